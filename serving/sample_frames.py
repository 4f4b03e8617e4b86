"""Structured synthetic camera frames as JPEG bytes, for the acceptance gate, the benchmark and the tests.

Not noise: noise compresses badly (a 1920×1080 noise JPEG is ~1.5 MB, a camera frame ~100–400 kB) and decodes
slowly, so it would measure the wrong thing. Each frame is a sky gradient over a ground plane with a horizon, a
road with its centre line and a few solid objects (boxes, discs) whose places follow ``seed``, under a light sensor
grain: distinct frames per seed, sizes and JPEG sizes like a camera's. Drawn with NumPy; encoded with Pillow, or
with torchvision where Pillow is not installed (the GPU machine).

Usage::

    data = jpeg(1280, 720, seed=1)                 # bytes of a baseline JPEG, quality 90
    frames = gate_frames()                         # [(w, h, bytes), ...] for 1280×720, 1920×1080, 640×480
"""

from __future__ import annotations

import io
import random

# What cameras and clients send (issue 26): HD, full HD, VGA.
GATE_SIZES = ((1280, 720), (1920, 1080), (640, 480))


def pixels(width: int, height: int, seed: int = 0):
    """uint8 [height, width, 3] RGB: sky, ground, road, centre line, 4–9 objects placed by ``seed``, grain."""
    import numpy as np

    rnd = random.Random(seed * 7919 + width * 31 + height)
    ys = np.arange(height, dtype=np.float32)[:, None]
    xs = np.arange(width, dtype=np.float32)[None, :]
    img = np.empty((height, width, 3), dtype=np.float32)
    horizon = max(1, int(height * rnd.uniform(0.35, 0.6)))
    top = np.array([rnd.randint(60, 140), rnd.randint(120, 190), 230], dtype=np.float32)
    t = (ys[:horizon] / horizon)[..., None]
    img[:horizon] = top * (1 - t) + np.array([200, 220, 240], dtype=np.float32) * t
    img[horizon:] = (rnd.randint(70, 110), rnd.randint(80, 120), rnd.randint(60, 90))
    cx = width / 2 + rnd.randint(-width // 8, width // 8)
    depth = np.clip((ys - horizon) / max(1, height - horizon), 0, 1)
    left, right = (cx - width / 30) * (1 - depth), cx + width / 30 + (width - cx - width / 30) * depth
    img[(ys >= horizon) & (xs >= left) & (xs <= right)] = (60, 60, 65)
    dash = (((ys - horizon) * 8 / max(1, height - horizon)) % 1 < 0.4) & (np.abs(xs - cx) <= max(1, width // 400))
    img[(ys >= horizon) & dash] = (235, 235, 220)
    for _ in range(rnd.randint(4, 9)):
        w = rnd.randint(max(2, width // 20), max(3, width // 5))
        h = rnd.randint(max(2, height // 20), max(3, height // 4))
        x = rnd.randint(0, max(0, width - w))
        y = rnd.randint(max(0, horizon - h), max(0, min(height - h, horizon + h)))
        color = (rnd.randint(0, 255), rnd.randint(0, 255), rnd.randint(0, 255))
        if rnd.random() < 0.3:
            inside = ((xs - x - w / 2) / (w / 2)) ** 2 + ((ys - y - h / 2) / (h / 2)) ** 2 <= 1
        else:
            inside = (xs >= x) & (xs < x + w) & (ys >= y) & (ys < y + h)
        img[inside] = color
    # Sensor grain: a camera frame has texture, which is what makes its JPEG 100–400 kB and its decode real work.
    grain = np.random.default_rng([seed, width, height]).normal(128, 40, (height, width, 1)).astype(np.float32)
    return np.clip(img * 0.95 + grain * 0.05, 0, 255).astype(np.uint8)


def encode(rgb, quality: int = 90) -> bytes:
    """uint8 [H, W, 3] → baseline JPEG bytes (4:2:0), with Pillow or else torchvision."""
    try:
        from PIL import Image
    except ImportError:
        import torch
        from torchvision.io import encode_jpeg

        return encode_jpeg(torch.from_numpy(rgb).permute(2, 0, 1).contiguous(), quality=quality).numpy().tobytes()
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def jpeg(width: int, height: int, seed: int = 0, quality: int = 90) -> bytes:
    """``pixels(width, height, seed)`` as a baseline JPEG."""
    return encode(pixels(width, height, seed), quality)


def gate_frames(sizes=GATE_SIZES, per_size: int = 1, seed: int = 0) -> list[tuple[int, int, bytes]]:
    """``per_size`` distinct frames of each size as (width, height, JPEG bytes)."""
    return [(w, h, jpeg(w, h, seed + k)) for w, h in sizes for k in range(per_size)]
