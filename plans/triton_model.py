"""Typed Triton model specs → ``config.pbtxt``, checked by Triton's own protobuf and its semantic rules.

A ``ModelSpec`` is built into tritonclient's ``model_config_pb2.ModelConfig`` message, printed with
protobuf ``text_format`` and parsed back (so a field Triton does not know cannot reach a guest), then
checked against the rules Triton applies when it loads a model (``validate``). Every error names the
field as a dotted path, e.g. ``dynamic_batching.preferred_batch_size[2]``.

Usage::

    spec = ModelSpec(
        name="yolov8n", platform="tensorrt_plan", max_batch_size=8,
        inputs=[Tensor(name="images", data_type="FP32", dims=[3, 640, 640])],
        outputs=[Tensor(name="output0", data_type="FP32", dims=[84, 8400])],
        instance_group=[InstanceGroup(kind="KIND_GPU", count=1, gpus=[0])],
        dynamic_batching=DynamicBatching(preferred_batch_size=[1, 2, 4, 8], max_queue_delay_microseconds=800),
    )
    text = render_config(spec, gpu_count=1)      # raises ModelConfigError naming the field
    message = parse_config(text)                 # ModelConfig protobuf (text_format.Parse)
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Literal, Optional

from google.protobuf import text_format
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from tritonclient.grpc import model_config_pb2 as pb

Platform = Literal["tensorrt_plan", "onnxruntime_onnx", "python"]
DataTypeName = Literal[
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "STRING",
    "BF16",
]


def _without_type_prefix(v: object) -> object:
    return v.removeprefix("TYPE_") if isinstance(v, str) else v


# Triton's own spelling (`TYPE_FP32`, as config.pbtxt writes it) is taken too.
DataType = Annotated[DataTypeName, BeforeValidator(_without_type_prefix)]
Kind = Literal["KIND_GPU", "KIND_CPU", "KIND_AUTO", "KIND_MODEL"]

# Model file Triton looks for in <model>/<version>/ per platform.
DEFAULT_MODEL_FILENAME = {"tensorrt_plan": "model.plan", "onnxruntime_onnx": "model.onnx", "python": "model.py"}


class ModelConfigError(ValueError):
    """A config Triton would reject; ``field`` is the dotted path of the offending field."""

    def __init__(self, model: str, field: str, message: str):
        self.model, self.field = model, field
        super().__init__(f"model {model!r}: {field}: {message}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Tensor(_Strict):
    name: str
    data_type: DataType
    dims: list[int]
    reshape: Optional[list[int]] = None
    optional: bool = False  # inputs only
    # Inputs only: requests whose variable dims differ still batch together (each request keeps its own shape).
    allow_ragged_batch: bool = False


class RateLimiterResource(_Strict):
    name: str
    count: int
    global_: bool = Field(False, alias="global")


class RateLimiter(_Strict):
    resources: list[RateLimiterResource] = []
    priority: int = 0


class InstanceGroup(_Strict):
    kind: Kind = "KIND_GPU"
    count: int = 1
    gpus: list[int] = []
    rate_limiter: Optional[RateLimiter] = None
    name: Optional[str] = None


class QueuePolicy(_Strict):
    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


class DynamicBatching(_Strict):
    preferred_batch_size: list[int] = []
    max_queue_delay_microseconds: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: Optional[QueuePolicy] = None
    priority_queue_policy: dict[int, QueuePolicy] = {}


class WarmupInput(_Strict):
    data_type: DataType
    dims: list[int]
    data: Literal["zero", "random"] = "zero"


class Warmup(_Strict):
    name: str
    batch_size: int = 1
    inputs: dict[str, WarmupInput]
    count: int = 1


class ModelSpec(_Strict):
    """One model of the repository. ``parameters`` become ``parameters { key value { string_value } }``."""

    name: str
    platform: Platform
    max_batch_size: int = 0
    inputs: list[Tensor]
    outputs: list[Tensor]
    instance_group: list[InstanceGroup] = [InstanceGroup()]
    dynamic_batching: Optional[DynamicBatching] = None
    response_cache: bool = False
    warmup: list[Warmup] = []
    parameters: dict[str, str] = {}
    version: int = 1
    # "low_latency" (queue window 500–1000 µs) or "diffusion" (2–6 ms), used by plans.presets.
    workload: Literal["low_latency", "diffusion", "throughput"] = "low_latency"


# ---------------------------------------------------------------- rendering


def to_message(spec: ModelSpec) -> pb.ModelConfig:
    """The ``ModelConfig`` protobuf for ``spec`` (no semantic checks)."""
    m = pb.ModelConfig(name=spec.name, max_batch_size=spec.max_batch_size)
    if spec.platform == "python":
        m.backend = "python"
    else:
        m.platform = spec.platform
    for t in spec.inputs:
        i = m.input.add(name=t.name, data_type=pb.DataType.Value("TYPE_" + t.data_type), dims=t.dims)
        if t.optional:
            i.optional = True
        if t.allow_ragged_batch:
            i.allow_ragged_batch = True
        if t.reshape is not None:
            i.reshape.shape.extend(t.reshape)
    for t in spec.outputs:
        o = m.output.add(name=t.name, data_type=pb.DataType.Value("TYPE_" + t.data_type), dims=t.dims)
        if t.reshape is not None:
            o.reshape.shape.extend(t.reshape)
    for g in spec.instance_group:
        ig = m.instance_group.add(kind=pb.ModelInstanceGroup.Kind.Value(g.kind), count=g.count, gpus=g.gpus)
        if g.name:
            ig.name = g.name
        if g.rate_limiter is not None:
            ig.rate_limiter.priority = g.rate_limiter.priority
            for r in g.rate_limiter.resources:
                res = ig.rate_limiter.resources.add(name=r.name, count=r.count)
                setattr(res, "global", r.global_)
    if spec.dynamic_batching is not None:
        d = spec.dynamic_batching
        db = m.dynamic_batching
        db.SetInParent()
        db.preferred_batch_size.extend(d.preferred_batch_size)
        db.max_queue_delay_microseconds = d.max_queue_delay_microseconds
        db.preserve_ordering = d.preserve_ordering
        db.priority_levels = d.priority_levels
        db.default_priority_level = d.default_priority_level
        if d.default_queue_policy is not None:
            _queue_policy(db.default_queue_policy, d.default_queue_policy)
        for level, policy in sorted(d.priority_queue_policy.items()):
            _queue_policy(db.priority_queue_policy[level], policy)
    if spec.response_cache:
        m.response_cache.enable = True
    for w in spec.warmup:
        mw = m.model_warmup.add(name=w.name, batch_size=w.batch_size, count=w.count)
        for input_name, wi in w.inputs.items():
            x = mw.inputs[input_name]
            x.data_type = pb.DataType.Value("TYPE_" + wi.data_type)
            x.dims.extend(wi.dims)
            if wi.data == "zero":
                x.zero_data = True
            else:
                x.random_data = True
    for k, v in sorted(spec.parameters.items()):
        m.parameters[k].string_value = v
    return m


def _queue_policy(target: pb.ModelQueuePolicy, policy: QueuePolicy) -> None:
    target.timeout_action = pb.ModelQueuePolicy.TimeoutAction.Value(policy.timeout_action)
    target.default_timeout_microseconds = policy.default_timeout_microseconds
    target.allow_timeout_override = policy.allow_timeout_override
    target.max_queue_size = policy.max_queue_size


def parse_config(text: str, model: str = "?") -> pb.ModelConfig:
    """Parse ``config.pbtxt`` text with Triton's ModelConfig; an unknown field raises ModelConfigError naming it."""
    try:
        return text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as e:
        raise ModelConfigError(model, _field_from_parse_error(str(e)), str(e)) from None


def _field_from_parse_error(message: str) -> str:
    # protobuf says e.g. '3:1 : Message type "inference.ModelConfig" has no field named "max_batch".'
    for marker in ('has no field named "', 'field named "'):
        if marker in message:
            return message.split(marker, 1)[1].split('"', 1)[0]
    return "config.pbtxt"


@lru_cache(maxsize=256)
def _parsed_back(text: str, model: str) -> pb.ModelConfig:
    """`parse_config` of a rendered text, once per text (a program renders each service's repository three times;
    the pure-Python text parser was the costliest part). Only compared against, never handed out."""
    return parse_config(text, model)


def render_config(spec: ModelSpec, *, gpu_count: int) -> str:
    """``config.pbtxt`` text for ``spec`` after ``validate``; parsed back with ModelConfig before returning."""
    validate(spec, gpu_count=gpu_count)
    message = to_message(spec)
    text = text_format.MessageToString(message)
    if _parsed_back(text, spec.name) != message:  # pragma: no cover - protobuf round trip guard
        raise ModelConfigError(spec.name, "config.pbtxt", "does not round-trip through ModelConfig")
    return text


# ---------------------------------------------------------------- Triton's semantic rules


def validate(spec: ModelSpec, *, gpu_count: int) -> None:
    """Raise ``ModelConfigError`` for what Triton would refuse at load time (or what cannot run on this host).

    Args:
      spec: the model.
      gpu_count: GPUs visible where Triton will run (0 on a CPU-only host; a MIG slice counts as one).
    """
    errors = problems(spec, gpu_count=gpu_count)
    if errors:
        field, message = errors[0]
        raise ModelConfigError(spec.name, field, message)


Problems = list[tuple[str, str]]  # (dotted field, message)


def problems(spec: ModelSpec, *, gpu_count: int) -> Problems:
    """Every rule violation as (field, message); empty when Triton would load the config."""
    return [
        *_top_level_problems(spec),
        *_tensor_problems("input", spec.inputs),
        *_tensor_problems("output", spec.outputs),
        *_instance_group_problems(spec, gpu_count),
        *_dynamic_batching_problems(spec),
        *_warmup_problems(spec),
        *[("parameters", "empty key") for k in spec.parameters if not k],
    ]


def _top_level_problems(spec: ModelSpec) -> Problems:
    out = []
    if not spec.name or "/" in spec.name:
        out.append(("name", "must be a non-empty directory name"))
    if spec.max_batch_size < 0:
        out.append(("max_batch_size", "must be >= 0"))
    if spec.version < 1:
        out.append(("version", "must be >= 1"))
    if not spec.inputs:
        out.append(("input", "a model needs at least one input"))
    if not spec.outputs:
        out.append(("output", "a model needs at least one output"))
    return out


def _tensor_problems(kind: str, tensors: list[Tensor]) -> Problems:
    """Names unique and set, dims sizes or -1, reshape keeping the element count; ragged and optional inputs only."""
    out = []
    seen: set[str] = set()
    for i, t in enumerate(tensors):
        where = f"{kind}[{i}]"
        if not t.name:
            out.append((f"{where}.name", "must not be empty"))
        if t.name in seen:
            out.append((f"{where}.name", f"duplicate {kind} name {t.name!r}"))
        seen.add(t.name)
        if not t.dims and t.reshape is None:
            out.append((f"{where}.dims", "must list at least one dimension (or give reshape)"))
        for j, dim in enumerate(t.dims):
            if dim == 0 or dim < -1:
                out.append((f"{where}.dims[{j}]", f"{dim} is not a size (>= 1) or -1 (variable)"))
        if t.reshape is not None and -1 not in t.dims and -1 not in t.reshape:
            if _prod(t.dims) != _prod(t.reshape):
                out.append((f"{where}.reshape", f"{t.reshape} has a different element count than dims {t.dims}"))
        if kind == "output" and t.optional:
            out.append((f"{where}.optional", "only inputs can be optional"))
        if kind == "output" and t.allow_ragged_batch:
            out.append((f"{where}.allow_ragged_batch", "only inputs can be ragged"))
    return out


def _instance_group_problems(spec: ModelSpec, gpu_count: int) -> Problems:
    """Counts, GPUs that exist (and only in KIND_GPU groups), TensorRT on a GPU, rate-limiter resources."""
    out = []
    for i, g in enumerate(spec.instance_group):
        where = f"instance_group[{i}]"
        if g.count < 1:
            out.append((f"{where}.count", "must be >= 1"))
        if g.kind == "KIND_GPU":
            if gpu_count == 0:
                out.append((f"{where}.kind", "KIND_GPU but the host has no GPU (use KIND_CPU or give the guest a GPU)"))
            for j, gpu in enumerate(g.gpus):
                if gpu < 0 or gpu >= gpu_count:
                    out.append((f"{where}.gpus[{j}]", f"GPU {gpu} does not exist (host has {gpu_count})"))
        elif g.gpus:
            out.append((f"{where}.gpus", f"only KIND_GPU groups may name GPUs, this one is {g.kind}"))
        if spec.platform == "tensorrt_plan" and g.kind == "KIND_CPU":
            out.append((f"{where}.kind", "a TensorRT plan runs only on a GPU (KIND_GPU)"))
        if g.rate_limiter is not None:
            for j, r in enumerate(g.rate_limiter.resources):
                if r.count < 0:
                    out.append((f"{where}.rate_limiter.resources[{j}].count", "must be >= 0"))
    return out


def _dynamic_batching_problems(spec: ModelSpec) -> Problems:
    """The batcher needs a batching model; preferred sizes within 1..max_batch_size, once each; then priorities
    and queue policies."""
    d = spec.dynamic_batching
    if d is None:
        return []
    out = []
    if spec.max_batch_size == 0:
        out.append(("dynamic_batching", "needs max_batch_size > 0 (the model does not batch)"))
    for j, p in enumerate(d.preferred_batch_size):
        if p < 1:
            out.append((f"dynamic_batching.preferred_batch_size[{j}]", "must be >= 1"))
        elif spec.max_batch_size and p > spec.max_batch_size:
            out.append(
                (
                    f"dynamic_batching.preferred_batch_size[{j}]",
                    f"{p} is larger than max_batch_size {spec.max_batch_size}",
                )
            )
    if len(set(d.preferred_batch_size)) != len(d.preferred_batch_size):
        out.append(("dynamic_batching.preferred_batch_size", "lists a size twice"))
    if d.max_queue_delay_microseconds < 0:
        out.append(("dynamic_batching.max_queue_delay_microseconds", "must be >= 0"))
    return out + _priority_problems(d) + _queue_policy_problems(d)


def _priority_problems(d: DynamicBatching) -> Problems:
    out = []
    if d.priority_levels < 0:
        out.append(("dynamic_batching.priority_levels", "must be >= 0"))
    if d.priority_levels:
        if not 1 <= d.default_priority_level <= d.priority_levels:
            out.append(
                (
                    "dynamic_batching.default_priority_level",
                    f"must be within 1..{d.priority_levels} when priority_levels is set",
                )
            )
        if d.preserve_ordering:
            # Priority queues reorder requests by design; Triton cannot honour both.
            out.append(("dynamic_batching.preserve_ordering", "cannot be combined with priority_levels"))
    elif d.default_priority_level:
        out.append(("dynamic_batching.default_priority_level", "set but priority_levels is 0"))
    for level in d.priority_queue_policy:
        if not 1 <= level <= d.priority_levels:
            out.append(
                (
                    f"dynamic_batching.priority_queue_policy[{level}]",
                    f"priority level {level} is outside 1..{d.priority_levels}",
                )
            )
    return out


def _queue_policy_problems(d: DynamicBatching) -> Problems:
    out = []
    for label, policy in [
        ("default_queue_policy", d.default_queue_policy),
        *((f"priority_queue_policy[{k}]", v) for k, v in d.priority_queue_policy.items()),
    ]:
        if policy is None:
            continue
        if policy.max_queue_size < 0:
            out.append((f"dynamic_batching.{label}.max_queue_size", "must be >= 0"))
        if policy.default_timeout_microseconds < 0:
            out.append((f"dynamic_batching.{label}.default_timeout_microseconds", "must be >= 0"))
    return out


def _warmup_problems(spec: ModelSpec) -> Problems:
    """Each warmup sample: a batch size the model takes, a count, and concrete data for every required input."""
    out = []
    inputs = {t.name: t for t in spec.inputs}
    for i, w in enumerate(spec.warmup):
        where = f"model_warmup[{i}]"
        if w.batch_size < 1 or w.batch_size > max(1, spec.max_batch_size):
            out.append((f"{where}.batch_size", f"must be within 1..{max(1, spec.max_batch_size)}"))
        if w.count < 1:
            out.append((f"{where}.count", "must be >= 1"))
        for name, wi in w.inputs.items():
            if name not in inputs:
                out.append((f"{where}.inputs[{name}]", "is not an input of the model"))
                continue
            if wi.data_type != inputs[name].data_type:
                out.append(
                    (f"{where}.inputs[{name}].data_type", f"{wi.data_type} but the input is {inputs[name].data_type}")
                )
            if any(x < 1 for x in wi.dims):
                out.append((f"{where}.inputs[{name}].dims", "warmup needs concrete sizes (no -1)"))
        for name, t in inputs.items():
            if name not in w.inputs and not t.optional:
                out.append((f"{where}.inputs", f"misses required input {name!r}"))
    return out


def _prod(xs: list[int]) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def needs_rate_limit(specs: list[ModelSpec]) -> bool:
    """True when an instance group declares rate-limiter resources (server needs ``--rate-limit=execution_count``)."""
    return any(g.rate_limiter is not None and g.rate_limiter.resources for s in specs for g in s.instance_group)


def needs_response_cache(specs: list[ModelSpec]) -> bool:
    """True when a model enables ``response_cache`` (server needs ``--cache-config``)."""
    return any(s.response_cache for s in specs)
