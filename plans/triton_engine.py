"""ONNX → TensorRT plan with trtexec in the TensorRT container on the guest (seed 000 §6.2, seed 004).

The build is keyed by what changes the engine: the ONNX file's sha256, the min/opt/max shapes, the
precision (and the INT8 calibration cache's sha256), the GPU model and the TensorRT version. Each is
a separate resource input, so ``pulumi preview`` shows *which* one changed; the same values, hashed,
are the cache key written beside the plan (``<plan>.key``) so a guest that already holds the right
engine is not rebuilt. The timing cache (``--timingCacheFile``) lives in a kept directory on the
guest and is reused by every build (seed 000 §8.4: upgrades then only need an incremental warm-up).

INT8: trtexec's ``--calib`` reads a calibration *cache*, not images; ``calib_dir`` must hold
``calibration.cache`` made from 50–200 representative images (seed 004's entropy calibrator).

Usage::

    b = EngineBuild(model="yolov8n", onnx_path="/srv/onnx/yolov8n_simp.onnx", onnx_sha256="ab12…",
                    plan_path="/srv/triton-repo/yolov8n/1/model.plan", gpu_model="NVIDIA H200",
                    trt_version="10.0.1", precision="fp16",
                    shapes={"images": ShapeRange(min=[1,3,640,640], opt=[4,3,640,640], max=[8,3,640,640])})
    command = build_command(b)      # one shell line, every value quoted by access.shell
    cache_key(b)                    # sha256 hex
    plan_rebuild(stored_key_json, b)  # -> Decision(rebuild, reason)
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from access.shell import Script

# TensorRT container → TensorRT version inside it (NGC release notes).
TENSORRT_IMAGE_VERSIONS = {
    "nvcr.io/nvidia/tensorrt:24.05-py3": "10.0.1",
    "nvcr.io/nvidia/tensorrt:24.06-py3": "10.1.0",
    "nvcr.io/nvidia/tensorrt:24.07-py3": "10.2.0",
    "nvcr.io/nvidia/tensorrt:24.08-py3": "10.3.0",
}


class ShapeRange(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    min: list[int]
    opt: list[int]
    max: list[int]

    @model_validator(mode="after")
    def _ordered(self):
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise ValueError("min, opt and max must have the same rank")
        for lo, mid, hi in zip(self.min, self.opt, self.max):
            if not (1 <= lo <= mid <= hi):
                raise ValueError(f"need 1 <= min <= opt <= max per axis, got {self.min}/{self.opt}/{self.max}")
        return self


class EngineBuild(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    onnx_path: str
    onnx_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    plan_path: str
    shapes: dict[str, ShapeRange]
    precision: Literal["fp32", "fp16", "int8"] = "fp16"
    calib_dir: Optional[str] = None
    calib_sha256: Optional[str] = Field(None, pattern=r"^[0-9a-f]{64}$")
    gpu_model: str
    gpu_index: int = 0
    image: str = "nvcr.io/nvidia/tensorrt:24.05-py3"
    trt_version: Optional[str] = None
    workspace_mib: int = Field(4096, ge=64)
    timing_cache: str = "/var/lib/gpuhost/tensorrt/timing.cache"

    @model_validator(mode="after")
    def _int8_needs_calibration(self):
        if self.precision == "int8" and not self.calib_dir:
            raise ValueError("precision int8 needs calib_dir (holding calibration.cache)")
        if self.precision != "int8" and self.calib_dir:
            raise ValueError("calib_dir is only used with precision int8")
        return self

    @property
    def tensorrt_version(self) -> str:
        if self.trt_version:
            return self.trt_version
        try:
            return TENSORRT_IMAGE_VERSIONS[self.image]
        except KeyError:
            raise ValueError(f"unknown TensorRT version of image {self.image!r}; set trt_version") from None


def _shape(dims: list[int]) -> str:
    return "x".join(str(d) for d in dims)


def trtexec_args(b: EngineBuild) -> list[str]:
    """The trtexec argument list (seed 000 §6.2; ``--memPoolSize`` replaces the removed ``--workspace``)."""
    names = sorted(b.shapes)
    args = [
        "trtexec",
        f"--onnx={b.onnx_path}",
        f"--saveEngine={b.plan_path}.tmp",
        f"--memPoolSize=workspace:{b.workspace_mib}M",
        "--minShapes=" + ",".join(f"{n}:{_shape(b.shapes[n].min)}" for n in names),
        "--optShapes=" + ",".join(f"{n}:{_shape(b.shapes[n].opt)}" for n in names),
        "--maxShapes=" + ",".join(f"{n}:{_shape(b.shapes[n].max)}" for n in names),
        f"--timingCacheFile={b.timing_cache}",
    ]
    if b.precision in ("fp16", "int8"):
        args.append("--fp16")  # INT8 builds keep FP16 as the fallback for layers without INT8 kernels
    if b.precision == "int8":
        assert b.calib_dir is not None  # EngineBuild refuses int8 without calib_dir
        args += ["--int8", f"--calib={posixpath.join(b.calib_dir, 'calibration.cache')}"]
    return args


def key_inputs(b: EngineBuild) -> dict:
    """The values that decide the engine, one per input so a preview names the one that changed."""
    return {
        "onnx_sha256": b.onnx_sha256,
        "shapes": {n: b.shapes[n].model_dump() for n in sorted(b.shapes)},
        "precision": b.precision,
        "calib_sha256": b.calib_sha256 or "",
        "gpu_model": b.gpu_model,
        "tensorrt_version": b.tensorrt_version,
    }


# Up to TensorRTEngine VERSION 2 these keys were camelCase, in the stack's state and in the guest's <plan>.key.
OLD_KEYS = {
    "onnxSha256": "onnx_sha256",
    "calibSha256": "calib_sha256",
    "gpuModel": "gpu_model",
    "tensorrtVersion": "tensorrt_version",
}


def current_keys(d: dict) -> dict:
    """``d`` with the camelCase keys written before renamed (a key already in snake_case wins): an engine built
    then is still the same engine, and state written then still diffs value by value."""
    out = {k: v for k, v in d.items() if k not in OLD_KEYS}
    for old, new in OLD_KEYS.items():
        if old in d and new not in out:
            out[new] = d[old]
    return out


def cache_key(b: EngineBuild) -> str:
    return hashlib.sha256(json.dumps(key_inputs(b), sort_keys=True).encode()).hexdigest()


class Decision(BaseModel):
    rebuild: bool
    reason: str
    changed: list[str] = []


def plan_rebuild(stored_key_json: Optional[str], b: EngineBuild, *, plan_exists: bool = True) -> Decision:
    """Facts (the ``<plan>.key`` file's content, whether the plan exists) in → build or no-op out."""
    if not plan_exists:
        return Decision(rebuild=True, reason=f"{b.plan_path} does not exist", changed=["plan"])
    if not stored_key_json:
        return Decision(rebuild=True, reason=f"{b.plan_path} has no build key", changed=["key"])
    try:
        stored = json.loads(stored_key_json)
    except json.JSONDecodeError:
        return Decision(rebuild=True, reason="build key is unreadable", changed=["key"])
    if isinstance(stored, dict):
        stored = current_keys(stored)
    wanted = key_inputs(b)
    changed = sorted(k for k in wanted if stored.get(k) != wanted[k])
    if not changed:
        return Decision(rebuild=False, reason=f"{b.plan_path} was built from the same inputs ({cache_key(b)[:12]})")
    return Decision(rebuild=True, reason="changed: " + ", ".join(changed), changed=changed)


def build_command(b: EngineBuild) -> str:
    """The guest-side script: trtexec in the TensorRT container, then atomically install plan and key."""
    workdirs = sorted(
        {posixpath.dirname(p) for p in (b.onnx_path, b.plan_path, b.timing_cache)}
        | ({b.calib_dir} if b.calib_dir else set())
    )
    s = Script()
    s.raw("set -eu")
    s.add("mkdir", "-p", posixpath.dirname(b.plan_path), posixpath.dirname(b.timing_cache))
    docker = ["docker", "run", "--rm", "--gpus", f"device={b.gpu_index}"]
    for d in workdirs:
        docker += ["-v", f"{d}:{d}"]
    s.add(*docker, b.image, *trtexec_args(b))
    s.add("mv", f"{b.plan_path}.tmp", b.plan_path)
    s.write(["printf", "%s\\n", json.dumps(key_inputs(b), sort_keys=True)], f"{b.plan_path}.key")
    return s.render()
