"""The test launcher itself: a real tritonserver (pytriton wheel, python backend, CPU) on loopback."""

import json
import urllib.request

import numpy as np
import tritonclient.http as httpclient

from testbed.servers.triton import triton_fixture, write_sleep_model

triton = triton_fixture(lambda repo: write_sleep_model(repo, "echo", sleep_ms=0, max_batch_size=4))


def test_real_triton_is_ready_and_echoes(triton):
    with urllib.request.urlopen(triton.http_url + "/v2/health/ready") as r:
        assert r.status == 200
    with urllib.request.urlopen(triton.http_url + "/v2/models/echo/config") as r:
        config = json.load(r)
    assert config["max_batch_size"] == 4 and config["backend"] == "python"
    client = httpclient.InferenceServerClient(triton.http_url.removeprefix("http://"))
    data = np.random.default_rng(7).random((3, 5), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    out = client.infer("echo", [tensor]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, data)
    client.close()


def test_real_triton_serves_prometheus_metrics(triton):
    with urllib.request.urlopen(triton.metrics_url + "/metrics") as r:
        text = r.read().decode()
    assert 'nv_inference_count{model="echo",version="1"}' in text
