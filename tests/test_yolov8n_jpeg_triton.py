"""JPEG frames through a real Triton (nvidia-pytriton wheel, CPU instance, python backend): the yolov8n_torch
model as gpuhost ships it (``input: jpeg``), frames of several sizes in, boxes in each frame's pixels out, each
answer compared with the same pipeline run eagerly in this process; a corrupt frame in a batch fails only its own
request, and the instance keeps answering.

The weights are the test detector's (``serving/models/yolov8n_synthetic.py``, shipped as the model's weights file),
so every frame answers tens of boxes (at conf 0.1) whose places depend on the frame (its pixels and its letterbox geometry); the
model's CPU kernels run on one thread in Triton and here, so the answers agree to float rounding (compared as
``bench.gpu_frames.MatchesReference`` does on the GPU, with a tolerance of 0.1 frame pixel).
"""

import concurrent.futures
import json
import time
import urllib.request

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

from gate import loadgate, sample_frames  # noqa: E402
from plans.triton_repo import repository_files, yolov8n_torch  # noqa: E402
from serving.models import frames, yolov8n_files  # noqa: E402
from testbed.servers.nginx import front_triton_fixture  # noqa: E402
from testbed.servers.redis import redis_fixture  # noqa: E402

MAX_DET, CONF = 100, 0.1
SIZES = [(1280, 720), (1920, 1080), (640, 480), (480, 640), (32, 32)]


@pytest.fixture(scope="module")
def weights():
    from bench.yolo_check import weights_file

    return weights_file()


def _populate(repo, weights):
    from bench.yolo_check import WEIGHTS_FILE

    spec = yolov8n_torch(
        name="det",
        gpu=False,
        input="jpeg",
        weights=WEIGHTS_FILE,
        max_batch_size=4,
        instances=1,
        # A long window with a preferred batch of 4: four requests sent together run as one batch.
        window_us=3_000_000,
        preferred_batch_size=[4],
        max_det=MAX_DET,
    )
    # conf 0.1: the test detector, calibrated on 640×640 images, is less sure of letterboxed camera frames.
    spec = spec.model_copy(update={"parameters": {**spec.parameters, "torch_threads": "1", "conf": str(CONF)}})
    # Loaded only by the test of the jpeg_decoder parameter (Triton starts with det alone).
    nvjpeg = yolov8n_torch(
        name="det_nvjpeg", gpu=False, input="jpeg", jpeg_decoder="nvjpeg", weights=WEIGHTS_FILE, max_det=MAX_DET
    )
    nvjpeg = nvjpeg.model_copy(update={"parameters": {**nvjpeg.parameters, "torch_threads": "1", "conf": str(CONF)}})
    for s in (spec, nvjpeg):
        files = repository_files([s], gpu_count=0, model_files=yolov8n_files(s.name, 1, weights, WEIGHTS_FILE))
        for rel, data in files.items():
            p = repo / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)


@pytest.fixture(scope="module")
def triton(tmp_path_factory, weights):
    from testbed.servers.triton import start_triton, triton_available

    if not triton_available():
        pytest.skip("tritonserver from the nvidia-pytriton wheel is not installed")
    base = tmp_path_factory.mktemp("triton")
    (base / "models").mkdir()
    _populate(base / "models", weights)
    explicit = ("--model-control-mode=explicit", "--load-model=det")  # as deployed; the others load on request
    with start_triton(base / "models", workdir=base / "work", ready_timeout=300, extra_args=explicit) as handle:
        yield handle


@pytest.fixture(scope="module")
def reference(weights):
    """The pipeline eagerly in this process: decode, letterbox, the same weights file, NMS, boxes back to the frame."""
    from serving.models import yolov8n as yolo
    from serving.models.yolov8n_weights import load_model

    model = yolo.fuse(load_model(weights))
    pre = yolo.Preprocess(torch.float32)
    decoder = frames.Decoder(torch.device("cpu"))

    def run(data: bytes):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            img = frames.prepare([torch.frombuffer(bytearray(data), dtype=torch.uint8)], decoder)[0]
            assert isinstance(img, torch.Tensor), img
            # The rect letterbox: the model's default for a state_dict, as predict's for a checkpoint.
            batch = torch.zeros(
                (1, *frames.letterbox_shape(img.shape[2], img.shape[1], rect=True), 3), dtype=torch.uint8
            )
            geo = frames.letterbox(img, batch[0])
            with torch.no_grad():
                det, count = yolo.fast_nms(model(pre(batch)), max_det=MAX_DET, conf=CONF)
            return frames.unletterbox(det, torch.tensor([geo]))[0], int(count[0, 0])
        finally:
            torch.set_num_threads(threads)

    return run


def _same(det, ref) -> bool:
    """The answer's boxes are the reference's (count, then each box to 0.1 frame pixel, score to 1e-3)."""
    from bench.gpu_frames import MatchesReference

    want, count = ref
    got = int((det[:, 4] > 0).sum())
    check = MatchesReference(want.tolist(), count, tol_px=0.1, tol_score=1e-3, conf=-1.0)  # every box must match
    ok = got == count and check(*_answer_body(det, got)) is None
    return ok and bool((det[count:] == 0).all())


def _answer_body(det, count):
    blob = det.numpy().tobytes()
    head = json.dumps(
        {
            "outputs": [
                {"name": "detections", "parameters": {"binary_data_size": len(blob)}},
                {"name": "num_detections", "parameters": {"binary_data_size": 4}},
            ]
        }
    ).encode()
    return head + blob + count.to_bytes(4, "little"), str(len(head))


def _infer(url: str, frame: bytes, model: str = "det"):
    body, headers = loadgate.binary_request([("images", "UINT8", [1, len(frame)], frame)], ["detections"])
    req = urllib.request.Request(f"{url}/v2/models/{model}/infer", data=body, headers=dict(headers), method="POST")
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


def _stats_after(url, before, successes: int, timeout: float = 30.0):
    """The model's statistics once `successes` more requests than in `before` are recorded as successful."""
    deadline = time.monotonic() + timeout
    while True:
        s = _stats(url)
        got = int(s["inference_stats"]["success"]["count"]) - int(before["inference_stats"]["success"]["count"])
        if got >= successes:
            return s
        if time.monotonic() > deadline:
            raise AssertionError(f"{got} of {successes} successful requests recorded in {timeout} s: {s}")
        time.sleep(0.1)


def test_frames_of_several_sizes_answer_boxes_in_their_own_pixels(triton, reference):
    answers = []
    for k, (w, h) in enumerate(SIZES):
        data = sample_frames.jpeg(w, h, seed=k)
        status, det = _infer(triton.http_url, data)
        assert status == 200, det
        ref = reference(data)
        assert ref[1] >= 10, f"{w}x{h}: the test detector finds {ref[1]} boxes"
        assert _same(det, ref), f"{w}x{h}"
        assert (det[:, [0, 2]] <= w).all() and (det[:, [1, 3]] <= h).all() and (det[:, :4] >= 0).all()
        answers.append((det, ref))
    # Distinct frames answer distinct boxes (the test can tell one frame's answer from another's).
    for i in range(len(answers)):
        for j in range(len(answers)):
            assert (i == j) == _same(answers[i][0], answers[j][1])


def test_a_corrupt_frame_in_a_batch_fails_alone_and_the_instance_keeps_answering(triton, reference):
    good = [sample_frames.jpeg(w, h, seed=10 + k) for k, (w, h) in enumerate([(1280, 720), (640, 480), (1920, 1080)])]
    # Every header and an end but no image data: passes the header check, fails in the decoder.
    corrupt = good[0][: good[0].index(b"\xff\xda")] + b"\xff\xd9"
    sent = [good[0], corrupt, good[1], good[2]]
    before = _stats(triton.http_url)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda d: _infer(triton.http_url, d), sent))
    # The preferred batch of 4 with a 3 s window makes the four one batch. Triton records a batch's statistics after
    # its responses went out, so they are read once the three good frames are counted (bounded), not at once.
    after = _stats_after(triton.http_url, before, successes=3)
    assert int(after["execution_count"]) - int(before["execution_count"]) == 1, (before, after)  # one batch of four
    status, why = results[1]
    assert status == 400 and "frame 0 of the request" in why and "corrupt JPEG" in why, why
    for (status, det), data in zip([results[0], results[2], results[3]], good):
        assert status == 200, det
        assert _same(det, reference(data))
    # Not a JPEG at all, a cut upload and an absurd header: refused before any decode, with the reason.
    status, why = _infer(triton.http_url, b"GIF89a" + bytes(64))
    assert status == 400 and "not a JPEG" in why
    status, why = _infer(triton.http_url, good[1][: len(good[1]) // 2])
    assert status == 400 and "truncated" in why
    i = good[1].index(b"\xff\xc0")
    huge = good[1][: i + 5] + (60000).to_bytes(2, "big") * 2 + good[1][i + 9 :]
    status, why = _infer(triton.http_url, huge)
    assert status == 400 and "60000x60000 pixels is larger than this model serves" in why
    # The instance is alive: the next frame answers correctly.
    status, det = _infer(triton.http_url, good[2])
    assert status == 200 and _same(det, reference(good[2]))


def _solid(w, h) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), (90, 140, 200)).save(buf, format="JPEG")
    return buf.getvalue()


def _decoded(url) -> dict[str, float]:
    """``gpuhost_frames_decoded_total`` of the model by decoder, from Triton's Prometheus endpoint."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("gpuhost_frames_decoded_total{") and 'model="det"' in line:
            decoder = line.split('decoder="', 1)[1].split('"', 1)[0]
            out[decoder] = float(line.rsplit(" ", 1)[1])
    return out


def test_frames_too_thin_too_large_or_disguised_fail_alone_in_their_batch(triton, reference):
    """One dynamic batch of four: a 1280×1 frame (it letterboxes to 640×0: before, every request of the batch got
    HTTP 500), a frame whose size is hidden behind a fake 100×100 SOF (libjpeg skips it and would decode
    9000×9000), a 1×1 frame and a camera frame: the first two fail alone with HTTP 400 and why, the others answer
    their own boxes; the decoders' count on Triton's /metrics grows by the two frames decoded."""
    good = sample_frames.jpeg(1280, 720, seed=30)
    base = sample_frames.jpeg(160, 120, seed=31)
    i = base.index(b"\xff\xc0\x00\x11")
    big = base[: i + 5] + (9000).to_bytes(2, "big") * 2 + base[i + 9 :]
    fake = b"\xff\xc0\x00\x11\x08\x00\x64\x00\x64\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    disguised = sample_frames.insert_segments(big, b"\xff\x00\x00\x06", sample_frames.segment(0xFE, fake))
    sent = [_solid(1280, 1), disguised, _solid(1, 1), good]
    before, decoded = _stats(triton.http_url), _decoded(triton.metrics_url)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda d: _infer(triton.http_url, d), sent))
    after = _stats_after(triton.http_url, before, successes=2)
    assert int(after["execution_count"]) - int(before["execution_count"]) == 1, (before, after)  # one batch of four
    status, why = results[0]
    assert status == 400 and "frame 0 of the request" in why and "1280x1 pixels letterboxes to 640x0" in why, why
    status, why = results[1]
    assert status == 400 and "9000x9000 pixels is larger than this model serves" in why, why
    for (status, det), data, (w, h) in zip(results[2:], sent[2:], [(1, 1), (1280, 720)]):
        assert status == 200, det
        assert _same(det, reference(data))
        assert (det[:, [0, 2]] <= w).all() and (det[:, [1, 3]] <= h).all()
    now = _decoded(triton.metrics_url)
    assert now.get("pillow", 0) - decoded.get("pillow", 0) == 2, (decoded, now)


def test_a_phone_frame_answers_boxes_in_its_upright_frame(triton, reference):
    """A portrait phone frame (stored 1280×720, EXIF orientation 6): the answer is the reference's (the frame
    turned upright, then letterboxed) and every box lies in the upright 720×1280 frame, as the gate checks it."""
    from gate.kserve import BoxesInFrame

    data = sample_frames.phone_jpeg(720, 1280, seed=32)
    assert frames.jpeg_size(data) == (720, 1280)
    status, det = _infer(triton.http_url, data)
    assert status == 200, det
    ref = reference(data)
    assert ref[1] >= 10 and _same(det, ref)
    assert BoxesInFrame(720, 1280)(*_answer_body(det, ref[1])) is None
    # Served in the stored grid instead, the answer would not be this one.
    stored = data[:2] + data[2 + len(sample_frames.exif_app1(6)) :]  # the same bytes without the EXIF tag
    assert frames.jpeg_size(stored) == (1280, 720) and not _same(det, reference(stored))


def _repository(url: str, model: str, action: str, body: bytes = b"{}") -> tuple[int, str]:
    """POST /v2/repository/models/<model>/load|unload: (status, Triton's error or "")."""
    req = urllib.request.Request(f"{url}/v2/repository/models/{model}/{action}", data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}").get("error", "")


def _ready(url: str, timeout: float = 60.0) -> None:
    """Wait until the (strictly ready) server is ready again: a model still unloading makes it not ready."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=10):
                return
        except urllib.error.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_the_jpeg_decoder_parameter_is_read_at_initialize_and_a_bad_one_fails_the_load(triton, reference):
    """On a CPU instance both choices decode with libjpeg: ``nvjpeg`` loads, says so at start and answers as
    ``exact`` does; a reload with a value that is neither fails with the parameter named (the loaded one stays)."""
    url = triton.http_url
    status, why = _repository(url, "det_nvjpeg", "load")
    assert status == 200, why
    try:
        assert '"jpeg_decoder": "nvjpeg"' in triton.log()
        frame = sample_frames.jpeg(1280, 720, seed=3)
        status, det = _infer(url, frame, "det_nvjpeg")
        assert status == 200 and _same(det, reference(frame))
        with urllib.request.urlopen(f"{url}/v2/models/det_nvjpeg/config", timeout=10) as r:
            config = json.loads(r.read())
        config["parameters"]["jpeg_decoder"] = {"string_value": "fast"}
        override = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
        status, why = _repository(url, "det_nvjpeg", "load", override)
        assert status == 400 and "parameter jpeg_decoder: 'fast' is not exact or nvjpeg" in why, why
        status, det = _infer(url, frame, "det_nvjpeg")
        assert status == 200 and _same(det, reference(frame))
    finally:
        _repository(url, "det_nvjpeg", "unload")
        _ready(url)


nginx = front_triton_fixture("det")
redis_srv = redis_fixture()


def test_jpeg_frames_through_the_queue_gateway_each_answer_its_own_frame(triton, reference, redis_srv, tmp_path):
    """Seed 001's gateway in front of the detector taking frames (real redis-server, a real worker process, this
    Triton over gRPC): JPEG frames are UINT8 [1, bytes] of every length; 1280×720 and 1920×1080 (over the queue's
    64 KiB inline bound) travel in a key of their own, 640×480 in the stream entry. Each answer is its own frame's
    boxes (the reference), not another frame's; nothing is left in Redis once they are answered."""
    import numpy as np
    import redis

    from serving.queue import JobQueue, QueueConfig
    from testbed.servers import stop_process
    from testbed.servers.gateway import spawn_worker, worker_config

    sizes = [(1280, 720), (640, 480), (1920, 1080), (640, 480)]
    sent = [sample_frames.jpeg(w, h, seed=20 + k) for k, (w, h) in enumerate(sizes)]
    r = redis.Redis(port=redis_srv.port)
    r.flushall()
    q = JobQueue(r, QueueConfig(max_depth=10))
    q.ensure_group()
    keys = [q.submit("det", {"images": np.frombuffer(f, dtype=np.uint8)[None]}) for f in sent]
    # Queued before any worker reads: each frame took the path its length decides.
    entries = [fields for _, fields in q.r.xrange(q.cfg.stream)]
    assert [b"payload" in f for f in entries] == [len(f) >= q.cfg.inline_max_bytes for f in sent]
    assert [b"payload" in f for f in entries] == [True, False, True, False]
    assert [r.strlen(f"gen:in:{k}") for k in keys] == [len(f) if len(f) >= 64 * 1024 else 0 for f in sent]
    # One worker, four slots: the four frames (four lengths) reach Triton together, one ragged batch.
    cfg = worker_config(redis_srv.port, {"t": triton}, {"t": 1}, slots=4, models=["det"], queue={"max_depth": 10})
    worker = spawn_worker(cfg, "w1", tmp_path)
    try:
        answers = []
        for key in keys:
            res = q.result(key, timeout_s=300)
            assert res.status == "ok" and res.backend == "t", res.error
            det = res.outputs["detections"]
            assert det.shape == (1, MAX_DET, 6) and res.outputs["num_detections"].reshape(-1)[0] >= 10
            answers.append(torch.from_numpy(det.reshape(MAX_DET, 6).copy()))
        refs = [reference(f) for f in sent]
        for i in range(len(sent)):
            for j in range(len(sent)):
                assert (i == j) == _same(answers[i], refs[j]), (i, j)
        assert q.depth() == 0 and not r.keys("gen:in:*") and len(r.keys("gen:result:*")) == len(keys)
    finally:
        stop_process(worker, timeout=10)
        r.close()


def test_the_gate_sends_jpeg_frames_of_three_sizes_through_nginx_and_checks_each_answer(triton, nginx):
    """The acceptance gate as `pulumi up` runs it (the SDK's provider server) for a model that takes frames: its
    signature from the stack's spec marks `images` as JPEG, the gate sends 1280×720, 1920×1080 and 640×480 frames
    and a phone's portrait frame (EXIF-rotated) in turn and checks every answer's boxes against its own upright
    frame."""
    from components.triton_service import gate_signature
    from providers.triton_gate import AcceptanceGateProvider
    from testbed.provider_server import ProviderServer
    from testbed.servers.triton import gate_inputs

    spec = yolov8n_torch(name="det", input="jpeg", gpu=False, max_batch_size=4, max_det=MAX_DET, weights="w.pt")
    sig = gate_signature(spec)
    assert sig["inputs"] == [{"name": "images", "datatype": "UINT8", "shape": [1, 1], "content": "jpeg"}]
    before = _stats(triton.http_url)
    load = {"concurrency": 1, "max_requests": 6, "warmup_requests": 1, "check_requests": 1}
    # CPU model on a shared 2-core machine: the SLO here is only that every answer is right.
    slo = {"p95_ms": 600_000, "request_timeout_s": 120}
    inputs = gate_inputs(nginx.http, "det", request=sig, version="1", **load, **slo)
    with ProviderServer({}) as srv:
        gate = srv.resource(AcceptanceGateProvider(), "gpuhost:serving:AcceptanceGate", "gate-det")
        op, outs = gate.up(inputs)
    assert op == "create" and outs["result"]["errors"] == 0 and outs["result"]["requests"] >= 1
    # Four checked frames (three camera sizes, a phone's), warmup, the load: Triton records a request's success after its response went out, so the
    # count is waited for (bounded), not read at once.
    _stats_after(triton.http_url, before, successes=4 + 1 + outs["result"]["requests"])


def test_boxes_in_frame_check_tells_a_right_answer_from_a_wrong_one():
    import struct

    from gate.kserve import BoxesInFrame

    def answer(count, rows):
        det = b"".join(struct.pack("<6f", *r) for r in rows)
        head = json.dumps(
            {
                "outputs": [
                    {"name": "detections", "shape": [1, len(rows), 6], "parameters": {"binary_data_size": len(det)}},
                    {"name": "num_detections", "shape": [1, 1], "parameters": {"binary_data_size": 4}},
                ]
            }
        ).encode()
        return head + det + struct.pack("<i", count), str(len(head))

    check = BoxesInFrame(1280, 720)
    zero = (0.0,) * 6
    assert check(*answer(1, [(10, 20, 1280, 720, 0.9, 3), zero])) is None
    assert "not inside the 1280x720 frame" in (check(*answer(1, [(10, 20, 1281, 700, 0.9, 3), zero])) or "")
    assert "not inside" in (check(*answer(1, [(10, 20, 5, 700, 0.9, 3), zero])) or "")  # x2 < x1
    assert "past the count" in (check(*answer(1, [(10, 20, 30, 40, 0.9, 3), (1, 1, 2, 2, 0.5, 1)])) or "")
    assert "not within" in (check(*answer(3, [zero, zero])) or "")
    assert "score" in (check(*answer(1, [(10, 20, 30, 40, 0.0, 3), zero])) or "")
    assert "not readable" in (check(b"{}", "2") or "")
