"""Triton python-backend model: seed 001's text-to-image generator at SDXL's shape (copied as
``<model>/<version>/model.py``, ``sdxl_generator.py`` beside it: ``serving/models/sdxl_generator.py``).

Inputs (per request, ``max_batch_size`` rows at most in one execute):

* ``prompt`` UINT8 [-1]: each row one UTF-8 prompt, zero-padded to the request's longest (ragged: requests of
  prompts of different lengths batch together); at most ``max_prompt_bytes`` bytes, no NUL. The gateway's front
  takes it as a KServe BYTES input and carries it this way (``serving/bytes_rows.py``);
* ``seed`` INT64 [1]: the starting noise of that row's image.

Output: ``image`` UINT8 [-1]: each row that image's PNG (``height`` × ``width`` RGB), zero-padded to the request's
longest (a PNG never ends with a zero byte). A request whose prompt is not UTF-8, holds a NUL or is too long fails
alone with a message (INVALID_ARG); the other requests of the batch are answered.

All the rows of an execute run as one batch: ``steps`` Euler steps of the UNet on 2 × rows (classifier-free
guidance at ``guidance``), one VAE decode, PNG encoding on the host. Tensors move through DLPack only, never
``as_numpy``/``Tensor(name, ndarray)``: with NumPy 2 beside the python backend's stub those read zeros and answer
0 bytes under HTTP 200.

Parameters (``config.pbtxt``): ``size`` (``sdxl``: SDXL base 1.0's UNet and VAE; ``tiny``: the same classes at a few
channels, for CPU tests), ``height``, ``width`` (multiples of 8), ``steps`` (default 30), ``guidance`` (default 5,
the seed's CFG), ``precision`` (fp16 on a GPU by default, fp32 on a CPU), ``weights_seed``, ``max_prompt_bytes``
(default 1024), ``png_level`` (zlib level, default 1), ``torch_threads`` (CPU instances, default 1),
``report_every`` (print the mean ms of each execute's phases every N executes to Triton's log; 0 never).
``random_weights_for_benchmarks`` must be ``true``: the weights are random (``sdxl_generator.py`` says why the cost is
SDXL's all the same), and without that word the model refuses to load. At start each instance runs one 1-step image
(the kernels' first use) and prints its time (``gpuhost-generator-warm``).
"""

import json
import os
import sys
import time

import torch
import triton_python_backend_utils as pb_utils
from torch.utils import dlpack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sdxl_generator as gen  # noqa: E402  (lies beside this file in the version directory)


def _param(config, key, default):
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


def _invalid(message):
    """The client's mistake (HTTP 400, gRPC INVALID_ARGUMENT), where the backend knows error codes."""
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


def prompt_of(row, max_bytes):
    """A request row (uint8 [L], CPU) as the prompt's text; ValueError naming what is wrong."""
    raw = bytes(row.numpy()).rstrip(b"\0")
    if len(raw) > max_bytes:
        raise ValueError(f"prompt: {len(raw)} bytes, over the model's {max_bytes}")
    if b"\0" in raw:
        raise ValueError("prompt: a NUL byte inside the prompt")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"prompt: not UTF-8 ({e.reason} at byte {e.start})") from None


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if _param(config, "random_weights_for_benchmarks", "false") != "true":
            raise pb_utils.TritonModelException(
                "sdxl_generator holds random weights: set random_weights_for_benchmarks=true to serve it (benchmarks "
                "and tests only)"
            )
        self.name = args.get("model_instance_name", "?")
        gpu = args.get("model_instance_kind") == "GPU" and torch.cuda.is_available()
        self.device = torch.device(f"cuda:{args.get('model_instance_device_id', '0')}" if gpu else "cpu")
        precision = _param(config, "precision", "fp16" if gpu else "fp32")
        dtype = torch.float16 if precision == "fp16" else torch.float32
        if not gpu:
            torch.set_num_threads(int(_param(config, "torch_threads", "1")))
        self.steps = int(_param(config, "steps", "30"))
        self.guidance = float(_param(config, "guidance", "5.0"))
        self.max_prompt = int(_param(config, "max_prompt_bytes", "1024"))
        self.png_level = int(_param(config, "png_level", "1"))
        self.max_batch = max(1, int(config.get("max_batch_size", 0)))
        self.generator = gen.Generator.build(
            _param(config, "size", "sdxl"),
            self.device,
            dtype,
            height=int(_param(config, "height", "1024")),
            width=int(_param(config, "width", "1024")),
            weights_seed=int(_param(config, "weights_seed", "0")),
        )
        self._report_every = int(_param(config, "report_every", "0"))
        self._phases, self._executes, self._images = [0.0, 0.0, 0.0], 0, 0
        t0 = time.perf_counter()
        self._generate(["warm-up"], [0], steps=1)  # the kernels' first use (cuBLAS, cuDNN, attention), off the clock
        ms = round((time.perf_counter() - t0) * 1000, 1)
        print("gpuhost-generator-warm " + json.dumps({"instance": self.name, "one_step_ms": ms}), flush=True)

    def _generate(self, prompts, seeds, steps=None):
        """PNG bytes of each (prompt, seed)."""
        images = self.generator(prompts, seeds, steps=steps or self.steps, guidance=self.guidance)
        host = images.cpu()
        return [gen.png_bytes(img, self.png_level) for img in host]

    @torch.no_grad()
    def execute(self, requests):
        t0 = time.perf_counter()
        prompts, seeds, owner, errors = [], [], [], {}
        for i, request in enumerate(requests):
            p = dlpack.from_dlpack(pb_utils.get_input_tensor_by_name(request, "prompt").to_dlpack())
            s = dlpack.from_dlpack(pb_utils.get_input_tensor_by_name(request, "seed").to_dlpack())
            if p.dim() != 2 or s.reshape(-1).shape[0] != p.shape[0]:
                errors[i] = f"prompt UINT8 [rows, bytes] and seed INT64 [rows, 1], got {list(p.shape)}, {list(s.shape)}"
                continue
            try:
                texts = [prompt_of(row.cpu(), self.max_prompt) for row in p]
            except ValueError as e:
                errors[i] = str(e)
                continue
            prompts += texts
            seeds += [int(x) for x in s.reshape(-1).cpu()]
            owner += [i] * len(texts)
        t1 = time.perf_counter()
        pngs = []
        for start in range(0, len(prompts), self.max_batch):  # one batch unless the requests hold more rows
            try:
                pngs += self._generate(prompts[start : start + self.max_batch], seeds[start : start + self.max_batch])
            except ValueError as e:
                for i in set(owner[start : start + self.max_batch]):
                    errors.setdefault(i, f"generator: {e}")
                pngs += [b""] * len(prompts[start : start + self.max_batch])
        t2 = time.perf_counter()
        responses = []
        for i in range(len(requests)):
            if i in errors:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=_invalid(errors[i])))
                continue
            mine = [png for png, o in zip(pngs, owner) if o == i]
            rows = torch.zeros((len(mine), max(len(x) for x in mine)), dtype=torch.uint8)
            for k, png in enumerate(mine):
                rows[k, : len(png)] = torch.frombuffer(bytearray(png), dtype=torch.uint8)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor.from_dlpack("image", rows)]))
        if self._report_every:
            self._account(t0, t1, t2, time.perf_counter(), images=len(prompts))
        return responses

    def _account(self, *marks, images=0):
        """Mean ms per execute of gather (DLPack, prompt checks), generate (GPU work + PNG) and respond, printed to
        Triton's log every ``report_every`` executes with the mean images per execute."""
        for k in range(3):
            self._phases[k] += marks[k + 1] - marks[k]
        self._executes += 1
        self._images += images
        if self._executes == self._report_every:
            report = {"instance": self.name, "executes": self._executes}
            names = ("gather", "generate", "respond")
            report.update({f"{n}_ms": round(x / self._executes * 1000, 3) for n, x in zip(names, self._phases)})
            report["images_per_execute"] = round(self._images / self._executes, 2)
            print("gpuhost-execute-ms " + json.dumps(report), flush=True)
            self._phases, self._executes, self._images = [0.0, 0.0, 0.0], 0, 0
