"""tools/structure_report.py on a small tree written here: what it counts is what the tree holds."""

from __future__ import annotations

from pathlib import Path

from tools import structure_report as sr


def tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return sr.sources(tmp_path)


def body(n: int) -> str:
    return "def f():\n" + "    x = 1\n" * (n - 2) + "    return x\n"


def test_a_function_of_81_lines_is_long_and_one_of_80_is_not(tmp_path):
    mods = tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": body(81), "pkg/b.py": body(80)})
    assert sr.long_functions(tmp_path, mods) == [(81, "pkg/a.py:f")]


def test_methods_and_nested_functions_are_named_by_their_place(tmp_path):
    nested = "class C:\n    def m(self):\n" + "        " + body(81).replace("\n", "\n        ").rstrip() + "\n"
    mods = tree(tmp_path, {"pkg/__init__.py": "", "pkg/c.py": nested})
    assert [w for _, w in sr.long_functions(tmp_path, mods)] == ["pkg/c.py:C.m", "pkg/c.py:C.m.f"]


def test_tests_are_not_counted(tmp_path):
    mods = tree(tmp_path, {"tests/__init__.py": "", "tests/test_a.py": body(200)})
    assert sr.long_functions(tmp_path, mods) == []


def test_a_loop_through_a_function_level_import_is_found_only_with_function_imports(tmp_path):
    mods = tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import g\n",
            "pkg/b.py": "def g():\n    from . import a\n    return a\n",
            "pkg/c.py": "import pkg.a\n",
        },
    )
    assert sr.loops(mods, top_only=True) == []
    assert sr.loops(mods, top_only=False) == [["pkg.a", "pkg.b"]]


def test_a_module_level_loop_is_found(tmp_path):
    mods = tree(tmp_path, {"p/__init__.py": "", "p/x.py": "from p import y\n", "p/y.py": "import p.x as x\n"})
    assert sr.loops(mods, top_only=True) == [["p.x", "p.y"]]


def test_readme_lines_per_section():
    text = "# Title\nintro\n\n## One\na\nb\n## Two\nc\n"
    assert sr.readme_sections(text) == [("(top)", 3), ("One", 3), ("Two", 2)]
