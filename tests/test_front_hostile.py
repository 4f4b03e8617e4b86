"""The queue gateway's HTTP entry (serving/front.py) under a hostile client on loopback: a real front, a real
redis-server and the real queue; the backend is an echo consumer in this test (it answers each job from its own
inputs, so a wrong answer is visible), standing in for the queue workers and Triton, which the live queue tests
cover. Every hostile request gets its status and exact message, the next good request is answered correctly, no
request hangs, and no thread is left behind (threads counted before and after). Bounded in count and time."""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import socket
import threading
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.bytes_rows import wire_inputs
from serving.front import BadRequest, Front, InputSig, Limits, ModelSig, parse_request
from serving.queue import JobQueue, QueueConfig, Result
from testbed.servers import redis as redis_server
from tests.hostile import live_threads, threads_left

redis = pytest.importorskip("redis")
redis_srv = redis_server.redis_fixture()

MODELS = {
    "m": ModelSig((InputSig("x", "FP32", (4,)),), max_batch_size=2),
    **{
        f"t-{dt.lower()}": ModelSig((InputSig("v", dt, (-1,)),))
        for dt in ("BOOL", "UINT8", "INT8", "INT32", "INT64", "FP16", "FP32")
    },
    # A prompt: BYTES at the API, UINT8 rows inside (the echo answers them back as the BYTES output "v").
    "t-bytes": ModelSig(
        (InputSig("v", "BYTES", (1,), max_bytes=16),), max_batch_size=2, bytes_outputs=("v",), outputs=("v",)
    ),
}
LIMITS = Limits(max_body_bytes=1 << 20, header_timeout_s=1.0, body_timeout_s=1.0, max_connections=4)
CAP_M = 2 * 4 * 32 + 64 * 1024  # model m: batch 2 x 4 values x 32 bytes + 64 KiB


def _echo(model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stand-in backend: model m doubles x; the typed models give v back."""
    if model == "m":
        return {"y": (inputs["x"] * 2).astype(np.float32)}
    return wire_inputs({"v": inputs["v"]})  # a BYTES input as the worker sends it to Triton: UINT8 rows


class EchoConsumer:
    def __init__(self, port: int):
        self.q = JobQueue(redis.Redis(port=port), QueueConfig())
        self.q.ensure_group()
        self.stop = threading.Event()
        self.paused = threading.Event()
        self.holding = threading.Event()  # set once the consumer has seen `paused` (no read in flight)
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.paused.is_set():
                self.holding.set()
                time.sleep(0.02)
                continue
            self.holding.clear()
            for job in self.q.read("echo", count=8, block_ms=50):
                res = Result(job.key, "ok", "echo", "echo", 1.0, 0.0, 1.0, outputs=_echo(job.model, job.inputs))
                self.q.complete(job, res)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.q.r.close()


@pytest.fixture
def front(redis_srv):
    yield from serve(redis_srv, LIMITS)


def serve(redis_srv, limits: Limits):
    """A front on a free port with the echo consumer behind it; stopped after, leaving no thread behind."""
    before = live_threads()
    r = redis.Redis(port=redis_srv.port)
    r.flushall()
    echo = EchoConsumer(redis_srv.port)
    q = JobQueue(r, QueueConfig())
    srv = Front(q, timeout_s=10, models=MODELS, limits=limits).server("127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    t.start()
    srv.echo = echo  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()  # joins the handler threads
        t.join(10)
        echo.close()
        r.close()
        r.connection_pool.disconnect()
        assert threads_left(before) == [], "threads left behind"


def _port(srv) -> int:
    return srv.server_address[1]


def post(srv, model: str, doc, *, src: str = "127.0.0.1", headers=None) -> tuple[int, dict]:
    c = http.client.HTTPConnection("127.0.0.1", _port(srv), timeout=20, source_address=(src, 0))
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    c.request("POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    out = r.status, json.loads(r.read())
    c.close()
    return out


def good(srv, i: float = 1.0, **kw) -> None:
    """A good request gets its own correct answer."""
    x = [i, i + 1, -i, i / 4]
    status, doc = post(srv, "m", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": x}]}, **kw)
    assert status == 200, doc
    assert doc["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [1, 4], "data": [2 * v for v in x]}]


def raw(srv, data: bytes, *, pause: float = 0.0, rest: bytes = b"") -> tuple[int, str]:
    """Send ``data`` on a fresh socket (then ``rest`` after ``pause`` seconds); (status, error message) of the one
    answer, read to the server's close (at most 20 s: a hang fails the test instead of stalling it)."""
    with socket.create_connection(("127.0.0.1", _port(srv)), timeout=20) as s:
        s.sendall(data)
        if pause:
            time.sleep(pause)
            try:
                s.sendall(rest)
            except OSError:
                pass
        chunks = []
        while True:
            try:
                got = s.recv(65536)
            except ConnectionResetError:
                break
            if not got:
                break
            chunks.append(got)
    answer = b"".join(chunks)
    assert answer, "the server closed the socket without an answer"
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    try:
        return status, json.loads(body)["error"]
    except (ValueError, KeyError):
        return status, body.decode(errors="replace")


BODY_M = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()
REQ = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"


# ------------------------------------------------------------------ one caller's results are its own


def test_two_clients_with_the_same_id_get_their_own_answers(front):
    """Two callers (127.0.0.1 and 127.0.0.2) send id "job-1", one caller sends "job-1" twice with different inputs,
    all queued before any is served: each gets the answer to its own inputs."""
    front.echo.paused.set()
    assert front.echo.holding.wait(10)
    asks = [("127.0.0.1", 1.0), ("127.0.0.2", 1.0), ("127.0.0.2", 5.0), ("127.0.0.1", 7.0)]
    got: dict[int, tuple[int, dict]] = {}

    def ask(k: int, src: str, v: float) -> None:
        doc = {"id": "job-1", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [v] * 4}]}
        got[k] = post(front, "m", doc, src=src)

    threads = [threading.Thread(target=ask, args=(k, *a)) for k, a in enumerate(asks)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while front.echo.q.depth() < len(asks) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert front.echo.q.depth() == len(asks)  # four jobs, not one shared key
    front.echo.paused.clear()
    for t in threads:
        t.join(20)
    for k, (_, v) in enumerate(asks):
        status, doc = got[k]
        assert status == 200 and doc["id"] == "job-1", doc
        assert doc["outputs"][0]["data"] == [2 * v] * 4


# ------------------------------------------------------------------ hostile requests: status, message, next answered

HOSTILE_HTTP = [
    ("Content-Length missing", REQ + b"\r\n" + BODY_M, 411, "Content-Length required"),
    (
        "Content-Length negative",
        REQ + b"Content-Length: -1\r\n\r\n",
        400,
        "Content-Length '-1' is not one non-negative integer",
    ),
    (
        "Content-Length non-numeric",
        REQ + b"Content-Length: 12abc\r\n\r\n",
        400,
        "Content-Length '12abc' is not one non-negative integer",
    ),
    (
        "Content-Length twice, different",
        REQ + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n",
        400,
        "Content-Length '5, 6' is not one non-negative integer",
    ),
    (
        "Content-Length huge",
        REQ + b"Content-Length: 99999999999999\r\n\r\n",
        413,
        f"body of 99999999999999 bytes is over this model's limit of {CAP_M} bytes",
    ),
    (
        "body over the model's size",
        REQ + f"Content-Length: {CAP_M + 1}\r\n\r\n".encode(),
        413,
        f"body of {CAP_M + 1} bytes is over this model's limit of {CAP_M} bytes",
    ),
    (
        "chunked body",
        REQ + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        411,
        "Transfer-Encoding is not accepted: send the body with a Content-Length",
    ),
    (
        "request line over 64 KiB",
        b"POST /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
        414,
        "request line longer than 64 KiB",
    ),
    ("101 headers", REQ + b"".join(b"X-%d: y\r\n" % i for i in range(101)) + b"\r\n", 431, "Too many headers"),
    ("unknown method", b"BREW /v2/models/m/infer HTTP/1.1\r\n\r\n", 501, "method 'BREW' not supported"),
    ("not HTTP", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400, "Bad request"),
]


@pytest.mark.parametrize("case, data, status, message", HOSTILE_HTTP, ids=[c[0] for c in HOSTILE_HTTP])
def test_hostile_http_is_answered_and_the_next_request_served(front, case, data, status, message):
    got_status, got_message = raw(front, data)
    assert (got_status, message in got_message) == (status, True), (case, got_status, got_message)
    good(front)


@pytest.mark.parametrize(
    "case, data, pause, rest",
    [
        ("headers never finished", REQ + b"Content-Le", 3.0, b""),
        ("headers trickled a byte at a time", b"P", 0.0, b""),
        ("body shorter than Content-Length", REQ + b"Content-Length: 100\r\n\r\n{", 3.0, b""),
    ],
)
def test_slow_clients_get_408_and_do_not_hold_a_thread(front, case, data, pause, rest):
    if case.startswith("headers trickled"):
        # one byte every 0.3 s: each read is quick, the whole request is not (the deadline is on the whole)
        with socket.create_connection(("127.0.0.1", _port(front)), timeout=20) as s:
            t0 = time.monotonic()
            answer = b""
            for b in REQ + b"Content-Length: 5\r\n\r\n{}":
                try:
                    s.sendall(bytes([b]))
                except OSError:
                    break
                s.settimeout(0.3)
                try:
                    answer = s.recv(65536)
                    break
                except TimeoutError:
                    continue
            s.settimeout(20)
            while chunk := s.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408"), answer
            assert time.monotonic() - t0 < 15  # cut at the 1 s deadline, not after every byte (bound, not a benchmark)
    else:
        status, message = raw(front, data, pause=pause, rest=rest)
        assert (status, message) == (408, "request not received in time"), case
    good(front)


@pytest.fixture
def patient_front(redis_srv):
    """The front with a 30 s header deadline: connections held idle stay held however slow this machine is."""
    yield from serve(redis_srv, dataclasses.replace(LIMITS, header_timeout_s=30.0))


def test_connections_are_bounded_and_the_extra_one_answered_503(patient_front):
    front = patient_front
    held = [socket.create_connection(("127.0.0.1", _port(front)), timeout=20) for _ in range(LIMITS.max_connections)]
    try:
        for s in held:
            s.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\n")  # and then nothing (the header deadline is 30 s)
        # no wait needed: the listener accepts in arrival order, so the held four take the slots before the fifth
        status, message = raw(front, REQ + f"Content-Length: {len(BODY_M)}\r\n\r\n".encode() + BODY_M)
        assert (status, message) == (503, "too many connections; retry later")
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 10
    while True:  # the held slots free as their handlers see the close
        try:
            good(front)
            break
        except (AssertionError, OSError, http.client.HTTPException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _body(name: str, dt: str, shape: list[int], data: list) -> bytes:
    """A KServe v2 JSON infer request with one input."""
    return json.dumps({"inputs": [{"name": name, "datatype": dt, "shape": shape, "data": data}]}).encode()


def _typed(dt: str, value) -> bytes:
    return _body("v", dt, [1], [value])


HOSTILE_VALUES = [
    ("UINT8 300", "t-uint8", _typed("UINT8", 300), "input 'v': 300 is out of range for UINT8 (0..255)"),
    ("UINT8 -1", "t-uint8", _typed("UINT8", -1), "input 'v': -1 is out of range for UINT8 (0..255)"),
    ("INT8 128", "t-int8", _typed("INT8", 128), "input 'v': 128 is out of range for INT8 (-128..127)"),
    ("INT32 2^31", "t-int32", _typed("INT32", 2**31), "input 'v': 2147483648 is out of range for INT32"),
    ("INT64 2^63", "t-int64", _typed("INT64", 2**63), "input 'v': 9223372036854775808 is out of range for INT64"),
    ("INT32 1.5", "t-int32", _typed("INT32", 1.5), "input 'v': INT32 takes integers only, got 1.5"),
    ("INT32 true", "t-int32", _typed("INT32", True), "input 'v': INT32 takes integers only, got True"),
    ("FP16 70000", "t-fp16", _typed("FP16", 70000), "input 'v': 70000 overflows FP16 (largest 65504)"),
    ("FP32 1e39", "t-fp32", _typed("FP32", 1e39), "input 'v': 1e+39 overflows FP32"),
    ("FP32 10^400", "t-fp32", _typed("FP32", 10**400), "input 'v': a value overflows FP32"),
    ("FP32 NaN", "t-fp32", _typed("FP32", float("nan")), "input 'v': nan is not a finite number"),
    ("FP32 Infinity", "t-fp32", _typed("FP32", float("inf")), "input 'v': inf is not a finite number"),
    ("FP32 string", "t-fp32", _typed("FP32", "1.0"), "input 'v': FP32 takes numbers only, got '1.0'"),
    ("BOOL string", "t-bool", _typed("BOOL", "true"), "input 'v': BOOL takes true/false only, got 'true'"),
    ("BOOL 1", "t-bool", _typed("BOOL", 1), "input 'v': BOOL takes true/false only, got 1"),
    (
        "nested deeper than shape",
        "m",
        _body("x", "FP32", [1, 4], [[[[[1]]]] * 4]),
        "input 'x': data nested deeper than shape [1, 4]",
    ),
    ("nesting bomb", "t-fp32", b'{"inputs": ' + b"[" * 50000 + b"]" * 50000 + b"}", "RecursionError"),
    (
        "shape bomb",
        "t-fp32",
        _body("v", "FP32", [10**9, 10**9], []),
        "input 'v': shape [1000000000, 1000000000] is more than the",
    ),
    (
        "wrong shape",
        "m",
        _body("x", "FP32", [1, 5], [1] * 5),
        "input 'x': shape [5] but the model takes [4] (-1: any size)",
    ),
    (
        "batch over max",
        "m",
        _body("x", "FP32", [3, 4], [1] * 12),
        "input 'x': shape [3, 4]: the batch (first) dimension must be 1..2",
    ),
    (
        "datatype not the model's",
        "m",
        _body("x", "FP64", [1, 4], [1] * 4),
        "input 'x': datatype FP64 but the model takes FP32",
    ),
    ("unknown input", "m", _body("z", "FP32", [1, 4], [1] * 4), "input 'z': the model has no such input (inputs: x)"),
    ("BYTES a number", "t-bytes", _body("v", "BYTES", [1, 1], [3]), "input 'v': BYTES takes strings only, got '3'"),
    ("BYTES null", "t-bytes", _body("v", "BYTES", [1, 1], [None]), "input 'v': BYTES takes strings only, got 'None'"),
    ("BYTES a list", "t-bytes", _body("v", "BYTES", [1, 1], [[["a"]]]), "input 'v': data nested deeper than shape"),
    ("BYTES an object", "t-bytes", _body("v", "BYTES", [1, 1], [{"a": 1}]), "input 'v': BYTES takes strings only"),
    (
        "BYTES over the bound",
        "t-bytes",
        _body("v", "BYTES", [1, 1], ["x" * 17]),
        "input 'v': 17 bytes, over the 16-byte bound",
    ),
    (
        "BYTES over the bound in UTF-8",
        "t-bytes",
        _body("v", "BYTES", [1, 1], ["é" * 9]),
        "input 'v': 18 bytes, over the 16-byte bound",
    ),
    (
        "BYTES a lone surrogate",
        "t-bytes",
        _body("v", "BYTES", [1, 1], ["a\ud800"]),
        "input 'v': not valid UTF-8 (a lone surrogate U+D800 at character 1)",
    ),
    (
        "BYTES invalid UTF-8 in the body",
        "t-bytes",
        b'{"inputs": [{"name": "v", "datatype": "BYTES", "shape": [1, 1], "data": ["\xff\xfe"]}]}',
        "not a KServe v2 JSON infer request: UnicodeDecodeError",
    ),
    (
        "BYTES with a NUL",
        "t-bytes",
        _body("v", "BYTES", [1, 1], ["a\u0000b"]),
        "input 'v': a NUL character (U+0000) at byte 1; not allowed",
    ),
    (
        "BYTES as UINT8",
        "t-bytes",
        _body("v", "UINT8", [1, 1], [97]),
        "input 'v': datatype UINT8 but the model takes BYTES",
    ),
    (
        "BYTES two a row",
        "t-bytes",
        _body("v", "BYTES", [1, 2], ["a", "b"]),
        "input 'v': shape [2] but the model takes [1] (-1: any size)",
    ),
    (
        "BYTES batch over max",
        "t-bytes",
        _body("v", "BYTES", [3, 1], ["a", "b", "c"]),
        "input 'v': shape [3, 1]: the batch (first) dimension must be 1..2",
    ),
    (
        "BYTES an unknown output asked",
        "t-bytes",
        json.dumps(
            {"inputs": [{"name": "v", "datatype": "BYTES", "shape": [1, 1], "data": ["a"]}], "outputs": [{"name": "w"}]}
        ).encode(),
        "output 'w': the model has no such output (outputs: v)",
    ),
    ("JSON null", "m", b"null", "not a KServe v2 JSON infer request: an object with an inputs list"),
    ("JSON list", "m", b"[1, 2]", "not a KServe v2 JSON infer request: an object with an inputs list"),
    ("not JSON", "m", b"\xff\xfe", "not a KServe v2 JSON infer request: JSONDecodeError: Expecting value"),
]


@pytest.mark.parametrize("case, model, body, message", HOSTILE_VALUES, ids=[c[0] for c in HOSTILE_VALUES])
def test_values_the_model_cannot_take_are_400_naming_the_input(front, case, model, body, message):
    status, doc = post(front, model, body)
    assert status == 400 and message in doc["error"], (case, doc)
    assert front.echo.q.depth() == 0  # nothing queued
    good(front)


def test_bytes_go_in_as_text_and_come_back_as_bytes_json_and_binary(front):
    """A BYTES input (UTF-8 text, up to the bound) crosses the queue as UINT8 rows and comes back as BYTES: as JSON
    strings, and in KServe's binary layout (a 4-byte little-endian length before each value) when asked."""
    values = ["café ☕", "x" * 16]
    doc: dict[str, Any] = {"inputs": [{"name": "v", "datatype": "BYTES", "shape": [2, 1], "data": values}]}
    status, got = post(front, "t-bytes", doc)
    assert status == 200, got
    assert got["outputs"] == [{"name": "v", "datatype": "BYTES", "shape": [2, 1], "data": values}]

    doc["outputs"] = [{"name": "v", "parameters": {"binary_data": True}}]
    c = http.client.HTTPConnection("127.0.0.1", _port(front), timeout=20)
    c.request("POST", "/v2/models/t-bytes/infer", json.dumps(doc).encode(), {"Content-Type": "application/json"})
    r = c.getresponse()
    body = r.read()
    c.close()
    assert r.status == 200, body
    n = int(r.getheader("Inference-Header-Content-Length") or "")
    head, blob = json.loads(body[:n]), body[n:]
    (out,) = head["outputs"]
    assert (out["datatype"], out["shape"], out["parameters"]) == ("BYTES", [2, 1], {"binary_data_size": len(blob)})
    want = b"".join(len(v.encode()).to_bytes(4, "little") + v.encode() for v in values)
    assert blob == want
    good(front)


def test_a_job_that_would_wait_past_shed_wait_ms_is_503_and_not_queued(front, redis_srv):
    """Shedding: with ``shed_wait_ms`` set, a submit behind a job that has already waited longer is refused at once
    (503, Retry-After, the wait named), nothing is queued; once the queue moves again the next job is served."""
    front.echo.paused.set()
    assert front.echo.holding.wait(10)
    r = redis.Redis(port=redis_srv.port)
    q = JobQueue(r, QueueConfig(shed_wait_ms=200))
    held = q.submit("m", {"x": np.ones((1, 4), np.float32)})
    time.sleep(0.3)  # the waiting job is now older than 200 ms: a new one would wait at least that long
    shedding = Front(q, timeout_s=10, models=MODELS, limits=LIMITS)
    status, headers, shed = shedding.handle("m", BODY_M, None)
    assert status == 503 and isinstance(shed, dict), (status, shed)
    doc = shed
    assert status == 503 and headers == {"Retry-After": "1"}, (status, doc)
    assert doc["shed_wait_ms"] == 200 and doc["wait_ms"] >= 200, doc
    assert "over the 200 ms allowed (shed_wait_ms); not queued" in doc["error"]
    assert q.depth() == 1 and q.stats()["shed"] == 1
    front.echo.paused.clear()
    assert q.result(held, timeout_s=10).status == "ok"
    status, _, answer = shedding.handle("m", BODY_M, None)
    assert status == 200 and isinstance(answer, dict) and answer["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0], answer
    r.close()


def test_unknown_model_and_path_are_404(front):
    assert post(front, "nope", BODY_M) == (
        404,
        {"error": "model 'nope' is not served here (models: " + ", ".join(MODELS) + ")"},
    )
    assert raw(front, b"POST /v2/x HTTP/1.1\r\nContent-Length: 0\r\n\r\n") == (404, "no such endpoint: /v2/x")
    good(front)


def test_a_version_in_the_url_is_refused_not_dropped(front):
    """Jobs run the backends' served version: a request for another is 404 naming it, never answered by another."""
    for version in ("1", "987654321", "0"):
        status, doc = post(front, f"m/versions/{version}", BODY_M)
        assert status == 404 and f"model m version {version} is not served here" in doc["error"], (status, doc)
    good(front)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.sampled_from(["inputs", "name", "datatype", "shape", "data", "id"]), inner, max_size=5)
        ),
        max_leaves=25,
    )
)
def test_any_json_body_is_answered_and_never_a_wrong_answer(front, body):
    status, doc = post(front, "m", json.dumps(body).encode())
    assert status == 400 and doc["error"], doc  # nothing random is a valid request for m
    good(front)


# ------------------------------------------------------------------ the value checks, pure


INT_RANGES = {"UINT8": (0, 255), "INT8": (-128, 127), "INT32": (-(2**31), 2**31 - 1), "INT64": (-(2**63), 2**63 - 1)}


@settings(max_examples=300, deadline=None)
@given(dt=st.sampled_from(sorted(INT_RANGES)), v=st.integers(-(2**70), 2**70))
def test_integers_in_range_pass_exactly_and_others_are_refused(dt, v):
    lo, hi = INT_RANGES[dt]
    sig = ModelSig((InputSig("v", dt, (-1,)),))
    if lo <= v <= hi:
        _, inputs = parse_request(_typed(dt, v), sig)
        assert int(inputs["v"][0]) == v
    else:
        with pytest.raises(BadRequest, match=rf"input 'v': {v} is out of range for {dt}"):
            parse_request(_typed(dt, v), sig)


@settings(max_examples=300, deadline=None)
@given(dt=st.sampled_from(["FP16", "FP32"]), v=st.floats(allow_nan=True, allow_infinity=True))
def test_floats_that_fit_pass_and_nan_inf_overflow_are_refused(dt, v):
    sig = ModelSig((InputSig("v", dt, (-1,)),))
    largest = float(np.finfo(np.float16 if dt == "FP16" else np.float32).max)
    if math.isfinite(v) and abs(v) <= largest:
        _, inputs = parse_request(_typed(dt, v), sig)
        assert math.isfinite(float(inputs["v"][0]))
    else:
        with pytest.raises(BadRequest, match=r"input 'v': .*(not a finite number|overflows)"):
            parse_request(_typed(dt, v), sig)


def test_a_full_redis_is_answered_503_and_the_queue_serves_again_once_it_has_room(front, redis_srv):
    """Redis as the gateway renders it (maxmemory, noeviction) refuses writes once full: the front answers 503 with
    Retry-After and queues nothing; with room again, the next request is served."""
    r = redis.Redis(port=redis_srv.port)
    depth = r.xlen(QueueConfig().stream) if r.exists(QueueConfig().stream) else 0
    try:
        r.config_set("maxmemory-policy", "noeviction")
        # Already over the limit: Redis refuses every write that may grow memory (OOM), as a full queue would.
        r.config_set("maxmemory", str(max(1, int(r.info("memory")["used_memory"]) // 2)))
        for i in range(3):
            c = http.client.HTTPConnection("127.0.0.1", _port(front), timeout=20)
            c.request("POST", "/v2/models/m/infer", BODY_M, {"Idempotency-Key": f"full-{i}"})
            resp = c.getresponse()
            doc = json.loads(resp.read())
            c.close()
            assert resp.status == 503 and resp.getheader("Retry-After") == "1", (resp.status, doc)
            assert "queue unavailable" in doc["error"], doc
        assert (r.xlen(QueueConfig().stream) if r.exists(QueueConfig().stream) else 0) == depth  # nothing queued
    finally:
        r.config_set("maxmemory", "0")
        r.close()
    good(front)
