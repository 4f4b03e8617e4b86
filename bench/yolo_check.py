"""Every answer is its own image's: distinct images through a served YOLOv8n, each answer against its own reference.

Shared by the CPU test (``tests/test_yolov8n_triton.py``: real Triton, KIND_CPU) and the H200 check
(``bench/gpu_accuracy.py``) and ``bench.gpu``'s load (distinct images per request):

* ``weights_file``: the test detector's weights (``serving/models/yolov8n_synthetic.py``) as a state_dict file,
  shipped beside ``model.py`` as ``weights.pt``; ``repository``: the model repository's files for YOLOv8n specs
  with those weights; ``h200_on_cpu``: a spec with the H200 preset's batching on KIND_CPU instances;
* ``references``: each image's eager batch-1 answer of a weights file (raw and NMS sets), the reference loop;
* ``send_all``: each image once, over HTTP with binary tensors, ``concurrency`` requests in flight (one keep-alive
  connection per worker); answers by image index;
* ``raw_report``: served ``output0`` vs the references: per image the maximum difference to its own reference
  (box rows in pixels, score rows) and the minimum, over all other images, of the maximum difference to another
  image's reference: a request answered with another's rows, a stale padded row or a wrong normalisation shows;
* ``detection_report``: NMS detections compared as sets (matched by class and IoU: near-threshold score ties
  reorder rows, so row-by-row comparison would be wrong); a detection left unmatched counts as near-threshold
  only when its score is within ``margin`` of ``conf``;
* ``agreement``: served detections against ``YOLO(...).predict``'s (class + IoU ≥ 0.5, greedy one to one):
  (matched, served, reference), shared by ``tests/test_yolov8n_ultralytics.py`` and ``bench/frames_agreement.py``;
* the batch sizes Triton formed between two ``/v2/models/<m>/stats`` readings: ``bench.servers.batch_sizes``.
"""

from __future__ import annotations

import http.client
import io
import json
import threading
import urllib.parse
from typing import Any, Optional, Sequence

import numpy as np

from gate.loadgate import binary_request

WEIGHTS_FILE = "weights.pt"
_NP = {"FP32": np.float32, "FP16": np.float16, "INT32": np.int32, "UINT8": np.uint8}


def weights_file(seed: int = 0) -> bytes:
    """The test detector's state_dict (FP32, this project's keys) as ``torch.save`` bytes."""
    import torch

    from serving.models.yolov8n_synthetic import make_test_weights

    buf = io.BytesIO()
    torch.save(make_test_weights(seed).state_dict(), buf)
    return buf.getvalue()


def with_parameters(spec: Any, **params: str) -> Any:
    """``spec`` (a ``plans.triton_model.ModelSpec``) with more backend parameters."""
    return spec.model_copy(update={"parameters": {**spec.parameters, **params}})


def repository(specs: Sequence[Any], weights: bytes, gpu: bool) -> dict[str, bytes]:
    """The model repository's files: each spec's config, the fast path's code and ``weights`` as its weights file."""
    from plans.triton_repo import repository_files
    from serving.models import yolov8n_files

    code = {k: v for s in specs for k, v in yolov8n_files(s.name, s.version, weights, WEIGHTS_FILE).items()}
    return repository_files(list(specs), gpu_count=1 if gpu else 0, model_files=code)


def h200_on_cpu(name: str, output: str) -> Any:
    """A YOLOv8n spec with the H200 preset's instances, max batch, window and preferred sizes on KIND_CPU
    instances, one torch thread each: the GPU's batching checked on a machine without a GPU."""
    from plans.presets import preset_for
    from plans.triton_repo import yolov8n_torch

    p = preset_for("NVIDIA H200")
    spec = yolov8n_torch(
        name=name,
        output=output,
        gpu=False,
        weights=WEIGHTS_FILE,
        instances=p.instance_count,
        max_batch_size=p.max_batch_size,
        window_us=p.max_queue_delay_microseconds,
        preferred_batch_size=p.preferred_batch_size,
    )
    return with_parameters(spec, torch_threads="1")


def references(weights: bytes, images: np.ndarray, device: str = "cpu", dtype_name: str = "fp32", **nms: Any):
    """Each image's eager batch-1 answer of the weights file (fused; channels_last off the CPU; ``Preprocess`` from
    uint8 as the backend does): raw [N, 84, 8400] (torch, on ``device``) and NMS sets (numpy, counted rows only)."""
    import torch

    from serving.models import yolov8n as yolo
    from serving.models.yolov8n_weights import load_model

    dtype = torch.float16 if dtype_name == "fp16" else torch.float32
    model = yolo.fuse(load_model(weights)).to(device, dtype)
    if device != "cpu":
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    pre = yolo.Preprocess(dtype)
    with torch.no_grad():
        raw = torch.stack([model(pre(torch.from_numpy(images[i : i + 1]).to(device)))[0] for i in range(len(images))])
        det, count = yolo.fast_nms(raw, **nms)
    return raw, [det[i, : int(count[i, 0])].cpu().numpy() for i in range(len(images))]


def parse_response(body: bytes, header_length: Optional[str]) -> dict[str, np.ndarray]:
    """A v2 binary infer response → {output name: array}."""
    n = int(header_length) if header_length is not None else len(body)
    head = json.loads(body[:n])
    out, off = {}, n
    for o in head["outputs"]:
        size = int(o["parameters"]["binary_data_size"])
        out[o["name"]] = np.frombuffer(body[off : off + size], dtype=_NP[o["datatype"]]).reshape(o["shape"])
        off += size
    return out


def send_all(
    base_url: str, model: str, images: np.ndarray, outputs: Sequence[str], concurrency: int, timeout_s: float = 120
) -> list[dict[str, np.ndarray]]:
    """Each image of ``images`` (uint8 [N, 640, 640, 3]) once as its own request, ``concurrency`` in flight."""
    url = urllib.parse.urlsplit(base_url)
    path = f"/v2/models/{model}/infer"
    results: list[Optional[dict[str, np.ndarray]]] = [None] * len(images)
    errors: list[str] = []
    nxt = [0]
    lock = threading.Lock()

    def worker():
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout_s)
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(images):
                break
            body, headers = binary_request([("images", "UINT8", [1, *images[i].shape], images[i].tobytes())], outputs)
            try:
                conn.request("POST", path, body=body, headers=dict(headers))
                r = conn.getresponse()
                data = r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {data[:300]!r}")
                results[i] = parse_response(data, r.getheader("Inference-Header-Content-Length"))
            except Exception as e:  # noqa: BLE001 - reported with the image index
                with lock:
                    errors.append(f"image {i}: {e!r}")
                conn.close()
                conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout_s)
        conn.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[:3]}")
    return results  # type: ignore[return-value]


def raw_report(served, refs, conf: float = 0.25) -> dict:
    """``served`` and ``refs``: [N, 84, 8400] (torch tensors, any device, compared in FP32).

    Returns the maximum over images of the own-reference difference (box rows px, also only on anchors whose
    reference score passes ``conf``; score rows; mean absolute), the minimum over images of the smallest maximum
    (and mean) difference to any other image's reference with the pair that gave it, and how many images have
    their own reference as the nearest (by mean absolute difference).
    """
    import torch

    s, r = served.float(), refs.float()
    n = s.shape[0]
    own_box = own_score = own_box_conf = own_mean = 0.0
    min_other, at, min_other_mean, nearest_own = float("inf"), (-1, -1), float("inf"), 0
    for i in range(n):
        d = (s[i] - r[i]).abs()
        own_box = max(own_box, float(d[:4].max()))
        own_score = max(own_score, float(d[4:].max()))
        confident = r[i, 4:].amax(0) > conf  # anchors that can become detections
        if bool(confident.any()):
            own_box_conf = max(own_box_conf, float(d[:4, confident].max()))
        own_mean = max(own_mean, float(d.mean()))
        diff = (s[i].unsqueeze(0) - r).abs().flatten(1)  # [N, 84 * 8400]
        others, means = diff.amax(1), diff.mean(1)
        nearest_own += int(int(torch.argmin(means)) == i)
        others[i] = means[i] = float("inf")
        j = int(torch.argmin(others))
        if float(others[j]) < min_other:
            min_other, at = float(others[j]), (i, j)
        min_other_mean = min(min_other_mean, float(means.min()))
    return {
        "images": n,
        "own_max_box_px": own_box,
        "own_max_box_px_above_conf": own_box_conf,
        "own_max_score": own_score,
        "own_max": max(own_box, own_score),
        "own_max_mean_abs": own_mean,
        "other_min": min_other,
        "other_min_pair": list(at),
        "other_min_mean_abs": min_other_mean,
        "nearest_reference_is_own": nearest_own,
    }


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix of xyxy boxes a [n, 4], b [m, 4]."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(2)
    area = lambda x: np.clip(x[:, 2] - x[:, 0], 0, None) * np.clip(x[:, 3] - x[:, 1], 0, None)  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter + 1e-9)


def agreement(served: np.ndarray, ref: np.ndarray, min_iou: float = 0.5) -> tuple[int, int, int]:
    """(matched, served, reference) of two detection sets [n, 6] (x1 y1 x2 y2 score cls): greedy one to one, same
    class, IoU ≥ ``min_iou``, the served boxes best score first; the agreement is matched ÷ max(served, reference)
    (issue 39's metric against ``YOLO(...).predict``).

    >>> agreement(np.array([[0, 0, 10, 10, .9, 1]]), np.array([[1, 0, 10, 10, .8, 1]]))
    (1, 1, 1)
    """
    if not len(served) or not len(ref):
        return 0, len(served), len(ref)
    ious = _iou(served[:, :4], ref[:, :4]) * (served[:, None, 5] == ref[None, :, 5])
    used: set[int] = set()
    matched = 0
    for i in np.argsort(-served[:, 4]):
        j = next((int(j) for j in np.argsort(-ious[i]) if ious[i, j] >= min_iou and int(j) not in used), None)
        if j is not None:
            used.add(j)
            matched += 1
    return matched, len(served), len(ref)


def match_detections(got: np.ndarray, want: np.ndarray, iou: float = 0.5) -> tuple[list[tuple[int, int]], list, list]:
    """Greedy one-to-one matching by class and IoU (best IoU first) of detections [n, 6] (x1 y1 x2 y2 score cls).
    Returns (matched pairs (got row, want row), unmatched got rows, unmatched want rows)."""
    pairs = []
    if len(got) and len(want):
        m = _iou(got[:, :4], want[:, :4])
        m[got[:, 5][:, None] != want[:, 5][None, :]] = 0
        order = np.dstack(np.unravel_index(np.argsort(-m, axis=None), m.shape))[0]
        used_g, used_w = set(), set()
        for gi, wi in order:
            if m[gi, wi] < iou:
                break
            if gi in used_g or wi in used_w:
                continue
            used_g.add(int(gi))
            used_w.add(int(wi))
            pairs.append((int(gi), int(wi)))
    mg = {g for g, _ in pairs}
    mw = {w for _, w in pairs}
    return pairs, [i for i in range(len(got)) if i not in mg], [i for i in range(len(want)) if i not in mw]


def set_problem(got: np.ndarray, want: np.ndarray, conf: float) -> Optional[str]:
    """None when two detection sets ([n, 6] each) are one image's answer: matched one to one by class and IoU >= 0.5,
    at most max(3, 30 %) of the larger set left unmatched, not counting boxes whose score is within 0.05 of the
    confidence threshold (served FP16 and an eager FP16 reference round those differently); else what differs."""
    _, ug, uw = match_detections(got, want)
    loose = [got[i] for i in ug] + [want[i] for i in uw]
    unmatched = sum(1 for d in loose if abs(float(d[4]) - conf) > 0.05)
    allowed = max(3, int(0.3 * max(len(got), len(want))))
    if unmatched > allowed:
        return f"{unmatched} of {len(got)} detections (reference {len(want)}) unmatched by class and IoU >= 0.5"
    return None


def detection_report(
    got: list[np.ndarray], want: list[np.ndarray], conf: float = 0.25, margin: float = 0.02, iou: float = 0.5
) -> dict:
    """Per-image sets of detections (each [k, 6], only the counted rows) against the references'."""
    out: dict = {
        "images": len(got),
        "reference_detections": int(sum(len(w) for w in want)),
        "served_detections": int(sum(len(g) for g in got)),
        "matched": 0,
        "unmatched_near_threshold": 0,
        "unmatched": 0,
        "matched_max_box_px": 0.0,
        "matched_max_score": 0.0,
        "images_identical_sets": 0,
        "first_unmatched": "",
    }
    for k, (g, w) in enumerate(zip(got, want)):
        pairs, ug, uw = match_detections(g, w, iou)
        out["matched"] += len(pairs)
        if pairs:
            gi, wi = zip(*pairs)
            out["matched_max_box_px"] = max(
                out["matched_max_box_px"], float(np.abs(g[list(gi), :4] - w[list(wi), :4]).max())
            )
            out["matched_max_score"] = max(
                out["matched_max_score"], float(np.abs(g[list(gi), 4] - w[list(wi), 4]).max())
            )
        loose = [g[i] for i in ug] + [w[i] for i in uw]
        near = sum(1 for d in loose if abs(float(d[4]) - conf) <= margin)
        out["unmatched_near_threshold"] += near
        out["unmatched"] += len(loose) - near
        if len(loose) - near and not out["first_unmatched"]:
            out["first_unmatched"] = f"image {k}: served {len(g)}, reference {len(w)}, unmatched {len(loose) - near}"
        out["images_identical_sets"] += int(not loose)
    return out
