"""The acceptance gate's binary bodies and response checks (pure): a 200 is not a success."""

import json
import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gate import loadgate
from gate.loadgate import ExpectedOutput, ResponseCheck, binary_request, check_response
from serving import adaptive_window

CHECK = ResponseCheck(
    (ExpectedOutput("detections", "FP32", (1, 100, 6)), ExpectedOutput("num_detections", "INT32", (1, 1)))
)


def _binary_response(outputs: list[tuple[str, str, list[int], bytes]]) -> tuple[bytes, str]:
    head = json.dumps(
        {
            "model_name": "m",
            "outputs": [
                {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": len(b)}}
                for n, d, s, b in outputs
            ],
        }
    ).encode()
    return head + b"".join(b for *_, b in outputs), str(len(head))


def test_binary_request_is_a_json_header_then_raw_tensors():
    image = bytes(range(256)) * 4800  # 640*640*3 bytes
    body, headers = binary_request([("images", "UINT8", [1, 640, 640, 3], image)], ["detections", "num_detections"])
    h = dict(headers)
    n = int(h["Inference-Header-Content-Length"])
    head = json.loads(body[:n])
    assert h["Content-Type"] == "application/octet-stream"
    assert head["inputs"] == [
        {"name": "images", "shape": [1, 640, 640, 3], "datatype": "UINT8", "parameters": {"binary_data_size": 1228800}}
    ]
    assert [o["name"] for o in head["outputs"]] == ["detections", "num_detections"]
    assert all(o["parameters"]["binary_data"] for o in head["outputs"])
    assert body[n:] == image and len(body) == n + 1228800


def test_binary_request_refuses_bytes_that_do_not_fit_the_shape():
    with pytest.raises(ValueError, match="FP16"):
        binary_request([("images", "FP16", [1, 3, 640, 640], b"\0" * 1228800)])


def test_a_complete_response_passes():
    body, hl = _binary_response(
        [("detections", "FP32", [1, 100, 6], b"\1" * 2400), ("num_detections", "INT32", [1, 1], b"\0" * 4)]
    )
    assert check_response(body, hl, CHECK) is None


@pytest.mark.parametrize(
    "outputs, why",
    [
        # The NumPy 2 trap: the python backend answers HTTP 200 with 0-byte outputs.
        ([("detections", "FP32", [1, 100, 6], b""), ("num_detections", "INT32", [1, 1], b"")], "0 bytes"),
        ([("detections", "FP32", [1, 100, 6], b"\0" * 2400)], "outputs"),
        ([("detections", "FP32", [1, 99, 6], b"\0" * 2376), ("num_detections", "INT32", [1, 1], b"\0" * 4)], "shape"),
        ([("detections", "FP16", [1, 100, 6], b"\0" * 1200), ("num_detections", "INT32", [1, 1], b"\0" * 4)], "FP16"),
    ],
)
def test_wrong_outputs_under_200_are_named(outputs, why):
    body, hl = _binary_response(outputs)
    problem = check_response(body, hl, CHECK)
    assert problem is not None and why in problem


def test_truncated_body_and_json_outputs():
    body, hl = _binary_response(
        [("detections", "FP32", [1, 100, 6], b"\1" * 2400), ("num_detections", "INT32", [1, 1], b"\0" * 4)]
    )
    assert "body is" in (check_response(body[:-1], hl, CHECK) or "")
    js = json.dumps(
        {"outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4], "data": [0.5, 0.5, 0.5]}]}
    ).encode()
    check = ResponseCheck((ExpectedOutput("OUTPUT0", "FP32", (1, 4)),))
    assert "3 values" in (check_response(js, None, check) or "")
    assert "not a v2 infer response" in (check_response(b"<html>", None, check) or "")


def test_expected_outputs_come_from_tritons_model_config():
    config = {
        "max_batch_size": 8,
        "output": [
            {"name": "detections", "data_type": "TYPE_FP32", "dims": ["100", "6"]},
            {"name": "num_detections", "data_type": "TYPE_INT32", "dims": [1]},
        ],
    }
    assert ResponseCheck.from_config(config, batch=1) == CHECK
    assert ResponseCheck.from_config(config, batch=4).outputs[0].nbytes == 4 * 100 * 6 * 4
    variable = ResponseCheck.from_config({"output": [{"name": "o", "data_type": "TYPE_FP32", "dims": [-1]}]})
    ok, hl = _binary_response([("o", "FP32", [7], b"\0" * 28)])
    assert check_response(ok, hl, variable) is None
    short, hl = _binary_response([("o", "FP32", [7], b"\0" * 27)])
    assert "27 bytes but FP32[7] is 28" in (check_response(short, hl, variable) or "")
    two_d, hl = _binary_response([("o", "FP32", [1, 7], b"\0" * 28)])
    assert "shape [1, 7]" in (check_response(two_d, hl, variable) or "")


def test_wrong_outputs_fail_the_gate_and_wrk_cannot_check():
    r = loadgate._result("python", 1, [1.0, 2.0], errors=2, elapsed=1.0, invalid=2, first_invalid="output x: 0 bytes")
    assert any("2 responses answered 2xx with wrong outputs" in v for v in loadgate.violations(r, loadgate.Slo()))
    with pytest.raises(ValueError, match="wrk cannot check"):
        loadgate.run(loadgate.LoadSpec(url="http://127.0.0.1:9/", tool="wrk", check=CHECK))


def test_binary_fp32_payload_round_trip_sizes():
    data = struct.pack("4f", 1, 2, 3, 4)
    body, headers = binary_request([("INPUT0", "FP32", [1, 4], data)])
    n = int(dict(headers)["Inference-Header-Content-Length"])
    assert body[n:] == data and "outputs" not in json.loads(body[:n])


def test_distinct_bodies_are_sent_in_turn():
    """``LoadSpec.bodies``: request n sends bodies[n % len] (a stdlib HTTP server records what arrives)."""
    import collections
    import http.server
    import threading

    seen: collections.Counter = collections.Counter()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            seen[self.rfile.read(int(self.headers["Content-Length"]))] += 1
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        bodies = (b"image-0", b"image-1", b"image-2")
        url = f"http://127.0.0.1:{srv.server_address[1]}/infer"
        spec = loadgate.LoadSpec(
            url=url, bodies=bodies, concurrency=2, duration_s=30, max_requests=30, warmup_requests=0, tool="python"
        )
        r = loadgate.run(spec)
        assert r.errors == 0 and sum(seen.values()) == 30
        assert {b: seen[b] for b in bodies} == {b: 10 for b in bodies}
        # Bodies of other lengths each go with their own Content-Length (JPEG frames differ in size).
        seen.clear()
        r = loadgate.run(
            loadgate.LoadSpec(
                url=url, bodies=(b"a", b"bb"), duration_s=30, max_requests=4, warmup_requests=0, tool="python"
            )
        )
        assert r.errors == 0 and seen == {b"a": 2, b"bb": 2}
    finally:
        srv.shutdown()


def test_latency_is_the_exchange_and_the_answer_is_still_checked():
    """A request's latency ends when its answer's last byte is read; the checks run after the clock stops (a
    client's own verification is not the service's time), and still judge every answer. The check here sleeps 2 s:
    the latencies stay under it, the run lasts past it for each request, a wrong answer is still counted."""
    import http.server
    import threading
    import time

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    def slow_check(verdict):
        def check(body, header_length):
            time.sleep(2.0)
            return "not the server's answer" if body != b"ok" else verdict

        return check

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/infer"
        for verdict in (None, "wrong boxes"):
            spec = loadgate.LoadSpec(
                url=url,
                payloads=(loadgate.Payload(b"frame", (), slow_check(verdict)),),
                duration_s=60,
                max_requests=2,
                warmup_requests=0,
                tool="python",
            )
            t0 = time.monotonic()
            r = loadgate.run(spec)
            assert r.requests == 2 and time.monotonic() - t0 >= 4.0
            assert r.max_ms < 2000.0, r
            assert (r.invalid, r.first_invalid) == ((0, "") if verdict is None else (2, "wrong boxes"))
    finally:
        srv.shutdown()


def test_binary_outputs_reads_back_each_output_by_name():
    body, hl = _binary_response(
        [
            ("detections", "FP32", [1, 1, 6], struct.pack("<6f", *range(6))),
            ("num_detections", "INT32", [1, 1], b"\1\0\0\0"),
        ]
    )
    blobs = loadgate.binary_outputs(body, hl)
    assert blobs == {"detections": struct.pack("<6f", *range(6)), "num_detections": b"\1\0\0\0"}
    with pytest.raises(KeyError):
        loadgate.binary_outputs(b'{"model_name": "m"}', "19")


@given(st.lists(st.floats(allow_nan=False), max_size=40), st.floats(0, 100))
def test_the_gate_and_the_window_take_the_same_nearest_rank_percentile(values, q):
    """Two copies by necessity (each module stands alone as one file): they must not drift apart."""
    gate, window = loadgate.percentile(sorted(values), q), adaptive_window.percentile(values, q)
    assert gate == window or (math.isnan(gate) and math.isnan(window))
