"""bench/window_gpu.py's pure parts and its answer check, on the real test detector (CPU): an answer passes only for
its own image. The whole bench runs here with ``python -m bench.window_gpu --cpu --tiny --out DIR``."""

import numpy as np
import pytest

from bench.window_gpu import (
    Phase,
    check,
    detector_weights,
    groups,
    parse_phases,
    pick_images,
    schedule,
    sized_phases,
    verdict,
)


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
    moved[:, :4] += 400.0  # boxes moved: fails
    assert "unmatched" in (check(moved, num, refs[0]) or "")
    assert "unmatched" in (check(det, np.array([0], np.int32), refs[0]) or "")


def test_phases_sized_so_a_saturates_and_the_preset_does_not():
    assert sized_phases(400.0, 1300.0) == [
        Phase("idle", 8.0, 20.0),
        Phase("burst", 24.0, 880.0),  # 2.2× (a)'s 400/s, under 70 % of the preset's 1300/s
        Phase("steady", 20.0, 530.0),  # 60 % of the burst, above (a)'s capacity
        Phase("idle", 8.0, 20.0),
    ]
    assert [p.rate for p in sized_phases(400.0, 900.0)] == [20.0, 630.0, 480.0, 20.0]  # the preset's 70 % caps it
    assert [p.rate for p in sized_phases(6.0, 40.0, (1, 2, 3, 4))] == [1.3, 13.2, 7.9, 1.3]  # CPU: idle a tenth
    # The previous H200 sizing (2.5×, 80 %) stays one flag away.
    assert [p.rate for p in sized_phases(400.0, 1300.0, over_a=2.5, headroom=0.8)] == [20.0, 1000.0, 600.0, 20.0]


def _run(config, p95s, served, wrong=0, lag_problems=(), halves=None):
    phases = [
        {
            "phase": f"p{k}",
            "served_per_s": s,
            "p95_ms": p,
            "p95_under_target": p <= 25,
            "shed": 0 if p <= 25 else 9,
            "failed": 0,
            "p95_halves_ms": halves or [p - 0.5, p + 0.5],
        }
        for k, (p, s) in enumerate(zip(p95s, served))
    ]
    return {"config": config, "phases": phases, "wrong_answers": wrong, "failed": 0, "client_bound": list(lag_problems)}


def test_verdict_reads_the_goal_off_the_runs_and_claims_nothing_from_a_bad_run():
    a = _run("a", [8, 900, 700, 9], [20, 400, 380, 20])
    c = _run("c", [9, 14, 12, 9], [20, 880, 530, 20])
    d = _run("d", [9, 14.5, 12, 9], [20, 880, 530, 20])
    assert verdict([a, c, d], {"a": {"right_per_s": 410.0, "wrong": 0, "failed": 0}}, 25) == [
        "(a) sustained 20/s (highest phase served with p95 ≤ 25 ms, nothing shed)",
        "(c) sustained 880/s (highest phase served with p95 ≤ 25 ms, nothing shed)",
        "(d) sustained 880/s (highest phase served with p95 ≤ 25 ms, nothing shed)",
        "(a) misses the target: yes, in p1, p2",
        "(d) p95 ≤ target in every phase: yes",
        "(d) sustained / (a)'s capacity (410.0/s): 2.15× (≥ 2×)",
        "(d) never worse than (c) by more than noise: yes",
    ]
    worse = _run("d", [9, 20, 12, 9], [20, 880, 530, 20], halves=[19.5, 20.0])
    assert verdict([a, c, worse], {"a": {"right_per_s": 500.0, "wrong": 0, "failed": 0}}, 25)[-2:] == [
        "(d) sustained / (a)'s capacity (500.0/s): 1.76× (< 2×)",
        "(d) never worse than (c) by more than noise: no: p1 20 vs 14 ms (noise 1.00)",
    ]
    # (d)'s decisions counted over its rounds, and a controller that never moved said so.
    rounds = [
        {"t_s": 2.0, "actions": {"widen": 2}, "window_us": [650, 650], "p95_ms": [8.0, 9.0], "requests": 40},
        {"t_s": 4.0, "actions": {"narrow": 1, "hold": 1}, "window_us": [600, 650], "p95_ms": [26, 27], "requests": 40},
    ]
    assert "(d) decisions: hold ×1, narrow ×1, widen ×2; windows after them 600–650 µs" in verdict(
        [a, c, {**d, "decisions": rounds}], {}, 25
    )
    held = [{**rounds[0], "actions": {"hold": 2}, "window_us": [600, 600]}]
    assert "(d) decisions: hold ×2; windows after them 600–600 µs (the controller never moved the window)" in verdict(
        [a, c, {**d, "decisions": held}], {}, 25
    )
    bound = _run("b", [9], [20], lag_problems=["issue lag p99 40 ms > 10 ms"])
    assert verdict([a, bound, d], {}, 25) == [
        "CLIENT-BOUND: the load generator did not keep its schedule, no result: (b) issue lag p99 40 ms > 10 ms"
    ]
    assert verdict([a, _run("d", [9], [20], wrong=2)], {}, 25) == [
        "INVALID: not every answer was right: (d) 2 wrong, 0 failed"
    ]
    assert verdict([a], {"b": {"right_per_s": 9.0, "wrong": 1, "failed": 0}}, 25) == [
        "INVALID: not every answer was right: (b) probe 1 wrong, 0 failed"
    ]


def test_configurations_run_together_keep_their_place_and_count_the_whole_load():
    """``groups``: (c) and (d) one run where (c) comes, the others alone; a configuration that served half the
    arrivals (its share) sustained the server's whole rate while its requests kept the target."""
    assert groups(["a", "b", "c", "d"], ["c", "d"]) == [["a"], ["b"], ["c", "d"]]
    assert groups(["d", "a", "c"], ["c", "d"]) == [["d", "c"], ["a"]]
    assert groups(["a", "b", "c", "d"], []) == [["a"], ["b"], ["c"], ["d"]]
    a = _run("a", [8, 900, 700, 9], [20, 400, 380, 20])
    c = {**_run("c", [9, 14, 12, 9], [10, 440, 265, 10]), "share": 0.5}
    d = {**_run("d", [9, 14.5, 12, 9], [10, 440, 265, 10]), "share": 0.5}
    got = verdict([a, c, d], {"a": {"right_per_s": 410.0, "wrong": 0, "failed": 0}}, 25)
    assert "(d) sustained 880/s (highest phase served with p95 ≤ 25 ms, nothing shed)" in got
    assert "(d) sustained / (a)'s capacity (410.0/s): 2.15× (≥ 2×)" in got
