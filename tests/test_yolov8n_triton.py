"""Every answer is its own image's: the YOLOv8n fast path (``serving/yolov8n_model.py``) in a real Triton (pytriton
wheel, python backend, KIND_CPU, FP32) with the test detector's weights shipped as its weights file, dynamic
batching on and the H200 preset's instances, max batch and window.

64 distinct structured images at concurrency 8; each answer is compared with that image's own eager reference
(the same weights file loaded by ``yolov8n_weights``, fused, batch 1) and shown to differ from every other image's
reference; the NMS detections are compared as sets (class + IoU); the batch sizes Triton formed are read from its
statistics. The figures go to the run's "measured" summary.
"""

import io
import json
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
import torch

from bench.servers import batch_sizes, get_json, model_stats, write_repository
from bench.yolo_check import (
    WEIGHTS_FILE,
    detection_report,
    h200_on_cpu,
    raw_report,
    send_all,
    weights_file,
    with_parameters,
)
from bench.yolo_check import (
    references as eager_references,
)
from plans.presets import preset_for
from plans.triton_repo import repository_files
from serving.models import yolov8n_files
from serving.models.yolov8n_synthetic import synthetic_images
from testbed.servers.triton import start_triton, triton_available

N, CONCURRENCY = 64, 8
PRESET = preset_for("NVIDIA H200")
NMS: dict[str, Any] = dict(max_det=100, candidates=256, conf=0.25, iou=0.45)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    assert triton_available(), "tritonserver from the nvidia-pytriton wheel is needed (requirements.txt)"
    weights = weights_file()
    specs = [h200_on_cpu("yolov8n_raw", "raw"), h200_on_cpu("yolov8n_nms", "nms")]
    code = {k: v for s in specs for k, v in yolov8n_files(s.name, s.version, weights, WEIGHTS_FILE).items()}
    # Two models the backend must refuse at load (loaded on demand below): no weights, weights of another layout.
    bad = h200_on_cpu("yolov8n_bad", "nms")
    none = with_parameters(bad.model_copy(update={"name": "yolov8n_none"}), weights="")
    state = torch.load(io.BytesIO(weights), weights_only=True)
    state["detect.cv3.1.2.weight"] = state["detect.cv3.1.2.weight"][:, :64].contiguous()
    buf = io.BytesIO()
    torch.save(state, buf)
    code.update(yolov8n_files("yolov8n_bad", 1, buf.getvalue(), WEIGHTS_FILE))
    code.update(yolov8n_files("yolov8n_none", 1))
    base = tmp_path_factory.mktemp("yolo-triton")
    write_repository(base / "models", repository_files([*specs, bad, none], gpu_count=0, model_files=code))
    explicit = ["--model-control-mode=explicit", "--load-model=yolov8n_raw", "--load-model=yolov8n_nms"]
    with start_triton(base / "models", workdir=base / "work", ready_timeout=300, extra_args=explicit) as triton:
        yield triton, weights


def _formed_after(url: str, model: str, before: dict, inferences: int, timeout: float = 30.0) -> dict:
    """The batches Triton formed since `before` (``bench.servers.batch_sizes``), once all `inferences` are recorded.

    Triton records an execution's statistics (its inference count and batch size) after the execution's responses
    went out, so a reading taken right after the last answer may miss the last batches: they are waited for."""
    deadline = time.monotonic() + timeout
    while True:
        formed = batch_sizes(before, model_stats(url, model))
        rows = sum(size * count for size, count in formed["sizes"].items())
        if formed["inferences"] >= inferences and rows >= inferences:
            return formed
        if time.monotonic() > deadline:
            raise AssertionError(f"{inferences} inferences not all recorded by Triton within {timeout} s: {formed}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def references(served):
    """Eager FP32 batch-1 answers of the same weights file, per image: raw [N, 84, 8400] and NMS sets."""
    images = synthetic_images(N, seed=1)
    raw, sets = eager_references(served[1], images, **NMS)
    return images, raw, sets


def test_every_raw_answer_is_its_own_images(served, references, measured):
    triton, _ = served
    images, ref, _ = references
    before = model_stats(triton.http_url, "yolov8n_raw")
    answers = send_all(triton.http_url, "yolov8n_raw", images, ["output0"], CONCURRENCY)
    formed = _formed_after(triton.http_url, "yolov8n_raw", before, N)
    got = torch.from_numpy(np.stack([a["output0"][0] for a in answers]))
    r = raw_report(got, ref)
    measured(
        f"Triton CPU raw output0, N={N} distinct images, concurrency {CONCURRENCY}, "
        f"{PRESET.instance_count} instances, max batch {PRESET.max_batch_size}, window "
        f"{PRESET.max_queue_delay_microseconds} us: batch sizes formed {formed['sizes']} "
        f"({formed['executions']} executions, {formed['inferences']} inferences); max diff to own reference "
        f"{r['own_max_box_px']:.2e} px (boxes), {r['own_max_score']:.2e} (scores); min diff to another image's "
        f"reference {r['other_min']:.2f} (images {r['other_min_pair']})"
    )
    # Dynamic batching is on with the preset's numbers, every request was one inference, in executions of the model's
    # sizes. Which batches formed depends on how the 8 clients' requests met the 3 instances (on a busy machine they
    # may all arrive one at a time): measured above, not asserted.
    cfg = get_json(f"{triton.http_url}/v2/models/yolov8n_raw/config")
    assert cfg["max_batch_size"] == PRESET.max_batch_size
    assert sum(int(g["count"]) for g in cfg["instance_group"]) == PRESET.instance_count
    assert int(cfg["dynamic_batching"]["max_queue_delay_microseconds"]) == PRESET.max_queue_delay_microseconds
    assert formed["inferences"] == N == sum(size * count for size, count in formed["sizes"].items())
    assert set(formed["sizes"]) <= set(range(1, PRESET.max_batch_size + 1))
    assert r["own_max_box_px"] <= 0.05 and r["own_max_score"] <= 1e-4
    assert r["other_min"] > 100 * r["own_max"] and r["other_min"] > 1.0


def test_every_detection_set_is_its_own_images(served, references, measured):
    triton, _ = served
    images, _, ref_sets = references
    before = model_stats(triton.http_url, "yolov8n_nms")
    answers = send_all(triton.http_url, "yolov8n_nms", images, ["detections", "num_detections"], CONCURRENCY)
    formed = _formed_after(triton.http_url, "yolov8n_nms", before, N)
    got = [a["detections"][0, : int(a["num_detections"][0, 0])] for a in answers]
    for a in answers:  # rows past the count are zero
        assert not a["detections"][0, int(a["num_detections"][0, 0]) :].any()
    r = detection_report(got, ref_sets, conf=NMS["conf"])
    shuffled = detection_report(got, ref_sets[1:] + ref_sets[:1], conf=NMS["conf"])
    measured(
        f"Triton CPU NMS detections, N={N}, concurrency {CONCURRENCY}: batch sizes {formed['sizes']}; "
        f"{r['served_detections']} served vs {r['reference_detections']} reference detections, {r['matched']} "
        f"matched (class + IoU>=0.5; max box diff {r['matched_max_box_px']:.2e} px, score "
        f"{r['matched_max_score']:.2e}), {r['unmatched_near_threshold']} unmatched within 0.02 of conf, "
        f"{r['unmatched']} other unmatched; {r['images_identical_sets']}/{N} images with identical sets; against "
        f"the next image's reference: {shuffled['matched']} matched, {shuffled['unmatched']} unmatched"
    )
    assert r["unmatched"] == 0, r["first_unmatched"]
    assert r["reference_detections"] >= 10 * N  # tens of detections per image on average: a real test
    assert r["matched_max_box_px"] <= 0.05
    assert shuffled["unmatched"] > r["reference_detections"] // 2  # another image's set does not pass


def test_the_backend_refuses_a_model_without_weights_or_with_weights_of_another_layout(served, measured):
    """What a url artifact gets (its layout cannot be checked before it lands): Triton's load fails with the
    loader's message, and the model is not served."""
    triton, _ = served
    msgs = {}
    for name in ("yolov8n_none", "yolov8n_bad"):
        req = urllib.request.Request(f"{triton.http_url}/v2/repository/models/{name}/load", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=120)
        msgs[name] = json.loads(e.value.read())["error"]
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{triton.http_url}/v2/models/{name}/ready", timeout=5)
    assert urllib.request.urlopen(f"{triton.http_url}/v2/models/yolov8n_nms/ready", timeout=5).status == 200
    measured("refused at load: " + " | ".join(m.split("\n")[0] for m in msgs.values()))
    assert "no weights: a stack may not serve random weights; give the model an artifact" in msgs["yolov8n_none"]
    assert (
        "key model.22.cv3.1.2.weight (detect.cv3.1.2.weight): expected shape [80, 80, 1, 1], found [80, 64, 1, 1]"
        in msgs["yolov8n_bad"]
    )
