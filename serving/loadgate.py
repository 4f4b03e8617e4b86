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
from typing import Optional


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
    url = urllib.parse.urlsplit(spec.url)
    path = url.path + (f"?{url.query}" if url.query else "")
    headers = dict(spec.headers)
    if spec.body:
        headers["Content-Length"] = str(len(spec.body))
    lock = threading.Lock()
    latencies: list[float] = []
    errors = [0]
    issued = [0]
    deadline = [0.0]
    started = [0.0]

    def _open_gate():
        # Runs once, after every worker finished its warmup and before any is released.
        started[0] = time.perf_counter()
        deadline[0] = started[0] + spec.duration_s

    start_gate = threading.Barrier(spec.concurrency + 1, action=_open_gate)

    def one(conn):
        conn.request(spec.method, path, body=spec.body or None, headers=headers)
        r = conn.getresponse()
        r.read()
        return r.status

    def worker():
        conn = _connection(url, spec.timeout_s)
        for _ in range(spec.warmup_requests):
            try:
                one(conn)
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = _connection(url, spec.timeout_s)
        mine: list[float] = []
        bad = 0
        start_gate.wait()
        while True:
            with lock:
                if issued[0] >= spec.max_requests:
                    break
                issued[0] += 1
            t0 = time.perf_counter()
            if t0 >= deadline[0]:
                with lock:
                    issued[0] -= 1
                break
            try:
                status = one(conn)
                ok = 200 <= status < 300
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

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(spec.concurrency)]
    for t in threads:
        t.start()
    start_gate.wait()
    for t in threads:
        t.join(spec.duration_s + spec.timeout_s + 30)
    elapsed = time.perf_counter() - started[0]
    return _result("python", spec.concurrency, [x * 1000 for x in latencies], errors[0], elapsed)


def _result(tool, concurrency, lat_ms: list[float], errors: int, elapsed: float) -> LoadResult:
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
        tool = "wrk" if wrk_available() else "python"
    return run_wrk(spec) if tool == "wrk" else run_python(spec)


def overhead(spec: LoadSpec, noop_url: str) -> LoadResult:
    """The same load tool and concurrency against a URL that costs nothing upstream (GET)."""
    return run(dataclasses.replace(spec, url=noop_url, method="GET", body=b"", headers=()))


def violations(result: LoadResult, slo: Slo) -> list[str]:
    out = []
    if result.requests == 0:
        out.append("no request completed")
    if slo.p95_ms is not None and not result.p95_ms < slo.p95_ms:
        out.append(f"p95 {result.p95_ms:.3f} ms >= SLO {slo.p95_ms} ms")
    if slo.p99_ms is not None and not result.p99_ms < slo.p99_ms:
        out.append(f"p99 {result.p99_ms:.3f} ms >= SLO {slo.p99_ms} ms")
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
