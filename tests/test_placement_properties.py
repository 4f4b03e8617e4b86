"""Property tests: on generated hosts and requests, every placement keeps every invariant,
and every refusal names a real shortage."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plans.placement import Cpu, Device, Host, Node, PlacementError, VmRequest, place


@st.composite
def hosts(draw):
    sockets = draw(st.integers(1, 2))
    nodes_per_socket = draw(st.integers(1, 2))
    cores = draw(st.integers(2, 10)) * nodes_per_socket
    tpc = draw(st.integers(1, 2))
    adjacent = draw(st.booleans())  # AMD-style numbering (siblings n, n+1) or Intel-style (n, n+cores)
    total = sockets * cores
    cpus = []
    for s in range(sockets):
        for c in range(cores):
            for t in range(tpc):
                cid = (s * cores + c) * tpc + t if adjacent else t * total + s * cores + c
                cpus.append(
                    Cpu(
                        id=cid,
                        core=c,
                        socket=s,
                        node=s * nodes_per_socket + c * nodes_per_socket // cores,
                        online=draw(st.integers(0, 9)) > 0 or cid == 0,
                        isolated=False,
                    )
                )
    ids = [c.id for c in cpus]
    if draw(st.booleans()):
        iso = {i for i in ids if draw(st.integers(0, 3)) > 0}
        cpus = [Cpu(c.id, c.core, c.socket, c.node, c.online, c.id in iso) for c in cpus]
    reserved = frozenset(draw(st.lists(st.sampled_from(ids), max_size=3)))
    n_nodes = sockets * nodes_per_socket
    nodes = tuple(
        Node(
            id=n,
            memory_free_mib=draw(st.integers(0, 4)) * 8192,
            hugepages_free={"1G": draw(st.integers(0, 4)) * 8, "2M": draw(st.integers(0, 4)) * 2048},
        )
        for n in range(n_nodes)
    )
    devices = tuple(
        Device(f"0000:{b:02x}:00.0", draw(st.integers(-1 if n_nodes == 1 else 0, n_nodes - 1)))
        for b in range(draw(st.integers(0, 6)))
    )
    return Host(cpus=tuple(sorted(cpus, key=lambda c: c.id)), nodes=nodes, devices=devices, reserved_cpus=reserved)


@st.composite
def scenarios(draw):
    host = draw(hosts())
    free_devs = [d.address for d in host.devices]
    reqs = []
    for i in range(draw(st.integers(1, 5))):
        devs = draw(st.lists(st.sampled_from(free_devs), max_size=2, unique=True)) if free_devs else []
        free_devs = [d for d in free_devs if d not in devs]
        page = draw(st.sampled_from(["1G", "2M", "4K"]))
        reqs.append(
            VmRequest(
                name=f"vm{i}",
                vcpus=draw(st.integers(1, 4)) * draw(st.sampled_from([1, 2])),
                memory_mib=draw(st.integers(1, 4)) * 1024,
                page_size=page,
                gpus=tuple(devs[:1]),
                vfs=tuple(devs[1:]),
                thread_policy=draw(st.sampled_from(["prefer", "require", "isolate"])),
                emulator_threads=draw(st.sampled_from(["share", "isolate"])),
                iothreads=draw(st.integers(0, 3)),
                numa_policy=draw(st.sampled_from(["required", "preferred", "socket"])),
            )
        )
    return host, reqs


def check_invariants(host: Host, reqs, plan):
    cpu = {c.id: c for c in host.cpus}
    core_of = {c.id: (c.socket, c.core) for c in host.cpus}
    dev_node = {d.address: d.numa_node for d in host.devices}
    any_isolated = any(c.isolated for c in host.cpus)
    owner: dict[int, str] = {}
    core_owner: dict[tuple[int, int], str] = {}
    assert [v.name for v in plan.vms] == [r.name for r in reqs]
    for r, v in zip(reqs, plan.vms):
        held = set(v.held_cpus)
        for c in held:
            assert c not in owner, f"cpu {c} given to {owner[c]} and {v.name}"
            owner[c] = v.name
            assert c not in host.reserved_cpus
            assert cpu[c].online and cpu[c].node == v.node
            assert cpu[c].isolated or not any_isolated
            # siblings of one core never split across VMs
            assert core_owner.setdefault(core_of[c], v.name) == v.name, f"core {core_of[c]} split"
        assert len(v.vcpupin) == r.vcpus == len(set(v.vcpupin))
        assert set(v.vcpupin) <= held
        t = v.topology
        assert t.sockets * t.cores * t.threads == r.vcpus
        for k in range(0, r.vcpus, t.threads):
            assert len({core_of[c] for c in v.vcpupin[k : k + t.threads]}) == 1, "guest core spans host cores"
        if r.thread_policy == "isolate":
            assert len({core_of[c] for c in v.vcpupin}) == r.vcpus
        if r.thread_policy == "require":
            assert t.threads >= 2
        assert len(v.iothreadpin) == r.iothreads
        if r.emulator_threads == "isolate":
            assert set(v.emulatorpin) <= held and not set(v.emulatorpin) & set(v.vcpupin)
            assert not {core_of[c] for c in v.emulatorpin} & {core_of[c] for c in v.vcpupin}
            for cs in v.iothreadpin:
                assert set(cs) <= held and not set(cs) & set(v.vcpupin)
        else:
            reserve = {c for c in host.reserved_cpus if cpu[c].node == v.node and cpu[c].online}
            assert set(v.emulatorpin) in (reserve, set(v.vcpupin))
        # a single-node host's devices often report NUMA node -1: they are on that node
        nodes = {0 if len(host.nodes) == 1 and dev_node[a] < 0 else dev_node[a] for a in r.gpus + r.vfs}
        if nodes and r.numa_policy == "required":
            assert nodes == {v.node}
        if nodes and r.numa_policy == "socket":
            sock = {c.socket for c in host.cpus if c.node == v.node}
            assert sock == {c.socket for c in host.cpus if c.node in nodes}
    # no memory / hugepage overcommit per node
    for n in host.nodes:
        on = [v for v in plan.vms if v.node == n.id]
        assert sum(v.memory_mib for v in on if v.page_size == "4K") <= n.memory_free_mib
        assert sum(v.memory_mib // 1024 for v in on if v.page_size == "1G") <= n.hugepages_free.get("1G", 0)
        assert sum(v.memory_mib // 2 for v in on if v.page_size == "2M") <= n.hugepages_free.get("2M", 0)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_placement_keeps_the_invariants_and_every_refusal_is_explained(scenario):
    host, reqs = scenario
    try:
        plan = place(host, reqs)
    except PlacementError as e:
        assert e.vm in {r.name for r in reqs}
        assert e.shortages or e.reason
        for s in e.shortages:
            assert s.need > s.free, s
            assert s.node in {n.id for n in host.nodes}
        # the VMs before the failing one do fit on their own: the error is about this VM
        before = reqs[: [r.name for r in reqs].index(e.vm)]
        check_invariants(host, before, place(host, before))
        return
    check_invariants(host, reqs, plan)
    assert place(host, reqs) == plan  # deterministic


@settings(max_examples=150, deadline=None)
@given(hosts())
def test_a_single_small_vm_fits_whenever_one_free_core_and_memory_exist(host):
    """Completeness check for the easy case: the solver does not refuse what plainly fits."""
    any_isolated = any(c.isolated for c in host.cpus)
    req = VmRequest("solo", vcpus=1, memory_mib=512, page_size="4K", thread_policy="prefer", emulator_threads="share")
    fits = any(
        n.memory_free_mib >= 512
        and any(
            c.node == n.id and c.online and c.id not in host.reserved_cpus and (c.isolated or not any_isolated)
            for c in host.cpus
        )
        for n in host.nodes
    )
    try:
        place(host, [req])
        assert fits
    except PlacementError:
        assert not fits
