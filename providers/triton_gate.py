"""AcceptanceGate: health gate, answer check, warmup and a bounded load run through nginx, one per model; a miss
puts the previous deploy back and fails ``up`` with the numbers.

Runs from where Pulumi runs, against ``url`` (the nginx front). The request is built here from ``request``, the
model's own signature (input names, datatypes, shapes; STRING inputs for a prompt), as a KServe binary-extension
body (``gate.kserve``): no multi-megabyte JSON in state or on the wire. Steps:

1. ``expect_digest``: the guest must serve the repository this deploy wrote (a marker the repository provider
   keeps); otherwise a previous gate rolled it back and `pulumi up --refresh` is needed.
2. ``/v2/health/ready`` and every model's ready; then ``check_requests`` answers, each checked against the model's
   outputs (names, datatypes, shapes, byte sizes): a 200 with wrong or empty outputs fails the gate.
3. Warmup, the load tool's own floor on ``/nginx-health``, then the load (``gate.loadgate``; open loop at
   ``rate`` when set, every answer checked by the Python client) against p95/p99, error rate and throughput.

On any failure with ``rollback`` set, the snapshot taken before this deploy (``providers.serving_snapshot``) goes
back — repository and server files — the server restarts, one checked request proves the previous version serves,
and the error names the numbers and the rollback. Any change of ``trigger`` or of the load/SLO inputs re-runs the
gate as a replacement, so every deploy that changes serving is measured again.

Usage::

    AcceptanceGate("svc-yolov8n-gate", {"url": "http://10.0.0.5:80", "models": ["yolov8n"], "model": "yolov8n",
                   "request": signature, "concurrency": 8, "duration_s": 30, "max_requests": 200000,
                   "p95_ms": 8.0, "p99_ms": None, "max_error_rate": 0.0, "rate": None, "min_rps": None,
                   "trigger": repo.digest, "rollback": None})
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.parse
import urllib.request
from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult

from gate import kserve, loadgate
from gate.health import NotReady, wait_ready
from providers.base import HostProvider, HostResource, Provider
from providers.effects import Effect, host_name
from providers.progress import resource_label, ticking


def request_body(props: dict) -> tuple[bytes, dict[str, str]]:
    """The infer request the gate sends, built here (never carried in state): from ``request``, the model's whole
    signature (every input, STRING prompts included, binary); or from ``body_spec`` (one input; ``binary`` sends
    raw bytes) or ``body`` (JSON text) as earlier gates were given."""
    if props.get("request"):
        if kserve.takes_frames(props["request"]):
            first = kserve.frame_payloads(props["request"])[0]
            return first.body, dict(first.headers)
        return kserve.signature_request(props["request"])
    spec = props.get("body_spec")
    if spec and spec.get("binary"):
        import math
        import random

        shape = [int(d) for d in spec["shape"]]
        dtype = spec.get("datatype", "FP32")
        data = random.Random(0).randbytes(loadgate.DTYPE_BYTES[dtype] * math.prod(shape))
        body, headers = loadgate.binary_request([(spec["input"], dtype, shape, data)])
        return body, dict(headers)
    if spec:
        body = loadgate.infer_body(spec["input"], [int(d) for d in spec["shape"]], spec.get("datatype", "FP32"))
    else:
        body = props["body"].encode()
    return body, {"Content-Type": "application/json"}


# What the gate reads from a server at most: a model config, an answer (the biggest model's outputs fit).
CONFIG_LIMIT = 16 * 1024 * 1024
ANSWER_LIMIT = 256 * 1024 * 1024


def response_check(url: str, model: str, props: dict) -> Optional[loadgate.ResponseCheck]:
    """What every answer of the load run must hold, from the model config the server reports (names, datatypes,
    shapes, bytes; a -1 dimension checked against the shape answered). ``check_outputs: false`` turns it off."""
    if not props.get("check_outputs", True):
        return None
    try:
        with urllib.request.urlopen(f"{url}/v2/models/{model}/config", timeout=30) as r:
            config = json.loads(loadgate.read_limited(r, CONFIG_LIMIT))
        sig = props.get("request") or {}
        spec = props.get("body_spec") or {}
        shape = sig["inputs"][0]["shape"] if sig.get("inputs") else spec.get("shape")
        batch = int(shape[0]) if shape and int(config.get("max_batch_size", 0)) > 0 else 1
        return loadgate.ResponseCheck.from_config(config, batch=batch)
    except (OSError, http.client.HTTPException, loadgate.OversizedResponse, RecursionError) as e:
        raise GateError(f"{model}: reading its config from {url}: {type(e).__name__}: {e}") from None
    except (AttributeError, TypeError, ValueError) as e:
        raise GateError(f"{model}: the config {url} reports is not usable: {e}") from None


def post(url: str, body: bytes, headers: dict[str, str], timeout: float = 60.0) -> tuple[int, dict, bytes]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "", u.port or 80, timeout=timeout)
    try:
        conn.request("POST", u.path, body=body, headers={**headers, "Content-Length": str(len(body))})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), loadgate.read_limited(r, ANSWER_LIMIT)
    finally:
        conn.close()


def checked_request(infer_url: str, sig: dict, body: bytes, headers: dict, expect=None) -> list[str]:
    try:
        status, h, data = post(infer_url, body, headers)
    except (OSError, http.client.HTTPException, loadgate.OversizedResponse) as e:
        return [f"request failed: {type(e).__name__}: {e}"]
    if status != 200:
        return [f"HTTP {status}: {data[:300]!r}"]
    problems = kserve.answer_problems(sig, h, data)
    if not problems and expect is not None:
        why = expect(data, {k.lower(): v for k, v in h.items()}.get(loadgate.HEADER_LENGTH.lower()))
        problems = [why] if why else []
    return problems


class GateError(RuntimeError):
    pass


# Up to VERSION 6 the inputs were camelCase; state written then still carries these keys in its olds.
OLD_KEYS = {
    "durationS": "duration_s",
    "maxRequests": "max_requests",
    "p95Ms": "p95_ms",
    "p99Ms": "p99_ms",
    "maxErrorRate": "max_error_rate",
    "minRps": "min_rps",
    "bodySpec": "body_spec",
    "checkOutputs": "check_outputs",
    "checkRequests": "check_requests",
    "warmupRequests": "warmup_requests",
    "requestTimeoutS": "request_timeout_s",
    "readyTimeoutS": "ready_timeout_s",
    "expectDigest": "expect_digest",
}


def current_keys(props: dict) -> dict:
    """``props`` with the camelCase keys of state written before VERSION 7 renamed (a key already in snake_case
    wins), so old state diffs against new inputs value by value instead of as every input changed."""
    out = {k: v for k, v in props.items() if k not in OLD_KEYS}
    for old, new in OLD_KEYS.items():
        if old in props and new not in out:
            out[new] = props[old]
    return out


def _label(props: dict) -> str:
    return resource_label(props.get("owner_tag"), f"gate-{props.get('model')}")


class AcceptanceGateProvider(Provider):
    # Keys from secret config as every host provider gets them: the rollback reaches the guest over SSH.
    configure = HostProvider.configure
    VERSION = "7"  # 7: inputs in snake_case (state written before reads through OLD_KEYS)
    OUTPUT_ONLY = ("result", "overhead")
    _BOOKKEEPING = {"__provider", "version", "owner_tag", "result", "overhead"}
    DERIVED = (("expect_digest",), ("trigger",))  # the repository's digest; a hash of the deploy it measures

    def diff(self, _id: str, olds: dict, news: dict) -> DiffResult:
        return super().diff(_id, current_keys(olds), news)

    def effects(self, olds: dict | None, news: dict) -> list[Effect]:
        # Created or replaced (any change), the gate runs its load against the serving endpoint once.
        host = host_name(news.get("rollback") or {}) or urllib.parse.urlsplit(str(news.get("url"))).hostname or ""
        load = {
            "url": news.get("url"),
            "connections": news.get("concurrency"),
            "duration_s": news.get("duration_s"),
            "max_requests": news.get("max_requests"),
            "rate_rps": news.get("rate"),
            "p95_ms": news.get("p95_ms"),
            "p99_ms": news.get("p99_ms"),
            "max_error_rate": news.get("max_error_rate"),
            "min_rps": news.get("min_rps"),
        }
        how = "a miss rolls the deploy back" if news.get("rollback") else "a miss fails the update"
        return [Effect("gate", host, str(news.get("model")), how, load)]

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = []
        if not str(news.get("url", "")).startswith(("http://", "https://")):
            failures.append(CheckFailure("url", "must be an http(s) URL of the nginx front"))
        for key, low in (("concurrency", 1), ("duration_s", 0.1), ("max_requests", 1)):
            if not isinstance(news.get(key), (int, float)) or news[key] < low:
                failures.append(CheckFailure(key, f"must be a number >= {low}"))
        for key in ("p95_ms", "p99_ms", "rate", "min_rps"):
            if news.get(key) is not None and not (isinstance(news[key], (int, float)) and news[key] > 0):
                failures.append(CheckFailure(key, "must be > 0"))
        req = news.get("request")
        if req is not None and (not isinstance(req, dict) or not req.get("inputs") or not req.get("outputs")):
            failures.append(CheckFailure("request", "the model's signature: inputs and outputs"))
        if req is None and not news.get("body_spec") and not news.get("body"):
            failures.append(CheckFailure("request", "the model's signature (or a body_spec / body)"))
        return CheckResult(news, failures)

    def diff_known(self, _id: str, olds: dict, news: dict) -> DiffResult:
        changed = sorted(k for k in set(olds) | set(news) if k not in self._BOOKKEEPING and olds.get(k) != news.get(k))
        return DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=True)

    def diffed_keys(self, news: dict) -> list[str]:
        return [k for k in news if k not in self._BOOKKEEPING]

    def replaces(self, olds: dict, news: dict, changed) -> list[str]:
        # A gate result stands for exactly the inputs it was measured with: any change measures again.
        return sorted(changed)

    def _measure(self, props: dict) -> tuple[loadgate.LoadResult, loadgate.LoadResult]:
        url = props["url"].rstrip("/")
        model, sig = props["model"], props.get("request")
        infer = f"{url}/v2/models/{model}/infer"
        self._wait_ready(props, url)
        body, headers = request_body(props)
        # A model that takes frames gets JPEG frames of the sizes cameras send, each answer checked for its frame.
        frames = kserve.frame_payloads(sig) if sig and kserve.takes_frames(sig) else []
        if sig:
            # Against the stack's own signature of the model: what was meant to be deployed answers.
            for i in range(int(props.get("check_requests") or 3)):
                for p in frames or [loadgate.Payload(body, tuple(headers.items()))]:
                    problems = checked_request(infer, sig, p.body, dict(p.headers), p.expect)
                    if problems:
                        raise GateError(f"answer {i + 1} of {model} is wrong: " + "; ".join(problems))
        check = response_check(url, model, props)
        concurrency = int(props["concurrency"])
        spec = loadgate.LoadSpec(
            url=infer,
            body=body,
            headers=tuple(headers.items()),
            concurrency=concurrency,
            duration_s=float(props["duration_s"]),
            max_requests=int(props["max_requests"]),
            tool=props.get("tool") or "auto",
            rate=props.get("rate"),
            check=check,
            # One client process per 4 connections: one process's GIL would queue requests at high concurrency.
            processes=max(1, min(os.cpu_count() or 1, concurrency // 4)),
            warmup_requests=int(props.get("warmup_requests") or 5),
            timeout_s=float(props.get("request_timeout_s") or 30),
            payloads=tuple(frames),
        )
        label, bound = _label(props), loadgate.bound_s(spec)
        with ticking(label, f"nginx's floor load on {url}/nginx-health ({concurrency} connections)", bound):
            floor = loadgate.overhead(spec, f"{url}/nginx-health")
        load = f"the acceptance load on {model} ({concurrency} connections, {spec.duration_s:g} s"
        with ticking(label, load + f", up to {spec.max_requests} requests)", bound):
            result = loadgate.run(spec)
        slo = loadgate.Slo(
            p95_ms=props.get("p95_ms"),
            p99_ms=props.get("p99_ms"),
            max_error_rate=float(props.get("max_error_rate") or 0.0),
            min_throughput_rps=props.get("min_rps"),
        )
        loadgate.check_slo(result, slo)
        return result, floor

    def create(self, props: dict) -> CreateResult:
        rb = props.get("rollback")
        try:
            if rb and props.get("expect_digest"):
                from providers.serving_snapshot import served_digest

                served = served_digest(rb)
                if served != props["expect_digest"]:
                    raise GateError(
                        f"the guest serves repository {served or 'unknown'}, not this deploy's "
                        f"{props['expect_digest']} (a failed gate rolled it back): run `pulumi up --refresh`"
                    )
            result, floor = self._measure(props)
        except (GateError, NotReady, loadgate.GateFailed) as e:
            raise GateError(f"{props['model']}: {e}{self._roll_back(props)}") from None
        out = {k: v for k, v in props.items() if k != "__provider"}
        out["result"] = result.as_dict()
        out["overhead"] = floor.as_dict()
        return CreateResult(f"gate-{props['model']}", out)

    @staticmethod
    def _wait_ready(props: dict, url: str) -> float:
        """Triton's health gate: the server and every model ready, saying so every 5 s while a model loads."""
        models = list(props.get("models") or [])
        bound = float(props.get("ready_timeout_s") or 300)
        what = f"{', '.join(models) or 'Triton'} to be ready at {url} (/v2/health/ready and each model's ready)"
        with ticking(_label(props), what, bound):
            return wait_ready(url, models, timeout_s=bound)

    def _roll_back(self, props: dict) -> str:
        rb = props.get("rollback")
        if not rb:
            return ""
        from providers.serving_snapshot import restore

        t0 = time.monotonic()
        restored = restore(rb)
        if not restored:
            return " | nothing to roll back to (first deploy): the new version stays"
        url = props["url"].rstrip("/")
        try:
            self._wait_ready(props, url)
            body, headers = request_body(props)
            sig = props.get("request") or {"inputs": [], "outputs": []}
            problems = checked_request(f"{url}/v2/models/{props['model']}/infer", sig, body, headers)
        except NotReady as e:
            problems = [str(e)]
        took = time.monotonic() - t0
        if problems:
            return (
                f" | rolled back to the previous repository and server in {took:.1f}s, but it does not answer: "
                + "; ".join(problems)
            )
        return (
            f" | rolled back to the previous repository and server in {took:.1f}s; it serves again "
            f"(checked by a request)"
        )

    # delete changes nothing (the base's): a gate measured, it made nothing to take back.


class AcceptanceGate(HostResource, module="serving", name="AcceptanceGate"):
    result: pulumi.Output[dict]
    overhead: pulumi.Output[dict]

    PROVIDER = AcceptanceGateProvider
    DEFAULTS = {"rollback": None, "expect_digest": None}


def summary(result: dict) -> str:
    return json.dumps({k: result[k] for k in ("p50_ms", "p95_ms", "p99_ms", "throughput_rps", "error_rate")})
