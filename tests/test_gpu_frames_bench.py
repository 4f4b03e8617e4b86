"""bench.gpu_frames' answer check: a detector's answer against the reference of its own frame (pure; the GPU run
itself is a benchmark, and ``python -m bench.gpu_frames --cpu --quick`` runs its whole pipeline on CPU)."""

import json
import struct

from bench.gpu_frames import MatchesReference


def _answer(rows, count):
    det = b"".join(struct.pack("<6f", *r) for r in rows)
    head = json.dumps(
        {
            "outputs": [
                {"name": "detections", "parameters": {"binary_data_size": len(det)}},
                {"name": "num_detections", "parameters": {"binary_data_size": 4}},
            ]
        }
    ).encode()
    return head + det + struct.pack("<i", count), str(len(head))


Z = (0.0,) * 6
A, B = (100.0, 50.0, 300.0, 250.0, 0.9, 2.0), (400.0, 60.0, 500.0, 160.0, 0.88, 2.0)


def test_the_same_boxes_within_the_tolerance_pass_in_either_order():
    check = MatchesReference([A, B, Z], 2, tol_px=3.0)
    assert check(*_answer([A, B, Z], 2)) is None
    assert check(*_answer([(101.5, 49.0, 302.0, 251.0, 0.895, 2.0), B, Z], 2)) is None
    assert check(*_answer([B, A, Z], 2)) is None  # near-equal scores swapped


def test_a_moved_missing_extra_or_reclassified_box_fails():
    check = MatchesReference([A, B, Z], 2, tol_px=3.0)
    assert "not in the reference" in (check(*_answer([(110.0, 50.0, 300.0, 250.0, 0.9, 2.0), B, Z], 2)) or "")
    assert "missing" in (check(*_answer([A, Z, Z], 1)) or "")
    assert "not in the reference" in (check(*_answer([A, B, (1.0, 1.0, 9.0, 9.0, 0.7, 1.0)], 3)) or "")
    assert "not in the reference" in (check(*_answer([A, (*B[:5], 3.0), Z], 2)) or "")
    # a box at the confidence threshold may appear on one side only (FP16 against the eager reference)
    assert check(*_answer([A, B, (1.0, 1.0, 9.0, 9.0, 0.26, 1.0)], 3)) is None
    assert "not readable" in (check(b"{}", "2") or "")


def test_a_box_that_rounding_decides_may_be_on_one_side_only():
    """NMS at its IoU threshold (0.45): FP16 on the GPU may keep a box the eager reference suppressed."""
    check = MatchesReference([A, Z], 1, tol_px=3.0)
    near = (172.0, 50.0, 372.0, 250.0, 0.85, 2.0)  # IoU with A ≈ 0.47
    assert check(*_answer([A, near, Z], 2)) is None
    far = (250.0, 50.0, 450.0, 250.0, 0.85, 2.0)  # IoU with A ≈ 0.14: a real difference
    assert "not in the reference" in (check(*_answer([A, far, Z], 2)) or "")
