"""Triton's dangerous APIs need the host's control key (issue 38 §1), against a real tritonserver (pytriton wheel).

Triton runs with the flags gpuhost renders (``plans.triton_runtime.restricted_args``) and explicit model control, as
a service with the adaptive window does. Directly at Triton's own ports, without the key or with a wrong one:
repository index/load/unload, shared-memory register, logging and trace settings are refused over HTTP and gRPC;
inference is still answered; the operator's reload (``adaptive_window.py reload-triton-window``) with the key file
loads the model with its new window.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import serving.adaptive_window as aw
from plans import triton_runtime as rt
from testbed.servers.triton import triton_fixture, write_sleep_model

ROOT = Path(__file__).resolve().parents[1]
KEY = "5f" * 32
WRONG = "a0" * 32


def standin(repo):
    write_sleep_model(repo, "standin", sleep_ms=1.0, max_batch_size=8, max_queue_delay_microseconds=300, dims=(4,))


triton = triton_fixture(
    standin, extra_args=("--model-control-mode=explicit", "--load-model=*", *rt.restricted_args(KEY))
)

HTTP_CALLS = [
    ("POST", "/v2/repository/index", b"{}"),
    ("POST", "/v2/repository/models/standin/load", b"{}"),
    ("POST", "/v2/repository/models/standin/unload", b"{}"),
    ("POST", "/v2/systemsharedmemory/region/r/register", b'{"key": "/r", "offset": 0, "byte_size": 16}'),
    ("GET", "/v2/systemsharedmemory/status", None),
    ("POST", "/v2/cudasharedmemory/region/r/register", b'{"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 16}'),
    ("GET", "/v2/logging", None),
    ("POST", "/v2/logging", b'{"log_verbose_level": 1}'),
    ("GET", "/v2/trace/setting", None),
    ("POST", "/v2/trace/setting", b'{"trace_level": ["TIMESTAMPS"]}'),
    ("POST", "/v2/models/standin/trace/setting", b'{"trace_level": ["TIMESTAMPS"]}'),
]


def http(url: str, method: str, path: str, body: bytes | None, headers: dict | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.parametrize("method, path, body", HTTP_CALLS, ids=[f"{m} {p}" for m, p, _ in HTTP_CALLS])
def test_http_control_apis_are_refused_without_the_key(triton, method, path, body):
    for headers in ({}, {rt.CONTROL_HEADER: WRONG}):
        status, text = http(triton.http_url, method, path, body, headers)
        assert status == 403 and "This API is restricted" in text, (headers, status, text)
    assert http(triton.http_url, "GET", "/v2/models/standin/ready", None)[0] == 200  # still served


def _grpc_calls(c: grpcclient.InferenceServerClient, headers: dict) -> dict:
    return {
        "RepositoryIndex": lambda: c.get_model_repository_index(headers=headers),
        "RepositoryModelLoad": lambda: c.load_model("standin", headers=headers),
        "RepositoryModelUnload": lambda: c.unload_model("standin", headers=headers),
        "SystemSharedMemoryRegister": lambda: c.register_system_shared_memory("r", "/r", 16, headers=headers),
        "SystemSharedMemoryStatus": lambda: c.get_system_shared_memory_status(headers=headers),
        "CudaSharedMemoryRegister": lambda: c.register_cuda_shared_memory("r", b"", 0, 16, headers=headers),
        "LogSettings": lambda: c.update_log_settings({"log_verbose_level": 1}, headers=headers),
        "TraceSetting": lambda: c.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]}, headers=headers),
    }


def test_grpc_control_protocols_are_refused_without_the_key_and_inference_answered(triton):
    c = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        for headers in ({}, {rt.GRPC_CONTROL_HEADER: WRONG}, {rt.CONTROL_HEADER: KEY}):
            for name, call in _grpc_calls(c, headers).items():
                with pytest.raises(InferenceServerException, match="This protocol is restricted") as e:
                    call()
                assert "UNAVAILABLE" in str(e.value), (name, headers)
        assert c.is_model_ready("standin")
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        out = c.infer("standin", [inp]).as_numpy("OUTPUT0")
        assert np.array_equal(out, x)
        # With the key (as Triton names the gRPC header), the same protocol answers.
        assert c.get_model_repository_index(headers={rt.GRPC_CONTROL_HEADER: KEY}, as_json=True)["models"]
    finally:
        c.close()


def test_http_inference_is_answered_and_the_key_opens_the_repository_api(triton):
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}
    ).encode()
    status, text = http(triton.http_url, "POST", "/v2/models/standin/infer", body)
    assert status == 200 and json.loads(text)["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
    status, text = http(triton.http_url, "POST", "/v2/repository/index", b"{}", {rt.CONTROL_HEADER: KEY})
    assert status == 200 and "standin" in text


def test_the_operators_reload_with_the_key_file_still_moves_tritons_window(triton, tmp_path):
    key_file = tmp_path / "triton-control.env"
    key_file.write_text(f"{rt.KEY_VAR}={KEY}\n")
    key_file.chmod(0o600)
    script = [sys.executable, str(ROOT / "serving" / "adaptive_window.py"), "reload-triton-window"]
    common = ["--triton-url", triton.http_url, "--model", "standin", "--min-interval-s", "0"]

    def served() -> int:
        config = json.load(urllib.request.urlopen(triton.http_url + "/v2/models/standin/config", timeout=5))
        return config["dynamic_batching"]["max_queue_delay_microseconds"]

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(script + common + list(extra), capture_output=True, text=True, timeout=120)

    # Without the key (no key file): Triton refuses the load, in one line.
    without = run("--window-us", "450", "--state", str(tmp_path / "a.json"), "--key-file", str(tmp_path / "none"))
    assert without.returncode == 1 and "HTTP 403" in without.stdout and "restricted" in without.stdout, without
    assert served() == 300
    with_key = run("--window-us", "450", "--state", str(tmp_path / "b.json"), "--key-file", str(key_file))
    assert with_key.returncode == 0, with_key.stdout + with_key.stderr
    assert served() == 450
    back = run("--window-us", "300", "--state", str(tmp_path / "c.json"), "--key-file", str(key_file))
    assert back.returncode == 0 and served() == 300


def test_the_controller_and_the_plans_name_the_same_key_file_variable_and_header():
    assert (aw.CONTROL_KEY_PATH, aw.CONTROL_KEY_VAR, aw.CONTROL_HEADER) == (
        rt.CONTROL_KEY_PATH,
        rt.KEY_VAR,
        rt.CONTROL_HEADER,
    )
