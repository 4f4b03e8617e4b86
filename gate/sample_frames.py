"""Structured synthetic camera frames as JPEG bytes, for the acceptance gate, the benchmark and the tests.

Not noise: noise compresses badly (a 1920×1080 noise JPEG is ~1.5 MB, a camera frame ~100–400 kB) and decodes
slowly, so it would measure the wrong thing. Each frame is a sky gradient over a ground plane with a horizon, a
road with its centre line and a few solid objects (boxes, discs) whose places follow ``seed``, under a light sensor
grain: distinct frames per seed, sizes and JPEG sizes like a camera's. Drawn with NumPy; encoded with Pillow, or
with torchvision where Pillow is not installed (the GPU machine).

Usage::

    data = jpeg(1280, 720, seed=1)                 # bytes of a baseline JPEG, quality 90
    frames = gate_frames()                         # [(w, h, bytes), ...]: 1280×720, 1920×1080, 640×480, a phone's
    classes = frame_classes()                      # {"progressive-420": bytes, "cmyk": ..., "exif-6": ...}
"""

from __future__ import annotations

import io
import random
import struct

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


def phone_jpeg(width: int = 720, height: int = 1280, seed: int = 0, orientation: int = 6) -> bytes:
    """``pixels(width, height, seed)`` (the upright frame) stored as a phone stores it: turned into the sensor's grid
    and tagged with EXIF ``orientation`` (6: the viewer turns it 90° clockwise), so a reader that applies the tag
    (Pillow's ``exif_transpose``, Ultralytics, the served model) sees the upright width×height frame and one that
    ignores it sees the sensor's grid (height×width for 5–8)."""
    import numpy as np

    up = pixels(width, height, seed)
    stored = {  # the inverse of what orientation tells the viewer to do
        2: lambda a: a[:, ::-1],
        3: lambda a: a[::-1, ::-1],
        4: lambda a: a[::-1],
        5: lambda a: a.transpose(1, 0, 2),
        6: lambda a: np.rot90(a, 1),
        7: lambda a: a.transpose(1, 0, 2)[::-1, ::-1],
        8: lambda a: np.rot90(a, -1),
    }.get(orientation, lambda a: a)(up)
    return insert_segments(encode(np.ascontiguousarray(stored)), exif_app1(orientation))


def gate_frames(sizes=GATE_SIZES, per_size: int = 1, seed: int = 0, phone: bool = True) -> list[tuple[int, int, bytes]]:
    """``per_size`` distinct frames of each size as (width, height, JPEG bytes); with ``phone``, then as many
    portrait phone frames (``phone_jpeg``: stored 1280×720 with EXIF orientation 6, served 720×1280). The width and
    height are the upright frame's, the one answers are in: a gate that checks boxes against them fails a server
    that ignores the orientation."""
    out = [(w, h, jpeg(w, h, seed + k)) for w, h in sizes for k in range(per_size)]
    return out + [(720, 1280, phone_jpeg(720, 1280, seed + k)) for k in range(per_size if phone else 0)]


def insert_segments(data: bytes, *segments: bytes) -> bytes:
    """``data`` (a JPEG) with marker ``segments`` (each ``FF xx`` + length + payload) put right after SOI."""
    return data[:2] + b"".join(segments) + data[2:]


def segment(marker: int, payload: bytes) -> bytes:
    """One marker segment: ``FF marker``, the big-endian length (2 + payload), the payload."""
    return bytes((0xFF, marker)) + (len(payload) + 2).to_bytes(2, "big") + payload


def exif_app1(orientation: int, thumbnail: bytes = b"", big_endian: bool = False) -> bytes:
    """An APP1 ``Exif`` segment as a camera writes one: IFD0 with the Orientation tag (0x0112), and when
    ``thumbnail`` (a JPEG) is given, IFD1 pointing at it (JPEGInterchangeFormat 0x0201 and its length 0x0202),
    the thumbnail's bytes (with their own SOI, SOF, EOI) inside the segment. Written here byte by byte, so that the
    GPU machine (no Pillow) makes the same frames; Pillow reads it back (``tests/test_frames.py``)."""
    o = ">" if big_endian else "<"
    ifd1 = 8 + 2 + 12 + 4
    ifd0 = struct.pack(o + "H", 1) + struct.pack(o + "HHI", 0x0112, 3, 1) + struct.pack(o + "HH", orientation, 0)
    if not thumbnail:
        tiff = (b"MM\x00*" if big_endian else b"II*\x00") + struct.pack(o + "I", 8) + ifd0 + struct.pack(o + "I", 0)
        return segment(0xE1, b"Exif\x00\x00" + tiff)
    start = ifd1 + 2 + 2 * 12 + 4
    ifd1_bytes = (
        struct.pack(o + "H", 2)
        + struct.pack(o + "HHII", 0x0201, 4, 1, start)
        + struct.pack(o + "HHII", 0x0202, 4, 1, len(thumbnail))
        + struct.pack(o + "I", 0)
    )
    head = (b"MM\x00*" if big_endian else b"II*\x00") + struct.pack(o + "I", 8)
    tiff = head + ifd0 + struct.pack(o + "I", ifd1) + ifd1_bytes + thumbnail
    return segment(0xE1, b"Exif\x00\x00" + tiff)


def frame_classes(width: int = 328, height: int = 245, seed: int = 5) -> dict[str, bytes]:
    """One JPEG of each class cameras, phones and editors write, of ``pixels(width, height, seed)`` (an odd size
    by default: chroma upsampling's edge cases), as {class: bytes}. Each is made by Pillow (libjpeg-turbo's own
    encoder) with the options named, except where "crafted" says how it was made from one:

    * ``baseline-420`` / ``-422`` / ``-444``: ``subsampling`` 2 / 1 / 0 (4:2:0 is Pillow's and most cameras');
    * ``progressive-420``, ``progressive-444``: ``progressive=True``;
    * ``restart-420``, ``restart-444``: ``restart_marker_rows=1`` (an RSTn marker after every MCU row);
    * ``gray``: an ``L`` image;
    * ``cmyk``: a ``CMYK`` image (libjpeg writes Adobe APP14, transform 0);
    * ``ycck``: crafted: ``cmyk`` with the Adobe transform flag set to 2, so libjpeg reads YCCK and converts it;
    * ``rgb-coded``: ``keep_rgb=True`` (Adobe APP14 transform 0: no YCbCr transform, what nvJPEG gets wrong);
    * ``icc``: ``icc_profile`` of 70 kB (two APP2 segments);
    * ``exif-1`` … ``exif-8``: ``exif`` from ``PIL.Image.Exif`` with the Orientation tag 1–8;
    * ``exif-thumbnail``: crafted: ``exif_app1(6, thumbnail)``, a 4:2:2 thumbnail JPEG inside APP1 with its own
      SOF (a header walk that stops at the first SOF-looking bytes reads the thumbnail's size);
    * ``comment-sof``: crafted: a COM segment holding a SOF0 header of 20000×20000 (libjpeg skips it).
    """
    from PIL import Image

    rgb = pixels(width, height, seed)
    img = Image.fromarray(rgb)

    def save(im, **kw) -> bytes:
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=kw.pop("quality", 90), **kw)
        return buf.getvalue()

    out = {f"baseline-{s}": save(img, subsampling=k) for s, k in (("420", 2), ("422", 1), ("444", 0))}
    out["progressive-420"] = save(img, subsampling=2, progressive=True)
    out["progressive-444"] = save(img, subsampling=0, progressive=True)
    out["restart-420"] = save(img, subsampling=2, restart_marker_rows=1)
    out["restart-444"] = save(img, subsampling=0, restart_marker_rows=1)
    out["gray"] = save(img.convert("L"))
    out["cmyk"] = save(img.convert("CMYK"))
    adobe = out["cmyk"].index(b"Adobe")
    out["ycck"] = out["cmyk"][: adobe + 11] + b"\x02" + out["cmyk"][adobe + 12 :]
    out["rgb-coded"] = save(img, keep_rgb=True)
    icc = bytes(range(256)) * 280
    out["icc"] = save(img, icc_profile=icc)
    for o in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = o
        out[f"exif-{o}"] = save(img, exif=exif.tobytes())
    thumb = save(img.resize((160, 120)), subsampling=1)
    out["exif-thumbnail"] = insert_segments(save(img), exif_app1(6, thumb, big_endian=True))
    sof = b"\x08" + struct.pack(">HH", 20000, 20000) + b"\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    out["comment-sof"] = insert_segments(save(img), segment(0xFE, b"\xff\xc0\x00\x11" + sof))
    return out
