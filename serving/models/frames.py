"""Frames as clients send them: JPEG bytes in, a letterboxed 640×640 batch for the model, boxes back in the frame.

Shipped beside ``model.py`` in the version directory (``serving.models.yolov8n_files``); torch only, the decoders
imported where they exist. The same code runs on a GPU instance (nvJPEG through ``torchvision.io.decode_jpeg``,
batched) and on a CPU instance (``torchvision`` on CPU, else Pillow), so the CPU tests prove the GPU's geometry.

* ``jpeg_size``: the frame's width and height from its SOF header, read before any decode, so a hostile header
  (65535×65535) is refused before it can allocate anything;
* ``frame_bytes``: a frame's bytes out of a request row (rows of one request are zero-padded to the longest);
* ``Decoder``: a batch of JPEG frames → RGB ``[3, H, W]`` uint8 tensors on the device, or a ``FrameError`` for
  each frame that does not decode (the others still do);
* ``letterbox``: Ultralytics' ``LetterBox`` (scale to fit keeping the aspect, pad 114 around, centred), written
  into a slot of the model's uint8 NHWC input; returns the frame's geometry;
* ``unletterbox``: detections [B, N, 6] from the 640×640 space back to each frame's own pixels (pad off, scale
  undone, clipped to the frame);
* ``letterboxed_forward``: one frame through letterbox, the model and ``unletterbox`` with static shapes (what a GPU
  instance captures in one CUDA graph per frame size).

Usage::

    w, h = jpeg_size(data)                                  # FrameError when not a JPEG or too large
    images = Decoder(device).decode([data1, data2])         # [tensor [3,H,W] | FrameError, ...]
    geo = letterbox(images[0], batch[0])                    # (left, top, sx, sy, w, h)
    det = unletterbox(det, torch.tensor([geo, ...]))        # boxes in each frame's pixels
"""

from __future__ import annotations

import io
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

SIZE = 640
PAD = 114
# A frame larger than this is refused from its header (8K UHD: 33 M pixels, 100 MB once decoded to RGB).
MAX_PIXELS = 7680 * 4320
MAX_SIDE = 8192

Geometry = tuple[float, float, float, float, float, float]  # left, top, sx, sy, width, height


class FrameError(ValueError):
    """A frame that cannot be served: not a JPEG, corrupt, or too large; the message is for the client."""


def _u16(b, i: int) -> int:
    return (b[i] << 8) | b[i + 1]


# SOF markers (C0–CF) except DHT (C4), JPG (C8) and DAC (CC): the frame header with the image's size.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def jpeg_size(data, *, max_pixels: int = MAX_PIXELS, max_side: int = MAX_SIDE) -> tuple[int, int]:
    """(width, height) from a JPEG's SOF header; ``FrameError`` when ``data`` is no JPEG or the frame is too large.

    Walks the marker segments from SOI by their lengths (a few steps; no entropy-coded data is read); the frame
    must end with EOI.
    """
    b = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else data
    n = len(b)
    if n < 4 or b[0] != 0xFF or b[1] != 0xD8:
        raise FrameError(f"not a JPEG frame ({n} bytes, no SOI marker FFD8 at the start)")
    if b[n - 2] != 0xFF or b[n - 1] != 0xD9:
        # A cut upload: refused here, since nvJPEG may decode what is there and answer boxes for half a frame.
        raise FrameError(f"corrupt JPEG: truncated ({n} bytes, no end-of-image marker FFD9 at the end)")
    i = 2
    while i + 4 <= n:
        if b[i] != 0xFF:
            raise FrameError(f"corrupt JPEG: no marker at byte {i}")
        marker = b[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # TEM, RSTn: no length
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # EOI, SOS before any frame header
            break
        length = _u16(b, i + 2)
        if length < 2:
            raise FrameError(f"corrupt JPEG: segment length {length} at byte {i}")
        if marker in _SOF:
            if i + 9 > n or length < 8:
                raise FrameError("corrupt JPEG: truncated frame header")
            h, w = _u16(b, i + 5), _u16(b, i + 7)
            if w == 0 or h == 0:
                raise FrameError(f"JPEG frame of {w}x{h} pixels (the height must be in the header)")
            if w > max_side or h > max_side or w * h > max_pixels:
                raise FrameError(
                    f"JPEG frame of {w}x{h} pixels is larger than this model serves "
                    f"(at most {max_side} per side and {max_pixels} pixels)"
                )
            return w, h
        i += 2 + length
    raise FrameError("corrupt JPEG: no frame header (SOF) before the image data")


def frame_bytes(row: torch.Tensor) -> torch.Tensor:
    """A request row (uint8 [L], CPU) without the zero padding after the frame: a JPEG ends with EOI (FFD9), so its
    last byte is never zero and trailing zeros are padding from a request of frames of different lengths."""
    if len(row) and int(row[-1]) != 0:  # one frame per request: no padding (the usual case, no scan)
        return row
    nz = row.nonzero()
    return row[: int(nz[-1]) + 1] if len(nz) else row[:0]


def _np_bytes(frame: torch.Tensor):
    return frame.numpy() if frame.device.type == "cpu" else frame.cpu().numpy()


class Decoder:
    """JPEG frames → RGB uint8 ``[3, H, W]`` on ``device``.

    ``mode``: ``gpu`` (nvJPEG through torchvision, batched), ``cpu`` (torchvision's libjpeg, else Pillow) or
    ``auto`` (GPU when the device is CUDA and torchvision can decode there). A batch that fails as a whole is
    decoded frame by frame, so one corrupt frame fails only itself.
    """

    def __init__(self, device: torch.device, mode: str = "auto"):
        self.device = device
        self._tv = None
        try:
            from torchvision import io as tvio

            self._tv = tvio
        except Exception:  # noqa: BLE001 - no torchvision (or one built for another torch): Pillow on CPU
            pass
        if mode not in ("auto", "gpu", "cpu"):
            raise ValueError(f"decode mode {mode!r}: auto, gpu or cpu")
        gpu_ok = device.type == "cuda" and self._tv is not None
        if mode == "gpu" and not gpu_ok:
            raise RuntimeError("decode=gpu needs a CUDA device and torchvision with nvJPEG")
        self.on_gpu = gpu_ok and mode != "cpu"
        if not self.on_gpu and self._tv is None:
            import PIL.Image  # noqa: F401 - fail at start, not on the first request

    def warm(self, sizes: Sequence[int] = (1, 8)) -> None:
        """Decode a small frame in batches of ``sizes`` once (nvJPEG's handles and buffers are made on first use)."""
        if not self.on_gpu:
            return
        assert self._tv is not None
        frame = self._tv.encode_jpeg(torch.full((3, 480, 640), PAD, dtype=torch.uint8))
        for n in sizes:
            self.decode([frame] * n)
        torch.cuda.synchronize(self.device)

    @property
    def name(self) -> str:
        return "nvjpeg" if self.on_gpu else ("torchvision-cpu" if self._tv is not None else "pillow")

    def decode(self, frames: Sequence[torch.Tensor]) -> list[Union[torch.Tensor, FrameError]]:
        if not frames:
            return []
        if self.on_gpu:
            try:
                return list(self._gpu(list(frames)))
            except Exception:  # noqa: BLE001 - one bad frame fails nvJPEG's whole batch: one by one below
                pass
        return [self._one(f) for f in frames]

    def _gpu(self, frames):
        assert self._tv is not None
        return self._tv.decode_jpeg(frames, mode=self._tv.ImageReadMode.RGB, device=self.device)

    def _one(self, frame: torch.Tensor) -> Union[torch.Tensor, FrameError]:
        if self.on_gpu:
            try:
                return self._gpu([frame])[0]
            except Exception:  # noqa: BLE001 - nvJPEG refuses some valid files (rare subsamplings): CPU below
                pass
        try:
            if self._tv is not None:
                img = self._tv.decode_jpeg(frame, mode=self._tv.ImageReadMode.RGB)
            else:
                img = _pillow(frame)
        except FrameError as e:
            return e
        except Exception as e:  # noqa: BLE001 - the decoder's own words for a corrupt frame
            return FrameError(f"corrupt JPEG: {type(e).__name__}: {e}"[:300])
        return img.to(self.device, non_blocking=True)


def _pillow(frame: torch.Tensor) -> torch.Tensor:
    import numpy as np
    from PIL import Image

    img = Image.open(io.BytesIO(_np_bytes(frame).tobytes()))
    if img.format != "JPEG":
        raise FrameError(f"not a JPEG frame ({img.format})")
    rgb = np.asarray(img.convert("RGB"))
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1)


def letterbox_geometry(w: int, h: int, size: int = SIZE) -> tuple[int, int, int, int]:
    """(new_w, new_h, left, top) of Ultralytics' LetterBox for a w×h frame (scale up or down, centred)."""
    r = min(size / h, size / w)
    new_w, new_h = int(round(w * r)), int(round(h * r))
    dw, dh = (size - new_w) / 2, (size - new_h) / 2
    return new_w, new_h, int(round(dw - 0.1)), int(round(dh - 0.1))


def geometry(w: int, h: int, size: int = SIZE) -> Geometry:
    """(left, top, sx, sy, w, h) of a w×h frame letterboxed to ``size`` (what ``letterbox`` returns)."""
    new_w, new_h, left, top = letterbox_geometry(w, h, size)
    return (float(left), float(top), new_w / w, new_h / h, float(w), float(h))


def letterbox(image: torch.Tensor, out: torch.Tensor, size: int = SIZE) -> Geometry:
    """Write ``image`` (uint8 [3, H, W]) letterboxed into ``out`` (uint8 [size, size, 3], same device).

    Resize like OpenCV's ``INTER_LINEAR`` (bilinear, half-pixel centres, no antialiasing), round to uint8, pad
    114. Returns the frame's geometry (left, top, sx, sy, w, h): the resized image's true scale per axis
    (new_w / w, new_h / h) rather than Ultralytics' single ratio, which is off by up to half a pixel where
    ``w * r`` was rounded, so boxes map back exactly.
    """
    _, h, w = image.shape
    new_w, new_h, left, top = letterbox_geometry(w, h, size)
    out.fill_(PAD)
    if (new_w, new_h) == (w, h):
        resized = image
    else:
        x = image.unsqueeze(0).float()
        resized = (
            F.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=False)
            .round_()
            .clamp_(0, 255)
            .to(torch.uint8)[0]
        )
    out[top : top + new_h, left : left + new_w].copy_(resized.permute(1, 2, 0))
    return geometry(w, h, size)


def to_letterbox(boxes: torch.Tensor, geo: Sequence[float]) -> torch.Tensor:
    """xyxy boxes in a frame's pixels → the letterboxed 640×640 space (the inverse of ``unletterbox``)."""
    left, top, sx, sy = geo[:4]
    out = boxes.clone().float()
    out[..., [0, 2]] = out[..., [0, 2]] * sx + left
    out[..., [1, 3]] = out[..., [1, 3]] * sy + top
    return out


def unletterbox(det: torch.Tensor, geo: torch.Tensor) -> torch.Tensor:
    """Detections [B, N, 6] (x1 y1 x2 y2 score class, 640×640 space) → each frame's pixels, clipped to it.

    ``geo`` [B, 6]: (left, top, sx, sy, w, h) per frame from ``letterbox``. Rows past a frame's count are zero
    and stay zero (score and class are untouched; the corners clip to 0). A few batched kernels, whatever B.
    """
    # Slices and repeats only: a list index would copy it from the host and wait for the GPU mid-execute.
    g = geo.to(det.device, torch.float32)[:, None, :]
    offset, scale, limit = g[..., 0:2].repeat(1, 1, 2), g[..., 2:4].repeat(1, 1, 2), g[..., 4:6].repeat(1, 1, 2)
    boxes = ((det[..., :4] - offset) / scale).clamp_(min=0).minimum(limit)
    return torch.cat((boxes, det[..., 4:]), -1) * (det[..., 4:5] > 0)


def letterbox_batch(images: Sequence[torch.Tensor], out: torch.Tensor, size: int = SIZE) -> list[Geometry]:
    """``letterbox`` for a batch: ``images[i]`` into ``out[i]``; frames of one size are resized in one call (the
    kernels a batch launches grow with its distinct sizes, not its frames). Returns each frame's geometry."""
    if not images:
        return []
    out[: len(images)].fill_(PAD)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, img in enumerate(images):
        groups.setdefault((int(img.shape[1]), int(img.shape[2])), []).append(i)
    geos: list[Geometry] = [(0.0,) * 6] * len(images)  # type: ignore[list-item]
    for (h, w), idx in groups.items():
        new_w, new_h, left, top = letterbox_geometry(w, h, size)
        x = torch.stack([images[i] for i in idx]) if len(idx) > 1 else images[idx[0]].unsqueeze(0)
        if (new_w, new_h) != (w, h):
            x = (
                F.interpolate(x.float(), size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=False)
                .round_()
                .clamp_(0, 255)
                .to(torch.uint8)
            )
        # One copy per frame: an index tensor would come from the host and wait for the GPU mid-execute.
        for j, i in enumerate(idx):
            out[i, top : top + new_h, left : left + new_w].copy_(x[j].permute(1, 2, 0))
            geos[i] = geometry(w, h, size)
    return geos


def letterboxed_forward(image: torch.Tensor, slot: torch.Tensor, geo: torch.Tensor, forward) -> tuple:
    """One frame end to end on its device: ``image`` (uint8 [3, H, W]) letterboxed into ``slot`` (uint8
    [1, size, size, 3]), ``forward(slot)`` → (detections [1, N, 6] in the model's space, counts), the boxes mapped
    back to the frame with ``geo`` ([1, 6] on the device: ``geometry(W, H)``). Static shapes and no host sync for a
    given frame size, so a GPU instance captures the whole of it in one CUDA graph per frame size (no launches
    between letterbox, model, NMS and boxes back); a CPU instance runs the same code eagerly."""
    letterbox(image, slot[0], slot.shape[1])
    det, count = forward(slot)
    return unletterbox(det, geo), count


def frame_sizes(text: str) -> list[tuple[int, int]]:
    """The backend's ``frame_graphs`` parameter: ``"1280x720,640x480"`` → [(1280, 720), (640, 480)]; "" or
    "none" → []; anything else refused (ValueError naming the parameter and the fix)."""
    if text.strip().lower() in ("", "none"):
        return []
    out = []
    for item in text.split(","):
        w, sep, h = item.strip().lower().partition("x")
        if not (sep and w.isdigit() and h.isdigit() and 0 < int(w) <= MAX_SIDE and 0 < int(h) <= MAX_SIDE):
            raise ValueError(
                f"parameter frame_graphs: {item.strip()!r} is not WIDTHxHEIGHT (1..{MAX_SIDE} each); "
                'write e.g. "1280x720,1920x1080", or "none"'
            )
        out.append((int(w), int(h)))
    return out


def prepare(
    rows: Sequence[torch.Tensor], decoder: Decoder, max_pixels: int = MAX_PIXELS, max_side: int = MAX_SIDE
) -> list[Union[torch.Tensor, FrameError]]:
    """Request rows → decoded frames (or the FrameError of each bad one): header check first, then one batched
    decode of the frames that passed it."""
    out: list[Optional[Union[torch.Tensor, FrameError]]] = [None] * len(rows)
    good: list[int] = []
    frames: list[torch.Tensor] = []
    for i, row in enumerate(rows):
        f = frame_bytes(row)
        try:
            jpeg_size(_np_bytes(f), max_pixels=max_pixels, max_side=max_side)
        except FrameError as e:
            out[i] = e
            continue
        good.append(i)
        frames.append(f)
    for i, img in zip(good, decoder.decode(frames)):
        out[i] = img
    return [x if x is not None else FrameError("frame was not decoded") for x in out]
