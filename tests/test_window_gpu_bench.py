"""bench/window_gpu.py's pure parts and its answer check, on the real test detector (CPU): an answer passes only for
its own image. The whole bench runs here with ``python -m bench.window_gpu --cpu --tiny --out DIR``."""

import numpy as np
import pytest

from bench.window_gpu import Phase, check, detector_weights, parse_phases, pick_images, schedule


def test_phases_and_open_loop_schedule():
    phases = parse_phases("idle:2:5,burst:1:20")
    assert phases == [Phase("idle", 2.0, 5.0), Phase("burst", 1.0, 20.0)]
    plan = schedule(phases)
    assert len(plan) == 30 and [p for _, p in plan].count(1) == 20
    assert plan[1][0] == pytest.approx(0.2) and plan[10][0] == pytest.approx(2.0) and plan[11][0] == pytest.approx(2.05)
    poisson = schedule(parse_phases("idle:50:10,burst:50:200"), poisson=True, seed=1)
    assert poisson == schedule(parse_phases("idle:50:10,burst:50:200"), poisson=True, seed=1)  # same for every config
    counts = [sum(1 for _, p in poisson if p == k) for k in (0, 1)]
    assert 400 < counts[0] < 600 and 9000 < counts[1] < 11000  # the phase's rate on average
    assert all(0 <= t < 50 for t, p in poisson if p == 0) and all(50 <= t < 100 for t, p in poisson if p == 1)
    with pytest.raises(SystemExit, match="'burst:x:9' is not name:seconds:rate"):
        parse_phases("burst:x:9")
    with pytest.raises(SystemExit, match="seconds > 0"):
        parse_phases("idle:0:5")


def test_an_answer_passes_only_against_its_own_images_reference():
    model, weights = detector_weights()
    assert len(weights) > 10_000_000  # a real state_dict (3.2 M parameters)
    images, refs = pick_images(model, 3, gpu=False)
    assert len(images) == 3 and all(int(r[1][0]) >= 5 for r in refs)  # images on which the detector finds boxes
    for i, (det, num) in enumerate(refs):
        assert check(det, num, refs[i]) is None
        for j in range(3):
            if j != i:
                assert check(det, num, refs[j]) is not None, (i, j)
    det, num = refs[0]
    nudged = det.copy()
    nudged[:, 4] += 0.01  # FP16 / batch-size noise passes
    assert check(nudged, num, refs[0]) is None
    moved = det.copy()
    moved[:, :4] += 40.0  # boxes moved: fails
    assert "IoU" in (check(moved, num, refs[0]) or "")
    assert "detections" in (check(det, np.array([0], np.int32), refs[0]) or "")
