"""Model repository plan: specs in → files (path → bytes) out; plus the seeds' models and CPU stand-ins.

``repository_files`` renders every ``<model>/config.pbtxt`` (validated, see ``plans.triton_model``)
and names the model file each version directory must hold; the model binaries themselves (plans,
ONNX files) come from the engine build (``plans.triton_engine``) or are uploaded as given.
``standin`` turns a real model into a python-backend model with the same inputs, outputs, batching
and instance count on CPU, so a real Triton can load the repository where no GPU exists.

Usage::

    files = repository_files([yolov8n(), resnet50_fp16(), sdxl()], gpu_count=1)
    files["yolov8n/config.pbtxt"]            # bytes
    cpu = [standin(s, sleep_ms=2) for s in (yolov8n(), resnet50_fp16(), sdxl())]
    files = repository_files(cpu, gpu_count=0, model_py=Path("serving/standin_model.py").read_bytes())
"""

from __future__ import annotations

import hashlib
import posixpath
from typing import Optional

from access.shell import sh
from facts.files import FileState
from plans.plan import Action, FileWrite, Plan, plan_of
from plans.triton_model import (
    DEFAULT_MODEL_FILENAME,
    DynamicBatching,
    InstanceGroup,
    ModelSpec,
    Tensor,
    Warmup,
    WarmupInput,
    render_config,
)


def repository_files(
    specs: list[ModelSpec],
    *,
    gpu_count: int,
    model_py: Optional[bytes] = None,
    model_files: Optional[dict[str, bytes]] = None,
) -> dict[str, bytes]:
    """Relative path → content for the whole repository.

    Args:
      specs: the models; names must be unique.
      gpu_count: GPUs where Triton runs (KIND_GPU needs > 0).
      model_py: content of ``<model>/<version>/model.py`` for python-backend models that have no entry
        in ``model_files``.
      model_files: extra files by relative path (e.g. ``"yolov8n/1/model.plan"``).
    """
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"model names must be unique in a repository: {dupes}")
    files: dict[str, bytes] = {}
    for spec in specs:
        files[f"{spec.name}/config.pbtxt"] = render_config(spec, gpu_count=gpu_count).encode()
        model_path = f"{spec.name}/{spec.version}/{DEFAULT_MODEL_FILENAME[spec.platform]}"
        if spec.platform == "python" and model_py is not None:
            files[model_path] = model_py
    for path, content in (model_files or {}).items():
        files[path] = content
    return files


def repository_digest(files: dict[str, bytes]) -> str:
    """sha256 over paths and contents, so a preview shows one input change when any file changes."""
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return h.hexdigest()


def repository_dirs(root: str, paths: list[str]) -> list[str]:
    """The root and every directory between it and each file (parents first), as absolute paths."""
    out = {root}
    for p in paths:
        d = posixpath.dirname(posixpath.join(root, p))
        while d.startswith(root) and d != root:
            out.add(d)
            d = posixpath.dirname(d)
    return sorted(out, key=lambda d: (d.count("/"), d))


def plan_repository(root: str, wanted: dict[str, bytes], current: dict[str, FileState]) -> Plan:
    """Write the files whose content (or mode) differs from the host's; their directories first. Facts in:
    `current` maps each relative path to its FileState on the host."""
    stale = []
    for p, content in sorted(wanted.items()):
        st = current.get(p)
        if st is None or not st.exists or st.content != content or (st.mode or "").zfill(4) != "0644":
            stale.append((p, content, "new" if st is None or not st.exists else "changed"))
    dirs = sorted({posixpath.dirname(posixpath.join(root, p)) for p, _, _ in stale})
    actions = [Action("create the repository's directories", sh("mkdir", "-p", "--", *dirs))] if dirs else []
    actions += [
        Action(f"write {p} ({why}, {len(c)} bytes)", write=FileWrite(posixpath.join(root, p), c, "0644", "0:0"))
        for p, c, why in stale
    ]
    return plan_of(actions, f"every file of the repository under {root} already has its content")


def standin(spec: ModelSpec, *, sleep_ms: float = 0.0) -> ModelSpec:
    """A python-backend CPU model with ``spec``'s I/O signature, batching and instance count.

    GPU-only settings are mapped to CPU: instance groups become KIND_CPU with the same count,
    GPU-only parameters (EXECUTION_ENV_PATH) are dropped, and ``sleep_ms`` is what each batch costs.
    """
    groups = [
        InstanceGroup(kind="KIND_CPU", count=g.count, rate_limiter=g.rate_limiter, name=g.name)
        for g in spec.instance_group
    ]
    params = {k: v for k, v in spec.parameters.items() if k != "EXECUTION_ENV_PATH"}
    params["sleep_ms"] = repr(float(sleep_ms))
    params["standin_for"] = spec.platform
    return spec.model_copy(update={"platform": "python", "instance_group": groups, "parameters": params})


# ---------------------------------------------------------------- the seeds' models


def yolov8n(max_batch_size: int = 8) -> ModelSpec:
    """YOLOv8n 640×640 TensorRT plan (seed 000 §6–7): ``images`` FP32 [3,640,640] → ``output0`` FP32 [84,8400]."""
    return ModelSpec(
        name="yolov8n",
        platform="tensorrt_plan",
        max_batch_size=max_batch_size,
        inputs=[Tensor(name="images", data_type="FP32", dims=[3, 640, 640])],
        outputs=[Tensor(name="output0", data_type="FP32", dims=[84, 8400])],
        instance_group=[InstanceGroup(kind="KIND_GPU", count=1, gpus=[0])],
        dynamic_batching=DynamicBatching(
            preferred_batch_size=[b for b in (1, 2, 4, 8) if b <= max_batch_size], max_queue_delay_microseconds=1000
        ),
        warmup=[
            Warmup(name="zeros", batch_size=1, inputs={"images": WarmupInput(data_type="FP32", dims=[3, 640, 640])})
        ],
    )


def resnet50_fp16(max_batch_size: int = 8) -> ModelSpec:
    """ResNet50 FP16 TensorRT plan (seed 004): ``input`` FP16 [3,224,224] → ``logits`` FP16 [1000].

    No response cache: with it on, Triton 2.51 exports no ``nv_inference_request_summary_us`` for the model, so the
    p95 alert and the latency panels would read nothing, and the gate's identical requests would time cache hits
    (tests/test_serving_metrics_live.py shows both).
    """
    return ModelSpec(
        name="resnet50_fp16",
        platform="tensorrt_plan",
        max_batch_size=max_batch_size,
        inputs=[Tensor(name="input", data_type="FP16", dims=[3, 224, 224])],
        outputs=[Tensor(name="logits", data_type="FP16", dims=[1000])],
        instance_group=[InstanceGroup(kind="KIND_GPU", count=2, gpus=[0])],
        dynamic_batching=DynamicBatching(
            preferred_batch_size=[b for b in (1, 2, 4, 8) if b <= max_batch_size], max_queue_delay_microseconds=800
        ),
    )


def sdxl(height: int = 1024, width: int = 1024) -> ModelSpec:
    """SDXL text-to-image python-backend pipeline (seed 001 §4.4): batch ≤ 2, 4 ms window, 2 instances.

    Inputs: ``prompt`` STRING [1], optional ``negative_prompt`` STRING [1], ``seed`` INT64 [1],
    ``steps`` INT32 [1], ``guidance_scale`` FP32 [1]; output ``image`` UINT8 [H,W,3].
    """
    return ModelSpec(
        name="sdxl",
        platform="python",
        max_batch_size=2,
        inputs=[
            Tensor(name="prompt", data_type="STRING", dims=[1]),
            Tensor(name="negative_prompt", data_type="STRING", dims=[1], optional=True),
            Tensor(name="seed", data_type="INT64", dims=[1]),
            Tensor(name="steps", data_type="INT32", dims=[1]),
            Tensor(name="guidance_scale", data_type="FP32", dims=[1]),
        ],
        outputs=[Tensor(name="image", data_type="UINT8", dims=[height, width, 3])],
        instance_group=[InstanceGroup(kind="KIND_GPU", count=2)],
        dynamic_batching=DynamicBatching(preferred_batch_size=[1, 2], max_queue_delay_microseconds=4000),
        parameters={"EXECUTION_ENV_PATH": "/opt/tritonserver/backends/python"},
        workload="diffusion",
    )


def yolov8n_torch(
    *,
    name: str = "yolov8n",
    output: str = "nms",
    max_batch_size: Optional[int] = None,
    instances: Optional[int] = None,
    window_us: Optional[int] = None,
    preferred_batch_size: Optional[list[int]] = None,
    gpu: bool = True,
    max_det: int = 100,
    input: str = "raw",
    jpeg_decoder: str = "exact",
    compile: str = "auto",
    weights: Optional[str] = None,
    random_weights_for_benchmarks: bool = False,
) -> ModelSpec:
    """YOLOv8n 640×640 on the python backend's fast path (``serving/yolov8n_model.py``), where no TensorRT is.

    ``input="jpeg"`` (what stack config gives new services, ``ServiceModel.input``): ``images`` UINT8 [-1], one
    encoded JPEG frame of any size per row (ragged: frames of different lengths batch together), decoded and
    letterboxed on the GPU, boxes answered in the frame's own pixels (``serving/models/frames.py``);
    ``input="raw"``: ``images`` UINT8 [640, 640, 3] (NHWC, RGB, letterboxed by the client, boxes in that 640×640
    space; 1.2 MB per frame on the wire). ``jpeg_decoder`` (jpeg input, ``ServiceModel.jpeg_decoder``): ``exact``
    (the model's default, no parameter written) decodes each frame to libjpeg's pixels, ``nvjpeg`` (the
    ``jpeg_decoder`` parameter) gives nvJPEG every frame it can decode on a GPU (``frames.route``). ``compile``
    (``ServiceModel.compile``, GPU only): ``auto`` (the model's default, no parameter written) compiles the model with
    torch's inductor where the stub's environment can and runs eagerly where not, ``inductor`` fails the load where
    it cannot, ``none`` never compiles.
    ``output="nms"``: ``detections`` FP32 [max_det, 6] (x1 y1 x2 y2 score class) and ``num_detections``
    INT32 [1], NMS on the GPU inside the CUDA graph; ``output="raw"``: ``output0`` [84, 8400] (FP16 on a
    GPU). ``window_us`` is the dynamic batcher's ``max_queue_delay_microseconds`` (0 still batches what is
    queued). ``max_batch_size``, ``instances`` and ``window_us`` left out are defaults (8, 2, 0 µs) that the
    GPU's preset replaces (``plans.presets.apply_preset``); given, they win over it. ``gpu=False`` gives the
    CPU form (FP32, KIND_CPU) for hosts without a GPU. The ``model_code`` parameter tells the repository
    which code to ship beside ``config.pbtxt`` (``serving.models.yolov8n_files``).

    ``weights`` names the weights file in the version directory (an Ultralytics ONNX export or checkpoint, a
    state_dict or safetensors: ``serving/models/yolov8n_weights.py``); a stack ships its ``artifact`` there.
    Without it the backend refuses to load, unless ``random_weights_for_benchmarks`` (never reachable from stack
    config) asks for the seeded random model, whose answers do not depend on the image.
    """
    _check_yolov8n_torch(output, input, jpeg_decoder, compile, gpu)
    batch = 8 if max_batch_size is None else max_batch_size
    preferred = (
        preferred_batch_size if preferred_batch_size is not None else [b for b in (1, 2, 4, 8, 16, 32) if b <= batch]
    )
    spec = ModelSpec(
        name=name,
        platform="python",
        max_batch_size=batch,
        inputs=[_yolov8n_image(input)],
        outputs=_yolov8n_outputs(output, gpu, max_det),
        instance_group=[InstanceGroup(kind="KIND_GPU" if gpu else "KIND_CPU", count=instances or 2)],
        dynamic_batching=DynamicBatching(preferred_batch_size=preferred, max_queue_delay_microseconds=window_us or 0),
        parameters={
            "model_code": "yolov8n",
            "output": output,
            "precision": "fp16" if gpu else "fp32",
            "cuda_graphs": "true" if gpu else "false",
            "max_det": str(max_det),
            "input": input,
            # exact is the model's own default: left out, so a stack that does not choose keeps its config.pbtxt.
            **({"jpeg_decoder": jpeg_decoder} if jpeg_decoder != "exact" else {}),
            **({"compile": compile} if compile != "auto" else {}),
            **({"weights": weights} if weights else {}),
            **({"random_weights_for_benchmarks": "true"} if random_weights_for_benchmarks else {}),
        },
    )
    # Defaults the caller did not choose stay open for the GPU's preset.
    for field, given in (
        ("max_batch_size", max_batch_size),
        ("instance_group", instances),
        ("dynamic_batching", window_us),
    ):
        if given is None:
            spec.model_fields_set.discard(field)
    return spec


# The backend's own lists (``serving/models/frames.py``'s JPEG_DECODERS, ``serving/yolov8n_model.py``'s
# COMPILE_MODES: shipped alone into the repository, they import nothing from here) and the stack schema's Literals;
# tests/test_yolov8n.py checks that all three agree.
JPEG_DECODERS = ("exact", "nvjpeg")
COMPILE_MODES = ("auto", "inductor", "none")


def compiles_at_load(spec: ModelSpec) -> bool:
    """Whether Triton's load of ``spec`` compiles it: yolov8n_torch on GPU instances with ``compile`` auto (no
    parameter written) or inductor. Such a load takes minutes, not seconds (H200, 16 CPUs, empty cache: 111–167 s an
    instance, nine instances ready in 132–192 s), which the acceptance gate's wait for readiness must allow for."""
    p = spec.parameters
    on_gpu = any(g.kind == "KIND_GPU" for g in spec.instance_group)
    return p.get("model_code") == "yolov8n" and on_gpu and p.get("compile", "auto") != "none"


def _check_yolov8n_torch(output: str, input: str, jpeg_decoder: str, compile: str, gpu: bool) -> None:
    if output not in ("nms", "raw"):
        raise ValueError(f"output must be 'nms' or 'raw', not {output!r}")
    if input not in ("jpeg", "raw"):
        raise ValueError(f"input must be 'jpeg' or 'raw', not {input!r}")
    if input == "jpeg" and output != "nms":
        raise ValueError("input 'jpeg' answers boxes in the frame's pixels: it needs output 'nms'")
    if jpeg_decoder not in JPEG_DECODERS or (jpeg_decoder != "exact" and input != "jpeg"):
        raise ValueError(f"jpeg_decoder must be 'exact' or 'nvjpeg' (nvjpeg with input 'jpeg'), not {jpeg_decoder!r}")
    if compile not in COMPILE_MODES or (compile != "auto" and not gpu):
        raise ValueError(f"compile must be 'auto', 'inductor' or 'none' (a GPU model's), not {compile!r}")


def _yolov8n_image(input: str) -> Tensor:
    """``images``: one encoded JPEG per row (ragged), or one letterboxed 640×640 RGB frame (NHWC)."""
    if input == "jpeg":
        return Tensor(name="images", data_type="UINT8", dims=[-1], allow_ragged_batch=True)
    return Tensor(name="images", data_type="UINT8", dims=[640, 640, 3])


def _yolov8n_outputs(output: str, gpu: bool, max_det: int) -> list[Tensor]:
    """Boxes after NMS (``detections``, ``num_detections``), or the raw head ``output0`` (FP16 on a GPU)."""
    if output == "nms":
        return [
            Tensor(name="detections", data_type="FP32", dims=[max_det, 6]),
            Tensor(name="num_detections", data_type="INT32", dims=[1]),
        ]
    return [Tensor(name="output0", data_type="FP16" if gpu else "FP32", dims=[84, 8400])]


def sdxl_generator(
    *,
    name: str = "sdxl_generator",
    size: str = "sdxl",
    gpu: bool = True,
    instances: int = 1,
    max_batch_size: int = 2,
    window_us: int = 4000,
    height: int = 1024,
    width: int = 1024,
    steps: int = 30,
    max_prompt_bytes: int = 1024,
) -> ModelSpec:
    """Seed 001's generator at SDXL's shape with random weights (``serving/sdxl_generator_model.py``; benchmarks
    and tests only: ``random_weights_for_benchmarks`` is set, so no stack serves it): ``prompt`` UINT8 [-1] (a
    UTF-8 prompt a row, zero-padded; ragged) and ``seed`` INT64 [1] → ``image`` UINT8 [-1] (a PNG a row). The
    gateway's front takes the prompt and answers the image as KServe BYTES (``serving/bytes_rows.py``).
    ``size="tiny"`` is the same code at a few channels (CPU tests: 64×64, 1–2 steps). The batching is the seed's:
    batch ≤ 2, a 4 ms window (seed 001 §4.4)."""
    return ModelSpec(
        name=name,
        platform="python",
        max_batch_size=max_batch_size,
        inputs=[
            Tensor(name="prompt", data_type="UINT8", dims=[-1], allow_ragged_batch=True),
            Tensor(name="seed", data_type="INT64", dims=[1]),
        ],
        outputs=[Tensor(name="image", data_type="UINT8", dims=[-1])],
        instance_group=[InstanceGroup(kind="KIND_GPU" if gpu else "KIND_CPU", count=instances)],
        dynamic_batching=DynamicBatching(
            preferred_batch_size=[b for b in (1, 2, 4, 8) if b <= max_batch_size],
            max_queue_delay_microseconds=window_us,
        ),
        parameters={
            "model_code": "sdxl_generator",
            "size": size,
            "height": str(height),
            "width": str(width),
            "steps": str(steps),
            "precision": "fp16" if gpu else "fp32",
            "max_prompt_bytes": str(max_prompt_bytes),
            "random_weights_for_benchmarks": "true",
        },
        workload="diffusion",
    )


def sdxl_generator_front(spec: ModelSpec) -> dict:
    """The gateway front's signature of an ``sdxl_generator`` model (``serving.front.ModelSig.from_dict``): the
    prompt as KServe BYTES [1] a row, at most the model's ``max_prompt_bytes``, the seed INT64 [1], and the image
    answered as BYTES (a PNG); inside they travel as the model's UINT8 rows."""
    return {
        "max_batch_size": spec.max_batch_size,
        "inputs": [
            {"name": "prompt", "datatype": "BYTES", "dims": [1], "max_bytes": int(spec.parameters["max_prompt_bytes"])},
            {"name": "seed", "datatype": "INT64", "dims": [1]},
        ],
        "outputs": [{"name": "image", "datatype": "BYTES"}],
    }
