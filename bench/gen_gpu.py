"""Seed 001's own workload on the GPU: text prompts in, PNGs out, through the queue gateway (issue 42 §1).

The generator is SDXL-shaped with random weights (``serving/models/sdxl_generator.py``: diffusers' UNet and VAE from
SDXL base 1.0's configs, a hashed-token text encoder, Euler, classifier-free guidance; FP16 on the GPU). Parts:

1. GPU time, in this process with the GPU to itself: one UNet step (guidance: a batch of 2 per image) and one VAE
   decode at each ``--batches`` size, PNG encoding on the host; a whole image at batch 1 (every reference image is
   one) and at the best batch; the per-image time and images/s each gives.
2. The gateway against direct calls (``bench.queue_gpu``'s machinery, shared with the detector's benchmark): two
   Tritons on the one GPU serving the generator, triton-a with ``--instances`` instances (weight 3) and triton-b
   with two thirds of them (weight 2); Redis; ``--workers`` workers of ``--slots`` slots. Open loop at ``--rate``
   (default: ``--load`` × the images/s of one image at a time, part 1), direct then gateway on the same
   arrival times; latency from the scheduled arrival (queueing included). Each request carries one of
   ``--prompts`` (prompt, seed) pairs; each answer's PNG is decoded and compared with that pair's reference image
   (part 1): nearer to its own than to any other, within a quarter of the smallest distance between two
   references (random weights make different seeds' pictures far apart; the served batches differ from batch 1
   only in rounding).
3. Shedding: the gateway at ``--shed-load`` × the rate with ``shed_wait_ms`` = the SLO (``--slo-ms``) less the p95
   service time the gateway run measured: jobs that would wait past it are refused at once (the front's 503).
4. The fault runs at the rate: a worker, Redis, a backend SIGKILLed; nothing lost, nothing answered twice.
5. What a job costs the gateway (Redis's main thread and the workers' CPU per job, from the gateway run; the
   scheduler's pick, timed here) and the N-machine line computed from it.

Results are written after every part (OUT/gen_gpu.json, OUT/gen_gpu.md), so a run cut short keeps what it measured.

    bash bench/gen_gpu.sh OUT                                    # on the GPU machine (wheels carried)
    .venv/bin/python -m bench.gen_gpu --cpu --out /tmp/gen       # the whole thing on CPU, tiny model, 64x64
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import queue_gpu as qg  # noqa: E402
from bench.report import md_table  # noqa: E402
from serving.adaptive_window import percentile as pct  # noqa: E402

MODEL = "sdxl_generator"
PROMPTS = (
    "a lighthouse on a rocky coast at dawn",
    "a red fox in fresh snow, telephoto",
    "an isometric city block at night, neon",
    "a bowl of ramen, studio lighting",
    "ein Leuchtturm im Morgengrauen, Ölgemälde",
    "a paper boat on a puddle after rain",
    "霧の中の竹林、水墨画",
    "a vintage robot reading a newspaper",
)
SLO_MS = 2500.0  # seed 001: p95 ≤ 2.5 s including queueing
SEED_GOAL = 45.0  # seed 001: ≥ 45 images/s per machine


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S ") + msg, flush=True)


# ---------------------------------------------------------------- answers


def image_problem(rows: Any, own: int, refs: list[np.ndarray], tolerance: float) -> Optional[str]:
    """None when ``rows`` (the answer's ``image``, one PNG a UINT8 row) is one PNG of the references' size nearer to
    reference ``own`` than to any other and within ``tolerance`` (mean |difference| per channel, levels)."""
    from PIL import Image

    from serving.bytes_rows import from_rows

    if rows is None:
        return "no image output"
    pngs = from_rows(rows)
    if len(pngs) != 1:
        return f"{len(pngs)} images for one prompt"
    try:
        img = np.asarray(Image.open(io.BytesIO(pngs[0])).convert("RGB"))
    except Exception as e:  # noqa: BLE001 - any undecodable answer is a wrong answer
        return f"the PNG does not decode: {type(e).__name__}: {e}"
    if img.shape != refs[own].shape:
        return f"image {img.shape[1]}x{img.shape[0]}, not the declared {refs[own].shape[1]}x{refs[own].shape[0]}"
    dist = [float(np.abs(img.astype(np.int16) - r).mean()) for r in refs]
    nearest = min(range(len(refs)), key=dist.__getitem__)
    if nearest != own:
        return f"nearer to prompt {nearest}'s reference ({dist[nearest]:.2f}) than to its own ({dist[own]:.2f})"
    if dist[own] > tolerance:
        return f"{dist[own]:.2f} levels from its reference, over the {tolerance:.2f} allowed"
    return None


class Workload:
    """A load process's side (``bench.queue_gpu.workload``): job ``j`` asks for pair ``j mod n`` (the prompt as
    BYTES: a NumPy ``S`` array, as the front queues it) and its answer is checked against that pair's reference."""

    def __init__(self, setup: dict):
        with np.load(setup["refs"]) as z:
            self.refs = [z[f"ref{i}"] for i in range(len(setup["prompts"]))]
        self.prompts, self.seeds, self.tolerance = setup["prompts"], setup["seeds"], setup["tolerance"]

    def inputs(self, j: int) -> dict[str, np.ndarray]:
        i = j % len(self.prompts)
        return {
            "prompt": np.array([[self.prompts[i].encode()]], dtype="S"),
            "seed": np.array([[self.seeds[i]]], dtype=np.int64),
        }

    def check(self, j: int, out: dict[str, np.ndarray]) -> Optional[str]:
        return image_problem(out.get("image"), j % len(self.prompts), self.refs, self.tolerance)


# ---------------------------------------------------------------- part 1: GPU time


def timed(fn: Any, sync: Any, *args: Any, **kw: Any) -> tuple[Any, float]:
    """``fn(*args, **kw)`` and the ms until ``sync()`` returned after it (the device's work done)."""
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    sync()
    return out, (time.perf_counter() - t0) * 1000


def step_and_decode(gen: Any, b: int, sync: Any) -> tuple[float, float]:
    """(one UNet step at ``b`` images: 2b rows with guidance, median of 3 after one warm-up; one VAE decode of b
    latents, after one warm-up), ms."""
    import torch

    h, w = gen.height // 8, gen.width // 8
    states, pooled = gen.text(["", "a lighthouse on a rocky coast at dawn"])
    x = torch.randn((2 * b, 4, h, w), device=gen.device, dtype=gen.dtype)
    ctx = states[:1].expand(2 * b, -1, -1).contiguous()
    ids = torch.tensor([[gen.height, gen.width, 0, 0, gen.height, gen.width]] * (2 * b), device=gen.device)
    added = {"text_embeds": pooled[:1].expand(2 * b, -1).contiguous(), "time_ids": ids.to(gen.dtype)}
    t = torch.tensor(500.0, device=gen.device)
    kw = {"encoder_hidden_states": ctx, "added_cond_kwargs": added}
    timed(gen.unet, sync, x, t, **kw)
    step = sorted(timed(gen.unet, sync, x, t, **kw)[1] for _ in range(3))[1]
    lat = torch.randn((b, 4, h, w), device=gen.device, dtype=gen.dtype)
    timed(gen.vae.decode, sync, lat)
    return step, timed(gen.vae.decode, sync, lat)[1]


def gpu_time(gen: Any, batches: list[int], steps: int, guidance: float, prompts: list[str], seeds: list[int]) -> dict:
    """Part 1: per batch, one UNet step and one decode; the whole image at batch 1 for every (prompt, seed) (the
    references) and at the best batch; PNG encoding on the host."""
    import torch

    from serving.models.sdxl_generator import png_bytes

    sync = torch.cuda.synchronize if gen.device.type == "cuda" else (lambda: None)
    per: dict[int, dict[str, float]] = {}
    with torch.no_grad():
        for b in batches:
            step, dec = step_and_decode(gen, b, sync)
            est = (steps * step + dec) / b
            per[b] = {"unet_step_ms": round(step, 2), "decode_ms": round(dec, 2), "per_image_ms_est": round(est, 1)}
            log(f"batch {b}: UNet step {step:.1f} ms ({2 * b} rows), decode {dec:.1f} ms, ~{est:.0f} ms/image")
        timed(gen, sync, prompts[:1], seeds[:1], steps=1, guidance=guidance)  # the whole path's first use
        refs, whole = [], []
        for p, s in zip(prompts, seeds):
            img, ms = timed(gen, sync, [p], [s], steps=steps, guidance=guidance)
            refs.append(img[0].cpu().numpy())
            whole.append(ms)
        png = [timed(png_bytes, lambda: None, r) for r in refs]
        best = min(per, key=lambda b: per[b]["per_image_ms_est"])
        best_ms = None
        if best > 1:
            batch = [prompts[i % len(prompts)] for i in range(best)]
            best_ms = timed(gen, sync, batch, list(range(best)), steps=steps, guidance=guidance)[1]
    batch1 = sorted(whole)[len(whole) // 2]
    per_image = {1: batch1, **({best: best_ms / best} if best_ms else {})}
    best_b = min(per_image, key=lambda b: per_image[b])
    return {
        "steps": steps,
        "guidance": guidance,
        "size": f"{gen.width}x{gen.height}",
        "dtype": str(gen.dtype).removeprefix("torch."),
        "by_batch": per,
        "image_batch1_ms": [round(x, 1) for x in whole],
        "image_batch1_median_ms": round(batch1, 1),
        "best_batch": best,
        "image_best_batch_ms": round(best_ms, 1) if best_ms else None,
        "per_image_ms": {b: round(v, 1) for b, v in per_image.items()},
        "images_per_s": round(1000 / per_image[best_b], 3),
        "images_per_s_batch1": round(1000 / batch1, 3),
        "png_encode_ms": round(sorted(x[1] for x in png)[len(png) // 2], 1),
        "png_bytes": int(np.median([len(x[0]) for x in png])),
        "refs": refs,
    }


def reference_tolerance(refs: list[np.ndarray]) -> tuple[float, float]:
    """(tolerance, the smallest distance between two references): a quarter of that distance."""
    d = [float(np.abs(a.astype(np.int16) - b).mean()) for i, a in enumerate(refs) for b in refs[i + 1 :]] or [
        float("inf")
    ]
    return min(d) / 4, min(d)


# ---------------------------------------------------------------- the gateway's own cost


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (and their reaped children), seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in f[11:15]) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def scheduler_pick_us(n: int = 20000) -> float:
    """One job's scheduler work (pick, started, finished) on two backends, µs (median of 5 rounds of ``n``)."""
    from serving.scheduler import Scheduler

    s = Scheduler(dict(qg.WEIGHTS))
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            name = s.pick(t0)
            assert name is not None
            s.started(name)
            s.finished(name)
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return round(sorted(rounds)[2], 2)


def machine_line(per_machine: float, cost: dict) -> dict:
    """Images/s for N machines: N × one machine's, as long as the shared parts keep up: one Redis (its main thread's
    µs per job: jobs/s it can take at 80 % busy) and the front (``cost``'s CPU ms per job; it scales by adding
    fronts, as the workers do). The seed's goal in machines."""
    redis_us = cost.get("redis_main_thread_us_per_job") or 0.0
    redis_max = 0.8 * 1e6 / redis_us if redis_us else float("inf")
    n_goal = math.ceil(SEED_GOAL / per_machine) if per_machine > 0 else None
    return {
        "images_per_s_one_machine": per_machine,
        "machines_for_seed_goal": n_goal,
        "redis_jobs_per_s_at_80pct": round(redis_max, 0) if math.isfinite(redis_max) else None,
        "machines_before_redis_limits": math.floor(redis_max / per_machine) if per_machine > 0 else None,
        "line": {n: round(n * per_machine, 2) for n in (1, 2, 4, 8, 16, 32, 64, 128)},
    }


# ---------------------------------------------------------------- the runs


def service_p95_ms(res: dict) -> float:
    """The p95 of the answered jobs' Triton call from the worker (the service time, without the queue), ms."""
    return pct(sorted(x[12] for x in res.get("_rows", []) if x[4] == "ok"), 95)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--cpu", action="store_true", help="no GPU: the tiny generator, KIND_CPU, FP32, 64x64")
    p.add_argument("--rate", type=float, default=None, help="jobs/s (default: --load x part 1's batch-1 images/s)")
    p.add_argument("--load", type=float, default=0.8, help="the rate as a share of part 1's batch-1 images/s")
    p.add_argument("--shed-load", type=float, default=1.5, help="the shedding run's rate over --rate")
    p.add_argument("--slo-ms", type=float, default=SLO_MS, help="the p95 goal shedding keeps (seed 001: 2500)")
    p.add_argument("--arrivals", choices=qg.ARRIVALS, default="poisson")
    p.add_argument("--seed", type=int, default=42, help="the Poisson arrivals' seed")
    p.add_argument("--duration", type=float, default=None, help="seconds per run (default 45; --cpu 12)")
    p.add_argument("--fault-duration", type=float, default=None, help="seconds per fault run (default 20; --cpu 9)")
    p.add_argument("--faults", default="worker,redis,backend", help="fault runs, in order (or 'none')")
    p.add_argument("--skip", default="", help="parts to leave out: gateway, shed")
    p.add_argument("--instances", type=int, default=2, help="triton-a's instances; triton-b two thirds (weights 3:2)")
    p.add_argument("--max-batch", type=int, default=2, help="the model's max batch (seed 001: 2)")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--slots", type=int, default=1, help="jobs in flight per worker (workers x slots = instances)")
    p.add_argument("--procs", type=int, default=2, help="load processes")
    p.add_argument("--threads", type=int, default=12, help="threads per load process")
    p.add_argument("--prompts", type=int, default=None, help="distinct (prompt, seed) pairs (default 6; --cpu 4)")
    p.add_argument("--batches", default=None, help="part 1's batch sizes (default 1,2,4,8; --cpu 1,2)")
    p.add_argument("--steps", type=int, default=None, help="scheduler steps (default 30; --cpu 2)")
    p.add_argument("--size", type=int, default=None, help="image side, px (default 1024; --cpu 64)")
    p.add_argument("--claim-idle-ms", type=int, default=4000)
    p.add_argument("--max-depth", type=int, default=1000)
    p.add_argument("--redis-server", default="/usr/bin/redis-server")
    a = p.parse_args(argv)
    gpu = not a.cpu
    defaults = {"duration": 45.0, "fault_duration": 20.0, "prompts": 6, "batches": "1,2,4,8", "steps": 30, "size": 1024}
    if a.cpu:
        defaults.update(duration=12.0, fault_duration=9.0, prompts=4, batches="1,2", steps=2, size=64)
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    faults_of(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuhost-gen-gpu-{os.getpid()}"
    base.mkdir(parents=True, exist_ok=True)
    from bench.window_gpu import machine_line as machine

    result: dict[str, Any] = {"runs": [], "faults": []}
    result["meta"] = {
        "machine": machine(gpu)[1],
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        # A copy of the tree without .git (the GPU machine's) is named by GPUHOST_COMMIT.
        "commit": os.environ.get("GPUHOST_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "command": "python3 -m bench.gen_gpu " + " ".join(argv if argv is not None else sys.argv[1:]),
        "setup": {k: v for k, v in vars(a).items() if k not in ("out", "redis_server")},
    }
    t0 = time.monotonic()
    try:
        part1(a, gpu, base, result)
        write(out, result)
        part2(a, gpu, base, out, result)
    except Exception:  # noqa: BLE001 - what was measured is still written, with the error
        import traceback

        result["error"] = traceback.format_exc()
        log("FAILED:\n" + result["error"])
    result["meta"]["wall_s"] = round(time.monotonic() - t0, 1)
    write(out, result)
    print(markdown(result))
    bad = 1 if "error" in result else 0
    bad += sum(x["wrong"] + x["errors"] + x["lost"] for x in result["runs"])
    bad += sum(f["run"]["wrong"] + f["run"]["lost"] + f["run"]["redis"]["answered_twice"] for f in result["faults"])
    return 1 if bad else 0


def part1(a: argparse.Namespace, gpu: bool, base: Path, result: dict) -> None:
    import torch

    from serving.models.sdxl_generator import Generator

    device = torch.device("cuda:0" if gpu else "cpu")
    dtype = torch.float16 if gpu else torch.float32
    t0 = time.monotonic()
    gen = Generator.build("sdxl" if gpu else "tiny", device, dtype, height=a.size, width=a.size)
    params = sum(x.numel() for x in gen.unet.parameters())
    log(f"generator built in {time.monotonic() - t0:.1f} s: UNet {params:,} parameters, {dtype}, {device}")
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(a.prompts)]
    seeds = [1000 + i for i in range(a.prompts)]
    batches = [int(x) for x in a.batches.split(",")]
    g = gpu_time(gen, batches, a.steps, 5.0, prompts, seeds)
    refs = g.pop("refs")
    tolerance, apart = reference_tolerance(refs)
    np.savez(base / "refs.npz", **{f"ref{i}": r for i, r in enumerate(refs)})
    g.update(unet_parameters=params, prompts=prompts, seeds=seeds, tolerance=round(tolerance, 2))
    g["references_apart_min"] = round(apart, 2)
    result["gpu"] = g
    log(f"part 1: {json.dumps(g)}")
    del gen
    if gpu:
        torch.cuda.empty_cache()


def write(out: Path, result: dict) -> None:
    doc = {**result, "runs": [qg.strip(dict(x)) for x in result["runs"]]}
    (out / "gen_gpu.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (out / "gen_gpu.md").write_text(markdown(result))


def generator_specs(a: argparse.Namespace, gpu: bool) -> dict:
    """The generator on two backends (instances by weight): SDXL's size on a GPU, the tiny one on CPU."""
    from plans.triton_repo import sdxl_generator

    spec = sdxl_generator(
        size="sdxl" if gpu else "tiny",
        gpu=gpu,
        instances=a.instances,
        max_batch_size=a.max_batch,
        height=a.size,
        width=a.size,
        steps=a.steps,
    )
    return qg.backend_specs(spec, by_weight=True)


def gen_gateway_config(a: argparse.Namespace, port: int, backends: dict) -> dict:
    """The detector bench's workers' config with the generator's model and its long timeouts."""
    return {**qg.gateway_config(port, backends, a), "models": [MODEL], "call_timeout_s": 300.0, "job_timeout_s": 600.0}


def load_setup(a: argparse.Namespace, g: dict, base: Path, port: int, backends: dict) -> dict:
    """What each load process needs: the prompts, seeds, references and their tolerance, Redis and the backends."""
    return {
        "workload": "bench.gen_gpu",
        "refs": str(base / "refs.npz"),
        "prompts": g["prompts"],
        "seeds": g["seeds"],
        "tolerance": g["tolerance"],
        "redis_port": port,
        "grpc": {b.name: b.grpc for b in backends.values()},
        "max_depth": a.max_depth,
        "call_timeout_s": 300.0,
        "cpus": None,
    }


def costed_gateway_run(bench: Any, r: Any, workers: dict, rate: float, a: argparse.Namespace) -> dict:
    """The gateway's run at ``rate`` with what it cost per job: the workers' and Redis's CPU, Redis's main
    thread, the scheduler's pick."""
    pids = [w.pid for w in workers.values()]
    cpu0, redis0 = cpu_seconds(pids), r.info("cpu")
    res = bench.run("gateway", "open", rate=rate, kind=a.arrivals)
    cpu1, redis1 = cpu_seconds(pids), r.info("cpu")
    jobs = max(1, res["sent"])
    res["cost"] = {
        "workers_cpu_ms_per_job": round((cpu1 - cpu0) * 1000 / jobs, 2),
        "redis_cpu_ms_per_job": round(
            sum(float(redis1[k]) - float(redis0[k]) for k in ("used_cpu_sys", "used_cpu_user")) * 1000 / jobs, 3
        ),
        "redis_main_thread_us_per_job": round(sum(v["usec"] for v in res["redis"]["per_job"].values()), 1),
        "scheduler_us_per_job": scheduler_pick_us(),
    }
    return res


def gen_runs(bench: Any, r: Any, workers: dict, rs: Any, a: argparse.Namespace, out: Path, result: dict) -> None:
    """Warm-up, direct then gateway at the load's rate, the shedding run, the faults; ``result`` written after
    each."""
    g = result["gpu"]
    rate = a.rate or round(a.load * g["images_per_s_batch1"], 3)
    result["meta"]["rate"] = rate
    log(f"warm-up; then {rate:g} jobs/s ({a.load:g} x {g['images_per_s_batch1']} images/s at batch 1)")
    for path in ("direct", "gateway"):
        bench.run(path, "open", rate=rate, kind=a.arrivals, duration=max(4.0, 2 / rate))
    if "gateway" not in a.skip:
        result["runs"].append(bench.run("direct", "open", rate=rate, kind=a.arrivals))
        write(out, result)
        result["runs"].append(costed_gateway_run(bench, r, workers, rate, a))
        write(out, result)
    if "shed" not in a.skip and result["runs"]:
        gw = result["runs"][-1]
        shed_ms = round(max(100.0, a.slo_ms - service_p95_ms(gw)), 0)
        res = bench.run("gateway", "open", rate=round(a.shed_load * rate, 3), kind=a.arrivals, shed_wait_ms=shed_ms)
        result["runs"].append(res)
        write(out, result)
    for f in faults_of(a):
        ev = bench.fault_run(f, rs, rate=rate, kind=a.arrivals)
        result["faults"].append(ev)
        write(out, result)


def part2(a: argparse.Namespace, gpu: bool, base: Path, out: Path, result: dict) -> None:
    """Parts 2-5: the Tritons, Redis, the workers, the load processes; the runs; the costs."""
    import shutil

    import redis  # noqa: F401 - missing, it fails here and not after the servers' start

    from plans.triton_repo import repository_files
    from serving.models import sdxl_generator_files

    specs = generator_specs(a, gpu)
    files = lambda s: repository_files([s], gpu_count=1 if gpu else 0, model_files=sdxl_generator_files(s.name))  # noqa: E731
    rs = qg.Redis(a.redis_server, base / "redis", 1)
    rs.start(aof=False)
    backends: dict[str, qg.Backend] = {}
    workers: dict[str, subprocess.Popen] = {}
    pool: Optional[qg.LoadPool] = None
    try:
        t0 = time.monotonic()
        backends = qg.start_backends(base, specs, b"", gpu, files=files)
        log(
            f"Tritons ready in {time.monotonic() - t0:.1f} s: {[(n, s.instance_group[0].count) for n, s in specs.items()]}"
        )
        result["meta"]["instances"] = {n: s.instance_group[0].count for n, s in specs.items()}
        cfg = gen_gateway_config(a, rs.port, backends)
        r, q, metrics_ports, worker_cfg = qg.start_workers(a, cfg, rs, base, workers, {})
        pool = qg.LoadPool(a.procs, load_setup(a, result["gpu"], base, rs.port, backends))
        bench = qg.Bench(pool, r, q, backends, workers, metrics_ports, worker_cfg, base, MODEL, a, {})
        gen_runs(bench, r, workers, rs, a, out, result)
    finally:
        if pool is not None:
            pool.close()
        for w in workers.values():
            qg.kill_group(w, signal.SIGTERM)
        for b in backends.values():
            qg.kill_group(b.proc, signal.SIGTERM)
        rs.stop()
        for name, b in backends.items():
            (out / f"triton-{name}.log").write_bytes((b.workdir / "triton.log").read_bytes()[-300_000:])
        logs = b"".join(f.read_bytes()[-100_000:] for f in sorted(base.glob("w*.log")))
        (out / "workers.log").write_bytes(logs)
        shutil.rmtree(base / "redis" / "appendonlydir", ignore_errors=True)


def faults_of(a: argparse.Namespace) -> list[str]:
    faults = [] if a.faults == "none" else a.faults.split(",")
    if any(f not in ("worker", "redis", "backend") for f in faults):
        raise SystemExit("--faults: worker, redis, backend (comma-separated) or none")
    return faults


# ---------------------------------------------------------------- report


def markdown(result: dict) -> str:
    m = result.get("meta", {})
    bad = sum(x["wrong"] + x["errors"] + x["lost"] for x in result["runs"])
    bad += sum(f["run"]["wrong"] + f["run"]["lost"] + f["run"]["redis"]["answered_twice"] for f in result["faults"])
    lines = [f"**INVALID: {bad} answers wrong, failed, lost or given twice.**", ""] if bad else []
    if "error" in result:
        lines += [f"**The run stopped early:** `{result['error'].strip().splitlines()[-1]}`", ""]
    lines += [f"Machine: {m.get('machine')}; commit {m.get('commit')}; {m.get('when')}.", ""]
    lines += [f"Command: `{m.get('command')}`.", ""]
    g = result.get("gpu")
    if g:
        lines += [
            f"Generator: SDXL base 1.0's UNet ({g['unet_parameters']:,} parameters) and VAE, random weights, "
            f"{g['dtype']}, {g['size']}, {g['steps']} Euler steps, guidance {g['guidance']} (2 UNet rows per image).",
            "",
        ]
        rows = [
            [b, x["unet_step_ms"], x["decode_ms"], x["per_image_ms_est"], round(1000 / x["per_image_ms_est"], 3)]
            for b, x in g["by_batch"].items()
        ]
        head = ["batch", "UNet step ms", "VAE decode ms", "per image ms (steps x step + decode) / batch", "images/s"]
        lines += md_table(head, rows, align="rrrrr")
        lines += [
            "",
            f"Whole images, measured: batch 1 {g['image_batch1_median_ms']} ms (median of {len(g['image_batch1_ms'])}:"
            f" {g['image_batch1_ms']}); batch {g['best_batch']} {g['image_best_batch_ms']} ms; per image "
            f"{g['per_image_ms']} ms → {g['images_per_s']} images/s at best, {g['images_per_s_batch1']} at batch 1. "
            f"PNG encoding on the host {g['png_encode_ms']} ms ({g['png_bytes']:,} bytes).",
            "",
        ]
    if result["runs"]:
        lines += generation_table(result)
    if result["faults"]:
        lines += ["", *fault_table(result)]
    gw = next((x for x in result["runs"] if x["path"] == "gateway" and "cost" in x), None)
    if g and gw:
        lines += ["", *n_machine_lines(g, gw)]
    return "\n".join(lines) + "\n"


def generation_table(result: dict) -> list[str]:
    head = ["path", "offered jobs/s", "answered/s", "p50 ms", "p95 ms", "p99 ms", "sent", "right", "wrong"]
    head += ["errors", "lost", "shed (503)", "split a:b", "shed_wait_ms"]
    rows = []
    for x in result["runs"]:
        a_, b_ = x["split"].get("triton-a", 0), x["split"].get("triton-b", 0)
        cells = [x["path"], x.get("offered_per_s"), x["jobs_per_s"], x["p50_ms"], x["p95_ms"], x["p99_ms"]]
        cells += [x["sent"], x["answered_right"], x["wrong"], x["errors"], x["lost"], x.get("shed", 0)]
        cells += [f"{a_}:{b_}", x.get("shed_wait_ms", "-")]
        rows.append(cells)
    m = result["meta"]
    return [
        f"Two Tritons on the one GPU, triton-a (weight 3) and triton-b (weight 2), instances {m.get('instances')}; "
        f"{m['setup']['workers']} workers x {m['setup']['slots']} slots; open loop, {m['setup']['arrivals']} arrivals; "
        "latency from the scheduled arrival (queueing included); every answer's PNG decoded and compared with its "
        "(prompt, seed)'s reference image.",
        "",
        *md_table(head, rows, align="-rrrrrrrrrrr-r"),
    ]


def fault_table(result: dict) -> list[str]:
    head = ["fault", "at s", "sent", "answered once, right", "wrong", "lost", "answered twice", "duplicates dropped"]
    head += ["in flight at the fault", "jobs moved", "p99 ms after"]
    rows = []
    for f in result["faults"]:
        x = f["run"]
        red = x["redis"]
        rows.append(
            [qg.fault_label(f), round(f.get("at_s", 0), 1), x["sent"], x["answered_right"], x["wrong"], x["lost"]]
            + [red["answered_twice"], red["duplicate_completions_dropped"], f["in_flight_at_fault"], f["jobs_moved"]]
            + [f["after_fault_p99_ms"]]
        )
    return md_table(head, rows, align="-rrrrrrrrrr")


def n_machine_lines(g: dict, gw: dict) -> list[str]:
    cost = gw["cost"]
    gpu_line = machine_line(g["images_per_s"], cost)
    served = gw["jobs_per_s"]
    return [
        f"The gateway's cost per job (gateway run): Redis main thread {cost['redis_main_thread_us_per_job']} µs "
        f"({cost['redis_cpu_ms_per_job']} ms of Redis CPU), workers {cost['workers_cpu_ms_per_job']} ms CPU, the "
        f"scheduler's pick {cost['scheduler_us_per_job']} µs.",
        "",
        f"One machine (this GPU): {g['images_per_s']} images/s GPU-bound ({g['images_per_s_batch1']} at batch 1), "
        f"{g['images_per_s'] / SEED_GOAL:.1%} of seed 001's 45; "
        f"the gateway answered {served}/s at p95 {gw['p95_ms']} ms. Seed 001's 45 images/s: "
        f"{gpu_line['machines_for_seed_goal']} such machines. One Redis takes "
        f"{gpu_line['redis_jobs_per_s_at_80pct']} jobs/s at 80 % of its main thread, so the line stays linear up to "
        f"{gpu_line['machines_before_redis_limits']} machines (workers and fronts are added with the machines): "
        + ", ".join(f"{n}: {v}" for n, v in gpu_line["line"].items())
        + " images/s.",
    ]


if __name__ == "__main__":
    raise SystemExit(main())
