"""Per-GPU Triton presets from the seeds, applied under what a model spec says itself.

Seed 004 (A10/L40S): L40S takes bigger preferred batches (2/4/8/16) with fewer instances (2); A10
smaller batches (1/2/4) with more instances (3); the queue window starts at 500–1000 µs for low
latency. Seed 001 (SDXL): diffusion batches are 1–2, the window 2–6 ms, 2 instances per MIG instance
or GPU when memory allows (1 when it is tight); 4090s run 2–3 instances under CUDA MPS with the
active thread percentage split between them (60/40 or 50/50). Seed 000: low-latency windows stay
≤ 2 ms. A100 sits between, with MIG available.

H100/H200 low latency is measured (issue 18, ``python -m bench.gpu`` on an H200, YOLOv8n 640×640 through
nginx and the gate, docs/benchmarks.md): batches past 8 are rarely formed at concurrency ≤ 16 (a batch of 8
already takes the GPU only 2.1 ms, 0.26 ms per image), so max batch 8; a 200 µs window gives +12 % images/s at
concurrency 16 for +1.5 ms p95 and moves p95 at concurrency 1 by 0.1 ms (a lone request is a preferred batch
of 1 and does not wait); 3 instances overlap one instance's host-side work (≈1 ms per execute in the python
backend) with another's GPU time: 1,277 images/s at p95 20.4 ms against 1,203 with 2 and 713 with 1.

Usage::

    spec = apply_preset(spec, "L40S")        # fields the spec set explicitly win
    preset_for("4090", "low_latency").mps    # True
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict

from plans import mig
from plans.triton_model import DynamicBatching, InstanceGroup, ModelSpec

GpuModel = Literal["A10", "L40S", "A100", "H100", "H200", "4090"]
Workload = Literal["low_latency", "diffusion", "throughput"]


class Preset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    gpu: str
    workload: str
    max_batch_size: int
    preferred_batch_size: list[int]
    max_queue_delay_microseconds: int
    instance_count: int
    mps: bool = False
    # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE per instance when ``mps`` (seed 001: 60/40 or 50/50).
    mps_split: list[int] = []
    mig_capable: bool = False
    memory_gib: int


# GPU: memory GiB (which models have MIG is plans.mig's).
_MEMORY_GIB: dict[str, int] = {"L40S": 48, "A10": 24, "A100": 80, "H100": 80, "H200": 141, "4090": 24}
# (gpu, workload): max batch, preferred batch sizes, queue delay µs, instances, MPS split per instance.
_ROWS: dict[tuple[str, str], tuple[int, list[int], int, int, list[int]]] = {
    ("L40S", "low_latency"): (16, [2, 4, 8, 16], 800, 2, []),
    ("A10", "low_latency"): (4, [1, 2, 4], 500, 3, []),
    ("A100", "low_latency"): (16, [2, 4, 8, 16], 800, 2, []),
    ("H100", "low_latency"): (8, [1, 2, 4, 8], 200, 3, []),
    ("H200", "low_latency"): (8, [1, 2, 4, 8], 200, 3, []),
    ("4090", "low_latency"): (8, [1, 2, 4, 8], 1000, 2, [60, 40]),
    # Diffusion (seed 001): batch 1–2, 2–6 ms window; count 1 where 24 GiB makes memory tight.
    ("L40S", "diffusion"): (2, [1, 2], 4000, 2, []),
    ("A10", "diffusion"): (2, [1, 2], 4000, 1, []),
    ("A100", "diffusion"): (2, [1, 2], 4000, 2, []),
    ("H100", "diffusion"): (2, [1, 2], 3000, 2, []),
    ("H200", "diffusion"): (2, [1, 2], 3000, 3, []),
    ("4090", "diffusion"): (2, [1, 2], 6000, 2, [50, 50]),
    # Throughput (seed 002: ResNet50 batch 32, concurrency 8): large batches, wide window.
    ("L40S", "throughput"): (32, [8, 16, 32], 2000, 2, []),
    ("A10", "throughput"): (16, [4, 8, 16], 2000, 3, []),
    ("A100", "throughput"): (32, [8, 16, 32], 2000, 2, []),
    ("H100", "throughput"): (64, [16, 32, 64], 2000, 2, []),
    ("H200", "throughput"): (64, [16, 32, 64], 2000, 2, []),
    ("4090", "throughput"): (16, [4, 8, 16], 2000, 2, [50, 50]),
}
PRESETS: dict[tuple[str, str], Preset] = {
    (gpu, workload): Preset(
        gpu=gpu,
        workload=workload,
        max_batch_size=batch,
        preferred_batch_size=preferred,
        max_queue_delay_microseconds=delay,
        instance_count=count,
        mps=bool(split),
        mps_split=split,
        mig_capable=mig.has_mig(gpu),
        memory_gib=_MEMORY_GIB[gpu],
    )
    for (gpu, workload), (batch, preferred, delay, count, split) in _ROWS.items()
}


def gpu_key(name: str) -> str:
    """Map a marketing or ``nvidia-smi`` name ("NVIDIA H200", "NVIDIA GeForce RTX 4090") to a preset key."""
    upper = name.upper().replace("NVIDIA", "").replace("GEFORCE", "").replace("RTX", "").strip()
    for token in upper.replace("-", " ").split():
        if token in _MEMORY_GIB:  # the GPUs with presets, by the token nvidia-smi names them with
            return token
    raise KeyError(f"no preset for GPU {name!r}; known: {sorted(_MEMORY_GIB)}")


def preset_for(gpu: str, workload: str = "low_latency") -> Preset:
    return PRESETS[(gpu_key(gpu), workload)]


def apply_preset(spec: ModelSpec, gpu: str, workload: Optional[str] = None) -> ModelSpec:
    """The spec with the GPU preset filled in where the spec did not set a value itself.

    ``max_batch_size``, ``dynamic_batching`` and ``instance_group`` set explicitly on the spec are kept
    as they are (per-model override); a ``dynamic_batching`` given without preferred sizes or delay
    gets those from the preset; preferred sizes above the model's max_batch_size are dropped.
    """
    p = preset_for(gpu, workload or spec.workload)
    explicit = spec.model_fields_set
    update: dict = {}
    max_batch = spec.max_batch_size if "max_batch_size" in explicit else p.max_batch_size
    update["max_batch_size"] = max_batch
    if max_batch > 0:
        if "dynamic_batching" not in explicit or spec.dynamic_batching is None:
            if "dynamic_batching" not in explicit:
                update["dynamic_batching"] = DynamicBatching(
                    preferred_batch_size=[b for b in p.preferred_batch_size if b <= max_batch],
                    max_queue_delay_microseconds=p.max_queue_delay_microseconds,
                )
        else:
            d = spec.dynamic_batching
            given = d.model_fields_set
            update["dynamic_batching"] = d.model_copy(
                update={
                    "preferred_batch_size": d.preferred_batch_size
                    if "preferred_batch_size" in given
                    else [b for b in p.preferred_batch_size if b <= max_batch],
                    "max_queue_delay_microseconds": d.max_queue_delay_microseconds
                    if "max_queue_delay_microseconds" in given
                    else p.max_queue_delay_microseconds,
                }
            )
    if "instance_group" not in explicit:
        update["instance_group"] = [InstanceGroup(kind="KIND_GPU", count=p.instance_count)]
    new = spec.model_copy(update=update)
    # model_copy keeps model_fields_set; the preset's values are now part of the spec.
    return ModelSpec.model_validate(new.model_dump(by_alias=True))


def mps_environment(
    preset: Preset, instance: int, *, pipe_dir: str = "/tmp/nvidia-mps", log_dir: str = "/var/log/nvidia-mps"
) -> dict[str, str]:
    """Environment for one Triton instance under CUDA MPS (seed 001 §5.4); empty when the preset has no MPS."""
    if not preset.mps:
        return {}
    split = preset.mps_split or [100 // preset.instance_count] * preset.instance_count
    pct = split[instance % len(split)]
    return {
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_MPS_PIPE_DIRECTORY": pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": log_dir,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct),
    }
