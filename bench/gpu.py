"""GPU serving benchmark: YOLOv8n 640×640 through Triton, nginx and gpuhost's acceptance gate (issue 18).

Everything is gpuhost's own: the model repository from ``plans.triton_repo`` (python backend on the fast path,
``serving/yolov8n_model.py``), the server arguments from ``plans.triton_runtime``, ``nginx.conf`` from
``plans.nginx``, the load from ``serving.loadgate`` (binary bodies, every response's outputs checked against the
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

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.yolo_check import WEIGHTS_FILE, weights_file  # noqa: E402
from plans.nginx import NginxSpec, render  # noqa: E402
from plans.presets import apply_preset  # noqa: E402
from plans.triton_repo import repository_files, yolov8n_torch  # noqa: E402
from plans.triton_runtime import ServerOptions, server_args  # noqa: E402
from serving import loadgate  # noqa: E402
from serving.models import yolov8n_files  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
IMAGE_SHAPE = [1, 640, 640, 3]
TARGETS = {"c1_p95_ms": 6.0, "c16_images_per_s": 1000.0, "c16_p95_ms": 25.0, "seed000_p95_ms": 8.0}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def get_json(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


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


# ---------------------------------------------------------------- Triton statistics


def model_stats(http: str, model: str) -> dict:
    return get_json(f"{http}/v2/models/{model}/stats")["model_stats"][0]


def stats_delta(before: dict, after: dict) -> dict:
    """Per-request averages (µs) of Triton's phases over a run, executions and the average batch."""
    b, a = before["inference_stats"], after["inference_stats"]
    out: dict = {}
    n = int(a["success"]["count"]) - int(b["success"]["count"])
    out["requests"] = n
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        dn = int(a[key]["ns"]) - int(b[key]["ns"])
        dc = int(a[key]["count"]) - int(b[key]["count"])
        out[f"{key}_us"] = round(dn / dc / 1000, 1) if dc else None
    ex = int(after.get("execution_count", 0)) - int(before.get("execution_count", 0))
    inf = int(after.get("inference_count", 0)) - int(before.get("inference_count", 0))
    out["executions"] = ex
    out["avg_batch"] = round(inf / ex, 2) if ex else None
    sizes = {}
    before_b = {int(x["batch_size"]): int(x["compute_infer"]["count"]) for x in before.get("batch_stats", [])}
    for x in after.get("batch_stats", []):
        d = int(x["compute_infer"]["count"]) - before_b.get(int(x["batch_size"]), 0)
        if d:
            sizes[int(x["batch_size"])] = d
    out["batch_sizes"] = sizes
    return out


# ---------------------------------------------------------------- gRPC load (same shape as loadgate's)


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
        import grpc  # imported after fork: a gRPC channel must never cross a fork
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        reqs = []
        for image in images:
            req = service_pb2.ModelInferRequest(model_name=model)
            t = req.inputs.add(name="images", datatype="UINT8")
            t.shape.extend(IMAGE_SHAPE)
            req.raw_input_contents.append(image)
            reqs.append(req)
        want = {o.name: o for o in check.outputs}
        lock = threading.Lock()
        lat: list[float] = []
        errs = [0, 0]
        first = [""]
        t0s = [0.0, 0.0]

        def _gate():
            barrier.wait()
            t0s[0] = start.value

        gate = threading.Barrier(n + 1, action=_gate)

        def problem(resp) -> Optional[str]:
            got = {o.name: (o, raw) for o, raw in zip(resp.outputs, resp.raw_output_contents)}
            if set(got) != set(want):
                return f"outputs {sorted(got)} but the config names {sorted(want)}"
            for name, exp in want.items():
                o, raw = got[name]
                if o.datatype != exp.datatype or tuple(o.shape) != exp.shape or len(raw) != exp.nbytes:
                    return f"output {name}: {o.datatype}{list(o.shape)} {len(raw)} B, want {exp}"
            return None

        def worker(offset: int):
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
                    p = problem(stub.ModelInfer(reqs[k % len(reqs)], timeout=30))
                    if p:
                        wrong, why, bad = wrong + 1, why or p, bad + 1
                except grpc.RpcError as e:
                    bad += 1
                    why = why or f"gRPC {e.code()}"
                mine.append((time.perf_counter() - t0) * 1000)
            channel.close()
            with lock:
                lat.extend(mine)
                errs[0] += bad
                errs[1] += wrong
                first[0] = first[0] or why

        threads = [threading.Thread(target=worker, args=(7 * i,), daemon=True) for i in range(n)]
        for th in threads:
            th.start()
        gate.wait()
        for th in threads:
            th.join(duration_s + 120)
        queue.put(
            {
                "lat": lat,
                "errors": errs[0],
                "invalid": errs[1],
                "first_invalid": first[0],
                "start": t0s[0],
                "end": time.perf_counter(),
            }
        )

    children = [ctx.Process(target=child, args=(n,), daemon=True) for n in shares]
    for c in children:
        c.start()
    outs = [queue.get(timeout=duration_s + 300) for _ in children]
    for c in children:
        c.join(10)
    lat = [x for o in outs for x in o["lat"]]
    first_invalid = next((o["first_invalid"] for o in outs if o["first_invalid"]), "")
    r = loadgate._result(
        "grpc",
        concurrency,
        lat,
        sum(o["errors"] for o in outs),
        max(o["end"] for o in outs) - min(o["start"] for o in outs),
        sum(o["invalid"] for o in outs),
        first_invalid,
    )
    return r


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


# ---------------------------------------------------------------- servers


def pytriton_dist() -> Path:
    """The wheel's tritonserver tree, found without importing pytriton (its client needs packages we do not)."""
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nvidia-pytriton is not installed (pip install the wheel, or put it on PYTHONPATH)")
    return Path(list(spec.submodule_search_locations)[0]).resolve() / "tritonserver"


@dataclasses.dataclass
class Servers:
    triton: subprocess.Popen
    nginx: subprocess.Popen
    http: str
    grpc: str
    nginx_http: str
    nginx_grpc: str
    workdir: Path
    # More nginx fronts by worker_processes (A/B of the rendered config's one knob that depends on the host).
    extra: dict = dataclasses.field(default_factory=dict)

    def stop(self) -> None:
        for p in (*(x[0] for x in self.extra.values()), self.nginx, self.triton):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_servers(
    workdir: Path,
    specs,
    files: dict[str, bytes],
    nginx_bin: str,
    gpu_count: int,
    http_threads: int,
    nginx_workers: tuple[str, ...] = (),
    server_extra: tuple[str, ...] = (),
) -> Servers:
    repo = workdir / "models"
    for rel, content in files.items():
        p = repo / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)
    dist = pytriton_dist()
    libs = dist.parent.parent / "nvidia_pytriton.libs"
    backends = workdir / "backends" / "python"
    backends.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(dist / "backends" / "python" / name, backends / name)
    ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    shutil.copy2(
        dist / "python_backend_stubs" / ver / "triton_python_backend_stub", backends / "triton_python_backend_stub"
    )
    ports = {k: free_port() for k in ("http", "grpc", "metrics")}
    opts = ServerOptions(
        model_repository=str(repo),
        http_port=ports["http"],
        grpc_port=ports["grpc"],
        metrics_port=ports["metrics"],
        exit_on_error=True,
        backend_directory=str(workdir / "backends"),
        extra=[
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            f"--http-thread-count={http_threads}",
            f"--cache-directory={dist / 'caches'}",
            "--log-verbose=0",
            *server_extra,
        ],
    )
    cmd = [str(dist / "bin" / "tritonserver"), *server_args(opts, specs)]
    env = dict(os.environ)
    # The stub links libpython3.X.so: take it from this interpreter's own LIBDIR (a venv's base Python).
    import sysconfig

    pylib = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(x for x in (str(libs), pylib, env.get("LD_LIBRARY_PATH", "")) if x)
    # The stub embeds libpython in isolated mode and takes its prefix (torch, numpy) from python3 on PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    log("tritonserver " + " ".join(cmd[1:]))
    tlog = open(workdir / "triton.log", "ab")
    triton = subprocess.Popen(cmd, stdout=tlog, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    http = f"http://127.0.0.1:{ports['http']}"
    deadline = time.monotonic() + 600
    while True:
        if triton.poll() is not None:
            raise RuntimeError("tritonserver exited:\n" + (workdir / "triton.log").read_text(errors="replace")[-6000:])
        try:
            if urllib.request.urlopen(http + "/v2/health/ready", timeout=2).status == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError((workdir / "triton.log").read_text(errors="replace")[-6000:])
        time.sleep(0.5)
    nginx, nhttp, ngrpc = start_nginx(workdir / "nginx", nginx_bin, specs[0].name, ports["http"], ports["grpc"], "auto")
    extra = {
        w: start_nginx(workdir / f"nginx-{w}", nginx_bin, specs[0].name, ports["http"], ports["grpc"], w)
        for w in nginx_workers
    }
    return Servers(triton, nginx, http, f"127.0.0.1:{ports['grpc']}", nhttp, ngrpc, workdir, extra)


def start_nginx(prefix: Path, nginx_bin: str, model: str, http_port: int, grpc_port: int, workers: str):
    """nginx with gpuhost's rendered config in front of Triton; returns (process, http URL, gRPC target)."""
    listen_http, listen_grpc = free_port(), free_port()
    conf = render(
        NginxSpec(
            default_model=model,
            listen_address="127.0.0.1",
            listen_http=listen_http,
            listen_grpc=listen_grpc,
            upstream_http=f"127.0.0.1:{http_port}",
            upstream_grpc=f"127.0.0.1:{grpc_port}",
            prefix=str(prefix),
            user="root" if os.geteuid() == 0 else None,
            worker_processes=workers,
        )
    )
    prefix.mkdir(exist_ok=True)
    (prefix / "nginx.conf").write_text(conf)
    ncmd = [
        nginx_bin,
        "-p",
        str(prefix),
        "-c",
        str(prefix / "nginx.conf"),
        "-e",
        str(prefix / "error.log"),
        "-g",
        "daemon off;",
    ]
    t = subprocess.run([*ncmd[:-2], "-t"], capture_output=True, text=True)
    if t.returncode:
        raise RuntimeError(f"nginx -t failed: {t.stderr}")
    proc = subprocess.Popen(ncmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    nhttp = f"http://127.0.0.1:{listen_http}"
    for _ in range(100):
        try:
            urllib.request.urlopen(nhttp + "/nginx-health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    return proc, nhttp, f"127.0.0.1:{listen_grpc}"


# ---------------------------------------------------------------- the run


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
    config = get_json(f"{s.http}/v2/models/{model}/config")
    check = loadgate.ResponseCheck.from_config(config, batch=1)
    before = model_stats(s.http, model)
    with GpuSampler() as gpu:
        if proto == "http":
            base = {"nginx": s.nginx_http, "direct": s.http}.get(via) or s.extra[via.removeprefix("nginx-w")][1]
            outs = [o.name for o in check.outputs]
            bodies = [loadgate.binary_request([("images", "UINT8", IMAGE_SHAPE, im)], outs) for im in images]
            headers = bodies[0][1]
            spec = loadgate.LoadSpec(
                url=f"{base}/v2/models/{model}/infer",
                bodies=tuple(b for b, _ in bodies),
                headers=headers,
                concurrency=concurrency,
                duration_s=duration,
                max_requests=10**7,
                warmup_requests=5,
                timeout_s=30,
                tool="python",
                check=check,
                processes=processes,
            )
            r = loadgate.run(spec)
        else:
            target = s.nginx_grpc if via == "nginx" else s.grpc
            r = grpc_run(target, model, images, check, concurrency, duration, processes)
    after = model_stats(s.http, model)
    row = {
        "name": name,
        "model": model,
        "via": via,
        "proto": proto,
        **r.as_dict(),
        **gpu.summary(),
        "triton": stats_delta(before, after),
        "response_bytes": sum(o.nbytes or 0 for o in check.outputs),
    }
    log(f"{name}: {r.summary()} | triton {row['triton']} | gpu {gpu.summary()}")
    return row


def _git_commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return r.stdout.strip()


def _extras(text: str) -> list[tuple[int, int, int]]:
    """``"1:200:8,3:200:8"`` → [(instances, window µs, max batch), ...]."""
    out = []
    for item in (x for x in text.split(",") if x):
        n, w, b = (int(v) for v in item.split(":"))
        out.append((n, w, b))
    return out


def run(args) -> dict:
    nginx_bin = args.nginx or shutil.which("nginx") or "/usr/sbin/nginx"
    from serving.models.yolov8n_synthetic import synthetic_image

    weights = weights_file()  # the test detector: answers depend on the image, NMS does real work
    gpu = not args.cpu
    gpu_count = 1 if gpu else 0
    windows = [int(w) for w in args.windows.split(",")]
    conc = [int(c) for c in args.concurrency.split(",")]
    smi = machine(nginx_bin).get("gpus") or [""]
    gpu_name = args.gpu_model or smi[0].split(",")[0]

    def product(spec):
        """What TritonService deploys: the GPU's preset fills what the spec leaves open."""
        if not gpu:
            return spec
        try:
            return apply_preset(spec, gpu_name)
        except KeyError:
            return spec

    def model(name: str, **kw):
        return product(
            yolov8n_torch(
                name=name, instances=args.instances, max_batch_size=args.max_batch, gpu=gpu, weights=WEIGHTS_FILE, **kw
            )
        )

    # The main model: the GPU's preset as shipped (window, instances, max batch), unless given on the command line.
    specs = [model("yolov8n_preset")]
    specs += [model(f"yolov8n_w{w}", window_us=w) for w in windows]
    extras = _extras(args.extra)
    for n, w, b in extras:
        specs.append(
            yolov8n_torch(
                name=f"yolov8n_i{n}_w{w}_b{b}",
                window_us=w,
                instances=n,
                gpu=gpu,
                max_batch_size=b,
                weights=WEIGHTS_FILE,
            )
        )
    specs.append(model("yolov8n_raw", output="raw"))
    if args.compare_old_preset:
        # gpuhost's H100/H200 low-latency preset before this sweep: max batch 32, preferred 4/8/16/32, 1 ms, 2 inst.
        specs.append(
            yolov8n_torch(
                name="yolov8n_old_preset",
                window_us=1000,
                instances=2,
                max_batch_size=32,
                preferred_batch_size=[4, 8, 16, 32],
                gpu=gpu,
                weights=WEIGHTS_FILE,
            )
        )
    # Each instance prints its execute phases every 500 executes (gather, GPU, respond) to Triton's log.
    specs = [
        x.model_copy(update={"parameters": {**x.parameters, "report_every": str(args.report_every)}}) for x in specs
    ]
    files = repository_files(
        specs,
        gpu_count=gpu_count,
        model_files={k: v for s in specs for k, v in yolov8n_files(s.name, s.version, weights, WEIGHTS_FILE).items()},
    )
    results: dict = {
        "machine": machine(nginx_bin),
        "args": vars(args),
        "targets": TARGETS,
        "points": [],
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "commit": args.commit or _git_commit(),
        "weights": "the test detector (serving/models/yolov8n_synthetic.py, seed 0: BatchNorm recalibrated on "
        "synthetic images, class-head bias +7; tens of detections per image)",
        "images": f"{args.images} distinct synthetic images, sent in turn (serving/models/yolov8n_synthetic.py)",
        "gpu_model": gpu_name,
        "main": {
            "model": specs[0].name,
            "instances": specs[0].instance_group[0].count,
            "max_batch": specs[0].max_batch_size,
            "window_us": specs[0].dynamic_batching.max_queue_delay_microseconds if specs[0].dynamic_batching else None,
            "preferred": specs[0].dynamic_batching.preferred_batch_size if specs[0].dynamic_batching else None,
        },
    }
    log(json.dumps(results["machine"]))
    if gpu:
        results["gpu_floor"] = gpu_floor(max(specs[0].max_batch_size, *(b for _, _, b in extras), 8))
        log(f"GPU floor: {results['gpu_floor']}")
    workdir = Path(tempfile.mkdtemp(prefix="gpuhost-gpu-bench-"))
    t0 = time.monotonic()
    workers = tuple(w for w in args.nginx_workers.split(",") if w)
    s = start_servers(workdir, specs, files, nginx_bin, gpu_count, args.http_threads, workers)
    results["startup_s"] = round(time.monotonic() - t0, 1)
    results["triton"] = get_json(f"{s.http}/v2")
    results["model_config"] = get_json(f"{s.http}/v2/models/{specs[0].name}/config")
    results["config_pbtxt"] = files[f"{specs[0].name}/config.pbtxt"].decode()
    results["nginx_conf"] = (workdir / "nginx" / "nginx.conf").read_text()
    log(f"servers up in {results['startup_s']} s: {results['triton'].get('version')}")
    images = [synthetic_image(i, seed=3).tobytes() for i in range(args.images)]
    w0 = specs[0].name
    d = args.duration
    plan = []
    for c in conc:
        plan.append((f"nginx-http c={c}", w0, "nginx", "http", c))
        plan.append((f"direct-http c={c}", w0, "direct", "http", c))
    for c in conc:
        plan.append((f"nginx-grpc c={c}", w0, "nginx", "grpc", c))
        plan.append((f"direct-grpc c={c}", w0, "direct", "grpc", c))
    for w in windows:
        for c in conc:
            plan.append((f"window {w} nginx-http c={c}", f"yolov8n_w{w}", "nginx", "http", c))
    for n, w, b in extras:
        for c in conc:
            extra = f"yolov8n_i{n}_w{w}_b{b}"
            plan.append((f"instances {n} window {w} batch {b} nginx-http c={c}", extra, "nginx", "http", c))
    for wk in workers:
        for c in conc:
            plan.append((f"nginx workers {wk} http c={c}", w0, f"nginx-w{wk}", "http", c))
    if args.compare_old_preset:
        for c in conc:
            plan.append((f"old preset nginx-http c={c}", "yolov8n_old_preset", "nginx", "http", c))
    for c in (conc[0], conc[-1]):
        plan.append((f"raw-output nginx-http c={c}", "yolov8n_raw", "nginx", "http", c))
    try:
        for name, target, via, proto, c in plan:
            try:
                row = measure(s, name, target, via, proto, c, d, images, args.processes)
            except Exception as e:  # noqa: BLE001 - one failed point must not lose the others
                log(f"{name}: FAILED {e!r}")
                row = {"name": name, "model": target, "via": via, "proto": proto, "concurrency": c, "failed": repr(e)}
            results["points"].append(row)
        for c in conc:
            spec = loadgate.LoadSpec(
                url=f"{s.nginx_http}/nginx-health",
                concurrency=c,
                duration_s=min(d, 3),
                max_requests=10**7,
                tool="python",
                processes=args.processes,
            )
            floor = loadgate.overhead(spec, f"{s.nginx_http}/nginx-health")
            log(f"gate floor c={c}: {floor.summary()}")
            results.setdefault("gate_floor", []).append(floor.as_dict())
    finally:
        s.stop()
        text = (workdir / "triton.log").read_text(errors="replace")
        results["triton_log_tail"] = text[-3000:]
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "triton.log").write_text(text[-4_000_000:])
        shutil.rmtree(workdir, ignore_errors=True)
        results["backend_reports"] = [
            json.loads(line.split(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(("gpuhost-graph-ms ", "gpuhost-execute-ms "))
        ]
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return results


# ---------------------------------------------------------------- report


def _pt(results: dict, name: str) -> Optional[dict]:
    return next((p for p in results["points"] if p["name"] == name and "failed" not in p), None)


def _cell(p: Optional[dict]) -> str:
    if p is None:
        return "–"
    bad = f", {p['errors']} err" if p.get("errors") else ""
    return f"{p['p50_ms']:.2f} / {p['p95_ms']:.2f} / {p['p99_ms']:.2f} ms, {p['throughput_rps']:.0f}/s{bad}"


def table(results: dict) -> str:
    m = results["machine"]
    a = results["args"]
    conc = [int(c) for c in a["concurrency"].split(",")]
    windows = [int(w) for w in a["windows"].split(",")]
    main = results.get("main") or {
        "instances": a["instances"],
        "max_batch": a["max_batch"],
        "window_us": a["windows"].split(",")[0],
    }
    main_text = f"{main['instances']} instances, max batch {main['max_batch']}, window {main['window_us']} µs" + (
        f" (gpuhost's {results['gpu_model']} preset)" if results.get("main") else ""
    )
    lines = [
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
    w0 = windows[0]
    for c in conc:
        target = "p95 ≤ 6 ms (seed 000: < 8 ms)" if c == 1 else "≥ 1,000 images/s, p95 < 25 ms" if c == 16 else "–"
        lines.append(
            f"| {c} | {_cell(_pt(results, f'nginx-http c={c}'))} | {_cell(_pt(results, f'direct-http c={c}'))} "
            f"| {_cell(_pt(results, f'nginx-grpc c={c}'))} | {_cell(_pt(results, f'direct-grpc c={c}'))} "
            f"| {target} |"
        )
    lines += [
        "",
        f"Batching window sweep (through nginx and the gate, HTTP; {main['instances']} instances, max batch "
        f"{main['max_batch']}): p95 ms / images per s, Triton queue µs, average batch, GPU utilisation",
        "",
        "| Window | " + " | ".join(f"c={c}" for c in conc) + " |",
        "|---|" + "---|" * len(conc),
    ]
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
    lines += [
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
    return "\n".join(lines) + "\n"


def write(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(results, indent=1, sort_keys=True))
    (out / "gpu.md").write_text(table(results))


def render_doc(results: dict) -> None:
    begin, end = "<!-- BEGIN bench/gpu.py table -->", "<!-- END bench/gpu.py table -->"
    text = DOC.read_text()
    block = f"{begin}\n{table(results)}{end}"
    if begin in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text += "\n## GPU serving: YOLOv8n through Triton, nginx and the gate (H200)\n\n" + block + "\n"
    DOC.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--windows", default="0,200,500,1000")
    ap.add_argument("--instances", type=int, default=None, help="default: the GPU's preset")
    ap.add_argument("--max-batch", type=int, default=None, help="default: the GPU's preset")
    ap.add_argument("--gpu-model", default="", help="preset key (default: nvidia-smi's name)")
    ap.add_argument("--processes", type=int, default=4, help="client processes (threads split between them)")
    ap.add_argument("--http-threads", type=int, default=16)
    ap.add_argument("--extra", default="", help="more models through nginx: instances:window:max_batch,...")
    ap.add_argument("--report-every", type=int, default=500, help="backend phase report every N executes")
    ap.add_argument("--compare-old-preset", action="store_true", help="also the H200 preset before issue 18")
    ap.add_argument("--nginx-workers", default="", help="more nginx fronts with these worker_processes, e.g. 4,8")
    ap.add_argument("--nginx", default="")
    ap.add_argument("--images", type=int, default=64, help="distinct images sent in turn (one per request)")
    ap.add_argument("--cpu", action="store_true", help="KIND_CPU instances, FP32 (pipeline check without a GPU)")
    ap.add_argument("--quick", action="store_true", help="1 s per point, concurrency 1,4, windows 0,500")
    ap.add_argument("--commit", default="")
    ap.add_argument("--render", default="", help="only rewrite docs/benchmarks.md from this gpu.json")
    args = ap.parse_args(argv)
    if args.render:
        render_doc(json.loads(Path(args.render).read_text()))
        return 0
    if args.quick:
        args.duration, args.concurrency, args.windows = 1.0, "1,4", "0,500"
    results = run(args)
    results["command"] = "python -m bench.gpu " + " ".join(argv if argv is not None else sys.argv[1:])
    write(results, Path(args.out))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
