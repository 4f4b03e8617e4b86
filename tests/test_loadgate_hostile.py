"""The acceptance gate against answers that lie: property tests over answer bodies and headers (``check_response``
never raises, every malformed answer is a reason, a well-formed one passes), and the load loop against a real HTTP
server on loopback answering what hypothesis generates (no hang, no lost thread, no pass on a bad answer, threads
counted before and after). Bounded in examples and time; nothing here measures speed."""

from __future__ import annotations

import json
import struct
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate import kserve, loadgate
from gate.loadgate import ExpectedOutput, LoadSpec, ResponseCheck, Slo, check_response
from tests.hostile import HostileServer, live_threads, threads_left

CHECK = ResponseCheck((ExpectedOutput("scores", "FP32", (1, 4)), ExpectedOutput("label", "BYTES", (1, 2))))
HEADER = "Inference-Header-Content-Length"


def _answer(scores: list[float], labels: list[bytes], *, outputs=None, extra: bytes = b"") -> tuple[bytes, str]:
    """A binary KServe answer (header JSON, then the tensors) for CHECK, or with ``outputs`` as its header."""
    fp = struct.pack("<4f", *scores)
    by = b"".join(struct.pack("<I", len(x)) + x for x in labels)
    if outputs is None:
        outputs = [
            {"name": "scores", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": len(fp)}},
            {"name": "label", "datatype": "BYTES", "shape": [1, 2], "parameters": {"binary_data_size": len(by)}},
        ]
    head = json.dumps({"model_name": "m", "outputs": outputs}).encode()
    return head + fp + by + extra, str(len(head))


floats = st.floats(allow_nan=False, width=32)
labels = st.lists(st.binary(max_size=12), min_size=2, max_size=2)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def bad_answers(draw) -> tuple[str, bytes, str]:
    """(class, body, header) of an answer that is wrong in one way."""
    scores, labs = draw(st.lists(floats, min_size=4, max_size=4)), draw(labels)
    body, hl = _answer(scores, labs)
    head = json.loads(body[: int(hl)])
    outs = head["outputs"]
    kind = draw(
        st.sampled_from(
            [
                "json-not-object",
                "outputs-not-list",
                "output-not-object",
                "duplicate-output",
                "zero-size-bytes",
                "negative-header-length",
                "non-numeric-header-length",
                "header-length-past-body",
                "negative-dim",
                "dim-wrong-type",
                "name-wrong-type",
                "datatype-wrong",
                "size-wrong-type",
                "size-lies",
                "bytes-element-lies",
                "truncated",
                "trailing-bytes",
                "deep-nesting",
                "json-data-wrong-type",
            ]
        )
    )

    def rebuild(outputs) -> tuple[bytes, str]:
        h = json.dumps({"outputs": outputs}).encode()
        return h + body[int(hl) :], str(len(h))

    if kind == "json-not-object":
        value = draw(json_values.filter(lambda v: not isinstance(v, dict)))
        return kind, json.dumps(value).encode(), draw(st.sampled_from(["", "none"]))
    if kind == "outputs-not-list":
        b, h = rebuild(draw(json_values.filter(lambda v: not isinstance(v, list))))
    elif kind == "output-not-object":
        b, h = rebuild([outs[0], draw(json_values.filter(lambda v: not isinstance(v, dict)))])
    elif kind == "duplicate-output":
        b, h = rebuild([*outs, outs[draw(st.integers(0, 1))]])
    elif kind == "zero-size-bytes":
        outs[1]["parameters"]["binary_data_size"] = 0
        fp = body[int(hl) : int(hl) + 16]
        hb = json.dumps({"outputs": outs}).encode()
        b, h = hb + fp, str(len(hb))
    elif kind == "negative-header-length":
        b, h = body, str(-draw(st.integers(1, len(body) + 5)))
    elif kind == "non-numeric-header-length":
        b, h = body, draw(st.sampled_from(["", " ", "1e3", "0x10", "12a", "١٢", "+5", "nan", hl + ".0"]))
    elif kind == "header-length-past-body":
        b, h = body, str(len(body) + draw(st.integers(1, 1 << 40)))
    elif kind == "negative-dim":
        outs[draw(st.integers(0, 1))]["shape"][draw(st.integers(0, 1))] = draw(st.integers(max_value=-1))
        b, h = rebuild(outs)
    elif kind == "dim-wrong-type":
        bad = draw(st.sampled_from([1.0, "1", True, None, [1], {"d": 1}]))
        outs[draw(st.integers(0, 1))]["shape"][0] = bad
        b, h = rebuild(outs)
    elif kind == "name-wrong-type":
        outs[draw(st.integers(0, 1))]["name"] = draw(json_values.filter(lambda v: not isinstance(v, str)))
        b, h = rebuild(outs)
    elif kind == "datatype-wrong":
        outs[0]["datatype"] = draw(json_values.filter(lambda v: v != "FP32"))
        b, h = rebuild(outs)
    elif kind == "size-wrong-type":
        i = draw(st.integers(0, 1))
        outs[i]["parameters"]["binary_data_size"] = draw(st.sampled_from([-1, "16", 16.0, True, None, [16]]))
        b, h = rebuild(outs)
    elif kind == "size-lies":
        outs[0]["parameters"]["binary_data_size"] = draw(st.integers(1, 64).filter(lambda n: n != 16))
        b, h = rebuild(outs)
    elif kind == "bytes-element-lies":
        # the first element's length prefix points past the blob (or short of it)
        tail = bytearray(body[int(hl) + 16 :])
        tail[0:4] = struct.pack("<I", len(labs[0]) + draw(st.integers(1, 1000)))
        b, h = body[: int(hl) + 16] + bytes(tail), hl
    elif kind == "truncated":
        b, h = body[: -draw(st.integers(1, len(body) - int(hl)))], hl
    elif kind == "trailing-bytes":
        b, h = body + draw(st.binary(min_size=1, max_size=8)), hl
    elif kind == "deep-nesting":
        depth = draw(st.integers(1000, 200_000))
        return kind, b"[" * depth + b"]" * depth, draw(st.sampled_from(["", "none"]))
    else:  # json-data-wrong-type
        outs[0].pop("parameters")
        outs[0]["data"] = draw(st.sampled_from([[1, 2, 3, "4"], [True, 1.0, 2.0, 3.0], [[1, 2, 3, 4]], "1234", None]))
        hb = json.dumps({"outputs": outs}).encode()
        b, h = hb + body[int(hl) + 16 :], str(len(hb))
    return kind, b, h


def _header(h: str):
    return None if h == "none" else h


# ------------------------------------------------------------------ check_response, pure


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()), header=st.text(max_size=12))
def test_check_response_never_raises_on_anything(body, header):
    for h in (header, None):
        assert isinstance(check_response(body, h, CHECK), str)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad=bad_answers())
def test_every_malformed_answer_is_a_reason(bad):
    kind, body, header = bad
    problem = check_response(body, _header(header), CHECK)
    assert isinstance(problem, str) and problem, kind


@settings(max_examples=100, deadline=None)
@given(scores=st.lists(floats, min_size=4, max_size=4), labs=labels)
def test_well_formed_answers_pass(scores, labs):
    body, hl = _answer(scores, labs)
    assert check_response(body, hl, CHECK) is None
    # the same through kserve's entry, headers in any case
    assert (
        kserve.answer_problems(
            {
                "outputs": [
                    {"name": "scores", "datatype": "FP32", "shape": [1, 4]},
                    {"name": "label", "datatype": "BYTES", "shape": [1, 2]},
                ]
            },
            {HEADER.lower(): hl},
            body,
        )
        == []
    )


@pytest.mark.parametrize(
    "kind, body, header, message",
    [
        ("null", b"null", None, "a JSON NoneType, not an object"),
        ("list", b"[1, 2]", None, "a JSON list, not an object"),
        ("nested", b"[" * 100_000 + b"]" * 100_000, None, "RecursionError"),
        ("negative header", *(_answer([1, 2, 3, 4], [b"a", b"b"])[0], "-5"), "'-5' is not a non-negative integer"),
    ],
)
def test_named_reasons(kind, body, header, message):
    assert message in (check_response(body, header, CHECK) or ""), kind


def test_duplicate_zero_size_and_variable_dims_are_named():
    body, hl = _answer([1, 2, 3, 4], [b"a", b"b"])
    outs = json.loads(body[: int(hl)])["outputs"]
    dup = json.dumps({"outputs": [*outs, outs[0]]}).encode()
    assert "outputs ['scores'] answered more than once" in (
        check_response(dup + body[int(hl) :], str(len(dup)), CHECK) or ""
    )
    outs[1]["shape"] = [1, -1]
    var = json.dumps({"outputs": outs}).encode()
    msg = check_response(var + body[int(hl) :], str(len(var)), CHECK)
    assert msg == "output label: shape [1, -1] has a negative or variable dimension (an answer has sizes)"
    outs[1]["shape"] = [1, 2]
    outs[1]["parameters"]["binary_data_size"] = 0
    zero = json.dumps({"outputs": outs}).encode()
    assert check_response(zero + body[int(hl) : int(hl) + 16], str(len(zero)), CHECK) == "output label: 0 bytes"


def test_model_config_that_is_not_a_config_is_refused():
    bad: object
    for bad in (None, [], {"output": None}, {"output": [{"dims": [1]}]}, {"output": []}, {"max_batch_size": "x"}):
        with pytest.raises(ValueError, match="model config"):
            ResponseCheck.from_config(bad)  # type: ignore[arg-type]
    twice = {"output": [{"name": "o", "data_type": "TYPE_FP32", "dims": [1]}] * 2}
    with pytest.raises(ValueError, match="one twice"):
        ResponseCheck.from_config(twice)


# ------------------------------------------------------------------ the load loop against a real server


def _spec(url: str, **kw) -> LoadSpec:
    body, headers = loadgate.binary_request([("x", "FP32", [1, 1], struct.pack("<f", 0.5))])
    base = dict(
        url=url + "/v2/models/m/infer",
        body=body,
        headers=headers,
        concurrency=3,
        duration_s=0.3,
        max_requests=30,
        warmup_requests=2,
        timeout_s=30.0,  # a request timed out is an error: only the never-answering server's test asks for less
        tool="python",
        check=CHECK,
    )
    return LoadSpec(**{**base, **kw})


@pytest.fixture
def server():
    before = live_threads()
    srv = HostileServer().start()
    try:
        yield srv
    finally:
        srv.stop()
        assert threads_left(before) == [], "threads left behind"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=bad_answers(), during=st.sampled_from(["warmup-and-load", "load-only"]))
def test_load_run_fails_on_any_bad_answer_and_loses_no_thread(server, bad, during):
    kind, body, header = bad
    good_body, good_hl = _answer([1, 2, 3, 4], [b"a", b"b"])
    headers = {} if header == "none" else {HEADER: header}
    before = live_threads()
    server.answer(200, body, headers)
    if during == "load-only":
        server.script = [(200, good_body, {HEADER: good_hl})] * 6  # every warmup request answered well
    result = loadgate.run(_spec(server.url))
    assert threads_left(before) == []
    assert result.failures == (), result.failures
    assert result.requests > 0 and result.invalid == result.errors == result.requests, (kind, result)
    found = loadgate.violations(result, Slo())
    assert any("answered 2xx with wrong outputs" in v for v in found), (kind, found)


def test_load_run_passes_on_good_answers(server):
    body, hl = _answer([1, 2, 3, 4], [b"a", b"b"])
    server.answer(200, body, {HEADER: hl})
    result = loadgate.run(_spec(server.url))
    assert result.requests > 0 and result.errors == 0 and not result.failures
    assert loadgate.violations(result, Slo()) == []


@pytest.mark.parametrize("mode", ["hang", "close"])
def test_a_server_that_never_answers_fails_the_gate_without_hanging(server, mode):
    server.mode = mode
    result = loadgate.run(_spec(server.url, timeout_s=0.5, warmup_requests=1, concurrency=2))
    assert result.requests > 0 and result.errors == result.requests
    assert loadgate.violations(result, Slo())


def test_an_endless_answer_is_cut_at_the_limit(server):
    body, hl = _answer([1, 2, 3, 4], [b"a", b"b"])
    server.answer(200, body, {HEADER: hl})
    server.mode = "trickle"
    result = loadgate.run(_spec(server.url, max_response_bytes=16, warmup_requests=0, concurrency=1, max_requests=3))
    assert result.errors == result.requests > 0 and "over the 16-byte limit" in result.first_invalid


@pytest.mark.parametrize("processes", [1, 2])
def test_a_thread_that_dies_fails_the_gate(server, monkeypatch, processes):
    """A load thread killed by something no request handler catches (here: its connection cannot be made, a
    stand-in for any bug) fails the gate by name; the other threads are released at once, not after a timeout."""
    body, hl = _answer([1, 2, 3, 4], [b"a", b"b"])
    server.answer(200, body, {HEADER: hl})
    real, calls = loadgate._connection, [0]
    lock = threading.Lock()

    def flaky(url, timeout):
        with lock:
            calls[0] += 1
            if calls[0] == 2:
                raise RuntimeError("injected: no connection for this thread")
        return real(url, timeout)

    monkeypatch.setattr(loadgate, "_connection", flaky)
    result = loadgate.run(_spec(server.url, concurrency=4, processes=processes))
    found = loadgate.violations(result, Slo())
    assert any("load threads failed" in v and "injected" in v for v in found), found
