"""Triton python-backend model: YOLOv8n on the GPU on the fast path (copied as ``<model>/<version>/model.py``).

Beside it in the version directory lies ``yolov8n.py`` (``serving/models/yolov8n.py``). Per instance:

* FP16 weights, Conv+BN fused, channels_last, cuDNN autotuned, compiled by torch's inductor where it works
  (``compile``: the model's graph in half the GPU time at batch 1, bit-equal answers); the input is uint8 NHWC and is cast and
  scaled on the GPU (``Preprocess``), so the wire carries 1.2 MB per 640×640 image instead of 2.4 (FP16);
* one CUDA graph per input shape and batch size (1–8, then multiples of 8 up to ``max_batch_size``); a batch is
  padded to the next captured size. Shapes: 640×640, and with ``letterbox: rect`` the rect shape of each
  ``frame_graphs`` size (1280×720 and 1920×1080 → 384×640, 640×480 → 480×640): 24 graphs at max batch 8, all in
  one memory pool (replays run one at a time and each answer is copied out before the next, so their scratch
  overlaps: on the H200 228 MiB for warm-up and all 24, as for the 8 square graphs alone). Any other shape runs
  eagerly, with cuDNN's autotuner turned off after initialize: it would tune each new shape in a request's path
  (on the H200 before these graphs, 1280×720 frames at c=32 answered in 1.4–4.1 s while it tuned);
* the requests of a dynamic batch are gathered into one pinned host buffer and go to the GPU in one copy;
  outputs come back in one copy per output into pinned buffers;
* tensors move through DLPack only, never ``as_numpy``/``Tensor(name, ndarray)``: with NumPy 2 beside the
  python backend's stub those read zeros and answer 0 bytes under HTTP 200;
* ``output`` parameter: ``nms`` runs a fixed-size class-aware NMS inside the graph and answers
  ``detections`` [max_det, 6] + ``num_detections`` [1] (2.4 kB per image), ``raw`` answers ``output0``
  [84, 8400] (1.4 MB in FP16).

On a KIND_CPU instance (tests, no GPU) the same code runs eagerly in FP32 without graphs.

``input`` parameter: ``raw`` takes ``images`` UINT8 [640, 640, 3] (already letterboxed by the client, boxes in that
640×640 space); ``jpeg`` takes ``images`` UINT8 [-1]: each row one encoded JPEG frame of any size (a request of
several frames pads its rows with zeros to the longest). Frames are checked from their headers (read as libjpeg
reads them), decoded to libjpeg's pixels (on a GPU nvJPEG, batched, for the frames it decodes as libjpeg does and
libjpeg on the host for the others, ``frames.route``; libjpeg/Pillow on CPU; ``jpeg_decoder`` = ``nvjpeg`` gives
nvJPEG every frame it decodes at all, pixels near libjpeg's, about twice the frames/s), turned upright by their EXIF
orientation, letterboxed into the model's input and the boxes mapped back to each upright frame's own pixels
(``frames.py`` beside this file). Triton's ``/metrics`` counts the frames each decoder served
(``gpuhost_frames_decoded_total{model, decoder}``). A frame that is no JPEG, corrupt, too large or too thin to
letterbox fails its own request with a message (``max_frame_pixels``, ``max_frame_side``); the other requests of
the batch answer. Raw bytes, not KServe BYTES: a BYTES input reaches Python only through ``as_numpy``, which reads
zeros beside NumPy 2.

Weights: the ``weights`` parameter names a file beside this one (an Ultralytics ONNX export or checkpoint, a
state_dict or safetensors, told apart by content: ``yolov8n_weights.py``), loaded at initialize; a stack ships its
``artifact`` there, pinned by sha256 (so a pickled checkpoint is trusted). A file that does not fit YOLOv8n fails
initialize with the loader's message (which key or node, expected vs found shape). Without ``weights`` the model
refuses to load: a stack may not serve random weights. ``random_weights_for_benchmarks`` = ``true`` (set only by
code, never from stack config) builds the seeded random model instead, whose answers do not depend on the image.

Parameters (``config.pbtxt``): ``weights``, ``random_weights_for_benchmarks``, ``output`` (nms|raw), ``precision``
(fp16|fp32), ``cuda_graphs`` (true|false), ``max_det``, ``nms_candidates``, ``conf``, ``iou``, ``torch_threads``,
``input`` (raw|jpeg), ``decode`` (auto|gpu|cpu), ``jpeg_decoder`` (exact|nvjpeg, default exact; any other value
fails initialize), ``decode_threads`` (frames of a batch decoded on the host at once; 4 on a GPU, 1 on a CPU
instance), ``max_frame_pixels``, ``max_frame_side``, ``frame_graphs`` (jpeg input on a GPU: the frame sizes,
``WxH,...`` or ``none``, whose lone frames run as one CUDA graph each: letterbox + model + NMS + boxes back, no
launches between them; default 1280x720,1920x1080,640x480), ``letterbox`` (jpeg input: ``square`` pads every frame
to 640×640, ``rect`` only to the next multiple of 32 around the resized frame, 1280×720 → 640×384, as Ultralytics'
``LetterBox(auto=True)``, which ``YOLO(checkpoint).predict`` uses for a checkpoint, state_dict or safetensors and a
dynamic ONNX export, while a static ONNX export gets 640×640; default what ``predict`` does with the artifact:
``rect`` for a checkpoint, state_dict, safetensors or dynamic ONNX export, ``square`` for a static ONNX export and
random weights; a batch of frames of several rect shapes runs one graph per shape: on the H200 (preset, through
nginx) rect serves 12 % more frames/s than square when a stream's frames share one size, 7–12 % fewer when every
batch mixes 1280×720 and 640×480, c=1 alike: bench/results/gpu_frames_rect_graphs_*.md), ``report_every`` (print
the mean time of each execute's phases every N executes to Triton's log, and the frames each decoder served, 0 =
never). At start each instance prints the GPU time of one graph replay per shape and batch size
(``gpuhost-graph-ms``). ``compile`` (GPU instances with ``cuda_graphs``): ``auto`` (default) compiles the model with
torch's inductor during initialize (on the H200 about a minute per instance, less once inductor's cache under /tmp
holds its kernels) and stays eager where that fails (no C compiler or Triton package beside the stub), ``inductor``
fails initialize instead, ``none`` never compiles; ``gpuhost-compile`` in Triton's log says which and why.
"""

import gc
import json
import os
import sys
import time
from contextlib import nullcontext as _nullcontext

import torch
import triton_python_backend_utils as pb_utils
from torch.utils import dlpack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import frames  # noqa: E402  (lies beside this file in the version directory)
import yolov8n as yolo  # noqa: E402
import yolov8n_weights  # noqa: E402


def _param(config, key, default):
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


def _invalid(message):
    """The client's mistake (HTTP 400, gRPC INVALID_ARGUMENT), where the backend knows error codes."""
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


def _decoded_family():
    """Triton's custom counter of JPEG frames by the decoder that served them (``/metrics``:
    ``gpuhost_frames_decoded_total{model, decoder}``); None where the python backend has no custom metrics."""
    family = getattr(pb_utils, "MetricFamily", None)
    if family is None:
        return None
    try:
        return family(
            name="gpuhost_frames_decoded_total",
            description="JPEG frames decoded, by the decoder that served them (nvjpeg, nvjpeg-planes, torchvision-cpu, "
            "pillow)",
            kind=family.COUNTER,
        )
    except Exception as e:  # noqa: BLE001 - an older backend: the execute report still counts them
        print(f"gpuhost-frames custom metrics unavailable: {type(e).__name__}: {e}", flush=True)
        return None


# Frame sizes (w×h) whose lone frames run as one CUDA graph each: what cameras and clients send (issue 26).
DEFAULT_FRAME_GRAPHS = "1280x720,1920x1080,640x480"


def _stop_compile_workers():
    """inductor's compile subprocesses (up to 32 per instance, each with torch imported) outlive the compile; once
    the graphs are captured nothing compiles again (``_net`` is the eager model), so they go now."""
    try:
        from torch._inductor.async_compile import shutdown_compile_workers

        shutdown_compile_workers()
    except Exception as e:  # noqa: BLE001 - a torch without it: its workers go idle on their own
        print(f"gpuhost-compile compile workers left running: {type(e).__name__}: {e}", flush=True)


# ``compile`` parameter: inductor where it works (auto), inductor or fail (inductor), never (none).
COMPILE_MODES = ("auto", "inductor", "none")


def graph_sizes(max_batch):
    """Batch sizes that get a CUDA graph: 1..8, then every multiple of 8 up to ``max_batch``."""
    return sorted({b for b in range(1, min(8, max_batch) + 1)} | set(range(8, max_batch + 1, 8)) | {max_batch})


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        gpu = self._settings(args, config)
        shape = self._input_setup(config, gpu)
        self._model_setup(config, gpu, shape)
        if gpu:
            self._gpu_setup(config)
        self._phases = [0.0, 0.0, 0.0]
        self._frames = 0
        self._executes = 0
        self._report_every = int(_param(config, "report_every", "0"))
        self._report_served = {}
        out_shapes = {n: t.shape[1:] for n, t in zip(self.outputs, self._forward(self.gpu_in[:1]))}
        self.host_out = {
            n: torch.empty((self.max_batch, *s), dtype=self._out_dtype(n), pin_memory=gpu)
            for n, s in out_shapes.items()
        }
        # Row views of the host outputs by (first, count): made once, not sliced again in every execute.
        self._rows = {}
        # What initialize built (torch, the model, the graphs: ~170,000 objects) leaves the collector's generations:
        # a full collection that falls in an execute would walk all of it (tens of ms on a fast core).
        gc.collect()
        gc.freeze()

    def _settings(self, args, config):
        """Names, batch, output mode, device and precision, NMS settings; True on a GPU instance."""
        self.name = args.get("model_instance_name", "?")
        self.model_name = args.get("model_name", "?")
        self.max_batch = max(1, int(config.get("max_batch_size", 0)))
        self.output_mode = _param(config, "output", "nms")
        torch.set_num_threads(int(_param(config, "torch_threads", "4")))
        gpu = args.get("model_instance_kind") == "GPU" and torch.cuda.is_available()
        self.device = torch.device(f"cuda:{args.get('model_instance_device_id', '0')}" if gpu else "cpu")
        self.dtype = torch.float16 if gpu and _param(config, "precision", "fp16") == "fp16" else torch.float32
        self.nms = dict(
            max_det=int(_param(config, "max_det", "100")),
            candidates=int(_param(config, "nms_candidates", "256")),
            conf=float(_param(config, "conf", "0.25")),
            iou=float(_param(config, "iou", "0.45")),
        )
        self.outputs = [o["name"] for o in config["output"]]
        self.input_name = config["input"][0]["name"]
        self.input_mode = _param(config, "input", "raw")
        self.compile_mode = _param(config, "compile", "auto")  # used on a GPU instance (``_gpu_setup``)
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"{self.name}: parameter compile: {self.compile_mode!r}; write auto, inductor or none")
        return gpu

    def _input_setup(self, config, gpu):
        """The model input's (H, W, C): 640×640×3 for JPEG frames (with their decoder, limits and metrics), else the
        config's dims."""
        if self.input_mode != "jpeg":
            return tuple(int(d) for d in config["input"][0]["dims"])
        # The frames nvJPEG cannot decode as libjpeg does go to libjpeg on the host: several at once in a batch.
        threads = int(_param(config, "decode_threads", str(min(4, os.cpu_count() or 1) if gpu else 1)))
        self.decoder = frames.Decoder(
            self.device,
            _param(config, "decode", "auto"),
            cpu_threads=threads,
            jpeg_decoder=_param(config, "jpeg_decoder", "exact"),
        )
        self.frame_limits = dict(
            max_pixels=int(_param(config, "max_frame_pixels", str(frames.MAX_PIXELS))),
            max_side=int(_param(config, "max_frame_side", str(frames.MAX_SIDE))),
        )
        self.geo = torch.zeros((self.max_batch, 6), dtype=torch.float32, pin_memory=gpu)
        self._decoded = _decoded_family()
        self._decoded_metrics = {}
        self._decoded_seen = {}
        started = {"instance": self.name, "decoder": self.decoder.name, "jpeg_decoder": self.decoder.jpeg_decoder}
        if self.decoder.planes_error:  # 4:2:0 / 4:2:2 frames then decode on the host (libjpeg)
            started["planes_error"] = self.decoder.planes_error
        if self.decoder.planes_info:
            started["planes"] = self.decoder.planes_info
        print(f"gpuhost-frames {json.dumps(started)}", flush=True)
        return frames.SIZE, frames.SIZE, 3

    def _model_setup(self, config, gpu, shape):
        """The weights into the fused model on the device, the letterbox mode, the input buffers, the frame sizes
        that get graphs."""
        self.artifact_format = "random"
        self.onnx_dynamic = False
        model = yolo.fuse(self._load(config)).to(self.device, self.dtype)
        self.rect = self._letterbox_mode(config) == "rect"
        if self.input_mode == "jpeg":
            print(f"gpuhost-letterbox {json.dumps({'instance': self.name, 'rect': self.rect})}", flush=True)
        self.model = model.to(memory_format=torch.channels_last) if gpu else model
        # What ``_forward`` runs: the model, or during a GPU instance's warm-up and captures its compiled form.
        self._net = self.model
        self.compiled = False
        self.pre = yolo.Preprocess(self.dtype)
        self.staging = torch.empty((self.max_batch, *shape), dtype=torch.uint8, pin_memory=gpu)
        self.gpu_in = torch.empty((self.max_batch, *shape), dtype=torch.uint8, device=self.device)
        self.in_shape = (int(shape[0]), int(shape[1]))
        self.buckets = graph_sizes(self.max_batch)
        # (H, W, batch) → graph and its outputs: the model (and NMS) on ``_slot(batch, (H, W))`` (``_gpu_setup``).
        self.graphs = {}
        self.graph_out = {}
        # (w, h) → (graph, its source frame buffer, its geometry, its outputs): a lone frame of a size here runs
        # letterbox, the model, NMS and the boxes' mapping back as one graph replay (``frames.letterboxed_forward``).
        self.frame_graphs = {}
        self.frame_sizes = (
            frames.frame_sizes(_param(config, "frame_graphs", DEFAULT_FRAME_GRAPHS))
            if self.input_mode == "jpeg"
            else []
        )

    def graph_shapes(self):
        """Input shapes (H, W) that get a graph per batch size: the model's input (640×640) and, for rect, the rect
        shape of each ``frame_graphs`` size (1280×720 and 1920×1080 → 384×640, 640×480 → 480×640)."""
        shapes = [self.in_shape]
        if self.input_mode == "jpeg" and self.rect:
            for fw, fh in self.frame_sizes:
                s = frames.letterbox_shape(fw, fh, rect=True)
                if s not in shapes:
                    shapes.append(s)
        return shapes

    def _gpu_setup(self, config):
        """Warm-up (and with ``compile`` inductor's compile of each graph shape), the batch graphs (``graph_shapes``
        × ``graph_sizes``, one shared memory pool), the decoder's warm-up and the lone-frame graphs; then cuDNN's
        autotuner off and the eager model back, so a shape without a graph runs eagerly with cuDNN's heuristics
        instead of tuning or compiling in a request's path."""
        torch.backends.cudnn.benchmark = True
        self.stream = torch.cuda.Stream(self.device)
        use_graphs = _param(config, "cuda_graphs", "true") == "true"
        sizes = self.buckets
        before = torch.cuda.memory_reserved(self.device)
        self.compiled = use_graphs and self.compile_mode != "none" and self._compile(self.compile_mode, sizes)
        with torch.cuda.stream(self.stream), torch.no_grad():
            if not self.compiled:  # a compile warms up as it goes
                self._warm_up(sizes)
            if use_graphs:
                # One pool for all of them: replays run one at a time on this stream and each answer is copied out
                # before the next replay, so their scratch may overlap (the largest graph's, not the sum).
                pool = torch.cuda.graph_pool_handle()
                for shape in self.graph_shapes():
                    for b in sizes:
                        g = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(g, pool=pool, stream=self.stream):
                            self.graph_out[(*shape, b)] = self._forward(self._slot(b, shape))
                        self.graphs[(*shape, b)] = g
        self.stream.synchronize()
        self._graph_mib = round((torch.cuda.memory_reserved(self.device) - before) / 2**20)
        self._report_graph_times()
        if self.input_mode == "jpeg":
            with torch.cuda.stream(self.stream), torch.no_grad():
                self.decoder.warm((1, min(8, self.max_batch)))
                if use_graphs:
                    for fw, fh in self.frame_sizes:
                        self.frame_graphs[(fw, fh)] = self._capture_frame(fw, fh)
            self.stream.synchronize()
        torch.backends.cudnn.benchmark = False
        self._net = self.model
        if self.compiled:
            _stop_compile_workers()

    def _warm_up(self, sizes):
        """Each graph shape at each batch size, three times: cuDNN's autotuner, lazy inits (and a compile) off the
        graphs."""
        for shape in self.graph_shapes():
            for b in sizes:
                for _ in range(3):
                    self._forward(self._slot(b, shape))
        self.stream.synchronize()

    def _compile(self, mode, sizes):
        """``compile`` = ``auto`` or ``inductor``: the model compiled by torch's inductor (convolutions stay cuDNN's,
        the element-wise work around them is fused: on the H200 one graph replay at batch 1 0.50 ms against 0.95
        eager, at batch 8 0.76–1.00 against 1.44–1.86, outputs bit-equal; bench/results/gpu_frames_compile_c244dfe.md),
        compiled here during warm-up: per graph shape once at batch 1 and once for batches 2..max_batch (the batch
        a dynamic dimension). True when it compiled; a failure (no C compiler or no Triton package in the
        stub's environment, an op inductor cannot take) fails initialize for ``inductor`` and leaves the model
        eager for ``auto``; both print ``gpuhost-compile`` to Triton's log."""
        import torch._dynamo as dynamo

        t0 = time.perf_counter()
        report = {"instance": self.name, "compile": mode}
        # Only the batch is dynamic (marked in ``_forward``): a new (H, W) is a static compile of its own. Two per
        # graph shape are expected; on the H200 three shapes took eight entries, torch's default limit (the anchor
        # cache, below), and the third shape's batches ran eagerly without a word (480×640 at batch 2..8 as slow as
        # eager). So: room to spare, a hard error at the limit (``auto`` then runs all of it eagerly and says so),
        # and the guards that failed printed to Triton's log while compiling.
        graphs = dynamo.utils.counters["stats"]["unique_graphs"]
        try:
            dynamo.config.automatic_dynamic_shapes = False
            dynamo.config.recompile_limit = max(int(dynamo.config.recompile_limit), 4 * len(self.graph_shapes()) + 8)
            dynamo.config.fail_on_recompile_limit_hit = True
            torch._logging.set_logs(recompiles=True)
            self._net = torch.compile(self.model, mode="default")
            with torch.cuda.stream(self.stream), torch.no_grad():
                # The head's anchors for every shape made eagerly first: a compiled call that adds a shape to their
                # cache changes the dict the earlier graphs guard on, and each shape compiled once more (H200: 9
                # graphs for the rect model's 3 shapes, 3 for square's 1).
                for shape in self.graph_shapes():
                    self.model(self.pre(self._slot(1, shape)))
                self._warm_up(sizes)
        except Exception as e:  # noqa: BLE001 - auto falls back to the eager model; inductor refuses below
            self._net = self.model
            dynamo.reset()
            report.update(compiled=False, error=f"{type(e).__name__}: {str(e)[:400]}")
            print(f"gpuhost-compile {json.dumps(report)}", flush=True)
            if mode == "inductor":
                raise RuntimeError(
                    f"{self.name}: compile inductor failed ({report['error']}); set the model's compile to auto "
                    "(eager where inductor fails) or none"
                ) from e
            return False
        finally:
            torch._logging.set_logs(recompiles=False)
        graphs = dynamo.utils.counters["stats"]["unique_graphs"] - graphs
        report.update(compiled=True, graphs=graphs, seconds=round(time.perf_counter() - t0, 1))
        print(f"gpuhost-compile {json.dumps(report)}", flush=True)
        return True

    def _load(self, config):
        """The model with the ``weights`` file's weights (eval, FP32, CPU); see the module docstring."""
        name = _param(config, "weights", "")
        if not name:
            if _param(config, "random_weights_for_benchmarks", "false") != "true":
                raise RuntimeError(
                    f"{self.name}: no weights: a stack may not serve random weights; give the model an artifact "
                    "(its YOLOv8n weights file: url or path, and sha256), which gpuhost ships as the 'weights' file"
                )
            torch.manual_seed(0)  # same model in every instance
            return yolo.YOLOv8n().eval()
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.path.basename(name))
        data = yolov8n_weights.read_artifact(path)  # a regular file of bounded size, read in chunks
        model = yolov8n_weights.load_model(data, trusted=True, what=path)
        self.artifact_format = yolov8n_weights.detect_format(data)
        self.onnx_dynamic = yolov8n_weights.onnx_dynamic(data)
        print(f"gpuhost-weights {json.dumps({'instance': self.name, 'file': path, 'bytes': len(data)})}", flush=True)
        return model

    def _letterbox_mode(self, config):
        """``letterbox`` parameter, else what ``YOLO(artifact).predict`` does with the artifact: ``rect`` for a
        checkpoint, state_dict, safetensors or dynamic ONNX export, ``square`` for a static ONNX export (its input
        is 640×640) and for random weights."""
        predicts_rect = self.artifact_format in ("torch", "safetensors") or self.onnx_dynamic
        mode = _param(config, "letterbox", "rect" if predicts_rect else "square")
        if mode not in ("square", "rect"):
            raise ValueError(f"{self.name}: parameter letterbox: {mode!r}; write square or rect")
        return mode

    def _slot(self, n, shape):
        """``gpu_in``'s first ``n`` frames viewed as [n, H, W, 3] (a rect shape fits in the 640×640 buffer)."""
        if tuple(shape) == tuple(self.gpu_in.shape[1:3]):
            return self.gpu_in[:n]
        return self.gpu_in.view(-1)[: n * shape[0] * shape[1] * 3].view(n, shape[0], shape[1], 3)

    def _report_graph_times(self):
        """GPU time of one graph replay per batch size (CUDA events, median of 20), printed to Triton's log:
        ``graph_ms`` at the model's input shape, ``rect_graph_ms`` per other shape, ``graph_pool_mib`` what
        warm-up and capture reserved on the device."""
        if not self.graphs:
            return
        times: dict = {}
        rect: dict = {}
        for (h, w, b), g in self.graphs.items():
            runs = []
            for _ in range(20):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                with torch.cuda.stream(self.stream):  # a replay goes to the current stream: the events' own
                    start.record(self.stream)
                    g.replay()
                    end.record(self.stream)
                end.synchronize()
                runs.append(start.elapsed_time(end))
            ms = round(sorted(runs)[len(runs) // 2], 3)
            if (h, w) == self.in_shape:
                times[b] = ms
            else:
                rect.setdefault(f"{h}x{w}", {})[b] = ms
        report = {"instance": self.name, "graph_ms": times, "graph_pool_mib": self._graph_mib}
        report["compiled"] = self.compiled
        if rect:
            report["rect_graph_ms"] = rect
        print("gpuhost-graph-ms " + json.dumps(report), flush=True)

    def _out_dtype(self, name):
        return torch.int32 if name == "num_detections" else (self.dtype if name == "output0" else torch.float32)

    @torch.no_grad()
    def _forward(self, images):
        x = self.pre(images)
        if self._net is not self.model and x.shape[0] > 1 and self.max_batch > 2:
            # One compile for batches 2..max_batch (1 is specialised by torch anyway).
            torch._dynamo.mark_dynamic(x, 0, min=2, max=self.max_batch)
        raw = self._net(x)
        if self.output_mode == "raw":
            return (raw,)
        det, count = yolo.fast_nms(raw, **self.nms)
        return det, count

    @torch.no_grad()
    def execute(self, requests):
        if self.input_mode == "jpeg":
            return self._execute_frames(requests)
        t0 = time.perf_counter()
        arrays = []
        for request in requests:
            t = pb_utils.get_input_tensor_by_name(request, self.input_name)
            arrays.append(dlpack.from_dlpack(t.to_dlpack()))
        total = sum(a.shape[0] for a in arrays)
        off = 0
        for a in arrays:
            self.staging[off : off + a.shape[0]].copy_(a)
            off += a.shape[0]
        t1 = time.perf_counter()
        if self.device.type == "cuda":
            with torch.cuda.stream(self.stream):
                self.gpu_in[:total].copy_(self.staging[:total], non_blocking=True)
                outs = self._run(total, self.in_shape)
                for name, t in zip(self.outputs, outs):
                    self.host_out[name][:total].copy_(t[:total], non_blocking=True)
            self.stream.synchronize()
        else:
            for name, t in zip(self.outputs, self._forward(self.staging[:total])):
                self.host_out[name][:total].copy_(t)
        t2 = time.perf_counter()
        responses = []
        off = 0
        for a in arrays:
            n = a.shape[0]
            tensors = [
                pb_utils.Tensor.from_dlpack(name, self.host_out[name][off : off + n].clone()) for name in self.outputs
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            off += n
        if self._report_every:
            self._account(t0, t1, t2, time.perf_counter(), frames=total)
        return responses

    def _run(self, total, shape):
        """The model on ``_slot(total, shape)``: the outputs (rows past ``total`` are padding), still on the device.

        A replay of the graph of the shape and the next captured batch size where there is one (``graph_shapes``),
        else eagerly (on a GPU with cuDNN's heuristics: ``_gpu_setup`` turned its autotuner off)."""
        if self.graphs:
            size = next(b for b in self.buckets if b >= total)
            graph = self.graphs.get((*shape, size))
            if graph is not None:
                graph.replay()
                return self.graph_out[(*shape, size)]
        return self._forward(self._slot(total, shape))

    def _capture_frame(self, w, h):
        """One CUDA graph of ``frames.letterboxed_forward`` for a w×h frame at batch 1 (warmed up eagerly first)."""
        src = torch.full((3, h, w), frames.PAD, dtype=torch.uint8, device=self.device)
        geo = torch.tensor([frames.geometry(w, h, rect=self.rect)], dtype=torch.float32, device=self.device)
        slot = self._slot(1, frames.letterbox_shape(w, h, rect=self.rect))

        def run():
            return frames.letterboxed_forward(src, slot, geo, self._forward)

        for _ in range(3):
            run()
        self.stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            outs = run()
        self.stream.synchronize()
        # Everything the graph reads must outlive it: a graph holds addresses, not tensors. ``geo`` once went out of
        # scope here, its block went back to the caching allocator and the next size's capture took it, so every
        # lone-frame graph mapped its boxes with the last size's geometry (on the H200 every lone 1280x720 and
        # 1920x1080 frame came back with boxes in another frame's pixels; bench/jpeg_diag.py).
        return graph, src, geo, outs, slot

    def _frames_forward(self, batch):
        """Decoded frames (on the device) → (detections in each frame's pixels, counts), still on the device.

        A lone frame: one replay of its size's graph (``frame_graphs``) after one copy into the graph's source
        buffer; on a CPU instance the same ``letterboxed_forward`` eagerly. Otherwise (a batch, or a size without a
        graph): per letterbox shape (one, 640×640, when square), ``letterbox_batch``, the model (the batch size's
        graph at 640×640), ``unletterbox``; the answers back in the batch's order."""
        total = len(batch)
        if total == 1:
            h, w = int(batch[0].shape[1]), int(batch[0].shape[2])
            captured = self.frame_graphs.get((w, h))
            if captured is not None:
                graph, src, _geo, outs, _slot_view = captured
                src.copy_(batch[0])
                graph.replay()
                return outs
            if self.device.type != "cuda":
                geo = torch.tensor([frames.geometry(w, h, rect=self.rect)], dtype=torch.float32)
                slot = self._slot(1, frames.letterbox_shape(w, h, rect=self.rect))
                return frames.letterboxed_forward(batch[0], slot, geo, self._forward)
        groups = frames.rect_groups(batch, rect=self.rect)
        if len(groups) == 1:
            return self._shape_forward(batch, next(iter(groups)), 0)
        dets, counts = [], []
        first = 0
        for shape, idx in groups.items():
            det, count = self._shape_forward([batch[i] for i in idx], shape, first)
            # Copied out before the next shape's forward reuses gpu_in and (at 640×640) the graph's outputs.
            dets.append(det[: len(idx)].clone())
            counts.append(count[: len(idx)].clone())
            first += len(idx)
        order = [i for idx in groups.values() for i in idx]
        back = torch.tensor(sorted(range(total), key=order.__getitem__))
        if self.device.type == "cuda":  # from pinned memory: a pageable copy would wait for the replays above
            back = back.pin_memory().to(self.device, non_blocking=True)
        return torch.cat(dets)[back], torch.cat(counts)[back]

    def _shape_forward(self, images, shape, first):
        """Frames that letterbox to one ``shape``: letterbox, the model, boxes back (geometry in ``self.geo`` from
        row ``first``)."""
        n = len(images)
        slot = self._slot(n, shape)
        self.geo[first : first + n] = torch.tensor(frames.letterbox_batch(images, slot, rect=self.rect))
        det, count = self._run(n, tuple(shape))
        geo = self.geo[first : first + n].to(self.device, non_blocking=True)
        return frames.unletterbox(det[:n], geo), count

    @torch.no_grad()
    def _execute_frames(self, requests):
        """JPEG frames: header checks, one batched decode, letterbox into ``gpu_in``, the model, boxes mapped back
        to each frame; a request with a bad frame gets its own error and takes no slot of the batch."""
        t0 = time.perf_counter()
        rows, owner, errors = [], [], {}
        for i, request in enumerate(requests):
            t = pb_utils.get_input_tensor_by_name(request, self.input_name)
            a = dlpack.from_dlpack(t.to_dlpack())
            if a.dim() != 2 or a.shape[1] == 0:
                errors[i] = f"images: want UINT8 [frames, bytes] (one JPEG frame per row), got {list(a.shape)}"
                continue
            for row in a:
                rows.append(row)
                owner.append(i)
        cuda = self.device.type == "cuda"
        slots: dict[int, list[int]] = {}
        with torch.cuda.stream(self.stream) if cuda else _nullcontext():
            images = frames.prepare(rows, self.decoder, **self.frame_limits)
            t_dec = time.perf_counter()
            self._count_decoded()
            for k, (i, img) in enumerate(zip(owner, images)):
                if isinstance(img, frames.FrameError) and i not in errors:
                    errors[i] = f"frame {k - owner.index(i)} of the request: {img}"
            batch: list = []
            for i, img in zip(owner, images):
                if i not in errors:
                    slots.setdefault(i, []).append(len(batch))
                    batch.append(img)
            total = len(batch)
            if total:
                det, count = self._frames_forward(batch)
                outs = {"detections": det, "num_detections": count}
                for name in self.outputs:
                    out = outs[name] if outs[name].shape[0] == total else outs[name][:total]
                    self._host_rows(name, 0, total).copy_(out, non_blocking=cuda)
            t1 = time.perf_counter()
        if cuda:
            self.stream.synchronize()
        t2 = time.perf_counter()
        responses = []
        for i in range(len(requests)):
            if i in errors:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=_invalid(errors[i])))
                continue
            first, n = slots[i][0], len(slots[i])
            tensors = [
                pb_utils.Tensor.from_dlpack(name, self._host_rows(name, first, n).clone()) for name in self.outputs
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        if self._report_every:
            self._account(t0, t_dec, t1, t2, time.perf_counter(), frames=total)
        return responses

    def _count_decoded(self):
        """The frames each decoder served since the last call, onto ``gpuhost_frames_decoded_total`` and the
        execute report (``frames.route`` sends a GPU instance's frames to nvJPEG or to libjpeg, frame by frame)."""
        for name, total in self.decoder.served.items():
            n = total - self._decoded_seen.get(name, 0)
            if not n:
                continue
            self._decoded_seen[name] = total
            if self._decoded is not None:
                metric = self._decoded_metrics.get(name)
                if metric is None:
                    labels = {"model": self.model_name, "decoder": name}
                    metric = self._decoded_metrics[name] = self._decoded.Metric(labels=labels)
                metric.increment(n)

    def _host_rows(self, name, first, n):
        """``host_out[name][first : first + n]``, the view made on first use (at most max_batch² of them)."""
        view = self._rows.get((name, first, n))
        if view is None:
            view = self._rows[(name, first, n)] = self.host_out[name][first : first + n]
        return view

    def _account(self, *marks, frames=0):
        """Mean ms per execute of each phase between ``marks`` (raw input: gather = DLPack + pinned staging, GPU =
        copies, graph, sync, respond; jpeg input: decode = header checks + the decoder's call, launch = letterbox,
        graph and copies issued (the host's share), GPU = the wait for them, respond), printed to Triton's log every
        ``report_every`` executes with the mean frames per execute."""
        names = ("decode", "launch", "gpu", "respond") if self.input_mode == "jpeg" else ("gather", "gpu", "respond")
        if len(self._phases) != len(names):
            self._phases = [0.0] * len(names)
        for i in range(len(names)):
            self._phases[i] += marks[i + 1] - marks[i]
        self._executes += 1
        self._frames += frames
        if self._executes == self._report_every:
            report = {"instance": self.name, "executes": self._executes, "input": self.input_mode}
            report.update({f"{n}_ms": round(x / self._executes * 1000, 3) for n, x in zip(names, self._phases)})
            report["frames_per_execute"] = round(self._frames / self._executes, 2)
            if self.input_mode == "jpeg":
                served = self.decoder.served
                report["decoded"] = {k: v - self._report_served.get(k, 0) for k, v in served.items()}
                self._report_served = dict(served)
            print("gpuhost-execute-ms " + json.dumps(report), flush=True)
            self._phases, self._executes, self._frames = [0.0] * len(names), 0, 0
