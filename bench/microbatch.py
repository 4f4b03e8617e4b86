"""Seed 004's client micro-batching and adaptive window, measured against a real Triton (CPU, pytriton wheel).

Six runs per round under the same open-loop bursty load (bursts of 1–12 single requests at exponential gaps, issued
on schedule whatever the server does): {direct gRPC requests, client micro-batching (600 µs, ≤ 8)} × {Triton's
window fixed at 600 µs; fixed but the model reloaded every period (what moving the window costs by itself: each
move is a model load); adaptive window (±50 µs per period toward the p95 target, clamp [200, 1500] µs)}. The model
costs a + b·batch (python backend stand-in) and batches dynamically on the server as well.

    .venv/bin/python -m bench.microbatch [--duration 30] [--period 3] [--target-ms 30] [--repeat 3]

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
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc.aio as grpcaio

from serving.adaptive_window import Controller, Triton, WindowPolicy, served_window, with_window
from serving.microbatch import BatchPolicy, MicroBatcher, TritonBatchInfer, percentile
from tests.servers.triton import start_triton, write_sleep_model

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Client micro-batching and the adaptive window (seed 004)"
COST_A_MS, COST_B_MS, START_WINDOW_US = 4.0, 0.3, 600


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


def reload_every_period(api: Triton, period_s: float, stop: threading.Event, count: list[int]) -> None:
    """The control for the adaptive runs: as many real reloads (one per period), the window unchanged.

    Each reload carries a new value of an unused parameter: a load with the served config unchanged came out as
    cheap as no reload at all in a first run (Triton does not reload an unmodified model).
    """
    while not stop.wait(period_s):
        config = api.config("standin")
        config.setdefault("parameters", {})["reload_nonce"] = {"string_value": str(count[0] + 1)}
        api.load("standin", config)
        count[0] += 1


async def one_run(triton, arrivals, *, client_batching: bool, window: str, policy: WindowPolicy) -> dict:
    adaptive = window == "adaptive"
    api = Triton(triton.http_url, triton.metrics_url)
    config = api.config("standin")
    if served_window(config) != START_WINDOW_US:
        api.load("standin", with_window(config, START_WINDOW_US))
    time.sleep(1.0)
    before = counters(triton.metrics_url)
    client = grpcaio.InferenceServerClient(triton.grpc_url)
    lat: list[tuple[float, float]] = []  # (done time, latency s)
    errors = 0
    batcher = MicroBatcher(TritonBatchInfer(client, "standin", outputs=["OUTPUT0"]), BatchPolicy(600, 8))
    x = np.arange(4, dtype=np.float32)

    async def request(i: int) -> None:
        nonlocal errors
        t0 = time.perf_counter()
        item = x + i
        try:
            if client_batching:
                out = (await batcher.submit({"INPUT0": item}))["OUTPUT0"]
            else:
                t = grpcaio.InferInput("INPUT0", [1, 4], "FP32")
                t.set_data_from_numpy(item[None])
                out = (await client.infer("standin", [t])).as_numpy("OUTPUT0")[0]
            if not np.array_equal(out, item):
                raise ValueError("wrong row")
            lat.append((time.perf_counter(), time.perf_counter() - t0))
        except Exception:  # noqa: BLE001 — counted
            errors += 1

    def client_p95(model: str) -> tuple[float, int]:
        # The last period, from the end of the last reload on: the reload's own disruption is not the window's.
        since = max(time.perf_counter() - policy.period_s, controller.applied_at.get(model, 0.0))
        recent = [v * 1e3 for done, v in lat if done >= since]
        return percentile(recent, 95), len(recent)

    controller: Controller = Controller(policy, ["standin"], client_p95, api)
    stop = threading.Event()
    reloads = [0]
    if window == "reloaded":
        runner = threading.Thread(target=reload_every_period, args=(api, policy.period_s, stop, reloads), daemon=True)
    else:
        runner = threading.Thread(target=controller.run, args=(stop,), daemon=True)
    if window != "fixed":
        runner.start()
    start = time.perf_counter()
    tasks = []
    async with batcher:
        for i, at in enumerate(arrivals):
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(request(i)))
        await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    stop.set()
    if window != "fixed":
        runner.join(timeout=30)
    await client.close()
    time.sleep(0.5)
    after = counters(triton.metrics_url)
    values = [v * 1e3 for _, v in lat]
    windows = [START_WINDOW_US] + [d.window_us for d in controller.decisions]
    return {
        "client_batching": client_batching,
        "window": window,
        "reloads": sum(d.changed for d in controller.decisions) if adaptive else reloads[0],
        "requests": len(arrivals),
        "ok": len(values),
        "errors": errors,
        "elapsed_s": round(elapsed, 2),
        "throughput_rps": round(len(values) / elapsed, 1),
        "p50_ms": round(percentile(values, 50), 2),
        "p95_ms": round(percentile(values, 95), 2),
        "p99_ms": round(percentile(values, 99), 2),
        "grpc_requests": int(after["nv_inference_request_success"] - before["nv_inference_request_success"]),
        "executions": int(after["nv_inference_exec_count"] - before["nv_inference_exec_count"]),
        "windows_us": windows,
        "loadavg_1m": float(open("/proc/loadavg").read().split()[0]),
        "decisions": [
            f"{d.action} {d.previous_us}->{d.window_us} (p95 {d.p95_ms:.1f} ms)" for d in controller.decisions
        ],
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| round | client micro-batching | Triton window | p50 ms | p95 ms | p99 ms | throughput req/s | gRPC requests | "
        "executions | reloads | errors | window path (µs) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        path = " → ".join(str(w) for w in r["windows_us"]) if r["window"] == "adaptive" else str(START_WINDOW_US)
        lines.append(
            f"| {r.get('repeat', 1)} | {'600 µs, ≤ 8' if r['client_batching'] else 'off'} | {r['window']} | {r['p50_ms']} | {r['p95_ms']} | "
            f"{r['p99_ms']} | {r['throughput_rps']} | {r['grpc_requests']} | {r['executions']} | {r['reloads']} | "
            f"{r['errors']} | "
            f"{path} |"
        )
    return "\n".join(lines) + "\n"


def summary(rows: list[dict]) -> str:
    """Median over the rounds of each configuration (the machine is shared: single runs are noisy)."""
    lines = [
        "| client micro-batching | Triton window | median p50 ms | median p95 ms | p95 range ms | median p99 ms | "
        "median throughput req/s | gRPC requests per run | executions per run | reloads per run | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cb in (False, True):
        for w in ("fixed", "reloaded", "adaptive"):
            rs = [r for r in rows if r["client_batching"] == cb and r["window"] == w]
            if not rs:
                continue

            def med(k, rs=rs):
                return round(float(np.median([r[k] for r in rs])), 2)

            p95s = [r["p95_ms"] for r in rs]
            lines.append(
                f"| {'600 µs, ≤ 8' if cb else 'off'} | {w} | {med('p50_ms')} | {med('p95_ms')} | "
                f"{min(p95s)}–{max(p95s)} | {med('p99_ms')} | {med('throughput_rps')} | {int(med('grpc_requests'))} | "
                f"{int(med('executions'))} | {int(med('reloads'))} | {sum(r['errors'] for r in rs)} |"
            )
    return "\n".join(lines) + "\n"


def write_doc(meta: dict, rows: list[dict]) -> None:
    body = (
        f"{SECTION}\n\n"
        f"`python -m bench.microbatch` at {meta['commit']} ({meta['when']}, {meta['machine']}): a real Triton on CPU "
        f"(pytriton wheel), model cost {COST_A_MS} ms + {COST_B_MS} ms·batch with server-side dynamic batching "
        f"(max 8); open-loop bursty load of {meta['requests']} single requests in {meta['duration_s']} s (bursts of "
        f"1–{meta['burst_max']} at exponential gaps of {meta['mean_gap_ms']} ms mean, same schedule in every run); "
        f"adaptive window: target p95 {meta['target_ms']} ms, ±50 µs every {meta['period_s']} s, clamp [200, 1500] "
        f"µs, p95 from the client's own records of the last period. 'gRPC requests' and 'executions' are Triton's "
        f"own counters.\n\nMedians over {meta['repeat']} interleaved rounds:\n\n" + summary(rows) + "\nEvery run "
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
    p.add_argument(
        "--windows",
        default="fixed,reloaded,adaptive",
        help="Triton window modes: fixed; reloaded (the model reloaded every period, window unchanged: what a move "
        "costs by itself); adaptive",
    )
    p.add_argument("--repeat", type=int, default=3, help="rounds of the four runs (interleaved against drift)")
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
                one_run(
                    triton,
                    schedule(3.0, a.seed + 1, a.mean_gap_ms, a.burst_max),
                    client_batching=True,
                    window="fixed",
                    policy=policy,
                )
            )
            for rep in range(a.repeat):
                for client_batching in (False, True):
                    for window in a.windows.split(","):
                        r = asyncio.run(
                            one_run(triton, arrivals, client_batching=client_batching, window=window, policy=policy)
                        )
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
