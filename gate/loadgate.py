"""Acceptance gate: a bounded load run against the serving endpoint, percentiles out, SLO check.

Standard library only, so the same file runs on the Pulumi host or is piped to ``python3 -`` on a
guest (``python3 - --url ... < loadgate.py`` prints one JSON object). Two load generators:

* ``wrk`` (Debian package, C, constant concurrency for a duration) when it is installed — the kept
  tool; percentiles come from its own HdrHistogram through a small Lua ``done()`` hook;
* a measured Python client otherwise: ``concurrency`` threads with one keep-alive connection each,
  bounded by both ``duration_s`` and ``max_requests``.

The gate's own overhead is measured, not assumed: ``overhead`` runs the same tool against a URL
that costs nothing upstream (nginx's ``return 200`` location) and reports its p50/p95.

Usage::

    spec = LoadSpec(url="http://127.0.0.1:80/infer", body=infer_body("INPUT0", [1, 4]),
                    concurrency=4, duration_s=10, max_requests=20000)
    result = run(spec)                          # LoadResult: p50/p95/p99 ms, rps, error rate
    check_slo(result, Slo(p95_ms=8.0))         # raises GateFailed with the numbers
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from typing import Callable, Optional, Sequence


@dataclasses.dataclass(frozen=True)
class LoadSpec:
    url: str
    body: bytes = b""
    method: str = "POST"
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    concurrency: int = 1
    duration_s: float = 5.0
    # Upper bound on requests (python client); wrk is bounded by duration only.
    max_requests: int = 100_000
    warmup_requests: int = 5
    timeout_s: float = 10.0
    tool: str = "auto"  # "auto" | "wrk" | "python"
    # Every response's outputs are checked against this (python client): a 200 is not a success.
    check: Optional["ResponseCheck"] = None
    # Client processes for the python client (threads split between them): one process's GIL otherwise
    # adds its own queueing to the latencies it measures at high concurrency.
    processes: int = 1
    # Open loop: requests/s over all connections, each sent at its scheduled time and timed from it (no
    # coordinated omission); None is closed loop (a connection sends as soon as its answer is back). One client
    # process only (the schedule is per process).
    rate: Optional[float] = None
    # An answer longer than this is an error (python client): a server cannot make the client read forever.
    max_response_bytes: int = 256 * 1024 * 1024
    # Distinct requests (python client), sent in turn instead of ``body``: e.g. JPEG frames of several sizes, each
    # with its own headers and its own answer check.
    payloads: tuple["Payload", ...] = ()
    # Python client: distinct bodies sent in turn (with ``headers``) instead of ``body``, so a server cannot pass by
    # answering every request alike (e.g. distinct images); ``payloads`` win over them.
    bodies: tuple[bytes, ...] = ()


@dataclasses.dataclass(frozen=True)
class Payload:
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    # Called on every 2xx answer to this body after ``LoadSpec.check`` (body, Inference-Header-Content-Length):
    # None when the answer is right for this request, else why not.
    expect: Optional[Callable[[bytes, Optional[str]], Optional[str]]] = None


@dataclasses.dataclass(frozen=True)
class LoadResult:
    tool: str
    concurrency: int
    requests: int
    errors: int
    duration_s: float
    throughput_rps: float
    error_rate: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    # 2xx responses whose outputs did not match the check (counted in ``errors`` too).
    invalid: int = 0
    first_invalid: str = ""
    # Threads or client processes that failed or did not finish: their requests are not in the count.
    failures: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        return (
            f"{self.tool} c={self.concurrency}: {self.requests} requests in {self.duration_s:.2f}s "
            f"({self.throughput_rps:.1f}/s), errors {self.errors} ({self.error_rate:.2%}), "
            f"p50 {self.p50_ms:.3f} ms, p95 {self.p95_ms:.3f} ms, p99 {self.p99_ms:.3f} ms, "
            f"max {self.max_ms:.3f} ms"
        )


@dataclasses.dataclass(frozen=True)
class Slo:
    p95_ms: Optional[float] = None
    p99_ms: Optional[float] = None
    max_error_rate: float = 0.0
    min_throughput_rps: Optional[float] = None


class GateFailed(RuntimeError):
    def __init__(self, result: LoadResult, violations: list[str]):
        self.result, self.violations = result, violations
        super().__init__("acceptance gate failed: " + "; ".join(violations) + " | " + result.summary())


def infer_body(input_name: str, shape: list[int], datatype: str = "FP32", value: float = 0.5) -> bytes:
    """A KServe v2 JSON infer request body with one constant-filled input."""
    n = math.prod(shape)
    return json.dumps(
        {"inputs": [{"name": input_name, "shape": shape, "datatype": datatype, "data": [value] * n}]}
    ).encode()


# ---------------------------------------------------------------- binary tensors and response checks

# The binary extension's header: where the JSON part of a body ends.
HEADER_LENGTH = "Inference-Header-Content-Length"

# Bytes per element of the KServe v2 datatypes (BYTES/STRING have no fixed size).
DTYPE_BYTES = {
    "BOOL": 1,
    "UINT8": 1,
    "INT8": 1,
    "UINT16": 2,
    "INT16": 2,
    "FP16": 2,
    "BF16": 2,
    "UINT32": 4,
    "INT32": 4,
    "FP32": 4,
    "UINT64": 8,
    "INT64": 8,
    "FP64": 8,
}


def binary_request(inputs: list[tuple[str, str, list[int], bytes]], outputs: Sequence[str] = ()) -> tuple[bytes, tuple]:
    """A KServe v2 binary-tensor request: (body, headers) for ``LoadSpec(body=..., headers=...)``.

    ``inputs`` are (name, datatype, shape, raw bytes); ``outputs`` named here come back as binary too
    (by default every output, in binary). The JSON header is followed by the raw tensors, its length in
    ``Inference-Header-Content-Length``: no JSON number parsing on either side, 1 byte per uint8 pixel.
    """
    header: dict = {"inputs": []}
    for name, datatype, shape, data in inputs:
        size = DTYPE_BYTES.get(datatype)
        if size is not None and len(data) != size * math.prod(shape):
            raise ValueError(f"input {name}: {len(data)} bytes but {datatype}{shape} needs {size * math.prod(shape)}")
        header["inputs"].append(
            {"name": name, "shape": list(shape), "datatype": datatype, "parameters": {"binary_data_size": len(data)}}
        )
    header["parameters"] = {"binary_data_output": True}
    if outputs:
        header["outputs"] = [{"name": o, "parameters": {"binary_data": True}} for o in outputs]
    head = json.dumps(header, separators=(",", ":")).encode()
    body = head + b"".join(data for *_, data in inputs)
    return body, (("Content-Type", "application/octet-stream"), (HEADER_LENGTH, str(len(head))))


def binary_outputs(body: bytes, header_length) -> dict[str, bytes]:
    """Each output's raw bytes of a binary answer (``binary_request``'s reverse), by name: the JSON head is the first
    ``header_length`` bytes, the outputs follow in its order. Checks nothing (``check_response`` does); raises
    KeyError, TypeError or ValueError when the answer is not laid out so."""
    n = int(header_length)
    head = json.loads(body[:n])
    blobs, pos = {}, n
    for o in head["outputs"]:
        size = int(o["parameters"]["binary_data_size"])
        blobs[o["name"]] = body[pos : pos + size]
        pos += size
    return blobs


@dataclasses.dataclass(frozen=True)
class ExpectedOutput:
    name: str
    datatype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> Optional[int]:
        """Bytes of the tensor; None for BYTES/STRING or a variable (-1) dimension."""
        size = DTYPE_BYTES.get(self.datatype)
        return None if size is None or any(d < 0 for d in self.shape) else size * math.prod(self.shape)

    def fits(self, shape) -> bool:
        """``shape`` matches, a -1 (variable) dimension matching any size."""
        return len(shape) == len(self.shape) and all(w < 0 or w == g for w, g in zip(self.shape, shape))


@dataclasses.dataclass(frozen=True)
class ResponseCheck:
    """What every response must hold: exactly these outputs, with these datatypes, shapes and byte sizes."""

    outputs: tuple[ExpectedOutput, ...]

    @classmethod
    def from_config(cls, config: dict, batch: int = 1) -> "ResponseCheck":
        """From Triton's model config as JSON (``GET /v2/models/<m>/config``) for requests of ``batch`` items;
        a variable dimension (-1) accepts any size, and the bytes are then checked against the shape answered."""
        try:
            lead = (batch,) if int(config.get("max_batch_size", 0)) > 0 else ()
            outs = []
            for o in config.get("output", []):
                dims = tuple(int(d) for d in o.get("dims", []))
                outs.append(ExpectedOutput(str(o["name"]), str(o["data_type"]).removeprefix("TYPE_"), lead + dims))
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"the model config is not Triton's JSON config: {type(e).__name__}: {e}") from None
        names = [o.name for o in outs]
        if not outs or len(set(names)) != len(names):
            raise ValueError(f"the model config names outputs {names}: none, or one twice")
        return cls(tuple(outs))

    @classmethod
    def from_signature(cls, sig: dict) -> "ResponseCheck":
        """From a request signature (``gate.kserve.signature``): its outputs, datatypes and shapes."""
        return cls(
            tuple(ExpectedOutput(o["name"], o["datatype"], tuple(int(d) for d in o["shape"])) for o in sig["outputs"])
        )


def _int(v) -> Optional[int]:
    """``v`` as an int when it is one in JSON (a bool or a float is not)."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _header_length(header_length: Optional[str], body: bytes) -> tuple[int, Optional[str]]:
    if header_length is None:
        return len(body), None
    text = str(header_length).strip()
    if not text.isascii() or not text.isdigit():
        return 0, f"Inference-Header-Content-Length {header_length!r} is not a non-negative integer"
    n = int(text)
    if n > len(body):
        return 0, f"Inference-Header-Content-Length {n} is past the body's {len(body)} bytes"
    return n, None


def _bytes_elements(blob: bytes, count: int) -> Optional[str]:
    """Why ``blob`` is not exactly ``count`` BYTES elements (4-byte little-endian length, then the bytes)."""
    pos = 0
    for i in range(count):
        if pos + 4 > len(blob):
            return f"element {i} of {count} is cut off at byte {pos}"
        pos += 4 + int.from_bytes(blob[pos : pos + 4], "little")
        if pos > len(blob):
            return f"element {i} of {count} runs past its {len(blob)} bytes"
    return None if pos == len(blob) else f"{len(blob) - pos} bytes after its {count} elements"


_JSON_KIND = {"BOOL": (bool,), "BYTES": (str,)}


def check_response(body: bytes, header_length: Optional[str], check: ResponseCheck) -> Optional[str]:
    """None when ``body`` (a v2 infer response, JSON or binary) holds exactly ``check``'s outputs, else why not.

    Never raises: whatever a server answers (JSON null, a list, wrong types, deep nesting, a lying header) is a
    reason, so the load loop counts it as an error instead of losing a thread."""
    try:
        return _check_response(body, header_length, check)
    except Exception as e:  # a shape of answer not foreseen below is still a wrong answer, never a dead thread
        return f"response is not a v2 infer response: {type(e).__name__}: {str(e)[:200]}"


def _check_response(body: bytes, header_length: Optional[str], check: ResponseCheck) -> Optional[str]:
    head_len, problem = _header_length(header_length, body)
    if problem:
        return problem
    try:
        head = json.loads(body[:head_len])
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        return f"response is not a v2 infer response: {type(e).__name__}: {str(e)[:200]}"
    if not isinstance(head, dict):
        return f"response is not a v2 infer response: a JSON {type(head).__name__}, not an object"
    outputs = head.get("outputs")
    if not isinstance(outputs, list):
        return f"response is not a v2 infer response: outputs is a {type(outputs).__name__}, not a list"
    names: list[str] = []
    for i, o in enumerate(outputs):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            return f"outputs[{i}] is not an object with a string name"
        names.append(o["name"])
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return f"outputs {twice} answered more than once"
    want = {o.name: o for o in check.outputs}
    if set(names) != set(want):
        return f"outputs {sorted(names)} but the model config names {sorted(want)}"
    pos = head_len
    for o in outputs:
        name = o["name"]
        exp = want[name]
        if o.get("datatype") != exp.datatype:
            return f"output {name}: datatype {o.get('datatype')!r} but the config says {exp.datatype}"
        raw = o.get("shape")
        dims = [_int(d) for d in raw] if isinstance(raw, list) else None
        if dims is None or any(d is None for d in dims):
            return f"output {name}: shape {raw!r} is not a list of integers"
        shape = tuple(d for d in dims if d is not None)
        if any(d < 0 for d in shape):
            return f"output {name}: shape {list(shape)} has a negative or variable dimension (an answer has sizes)"
        if not exp.fits(shape):
            return f"output {name}: shape {list(shape)} but the config says {list(exp.shape)}"
        count = math.prod(shape)
        if count == 0:
            return f"output {name}: empty (shape {list(shape)})"
        params = o.get("parameters")
        if params is not None and not isinstance(params, dict):
            return f"output {name}: parameters is a {type(params).__name__}, not an object"
        if params and "binary_data_size" in params:
            size = _int(params["binary_data_size"])
            if size is None or size < 0:
                return f"output {name}: binary_data_size {params['binary_data_size']!r} is not a size"
            if size == 0:
                return f"output {name}: 0 bytes"
            nbytes = ExpectedOutput(name, exp.datatype, shape).nbytes
            if nbytes is not None and size != nbytes:
                return f"output {name}: {size} bytes but {exp.datatype}{list(shape)} is {nbytes}"
            if pos + size > len(body):
                return f"body is {len(body)} bytes: output {name}'s {size} bytes from byte {pos} run past its end"
            if exp.datatype == "BYTES":
                bad = _bytes_elements(body[pos : pos + size], count)
                if bad:
                    return f"output {name}: BYTES {bad}"
            pos += size
        elif "data" in o:
            data = o["data"]
            if not isinstance(data, list) or len(data) != count:
                n = len(data) if isinstance(data, list) else type(data).__name__
                return f"output {name}: {n} values but {list(shape)} holds {count}"
            kinds = _JSON_KIND.get(exp.datatype)
            for v in data:
                ok = isinstance(v, kinds) if kinds else isinstance(v, (int, float)) and not isinstance(v, bool)
                if not ok:
                    return f"output {name}: value {v!r} is not {exp.datatype}"
        else:
            return f"output {name}: no data"
    if len(body) != pos:
        return f"body is {len(body)} bytes, header {head_len} + binary outputs {pos - head_len}"
    return None


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an ascending list; NaN for none.

    The same rule as ``serving.adaptive_window.percentile`` (tests/test_loadgate_checks.py holds them equal): each
    module must stand alone as one file (this one piped to a guest, that one shipped as the window unit's script),
    so neither can import the other."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


# ---------------------------------------------------------------- python client


def _connection(url: urllib.parse.SplitResult, timeout: float) -> http.client.HTTPConnection:
    cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    assert url.hostname is not None  # _run_threads refuses a URL without one
    return cls(url.hostname, url.port or (443 if url.scheme == "https" else 80), timeout=timeout)


def _wait_budget(spec: LoadSpec) -> float:
    """How long any one wait of a load run may take: every warmup request timing out, then the run itself."""
    return spec.timeout_s * (spec.warmup_requests + 2) + spec.duration_s + 30


def bound_s(spec: LoadSpec) -> float:
    """The longest a run of ``spec`` may take before it is cut off (the python client's bound; wrk's is shorter)."""
    return _wait_budget(spec) + 30


def run_python(spec: LoadSpec) -> LoadResult:
    """Constant concurrency from ``spec.processes`` processes (threads split between them), one keep-alive
    connection per thread; percentiles over all of them. A thread or process that fails or does not finish in
    time is named in ``failures`` and fails the gate (its requests would otherwise vanish from the count)."""
    procs = max(1, min(spec.processes, spec.concurrency))
    if procs == 1:
        out = _run_threads(spec, spec.concurrency, spec.max_requests, None)
        return _result(
            "python",
            spec.concurrency,
            out["lat"],
            out["errors"],
            out["end"] - out["start"] if out["start"] else 0.0,
            out["invalid"],
            out["first_invalid"],
            failures=out["failures"],
        )
    import multiprocessing
    import queue as queue_mod

    ctx = multiprocessing.get_context("fork")
    start = ctx.Value("d", 0.0)

    def _open():
        start.value = time.perf_counter()

    budget = _wait_budget(spec)
    barrier = ctx.Barrier(procs, action=_open, timeout=budget)
    queue = ctx.Queue()
    shares = [spec.concurrency // procs + (1 if i < spec.concurrency % procs else 0) for i in range(procs)]

    def child(i: int, n: int) -> None:
        def sync() -> float:
            barrier.wait()
            return start.value

        try:
            out = _run_threads(spec, n, max(1, spec.max_requests * n // spec.concurrency), sync, barrier.abort)
        except BaseException as e:  # the parent must hear from every child, whatever happened
            out = {"lat": [], "errors": 0, "invalid": 0, "first_invalid": "", "start": 0.0, "end": 0.0}
            out["failures"] = [f"process {i}: {type(e).__name__}: {e}"]
        queue.put(out)

    children = [ctx.Process(target=child, args=(i, n), daemon=True) for i, n in enumerate(shares)]
    for c in children:
        c.start()
    outs, failures = [], []
    deadline = time.monotonic() + budget + 30
    for _ in children:
        try:
            outs.append(queue.get(timeout=max(0.1, deadline - time.monotonic())))
        except queue_mod.Empty:
            failures.append(f"{len(children) - len(outs)} client processes sent no result within {budget + 30:.0f}s")
            break
    for c in children:
        c.join(10)
        if c.is_alive():
            c.kill()
    failures += [f for o in outs for f in o["failures"]]
    lat = [x for o in outs for x in o["lat"]]
    first = next((o["first_invalid"] for o in outs if o["first_invalid"]), "")
    started = [o["start"] for o in outs if o["start"]]
    return _result(
        "python",
        spec.concurrency,
        lat,
        sum(o["errors"] for o in outs),
        (max(o["end"] for o in outs) - min(started)) if started else 0.0,
        sum(o["invalid"] for o in outs),
        first,
        failures=failures,
    )


def read_limited(r: http.client.HTTPResponse, limit: int) -> bytes:
    """The whole body, or OversizedResponse past ``limit`` bytes: a server cannot make the client read forever."""
    length = r.getheader("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) > limit:
        raise OversizedResponse(f"Content-Length {length} is over the {limit}-byte limit")
    data = r.read(limit + 1)
    if len(data) > limit:
        raise OversizedResponse(f"body is over the {limit}-byte limit")
    return data


class OversizedResponse(Exception):
    pass


def _run_threads(spec: LoadSpec, concurrency: int, max_requests: int, sync, abort=None) -> dict:
    """One process's share of a python-client run: ``concurrency`` threads warm up, start together (``sync``
    returns the common start when several processes run), send until the deadline or ``max_requests``; their
    tallies, latencies in ms. ``abort`` is called when a thread fails before the start (the other processes then
    need not wait out the barrier)."""
    run = _ThreadRun(spec, concurrency, max_requests, sync, abort)
    threads = [threading.Thread(target=run.worker, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    run.release()
    run.join(threads)
    return run.tally()


def _payloads(spec: LoadSpec) -> list[tuple[bytes, dict[str, str], Optional[Callable]]]:
    """(body, headers, expect) of each distinct request, sent in turn: ``payloads``, else ``bodies``, else ``body``."""
    headers = dict(spec.headers)
    if spec.body:
        headers["Content-Length"] = str(len(spec.body))
    return (
        [(p.body, {**headers, **dict(p.headers), "Content-Length": str(len(p.body))}, p.expect) for p in spec.payloads]
        or [(b, {**headers, "Content-Length": str(len(b))}, None) for b in spec.bodies]
        or [(spec.body, headers, None)]
    )


@dataclasses.dataclass
class _Worker:
    """One thread's connection and its own tallies, merged into the run's when it ends."""

    idx: int
    conn: Optional[http.client.HTTPConnection] = None
    lat: list[float] = dataclasses.field(default_factory=list)
    bad: int = 0
    wrong: int = 0
    why: str = ""


class _ThreadRun:
    """The state the threads of one process share: the start barrier, the request budget, the tallies."""

    def __init__(self, spec: LoadSpec, concurrency: int, max_requests: int, sync, abort) -> None:
        url = urllib.parse.urlsplit(spec.url)
        if not url.hostname:
            raise ValueError(f"{spec.url!r} names no host (write http://HOST:PORT/path)")
        self.spec, self.url, self.concurrency, self.max_requests = spec, url, concurrency, max_requests
        self.path = url.path + (f"?{url.query}" if url.query else "")
        self.sync, self.abort = sync, abort
        self.budget = _wait_budget(spec)
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.errors = self.invalid = self.issued = 0
        self.first_invalid = ""
        self.failures: list[str] = []
        self.finished: set[int] = set()
        self.deadline = self.started = 0.0
        self.start_gate = threading.Barrier(concurrency + 1, action=self._open_gate, timeout=self.budget)
        self.payloads = _payloads(spec)
        self.turn = itertools.count()  # next() is atomic under the GIL: the threads take the payloads in turn

    def _open_gate(self) -> None:
        # Runs once, after every worker finished its warmup and before any is released; with several
        # processes, after every process's workers did (``sync`` returns the common start).
        self.started = self.sync() if self.sync else time.perf_counter()
        self.deadline = self.started + self.spec.duration_s

    def one(self, conn: http.client.HTTPConnection) -> tuple[int, Optional[str], float]:
        """(status, what is wrong with the answer or None, when its last byte was read): the latency is the
        exchange's, the checks run after it (a client's own verification is not the service's time)."""
        spec = self.spec
        body, hdrs, expect = self.payloads[next(self.turn) % len(self.payloads)]
        conn.request(spec.method, self.path, body=body or None, headers=hdrs)
        r = conn.getresponse()
        data = read_limited(r, spec.max_response_bytes)
        done = time.perf_counter()
        if 200 <= r.status < 300 and (spec.check is not None or expect is not None):
            length = r.getheader(HEADER_LENGTH)
            problem = check_response(data, length, spec.check) if spec.check is not None else None
            return r.status, problem or (expect(data, length) if expect is not None else None), done
        return r.status, None, done

    def worker(self, idx: int = 0) -> None:
        w = _Worker(idx)
        try:
            self._warm_up(w)
            self.start_gate.wait()
            self._send(w)
        except threading.BrokenBarrierError:
            with self.lock:
                self.failures.append(f"thread {idx}: the start barrier broke (a warmup or another process overran)")
        except BaseException as e:
            with self.lock:
                self.failures.append(f"thread {idx}: {type(e).__name__}: {str(e)[:200]}")
            # The others need not wait out the barrier's timeout for a thread that will never come.
            self.start_gate.abort()
            if self.abort is not None and not self.started:
                self.abort()
        finally:
            if w.conn is not None:
                w.conn.close()
            with self.lock:
                self.latencies.extend(w.lat)
                self.errors += w.bad
                self.invalid += w.wrong
                self.first_invalid = self.first_invalid or w.why
                self.finished.add(idx)

    def _warm_up(self, w: _Worker) -> None:
        w.conn = _connection(self.url, self.spec.timeout_s)
        for _ in range(self.spec.warmup_requests):
            try:
                self.one(w.conn)
            except Exception:  # warmup answers are not judged; a broken one must not end the thread
                w.conn.close()
                w.conn = _connection(self.url, self.spec.timeout_s)

    def _take_turn(self) -> bool:
        with self.lock:
            if self.issued >= self.max_requests:
                return False
            self.issued += 1
            return True

    def _send(self, w: _Worker) -> None:
        """Requests until the deadline or the budget: as fast as answers come (closed loop), or each at its
        scheduled time and timed from it (open loop, ``spec.rate``)."""
        interval = self.concurrency / self.spec.rate if self.spec.rate else 0.0
        k = 0
        while self._take_turn():
            if interval:
                # This connection's k-th scheduled send, connections spread evenly over one interval.
                t0 = self.started + interval * (k + w.idx / self.concurrency)
                k += 1
                now = time.perf_counter()
                if t0 > now:
                    time.sleep(t0 - now)
            else:
                t0 = time.perf_counter()
            if t0 >= self.deadline:
                with self.lock:
                    self.issued -= 1
                break
            self._exchange(w, t0)

    def _exchange(self, w: _Worker, t0: float) -> None:
        assert w.conn is not None  # _warm_up opened it
        done = 0.0
        try:
            status, problem, done = self.one(w.conn)
            ok = 200 <= status < 300 and problem is None
            if problem is not None:
                w.wrong += 1
                w.why = w.why or problem
        except Exception as e:  # any failed exchange is an error that counts, never a dead thread
            ok = False
            if not isinstance(e, (OSError, http.client.HTTPException)):
                w.wrong += 1
                w.why = w.why or f"{type(e).__name__}: {str(e)[:200]}"
            w.conn.close()
            w.conn = _connection(self.url, self.spec.timeout_s)
        w.lat.append((done or time.perf_counter()) - t0)
        if not ok:
            w.bad += 1

    def release(self) -> None:
        """Wait at the start barrier with the threads (its action starts the clock)."""
        try:
            self.start_gate.wait()
        except Exception:  # broken (a warmup overran) or the multi-process start failed in the barrier's action
            with self.lock:
                self.failures.append(
                    f"the load did not start: not every thread was through its warmup within {self.budget:.0f}s"
                )

    def join(self, threads: list[threading.Thread]) -> None:
        end_by = time.monotonic() + self.spec.duration_s + self.spec.timeout_s + 30
        for t in threads:
            t.join(max(0.0, end_by - time.monotonic()))

    def tally(self) -> dict:
        spec = self.spec
        with self.lock:
            late = [i for i in range(self.concurrency) if i not in self.finished]
            if late:
                self.failures.append(
                    f"threads {late} did not finish within {spec.duration_s + spec.timeout_s + 30:.0f}s"
                )
            return {
                "lat": [x * 1000 for x in self.latencies],
                "errors": self.errors,
                "invalid": self.invalid,
                "first_invalid": self.first_invalid,
                "failures": list(self.failures),
                "start": self.started,
                "end": time.perf_counter(),
            }


def _result(
    tool,
    concurrency,
    lat_ms: list[float],
    errors: int,
    elapsed: float,
    invalid: int = 0,
    first_invalid: str = "",
    failures: Sequence[str] = (),
) -> LoadResult:
    lat_ms.sort()
    n = len(lat_ms)
    return LoadResult(
        tool=tool,
        concurrency=concurrency,
        requests=n,
        errors=errors,
        duration_s=elapsed,
        throughput_rps=(n - errors) / elapsed if elapsed > 0 else 0.0,
        error_rate=errors / n if n else 1.0,
        p50_ms=percentile(lat_ms, 50),
        p95_ms=percentile(lat_ms, 95),
        p99_ms=percentile(lat_ms, 99),
        mean_ms=sum(lat_ms) / n if n else float("nan"),
        max_ms=lat_ms[-1] if n else float("nan"),
        invalid=invalid,
        first_invalid=first_invalid,
        failures=tuple(failures),
    )


# ---------------------------------------------------------------- wrk

_WRK_LUA = r"""
wrk.method = %(method)s
wrk.body = %(body)s
%(headers)s
done = function(summary, latency, requests)
  local e = summary.errors
  io.write("GATEJSON ", string.format(
    '{"requests":%%d,"duration_us":%%d,"errors":%%d,"p50":%%d,"p95":%%d,"p99":%%d,"mean":%%f,"max":%%d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99), latency.mean, latency.max))
end
"""


def _lua_string(data: bytes) -> str:
    # Decimal escapes keep any byte safe inside a Lua string literal.
    return '"' + "".join(chr(b) if 32 <= b < 127 and chr(b) not in '"\\' else f"\\{b}" for b in data) + '"'


def wrk_available() -> bool:
    return shutil.which("wrk") is not None


def wrk_command(spec: LoadSpec, script_path: str) -> list[str]:
    threads = max(1, min(spec.concurrency, os.cpu_count() or 1))
    return [
        "wrk",
        "-t",
        str(threads),
        "-c",
        str(spec.concurrency),
        "-d",
        f"{max(1, round(spec.duration_s))}s",
        "--timeout",
        f"{max(1, math.ceil(spec.timeout_s))}s",
        "-s",
        script_path,
        spec.url,
    ]


def run_wrk(spec: LoadSpec) -> LoadResult:
    headers = "\n".join(f"wrk.headers[{_lua_string(k.encode())}] = {_lua_string(v.encode())}" for k, v in spec.headers)
    script = _WRK_LUA % {
        "method": _lua_string(spec.method.encode()),
        "body": _lua_string(spec.body),
        "headers": headers,
    }
    if spec.warmup_requests:
        run_python(
            dataclasses.replace(
                spec,
                duration_s=0.5,
                max_requests=spec.warmup_requests,
                concurrency=min(spec.concurrency, spec.warmup_requests),
                warmup_requests=0,
            )
        )
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    try:
        out = subprocess.run(
            wrk_command(spec, f.name), capture_output=True, text=True, timeout=spec.duration_s + spec.timeout_s + 30
        )
    finally:
        os.unlink(f.name)
    line = next((x for x in out.stdout.splitlines() if x.startswith("GATEJSON ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-1000:]} {out.stderr[-1000:]}")
    d = json.loads(line.split(" ", 1)[1])
    elapsed = d["duration_us"] / 1e6
    n = d["requests"]
    return LoadResult(
        tool="wrk",
        concurrency=spec.concurrency,
        requests=n,
        errors=d["errors"],
        duration_s=elapsed,
        throughput_rps=(n - d["errors"]) / elapsed if elapsed else 0.0,
        error_rate=d["errors"] / n if n else 1.0,
        p50_ms=d["p50"] / 1000,
        p95_ms=d["p95"] / 1000,
        p99_ms=d["p99"] / 1000,
        mean_ms=d["mean"] / 1000,
        max_ms=d["max"] / 1000,
    )


# ---------------------------------------------------------------- gate


def run(spec: LoadSpec) -> LoadResult:
    tool = spec.tool
    if tool == "auto":
        # wrk cannot read response bodies: a checked run uses the python client.
        tool = (
            "wrk"
            if wrk_available() and spec.check is None and spec.rate is None and not (spec.payloads or spec.bodies)
            else "python"
        )
    if tool == "wrk" and (spec.check is not None or spec.payloads or spec.bodies):
        raise ValueError("wrk cannot check response outputs or vary the body; use tool='python'")
    if spec.rate is not None and spec.processes > 1:
        spec = dataclasses.replace(spec, processes=1)
    return run_wrk(spec) if tool == "wrk" else run_python(spec)


def overhead(spec: LoadSpec, noop_url: str) -> LoadResult:
    """The same load tool and concurrency against a URL that costs nothing upstream (GET)."""
    return run(dataclasses.replace(spec, url=noop_url, method="GET", body=b"", headers=(), check=None, rate=None))


def violations(result: LoadResult, slo: Slo) -> list[str]:
    out = []
    if result.requests == 0:
        out.append("no request completed")
    if slo.p95_ms is not None and not result.p95_ms < slo.p95_ms:
        out.append(f"p95 {result.p95_ms:.3f} ms >= SLO {slo.p95_ms} ms")
    if slo.p99_ms is not None and not result.p99_ms < slo.p99_ms:
        out.append(f"p99 {result.p99_ms:.3f} ms >= SLO {slo.p99_ms} ms")
    if result.invalid:
        out.append(f"{result.invalid} responses answered 2xx with wrong outputs (first: {result.first_invalid})")
    if result.failures:
        out.append(f"{len(result.failures)} load threads failed (first: {result.failures[0]})")
    if result.error_rate > slo.max_error_rate:
        out.append(f"error rate {result.error_rate:.2%} > {slo.max_error_rate:.2%}")
    if slo.min_throughput_rps is not None and result.throughput_rps < slo.min_throughput_rps:
        out.append(f"throughput {result.throughput_rps:.1f}/s < {slo.min_throughput_rps}/s")
    return out


def check_slo(result: LoadResult, slo: Slo) -> LoadResult:
    found = violations(result, slo)
    if found:
        raise GateFailed(result, found)
    return result


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--body-json", default="")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--max-requests", type=int, default=100_000)
    ap.add_argument("--tool", default="auto", choices=["auto", "wrk", "python"])
    ap.add_argument("--noop-url", default="")
    ap.add_argument("--p95-ms", type=float)
    ap.add_argument("--max-error-rate", type=float, default=0.0)
    a = ap.parse_args(argv)
    spec = LoadSpec(
        url=a.url,
        body=a.body_json.encode(),
        concurrency=a.concurrency,
        duration_s=a.duration,
        max_requests=a.max_requests,
        tool=a.tool,
    )
    report: dict = {}
    if a.noop_url:
        report["overhead"] = overhead(spec, a.noop_url).as_dict()
    result = run(spec)
    report["result"] = result.as_dict()
    report["violations"] = violations(result, Slo(p95_ms=a.p95_ms, max_error_rate=a.max_error_rate))
    print(json.dumps(report))
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
