"""Does a MIG layout fit the GPU? Checked at stack load, before anything is declared.

A GPU has 7 compute slices and 8 memory slices (A30: 4 and 4); each GPU-instance profile takes `Ng` compute slices
and a fixed number of memory slices, and `nvidia-smi mig -lgip` says how many instances of each profile fit an empty
GPU ("Free/Total"). A layout fits when every profile is one this GPU has, no profile is asked for more often than
its Total, and the slices add up. (The driver's placement rules are finer; a layout that passes here can still
be refused by `nvidia-smi mig -cgi`, but one refused here can never be created.)

The tables are `-lgip` of an empty GPU; `capacity_from_lgip` reads a capture into the same shape (the H200 table
is checked against the real capture in tests/fixtures/nvidia).

Usage::

    problems = layout_problems("A100", ["3g.40gb", "3g.40gb", "1g.10gb"])
    # ['... needs 9 of 8 memory slices ...']
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    compute: int  # compute slices (the N of Ng)
    memory: int  # memory slices
    total: int  # instances of it that fit an empty GPU (-lgip Free/Total on an empty GPU)


@dataclass(frozen=True)
class Capacity:
    gpu: str
    compute: int
    memory: int
    profiles: dict[str, Profile]


def _table(gpu: str, rows: dict[str, tuple[int, int, int]], compute: int = 7, memory: int = 8) -> Capacity:
    return Capacity(gpu, compute, memory, {k: Profile(*v) for k, v in rows.items()})


def _seven_slices(gpu: str, gb_1: str, gb_2: str, gb_4: str, gb_8: str) -> Capacity:
    """The profiles of a GPU with 7 compute and 8 memory slices (A100, H100, H200): one shape, named by the memory
    of 1, 2, 4 and 8 memory slices."""
    return _table(
        gpu,
        {
            f"1g.{gb_1}gb": (1, 1, 7),
            f"1g.{gb_1}gb+me": (1, 1, 1),
            f"1g.{gb_2}gb": (1, 2, 4),
            f"2g.{gb_2}gb": (2, 2, 3),
            f"3g.{gb_4}gb": (3, 4, 2),
            f"4g.{gb_4}gb": (4, 4, 1),
            f"7g.{gb_8}gb": (7, 8, 1),
        },
    )


# From `nvidia-smi mig -lgip` on empty GPUs (NVIDIA MIG user guide, "Supported MIG profiles").
TABLES: tuple[Capacity, ...] = (
    _seven_slices("A100-40GB", "5", "10", "20", "40"),
    _seven_slices("A100-80GB", "10", "20", "40", "80"),
    # H100 80GB has the A100 80GB profiles (same names and slice counts).
    _seven_slices("H100-80GB", "10", "20", "40", "80"),
    _seven_slices("H200", "18", "35", "71", "141"),
    _table(
        "A30",
        {
            "1g.6gb": (1, 1, 4),
            "1g.6gb+me": (1, 1, 1),
            "2g.12gb": (2, 2, 2),
            "2g.12gb+me": (2, 2, 1),
            "4g.24gb": (4, 4, 1),
        },
        compute=4,
        memory=4,
    ),
)

_FAMILY = {"A100": ("A100-40GB", "A100-80GB"), "H100": ("H100-80GB",), "H200": ("H200",), "A30": ("A30",)}

_LGIP_ROW = re.compile(r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+\d+\s+(\d+)/(\d+)\s+([0-9.]+)\s+")


def capacity_from_lgip(text: str, gpu: str = "captured") -> dict[int, Capacity]:
    """`nvidia-smi mig -lgip` of empty GPUs → {gpu index: Capacity}; memory slices from each profile's share of
    the whole-GPU profile's memory."""
    rows: dict[int, dict[str, tuple[int, float, int]]] = {}
    for line in text.splitlines():
        m = _LGIP_ROW.match(line)
        if m:
            name = m.group(2)
            rows.setdefault(int(m.group(1)), {})[name] = (
                int(name.split("g.", 1)[0]),
                float(m.group(5)),
                int(m.group(4)),
            )
    out = {}
    for idx, profs in rows.items():
        whole = max(profs.values(), key=lambda p: (p[0], p[1]))
        compute = whole[0]
        memory = 8 if compute == 7 else compute
        slice_gib = whole[1] / memory
        out[idx] = Capacity(
            gpu,
            compute,
            memory,
            {n: Profile(c, max(1, round(mem / slice_gib)), total) for n, (c, mem, total) in profs.items()},
        )
    return out


def _problems(cap: Capacity, layout: list[str]) -> list[str]:
    unknown = [p for p in layout if p not in cap.profiles]
    if unknown:
        return [f"{cap.gpu} has no MIG profile {unknown[0]!r} (it has {', '.join(cap.profiles)})"]
    out = []
    for name, n in Counter(layout).items():
        if n > cap.profiles[name].total:
            out.append(f"{n} x {name} but at most {cap.profiles[name].total} fit a {cap.gpu}")
    compute = sum(cap.profiles[p].compute for p in layout)
    memory = sum(cap.profiles[p].memory for p in layout)
    if compute > cap.compute:
        out.append(f"the layout needs {compute} of {cap.compute} compute slices of a {cap.gpu}")
    if memory > cap.memory:
        out.append(f"the layout needs {memory} of {cap.memory} memory slices of a {cap.gpu}")
    return out


def layout_problems(model: str, layout: list[str]) -> list[str]:
    """Why `layout` cannot be created on a GPU of this model ([] when it fits, or when the model is not known:
    the MigLayout provider still checks against the GPU's own -lgip)."""
    key = next((k for k in _FAMILY if k.lower() in model.lower()), None)
    if key is None:
        return []
    tables = [t for t in TABLES if t.gpu in _FAMILY[key]]
    # A100 comes in 40 and 80 GB with different profile names: judge by the table that knows the most of them.
    table = max(tables, key=lambda t: sum(p in t.profiles for p in layout))
    return _problems(table, layout)
