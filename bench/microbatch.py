"""Seed 004's client micro-batching and adaptive window, measured against a real Triton (CPU, pytriton wheel).

Three runs per round under the same open-loop bursty load (bursts of 1–12 single requests at exponential gaps, issued
on schedule whatever the server does): direct gRPC requests; client micro-batching (≤ 8) with its window fixed at
600 µs; client micro-batching with the adaptive window moved in process (``serving.adaptive_window.in_process``: ±50
µs per period toward the p95 target from the client's own records, clamp [200, 1500] µs; no reload, no restart).
Triton's own ``max_queue_delay_microseconds`` stays at 600 µs throughout (the server-side bound; the model is never
reloaded: Triton's log of model loads is checked). The model costs a + b·batch (python backend stand-in) and batches
dynamically on the server as well.

    .venv/bin/python -m bench.microbatch [--duration 30] [--period 3] [--target-ms 30] [--repeat 2]

Writes bench/results/microbatch.json and .md and puts the table in docs/benchmarks.md (its own section).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import re
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc.aio as grpcaio

from bench.report import latency, md_table
from serving.adaptive_window import WindowPolicy, in_process
from serving.microbatch import BatchPolicy, MicroBatcher, TritonBatchInfer
from testbed.servers.triton import start_triton, write_sleep_model

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Client micro-batching and the adaptive window (seed 004)"
COST_A_MS, COST_B_MS, START_WINDOW_US = 4.0, 0.3, 600
MODES = ("direct", "fixed", "adaptive")
MEDIANS = ("p50_ms", "p95_ms", "p99_ms", "throughput_rps", "grpc_requests", "executions")
LABEL = {"direct": "off (direct)", "fixed": "600 µs fixed, ≤ 8", "adaptive": "adaptive in process, ≤ 8"}


def schedule(duration_s: float, seed: int, mean_gap_ms: float, burst_max: int) -> list[float]:
    """Arrival times (s from start): bursts of 1..burst_max requests at exponential gaps (open loop)."""
    rng = random.Random(seed)
    t, out = 0.0, list[float]()
    while True:
        t += rng.expovariate(1000.0 / mean_gap_ms)
        if t >= duration_s:
            return out
        out += [t] * rng.randint(1, burst_max)


def counters(metrics_url: str) -> dict[str, float]:
    text = urllib.request.urlopen(metrics_url + "/metrics").read().decode()
    out = {}
    for k in ("nv_inference_exec_count", "nv_inference_request_success", "nv_inference_count"):
        m = re.search(rf'^{k}{{model="standin",version="1"}} (\S+)$', text, re.MULTILINE)
        out[k] = float(m.group(1)) if m else 0.0
    return out


def model_loads(triton) -> int:
    return len(re.findall(r"successfully loaded 'standin'", triton.log(), re.IGNORECASE))


async def one_run(triton, arrivals, *, mode: str, policy: WindowPolicy) -> dict:
    loads_before = model_loads(triton)
    time.sleep(1.0)
    before = counters(triton.metrics_url)
    client = grpcaio.InferenceServerClient(triton.grpc_url)
    lat: list[float] = []
    errors = 0
    batcher = MicroBatcher(TritonBatchInfer(client, "standin", outputs=["OUTPUT0"]), BatchPolicy(START_WINDOW_US, 8))
    controller = in_process({"standin": batcher}, policy)
    x = np.arange(4, dtype=np.float32)

    async def request(i: int) -> None:
        nonlocal errors
        t0 = time.perf_counter()
        item = x + i
        try:
            if mode != "direct":
                out = (await batcher.submit({"INPUT0": item}))["OUTPUT0"]
            else:
                t = grpcaio.InferInput("INPUT0", [1, 4], "FP32")
                t.set_data_from_numpy(item[None])
                out = (await client.infer("standin", [t])).as_numpy("OUTPUT0")[0]
            if not np.array_equal(out, item):
                raise ValueError("wrong row")
            lat.append(time.perf_counter() - t0)
        except Exception:  # noqa: BLE001 — counted
            errors += 1

    start = time.perf_counter()
    tasks = []
    async with batcher:
        control = asyncio.ensure_future(controller.run_async()) if mode == "adaptive" else None
        for i, at in enumerate(arrivals):
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(request(i)))
        await asyncio.gather(*tasks)
        if control is not None:
            control.cancel()
    elapsed = time.perf_counter() - start
    await client.close()
    time.sleep(0.5)
    after = counters(triton.metrics_url)
    values = [v * 1e3 for v in lat]
    return {
        "mode": mode,
        "requests": len(arrivals),
        "ok": len(values),
        "errors": errors,
        "model_reloads": model_loads(triton) - loads_before,
        "elapsed_s": round(elapsed, 2),
        "throughput_rps": round(len(values) / elapsed, 1),
        **latency(values),
        "grpc_requests": int(after["nv_inference_request_success"] - before["nv_inference_request_success"]),
        "executions": int(after["nv_inference_exec_count"] - before["nv_inference_exec_count"]),
        "windows_us": [START_WINDOW_US] + [d.window_us for d in controller.decisions],
        "loadavg_1m": float(open("/proc/loadavg").read().split()[0]),
        "decisions": [
            f"{d.action} {d.previous_us}->{d.window_us} (p95 {d.p95_ms:.1f} ms, {d.requests} requests)"
            for d in controller.decisions
        ],
    }


def _path(r: dict) -> str:
    return " → ".join(str(w) for w in r["windows_us"]) if r["mode"] == "adaptive" else "—"


def table(rows: list[dict]) -> str:
    head = ["round", "client micro-batching", "p50 ms", "p95 ms", "p99 ms", "throughput req/s", "gRPC requests"]
    head += ["executions", "model reloads", "errors", "load avg", "window path (µs)"]
    keys = ("p50_ms", "p95_ms", "p99_ms", "throughput_rps", "grpc_requests", "executions", "model_reloads", "errors")
    cells = ([r.get("repeat", 1), LABEL[r["mode"]], *(r[k] for k in keys), r["loadavg_1m"], _path(r)] for r in rows)
    return "\n".join(md_table(head, cells)) + "\n"


def summary(rows: list[dict]) -> str:
    """Median over the rounds of each configuration (the machine is shared: single runs are noisy)."""
    head = ["client micro-batching", "median p50 ms", "median p95 ms", "p95 range ms", "median p99 ms"]
    head += ["median throughput req/s", "gRPC requests per run", "executions per run", "model reloads", "errors"]
    cells = []
    for mode in MODES:
        rs = [r for r in rows if r["mode"] == mode]
        if rs:
            med = {k: round(float(np.median([r[k] for r in rs])), 2) for k in MEDIANS}
            p95s = [r["p95_ms"] for r in rs]
            cells.append(
                [LABEL[mode], med["p50_ms"], med["p95_ms"], f"{min(p95s)}–{max(p95s)}", med["p99_ms"]]
                + [med["throughput_rps"], int(med["grpc_requests"]), int(med["executions"])]
                + [sum(r["model_reloads"] for r in rs), sum(r["errors"] for r in rs)]
            )
    return "\n".join(md_table(head, cells)) + "\n"


def write_doc(meta: dict, rows: list[dict]) -> None:
    body = (
        f"{SECTION}\n\n"
        f"`python -m bench.microbatch` at {meta['commit']} ({meta['when']}, {meta['machine']}): a real Triton on CPU "
        f"(pytriton wheel), model cost {COST_A_MS} ms + {COST_B_MS} ms·batch with server-side dynamic batching "
        f"(max 8); open-loop bursty load of {meta['requests']} single requests in {meta['duration_s']} s (bursts of "
        f"1–{meta['burst_max']} at exponential gaps of {meta['mean_gap_ms']} ms mean, same schedule in every run); "
        f"adaptive window: target p95 {meta['target_ms']} ms, ±50 µs every {meta['period_s']} s, clamp [200, 1500] "
        f"µs, p95 from the client's own records of the last period, the window moved in process (no reload, no "
        f"restart); Triton's own window stays at {START_WINDOW_US} µs. 'gRPC requests', 'executions' are Triton's "
        f"own counters, 'model reloads' Triton's log of model loads during the run.\n\nMedians over {meta['repeat']} interleaved rounds:\n\n"
        + summary(rows)
        + "\nEvery run "
        "(load average of the shared machine at its end in the JSON results):\n\n" + table(rows) + "\n"
    )
    text = DOC.read_text() if DOC.exists() else ""
    if SECTION in text:
        head, _, rest = text.partition(SECTION)
        nxt = rest.find("\n## ")
        text = head + body + (rest[nxt + 1 :] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + body
    DOC.write_text(text)


def main() -> int:
    p = argparse.ArgumentParser(description="client micro-batching and adaptive window against a real Triton")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--period", type=float, default=3.0)
    p.add_argument("--target-ms", type=float, default=30.0)
    p.add_argument("--mean-gap-ms", type=float, default=40.0)
    p.add_argument("--burst-max", type=int, default=12)
    p.add_argument("--seed", type=int, default=4)
    p.add_argument("--modes", default=",".join(MODES), help="direct, fixed (600 µs), adaptive (in process)")
    p.add_argument("--repeat", type=int, default=2, help="rounds of the three runs (interleaved against drift)")
    a = p.parse_args()
    arrivals = schedule(a.duration, a.seed, a.mean_gap_ms, a.burst_max)
    policy = WindowPolicy(target_p95_ms=a.target_ms, step_us=50, period_s=a.period, min_us=200, max_us=1500)
    with tempfile.TemporaryDirectory(prefix="gpuhost-bench-mb-") as tmp:
        repo = Path(tmp) / "models"
        model = write_sleep_model(
            repo,
            "standin",
            sleep_ms=COST_A_MS,
            max_batch_size=8,
            max_queue_delay_microseconds=START_WINDOW_US,
            dims=(4,),
        )
        cfg = model / "config.pbtxt"
        cfg.write_text(
            cfg.read_text() + f'parameters {{ key: "sleep_per_request_ms" value {{ string_value: "{COST_B_MS}" }} }}\n'
        )
        flags = ["--model-control-mode=explicit", "--load-model=*", "--metrics-config=summary_latencies=true"]
        rows = []
        with start_triton(repo, workdir=Path(tmp) / "work", extra_args=flags) as triton:
            # Warm-up (discarded): the first requests after start pay the python backend's first calls.
            asyncio.run(
                one_run(triton, schedule(3.0, a.seed + 1, a.mean_gap_ms, a.burst_max), mode="fixed", policy=policy)
            )
            for rep in range(a.repeat):
                for mode in a.modes.split(","):
                    r = asyncio.run(one_run(triton, arrivals, mode=mode, policy=policy))
                    r["repeat"] = rep + 1
                    print(json.dumps(r), flush=True)
                    rows.append(r)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    meta = {
        "commit": commit.strip(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, load average {open('/proc/loadavg').read().split()[0]} at the end",
        "requests": len(arrivals),
        "duration_s": a.duration,
        "burst_max": a.burst_max,
        "mean_gap_ms": a.mean_gap_ms,
        "target_ms": a.target_ms,
        "period_s": a.period,
        "repeat": a.repeat,
        "cost": {"a_ms": COST_A_MS, "b_ms": COST_B_MS},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "microbatch.json").write_text(json.dumps({"meta": meta, "runs": rows}, indent=2) + "\n")
    (RESULTS / "microbatch.md").write_text(summary(rows) + "\n" + table(rows))
    write_doc(meta, rows)
    print(summary(rows) + "\n" + table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
