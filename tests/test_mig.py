"""MIG (plans/mig.py), pure: layouts checked at load against what `nvidia-smi mig -lgip` says fits (the H200 table
is the real capture), the GPUs' state parsed from captures, and the plan that lays a layout out."""

from pathlib import Path

import pytest

from plans import mig
from plans.mig import TABLES, has_mig, layout_problems, tables_from_lgip

FIX = Path(__file__).parent / "fixtures"
LGIP = FIX / "nvidia" / "nvidia-smi-mig-lgip.txt"


def test_h200_table_is_what_the_captured_lgip_says():
    captured = tables_from_lgip(LGIP.read_text(), gpu="H200")
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


def test_the_presets_gpus_with_mig_are_the_ones_with_a_profile_table():
    assert [m for m in ("L40S", "A10", "A100", "H100", "H200", "4090") if has_mig(m)] == ["A100", "H100", "H200"]


# ---------------------------------------------------------------- the GPUs' state and the plan


def _state(mode, lgi, listing):
    text = "\n".join(
        [
            "@@MODE",
            (FIX / "triton" / mode).read_text(),
            "@@LGIP",
            (FIX / "nvidia" / "nvidia-smi-mig-lgip.txt").read_text(),
            "@@LGI",
            (FIX / "triton" / lgi).read_text(),
            "@@LIST",
            listing.read_text(),
        ]
    )
    return mig.parse_state(text)


def test_parsers_read_the_real_h200_captures():
    profiles = mig.parse_profile_ids((FIX / "nvidia" / "nvidia-smi-mig-lgip.txt").read_text())
    assert profiles[0]["1g.18gb"] == 19 and profiles[0]["3g.71gb"] == 9 and profiles[0]["7g.141gb"] == 0
    assert profiles[0]["1g.18gb+me"] == 20
    devices = mig.parse_uuids((FIX / "nvidia" / "nvidia-smi-L.txt").read_text())
    assert devices == {0: []}


LAYOUT = {0: ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]}


def test_mig_plan_from_mig_off_enables_then_creates_by_profile_id():
    gpus = _state("nvidia-smi-mode-h200-off.csv", "nvidia-smi-mig-lgi-none.txt", FIX / "nvidia" / "nvidia-smi-L.txt")
    actions = mig.plan_layout(gpus, LAYOUT)
    assert [a.command for a in actions] == ["nvidia-smi -i 0 -mig 1", "nvidia-smi mig -i 0 -cgi 9,14,19,19 -C"]
    assert actions[0].needs_reset


def test_mig_plan_is_a_noop_when_layout_matches_and_binds_by_uuid():
    gpus = _state(
        "nvidia-smi-mode-h200-on.csv", "nvidia-smi-mig-lgi-h200.txt", FIX / "triton" / "nvidia-smi-L-h200-mig.txt"
    )
    assert mig.plan_layout(gpus, {0: ["1g.18gb", "3g.71gb", "1g.18gb", "2g.35gb"]}) == []
    assert (
        mig.instance_uuids(gpus, 0)[0] == "MIG-1f4c6b1e-3c1a-5d55-9a3e-0b8d2f6a7c10"
        and len(mig.instance_uuids(gpus, 0)) == 4
    )


def test_mig_plan_changes_layout_by_destroying_then_creating():
    gpus = _state(
        "nvidia-smi-mode-h200-on.csv", "nvidia-smi-mig-lgi-h200.txt", FIX / "triton" / "nvidia-smi-L-h200-mig.txt"
    )
    actions = mig.plan_layout(gpus, {0: ["3g.71gb", "3g.71gb"]})
    assert [a.command for a in actions] == [
        "nvidia-smi mig -i 0 -dci",
        "nvidia-smi mig -i 0 -dgi",
        "nvidia-smi mig -i 0 -cgi 9,9 -C",
    ]
    off = mig.plan_layout(gpus, {0: []})
    assert off[-1].command == "nvidia-smi -i 0 -mig 0" and off[-1].needs_reset
    with pytest.raises(ValueError, match="2g.20gb"):
        mig.plan_layout(gpus, {0: ["2g.20gb"]})  # an A100 profile name does not exist on an H200
