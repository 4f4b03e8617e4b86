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
from typing import Optional, Sequence


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
    # Python client: distinct bodies of one length sent in turn (request n sends bodies[n % len]) instead of
    # ``body``, so a server cannot pass by answering every request alike (e.g. distinct images).
    bodies: tuple[bytes, ...] = ()


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
    return body, (("Content-Type", "application/octet-stream"), ("Inference-Header-Content-Length", str(len(head))))


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
        lead = (batch,) if int(config.get("max_batch_size", 0)) > 0 else ()
        outs = []
        for o in config.get("output", []):
            dims = tuple(int(d) for d in o.get("dims", []))
            outs.append(ExpectedOutput(o["name"], str(o["data_type"]).removeprefix("TYPE_"), lead + dims))
        return cls(tuple(outs))

    @classmethod
    def from_signature(cls, sig: dict) -> "ResponseCheck":
        """From a request signature (``serving.kserve.signature``): its outputs, datatypes and shapes."""
        return cls(
            tuple(ExpectedOutput(o["name"], o["datatype"], tuple(int(d) for d in o["shape"])) for o in sig["outputs"])
        )


def check_response(body: bytes, header_length: Optional[str], check: ResponseCheck) -> Optional[str]:
    """None when ``body`` (a v2 infer response, JSON or binary) holds exactly ``check``'s outputs, else why not."""
    try:
        head_len = int(header_length) if header_length is not None else len(body)
        head = json.loads(body[:head_len])
    except (ValueError, UnicodeDecodeError) as e:
        return f"response is not a v2 infer response: {e}"
    got = {str(o.get("name")): o for o in head.get("outputs", []) if isinstance(o, dict)}
    want = {o.name: o for o in check.outputs}
    if set(got) != set(want):
        return f"outputs {sorted(got)} but the model config names {sorted(want)}"
    binary_total = 0
    for name, exp in want.items():
        o = got[name]
        if o.get("datatype") != exp.datatype:
            return f"output {name}: datatype {o.get('datatype')} but the config says {exp.datatype}"
        shape = tuple(int(d) for d in o.get("shape", ()))
        if not exp.fits(shape):
            return f"output {name}: shape {list(shape)} but the config says {list(exp.shape)}"
        if math.prod(shape) == 0:
            return f"output {name}: empty (shape {list(shape)})"
        answered = ExpectedOutput(name, exp.datatype, shape)
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            binary_total += int(size)
            if answered.nbytes is not None and int(size) != answered.nbytes:
                return f"output {name}: {size} bytes but {exp.datatype}{list(shape)} is {answered.nbytes}"
        elif "data" in o:
            if len(o["data"]) != math.prod(shape):
                return f"output {name}: {len(o['data'])} values but {list(shape)} holds {math.prod(shape)}"
        else:
            return f"output {name}: no data"
    if len(body) != head_len + binary_total:
        return f"body is {len(body)} bytes, header {head_len} + binary outputs {binary_total}"
    return None


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


# ---------------------------------------------------------------- python client


def _connection(url: urllib.parse.SplitResult, timeout: float) -> http.client.HTTPConnection:
    cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    return cls(url.hostname, url.port or (443 if url.scheme == "https" else 80), timeout=timeout)


def run_python(spec: LoadSpec) -> LoadResult:
    """Constant concurrency from ``spec.processes`` processes (threads split between them), one keep-alive
    connection per thread; percentiles over all of them."""
    procs = max(1, min(spec.processes, spec.concurrency))
    if procs == 1:
        out = _run_threads(spec, spec.concurrency, spec.max_requests, None)
        return _result(
            "python",
            spec.concurrency,
            out["lat"],
            out["errors"],
            out["end"] - out["start"],
            out["invalid"],
            out["first_invalid"],
        )
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    start = ctx.Value("d", 0.0)

    def _open():
        start.value = time.perf_counter()

    barrier = ctx.Barrier(procs, action=_open)
    queue = ctx.Queue()
    shares = [spec.concurrency // procs + (1 if i < spec.concurrency % procs else 0) for i in range(procs)]

    def child(n: int) -> None:
        def sync() -> float:
            barrier.wait()
            return start.value

        queue.put(_run_threads(spec, n, max(1, spec.max_requests * n // spec.concurrency), sync))

    children = [ctx.Process(target=child, args=(n,), daemon=True) for n in shares]
    for c in children:
        c.start()
    outs = [queue.get(timeout=spec.duration_s + spec.timeout_s * (spec.warmup_requests + 2) + 60) for _ in children]
    for c in children:
        c.join(10)
    lat = [x for o in outs for x in o["lat"]]
    first = next((o["first_invalid"] for o in outs if o["first_invalid"]), "")
    return _result(
        "python",
        spec.concurrency,
        lat,
        sum(o["errors"] for o in outs),
        max(o["end"] for o in outs) - min(o["start"] for o in outs),
        sum(o["invalid"] for o in outs),
        first,
    )


def _run_threads(spec: LoadSpec, concurrency: int, max_requests: int, sync) -> dict:
    url = urllib.parse.urlsplit(spec.url)
    path = url.path + (f"?{url.query}" if url.query else "")
    headers = dict(spec.headers)
    if spec.body or spec.bodies:
        headers["Content-Length"] = str(len(spec.bodies[0] if spec.bodies else spec.body))
    if len({len(b) for b in spec.bodies}) > 1:
        raise ValueError("LoadSpec.bodies must all have one length")
    lock = threading.Lock()
    latencies: list[float] = []
    errors = [0]
    invalid = [0]
    first_invalid = [""]
    issued = [0]
    deadline = [0.0]
    started = [0.0]

    def _open_gate():
        # Runs once, after every worker finished its warmup and before any is released; with several
        # processes, after every process's workers did (``sync`` returns the common start).
        started[0] = sync() if sync else time.perf_counter()
        deadline[0] = started[0] + spec.duration_s

    start_gate = threading.Barrier(concurrency + 1, action=_open_gate)

    def one(conn, n: int = 0) -> tuple[int, Optional[str]]:
        body = spec.bodies[n % len(spec.bodies)] if spec.bodies else spec.body
        conn.request(spec.method, path, body=body or None, headers=headers)
        r = conn.getresponse()
        data = r.read()
        if spec.check is not None and 200 <= r.status < 300:
            return r.status, check_response(data, r.getheader("Inference-Header-Content-Length"), spec.check)
        return r.status, None

    def worker(idx: int = 0):
        conn = _connection(url, spec.timeout_s)
        for _ in range(spec.warmup_requests):
            try:
                one(conn)
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = _connection(url, spec.timeout_s)
        mine: list[float] = []
        bad = wrong = 0
        why = ""
        start_gate.wait()
        interval = concurrency / spec.rate if spec.rate else 0.0
        k = 0
        while True:
            with lock:
                if issued[0] >= max_requests:
                    break
                issued[0] += 1
                n = issued[0]
            if interval:
                # This connection's k-th scheduled send, connections spread evenly over one interval.
                t0 = started[0] + interval * (k + idx / concurrency)
                k += 1
                now = time.perf_counter()
                if t0 > now:
                    time.sleep(t0 - now)
            else:
                t0 = time.perf_counter()
            if t0 >= deadline[0]:
                with lock:
                    issued[0] -= 1
                break
            try:
                status, problem = one(conn, n)
                ok = 200 <= status < 300 and problem is None
                if problem is not None:
                    wrong += 1
                    why = why or problem
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = _connection(url, spec.timeout_s)
            mine.append(time.perf_counter() - t0)
            if not ok:
                bad += 1
        conn.close()
        with lock:
            latencies.extend(mine)
            errors[0] += bad
            invalid[0] += wrong
            first_invalid[0] = first_invalid[0] or why

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    start_gate.wait()
    for t in threads:
        t.join(spec.duration_s + spec.timeout_s + 30)
    return {
        "lat": [x * 1000 for x in latencies],
        "errors": errors[0],
        "invalid": invalid[0],
        "first_invalid": first_invalid[0],
        "start": started[0],
        "end": time.perf_counter(),
    }


def _result(
    tool, concurrency, lat_ms: list[float], errors: int, elapsed: float, invalid: int = 0, first_invalid: str = ""
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
        tool = "wrk" if wrk_available() and spec.check is None and spec.rate is None else "python"
    if tool == "wrk" and spec.check is not None:
        raise ValueError("wrk cannot check response outputs; use tool='python' for a checked run")
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
