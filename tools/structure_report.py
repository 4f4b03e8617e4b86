"""How the tree reads, in figures: long functions, the largest modules, import loops, README sections, prose size.

Counts what issue 41 asks to show before and after a restructuring; `duplicates --most 40` gives the repeated pairs.
A function's length is its definition from `def` to its last line (`end_lineno - lineno + 1`, docstring included);
an import loop is a cycle of the tree's own modules, once with module-level imports only and once with the imports
inside functions too (those run later, but a reader still goes round in circles).

Usage::

    .venv/bin/python -m tools.structure_report            # Markdown on stdout, for the tree in the current folder
    .venv/bin/python -m tools.structure_report --root /tmp/other-checkout
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
from pathlib import Path

SKIP = {".venv", ".cache", "build", "results", "__pycache__", ".git"}
LONG = 80  # lines: a function longer than this does not fit a screen


def sources(root: Path) -> dict[str, Path]:
    """Every module of the tree by dotted name (`plans.sriov`, `plans` for plans/__init__.py, `__main__`): in a git
    checkout the files git tracks and the untracked ones it does not ignore (as `duplicates` reads them)."""
    git = subprocess.run(
        ["git", "-C", str(root), "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        capture_output=True,
        text=True,
    )
    files = [root / x for x in git.stdout.splitlines()] if git.returncode == 0 else root.rglob("*.py")
    out = {}
    for p in sorted(files):
        rel = p.relative_to(root)
        if SKIP & set(rel.parts) or not p.is_file():
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def long_functions(root: Path, mods: dict[str, Path], limit: int = LONG) -> list[tuple[int, str]]:
    """(length, "path:qualified.name") of every function longer than `limit`, outside tests/, longest first."""
    found = []

    def visit(node: ast.AST, prefix: str, path: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}."
                n = (child.end_lineno or child.lineno) - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and n > limit:
                    found.append((n, f"{path}:{name[:-1]}"))
            visit(child, name, path)

    for mod, p in mods.items():
        if not mod.startswith("tests"):
            visit(ast.parse(p.read_text()), "", str(p.relative_to(root)))
    return sorted(found, key=lambda t: (-t[0], t[1]))


def imports(mod: str, path: Path, mods: dict[str, Path], top_only: bool) -> set[str]:
    """The tree's own modules that `mod` imports (at module level only when `top_only`)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_only else list(ast.walk(tree))
    if top_only:  # module level includes `if TYPE_CHECKING:`/`try:` blocks but not function bodies
        nodes = [
            n
            for top in tree.body
            if not isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for n in ast.walk(top)
        ]
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for n in nodes:
        names: list[str] = []
        if isinstance(n, ast.Import):
            names = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                up = package.split(".")[: len(package.split(".")) - (n.level - 1)]
                base = ".".join([*up, base] if base else up)
            names = [f"{base}.{a.name}" for a in n.names] + [base]
        for name in names:
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name and name != mod:
                out.add(name)
    return out


def loops(mods: dict[str, Path], top_only: bool) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan), each sorted."""
    graph = {m: imports(m, p, mods, top_only) for m, p in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for m in sorted(graph):
        if m not in index:
            strong(m)
    return sorted(found)


def readme_sections(text: str) -> list[tuple[str, int]]:
    """(heading, lines) per `## ` section of a Markdown file; the part before the first one is "(top)"."""
    out: list[tuple[str, int]] = [("(top)", 0)]
    for line in text.splitlines():
        if line.startswith("## "):
            out.append((line[3:].strip(), 0))
        out[-1] = (out[-1][0], out[-1][1] + 1)
    return out


def report(root: Path, commits: int = 50) -> str:
    mods = sources(root)
    longs = long_functions(root, mods)
    sizes = sorted(((len(p.read_text().splitlines()), str(p.relative_to(root))) for p in mods.values()), reverse=True)
    out = [f"## Functions over {LONG} lines outside tests: {len(longs)}", ""]
    out += [f"- {n} `{where}`" for n, where in longs]
    out += ["", "## The 10 largest modules (lines)", ""] + [f"- {n} `{p}`" for n, p in sizes[:10]]
    for top_only, what in ((True, "module-level imports"), (False, "module- and function-level imports")):
        found = loops(mods, top_only)
        out += ["", f"## Import loops, {what}: {len(found)}", ""] + [f"- {' ↔ '.join(g)}" for g in found]
    out += ["", "## README.md lines per section", ""]
    out += [f"- {n} {h}" for h, n in readme_sections((root / "README.md").read_text())]
    words = [
        (len(p.read_text().split()), str(p.relative_to(root)))
        for p in [*sorted(root.glob("docs/*.md")), root / "README.md"]
    ]
    out += ["", "## Words (wc -w)", ""] + [f"- {n} `{p}`" for n, p in words] + [f"- {sum(n for n, _ in words)} total"]
    log = subprocess.run(["git", "-C", str(root), "log", f"-{commits}", "--format=%s"], capture_output=True, text=True)
    subjects = log.stdout.splitlines()
    if subjects:
        mean = sum(map(len, subjects)) / len(subjects)
        over = sum(len(s) > 72 for s in subjects)
        out += ["", f"## Commit subjects, last {len(subjects)}: mean {mean:.0f} characters, {over} over 72"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path.cwd())
    ap.add_argument("--commits", type=int, default=50, help="how many recent commit subjects to average")
    a = ap.parse_args(argv)
    print(re.sub(r"\n{3,}", "\n\n", report(a.root.resolve(), a.commits)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
