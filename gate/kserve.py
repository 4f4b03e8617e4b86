"""KServe v2 inference requests with the binary tensor extension, built from a model's own signature, and the check
that an answer really carries the model's outputs. Standard library only (it runs wherever the gate runs). The
codec itself (encode, decode, check) is ``gate.loadgate``'s; this module speaks in signatures.

A 640×640 FP32 image is 1.2 M numbers: as JSON that is ~6 MB of text per request, which alone blows an 8 ms p95.
With the binary extension the body is a small JSON header followed by the raw tensor bytes (4.9 MB for that image,
no parsing on either side); ``Inference-Header-Content-Length`` says where the JSON ends.

Usage::

    sig = {"inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 3, 640, 640]}],
           "outputs": [{"name": "output0", "datatype": "FP32", "shape": [1, 84, 8400]}]}
    body, headers = signature_request(sig)
    status, resp_headers, data = post(...)
    problems = answer_problems(sig, resp_headers, data)     # [] when every output is there, right shape and size
"""

from __future__ import annotations

import math
import struct
from typing import Mapping

from gate import loadgate

# What a STRING input carries in the gate's requests (a short prompt: the SDXL pipeline's `prompt`).
DEFAULT_TEXT = "a lighthouse on a rocky coast at dawn"


def _tensor_bytes(datatype: str, shape: list[int], text: str) -> bytes:
    n = math.prod(int(d) for d in shape)
    if datatype == "BYTES":
        one = text.encode()
        return (struct.pack("<I", len(one)) + one) * n
    size = loadgate.DTYPE_BYTES[datatype]
    if datatype in ("FP32",):
        return struct.pack("<f", 0.5) * n
    if datatype in ("FP16",):
        return b"\x00\x38" * n  # 0.5 in IEEE half precision, little endian
    if datatype in ("FP64",):
        return struct.pack("<d", 0.5) * n
    # integers and BOOL: ones (a seed of 1, one step, true)
    return (1).to_bytes(size, "little") * n


def signature_request(sig: dict, *, text: str = DEFAULT_TEXT, frame: bytes = b"") -> tuple[bytes, dict[str, str]]:
    """(body, headers) of an infer request for every input of ``sig`` with binary data, asking for every output
    in binary too (the encoding is ``gate.loadgate.binary_request``'s). An input whose ``content`` is ``jpeg``
    carries ``frame`` (one encoded frame: UINT8 [1, bytes])."""
    tensors = [
        (t["name"], t["datatype"], [1, len(frame)], frame)
        if t.get("content") == "jpeg"
        else (
            t["name"],
            t["datatype"],
            [int(d) for d in t["shape"]],
            _tensor_bytes(t["datatype"], list(t["shape"]), text),
        )
        for t in sig["inputs"]
    ]
    body, headers = loadgate.binary_request(tensors, [o["name"] for o in sig.get("outputs", [])])
    return body, dict(headers)


def answer_problems(sig: dict, headers: Mapping[str, str], data: bytes) -> list[str]:
    """Why an answer does not carry the outputs of ``sig`` (names, datatypes, shapes, sizes, not empty), as
    ``gate.loadgate.check_response`` judges every answer of a load run; [] when it does."""
    lower = {k.lower(): v for k, v in headers.items()}
    problem = loadgate.check_response(
        data, lower.get(loadgate.HEADER_LENGTH.lower()), loadgate.ResponseCheck.from_signature(sig)
    )
    return [problem] if problem else []


def signature(inputs: list[dict], outputs: list[dict], max_batch_size: int, batch: int = 1) -> dict:
    """The request signature of one model from its config's tensors (``{"name", "data_type", "dims"}``): the
    batch dimension prepended when the model batches, variable dims (-1) given 1 in inputs, optional inputs left
    out."""
    pre = [batch] if max_batch_size > 0 else []

    def wire(dt: str) -> str:
        return "BYTES" if dt == "STRING" else dt

    return {
        "inputs": [
            {"name": t["name"], "datatype": wire(t["data_type"]), "shape": pre + [d if d > 0 else 1 for d in t["dims"]]}
            for t in inputs
            if not t.get("optional")
        ],
        "outputs": [
            {"name": t["name"], "datatype": wire(t["data_type"]), "shape": pre + list(t["dims"])} for t in outputs
        ],
    }


def takes_frames(sig: dict) -> bool:
    """Whether a model of this signature takes encoded JPEG frames (``yolov8n_torch`` with ``input: jpeg``)."""
    return any(t.get("content") == "jpeg" for t in sig.get("inputs", []))


def frame_payloads(sig: dict) -> list[loadgate.Payload]:
    """The requests a gate sends a model that takes frames: one structured synthetic JPEG frame of each size
    cameras send (``gate.sample_frames.GATE_SIZES``) and a phone's portrait frame (stored landscape, EXIF
    orientation 6), each answer checked for boxes inside its own upright frame (the size the client sees, not the
    stored grid: a server that ignores the orientation answers boxes outside it)."""
    from gate import sample_frames

    out = []
    for w, h, data in sample_frames.gate_frames():
        body, headers = signature_request(sig, frame=data)
        out.append(loadgate.Payload(body, tuple(headers.items()), expect=BoxesInFrame(w, h)))
    return out


class BoxesInFrame:
    """An answer's ``detections`` [1, max_det, 6] and ``num_detections`` [1, 1] are boxes of a w×h frame: the count
    within max_det, each counted box inside the frame (0 ≤ x1 ≤ x2 ≤ w, 0 ≤ y1 ≤ y2 ≤ h) with a score in (0, 1]
    and a whole class number, the rows past the count zero. Called as ``expect(body, header_length)``."""

    def __init__(self, width: int, height: int):
        self.width, self.height = width, height

    def __call__(self, body: bytes, header_length) -> str | None:
        try:
            blobs = loadgate.binary_outputs(body, header_length)
            count_raw, det_raw = blobs["num_detections"], blobs["detections"]
        except (KeyError, TypeError, ValueError) as e:
            return f"detections not readable from the answer: {type(e).__name__}: {e}"
        count = struct.unpack("<i", count_raw[:4])[0]
        rows = [struct.unpack_from("<6f", det_raw, 24 * i) for i in range(len(det_raw) // 24)]
        if not 0 <= count <= len(rows):
            return f"num_detections {count} is not within 0..{len(rows)}"
        for i, (x1, y1, x2, y2, score, cls) in enumerate(rows):
            if i >= count:
                if any((x1, y1, x2, y2, score, cls)):
                    return f"detection row {i} past the count {count} is not zero"
                continue
            if not (0 <= x1 <= x2 <= self.width and 0 <= y1 <= y2 <= self.height):
                return f"box {i} ({x1:.1f}, {y1:.1f}, {x2:.1f}, {y2:.1f}) is not inside the {self.width}x{self.height} frame"
            if not (0 < score <= 1 and cls == int(cls) and cls >= 0):
                return f"box {i}: score {score} or class {cls} is not a detection's"
        return None
