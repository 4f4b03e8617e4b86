"""What the benchmarks write: latency summaries, markdown tables, the json/md results and docs/benchmarks.md's blocks.

* ``latency``: p50/p95/p99 (nearest rank, ``serving.adaptive_window.percentile``: the one rule) of latencies in ms, rounded;
* ``md_table``: a markdown table's lines from a header and rows;
* ``put_block``: a benchmark's table in ``docs/benchmarks.md`` between its BEGIN/END markers (appended with a
  heading the first time);
* ``wrong_answers``: every measured point of a result that counted a wrong or failed answer; ``invalid_banner``
  the line that heads such a result's table (a benchmark with one exits 1: its latencies are not results);
* ``Report``: a GPU benchmark's files (``OUT/<stem>.json``, ``OUT/<stem>.md``, the docs block) and its command line's
  common part (``--out``, ``--render``, ``--cpu``, ``--quick``, ...), shared by ``bench.gpu`` and ``bench.gpu_frames``.

Usage::

    row = {"requests": len(ms), **latency(ms)}          # {"p50_ms": 4.12, "p95_ms": 9.8, "p99_ms": 12.01}
    "\\n".join(md_table(["clients", "p95 ms"], [[c, r["p95_ms"]] for c, r in rows], align="r-"))
    put_block(DOC, "bench/queue.py", table_text)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from serving.adaptive_window import percentile

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"


def latency(values_ms: Iterable[float], digits: int = 2) -> dict[str, float]:
    """p50/p95/p99 of latencies in ms (nearest rank; NaN for none), rounded to ``digits``."""
    ordered = sorted(values_ms)
    return {f"p{q}_ms": round(percentile(ordered, q), digits) for q in (50, 95, 99)}


def md_table(head: Sequence[str], rows: Iterable[Sequence[Any]], align: str = "") -> list[str]:
    """A markdown table's lines: the header, the rule (``align``: one of ``l``/``r``/``-`` per column, ``r`` for
    right-aligned; default all ``-``) and one line per row (cells as ``str``)."""
    rule = "|" + "".join("---:|" if a == "r" else "---|" for a in (align or "-" * len(head)))
    return ["| " + " | ".join(head) + " |", rule, *("| " + " | ".join(str(c) for c in r) + " |" for r in rows)]


def put_block(doc: Path, name: str, body: str, heading: str = "") -> None:
    """``body`` between ``<!-- BEGIN <name> table -->`` and its END marker in ``doc``; where the markers are
    absent, the block is appended (below ``heading`` where given)."""
    begin, end = f"<!-- BEGIN {name} table -->", f"<!-- END {name} table -->"
    text = doc.read_text()
    block = f"{begin}\n{body}{end}"
    if begin in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + (f"{heading}\n\n" if heading else "") + block + "\n"
    doc.write_text(text)


def wrong_answers(results: Any, path: str = "") -> list[str]:
    """Every point in ``results`` (any nesting of dicts and lists) that counted a wrong or failed answer: a dict
    whose ``errors`` or ``invalid`` count is above 0, named by its ``name`` (else its path), with how many of its
    ``requests``."""
    out: list[str] = []
    if isinstance(results, dict):
        bad = max(
            (v for k in ("errors", "invalid") if isinstance(v := results.get(k), int) and not isinstance(v, bool)),
            default=0,
        )
        if bad > 0:
            name = results.get("name") or path or "the run"
            of = f" of {results['requests']}" if isinstance(results.get("requests"), int) else ""
            out.append(f"{name} ({bad}{of})")
        for k, v in results.items():
            out += wrong_answers(v, f"{path}/{k}")
    elif isinstance(results, list):
        for i, v in enumerate(results):
            out += wrong_answers(v, f"{path}[{i}]")
    return out


def invalid_banner(results: Any) -> str:
    """The line that heads a result with wrong or failed answers ("" for none)."""
    bad = wrong_answers(results)
    if not bad:
        return ""
    return (
        f"**INVALID: wrong or failed answers in {len(bad)} point(s): {'; '.join(bad)}. Their latencies time wrong "
        "work and are not results.**\n\n"
    )


def git_commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return r.stdout.strip()


@dataclasses.dataclass(frozen=True)
class Report:
    """A GPU benchmark's results: ``OUT/<stem>.json`` and ``OUT/<stem>.md``, and its table in docs/benchmarks.md
    between the ``bench/<stem>.py`` markers (under ``heading`` the first time).

    Example (``bench.gpu``)::

        REPORT = Report("gpu", table, "## GPU serving: ...")
        def main(argv=None):
            ap = REPORT.parser(__doc__, duration=5.0, concurrency="1,4,8,16")
            ap.add_argument("--windows", default="0,200,500,1000")
            ap.add_argument("--quick", action="store_true", help="1 s per point, concurrency 1,4")
            return REPORT.main(ap, argv, run, quick={"duration": 1.0, "concurrency": "1,4"})
    """

    stem: str
    table: Callable[[dict], str]
    heading: str

    def write(self, results: dict, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{self.stem}.json").write_text(json.dumps(results, indent=1, sort_keys=True))
        (out / f"{self.stem}.md").write_text(invalid_banner(results) + self.table(results))

    def render_doc(self, results: dict) -> None:
        put_block(DOC, f"bench/{self.stem}.py", self.table(results), self.heading)

    def parser(self, doc: str, duration: float, concurrency: str) -> argparse.ArgumentParser:
        """The options every GPU benchmark has (``--duration`` and ``--concurrency`` with these defaults); the caller
        adds its own, ``--cpu`` and ``--quick`` among them."""
        ap = argparse.ArgumentParser(description=doc.splitlines()[0])
        ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
        ap.add_argument("--duration", type=float, default=duration)
        ap.add_argument("--concurrency", default=concurrency)
        ap.add_argument("--gpu-model", default="", help="preset key (default: nvidia-smi's name)")
        ap.add_argument("--nginx", default="")
        ap.add_argument("--commit", default="")
        ap.add_argument("--render", default="", help=f"only rewrite docs/benchmarks.md from this {self.stem}.json")
        return ap

    def main(
        self,
        ap: argparse.ArgumentParser,
        argv: Optional[list[str]],
        run: Callable[[argparse.Namespace], dict],
        quick: dict[str, Any],
    ) -> int:
        """Parse; ``--render``: the docs block only; else the ``quick`` settings where ``--quick``, ``run(args)``,
        the files written and the table printed; 1 when an answer was wrong or failed (``wrong_answers``)."""
        args = ap.parse_args(argv)
        if args.render:
            self.render_doc(json.loads(Path(args.render).read_text()))
            return 0
        if args.quick:
            vars(args).update(quick)
        results = run(args)
        results["command"] = f"python -m bench.{self.stem} " + " ".join(argv if argv is not None else sys.argv[1:])
        self.write(results, Path(args.out))
        print(invalid_banner(results) + self.table(results))
        return 1 if wrong_answers(results) else 0
