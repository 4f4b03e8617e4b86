"""The one-copy ModelInferRequest (serving.triton_wire) against the message tritonclient builds itself: pure, no
server (the micro-batcher's and the worker's requests reach a real Triton in test_microbatch_triton.py,
test_adaptive_window_triton.py and the gateway tests)."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

from serving.microbatch import stack
from serving.triton_wire import _varint, batch_request, tensors_request

DTYPES = {np.uint8: "UINT8", np.float16: "FP16", np.int64: "INT64", np.float32: "FP32", np.object_: "BYTES"}


def tritonclients_request(model: str, tensors: dict[str, np.ndarray], outputs: list[str], version: str = ""):
    inputs = []
    for name, array in tensors.items():
        t = grpcclient.InferInput(name, list(array.shape), DTYPES[array.dtype.type])
        t.set_data_from_numpy(array)
        inputs.append(t)
    return _get_inference_request(
        model_name=model,
        inputs=inputs,
        model_version=version,
        request_id="",
        outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )


@pytest.mark.parametrize(
    "n, expected",
    [(0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"), (300, b"\xac\x02"), (1228800, b"\x80\x80\x4b")],
)
def test_varint_is_protobufs(n, expected):
    assert _varint(n) == expected


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_a_batch_request_is_the_request_tritonclient_builds_from_the_stacked_rows(rows):
    """Same shapes, dtypes, outputs and bytes, every input in its order; rows of 700 bytes need a two-byte length."""
    rng = np.random.default_rng(rows)
    items: list[dict[str, np.ndarray]] = [
        {
            "images": rng.integers(0, 255, (7, 10, 10), dtype=np.uint8),
            "scale": rng.random(3).astype(np.float16),
            "ids": np.arange(i, i + 2, dtype=np.int64)[::-1],  # a view with a negative stride: copied in order
        }
        for i in range(rows)
    ]
    batched = stack(items)
    expected = tritonclients_request("yolov8n", batched, ["detections", "num_detections"], version="2")
    ours = service_pb2.ModelInferRequest.FromString(
        batch_request("yolov8n", items, ["detections", "num_detections"], version="2")
    )
    assert ours == expected
    assert [bytes(c) for c in ours.raw_input_contents] == [batched[n].tobytes() for n in ("images", "scale", "ids")]


def test_a_tensors_request_keeps_each_tensors_own_shape():
    """The worker's: a JPEG frame as UINT8 [1, bytes] and a tensor of another first axis, no outputs named (Triton
    answers all), a Fortran-ordered array sent in C order."""
    frame = np.frombuffer(bytes(range(256)) * 500, dtype=np.uint8).reshape(1, -1)
    other = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    ours = service_pb2.ModelInferRequest.FromString(tensors_request("yolov8n", {"images": frame, "other": other}))
    assert ours == tritonclients_request("yolov8n", {"images": frame, "other": other}, [])
    assert list(ours.inputs[0].shape) == [1, 128000] and list(ours.inputs[1].shape) == [3, 4]


def test_a_bytes_tensor_is_the_request_tritonclient_builds_for_bytes():
    """A prompt for a model that declares it BYTES (TYPE_STRING): the queue's ``S`` array (and an object array of
    bytes) in KServe's BYTES layout, as tritonclient serializes it, beside a numeric input; UTF-8 and empty values."""
    prompts = [["a red fox in the snow".encode()], ["ein Leuchtturm ☀".encode()], [b""]]
    seed = np.array([[7], [8], [9]], dtype=np.int64)
    expected = tritonclients_request("sdxl", {"prompt": np.array(prompts, dtype=object), "seed": seed}, [])
    for prompt in (np.array(prompts, dtype="S"), np.array(prompts, dtype=object)):
        ours = service_pb2.ModelInferRequest.FromString(tensors_request("sdxl", {"prompt": prompt, "seed": seed}))
        assert ours == expected
        assert (ours.inputs[0].datatype, list(ours.inputs[0].shape)) == ("BYTES", [3, 1])
    rows = [{"prompt": np.array([p[0]], dtype="S")} for p in prompts]  # the micro-batcher's items, stacked
    stacked = service_pb2.ModelInferRequest.FromString(batch_request("sdxl", rows))
    assert stacked.raw_input_contents[0] == expected.raw_input_contents[0]


def test_an_object_tensor_of_other_values_is_refused_with_the_inputs_name():
    with pytest.raises(TypeError, match="input 'text': an object array of other than bytes values"):
        batch_request("m", [{"text": np.array(["a"], dtype=object)}], ["y"])
    with pytest.raises(TypeError, match="input 'text': an object array"):
        tensors_request("m", {"text": np.array([1], dtype=object)})
