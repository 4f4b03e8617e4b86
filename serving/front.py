"""The queue's HTTP entry (seed 001: API gateway → Redis Stream): KServe v2 JSON in, the job's result out.

``POST /v2/models/<model>/infer`` with a KServe v2 JSON body queues one job and waits for its result:

  * 200: ``outputs`` as KServe v2 JSON, and where it ran and how long it took, in ``parameters`` and in the
    headers ``X-Gpuhost-Backend`` and ``X-Gpuhost-Latency-Ms`` (submit to result, queueing included);
  * 429 with ``Retry-After``: the queue is full (``max_depth`` jobs waiting or running); nothing was queued;
  * 503 with ``Retry-After``: shedding (the queue's ``shed_wait_ms``): a new job would wait longer than that for a
    worker, so it is refused now rather than answered after its latency goal; nothing was queued;
  * 504: no result within ``--timeout`` (the job stays queued; resubmitting the same request with the same ``id``
    does not queue it twice, and gets its result: every request of one job key in flight, or arriving within the
    queue's ``read_ttl_s`` after the result was first read, is answered with it);
  * 502: the job failed on every backend (the message says why);
  * 400: a body that is not a v2 request, or a value the model's datatype cannot hold (out of range, NaN/inf,
    a string for BOOL, an array deeper than the shape): the message names the input; nothing is coerced;
  * 404 an unknown path or model; 411/413/408/503: no or a bad ``Content-Length``, a body over the model's size,
    a client too slow to send its request, too many connections. Every refusal is an answer, never a silent close.

BYTES inputs (a prompt) are JSON strings: valid UTF-8, no NUL, at most the input's ``max_bytes`` (default 1024)
UTF-8 bytes each, else 400 naming the input. Inside they travel as UINT8 rows (``serving/bytes_rows.py``), and an
output the model's config names BYTES (an image's PNG) comes back as BYTES: a JSON string where it is UTF-8 text,
else base64 with ``parameters.content_encoding`` = ``base64``, or raw in KServe's binary tensor extension when the
request asks (``parameters.binary_data_output``, or an output's ``parameters.binary_data``, as tritonclient's HTTP
client does: the JSON head, then the bytes, ``Inference-Header-Content-Length`` between them).

It is a server on a network, so it bounds everything: the body (from the model's input sizes, read exactly
``Content-Length`` bytes, never to EOF), the time a client may take to send its headers and its body (slow clients
do not hold threads), and the number of connections.

Results belong to the caller who asked: the job key is a digest of the client's address, the model, the request's
``id`` (or ``Idempotency-Key``) and the request's inputs, so two clients that use the same id get their own
answers, and a reused id with a different request is a different job. ``GET /v2/health/ready`` is 200 while Redis
answers.

Run::

    python -m serving.front --config /etc/gpuhost/gateway/worker.json --listen 127.0.0.1 --port 8090

The config's ``front`` section (written by ``plans.gateway``) holds each model's inputs (name, datatype, dims,
-1 variable; ``max_bytes`` for BYTES), max batch size and outputs (name, datatype: BYTES ones are turned back from
rows); without it the request's own datatypes are checked and ``max_body_bytes`` caps.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import http.server
import io
import json
import logging
import math
import re
import socket
import sys
import threading
import time
import uuid
from typing import Any, Optional

import numpy as np
import redis

from serving.bytes_rows import from_rows
from serving.queue import JobQueue, QueueConfig, QueueFull, QueueShed, ResultTimeout

log = logging.getLogger("gpuhost.front")

DTYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
_NAMES = {np.dtype(v).str: k for k, v in DTYPES.items()}
# A version in the URL is matched so that it can be refused by name: jobs run the backends' served version, so
# answering `/versions/987654321/infer` from another version would be a silent substitution.
_PATH = re.compile(r"/v2/models/([A-Za-z0-9_.-]{1,64})(/versions/[0-9]{1,19})?/infer")
# JSON text one element can take at most ("-1.2345678901234567e-308, "), for the body cap from input sizes.
JSON_BYTES_PER_ELEMENT = 32
JSON_OVERHEAD = 64 * 1024
# A BYTES input's bound on each value (UTF-8 bytes) where the model's signature gives none: a prompt's size.
MAX_BYTES = 1024
# JSON text one byte of a BYTES value can take at most (a control character escaped as "\u001f").
JSON_PER_BYTE = 6


class BadRequest(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class InputSig:
    name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension; -1 is variable
    max_bytes: int = MAX_BYTES  # BYTES: the most UTF-8 bytes one value may hold

    def json_bytes_per_element(self) -> int:
        return self.max_bytes * JSON_PER_BYTE + 8 if self.datatype == "BYTES" else JSON_BYTES_PER_ELEMENT


@dataclasses.dataclass(frozen=True)
class ModelSig:
    """What the front accepts for one model: its inputs and max batch size (0: no batch dimension), and the outputs
    it answers as BYTES (``outputs``: names; carried inside as UINT8 rows, ``serving/bytes_rows.py``)."""

    inputs: tuple[InputSig, ...]
    max_batch_size: int = 0
    bytes_outputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()  # every output's name, where the config lists them (requested ones are checked)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSig":
        return cls(
            tuple(
                InputSig(
                    str(i["name"]),
                    str(i["datatype"]),
                    tuple(int(x) for x in i["dims"]),
                    int(i.get("max_bytes", MAX_BYTES)),
                )
                for i in d["inputs"]
            ),
            int(d.get("max_batch_size", 0)),
            tuple(str(o["name"]) for o in d.get("outputs", ()) if o.get("datatype") == "BYTES"),
            tuple(str(o["name"]) for o in d.get("outputs", ())),
        )

    def max_elements(self) -> Optional[int]:
        """Elements of the largest request; None when a dimension is variable."""
        if any(d < 0 for i in self.inputs for d in i.dims):
            return None
        batch = max(1, self.max_batch_size)
        return sum(batch * math.prod(i.dims) for i in self.inputs)

    def body_cap(self, fallback: int) -> int:
        if self.max_elements() is None:
            return fallback
        batch = max(1, self.max_batch_size)
        text = sum(batch * math.prod(i.dims) * i.json_bytes_per_element() for i in self.inputs)
        return min(fallback, text + JSON_OVERHEAD)


def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _flat(name: str, data: Any, shape: list[int]) -> list:
    """The values of ``data`` in row-major order: a flat list of prod(shape) scalars, or nested exactly as
    ``shape``. Never deeper than the shape (a nested-array bomb is refused at the first extra level)."""
    count = math.prod(shape)
    if not isinstance(data, list):
        raise BadRequest(f"input {name!r}: data is a {type(data).__name__}, not a list")
    if all(not isinstance(v, list) for v in data):
        if len(data) != count:
            raise BadRequest(f"input {name!r}: {len(data)} values but shape {shape} holds {count}")
        return data
    level: list = [data]
    for depth, size in enumerate(shape):
        nxt: list = []
        for item in level:
            if not isinstance(item, list) or len(item) != size:
                raise BadRequest(f"input {name!r}: data nested unlike shape {shape} at depth {depth}")
            nxt.extend(item)
        level = nxt
    if any(isinstance(v, (list, dict)) for v in level):
        raise BadRequest(f"input {name!r}: data nested deeper than shape {shape}")
    return level


def _array(name: str, datatype: str, values: list, shape: list[int]) -> np.ndarray:
    """``values`` as ``datatype``, each checked: a value the type cannot hold is refused, never wrapped or coerced."""
    kinds = set(map(type, values))
    if datatype == "BOOL":
        if kinds - {bool}:
            raise BadRequest(f"input {name!r}: BOOL takes true/false only, got {_first(values, bool)!r}")
        return np.asarray(values, dtype=np.bool_).reshape(shape)
    dtype: Any = np.dtype(DTYPES[datatype])
    if dtype.kind in "iu":
        if kinds - {int}:
            raise BadRequest(f"input {name!r}: {datatype} takes integers only, got {_first(values, int)!r}")
        info = np.iinfo(dtype)
        if values and (min(values) < info.min or max(values) > info.max):
            bad = next(v for v in values if not info.min <= v <= info.max)
            raise BadRequest(f"input {name!r}: {bad} is out of range for {datatype} ({info.min}..{info.max})")
        return np.asarray(values, dtype=dtype).reshape(shape)
    if kinds - {int, float}:
        raise BadRequest(f"input {name!r}: {datatype} takes numbers only, got {_first(values, (int, float))!r}")
    try:
        wide = np.asarray(values, dtype=np.float64)
    except OverflowError:
        raise BadRequest(f"input {name!r}: a value overflows {datatype}") from None
    if not np.isfinite(wide).all():
        bad = wide[~np.isfinite(wide)][0]
        raise BadRequest(f"input {name!r}: {bad} is not a finite number ({datatype} inputs take finite values only)")
    limit = float(np.finfo(dtype).max)
    if wide.size and float(np.abs(wide).max()) > limit:
        bad = wide[np.abs(wide) > limit][0]
        raise BadRequest(f"input {name!r}: {bad:g} overflows {datatype} (largest {limit:g})")
    return wide.astype(dtype).reshape(shape)


def _first(values: list, ok) -> Any:
    return next(v for v in values if not (isinstance(v, ok) and (ok is bool or not isinstance(v, bool))))


def _bytes_array(name: str, values: list, shape: list[int], max_bytes: int) -> np.ndarray:
    """BYTES values (JSON strings) as a NumPy ``S`` array (the queue's form of BYTES, ``serving/bytes_rows.py``),
    each checked: a string, valid UTF-8, at most ``max_bytes`` bytes, no NUL (rows are zero-padded inside)."""
    out = []
    for v in values:
        if not isinstance(v, str):
            raise BadRequest(f"input {name!r}: BYTES takes strings only, got {str(v)[:40]!r} ({type(v).__name__})")
        try:
            b = v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise BadRequest(
                f"input {name!r}: not valid UTF-8 (a lone surrogate U+{ord(v[e.start]):04X} at character {e.start})"
            ) from None
        if len(b) > max_bytes:
            raise BadRequest(f"input {name!r}: {len(b)} bytes, over the {max_bytes}-byte bound")
        if b"\0" in b:
            raise BadRequest(f"input {name!r}: a NUL character (U+0000) at byte {b.index(0)}; not allowed")
        out.append(b)
    return np.array(out, dtype=f"S{max([1, *map(len, out)])}").reshape(shape)


def _load(body: bytes) -> dict:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"not a KServe v2 JSON infer request: {type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise BadRequest("not a KServe v2 JSON infer request: an object with an inputs list")
    return doc


def parse_request(
    body: bytes, sig: Optional[ModelSig] = None, *, max_elements: int = 1 << 26
) -> tuple[Optional[str], dict[str, np.ndarray]]:
    """(request id, inputs) of a KServe v2 JSON infer request, every value checked against the model's datatypes
    (``sig``; the request's own datatypes without one). BadRequest names the input and why."""
    return parse_doc(_load(body), sig, max_elements=max_elements)


def parse_doc(
    doc: dict, sig: Optional[ModelSig] = None, *, max_elements: int = 1 << 26
) -> tuple[Optional[str], dict[str, np.ndarray]]:
    """``parse_request`` on the request's parsed JSON."""
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise BadRequest("not a KServe v2 JSON infer request: an object with an inputs list")
    want = {i.name: i for i in sig.inputs} if sig else None
    inputs: dict[str, np.ndarray] = {}
    total = 0
    for k, i in enumerate(doc["inputs"]):
        if not isinstance(i, dict) or not isinstance(i.get("name"), str):
            raise BadRequest(f"inputs[{k}]: an object with a string name")
        name, datatype, raw = i["name"], i.get("datatype"), i.get("shape")
        if name in inputs:
            raise BadRequest(f"input {name!r}: given twice")
        if datatype not in DTYPES and datatype != "BYTES":
            raise BadRequest(f"input {name!r}: datatype {str(datatype)[:40]!r} not supported")
        shape = [_int(d) for d in raw] if isinstance(raw, list) and len(raw) <= 16 else None
        if shape is None or any(d is None or d < 0 for d in shape):
            raise BadRequest(f"input {name!r}: shape {str(raw)[:80]} is not a list of sizes")
        dims = [d for d in shape if d is not None]
        total += math.prod(dims)
        if total > max_elements:
            raise BadRequest(f"input {name!r}: shape {dims} is more than the {max_elements} elements allowed")
        if want is not None:
            exp = want.get(name)
            if exp is None:
                raise BadRequest(f"input {name!r}: the model has no such input (inputs: {', '.join(want)})")
            if datatype != exp.datatype:
                raise BadRequest(f"input {name!r}: datatype {datatype} but the model takes {exp.datatype}")
            _check_shape(name, dims, exp, sig.max_batch_size if sig else 0)
        values = _flat(name, i.get("data"), dims)
        if datatype == "BYTES":
            inputs[name] = _bytes_array(name, values, dims, want[name].max_bytes if want is not None else MAX_BYTES)
        else:
            inputs[name] = _array(name, datatype, values, dims)
    if not inputs:
        raise BadRequest("no inputs")
    if want is not None and set(want) - set(inputs):
        raise BadRequest(f"inputs {sorted(set(want) - set(inputs))} missing")
    rid = doc.get("id")
    if rid is not None and (not isinstance(rid, (str, int)) or isinstance(rid, bool)):
        raise BadRequest("id: a string")
    return (str(rid)[:256] if rid not in (None, "") else None), inputs


def _check_shape(name: str, shape: list[int], exp: InputSig, max_batch: int) -> None:
    dims = list(exp.dims)
    if max_batch > 0:
        if not shape or not 1 <= shape[0] <= max_batch:
            raise BadRequest(f"input {name!r}: shape {shape}: the batch (first) dimension must be 1..{max_batch}")
        shape = shape[1:]
    if len(shape) != len(dims) or any(w >= 0 and w != g for w, g in zip(dims, shape)):
        raise BadRequest(f"input {name!r}: shape {shape} but the model takes {dims} (-1: any size)")


def outputs_json(outputs: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    return [
        {"name": n, "datatype": _NAMES.get(a.dtype.str, "BYTES"), "shape": list(a.shape), "data": a.ravel().tolist()}
        for n, a in outputs.items()
    ]


@dataclasses.dataclass(frozen=True)
class Wanted:
    """Which outputs a request asks for (None: all) and which of them in binary (KServe's binary tensor extension:
    the request's ``parameters.binary_data_output`` or an output's ``parameters.binary_data``)."""

    names: Optional[tuple[str, ...]] = None
    binary: frozenset[str] = frozenset()
    all_binary: bool = False

    def is_binary(self, name: str) -> bool:
        return self.all_binary or name in self.binary


def wanted_outputs(doc: dict, sig: Optional[ModelSig]) -> Wanted:
    """The request's ``outputs`` and binary choices; BadRequest for a malformed list or, where the model's outputs
    are known, a name it does not answer."""
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("parameters: an object")
    all_binary = params.get("binary_data_output") is True
    asked = doc.get("outputs")
    if asked is None:
        return Wanted(all_binary=all_binary)
    if not isinstance(asked, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in asked):
        raise BadRequest("outputs: a list of objects with a string name")
    names = tuple(o["name"] for o in asked)
    known = sig.outputs if sig else ()
    for n in names:
        if known and n not in known:
            raise BadRequest(f"output {n[:64]!r}: the model has no such output (outputs: {', '.join(known)})")
    binary = frozenset(
        o["name"] for o in asked if isinstance(o.get("parameters"), dict) and o["parameters"].get("binary_data") is True
    )
    return Wanted(names, binary, all_binary)


def answer_outputs(
    outputs: dict[str, np.ndarray], sig: Optional[ModelSig], wanted: Wanted
) -> tuple[list[dict[str, Any]], list[bytes]]:
    """The answer's outputs (KServe v2 JSON) and the binary parts after the JSON, in order. An output the model's
    signature names BYTES comes out of its UINT8 rows (``serving/bytes_rows.py``) as one value a row, [n, 1]: in
    binary, KServe's BYTES layout (a 4-byte little-endian length before each value); in JSON, a string where the
    value is UTF-8 text, else base64 with ``parameters.content_encoding`` = ``base64`` (a PNG is not text)."""
    docs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, a in outputs.items():
        if wanted.names is not None and name not in wanted.names:
            continue
        if sig is not None and name in sig.bytes_outputs:
            values = from_rows(a)
            head: dict[str, Any] = {"name": name, "datatype": "BYTES", "shape": [len(values), 1]}
            if wanted.is_binary(name):
                blob = b"".join(len(v).to_bytes(4, "little") + v for v in values)
                head["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                try:
                    head["data"] = [v.decode("utf-8") for v in values]
                except UnicodeDecodeError:
                    head["data"] = [base64.b64encode(v).decode() for v in values]
                    head["parameters"] = {"content_encoding": "base64"}
            docs.append(head)
        elif wanted.is_binary(name) and a.dtype.str in _NAMES:
            blob = np.ascontiguousarray(a).tobytes()
            docs.append(
                {
                    "name": name,
                    "datatype": _NAMES[a.dtype.str],
                    "shape": list(a.shape),
                    "parameters": {"binary_data_size": len(blob)},
                }
            )
            blobs.append(blob)
        else:
            docs += outputs_json({name: a})
    return docs, blobs


@dataclasses.dataclass(frozen=True)
class Binary:
    """An answer with binary parts: the JSON head, then the parts (``Inference-Header-Content-Length`` says where the
    JSON ends)."""

    head: dict[str, Any]
    parts: tuple[bytes, ...]

    def body(self) -> tuple[bytes, dict[str, str]]:
        h = json.dumps(self.head).encode()
        return h + b"".join(self.parts), {"Inference-Header-Content-Length": str(len(h))}


def job_key(caller: str, model: str, rid: Optional[str], inputs: dict[str, np.ndarray]) -> str:
    """The queue key of a request: the caller's own id scoped by who asked, for which model, with which inputs."""
    h = hashlib.sha256()
    for part in (caller, model, rid or ""):
        h.update(part.encode() + b"\0")
    for n in sorted(inputs):
        a = np.ascontiguousarray(inputs[n])
        h.update(f"{n}\0{a.dtype.str}\0{list(a.shape)}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:40]


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one client may cost the front."""

    max_body_bytes: int = 64 * 1024 * 1024  # without a model signature, or for variable dims
    header_timeout_s: float = 10.0  # request line and headers, from the first byte read (and idle keep-alive)
    body_timeout_s: float = 30.0  # the whole body
    max_connections: int = 64
    max_header_bytes: int = 64 * 1024


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes that must all arrive before ``deadline`` (monotonic): each read waits only what is left, so a
    client trickling one byte at a time cannot hold a thread past it."""

    def __init__(self, sock: socket.socket):
        self.sock, self.deadline, self.received = sock, math.inf, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.sock.settimeout(min(left, 3600.0))
        n = self.sock.recv_into(b)
        self.received += n
        return n


class Front:
    def __init__(
        self,
        queue: JobQueue,
        *,
        timeout_s: float = 30.0,
        models: Optional[dict[str, ModelSig]] = None,
        limits: Limits = Limits(),
    ):
        self.queue, self.timeout_s, self.models, self.limits = queue, timeout_s, models, limits

    def body_cap(self, model: str) -> int:
        sig = (self.models or {}).get(model)
        return sig.body_cap(self.limits.max_body_bytes) if sig else self.limits.max_body_bytes

    def handle(
        self, model: str, body: bytes, key: Optional[str], caller: str = "-"
    ) -> tuple[int, dict[str, str], "dict[str, Any] | Binary"]:
        """(status, headers, JSON body or a binary answer) for one infer request from ``caller`` (the client's
        address)."""
        if self.models is not None and model not in self.models:
            return 404, {}, {"error": f"model {model!r} is not served here (models: {', '.join(self.models)})"}
        sig = (self.models or {}).get(model)
        try:
            doc = _load(body)
            rid, inputs = parse_doc(doc, sig, max_elements=max(1, len(body)))
            wanted = wanted_outputs(doc, sig)
        except BadRequest as e:
            return 400, {}, {"error": str(e)}
        rid = key[:256] if key else rid
        # No id: a job of its own. An id: scoped by caller, model and inputs (a retry of the same request is found).
        jkey = job_key(caller, model, rid, inputs) if rid else uuid.uuid4().hex
        shown = rid or jkey
        t0 = time.time()
        try:
            self.queue.submit(model, inputs, key=jkey)
        except QueueShed as e:
            # Queue time alone would break the latency goal: refused now, not answered late (nothing was queued).
            retry = str(max(1, math.ceil(e.wait_ms / 1000)))
            return 503, {"Retry-After": retry}, {"error": str(e), "wait_ms": e.wait_ms, "shed_wait_ms": e.limit_ms}
        except QueueFull as e:
            return 429, {"Retry-After": "1"}, {"error": str(e), "depth": e.depth, "max_depth": e.max_depth}
        except redis.RedisError as e:
            return 503, {"Retry-After": "1"}, {"error": f"queue unavailable: {type(e).__name__}"}
        try:
            res = self.queue.result(jkey, timeout_s=self.timeout_s, submitted_at=t0)
        except ResultTimeout:
            return 504, {}, {"error": f"no result for job {shown} within {self.timeout_s:g}s", "id": shown}
        except redis.RedisError as e:
            return 503, {"Retry-After": "1"}, {"error": f"queue unavailable: {type(e).__name__}", "id": shown}
        params = {
            "backend": res.backend,
            "latency_ms": round(res.latency_ms, 3),
            "queue_ms": round(res.queue_ms, 3),
            "service_ms": round(res.service_ms, 3),
            "attempts": res.attempts,
            "reclaimed": res.reclaimed,
        }
        headers = {"X-Gpuhost-Backend": res.backend, "X-Gpuhost-Latency-Ms": f"{res.latency_ms:.3f}"}
        if res.status != "ok":
            return 502, headers, {"error": res.error, "id": shown, "parameters": params}
        outputs, parts = answer_outputs(res.outputs, sig, wanted)
        head = {"model_name": model, "id": shown, "outputs": outputs, "parameters": params}
        return 200, headers, Binary(head, tuple(parts)) if parts else head

    def server(self, address: str, port: int) -> "BoundedServer":
        """A server answering with this front, bounded by its limits (a handler class bound to both)."""
        handler = type("Handler", (FrontHandler,), {"front": self, "limits": self.limits})
        return BoundedServer((address, port), handler, self.limits.max_connections)


class FrontHandler(http.server.BaseHTTPRequestHandler):
    """One connection of a front: http.server's request loop with deadlines on the request line, the headers and
    the body, and an answer (never a silent close) to every refusal. `Front.server` binds `front` and `limits`."""

    front: Front
    limits: Limits
    protocol_version = "HTTP/1.1"
    # An answer always has a status line and headers, also to a request line that is not HTTP/1.x.
    default_request_version = "HTTP/1.1"

    def send_error(self, code: int, message: Optional[str] = None, explain: Optional[str] = None) -> None:
        self._refuse(code, message or self.responses.get(code, ("error",))[0])

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the plain socket file: reads go through the deadline instead
        self._raw = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._raw, 64 * 1024)

    def handle_one_request(self) -> None:
        # http.server's own, with a deadline over the request line and headers and an answer on timeout
        self._raw.deadline = time.monotonic() + self.limits.header_timeout_s
        self._raw.received = 0
        self._answered = False
        self.requestline, self.request_version, self.command = "", self.default_request_version, ""
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if len(self.raw_requestline) > 65536:
                self._refuse(414, "request line longer than 64 KiB")
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():  # it answered (400, 431, 505, ...)
                self.close_connection = True
                return
            method = getattr(self, f"do_{self.command}", None)
            if method is None:
                self._refuse(501, f"method {self.command[:20]!r} not supported")
                return
            method()
            self.wfile.flush()
        except (TimeoutError, socket.timeout):
            # Idle keep-alive with nothing sent: close. Part of a request sent: it gets its 408.
            if self._raw.received and not self._answered:
                self._refuse(408, "request not received in time")
            self.close_connection = True
        except (ConnectionError, BrokenPipeError):
            self.close_connection = True

    def _refuse(self, status: int, why: str) -> None:
        self.close_connection = True
        try:
            self._send(status, {"Connection": "close"}, {"error": why})
        except OSError:
            pass

    def _send(self, status: int, headers: dict[str, str], doc: "dict[str, Any] | Binary") -> None:
        if isinstance(doc, Binary):
            data, extra = doc.body()
            headers = {**headers, **extra}
        else:
            data = json.dumps(doc).encode()
        self.connection.settimeout(self.limits.body_timeout_s)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream" if isinstance(doc, Binary) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self._answered = True

    def _length(self, cap: int) -> Optional[int]:
        """The body's length from the one Content-Length header, or None after refusing the request."""
        if self.headers.get("Transfer-Encoding") is not None:
            self._refuse(411, "Transfer-Encoding is not accepted: send the body with a Content-Length")
            return None
        values = self.headers.get_all("Content-Length") or []
        if not values:
            self._refuse(411, "Content-Length required")
            return None
        if len(set(values)) != 1 or not re.fullmatch(r"[0-9]{1,19}", values[0].strip()):
            self._refuse(400, f"Content-Length {', '.join(values)[:60]!r} is not one non-negative integer")
            return None
        n = int(values[0].strip())
        if n > cap:
            self._refuse(413, f"body of {n} bytes is over this model's limit of {cap} bytes")
            return None
        return n

    def do_POST(self):  # noqa: N802
        m = _PATH.fullmatch(self.path.split("?")[0])
        cap = self.front.body_cap(m.group(1)) if m else 0
        n = self._length(cap if m else self.limits.max_header_bytes)
        if n is None:
            return
        self._raw.deadline = time.monotonic() + self.limits.body_timeout_s
        body = self.rfile.read(n) if n else b""
        if len(body) != n:
            self._refuse(400, f"body ended after {len(body)} of {n} bytes")
            return
        if not m:
            self._send(404, {}, {"error": f"no such endpoint: {self.path[:200]}"})
            return
        if m.group(2):
            self._send(
                404,
                {},
                {
                    "error": f"model {m.group(1)} version {m.group(2).rsplit('/', 1)[1]} is not served here: "
                    f"the queue runs the served version; call /v2/models/{m.group(1)}/infer"
                },
            )
            return
        self._send(*self.front.handle(m.group(1), body, self.headers.get("Idempotency-Key"), self._caller()))

    def _caller(self) -> str:
        return str(self.client_address[0])

    def do_GET(self):  # noqa: N802
        if self.headers.get("Transfer-Encoding") or (self.headers.get("Content-Length") or "0").strip() != "0":
            self.close_connection = True  # a body nobody reads must not be taken for the next request
        if self.path.split("?")[0] not in ("/v2/health/ready", "/v2/health/live"):
            self._send(404, {}, {"error": f"no such endpoint: {self.path[:200]}"})
            return
        try:
            self.front.queue.r.ping()
            self._send(200, {}, {"ready": True})
        except redis.RedisError as e:
            self._send(503, {}, {"ready": False, "error": type(e).__name__})

    def log_message(self, *a):
        pass


class BoundedServer(http.server.ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` of them; one more is answered 503 and closed. Its
    threads are joined on ``server_close`` (so a test can count them)."""

    daemon_threads = False
    block_on_close = True
    request_queue_size = 128

    def __init__(self, address, handler, max_connections: int):
        self.slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                body = b'{"error": "too many connections; retry later"}'
                request.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                    b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                )
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def redis_client(cfg: dict) -> redis.Redis:
    """The Redis of the workers' config (host, port, and the password from ``password_file`` when set)."""
    from serving.worker import redis_password

    r = cfg.get("redis", {})
    return redis.Redis(
        host=r.get("host", "127.0.0.1"),
        port=int(r.get("port", 6379)),
        password=redis_password(r),
        socket_timeout=max(10.0, float(cfg.get("front", {}).get("timeout_s", 30.0)) + 5),
    )


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the workers' JSON config (redis, queue and front sections)")
    ap.add_argument("--listen", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8090)
    ap.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open(a.config) as f:
        cfg = json.load(f)
    fc = cfg.get("front", {})
    models = {m: ModelSig.from_dict(d) for m, d in fc["models"].items()} if fc.get("models") else None
    limits = Limits(**{k: v for k, v in fc.items() if k in {f.name for f in dataclasses.fields(Limits)}})
    q = JobQueue(redis_client(cfg), QueueConfig(**cfg.get("queue", {})))
    q.ensure_group()
    srv = Front(q, timeout_s=a.timeout, models=models, limits=limits).server(a.listen, a.port)
    log.info("front on %s:%d, stream %s", a.listen, a.port, q.cfg.stream)
    srv.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
