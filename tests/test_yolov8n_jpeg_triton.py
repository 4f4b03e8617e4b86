"""JPEG frames through a real Triton (nvidia-pytriton wheel, CPU instance, python backend): the yolov8n_torch
model as gpuhost ships it (``input: jpeg``), frames of several sizes in, boxes in each frame's pixels out, each
answer compared with the same pipeline run eagerly in this process; a corrupt frame in a batch fails only its own
request, and the instance keeps answering.

The weights are the model code's seeded random ones and ``conf`` is 0, so every frame answers boxes
whose places depend on the frame (its pixels and its letterbox geometry); the model's CPU kernels run on one
thread in Triton and here, so the answers must agree to float rounding.
"""

import concurrent.futures
import json
import urllib.request

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

from plans.triton_repo import repository_files, yolov8n_torch  # noqa: E402
from serving import loadgate, sample_frames  # noqa: E402
from serving.models import frames, yolov8n_files  # noqa: E402
from tests.servers.triton import triton_fixture  # noqa: E402

MAX_DET = 10
SIZES = [(1280, 720), (1920, 1080), (640, 480), (480, 640), (32, 32)]


def _populate(repo):
    spec = yolov8n_torch(
        name="det",
        gpu=False,
        input="jpeg",
        max_batch_size=4,
        instances=1,
        # A long window with a preferred batch of 4: four requests sent together run as one batch.
        window_us=3_000_000,
        preferred_batch_size=[4],
        max_det=MAX_DET,
    )
    spec = spec.model_copy(update={"parameters": {**spec.parameters, "conf": "0.0", "torch_threads": "1"}})
    files = repository_files([spec], gpu_count=0, model_files=yolov8n_files("det"))
    for rel, data in files.items():
        p = repo / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


triton = triton_fixture(_populate)


@pytest.fixture(scope="module")
def reference():
    """The pipeline eagerly in this process: decode, letterbox, the seeded model, NMS, boxes back to the frame."""
    from serving.models import yolov8n as yolo

    torch.manual_seed(0)
    model = yolo.fuse(yolo.YOLOv8n().eval())
    pre = yolo.Preprocess(torch.float32)
    decoder = frames.Decoder(torch.device("cpu"))

    def run(data: bytes):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            img = frames.prepare([torch.frombuffer(bytearray(data), dtype=torch.uint8)], decoder)[0]
            assert isinstance(img, torch.Tensor), img
            batch = torch.zeros((1, 640, 640, 3), dtype=torch.uint8)
            geo = frames.letterbox(img, batch[0])
            with torch.no_grad():
                det, _ = yolo.fast_nms(model(pre(batch)), max_det=MAX_DET, conf=0.0)
            return frames.unletterbox(det, torch.tensor([geo]))[0]
        finally:
            torch.set_num_threads(threads)

    return run


def _infer(url: str, frame: bytes):
    body, headers = loadgate.binary_request([("images", "UINT8", [1, len(frame)], frame)], ["detections"])
    req = urllib.request.Request(f"{url}/v2/models/det/infer", data=body, headers=dict(headers), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            data, head_len = r.read(), int(r.headers["Inference-Header-Content-Length"])
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()).get("error", "")
    head = json.loads(data[:head_len])
    out = head["outputs"][0]
    assert out["name"] == "detections" and out["shape"] == [1, MAX_DET, 6]
    return 200, torch.frombuffer(bytearray(data[head_len:]), dtype=torch.float32).view(MAX_DET, 6)


def _stats(url):
    with urllib.request.urlopen(f"{url}/v2/models/det/stats", timeout=10) as r:
        return json.loads(r.read())["model_stats"][0]


def test_frames_of_several_sizes_answer_boxes_in_their_own_pixels(triton, reference):
    answers = []
    for k, (w, h) in enumerate(SIZES):
        data = sample_frames.jpeg(w, h, seed=k)
        status, det = _infer(triton.http_url, data)
        assert status == 200, det
        assert torch.allclose(det, reference(data), atol=1e-3), f"{w}x{h}"
        assert int((det[:, 4] > 0).sum()) >= 1
        assert (det[:, [0, 2]] <= w).all() and (det[:, [1, 3]] <= h).all() and (det[:, :4] >= 0).all()
        answers.append(det)
    # Distinct frames answer distinct boxes (the test can tell one frame's answer from another's).
    for i in range(len(answers)):
        for j in range(i):
            assert not torch.allclose(answers[i][:, :4], answers[j][:, :4], atol=1.0)


def test_a_corrupt_frame_in_a_batch_fails_alone_and_the_instance_keeps_answering(triton, reference):
    good = [sample_frames.jpeg(w, h, seed=10 + k) for k, (w, h) in enumerate([(1280, 720), (640, 480), (1920, 1080)])]
    corrupt = good[0][:700] + bytes(range(256)) * 60  # a valid header, then no image data
    sent = [good[0], corrupt, good[1], good[2]]
    before = _stats(triton.http_url)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda d: _infer(triton.http_url, d), sent))
    after = _stats(triton.http_url)
    assert int(after["execution_count"]) - int(before["execution_count"]) == 1  # one batch of four
    status, why = results[1]
    assert status == 400 and "frame 0 of the request" in why and "corrupt JPEG" in why, why
    for (status, det), data in zip([results[0], results[2], results[3]], good):
        assert status == 200, det
        assert torch.allclose(det, reference(data), atol=1e-3)
    # Not a JPEG at all, and an absurd header: refused before any decode, with the reason.
    status, why = _infer(triton.http_url, b"GIF89a" + bytes(64))
    assert status == 400 and "not a JPEG" in why
    i = good[1].index(b"\xff\xc0")
    huge = good[1][: i + 5] + (60000).to_bytes(2, "big") * 2 + good[1][i + 9 :]
    status, why = _infer(triton.http_url, huge)
    assert status == 400 and "60000x60000 pixels is larger than this model serves" in why
    # The instance is alive: the next frame answers correctly.
    status, det = _infer(triton.http_url, good[2])
    assert status == 200 and torch.allclose(det, reference(good[2]), atol=1e-3)
