"""Model code that gpuhost ships into Triton model repositories (python backend)."""

from __future__ import annotations

from pathlib import Path

_SERVING = Path(__file__).resolve().parents[1]


def yolov8n_files(name: str = "yolov8n", version: int = 1) -> dict[str, bytes]:
    """``model.py``, ``yolov8n.py`` and ``frames.py`` for ``<name>/<version>/`` of a repository (see
    ``plans.triton_repo``)."""
    return {
        f"{name}/{version}/model.py": (_SERVING / "yolov8n_model.py").read_bytes(),
        f"{name}/{version}/yolov8n.py": (_SERVING / "models" / "yolov8n.py").read_bytes(),
        f"{name}/{version}/frames.py": (_SERVING / "models" / "frames.py").read_bytes(),
    }
