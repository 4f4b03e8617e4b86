"""Adaptive batching window (seed 004): every period, move Triton's ``max_queue_delay_microseconds`` one step
towards the p95 target, inside a clamp.

Seed 004: "以 p95 目标为约束（如 50ms），如果稳定低于目标，就每 10s 把 WINDOW_US+50；如果超过，就 -50；在
[200, 1500]us 内夹紧" — below the target the window widens (bigger batches, more throughput), above it the window
narrows (less queueing). A dead band under the target (``hysteresis``, 10 %) holds the window when p95 sits just
under the target, so it does not flap between two values; a period with too few requests holds it too.

Where p95 comes from: Triton's ``nv_inference_request_summary_us`` quantile 0.95 (Triton started with
``--metrics-config=summary_latencies=true``; a sliding window of about a minute) or, in-process, any callable such
as a micro-batching client's own records. Where the window goes: Triton's model-control API, loading the model
again with its served config and the new value as a config override (Triton started with
``--model-control-mode=explicit``); Triton keeps serving the old instance until the new one is ready.

Standard library only, so the same file runs on the serving guest under systemd::

    python3 adaptive_window.py --triton-url http://127.0.0.1:8000 --metrics-url http://127.0.0.1:8002 \\
        --model resnet50 --target-p95-ms 50 --step-us 50 --period-s 10 --min-us 200 --max-us 1500 \\
        --listen 127.0.0.1:9108          # decisions as Prometheus metrics on /metrics

Pure parts (tested on tables): ``decide``, ``parse_summary``, ``with_window``, ``load_body``, ``render_metrics``.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.server
import json
import logging
import math
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, Optional

log = logging.getLogger("gpuhost.adaptive_window")


@dataclasses.dataclass(frozen=True)
class WindowPolicy:
    """Seed 004's numbers are the defaults: 50 ms target, ±50 µs every 10 s, clamp [200, 1500] µs."""

    target_p95_ms: float = 50.0
    step_us: int = 50
    period_s: float = 10.0
    min_us: int = 200
    max_us: int = 1500
    hysteresis: float = 0.1  # widen only when p95 < target·(1 − hysteresis)
    min_requests: int = 20  # fewer requests in a period is no evidence either way

    def __post_init__(self):
        errors = []
        if not self.target_p95_ms > 0:
            errors.append(f"target_p95_ms must be > 0, got {self.target_p95_ms}")
        if self.step_us < 1:
            errors.append(f"step_us must be ≥ 1, got {self.step_us}")
        if not self.period_s > 0:
            errors.append(f"period_s must be > 0, got {self.period_s}")
        if self.min_us < 0 or self.max_us < self.min_us:
            errors.append(f"clamp [{self.min_us}, {self.max_us}] µs is empty or negative")
        if not 0 <= self.hysteresis < 1:
            errors.append(f"hysteresis must be in [0, 1), got {self.hysteresis}")
        if errors:
            raise ValueError("; ".join(errors))


@dataclasses.dataclass(frozen=True)
class Decision:
    model: str
    previous_us: int
    window_us: int
    action: str  # "widen" | "narrow" | "hold" | "clamp"
    reason: str
    p95_ms: float
    requests: int
    at: float = 0.0  # Unix time the period ended and the decision was taken (set by the controller)

    @property
    def changed(self) -> bool:
        return self.window_us != self.previous_us


def decide(policy: WindowPolicy, model: str, window_us: int, p95_ms: float, requests: int) -> Decision:
    """The next window for one model, from the p95 and request count of the last period (pure)."""

    def d(new: int, action: str, reason: str) -> Decision:
        return Decision(model, window_us, new, action, reason, p95_ms, requests)

    clamped = min(policy.max_us, max(policy.min_us, window_us))
    if clamped != window_us:
        return d(clamped, "clamp", f"served window {window_us} µs is outside [{policy.min_us}, {policy.max_us}] µs")
    if requests < policy.min_requests or math.isnan(p95_ms):
        return d(window_us, "hold", f"{requests} requests in the period (< {policy.min_requests}): no evidence")
    if p95_ms > policy.target_p95_ms:
        new = max(policy.min_us, window_us - policy.step_us)
        why = f"p95 {p95_ms:.2f} ms > target {policy.target_p95_ms:g} ms"
        return d(new, "narrow", why) if new != window_us else d(window_us, "hold", why + f"; at the floor {new} µs")
    if p95_ms < policy.target_p95_ms * (1 - policy.hysteresis):
        new = min(policy.max_us, window_us + policy.step_us)
        why = f"p95 {p95_ms:.2f} ms < {1 - policy.hysteresis:.0%} of target {policy.target_p95_ms:g} ms"
        return d(new, "widen", why) if new != window_us else d(window_us, "hold", why + f"; at the ceiling {new} µs")
    return d(window_us, "hold", f"p95 {p95_ms:.2f} ms within the band under target {policy.target_p95_ms:g} ms")


# ---------------------------------------------------------------- Triton: metrics, config, model control

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_summary(
    text: str, model: str, metric: str = "nv_inference_request_summary_us", quantile: str = "0.95"
) -> tuple[float, int]:
    """(p95 in ms, request count) of one model from Triton's /metrics text; several versions: worst p95, summed
    count. Raises LookupError when the summary is not exported (Triton without summary_latencies)."""
    p95_us: list[float] = []
    count = 0
    found = False
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or not m.group("name").startswith(metric):
            continue
        labels = dict(_LABEL.findall(m.group("labels")))
        if labels.get("model") != model:
            continue
        name, value = m.group("name"), float(m.group("value"))
        if name == metric and labels.get("quantile") == quantile:
            found = True
            if not math.isnan(value):
                p95_us.append(value)
        elif name == metric + "_count":
            found = True
            count += int(value)
    if not found:
        raise LookupError(
            f"{metric} for model {model!r} is not in Triton's metrics; start Triton with "
            "--metrics-config=summary_latencies=true"
        )
    return (max(p95_us) / 1000.0 if p95_us else math.nan), count


def with_window(config: dict, window_us: int) -> dict:
    """The model's served config with a new batching window (pure; the config must have dynamic batching)."""
    if "dynamic_batching" not in config:
        raise ValueError(f"model {config.get('name')!r} has no dynamic_batching: no window to move")
    new = json.loads(json.dumps(config))
    new["dynamic_batching"]["max_queue_delay_microseconds"] = int(window_us)
    return new


def served_window(config: dict) -> int:
    return int(config.get("dynamic_batching", {}).get("max_queue_delay_microseconds", 0))


def load_body(config: dict) -> bytes:
    """POST /v2/repository/models/<m>/load body: the whole config as an override (Triton's model-control API)."""
    return json.dumps({"parameters": {"config": json.dumps(config)}}).encode()


class Triton:
    """Triton's HTTP endpoints the controller uses (standard library only)."""

    def __init__(self, url: str, metrics_url: str, timeout_s: float = 60.0):
        self.url, self.metrics_url, self.timeout_s = url.rstrip("/"), metrics_url.rstrip("/"), timeout_s

    def _get(self, url: str) -> bytes:
        with urllib.request.urlopen(url, timeout=self.timeout_s) as r:
            return r.read()

    def metrics(self) -> str:
        return self._get(self.metrics_url + "/metrics").decode()

    def config(self, model: str) -> dict:
        return json.loads(self._get(f"{self.url}/v2/models/{urllib.parse.quote(model)}/config"))

    def load(self, model: str, config: dict) -> None:
        req = urllib.request.Request(
            f"{self.url}/v2/repository/models/{urllib.parse.quote(model)}/load",
            data=load_body(config),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s):
                pass
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            hint = " (Triton needs --model-control-mode=explicit)" if "explicit" in detail.lower() else ""
            raise RuntimeError(f"loading {model} with a new window failed: HTTP {e.code} {detail}{hint}") from None


class TritonP95:
    """p95 source from Triton's summary; the request count is the summary count's growth since the last read."""

    def __init__(self, triton: Triton):
        self.triton = triton
        self.last_count: dict[str, int] = {}

    def __call__(self, model: str) -> tuple[float, int]:
        p95, count = parse_summary(self.triton.metrics(), model)
        previous = self.last_count.get(model)
        self.last_count[model] = count
        # A restarted Triton starts its counters again; count what it has.
        return p95, count if previous is None or count < previous else count - previous


# ---------------------------------------------------------------- controller and its metrics


@dataclasses.dataclass
class ModelState:
    window_us: Optional[int] = None
    p95_ms: float = math.nan
    actions: dict[str, int] = dataclasses.field(default_factory=dict)
    errors: int = 0
    last_decision_s: float = 0.0


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(policy: WindowPolicy, states: dict[str, ModelState]) -> str:
    """Prometheus text exposition of the controller's decisions (pure)."""
    out = []

    def family(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{{{labels}}} {value:g}" for labels, value in samples)

    ms = sorted(states.items())
    family(
        "gpuhost_adaptive_window_us",
        "gauge",
        "Batching window the controller last set or read (µs).",
        [(f'model="{_esc(m)}"', s.window_us) for m, s in ms if s.window_us is not None],
    )
    family(
        "gpuhost_adaptive_window_p95_ms",
        "gauge",
        "p95 latency the last decision was based on (ms).",
        [(f'model="{_esc(m)}"', s.p95_ms) for m, s in ms],
    )
    family(
        "gpuhost_adaptive_window_target_p95_ms",
        "gauge",
        "p95 target (ms).",
        [(f'model="{_esc(m)}"', policy.target_p95_ms) for m, _ in ms],
    )
    family(
        "gpuhost_adaptive_window_bound_us",
        "gauge",
        "Clamp of the window (µs).",
        [
            (f'model="{_esc(m)}",bound="{b}"', v)
            for m, _ in ms
            for b, v in (("min", policy.min_us), ("max", policy.max_us))
        ],
    )
    family(
        "gpuhost_adaptive_window_decisions_total",
        "counter",
        "Decisions taken, by action.",
        [
            (f'model="{_esc(m)}",action="{a}"', s.actions.get(a, 0))
            for m, s in ms
            for a in ("widen", "narrow", "hold", "clamp")
        ],
    )
    family(
        "gpuhost_adaptive_window_errors_total",
        "counter",
        "Periods that failed (metrics, config or load).",
        [(f'model="{_esc(m)}"', s.errors) for m, s in ms],
    )
    family(
        "gpuhost_adaptive_window_last_decision_timestamp_seconds",
        "gauge",
        "Unix time of the last decision.",
        [(f'model="{_esc(m)}"', s.last_decision_s) for m, s in ms],
    )
    return "\n".join(out) + "\n"


class Controller:
    """One decision per model per period.

    Args:
      policy: target, step, period and clamp.
      models: model names whose window it moves.
      p95: callable ``model -> (p95_ms, requests in the period)`` (``TritonP95`` or a client's records).
      triton: where the window is read (served config) and set (model load with a config override).
    """

    def __init__(
        self,
        policy: WindowPolicy,
        models: list[str],
        p95: Callable[[str], tuple[float, int]],
        triton: Triton,
        *,
        on_decision: Optional[Callable[[Decision], None]] = None,
    ):
        self.policy, self.models, self.p95, self.triton = policy, list(models), p95, triton
        self.states = {m: ModelState() for m in self.models}
        self.decisions: list[Decision] = []
        self.applied_at: dict[str, float] = {}
        self.on_decision = on_decision
        self.lock = threading.Lock()

    def step(self) -> list[Decision]:
        out = []
        for model in self.models:
            state = self.states[model]
            at = time.time()
            try:
                config = self.triton.config(model)
                current = served_window(config)
                p95_ms, requests = self.p95(model)
                d = dataclasses.replace(decide(self.policy, model, current, p95_ms, requests), at=at)
                if d.changed:
                    self.triton.load(model, with_window(config, d.window_us))
                    # A source that can (a client's own records) measures only what came after the reload.
                    self.applied_at[model] = time.perf_counter()
            except Exception as e:  # noqa: BLE001 — one bad period is counted and logged; the next one retries
                with self.lock:
                    state.errors += 1
                log.warning("%s: period failed: %s", model, e)
                continue
            with self.lock:
                state.window_us, state.p95_ms = d.window_us, p95_ms
                state.actions[d.action] = state.actions.get(d.action, 0) + 1
                state.last_decision_s = d.at
                self.decisions.append(d)
            log.info(
                "%s: %s %d -> %d µs (%s, %d requests)",
                model,
                d.action,
                d.previous_us,
                d.window_us,
                d.reason,
                d.requests,
            )
            if self.on_decision:
                self.on_decision(d)
            out.append(d)
        return out

    def run(self, stop: threading.Event) -> None:
        """Decide every ``period_s`` until ``stop`` is set; the first period only primes the request counters."""
        for model in self.models:
            try:
                self.p95(model)
            except Exception as e:  # noqa: BLE001
                log.warning("%s: cannot read p95 yet: %s", model, e)
        next_at = time.monotonic() + self.policy.period_s
        while not stop.wait(max(0.0, next_at - time.monotonic())):
            self.step()
            next_at += self.policy.period_s
            if next_at < time.monotonic():  # a slow load ate the period: start the next one now
                next_at = time.monotonic() + self.policy.period_s

    def metrics_text(self) -> str:
        with self.lock:
            return render_metrics(self.policy, self.states)


def serve_metrics(controller: Controller, host: str, port: int) -> http.server.ThreadingHTTPServer:
    """Expose ``controller.metrics_text()`` on ``http://host:port/metrics`` from a daemon thread."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 — http.server's naming
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = controller.metrics_text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):
            pass

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="adaptive-window-metrics", daemon=True).start()
    return server


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--triton-url", default="http://127.0.0.1:8000")
    p.add_argument("--metrics-url", default="http://127.0.0.1:8002")
    p.add_argument("--model", action="append", required=True, help="model whose window moves (repeatable)")
    defaults = WindowPolicy()
    p.add_argument("--target-p95-ms", type=float, default=defaults.target_p95_ms)
    p.add_argument("--step-us", type=int, default=defaults.step_us)
    p.add_argument("--period-s", type=float, default=defaults.period_s)
    p.add_argument("--min-us", type=int, default=defaults.min_us)
    p.add_argument("--max-us", type=int, default=defaults.max_us)
    p.add_argument("--hysteresis", type=float, default=defaults.hysteresis)
    p.add_argument("--min-requests", type=int, default=defaults.min_requests)
    p.add_argument("--listen", default="127.0.0.1:9108", help="host:port of the /metrics endpoint ('' for none)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    policy = WindowPolicy(a.target_p95_ms, a.step_us, a.period_s, a.min_us, a.max_us, a.hysteresis, a.min_requests)
    triton = Triton(a.triton_url, a.metrics_url)
    controller = Controller(policy, a.model, TritonP95(triton), triton)
    if a.listen:
        host, _, port = a.listen.rpartition(":")
        serve_metrics(controller, host or "127.0.0.1", int(port))
    stop = threading.Event()
    try:
        import signal

        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        controller.run(stop)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
