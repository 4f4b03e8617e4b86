"""NUMA placement of a host's tenant VMs: which host CPUs, node and hugepages each VM gets.

Seed 002's rule in code: a tenant VM's vCPUs and memory live on the NUMA node of its GPU, vCPUs are pinned
sibling-paired (two threads of one core to two vCPUs of one guest core), emulator and IO threads stay off the
VM's vCPU cores, memory comes from hugepages of that node, and a core's sibling threads never serve two VMs
("避免把同一物理核的两个超线程分给不同 VM").

The solver is pure and deterministic: `place(host, requests)` returns a `HostPlacement` or raises
`PlacementError`, naming the node, the resource, what was needed and what was free.

Rules (each one a deliberate choice, see the docstrings below for the details):

* A VM gets whole cores: every thread of a core it touches belongs to it, used or idle.
* One VM lives on one NUMA node (the guest sees a single cell; numatune is strict on that node).
* VMs are placed in request order, so appending a VM never moves the ones before it.
* If the host has isolated CPUs (`isolcpus=`), guests get only isolated CPUs: the operator marked them as the
  guests' pool. Otherwise every online CPU not in the host reserve is a guest CPU.
* `thread_policy` as Nova's `hw:cpu_thread_policy`:
    - prefer: pack vCPUs onto sibling threads where the node has SMT, guest sees threads when they divide evenly;
    - require: the node must have SMT and the vCPU count must fill whole cores; guest sees the host's threads;
    - isolate: one vCPU per core, the core's other threads stay idle (held by the VM so nobody else lands there).
* `emulator_threads` as Nova's `hw:emulator_threads_policy`:
    - share: emulator and IO threads float on the host reserve of the VM's node (Nova's `cpu_shared_set`),
      or on the VM's own vCPUs when that node has no reserve;
    - isolate: the VM gets one more whole core for the emulator, and ceil(iothreads / threads-per-core) more
      cores for its IO threads (seed 002: `iothreadpin` and `emulatorpin` on separate cores).
* Device NUMA policy (`numa_policy`), as Nova's PCI NUMA affinity policies:
    - required: the VM must sit on the node of its devices (all of them on one node);
    - preferred: that node if it fits, else the node with the most free CPUs that fits;
    - socket: any node of the devices' socket.

Example:
    >>> host = Host.uniform(sockets=2, cores_per_socket=2, threads_per_core=2, memory_mib=8192,
    ...                     hugepages_1g=4, devices={"0000:65:00.0": 1})
    >>> plan = place(host, [VmRequest(name="a", vcpus=2, memory_mib=2048, gpus=("0000:65:00.0",))])
    >>> plan.vm("a").node, plan.vm("a").vcpupin
    (1, (2, 6))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping, Sequence

from facts.cpulist import format_cpulist

PageSize = Literal["1G", "2M", "4K"]
ThreadPolicy = Literal["prefer", "require", "isolate"]
EmulatorPolicy = Literal["share", "isolate"]
NumaPolicy = Literal["required", "preferred", "socket"]

PAGE_KIB: dict[str, int] = {"1G": 1024 * 1024, "2M": 2048, "4K": 4}


# ---------------------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class Cpu:
    """One logical CPU. `core` is the core id inside its socket (lscpu's CORE column may repeat per socket)."""

    id: int
    core: int
    socket: int
    node: int
    online: bool = True
    isolated: bool = False


@dataclass(frozen=True, slots=True)
class Node:
    """One NUMA node's memory. `memory_free_mib` is ordinary (4K) memory; `hugepages_free` maps page size → count."""

    id: int
    memory_free_mib: int
    hugepages_free: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Device:
    """A PCI function that a VM may take; `numa_node` -1 means the firmware did not say."""

    address: str
    numa_node: int


@dataclass(frozen=True, slots=True)
class Host:
    """The solver's view of a host. `siblings` groups CPU ids per core; derived from (socket, core) if empty."""

    cpus: tuple[Cpu, ...]
    nodes: tuple[Node, ...]
    devices: tuple[Device, ...] = ()
    reserved_cpus: frozenset[int] = frozenset()
    siblings: tuple[tuple[int, ...], ...] = ()

    @staticmethod
    def uniform(
        *,
        sockets: int,
        cores_per_socket: int,
        threads_per_core: int,
        memory_mib: int,
        hugepages_1g: int = 0,
        hugepages_2m: int = 0,
        nodes_per_socket: int = 1,
        devices: Mapping[str, int] | None = None,
        reserved_cpus: Iterable[int] = (),
    ) -> "Host":
        """A regular host numbered like Linux does on Intel: thread t of core c in socket s is
        `t * sockets * cores + s * cores + c` (so CPU 0 and CPU 32 are siblings on a 2×16×2 box).

        Memory and hugepages are per node.
        """
        total_cores = sockets * cores_per_socket
        cores_per_node = cores_per_socket // nodes_per_socket
        cpus = []
        for t in range(threads_per_core):
            for s in range(sockets):
                for c in range(cores_per_socket):
                    cpu_id = t * total_cores + s * cores_per_socket + c
                    node = s * nodes_per_socket + c // cores_per_node
                    cpus.append(Cpu(id=cpu_id, core=c, socket=s, node=node))
        cpus.sort(key=lambda c: c.id)
        nodes = tuple(
            Node(id=n, memory_free_mib=memory_mib, hugepages_free={"1G": hugepages_1g, "2M": hugepages_2m})
            for n in range(sockets * nodes_per_socket)
        )
        devs = tuple(Device(address=a, numa_node=n) for a, n in sorted((devices or {}).items()))
        return Host(cpus=tuple(cpus), nodes=nodes, devices=devs, reserved_cpus=frozenset(reserved_cpus))


@dataclass(frozen=True, slots=True)
class VmRequest:
    """What one tenant VM asks for.

    Args:
        name: the VM (domain) name, unique per host.
        vcpus: guest vCPUs.
        memory_mib: guest memory; with hugepages it must be a whole number of pages.
        page_size: "1G" or "2M" hugepages (seed 002 prefers 1G for inference), or "4K" (no hugepages).
        gpus: PCI addresses of every function of the VM's GPUs (GPU and its audio function).
        vfs: PCI addresses of SR-IOV VFs for the VM.
        thread_policy: prefer / require / isolate (see module docstring).
        emulator_threads: share / isolate.
        iothreads: number of QEMU IO threads.
        numa_policy: required / preferred / socket, for the devices' NUMA affinity.
    """

    name: str
    vcpus: int
    memory_mib: int
    page_size: PageSize = "1G"
    gpus: tuple[str, ...] = ()
    vfs: tuple[str, ...] = ()
    thread_policy: ThreadPolicy = "prefer"
    emulator_threads: EmulatorPolicy = "isolate"
    iothreads: int = 0
    numa_policy: NumaPolicy = "required"


# ---------------------------------------------------------------------------------------------------- outputs


@dataclass(frozen=True, slots=True)
class GuestTopology:
    sockets: int
    cores: int
    threads: int


@dataclass(frozen=True, slots=True)
class VmPlacement:
    """Where one VM goes. `vcpupin[i]` is the host CPU of vCPU i; `iothreadpin[i]` the cpuset of IO thread i+1."""

    name: str
    node: int
    vcpupin: tuple[int, ...]
    emulatorpin: tuple[int, ...]
    iothreadpin: tuple[tuple[int, ...], ...]
    memory_mib: int
    page_size: PageSize
    topology: GuestTopology
    held_cpus: tuple[int, ...]
    """Every host CPU this VM owns: its vCPUs' CPUs, their idle siblings and its emulator/IO thread cores."""

    @property
    def numatune(self) -> tuple[str, str]:
        """(mode, nodeset) for libvirt's `<numatune><memory .../>`."""
        return ("strict", str(self.node))


@dataclass(frozen=True, slots=True)
class Shortage:
    node: int
    resource: str
    need: int
    free: int

    def __str__(self) -> str:
        return f"node {self.node}: {self.resource} need {self.need}, free {self.free}"


class PlacementError(ValueError):
    """A VM cannot be placed. `shortages` names node, resource, need and free for each node tried."""

    def __init__(self, vm: str, shortages: Sequence[Shortage] = (), reason: str = ""):
        self.vm = vm
        self.shortages = tuple(shortages)
        self.reason = reason
        detail = "; ".join(str(s) for s in self.shortages)
        parts = [p for p in (reason, detail) if p]
        super().__init__(f"VM {vm!r} does not fit: " + " | ".join(parts))


@dataclass(frozen=True, slots=True)
class HostPlacement:
    vms: tuple[VmPlacement, ...]
    host: Host

    def vm(self, name: str) -> VmPlacement:
        for v in self.vms:
            if v.name == name:
                return v
        raise KeyError(name)

    def report(self) -> str:
        """Per node: every CPU and who holds it (a VM, `host` for the reserve, `-` free, `off` offline),
        then memory/hugepages left. Example line: `node 1  cpus 16-31,48-63` then `  16 tenant-a (vcpu 0)`."""
        owner: dict[int, str] = {}
        shared: dict[int, list[str]] = {}
        for v in self.vms:
            held = set(v.held_cpus)
            for c in held:
                owner[c] = f"{v.name} (idle sibling)"
            for i, cs in enumerate(v.iothreadpin):
                for c in cs:
                    if c in held:
                        owner[c] = f"{v.name} (iothread {i + 1})"
            for c in v.emulatorpin:
                if c in held:
                    owner[c] = f"{v.name} (emulator)"
                else:
                    shared.setdefault(c, []).append(v.name)
            for i, c in enumerate(v.vcpupin):
                owner[c] = f"{v.name} (vcpu {i})"
        used_mem = _memory_use(self.vms)
        lines = []
        by_node: dict[int, list[Cpu]] = {}
        for cpu in self.host.cpus:
            by_node.setdefault(cpu.node, []).append(cpu)
        for node in self.host.nodes:
            cpus = by_node.get(node.id, [])
            lines.append(f"node {node.id}  cpus {cpuset_str(cpu.id for cpu in cpus)}")
            for cpu in sorted(cpus, key=lambda cpu: cpu.id):
                if cpu.id in owner:
                    who = owner[cpu.id]
                elif not cpu.online:
                    who = "off"
                elif cpu.id in self.host.reserved_cpus:
                    who = "host" + (f" (emulator of {', '.join(shared[cpu.id])})" if cpu.id in shared else "")
                else:
                    who = "-"
                lines.append(f"  cpu {cpu.id:>3} core {cpu.socket}/{cpu.core:<3} {who}")
            mem = used_mem.get(node.id, {})
            free = [f"4K {node.memory_free_mib - mem.get('4K', 0)} MiB free"]
            for size in ("1G", "2M"):
                have = node.hugepages_free.get(size, 0)
                if have or mem.get(size):
                    free.append(f"{size} pages {have - mem.get(size, 0)}/{have} free")
            lines.append("  memory: " + ", ".join(free))
        return "\n".join(lines) + "\n"


def cpuset_str(cpus: Iterable[int]) -> str:
    """`[0,1,2,5]` → `"0-2,5"` (libvirt's cpuset syntax is the kernel's cpulist)."""
    return format_cpulist(cpus)


def parse_cpuset(text: str) -> tuple[int, ...]:
    """`"0-2,5"` → `(0, 1, 2, 5)`; libvirt's `^n` exclusions are honoured."""
    keep: set[int] = set()
    drop: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        target = drop if part.startswith("^") else keep
        part = part.lstrip("^")
        if "-" in part:
            a, b = part.split("-")
            target.update(range(int(a), int(b) + 1))
        else:
            target.add(int(part))
    return tuple(sorted(keep - drop))


def _memory_use(vms: Iterable[VmPlacement]) -> dict[int, dict[str, int]]:
    use: dict[int, dict[str, int]] = {}
    for v in vms:
        per = use.setdefault(v.node, {})
        if v.page_size == "4K":
            per["4K"] = per.get("4K", 0) + v.memory_mib
        else:
            per[v.page_size] = per.get(v.page_size, 0) + v.memory_mib * 1024 // PAGE_KIB[v.page_size]
    return use


# ---------------------------------------------------------------------------------------------------- solver


class _Core:
    """A core's free threads, in CPU id order. Mutable scratch state of one `place` call."""

    __slots__ = ("key", "threads", "free", "smt")

    def __init__(self, key: tuple[int, int], threads: list[int], free: list[int]):
        self.key = key
        self.threads = threads
        self.free = free
        self.smt = len(threads)


class _NodeState:
    __slots__ = ("id", "socket", "cores", "reserve", "mem4k", "pages", "tpc")

    def __init__(self, node: Node, socket: int):
        self.id = node.id
        self.socket = socket
        self.cores: list[_Core] = []
        self.reserve: list[int] = []
        self.mem4k = node.memory_free_mib
        self.pages = {"1G": node.hugepages_free.get("1G", 0), "2M": node.hugepages_free.get("2M", 0)}
        self.tpc = 1

    def free_cores(self) -> list[_Core]:
        return [c for c in self.cores if c.free]

    def free_cpu_count(self) -> int:
        return sum(len(c.free) for c in self.cores if c.free)


def _build(host: Host) -> dict[int, _NodeState]:
    by_id = {c.id: c for c in host.cpus}
    groups: list[tuple[int, ...]]
    if host.siblings:
        groups = [tuple(sorted(g)) for g in host.siblings]
    else:
        keyed: dict[tuple[int, int], list[int]] = {}
        for c in host.cpus:
            keyed.setdefault((c.socket, c.core), []).append(c.id)
        groups = [tuple(sorted(v)) for v in keyed.values()]
    any_isolated = any(c.isolated for c in host.cpus)
    node_socket: dict[int, int] = {}
    for c in host.cpus:
        node_socket.setdefault(c.node, c.socket)
    states = {n.id: _NodeState(n, node_socket.get(n.id, 0)) for n in host.nodes}
    for g in sorted(groups):
        first = by_id[g[0]]
        st = states.get(first.node)
        if st is None:
            continue
        usable = []
        for cid in g:
            c = by_id[cid]
            if not c.online:
                continue
            if cid in host.reserved_cpus:
                st.reserve.append(cid)
            elif c.isolated or not any_isolated:
                usable.append(cid)
        st.cores.append(_Core((first.socket, first.core), list(g), usable))
        st.tpc = max(st.tpc, len(g))
    for st in states.values():
        st.reserve.sort()
    return states


def _need_pages(req: VmRequest) -> int:
    if req.page_size == "4K":
        return req.memory_mib
    return req.memory_mib * 1024 // PAGE_KIB[req.page_size]


def _validate(req: VmRequest) -> None:
    if req.vcpus < 1:
        raise PlacementError(req.name, reason="vcpus must be at least 1")
    if req.page_size not in PAGE_KIB:
        raise PlacementError(req.name, reason=f"page size {req.page_size!r} is not one of 1G, 2M, 4K")
    if req.memory_mib < 1 or (req.memory_mib * 1024) % PAGE_KIB[req.page_size]:
        raise PlacementError(
            req.name, reason=f"memory {req.memory_mib} MiB is not a whole number of {req.page_size} pages"
        )
    if req.iothreads < 0:
        raise PlacementError(req.name, reason="iothreads must be >= 0")


def _pick_vcpu_cores(st: _NodeState, req: VmRequest) -> tuple[list[_Core], list[int], int] | Shortage:
    """Cores for the vCPUs: (cores, vcpu→cpu list, guest threads per core) or the shortage."""
    n = req.vcpus
    free = st.free_cores()
    if req.thread_policy == "isolate":
        if len(free) < n:
            return Shortage(st.id, "cores (thread_policy=isolate)", n, len(free))
        cores = free[:n]
        return cores, [c.free[0] for c in cores], 1
    full = [c for c in free if len(c.free) == c.smt]
    if req.thread_policy == "require":
        tpc = st.tpc
        if tpc < 2:
            return Shortage(st.id, "SMT threads per core (thread_policy=require)", 2, tpc)
        if n % tpc:
            raise PlacementError(
                req.name,
                reason=f"thread_policy=require: {n} vCPUs do not fill whole {tpc}-thread cores on node {st.id}",
            )
        want = n // tpc
        full = [c for c in full if c.smt == tpc]
        if len(full) < want:
            return Shortage(st.id, f"whole {tpc}-thread cores (thread_policy=require)", want, len(full))
        cores = full[:want]
        return cores, [t for c in cores for t in c.free][:n], tpc
    # prefer: whole cores first (sibling pairs), then partial cores with the most free threads.
    partial = sorted((c for c in free if len(c.free) < c.smt), key=lambda c: -len(c.free))
    cores = []
    cpus: list[int] = []
    for c in full + partial:
        if len(cpus) >= n:
            break
        cores.append(c)
        cpus.extend(c.free)
    if len(cpus) < n:
        return Shortage(st.id, "cpus", n, len(cpus))
    cpus = cpus[:n]
    tpc = len(cores[0].free) if cores else 1
    uniform = all(len(c.free) == tpc for c in cores) and n % tpc == 0
    return cores, cpus, tpc if uniform else 1


def _try_node(st: _NodeState, req: VmRequest) -> VmPlacement | list[Shortage]:
    shortages: list[Shortage] = []
    pages = _need_pages(req)
    have = st.mem4k if req.page_size == "4K" else st.pages[req.page_size]
    if have < pages:
        unit = "memory MiB (4K pages)" if req.page_size == "4K" else f"{req.page_size} hugepages"
        shortages.append(Shortage(st.id, unit, pages, have))
    picked = _pick_vcpu_cores(st, req)
    if isinstance(picked, Shortage):
        shortages.append(picked)
        return shortages
    cores, vcpus, threads = picked
    extra_needed = 0
    if req.emulator_threads == "isolate":
        extra_needed = 1 + (-(-req.iothreads // max(st.tpc, 1)) if req.iothreads else 0)
    taken = {id(c) for c in cores}
    rest = [c for c in st.free_cores() if id(c) not in taken]
    # Housekeeping cores: whole cores first so the emulator never shares a core with nobody-knows-what.
    rest.sort(key=lambda c: (len(c.free) != c.smt,))
    if len(rest) < extra_needed:
        shortages.append(
            Shortage(
                st.id,
                "cores for vcpus+emulator/iothreads (emulator_threads=isolate)",
                len(cores) + extra_needed,
                len(cores) + len(rest),
            )
        )
    if shortages:
        return shortages
    extra = rest[:extra_needed]
    if req.emulator_threads == "isolate":
        emulator = tuple(extra[0].free)
        io_cpus = [t for c in extra[1:] for t in c.free]
        iothreadpin: tuple[tuple[int, ...], ...] = tuple((io_cpus[i % len(io_cpus)],) for i in range(req.iothreads))
    else:
        emulator = tuple(st.reserve) if st.reserve else tuple(sorted(vcpus))
        iothreadpin = tuple(emulator for _ in range(req.iothreads))
    held = tuple(sorted(t for c in cores + extra for t in c.free))
    for c in cores + extra:
        c.free = []
    if req.page_size == "4K":
        st.mem4k -= pages
    else:
        st.pages[req.page_size] -= pages
    return VmPlacement(
        name=req.name,
        node=st.id,
        vcpupin=tuple(vcpus),
        emulatorpin=emulator,
        iothreadpin=iothreadpin,
        memory_mib=req.memory_mib,
        page_size=req.page_size,
        topology=GuestTopology(sockets=1, cores=req.vcpus // threads, threads=threads),
        held_cpus=held,
    )


def _candidates(
    req: VmRequest, states: dict[int, _NodeState], devices: dict[str, Device]
) -> tuple[list[_NodeState], str]:
    """Nodes to try, in order, and a reason when none qualifies."""
    addrs = req.gpus + req.vfs
    missing = [a for a in addrs if a not in devices]
    if missing:
        return [], f"device(s) {', '.join(missing)} not on this host"
    single_node = len(states) == 1
    dev_nodes = sorted({(0 if single_node and devices[a].numa_node < 0 else devices[a].numa_node) for a in addrs})
    # Most free CPUs first, then lowest id: spreads VMs without device affinity over nodes, deterministically.
    by_room = sorted(states.values(), key=lambda s: (-s.free_cpu_count(), s.id))
    if not addrs:
        return by_room, ""
    if any(n < 0 for n in dev_nodes):
        unknown = [a for a in addrs if devices[a].numa_node < 0]
        if req.numa_policy == "preferred":
            return by_room, ""
        return [], f"NUMA node of {', '.join(unknown)} unknown, cannot honour numa_policy={req.numa_policy}"
    if req.numa_policy == "socket":
        sockets = {states[n].socket for n in dev_nodes if n in states}
        if len(sockets) != 1:
            return [], f"devices span sockets {sorted(sockets)}"
        return [s for s in by_room if s.socket in sockets], ""
    if len(dev_nodes) != 1:
        if req.numa_policy == "preferred":
            return by_room, ""
        return [], f"devices span NUMA nodes {dev_nodes}; numa_policy=required needs one node"
    home = states.get(dev_nodes[0])
    if home is None:
        return [], f"device NUMA node {dev_nodes[0]} has no CPUs/memory in the host facts"
    if req.numa_policy == "required":
        return [home], ""
    return [home] + [s for s in by_room if s is not home], ""


def place(host: Host, requests: Sequence[VmRequest]) -> HostPlacement:
    """Place `requests` on `host`, in order. Raises `PlacementError` for the first VM that cannot fit.

    Example:
        plan = place(host, [VmRequest("tenant-a", vcpus=8, memory_mib=32768, gpus=("0000:65:00.0",))])
        print(plan.report())
    """
    states = _build(host)
    devices = {d.address: d for d in host.devices}
    seen_names: set[str] = set()
    seen_devs: dict[str, str] = {}
    out: list[VmPlacement] = []
    for req in requests:
        _validate(req)
        if req.name in seen_names:
            raise PlacementError(req.name, reason="duplicate VM name")
        seen_names.add(req.name)
        for a in req.gpus + req.vfs:
            if a in seen_devs:
                raise PlacementError(req.name, reason=f"device {a} already given to VM {seen_devs[a]!r}")
            seen_devs[a] = req.name
        nodes, reason = _candidates(req, states, devices)
        if not nodes:
            raise PlacementError(req.name, reason=reason)
        shortages: list[Shortage] = []
        for st in nodes:
            got = _try_node(st, req)
            if isinstance(got, VmPlacement):
                out.append(got)
                break
            shortages.extend(got)
        else:
            raise PlacementError(req.name, shortages)
    return HostPlacement(vms=tuple(out), host=host)


# ---------------------------------------------------------------------------------------------------- (de)serialise


def host_to_dict(host: Host) -> dict:
    """Plain JSON-able form of a `Host` (used for fixtures and Pulumi inputs)."""
    return {
        "cpus": [[c.id, c.core, c.socket, c.node, int(c.online), int(c.isolated)] for c in host.cpus],
        "nodes": [
            {"id": n.id, "memory_free_mib": n.memory_free_mib, "hugepages_free": dict(n.hugepages_free)}
            for n in host.nodes
        ],
        "devices": {d.address: d.numa_node for d in host.devices},
        "reserved_cpus": sorted(host.reserved_cpus),
        "siblings": [list(g) for g in host.siblings],
    }


def host_from_dict(data: Mapping) -> Host:
    """Inverse of `host_to_dict`. CPU rows are `[id, core, socket, node, online, isolated]`."""
    return Host(
        cpus=tuple(
            Cpu(id=r[0], core=r[1], socket=r[2], node=r[3], online=bool(r[4]), isolated=bool(r[5]))
            for r in data["cpus"]
        ),
        nodes=tuple(
            Node(id=n["id"], memory_free_mib=n["memory_free_mib"], hugepages_free=dict(n.get("hugepages_free", {})))
            for n in data["nodes"]
        ),
        devices=tuple(Device(address=a, numa_node=n) for a, n in sorted(data.get("devices", {}).items())),
        reserved_cpus=frozenset(data.get("reserved_cpus", ())),
        siblings=tuple(tuple(g) for g in data.get("siblings", ())),
    )


def from_facts(facts, reserved_cpus: Iterable[int] = ()) -> Host:
    """The solver's `Host` from the typed host facts (`facts.model.HostFacts`).

    `reserved_cpus` is the host's own reserve (housekeeping, IRQs); it is configuration, not a fact.
    Node memory is `MemFree` of the node, which already excludes the hugepage pools; hugepages are the
    pools' free counts (1G = 1048576 kB, 2M = 2048 kB). Devices are every PCI function with its NUMA node.

    Example:
        host = from_facts(read_facts(conn), reserved_cpus=[0, 32])
    """
    online = set(facts.online) if facts.online else {c.id for c in facts.cpus}
    isolated = set(facts.isolated)
    cpus = tuple(
        Cpu(id=c.id, core=c.core, socket=c.socket, node=c.node, online=c.id in online, isolated=c.id in isolated)
        for c in sorted(facts.cpus, key=lambda c: c.id)
    )
    groups = sorted({tuple(sorted(set(c.siblings) | {c.id})) for c in facts.cpus})
    nodes = tuple(
        Node(
            id=n.id,
            memory_free_mib=n.mem_free_kb // 1024,
            hugepages_free={
                size: n.hugepages.get(kb, {}).get("free", 0) for size, kb in (("1G", 1048576), ("2M", 2048))
            },
        )
        for n in sorted(facts.nodes.values(), key=lambda n: n.id)
    )
    devices = tuple(Device(address=a, numa_node=d.numa_node) for a, d in sorted(facts.pci.items()))
    return Host(cpus=cpus, nodes=nodes, devices=devices, reserved_cpus=frozenset(reserved_cpus), siblings=tuple(groups))
