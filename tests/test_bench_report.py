"""bench/report.py: a benchmark result with a wrong or failed answer is marked INVALID and its run exits 1."""

import json
from pathlib import Path

from bench.report import Report, invalid_banner, wrong_answers

ROOT = Path(__file__).resolve().parents[1]


def test_wrong_answers_are_found_at_any_depth_and_named():
    results = {
        "served": {
            "points": [
                {"name": "echo", "requests": 10, "errors": 0},
                {"name": "det lone", "requests": 476, "errors": 476, "invalid": 476},
                {"name": "det c16", "requests": 3039, "errors": 0, "invalid": 0},
            ]
        },
        "runs": [{"requests": 5, "invalid": 2}],
        "flag": {"errors": True},  # a bool is no count
    }
    assert wrong_answers(results) == ["det lone (476 of 476)", "/runs[0] (2 of 5)"]
    assert invalid_banner(results).startswith("**INVALID: wrong or failed answers in 2 point(s): det lone (476 of 476)")
    assert invalid_banner({"points": [{"name": "ok", "errors": 0}]}) == ""


def test_the_recorded_c1_profile_of_issue_26_is_invalid():
    """The H200 c=1 profile (commit dd9e862) recorded every lone-frame answer of the frame-graph models wrong; read
    with this rule it is marked, point by point, and only the models without the graphs and the c=16 points pass."""
    res = json.loads((ROOT / "bench" / "results" / "gpu_c1_dd9e862_invalid.json").read_text())
    bad = wrong_answers(res)
    assert len(bad) == 10 and bad[0] == "det_jpeg http direct (476 of 476)"
    assert not any(name.startswith("det_jpeg_nofg") for name in bad)


def test_a_report_with_a_wrong_answer_exits_1_under_its_banner(tmp_path):
    report = Report("stand_in", lambda r: "| table |\n", "## Stand-in")

    def run(args):
        return {"points": [{"name": "p", "requests": 3, "errors": 1}]}

    ap = report.parser("stand-in benchmark", duration=1.0, concurrency="1")
    ap.add_argument("--quick", action="store_true")
    assert report.main(ap, ["--out", str(tmp_path)], run, quick={}) == 1
    assert (
        (tmp_path / "stand_in.md")
        .read_text()
        .startswith("**INVALID: wrong or failed answers in 1 point(s): p (1 of 3)")
    )

    def good(args):
        return {"points": [{"name": "p", "requests": 3, "errors": 0}]}

    assert report.main(ap, ["--out", str(tmp_path)], good, quick={}) == 0
    assert (tmp_path / "stand_in.md").read_text() == "| table |\n"
