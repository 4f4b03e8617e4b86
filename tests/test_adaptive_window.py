"""Adaptive batching window, pure parts: the decision table, Triton's summary parsed from a real capture, the
config override and the exported metrics."""

import json
import math
from pathlib import Path

import pytest

from serving.adaptive_window import (
    Decision,
    ModelState,
    WindowPolicy,
    decide,
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
