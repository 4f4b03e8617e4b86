"""Model code that gpuhost ships into Triton model repositories (python backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

_SERVING = Path(__file__).resolve().parents[1]


def yolov8n_files(
    name: str = "yolov8n", version: int = 1, weights: Optional[bytes] = None, weights_file: str = "weights.safetensors"
) -> dict[str, bytes]:
    """``model.py``, ``yolov8n.py``, ``yolov8n_weights.py``, ``frames.py`` and ``jpeg_planes.py`` for
    ``<name>/<version>/`` of a repository (see ``plans.triton_repo``); with ``weights``, that file as ``weights_file``
    too (tests and benchmarks: a stack's weights come as its artifact)."""
    files = {
        f"{name}/{version}/model.py": (_SERVING / "yolov8n_model.py").read_bytes(),
        f"{name}/{version}/yolov8n.py": (_SERVING / "models" / "yolov8n.py").read_bytes(),
        f"{name}/{version}/yolov8n_weights.py": (_SERVING / "models" / "yolov8n_weights.py").read_bytes(),
        f"{name}/{version}/frames.py": (_SERVING / "models" / "frames.py").read_bytes(),
        f"{name}/{version}/jpeg_planes.py": (_SERVING / "models" / "jpeg_planes.py").read_bytes(),
    }
    if weights is not None:
        files[f"{name}/{version}/{weights_file}"] = weights
    return files


def sdxl_generator_files(name: str = "sdxl_generator", version: int = 1) -> dict[str, bytes]:
    """``model.py`` and ``sdxl_generator.py`` for ``<name>/<version>/`` of a repository: seed 001's generator at
    SDXL's shape with random weights (``plans.triton_repo.sdxl_generator``; benchmarks and tests only)."""
    return {
        f"{name}/{version}/model.py": (_SERVING / "sdxl_generator_model.py").read_bytes(),
        f"{name}/{version}/sdxl_generator.py": (_SERVING / "models" / "sdxl_generator.py").read_bytes(),
    }
