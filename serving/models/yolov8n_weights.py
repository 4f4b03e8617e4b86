"""YOLOv8n weight files → ``serving/models/yolov8n.py``'s model: Ultralytics ONNX export or checkpoint, state_dict,
safetensors. Pure (no I/O but the bytes given); shipped beside ``model.py`` in the Triton repository.

Formats, told apart by content:

* **ONNX** (an Ultralytics ``yolov8n.onnx``: BatchNorm folded into the convolutions, 64 Conv nodes): the weights
  are read *through the Conv nodes* (input 1 = weight, input 2 = bias), following Identity and Constant nodes, in
  the graph's node order, which is the forward order (the TorchScript exporter Ultralytics uses emits nodes as
  traced). Initializer names are not used: the exporter merges identical initializers, so a lookup by
  ``model.N.…`` name misses some. They load into the fused model (``yolov8n.fuse``). A minimal protobuf reader
  parses the file, so the ``onnx`` package is not needed where Triton runs.
* **Ultralytics checkpoint** (``yolov8n.pt``: a pickled ``DetectionModel`` in FP16 under ``ema``/``model``):
  unpickling runs code (``weights_only=False``) and needs Ultralytics importable, so it is accepted only with
  ``trusted=True``, which callers give for a file whose sha256 the stack config pins. Its ``state_dict`` maps one to
  one: ``model.{i}.<rest>`` → ``b0…b9`` (i = 0…9), ``h12, h15, h16, h18, h19, h21``, ``detect`` (22); 355 keys.
* **state_dict** (``torch.save(model.state_dict())``, loaded with ``weights_only=True``) and **safetensors**, in
  this project's key layout or Ultralytics' (``model.N.…``), FP16 or FP32; optionally under a ``model``/``ema``
  key (a checkpoint's dict without pickled objects).

Every layout mismatch raises ``WeightsError`` naming the key or node with the expected and found shapes.

Usage::

    model = load_model(Path("weights.onnx").read_bytes())        # YOLOv8n, eval, FP32, fused or not
    model = yolov8n.fuse(model)                                   # serving form (no-op if fused already)
"""

from __future__ import annotations

import io
import json
import re
import struct
from typing import Any, Optional

import torch
from torch import nn

try:  # beside model.py in a Triton version directory, or as a package module here
    from serving.models import yolov8n as yolo
except ImportError:  # pragma: no cover - the Triton layout
    import yolov8n as yolo  # type: ignore[no-redef]

# Ultralytics' layer index → this model's attribute (layers 10, 11, 13, 14, 17, 20 have no parameters).
LAYERS = {**{i: f"b{i}" for i in range(10)}, 12: "h12", 15: "h15", 16: "h16", 18: "h18", 19: "h19", 21: "h21"}
LAYERS[22] = "detect"
OURS = {v: k for k, v in LAYERS.items()}
CONV_NODES = 64


class WeightsError(ValueError):
    """A weights file that does not fit YOLOv8n (format, key, node or shape)."""


# -- key layouts ------------------------------------------------------------------------------------------------


def from_ultralytics_key(key: str) -> str:
    """``model.22.cv3.0.2.bias`` → ``detect.cv3.0.2.bias``; other keys unchanged."""
    m = re.match(r"^model\.(\d+)\.(.+)$", key)
    if not m:
        return key
    i = int(m.group(1))
    if i not in LAYERS:
        raise WeightsError(f"key {key}: layer {i} has no parameters in YOLOv8n (layers with weights: {sorted(LAYERS)})")
    return f"{LAYERS[i]}.{m.group(2)}"


def to_ultralytics_key(key: str) -> str:
    """``detect.cv3.0.2.bias`` → ``model.22.cv3.0.2.bias`` (inverse of ``from_ultralytics_key``)."""
    head, rest = key.split(".", 1)
    return f"model.{OURS[head]}.{rest}"


def _normalise(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    for wrapper in ("ema", "model", "state_dict"):  # a checkpoint's dict without pickled objects
        inner = state.get(wrapper) if isinstance(state, dict) else None
        if isinstance(inner, dict) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
            state = inner
            break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError("expected a mapping of parameter names to tensors")
    return {from_ultralytics_key(k): v for k, v in state.items()}


def load_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """``strict`` load with a clear error: missing/unexpected keys (Ultralytics' names shown too), shapes."""
    want = model.state_dict()
    missing = [k for k in want if k not in state]
    extra = [k for k in state if k not in want]
    if missing or extra:
        show = lambda ks: ", ".join(f"{k} (model.{OURS[k.split('.')[0]]}.{k.split('.', 1)[1]})" for k in ks[:5])  # noqa: E731
        raise WeightsError(
            f"{len(state)} keys, YOLOv8n has {len(want)}"
            + (f"; missing {len(missing)}: {show(missing)}" if missing else "")
            + (f"; unexpected {len(extra)}: {', '.join(extra[:5])}" if extra else "")
        )
    for k, v in want.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise WeightsError(
                f"key {to_ultralytics_key(k)} ({k}): expected shape {list(v.shape)}, found {list(state[k].shape)}"
            )
    model.load_state_dict({k: t.to(want[k].dtype) for k, t in state.items()}, strict=True)


# -- ONNX (minimal protobuf reader) ------------------------------------------------------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, pos
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of one protobuf message; value is int or bytes."""
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise WeightsError(f"not an ONNX file (protobuf wire type {wire})")
        yield field, wire, value


_DTYPES = {1: (torch.float32, "<f4"), 10: (torch.float16, "<f2"), 11: (torch.float64, "<f8")}


def _tensor(buf: bytes) -> tuple[str, Optional[torch.Tensor]]:
    dims: list[int] = []
    dtype, name, raw = 1, "", None
    floats: list[float] = []
    for f, w, v in _fields(buf):
        if f == 1:
            if w == 2:
                p = 0
                while p < len(v):
                    d, p = _varint(v, p)
                    dims.append(d)
            else:
                dims.append(v)
        elif f == 2:
            dtype = v
        elif f == 4:
            floats.extend(struct.unpack(f"<{len(v) // 4}f", v) if w == 2 else struct.unpack("<f", v))
        elif f == 8:
            name = v.decode()
        elif f == 9:
            raw = v
        elif f == 14 and v == 1:
            raise WeightsError(f"ONNX tensor {name or '?'}: external data is not supported (one self-contained file)")
    if dtype not in _DTYPES:  # shapes, indices: never a Conv's weight (``resolve`` says so if one is)
        return name, None
    tdtype, _ = _DTYPES[dtype]
    if raw is not None:
        t = torch.frombuffer(bytearray(raw), dtype=tdtype) if raw else torch.empty(0, dtype=tdtype)
    else:
        t = torch.tensor(floats, dtype=torch.float32)
    return name, t.reshape(dims).float()


def onnx_convs(data: bytes) -> list[tuple[str, torch.Tensor, Optional[torch.Tensor]]]:
    """(node name, weight, bias or None) of every Conv node of an ONNX model, in node order."""
    graph = None
    for f, w, v in _fields(data):
        if f == 7 and w == 2:
            graph = v
    if graph is None:
        raise WeightsError("not an ONNX model (no graph)")
    tensors: dict[str, Optional[torch.Tensor]] = {}
    alias: dict[str, str] = {}
    convs: list[tuple[str, list[str]]] = []
    for f, _, v in _fields(graph):
        if f == 5:
            n, t = _tensor(v)
            tensors[n] = t
        elif f == 1:
            inputs, outputs, name, op, attrs = [], [], "", "", []
            for nf, _, nv in _fields(v):
                if nf == 1:
                    inputs.append(nv.decode())
                elif nf == 2:
                    outputs.append(nv.decode())
                elif nf == 3:
                    name = nv.decode()
                elif nf == 4:
                    op = nv.decode()
                elif nf == 5:
                    attrs.append(nv)
            if op == "Identity" and inputs and outputs:
                alias[outputs[0]] = inputs[0]
            elif op == "Constant" and outputs:
                for a in attrs:
                    for af, _, av in _fields(a):
                        if af == 5:  # AttributeProto.t
                            tensors[outputs[0]] = _tensor(av)[1]
            elif op == "Conv":
                convs.append((name or f"Conv#{len(convs)}", inputs))

    def resolve(n: str, node: str) -> torch.Tensor:
        seen = n
        while n not in tensors and n in alias:
            n = alias[n]
        t = tensors.get(n)
        if t is None:
            raise WeightsError(
                f"ONNX Conv node {node}: input {seen} is not a float32/float16 constant (initializer, Identity, Constant)"
            )
        return t

    out = []
    for name, inputs in convs:
        if len(inputs) < 2:
            raise WeightsError(f"ONNX Conv node {name}: no weight input")
        bias = resolve(inputs[2], name) if len(inputs) > 2 and inputs[2] else None
        out.append((name, resolve(inputs[1], name), bias))
    return out


def _forward_convs(model: nn.Module) -> list[tuple[str, nn.Conv2d]]:
    """The model's Conv2d modules in forward order (hooks on a tiny input)."""
    names = {m: n for n, m in model.named_modules()}
    order: list[nn.Module] = []
    hooks = [m.register_forward_hook(lambda m, i, o: order.append(m)) for m in names if isinstance(m, nn.Conv2d)]
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, 64, 64))
    finally:
        for h in hooks:
            h.remove()
    return [(names[m], m) for m in order]  # type: ignore[misc]


def load_onnx(model: nn.Module, data: bytes) -> None:
    """Conv weights of an Ultralytics ONNX export into ``model`` (which must be fused: BN folded)."""
    convs = onnx_convs(data)
    mine = _forward_convs(model)
    if len(convs) != len(mine):
        raise WeightsError(f"ONNX: expected {len(mine)} Conv nodes (YOLOv8n), found {len(convs)}")
    state = model.state_dict()
    for k, ((node, w, b), (name, conv)) in enumerate(zip(convs, mine)):
        where = f"ONNX Conv node {node} (#{k}, {to_ultralytics_key(name)})"
        if tuple(w.shape) != tuple(conv.weight.shape):
            raise WeightsError(f"{where}: weight expected shape {list(conv.weight.shape)}, found {list(w.shape)}")
        state[f"{name}.weight"] = w
        if conv.bias is None:
            if b is not None and name != "detect.dfl.conv":
                raise WeightsError(f"{where}: has a bias, the model's convolution has none")
        else:
            if b is None:
                raise WeightsError(f"{where}: bias expected shape {list(conv.bias.shape)}, found none")
            if tuple(b.shape) != tuple(conv.bias.shape):
                raise WeightsError(f"{where}: bias expected shape {list(conv.bias.shape)}, found {list(b.shape)}")
            state[f"{name}.bias"] = b
    model.load_state_dict(state, strict=True)


# -- files -------------------------------------------------------------------------------------------------------


def detect_format(data: bytes) -> str:
    """``safetensors``, ``torch`` (a torch.save zip or legacy pickle) or ``onnx``, by content."""
    if len(data) > 10 and data[8:9] == b"{" and int.from_bytes(data[:8], "little") < len(data):
        return "safetensors"
    if data[:4] == b"PK\x03\x04" or data[:2] == b"\x80\x02":
        return "torch"
    if data[:1] == b"\x08":  # ModelProto field 1 (ir_version), varint: every ONNX file starts so
        return "onnx"
    raise WeightsError("unknown weights format (expected ONNX, a PyTorch .pt or safetensors)")


def _safetensors(data: bytes) -> dict[str, torch.Tensor]:
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    kinds = {
        "F32": torch.float32,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "F64": torch.float64,
        "I64": torch.int64,
    }
    out = {}
    body = data[8 + n :]
    for k, meta in header.items():
        if k == "__metadata__":
            continue
        if meta["dtype"] not in kinds:
            raise WeightsError(f"safetensors key {k}: dtype {meta['dtype']}")
        lo, hi = meta["data_offsets"]
        raw = bytearray(body[lo:hi])
        t = torch.frombuffer(raw, dtype=kinds[meta["dtype"]]) if raw else torch.empty(0, dtype=kinds[meta["dtype"]])
        out[k] = t.reshape(meta["shape"])
    return out


def _torch_file(data: bytes, trusted: bool) -> dict[str, torch.Tensor]:
    try:
        obj: Any = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # pickled objects (an Ultralytics checkpoint's DetectionModel)
        if not trusted:
            raise WeightsError(
                "the .pt file holds pickled objects (an Ultralytics checkpoint?), which run code when loaded: "
                "accepted only from an artifact whose sha256 the stack config pins; or save its state_dict "
                f"(torch.save(ckpt['model'].state_dict())) or safetensors instead ({type(e).__name__})"
            ) from None
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    if isinstance(obj, dict) and not all(isinstance(v, torch.Tensor) for v in obj.values()):
        model = obj.get("ema") or obj.get("model")  # Ultralytics: ema when saved during training, else model
        if model is not None and hasattr(model, "state_dict"):
            obj = (model.float() if hasattr(model, "float") else model).state_dict()
    elif hasattr(obj, "state_dict") and not isinstance(obj, dict):
        obj = obj.float().state_dict() if hasattr(obj, "float") else obj.state_dict()
    return obj


def load_model(data: bytes, *, trusted: bool = False, what: str = "weights") -> nn.Module:
    """A YOLOv8n (eval, FP32, CPU) with the weights in ``data``; fused when they came fused (ONNX)."""
    fmt = detect_format(data)
    try:
        if fmt == "onnx":
            model = yolo.fuse(yolo.YOLOv8n().eval())
            load_onnx(model, data)
            return model
        state = _safetensors(data) if fmt == "safetensors" else _torch_file(data, trusted)
        model = yolo.YOLOv8n().eval()
        load_state(model, _normalise(state))
        return model
    except WeightsError as e:
        raise WeightsError(f"{what} ({fmt}): {e}") from None
