"""MIG layouts checked at load against what `nvidia-smi mig -lgip` says fits (the H200 table is the real capture)."""

from pathlib import Path

import pytest

from plans.mig_fit import TABLES, capacity_from_lgip, layout_problems

LGIP = Path(__file__).parent / "fixtures" / "nvidia" / "nvidia-smi-mig-lgip.txt"


def test_h200_table_is_what_the_captured_lgip_says():
    captured = capacity_from_lgip(LGIP.read_text(), gpu="H200")
    assert captured == {0: next(t for t in TABLES if t.gpu == "H200")}


@pytest.mark.parametrize(
    "model, layout",
    [
        ("A100", ["2g.20gb", "2g.20gb", "1g.10gb", "1g.10gb"]),
        ("A100", ["3g.40gb", "3g.40gb"]),
        ("A100", ["4g.40gb", "3g.40gb"]),
        ("A100", ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]),
        ("NVIDIA H200", ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]),
        ("H200", ["1g.18gb"] * 7),
        ("L40S", ["whatever.9gb"]),  # no MIG table for this model: the provider checks against the GPU's own -lgip
    ],
)
def test_layouts_that_fit(model, layout):
    assert layout_problems(model, layout) == []


@pytest.mark.parametrize(
    "model, layout, problem",
    [
        ("H200", ["1g.18gb"] * 8, "8 x 1g.18gb but at most 7 fit a H200"),
        ("H200", ["4g.71gb", "4g.71gb"], "2 x 4g.71gb but at most 1 fit a H200"),
        ("H200", ["3g.71gb", "3g.71gb", "1g.18gb"], "the layout needs 9 of 8 memory slices of a H200"),
        ("H200", ["4g.71gb", "2g.35gb", "2g.35gb"], "the layout needs 8 of 7 compute slices of a H200"),
        ("A100", ["3g.40gb", "3g.20gb"], "has no MIG profile"),
    ],
)
def test_layouts_that_cannot_be_created(model, layout, problem):
    assert problem in layout_problems(model, layout)[0]
