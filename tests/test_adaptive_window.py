"""Adaptive batching window, pure parts: the decision table, Triton's summary parsed from a real capture, the
config override and the exported metrics."""

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from serving.adaptive_window import (
    BatcherWindow,
    ClientP95,
    Controller,
    Decision,
    ModelState,
    PublishedWindow,
    RateLimited,
    ReloadLimit,
    StateError,
    WindowPolicy,
    decide,
    in_process,
    load_body,
    parse_summary,
    render_metrics,
    served_window,
    with_window,
)

SEED = WindowPolicy()  # 50 ms, 50 µs, 10 s, [200, 1500] µs
CAPTURE = Path(__file__).parent / "fixtures" / "triton" / "metrics_summary.txt"


def test_seed_values_are_the_defaults_and_bad_policies_are_refused():
    assert (SEED.target_p95_ms, SEED.step_us, SEED.period_s, SEED.min_us, SEED.max_us) == (50, 50, 10, 200, 1500)
    with pytest.raises(ValueError, match=r"clamp \[1500, 200\] µs is empty"):
        WindowPolicy(min_us=1500, max_us=200)
    with pytest.raises(ValueError, match="step_us must be ≥ 1"):
        WindowPolicy(step_us=0)


@pytest.mark.parametrize(
    "window, p95, requests, new, action",
    [
        (800, 30.0, 500, 850, "widen"),  # well under target: bigger batches
        (800, 44.9, 500, 850, "widen"),  # under 90 % of 50 ms
        (800, 45.0, 500, 800, "hold"),  # in the dead band: no flapping around the target
        (800, 50.0, 500, 800, "hold"),  # at the target
        (800, 50.1, 500, 750, "narrow"),  # over target: less queueing
        (1500, 10.0, 500, 1500, "hold"),  # ceiling
        (1480, 10.0, 500, 1500, "widen"),  # a step that would overshoot stops at the ceiling
        (200, 120.0, 500, 200, "hold"),  # floor
        (230, 120.0, 500, 200, "narrow"),
        (800, 120.0, 5, 800, "hold"),  # too few requests: no evidence
        (800, math.nan, 500, 800, "hold"),  # summary empty (no traffic in its window)
        (3000, 10.0, 500, 1500, "clamp"),  # a hand-set window outside the clamp is brought back first
        (100, 120.0, 500, 200, "clamp"),
    ],
)
def test_decision_table(window, p95, requests, new, action):
    d = decide(SEED, "m", window, p95, requests)
    assert (d.window_us, d.action) == (new, action)
    assert SEED.min_us <= d.window_us <= SEED.max_us
    assert abs(d.window_us - d.previous_us) <= SEED.step_us or action == "clamp"


def test_hysteresis_is_a_dead_band_under_the_target():
    policy = WindowPolicy(target_p95_ms=10, hysteresis=0.2)
    assert decide(policy, "m", 500, 7.9, 100).action == "widen"
    assert decide(policy, "m", 500, 8.1, 100).action == "hold"
    assert decide(policy, "m", 500, 10.1, 100).action == "narrow"


def test_summary_parsed_from_a_real_triton_capture():
    text = CAPTURE.read_text()
    p95, count = parse_summary(text, "m")
    assert p95 == pytest.approx(2.706) and count == 61
    with pytest.raises(LookupError, match="summary_latencies=true"):
        parse_summary(text, "other")
    with pytest.raises(LookupError):
        parse_summary(text.replace("summary", "duration"), "m")


def test_summary_of_several_versions_and_nan():
    text = (
        'nv_inference_request_summary_us_count{model="m",version="1"} 10\n'
        'nv_inference_request_summary_us{model="m",version="1",quantile="0.95"} 4000\n'
        'nv_inference_request_summary_us_count{model="m",version="2"} 5\n'
        'nv_inference_request_summary_us{model="m",version="2",quantile="0.95"} 9000\n'
        'nv_inference_request_summary_us_count{model="n",version="1"} 5\n'
        'nv_inference_request_summary_us{model="n",version="1",quantile="0.95"} nan\n'
    )
    assert parse_summary(text, "m") == (9.0, 15)
    p95, count = parse_summary(text, "n")
    assert math.isnan(p95) and count == 5


def test_config_override_changes_only_the_window():
    config = {
        "name": "m",
        "max_batch_size": 8,
        "dynamic_batching": {"preferred_batch_size": [8], "max_queue_delay_microseconds": 300},
    }
    new = with_window(config, 350)
    assert served_window(new) == 350 and served_window(config) == 300
    assert {k: v for k, v in new.items() if k != "dynamic_batching"} == {"name": "m", "max_batch_size": 8}
    body = json.loads(load_body(new))
    assert json.loads(body["parameters"]["config"]) == new
    with pytest.raises(ValueError, match="no dynamic_batching"):
        with_window({"name": "plain"}, 300)


def test_metrics_render_every_decision_kind():
    state = ModelState(window_us=850, p95_ms=31.5, actions={"widen": 3, "hold": 1}, errors=2, last_decision_s=1e9)
    text = render_metrics(SEED, {"m": state})
    assert 'gpuhost_adaptive_window_us{model="m"} 850' in text
    assert 'gpuhost_adaptive_window_decisions_total{model="m",action="widen"} 3' in text
    assert 'gpuhost_adaptive_window_decisions_total{model="m",action="narrow"} 0' in text
    assert 'gpuhost_adaptive_window_bound_us{model="m",bound="max"} 1500' in text
    assert 'gpuhost_adaptive_window_errors_total{model="m"} 2' in text
    assert "# TYPE gpuhost_adaptive_window_decisions_total counter" in text
    assert isinstance(decide(SEED, "m", 800, 1.0, 100), Decision)


# ------------------------------------------------------------------ in process: the micro-batcher's window


class FakeBatcher:
    """Stands for serving.microbatch.MicroBatcher's surface the controller uses (window, clock, records); the real
    one against a real Triton is in test_adaptive_window_triton.py."""

    def __init__(self, window_us=600):
        from serving.microbatch import LatencyStats

        self.window_us, self.now, self.stats, self.sets = window_us, 0.0, LatencyStats(), []

    def clock(self):
        return self.now

    def set_window(self, us):
        self.sets.append(us)
        self.window_us = us

    def complete(self, latencies_ms, ok=True, batch=4):
        from serving.microbatch import RequestRecord

        for ms in latencies_ms:
            self.stats.add(RequestRecord(self.now - 0.5 - ms / 1e3, 0.0, ms / 1e3, batch, ok))  # done 0.5 s ago


def test_client_p95_counts_each_request_in_the_period_it_completed():
    b = FakeBatcher()
    source = ClientP95({"m": b})
    b.now = 10.0
    b.complete([float(i) for i in range(1, 101)])  # 1..100 ms, all completed at t=9.5
    assert source("m") == (95.0, 100, 4.0)
    b.now = 20.0
    p95, requests, per_batch = source("m")
    assert math.isnan(p95) and requests == 0 and per_batch is None  # nothing new: no evidence
    b.now = 30.0
    b.complete([5.0] * 30, batch=1)
    b.complete([900.0] * 3, ok=False, batch=3)  # failures count as requests, carry no latency
    p95, requests, per_batch = source("m")
    assert (p95, requests) == (5.0, 33) and per_batch == pytest.approx(33 / 31)  # 30 lone requests, one batch of 3


def test_a_window_that_batches_nothing_is_not_widened():
    """Under the target the seed widens the window; where the client's own records show batches of about one request
    (the window closes on a lone request), widening only adds its wait: hold, say why. Narrowing is unaffected; a
    source without batch sizes (Triton's summary) keeps the seed's rule."""
    policy = WindowPolicy(target_p95_ms=25, min_requests=20)
    lone = decide(policy, "m", 600, 12.0, 2000, per_batch=1.2)
    assert (lone.action, lone.window_us, lone.per_batch) == ("hold", 600, 1.2)
    assert "not batching" in lone.reason and "1.20 requests (< 2)" in lone.reason
    assert decide(policy, "m", 600, 12.0, 2000, per_batch=2.5).action == "widen"
    assert decide(policy, "m", 600, 12.0, 2000).action == "widen"
    assert decide(policy, "m", 600, 40.0, 2000, per_batch=1.0).action == "narrow"
    assert decide(WindowPolicy(target_p95_ms=25, widen_min_per_batch=1), "m", 600, 12.0, 2000, 1.0).action == "widen"
    with pytest.raises(ValueError, match="widen_min_per_batch"):
        WindowPolicy(widen_min_per_batch=0.5)

    b = FakeBatcher(window_us=600)
    c = in_process({"m": b}, policy)
    c.prime()
    for batch, action in ((1, "hold"), (4, "widen")):
        b.now += 10
        b.complete([10.0] * 40, batch=batch)
        (d,) = c.step()
        assert (d.action, d.per_batch) == (action, float(batch))
    assert b.sets == [650]


def test_controller_moves_the_batchers_window_one_step_per_period_inside_the_clamp():
    b = FakeBatcher(window_us=600)
    policy = WindowPolicy(target_p95_ms=50, step_us=50, min_us=500, max_us=700, min_requests=20)
    c = in_process({"m": b}, policy)
    c.prime()
    actions = []
    for latency in [10.0, 10.0, 10.0, 47.0, 80.0, 80.0, 80.0, 80.0, 46.0, 10.0]:
        b.now += 10
        b.complete([latency] * 40)
        (d,) = c.step()
        actions.append((d.action, d.window_us))
    assert actions == [
        ("widen", 650),
        ("widen", 700),
        ("hold", 700),  # at the ceiling
        ("hold", 700),  # 47 ms: in the dead band (45..50 ms)
        ("narrow", 650),
        ("narrow", 600),
        ("narrow", 550),
        ("narrow", 500),
        ("hold", 500),  # 46 ms: dead band
        ("widen", 550),
    ]
    assert b.sets == [650, 700, 650, 600, 550, 500, 550]  # set only on a change
    text = c.metrics_text()
    assert 'gpuhost_adaptive_window_us{model="m"} 550' in text
    assert 'gpuhost_adaptive_window_p95_ms{model="m"} 10' in text
    assert 'gpuhost_adaptive_window_target_p95_ms{model="m"} 50' in text
    assert 'gpuhost_adaptive_window_decisions_total{model="m",action="narrow"} 4' in text
    assert 'gpuhost_adaptive_window_decisions_total{model="m",action="hold"} 3' in text


def test_a_failing_period_is_counted_and_the_window_kept():
    b = FakeBatcher(window_us=600)

    def broken(model):
        raise OSError("metrics unreachable")

    c = Controller(WindowPolicy(), ["m"], broken, BatcherWindow({"m": b}))
    assert c.step() == [] and b.sets == [] and b.window_us == 600
    assert 'gpuhost_adaptive_window_errors_total{model="m"} 1' in c.metrics_text()


def test_published_window_for_a_client_that_is_not_gpuhosts():
    w = PublishedWindow(["a", "b"], 600)
    c = Controller(WindowPolicy(min_requests=1), ["a", "b"], lambda m: (10.0 if m == "a" else 90.0, 100), w)
    c.step()
    assert w.snapshot() == {"a": 650, "b": 550}


# ------------------------------------------------------------------ Triton's window: operator action, rate limited


def test_reload_limit_allows_one_reload_per_model_per_interval(tmp_path):
    now = [1000.0]
    limit = ReloadLimit(str(tmp_path / "sub" / "reloads.json"), min_interval_s=600, clock=lambda: now[0])
    assert limit.acquire("m") == 1600.0
    now[0] = 1599.0
    with pytest.raises(RateLimited, match=r"m: Triton's window was reloaded 599 s ago; .* next allowed in 1 s"):
        limit.acquire("m")
    assert limit.acquire("other") == 2199.0  # per model
    now[0] = 1600.0
    assert limit.acquire("m") == 2200.0
    # The limit lives in the file: another process (a second operator) sees it.
    again = ReloadLimit(str(tmp_path / "sub" / "reloads.json"), min_interval_s=600, clock=lambda: 1700.0)
    with pytest.raises(RateLimited):
        again.acquire("m")


def test_reload_limit_holds_under_concurrent_operators(tmp_path):
    path = str(tmp_path / "reloads.json")
    results = []

    def one():
        try:
            ReloadLimit(path, 600).acquire("m")
            results.append("ok")
        except RateLimited:
            results.append("refused")

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["ok"] + ["refused"] * 7


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "text, what",
    [
        ("{not json", "not JSON"),
        ("[]", "a JSON list, not an object of model -> time"),
        ('"m"', "a JSON str, not an object of model -> time"),
        ('{"m": 1e308}', "the time of 'm' is 1e+308, not a Unix time up to now"),
        ('{"m": NaN}', "the time of 'm' is nan, not a Unix time up to now"),
        ('{"m": Infinity}', "the time of 'm' is inf, not a Unix time up to now"),
        ('{"m": -5}', "the time of 'm' is -5, not a Unix time up to now"),
        ('{"m": "1000"}', "the time of 'm' is \"1000\", not a number"),
        ('{"m": true}', "the time of 'm' is true, not a number"),
        ('{"m": {"at": 1}}', "the time of 'm' is {\"at\": 1}, not a number"),
        (b"\xff\xfe{}", "not JSON"),
        ("[" * 100_000, "not JSON"),
    ],
)
def test_a_bad_reload_state_is_refused_with_one_line_and_left_alone(tmp_path, text, what):
    """A state that is not ``{model: unix time}`` is refused, naming the file and the fix; NaN, which compares
    false with everything, would otherwise let every reload through the limit."""
    path = tmp_path / "reloads.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = path.read_bytes()
    with pytest.raises(StateError) as e:
        ReloadLimit(str(path), clock=lambda: 2000.0).acquire("m")
    assert str(e.value) == f"{path}: {what}, not the state the reload limit writes; fix or remove it"
    assert path.read_bytes() == before


def test_the_reload_command_answers_a_bad_state_in_one_line_without_a_traceback(tmp_path):
    """The operator command: one line and exit 1, before any request to Triton (nothing listens at the URL)."""
    path = tmp_path / "reloads.json"
    for text in ("[]", '{"m": 1e308}', '{"m": NaN}'):
        path.write_text(text)
        r = subprocess.run(
            [sys.executable, str(ROOT / "serving" / "adaptive_window.py"), "reload-triton-window", "--model", "m"]
            + ["--window-us", "500", "--state", str(path), "--triton-url", "http://127.0.0.1:9"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1, r.stdout + r.stderr
        assert r.stderr == "" and r.stdout.count("\n") == 1, r.stdout + r.stderr
        assert r.stdout.startswith(f"failed: {path}: the time of 'm'") or r.stdout.startswith(f"failed: {path}: a JSON")


def test_the_reload_state_is_never_written_through_a_symbolic_link(tmp_path):
    """A link planted at the state path (or its lock) is refused; the file it points to is not touched."""
    target = tmp_path / "shadow"
    target.write_text("root:x:0:0\n")
    path = tmp_path / "reloads.json"
    path.symlink_to(target)
    with pytest.raises(StateError, match=r"reloads.json is a symbolic link; .* remove it"):
        ReloadLimit(str(path), clock=lambda: 2000.0).acquire("m")
    assert target.read_text() == "root:x:0:0\n" and path.is_symlink()
    path.unlink()
    (tmp_path / "reloads.json.lock").unlink()
    (tmp_path / "reloads.json.lock").symlink_to(target)
    with pytest.raises(StateError, match=r"reloads.json.lock is a symbolic link"):
        ReloadLimit(str(path), clock=lambda: 2000.0).acquire("m")
    assert target.read_text() == "root:x:0:0\n" and not path.exists()


def test_the_reload_state_is_replaced_by_rename_and_a_fifo_is_refused(tmp_path):
    """The new state is a new file renamed into place (a reader never sees half of it); nothing else is left in
    the directory but the state and its lock; a FIFO at the path is refused at once, not waited on."""
    path = tmp_path / "reloads.json"
    path.write_text('{"other": 1000}')
    inode = path.stat().st_ino
    ReloadLimit(str(path), clock=lambda: 2000.0).acquire("m")
    assert json.loads(path.read_text()) == {"m": 2000.0, "other": 1000}
    assert path.stat().st_ino != inode and path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reloads.json", "reloads.json.lock"]
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(StateError, match="reloads.json is not a regular file; remove it"):
        ReloadLimit(str(path), clock=lambda: 2000.0).acquire("m")
