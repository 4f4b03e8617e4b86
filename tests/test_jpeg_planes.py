"""libjpeg's upsampling and colour conversion in torch (``serving/models/jpeg_planes.py``) against libjpeg itself.

The planes are libjpeg-turbo's own: TurboJPEG's ``tjDecompressToYUVPlanes`` (Debian's libturbojpeg0, through ctypes)
gives Y, Cb and Cr as its IDCT leaves them, before upsampling and colour conversion. ``planes_to_rgb`` of those planes
must equal, bit for bit, the RGB that Pillow (libjpeg-turbo's full decode, fancy upsampling and ``ycc_rgb_convert``)
gives for the same file: every subsampling served, odd sizes, the narrow frames libjpeg upsamples by replication,
restart markers, saturated colours. A GPU instance feeds the same functions nvJPEG's planes instead.
"""

import ctypes
import ctypes.util
import io

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
PIL = pytest.importorskip("PIL")

from PIL import Image  # noqa: E402

from gate import sample_frames  # noqa: E402
from serving.models import jpeg_planes  # noqa: E402

# TurboJPEG's TJSAMP_* by Pillow's ``subsampling`` (0: 4:4:4, 1: 4:2:2, 2: 4:2:0), and the (h, v) factors of each.
TJSAMP = {0: 0, 1: 1, 2: 2}
FACTORS = {0: (1, 1), 1: (2, 1), 2: (2, 2)}


class TurboJPEG:
    """libjpeg-turbo's TurboJPEG API (the ``libturbojpeg`` shared library): a JPEG's raw planes."""

    def __init__(self):
        name = ctypes.util.find_library("turbojpeg")
        assert name, "libturbojpeg is not installed (Debian: libturbojpeg0; ./gpuhost.sh setup installs it)"
        lib = self.lib = ctypes.CDLL(name)
        p, i, ip = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)
        lib.tjInitDecompress.restype = p
        lib.tjDecompressHeader3.argtypes = [p, p, ctypes.c_ulong, ip, ip, ip, ip]
        lib.tjDecompressToYUVPlanes.argtypes = [p, p, ctypes.c_ulong, ctypes.POINTER(p), i, ip, i, i]
        lib.tjGetErrorStr2.argtypes, lib.tjGetErrorStr2.restype = [p], ctypes.c_char_p
        lib.tjDestroy.argtypes = [p]
        self.handle = lib.tjInitDecompress()

    def planes(self, data: bytes):
        """(Y [H, W], CbCr [2, h, w], TJSAMP) as libjpeg-turbo decodes them (islow IDCT, no upsampling)."""
        lib, buf = self.lib, ctypes.create_string_buffer(data, len(data))
        w, h, samp, cs = (ctypes.c_int() for _ in range(4))
        refs = (ctypes.byref(w), ctypes.byref(h), ctypes.byref(samp), ctypes.byref(cs))
        assert lib.tjDecompressHeader3(self.handle, buf, len(data), *refs) == 0, lib.tjGetErrorStr2(self.handle)
        sizes = [
            (lib.tjPlaneHeight(c, h.value, samp.value), lib.tjPlaneWidth(c, w.value, samp.value)) for c in range(3)
        ]
        arrays = [np.zeros(s, dtype=np.uint8) for s in sizes]
        ptrs = (ctypes.c_void_p * 3)(*[a.ctypes.data for a in arrays])
        status = lib.tjDecompressToYUVPlanes(self.handle, buf, len(data), ptrs, w.value, None, h.value, 0)
        assert status == 0, lib.tjGetErrorStr2(self.handle)
        y = torch.from_numpy(arrays[0][: h.value, : w.value].copy())
        return y, torch.from_numpy(np.stack(arrays[1:])), samp.value

    def close(self):
        self.lib.tjDestroy(self.handle)


@pytest.fixture(scope="module")
def turbo():
    t = TurboJPEG()
    yield t
    t.close()


def _image(kind: str, w: int, h: int, seed: int):
    if kind == "scene":
        return Image.fromarray(sample_frames.pixels(w, h, seed=seed))
    # Saturated noise: chroma far from grey at every sample, so the range limit (0 and 255) is hit on each channel.
    rnd = np.random.default_rng(seed)
    return Image.fromarray(np.where(rnd.random((h, w, 3)) < 0.5, 0, 255).astype(np.uint8))


def _jpeg(img, subsampling: int, quality: int = 90, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", subsampling=subsampling, quality=quality, **kw)
    return buf.getvalue()


def _check(turbo, data: bytes, subsampling: int):
    y, cbcr, samp = turbo.planes(data)
    assert samp == TJSAMP[subsampling]
    got = jpeg_planes.planes_to_rgb(y, cbcr, FACTORS[subsampling]).permute(1, 2, 0).numpy()
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert got.shape == ref.shape
    diff = np.abs(got.astype(np.int16) - ref)
    assert int(diff.max()) == 0, f"{int((diff > 0).sum())} samples differ, up to {int(diff.max())}"


SIZES = [(327, 245), (1281, 719), (1280, 720), (640, 480), (17, 9), (9, 17), (16, 16)]


@pytest.mark.parametrize("subsampling", [2, 1, 0], ids=["420", "422", "444"])
@pytest.mark.parametrize("w,h", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("kind", ["scene", "saturated"])
def test_libjpegs_planes_upsampled_and_converted_are_pillows_pixels(turbo, kind, w, h, subsampling):
    _check(turbo, _jpeg(_image(kind, w, h, seed=w + h), subsampling), subsampling)


@pytest.mark.parametrize("subsampling", [2, 1], ids=["420", "422"])
@pytest.mark.parametrize("w,h", [(1, 1), (2, 2), (3, 3), (4, 5), (5, 4), (2, 7), (6, 1)])
def test_frames_too_narrow_for_fancy_upsampling_are_replicated_as_libjpeg_does(turbo, w, h, subsampling):
    """libjpeg-turbo upsamples a chroma plane of at most 2 samples across (frames up to 4 pixels wide) by plain
    replication; 5 and 6 pixels wide are the first fancy ones."""
    _check(turbo, _jpeg(_image("saturated", w, h, seed=w * 10 + h), subsampling), subsampling)


@pytest.mark.parametrize("subsampling", [2, 1], ids=["420", "422"])
@pytest.mark.parametrize("quality", [30, 75, 100])
def test_restart_markers_and_qualities(turbo, quality, subsampling):
    img = _image("scene", 333, 251, seed=quality)
    _check(turbo, _jpeg(img, subsampling, quality, restart_marker_rows=1), subsampling)
    _check(turbo, _jpeg(img, subsampling, quality, restart_marker_blocks=3), subsampling)


def test_every_4_2_0_class_of_sample_frames(turbo):
    """The 4:2:0 frame classes the GPU tests serve (EXIF, ICC, a thumbnail, a disguised SOF in a COM segment):
    libjpeg's planes through ``planes_to_rgb`` are Pillow's stored (not yet turned upright) pixels."""
    for name, data in sample_frames.frame_classes(329, 247).items():
        if name.startswith(("baseline-420", "restart-420", "icc", "exif-", "comment-sof")):
            _check(turbo, data, 2)


def test_upsampling_changes_what_nearest_neighbour_would_give(turbo):
    """The test can fail: the planes through nearest-neighbour chroma (what a decoder without libjpeg's filter
    might do) are far from Pillow's pixels on the same frame."""
    data = _jpeg(_image("scene", 327, 245, seed=1), 2)
    y, cbcr, _ = turbo.planes(data)
    c = cbcr.repeat_interleave(2, -1).repeat_interleave(2, -2)[..., :245, :327]
    nearest = jpeg_planes.ycc_to_rgb(y, c[0], c[1]).permute(1, 2, 0).numpy().astype(np.int16)
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.abs(nearest - ref).max() > 10


@pytest.mark.parametrize("factors", [(2, 2), (2, 1)], ids=["420", "422"])
def test_the_fused_gpu_kernel_is_planes_to_rgb(factors):
    """On a GPU with Triton: the one-kernel upsampling and conversion a GPU instance serves with equals
    ``planes_to_rgb`` (held to libjpeg above) on random planes, odd and even sizes, narrow frames included."""
    if not torch.cuda.is_available() or jpeg_planes.triton is None:
        pytest.skip("no CUDA device or no Triton here")
    g = torch.Generator().manual_seed(factors[1])
    for w, h in [(1281, 719), (1280, 720), (327, 245), (1, 1), (4, 4), (5, 2), (7, 1)]:
        cw, ch = -(-w // factors[0]), -(-h // factors[1])
        y = torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8).cuda()
        c = torch.randint(0, 256, (3, 2, ch, cw), generator=g, dtype=torch.uint8).cuda()
        got = jpeg_planes.fused_planes_to_rgb(y, c, factors)
        assert torch.equal(got, jpeg_planes.planes_to_rgb(y, c, factors)), (w, h)
