"""MIG, the pure part: the profiles a GPU model offers, whether a layout fits, and the plan that lays it out.

One vocabulary, NVIDIA's (the MIG user guide, ``nvidia-smi mig``):

- **slice**: the unit a GPU is cut in: 7 compute slices and 8 memory slices (A30: 4 and 4).
- **profile**: the shape of one instance, named as ``nvidia-smi mig -lgip`` prints it: ``3g.71gb`` is 3 compute
  slices and 71 GB; ``+me`` adds the media engines. Each GPU model numbers its profiles (the **profile ID**).
- **instance**: a GPU instance made from a profile, with one compute instance over all of it; CUDA sees it as a
  MIG device with its own **MIG UUID** (``nvidia-smi -L``), which a Triton service is bound to.
- **layout**: the profiles wanted on each GPU, by index (``gpus[].mig`` in the stack, MigLayout's ``layout``);
  [] is MIG off.
- **MIG mode**: on or off per GPU; a change stays *pending* until the GPU (in a passthrough guest: the guest) resets.

Three parts, each pure:

- Profiles and fit (checked at stack load, before anything is declared): ``TABLES`` of known GPU models,
  ``layout_problems(model, layout)``, ``PROFILE_RE`` (the syntax of a profile name).
- The GPUs' state, read in one round trip (``FACT_SCRIPT``) and parsed by ``parse_state``; the parsers are tested
  on captures (``tests/fixtures/nvidia``: a real H200's ``-L`` and ``-lgip``).
- The plan, mig-parted style: ``plan_layout(gpus, layout)`` is [] when every GPU's instances already match its
  layout (as a multiset of profiles); otherwise it turns MIG mode on if needed, destroys the compute and GPU
  instances, and creates the wanted ones by profile ID (``-cgi … -C``). ``instance_uuids`` gives the MIG UUIDs.

The MigLayout provider (``providers/mig.py``) runs the plan on a host; MigGpus (``components/mig_gpus.py``) declares
it for a host's own GPUs.

Usage::

    layout_problems("A100", ["3g.40gb", "3g.40gb", "1g.10gb"])   # ['... needs 9 of 8 memory slices ...']
    gpus = parse_state(conn.run(FACT_SCRIPT).stdout)
    for a in plan_layout(gpus, {0: ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]}):
        print(a.why, a.command)
    instance_uuids(gpus, 0)   # ["MIG-…", …] in nvidia-smi -L order
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from access.shell import sh

# ---- profiles and fit -------------------------------------------------------------------------------------------

# A profile name as `nvidia-smi mig -lgip` prints it (the stack's `gpus[].mig` entries are checked against it).
PROFILE_RE = re.compile(r"^[1-8]g\.[0-9]+gb(\+me)?$")


@dataclass(frozen=True)
class Profile:
    compute_slices: int  # the N of Ng
    memory_slices: int
    max_instances: int  # instances of it that fit an empty GPU (-lgip Free/Total on an empty GPU)


@dataclass(frozen=True)
class ProfileTable:
    """What ``nvidia-smi mig -lgip`` says of an empty GPU of one model: its slices and its profiles by name."""

    gpu: str
    compute_slices: int
    memory_slices: int
    profiles: dict[str, Profile]


def _table(gpu: str, rows: dict[str, tuple[int, int, int]], compute: int = 7, memory: int = 8) -> ProfileTable:
    return ProfileTable(gpu, compute, memory, {k: Profile(*v) for k, v in rows.items()})


def _seven_slices(gpu: str, gb_1: str, gb_2: str, gb_4: str, gb_8: str) -> ProfileTable:
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


# From `nvidia-smi mig -lgip` on empty GPUs (NVIDIA MIG user guide, "Supported MIG profiles"); the H200 table is
# checked against the real capture in tests/fixtures/nvidia.
TABLES: tuple[ProfileTable, ...] = (
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


def _family(model: str) -> Optional[str]:
    return next((k for k in _FAMILY if k.lower() in model.lower()), None)


def has_mig(model: str) -> bool:
    """Whether GPUs of this model can be cut into MIG instances (``"NVIDIA H200"`` → True, ``"L40S"`` → False)."""
    return _family(model) is not None


_LGIP_ROW = re.compile(r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+\d+\s+(\d+)/(\d+)\s+([0-9.]+)\s+")


def tables_from_lgip(text: str, gpu: str = "captured") -> dict[int, ProfileTable]:
    """`nvidia-smi mig -lgip` of empty GPUs → {gpu index: ProfileTable}; memory slices from each profile's share of
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
        out[idx] = ProfileTable(
            gpu,
            compute,
            memory,
            {n: Profile(c, max(1, round(mem / slice_gib)), total) for n, (c, mem, total) in profs.items()},
        )
    return out


def _problems(table: ProfileTable, layout: list[str]) -> list[str]:
    unknown = [p for p in layout if p not in table.profiles]
    if unknown:
        return [f"{table.gpu} has no MIG profile {unknown[0]!r} (it has {', '.join(table.profiles)})"]
    out = []
    for name, n in Counter(layout).items():
        if n > table.profiles[name].max_instances:
            out.append(f"{n} x {name} but at most {table.profiles[name].max_instances} fit a {table.gpu}")
    compute = sum(table.profiles[p].compute_slices for p in layout)
    memory = sum(table.profiles[p].memory_slices for p in layout)
    if compute > table.compute_slices:
        out.append(f"the layout needs {compute} of {table.compute_slices} compute slices of a {table.gpu}")
    if memory > table.memory_slices:
        out.append(f"the layout needs {memory} of {table.memory_slices} memory slices of a {table.gpu}")
    return out


def layout_problems(model: str, layout: list[str]) -> list[str]:
    """Why `layout` cannot be created on a GPU of this model ([] when it fits, or when the model is not known:
    the MigLayout provider still checks against the GPU's own -lgip).

    A layout fits when every profile is one this GPU has, no profile is asked for more often than its
    ``max_instances``, and the slices add up. (The driver's placement rules are finer; a layout that passes here
    can still be refused by ``nvidia-smi mig -cgi``, but one refused here can never be created.)"""
    key = _family(model)
    if key is None:
        return []
    tables = [t for t in TABLES if t.gpu in _FAMILY[key]]
    # A100 comes in 40 and 80 GB with different profile names: judge by the table that knows the most of them.
    table = max(tables, key=lambda t: sum(p in t.profiles for p in layout))
    return _problems(table, layout)


# ---- the GPUs' state, read in one round trip --------------------------------------------------------------------

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
    profile_ids: dict[str, int] = field(default_factory=dict)  # "3g.71gb" -> profile ID on this GPU model
    instances: list[str] = field(default_factory=list)  # the profile of each GPU instance present
    uuids: list[tuple[str, str]] = field(default_factory=list)  # (profile, MIG UUID) of each instance, -L order


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


def parse_profile_ids(text: str) -> dict[int, dict[str, int]]:
    """``nvidia-smi mig -lgip`` → {gpu index: {profile: profile ID}}."""
    out: dict[int, dict[str, int]] = {}
    for line in text.splitlines():
        m = _PROFILE_ROW.match(line)
        if m:
            out.setdefault(int(m.group(1)), {})[m.group(2)] = int(m.group(3))
    return out


_INSTANCE_ROW = re.compile(r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+\d+:\d+\s+\|")


def parse_instances(text: str) -> dict[int, list[str]]:
    """``nvidia-smi mig -lgi`` → {gpu index: [profile of each GPU instance]}."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = _INSTANCE_ROW.match(line)
        if m:
            out.setdefault(int(m.group(1)), []).append(m.group(2))
    return out


_GPU_LINE = re.compile(r"^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-f-]+)\)")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[0-9a-f-]+)\)")


def parse_uuids(text: str) -> dict[int, list[tuple[str, str]]]:
    """``nvidia-smi -L`` → {gpu index: [(profile, MIG UUID) of each instance, ...]}."""
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
    ids, instances = parse_profile_ids(s.get("LGIP", "")), parse_instances(s.get("LGI", ""))
    uuids = parse_uuids(s.get("LIST", ""))
    for g in gpus:
        g.profile_ids = ids.get(g.index, {})
        g.instances = instances.get(g.index, [])
        g.uuids = uuids.get(g.index, [])
    return gpus


# ---- the plan ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    why: str
    command: str
    needs_reset: bool = False


def plan_layout(gpus: list[Gpu], layout: dict[int, list[str]]) -> list[Action]:
    """Actions that bring each GPU in ``layout`` to its list of profiles ([] = MIG off).

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
        if gpu.profile_ids:
            unknown = [p for p in wanted if p not in gpu.profile_ids]
            if unknown:
                raise ValueError(
                    f"GPU {index} ({gpu.name}) has no MIG profile {unknown[0]!r}; it offers {sorted(gpu.profile_ids)}"
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
        ids = ",".join(str(gpu.profile_ids[p]) if p in gpu.profile_ids else p for p in wanted)
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


def instance_uuids(gpus: list[Gpu], index: int) -> list[str]:
    """The MIG UUIDs of a GPU's instances, in ``nvidia-smi -L`` order, for binding Triton instances."""
    for g in gpus:
        if g.index == index:
            return [u for _, u in g.uuids]
    return []
