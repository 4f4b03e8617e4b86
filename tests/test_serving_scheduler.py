"""The pure parts of seed 001's queue: the scheduler's rules on a hand-driven clock, the wire codec, metric parsing."""

from __future__ import annotations

import random

import numpy as np
import pytest

from serving.metrics import Counter, Histogram, parse_samples, render
from serving.queue import Result
from serving.scheduler import Policy, Scheduler, Signals
from serving.worker import WorkerConfig, queue_ms_from, xid_from

W = {"mig-a": 3, "vm-b": 2}


def _fill(s: Scheduler, now: float, slots: int) -> dict[str, int]:
    """Start jobs until `slots` are in flight; returns the in-flight count per backend."""
    got = {n: 0 for n in s.names}
    for _ in range(slots):
        n = s.pick(now)
        assert n is not None
        s.started(n)
        got[n] += 1
    return got


def _serve(s: Scheduler, now: float, rounds: int, slots: int = 10, rng=None) -> dict[str, int]:
    """Closed loop: `slots` jobs in flight, one random in-flight job finishes and the freed slot is refilled."""
    rng = rng or random.Random(1)
    inflight = []
    for _ in range(slots):
        n = s.pick(now)
        assert n is not None
        s.started(n)
        inflight.append(n)
    served = {n: 0 for n in s.names}
    for _ in range(rounds):
        done = inflight.pop(rng.randrange(len(inflight)))
        s.finished(done)
        served[done] += 1
        n = s.pick(now)
        assert n is not None
        s.started(n)
        inflight.append(n)
    return served


def test_load_per_weight_settles_in_flight_at_3_to_2():
    s = Scheduler(W, rng=random.Random(0))
    assert _fill(s, 0.0, 5) == {"mig-a": 3, "vm-b": 2}
    s2 = Scheduler(W, rng=random.Random(0))
    assert _fill(s2, 0.0, 10) == {"mig-a": 6, "vm-b": 4}


def test_at_low_load_where_both_are_idle_the_split_is_still_the_weights():
    """One job at a time (each finished before the next: both backends idle at every pick): 3:2 exactly over every
    5 picks, where a score of (in_flight + 1) / weight sent every such job to the heavier backend."""
    s = Scheduler(W, rng=random.Random(7))
    picks = []
    for _ in range(1000):
        n = s.pick(0.0)
        assert n is not None
        s.started(n)
        s.finished(n)
        picks.append(n)
    assert picks.count("mig-a") == 600
    assert all(picks[i : i + 5].count("mig-a") == 3 for i in range(0, 1000, 5))
    # Two workers' schedulers start their round robin at different points (no picking in step).
    assert {Scheduler(W, rng=random.Random(seed)).pick(0.0) for seed in range(20)} == set(W)


def test_failed_backend_drained_at_once_and_back_only_after_retry_after():
    s = Scheduler(W, Policy(retry_after_s=1.0, ramp_s=0))
    s.failed("mig-a", 10.0)
    assert s.effective_weight("mig-a", 10.0) == 0
    assert {s.pick(10.0) for _ in range(50)} == {"vm-b"}
    s.observe("mig-a", Signals(ready=True), 10.5)  # a probe too soon after the failure does not count
    assert s.effective_weight("mig-a", 10.5) == 0
    s.observe("mig-a", Signals(ready=True), 11.2)
    assert s.effective_weight("mig-a", 11.2) == 3


def test_not_ready_or_xid_drains():
    s = Scheduler(W)
    s.observe("vm-b", Signals(ready=False), 1.0)
    assert s.effective_weight("vm-b", 1.0) == 0
    s.observe("mig-a", Signals(ready=True, xid=79), 1.0)
    assert s.pick(1.0) is None  # both drained by failure, nothing to fall back on
    s.observe("mig-a", Signals(ready=True, xid=0), 2.0)
    assert s.pick(2.0) == "mig-a"


def test_return_ramps_gradually_no_herding():
    p = Policy(ramp_s=10.0, ramp_floor=0.1, retry_after_s=0)
    s = Scheduler(W, p)
    s.observe("mig-a", Signals(ready=False), 0.0)
    s.observe("mig-a", Signals(ready=True), 100.0)
    assert s.effective_weight("mig-a", 100.0) == pytest.approx(0.3)
    assert s.effective_weight("mig-a", 105.0) == pytest.approx(3 * (0.1 + 0.9 * 0.5))
    assert s.effective_weight("mig-a", 110.0) == 3
    # Just back, the idle backend does not take the whole next wave: most new jobs still go to vm-b.
    served = _serve(s, 100.0, 2000)
    assert served["mig-a"] / sum(served.values()) < 0.25
    # Once ramped, the split is back to 3:2.
    served = _serve(Scheduler(W, p), 0.0, 5000)
    assert served["mig-a"] / served["vm-b"] == pytest.approx(1.5, rel=0.1)


def test_queue_time_shifts_weight_then_drains():
    s = Scheduler(W, Policy(queue_ms_shift=20, queue_ms_drain=100, ramp_s=0))
    s.observe("mig-a", Signals(ready=True, queue_ms=10), 0.0)
    assert s.effective_weight("mig-a", 0.0) == 3
    s.observe("mig-a", Signals(ready=True, queue_ms=60), 1.0)
    assert s.effective_weight("mig-a", 1.0) == pytest.approx(1.5)
    s.observe("mig-a", Signals(ready=True, queue_ms=150), 2.0)
    assert s.effective_weight("mig-a", 2.0) == 0
    assert {s.pick(2.0) for _ in range(20)} == {"vm-b"}
    # Overload everywhere: the ready backends still serve at their configured weights.
    s.observe("vm-b", Signals(ready=True, queue_ms=500), 2.0)
    assert s.pick(2.0) in W


def test_jitter_spreads_near_ties_in_proportion_to_weight():
    s = Scheduler({"a": 1, "b": 1}, Policy(jitter=0.1), rng=random.Random(3))
    picks = [s.pick(0.0) for _ in range(2000)]
    assert 0.4 < picks.count("a") / len(picks) < 0.6
    s0 = Scheduler({"a": 1, "b": 1}, Policy(jitter=0.0), rng=random.Random(3))
    s0.started("b")
    assert {s0.pick(0.0) for _ in range(50)} == {"a"}


def test_exclude_skips_a_backend_that_just_failed_this_job():
    s = Scheduler(W)
    assert {s.pick(0.0, exclude={"mig-a"}) for _ in range(10)} == {"vm-b"}


def test_bad_weights_and_policy_refused():
    with pytest.raises(ValueError, match="positive"):
        Scheduler({"a": 0})
    with pytest.raises(ValueError, match="queue_ms_shift"):
        Policy(queue_ms_shift=50, queue_ms_drain=20)


def test_result_codec_round_trip():
    out: dict[str, np.ndarray] = {
        "OUTPUT0": np.arange(12, dtype=np.float32).reshape(3, 4),
        "IDX": np.array([[1, 2]], dtype=np.int64),
    }
    r = Result(
        key="k",
        status="ok",
        backend="vm-b",
        worker="w1",
        latency_ms=12.5,
        queue_ms=3.0,
        service_ms=9.0,
        attempts=2,
        reclaimed=True,
        outputs=out,
    )
    back = Result.decode(r.encode())
    assert (back.backend, back.attempts, back.reclaimed, back.latency_ms) == ("vm-b", 2, True, 12.5)
    for k, v in out.items():
        np.testing.assert_array_equal(back.outputs[k], v)
        assert back.outputs[k].dtype == v.dtype


TRITON_METRICS = """# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="gen",version="1"} %d
nv_inference_request_success{model="other",version="1"} 999
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="gen",version="1"} %d
nv_inference_queue_duration_us{model="other",version="1"} 123456789
"""


def test_queue_time_from_triton_counters():
    q, prev = queue_ms_from(None, TRITON_METRICS % (100, 1_000_000), {"gen"})
    assert q is None and prev == (1_000_000, 100)
    q, prev = queue_ms_from(prev, TRITON_METRICS % (150, 2_500_000), {"gen"})
    assert q == pytest.approx(30.0)  # 1.5 s of queueing over 50 requests
    q, _ = queue_ms_from(prev, TRITON_METRICS % (150, 2_500_000), {"gen"})
    assert q is None  # no new request: no new measurement


def test_xid_from_dcgm():
    text = 'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1"} 0\nDCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-2"} 79\n'
    assert xid_from(text) == 79
    assert xid_from('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 50\n') == 0


def test_metrics_render_parses_back():
    c = Counter("gpuhost_gateway_jobs_total", "Jobs", ("backend", "outcome"))
    c.inc("mig-a", "ok")
    c.inc("mig-a", "ok")
    h = Histogram("gpuhost_gateway_job_latency_seconds", "Latency", ("backend",), buckets=(0.1, 1.0))
    for x in (0.05, 0.5, 2.0):
        h.observe(x, "vm-b")
    text = render(
        [("g_b", "b", {"backend": "x"}, 1), ("g_a", "a", {}, 2.5), ("g_b", "b", {"backend": "y"}, 0)],
        [c],
        [h],
        common={"consumer": "w1"},
    )
    s = {(n, tuple(sorted(lb.items()))): v for n, lb, v in parse_samples(text)}
    assert s[("gpuhost_gateway_jobs_total", (("backend", "mig-a"), ("consumer", "w1"), ("outcome", "ok")))] == 2
    assert (
        s[("gpuhost_gateway_job_latency_seconds_bucket", (("backend", "vm-b"), ("consumer", "w1"), ("le", "1")))] == 2
    )
    assert s[("gpuhost_gateway_job_latency_seconds_count", (("backend", "vm-b"), ("consumer", "w1")))] == 3
    lines = [ln for ln in text.splitlines() if ln.startswith("g_b")]
    assert len(lines) == 2 and text.index("g_a") < text.index("g_b")  # families contiguous


def test_worker_config_from_json_dict():
    cfg = WorkerConfig.from_dict(
        {
            "redis": {"host": "10.0.0.5", "port": 6380},
            "queue": {"max_depth": 50},
            "backends": [{"name": "a", "weight": 3, "grpc": "h:8001", "http": "http://h:8000"}],
            "slots": 4,
            "policy": {"ramp_s": 5},
        }
    )
    assert (cfg.redis_host, cfg.redis_port, cfg.queue.max_depth, cfg.slots, cfg.policy.ramp_s) == (
        "10.0.0.5",
        6380,
        50,
        4,
        5,
    )
    with pytest.raises(TypeError):
        WorkerConfig.from_dict({"backends": [], "bogus": 1})
