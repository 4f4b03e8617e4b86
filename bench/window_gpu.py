"""Seed 004 on the GPU: the real detector under a load that changes, four ways (issue 27).

(a) no micro-batching, Triton's defaults: 1 instance, no dynamic batching;
(b) the GPU's preset alone (``plans.presets``: instances, max batch, Triton window), single requests;
(c) the preset + client micro-batching (``serving.microbatch``), window fixed at 600 µs;
(d) the preset + client micro-batching + the adaptive window moved in process (``serving.adaptive_window``:
    ±step per period toward the p95 target from the client's own records, clamp [200, 1500] µs; no reload).

(c) and (d) run at the same time (``--together``, default ``c,d``): each on alternate client processes with its
share of the arrivals, against the one server under the whole load, so that what differs between them is the
client alone (two runs of the same client one after the other differ by more than their within-run noise: the
server's state moves between runs). The others run alone. Each run has the same open-loop load, phase by phase
at a fixed arrival rate (idle → burst → steady → idle;
Poisson arrivals at that rate, or evenly spaced with ``--arrivals even``; the same schedule for every configuration,
issued on time whatever the server does, so queueing shows). By default the rates come from short closed-loop
capacity probes of (a) and (b) (``sized_phases``: a burst at 2.2× (a)'s capacity, at most 70 % of the preset's;
``--burst-over-a``/``--preset-headroom``), so (a) saturates and the preset does not. The load comes from ``--procs`` client processes (``bench.openloop``): each
issues its own share of the arrivals over its own gRPC connection and, in (c)/(d), through its own micro-batcher and
controller, as real clients would; each request's latency counts from its scheduled time, and how late the client
issued it (issue lag) is recorded. A process holds at most ``--max-outstanding`` requests; an arrival beyond that is
shed and counted (the load the configuration could not take). A run whose clients issued late (issue lag past
``--max-lag-p99-ms``/``--max-lag-ms``) or were busy all the time says CLIENT-BOUND instead of a verdict. The model is ``yolov8n_torch`` (python backend, FP16 + CUDA graphs on a GPU) with the test detector's weights
(``serving.models.yolov8n_synthetic.make_test_weights``: input-dependent, tens of detections per image) and
``--images`` distinct synthetic images; request ``i`` sends image ``i mod N`` and its answer is compared with that
image's own reference (the same weights run in this process before Triton starts): detection count and the top boxes'
class, IoU and score. A 200 with a wrong answer counts as an error, never as served.

Recorded per configuration: per phase offered/served rate, shed, errors, p50/p95/p99; per time bucket p95 against the
target, served rate and (d)'s windows; (d)'s decisions per period. Written to OUT/window_gpu.json and OUT/window_gpu.md,
every request's record (due, sent, done, right/wrong/failed/shed) to OUT/records_<config>.npz.

    python3 -m bench.window_gpu --out OUT                      # on the GPU machine (bench/window_gpu.sh OUT)
    .venv/bin/python -m bench.window_gpu --cpu --tiny --out /tmp/w   # smoke test here (CPU, minutes)
    .venv/bin/python -m bench.window_gpu --cpu --tiny --phases auto --auto-seconds 2,4,3,2 --probe-s 3 --out /tmp/w
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import openloop, servers  # noqa: E402
from bench.openloop import ClientSpec  # noqa: E402
from bench.yolo_check import repository, set_problem  # noqa: E402
from plans.presets import apply_preset  # noqa: E402
from plans.triton_model import InstanceGroup  # noqa: E402
from plans.triton_repo import yolov8n_torch  # noqa: E402
from serving.adaptive_window import WindowPolicy  # noqa: E402

CONFIGS = {
    "a": "no micro-batching, Triton defaults (1 instance, no dynamic batching)",
    "b": "GPU preset alone",
    "c": "preset + micro-batching, window fixed 600 µs",
    "d": "preset + micro-batching + adaptive window (in process)",
}
# Default: the phases sized by closed-loop probes of (a) and (b) (``sized_phases``), these seconds each.
AUTO_SECONDS = (8.0, 24.0, 20.0, 8.0)
# The goal asks for ≥ 2× (a)'s sustainable throughput: a burst at 2.2× tests it with a margin for the probe's error,
# and at most 70 % of the preset's closed-loop capacity (an open-loop Poisson load near a server's capacity queues
# whatever the client does; the H200 run at 2.5× / 76 % had even the preset alone over 25 ms in the burst).
BURST_OVER_A, PRESET_HEADROOM = 2.2, 0.7
TINY_PHASES = "idle:2:2,burst:3:6,steady:3:3,idle:2:2"
OUTPUTS = ["detections", "num_detections"]
WEIGHTS_FILE = "weights.pt"  # torch.save(state_dict): serving/models/yolov8n_weights.py loads it beside model.py
START_WINDOW_US = 600


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S ") + msg, flush=True)


# ---------------------------------------------------------------- load


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    rate: float  # arrivals per second


def parse_phases(text: str) -> list[Phase]:
    """``name:seconds:rate,...`` → phases; refused with the bad item named."""
    out = []
    for item in text.split(","):
        parts = item.split(":")
        try:
            name, seconds, rate = parts[0], float(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            raise SystemExit(f"--phases: {item!r} is not name:seconds:rate (e.g. burst:20:900)") from None
        if len(parts) != 3 or not name or seconds <= 0 or rate < 0:
            raise SystemExit(f"--phases: {item!r}: name, seconds > 0, rate ≥ 0")
        out.append(Phase(name, seconds, rate))
    return out


def schedule(phases: list[Phase], poisson: bool = False, seed: int = 4) -> list[tuple[float, int]]:
    """(arrival time s, phase index) at each phase's fixed rate (open loop): evenly spaced, or Poisson arrivals
    (exponential gaps at that mean rate, drawn from ``seed``: the same schedule for every configuration)."""
    import random

    rng = random.Random(seed)
    out: list[tuple[float, int]] = []
    start = 0.0
    for k, ph in enumerate(phases):
        if ph.rate > 0 and poisson:
            t = start + rng.expovariate(ph.rate)
            while t < start + ph.seconds:
                out.append((t, k))
                t += rng.expovariate(ph.rate)
        elif ph.rate > 0:
            out += [(start + j / ph.rate, k) for j in range(int(round(ph.seconds * ph.rate)))]
        start += ph.seconds
    return out


# ---------------------------------------------------------------- the detector and its references


def detector_weights() -> tuple[Any, bytes]:
    """The test detector (unfused, FP32, CPU) and its state_dict as torch.save bytes (what the backend loads)."""
    import torch

    from serving.models.yolov8n_synthetic import make_test_weights

    model = make_test_weights()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return model, buf.getvalue()


def references(model: Any, images: np.ndarray, gpu: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each image's (detections [100, 6], num_detections [1]) from the backend's own path run in this process: fused,
    FP16 channels_last on the GPU (FP32 on the CPU), the same preprocessing and NMS, one image at a time."""
    import copy

    import torch

    from serving.models import yolov8n as yolo

    dev = torch.device("cuda:0" if gpu else "cpu")
    dtype = torch.float16 if gpu else torch.float32
    net = yolo.fuse(copy.deepcopy(model).eval()).to(dev, dtype)
    if gpu:
        net = net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    pre = yolo.Preprocess(dtype)
    out = []
    with torch.no_grad():
        for img in images:
            det, count = yolo.fast_nms(net(pre(torch.from_numpy(img[None]).to(dev))))
            out.append((det[0].float().cpu().numpy(), count[0].cpu().numpy().astype(np.int32)))
    del net
    if gpu:
        torch.cuda.empty_cache()
    return out


def pick_images(model: Any, n: int, gpu: bool, min_detections: int = 5) -> tuple[np.ndarray, list]:
    """``n`` distinct synthetic images (from index 1000 on) on which the test detector finds at least
    ``min_detections`` boxes, with their references: an empty answer would match any other empty answer."""
    from serving.models.yolov8n_synthetic import synthetic_images

    images: list[np.ndarray] = []
    refs: list = []
    start = 1000
    while len(images) < n:
        if start > 1000 + 50 * n:
            raise RuntimeError(f"fewer than {n} of {50 * n} synthetic images give {min_detections} detections")
        batch = synthetic_images(n, start=start)
        for img, ref in zip(batch, references(model, batch, gpu)):
            if int(ref[1][0]) >= min_detections and len(images) < n:
                images.append(img)
                refs.append(ref)
        start += n
    return np.stack(images), refs


def check(det: np.ndarray, num: np.ndarray, ref: tuple[np.ndarray, np.ndarray], conf: float = 0.25) -> Optional[str]:
    """None when the answer is this image's: its detections and the reference's, matched one to one by class and
    IoU >= 0.5 (bench/yolo_check.match_detections), leave at most max(3, 30 %) of the larger set unmatched, not
    counting boxes whose score is within 0.05 of the threshold; else what differs.

    Why sets and that bound: served FP16 (CUDA graph, batched) and eager FP16 batch-1 on the same GPU differ a lot
    with these weights: the H200 per-answer check (bench/gpu_accuracy.py, 256 images) matched 10,942 of 11,047
    detections, with 199 unmatched away from the threshold and single boxes moved by up to 183 px, so a per-box
    IoU test refuses right answers (the first two H200 runs of this bench did). Against the next image's reference
    the same answers matched 371 of 11,047 (about 97 % unmatched), far past this bound."""
    ref_det, ref_num = ref
    n, rn = int(np.asarray(num).reshape(-1)[0]), int(np.asarray(ref_num).reshape(-1)[0])
    got, want = np.asarray(det, dtype=np.float32)[:n], np.asarray(ref_det, dtype=np.float32)[:rn]
    return set_problem(got, want, conf)


# ---------------------------------------------------------------- Triton


def model_specs(gpu: bool, gpu_name: str) -> dict[str, Any]:
    """(a)'s model and the preset model of (b), (c), (d), both with the test weights."""
    kind = "KIND_GPU" if gpu else "KIND_CPU"
    default = yolov8n_torch(name="yolov8n_default", max_batch_size=8, instances=1, gpu=gpu, weights=WEIGHTS_FILE)
    default = default.model_copy(
        update={"dynamic_batching": None, "instance_group": [InstanceGroup(kind=kind, count=1)]}
    )
    if gpu:
        preset = apply_preset(yolov8n_torch(name="yolov8n_preset", gpu=True, weights=WEIGHTS_FILE), gpu_name)
    else:  # no GPU, no preset: its H200 window and batch on one CPU instance (smoke test only)
        preset = yolov8n_torch(
            name="yolov8n_preset", gpu=False, instances=1, window_us=200, max_batch_size=8, weights=WEIGHTS_FILE
        )
    return {"default": default, "preset": preset}


def start_triton(workdir: Path, specs: list[Any], weights: bytes, gpu: bool) -> tuple[subprocess.Popen, str, str]:
    t = servers.start_triton(workdir, specs, repository(specs, weights, gpu), ready_timeout=300)
    return t.process, t.http, t.grpc


def model_loads(workdir: Path, model: str) -> int:
    return (workdir / "triton.log").read_text(errors="replace").lower().count(f"successfully loaded '{model}'")


# ---------------------------------------------------------------- one configuration


def answer_problem(out: Mapping[str, np.ndarray], ref: tuple[np.ndarray, np.ndarray]) -> Optional[str]:
    """``check`` on one served answer (the load generator's form: this image's outputs, its reference)."""
    return check(out["detections"], out["num_detections"], ref)


def client_spec(config: str, model: str, grpc_url: str, payload: str, args: argparse.Namespace) -> ClientSpec:
    """What each client process of configuration ``config`` does: (a)/(b) one request per image, (c) through its
    own micro-batcher, (d) and its own adaptive window."""
    return ClientSpec(
        grpc_url=grpc_url,
        model=model,
        input_name="images",
        outputs=tuple(OUTPUTS),
        payload=payload,
        check=answer_problem,
        batching=config in ("c", "d"),
        adaptive=config == "d",
        window_us=args.start_window_us,
        max_batch=8,
        policy=WindowPolicy(
            target_p95_ms=args.target_ms,
            step_us=args.step_us,
            period_s=args.period_s,
            min_us=200,
            max_us=1500,
            min_requests=args.min_requests,
            widen_min_per_batch=args.widen_min_per_batch,
        ),
        max_outstanding=args.max_outstanding,
        timeout_s=args.timeout_s,
    )


def sized_phases(
    capacity_a: float,
    capacity_preset: float,
    seconds: tuple[float, ...] = AUTO_SECONDS,
    over_a: float = BURST_OVER_A,
    headroom: float = PRESET_HEADROOM,
) -> list[Phase]:
    """The schedule from the closed-loop capacities: a burst at ``over_a`` × (a)'s capacity, but at most
    ``headroom`` × what the preset serves (so (a) saturates and the preset does not), a steady phase at 60 % of the burst and at least
    1.2× (a)'s capacity, idle at 20/s (at most a tenth of the burst) around them; rates of 100/s and more rounded
    to tens, smaller ones to tenths (a CPU smoke test's)."""
    burst = min(over_a * capacity_a, headroom * capacity_preset)
    steady = min(burst, max(1.2 * capacity_a, 0.6 * burst))
    idle = min(20.0, 0.1 * burst)

    def rounded(x: float) -> float:
        return float(round(x, -1)) if x >= 100 else max(0.1, round(x, 1))

    s = seconds
    return [
        Phase("idle", s[0], rounded(idle)),
        Phase("burst", s[1], rounded(burst)),
        Phase("steady", s[2], rounded(steady)),
        Phase("idle", s[3], rounded(idle)),
    ]


def run_configs(
    configs: list[str], specs: dict[str, ClientSpec], phases: list[Phase], args: argparse.Namespace
) -> list[dict]:
    """``configs`` under the phases' load: one configuration alone, or several at once (``--together``: each a
    share of the client processes and of the arrivals against the one server)."""
    plan = schedule(phases, poisson=args.arrivals == "poisson", seed=args.seed)
    together = openloop.run_open_loop_together({c: specs[c] for c in configs}, plan, args.procs, seed=args.seed)
    out = []
    for config in configs:
        run = together[config]
        recs = run.records
        # Every request's record (openloop.RECORD), to read again without the GPU.
        np.savez_compressed(Path(args.out) / f"records_{config}.npz", records=recs)
        c = openloop.counts(recs)
        late = openloop.lag(recs)
        spec = specs[config]
        out.append(
            {
                "config": config,
                "what": CONFIGS[config].replace(f"{START_WINDOW_US} µs", f"{args.start_window_us} µs"),
                "model": spec.model,
                "together_with": [x for x in configs if x != config],
                "share": round(run.share, 4),
                "elapsed_s": round(run.elapsed_s, 2),
                "requests": len(recs),
                "served_right": c["right"],
                "wrong_answers": c["wrong"],
                "failed": c["failed"],
                "shed": c["shed"],
                "issue_lag_ms": late,
                "max_issue_lag_ms": late["max_ms"],
                "client_cpu_share": run.cpu_share,
                "client_bound": openloop.client_bound(recs, run.cpu_share, args.max_lag_p99_ms, args.max_lag_ms),
                "batch_sizes": run.batch_sizes,
                "phases": openloop.phase_rows(recs, phases, args.target_ms),
                "timeline": openloop.timeline(
                    recs,
                    sum(ph.seconds for ph in phases),
                    args.bucket_s,
                    run.decisions if spec.batching else None,
                    args.start_window_us,
                ),
                "decisions": openloop.decision_rounds(run.decisions, args.period_s) if spec.adaptive else [],
                "problems": run.problems,
            }
        )
    return out


def verdict(runs: list[dict], probes: dict[str, dict], target_ms: float) -> list[str]:
    """The issue's goal, read off the runs: (a) misses the target, (d) keeps it in every phase with ≥ 2× (a)'s
    sustainable throughput, (d)'s p95 never worse than (c)'s by more than noise. Nothing is claimed from a run with
    a wrong answer, a failed request or a client that could not keep its schedule."""
    bad = [
        f"({r['config']}) {r['wrong_answers']} wrong, {r['failed']} failed"
        for r in runs
        if r["wrong_answers"] or r["failed"]
    ] + [
        f"({c}) probe {p['wrong']} wrong, {p['failed']} failed" for c, p in probes.items() if p["wrong"] or p["failed"]
    ]
    capacity = {c: p["right_per_s"] for c, p in probes.items()}
    bound = [f"({r['config']}) " + "; ".join(r["client_bound"]) for r in runs if r["client_bound"]]
    if bad:
        return ["INVALID: not every answer was right: " + "; ".join(bad)]
    if bound:
        return ["CLIENT-BOUND: the load generator did not keep its schedule, no result: " + "; ".join(bound)]
    by = {r["config"]: r for r in runs}
    out = []

    def sustained(r: dict) -> float:
        """The highest rate the server was under while this configuration's requests kept the target, nothing
        shed: its own served rate over its share of the arrivals (a configuration run with another had half)."""
        ok = [p["served_per_s"] for p in r["phases"] if p["p95_under_target"] and p["shed"] == 0 and p["failed"] == 0]
        return round(max(ok, default=0.0) / r.get("share", 1.0), 1)

    for c in by:
        out.append(
            f"({c}) sustained {sustained(by[c]):g}/s (highest phase served with p95 ≤ {target_ms:g} ms, nothing shed)"
        )
    if "a" in by:
        missed = [p["phase"] for p in by["a"]["phases"] if p["p95_under_target"] is False]
        out.append(f"(a) misses the target: {'yes, in ' + ', '.join(missed) if missed else 'no'}")
    if "d" in by:
        over = [p["phase"] for p in by["d"]["phases"] if p["p95_under_target"] is False]
        out.append(f"(d) p95 ≤ target in every phase: {'no, over in ' + ', '.join(over) if over else 'yes'}")
        cap_a = capacity.get("a") or (sustained(by["a"]) if "a" in by else 0.0)
        if cap_a:
            ratio = sustained(by["d"]) / cap_a
            out.append(f"(d) sustained / (a)'s capacity ({cap_a}/s): {ratio:.2f}× ({'≥' if ratio >= 2 else '<'} 2×)")
    if "d" in by and by["d"].get("decisions"):
        acts: dict[str, int] = {}
        for r in by["d"]["decisions"]:
            for a, n in r["actions"].items():
                acts[a] = acts.get(a, 0) + n
        lo = min(r["window_us"][0] for r in by["d"]["decisions"])
        hi = max(r["window_us"][1] for r in by["d"]["decisions"])
        out.append(
            "(d) decisions: "
            + ", ".join(f"{a} ×{n}" for a, n in sorted(acts.items()))
            + f"; windows after them {lo}–{hi} µs"
            + ("" if acts.keys() - {"hold"} else " (the controller never moved the window)")
        )
    if "c" in by and "d" in by:
        worse = []
        for pc, pd in zip(by["c"]["phases"], by["d"]["phases"]):
            if pc["p95_ms"] is None or pd["p95_ms"] is None:
                continue
            noise = max(abs(h[0] - h[1]) for h in (pc["p95_halves_ms"], pd["p95_halves_ms"]) if None not in h)
            if pd["p95_ms"] - pc["p95_ms"] > max(2 * noise, 1.0):
                worse.append(f"{pd['phase']} {pd['p95_ms']} vs {pc['p95_ms']} ms (noise {noise:.2f})")
        out.append("(d) never worse than (c) by more than noise: " + ("no: " + "; ".join(worse) if worse else "yes"))
    return out


# ---------------------------------------------------------------- report


def groups(configs: list[str], together: list[str]) -> list[list[str]]:
    """The runs, in ``configs``' order: each configuration alone, the ``together`` ones as one run where the first
    of them comes."""
    out: list[list[str]] = []
    for c in configs:
        if c not in together:
            out.append([c])
        elif not any(c in g for g in out):
            out.append([x for x in configs if x in together])
    return out


def _header_lines(m: dict) -> list[str]:
    """The run's machine, command, load and models, then each capacity probe."""
    lines = [
        f"Machine: {m['machine']}; commit {m['commit']}; {m['when']}.",
        "",
        f"Command: `{m['command']}`. Load (open loop, {m['arrivals']} arrivals, the same schedule for every "
        "configuration): "
        + ", ".join(f"{p['name']} {p['seconds']:g} s at {p['rate']:g}/s" for p in m["phases"])
        + f"; {m['procs']} client processes (each its own share of the arrivals, its own gRPC connection and, in "
        f"(c)/(d), its own micro-batcher and controller); latency from each request's scheduled time; at most "
        f"{m['max_outstanding']} outstanding per process, beyond that an arrival is shed. "
        f"Target p95 {m['target_ms']:g} ms; adaptive window ±{m['step_us']} µs every {m['period_s']:g} s, clamp "
        f"[200, 1500] µs, start {m.get('start_window_us', START_WINDOW_US)} µs; widen only when a period's batches held ≥ "
        f"{m.get('widen_min_per_batch', 2):g} requests on average (1: the seed's rule as written). {m['images']} distinct images; every answer checked against its "
        f"own image's reference. Models: {m['models']}."
        + (
            " " + " and ".join(f"({c})" for c in m["together"]) + " ran at the same time against the one server, "
            "each on its share of the client processes (alternate ones) and of the arrivals (dealt at random), so "
            "that the server's state from one run to the next does not enter their comparison; their served "
            "rates below are their own shares, the load on the server the phase's."
            if m.get("together")
            else ""
        ),
        "",
    ]
    for c, pr in m["probes"].items():
        lines.append(
            f"Capacity probe ({c}), closed loop, {pr['procs']}×{pr['concurrency']} in flight for {pr['seconds']:g} s: "
            f"{pr['right_per_s']}/s right (wrong {pr['wrong']}, failed {pr['failed']}), p50 {pr['p50_ms']} ms, "
            f"p95 {pr['p95_ms']} ms."
        )
    return lines


def _phase_table(runs: list[dict]) -> list[str]:
    """One row per configuration and phase."""
    lines = [
        "",
        "| config | phase | offered/s | served right/s | shed | wrong | failed | p50 ms | p95 ms | p99 ms | p95 ≤ target "
        "| issue lag p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        for p in r["phases"]:
            ok = "–" if p["p95_under_target"] is None else ("yes" if p["p95_under_target"] else "**no**")
            lines.append(
                f"| ({r['config']}) {r['what']} | {p['phase']} | {p['rate']:g} | {p['served_per_s']} | {p['shed']} | "
                f"{p['wrong_answers']} | {p['failed']} | {p['p50_ms']} | {p['p95_ms']} | {p['p99_ms']} | {ok} "
                f"| {p['lag_p99_ms']} |"
            )
    return lines


def _timeline_table(runs: list[dict], m: dict) -> list[str]:
    """p95 per time bucket for every configuration, with (d)'s window beside it."""
    lines = [
        "",
        f"p95 over time (ms, per {m['bucket_s']:g} s bucket of scheduled time; target {m['target_ms']:g}):",
        "",
    ]
    if not runs:
        return lines
    lines.append("| t s | " + " | ".join(f"({r['config']})" for r in runs) + " | (d) window µs, mean (min–max) |")
    lines.append("|---" * (len(runs) + 2) + "|")
    d = next((r for r in runs if r["config"] == "d"), None)
    for i, row in enumerate(runs[0]["timeline"]):
        cells = []
        for r in runs:
            v = r["timeline"][i]["p95_ms"] if i < len(r["timeline"]) else None
            cells.append("–" if v is None else (f"**{v}**" if v > m["target_ms"] else str(v)))
        w = "–"
        if d and i < len(d["timeline"]):
            w = "{} ({}–{})".format(d["timeline"][i]["window_us"], *d["timeline"][i]["window_range_us"])
        lines.append(f"| {row['t_s']} | " + " | ".join(cells) + f" | {w} |")
    return lines


def _decision_table(d: dict) -> list[str]:
    """(d)'s window decisions per period."""
    lines = [
        "",
        "(d)'s decisions per period, over its client processes (each decides from its own records):",
        "",
        "| t s | actions | window after, µs (min–max) | p95 ms (min–max) | requests |",
        "|---|---|---|---|---|",
    ]
    for x in d["decisions"]:
        acts = ", ".join(f"{a} ×{n}" for a, n in x["actions"].items())
        p95 = "–" if x["p95_ms"] is None else "{}–{}".format(*x["p95_ms"])
        lines.append(f"| {x['t_s']} | {acts} | {x['window_us'][0]}–{x['window_us'][1]} | {p95} | {x['requests']} |")
    return lines


def _run_totals(runs: list[dict]) -> list[str]:
    """Each configuration's totals, then its first problems."""
    lines = [""] + [
        f"({r['config']}) requests {r['requests']}, served right {r['served_right']}, wrong {r['wrong_answers']}, "
        f"failed {r['failed']}, shed {r['shed']}, model reloads {r['model_reloads']}, client issue lag p50 "
        f"{r['issue_lag_ms']['p50_ms']} / p99 {r['issue_lag_ms']['p99_ms']} / max {r['max_issue_lag_ms']} ms, client "
        f"processes busy {max(r['client_cpu_share']):.0%} at most, batch sizes {r['batch_sizes']}"
        for r in runs
    ]
    for r in runs:
        if r["problems"]:
            lines += ["", f"({r['config']}) first problems: " + "; ".join(r["problems"])]
    return lines


def markdown(result: dict) -> str:
    m, runs = result["meta"], result["runs"]
    lines = _header_lines(m)
    lines += ["", "Verdict:", ""] + [f"- {v}" for v in result["verdict"]]
    lines += _phase_table(runs)
    lines += _timeline_table(runs, m)
    d = next((r for r in runs if r["config"] == "d"), None)
    if d:
        lines += _decision_table(d)
    lines += _run_totals(runs)
    return "\n".join(lines) + "\n"


def machine_line(gpu: bool) -> tuple[str, str]:
    name = "CPU"
    if gpu:
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.strip()
            name = smi.splitlines()[0].split(",")[0] if smi else "GPU"
            return name, f"{smi}; {os.cpu_count()} CPUs; Python {platform.python_version()}"
        except OSError:
            pass
    load = open("/proc/loadavg").read().split()[0]
    return name, f"{platform.machine()} CPU only, {os.cpu_count()} CPUs, load average {load}"


def arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="seed 004 on the GPU: (a)–(d) under a changing open-loop load")
    p.add_argument("--out", required=True)
    p.add_argument("--cpu", action="store_true", help="no GPU: KIND_CPU, FP32 (smoke test)")
    p.add_argument("--tiny", action="store_true", help="seconds-long phases and 4 images (smoke test)")
    p.add_argument(
        "--phases",
        default=None,
        help="name:seconds:rate,... or auto: sized from closed-loop probes of (a) and (b) (default; tiny: "
        f"{TINY_PHASES})",
    )
    p.add_argument(
        "--auto-seconds",
        default=",".join(f"{x:g}" for x in AUTO_SECONDS),
        help="seconds of the sized phases: idle,burst,steady,idle",
    )
    p.add_argument("--burst-over-a", type=float, default=BURST_OVER_A, help="auto burst: this × (a)'s capacity")
    p.add_argument(
        "--preset-headroom", type=float, default=PRESET_HEADROOM, help="auto burst: at most this × the preset's"
    )
    p.add_argument("--procs", type=int, default=None, help="client processes (default 8; tiny: 2)")
    p.add_argument("--probe-s", type=float, default=5.0, help="seconds of each closed-loop capacity probe")
    p.add_argument("--probe-concurrency", type=int, default=4, help="requests in flight per process in a probe")
    p.add_argument("--max-lag-p99-ms", type=float, default=10.0, help="issue lag p99 past this: client-bound")
    p.add_argument("--max-lag-ms", type=float, default=100.0, help="issue lag past this: client-bound")
    p.add_argument("--configs", default="a,b,c,d")
    p.add_argument(
        "--together",
        default="c,d",
        help="configurations run at the same time, each on its share of the client processes and arrivals, against "
        "the one server, so their comparison is not moved by the server's state between runs ('' for none)",
    )
    p.add_argument(
        "--arrivals",
        choices=("poisson", "even"),
        default="poisson",
        help="Poisson arrivals at each phase's rate (default) or evenly spaced ones",
    )
    p.add_argument("--seed", type=int, default=4, help="seed of the Poisson schedule (the same for every config)")
    p.add_argument("--images", type=int, default=None, help="distinct images (default 64; tiny: 4)")
    p.add_argument("--target-ms", type=float, default=25.0)
    p.add_argument("--step-us", type=int, default=50)
    p.add_argument("--period-s", type=float, default=2.0, help="seconds between window decisions (seed: 10)")
    p.add_argument("--min-requests", type=int, default=20)
    p.add_argument("--start-window-us", type=int, default=START_WINDOW_US, help="(c)'s window and (d)'s first one")
    p.add_argument(
        "--widen-min-per-batch",
        type=float,
        default=WindowPolicy.widen_min_per_batch,
        help="(d) widens only when its batches held this many requests on average (1: the seed's rule as written)",
    )
    p.add_argument("--bucket-s", type=float, default=2.0)
    p.add_argument("--max-outstanding", type=int, default=64, help="per client process")
    p.add_argument("--timeout-s", type=float, default=30.0)
    p.add_argument("--gpu-model", default="", help="preset key (default: from nvidia-smi)")
    p.add_argument("--commit", default="")
    return p


def settle(args: argparse.Namespace) -> tuple[list[Phase], tuple[float, ...], list[str], list[str]]:
    """``--tiny``'s smaller settings filled in, every argument checked: (the given phases, or none for auto; the
    auto phases' seconds; the configurations; those of them that run together)."""
    if args.tiny:
        args.phases = args.phases or TINY_PHASES
        args.images = args.images or 4
        args.procs = args.procs or 2
        args.period_s, args.min_requests, args.bucket_s = min(args.period_s, 1.0), 2, 1.0
    args.procs = args.procs or 8
    if args.procs < 1:
        raise SystemExit("--procs: at least 1")
    phases = [] if args.phases in (None, "auto") else parse_phases(args.phases)
    try:
        auto_seconds = tuple(float(x) for x in args.auto_seconds.split(","))
    except ValueError:
        auto_seconds = ()
    if len(auto_seconds) != 4 or min(auto_seconds) <= 0:
        raise SystemExit(f"--auto-seconds: {args.auto_seconds!r} is not four durations > 0 (idle,burst,steady,idle)")
    configs = args.configs.split(",")
    if any(c not in CONFIGS for c in configs):
        raise SystemExit(f"--configs: only {', '.join(CONFIGS)}")
    named = [c for c in args.together.split(",") if c]
    if any(c not in CONFIGS for c in named) or len(set(named)) < len(named) or len(named) == 1:
        raise SystemExit(f"--together {args.together!r}: two or more of {', '.join(CONFIGS)}, each once, or ''")
    together = [c for c in configs if c in named]  # those of them that run at all
    together = together if len(together) >= 2 else []
    if len(together) > args.procs:
        raise SystemExit(f"--together: {len(together)} configurations need at least as many --procs ({args.procs})")
    return phases, auto_seconds, configs, together


def model_name(specs: dict[str, Any], config: str) -> str:
    return specs["default"].name if config == "a" else specs["preset"].name


def probe_and_size(
    phases: list[Phase],
    specs: dict[str, Any],
    grpc_url: str,
    payload: str,
    args: argparse.Namespace,
    auto_seconds: tuple[float, ...],
) -> tuple[list[Phase], dict[str, dict]]:
    """With no phases given: closed-loop capacity probes of (a) and (b), and the phases sized from them."""
    probes: dict[str, dict] = {}
    if phases:
        return phases, probes
    for c in ("a", "b"):
        probes[c] = openloop.probe(
            client_spec(c, model_name(specs, c), grpc_url, payload, args),
            args.procs,
            args.probe_concurrency,
            args.probe_s,
        )
        log(f"({c}) capacity probe: {probes[c]}")
    phases = sized_phases(
        probes["a"]["right_per_s"],
        probes["b"]["right_per_s"],
        auto_seconds,
        args.burst_over_a,
        args.preset_headroom,
    )
    log("phases: " + ",".join(f"{ph.name}:{ph.seconds:g}:{ph.rate:g}" for ph in phases))
    return phases, probes


def run_groups(
    configs: list[str],
    together: list[str],
    specs: dict[str, Any],
    workdir: Path,
    grpc_url: str,
    payload: str,
    phases: list[Phase],
    args: argparse.Namespace,
) -> list[dict]:
    """Every configuration under the phases' load, alone or with those it runs together with; each run with the
    model reloads Triton logged during it."""
    runs = []
    for group in groups(configs, together):
        names = {c: model_name(specs, c) for c in group}
        loads = {c: model_loads(workdir, names[c]) for c in group}
        log(" + ".join(f"({c}) {CONFIGS[c]}: {names[c]}" for c in group))
        cspecs = {c: client_spec(c, names[c], grpc_url, payload, args) for c in group}
        for r in run_configs(group, cspecs, phases, args):
            c = r["config"]
            r["model_reloads"] = model_loads(workdir, names[c]) - loads[c]
            summary = ", ".join(f"{p['phase']} {p['served_per_s']}/s p95 {p['p95_ms']} ms" for p in r["phases"])
            log(
                f"({c}) {summary}; wrong {r['wrong_answers']} failed {r['failed']} shed {r['shed']}, "
                f"client issue lag {r['issue_lag_ms']}, client busy {r['client_cpu_share']}, "
                f"reloads {r['model_reloads']}{', CLIENT-BOUND: ' + '; '.join(r['client_bound']) if r['client_bound'] else ''}"
            )
            runs.append(r)
    return runs


def stop_triton(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def run_meta(
    args: argparse.Namespace,
    argv: Optional[list[str]],
    machine: str,
    phases: list[Phase],
    together: list[str],
    probes: dict[str, dict],
    specs: dict[str, Any],
    counts: list[int],
    t0: float,
) -> dict:
    """What ran, where and how (the JSON's ``meta``; the markdown's header)."""
    commit = (
        args.commit
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    )
    return {
        "machine": machine,
        "commit": commit,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python3 -m bench.window_gpu " + " ".join(argv if argv is not None else sys.argv[1:]),
        "phases": [dataclasses.asdict(ph) for ph in phases],
        "arrivals": args.arrivals,
        "seed": args.seed,
        "max_outstanding": args.max_outstanding,
        "procs": args.procs,
        "together": together,
        "probes": probes,
        "target_ms": args.target_ms,
        "step_us": args.step_us,
        "period_s": args.period_s,
        "start_window_us": args.start_window_us,
        "widen_min_per_batch": args.widen_min_per_batch,
        "bucket_s": args.bucket_s,
        "images": len(counts),
        "reference_detections": counts,
        "models": {
            k: {
                "instances": s.instance_group[0].count,
                "max_batch": s.max_batch_size,
                "triton_window_us": s.dynamic_batching.max_queue_delay_microseconds if s.dynamic_batching else None,
                "preferred": s.dynamic_batching.preferred_batch_size if s.dynamic_batching else None,
            }
            for k, s in specs.items()
        },
        "wall_s": round(time.monotonic() - t0, 1),
    }


def write_result(out: Path, workdir: Path, result: dict) -> None:
    (out / "window_gpu.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "window_gpu.md").write_text(markdown(result))
    (out / "triton.log").write_bytes((workdir / "triton.log").read_bytes()[-2_000_000:])
    log(f"wrote {out}/window_gpu.json and .md in {result['meta']['wall_s']} s")
    print(markdown(result))


def exit_code(runs: list[dict], probes: dict[str, dict]) -> int:
    """1: a wrong or failed answer anywhere; 3: a run was client-bound; else 0."""
    bad = sum(r["wrong_answers"] + r["failed"] for r in runs) + sum(p["wrong"] + p["failed"] for p in probes.values())
    return 1 if bad else (3 if any(r["client_bound"] for r in runs) else 0)


def main(argv: Optional[list[str]] = None) -> int:
    args = arg_parser().parse_args(argv)
    gpu = not args.cpu
    phases, auto_seconds, configs, together = settle(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu_name, machine = machine_line(gpu)
    t0 = time.monotonic()

    log("test weights and images")
    model, weights = detector_weights()
    images, refs = pick_images(model, args.images or 64, gpu)
    counts = [int(r[1][0]) for r in refs]
    log(f"references: detections per image {counts[:16]}{' …' if len(counts) > 16 else ''}")
    specs = model_specs(gpu, args.gpu_model or gpu_name)
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuhost-window-gpu-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    proc, _http, grpc_url = start_triton(workdir, list(specs.values()), weights, gpu)
    log(f"Triton ready after {time.monotonic() - t0:.1f} s")
    payload = openloop.write_payload(workdir, images, refs)
    try:
        phases, probes = probe_and_size(phases, specs, grpc_url, payload, args, auto_seconds)
        runs = run_groups(configs, together, specs, workdir, grpc_url, payload, phases, args)
    finally:
        stop_triton(proc)
    meta = run_meta(args, argv, machine, phases, together, probes, specs, counts, t0)
    result = {"meta": meta, "runs": runs, "verdict": verdict(runs, probes, args.target_ms)}
    write_result(out, workdir, result)
    return exit_code(runs, probes)


if __name__ == "__main__":
    raise SystemExit(main())
