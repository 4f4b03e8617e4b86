"""KServe BYTES values carried as UINT8 rows: what the gateway and the python backend exchange instead of BYTES.

A BYTES tensor reaches a python-backend model only through ``as_numpy``, which reads zeros beside NumPy 2 (and a
BYTES output answered from such a stub is 0 bytes under HTTP 200). So BYTES stay at the API a client sees (the
front's KServe v2 JSON), and inside they travel as numbers: one value a row of a UINT8 [n, L] tensor, rows
zero-padded to the longest. A row is read back by dropping its trailing zeros, so a value carried this way must
not end with a zero byte: a prompt has no NUL (the front refuses one), a PNG ends with its IEND chunk's CRC
(AE 42 60 82) and a JPEG with FFD9.

In the queue a BYTES input is a NumPy fixed-width bytes array (dtype ``S``: zero-padded too), [n] or [n, 1]; the
worker (and the benchmark's direct path) turns it into rows before the Triton call (``wire_inputs``), except for an
input the model itself declares BYTES (``TYPE_STRING``: a backend with no NumPy-2 trap, e.g. hk-prod's ``sdxl``),
which gets BYTES as the client sent them; a BYTES output such a model answers comes back into the queue as rows
(``queue_outputs``), so the front answers it as it answers the python backends' images.

>>> rows = to_rows([b"a fox", b"dawn"])
>>> rows.shape, rows.dtype.name
((2, 5), 'uint8')
>>> from_rows(rows)
[b'a fox', b'dawn']
>>> from_rows(wire_inputs({"prompt": np.array([[b"hi"]], dtype="S")})["prompt"])
[b'hi']
>>> wire_inputs({"prompt": np.array([[b"hi"]], dtype="S")}, as_bytes={"prompt"})["prompt"].dtype.kind
'S'
>>> queue_outputs({"echo": np.array([[b"a fox"]], dtype=object)})["echo"].tolist()
[[97, 32, 102, 111, 120]]
"""

from __future__ import annotations

from typing import AbstractSet, Mapping, Sequence

import numpy as np


def to_rows(values: Sequence[bytes]) -> np.ndarray:
    """``values`` as UINT8 [n, L] (L the longest, at least 1), each row zero-padded."""
    width = max([1, *(len(v) for v in values)])
    out = np.zeros((len(values), width), dtype=np.uint8)
    for i, v in enumerate(values):
        out[i, : len(v)] = np.frombuffer(v, dtype=np.uint8)
    return out


def from_rows(rows: np.ndarray) -> list[bytes]:
    """Each row of a UINT8 [n, L] tensor (or one [L] row) without its trailing zeros."""
    a = np.asarray(rows, dtype=np.uint8)
    a = a.reshape(1, -1) if a.ndim == 1 else a.reshape(a.shape[0], -1)
    return [bytes(r).rstrip(b"\0") for r in a]


def is_bytes(a: np.ndarray) -> bool:
    """A NumPy array of byte strings (``S``) or Python bytes objects: a BYTES tensor."""
    return a.dtype.kind == "S" or (a.dtype == np.object_ and all(isinstance(v, bytes) for v in a.ravel()))


def bytes_to_rows(a: np.ndarray) -> np.ndarray:
    """A BYTES tensor of one value per batch row ([n] or [n, 1]) as UINT8 [n, L]. ValueError for more values a row
    (a model input of several strings a row is not carried this way)."""
    if a.ndim == 0 or a.size != a.shape[0]:
        raise ValueError(f"a BYTES tensor of shape {list(a.shape)}: one value per batch row ([n] or [n, 1]) only")
    return to_rows([bytes(v) for v in a.ravel()])


def wire_inputs(inputs: Mapping[str, np.ndarray], as_bytes: AbstractSet[str] = frozenset()) -> dict[str, np.ndarray]:
    """``inputs`` with every BYTES tensor as UINT8 rows, except those named in ``as_bytes`` (the model declares them
    BYTES: sent as BYTES); the others as they are (no copy)."""
    return {n: bytes_to_rows(a) if is_bytes(a) and n not in as_bytes else a for n, a in inputs.items()}


def queue_outputs(outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A model's answer as the queue carries it: every BYTES output (tritonclient reads it as an object array of
    ``bytes``) as UINT8 rows, the others as they are. ValueError for a BYTES output of several values a row."""
    return {n: bytes_to_rows(a) if a.dtype == np.object_ and is_bytes(a) else a for n, a in outputs.items()}
