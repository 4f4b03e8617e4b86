"""Seed 001's own workload through the gateway: a text prompt in, a PNG out. Real servers: the CPU Triton (python
backend) serving the SDXL-shaped generator at its tiny size (``plans.triton_repo.sdxl_generator``: the same
diffusers UNet and VAE classes at a few channels, 64×64, 2 steps), Debian's redis-server, a real worker process
(``python -m serving.worker``) and the real front (``serving.front``) on loopback; the client is tritonclient's HTTP
client, as users call a KServe v2 server. Every answer is decoded with Pillow and checked against the prompt and
seed it was asked for.

Beside it, on the same Triton and worker, a model that declares its prompt BYTES as hk-prod's ``sdxl`` does
(``plans.triton_repo.sdxl``: ``TYPE_STRING`` [1], batch ≤ 2), served by the stand-in that echoes it: the worker
reads each model's metadata and sends the prompt as BYTES there and as UINT8 rows to the generator; the echo is
checked value by value (a 200 alone proves nothing: a NumPy-2 stub answers 0-byte outputs with 200)."""

from __future__ import annotations

import base64
import io
import json
import threading
import urllib.request

import numpy as np
import pytest

from bench.servers import write_repository
from plans.triton_model import InstanceGroup, Tensor
from plans.triton_repo import repository_files, sdxl, sdxl_generator, sdxl_generator_front, standin
from serving.front import Front, Limits, ModelSig
from serving.models import sdxl_generator_files
from serving.queue import JobQueue, QueueConfig
from testbed.servers import redis as redis_server
from testbed.servers import stop_process
from testbed.servers.gateway import spawn_worker, worker_config
from testbed.servers.triton import STANDIN_MODEL, start_triton, triton_available

redis = pytest.importorskip("redis")
Image = pytest.importorskip("PIL.Image")
httpclient = pytest.importorskip("tritonclient.http")
pytest.importorskip("diffusers")

MODEL = "sdxl_generator"
SIZE = 64
SPEC = sdxl_generator(size="tiny", gpu=False, height=SIZE, width=SIZE, steps=2, max_prompt_bytes=256)
ECHO = "prompt_echo"
ECHO_SPEC = standin(
    sdxl().model_copy(
        update={
            "name": ECHO,
            "inputs": [sdxl().inputs[0]],  # hk-prod's prompt: STRING [1]
            "outputs": [Tensor(name="echo", data_type="STRING", dims=[1])],
            "instance_group": [InstanceGroup(kind="KIND_GPU", count=1)],  # one stub process is enough here
        }
    )
)
ECHO_SIG = {
    "max_batch_size": ECHO_SPEC.max_batch_size,
    "inputs": [{"name": "prompt", "datatype": "BYTES", "dims": [1]}],
    "outputs": [{"name": "echo", "datatype": "BYTES"}],
}

redis_srv = redis_server.redis_fixture()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, redis_srv):
    """(front URL host:port, Triton handle): Triton serving the tiny generator, one worker, the front."""
    if not triton_available():
        pytest.skip("tritonserver from the nvidia-pytriton wheel is not installed")
    base = tmp_path_factory.mktemp("gen")
    files = repository_files(
        [SPEC, ECHO_SPEC], gpu_count=0, model_py=STANDIN_MODEL.read_bytes(), model_files=sdxl_generator_files(MODEL)
    )
    triton = start_triton(write_repository(base / "models", files), workdir=base / "triton")
    worker = None
    server = None
    try:
        cfg = worker_config(redis_srv.port, {"gen": triton}, {"gen": 1}, slots=2, models=[MODEL, ECHO])
        worker = spawn_worker(cfg, "gen-w1", base)
        q = JobQueue(redis.Redis(port=redis_srv.port), QueueConfig())
        q.ensure_group()
        sig = {MODEL: ModelSig.from_dict(sdxl_generator_front(SPEC)), ECHO: ModelSig.from_dict(ECHO_SIG)}
        server = Front(q, timeout_s=60, models=sig, limits=Limits()).server("127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        yield f"127.0.0.1:{server.server_address[1]}", triton
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        if worker is not None:
            stop_process(worker, timeout=10)
        triton.stop()


def generate(url: str, prompts: list[str], seeds: list[int]) -> list[bytes]:
    """PNGs from the front through tritonclient's HTTP client (JSON inputs, the image output in binary)."""
    client = httpclient.InferenceServerClient(url, network_timeout=120)
    prompt = httpclient.InferInput("prompt", [len(prompts), 1], "BYTES")
    prompt.set_data_from_numpy(np.array([[p.encode()] for p in prompts], dtype=np.object_), binary_data=False)
    seed = httpclient.InferInput("seed", [len(seeds), 1], "INT64")
    seed.set_data_from_numpy(np.array([[s] for s in seeds], dtype=np.int64), binary_data=False)
    out = httpclient.InferRequestedOutput("image", binary_data=True)
    result = client.infer(MODEL, [prompt, seed], outputs=[out])
    client.close()
    images = result.as_numpy("image")
    assert images is not None and images.shape == (len(prompts), 1), images
    return [bytes(x) for x in images.ravel()]


def pixels(png: bytes) -> np.ndarray:
    """The PNG decoded by Pillow; it must be an RGB image of the model's declared size."""
    img = Image.open(io.BytesIO(png))
    assert (img.format, img.mode, img.size) == ("PNG", "RGB", (SIZE, SIZE))
    return np.asarray(img)


def test_a_prompt_in_a_png_out_that_depends_on_prompt_and_seed(gateway, measured):
    url, _ = gateway
    fox = pixels(generate(url, ["a red fox in the snow"], [7])[0])
    again = pixels(generate(url, ["a red fox in the snow"], [7])[0])
    other_prompt = pixels(generate(url, ["a lighthouse on a rocky coast at dawn"], [7])[0])
    other_seed = pixels(generate(url, ["a red fox in the snow"], [8])[0])
    np.testing.assert_array_equal(fox, again)  # same prompt and seed: the same image
    assert fox.std() > 1  # a picture, not a flat colour
    for other in (other_prompt, other_seed):
        assert np.abs(fox.astype(int) - other).mean() > 0.1
    measured(
        "mean |difference| per channel vs another prompt "
        f"{np.abs(fox.astype(int) - other_prompt).mean():.2f}, vs another seed {np.abs(fox.astype(int) - other_seed).mean():.2f}"
    )


def test_two_prompts_in_one_request_get_their_own_images(gateway):
    url, _ = gateway
    a, b = generate(url, ["a red fox in the snow", "ein Leuchtturm im Morgengrauen ☀"], [7, 7])
    pa, pb = pixels(a), pixels(b)
    assert np.abs(pa.astype(int) - pb).mean() > 0.1


def test_json_answer_carries_the_png_as_base64(gateway):
    """Without the binary extension the image is a JSON string: base64, marked so (a PNG is not UTF-8 text)."""
    url, _ = gateway
    body = {
        "inputs": [
            {"name": "prompt", "datatype": "BYTES", "shape": [1, 1], "data": ["a red fox in the snow"]},
            {"name": "seed", "datatype": "INT64", "shape": [1, 1], "data": [7]},
        ]
    }
    req = urllib.request.Request(f"http://{url}/v2/models/{MODEL}/infer", json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        doc = json.loads(r.read())
    (out,) = doc["outputs"]
    assert (out["name"], out["datatype"], out["shape"], out["parameters"]) == (
        "image",
        "BYTES",
        [1, 1],
        {"content_encoding": "base64"},
    )
    png = base64.b64decode(out["data"][0])
    np.testing.assert_array_equal(pixels(png), pixels(generate(url, ["a red fox in the snow"], [7])[0]))


def test_an_oversize_prompt_is_400_at_the_front_and_never_queued(gateway, redis_srv):
    url, _ = gateway
    q = JobQueue(redis.Redis(port=redis_srv.port), QueueConfig())
    accepted = q.stats().get("accepted", 0)
    body = {
        "inputs": [
            {"name": "prompt", "datatype": "BYTES", "shape": [1, 1], "data": ["x" * 257]},
            {"name": "seed", "datatype": "INT64", "shape": [1, 1], "data": [7]},
        ]
    }
    req = urllib.request.Request(f"http://{url}/v2/models/{MODEL}/infer", json.dumps(body).encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 400
    assert json.loads(e.value.read())["error"] == "input 'prompt': 257 bytes, over the 256-byte bound"
    assert q.stats().get("accepted", 0) == accepted


def test_the_model_refuses_a_bad_row_alone(gateway):
    """Straight to Triton (what the front never sends): a row that is not UTF-8 fails its own request with the
    model's reason; a good request beside it is answered."""
    import tritonclient.grpc as grpcclient

    _, triton = gateway
    client = grpcclient.InferenceServerClient(triton.grpc_url)

    def ask(row: bytes):
        p = grpcclient.InferInput("prompt", [1, len(row)], "UINT8")
        p.set_data_from_numpy(np.frombuffer(row, dtype=np.uint8)[None])
        s = grpcclient.InferInput("seed", [1, 1], "INT64")
        s.set_data_from_numpy(np.array([[7]], dtype=np.int64))
        return client.infer(MODEL, [p, s])

    with pytest.raises(Exception) as e:
        ask(b"a \xff fox")
    assert "prompt: not UTF-8 (invalid start byte at byte 2)" in str(e.value)
    png = ask("a red fox in the snow".encode()).as_numpy("image")
    assert png is not None and png.dtype == np.uint8 and png.shape[0] == 1
    client.close()


def test_a_model_that_declares_bytes_gets_bytes_and_its_answer_back(gateway):
    """The prompt as BYTES to a model whose config says TYPE_STRING (the worker read its metadata): each echoed value
    is its own prompt, UTF-8 and of different lengths in one request (the generator's tests above: rows)."""
    url, triton = gateway
    meta = httpclient.InferenceServerClient(triton.http_url.removeprefix("http://")).get_model_metadata(ECHO)
    assert [(i["name"], i["datatype"]) for i in meta["inputs"]] == [("prompt", "BYTES")]
    prompts = ["a red fox in the snow", "ein Leuchtturm im Morgengrauen ☀"]
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    for binary in (False, True):
        p = httpclient.InferInput("prompt", [2, 1], "BYTES")
        p.set_data_from_numpy(np.array([[x.encode()] for x in prompts], dtype=np.object_), binary_data=False)
        out = httpclient.InferRequestedOutput("echo", binary_data=binary)
        echo = client.infer(ECHO, [p], outputs=[out]).as_numpy("echo")
        assert echo is not None and echo.shape == (2, 1)
        # JSON: the strings themselves; binary: KServe's BYTES layout, read back as bytes
        assert [v.decode() if isinstance(v, bytes) else v for v in echo.ravel()] == prompts
    client.close()
