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

from serving import sample_frames  # noqa: E402
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
def test_letterbox_and_back_gives_the_painted_boxes_in_the_frames_pixels(w, h):
    img, painted = _painted(w, h)
    data = _jpeg(img)
    assert frames.jpeg_size(data) == (w, h)
    decoded = frames.Decoder(torch.device("cpu")).decode([_bytes(data)])[0]
    assert isinstance(decoded, torch.Tensor) and decoded.shape == (3, h, w)
    batch = torch.zeros((1, 640, 640, 3), dtype=torch.uint8)
    geo = frames.letterbox(decoded, batch[0])
    new_w, new_h, left, top = frames.letterbox_geometry(w, h)
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
        (good[:2] + b"\x00" * 30 + b"\xff\xd9", "no marker"),
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
    assert [(w, h) for w, h, _ in got] == [(1280, 720)] * 2 + [(1920, 1080)] * 2 + [(640, 480)] * 2
    assert len({d for *_, d in got}) == 6
    for w, h, d in got:
        assert frames.jpeg_size(d) == (w, h)
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


@pytest.mark.parametrize("w,h", [(1280, 720), (640, 480), (720, 1280), (640, 640), (32, 32)])
def test_one_frame_end_to_end_equals_the_batched_path(w, h):
    """``letterboxed_forward`` (what a GPU instance captures in one CUDA graph per frame size, and a CPU instance
    runs eagerly for a lone frame) answers what the batched path does for the same frame: letterbox_batch, the model
    (here the box echo), unletterbox; and the painted boxes come back in the frame's pixels."""
    img, painted = _painted(w, h)
    decoded = frames.Decoder(torch.device("cpu")).decode([_bytes(_jpeg(img))])[0]
    assert isinstance(decoded, torch.Tensor)

    def echo(slot):
        return _echo(slot[0]), torch.tensor([[len(COLOURS)]], dtype=torch.int32)

    slot = torch.zeros((1, 640, 640, 3), dtype=torch.uint8)
    det, count = frames.letterboxed_forward(decoded, slot, torch.tensor([frames.geometry(w, h)]), echo)
    batch = torch.zeros((4, 640, 640, 3), dtype=torch.uint8)
    geos = frames.letterbox_batch([decoded], batch)
    assert geos == [frames.geometry(w, h)]
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
