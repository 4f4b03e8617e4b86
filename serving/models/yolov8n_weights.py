"""YOLOv8n weight files → ``serving/models/yolov8n.py``'s model: Ultralytics ONNX export or checkpoint, state_dict,
safetensors. Pure but for ``read_artifact`` (bounded file read); shipped beside ``model.py`` in the Triton repository.

Formats, told apart by content:

* **ONNX** (Ultralytics' ``model.export(format="onnx")``: with onnxslim or ``simplify=False``, ``dynamic`` on or
  off, FP32 or FP16, the opsets it uses; BatchNorm folded into the convolutions, 64 Conv nodes). Each Conv node is
  placed by the graph's *structure*, not by node order or initializer names (the exporter reorders the Detect
  head's nodes and merges equal initializers): walking the data path back from a Conv node gives the Conv nodes
  that feed it, and the one convolution of YOLOv8n fed by the same (already placed) convolutions with the same
  weight shape, stride and padding is its place. A node named as Ultralytics names them (``/model.22/cv2.0/…``)
  must agree with its place. The graph is checked to be YOLOv8n's: SiLU (Sigmoid·Mul) after every Conv block's
  convolution, the Detect head's DFL (a softmax into a fixed 0…15 convolution). Weights are read *through* the
  Conv nodes (initializers, Identity, Constant) into the fused model (``yolov8n.fuse``). A small bounded protobuf
  reader parses the file, so the ``onnx`` package is not needed where Triton runs.
* **Ultralytics checkpoint** (``yolov8n.pt``: a pickled ``DetectionModel`` in FP16 under ``ema``/``model``). It is
  read by an unpickler that runs no code of the file's classes: every class becomes an inert record of its pickled
  state (Ultralytics need not be installed), and only tensor rebuilding and containers are called. Its parameters
  and persistent buffers map one to one: ``model.{i}.<rest>`` → ``b0…b9`` (i = 0…9), ``h12, h15, h16, h18, h19,
  h21``, ``detect`` (22); 355 keys (or the fused layout: a convolution bias and no BatchNorm).
* **state_dict** (``torch.save(model.state_dict())``, loaded with ``weights_only=True``) and **safetensors**, in
  this project's key layout or Ultralytics' (``model.N.…``), FP16 or FP32; optionally under a ``model``/``ema``
  key (a checkpoint's dict without pickled objects).

Every refusal is one ``WeightsError`` naming the artifact and the key or node with what was expected and found;
a malformed file (truncated, a varint over 10 bytes, a name that is not UTF-8, absurd dims, safetensors offsets
that overlap or run past the end) and non-finite weights included.

Usage::

    data = read_artifact("weights.onnx")                          # a regular file, at most MAX_BYTES
    model = load_model(data, what="weights.onnx")                  # YOLOv8n, eval, FP32, fused or not
    model = yolov8n.fuse(model)                                    # serving form (no-op if fused already)
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import os
import pickle
import re
import stat
import struct
import types
import zipfile
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

if __package__:  # serving.models.yolov8n_weights
    from serving.models import yolov8n as yolo
else:  # beside model.py in a Triton version directory: the same yolov8n module model.py uses (fuse's isinstance)
    import yolov8n as yolo  # type: ignore[no-redef]

# Ultralytics' layer index → this model's attribute (layers 10, 11, 13, 14, 17, 20 have no parameters).
LAYERS = {**{i: f"b{i}" for i in range(10)}, 12: "h12", 15: "h15", 16: "h16", 18: "h18", 19: "h19", 21: "h21"}
LAYERS[22] = "detect"
OURS = {v: k for k, v in LAYERS.items()}
CONV_NODES = 64
MAX_BYTES = 256 << 20  # a YOLOv8n file is 6–13 MB; anything past this is not one
MAX_ELEMENTS = 1 << 26  # per tensor (the largest YOLOv8n tensor has 589,824)
MAX_DIMS = 8


class WeightsError(ValueError):
    """A weights file that does not fit YOLOv8n (format, key, node or shape), or a malformed one."""


def read_artifact(path: str, *, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes`` (a FIFO, a device or a huge file is refused
    before it is read; opened non-blocking, read in chunks). ``hashlib.sha256(data)`` is its hash.

    >>> read_artifact("/dev/zero")  # doctest: +SKIP
    WeightsError: /dev/zero: not a regular file (a character device)
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise WeightsError(f"{path}: cannot open ({e.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = next((k for t, k in _KINDS if t(st.st_mode)), "not a file")
        raise WeightsError(f"{path}: not a regular file ({kind})")
    with os.fdopen(fd, "rb", buffering=0) as f:
        if st.st_size > max_bytes:
            raise WeightsError(f"{path}: {st.st_size} bytes, more than the {max_bytes} a YOLOv8n weights file can be")
        chunks, total = [], 0
        while chunk := f.read(1 << 20):
            total += len(chunk)
            if total > max_bytes:  # grew while read
                raise WeightsError(f"{path}: more than {max_bytes} bytes")
            chunks.append(chunk)
    return b"".join(chunks)


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    return f"model.{OURS[head]}.{rest}" if head in OURS else key


def _normalise(state: Any) -> dict[str, torch.Tensor]:
    for wrapper in ("ema", "model", "state_dict"):  # a checkpoint's dict without pickled objects
        inner = state.get(wrapper) if isinstance(state, dict) else None
        if isinstance(inner, dict) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
            state = inner
            break
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise WeightsError("expected a mapping of parameter names to tensors")
    return {from_ultralytics_key(k): v for k, v in state.items()}


def _is_fused(state: dict[str, torch.Tensor]) -> bool:
    """The fused layout: a Conv block's convolution has a bias and the block no BatchNorm."""
    return "b0.conv.bias" in state and "b0.bn.weight" not in state


def load_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """``strict`` load with a clear error: missing/unexpected keys (Ultralytics' names shown too), shapes, NaN."""
    want = model.state_dict()
    missing = [k for k in want if k not in state]
    extra = [k for k in state if k not in want]
    if missing or extra:
        show = lambda ks: ", ".join(f"{k} ({to_ultralytics_key(k)})" for k in ks[:5])  # noqa: E731
        raise WeightsError(
            f"{len(state)} keys, YOLOv8n has {len(want)}"
            + (f"; missing {len(missing)}: {show(missing)}" if missing else "")
            + (f"; unexpected {len(extra)}: {', '.join(extra[:5])}" if extra else "")
        )
    for k, v in want.items():
        where = f"key {to_ultralytics_key(k)} ({k})"
        if tuple(state[k].shape) != tuple(v.shape):
            raise WeightsError(f"{where}: expected shape {list(v.shape)}, found {list(state[k].shape)}")
        _finite(state[k], where)
    model.load_state_dict({k: t.to(want[k].dtype) for k, t in state.items()}, strict=True)


def _finite(t: torch.Tensor, where: str) -> None:
    if t.is_floating_point():
        bad = int((~torch.isfinite(t.float())).sum())
        if bad:
            raise WeightsError(f"{where}: {bad} of {t.numel()} values are NaN or infinite (expected finite weights)")


# -- ONNX: a bounded protobuf reader ----------------------------------------------------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    out = 0
    for i in range(10):  # 64 bits: at most 10 bytes
        if pos >= len(buf):
            raise WeightsError("truncated: a varint runs past the end of its message")
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return out, pos
    raise WeightsError(f"malformed protobuf: a varint longer than 10 bytes at byte {pos - 10}")


def _fields(buf: bytes):
    """(field number, wire type, value) of one protobuf message; value is int or bytes."""
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        fnum, wire = key >> 3, key & 7
        size = {1: 8, 5: 4}.get(wire, 0)
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            size, pos = _varint(buf, pos)
        elif wire not in (1, 5):
            raise WeightsError(f"malformed protobuf: wire type {wire} of field {fnum} (not an ONNX file?)")
        if wire != 0:
            if pos + size > n:
                raise WeightsError(f"truncated: field {fnum} needs {size} bytes, {n - pos} are left")
            value, pos = buf[pos : pos + size], pos + size
        if fnum == 0:
            raise WeightsError("malformed protobuf: field number 0 (not an ONNX file?)")
        yield fnum, wire, value


def _text(v: Any, what: str) -> str:
    if not isinstance(v, bytes):
        raise WeightsError(f"malformed ONNX: {what} is not a string")
    try:
        return v.decode("utf-8")
    except UnicodeDecodeError:
        raise WeightsError(f"malformed ONNX: {what} {v[:40]!r} is not UTF-8") from None


def _ints(w: int, v: Any) -> list[int]:
    if w == 0:
        return [v]
    if w != 2:
        raise WeightsError("malformed ONNX: an integer list of the wrong wire type")
    out, p = [], 0
    while p < len(v):
        d, p = _varint(v, p)
        out.append(d)
    return out


_DTYPES = {1: (torch.float32, "<f4", 4), 10: (torch.float16, "<f2", 2), 11: (torch.float64, "<f8", 8)}


def _tensor(buf: bytes) -> tuple[str, Optional[torch.Tensor]]:
    dims: list[int] = []
    dtype, name, raw = 1, "", None
    floats: list[float] = []
    for f, w, v in _fields(buf):
        if f == 1:
            dims.extend(_ints(w, v))
        elif f == 2 and w == 0:
            dtype = v
        elif f == 4:
            if w == 2:
                floats.extend(struct.unpack(f"<{len(v) // 4}f", v[: len(v) // 4 * 4]))
            elif w == 5:
                floats.extend(struct.unpack("<f", v))
        elif f == 8:
            name = _text(v, "a tensor name")
        elif f == 9 and w == 2:
            raw = v
        elif f == 14 and v == 1:
            raise WeightsError(f"ONNX tensor {name or '?'}: external data is not supported (one self-contained file)")
    where = f"ONNX tensor {name or '?'}"
    if len(dims) > MAX_DIMS or any(d < 0 or d > MAX_ELEMENTS for d in dims) or math.prod(dims) > MAX_ELEMENTS:
        raise WeightsError(f"{where}: dims {dims[: MAX_DIMS + 1]} (at most {MAX_DIMS} dims of {MAX_ELEMENTS} values)")
    if dtype not in _DTYPES:  # shapes, indices: never a Conv's weight (``_resolve`` says so if one is)
        return name, None
    tdtype, _, size = _DTYPES[dtype]
    count = math.prod(dims)
    if raw is not None:
        if len(raw) != count * size:
            raise WeightsError(f"{where}: dims {dims} need {count * size} bytes of data, found {len(raw)}")
        t = torch.frombuffer(bytearray(raw), dtype=tdtype) if raw else torch.empty(0, dtype=tdtype)
    else:
        if len(floats) != count:
            raise WeightsError(f"{where}: dims {dims} need {count} values, found {len(floats)}")
        t = torch.tensor(floats, dtype=torch.float32)
    return name, t.reshape(dims).float()


@dataclass
class _Node:
    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    ints: dict[str, list[int]] = field(default_factory=dict)
    value: Optional[torch.Tensor] = None  # a Constant's


def _node(buf: bytes, k: int) -> _Node:
    n = _Node(name="", op="", inputs=[], outputs=[])
    for f, _, v in _fields(buf):
        if f == 1:
            n.inputs.append(_text(v, f"an input of node #{k}"))
        elif f == 2:
            n.outputs.append(_text(v, f"an output of node #{k}"))
        elif f == 3:
            n.name = _text(v, f"the name of node #{k}")
        elif f == 4:
            n.op = _text(v, f"the op type of node #{k}")
        elif f == 5 and isinstance(v, bytes):
            aname, ints = "", []
            for af, aw, av in _fields(v):
                if af == 1:
                    aname = _text(av, f"an attribute name of node #{k}")
                elif af == 3 and aw == 0:
                    ints = [av]
                elif af == 8:
                    ints.extend(_ints(aw, av))
                elif af == 5 and isinstance(av, bytes):
                    n.value = _tensor(av)[1]
            n.ints[aname] = ints
    n.name = n.name or f"{n.op}#{k}"
    return n


class _Graph:
    """The parts of an ONNX graph the loader reads: nodes, constants, who makes and who reads each value."""

    def __init__(self, data: bytes):
        graph = None
        for f, w, v in _fields(data):
            if f == 7 and w == 2:
                graph = v
        if graph is None:
            raise WeightsError("not an ONNX model (no graph)")
        self.tensors: dict[str, Optional[torch.Tensor]] = {}
        self.nodes: list[_Node] = []
        self.inputs: set[str] = set()
        for f, w, v in _fields(graph):
            if f == 5 and w == 2:
                tname, t = _tensor(v)
                self.tensors[tname] = t
            elif f == 1 and w == 2:
                self.nodes.append(_node(v, len(self.nodes)))
            elif f == 11 and w == 2:
                for vf, _, vv in _fields(v):
                    if vf == 1:
                        self.inputs.add(_text(vv, "a graph input name"))
        self.alias: dict[str, str] = {}
        self.producer: dict[str, _Node] = {}
        self.readers: dict[str, list[_Node]] = {}
        for n in self.nodes:
            if n.op == "Identity" and n.inputs and n.outputs:
                self.alias[n.outputs[0]] = n.inputs[0]
            elif n.op == "Constant" and n.outputs:
                self.tensors[n.outputs[0]] = n.value
            for o in n.outputs:
                self.producer[o] = n
            for i in n.inputs:
                self.readers.setdefault(i, []).append(n)
        self.inputs -= set(self.tensors)  # old exporters list initializers as inputs too

    def const(self, name: str) -> tuple[bool, Optional[torch.Tensor]]:
        """(is a constant, its float tensor or None) of value ``name``, through Identity nodes."""
        for _ in range(len(self.alias) + 1):
            if name in self.tensors:
                return True, self.tensors[name]
            if name not in self.alias:
                break
            name = self.alias[name]
        return False, None

    def source(self, name: str) -> Optional[_Node]:
        """The node that makes value ``name``, through Identity nodes (None: a graph input or constant)."""
        n = self.producer.get(name)
        while n is not None and n.op == "Identity" and n.inputs:
            n = self.producer.get(n.inputs[0])
        return n


# Ops whose first input alone carries data (the others: shapes, scales, indices, computed or constant).
_DATA_FIRST = {"Reshape", "Resize", "Slice", "Split", "Transpose", "Softmax", "Sigmoid", "MaxPool", "Unsqueeze"}
_DATA_FIRST |= {"Squeeze", "Flatten", "Expand", "Tile", "Gather", "Cast", "Identity", "Pad", "Upsample"}
_METADATA = {"Shape", "Size", "Constant", "ConstantOfShape", "Range"}


def _conv_parents(g: _Graph, conv: _Node) -> frozenset:
    """The Conv nodes (or ``"input"``) whose outputs reach ``conv``'s data input with no Conv in between."""
    out: set = set()
    seen: set[str] = set()
    todo = [conv.inputs[0]] if conv.inputs else []
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in g.inputs:
            out.add("input")
            continue
        if g.const(v)[0]:
            continue
        p = g.producer.get(v)
        if p is None:
            raise WeightsError(f"malformed ONNX: value {v} (read on the way to Conv node {conv.name}) is never made")
        if p.op == "Conv":
            out.add(p.name)
        elif p.op not in _METADATA:
            todo.extend(p.inputs[:1] if p.op in _DATA_FIRST else [i for i in p.inputs if i])
    return frozenset(out)


@dataclass(frozen=True)
class _Place:
    """A convolution of YOLOv8n: its key (Ultralytics' name), what feeds it, its geometry, whether SiLU follows."""

    key: str
    parents: frozenset
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    pad: int
    silu: bool


_DFL = "model.22.dfl.conv"
_CLASS_OUT = re.compile(r"^model\.22\.cv3\.\d+\.2$")


@functools.lru_cache(maxsize=1)
def _places() -> dict[str, _Place]:
    """YOLOv8n's convolutions by Ultralytics key, each with the convolutions that feed it: read from the autograd
    graph of one small forward pass (so the structure is the model code's own, not a copy). The DFL is fed by the
    box convolutions (``cv2.i.2``) alone: the class convolutions reach it here only through a split that drops
    them, and Ultralytics' export splits before the concatenation."""
    model = yolo.YOLOv8n().eval()
    names = {m: n for n, m in model.named_modules()}
    made: dict[Any, str] = {}
    fed: dict[str, Any] = {}

    def hook(m, i, o):
        made[o.grad_fn] = names[m]
        fed[names[m]] = i[0].grad_fn or "input"  # the model's input itself: a leaf

    hooks = [m.register_forward_hook(hook) for m in names if isinstance(m, nn.Conv2d)]
    x = torch.zeros(1, 3, 64, 64, requires_grad=True)
    try:
        with torch.enable_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    modules = dict(model.named_modules())
    acts = {n for n, m in modules.items() if isinstance(m, yolo.Conv)}
    out = {}
    for name, fn in fed.items():
        parents: set[str] = set()
        todo, seen = [fn], set()
        while todo:
            f = todo.pop()
            if f is None or f in seen:
                continue
            seen.add(f)
            if f == "input":
                parents.add("input")
            elif f in made:
                parents.add(to_ultralytics_key(made[f]))
            elif hasattr(f, "variable"):  # a leaf: the input, or a parameter (BatchNorm's)
                if f.variable is x:
                    parents.add("input")
            else:
                todo.extend(nf for nf, _ in f.next_functions)
        conv = modules[name]
        assert isinstance(conv, nn.Conv2d)
        key = to_ultralytics_key(name)
        if key == _DFL:
            parents = {p for p in parents if not _CLASS_OUT.match(p)}
        out[key] = _Place(
            key,
            frozenset(parents),
            tuple(conv.weight.shape),
            tuple(conv.stride),
            int(conv.padding[0]),  # type: ignore[index]
            name.rsplit(".", 1)[0] in acts,
        )
    return out


def _named_as(node: str) -> Optional[list[str]]:
    """The scopes of a node named as Ultralytics' exporter names them (``/model.22/cv2.0/cv2.0.0/conv/Conv`` →
    ``['model.22', 'cv2.0', 'cv2.0.0', 'conv']``); None for other names."""
    if not re.match(r"^/model\.\d+/", node):
        return None
    return node.strip("/").split("/")[:-1]


def _agrees(scopes: list[str], key: str) -> bool:
    """Each scope is a run of ``key``'s dotted parts, each starting at or after the previous one."""
    parts, start = key.split("."), 0
    for s in scopes:
        sp = s.split(".")
        at = next((i for i in range(start, len(parts)) if parts[i : i + len(sp)] == sp), None)
        if at is None:
            return False
        start = at
    return True


def _place_convs(g: _Graph) -> dict[str, _Node]:
    """Ultralytics key (``model.N.….conv``) → the Conv node at that place in the graph."""
    places = _places()
    convs = [n for n in g.nodes if n.op == "Conv"]
    parents = {n.name: _conv_parents(g, n) for n in convs}
    by_name = {n.name: n for n in convs}
    if len(by_name) != len(convs):
        raise WeightsError("malformed ONNX: two Conv nodes share a name")
    placed: dict[str, str] = {}  # node name → key
    todo = list(convs)
    while todo:
        ready = [n for n in todo if all(p == "input" or p in placed for p in parents[n.name])]
        if not ready:
            raise WeightsError(f"malformed ONNX: the Conv nodes {', '.join(n.name for n in todo[:3])} feed each other")
        for n in ready:
            fed_by = {placed.get(p, p) for p in parents[n.name]}
            if fed_by and all(re.match(r"^model\.22\.cv[23]\.\d+\.2$", k) for k in fed_by):  # the DFL's
                fed_by = {k for k in fed_by if not _CLASS_OUT.match(k)}
            placed[n.name] = _place_one(g, n, frozenset(fed_by), placed, places)
        todo = [n for n in todo if n.name not in placed]
    missing = [k for k in places if k not in placed.values()]
    if missing:
        p = places[missing[0]]
        raise WeightsError(
            f"ONNX: {len(convs)} Conv nodes, YOLOv8n has {len(places)}; no Conv node for {', '.join(missing[:4])} "
            f"(expected weight {list(p.shape)} fed by {_feeders(p.parents)})"
        )
    return {k: by_name[n] for n, k in placed.items()}


def _feeders(parents: frozenset) -> str:
    return " and ".join(sorted(parents)) or "nothing"


def _place_one(g: _Graph, n: _Node, fed_by: frozenset, placed: dict[str, str], places: dict[str, _Place]) -> str:
    """The key of Conv node ``n``, fed by the convolutions ``fed_by`` (keys), or a WeightsError saying why none."""
    has, w = g.const(n.inputs[1]) if len(n.inputs) > 1 else (False, None)
    if w is None:
        raise WeightsError(f"ONNX Conv node {n.name}: weight is not a float32/float16 constant ({has and 'not float'})")
    shape, stride = tuple(w.shape), tuple(n.ints.get("strides") or [1, 1])
    pads = n.ints.get("pads") or [0] * 4
    taken = set(placed.values())
    here = [p for p in places.values() if p.parents == fed_by and p.key not in taken]
    fits = [p for p in here if p.shape == shape and p.stride == stride]
    scopes = _named_as(n.name)
    if len(fits) > 1 and scopes:
        fits = [p for p in fits if _agrees(scopes, p.key)] or fits
    if len(fits) != 1:
        if not here:
            raise WeightsError(
                f"ONNX Conv node {n.name}: fed by {_feeders(fed_by)}, which feed no (other) convolution in YOLOv8n"
            )
        want = "; ".join(f"{p.key}: weight {list(p.shape)}, stride {list(p.stride)}" for p in here)
        found = f"weight {list(shape)}, stride {list(stride)}"
        raise WeightsError(f"ONNX Conv node {n.name} (fed by {_feeders(fed_by)}): expected {want}; found {found}")
    p = fits[0]
    if scopes and not _agrees(scopes, p.key):
        raise WeightsError(f"ONNX Conv node {n.name}: named as another layer, but its place in the graph is {p.key}")
    if set(pads) != {p.pad} or any(d != 1 for d in n.ints.get("dilations", [])) or n.ints.get("group", [1]) != [1]:
        raise WeightsError(
            f"ONNX Conv node {n.name} ({p.key}): expected pads {p.pad}, no dilation, one group; found pads {pads}, "
            f"dilations {n.ints.get('dilations')}, group {n.ints.get('group')}"
        )
    return p.key


def _check_silu(g: _Graph, n: _Node, key: str) -> None:
    """Conv ``n``'s output goes into SiLU (x·sigmoid(x): a Sigmoid and a Mul) and nowhere else."""
    y = n.outputs[0] if n.outputs else ""
    readers = g.readers.get(y, [])
    sig = [r for r in readers if r.op == "Sigmoid"]
    mul = [r for r in readers if r.op == "Mul" and sig and set(r.inputs) == {y, sig[0].outputs[0]}]
    if len(sig) != 1 or len(mul) != 1 or len(readers) != 2:
        ops = ", ".join(sorted(r.op for r in readers)) or "nothing"
        raise WeightsError(
            f"ONNX Conv node {n.name} ({key}): its output goes into {ops}; YOLOv8n applies SiLU there "
            "(a Sigmoid and a Mul of the output with it): not a YOLOv8n graph"
        )


def _check_dfl(g: _Graph, n: _Node, w: torch.Tensor) -> None:
    where = f"ONNX Conv node {n.name} (model.22.dfl.conv, the Detect head's DFL)"
    if not torch.equal(w, torch.arange(16, dtype=w.dtype).view(1, 16, 1, 1)):
        raise WeightsError(f"{where}: expected the fixed weights 0, 1, …, 15; found {w.flatten()[:16].tolist()}")
    src = g.source(n.inputs[0])
    while src is not None and src.op in ("Transpose", "Reshape") and src.inputs:  # opset < 13: softmax on 2-D
        src = g.source(src.inputs[0])
    if src is None or src.op != "Softmax":
        raise WeightsError(f"{where}: expected a Softmax over the 16 bins before it, found {src.op if src else 'none'}")


def load_onnx(model: nn.Module, data: bytes) -> None:
    """Conv weights of an Ultralytics ONNX export into ``model`` (which must be fused: BN folded)."""
    g = _Graph(data)
    state = model.state_dict()
    places = _places()
    for key, n in _place_convs(g).items():
        name = from_ultralytics_key(key)
        where = f"ONNX Conv node {n.name} ({key})"
        w = g.const(n.inputs[1])[1]
        assert w is not None  # _place_one checked it
        _finite(w, f"{where} weight")
        if key == _DFL:
            _check_dfl(g, n, w)
        if places[key].silu:
            _check_silu(g, n, key)
        state[f"{name}.weight"] = w
        bias_in = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
        b = g.const(bias_in)[1] if bias_in else None
        if bias_in and b is None:
            raise WeightsError(f"{where}: bias {bias_in} is not a float32/float16 constant")
        if f"{name}.bias" not in state:
            if b is not None and key != _DFL:
                raise WeightsError(f"{where}: has a bias, the model's convolution has none")
            continue
        want = list(state[f"{name}.bias"].shape)
        if b is None or list(b.shape) != want:
            raise WeightsError(
                f"{where}: bias expected shape {want}, found {list(b.shape) if b is not None else 'none'}"
            )
        _finite(b, f"{where} bias")
        state[f"{name}.bias"] = b
    model.load_state_dict(state, strict=True)


# -- PyTorch files: a pickle read without running the file's code ----------------------------------------------


class _Inert:
    """An object of a pickled class, kept as its pickled state: no code of the class runs."""

    cls = "?"

    def __init__(self, *args, **kwargs):
        self.args = args

    def __setstate__(self, state):
        self.state = state


_CALLABLE = {
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_parameter_with_state"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("__builtin__", "set"),
    ("__builtin__", "frozenset"),
}


class _InertUnpickler(pickle.Unpickler):
    """Tensors and containers are rebuilt; every other class becomes an ``_Inert`` subclass named after it."""

    def find_class(self, module, name):
        if (module, name) in _CALLABLE:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        return type(name, (_Inert,), {"cls": f"{module}.{name}"})


_INERT_PICKLE = types.SimpleNamespace(__name__="inert_pickle", Unpickler=_InertUnpickler, load=None)


def _module_state(obj: Any, prefix: str = "", out: Optional[dict] = None) -> dict[str, torch.Tensor]:
    """The state_dict of a pickled ``nn.Module`` kept inert: parameters, then persistent buffers, then children."""
    out = {} if out is None else out
    st = getattr(obj, "state", None)
    if not isinstance(st, dict):
        raise WeightsError(f"pickled {getattr(obj, 'cls', type(obj).__name__)} at {prefix or 'the top'} is no module")
    skip = st.get("_non_persistent_buffers_set") or set()
    for attr in ("_parameters", "_buffers"):
        for k, v in (st.get(attr) or {}).items():
            if isinstance(v, torch.Tensor) and not (attr == "_buffers" and k in skip):
                out[prefix + k] = v
    for k, child in (st.get("_modules") or {}).items():
        if child is not None:
            _module_state(child, f"{prefix}{k}.", out)
    return out


def _torch_file(data: bytes) -> Any:
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError) as e:
        if not zipfile.is_zipfile(io.BytesIO(data)):
            raise WeightsError(f"not a readable PyTorch file ({type(e).__name__}: {str(e)[:120]})") from None
        if "weights_only" not in str(e) and "Unsupported global" not in str(e):
            raise WeightsError(f"not a readable PyTorch file ({type(e).__name__}: {str(e)[:120]})") from None
    except Exception as e:  # a truncated zip, a bad record: torch raises many kinds
        raise WeightsError(f"not a readable PyTorch file ({type(e).__name__}: {str(e)[:120]})") from None
    try:  # pickled objects (an Ultralytics checkpoint's DetectionModel): read inert
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False, pickle_module=_INERT_PICKLE)
    except WeightsError:
        raise
    except Exception as e:
        raise WeightsError(f"not a readable PyTorch file ({type(e).__name__}: {str(e)[:120]})") from None
    if isinstance(obj, dict) and not all(isinstance(v, torch.Tensor) for v in obj.values()):
        model = obj.get("ema") or obj.get("model")  # Ultralytics: ema when saved during training, else model
        if isinstance(model, _Inert):
            return _module_state(model)
    if isinstance(obj, _Inert):
        return _module_state(obj)
    return obj


# -- safetensors ------------------------------------------------------------------------------------------------

_ST_KINDS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
_ST_KINDS["I64"] = torch.int64


def _safetensors(data: bytes) -> dict[str, torch.Tensor]:
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise WeightsError(f"truncated: a header of {n} bytes, {len(data) - 8} bytes in the file")
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise WeightsError(f"the header is not JSON ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise WeightsError("the header is not a JSON object")
    body = data[8 + n :]
    out, spans = {}, []
    for k, meta in header.items():
        if k == "__metadata__":
            continue
        where = f"safetensors key {k}"
        if not isinstance(meta, dict) or not {"dtype", "shape", "data_offsets"} <= set(meta):
            raise WeightsError(f"{where}: expected dtype, shape and data_offsets")
        kind, shape, offs = meta["dtype"], meta["shape"], meta["data_offsets"]
        if kind not in _ST_KINDS:
            raise WeightsError(f"{where}: dtype {str(kind)[:20]} (expected one of {', '.join(_ST_KINDS)})")
        ok = lambda xs: isinstance(xs, list) and all(type(x) is int and 0 <= x for x in xs)  # noqa: E731
        if not ok(shape) or len(shape) > MAX_DIMS or math.prod(shape) > MAX_ELEMENTS:
            raise WeightsError(f"{where}: shape {str(shape)[:60]} (at most {MAX_DIMS} dims of {MAX_ELEMENTS} values)")
        if not ok(offs) or len(offs) != 2 or not offs[0] <= offs[1] <= len(body):
            raise WeightsError(f"{where}: data_offsets {str(offs)[:60]} run outside the {len(body)}-byte body")
        lo, hi = offs
        size = math.prod(shape) * _ST_KINDS[kind].itemsize
        if hi - lo != size:
            raise WeightsError(f"{where}: shape {shape} in {kind} needs {size} bytes, data_offsets give {hi - lo}")
        spans.append((lo, hi, k))
        raw = bytearray(body[lo:hi])
        out[k] = (
            torch.frombuffer(raw, dtype=_ST_KINDS[kind]) if raw else torch.empty(0, dtype=_ST_KINDS[kind])
        ).reshape(shape)
    spans.sort()
    for (_, hi, a), (lo, _, b) in zip(spans, spans[1:]):
        if lo < hi:
            raise WeightsError(f"safetensors keys {a} and {b}: their data_offsets overlap")
    return out


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


def _first(msg: bytes, field: int) -> Optional[bytes]:
    """The first length-delimited ``field`` of a protobuf message, or None."""
    return next((v for f, w, v in _fields(msg) if f == field and w == 2 and isinstance(v, bytes)), None)


def onnx_dynamic(data: bytes) -> bool:
    """Whether an ONNX file's first output has a named (not fixed) first dimension: Ultralytics' own test for an
    export made with ``dynamic=True`` (its ONNX backend: ``isinstance(session.get_outputs()[0].shape[0], str)``),
    for which ``predict`` letterboxes rect as for a checkpoint; False for a static export or another format.

    >>> onnx_dynamic(open("yolov8n_dynamic.onnx", "rb").read()), onnx_dynamic(open("yolov8n.onnx", "rb").read())
    (True, False)
    """
    if detect_format(data) != "onnx":
        return False
    graph = _first(data, 7)  # ModelProto.graph
    output = _first(graph, 12) if graph is not None else None  # GraphProto.output[0], a ValueInfoProto
    shape = None
    if output is not None and (typ := _first(output, 2)) is not None and (tensor := _first(typ, 1)) is not None:
        shape = _first(tensor, 2)  # TypeProto.tensor_type.shape
    dim = _first(shape, 1) if shape is not None else None  # TensorShapeProto.dim[0]
    return dim is not None and any(f == 2 for f, _, _ in _fields(dim))  # Dimension.dim_param


def load_model(data: bytes, *, trusted: bool = False, what: str = "weights") -> nn.Module:
    """A YOLOv8n (eval, FP32, CPU) with the weights in ``data``; fused when they came fused (ONNX, a fused state).

    ``trusted`` is accepted for callers and no longer needed: a pickled checkpoint is read without running its code.
    """
    try:
        fmt = detect_format(data)
    except WeightsError as e:
        raise WeightsError(f"{what}: {e}") from None
    try:
        if fmt == "onnx":
            model = yolo.fuse(yolo.YOLOv8n().eval())
            load_onnx(model, data)
            return model
        state = _normalise(_safetensors(data) if fmt == "safetensors" else _torch_file(data))
        model = yolo.YOLOv8n().eval()
        if _is_fused(state):
            model = yolo.fuse(model)
        load_state(model, state)
        return model
    except WeightsError as e:
        raise WeightsError(f"{what} ({fmt}): {e}") from None
    except RecursionError:
        raise WeightsError(f"{what} ({fmt}): nested too deeply") from None
