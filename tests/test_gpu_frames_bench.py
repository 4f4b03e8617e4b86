"""bench.gpu_frames' answer check: a detector's answer against the reference of its own frame (pure; the GPU run
itself is a benchmark, and ``python -m bench.gpu_frames --cpu --quick`` runs its whole pipeline on CPU)."""

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from bench.gpu_frames import STAGES, MatchesReference, stages
from bench.servers import front_conf, read_timing, with_timing_log


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


# ---------------------------------------------------------------- nginx's times (--nginx-timing)


def test_the_timing_log_is_a_config_real_nginx_accepts_and_its_lines_are_read_back(tmp_path):
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        pytest.skip("no nginx binary")
    conf, _, _ = front_conf(tmp_path, "det", 8000, 8001, "1")
    timed = with_timing_log(conf, tmp_path / "timing.log")
    assert timed.count("access_log off;") == conf.count("access_log off;") - 1  # the health check still logs nothing
    (tmp_path / "nginx.conf").write_text(timed)
    t = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", str(tmp_path / "error.log")],
        capture_output=True,
        text=True,
    )
    assert t.returncode == 0, t.stderr
    (tmp_path / "timing.log").write_text(
        "100.000 0.004 0.000 0.003 0.003 200\n"
        "100.500 0.006 0.001 0.004 0.005 200\n"
        "100.600 0.009 - - - 404\n"  # no upstream
        "100.700 0.030 0.000, 0.001 0.010, 0.020 0.010, 0.020 200\n"  # retried upstream: not a plain answer
        "101.500 0.050 0.000 0.040 0.040 200\n"  # after the window
    )
    got = read_timing(tmp_path / "timing.log", 99.9, 101.0)
    assert got == {
        "requests": 2,
        "request_ms": 5.0,
        "upstream_connect_ms": 0.5,
        "upstream_header_ms": 3.5,
        "upstream_response_ms": 4.0,
    }
    assert read_timing(tmp_path / "absent.log", 0, 1e12)["requests"] == 0


def test_the_stages_add_up_to_the_client_mean():
    point = {
        "mean_ms": 3.2,
        "nginx_timing": {"requests": 10, "request_ms": 2.8, "upstream_response_ms": 2.7},
        "triton": {
            "success_us": 2300.0,
            "queue_us": 100.0,
            "compute_input_us": 50.0,
            "compute_infer_us": 2100.0,
            "compute_output_us": 50.0,
        },
    }
    execute = {"decode_ms": 0.7, "launch_ms": 0.2, "gpu_ms": 0.8, "respond_ms": 0.15}
    got = stages(point, execute)
    assert got is not None and len(got) == len(STAGES)
    assert [round(x, 3) for x in got] == [0.4, 0.1, 0.4, 0.1, 0.05, 0.25, 0.7, 0.2, 0.8, 0.15, 0.05]
    assert abs(sum(got) - 3.2) < 1e-9
    assert stages({**point, "nginx_timing": {"requests": 0}}, execute) is None  # no nginx times: no table row
    assert stages(point, {"gather_ms": 1.0}) is None  # a raw model's phases are not a JPEG execute's
