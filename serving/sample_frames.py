"""Structured synthetic camera frames as JPEG bytes, for the acceptance gate, the benchmark and the tests.

Not noise: noise compresses badly (a 1920×1080 noise JPEG is ~1.5 MB, a camera frame ~100–400 kB) and decodes
slowly, so it would measure the wrong thing. Each frame is a sky gradient over a ground plane with a horizon,
road stripes and a few solid objects (boxes, discs) whose places follow ``seed``: distinct frames per seed,
sizes like a camera's. Pillow only (imported when called).

Usage::

    data = jpeg(1280, 720, seed=1)                 # bytes of a baseline JPEG, quality 90
    frames = gate_frames()                         # [(w, h, bytes), ...] for 1280×720, 1920×1080, 640×480
"""

from __future__ import annotations

import io
import random

# What cameras and clients send (issue 26): HD, full HD, VGA.
GATE_SIZES = ((1280, 720), (1920, 1080), (640, 480))


def image(width: int, height: int, seed: int = 0):
    """A PIL RGB image: sky gradient, ground, horizon, stripes and a few solid objects placed by ``seed``."""
    from PIL import Image, ImageDraw

    rnd = random.Random(seed * 7919 + width * 31 + height)
    horizon = int(height * rnd.uniform(0.35, 0.6))
    sky = Image.linear_gradient("L").resize((width, max(1, horizon)))
    top, bottom = (rnd.randint(60, 140), rnd.randint(120, 190), 230), (200, 220, 240)
    img = Image.new("RGB", (width, height), (90, 95, 85))
    img.paste(Image.composite(Image.new("RGB", sky.size, bottom), Image.new("RGB", sky.size, top), sky), (0, 0))
    d = ImageDraw.Draw(img)
    d.rectangle((0, horizon, width, height), fill=(rnd.randint(70, 110), rnd.randint(80, 120), rnd.randint(60, 90)))
    cx = width // 2 + rnd.randint(-width // 8, width // 8)
    d.polygon(
        [(cx - width // 30, horizon), (cx + width // 30, horizon), (width, height), (0, height)], fill=(60, 60, 65)
    )
    for k in range(1, 8):
        y = horizon + (height - horizon) * k / 8
        d.line((cx, y, cx, y + (height - horizon) / 20), fill=(235, 235, 220), width=max(1, width // 200))
    for _ in range(rnd.randint(4, 9)):
        w = rnd.randint(max(2, width // 20), max(3, width // 5))
        h = rnd.randint(max(2, height // 20), max(3, height // 4))
        x = rnd.randint(0, max(0, width - w))
        y = rnd.randint(max(0, horizon - h), max(0, min(height - h, horizon + h)))
        color = (rnd.randint(0, 255), rnd.randint(0, 255), rnd.randint(0, 255))
        (d.ellipse if rnd.random() < 0.3 else d.rectangle)((x, y, x + w, y + h), fill=color, outline=(20, 20, 20))
    # Sensor grain: a camera frame has texture, which is what makes its JPEG 100-400 kB and its decode real work.
    grain = Image.effect_noise((width, height), 40).convert("RGB")
    return Image.blend(img, grain, 0.05)


def encode(img, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def jpeg(width: int, height: int, seed: int = 0, quality: int = 90) -> bytes:
    """``image(width, height, seed)`` as a baseline JPEG."""
    return encode(image(width, height, seed), quality)


def gate_frames(sizes=GATE_SIZES, per_size: int = 1, seed: int = 0) -> list[tuple[int, int, bytes]]:
    """``per_size`` distinct frames of each size as (width, height, JPEG bytes)."""
    return [(w, h, jpeg(w, h, seed + k)) for w, h in sizes for k in range(per_size)]
