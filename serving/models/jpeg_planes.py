"""libjpeg's pixels from a JPEG's decoded planes, on the GPU: nvJPEG decodes, libjpeg upsamples and converts.

nvJPEG's IDCT gives libjpeg's samples (a baseline 4:4:4 frame decodes to Pillow's pixels exactly on the H200);
what it does differently on 4:2:0 / 4:2:2 frames is the chroma upsampling (48–73 levels off libjpeg's "fancy"
triangle filter). So a GPU instance asks nvJPEG for the planes before its colour conversion (Y, Cb, Cr at their own
sampled sizes, ``NVJPEG_OUTPUT_YUV``) and does what libjpeg-turbo does after its IDCT, in torch on the device:

* ``upsample``: jdsample.c's ``h2v1_fancy_upsample`` (4:2:2) and ``h2v2_fancy_upsample`` (4:2:0), with their
  rounding biases (1/2 between output columns for h2v1, 8/7 for h2v2), edges replicated as jdmainct.c's context rows
  replicate them, and the plain replication libjpeg-turbo uses where a component is at most 2 samples wide;
* ``ycc_to_rgb``: jdcolor.c's ``ycc_rgb_convert`` (its integer tables, ``SCALEBITS`` 16, ``ONE_HALF`` rounding,
  the range limit);
* ``planes_to_rgb``: both, for a stack of frames of one size; ``fused_planes_to_rgb``: the same as one Triton
  kernel on a GPU (what serves; checked against ``planes_to_rgb`` at start);
* ``NvjpegPlanes``: libnvjpeg through ctypes (the copy torchvision loaded, else the CUDA wheels' or toolkit's),
  batched (``nvjpegDecodeBatched`` on the hardware decoder where the GPU has one) straight into torch tensors on the
  caller's stream, then ``planes_to_rgb``; a frame nvJPEG does not take (``nvjpegDecodeBatchedSupported``, a plane
  size other than libjpeg's, a failed decode) comes back as ``None`` for the caller's other decoder, never failing
  its batch-mates.

``tests/test_jpeg_planes.py`` holds the first three to libjpeg itself: libjpeg-turbo's own raw planes
(TurboJPEG's ``tjDecompressToYUVPlanes``) through ``planes_to_rgb`` equal Pillow's RGB bit for bit.

Usage::

    rgb = planes_to_rgb(y, cbcr, (2, 2))            # y [N, H, W], cbcr [N, 2, ceil(H/2), ceil(W/2)] uint8
    nv = NvjpegPlanes(torch.device("cuda"))         # OSError / RuntimeError where there is no nvJPEG to use
    nv.decode([frame], [(1280, 720, ((2, 2), (1, 1), (1, 1)))])  # [tensor [3, 720, 1280] uint8 on cuda | None]
"""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Optional, Sequence

import torch

# Luma's sampling over chroma's (h, v) by the header's sampling factors: the layouts decoded here (camera and phone
# frames, Pillow's and libjpeg's defaults); any other goes to libjpeg on the host.
FACTORS = {((2, 2), (1, 1), (1, 1)): (2, 2), ((2, 1), (1, 1), (1, 1)): (2, 1)}
# nvjpegChromaSubsampling_t of each (NVJPEG_CSS_420, NVJPEG_CSS_422).
_CSS = {(2, 2): 2, (2, 1): 1}

SCALEBITS = 16
ONE_HALF = 1 << (SCALEBITS - 1)


def _fix(x: float) -> int:
    """jdcolor.c's FIX(x): x in 16.16 fixed point, rounded."""
    return int(x * (1 << SCALEBITS) + 0.5)


def upsample(c: torch.Tensor, factors: tuple[int, int], width: int, height: int) -> torch.Tensor:
    """A chroma plane (uint8 [..., h, w], w = ceil(width / fh), h = ceil(height / fv)) → int32 [..., height, width],
    as libjpeg-turbo's jdsample.c upsamples it for ``factors`` (2, 1) (h2v1) or (2, 2) (h2v2), fancy (a triangle
    filter: 3/4 of the nearer sample, 1/4 of the further, in each direction), or by replication where the plane is at
    most 2 samples wide (jinit_upsampler: fancy only when ``downsampled_width > 2``).

    >>> upsample(torch.tensor([[10, 20, 40]], dtype=torch.uint8), (2, 1), 6, 1).tolist()
    [[10, 13, 17, 25, 35, 40]]
    >>> upsample(torch.tensor([[0, 100, 0], [200, 0, 0]], dtype=torch.uint8), (2, 2), 5, 3).tolist()[0]
    [0, 25, 75, 75, 25]
    """
    fh, fv = factors
    if (fh, fv) == (1, 1):
        return c.to(torch.int32)
    if c.shape[-1] <= 2:
        out = c.repeat_interleave(2, -1)
        return (out.repeat_interleave(2, -2) if fv == 2 else out)[..., :height, :width].to(torch.int32)
    x = c.to(torch.int32)
    bias, shift = (1, 2), 2  # h2v1: (3 * nearer + further + 1 or 2) >> 2
    if fv == 2:
        # Column sums first (3 * this row + the row above for an upper output row, below for a lower one: an
        # edge row is its own neighbour), then across with 16ths: (3 * nearer + further + 8 or 7) >> 4.
        x3 = x * 3
        above = torch.cat((x[..., :1, :], x[..., :-1, :]), -2)
        below = torch.cat((x[..., 1:, :], x[..., -1:, :]), -2)
        x = torch.stack((x3 + above, x3 + below), -2).flatten(-3, -2)[..., :height, :]
        bias, shift = (8, 7), 4
    left = torch.cat((x[..., :1], x[..., :-1]), -1)
    right = torch.cat((x[..., 1:], x[..., -1:]), -1)
    x3 = x * 3
    even = (x3 + left + bias[0]) >> shift
    odd = (x3 + right + bias[1]) >> shift
    return torch.stack((even, odd), -1).flatten(-2)[..., :width]


def ycc_to_rgb(y: torch.Tensor, cb: torch.Tensor, cr: torch.Tensor) -> torch.Tensor:
    """Full-size Y, Cb, Cr (any integer dtype, [..., H, W]) → uint8 RGB [..., 3, H, W] by jdcolor.c's
    ``ycc_rgb_convert``: R = Y + Cr_r_tab[Cr], G = Y + ((Cb_g_tab[Cb] + Cr_g_tab[Cr]) >> 16), B = Y + Cb_b_tab[Cb],
    each table entry FIX(coefficient) × (value − 128) with ONE_HALF added before its shift, then the range limit.

    >>> ycc_to_rgb(*(torch.tensor([[v]]) for v in (100, 90, 200))).flatten().tolist()
    [201, 62, 33]
    """
    y = y.to(torch.int32)
    cb = cb.to(torch.int32) - 128
    cr = cr.to(torch.int32) - 128
    r = y + ((_fix(1.40200) * cr + ONE_HALF) >> SCALEBITS)
    g = y + ((-_fix(0.34414) * cb + ONE_HALF - _fix(0.71414) * cr) >> SCALEBITS)
    b = y + ((_fix(1.77200) * cb + ONE_HALF) >> SCALEBITS)
    return torch.stack((r, g, b), -3).clamp_(0, 255).to(torch.uint8)


def planes_to_rgb(y: torch.Tensor, cbcr: torch.Tensor, factors: tuple[int, int]) -> torch.Tensor:
    """Decoded planes → libjpeg's RGB: ``y`` uint8 [..., H, W], ``cbcr`` uint8 [..., 2, h, w] (Cb then Cr at their
    sampled size) → uint8 [..., 3, H, W], the chroma upsampled (``upsample``) and converted (``ycc_to_rgb``)."""
    height, width = y.shape[-2:]
    c = upsample(cbcr, factors, width, height)
    return ycc_to_rgb(y, c[..., 0, :, :], c[..., 1, :, :])


# ``planes_to_rgb`` as one Triton kernel on a GPU: each output sample reads its Y and the 2-4 chroma samples
# libjpeg's filter weighs for it, then is converted and stored, with the same integer arithmetic (biases, shifts,
# ONE_HALF = 32768, the range limit) as ``upsample`` and ``ycc_to_rgb``. One launch per stack of frames instead of
# about 35 torch kernels over int32 intermediates, which, with three instances sharing a GPU, cost more GPU time
# than the model. ``NvjpegPlanes`` checks it against ``planes_to_rgb`` when it starts and uses torch where it
# differs or Triton is missing (``kernel``).
try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - not installed (a CPU machine) or broken: planes_to_rgb in torch only
    triton = None

if triton is not None:

    @triton.jit
    def _chroma(plane, i, j, c, d, odd, mask, CW, FV: tl.constexpr, FANCY: tl.constexpr):
        near = tl.load(plane + i * CW + c, mask=mask, other=0).to(tl.int32)
        if not FANCY:
            v = near
        elif FV == 2:
            near = 3 * near + tl.load(plane + j * CW + c, mask=mask, other=0).to(tl.int32)
            far = 3 * tl.load(plane + i * CW + d, mask=mask, other=0).to(tl.int32)
            far += tl.load(plane + j * CW + d, mask=mask, other=0).to(tl.int32)
            v = (3 * near + far + 8 - odd) >> 4
        else:
            far = tl.load(plane + i * CW + d, mask=mask, other=0).to(tl.int32)
            v = (3 * near + far + 1 + odd) >> 2
        return v - 128

    @triton.jit
    def _fused_kernel(
        y_ptr, c_ptr, out_ptr, H, W, CH, CW,
        CR_R: tl.constexpr, CB_G: tl.constexpr, CR_G: tl.constexpr, CB_B: tl.constexpr,
        FV: tl.constexpr, FANCY: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)  # one output row of one frame
        n = row // H
        r = row % H
        xs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = xs < W
        odd = xs % 2
        c = xs // 2
        d = tl.minimum(tl.maximum(c + 2 * odd - 1, 0), CW - 1)  # the further column: left of an even output
        i = r // FV
        j = tl.minimum(tl.maximum(i + 2 * (r % 2) - 1, 0), CH - 1)  # the further row (h2v2): above an upper one
        yv = tl.load(y_ptr + row * W + xs, mask=mask, other=0).to(tl.int32)
        cb = _chroma(c_ptr + (n * 2) * CH * CW, i, j, c, d, odd, mask, CW, FV, FANCY)
        cr = _chroma(c_ptr + (n * 2 + 1) * CH * CW, i, j, c, d, odd, mask, CW, FV, FANCY)
        out = out_ptr + (n * 3 * H + r) * W + xs
        red = yv + ((CR_R * cr + 32768) >> 16)
        green = yv + ((CB_G * cb + 32768 + CR_G * cr) >> 16)
        blue = yv + ((CB_B * cb + 32768) >> 16)
        tl.store(out, tl.minimum(tl.maximum(red, 0), 255).to(tl.uint8), mask=mask)
        tl.store(out + H * W, tl.minimum(tl.maximum(green, 0), 255).to(tl.uint8), mask=mask)
        tl.store(out + 2 * H * W, tl.minimum(tl.maximum(blue, 0), 255).to(tl.uint8), mask=mask)


def fused_planes_to_rgb(y: torch.Tensor, cbcr: torch.Tensor, factors: tuple[int, int]) -> torch.Tensor:
    """``planes_to_rgb`` of ``y`` [N, H, W] and ``cbcr`` [N, 2, h, w] (contiguous, on a GPU) by the Triton kernel
    ``_fused_kernel``: uint8 [N, 3, H, W]."""
    n, height, width = y.shape
    ch, cw = cbcr.shape[-2:]
    out = torch.empty((n, 3, height, width), dtype=torch.uint8, device=y.device)
    coefficients = dict(CR_R=_fix(1.40200), CB_G=-_fix(0.34414), CR_G=-_fix(0.71414), CB_B=_fix(1.77200))
    grid = (n * height, -(-width // 1024))
    _fused_kernel[grid](y, cbcr, out, height, width, ch, cw, **coefficients, FV=factors[1], FANCY=cw > 2, BLOCK=1024)
    return out


# ---------------------------------------------------------------- nvJPEG through ctypes

_BACKEND_DEFAULT, _BACKEND_HARDWARE = 0, 3
# nvjpegOutputFormat_t: both give a 3-component frame's planes at their own sampled sizes.
_OUTPUTS = {"yuv": 1, "unchanged": 0}
_STATUS = {
    1: "not initialized",
    2: "invalid parameter",
    3: "bad JPEG",
    4: "JPEG not supported",
    5: "allocator failure",
    6: "execution failed",
    7: "architecture mismatch",
    8: "internal error",
    9: "implementation not supported",
    10: "incomplete bitstream",
}


class _Image(ctypes.Structure):
    """nvjpegImage_t: a plane pointer and a row pitch per component (NVJPEG_MAX_COMPONENT = 4)."""

    _fields_ = [("channel", ctypes.c_void_p * 4), ("pitch", ctypes.c_size_t * 4)]


def find_library() -> str:
    """The libnvjpeg to load: the one already in this process (torchvision's, once ``torchvision.io`` is imported),
    else one beside torchvision (``torchvision.libs``), in the CUDA wheels (``nvidia/*/lib``), or the toolkit's;
    OSError naming the places looked in when there is none."""
    try:
        with open("/proc/self/maps") as f:
            loaded = sorted({line.split()[-1] for line in f if "libnvjpeg" in line and "/" in line})
        if loaded:
            return loaded[0]
    except OSError:
        pass
    places = []
    try:
        import torchvision

        places.append(os.path.join(os.path.dirname(os.path.dirname(torchvision.__file__)), "torchvision.libs"))
    except Exception:  # noqa: BLE001 - no torchvision: the other places
        pass
    places.append(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "*", "lib"))
    places += ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu"]
    for place in places:
        found = sorted(glob.glob(os.path.join(place, "libnvjpeg*.so*")))
        if found:
            return found[0]
    raise OSError(f"no libnvjpeg loaded or in {', '.join(places)}")


class NvjpegPlanes:
    """Baseline 4:2:0 / 4:2:2 JPEG frames → libjpeg's RGB on ``device``: nvJPEG's planes (``NVJPEG_OUTPUT_YUV``,
    batched, on the hardware decoder where there is one, else nvJPEG's default backend) and ``planes_to_rgb``.

    ``library``: a libnvjpeg path (``find_library`` when not given); ``hardware=False`` uses nvJPEG's default
    backend even where there is a hardware decoder; ``output``: ``yuv`` or ``unchanged`` (nvJPEG's names). After
    construction ``hardware`` says whether the hardware backend is in use; ``kernel`` whether the upsampling and
    conversion run as the fused Triton kernel (``triton``, checked against ``planes_to_rgb`` here first) or as
    torch's functions (``torch``; ``kernel_error`` says why); ``last_error`` names the last call that failed (a
    decode's status). Raises OSError (no library) or RuntimeError (nvJPEG's status) at construction;
    ``decode`` never raises for a frame: it answers ``None`` for each frame it does not decode. One instance per
    thread (nvJPEG's state).
    """

    def __init__(
        self, device: torch.device, library: Optional[str] = None, *, hardware: bool = True, output: str = "yuv"
    ):
        self.device = device
        self.output = _OUTPUTS[output]
        self.last_error: Optional[str] = None
        self.library = library or find_library()
        lib = self._lib = ctypes.CDLL(self.library)
        p, i, z = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        pp, ip = ctypes.POINTER(p), ctypes.POINTER(i)
        for name, args in {
            "nvjpegGetProperty": [i, ip],
            "nvjpegCreateEx": [i, p, p, ctypes.c_uint, pp],
            "nvjpegJpegStateCreate": [p, pp],
            "nvjpegJpegStreamCreate": [p, pp],
            "nvjpegGetImageInfo": [p, p, z, ip, ip, ip, ip],
            "nvjpegJpegStreamParseHeader": [p, p, z, p],
            "nvjpegDecodeBatchedSupported": [p, p, ip],
            "nvjpegDecodeBatchedInitialize": [p, p, i, i, i],
            "nvjpegDecodeBatched": [p, p, pp, ctypes.POINTER(z), ctypes.POINTER(_Image), p],
        }.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        v = [ctypes.c_int() for _ in range(3)]
        for k in range(3):
            lib.nvjpegGetProperty(k, ctypes.byref(v[k]))
        self.version = ".".join(str(x.value) for x in v)
        self.handle, self.state, self.stream = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        with torch.cuda.device(device):
            status = lib.nvjpegCreateEx(_BACKEND_HARDWARE, None, None, 0, ctypes.byref(self.handle)) if hardware else 7
            self.hardware = status == 0
            if status == 7:  # architecture mismatch: no hardware JPEG decoder on this GPU
                status = lib.nvjpegCreateEx(_BACKEND_DEFAULT, None, None, 0, ctypes.byref(self.handle))
            self._check(status, "nvjpegCreateEx")
            self._check(lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(self.state)), "nvjpegJpegStateCreate")
            self._check(lib.nvjpegJpegStreamCreate(self.handle, ctypes.byref(self.stream)), "nvjpegJpegStreamCreate")
        self._keep: tuple = ()
        # The batch size the state was last initialized for (``nvjpegDecodeBatchedInitialize``), None after a failure.
        self._batch: Optional[int] = None
        self.kernel, self.kernel_error = "torch", None
        if triton is not None:
            try:
                self._check_kernel()
                self.kernel = "triton"
            except Exception as e:  # noqa: BLE001 - no compiler, another Triton: the torch functions instead
                self.kernel_error = f"{type(e).__name__}: {e}"[:300]

    def _check_kernel(self) -> None:
        """The fused kernel against ``planes_to_rgb`` on random planes of each layout, fancy and replicated (odd
        sizes, frames 4 and 5 pixels wide); AssertionError where any sample differs."""
        g = torch.Generator().manual_seed(39)
        for (w, h), factors in [((37, 29), (2, 2)), ((37, 29), (2, 1)), ((4, 3), (2, 2)), ((5, 3), (2, 1))]:
            cw, ch = -(-w // factors[0]), -(-h // factors[1])
            y = torch.randint(0, 256, (2, h, w), generator=g, dtype=torch.uint8).to(self.device)
            c = torch.randint(0, 256, (2, 2, ch, cw), generator=g, dtype=torch.uint8).to(self.device)
            fused, ref = fused_planes_to_rgb(y, c, factors), planes_to_rgb(y, c, factors)
            assert torch.equal(fused, ref), f"fused kernel differs from planes_to_rgb at {w}x{h} {factors}"

    @staticmethod
    def _check(status: int, call: str) -> None:
        if status != 0:
            raise RuntimeError(f"{call}: nvJPEG status {status} ({_STATUS.get(status, '?')})")

    def info(self, frame: torch.Tensor) -> Optional[tuple[int, int, list[int], list[int]]]:
        """nvjpegGetImageInfo: (components, nvjpegChromaSubsampling_t, plane widths, plane heights); None where
        nvJPEG cannot read the header."""
        nc, css = ctypes.c_int(), ctypes.c_int()
        ws, hs = (ctypes.c_int * 4)(), (ctypes.c_int * 4)()
        refs = ctypes.byref(nc), ctypes.byref(css)
        if self._lib.nvjpegGetImageInfo(self.handle, frame.data_ptr(), frame.numel(), *refs, ws, hs) != 0:
            return None
        return nc.value, css.value, ws[: nc.value], hs[: nc.value]

    def accepts(self, frame: torch.Tensor, width: int, height: int, sampling) -> bool:
        """Whether nvJPEG reads this frame as its header says (3 components, the layout, libjpeg's plane sizes:
        ceil(width / 2) × height or ceil(height / 2)) and, on the hardware backend, can decode it there."""
        factors = FACTORS.get(tuple(sampling))
        if factors is None:
            return False
        cw, ch = -(-width // factors[0]), -(-height // factors[1])
        if self.info(frame) != (3, _CSS[factors], [width, cw, cw], [height, ch, ch]):
            return False
        if not self.hardware:
            return True
        supported = ctypes.c_int(-1)
        if self._lib.nvjpegJpegStreamParseHeader(self.handle, frame.data_ptr(), frame.numel(), self.stream) != 0:
            return False
        self._lib.nvjpegDecodeBatchedSupported(self.handle, self.stream, ctypes.byref(supported))
        return supported.value == 0  # 0: supported

    def decode(self, frames: Sequence[torch.Tensor], sizes: Sequence[tuple]) -> list[Optional[torch.Tensor]]:
        """``frames`` (contiguous uint8 CPU tensors) with ``sizes`` ((width, height, sampling) from each header) →
        RGB uint8 [3, H, W] on the device for each frame decoded, ``None`` for each one not. Frames of one size and
        layout are upsampled and converted as one stack; the work is queued on the current stream."""
        out: list[Optional[torch.Tensor]] = [None] * len(frames)
        with torch.cuda.device(self.device):
            ok = [k for k, (f, (w, h, s)) in enumerate(zip(frames, sizes)) if self.accepts(f, w, h, s)]
            groups: dict[tuple, list[int]] = {}
            for k in ok:
                w, h, s = sizes[k]
                groups.setdefault((w, h, FACTORS[tuple(s)]), []).append(k)
            planes: dict[int, _Image] = {}
            stacks = {}
            for (w, h, (fh, fv)), idx in groups.items():
                y = torch.empty((len(idx), h, w), dtype=torch.uint8, device=self.device)
                c = torch.empty((len(idx), 2, -(-h // fv), -(-w // fh)), dtype=torch.uint8, device=self.device)
                stacks[(w, h, (fh, fv))] = (y, c)
                for j, k in enumerate(idx):
                    img = planes[k] = _Image()
                    img.channel[0], img.pitch[0] = y[j].data_ptr(), w
                    img.channel[1], img.pitch[1] = c[j, 0].data_ptr(), c.shape[-1]
                    img.channel[2], img.pitch[2] = c[j, 1].data_ptr(), c.shape[-1]
            done = self._batched(ok, frames, planes) if ok else set()
            for key, idx in groups.items():
                if not any(k in done for k in idx):
                    continue
                y, c = stacks[key]
                rgb = (fused_planes_to_rgb if self.kernel == "triton" else planes_to_rgb)(y, c, key[2])
                for j, k in enumerate(idx):
                    out[k] = rgb[j] if k in done else None
        return out

    def _batched(self, ks: list[int], frames: Sequence[torch.Tensor], planes: dict[int, _Image]) -> set[int]:
        """One ``nvjpegDecodeBatched`` of frames ``ks`` into their planes; where the batch fails, each frame alone.
        Returns the frames decoded."""
        stream = ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)
        self._keep = tuple(frames)  # nvJPEG may read the host bytes after the call returns: held to the next call

        def run(sub: list[int]) -> bool:
            n = len(sub)
            data = (ctypes.c_void_p * n)(*[frames[k].data_ptr() for k in sub])
            lengths = (ctypes.c_size_t * n)(*[frames[k].numel() for k in sub])
            images = (_Image * n)(*[planes[k] for k in sub])
            lib = self._lib
            status, call = 0, "nvjpegDecodeBatchedInitialize"
            if self._batch != n:  # once per batch size (nvJPEG's guide), and again after a failed batch
                self._batch = None
                status = lib.nvjpegDecodeBatchedInitialize(self.handle, self.state, n, 1, self.output)
            if status == 0:
                self._batch = n
                status = lib.nvjpegDecodeBatched(self.handle, self.state, data, lengths, images, stream)
                call = "nvjpegDecodeBatched"
            if status != 0:
                self._batch = None
                self.last_error = f"{call} of {n} frames: nvJPEG status {status} ({_STATUS.get(status, '?')})"
            return status == 0

        if run(ks):
            return set(ks)
        return {k for k in ks if len(ks) > 1 and run([k])}
