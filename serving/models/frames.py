"""Frames as clients send them: JPEG bytes in, a letterboxed 640×640 batch for the model, boxes back in the frame.

Shipped beside ``model.py`` in the version directory with ``jpeg_planes.py`` (``serving.models.yolov8n_files``);
torch only, the decoders imported where they exist. The same code runs on a GPU instance (nvJPEG, batched: through
``torchvision.io.decode_jpeg`` for its RGB, through ``jpeg_planes`` for its planes with libjpeg's upsampling and
colour conversion) and on a CPU instance (``torchvision`` on CPU, else Pillow), so the CPU tests prove the GPU's
geometry.

* ``read_header``: what the markers say before the image data (size, components, sampling, libjpeg's colour
  space, EXIF orientation), walked as libjpeg walks them and read before any decode, so a hostile header
  (65535×65535, or a small SOF hidden where libjpeg skips it) is refused before it can allocate anything, and so is
  a frame too thin to letterbox; ``jpeg_size``: its upright (width, height);
* ``frame_bytes``: a frame's bytes out of a request row (rows of one request are zero-padded to the longest);
* ``route``: from a header and the ``jpeg_decoder`` choice, which decoder a GPU instance gives the frame: with
  ``exact`` nvJPEG's RGB only where it is libjpeg's (baseline gray or 4:4:4 YCbCr), nvJPEG's planes upsampled and
  converted as libjpeg does for baseline 4:2:0 / 4:2:2 (``jpeg_planes``), libjpeg on the host for the rest
  (progressive, RGB-coded, CMYK / YCCK, other chroma layouts); with ``nvjpeg`` nvJPEG's RGB for every frame it
  decodes at all, libjpeg only for RGB-coded, CMYK / YCCK and junk between markers;
* ``Decoder``: a batch of JPEG frames → upright RGB ``[3, H, W]`` uint8 tensors on the device, libjpeg's (Pillow's)
  pixels, or a ``FrameError`` for each frame that does not decode (the others still do); a frame one GPU path
  refuses falls back to libjpeg alone; ``orient`` turns a decoded frame upright by its EXIF orientation;
* ``letterbox``: Ultralytics' ``LetterBox`` (scale to fit keeping the aspect, pad 114 around, centred), written
  into a slot of the model's uint8 NHWC input; returns the frame's geometry;
* ``unletterbox``: detections [B, N, 6] from the 640×640 space back to each frame's own pixels (pad off, scale
  undone, clipped to the frame);
* ``letterboxed_forward``: one frame through letterbox, the model and ``unletterbox`` with static shapes (what a GPU
  instance captures in one CUDA graph per frame size).

Usage::

    head = read_header(data)                                # FrameError when not a JPEG or too large
    w, h = head.upright                                     # = jpeg_size(data): the frame answers are in
    route(head)                                             # ("planes", "ycbcr 4:2:0 planes")
    route(head, "nvjpeg")                                   # ("gpu", "ycbcr 4:2:0")
    images = Decoder(device).decode([data1, data2])         # [tensor [3,H,W] upright | FrameError, ...]
    geo = letterbox(images[0], batch[0])                    # (left, top, sx, sy, w, h)
    det = unletterbox(det, torch.tensor([geo, ...]))        # boxes in each frame's pixels
"""

from __future__ import annotations

import io
import re
import struct
from collections import Counter
from typing import NamedTuple, Optional, Sequence, Union

import torch
import torch.nn.functional as F

try:
    from . import jpeg_planes
except ImportError:  # beside model.py in a Triton version directory, where this file is a top-level module
    import jpeg_planes  # type: ignore[no-redef]

SIZE = 640
PAD = 114
STRIDE = 32  # YOLOv8n's largest stride: the rect letterbox pads each side to a multiple of it
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
# The processes served: baseline, extended and progressive Huffman, 8 bits (what cameras, phones and editors write).
# libjpeg refuses the hierarchical ones; lossless and arithmetic coding are refused here for the same reason.
_SERVED_SOF = {0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive"}
# Markers libjpeg's read_markers (jdmarker.c) knows; any other stops it (JERR_UNKNOWN_MARKER).
_KNOWN = _SOF | {0xC4, 0xCC, 0xDB, 0xDC, 0xDD, 0xFE} | set(range(0xE0, 0xF0))
_XMP = b"http://ns.adobe.com/xap/1.0/\x00"
_XMP_ORIENTATION = re.compile(rb'tiff:Orientation(="|>)([0-9])')


class Header(NamedTuple):
    """What a JPEG's markers say before its image data, read as libjpeg reads them (``read_header``).

    ``width``, ``height``: the stored grid (SOF); ``upright``: the frame the client sees, the stored grid turned by
    ``orientation`` (EXIF 1–8, as ``PIL.ImageOps.exif_transpose`` reads it; 1 when absent). ``colour``: the colour
    space libjpeg decodes from (``gray``, ``ycbcr``, ``rgb``, ``cmyk``, ``ycck``: jdapimin.c's
    default_decompress_parms, from JFIF, Adobe APP14 and the component ids). ``sampling``: (h, v) per component.
    ``extraneous``: bytes libjpeg skips between markers with a warning (junk, ``FF 00``).
    """

    width: int
    height: int
    components: int
    sampling: tuple[tuple[int, int], ...]
    process: str
    colour: str
    orientation: int = 1
    extraneous: int = 0

    @property
    def upright(self) -> tuple[int, int]:
        return (self.height, self.width) if self.orientation >= 5 else (self.width, self.height)

    @property
    def subsampling(self) -> str:
        """``4:4:4``, ``4:2:2``, ``4:2:0``, ``4:4:0``, … of a colour frame (luma's factors over chroma's); ``gray``."""
        if self.components == 1:
            return "gray"
        (h0, v0), rest = self.sampling[0], self.sampling[1:]
        if any(s != rest[0] for s in rest[1:]) or any(h0 % h or v0 % v for h, v in rest):
            return "irregular"
        h, v = h0 // rest[0][0], v0 // rest[0][1]
        return {(1, 1): "4:4:4", (2, 1): "4:2:2", (2, 2): "4:2:0", (1, 2): "4:4:0", (4, 1): "4:1:1"}.get(
            (h, v), f"{h}x{v}"
        )


def _next_marker(b: bytes, i: int) -> tuple[int, int]:
    """(marker, offset after it) from ``i`` as libjpeg's next_marker finds it: non-FF bytes skipped, fill bytes
    (FF FF …) swallowed, a stuffed ``FF 00`` skipped as data; FrameError at the end of the data."""
    n = len(b)
    while True:
        j = b.find(b"\xff", i)
        if j < 0:
            break
        k = j + 1
        while k < n and b[k] == 0xFF:
            k += 1
        if k >= n:
            break
        if b[k] != 0:
            return b[k], k + 1
        i = k + 1
    raise FrameError("corrupt JPEG: no image data (SOS) before the end")


def _sof(seg: bytes, marker: int, at: int) -> tuple[int, int, int, tuple[tuple[int, int], ...], tuple[int, ...]]:
    """(width, height, components, sampling, component ids) of a SOF segment's payload, checked as libjpeg's get_sof
    and initial_setup check them."""
    if marker not in _SERVED_SOF:
        raise FrameError(f"JPEG process SOF{marker - 0xC0} (byte {at}) is not served: baseline or progressive only")
    if len(seg) < 6:
        raise FrameError("corrupt JPEG: truncated frame header")
    bits, h, w, nc = seg[0], _u16(seg, 1), _u16(seg, 3), seg[5]
    if len(seg) != 6 + 3 * nc:
        raise FrameError(f"corrupt JPEG: frame header of {len(seg) + 2} bytes for {nc} components")
    if bits != 8:
        raise FrameError(f"JPEG of {bits} bits per sample: 8 only")
    if nc not in (1, 3, 4):
        raise FrameError(f"JPEG of {nc} components: 1 (gray), 3 (colour) or 4 (CMYK) only")
    comps = [seg[6 + 3 * c : 9 + 3 * c] for c in range(nc)]
    sampling = tuple((c[1] >> 4, c[1] & 15) for c in comps)
    if any(not (1 <= x <= 4) for s in sampling for x in s):
        raise FrameError(f"corrupt JPEG: sampling factors {sampling}")
    if w == 0 or h == 0:
        raise FrameError(f"JPEG frame of {w}x{h} pixels (the height must be in the header)")
    return w, h, nc, sampling, tuple(c[0] for c in comps)


def _orientation(exif: bytes) -> int:
    """EXIF orientation (tag 0x0112 of IFD0) from an APP1 ``Exif\\0\\0`` payload; 0 when the tag is not there."""
    t = exif[6:]
    if t[:4] not in (b"II*\x00", b"MM\x00*"):
        return 0
    order = "<" if t[:2] == b"II" else ">"
    try:
        (ifd,) = struct.unpack_from(order + "I", t, 4)
        (count,) = struct.unpack_from(order + "H", t, ifd)
        for e in range(count):
            tag, typ, _n = struct.unpack_from(order + "HHI", t, ifd + 2 + 12 * e)
            if tag == 0x0112:
                if typ == 3:
                    return struct.unpack_from(order + "H", t, ifd + 10 + 12 * e)[0]
                if typ == 4:
                    return struct.unpack_from(order + "I", t, ifd + 10 + 12 * e)[0]
                return 0
    except struct.error:
        pass
    return 0


def read_header(data, *, max_pixels: int = MAX_PIXELS, max_side: int = MAX_SIDE) -> Header:
    """A JPEG's ``Header`` from its markers, walked as libjpeg walks them (jdmarker.c read_markers): from SOI up to
    the first SOS, each segment skipped by its length, fill bytes and junk between them skipped as libjpeg skips
    them. So the size here is the size every decoder decodes: a SOF-looking pair of bytes inside a COM or APPn
    segment (an EXIF thumbnail's own SOF), or in junk after ``FF 00``, is not a frame header to libjpeg and not to
    this walk. ``FrameError`` when the data is no JPEG, is cut, has a second SOF or a segment running past its end,
    or when the frame is larger than ``max_side`` / ``max_pixels`` or letterboxes to nothing (1280×1).

    >>> read_header(open("phone.jpg", "rb").read())  # stored 4032×3024, EXIF orientation 6
    Header(width=4032, height=3024, components=3, sampling=((2, 2), (1, 1), (1, 1)), process='baseline',
           colour='ycbcr', orientation=6, extraneous=0)                    # .upright == (3024, 4032)
    """
    b = bytes(data)
    n = len(b)
    if n < 4 or b[0] != 0xFF or b[1] != 0xD8:
        raise FrameError(f"not a JPEG frame ({n} bytes, no SOI marker FFD8 at the start)")
    if b[n - 2] != 0xFF or b[n - 1] != 0xD9:
        # A cut upload: refused here, since nvJPEG may decode what is there and answer boxes for half a frame.
        raise FrameError(f"corrupt JPEG: truncated ({n} bytes, no end-of-image marker FFD9 at the end)")
    i, sof, extraneous = 2, None, 0
    jfif, adobe, exif, xmp = False, None, 0, 0
    while True:
        start = i
        marker, i = _next_marker(b, i)
        extraneous += (i - 1 - start) - b.count(b"\xff", start, i - 1)
        if marker == 0xDA:
            break
        if marker == 0xD9:
            break  # EOI before any image data: libjpeg's "no image"
        if marker == 0xD8:
            raise FrameError(f"corrupt JPEG: a second start-of-image marker at byte {i - 2}")
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # TEM, RSTn: no length, nothing to libjpeg here
            continue
        if marker not in _KNOWN:
            raise FrameError(f"corrupt JPEG: marker FF{marker:02X} at byte {i - 2} (libjpeg stops there)")
        if i + 2 > n:
            raise FrameError("corrupt JPEG: truncated segment")
        length = _u16(b, i)
        if length < 2 or i + length > n:
            raise FrameError(f"corrupt JPEG: segment FF{marker:02X} at byte {i - 2} of length {length} in {n} bytes")
        seg = b[i + 2 : i + length]
        if marker in _SOF:
            if sof is not None:
                raise FrameError(f"corrupt JPEG: a second frame header (SOF) at byte {i - 2}")
            sof = (_sof(seg, marker, i - 2), _SERVED_SOF.get(marker, ""))
        elif marker == 0xE0 and length >= 16 and seg[:5] == b"JFIF\x00":
            jfif = True
        elif marker == 0xEE and length >= 14 and seg[:5] == b"Adobe":
            adobe = seg[11]
        elif marker == 0xE1 and seg[:6] == b"Exif\x00\x00" and not exif:
            exif = _orientation(seg) or -1
        elif marker == 0xE1 and seg.startswith(_XMP):
            m = _XMP_ORIENTATION.search(seg)
            xmp = int(m[2]) if m else 0
        i += length
    if sof is None:
        raise FrameError("corrupt JPEG: no frame header (SOF) before the image data")
    if marker == 0xD9:
        raise FrameError("corrupt JPEG: no image data (SOS) before the end-of-image marker")
    (w, h, nc, sampling, ids), process = sof
    orientation = exif if exif > 0 else xmp  # Pillow's getexif: XMP's tiff:Orientation where EXIF has none
    orientation = orientation if 2 <= orientation <= 8 else 1
    head = Header(w, h, nc, sampling, process, _colour(nc, jfif, adobe, ids), orientation, extraneous)
    uw, uh = head.upright
    if w > max_side or h > max_side or w * h > max_pixels:
        raise FrameError(
            f"JPEG frame of {uw}x{uh} pixels is larger than this model serves "
            f"(at most {max_side} per side and {max_pixels} pixels)"
        )
    new_w, new_h, _, _ = letterbox_geometry(uw, uh)
    if new_w < 1 or new_h < 1:
        raise FrameError(f"JPEG frame of {uw}x{uh} pixels letterboxes to {new_w}x{new_h}: nothing to detect in")
    return head


def _colour(nc: int, jfif: bool, adobe: Optional[int], ids: tuple[int, ...]) -> str:
    """The colour space libjpeg decodes from (jdapimin.c default_decompress_parms)."""
    if nc == 1:
        return "gray"
    if nc == 4:
        return "ycck" if adobe is not None and adobe != 0 else "cmyk"
    if jfif:
        return "ycbcr"
    if adobe is not None:
        return "rgb" if adobe == 0 else "ycbcr"
    return "rgb" if ids == (82, 71, 66) else "ycbcr"  # 'R', 'G', 'B'


def jpeg_size(data, *, max_pixels: int = MAX_PIXELS, max_side: int = MAX_SIDE) -> tuple[int, int]:
    """(width, height) of the frame as served (``read_header``'s upright size); ``FrameError`` as ``read_header``."""
    return read_header(data, max_pixels=max_pixels, max_side=max_side).upright


def frame_bytes(row: torch.Tensor) -> torch.Tensor:
    """A request row (uint8 [L], CPU) without the zero padding after the frame: a JPEG ends with EOI (FFD9), so its
    last byte is never zero and trailing zeros are padding from a request of frames of different lengths."""
    if len(row) and int(row[-1]) != 0:  # one frame per request: no padding (the usual case, no scan)
        return row
    nz = row.nonzero()
    return row[: int(nz[-1]) + 1] if len(nz) else row[:0]


def _np_bytes(frame: torch.Tensor):
    return frame.numpy() if frame.device.type == "cpu" else frame.cpu().numpy()


# ``route``'s choices (the model's ``jpeg_decoder`` parameter, stack config ``models[].jpeg_decoder``).
JPEG_DECODERS = ("exact", "nvjpeg")
# Chroma layouts nvJPEG decodes (nvjpegChromaSubsampling_t); an irregular one (Cb and Cr sampled apart) is not one.
_NVJPEG_SUBSAMPLING = {"4:4:4", "4:2:2", "4:2:0", "4:4:0", "4:1:1"}


def route(header: Header, jpeg_decoder: str = "exact") -> tuple[str, str]:
    """Which decoder a GPU instance gives this frame: ``("gpu", why)`` for nvJPEG's RGB, ``("planes", why)`` for
    nvJPEG's planes upsampled and converted as libjpeg does (``jpeg_planes.NvjpegPlanes``), ``("cpu", why)`` for
    libjpeg on the host. Decided from the header alone (a pure function; the CPU tests hold it).

    ``jpeg_decoder="exact"``: libjpeg's pixels. nvJPEG's RGB matches libjpeg exactly (``tests/test_frames.py``'s
    table, H200, torchvision 0.26) on baseline gray frames and baseline YCbCr frames without chroma subsampling
    (4:4:4), restart markers or not. On baseline 4:2:0 / 4:2:2 (most camera and phone frames) its RGB is 48–73 levels
    off (chroma upsampled otherwise than libjpeg's "fancy" triangle filter) but its planes are libjpeg's: those go
    to ``planes``. libjpeg on the host for the rest: progressive frames (3 levels off at 4:4:4), RGB-coded frames
    (Adobe transform 0 or component ids 'R','G','B': nvJPEG applies the YCbCr transform anyway, up to 233 levels
    off), CMYK / YCCK (refused), other chroma layouts, and frames with junk between markers (its own marker parser
    may not skip it as libjpeg does).

    ``jpeg_decoder="nvjpeg"``: nvJPEG for every frame it decodes at all, pixels near libjpeg's but not equal (gray
    and YCbCr of any usual subsampling, baseline or progressive); libjpeg still for what it gets badly wrong or
    refuses (RGB-coded, CMYK / YCCK, junk between markers, an irregular chroma layout).

    >>> route(Header(1280, 720, 3, ((2, 2), (1, 1), (1, 1)), "baseline", "ycbcr"))
    ('planes', 'ycbcr 4:2:0 planes')
    >>> route(Header(1280, 720, 3, ((2, 2), (1, 1), (1, 1)), "baseline", "ycbcr"), "nvjpeg")
    ('gpu', 'ycbcr 4:2:0')
    """
    if jpeg_decoder not in JPEG_DECODERS:
        raise ValueError(f"jpeg_decoder {jpeg_decoder!r}: exact or nvjpeg")
    exact = jpeg_decoder == "exact"
    if header.extraneous:
        return "cpu", "junk between markers"
    if exact and header.process == "progressive":
        return "cpu", "progressive"
    if header.colour == "gray":
        return "gpu", "gray"
    if header.colour != "ycbcr":
        return "cpu", f"{header.colour}-coded"
    sub = header.subsampling
    if sub == "4:4:4" or (not exact and sub in _NVJPEG_SUBSAMPLING):
        return "gpu", f"ycbcr {sub}"
    if header.process == "baseline" and header.sampling in jpeg_planes.FACTORS:
        return "planes", f"ycbcr {sub} planes"
    return "cpu", f"{sub} chroma"


def orient(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """uint8 [C, H, W] as stored → upright, for EXIF ``orientation`` 1–8 (what ``PIL.ImageOps.exif_transpose``
    does: 2 mirror, 3 rotate 180, 4 flip, 5 transpose, 6 rotate 90 clockwise, 7 transverse, 8 rotate 90
    anticlockwise). Flips and a transpose on the device, made contiguous."""
    if orientation <= 1 or orientation > 8:
        return image
    x = image.transpose(1, 2) if orientation >= 5 else image
    dims = {2: (2,), 3: (1, 2), 4: (1,), 5: (), 6: (2,), 7: (1, 2), 8: (1,)}[orientation]
    return (x.flip(dims) if dims else x).contiguous()


class Decoder:
    """JPEG frames → upright RGB uint8 ``[3, H, W]`` on ``device``, the pixels libjpeg (Pillow) gives.

    ``mode``: ``gpu`` (nvJPEG, batched, for the frames ``route`` gives it: its RGB through torchvision, its planes
    through ``jpeg_planes.NvjpegPlanes`` with libjpeg's upsampling and colour conversion; libjpeg on the host for
    the others), ``cpu`` (torchvision's libjpeg, else Pillow) or ``auto`` (GPU when the device is CUDA and
    torchvision can decode there); ``jpeg_decoder``: ``route``'s choice on a GPU (``exact``: libjpeg's pixels,
    ``nvjpeg``: nvJPEG's RGB wherever it decodes; a CPU decodes every frame with libjpeg either way);
    ``torchvision=False`` decodes on the CPU with Pillow even where torchvision is installed; ``cpu_threads`` > 1
    decodes a batch's host frames on that many threads. EXIF orientation is applied to every frame (``orient``).
    ``served`` counts the frames each decoder gave (``nvjpeg``, ``nvjpeg-planes``, ``torchvision-cpu``,
    ``pillow``). A batch that fails as a whole is decoded frame by frame, and a frame a GPU path refuses goes to
    libjpeg, so one corrupt frame fails only itself. ``planes_error``: why nvJPEG's planes are not used on a GPU
    instance with ``exact`` (no libnvjpeg to load, nvJPEG's status, no hardware JPEG decoder), else None: those
    frames then go to libjpeg. ``planes_info``: the libnvjpeg, its version and the kernel used, for the logs.
    """

    def __init__(
        self,
        device: torch.device,
        mode: str = "auto",
        *,
        torchvision: bool = True,
        cpu_threads: int = 1,
        jpeg_decoder: str = "exact",
    ):
        if jpeg_decoder not in JPEG_DECODERS:
            raise ValueError(
                f"parameter jpeg_decoder: {jpeg_decoder!r} is not exact or nvjpeg (exact: libjpeg's pixels for every "
                "frame; nvjpeg: nvJPEG for every frame it decodes, faster, pixels near libjpeg's)"
            )
        self.device = device
        self.jpeg_decoder = jpeg_decoder
        self._pool = None
        if cpu_threads > 1:  # libjpeg (torchvision's op, Pillow's decoder) runs without the GIL
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(cpu_threads, thread_name_prefix="gpuhost-libjpeg")
        self._tv = None
        if torchvision:
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
        self.cpu_name = "torchvision-cpu" if self._tv is not None else "pillow"
        self.served: Counter[str] = Counter()
        self._planes: Optional[jpeg_planes.NvjpegPlanes] = None
        self.planes_error: Optional[str] = None
        if self.on_gpu and jpeg_decoder == "exact":
            try:
                self._planes = jpeg_planes.NvjpegPlanes(device)
            except (OSError, RuntimeError, AttributeError) as e:  # AttributeError: a libnvjpeg without a call used
                self.planes_error = f"{type(e).__name__}: {e}"[:300]
            if self._planes is not None and not self._planes.hardware:
                # Measured on the H200: nvJPEG's default (software) backend gives planes up to 3 levels off libjpeg's.
                self._planes, self.planes_error = None, "no hardware JPEG decoder (nvJPEG's software planes differ)"
        if self._tv is None:
            import PIL.Image  # noqa: F401 - fail at start, not on the first request

    def warm(self, sizes: Sequence[int] = (1, 8)) -> None:
        """Decode a small frame in batches of ``sizes`` once (nvJPEG's handles and buffers are made on first use)."""
        if not self.on_gpu:
            return
        assert self._tv is not None
        frame = self._tv.encode_jpeg(torch.full((3, 480, 640), PAD, dtype=torch.uint8))
        sampling = read_header(_np_bytes(frame)).sampling
        for n in sizes:
            self._gpu([frame] * n)  # nvJPEG itself, whatever route() would say of this 4:2:0 frame
            if self._planes is not None:
                self._planes.decode([frame] * n, [(640, 480, sampling)] * n)
        torch.cuda.synchronize(self.device)

    @property
    def planes_info(self) -> Optional[str]:
        p = self._planes
        if p is None:
            return None
        return f"{p.library} {p.version}, {p.kernel} kernel" + (f" ({p.kernel_error})" if p.kernel_error else "")

    @property
    def name(self) -> str:
        if not self.on_gpu:
            return self.cpu_name
        return "+".join(["nvjpeg", *(["nvjpeg-planes"] if self._planes is not None else []), self.cpu_name])

    def decode(
        self, frames: Sequence[torch.Tensor], headers: Optional[Sequence[Header]] = None
    ) -> list[Union[torch.Tensor, FrameError]]:
        """Each frame decoded and turned upright, or its ``FrameError``. ``headers``: ``read_header`` of each frame
        (read here when not given); a decoded grid other than the header's is refused."""
        if headers is None:
            return prepare(frames, self)
        out: list[Union[torch.Tensor, FrameError]] = []
        where = [route(h, self.jpeg_decoder)[0] if self.on_gpu else "cpu" for h in headers]
        gpu = [k for k, w in enumerate(where) if w == "gpu"]
        raw: dict[int, Union[torch.Tensor, FrameError, None]] = {k: None for k in range(len(frames))}
        names: dict[int, str] = {}
        planes = [k for k, w in enumerate(where) if w == "planes"]
        for k, rgb in self._from_planes([frames[k] for k in planes], [headers[k] for k in planes]).items():
            raw[planes[k]], names[planes[k]] = rgb, "nvjpeg-planes"
        if gpu:
            try:
                for k, img in zip(gpu, self._gpu([frames[k] for k in gpu])):
                    raw[k], names[k] = img, "nvjpeg"
            except Exception:  # noqa: BLE001 - one bad frame fails nvJPEG's whole batch: one by one below
                for k in gpu:
                    try:
                        raw[k], names[k] = self._gpu([frames[k]])[0], "nvjpeg"
                    except Exception:  # noqa: BLE001 - nvJPEG refuses some valid files: libjpeg below
                        pass
        cpu = [k for k in raw if raw[k] is None]
        if self._pool is not None and len(cpu) > 1:
            done = list(self._pool.map(lambda k: self._cpu(frames[k], headers[k]), cpu))
        else:
            done = [self._cpu(frames[k], headers[k]) for k in cpu]
        for k, img in zip(cpu, done):
            raw[k], names[k] = img, self.cpu_name
        for k, head in enumerate(headers):
            out.append(self._finish(raw[k], head, names[k]))
        return out

    def _from_planes(self, frames: Sequence[torch.Tensor], headers: Sequence[Header]) -> dict[int, torch.Tensor]:
        """{index: RGB} of the frames nvJPEG's planes decoded; the others (none where the planes path is not loaded
        or failed as a whole) are left to libjpeg."""
        if not frames or self._planes is None:
            return {}
        sizes = [(h.width, h.height, h.sampling) for h in headers]
        try:
            got = self._planes.decode([f.contiguous() for f in frames], sizes)
        except Exception as e:  # noqa: BLE001 - e.g. out of device memory: libjpeg for all of them
            print(f"gpuhost-frames nvjpeg-planes failed: {type(e).__name__}: {e}"[:300], flush=True)
            return {}
        return {k: rgb for k, rgb in enumerate(got) if rgb is not None}

    def _finish(self, img, head: Header, name: str) -> Union[torch.Tensor, FrameError]:
        if isinstance(img, FrameError):
            return img
        if tuple(img.shape) != (3, head.height, head.width):
            return FrameError(
                f"corrupt JPEG: decoded to {tuple(img.shape)}, its header says {head.width}x{head.height} (refused)"
            )
        self.served[name] += 1
        return orient(img.to(self.device, non_blocking=True), head.orientation)

    def _gpu(self, frames):
        assert self._tv is not None
        return self._tv.decode_jpeg(list(frames), mode=self._tv.ImageReadMode.RGB, device=self.device)

    def _cpu(self, frame: torch.Tensor, head: Header) -> Union[torch.Tensor, FrameError]:
        """libjpeg on the host: torchvision's ``decode_jpeg`` (orientation not applied there: ``orient`` does it for
        every decoder alike), else Pillow."""
        try:
            if self._tv is not None:
                return self._tv.decode_jpeg(frame.cpu(), mode=self._tv.ImageReadMode.RGB)
            return _pillow(frame, head)
        except FrameError as e:
            return e
        except Exception as e:  # noqa: BLE001 - the decoder's own words for a corrupt frame
            return FrameError(f"corrupt JPEG: {type(e).__name__}: {e}"[:300])


def _pillow(frame: torch.Tensor, head: Header) -> torch.Tensor:
    """Pillow's decode, after its own header read (``Image.open`` decodes nothing) agrees with ``head``."""
    import numpy as np
    from PIL import Image

    img = Image.open(io.BytesIO(_np_bytes(frame).tobytes()))
    if img.format != "JPEG":
        raise FrameError(f"not a JPEG frame ({img.format})")
    if img.size != (head.width, head.height):
        raise FrameError(
            f"corrupt JPEG: Pillow reads {img.size[0]}x{img.size[1]}, the markers {head.width}x{head.height}"
        )
    rgb = np.asarray(img.convert("RGB"))
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1)


def letterbox_geometry(w: int, h: int, size: int = SIZE, rect: bool = False) -> tuple[int, int, int, int]:
    """(new_w, new_h, left, top) of Ultralytics' LetterBox for a w×h frame (scale up or down, centred).

    ``rect`` is its ``auto=True`` (what ``YOLO("x.pt").predict`` uses, ``letterbox_shape``): the padding is only
    what reaches the next multiple of ``STRIDE``, split as LetterBox splits it (``round(d - 0.1)`` first).

    >>> letterbox_geometry(1280, 720)
    (640, 360, 0, 140)
    >>> letterbox_geometry(1280, 720, rect=True)
    (640, 360, 0, 12)
    >>> letterbox_geometry(641, 480, rect=True)  # dh = 479 → 480: 1 pixel, top 0, bottom 1
    (640, 479, 0, 0)
    >>> letterbox_geometry(333, 500, rect=True)  # dw = 426 → 448: 22 pixels, 11 each side
    (426, 640, 11, 0)
    """
    r = min(size / h, size / w)
    new_w, new_h = int(round(w * r)), int(round(h * r))
    dw, dh = size - new_w, size - new_h
    if rect:
        dw, dh = dw % STRIDE, dh % STRIDE
    return new_w, new_h, int(round(dw / 2 - 0.1)), int(round(dh / 2 - 0.1))


def letterbox_shape(w: int, h: int, size: int = SIZE, rect: bool = False) -> tuple[int, int]:
    """(height, width) of the model input a w×h frame is letterboxed into: ``size``×``size``, or with ``rect`` the
    smallest multiple of ``STRIDE`` per side around the resized frame (Ultralytics' ``LetterBox(auto=True)``).

    >>> letterbox_shape(1280, 720, rect=True), letterbox_shape(1920, 1080, rect=True)
    ((384, 640), (384, 640))
    >>> letterbox_shape(640, 480, rect=True), letterbox_shape(480, 640, rect=True), letterbox_shape(1280, 720)
    ((480, 640), (640, 480), (640, 640))
    """
    if not rect:
        return size, size
    new_w, new_h, _, _ = letterbox_geometry(w, h, size, rect=True)
    return new_h + (size - new_h) % STRIDE, new_w + (size - new_w) % STRIDE


def geometry(w: int, h: int, size: int = SIZE, rect: bool = False) -> Geometry:
    """(left, top, sx, sy, w, h) of a w×h frame letterboxed to ``size`` (what ``letterbox`` returns)."""
    new_w, new_h, left, top = letterbox_geometry(w, h, size, rect)
    return (float(left), float(top), new_w / w, new_h / h, float(w), float(h))


def _slot_mode(w: int, h: int, slot_h: int, slot_w: int) -> tuple[int, bool]:
    """(size, rect) of a w×h frame letterboxed into a slot_h×slot_w slot: a square slot is the square letterbox
    (a frame whose rect shape is square letterboxes the same either way), any other the frame's rect shape."""
    size, rect = max(slot_h, slot_w), slot_h != slot_w
    if letterbox_shape(w, h, size, rect) != (slot_h, slot_w):
        raise ValueError(f"a {w}x{h} frame letterboxes to {letterbox_shape(w, h, size, True)}, not {slot_h}x{slot_w}")
    return size, rect


def letterbox(image: torch.Tensor, out: torch.Tensor) -> Geometry:
    """Write ``image`` (uint8 [3, H, W]) letterboxed into ``out`` (uint8 [size, size, 3], or the frame's rect shape
    ``letterbox_shape(W, H, rect=True)`` + [3]; same device).

    Resize like OpenCV's ``INTER_LINEAR`` (bilinear, half-pixel centres, no antialiasing), round to uint8, pad
    114. Returns the frame's geometry (left, top, sx, sy, w, h): the resized image's true scale per axis
    (new_w / w, new_h / h) rather than Ultralytics' single ratio, which is off by up to half a pixel where
    ``w * r`` was rounded, so boxes map back exactly.
    """
    _, h, w = image.shape
    size, rect = _slot_mode(w, h, int(out.shape[0]), int(out.shape[1]))
    new_w, new_h, left, top = letterbox_geometry(w, h, size, rect)
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
    return geometry(w, h, size, rect)


def to_letterbox(boxes: torch.Tensor, geo: Sequence[float]) -> torch.Tensor:
    """xyxy boxes in a frame's pixels → the letterboxed model input's space (the inverse of ``unletterbox``)."""
    left, top, sx, sy = geo[:4]
    out = boxes.clone().float()
    out[..., [0, 2]] = out[..., [0, 2]] * sx + left
    out[..., [1, 3]] = out[..., [1, 3]] * sy + top
    return out


def unletterbox(det: torch.Tensor, geo: torch.Tensor) -> torch.Tensor:
    """Detections [B, N, 6] (x1 y1 x2 y2 score class, model-input space) → each frame's pixels, clipped to it.

    ``geo`` [B, 6]: (left, top, sx, sy, w, h) per frame from ``letterbox``. Rows past a frame's count are zero
    and stay zero (score and class are untouched; the corners clip to 0). A few batched kernels, whatever B.
    """
    # Slices and repeats only: a list index would copy it from the host and wait for the GPU mid-execute.
    g = geo.to(det.device, torch.float32)[:, None, :]
    offset, scale, limit = g[..., 0:2].repeat(1, 1, 2), g[..., 2:4].repeat(1, 1, 2), g[..., 4:6].repeat(1, 1, 2)
    boxes = ((det[..., :4] - offset) / scale).clamp_(min=0).minimum(limit)
    return torch.cat((boxes, det[..., 4:]), -1) * (det[..., 4:5] > 0)


def letterbox_batch(
    images: Sequence[torch.Tensor], out: torch.Tensor, size: int = SIZE, rect: bool = False
) -> list[Geometry]:
    """``letterbox`` for a batch: ``images[i]`` into ``out[i]`` ([B, size, size, 3], or with ``rect`` the one rect
    shape all the frames share: ``rect_groups``); frames of one size are resized in one call (the kernels a batch
    launches grow with its distinct sizes, not its frames). Returns each frame's geometry."""
    if not images:
        return []
    out[: len(images)].fill_(PAD)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, img in enumerate(images):
        groups.setdefault((int(img.shape[1]), int(img.shape[2])), []).append(i)
    geos: list[Geometry] = [(0.0,) * 6] * len(images)  # type: ignore[list-item]
    for (h, w), idx in groups.items():
        if letterbox_shape(w, h, size, rect) != (out.shape[1], out.shape[2]):
            raise ValueError(f"a {w}x{h} frame letterboxes to {letterbox_shape(w, h, size, rect)}, not {out.shape}")
        new_w, new_h, left, top = letterbox_geometry(w, h, size, rect)
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
            geos[i] = geometry(w, h, size, rect)
    return geos


def rect_groups(images: Sequence[torch.Tensor], size: int = SIZE, rect: bool = False) -> dict:
    """{(height, width) of the letterboxed input: [indices of ``images`` of that shape]} in first-seen order: a
    batch runs one forward per shape (all one ``size``×``size`` group without ``rect``)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, img in enumerate(images):
        groups.setdefault(letterbox_shape(int(img.shape[2]), int(img.shape[1]), size, rect), []).append(i)
    return groups


def letterboxed_forward(image: torch.Tensor, slot: torch.Tensor, geo: torch.Tensor, forward) -> tuple:
    """One frame end to end on its device: ``image`` (uint8 [3, H, W]) letterboxed into ``slot`` (uint8
    [1, size, size, 3], or [1, *letterbox_shape(W, H, rect=True), 3] for the rect letterbox), ``forward(slot)`` → (detections [1, N, 6] in the model's space, counts), the boxes mapped
    back to the frame with ``geo`` ([1, 6] on the device: ``geometry(W, H, rect=...)``). Static shapes and no host sync for a
    given frame size, so a GPU instance captures the whole of it in one CUDA graph per frame size (no launches
    between letterbox, model, NMS and boxes back); a CPU instance runs the same code eagerly."""
    letterbox(image, slot[0])
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
    """Request rows → decoded upright frames (or the FrameError of each bad one): ``read_header`` first (limits,
    geometry), then one batched decode of the frames that passed it."""
    out: list[Optional[Union[torch.Tensor, FrameError]]] = [None] * len(rows)
    good: list[int] = []
    frames: list[torch.Tensor] = []
    headers: list[Header] = []
    for i, row in enumerate(rows):
        f = frame_bytes(row)
        try:
            headers.append(read_header(_np_bytes(f), max_pixels=max_pixels, max_side=max_side))
        except FrameError as e:
            out[i] = e
            continue
        good.append(i)
        frames.append(f)
    for i, img in zip(good, decoder.decode(frames, headers)):
        out[i] = img
    return [x if x is not None else FrameError("frame was not decoded") for x in out]
