"""JPEG frames in, boxes in the frame's own pixels out: the header check, the decoder, the letterbox and back
(``serving/models/frames.py``, the code the Triton model runs on GPU and CPU alike).

The model is replaced by a box echo: a frame is painted with solid rectangles at known places, sent through the
real JPEG encode → decode → letterbox, the echo finds each rectangle in the 640×640 model input and answers its box
there, and ``unletterbox`` must give back the painted box in the frame's pixels (to within one model-input pixel,
the resolution of the echo). The box transform itself is checked exactly both ways.
"""

import io
import struct

import pytest

torch = pytest.importorskip("torch")
PIL = pytest.importorskip("PIL")

from PIL import Image, ImageDraw  # noqa: E402

from gate import sample_frames  # noqa: E402
from serving.models import frames  # noqa: E402

BG, PAD = (60, 60, 60), (114, 114, 114)
COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]


def _painted(w, h):
    """A frame of w×h with four solid rectangles (x1, y1, x2, y2 exclusive) spread over it."""
    img = Image.new("RGB", (w, h), BG)
    d = ImageDraw.Draw(img)
    boxes = []
    for k, (fx, fy) in enumerate([(0.05, 0.1), (0.55, 0.08), (0.1, 0.6), (0.6, 0.55)]):
        x1, y1 = int(fx * w), int(fy * h)
        x2, y2 = x1 + max(2, int(0.3 * w)), y1 + max(2, int(0.3 * h))
        d.rectangle((x1, y1, x2 - 1, y2 - 1), fill=COLOURS[k])
        boxes.append((x1, y1, x2, y2))
    return img, boxes


def _jpeg(img, quality=95):
    """4:4:4 (no chroma subsampling): colour edges stay where they were painted, to the pixel."""
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality, subsampling=0)
    return buf.getvalue()


def _echo(model_input):
    """The box echo: for each painted colour, the bounding box (x1, y1, x2, y2 exclusive) of the pixels nearest to
    it (of the colours, the background and the pad) in the 640×640 input; rows like the model's (score 1, class k)."""
    x = model_input.int()
    refs = torch.tensor([*COLOURS, BG, PAD])
    nearest = (x[:, :, None, :] - refs).abs().sum(-1).argmin(-1)
    rows = []
    for k in range(len(COLOURS)):
        ys, xs = (nearest == k).nonzero(as_tuple=True)
        rows.append([float(xs.min()), float(ys.min()), float(xs.max()) + 1, float(ys.max()) + 1, 1.0, float(k)])
    return torch.tensor([rows])


def _bytes(row):
    return torch.frombuffer(bytearray(row), dtype=torch.uint8)


@pytest.mark.parametrize(
    "w,h",
    [(1280, 720), (1920, 1080), (640, 480), (720, 1280), (333, 500), (32, 32), (3840, 2160)],
    ids=["hd", "full-hd", "vga", "portrait", "odd-portrait", "tiny-32", "4k"],
)
@pytest.mark.parametrize("rect", [False, True], ids=["square", "rect"])
def test_letterbox_and_back_gives_the_painted_boxes_in_the_frames_pixels(w, h, rect):
    img, painted = _painted(w, h)
    data = _jpeg(img)
    assert frames.jpeg_size(data) == (w, h)
    decoded = frames.Decoder(torch.device("cpu")).decode([_bytes(data)])[0]
    assert isinstance(decoded, torch.Tensor) and decoded.shape == (3, h, w)
    batch = torch.zeros((1, *frames.letterbox_shape(w, h, rect=rect), 3), dtype=torch.uint8)
    geo = frames.letterbox(decoded, batch[0])
    new_w, new_h, left, top = frames.letterbox_geometry(w, h, rect=rect)
    # Ultralytics' layout: the frame scaled to fit, centred, the rest 114.
    assert max(new_w, new_h) == 640 and abs(new_w / new_h - w / h) < 2 / min(new_w, new_h)
    assert (batch[0, :top] == 114).all() and (batch[0, top + new_h :] == 114).all()
    assert (batch[0, :, :left] == 114).all() and (batch[0, :, left + new_w :] == 114).all()
    got = frames.unletterbox(_echo(batch[0]), torch.tensor([geo]))[0]
    one_input_pixel = max(w / new_w, h / new_h)
    for (x1, y1, x2, y2), row in zip(painted, got.tolist()):
        assert row[0] == pytest.approx(x1, abs=one_input_pixel + 0.01)
        assert row[1] == pytest.approx(y1, abs=one_input_pixel + 0.01)
        assert row[2] == pytest.approx(x2, abs=one_input_pixel + 0.01)
        assert row[3] == pytest.approx(y2, abs=one_input_pixel + 0.01)
    assert (got[:, :4] >= 0).all() and (got[:, [0, 2]] <= w).all() and (got[:, [1, 3]] <= h).all()


@pytest.mark.parametrize("w,h", [(1280, 720), (720, 1280), (333, 500), (32, 32), (3840, 2160), (640, 640)])
def test_box_transform_there_and_back_is_exact(w, h):
    new_w, new_h, left, top = frames.letterbox_geometry(w, h)
    geo = (float(left), float(top), new_w / w, new_h / h, float(w), float(h))
    g = torch.Generator().manual_seed(w * h)
    xy1 = torch.rand(1, 50, 2, generator=g) * torch.tensor([w, h]) * 0.8
    wh = torch.rand(1, 50, 2, generator=g) * torch.tensor([w, h]) * 0.2
    boxes = torch.cat((xy1, xy1 + wh), 2)
    det = torch.cat((frames.to_letterbox(boxes, geo), torch.full((1, 50, 1), 0.9), torch.ones(1, 50, 1)), 2)
    back = frames.unletterbox(det, torch.tensor([geo]))
    assert torch.allclose(back[..., :4], boxes, atol=1e-3)
    assert (back[..., 4:] == det[..., 4:]).all()


def test_known_letterbox_layouts_match_ultralytics():
    """(new_w, new_h, left, top) as Ultralytics' LetterBox computes them (r = min(640/h, 640/w), round(dw ∓ 0.1))."""
    assert frames.letterbox_geometry(1280, 720) == (640, 360, 0, 140)
    assert frames.letterbox_geometry(1920, 1080) == (640, 360, 0, 140)
    assert frames.letterbox_geometry(640, 480) == (640, 480, 0, 80)
    assert frames.letterbox_geometry(480, 640) == (480, 640, 80, 0)
    assert frames.letterbox_geometry(32, 32) == (640, 640, 0, 0)
    assert frames.letterbox_geometry(3840, 2160) == (640, 360, 0, 140)
    assert frames.letterbox_geometry(333, 500) == (426, 640, 107, 0)  # dw = 107: left 107, right 107
    assert frames.letterbox_geometry(641, 480) == (640, 479, 0, 80)  # dh = 80.5: top 80, bottom 81


def test_known_rect_layouts_match_ultralytics_auto():
    """LetterBox(auto=True), what predict uses for a checkpoint: dw, dh = (640 − new) mod 32, halved, round(d ∓ 0.1);
    the input is the resized frame plus that padding."""
    assert frames.letterbox_geometry(1280, 720, rect=True) == (640, 360, 0, 12)
    assert frames.letterbox_shape(1280, 720, rect=True) == (384, 640)
    assert frames.letterbox_shape(1920, 1080, rect=True) == (384, 640)
    assert frames.letterbox_shape(640, 480, rect=True) == (480, 640)  # no padding at all
    assert frames.letterbox_geometry(640, 480, rect=True) == (640, 480, 0, 0)
    assert frames.letterbox_shape(720, 1280, rect=True) == (640, 384)
    assert frames.letterbox_geometry(333, 500, rect=True) == (426, 640, 11, 0)  # dw = 22: 11 and 11
    assert frames.letterbox_shape(333, 500, rect=True) == (640, 448)
    assert frames.letterbox_geometry(641, 480, rect=True) == (640, 479, 0, 0)  # dh = 1: top 0, bottom 1
    assert frames.letterbox_shape(641, 480, rect=True) == (480, 640)
    assert frames.letterbox_geometry(3000, 100, rect=True) == (640, 21, 0, 5)  # dh = 11: top 5, bottom 6
    assert frames.letterbox_shape(3000, 100, rect=True) == (32, 640)
    assert frames.letterbox_shape(1280, 720) == (640, 640)
    with pytest.raises(ValueError, match="letterboxes to"):
        frames.letterbox(torch.zeros((3, 720, 1280), dtype=torch.uint8), torch.zeros((480, 640, 3), dtype=torch.uint8))


def test_rows_past_the_count_stay_zero():
    det = torch.zeros(2, 5, 6)
    det[0, 0] = torch.tensor([10.0, 150.0, 100.0, 300.0, 0.8, 3.0])
    geo = torch.tensor([[0.0, 140.0, 0.5, 0.5, 1280.0, 720.0], [80.0, 0.0, 1.0, 1.0, 480.0, 640.0]])
    out = frames.unletterbox(det, geo)
    assert out[0, 0].tolist() == pytest.approx([20.0, 20.0, 200.0, 320.0, 0.8, 3.0])
    assert (out[0, 1:] == 0).all() and (out[1] == 0).all()


def test_boxes_outside_the_frame_are_clipped_to_it():
    det = torch.tensor([[[-5.0, 100.0, 645.0, 600.0, 0.5, 1.0]]])  # over the pad on every side
    out = frames.unletterbox(det, torch.tensor([[0.0, 140.0, 0.5, 0.5, 1280.0, 720.0]]))
    assert out[0, 0, :4].tolist() == [0.0, 0.0, 1280.0, 720.0]


def _sof(data: bytes) -> int:
    """Offset of the SOF0 marker of a baseline JPEG."""
    return data.index(b"\xff\xc0")


def test_header_check_refuses_what_is_no_jpeg_or_too_large():
    good = sample_frames.jpeg(640, 480, seed=3)
    assert frames.jpeg_size(good) == (640, 480)
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, format="PNG")
    for bad, why in [
        (b"", "not a JPEG"),
        (png.getvalue(), "not a JPEG"),
        (b"GIF89a" + bytes(100), "not a JPEG"),
        (good[:2] + b"\x00" * 30 + b"\xff\xd9", "no frame header"),  # libjpeg skips junk between markers
        (good[: _sof(good)] + b"\xff\xd9", "no frame header"),
        (good[: len(good) // 2], "truncated"),
    ]:
        with pytest.raises(frames.FrameError, match=why):
            frames.jpeg_size(bad)
    i = _sof(good)
    huge = good[: i + 5] + struct.pack(">HH", 65000, 65000) + good[i + 9 :]
    with pytest.raises(frames.FrameError, match="65000x65000 pixels is larger than this model serves"):
        frames.jpeg_size(huge)
    wide = good[: i + 5] + struct.pack(">HH", 100, 9000) + good[i + 9 :]
    with pytest.raises(frames.FrameError, match="at most 8192 per side"):
        frames.jpeg_size(wide)
    assert frames.jpeg_size(wide, max_side=10000) == (9000, 100)


def test_a_corrupt_frame_fails_alone_and_the_others_decode():
    """prepare(): header checks, then one decode; the bad frames come back as FrameError in their places."""
    a, b = sample_frames.jpeg(1280, 720, seed=1), sample_frames.jpeg(640, 480, seed=2)
    truncated = a[: len(a) // 3]
    garbage = a[: a.index(b"\xff\xda")] + b"\xff\xd9"  # every header, an end, no image data: the decoder's error
    rows = [_bytes(a), _bytes(truncated), _bytes(b"hello"), _bytes(garbage), _bytes(b)]
    out = frames.prepare(rows, frames.Decoder(torch.device("cpu")))
    assert isinstance(out[0], torch.Tensor) and out[0].shape == (3, 720, 1280)
    assert isinstance(out[4], torch.Tensor) and out[4].shape == (3, 480, 640)
    assert isinstance(out[1], frames.FrameError) and "corrupt JPEG" in str(out[1])
    assert isinstance(out[2], frames.FrameError) and "not a JPEG" in str(out[2])
    assert isinstance(out[3], frames.FrameError) and "corrupt JPEG" in str(out[3]) and "truncated" not in str(out[3])
    # Decoded pixels are the frame's: the same as Pillow's own decode of the file.
    import numpy as np

    ref = np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))
    assert (out[4].permute(1, 2, 0).numpy() == ref).all()


def test_padding_after_a_frame_is_cut_off():
    a = sample_frames.jpeg(640, 480, seed=4)
    row = _bytes(a + bytes(5000))
    assert frames.frame_bytes(row).numel() == len(a)
    assert frames.frame_bytes(_bytes(bytes(10))).numel() == 0


def test_sample_frames_are_distinct_structured_jpegs():
    got = sample_frames.gate_frames(per_size=2)
    assert [(w, h) for w, h, _ in got] == [(1280, 720)] * 2 + [(1920, 1080)] * 2 + [(640, 480)] * 2 + [(720, 1280)] * 2
    assert len({d for *_, d in got}) == 8
    for w, h, d in got:
        assert frames.jpeg_size(d) == (w, h) == ImageOpsSize(d)  # the upright size: what the gate checks boxes in
        assert len(d) < w * h * 3 / 8  # structured, not noise (noise stays near 1 byte per pixel at quality 90)


def test_batched_letterbox_equals_one_frame_at_a_time():
    """The backend letterboxes a batch with one resize per distinct frame size: the same pixels and geometry as
    one frame at a time, whatever the mix and order of sizes."""
    sizes = [(1280, 720), (640, 480), (1280, 720), (32, 32), (480, 640), (1280, 720)]
    images = [
        torch.from_numpy(sample_frames.pixels(w, h, seed=k).copy()).permute(2, 0, 1) for k, (w, h) in enumerate(sizes)
    ]
    batch = torch.zeros((8, 640, 640, 3), dtype=torch.uint8)
    geos = frames.letterbox_batch(images, batch)
    for k, img in enumerate(images):
        one = torch.zeros((640, 640, 3), dtype=torch.uint8)
        assert frames.letterbox(img, one) == geos[k]
        assert torch.equal(one, batch[k]), sizes[k]
    assert frames.letterbox_batch([], batch) == []


def test_rect_batch_groups_by_shape_and_equals_one_frame_at_a_time():
    """With the rect letterbox a batch runs one forward per input shape (``rect_groups``, in first-seen order);
    each group letterboxed at once gives the pixels and geometry of one frame at a time into its own shape."""
    sizes = [(1280, 720), (640, 480), (1920, 1080), (480, 640), (1280, 720)]
    images = [
        torch.from_numpy(sample_frames.pixels(w, h, seed=k).copy()).permute(2, 0, 1) for k, (w, h) in enumerate(sizes)
    ]
    groups = frames.rect_groups(images, rect=True)
    assert groups == {(384, 640): [0, 2, 4], (480, 640): [1], (640, 480): [3]}
    assert frames.rect_groups(images) == {(640, 640): [0, 1, 2, 3, 4]}
    for shape, idx in groups.items():
        batch = torch.zeros((len(idx), *shape, 3), dtype=torch.uint8)
        geos = frames.letterbox_batch([images[i] for i in idx], batch, rect=True)
        for j, i in enumerate(idx):
            one = torch.zeros((*shape, 3), dtype=torch.uint8)
            assert frames.letterbox(images[i], one) == geos[j] == frames.geometry(sizes[i][0], sizes[i][1], rect=True)
            assert torch.equal(one, batch[j]), sizes[i]
    with pytest.raises(ValueError, match="letterboxes to"):
        frames.letterbox_batch(images[:2], torch.zeros((2, 384, 640, 3), dtype=torch.uint8), rect=True)


@pytest.mark.parametrize("w,h", [(1280, 720), (640, 480), (720, 1280), (640, 640), (32, 32)])
@pytest.mark.parametrize("rect", [False, True], ids=["square", "rect"])
def test_one_frame_end_to_end_equals_the_batched_path(w, h, rect):
    """``letterboxed_forward`` (what a GPU instance captures in one CUDA graph per frame size, and a CPU instance
    runs eagerly for a lone frame) answers what the batched path does for the same frame: letterbox_batch, the model
    (here the box echo), unletterbox; and the painted boxes come back in the frame's pixels."""
    img, painted = _painted(w, h)
    decoded = frames.Decoder(torch.device("cpu")).decode([_bytes(_jpeg(img))])[0]
    assert isinstance(decoded, torch.Tensor)

    def echo(slot):
        return _echo(slot[0]), torch.tensor([[len(COLOURS)]], dtype=torch.int32)

    shape = frames.letterbox_shape(w, h, rect=rect)
    slot = torch.zeros((1, *shape, 3), dtype=torch.uint8)
    det, count = frames.letterboxed_forward(decoded, slot, torch.tensor([frames.geometry(w, h, rect=rect)]), echo)
    batch = torch.zeros((4, *shape, 3), dtype=torch.uint8)
    geos = frames.letterbox_batch([decoded], batch, rect=rect)
    assert geos == [frames.geometry(w, h, rect=rect)]
    assert torch.equal(slot[0], batch[0])
    want = frames.unletterbox(echo(batch[:1])[0], torch.tensor(geos))
    assert torch.equal(det, want) and int(count[0, 0]) == len(COLOURS)
    one_input_pixel = max(w / frames.letterbox_geometry(w, h)[0], h / frames.letterbox_geometry(w, h)[1])
    for box, row in zip(painted, det[0].tolist()):
        assert row[:4] == pytest.approx(box, abs=one_input_pixel + 0.01)


def test_frame_graph_sizes_parameter_is_read_or_refused_with_the_fix():
    assert frames.frame_sizes("1280x720, 1920X1080,640x480") == [(1280, 720), (1920, 1080), (640, 480)]
    assert frames.frame_sizes("none") == [] and frames.frame_sizes(" ") == []
    for bad in ("1280", "1280x", "x720", "1280x720,abc", "0x720", "9000x100", "1280*720"):
        with pytest.raises(ValueError, match=r"frame_graphs: .* is not WIDTHxHEIGHT .*write e\.g\."):
            frames.frame_sizes(bad)


# ---------------------------------------------------------------- libjpeg's pixels, upright, for every frame class

# Odd sizes: chroma planes of ceil(w / 2) samples, the last one replicated by libjpeg's upsampling.
CLASS_SIZES = [(327, 245), (1280, 720), (1281, 719)]
# How far nvJPEG's pixels may be from libjpeg's on what ``jpeg_decoder: nvjpeg`` gives it (4:2:0 chroma upsampling:
# 48-73 levels measured on the H200); RGB-coded frames, up to 209 off, stay on libjpeg.
NVJPEG_NEAR = 80
DECODERS = ["pillow", "torchvision-cpu", "gpu"]


@pytest.fixture(scope="module")
def classes():
    """{(w, h): {class: JPEG bytes}} (``sample_frames.frame_classes`` says how each class is made)."""
    return {(w, h): sample_frames.frame_classes(w, h) for w, h in CLASS_SIZES}


def _reference(data: bytes):
    """libjpeg's pixels as Pillow gives them, turned upright by EXIF orientation: uint8 [H, W, 3]."""
    import numpy as np
    from PIL import ImageOps

    return np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))


def _decoder(kind):
    if kind == "pillow":
        return frames.Decoder(torch.device("cpu"), "cpu", torchvision=False)
    if kind == "torchvision-cpu":
        d = frames.Decoder(torch.device("cpu"), "cpu")
        if d.cpu_name != "torchvision-cpu":
            pytest.skip("torchvision is not installed here")
        return d
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    return frames.Decoder(torch.device("cuda"), "gpu")


def _max_diff(img, ref) -> int:
    import numpy as np

    got = img.permute(1, 2, 0).cpu().numpy().astype(np.int16)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    return int(np.abs(got - ref).max())


@pytest.mark.parametrize("kind", DECODERS)
def test_every_frame_class_decodes_to_libjpegs_pixels_upright(kind, classes):
    """Each decoder the product can use (Pillow; torchvision's libjpeg and the GPU where installed) gives, for every
    class of frame, Pillow's pixels of the upright frame within one level; prints the table (``-s``)."""
    decoder = _decoder(kind)
    rows = []
    for (w, h), by_class in classes.items():
        names = list(by_class)
        got = decoder.decode([_bytes(by_class[c]) for c in names])  # one batch: the GPU's routing per frame
        for name, img in zip(names, got):
            assert isinstance(img, torch.Tensor), (name, img)
            rows.append((f"{w}x{h}", name, _max_diff(img, _reference(by_class[name]))))
    print(f"\n{kind}: max |decoded - Pillow| per class, served by {dict(decoder.served)}")
    for size, name, diff in rows:
        print(f"  {size:9s} {name:18s} {diff}")
    assert sum(decoder.served.values()) == len(rows)
    assert [r for r in rows if r[2] > 1] == []
    if kind == "gpu":  # nvJPEG's planes answered every frame routed to them (none fell back to the host)
        print(f"  nvJPEG planes: {decoder.planes_info}")
        assert decoder.planes_error is None
        assert decoder.served["nvjpeg-planes"] == len(EXACT_PLANES) * len(classes)


def test_nvjpeg_matches_libjpeg_on_the_frames_route_gives_it(classes):
    """nvJPEG on its own (no routing): the classes ``route`` gives the GPU are within one level of libjpeg; prints
    how far off it is on the others (why they go to libjpeg). With ``jpeg_decoder: nvjpeg`` nvJPEG refuses none of
    the classes routed to it and stays within ``NVJPEG_NEAR`` levels (chroma upsampling); the table shows both."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    from torchvision.io import ImageReadMode, decode_jpeg

    wrong = []
    print("\nnvJPEG alone: max |decoded - Pillow| per class (route exact; route nvjpeg)")
    for (w, h), by_class in classes.items():
        for name, data in by_class.items():
            head = frames.read_header(data)
            where, why = frames.route(head)
            nv_where = frames.route(head, "nvjpeg")[0]
            try:
                img = decode_jpeg(_bytes(data), mode=ImageReadMode.RGB, device="cuda")
                diff = _max_diff(frames.orient(img, head.orientation), _reference(data))
            except RuntimeError as e:  # nvJPEG refuses some (CMYK): a refusal, never wrong pixels
                print(f"  {w}x{h:<5d} {name:18s} refused ({str(e).splitlines()[0][:60]})  {where} ({why}); {nv_where}")
                assert where == "cpu" and nv_where == "cpu", name
                continue
            print(f"  {w}x{h:<5d} {name:18s} {diff:4d}  {where} ({why}); {nv_where}")
            if (where == "gpu" and diff > 1) or (nv_where == "gpu" and diff > NVJPEG_NEAR):
                wrong.append((name, w, h, diff))
    assert wrong == []


# Measured on the H200: nvJPEG's RGB is exact on these classes alone; its planes on the baseline 4:2:0 / 4:2:2 ones.
EXACT_GPU = {"baseline-444", "restart-444", "gray"}
EXACT_PLANES = {"baseline-420", "baseline-422", "restart-420", "icc", "exif-thumbnail", "comment-sof"} | {
    f"exif-{o}" for o in range(1, 9)
}


def test_a_frame_nvjpegs_planes_refuse_falls_back_alone(classes):
    """On a GPU: in one batch, a 4:2:0 frame whose planes nvJPEG does not take (here a sampling it is not told, and
    one with corrupt entropy data) comes back as None from the planes path; its batch-mates are libjpeg's pixels,
    and the Decoder answers every frame (libjpeg on the host for the refused one)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    decoder = frames.Decoder(torch.device("cuda"), "gpu")
    assert decoder.planes_error is None and decoder._planes is not None
    good = [classes[CLASS_SIZES[0]]["baseline-420"], classes[CLASS_SIZES[1]]["baseline-422"]]
    heads = [frames.read_header(d) for d in good]
    sizes = [(h.width, h.height, h.sampling) for h in heads]
    lie = (sizes[0][0], sizes[0][1], ((2, 1), (1, 1), (1, 1)))
    got = decoder._planes.decode([_bytes(good[0]), _bytes(good[0]), _bytes(good[1])], [sizes[0], lie, sizes[1]])
    assert got[1] is None
    for img, data in [(got[0], good[0]), (got[2], good[1])]:
        assert img is not None and _max_diff(img, _reference(data)) == 0
    sos = good[0].index(b"\xff\xda")
    corrupt = good[0][: sos + 40] + bytes(range(1, 255)) * 20 + b"\xff\xd9"
    out = decoder.decode([_bytes(good[0]), _bytes(corrupt), _bytes(good[1])])
    assert _max_diff(out[0], _reference(good[0])) == 0 and _max_diff(out[2], _reference(good[1])) == 0
    print(f"\ncorrupt 4:2:0 frame in a batch: {type(out[1]).__name__}; served {dict(decoder.served)}")


def test_route_sends_nvjpeg_only_what_it_decodes_as_libjpeg_does(classes):
    for name, data in classes[CLASS_SIZES[0]].items():
        where, why = frames.route(frames.read_header(data))
        assert (where == "gpu") == (name in EXACT_GPU), (name, where, why)
        assert (where == "planes") == (name in EXACT_PLANES), (name, where, why)
    assert frames.route(frames.read_header(classes[CLASS_SIZES[0]]["rgb-coded"])) == ("cpu", "rgb-coded")
    assert frames.route(frames.read_header(classes[CLASS_SIZES[0]]["progressive-420"])) == ("cpu", "progressive")


# The classes nvJPEG decodes at all, near libjpeg (``jpeg_decoder: nvjpeg``); the rest it refuses or gets badly wrong.
NVJPEG_CPU = {"cmyk": "cmyk-coded", "ycck": "ycck-coded", "rgb-coded": "rgb-coded"}


@pytest.mark.parametrize("jpeg_decoder", frames.JPEG_DECODERS)
def test_route_in_each_jpeg_decoder_mode_over_every_frame_class(jpeg_decoder, classes):
    """``exact``: nvJPEG's RGB only for the classes it decodes as libjpeg does, its planes for baseline 4:2:0 /
    4:2:2; ``nvjpeg``: nvJPEG's RGB for every class but CMYK / YCCK and RGB-coded; junk between markers goes to
    libjpeg in both."""
    for size, by_class in classes.items():
        for name, data in by_class.items():
            where, why = frames.route(frames.read_header(data), jpeg_decoder)
            if jpeg_decoder == "exact":
                assert (where == "gpu") == (name in EXACT_GPU), (size, name, where, why)
                assert (where == "planes") == (name in EXACT_PLANES), (size, name, where, why)
            elif name in NVJPEG_CPU:
                assert (where, why) == ("cpu", NVJPEG_CPU[name]), (size, name)
            else:
                assert where == "gpu", (size, name, where, why)
    junk = sample_frames.insert_segments(sample_frames.jpeg(160, 120, seed=2), *_disguised()["sof-after-ff00"])
    assert frames.route(frames.read_header(junk), jpeg_decoder) == ("cpu", "junk between markers")


def test_route_nvjpeg_mode_by_header():
    """The header fields that decide, one at a time (progressive gray, 4:2:2, 4:4:0, an irregular chroma layout)."""
    ycc = frames.Header(1280, 720, 3, ((2, 2), (1, 1), (1, 1)), "baseline", "ycbcr")
    assert frames.route(ycc) == ("planes", "ycbcr 4:2:0 planes")
    assert frames.route(ycc._replace(sampling=((2, 1), (1, 1), (1, 1)))) == ("planes", "ycbcr 4:2:2 planes")
    # Only the layouts jpeg_planes upsamples, and baseline (what nvJPEG's hardware decoder takes) go to the planes.
    assert frames.route(ycc._replace(process="extended")) == ("cpu", "4:2:0 chroma")
    assert frames.route(ycc._replace(sampling=((2, 2), (1, 2), (1, 2)))) == ("cpu", "4:2:2 chroma")
    assert frames.route(ycc._replace(sampling=((1, 2), (1, 1), (1, 1)))) == ("cpu", "4:4:0 chroma")
    assert frames.route(ycc, "nvjpeg") == ("gpu", "ycbcr 4:2:0")
    assert frames.route(ycc._replace(process="progressive"), "nvjpeg") == ("gpu", "ycbcr 4:2:0")
    assert frames.route(ycc._replace(sampling=((2, 1), (1, 1), (1, 1))), "nvjpeg") == ("gpu", "ycbcr 4:2:2")
    assert frames.route(ycc._replace(sampling=((1, 2), (1, 1), (1, 1))), "nvjpeg") == ("gpu", "ycbcr 4:4:0")
    assert frames.route(ycc._replace(sampling=((2, 2), (2, 1), (1, 1))), "nvjpeg") == ("cpu", "irregular chroma")
    gray = frames.Header(640, 480, 1, ((1, 1),), "progressive", "gray")
    assert frames.route(gray) == ("cpu", "progressive")
    assert frames.route(gray, "nvjpeg") == ("gpu", "gray")
    with pytest.raises(ValueError, match="jpeg_decoder 'fast': exact or nvjpeg"):
        frames.route(ycc, "fast")


def test_a_decoder_refuses_an_unknown_jpeg_decoder_naming_the_parameter():
    with pytest.raises(ValueError, match=r"parameter jpeg_decoder: 'fast' is not exact or nvjpeg \(exact: "):
        frames.Decoder(torch.device("cpu"), jpeg_decoder="fast")
    # A CPU instance decodes every frame with libjpeg in either mode.
    d = frames.Decoder(torch.device("cpu"), jpeg_decoder="nvjpeg")
    assert not d.on_gpu and d.jpeg_decoder == "nvjpeg"
    assert isinstance(d.decode([_bytes(sample_frames.jpeg(160, 120))])[0], torch.Tensor)
    assert set(d.served) == {d.cpu_name}


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_gives_the_upright_frame_and_its_size(orientation, classes):
    data = classes[CLASS_SIZES[0]][f"exif-{orientation}"]
    w, h = CLASS_SIZES[0]
    upright = (h, w) if orientation >= 5 else (w, h)
    assert frames.read_header(data).orientation == orientation
    assert frames.jpeg_size(data) == upright == ImageOpsSize(data)
    img = frames.Decoder(torch.device("cpu"), torchvision=False).decode([_bytes(data)])[0]
    assert isinstance(img, torch.Tensor) and (img.shape[2], img.shape[1]) == upright
    assert _max_diff(img, _reference(data)) == 0


def ImageOpsSize(data):
    from PIL import ImageOps

    return ImageOps.exif_transpose(Image.open(io.BytesIO(data))).size


def test_a_phone_frame_is_stored_turned_and_served_upright():
    """``sample_frames.phone_jpeg``: Pillow, applying the EXIF tag, sees the upright pixels it was made from."""
    import numpy as np

    for orientation in (3, 6, 8):
        data = sample_frames.phone_jpeg(120, 200, seed=1, orientation=orientation)
        head = frames.read_header(data)
        assert head.orientation == orientation and head.upright == (120, 200)
        err = np.abs(_reference(data).astype(int) - sample_frames.pixels(120, 200, seed=1)).mean()
        assert err < 3, (orientation, err)  # JPEG's loss only; a wrong turn is tens of levels off


# ---------------------------------------------------------------- the size check reads what the decoder will decode

_FAKE_SOF = b"\xff\xc0\x00\x11\x08\x00\x64\x00\x64\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"  # 100×100, 4:2:0


def _real_sof_size(data: bytes, w: int, h: int) -> bytes:
    """``data`` with its (only, baseline) frame header saying w×h: Pillow reads that size from it, as libjpeg would."""
    i = data.index(b"\xff\xc0\x00\x11")
    return data[: i + 5] + struct.pack(">HH", h, w) + data[i + 9 :]


def _disguised():
    """{case: JPEG} whose first SOF-looking bytes (100×100) are not its frame header to libjpeg."""
    seg = sample_frames.segment
    return {
        "sof-in-com": (seg(0xFE, _FAKE_SOF),),
        "sof-in-app1": (seg(0xE1, b"XMP\x00" + _FAKE_SOF),),
        "sof-in-app13": (seg(0xED, _FAKE_SOF),),
        # A naive walk reads FF 00 as a segment of length 6, skips to the fake SOF; libjpeg skips FF 00 and the
        # junk after it, finds the COM, and skips the fake SOF inside it.
        "sof-after-ff00": (b"\xff\x00\x00\x06", seg(0xFE, _FAKE_SOF)),
        "fill-bytes": (b"\xff\xff\xff", seg(0xFE, b"hi")),
    }


@pytest.mark.parametrize("case", list(_disguised()))
def test_the_size_checked_is_the_size_libjpeg_decodes(case):
    base = sample_frames.jpeg(160, 120, seed=2)
    data = sample_frames.insert_segments(base, *_disguised()[case])
    head = frames.read_header(data)
    assert (head.width, head.height) == Image.open(io.BytesIO(data)).size == (160, 120)
    img = frames.Decoder(torch.device("cpu"), torchvision=False).decode([_bytes(data)])[0]
    assert isinstance(img, torch.Tensor) and _max_diff(img, _reference(data)) == 0
    # The same disguise over a frame too large to serve: refused from the header, before any decode.
    big = sample_frames.insert_segments(_real_sof_size(base, 9000, 9000), *_disguised()[case])
    assert Image.open(io.BytesIO(big)).size == (9000, 9000)
    with pytest.raises(frames.FrameError, match="9000x9000 pixels is larger than this model serves"):
        frames.read_header(big)
    out = frames.prepare([_bytes(big)], frames.Decoder(torch.device("cpu"), torchvision=False))
    assert isinstance(out[0], frames.FrameError)


def test_junk_between_markers_goes_to_libjpeg_on_a_gpu():
    data = sample_frames.insert_segments(
        sample_frames.jpeg(160, 120, seed=2, quality=90), *_disguised()["sof-after-ff00"]
    )
    head = frames.read_header(data)
    assert head.extraneous == 3 and frames.route(head) == ("cpu", "junk between markers")  # 00 06 and FF 00's 00
    assert frames.read_header(sample_frames.jpeg(160, 120)).extraneous == 0


def test_a_second_frame_header_is_refused_as_libjpeg_refuses_it():
    base = sample_frames.jpeg(160, 120, seed=2)
    i = base.index(b"\xff\xc0")
    sof = base[i : i + 2 + 17]
    twice = base[:i] + sof + base[i:]
    with pytest.raises(frames.FrameError, match="a second frame header"):
        frames.read_header(twice)
    with pytest.raises(OSError):  # libjpeg: "Invalid JPEG file structure: two SOF markers"
        Image.open(io.BytesIO(twice)).load()
    # Of another size after the real one: Pillow's own header read takes the last, libjpeg refuses; so do we.
    other = base[:i] + sof + _real_sof_size(base, 9000, 100)[i:]
    with pytest.raises(frames.FrameError, match="a second frame header"):
        frames.read_header(other)


@pytest.mark.parametrize(
    "segment,why",
    [
        (b"\xff\xfe\xff\xff", "segment FFFE at byte 2 of length 65535"),  # runs past the end
        (b"\xff\xfe\x00\x01", "of length 1"),  # shorter than its own length field
        (b"\xff\xfe\x00\x00", "of length 0"),
        (b"\xff\xc8\x00\x04ab", "marker FFC8"),  # JPG: libjpeg stops (unknown marker)
        (b"\xff\xd8", "second start-of-image"),
    ],
)
def test_truncated_or_impossible_segments_are_refused(segment, why):
    base = sample_frames.jpeg(160, 120, seed=2)
    with pytest.raises(frames.FrameError, match=why):
        frames.read_header(sample_frames.insert_segments(base, segment))


def test_a_segment_cut_by_the_end_is_refused():
    base = sample_frames.jpeg(160, 120, seed=2)
    i = base.index(b"\xff\xc0")
    with pytest.raises(frames.FrameError, match="length 17"):
        frames.read_header(base[: i + 10] + b"\xff\xd9")


@pytest.mark.parametrize(
    "w,h,why",
    [(1280, 1, "letterboxes to 640x0"), (1, 1281, "letterboxes to 0x640"), (8193, 4, "at most 8192 per side")],
)
def test_frames_too_thin_to_letterbox_or_too_large_are_refused(w, h, why):
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 200, 30)).save(buf, format="JPEG")
    with pytest.raises(frames.FrameError, match=why):
        frames.read_header(buf.getvalue())


def test_the_smallest_frames_letterbox():
    for w, h in [(1, 1), (1280, 2), (2, 1280)]:
        buf = io.BytesIO()
        Image.new("RGB", (w, h), (10, 200, 30)).save(buf, format="JPEG")
        img = frames.prepare([_bytes(buf.getvalue())], frames.Decoder(torch.device("cpu")))[0]
        assert isinstance(img, torch.Tensor) and img.shape == (3, h, w)
        assert frames.letterbox(img, torch.zeros((640, 640, 3), dtype=torch.uint8))[4:] == (w, h)


def test_host_frames_of_a_batch_decode_on_threads_as_one_by_one(classes):
    by_class = classes[CLASS_SIZES[0]]
    batch = [_bytes(d) for d in by_class.values()]
    one = frames.Decoder(torch.device("cpu"), torchvision=False).decode(batch)
    threaded = frames.Decoder(torch.device("cpu"), torchvision=False, cpu_threads=3)
    for a, b in zip(one, threaded.decode(batch)):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    assert threaded.served == {"pillow": len(batch)}
