"""MIG partitions, mig-parted style: read the GPU's state, assert the wanted layout, apply only the difference.

Facts (one round trip, ``FACT_SCRIPT``): MIG mode current/pending per GPU, the GPU-instance profiles
(``nvidia-smi mig -lgip``: name → profile ID for *this* GPU model), the existing GPU instances
(``nvidia-smi mig -lgi``) and the device list with MIG UUIDs (``nvidia-smi -L``). The parsers are
pure and tested on captures (``tests/fixtures/nvidia``: a real H200 ``-L`` and ``-lgip``).

Plan: if the GPU instances already match the layout (as a multiset of profiles) → no-op with a reason.
Otherwise: enable MIG mode if needed (a pending mode change needs a GPU reset — in a passthrough
guest a guest reset), destroy compute and GPU instances, create the wanted ones with ``-cgi … -C``.
Triton instances are then bound by MIG UUID (``mig_uuids``) through Docker device requests or
``CUDA_VISIBLE_DEVICES``.

Usage::

    state = parse_state(conn.run(FACT_SCRIPT).stdout)
    actions = plan(state, {0: ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]})
    for a in actions: print(a.why, a.command)
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from access.shell import sh

SECTIONS = ("MODE", "LGIP", "LGI", "LIST")
FACT_SCRIPT = (
    "\n".join(
        [
            "echo '@@MODE'",
            "nvidia-smi --query-gpu=index,uuid,name,mig.mode.current,mig.mode.pending --format=csv,noheader || true",
            "echo '@@LGIP'",
            "nvidia-smi mig -lgip 2>&1 || true",
            "echo '@@LGI'",
            "nvidia-smi mig -lgi 2>&1 || true",
            "echo '@@LIST'",
            "nvidia-smi -L || true",
        ]
    )
    + "\n"
)


@dataclass
class Gpu:
    index: int
    uuid: str
    name: str
    mig_current: bool
    mig_pending: bool
    profiles: dict[str, int] = field(default_factory=dict)  # "3g.71gb" -> profile ID
    instances: list[str] = field(default_factory=list)  # GPU-instance profile names present
    mig_devices: list[tuple[str, str]] = field(default_factory=list)  # (profile name, MIG UUID)


def _sections(text: str) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    current: Optional[str] = None
    for line in text.splitlines():
        if line.startswith("@@") and line[2:] in SECTIONS:
            current = line[2:]
            out[current] = []
        elif current:
            out[current].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def parse_mode(text: str) -> list[Gpu]:
    """``--query-gpu=index,uuid,name,mig.mode.current,mig.mode.pending --format=csv,noheader``."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5 or not parts[0].isdigit():
            continue
        gpus.append(Gpu(int(parts[0]), parts[1], parts[2], parts[3] == "Enabled", parts[4] == "Enabled"))
    return gpus


_PROFILE_ROW = re.compile(r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+")


def parse_lgip(text: str) -> dict[int, dict[str, int]]:
    """``nvidia-smi mig -lgip`` → {gpu index: {profile name: profile ID}}."""
    out: dict[int, dict[str, int]] = {}
    for line in text.splitlines():
        m = _PROFILE_ROW.match(line)
        if m:
            out.setdefault(int(m.group(1)), {})[m.group(2)] = int(m.group(3))
    return out


_INSTANCE_ROW = re.compile(r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+\d+:\d+\s+\|")


def parse_lgi(text: str) -> dict[int, list[str]]:
    """``nvidia-smi mig -lgi`` → {gpu index: [profile name of each GPU instance]}."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = _INSTANCE_ROW.match(line)
        if m:
            out.setdefault(int(m.group(1)), []).append(m.group(2))
    return out


_GPU_LINE = re.compile(r"^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-f-]+)\)")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[0-9a-f-]+)\)")


def parse_list(text: str) -> dict[int, list[tuple[str, str]]]:
    """``nvidia-smi -L`` → {gpu index: [(MIG profile, MIG UUID), ...]}."""
    out: dict[int, list[tuple[str, str]]] = {}
    current = None
    for line in text.splitlines():
        g = _GPU_LINE.match(line)
        if g:
            current = int(g.group(1))
            out.setdefault(current, [])
            continue
        m = _MIG_LINE.match(line)
        if m and current is not None:
            out[current].append((m.group(1), m.group(2)))
    return out


def parse_state(text: str) -> list[Gpu]:
    s = _sections(text)
    gpus = parse_mode(s.get("MODE", ""))
    lgip, lgi, devices = parse_lgip(s.get("LGIP", "")), parse_lgi(s.get("LGI", "")), parse_list(s.get("LIST", ""))
    for g in gpus:
        g.profiles = lgip.get(g.index, {})
        g.instances = lgi.get(g.index, [])
        g.mig_devices = devices.get(g.index, [])
    return gpus


@dataclass(frozen=True)
class Action:
    why: str
    command: str
    needs_reset: bool = False


def plan(gpus: list[Gpu], layout: dict[int, list[str]]) -> list[Action]:
    """Actions that bring each GPU in ``layout`` to its list of GPU-instance profiles ([] = MIG off).

    Returns [] when every GPU already matches (the no-op); raises ValueError naming the GPU and
    profile when a profile does not exist on that GPU model.
    """
    by_index = {g.index: g for g in gpus}
    actions: list[Action] = []
    for index, wanted in sorted(layout.items()):
        gpu = by_index.get(index)
        if gpu is None:
            raise ValueError(f"GPU {index} is not present (have {sorted(by_index)})")
        if not wanted:
            if gpu.mig_current or gpu.mig_pending:
                if gpu.instances:
                    actions += _destroy(index)
                actions.append(
                    Action(f"GPU {index}: turn MIG off", sh("nvidia-smi", "-i", index, "-mig", 0), needs_reset=True)
                )
            continue
        if gpu.mig_current and Counter(gpu.instances) == Counter(wanted):
            continue
        if gpu.profiles:
            unknown = [p for p in wanted if p not in gpu.profiles]
            if unknown:
                raise ValueError(
                    f"GPU {index} ({gpu.name}) has no MIG profile {unknown[0]!r}; it offers {sorted(gpu.profiles)}"
                )
        if not gpu.mig_current:
            actions.append(
                Action(
                    f"GPU {index}: enable MIG mode"
                    + (" (pending: reset the GPU or the guest)" if gpu.mig_pending else ""),
                    sh("nvidia-smi", "-i", index, "-mig", 1),
                    needs_reset=True,
                )
            )
        if gpu.instances:
            actions += _destroy(index)
        ids = ",".join(str(gpu.profiles[p]) if p in gpu.profiles else p for p in wanted)
        actions.append(
            Action(
                f"GPU {index}: create GPU+compute instances {wanted}",
                sh("nvidia-smi", "mig", "-i", index, "-cgi", ids, "-C"),
            )
        )
    return actions


def _destroy(index: int) -> list[Action]:
    return [
        Action(f"GPU {index}: destroy compute instances", sh("nvidia-smi", "mig", "-i", index, "-dci")),
        Action(f"GPU {index}: destroy GPU instances", sh("nvidia-smi", "mig", "-i", index, "-dgi")),
    ]


def mig_uuids(gpus: list[Gpu], index: int) -> list[str]:
    """MIG device UUIDs of a GPU, in ``nvidia-smi -L`` order, for binding Triton instances."""
    for g in gpus:
        if g.index == index:
            return [u for _, u in g.mig_devices]
    return []
