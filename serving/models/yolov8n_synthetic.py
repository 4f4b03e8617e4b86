"""Test weights that make YOLOv8n a real (input-dependent) detector, and distinct structured synthetic images.

No trained weights can be fetched where the tests and benchmarks run, and PyTorch's random initialisation makes
an input-blind model (every image gets the same answer, 0 detections). ``make_test_weights`` fixes that without data:

1. random initialisation from ``seed`` (PyTorch's default init, the head's design bias init);
2. BatchNorm recalibration: one forward pass over ``calib`` structured synthetic images in train mode, without
   gradient, with ``momentum=None`` (cumulative statistics), so every layer's activations are normalised for
   images rather than for the init's scale;
3. eval mode; the class heads' last biases (``detect.cv3[i][2].bias``) shifted by ``class_bias_shift`` (+7) so
   that an image gives tens of detections at conf 0.25.

Everything runs on the CPU in FP32 under a forked RNG (the caller's RNG state is left alone): the same ``seed``
gives the same weights on every machine up to CPU float summation order (move them to a GPU afterwards).
``synthetic_images`` draws distinct images (gradient background, rectangles, ellipses, stripes at varying places,
sizes and colours; never noise), the ``i``-th image a function of ``(seed, i)`` only.

API (stable; benchmarks and tests on other branches use it)::

    from serving.models.yolov8n_synthetic import make_test_weights, synthetic_images, synthetic_image

    model = make_test_weights()                      # YOLOv8n, unfused, eval, FP32, CPU
    images = synthetic_images(64)               # numpy uint8 [64, 640, 640, 3], RGB, NHWC
    one = synthetic_image(7)                    # == synthetic_images(8)[7]
    state = model.state_dict()                  # save with torch.save / safetensors for a weights file
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from serving.models import yolov8n as yolo

SIZE = 640
CLASS_BIAS_SHIFT = 7.0


def synthetic_image(i: int, seed: int = 0, size: int = SIZE) -> np.ndarray:
    """Image ``i`` of the ``seed`` family: uint8 [size, size, 3] (RGB). Deterministic in ``(seed, i)``."""
    rng = np.random.default_rng([seed, i, 0x59F8])
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) / size
    angle = rng.uniform(0, 2 * np.pi)
    t = np.cos(angle) * xs + np.sin(angle) * ys
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    img = c0[None, None, :] * (1 - t[..., None]) + c1[None, None, :] * t[..., None]
    for _ in range(int(rng.integers(3, 9))):
        kind = int(rng.integers(0, 3))
        w, h = (int(v) for v in rng.integers(size // 16, size // 2, 2))
        x0, y0 = int(rng.integers(0, size - w)), int(rng.integers(0, size - h))
        colour = rng.uniform(0, 255, 3)
        region = img[y0 : y0 + h, x0 : x0 + w]
        if kind == 0:  # filled rectangle
            region[:] = colour
        elif kind == 1:  # ellipse
            yy, xx = ys[y0 : y0 + h, x0 : x0 + w] * size, xs[y0 : y0 + h, x0 : x0 + w] * size
            inside = ((xx - x0 - w / 2) / (w / 2)) ** 2 + ((yy - y0 - h / 2) / (h / 2)) ** 2 <= 1
            region[inside] = colour
        else:  # stripes
            period = int(rng.integers(4, 24))
            on = ((xs[y0 : y0 + h, x0 : x0 + w] * size).astype(np.int32) // period) % 2 == 0
            region[on] = colour
    return np.clip(img, 0, 255).astype(np.uint8)


def synthetic_images(n: int, seed: int = 0, size: int = SIZE, start: int = 0) -> np.ndarray:
    """Images ``start … start+n-1`` of the ``seed`` family: uint8 [n, size, size, 3], pairwise distinct."""
    out = np.empty((n, size, size, 3), dtype=np.uint8)
    for k in range(n):
        out[k] = synthetic_image(start + k, seed, size)
    return out


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 NHWC images → FP32 NCHW in 0..1 (what ``yolov8n.Preprocess`` gives, contiguous)."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div(255.0).contiguous()


@torch.no_grad()
def make_test_weights(seed: int = 0, calib: int = 8, class_bias_shift: float = CLASS_BIAS_SHIFT) -> yolo.YOLOv8n:
    """YOLOv8n (unfused, eval, FP32, CPU) whose outputs depend on the input and that detects tens of boxes per image.

    ``calib`` images (``synthetic_images(calib, seed=10_000 + seed)``: not among the images tests send) recalibrate
    every BatchNorm's running statistics in one train-mode pass with ``momentum=None``.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = yolo.YOLOv8n()
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    model.train()
    model(to_tensor(synthetic_images(calib, seed=10_000 + seed)))
    for bn in bns:
        bn.momentum = 0.03
    model.eval()
    for seq in model.detect.cv3:
        seq[2].bias.add_(class_bias_shift)  # type: ignore[index]
    return model
