"""Ultralytics' own answers to JPEG frame files, as a user gets them, and the noise floor of the same weights. Runs
under ``.venv-ultralytics`` (beside ``tests/ultralytics_client.py``, whose model it makes); ``bench/frames_agreement.py``
and ``tests/test_frames_ultralytics_triton.py`` compare the served model with what it writes.

    .venv-ultralytics/bin/python tests/ultralytics_frames.py OUT CONF IOU DRAWS CALIB.png ... -- FRAME.jpg ...

* ``OUT/yolov8n.pt``: ``make_model`` (``YOLO("yolov8n.yaml")`` seeded, the first convolution's filters drawn
  towards their mean over R, G, B, BatchNorm recalibrated on the ``CALIB`` frames, the class biases raised,
  ``YOLO.save``);
* per frame file, ``YOLO("OUT/yolov8n.pt").predict(<its path>, conf, iou, max_det=100, imgsz=640)``: Ultralytics
  reads the file itself (``ultralytics.utils.patches.imread``: OpenCV's ``imdecode``, which applies the EXIF
  orientation and converts gray, CMYK and YCCK to BGR). ``predict`` defaults to ``rect=True``: a checkpoint's
  frame is letterboxed to the smallest rectangle of multiples of 32 (1280×720 → 640×384, 640×480 unpadded), as the
  served model does by default for a checkpoint; a static-shape ONNX export is letterboxed to 640×640; so each file
  is answered both ways, ``predict`` (the default) and ``square`` (``rect=False``);
* the noise floor, both ways: the frame as Ultralytics read it with every channel value moved one level up or down
  at random (clipped to 0–255; ``DRAWS`` draws, seeded by the frame's place in the list), through ``predict`` as an
  array;
* what Ultralytics read, against Pillow's upright decode (``ImageOps.exif_transpose``, ``convert("RGB")``): its
  size and the largest difference of a channel value.

``OUT/frames.json``: ``{"versions", "seconds", "conf", "iou", "noise", "files": {file name: {"read": [w, h],
"read_vs_pillow": levels, "predict": [[x1, y1, x2, y2, conf, cls], …], "predict_noisy": [[…] per draw],
"square": […], "square_noisy": [[…] per draw]}}}``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ultralytics_client import SEED, torchvision_stand_in

# A random first convolution makes the detector answer colour, not luminance: gray frames got no box at all. With
# 80 % of each filter shared by R, G and B they answer tens, and chroma still moves the boxes (20 % of each filter:
# a decoder's chroma error of tens of levels is still far above the ±1-level noise floor).
LUMA_SHARE = 0.8
CLASS_BIAS_SHIFT = 3.0  # 3: 10–70 boxes on most of bench/frames_agreement.py's frames at conf 0.25, below max_det
NOISE = "every channel value of every pixel ±1 level (sign at random, numpy default_rng([draw, frame index])), clipped"


def make_model(calib: list[Path], out: Path) -> Path:
    """``OUT/yolov8n.pt``: Ultralytics' YOLOv8n (seeded), ``LUMA_SHARE`` of the first filters shared by R, G and B,
    every BatchNorm recalibrated on ``calib`` (640×640 frames; train mode, cumulative), the class biases raised by
    ``CLASS_BIAS_SHIFT``, saved by ``YOLO.save`` (FP16, as users' checkpoints are)."""
    import cv2
    import numpy as np
    import torch
    from ultralytics import YOLO

    torch.manual_seed(SEED)
    model = YOLO("yolov8n.yaml")
    dm = model.model
    batch = np.stack([cv2.imread(str(f))[..., ::-1] for f in calib])  # BGR → RGB, as predict feeds the model
    x = torch.from_numpy(batch.copy()).permute(0, 3, 1, 2).float() / 255
    with torch.no_grad():
        w = dm.model[0].conv.weight
        w.copy_((1 - LUMA_SHARE) * w + LUMA_SHARE * w.mean(1, keepdim=True))
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


def boxes(result) -> list[list[float]]:
    import torch

    b = result.boxes
    return torch.cat((b.xyxy, b.conf[:, None], b.cls[:, None]), 1).tolist()


def main(out: Path, conf: float, iou: float, draws: int, calib: list[Path], files: list[Path]) -> None:
    t0 = time.monotonic()
    torchvision_stand_in()
    import cv2
    import numpy as np
    import torch
    import ultralytics
    from PIL import Image, ImageOps
    from ultralytics import YOLO
    from ultralytics.utils.patches import imread

    seconds: dict[str, float] = {}
    pt = make_model(calib, out)
    model = YOLO(str(pt), task="detect")
    seconds["build"] = time.monotonic() - t0
    kw = dict(conf=conf, iou=iou, max_det=100, imgsz=640, verbose=False)
    modes = {"predict": {}, "square": {"rect": False}}
    answers: dict[str, dict] = {}
    t = time.monotonic()
    for f in files:
        answers[f.name] = {mode: boxes(model.predict(str(f), **kw, **rect)[0]) for mode, rect in modes.items()}
    seconds["predict files"] = time.monotonic() - t
    t = time.monotonic()
    for k, f in enumerate(files):
        bgr = imread(str(f), flags=cv2.IMREAD_COLOR)  # what predict read from the path
        with Image.open(f) as im:
            pillow = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
        rgb = bgr[..., ::-1]
        answers[f.name]["read"] = [int(bgr.shape[1]), int(bgr.shape[0])]
        same = rgb.shape == pillow.shape
        answers[f.name]["read_vs_pillow"] = int(np.abs(rgb.astype(np.int16) - pillow).max()) if same else None
        for mode, rect in modes.items():
            noisy = []
            for d in range(draws):
                sign = np.random.default_rng([d, k]).integers(0, 2, bgr.shape, dtype=np.int16) * 2 - 1
                moved = np.clip(bgr.astype(np.int16) + sign, 0, 255).astype(np.uint8)
                noisy.append(boxes(model.predict(moved, **kw, **rect)[0]))
            answers[f.name][f"{mode}_noisy"] = noisy
    seconds["predict noisy"] = time.monotonic() - t
    versions = {"ultralytics": ultralytics.__version__, "torch": torch.__version__, "opencv": cv2.__version__}
    doc = {"versions": versions, "seconds": seconds, "conf": conf, "iou": iou, "noise": NOISE, "files": answers}
    (out / "frames.json").write_text(json.dumps(doc))


if __name__ == "__main__":
    args = sys.argv[1:]
    cut = args.index("--")
    head, frames = args[:cut], [Path(a) for a in args[cut + 1 :]]
    main(Path(head[0]), float(head[1]), float(head[2]), int(head[3]), [Path(a) for a in head[4:]], frames)
