"""GPU serving benchmark: YOLOv8n 640×640 through Triton, nginx and gpuhost's acceptance gate (issue 18).

Everything is gpuhost's own: the model repository from ``plans.triton_repo`` (python backend on the fast path,
``serving/yolov8n_model.py``), the server arguments from ``plans.triton_runtime``, ``nginx.conf`` from
``plans.nginx``, the load from ``gate.loadgate`` (binary bodies, every response's outputs checked against the
model config Triton reports). Triton is the real ``tritonserver`` of the nvidia-pytriton wheel.

Per point it records p50/p95/p99, throughput, errors and wrong outputs, GPU utilisation (NVML samples), and
Triton's per-model statistics over the run (queue, compute input/infer/output per request, executions, average
batch). Points: through nginx and straight to Triton, HTTP and gRPC, concurrency 1/4/8/16; the batching window
sweep (0/200/500/1000 µs) through nginx; the raw 1.4 MB output against NMS on the GPU; the gate's own floor
(the same client against nginx's ``/nginx-health``).

Usage (on the GPU machine; ``--quick`` for a pipeline check; ``--cpu`` runs the same on CPU instances)::

    python -m bench.gpu --out bench/results            # writes gpu.json and gpu.md
    python -m bench.gpu --cpu --quick --out /tmp/b      # CPU, tiny scale (no GPU here)
    python -m bench.gpu --render bench/results/gpu.json # rewrite docs/benchmarks.md's GPU table from a result
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import Report, git_commit  # noqa: E402
from bench.servers import Servers, get_json, log, model_stats, start_servers, stats_delta  # noqa: E402
from bench.yolo_check import WEIGHTS_FILE, repository, weights_file, with_parameters  # noqa: E402
from gate import loadgate  # noqa: E402
from plans.presets import apply_preset  # noqa: E402
from plans.triton_repo import yolov8n_torch  # noqa: E402

IMAGE_SHAPE = [1, 640, 640, 3]
TARGETS = {"c1_p95_ms": 6.0, "c16_images_per_s": 1000.0, "c16_p95_ms": 25.0, "seed000_p95_ms": 8.0}


# ---------------------------------------------------------------- machine and versions


def machine(nginx: str) -> dict:
    out: dict = {"python": platform.python_version(), "cpus": os.cpu_count(), "kernel": platform.release()}
    try:
        q = "name,driver_version,memory.total,clocks.max.sm,power.limit"
        smi = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
        out["gpus"] = [x.strip() for x in smi.stdout.strip().splitlines()]
    except (OSError, subprocess.TimeoutExpired):
        out["gpus"] = []
    try:
        import torch

        out["torch"] = torch.__version__
        out["torch_cuda"] = torch.version.cuda
    except ImportError:
        out["torch"] = None
    try:
        import numpy

        out["numpy"] = numpy.__version__
    except ImportError:
        pass
    try:
        from importlib.metadata import version

        out["nvidia_pytriton"] = version("nvidia-pytriton")
        out["tritonclient"] = version("tritonclient")
    except Exception:  # noqa: BLE001 - versions are informative
        pass
    r = subprocess.run([nginx, "-v"], capture_output=True, text=True)
    out["nginx"] = (r.stderr or r.stdout).strip()
    return out


# ---------------------------------------------------------------- GPU utilisation


class GpuSampler:
    """NVML utilisation samples (every 50 ms) while a point runs; nothing where NVML is absent."""

    def __init__(self):
        self.samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 - no NVML, no GPU: record nothing
            self._nvml = None

    def __enter__(self):
        if self._nvml is not None:
            self._stop.clear()
            self.samples = []
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.05):
            u = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            self.samples.append((u.gpu, u.memory))

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join(2)

    def summary(self) -> dict:
        if not self.samples:
            return {}
        g = sorted(s[0] for s in self.samples)
        return {
            "gpu_util_mean_pct": round(sum(g) / len(g), 1),
            "gpu_util_p95_pct": g[int(0.95 * (len(g) - 1))],
            "mem_util_mean_pct": round(sum(s[1] for s in self.samples) / len(g), 1),
            "samples": len(g),
        }


class CpuSampler:
    """CPU cores each part of the run used over a point (Linux ``/proc``; nothing elsewhere): ``client`` (this
    process and its client processes, counted once reaped), ``nginx``, ``tritonserver``, ``python_stubs`` (the
    python backend's stub processes), ``other``, and the whole machine's busy share. Tells whether a point is bound
    by the GPU or by the processes sharing the machine's cores."""

    GROUPS = {"nginx": "nginx", "tritonserver": "tritonserver", "triton_python_b": "python_stubs"}

    def __init__(self):
        self.summary_: dict = {}
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._p0: Optional[dict[int, tuple[str, int]]] = None

    def _procs(self) -> dict[int, tuple[str, int]]:
        out = {}
        me = os.getpid()
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                raw = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            comm = raw[raw.index("(") + 1 : raw.rindex(")")]
            f = raw[raw.rindex(")") + 2 :].split()
            ticks = int(f[11]) + int(f[12]) + (int(f[13]) + int(f[14]) if int(d) == me else 0)
            out[int(d)] = ("client" if int(d) == me else self.GROUPS.get(comm, "other"), ticks)
        return out

    @staticmethod
    def _machine() -> tuple[int, int]:
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return sum(v) - idle, sum(v)

    def __enter__(self):
        try:
            self._t0, self._p0, self._m0 = time.monotonic(), self._procs(), self._machine()
        except (OSError, ValueError, IndexError):
            self._p0 = None
        return self

    def __exit__(self, *exc):
        if self._p0 is None:
            return
        try:
            p1, m1 = self._procs(), self._machine()
        except (OSError, ValueError, IndexError):
            return
        seconds = max(1e-6, time.monotonic() - self._t0)
        used: dict[str, float] = {}
        for pid, (group, ticks) in p1.items():
            before = self._p0.get(pid, (group, 0))[1]
            used[group] = used.get(group, 0.0) + (ticks - before) / self._tick / seconds
        busy, total = m1[0] - self._m0[0], m1[1] - self._m0[1]
        self.summary_ = {
            "cpu_cores": {k: round(v, 2) for k, v in sorted(used.items())},
            "cpu_busy_pct": round(100.0 * busy / total, 1) if total else None,
        }

    def summary(self) -> dict:
        return dict(self.summary_)


# ---------------------------------------------------------------- gRPC load (same shape as loadgate's)


def _grpc_requests(model: str, images: list[bytes]) -> list:
    """One ModelInferRequest per image (raw binary contents). Call after a fork: gRPC must not cross one."""
    from tritonclient.grpc import service_pb2

    reqs = []
    for image in images:
        req = service_pb2.ModelInferRequest(model_name=model)
        t = req.inputs.add(name="images", datatype="UINT8")
        t.shape.extend(IMAGE_SHAPE)
        req.raw_input_contents.append(image)
        reqs.append(req)
    return reqs


def _output_problem(resp, want: dict) -> Optional[str]:
    """What is wrong with a response's outputs against the config's (names, datatypes, shapes, bytes), or None."""
    got = {o.name: (o, raw) for o, raw in zip(resp.outputs, resp.raw_output_contents)}
    if set(got) != set(want):
        return f"outputs {sorted(got)} but the config names {sorted(want)}"
    for name, exp in want.items():
        o, raw = got[name]
        if o.datatype != exp.datatype or tuple(o.shape) != exp.shape or len(raw) != exp.nbytes:
            return f"output {name}: {o.datatype}{list(o.shape)} {len(raw)} B, want {exp}"
    return None


def _grpc_worker(
    target: str,
    reqs: list,
    want: dict,
    warmup: int,
    duration_s: float,
    gate: threading.Barrier,
    t0s: list[float],
    offset: int,
    tallies: list[dict],
) -> None:
    """One connection: ``warmup`` requests, then (once every worker of every process is at the gate) requests
    back to back until ``duration_s`` after the common start; its tally appended to ``tallies``."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    channel = grpc.insecure_channel(target, options=opts)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    for k in range(warmup):
        try:
            stub.ModelInfer(reqs[(offset + k) % len(reqs)], timeout=30)
        except grpc.RpcError:
            pass
    mine, bad, wrong, why = [], 0, 0, ""
    gate.wait()
    end = t0s[0] + duration_s
    k = offset
    while True:
        t0 = time.perf_counter()
        if t0 >= end:
            break
        k += 1
        try:
            p = _output_problem(stub.ModelInfer(reqs[k % len(reqs)], timeout=30), want)
            if p:
                wrong, why, bad = wrong + 1, why or p, bad + 1
        except grpc.RpcError as e:
            bad += 1
            why = why or f"gRPC {e.code()}"
        mine.append((time.perf_counter() - t0) * 1000)
    channel.close()
    tallies.append({"lat": mine, "errors": bad, "invalid": wrong, "first_invalid": why})


def grpc_run(
    target: str,
    model: str,
    images: list[bytes],
    check: loadgate.ResponseCheck,
    concurrency: int,
    duration_s: float,
    processes: int,
    warmup: int = 5,
) -> loadgate.LoadResult:
    """Constant-concurrency ModelInfer over gRPC (raw binary contents), outputs checked like the HTTP gate; the
    distinct ``images`` are sent in turn (each worker from its own offset)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    procs = max(1, min(processes, concurrency))
    start = ctx.Value("d", 0.0)

    def _open():
        start.value = time.perf_counter()

    barrier = ctx.Barrier(procs, action=_open)
    queue = ctx.Queue()
    shares = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]

    def child(n: int) -> None:
        reqs = _grpc_requests(model, images)  # after the fork: a gRPC channel must never cross one
        want = {o.name: o for o in check.outputs}
        tallies: list[dict] = []  # one per thread, appended when it is done
        t0s = [0.0, 0.0]

        def _gate():
            barrier.wait()
            t0s[0] = start.value

        gate = threading.Barrier(n + 1, action=_gate)
        threads = [
            threading.Thread(
                target=_grpc_worker,
                args=(target, reqs, want, warmup, duration_s, gate, t0s, 7 * i, tallies),
                daemon=True,
            )
            for i in range(n)
        ]
        for th in threads:
            th.start()
        gate.wait()
        for th in threads:
            th.join(duration_s + 120)
        queue.put({"tallies": tallies, "start": t0s[0], "end": time.perf_counter()})

    children = [ctx.Process(target=child, args=(n,), daemon=True) for n in shares]
    for c in children:
        c.start()
    outs = [queue.get(timeout=duration_s + 300) for _ in children]
    for c in children:
        c.join(10)
    tallies = [t for o in outs for t in o["tallies"]]
    return loadgate._result(
        "grpc",
        concurrency,
        [x for t in tallies for x in t["lat"]],
        sum(t["errors"] for t in tallies),
        max(o["end"] for o in outs) - min(o["start"] for o in outs),
        sum(t["invalid"] for t in tallies),
        next((t["first_invalid"] for t in tallies if t["first_invalid"]), ""),
    )


# ---------------------------------------------------------------- the GPU's own floor


def gpu_floor(max_batch: int) -> dict:
    """GPU time of the model alone, as the backend runs it (FP16, fused, channels_last, uint8 in, NMS, one CUDA
    graph per batch size): median of 50 replays per size with CUDA events, and the pinned host→device copy of
    the batch's images. Measured in this process before Triton starts, so nothing else is on the GPU."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    from serving.models import yolov8n as yolo

    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    torch.backends.cudnn.benchmark = True
    model = yolo.fuse(yolo.YOLOv8n().eval()).to(dev, torch.float16)
    model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # Module.to takes it
    pre = yolo.Preprocess(torch.float16)
    stream = torch.cuda.Stream(dev)
    host = torch.randint(0, 256, (max_batch, 640, 640, 3), dtype=torch.uint8).pin_memory()
    gpu_in = torch.randint(0, 256, (max_batch, 640, 640, 3), dtype=torch.uint8, device=dev)
    out: dict = {"graph_ms": {}, "h2d_ms": {}, "eager_ms": {}}

    def median_ms(fn, n=50) -> float:
        runs = []
        for _ in range(n):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            fn()
            b.record(stream)
            b.synchronize()
            runs.append(a.elapsed_time(b))
        return round(sorted(runs)[n // 2], 3)

    with torch.no_grad(), torch.cuda.stream(stream):
        for b in sorted({1, 2, 4, 8, max_batch}):
            x = gpu_in[:b]
            for _ in range(3):
                yolo.fast_nms(model(pre(x)))
            stream.synchronize()
            out["eager_ms"][b] = median_ms(lambda x=x: yolo.fast_nms(model(pre(x))), 10)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                yolo.fast_nms(model(pre(x)))
            out["graph_ms"][b] = median_ms(g.replay)
            out["h2d_ms"][b] = median_ms(lambda b=b: gpu_in[:b].copy_(host[:b], non_blocking=True))
            del g
    out["graph_ms_per_image"] = {b: round(t / b, 3) for b, t in out["graph_ms"].items()}
    return out


# ---------------------------------------------------------------- the run


def preset_key(info: dict, override: str) -> str:
    """The GPU's preset key: ``override`` where given, else the first GPU's name from nvidia-smi ("" without)."""
    return override or (info.get("gpus") or [""])[0].split(",")[0]


def on_preset(spec, gpu_name: str):
    """What TritonService deploys: the GPU's preset fills what the spec leaves open (a GPU without one: the spec)."""
    try:
        return apply_preset(spec, gpu_name)
    except KeyError:
        return spec


def point(
    s: Servers,
    name: str,
    model: str,
    via: str,
    load: Callable[[loadgate.ResponseCheck], tuple[loadgate.LoadResult, dict]],
) -> dict:
    """One point: ``load(check)`` against ``model`` (the check from the config Triton reports) with Triton's
    per-request phases and the GPU's utilisation over it; returns the row (``load``'s own fields added)."""
    check = loadgate.ResponseCheck.from_config(get_json(f"{s.http}/v2/models/{model}/config"), batch=1)
    before = model_stats(s.http, model)
    with GpuSampler() as gpu, CpuSampler() as cpu:
        r, extra = load(check)
    after = model_stats(s.http, model)
    row = {"name": name, "model": model, "via": via, **r.as_dict(), **gpu.summary(), **cpu.summary()}
    row.update(triton=stats_delta(before, after), **extra)
    log(f"{name}: {r.summary()} | triton {row['triton']} | gpu {gpu.summary()}")
    return row


def guarded(name: str, row: dict, measure: Callable[[], dict]) -> dict:
    """``measure()``'s row; where it fails, ``row`` (what the point was) with the failure."""
    try:
        return measure()
    except Exception as e:  # noqa: BLE001 - one failed point must not lose the others
        log(f"{name}: FAILED {e!r}")
        return {"name": name, **row, "failed": repr(e)}


def serve(results: dict, prefix: str, specs: list, files: dict[str, bytes], nginx_bin: str, args) -> Servers:
    """``start_servers`` in a new work directory (``args.http_threads``, ``args.nginx_workers``); into ``results``:
    how long the start took, Triton's version, the main model's config.pbtxt and nginx.conf."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    t0 = time.monotonic()
    workers = tuple(w for w in args.nginx_workers.split(",") if w)
    s = start_servers(
        workdir,
        specs,
        files,
        nginx_bin,
        http_threads=args.http_threads,
        nginx_workers=workers,
        nginx_timing=getattr(args, "nginx_timing", False),
    )
    results["startup_s"] = round(time.monotonic() - t0, 1)
    results["triton"] = get_json(f"{s.http}/v2")
    results["config_pbtxt"] = files[f"{specs[0].name}/config.pbtxt"].decode()
    results["nginx_conf"] = (workdir / "nginx" / "nginx.conf").read_text()
    log(f"servers up in {results['startup_s']} s: {results['triton'].get('version')}")
    return s


def finish(results: dict, s: Servers, out: str, log_name: str, report_prefixes: tuple[str, ...]) -> None:
    """Servers stopped; Triton's log kept in ``out``, its tail and the backend's reports into ``results``."""
    results["triton_log_tail"], results["backend_reports"] = s.finish(Path(out), log_name, report_prefixes)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def http_load(
    s: Servers,
    via: str,
    model: str,
    check: loadgate.ResponseCheck,
    concurrency: int,
    duration: float,
    processes: int,
    *,
    warmup: int,
    timeout_s: float,
) -> Callable[..., loadgate.LoadSpec]:
    """The gate's closed-loop HTTP load against ``model`` through ``via``: call it with the requests (``bodies``
    and ``headers``, or ``payloads``) for the ``loadgate.LoadSpec``."""
    return partial(
        loadgate.LoadSpec,
        url=f"{s.base(via)}/v2/models/{model}/infer",
        concurrency=concurrency,
        duration_s=duration,
        max_requests=10**7,
        warmup_requests=warmup,
        timeout_s=timeout_s,
        tool="python",
        check=check,
        processes=processes,
    )


def measure(
    s: Servers,
    name: str,
    model: str,
    via: str,
    proto: str,
    concurrency: int,
    duration: float,
    images: list[bytes],
    processes: int,
) -> dict:
    def load(check: loadgate.ResponseCheck) -> tuple[loadgate.LoadResult, dict]:
        extra = {"proto": proto, "response_bytes": sum(o.nbytes or 0 for o in check.outputs)}
        if proto != "http":
            target = s.nginx_grpc if via == "nginx" else s.grpc
            return grpc_run(target, model, images, check, concurrency, duration, processes), extra
        outs = [o.name for o in check.outputs]
        bodies = [loadgate.binary_request([("images", "UINT8", IMAGE_SHAPE, im)], outs) for im in images]
        spec = http_load(s, via, model, check, concurrency, duration, processes, warmup=5, timeout_s=30)
        return loadgate.run(spec(bodies=tuple(b for b, _ in bodies), headers=bodies[0][1])), extra

    return point(s, name, model, via, load)


def _extras(text: str) -> list[tuple[int, int, int]]:
    """``"1:200:8,3:200:8"`` → [(instances, window µs, max batch), ...]."""
    out = []
    for item in (x for x in text.split(",") if x):
        n, w, b = (int(v) for v in item.split(":"))
        out.append((n, w, b))
    return out


def model_specs(args, gpu: bool, gpu_name: str, windows: list[int], extras: list[tuple[int, int, int]]) -> list:
    """The models of one run, the main one first: the GPU's preset as shipped (window, instances, max batch)
    unless given on the command line; one per window; the extra instance/window/batch points; raw output; the
    old preset if asked. Each prints its execute phases every ``--report-every`` executes."""

    def model(name: str, **kw):
        spec = yolov8n_torch(
            name=name, instances=args.instances, max_batch_size=args.max_batch, gpu=gpu, weights=WEIGHTS_FILE, **kw
        )
        return on_preset(spec, gpu_name) if gpu else spec

    def fixed(name: str, w: int, n: int, b: int, p: Optional[list[int]] = None):
        """A model that does not take the preset: window ``w`` µs, ``n`` instances, max batch ``b``, preferred ``p``."""
        return yolov8n_torch(
            name=name, window_us=w, instances=n, max_batch_size=b, preferred_batch_size=p, gpu=gpu, weights=WEIGHTS_FILE
        )

    specs = [model("yolov8n_preset")]
    specs += [model(f"yolov8n_w{w}", window_us=w) for w in windows]
    specs += [fixed(f"yolov8n_i{n}_w{w}_b{b}", w, n, b) for n, w, b in extras]
    specs.append(model("yolov8n_raw", output="raw"))
    if args.compare_old_preset:
        # gpuhost's H100/H200 low-latency preset before this sweep: max batch 32, preferred 4/8/16/32, 1 ms, 2 inst.
        specs.append(fixed("yolov8n_old_preset", 1000, 2, 32, [4, 8, 16, 32]))
    # Each instance prints its execute phases every 500 executes (gather, GPU, respond) to Triton's log.
    return [with_parameters(x, report_every=str(args.report_every)) for x in specs]


def run_header(args, nginx_bin: str, gpu_name: str, main) -> dict:
    """The results' head: machine, arguments, targets, weights, images and the main model's settings."""
    return {
        "machine": machine(nginx_bin),
        "args": vars(args),
        "targets": TARGETS,
        "points": [],
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "commit": args.commit or git_commit(),
        "weights": "the test detector (serving/models/yolov8n_synthetic.py, seed 0: BatchNorm recalibrated on "
        "synthetic images, class-head bias +7; tens of detections per image)",
        "images": f"{args.images} distinct synthetic images, sent in turn (serving/models/yolov8n_synthetic.py)",
        "gpu_model": gpu_name,
        "main": {
            "model": main.name,
            "instances": main.instance_group[0].count,
            "max_batch": main.max_batch_size,
            "window_us": main.dynamic_batching.max_queue_delay_microseconds if main.dynamic_batching else None,
            "preferred": main.dynamic_batching.preferred_batch_size if main.dynamic_batching else None,
        },
    }


def load_plan(
    main: str,
    conc: list[int],
    windows: list[int],
    extras: list[tuple[int, int, int]],
    workers: tuple[str, ...],
    old_preset: bool,
) -> list[tuple[str, str, str, str, int]]:
    """Every point of a run in order: (name, model, via, protocol, concurrency)."""
    plan = []
    for c in conc:
        plan.append((f"nginx-http c={c}", main, "nginx", "http", c))
        plan.append((f"direct-http c={c}", main, "direct", "http", c))
    for c in conc:
        plan.append((f"nginx-grpc c={c}", main, "nginx", "grpc", c))
        plan.append((f"direct-grpc c={c}", main, "direct", "grpc", c))
    for w in windows:
        for c in conc:
            plan.append((f"window {w} nginx-http c={c}", f"yolov8n_w{w}", "nginx", "http", c))
    for n, w, b in extras:
        for c in conc:
            extra = f"yolov8n_i{n}_w{w}_b{b}"
            plan.append((f"instances {n} window {w} batch {b} nginx-http c={c}", extra, "nginx", "http", c))
    for wk in workers:
        for c in conc:
            plan.append((f"nginx workers {wk} http c={c}", main, f"nginx-w{wk}", "http", c))
    if old_preset:
        for c in conc:
            plan.append((f"old preset nginx-http c={c}", "yolov8n_old_preset", "nginx", "http", c))
    for c in (conc[0], conc[-1]):
        plan.append((f"raw-output nginx-http c={c}", "yolov8n_raw", "nginx", "http", c))
    return plan


def gate_floors(results: dict, s: Servers, conc: list[int], duration_s: float, processes: int) -> None:
    """The gate's own floor per concurrency (the same client against nginx's ``/nginx-health``) into
    ``results["gate_floor"]`` as each is measured."""
    for c in conc:
        spec = loadgate.LoadSpec(
            url=f"{s.nginx_http}/nginx-health",
            concurrency=c,
            duration_s=min(duration_s, 3),
            max_requests=10**7,
            tool="python",
            processes=processes,
        )
        floor = loadgate.overhead(spec, f"{s.nginx_http}/nginx-health")
        log(f"gate floor c={c}: {floor.summary()}")
        results.setdefault("gate_floor", []).append(floor.as_dict())


def run(args) -> dict:
    nginx_bin = args.nginx or shutil.which("nginx") or "/usr/sbin/nginx"
    from serving.models.yolov8n_synthetic import synthetic_image

    weights = weights_file()  # the test detector: answers depend on the image, NMS does real work
    gpu = not args.cpu
    windows = [int(w) for w in args.windows.split(",")]
    conc = [int(c) for c in args.concurrency.split(",")]
    gpu_name = preset_key(machine(nginx_bin), args.gpu_model)
    extras = _extras(args.extra)
    specs = model_specs(args, gpu, gpu_name, windows, extras)
    files = repository(specs, weights, gpu)
    results = run_header(args, nginx_bin, gpu_name, specs[0])
    log(json.dumps(results["machine"]))
    if gpu:
        results["gpu_floor"] = gpu_floor(max(specs[0].max_batch_size, *(b for _, _, b in extras), 8))
        log(f"GPU floor: {results['gpu_floor']}")
    workers = tuple(w for w in args.nginx_workers.split(",") if w)
    s = serve(results, "gpuhost-gpu-bench-", specs, files, nginx_bin, args)
    results["model_config"] = get_json(f"{s.http}/v2/models/{specs[0].name}/config")
    images = [synthetic_image(i, seed=3).tobytes() for i in range(args.images)]
    plan = load_plan(specs[0].name, conc, windows, extras, workers, args.compare_old_preset)
    try:
        for name, target, via, proto, c in plan:
            row = {"model": target, "via": via, "proto": proto, "concurrency": c}
            point_ = partial(measure, s, name, target, via, proto, c, args.duration, images, args.processes)
            results["points"].append(guarded(name, row, point_))
        gate_floors(results, s, conc, args.duration, args.processes)
    finally:
        finish(results, s, args.out, "triton.log", ("gpuhost-graph-ms ", "gpuhost-execute-ms "))
    return results


# ---------------------------------------------------------------- report


def _pt(results: dict, name: str) -> Optional[dict]:
    return next((p for p in results["points"] if p["name"] == name and "failed" not in p), None)


def _cell(p: Optional[dict]) -> str:
    if p is None:
        return "–"
    bad = f", {p['errors']} err" if p.get("errors") else ""
    return f"{p['p50_ms']:.2f} / {p['p95_ms']:.2f} / {p['p99_ms']:.2f} ms, {p['throughput_rps']:.0f}/s{bad}"


def _main_model(results: dict) -> tuple[dict, str]:
    """The main table's model (the preset's, else the first window's from the arguments) and its one-line text."""
    a = results["args"]
    main = results.get("main") or {
        "instances": a["instances"],
        "max_batch": a["max_batch"],
        "window_us": a["windows"].split(",")[0],
    }
    main_text = f"{main['instances']} instances, max batch {main['max_batch']}, window {main['window_us']} µs" + (
        f" (gpuhost's {results['gpu_model']} preset)" if results.get("main") else ""
    )
    return main, main_text


def _header(results: dict, main_text: str) -> list[str]:
    """Machine, command and model, then the head of the main table."""
    m = results["machine"]
    return [
        f"Machine: {', '.join(m.get('gpus') or ['no GPU'])}; {m.get('cpus')} CPUs; Python {m.get('python')}, "
        f"torch {m.get('torch')} (CUDA {m.get('torch_cuda')}), numpy {m.get('numpy')}, "
        f"Triton {results.get('triton', {}).get('version')} (nvidia-pytriton {m.get('nvidia_pytriton')}), "
        f"{m.get('nginx')}; commit {results.get('commit')}; {results.get('started')}. Client, nginx and Triton on "
        f"the same machine. Weights: {results.get('weights')}. TensorRT is not used: its wheels are too large to "
        "carry to the device machine (64 MiB per call), so the model runs in PyTorch inside the python backend.",
        "",
        f"Command: `{results.get('reproduce') or results.get('command', 'python -m bench.gpu --out bench/results')}`"
        + (f" (it runs `{results['command']}`)" if results.get("reproduce") else ""),
        "",
        f"Model: UINT8 [640,640,3] in (1.2 MB), NMS on the GPU, `detections` FP32 [100,6] + "
        f"`num_detections` INT32 [1] out (2.4 kB). Main table: {main_text}. Each cell: p50 / p95 / p99, "
        "throughput (1 image per request"
        + (f"; {results['images']}" if results.get("images") else "")
        + "); every response's outputs checked against the model config (names, datatypes, shapes, bytes); "
        "every answer's values against its own image's reference: `bench/gpu_accuracy.py`.",
        "",
        "| Concurrency | gpuhost: nginx + gate, HTTP | straight to Triton, HTTP | nginx, gRPC | straight, gRPC | "
        "Seed target |",
        "|---|---|---|---|---|---|",
    ]


def _main_rows(results: dict, conc: list[int]) -> list[str]:
    """One row per concurrency: the four paths and the seed's target."""
    lines = []
    for c in conc:
        target = "p95 ≤ 6 ms (seed 000: < 8 ms)" if c == 1 else "≥ 1,000 images/s, p95 < 25 ms" if c == 16 else "–"
        lines.append(
            f"| {c} | {_cell(_pt(results, f'nginx-http c={c}'))} | {_cell(_pt(results, f'direct-http c={c}'))} "
            f"| {_cell(_pt(results, f'nginx-grpc c={c}'))} | {_cell(_pt(results, f'direct-grpc c={c}'))} "
            f"| {target} |"
        )
    return lines


def _window_rows(results: dict, conc: list[int], windows: list[int], main: dict) -> list[str]:
    """The batching window sweep through nginx and the gate."""
    lines = [
        "",
        f"Batching window sweep (through nginx and the gate, HTTP; {main['instances']} instances, max batch "
        f"{main['max_batch']}): p95 ms / images per s, Triton queue µs, average batch, GPU utilisation",
        "",
        "| Window | " + " | ".join(f"c={c}" for c in conc) + " |",
        "|---|" + "---|" * len(conc),
    ]
    w0 = windows[0]
    for w in windows:
        cells = []
        for c in conc:
            p = _pt(results, f"window {w} nginx-http c={c}") or (
                _pt(results, f"nginx-http c={c}") if w == w0 and not results.get("main") else None
            )
            if p is None:
                cells.append("–")
                continue
            t = p.get("triton", {})
            util = f", GPU {p['gpu_util_mean_pct']:.0f} %" if "gpu_util_mean_pct" in p else ""
            cells.append(
                f"{p['p95_ms']:.2f} ms / {p['throughput_rps']:.0f}/s, queue {t.get('queue_us')} µs, "
                f"batch {t.get('avg_batch')}{util}"
            )
        lines.append(f"| {w} µs | " + " | ".join(cells) + " |")
    return lines


def _time_rows(results: dict, conc: list[int]) -> list[str]:
    """Where the main model's time goes: Triton's per-request phases and what is outside Triton."""
    lines = [
        "",
        "Where the time goes (main model through nginx, HTTP; Triton's per-request averages over each run, µs):",
        "",
        "| Concurrency | client p50 ms | Triton total | queue | compute input | compute infer | "
        "compute output | outside Triton (nginx, HTTP, client) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in conc:
        p = _pt(results, f"nginx-http c={c}")
        if p is None:
            continue
        t = p["triton"]
        outside = (p["mean_ms"] * 1000 - t["success_us"]) if t.get("success_us") else None
        lines.append(
            f"| {c} | {p['p50_ms']:.2f} | {t.get('success_us')} | {t.get('queue_us')} | "
            f"{t.get('compute_input_us')} | {t.get('compute_infer_us')} | {t.get('compute_output_us')} | "
            f"{outside:.0f} (mean) |"
            if outside is not None
            else "|"
        )
    return lines


def _variant_rows(results: dict, conc: list[int], main_text: str) -> list[str]:
    """The extra instance/window/batch points, nginx's worker counts and the old preset, where they ran."""
    a = results["args"]
    lines: list[str] = []
    extras = _extras(a.get("extra", ""))
    if extras:
        lines += [
            "",
            f"Instances, window and batch size (through nginx, HTTP; main table: {main_text}): "
            "p50 / p95 / p99, images per s, average batch",
            "",
            "| Instances, window, max batch | " + " | ".join(f"c={c}" for c in conc) + " |",
            "|---|" + "---|" * len(conc),
        ]
        for n, w, b in extras:
            cells = []
            for c in conc:
                p = _pt(results, f"instances {n} window {w} batch {b} nginx-http c={c}")
                cells.append("–" if p is None else f"{_cell(p)}, batch {p['triton'].get('avg_batch')}")
            lines.append(f"| {n}, {w} µs, {b} | " + " | ".join(cells) + " |")
    wks = [w for w in a.get("nginx_workers", "").split(",") if w]
    if wks:
        lines += [
            "",
            "nginx `worker_processes` (main model, HTTP, p50 / p95 / p99, images per s): auto ("
            + str(results["machine"].get("cpus"))
            + " workers): "
            + "; ".join(f"c={c}: {_cell(_pt(results, f'nginx-http c={c}'))}" for c in conc)
            + "".join(
                f" | {w}: " + "; ".join(f"c={c}: {_cell(_pt(results, f'nginx workers {w} http c={c}'))}" for c in conc)
                for w in wks
            ),
        ]
    if any(p["name"].startswith("old preset") for p in results["points"]):
        lines += [
            "",
            "gpuhost's H100/H200 preset before this sweep (max batch 32, preferred 4/8/16/32, window 1000 µs, "
            "2 instances), same load through nginx: "
            + "; ".join(f"c={c}: {_cell(_pt(results, f'old preset nginx-http c={c}'))}" for c in conc),
        ]
    raw = [(c, _pt(results, f"raw-output nginx-http c={c}")) for c in (conc[0], conc[-1])]
    lines += [
        "",
        "Output on the wire: raw `output0` FP16 [84,8400] (1.4 MB) against NMS on the GPU (2.4 kB), "
        "through nginx: "
        + "; ".join(f"c={c}: raw {_cell(p)} vs NMS {_cell(_pt(results, f'nginx-http c={c}'))}" for c, p in raw),
    ]
    return lines


def _floor_lines(results: dict) -> list[str]:
    """The floors: the GPU alone, the python backend's execute, the gate against nginx's health page."""
    lines: list[str] = []
    fl = results.get("gpu_floor") or {}
    if fl:
        lines += [
            "",
            "The GPU alone (this process, before Triton starts; CUDA events, median of 50): one graph replay "
            + ", ".join(
                f"batch {b}: {t} ms ({fl['graph_ms_per_image'][b]} per image)" for b, t in fl["graph_ms"].items()
            )
            + "; eager PyTorch without graphs "
            + ", ".join(f"batch {b}: {t} ms" for b, t in fl["eager_ms"].items())
            + "; pinned host→device copy of the images "
            + ", ".join(f"batch {b}: {t} ms" for b, t in fl["h2d_ms"].items())
            + ".",
        ]
    reps = [r for r in results.get("backend_reports", []) if "gather_ms" in r]
    if reps:
        n = len(reps)
        lines += [
            "",
            f"Inside the python backend's execute (means of {n} reports of 500 executes each, all models): gather "
            f"(DLPack + pinned staging) {sum(r['gather_ms'] for r in reps) / n:.3f} ms, GPU (copies, graph, sync) "
            f"{sum(r['gpu_ms'] for r in reps) / n:.3f} ms, respond {sum(r['respond_ms'] for r in reps) / n:.3f} ms.",
        ]
    floors = results.get("gate_floor", [])
    if floors:
        lines += [
            "",
            "The gate's own floor (same client, processes and concurrency against nginx's "
            "`/nginx-health`): "
            + "; ".join(f"c={f['concurrency']}: p50 {f['p50_ms']:.3f} / p95 {f['p95_ms']:.3f} ms" for f in floors),
        ]
    return lines


def table(results: dict) -> str:
    a = results["args"]
    conc = [int(c) for c in a["concurrency"].split(",")]
    windows = [int(w) for w in a["windows"].split(",")]
    main, main_text = _main_model(results)
    lines = _header(results, main_text)
    lines += _main_rows(results, conc)
    lines += _window_rows(results, conc, windows, main)
    lines += _time_rows(results, conc)
    lines += _variant_rows(results, conc, main_text)
    lines += _floor_lines(results)
    return "\n".join(lines) + "\n"


REPORT = Report("gpu", table, "## GPU serving: YOLOv8n through Triton, nginx and the gate (H200)")


def main(argv=None) -> int:
    ap = REPORT.parser(__doc__, duration=5.0, concurrency="1,4,8,16")
    ap.add_argument("--windows", default="0,200,500,1000")
    ap.add_argument("--instances", type=int, default=None, help="default: the GPU's preset")
    ap.add_argument("--max-batch", type=int, default=None, help="default: the GPU's preset")
    ap.add_argument("--processes", type=int, default=4, help="client processes (threads split between them)")
    ap.add_argument("--http-threads", type=int, default=16)
    ap.add_argument("--extra", default="", help="more models through nginx: instances:window:max_batch,...")
    ap.add_argument("--report-every", type=int, default=500, help="backend phase report every N executes")
    ap.add_argument("--compare-old-preset", action="store_true", help="also the H200 preset before issue 18")
    ap.add_argument("--nginx-workers", default="", help="more nginx fronts with these worker_processes, e.g. 4,8")
    ap.add_argument("--images", type=int, default=64, help="distinct images sent in turn (one per request)")
    ap.add_argument("--cpu", action="store_true", help="KIND_CPU instances, FP32 (pipeline check without a GPU)")
    ap.add_argument("--quick", action="store_true", help="1 s per point, concurrency 1,4, windows 0,500")
    return REPORT.main(ap, argv, run, quick={"duration": 1.0, "concurrency": "1,4", "windows": "0,500"})


if __name__ == "__main__":
    sys.exit(main())
