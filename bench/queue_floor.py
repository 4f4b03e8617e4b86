"""The queue gateway's own cost per job: real Redis, real ``serving.worker`` processes, a backend that answers at once.

What ``bench.queue_gpu`` cannot separate from Triton: the part of a job's latency that is the gateway's (the
client's submit call, submit → dispatch, stored → caller) and what each side spends in CPU, with the detector's
answer (detections [1, 100, 6] FP32 + num_detections) returned at once by a stand-in backend in the worker process
(a mock by design: this bench measures everything but the model). The inputs are distinct arrays of ``--bytes``
(default: a 1280x720 JPEG frame's 106,805 bytes), so ``--inline-max-bytes`` decides their path: a key of their own
(SET beside the submit script, MGET per worker read) or inline in the stream entry (through the submit script).

    .venv/bin/python -m bench.queue_floor                        # one client: the latency floor
    .venv/bin/python -m bench.queue_floor --clients 8 --workers 2
    .venv/bin/python -m bench.queue_floor --inline-max-bytes 1048576    # the frame through the submit script
    .venv/bin/python -m bench.queue_floor --round-trips     # + the round trips per job, caller's and worker's

``--round-trips`` counts the requests each side's redis-py writes before it reads the replies (one command, or one
whole pipeline: a round trip), by the commands in each; Redis's own count of commands (INFO commandstats) is printed
either way. The count parses every request it sends, so its latencies are not the floor's.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from serving.adaptive_window import percentile as pct  # noqa: E402

ANSWER = {"detections": np.zeros((1, 100, 6), np.float32), "num_detections": np.array([[7]], np.int32)}


class AtOnce:
    """A backend that answers every job at once with a detector-shaped answer (stands in for Triton)."""

    def __init__(self, cfg: Any, timeout_s: float):
        self.cfg = cfg

    def infer(self, job: Any) -> dict[str, np.ndarray]:
        return ANSWER


def command_names(request: Any) -> str:
    """The commands of one request redis-py writes (RESP arrays of bulk strings; a pipeline's several), e.g.
    ``SET+EVALSHA``."""
    data = request if isinstance(request, bytes) else b"".join(bytes(c) for c in request)
    names, pos = [], 0
    while pos < len(data):
        end = data.index(b"\r\n", pos)
        n, pos = int(data[pos + 1 : end]), end + 2
        for i in range(n):
            end = data.index(b"\r\n", pos)
            size = int(data[pos + 1 : end])
            if i == 0:
                names.append(data[end + 2 : end + 2 + size].decode().upper())
            pos = end + 2 + size + 2
    return "+".join(names)


def count_round_trips() -> collections.Counter:
    """From now on, this process's round trips to Redis by their commands: redis-py writes a command, or a whole
    pipeline, with one ``send_packed_command`` before it reads the replies."""
    import redis.connection

    counts: collections.Counter = collections.Counter()
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        counts[command_names(command)] += 1
        send(self, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
    return counts


def worker_main(
    redis_port: int, consumer: str, slots: int, conn: Any, round_trips: bool = False, block_ms: Optional[int] = None
) -> None:
    from serving.scheduler import Signals
    from serving.worker import Worker, WorkerConfig

    class StandInWorker(Worker):
        def _probe_once(self, b: Any, prev: dict[str, Any], with_metrics: bool) -> None:
            self.sched.observe(b.name, Signals(ready=True), time.monotonic())  # the stand-in is always ready

    backends = [{"name": n, "weight": w, "grpc": "-", "http": "-"} for n, w in (("a", 3), ("b", 2))]
    cfg = WorkerConfig.from_dict(
        {"redis": {"port": redis_port}, "backends": backends, "slots": slots}
        | ({"block_ms": block_ms} if block_ms is not None else {})
    )
    w = StandInWorker(cfg, consumer, backend_factory=AtOnce)
    signal.signal(signal.SIGTERM, lambda *_: w.stop.set())
    counts = count_round_trips() if round_trips else collections.Counter()
    t0 = os.times()
    w.run()
    t1 = os.times()
    conn.send((t1.user - t0.user + t1.system - t0.system, dict(counts)))


def start_floor_workers(port: int, a: argparse.Namespace, r: Any, q: Any) -> list[tuple[Any, Any]]:
    """``--workers`` stand-in worker processes (spawned), each with the pipe it reports on, waited for until each
    is a consumer of the stream."""
    ctx = multiprocessing.get_context("spawn")
    procs = []
    for i in range(a.workers):
        parent, child = ctx.Pipe()
        p = ctx.Process(
            target=worker_main, args=(port, f"w{i}", a.slots, child, a.round_trips, a.block_ms), daemon=True
        )
        p.start()
        procs.append((p, parent))
    deadline = time.monotonic() + 60
    while int((r.xinfo_groups(q.cfg.stream) or [{"consumers": 0}])[0]["consumers"]) < a.workers:
        if time.monotonic() > deadline:
            raise TimeoutError("workers did not join the group")
        time.sleep(0.05)
    return procs


def timed_jobs(q: Any, inputs: list[np.ndarray], a: argparse.Namespace) -> tuple[list[tuple[float, ...]], float, float]:
    """``--jobs`` jobs from ``--clients`` threads, one job at a time each: per job (total, submit call, submit →
    dispatch, dispatch → stored, stored → caller) in ms; the wall seconds; the client's CPU seconds."""
    rows: list[tuple[float, ...]] = []
    lock, nxt = threading.Lock(), [0]

    def client() -> None:
        while True:
            with lock:
                j = nxt[0]
                nxt[0] += 1
            if j >= a.jobs:
                return
            t0 = time.time()
            key = q.submit("m", {"images": inputs[j % 16]})
            t1 = time.time()
            res = q.result(key, timeout_s=30, submitted_at=t0)
            t2 = time.time()
            if res.status != "ok" or int(res.outputs["num_detections"][0, 0]) != 7:
                raise RuntimeError(f"job {j}: {res.status} {res.error}")
            with lock:  # total, submit call, submit -> dispatch, dispatch -> stored, stored -> caller
                rows.append(
                    ((t2 - t0) * 1000, (t1 - t0) * 1000, res.queue_ms, res.latency_ms - res.queue_ms,
                     (t2 - t0) * 1000 - res.latency_ms)
                )  # fmt: skip

    c0, t0 = os.times(), time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds, c1 = time.perf_counter() - t0, os.times()
    return rows, seconds, c1.user - c0.user + c1.system - c0.system


def stop_floor_workers(procs: list[tuple[Any, Any]]) -> tuple[float, collections.Counter]:
    """SIGTERM each worker; what they report: their CPU seconds together and their round trips by command."""
    worker_cpu = 0.0
    worker_counts: collections.Counter = collections.Counter()
    for p, conn in procs:
        p.terminate()  # SIGTERM: the worker stops and reports its CPU and round trips
        cpu, counts = conn.recv() if conn.poll(30) else (float("nan"), {})
        worker_cpu += cpu
        worker_counts.update(counts)
        p.join(10)
    return worker_cpu, worker_counts


def run(a: argparse.Namespace) -> dict:
    import redis

    from serving.queue import JobQueue, QueueConfig
    from testbed.servers.redis import start_redis

    with start_redis(Path(tempfile.mkdtemp(prefix="gpuhost-queue-floor-"))) as h:
        r = redis.Redis(port=h.port, socket_timeout=10)
        q = JobQueue(r, QueueConfig(max_depth=10_000, inline_max_bytes=a.inline_max_bytes))
        q.ensure_group()
        procs = start_floor_workers(h.port, a, r, q)
        inputs = [np.random.default_rng(i).integers(0, 256, (1, a.bytes), dtype=np.uint8) for i in range(16)]
        for i in range(20):  # warm: scripts loaded, connections open, probes done
            q.call("m", {"images": inputs[i % 16]}, timeout_s=30)
        r.config_resetstat()
        caller = count_round_trips() if a.round_trips else collections.Counter()
        rows, seconds, client_cpu = timed_jobs(q, inputs, a)
        caller_counts = dict(caller)
        stats = r.info("commandstats")
        worker_cpu, worker_counts = stop_floor_workers(procs)
        r.close()
    names = ("total", "submit call", "submit to dispatch (from the call)", "dispatch to stored", "stored to caller")
    cols = [sorted(c) for c in zip(*rows)]
    trips = {}
    if a.round_trips:  # the workers' count runs from their start: the 20 warm-up jobs are in it
        trips = {
            "caller_round_trips_per_job": per_job(caller_counts, a.jobs),
            "worker_round_trips_per_job (polls that found no job included)": per_job(worker_counts, a.jobs + 20),
        }
    return {
        "jobs": a.jobs,
        "jobs_per_s": round(a.jobs / seconds, 1),
        "p50_ms": {n: round(pct(c, 50), 3) for n, c in zip(names, cols)},
        "p95_ms": round(pct(cols[0], 95), 3),
        "client_cpu_us_per_job": round(client_cpu / a.jobs * 1e6),
        "worker_cpu_us_per_job": round(worker_cpu / (a.jobs + 20) * 1e6),
        "redis_us_per_job": round(sum(v["usec"] for k, v in stats.items() if k != "cmdstat_config") / a.jobs, 1),
        "redis_per_job": {
            k.removeprefix("cmdstat_"): (round(v["calls"] / a.jobs, 2), round(v["usec"] / a.jobs, 1))
            for k, v in stats.items()
            if k != "cmdstat_config"
        },
        **trips,
    }


def per_job(counts: dict[str, int], jobs: int) -> dict[str, float]:
    """Round trips per job by their commands, and their sum under ``all``."""
    out = {k: round(v / jobs, 3) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}
    return {"all": round(sum(counts.values()) / jobs, 3), **out}


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--clients", type=int, default=1, help="client threads, each one job at a time")
    p.add_argument("--workers", type=int, default=1, help="serving.worker processes")
    p.add_argument("--slots", type=int, default=12)
    p.add_argument("--block-ms", type=int, default=None, help="an idle slot's XREADGROUP wait (default: the worker's)")
    p.add_argument("--bytes", type=int, default=106_805, help="input bytes a job (a 1280x720 JPEG frame's)")
    p.add_argument("--inline-max-bytes", type=int, default=64 * 1024)
    p.add_argument("--round-trips", action="store_true", help="count each side's round trips to Redis per job")
    a = p.parse_args(argv)
    import redis.utils

    out = run(a)
    parser = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "redis-py's Python parser"
    print(f"{a.bytes} bytes a job, {a.clients} clients, {a.workers} workers x {a.slots} slots (block_ms {a.block_ms or 'default'}), {parser}, "
          f"inline below {a.inline_max_bytes} bytes; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    for k, v in out.items():
        print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
