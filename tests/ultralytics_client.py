"""Ultralytics itself, as a user runs it: makes a YOLOv8n, saves its checkpoint, exports it to ONNX the ways users
do, and answers frames with ``YOLO(file).predict``. Runs under ``.venv-ultralytics`` (``requirements-ultralytics.txt``,
made by ``./gpuhost.sh setup``), never in the product's venv; ``tests/test_yolov8n_ultralytics.py`` compares the
product's loader and model against what it writes.

    .venv-ultralytics/bin/python tests/ultralytics_client.py OUT CONF IOU FRAME.png ...

writes ``OUT/yolov8n.pt`` (``YOLO.save``: FP16 ``DetectionModel``), ``OUT/state_dict.pt`` (its FP32 state_dict,
Ultralytics' keys), ``OUT/<variant>.onnx`` (``YOLO("yolov8n.pt").export(format="onnx", **kwargs)`` per variant) and
``OUT/answers.json``: ``{"versions": …, "seconds": …, "files": {file: [[x1, y1, x2, y2, conf, cls], …] per frame}}``.

No weights can be downloaded: ``YOLO("yolov8n.yaml")`` builds random weights (seeded); the BatchNorm statistics are
recalibrated on the frames (train mode, cumulative) and the class outputs' biases raised, so that the detector
depends on its input and gives boxes at the served ``conf``.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import types
from pathlib import Path
from typing import Any

# Each (file name, export arguments): the default (onnxslim on), without onnxslim, dynamic axes, an older opset.
EXPORTS: dict[str, dict[str, Any]] = {
    "default.onnx": {},
    "no_simplify.onnx": {"simplify": False},
    "dynamic.onnx": {"dynamic": True},
    "opset12.onnx": {"opset": 12, "simplify": False},
}
SEED, CLASS_BIAS_SHIFT = 0, 5.0  # 5: tens of boxes on most frames that have any, below max_det


def torchvision_stand_in() -> None:
    """torchvision 0.28 does not import on the CPU torch 2.13 (its ops are not registered); Ultralytics imports it
    only for ``ops.nms`` when predicting, so its own ``TorchNMS.nms`` stands in."""
    from ultralytics.utils.nms import TorchNMS

    tv = types.ModuleType("torchvision")
    tv.ops = types.SimpleNamespace(nms=TorchNMS.nms)  # type: ignore[attr-defined]
    tv.__version__ = "0.28.0"  # type: ignore[attr-defined]
    sys.modules["torchvision"] = tv


def make_model(frames: list[Path], out: Path) -> Path:
    import cv2
    import numpy as np
    import torch
    from ultralytics import YOLO

    torch.manual_seed(SEED)
    model = YOLO("yolov8n.yaml")
    dm = model.model
    batch = np.stack([cv2.imread(str(f))[..., ::-1] for f in frames])  # BGR → RGB, as predict feeds the model
    x = torch.from_numpy(batch.copy()).permute(0, 3, 1, 2).float() / 255
    for m in dm.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    dm.train()
    with torch.no_grad():
        dm(x)
        dm.eval()
        for seq in dm.model[-1].cv3:
            seq[-1].bias += CLASS_BIAS_SHIFT
    path = out / "yolov8n.pt"
    model.save(str(path))
    return path


def main(out: Path, conf: float, iou: float, frames: list[Path]) -> None:
    t0 = time.monotonic()
    torchvision_stand_in()
    import torch
    import ultralytics
    from ultralytics import YOLO

    seconds: dict[str, float] = {}
    pt = make_model(frames, out)
    seconds["build"] = time.monotonic() - t0
    torch.save(YOLO(str(pt)).model.float().state_dict(), out / "state_dict.pt")
    for name, kwargs in EXPORTS.items():
        t = time.monotonic()
        made = YOLO(str(pt)).export(format="onnx", **kwargs)
        shutil.move(made, out / name)
        seconds[f"export {name}"] = time.monotonic() - t
    answers = {}
    for name in ["yolov8n.pt", *EXPORTS]:
        t = time.monotonic()
        model = YOLO(str(out / name), task="detect")
        results = model.predict([str(f) for f in frames], conf=conf, iou=iou, max_det=100, imgsz=640, verbose=False)
        answers[name] = [
            torch.cat((r.boxes.xyxy, r.boxes.conf[:, None], r.boxes.cls[:, None]), 1).tolist() for r in results
        ]
        seconds[f"predict {name}"] = time.monotonic() - t
    versions = {"ultralytics": ultralytics.__version__, "torch": torch.__version__}
    doc = {"versions": versions, "seconds": seconds, "files": answers}
    (out / "answers.json").write_text(json.dumps(doc))


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), [Path(a) for a in sys.argv[4:]])
