"""Seed 001's queue + scheduler against direct calls to Triton: jobs/s and the p95 the queue adds, on this machine.

    .venv/bin/python -m bench.queue                      # ~2 min: results in bench/results/queue.{json,md}
    .venv/bin/python -m bench.queue --duration 5 --concurrency 4,16

Setup (all real, on loopback): Debian's redis-server, two Tritons from the pytriton wheel serving a CPU stand-in
(`gen`: FP32 echo, fixed ``--batch-ms`` per batch, dynamic batching up to 8), named mig-a (weight 3) and vm-b
(weight 2), and ``--workers`` queue worker processes (``python -m serving.worker``, 8 slots each).

For each concurrency C, a closed loop of C client threads for ``--duration`` seconds:
  * direct: each call goes straight to a Triton over gRPC, the backend chosen by smooth weighted round robin 3:2
    (what a client would do without the queue);
  * queue:  each call is ``JobQueue.call``: XADD through the submit script, a worker's XREADGROUP, the scheduler's
    pick, the gRPC call, the result stored once and BLPOP'd by the caller. Latency is the caller's, submit to
    result, queueing included.
Every answer is compared with its input. Writes bench/results/queue.json (all numbers) and queue.md, and puts the
table into docs/benchmarks.md between its bench/queue.py markers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bench.report import latency

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- BEGIN bench/queue.py table -->", "<!-- END bench/queue.py table -->"
WEIGHTS = {"mig-a": 3, "vm-b": 2}


def log(msg: str) -> None:
    print(f"[bench.queue {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def closed_loop(call, concurrency: int, duration: float) -> dict:
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop_at = [0.0]
    barrier = threading.Barrier(concurrency + 1)

    def worker(w: int) -> None:
        mine, bad, i = [], 0, 0
        barrier.wait()
        while time.perf_counter() < stop_at[0]:
            x = np.full((1, 16), float(w * 1_000_000 + i) + 0.5, dtype=np.float32)
            t0 = time.perf_counter()
            try:
                out = call(x)
                ok = np.array_equal(out, x)
            except Exception:  # a failed call counts as an error, the loop goes on
                ok = False
            mine.append((time.perf_counter() - t0) * 1000)
            bad += 0 if ok else 1
            i += 1
        with lock:
            lat.extend(mine)
            errors[0] += bad

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(concurrency)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + duration
    t_start = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join(duration + 60)
    elapsed = time.perf_counter() - t_start
    lat.sort()
    return {
        "concurrency": concurrency,
        "requests": len(lat),
        "errors": errors[0],
        "seconds": round(elapsed, 3),
        "jobs_per_s": round((len(lat) - errors[0]) / elapsed, 1),
        **latency(lat),
    }


class WeightedRoundRobin:
    """Smooth weighted round robin (nginx's): 3:2 gives a, b, a, b, a."""

    def __init__(self, weights: dict[str, int]):
        self.w, self.cur, self.lock = weights, {k: 0 for k in weights}, threading.Lock()

    def next(self) -> str:
        with self.lock:
            total = sum(self.w.values())
            for k in self.cur:
                self.cur[k] += self.w[k]
            best = max(self.cur, key=lambda k: self.cur[k])
            self.cur[best] -= total
            return best


def arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--concurrency", default="4,16")
    ap.add_argument("--batch-ms", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--no-doc", action="store_true", help="do not touch docs/benchmarks.md")
    return ap


def start_tritons(base: Path, batch_ms: float, handles: dict) -> None:
    """One Triton per backend of WEIGHTS serving the stand-in ``gen``, into ``handles`` as each is ready (so a
    failed start still stops those before it)."""
    from testbed.servers.triton import sleep_model_config, start_triton, write_python_model

    for name in WEIGHTS:
        repo = base / name / "models"
        repo.mkdir(parents=True)
        write_python_model(repo, "gen", sleep_model_config("gen", sleep_ms=batch_ms, max_batch_size=8))
        handles[name] = start_triton(repo, workdir=base / name / "work")


def direct_caller(handles: dict) -> Callable[[np.ndarray], np.ndarray]:
    """A call straight to a Triton over gRPC, the backend chosen by smooth weighted round robin."""
    import tritonclient.grpc as grpcclient

    clients = {n: grpcclient.InferenceServerClient(h.grpc_url) for n, h in handles.items()}
    rr = WeightedRoundRobin(WEIGHTS)

    def direct(x):
        i = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        return clients[rr.next()].infer("gen", [i], client_timeout=30).as_numpy("OUTPUT0")

    return direct


def start_workers(a: argparse.Namespace, port: int, handles: dict, base: Path, workers: list) -> Any:
    """``--workers`` queue worker processes (into ``workers``), waited for until each is a consumer of the
    stream; the JobQueue a caller submits to."""
    import redis

    from serving.queue import JobQueue, QueueConfig
    from testbed.servers.gateway import spawn_worker, worker_config

    cfg = worker_config(port, handles, WEIGHTS, queue={"max_depth": 10_000}, slots=a.slots, models=["gen"])
    workers += [spawn_worker(cfg, f"bench-{i}", base) for i in range(a.workers)]
    r = redis.Redis(port=port)
    q = JobQueue(r, QueueConfig(max_depth=10_000))
    q.ensure_group()
    deadline = time.monotonic() + 60
    while int(r.xinfo_groups(q.cfg.stream)[0]["consumers"]) < a.workers:
        if time.monotonic() > deadline:
            raise TimeoutError("workers did not start")
        time.sleep(0.1)
    return q


def queued_caller(q: Any) -> Callable[[np.ndarray], np.ndarray]:
    """A call through the queue: ``JobQueue.call``, submit to result."""

    def queued(x):
        res = q.call("gen", {"INPUT0": x}, timeout_s=30)
        if res.status != "ok":
            raise RuntimeError(res.error)
        return res.outputs["OUTPUT0"]

    return queued


def measure(levels: list[int], direct: Callable, queued: Callable, q: Any, duration: float) -> list[dict]:
    """Both paths warmed, then a closed loop per concurrency and path; the queue's rows with the backends' split."""
    for f in (direct, queued):  # warm both paths
        closed_loop(f, 4, 1.0)
    rows = []
    for c in levels:
        for path, f in (("direct", direct), ("queue", queued)):
            q.r.delete(q.cfg.stats_key)
            res = closed_loop(f, c, duration)
            if path == "queue":
                st = q.stats()
                res["served"] = {k.split(":", 1)[1]: v for k, v in st.items() if k.startswith("served:")}
                res["duplicates"] = st.get("duplicates", 0)
            log(f"{path:6s} c={c}: {res}")
            rows.append({"path": path, **res})
    return rows


def result_of(a: argparse.Namespace, rows: list[dict]) -> dict:
    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "machine": {
            "nproc": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_start": Path("/proc/loadavg").read_text().split()[:3],
        },
        "setup": {
            "batch_ms": a.batch_ms,
            "max_batch_size": 8,
            "workers": a.workers,
            "slots": a.slots,
            "weights": WEIGHTS,
            "duration_s": a.duration,
        },
        "rows": rows,
    }


def write(result: dict, doc: bool) -> str:
    """bench/results/queue.{json,md} and, with ``doc``, the table between docs/benchmarks.md's markers."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "queue.json").write_text(json.dumps(result, indent=2) + "\n")
    table = render(result)
    (RESULTS / "queue.md").write_text(table)
    if doc:
        text = DOC.read_text()
        block = f"{BEGIN}\n{table}{END}"
        text = (
            text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
            if BEGIN in text
            else (text.rstrip("\n") + "\n\n" + block + "\n")
        )
        DOC.write_text(text)
    return table


def main(argv: list[str] | None = None) -> int:
    a = arg_parser().parse_args(argv)
    sys.path.insert(0, str(ROOT))
    # Missing, these fail here and not after the servers' start.
    import redis  # noqa: F401
    import tritonclient.grpc  # noqa: F401

    from testbed.servers import stop_process
    from testbed.servers.redis import start_redis

    levels = [int(x) for x in a.concurrency.split(",")]
    base = Path(tempfile.mkdtemp(prefix="gpuhost-bench-queue-"))
    handles: dict = {}
    workers: list = []
    rs = start_redis(base / "redis")
    try:
        start_tritons(base, a.batch_ms, handles)
        log(f"redis on {rs.port}, tritons {[h.grpc_url for h in handles.values()]}")
        direct = direct_caller(handles)
        q = start_workers(a, rs.port, handles, base, workers)
        rows = measure(levels, direct, queued_caller(q), q, a.duration)
        result = result_of(a, rows)
    finally:
        for p in workers:
            stop_process(p)
        for h in handles.values():
            h.stop()
        rs.stop()
    print(write(result, doc=not a.no_doc))
    return 0


def render(result: dict) -> str:
    s = result["setup"]
    lines = [
        f"Queue + scheduler vs direct Triton calls (bench/queue.py, {result['when']}, commit {result['commit']}, "
        f"{result['machine']['nproc']} CPUs shared, load {' '.join(result['machine']['loadavg_start'])}): two CPU "
        f"Tritons, stand-in with {s['batch_ms']:g} ms per batch (max batch {s['max_batch_size']}), weights 3:2, "
        f"{s['workers']} workers x {s['slots']} slots, closed loop {s['duration_s']:g} s per row.",
        "",
        "| clients | path | jobs/s | p50 ms | p95 ms | p99 ms | errors | split mig-a:vm-b |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    by = {(r["path"], r["concurrency"]): r for r in result["rows"]}
    for r in result["rows"]:
        split = ""
        if r.get("served"):
            a, b = r["served"].get("mig-a", 0), r["served"].get("vm-b", 0)
            split = f"{a}:{b} ({a / b:.2f})" if b else f"{a}:0"
        lines.append(
            f"| {r['concurrency']} | {r['path']} | {r['jobs_per_s']:.1f} | {r['p50_ms']:.1f} | "
            f"{r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} | {split} |"
        )
    lines.append("")
    for c in sorted({r["concurrency"] for r in result["rows"]}):
        d, q = by.get(("direct", c)), by.get(("queue", c))
        if d and q:
            p95, p50, share = q["p95_ms"] - d["p95_ms"], q["p50_ms"] - d["p50_ms"], q["jobs_per_s"] / d["jobs_per_s"]
            lines.append(
                f"- {c} clients: the queue adds {p95:+.1f} ms at p95 ({p50:+.1f} ms at p50) and serves {share:.0%} of the direct rate."
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
