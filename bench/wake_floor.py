"""What one hand-off between processes costs on a machine: the floor under each of the queue gateway's hops.

A job through the gateway crosses processes several times where a direct call does not (the client's submit wakes
Redis, Redis wakes a worker slot, the slot's MGET and complete wake Redis and are answered, the stored result wakes
the caller). Each crossing is a wake-up of a blocked thread, often on an idle core. This measures one, between two
Python processes pinned to CPUs of the caller's choosing, over a socket pair: the round trip halved, back to back
(the cores stay busy) and spaced ``--gap-ms`` apart (the cores idle between, as at 1,000 jobs/s); and the round trip
of one Redis PING on the queue's own connection (``serving.queue._RoundTrips``), Redis pinned too.

    python3 -m bench.wake_floor --cpus 4,5 --redis-cpu 6 [--redis-server PATH] [--n 5000] [--gap-ms 1]

Nothing about CPU power states is changed: the figures are the machine's as it is.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


def _echo(sock: socket.socket, cpu: Optional[int]) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    while True:
        b = sock.recv(1)
        if not b or b == b"q":
            return
        sock.sendall(b)


def _timed(step: Callable[[], Any], n: int, gap_ms: float, scale: float) -> dict[str, float]:
    """``step`` run ``n`` times after 200 unrecorded ones, each ``gap_ms`` after the last (this process spins
    meanwhile; only the other side sleeps): p50, p95, p99 of its time in µs, times ``scale``."""
    times = []
    for i in range(n + 200):
        if gap_ms:
            end = time.perf_counter() + gap_ms / 1000
            while time.perf_counter() < end:
                pass
        t0 = time.perf_counter()
        step()
        if i >= 200:
            times.append((time.perf_counter() - t0) * scale * 1e6)
    return {f"p{q}_us": round(_pct(times, q), 1) for q in (50, 95, 99)}


def ping_pong(cpus: tuple[Optional[int], Optional[int]], n: int, gap_ms: float) -> dict[str, float]:
    """One-way hand-off (round trip ÷ 2) in µs between two pinned processes: p50, p95, p99."""
    a, b = socket.socketpair()
    p = multiprocessing.get_context("fork").Process(target=_echo, args=(b, cpus[1]), daemon=True)
    p.start()
    if cpus[0] is not None:
        os.sched_setaffinity(0, {cpus[0]})

    def step() -> None:
        a.sendall(b"x")
        a.recv(1)

    out = _timed(step, n, gap_ms, 0.5)
    a.sendall(b"q")
    p.join(5)
    return out


def redis_pings(port: int, cpu: Optional[int], n: int, gap_ms: float) -> dict[str, float]:
    """Round trip of a PING on the queue's own connection, in µs (Redis's wake-up, its reply, ours)."""
    import redis

    from serving.queue import JobQueue, QueueConfig

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    q = JobQueue(redis.Redis(port=port), QueueConfig())
    out = _timed(lambda: q._trip(("PING",)), n, gap_ms, 1.0)
    q.close()
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpus", default="", help="two CPUs, the pinger's and the echo's (default: not pinned)")
    p.add_argument("--redis-cpu", type=int, default=None, help="Redis's CPU (default: not pinned)")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--gap-ms", type=float, default=1.0, help="spacing of the spaced runs (1 ms: 1,000 jobs/s)")
    p.add_argument("--out", default="", help="also write the figures here as JSON")
    a = p.parse_args(argv)
    pinned = [int(c) for c in a.cpus.split(",")] if a.cpus else []
    if a.cpus and len(pinned) != 2:
        p.error(f"--cpus takes two CPUs, the pinger's and the echo's, e.g. 4,5; got {a.cpus!r}")
    cpus: tuple[Optional[int], Optional[int]] = (pinned[0], pinned[1]) if pinned else (None, None)
    out: dict[str, Any] = {"cpus": a.cpus or "not pinned", "redis_cpu": a.redis_cpu, "n": a.n, "gap_ms": a.gap_ms}
    out["hand_off_back_to_back"] = ping_pong(cpus, a.n, 0)
    out["hand_off_spaced"] = ping_pong(cpus, a.n, a.gap_ms)
    with socket.socket() as s:  # a free port (bench.servers' needs pydantic, which the device lacks)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    work = tempfile.mkdtemp(prefix="gpuhost-wake-")
    cmd = [a.redis_server, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", work]
    if a.redis_cpu is not None:
        cmd = ["taskset", "-c", str(a.redis_cpu), *cmd]
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        out["redis_ping_back_to_back"] = redis_pings(port, cpus[0], a.n, 0)
        out["redis_ping_spaced"] = redis_pings(port, cpus[0], a.n, a.gap_ms)
    finally:
        srv.terminate()
        srv.wait(10)
    out["load_average"] = os.getloadavg()[0]
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
