"""Adaptive batching window (seed 004): every period, move the client's micro-batching window (``WINDOW_US`` in the
seed's ``client_microbatch.py``, initial 600 µs) one step towards the p95 target, inside a clamp, at runtime and in
process: no reload, no restart, no dropped request.

Seed 004: "以 p95 目标为约束（如 50ms），如果稳定低于目标，就每 10s 把 WINDOW_US+50；如果超过，就 -50；在
[200, 1500]us 内夹紧" — below the target the window widens (bigger batches, more throughput), above it the window
narrows (less queueing). A dead band under the target (``hysteresis``, 10 %) holds the window when p95 sits just
under the target, so it does not flap between two values; a period with too few requests holds it too. Triton's
``max_queue_delay_microseconds`` is the server-side upper bound, set per GPU by the preset; it is not in the loop.

Where the window lives (``WindowActuator``):

* ``BatcherWindow``: gpuhost's own client, ``serving.microbatch.MicroBatcher``, in the same process:
  ``MicroBatcher.set_window`` takes effect on the next deadline, open batches included;
* ``PublishedWindow``: a client that is not gpuhost's. The controller (the systemd unit beside Triton,
  ``plans/adaptive_window.py``) keeps the window and publishes it on ``GET /window`` (JSON ``{model: µs}``) and on
  /metrics; the client reads it each period and applies it to its own micro-batching window.

Where p95 comes from: the client's own sliding window of latencies (``ClientP95``: the requests that completed
during the last period, from the micro-batcher's records) or, where the client is not gpuhost's, Triton's
``nv_inference_request_summary_us`` quantile 0.95 (``TritonP95``; Triton started with
``--metrics-config=summary_latencies=true``).

In process (the client's event loop or a thread)::

    async with MicroBatcher(TritonBatchInfer(client, "yolov8n"), BatchPolicy(window_us=600)) as mb:
        controller = in_process({"yolov8n": mb}, WindowPolicy(target_p95_ms=50))
        serve_metrics(controller, "0.0.0.0", 9108)          # decisions for Prometheus
        task = asyncio.create_task(controller.run_async())  # cancel it to stop

As the unit beside Triton (standard library only; p95 from Triton, window published)::

    python3 adaptive_window.py --triton-url http://127.0.0.1:8000 --metrics-url http://127.0.0.1:8002 \\
        --model resnet50 --target-p95-ms 50 --step-us 50 --period-s 10 --min-us 200 --max-us 1500 \\
        --initial-us 600 --listen 0.0.0.0:9108          # /metrics and /window

Triton's own window changes only by an explicit operator action, rate limited per model (one reload per 10 min by
default, recorded in a state file shared by every operator of the host), never by the control loop::

    python3 adaptive_window.py reload-triton-window --model resnet50 --window-us 800 \\
        [--triton-url http://127.0.0.1:8000] [--min-interval-s 600] [--state /var/lib/gpuhost/adaptive-window-reloads.json] \\
        [--key-file /etc/gpuhost/triton-control.env]    # as root: Triton's repository API needs the host's key

Pure parts (tested on tables): ``decide``, ``parse_summary``, ``with_window``, ``load_body``, ``render_metrics``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import http.server
import json
import logging
import math
import os
import re
import stat
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol

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
    # Widen only when the window batches: the period's batches held at least this many requests on average (the
    # seed: "记录 batch 实际大小分布（看窗口是否有效）"). A window that closes on one request adds its whole wait to
    # that request and batches nothing; widening it only spends the latency headroom. Needs the client's own records
    # (``ClientP95``); a source without batch sizes (``TritonP95``) leaves the seed's rule as it is. 1: always widen.
    widen_min_per_batch: float = 2.0

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
        if not self.widen_min_per_batch >= 1:
            errors.append(f"widen_min_per_batch must be ≥ 1 (requests per batch), got {self.widen_min_per_batch}")
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
    per_batch: Optional[float] = None  # requests per batch in the period (None: the source does not know)

    @property
    def changed(self) -> bool:
        return self.window_us != self.previous_us


def decide(
    policy: WindowPolicy, model: str, window_us: int, p95_ms: float, requests: int, per_batch: Optional[float] = None
) -> Decision:
    """The next window for one model, from the p95, request count and (where known) requests per batch of the last
    period (pure)."""

    def d(new: int, action: str, reason: str) -> Decision:
        return Decision(model, window_us, new, action, reason, p95_ms, requests, per_batch=per_batch)

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
        if per_batch is not None and per_batch < policy.widen_min_per_batch:
            return d(
                window_us,
                "hold",
                why + f"; batches hold {per_batch:.2f} requests (< {policy.widen_min_per_batch:g}): the window is "
                "not batching, widening would only add its wait",
            )
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

    def __init__(self, url: str, metrics_url: str, timeout_s: float = 60.0, control_key: str = ""):
        self.url, self.metrics_url, self.timeout_s = url.rstrip("/"), metrics_url.rstrip("/"), timeout_s
        # Triton's model-repository API answers only requests carrying the host's control key (the reload's).
        self.control_key = control_key

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
            headers={
                "Content-Type": "application/json",
                **({CONTROL_HEADER: self.control_key} if self.control_key else {}),
            },
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


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values (serving.microbatch's latency records use it too)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[max(1, math.ceil(q / 100.0 * len(ordered))) - 1]


class ClientP95:
    """p95 from the client's own sliding window: the requests that completed since the last read (one period),
    from each model's ``MicroBatcher`` records (``stats.records``, ``clock``). Every request counts in exactly one
    period; failed ones count as requests but carry no latency. Also the period's requests per batch (a batch of
    ``k`` leaves ``k`` records that complete together: requests / Σ 1/k)."""

    def __init__(self, batchers: Mapping[str, Any]):
        self.batchers = batchers
        self.since: dict[str, float] = {}

    def __call__(self, model: str) -> tuple[float, int, Optional[float]]:
        batcher = self.batchers[model]
        now = batcher.clock()
        since = self.since.get(model, -math.inf)
        self.since[model] = now
        records = list(batcher.stats.records)  # one copy, taken at once (the loop may be appending)
        period = [r for r in records if since <= r.submitted + r.latency_s < now]
        batches = sum(1.0 / max(1, r.batch_size) for r in period)
        per_batch = len(period) / batches if batches else None
        return percentile([r.latency_s * 1e3 for r in period if r.ok], 95), len(period), per_batch


# ---------------------------------------------------------------- where the window lives


class WindowActuator(Protocol):
    def get(self, model: str) -> int: ...

    def set(self, model: str, window_us: int) -> None: ...


class BatcherWindow:
    """The window of gpuhost's own micro-batchers in this process (``MicroBatcher.set_window``, one per model)."""

    def __init__(self, batchers: Mapping[str, Any]):
        self.batchers = batchers

    def get(self, model: str) -> int:
        return int(self.batchers[model].window_us)

    def set(self, model: str, window_us: int) -> None:
        self.batchers[model].set_window(window_us)


class PublishedWindow:
    """The window of a client that is not gpuhost's: kept here, published on ``GET /window`` and on /metrics."""

    def __init__(self, models: list[str], initial_us: int):
        self.windows = {m: int(initial_us) for m in models}
        self.lock = threading.Lock()

    def get(self, model: str) -> int:
        with self.lock:
            return self.windows[model]

    def set(self, model: str, window_us: int) -> None:
        with self.lock:
            self.windows[model] = int(window_us)

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.windows)


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

    def per_model(name: str, kind: str, help_: str, value: Callable[[ModelState], Optional[float]]) -> None:
        family(name, kind, help_, [(f'model="{_esc(m)}"', v) for m, s in ms if (v := value(s)) is not None])

    per_model(
        "gpuhost_adaptive_window_us",
        "gauge",
        "Batching window the controller last set or read (µs).",
        lambda s: s.window_us,
    )
    per_model(
        "gpuhost_adaptive_window_p95_ms",
        "gauge",
        "p95 latency the last decision was based on (ms).",
        lambda s: s.p95_ms,
    )
    per_model("gpuhost_adaptive_window_target_p95_ms", "gauge", "p95 target (ms).", lambda s: policy.target_p95_ms)
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
    per_model(
        "gpuhost_adaptive_window_errors_total",
        "counter",
        "Periods that failed (metrics, config or load).",
        lambda s: s.errors,
    )
    per_model(
        "gpuhost_adaptive_window_last_decision_timestamp_seconds",
        "gauge",
        "Unix time of the last decision.",
        lambda s: s.last_decision_s,
    )
    return "\n".join(out) + "\n"


class Controller:
    """One decision per model per period; the window moves where ``window`` keeps it, never by a model reload.

    Args:
      policy: target, step, period and clamp.
      models: model names whose window it moves.
      p95: callable ``model -> (p95_ms, requests in the period[, requests per batch])`` (``ClientP95`` or
        ``TritonP95``).
      window: where the window is read and set (``BatcherWindow`` in process, ``PublishedWindow`` for a client
        that is not gpuhost's).
    """

    def __init__(
        self,
        policy: WindowPolicy,
        models: list[str],
        p95: Callable[[str], tuple],
        window: WindowActuator,
        *,
        on_decision: Optional[Callable[[Decision], None]] = None,
    ):
        self.policy, self.models, self.p95, self.window = policy, list(models), p95, window
        self.states = {m: ModelState() for m in self.models}
        self.decisions: list[Decision] = []
        self.on_decision = on_decision
        self.lock = threading.Lock()

    def step(self) -> list[Decision]:
        out = []
        for model in self.models:
            state = self.states[model]
            at = time.time()
            try:
                current = self.window.get(model)
                p95_ms, requests, *more = self.p95(model)
                per_batch = more[0] if more else None
                d = dataclasses.replace(decide(self.policy, model, current, p95_ms, requests, per_batch), at=at)
                if d.changed:
                    self.window.set(model, d.window_us)
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

    def prime(self) -> None:
        """Start the first period now: read each source once (Triton's counters, the client's records) and show
        the starting window on /metrics."""
        for model in self.models:
            try:
                self.p95(model)
                with self.lock:
                    self.states[model].window_us = self.window.get(model)
            except Exception as e:  # noqa: BLE001
                log.warning("%s: cannot read p95 yet: %s", model, e)

    def run(self, stop: threading.Event) -> None:
        """Decide every ``period_s`` until ``stop`` is set (a thread of its own)."""
        self.prime()
        next_at = time.monotonic() + self.policy.period_s
        while not stop.wait(max(0.0, next_at - time.monotonic())):
            self.step()
            next_at += self.policy.period_s
            if next_at < time.monotonic():  # a slow period: start the next one now
                next_at = time.monotonic() + self.policy.period_s

    async def run_async(self) -> None:
        """Decide every ``period_s`` in the running event loop (the client's own) until cancelled."""
        self.prime()
        next_at = time.monotonic() + self.policy.period_s
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            self.step()
            next_at += self.policy.period_s
            if next_at < time.monotonic():
                next_at = time.monotonic() + self.policy.period_s

    def metrics_text(self) -> str:
        with self.lock:
            return render_metrics(self.policy, self.states)


def in_process(batchers: Mapping[str, Any], policy: WindowPolicy, **kwargs: Any) -> Controller:
    """A controller moving the windows of this process's micro-batchers (``{model: MicroBatcher}``), p95 from their
    own records."""
    return Controller(policy, list(batchers), ClientP95(batchers), BatcherWindow(batchers), **kwargs)


def serve_metrics(controller: Controller, host: str, port: int) -> http.server.ThreadingHTTPServer:
    """Expose ``controller.metrics_text()`` on ``http://host:port/metrics`` from a daemon thread; with a
    ``PublishedWindow``, the windows as JSON on ``/window`` too."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 — http.server's naming
            path = self.path.split("?")[0]
            if path == "/metrics":
                body, kind = controller.metrics_text().encode(), "text/plain; version=0.0.4"
            elif path == "/window" and isinstance(controller.window, PublishedWindow):
                body, kind = json.dumps(controller.window.snapshot()).encode(), "application/json"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):
            pass

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="adaptive-window-metrics", daemon=True).start()
    return server


# ---------------------------------------------------------------- Triton's window: an operator action only

RELOAD_STATE = "/var/lib/gpuhost/adaptive-window-reloads.json"
# The host's Triton control key (plans/triton_runtime.py; root 0600): this script stays standard-library only, so
# the names are repeated here (a test holds them equal).
CONTROL_KEY_PATH = "/etc/gpuhost/triton-control.env"
CONTROL_KEY_VAR = "GPUHOST_TRITON_CONTROL_KEY"
CONTROL_HEADER = "gpuhost-control-key"


def read_control_key(path: str) -> str:
    """The key from the control key file (``GPUHOST_TRITON_CONTROL_KEY=<hex>``); "" when there is none (a Triton
    without restricted APIs); RuntimeError naming the file when it is unreadable or holds no key."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return ""
    except OSError as e:
        raise RuntimeError(f"{path}: {e.strerror}; run the reload as root (the key file is root's)") from None
    with os.fdopen(fd, "rb") as f:
        text = f.read(4096).decode(errors="replace")
    for line in text.splitlines():
        name, _, value = line.strip().partition("=")
        if name == CONTROL_KEY_VAR and re.fullmatch(r"[0-9a-f]{64}", value):
            return value
    raise RuntimeError(f"{path} holds no {CONTROL_KEY_VAR}=<64 hex digits> line; run `pulumi up` to make it again")


RELOAD_MIN_INTERVAL_S = 600.0


class RateLimited(RuntimeError):
    pass


class ReloadLimit:
    """At most one Triton window reload per model every ``min_interval_s``; the times are kept in ``path`` (JSON
    ``{model: unix time}``), so every operator and every shell on the host shares the limit.

    The state is read and replaced under an flock of ``<path>.lock``; neither file is opened through a symbolic
    link (``O_NOFOLLOW``: a link planted at either path would otherwise aim a root operator's write anywhere) and
    the new state goes to a temporary file in the same directory, renamed over ``path``. A state that is not such
    an object (``[]``, a time that is not a finite Unix time: ``NaN`` would let every reload through) is refused
    with one line naming the file.
    """

    def __init__(
        self,
        path: str = RELOAD_STATE,
        min_interval_s: float = RELOAD_MIN_INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ):
        if not 0 <= min_interval_s < math.inf:
            raise ValueError(f"min_interval_s must be finite and ≥ 0, got {min_interval_s}")
        self.path, self.min_interval_s, self.clock = path, min_interval_s, clock

    def _open(self, path: str, flags: int) -> int:
        try:
            # O_NONBLOCK: a FIFO planted at the path fails the regular-file check below instead of hanging the open.
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise StateError(
                    f"{path} is a symbolic link; the reload limit writes only its own file: remove it"
                ) from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise StateError(f"{path} is not a regular file; remove it")
        return fd

    def _read(self) -> dict[str, float]:
        try:
            fd = self._open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return {}
        with os.fdopen(fd, "rb") as f:
            data = f.read(1 << 20)
        return parse_reload_state(data, self.path, self.clock())

    def _write(self, done: dict[str, float]) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix=".reloads-", dir=directory)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(done, sort_keys=True))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)  # replaces a link at `path` itself, never what it points to
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def acquire(self, model: str, record: bool = True) -> float:
        """Record a reload of ``model`` now, or raise ``RateLimited`` naming when the next one is allowed; returns
        the time of the next allowed reload. A bad state file raises ``StateError`` (one line: file and fix).
        ``record=False`` only checks (nothing written)."""
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        lock = self._open(self.path + ".lock", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            done = self._read()
            now = self.clock()
            last = done.get(model)
            if last is not None and now - last < self.min_interval_s:
                allowed = last + self.min_interval_s
                raise RateLimited(
                    f"{model}: Triton's window was reloaded {now - last:.0f} s ago; one reload per "
                    f"{self.min_interval_s:g} s: next allowed in {allowed - now:.0f} s "
                    f"({time.strftime('%H:%M:%S', time.gmtime(allowed))} UTC)"
                )
            if record:
                done[model] = now
                self._write(done)
            return now + self.min_interval_s
        finally:
            os.close(lock)


class StateError(RuntimeError):
    """The reload state file is not what the reload limit writes (one line: the file and the fix)."""


# A recorded time may lie this far ahead of the clock (a clock stepped back); further is not a time this wrote.
_STATE_FUTURE_S = 86400.0


def parse_reload_state(data: bytes, path: str, now: float) -> dict[str, float]:
    """``{model: unix time}`` from the state file's bytes (pure), or ``StateError`` naming the file and what is wrong.

    >>> parse_reload_state(b'{"m": 1000.5}', "s.json", 2000.0)
    {'m': 1000.5}
    """

    def bad(what: str) -> StateError:
        return StateError(f"{path}: {what}, not the state the reload limit writes; fix or remove it")

    if not data.strip():
        return {}
    try:
        done = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise bad("not JSON") from None
    if not isinstance(done, dict):
        raise bad(f"a JSON {type(done).__name__}, not an object of model -> time")
    out: dict[str, float] = {}
    for model, t in done.items():
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            raise bad(f"the time of {model!r} is {json.dumps(t)[:40]}, not a number")
        if not (math.isfinite(t) and 0 <= t <= now + _STATE_FUTURE_S):
            raise bad(f"the time of {model!r} is {t!r}, not a Unix time up to now")
        out[model] = float(t)
    return out


def reload_triton_window(triton: Triton, model: str, window_us: int, limit: ReloadLimit) -> tuple[int, int, float]:
    """The operator action: load ``model`` again with its served config and a new ``max_queue_delay_microseconds``
    (Triton with ``--model-control-mode=explicit``), if the rate limit allows. Returns (old µs, new µs, next allowed
    reload). The attempt counts against the limit even when the load fails."""
    if not 0 <= window_us <= 1_000_000:
        raise ValueError(f"--window-us: {window_us} µs is outside 0..1000000")
    limit.acquire(model, record=False)  # a bad state or a reload too soon: refused before any request to Triton
    config = triton.config(model)
    before = served_window(config)
    new = with_window(config, window_us)
    next_at = limit.acquire(model)
    triton.load(model, new)
    return before, window_us, next_at


def reload_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="adaptive_window.py reload-triton-window",
        description="Operator action: set Triton's max_queue_delay_microseconds by a model reload (rate limited).",
    )
    p.add_argument("--triton-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--window-us", type=int, required=True)
    p.add_argument("--min-interval-s", type=float, default=RELOAD_MIN_INTERVAL_S)
    p.add_argument("--state", default=RELOAD_STATE)
    p.add_argument("--key-file", default=CONTROL_KEY_PATH, help="the host's Triton control key (root's)")
    a = p.parse_args(argv)
    try:
        triton = Triton(a.triton_url, a.triton_url, control_key=read_control_key(a.key_file))
        before, after, next_at = reload_triton_window(
            triton, a.model, a.window_us, ReloadLimit(a.state, a.min_interval_s)
        )
    except RateLimited as e:
        print(f"refused: {e}")
        return 2
    except (RuntimeError, ValueError, OSError) as e:
        print(f"failed: {e}")
        return 1
    print(
        f"{a.model}: Triton window {before} -> {after} µs by reload; next reload allowed at "
        f"{time.strftime('%H:%M:%S', time.gmtime(next_at))} UTC"
    )
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["reload-triton-window"]:
        return reload_main(argv[1:])
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
    p.add_argument("--initial-us", type=int, default=600, help="published window before the first decision (µs)")
    p.add_argument("--hysteresis", type=float, default=defaults.hysteresis)
    p.add_argument("--min-requests", type=int, default=defaults.min_requests)
    p.add_argument("--listen", default="127.0.0.1:9108", help="host:port of /metrics and /window ('' for none)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    policy = WindowPolicy(a.target_p95_ms, a.step_us, a.period_s, a.min_us, a.max_us, a.hysteresis, a.min_requests)
    if not policy.min_us <= a.initial_us <= policy.max_us:
        p.error(f"--initial-us {a.initial_us} is outside the clamp [{policy.min_us}, {policy.max_us}] µs")
    triton = Triton(a.triton_url, a.metrics_url)
    controller = Controller(policy, a.model, TritonP95(triton), PublishedWindow(a.model, a.initial_us))
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
