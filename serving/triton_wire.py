"""Triton's gRPC inference request, serialized with one copy of its tensors' bytes.

tritonclient copies an input's bytes three times on the way out (``InferInput.set_data_from_numpy``'s ``tobytes``,
the request message, its serialization) and the micro-batcher's stacking a fourth; for a 1.2 MB image each fresh
copy is mostly page faults, in the client's loop or a worker's slot, between its other requests. Here the small
fields go through protobuf (tritonclient's ``service_pb2``) and each input's ``raw_input_contents`` (field 7 of
``ModelInferRequest``, ``repeated bytes``) is appended in protobuf's wire format, the rows one after another:
fields may come in any order, so the bytes parse to the message tritonclient would build (tested against it).

* ``batch_request``: items without a batch axis (equal signatures), stacked on a new one: the micro-batcher's;
* ``tensors_request``: whole tensors as they are: the gateway worker's;
* ``model_infer``: the ``ModelInfer`` method on a channel (sync or asyncio) that sends such bytes as they are and
  parses the answer; ``outputs`` reads its tensors (through tritonclient's ``InferResult``);
* ``server_error``: a gRPC error as tritonclient's ``InferenceServerException``, as ``client.infer`` raises it.

A BYTES tensor (NumPy ``S``, or an object array of ``bytes``) goes in KServe's BYTES layout, each value after its
4-byte little-endian length, as tritonclient serializes it: for a model whose config declares the input BYTES
(``TYPE_STRING``); the project's python backends take such values as UINT8 rows instead (``serving/bytes_rows.py``).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np

from serving.bytes_rows import is_bytes

_RAW_INPUT_TAG = bytes([7 << 3 | 2])  # field 7, wire type 2 (length-delimited)
_METHOD = "/inference.GRPCInferenceService/ModelInfer"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _buffer(name: str, a: np.ndarray) -> memoryview:
    if is_bytes(a):  # KServe's BYTES layout; an ``S`` value has no trailing NULs (NumPy drops them)
        return memoryview(b"".join(len(v).to_bytes(4, "little") + bytes(v) for v in a.ravel()))
    if a.dtype == np.object_:
        raise TypeError(f"input {name!r}: an object array of other than bytes values (BYTES: bytes values only)")
    return memoryview(np.ascontiguousarray(a).data).cast("B")


def _request(
    model: str,
    version: str,
    inputs: Sequence[tuple[str, np.dtype, list[int], list[memoryview]]],
    outputs: Sequence[str],
) -> bytes:
    from tritonclient.grpc import service_pb2
    from tritonclient.utils import np_to_triton_dtype

    head = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    parts: list[Any] = []
    for name, dtype, shape, rows in inputs:
        tensor = head.inputs.add(name=name, datatype=np_to_triton_dtype(dtype))
        tensor.shape.extend(shape)
        parts += [_RAW_INPUT_TAG, _varint(sum(r.nbytes for r in rows)), *rows]
    for name in outputs:
        head.outputs.add(name=name)
    return b"".join([head.SerializeToString(), *parts])


def batch_request(
    model: str, items: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[str] = (), version: str = ""
) -> bytes:
    """``items`` (tensors without the batch axis, equal signatures) as one request of ``len(items)`` rows."""
    inputs = []
    for name in items[0]:
        first = np.asarray(items[0][name])
        rows = [_buffer(name, np.asarray(item[name])) for item in items]
        inputs.append((name, first.dtype, [len(items), *first.shape], rows))
    return _request(model, version, inputs, outputs)


def tensors_request(
    model: str, tensors: Mapping[str, np.ndarray], outputs: Sequence[str] = (), version: str = ""
) -> bytes:
    """Whole tensors (their own shapes, batch axis included where the model has one) as one request; no
    ``outputs``: Triton answers all of the model's."""
    inputs = [(name, a.dtype, list(a.shape), [_buffer(name, a)]) for name, a in tensors.items()]
    return _request(model, version, inputs, outputs)


def model_infer(channel: Any) -> Any:
    """``ModelInfer`` on a ``grpc`` or ``grpc.aio`` channel: a request from ``batch_request``/``tensors_request``
    goes as it is (no serializer), the answer comes back as a ``ModelInferResponse``."""
    from tritonclient.grpc import service_pb2

    return channel.unary_unary(
        _METHOD, request_serializer=None, response_deserializer=service_pb2.ModelInferResponse.FromString
    )


def outputs(response: Any, names: Optional[Sequence[str]] = None) -> dict[str, np.ndarray]:
    """The answer's outputs as arrays, read by tritonclient's ``InferResult``: ``names`` (default: every output
    the answer holds)."""
    from tritonclient.grpc import InferResult

    result = InferResult(response)
    return {n: result.as_numpy(n) for n in (names if names is not None else [o.name for o in response.outputs])}


def server_error(e: Any) -> Exception:
    """A ``grpc.RpcError`` as tritonclient's ``InferenceServerException`` (status ``StatusCode.<NAME>``)."""
    from tritonclient.utils import InferenceServerException

    return InferenceServerException(msg=e.details(), status=str(e.code()), debug_details=e.debug_error_string())
