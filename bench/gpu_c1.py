"""Where the c=1 time of one 1280×720 JPEG frame goes (issue 26's 4 ms p95 goal): by stage, then the serving floor.

Command (on the GPU machine; ≤ 4 minutes; writes OUT/gpu_c1.json and OUT/gpu_c1.md)::

    GPUHOST_BENCH=bench.gpu_c1 bash bench/gpu_device.sh OUT
    python -m bench.gpu_c1 --cpu --quick --out /tmp/c1     # the same pipeline here, on CPU (no CUDA parts)

Three parts, each for the same 1280×720 frame (``gate.sample_frames``, seed 100, ~108 KB):

1. ``stages``: in this process, no Triton, batch 1, on the device: bytes → tensor, header check, decode (the
   product's ``Decoder``, torchvision's single-tensor and list forms of ``decode_jpeg(device="cuda")``, libjpeg on the
   CPU), letterbox (the product's ``letterbox_batch`` and cheaper variants: FP16, channels-last, captured in a CUDA
   graph for the fixed frame size), the product's graph (preprocess + model + NMS) and its parts, box mapping, the
   device → host copy, and end to end: the batched path as ``_execute_frames`` runs it for a batch (letterbox_batch,
   the batch size's graph, unletterbox), and the lone frame's path (decode, then one graph of
   ``frames.letterboxed_forward``: letterbox + model + NMS + boxes back, captured for the frame's size). Each stage:
   host time until the call returns (launch), wall time to a synchronize, GPU time (CUDA events); p50/p95/p99 over
   ``--reps``; both end-to-end paths also with a 4 and a 13 ms sleep before each rep (how long an instance idles
   between c=1 requests with 1 and 3 instances: the same work on a cold core). The host syncs of both paths are
   counted with ``torch.cuda.set_sync_debug_mode``.
2. ``floor``: Triton with a python-backend model that reads the frame and answers a zero ``detections`` /
   ``num_detections`` of the real shapes (the product's config.pbtxt, same instances, batching, window), for the
   same body: HTTP direct and through nginx, gRPC direct and through nginx; and nginx's ``/nginx-health`` (the
   client's and nginx's own floor).
3. ``served``: the real model (the GPU's preset) at c=1, the same four ways, and over HTTP variants with 2 and 1
   instances and one without the lone-frame graphs (``frame_graphs: none``); every answer checked against the
   device's eager reference of the frame (after the clock stops, as the gate does). Triton's per-request phases
   and the backend's own (decode, launch, GPU, respond) per point. Then a second Triton with
   ``--rate-limit=execution_count`` serving the preset's instances as two groups, 1 at rate-limiter priority 1 and
   the rest at 1000 (``det_jpeg_warm``): lone requests go to the first instance (it stays warm), the others take
   batches while it is busy; c=1 over HTTP and c=16 through nginx against the plain preset's c=16.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu import get_json, log, machine, model_stats, start_servers, stats_delta  # noqa: E402
from bench.gpu_frames import CONF, MAX_DET, make_frames, payloads, references  # noqa: E402
from bench.report import git_commit, invalid_banner, wrong_answers  # noqa: E402
from bench.yolo_check import WEIGHTS_FILE, set_problem, weights_file  # noqa: E402
from gate import loadgate  # noqa: E402
from plans.presets import apply_preset  # noqa: E402
from plans.triton_model import RateLimiter  # noqa: E402
from plans.triton_repo import repository_files, yolov8n_torch  # noqa: E402
from serving.models import yolov8n_files  # noqa: E402

HD = (1280, 720)

# The floor's model: the product's config.pbtxt, this model.py (reads the frame through DLPack as the product does,
# answers zeros of the real output shapes through DLPack).
ECHO_MODEL = """
import json
import torch
import triton_python_backend_utils as pb_utils
from torch.utils import dlpack


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.input_name = config["input"][0]["name"]
        self.det = torch.zeros((1, int(config["output"][0]["dims"][0]), 6), dtype=torch.float32)
        self.count = torch.zeros((1, 1), dtype=torch.int32)

    def execute(self, requests):
        out = []
        for request in requests:
            t = pb_utils.get_input_tensor_by_name(request, self.input_name)
            a = dlpack.from_dlpack(t.to_dlpack())
            n = int(a.shape[0])
            det = self.det.expand(n, -1, -1).clone()
            count = self.count.expand(n, -1).clone()
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor.from_dlpack("detections", det),
                pb_utils.Tensor.from_dlpack("num_detections", count),
            ]))
        return out
"""


# ---------------------------------------------------------------- part 1: stages in this process


def _pcts(xs: list[float]) -> dict:
    s = sorted(xs)
    if not s:
        return {}

    def q(p: float) -> float:
        return round(s[min(len(s) - 1, int(round(p * (len(s) - 1))))], 4)

    return {"p50": q(0.5), "p95": q(0.95), "p99": q(0.99), "mean": round(statistics.fmean(s), 4), "n": len(s)}


class Timer:
    """Times a callable: host ms until it returns, wall ms until the device is idle again, GPU ms (CUDA events)."""

    def __init__(self, torch, cuda: bool, reps: int, warm: int = 5):
        self.torch, self.cuda, self.reps, self.warm = torch, cuda, reps, warm

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def __call__(self, fn: Callable[[], object], idle_ms: float = 0.0) -> dict:
        """``idle_ms``: sleep that long before each rep (a served instance waits between requests: its core and
        caches go cold), so the busy loop's numbers and a server's can be told apart."""
        torch = self.torch
        for _ in range(self.warm):
            fn()
        self.sync()
        host, wall, gpu = [], [], []
        for _ in range(self.reps):
            self.sync()
            if idle_ms:
                time.sleep(idle_ms / 1000)
            if self.cuda:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            if self.cuda:
                e1.record()
            self.sync()
            t2 = time.perf_counter()
            host.append((t1 - t0) * 1000)
            wall.append((t2 - t0) * 1000)
            if self.cuda:
                gpu.append(e0.elapsed_time(e1))
        out = {"wall_ms": _pcts(wall), "host_ms": _pcts(host)}
        if gpu:
            out["gpu_ms"] = _pcts(gpu)
        return out


class StageRun:
    """Part 1's shared state: the device, the model and its NMS settings, the frame as each stage leaves it (row
    → decoded image → letterboxed input → detections), the pinned host buffers and the captured graphs. Each
    method times one group of stages into ``res["stages"]``, in the order the product runs them."""

    def __init__(self, gpu: bool, reps: int, weights: bytes, jpeg: bytes):
        import torch

        from serving.models import frames as fr
        from serving.models import yolov8n as yolo
        from serving.models.yolov8n_weights import load_model

        self.torch, self.fr, self.yolo, self.jpeg = torch, fr, yolo, jpeg
        self.cuda = cuda = gpu and torch.cuda.is_available()
        self.dev = dev = torch.device("cuda:0" if cuda else "cpu")
        dtype = torch.float16 if cuda else torch.float32
        torch.backends.cudnn.benchmark = True
        model = yolo.fuse(load_model(weights)).to(dev, dtype)
        if cuda:
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.model = model
        self.pre = yolo.Preprocess(dtype)
        self.nms: dict[str, Any] = dict(max_det=MAX_DET, candidates=256, conf=CONF, iou=0.45)
        self.timer = Timer(torch, cuda, reps)
        self.res: dict = {"device": str(dev), "dtype": str(dtype), "frame_bytes": len(jpeg), "reps": reps, "stages": {}}
        self.st = self.res["stages"]
        self.stream = torch.cuda.Stream(dev) if cuda else None
        self.ctx = torch.cuda.stream(self.stream) if cuda else _Null()
        self.decoder = fr.Decoder(dev)
        self.res["decoder"] = self.decoder.name
        self.graphs: dict = {}

    def forward(self, x):
        return self.yolo.fast_nms(self.model(self.pre(x)), **self.nms)

    def respond(self):
        return [self.host_det[:1].clone(), self.host_cnt[:1].clone()]

    def decode(self) -> None:
        """Bytes to tensor, header check, the product's decode and prepare, torchvision's decoders; then the
        decoded image and the letterbox's buffers for the stages after."""
        torch, fr, timer, st, dev, jpeg = self.torch, self.fr, self.timer, self.st, self.dev, self.jpeg
        try:
            from torchvision import io as tvio
        except Exception:  # noqa: BLE001 - no torchvision here: Pillow decodes, the torchvision rows are skipped
            tvio = None
        self.decoder.warm((1, 8)) if self.cuda else None
        row = self.row = torch.frombuffer(bytearray(jpeg), dtype=torch.uint8)
        st["bytes_to_tensor"] = timer(lambda: fr.frame_bytes(torch.frombuffer(bytearray(jpeg), dtype=torch.uint8)))
        st["header_check"] = timer(lambda: fr.jpeg_size(fr._np_bytes(row)))
        st["decode_product"] = timer(lambda: self.decoder.decode([row]))
        st["prepare_product"] = timer(lambda: fr.prepare([row], self.decoder))
        if tvio is not None:
            rgb = tvio.ImageReadMode.RGB
            if self.cuda:
                st["decode_nvjpeg_list"] = timer(lambda: tvio.decode_jpeg([row], mode=rgb, device=dev))
                st["decode_nvjpeg_single"] = timer(lambda: tvio.decode_jpeg(row, mode=rgb, device=dev))
            st["decode_cpu_libjpeg_to_device"] = timer(lambda: tvio.decode_jpeg(row, mode=rgb).to(dev))
        img = self.decoder.decode([row])[0]
        assert isinstance(img, torch.Tensor), img
        self.img = img
        self.gpu_in = torch.zeros((8, 640, 640, 3), dtype=torch.uint8, device=dev)
        self.geo_host = torch.zeros((8, 6), dtype=torch.float32, pin_memory=self.cuda)

    def letterbox(self) -> None:
        """The product's letterbox_batch and single letterbox, cheaper variants, and how the FP16 one differs."""
        torch, fr, timer, st, img, gpu_in = self.torch, self.fr, self.timer, self.st, self.img, self.gpu_in
        import torch.nn.functional as F

        h, w = int(img.shape[1]), int(img.shape[2])
        new_w, new_h, left, top = fr.letterbox_geometry(w, h)

        def lb_product():
            self.geo_host[:1] = torch.tensor(fr.letterbox_batch([img], gpu_in))

        st["letterbox_product"] = timer(lb_product)
        st["letterbox_single"] = timer(lambda: fr.letterbox(img, gpu_in[0]))

        def lb_variant(dt, channels_last: bool):
            def run():
                x = img.unsqueeze(0).to(dt)
                if channels_last:
                    x = x.contiguous(memory_format=torch.channels_last)
                y = F.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=False).round_().clamp_(0, 255)
                gpu_in[0].fill_(fr.PAD)
                gpu_in[0, top : top + new_h, left : left + new_w].copy_(y[0].permute(1, 2, 0))

            return run

        if self.cuda:
            st["letterbox_fp16"] = timer(lb_variant(torch.float16, False))
            st["letterbox_fp16_channels_last"] = timer(lb_variant(torch.float16, True))
        st["letterbox_fp32_channels_last"] = timer(lb_variant(torch.float32, True))
        # The product's letterbox against the FP16 one: how many pixels differ (rounding) and by how much.
        ref_in = torch.zeros_like(gpu_in[:1])
        fr.letterbox(img, ref_in[0])
        if self.cuda:
            lb_variant(torch.float16, True)()
            diff = (gpu_in[0].int() - ref_in[0].int()).abs()
            self.res["letterbox_fp16_vs_product"] = {
                "pixels_differ": int((diff > 0).sum()),
                "max_diff": int(diff.max()),
            }

    def model_and_graphs(self) -> None:
        """Eager model + NMS and their parts; on a GPU the captured graphs (the product's, the model alone, the
        lone frame's fused one) replayed. Leaves the product's detections for the stages after."""
        torch, fr, timer, st, gpu_in, img = self.torch, self.fr, self.timer, self.st, self.gpu_in, self.img
        forward, model, pre = self.forward, self.model, self.pre
        for _ in range(3):
            forward(gpu_in[:1])
        timer.sync()
        st["eager_model_nms"] = timer(lambda: forward(gpu_in[:1]))
        st["eager_model_only"] = timer(lambda: model(pre(gpu_in[:1])))
        raw = model(pre(gpu_in[:1]))
        st["eager_nms"] = timer(lambda: self.yolo.fast_nms(raw, **self.nms))
        src = self.src = torch.empty_like(img)
        src.copy_(img)
        geo_dev = self.geo_dev = torch.tensor([fr.letterbox(img, gpu_in[0])], device=self.dev)
        graphs = self.graphs
        if self.cuda:
            graphs["product"] = _capture(torch, self.stream, lambda: forward(gpu_in[:1]))
            graphs["model_only"] = _capture(torch, self.stream, lambda: model(pre(gpu_in[:1])))

            def fused():  # the product's lone-frame graph (serving/yolov8n_model.py, frame_graphs)
                return fr.letterboxed_forward(src, gpu_in[:1], geo_dev, forward)

            graphs["fused"] = _capture(torch, self.stream, fused)
            for k, (g, _) in graphs.items():
                st[f"graph_{k}_replay"] = timer(g.replay)
        self.det, self.count = graphs["product"][1] if self.cuda else forward(gpu_in[:1])

    def answer(self) -> None:
        """Boxes back to the frame's coordinates, the device → host copy, the response's clones."""
        torch, fr, timer, st, det, count, cuda = (
            self.torch,
            self.fr,
            self.timer,
            self.st,
            self.det,
            self.count,
            self.cuda,
        )
        self.host_det = torch.zeros((8, MAX_DET, 6), dtype=torch.float32, pin_memory=cuda)
        self.host_cnt = torch.zeros((8, 1), dtype=torch.int32, pin_memory=cuda)

        def unlb_product():
            return fr.unletterbox(det[:1], self.geo_host[:1].to(self.dev, non_blocking=True))

        st["unletterbox_product"] = timer(unlb_product)
        st["unletterbox_geo_on_device"] = timer(lambda: fr.unletterbox(det[:1], self.geo_dev))

        def d2h():
            self.host_det[:1].copy_(det[:1], non_blocking=cuda)
            self.host_cnt[:1].copy_(count[:1], non_blocking=cuda)

        st["d2h"] = timer(d2h)
        st["respond_clones"] = timer(self.respond)

    def batched_total(self):
        """One frame end to end as ``_execute_frames`` runs a batch: letterbox_batch, the graph, unletterbox."""
        torch, fr, cuda = self.torch, self.fr, self.cuda
        r = fr.frame_bytes(torch.frombuffer(bytearray(self.jpeg), dtype=torch.uint8))
        images = [x for x in fr.prepare([r], self.decoder) if isinstance(x, torch.Tensor)]
        self.geo_host[:1] = torch.tensor(fr.letterbox_batch(images, self.gpu_in))
        if cuda:
            self.graphs["product"][0].replay()
            d, c = self.graphs["product"][1]
        else:
            d, c = self.forward(self.gpu_in[:1])
        d = fr.unletterbox(d[:1], self.geo_host[:1].to(self.dev, non_blocking=True))
        self.host_det[:1].copy_(d, non_blocking=cuda)
        self.host_cnt[:1].copy_(c[:1], non_blocking=cuda)
        self.timer.sync()
        return self.respond()

    def fused_total(self):
        """One frame end to end on the lone frame's path: decode, then the fused graph."""
        fr = self.fr
        r = fr.frame_bytes(self.torch.frombuffer(bytearray(self.jpeg), dtype=self.torch.uint8))
        self.src.copy_(fr.prepare([r], self.decoder)[0])  # type: ignore[arg-type]  # a good frame: a tensor
        self.graphs["fused"][0].replay()
        d, c = self.graphs["fused"][1]
        self.host_det[:1].copy_(d, non_blocking=True)
        self.host_cnt[:1].copy_(c, non_blocking=True)
        self.timer.sync()
        return self.respond()

    def totals(self) -> None:
        """Both end-to-end paths (the lone frame's on a GPU only), also after an instance's idle time, their host
        syncs, and whether they answer the same."""
        torch, timer, st = self.torch, self.timer, self.st
        st["total_batched_path"] = timer(self.batched_total)
        if not self.cuda:
            return
        self.res["batched_path_host_syncs"] = _count_syncs(torch, self.batched_total)
        st["total_frame_graph"] = timer(self.fused_total)
        # c=1 through the preset: a request every ~4.5 ms, each instance idle ~4 ms (1 instance) or ~13 ms (3).
        for idle in (4, 13):
            st[f"total_frame_graph_idle_{idle}ms"] = timer(self.fused_total, idle_ms=idle)
            st[f"total_batched_path_idle_{idle}ms"] = timer(self.batched_total, idle_ms=idle)
        self.res["frame_graph_host_syncs"] = _count_syncs(torch, self.fused_total)
        # The lone frame's graph answers what the batched path does (same frame, same kernels).
        a = [t.clone() for t in self.batched_total()]
        b = self.fused_total()
        self.res["frame_graph_matches_batched_path"] = bool(torch.equal(a[1], b[1]) and torch.equal(a[0], b[0]))


def stages(gpu: bool, reps: int, weights: bytes, jpeg: bytes) -> dict:
    """Part 1 (see the module docstring): {stage: {wall_ms, host_ms[, gpu_ms]}} plus notes."""
    run = StageRun(gpu, reps, weights, jpeg)
    with run.torch.no_grad(), run.ctx:
        run.decode()
        run.letterbox()
        run.model_and_graphs()
        run.answer()
        run.totals()
    return run.res


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _capture(torch, stream, fn):
    for _ in range(3):
        fn()
    stream.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        out = fn()
    stream.synchronize()
    return g, out


def _count_syncs(torch, fn) -> dict:
    """Host syncs inside ``fn`` (CUDA's sync debug mode warns on each), by the line that made them."""
    where: dict[str, int] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        if "synchroniz" in str(w.message):
            key = f"{Path(w.filename).name}:{w.lineno}"
            where[key] = where.get(key, 0) + 1
    return where


# ---------------------------------------------------------------- parts 2 and 3: Triton, nginx


def _grpc_c1(target: str, model: str, body: bytes, ref: Optional[tuple[list, int]], duration: float) -> dict:
    """c=1 ModelInfer over gRPC, one channel, for ``duration`` s; each answer's outputs checked (sizes, and the
    boxes against ``ref`` (rows, count) as sets, where given)."""
    import grpc
    import numpy as np
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    req = service_pb2.ModelInferRequest(model_name=model)
    t = req.inputs.add(name="images", datatype="UINT8")
    t.shape.extend([1, len(body)])
    req.raw_input_contents.append(body)
    for name in ("detections", "num_detections"):
        req.outputs.add(name=name)
    opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    channel = grpc.insecure_channel(target, options=opts)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    lat: list[float] = []
    errors, first = 0, ""

    def problem(resp) -> Optional[str]:
        got = {o.name: raw for o, raw in zip(resp.outputs, resp.raw_output_contents)}
        if len(got.get("detections", b"")) != MAX_DET * 24 or len(got.get("num_detections", b"")) != 4:
            return f"outputs {[(k, len(v)) for k, v in got.items()]}"
        if ref is None:
            return None
        n = int(np.frombuffer(got["num_detections"], dtype=np.int32)[0])
        rows = np.frombuffer(got["detections"], dtype=np.float32).reshape(-1, 6)[:n]
        return set_problem(rows, np.asarray(ref[0], dtype=np.float32).reshape(-1, 6)[: ref[1]], CONF)

    try:
        for _ in range(5):
            stub.ModelInfer(req, timeout=30)
        end = time.perf_counter() + duration
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            try:
                resp = stub.ModelInfer(req, timeout=30)
                lat.append((time.perf_counter() - t0) * 1000)  # the exchange; the check after (as the gate does)
                p = problem(resp)
            except grpc.RpcError as e:
                lat.append((time.perf_counter() - t0) * 1000)
                p = f"gRPC {e.code()}"
            if p:
                errors += 1
                first = first or p
    finally:
        channel.close()
    return {"tool": "grpc", "requests": len(lat), "errors": errors, "first_invalid": first, **_ms(lat)}


def _ms(lat: list[float]) -> dict:
    p = _pcts(lat)
    return {f"{k}_ms": v for k, v in p.items() if k != "n"}


def _http(url: str, pl, check, duration: float, c: int = 1) -> dict:
    # c connections (threads of up to 4 processes), 5 warm-up requests each; every answer checked.
    spec = loadgate.LoadSpec(
        url, payloads=pl, concurrency=c, duration_s=duration, max_requests=10**7, tool="python", check=check
    )
    d = loadgate.run(dataclasses.replace(spec, processes=min(c, 4))).as_dict()
    keep = ("tool", "requests", "errors", "invalid", "first_invalid", "p50_ms", "p95_ms", "p99_ms", "throughput_rps")
    return {k: d[k] for k in keep} | {"mean_ms": round(d["mean_ms"], 4)}


def served(args, gpu: bool, weights: bytes, frame: dict) -> dict:
    """Parts 2 and 3 (see the module docstring): one Triton with the echo, the preset's model and its variants,
    then one with the preset's instances under Triton's rate limiter, the first instance preferred (``warm``)."""
    nginx_bin = args.nginx or shutil.which("nginx") or "/usr/sbin/nginx"
    gpu_name = args.gpu_model or (machine(nginx_bin).get("gpus") or [""])[0].split(",")[0]

    def spec(name, **kw):
        s = yolov8n_torch(name=name, input="jpeg", gpu=gpu, weights=WEIGHTS_FILE, **kw)
        with contextlib.suppress(KeyError):  # a GPU without a preset keeps the defaults
            s = apply_preset(s, gpu_name) if gpu else s
        # Square, set: the references (bench.gpu_frames.references) letterbox 640×640; a state_dict's default is rect.
        params = {"report_every": "100", "conf": str(CONF), "letterbox": "square"}
        return s.model_copy(update={"parameters": {**s.parameters, **params}})

    # The preset's instance count against fewer (each request of a c=1 run lands on the instance that has waited
    # longest: the coldest process and GPU context), same batching otherwise; and the lone-frame graphs off.
    variants = {"det_jpeg_i2": dict(instances=2), "det_jpeg_i1": dict(instances=1)}
    specs = [spec("det_jpeg"), spec("echo"), *(spec(k, **v) for k, v in variants.items())]
    nograph = spec("det_jpeg_nofg")
    specs.append(nograph.model_copy(update={"parameters": {**nograph.parameters, "frame_graphs": "none"}}))
    all_ways = ("http direct", "http nginx", "grpc direct", "grpc nginx")
    plan = [("echo", w, 1) for w in all_ways] + [("det_jpeg", w, 1) for w in all_ways]
    plan += [(m, w, 1) for m in (*variants, "det_jpeg_nofg") for w in all_ways[:2]]
    plan += [("det_jpeg", "http nginx", 16)]
    out = _triton(args, gpu, weights, frame, nginx_bin, specs, plan, ())
    out["gpu_model"] = gpu_name
    # Triton's rate limiter hands a batch to the available instance of the lowest priority × executions: with the
    # first instance at priority 1 and the others at 1000, lone requests all go to the first (warm) one, and the
    # others take batches only while it is busy.
    base = spec("det_jpeg_warm")
    g = base.instance_group[0]
    if g.count > 1:
        groups = [
            g.model_copy(update={"count": 1, "rate_limiter": RateLimiter(priority=1)}),
            g.model_copy(update={"count": g.count - 1, "rate_limiter": RateLimiter(priority=1000)}),
        ]
        warm = base.model_copy(update={"instance_group": groups})
        plan = [("det_jpeg_warm", w, 1) for w in all_ways[:2]] + [("det_jpeg_warm", "http nginx", 16)]
        try:
            second = _triton(args, gpu, weights, frame, nginx_bin, [warm], plan, ("--rate-limit=execution_count",))
        except Exception as e:  # noqa: BLE001 - the first Triton's points stand alone
            second = {"points": [{"name": "det_jpeg_warm", "failed": repr(e)}], "backend_reports": []}
        out["points"] += second["points"]
        out["backend_reports"] += second["backend_reports"]
        out["warm_config_pbtxt"] = second.get("config_pbtxt", "")
    return out


def _triton(args, gpu: bool, weights: bytes, frame: dict, nginx_bin: str, specs, plan, server_extra) -> dict:
    """Triton (with ``server_extra`` flags) and nginx serving ``specs``; each (model, way, concurrency) of ``plan``
    measured for ``--duration`` s with Triton's per-request phases; the backends' reports from Triton's log."""
    files = repository_files(specs, gpu_count=1 if gpu else 0)
    for s in specs:
        if s.name == "echo":
            files[f"echo/{s.version}/model.py"] = ECHO_MODEL.encode()
        else:
            files.update(yolov8n_files(s.name, s.version, weights, WEIGHTS_FILE))
    workdir = Path(tempfile.mkdtemp(prefix="gpuhost-c1-"))
    out: dict = {"points": []}
    t0 = time.monotonic()
    srv = start_servers(
        workdir, specs, files, nginx_bin, http_threads=args.http_threads, server_extra=tuple(server_extra)
    )
    out["startup_s"] = round(time.monotonic() - t0, 1)
    out["config_pbtxt"] = files[f"{specs[0].name}/config.pbtxt"].decode()
    log(f"servers up in {out['startup_s']} s ({' '.join(server_extra) or 'default flags'})")
    pl_real = payloads([frame], "jpeg")
    body, headers = loadgate.binary_request(
        [("images", "UINT8", [1, len(frame["jpeg"])], frame["jpeg"])], ["detections", "num_detections"]
    )
    pl_echo = (loadgate.Payload(body, tuple(headers)),)
    d = args.duration
    try:
        if not server_extra:
            r = loadgate.run(
                loadgate.LoadSpec(f"{srv.nginx_http}/nginx-health", method="GET", duration_s=d, tool="python")
            )
            out["points"].append({"name": "nginx /nginx-health (client + nginx floor)", **_ms_of(r)})
            log(f"nginx-health: {r.summary()}")
        bases = {
            "http direct": srv.http,
            "http nginx": srv.nginx_http,
            "grpc direct": srv.grpc,
            "grpc nginx": srv.nginx_grpc,
        }
        for model, way, c in plan:
            pl = pl_echo if model == "echo" else pl_real
            name = f"{model} {way}" + (f" c={c}" if c > 1 else "")
            before = model_stats(srv.http, model)
            try:
                if way.startswith("http"):
                    check = loadgate.ResponseCheck.from_config(get_json(f"{srv.http}/v2/models/{model}/config"))
                    row = _http(f"{bases[way]}/v2/models/{model}/infer", pl, check, d, c)
                else:
                    ref = None if model == "echo" else (frame["det"], frame["count"])
                    row = _grpc_c1(bases[way], model, frame["jpeg"], ref, d)
            except Exception as e:  # noqa: BLE001 - one failed point must not lose the others
                row = {"failed": repr(e)}
            row["triton"] = stats_delta(before, model_stats(srv.http, model))
            out["points"].append({"name": name, "model": model, "via": way, "concurrency": c, **row})
            log(f"{name}: {json.dumps(row)}")
    finally:
        srv.stop()
        text = (workdir / "triton.log").read_text(errors="replace")
        out["backend_reports"] = [
            json.loads(line.split(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(("gpuhost-graph-ms ", "gpuhost-execute-ms ", "gpuhost-frames "))
        ]
        out["triton_log_tail"] = text[-2000:]
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def _ms_of(r) -> dict:
    d = r.as_dict()
    return {k: d[k] for k in ("requests", "errors", "p50_ms", "p95_ms", "p99_ms", "mean_ms")}


# ---------------------------------------------------------------- report


def table(res: dict) -> str:
    lines = [
        f"c=1 profile of one {HD[0]}×{HD[1]} JPEG frame ({res.get('frame_bytes')} B); machine: "
        f"{', '.join(res['machine'].get('gpus') or ['no GPU'])}; torch {res['machine'].get('torch')}; commit "
        f"{res.get('commit')}; {res.get('started')}.",
        "",
        f"Command: `{res.get('command')}`",
        "",
    ]
    s = res.get("stages") or {}
    if s:
        lines += [
            f"Stages in one process, batch 1, {s.get('device')} {s.get('dtype')}, decoder {s.get('decoder')}, "
            f"{s.get('reps')} reps (ms; wall = to a synchronize, host = until the call returns, GPU = CUDA events):",
            "",
            "| Stage | wall p50 / p95 / p99 | host p50 | GPU p50 |",
            "|---|---|---|---|",
        ]
        for k, v in s["stages"].items():
            w = v["wall_ms"]
            g = v.get("gpu_ms", {}).get("p50", "–")
            lines.append(f"| {k} | {w['p50']} / {w['p95']} / {w['p99']} | {v['host_ms']['p50']} | {g} |")
        for k in (
            "batched_path_host_syncs",
            "frame_graph_host_syncs",
            "frame_graph_matches_batched_path",
            "letterbox_fp16_vs_product",
        ):
            if k in s:
                lines.append(f"\n{k}: `{json.dumps(s[k])}`")
        lines.append("")
    sv = res.get("served") or {}
    if sv:
        lines += [
            f"Served at c=1 (preset of {sv.get('gpu_model')}; echo = the product's config with a model that answers "
            "zeros; ms; Triton µs per request):",
            "",
            "| Point | p50 / p95 / p99 | mean | req/s | errors | Triton total | queue | input | infer | output "
            "| batch |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for p in sv["points"]:
            if "failed" in p:
                lines.append(f"| {p['name']} | failed: {p['failed'][:120]} ||||||||||")
                continue
            t = p.get("triton") or {}
            rps = p.get("throughput_rps")
            lines.append(
                f"| {p['name']} | {p['p50_ms']:.3f} / {p['p95_ms']:.3f} / {p['p99_ms']:.3f} | {p['mean_ms']:.3f} | "
                f"{'' if rps is None else round(rps)} | "
                f"{p.get('errors')} | {t.get('success_us', '')} | {t.get('queue_us', '')} | "
                f"{t.get('compute_input_us', '')} | {t.get('compute_infer_us', '')} | "
                f"{t.get('compute_output_us', '')} | {t.get('avg_batch', '')} |"
            )
        by_model: dict[str, list[dict]] = {}
        for r in sv.get("backend_reports", []):
            if "respond_ms" in r:
                by_model.setdefault(r["instance"].rsplit("_", 2)[0], []).append(r)
        for model, reps in by_model.items():
            keys = [k for k in reps[0] if k.endswith("_ms") or k == "frames_per_execute"]
            mean = ", ".join(f"{k} {statistics.fmean(r[k] for r in reps):.3f}" for k in keys)
            per: dict[str, int] = {}
            for r in reps:
                per[r["instance"]] = per.get(r["instance"], 0) + 100
            lines.append(
                f"\nbackend {model} (means of {len(reps)} reports of 100 executes): {mean}; executes by instance "
                f"(hundreds, warm-up included): `{json.dumps(per, sort_keys=True)}`"
            )
        graphs = [r for r in sv.get("backend_reports", []) if "graph_ms" in r]
        if graphs:
            lines.append(f"\ngraph replay ms by batch (first instance): `{json.dumps(graphs[0]['graph_ms'])}`")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per served point")
    ap.add_argument("--http-threads", type=int, default=32)
    ap.add_argument("--gpu-model", default="")
    ap.add_argument("--nginx", default="")
    ap.add_argument("--cpu", action="store_true", help="CPU only: KIND_CPU instances, FP32, no CUDA-only stages")
    ap.add_argument("--quick", action="store_true", help="20 reps, 1 s per point")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: stages,served")
    ap.add_argument("--commit", default="")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.duration = 20, 1.0
    skip = {x for x in args.skip.split(",") if x}
    gpu = not args.cpu
    nginx_bin = args.nginx or shutil.which("nginx") or "/usr/sbin/nginx"
    weights = weights_file()
    frame = make_frames(1, sizes=(HD,))[0]
    res: dict = {
        "machine": machine(nginx_bin),
        "commit": args.commit or git_commit(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "frame_bytes": len(frame["jpeg"]),
        "command": "python -m bench.gpu_c1 " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save():
        (out / "gpu_c1.json").write_text(json.dumps(res, indent=1, sort_keys=True))
        (out / "gpu_c1.md").write_text(invalid_banner(res) + table(res))

    if "stages" not in skip:
        try:
            res["stages"] = stages(gpu, args.reps, weights, frame["jpeg"])
        except Exception as e:  # noqa: BLE001 - the served part still runs
            import traceback

            res["stages_failed"] = traceback.format_exc()[-3000:]
            log(f"stages: FAILED {e!r}")
        save()
        log("stages done")
    if "served" not in skip:
        res["reference"] = references([frame], gpu, weights)
        res["served"] = served(args, gpu, weights, frame)
        save()
    res["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    save()
    print(invalid_banner(res) + table(res))
    return 1 if wrong_answers(res) else 0


if __name__ == "__main__":
    sys.exit(main())
