"""A Triton python-backend stand-in for a real model (copied as ``<model>/1/model.py``).

It keeps the real model's signature (Triton itself rejects requests that do not fit the
config): it reads its own ``config.pbtxt`` (Triton passes it as JSON) and answers every
configured output with the configured datatype and dims (``-1`` dims take the size of the
first input's matching axis, else 1). An output whose datatype and dims fit the input at the
same position is an identity copy, so a one-input one-output model is an echo.

Parameters (``parameters { key: ... value { string_value: ... } }`` in config.pbtxt):
  * ``sleep_ms``: time to sleep once per ``execute`` call, i.e. once per dynamic batch,
    so batching is visible as fewer executions than requests (``nv_inference_exec_count``).
  * ``sleep_per_request_ms``: extra sleep per request in the batch.

It needs only numpy and ``triton_python_backend_utils``; it never touches a GPU.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(config, key, default):
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return float(value) if value not in (None, "") else default


def _fits(array, dtype, dims, offset):
    item = array.shape[offset:]
    return array.dtype == dtype and len(item) == len(dims) and all(d in (-1, s) for s, d in zip(item, dims))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self.inputs = [
            (i["name"], pb_utils.triton_string_to_numpy(i["data_type"]), [int(d) for d in i["dims"]])
            for i in config.get("input", [])
        ]
        self.outputs = [
            (o["name"], o["data_type"], pb_utils.triton_string_to_numpy(o["data_type"]), [int(d) for d in o["dims"]])
            for o in config.get("output", [])
        ]
        self.sleep_s = _param(config, "sleep_ms", 0.0) / 1000.0
        self.sleep_per_request_s = _param(config, "sleep_per_request_ms", 0.0) / 1000.0

    def _answer(self, request):
        given = {}
        for name, _dtype, _dims in self.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                given[name] = tensor.as_numpy()
        first = next(iter(given.values()), None)
        batch = first.shape[0] if (self.batched and first is not None and first.ndim > 0) else None
        tensors = []
        offset = 1 if self.batched else 0
        arrays = list(given.values())
        for position, (name, type_name, dtype, dims) in enumerate(self.outputs):
            source = arrays[position] if position < len(arrays) else None
            if source is not None and not _fits(source, dtype, dims, offset):
                source = None
            if source is None:
                shape = [1 if d == -1 else d for d in dims]
                if first is not None:
                    for axis, d in enumerate(dims):
                        if d == -1 and axis + offset < first.ndim:
                            shape[axis] = first.shape[axis + offset]
                if batch is not None:
                    shape = [batch] + shape
                if type_name == "TYPE_STRING":
                    source = np.full(shape, b"", dtype=np.object_)
                else:
                    source = np.zeros(shape, dtype=dtype)
            tensors.append(pb_utils.Tensor(name, source))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def execute(self, requests):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.sleep_per_request_s:
            time.sleep(self.sleep_per_request_s * len(requests))
        return [self._answer(r) for r in requests]
