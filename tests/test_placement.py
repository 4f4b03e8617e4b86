"""Placement solver on the seeds' machines: facts in → pinning out, no SSH."""

import json
from pathlib import Path

import pytest

from plans.placement import (
    PlacementError,
    VmRequest,
    cpuset_str,
    host_from_dict,
    parse_cpuset,
    place,
)

FIX = Path(__file__).parent / "fixtures" / "placement"


def load(name):
    return host_from_dict(json.loads((FIX / f"{name}.json").read_text()))


def siblings_of(host):
    groups: dict[tuple, set] = {}
    for c in host.cpus:
        groups.setdefault((c.socket, c.core), set()).add(c.id)
    return {cpu: frozenset(g) for g in groups.values() for cpu in g}


def node_of(host):
    return {c.id: c.node for c in host.cpus}


def assert_sibling_paired(host, vm):
    sib = siblings_of(host)
    assert vm.topology.threads == 2
    for k in range(0, len(vm.vcpupin), 2):
        a, b = vm.vcpupin[k], vm.vcpupin[k + 1]
        assert a != b and b in sib[a], f"vcpu {k},{k + 1} on {a},{b}: not siblings"


def _seed002_tenant(name: str, gpu_bus: str, nic_bus: str) -> VmRequest:
    """Seed 002's tenant: 16 vCPUs, 64 GiB, both functions of the H200 on `gpu_bus`, the first VF of the ConnectX
    on `nic_bus`, two IO threads."""
    return VmRequest(
        name,
        vcpus=16,
        memory_mib=64 * 1024,
        gpus=(f"0000:{gpu_bus}:00.0", f"0000:{gpu_bus}:00.1"),
        vfs=(f"0000:{nic_bus}:02.0",),
        iothreads=2,
    )


def test_two_tenants_seed002_each_on_its_gpu_node_disjoint_and_sibling_paired():
    host = load("seed002_2x16c")
    plan = place(
        host,
        [
            _seed002_tenant("tenant-a", gpu_bus="65", nic_bus="41"),
            _seed002_tenant("tenant-b", gpu_bus="ca", nic_bus="c1"),
        ],
    )
    a, b = plan.vm("tenant-a"), plan.vm("tenant-b")
    nodes = node_of(host)
    assert a.node == 0 and b.node == 1
    assert {nodes[c] for c in a.held_cpus} == {0} and {nodes[c] for c in b.held_cpus} == {1}
    assert not set(a.held_cpus) & set(b.held_cpus)
    assert not set(a.held_cpus + b.held_cpus) & host.reserved_cpus
    assert_sibling_paired(host, a)
    assert_sibling_paired(host, b)
    assert (a.topology.sockets, a.topology.cores, a.topology.threads) == (1, 8, 2)
    # emulator and IO threads off the vCPU cores (seed 002: iothreadpin/emulatorpin on spare cores)
    for vm in (a, b):
        vcores = {siblings_of(host)[c] for c in vm.vcpupin}
        assert not {siblings_of(host)[c] for c in vm.emulatorpin} & vcores
        assert len(vm.iothreadpin) == 2
        assert not {siblings_of(host)[c] for cs in vm.iothreadpin for c in cs} & vcores
    assert a.numatune == ("strict", "0") and b.numatune == ("strict", "1")


@pytest.mark.parametrize(
    "fixture,gpu_a,gpu_b",
    [("seed004_l40s", "0000:4b:00.0", "0000:ca:00.0"), ("seed004_a10", "0000:17:00.0", "0000:31:00.0")],
)
def test_two_tenants_seed004_nodes(fixture, gpu_a, gpu_b):
    """L40S: one card per socket; A10: both tenants' cards on node 0, so they share a node but no core."""
    host = load(fixture)
    dev_node = {d.address: d.numa_node for d in host.devices}
    plan = place(
        host,
        [
            VmRequest("a", vcpus=8, memory_mib=32768, gpus=(gpu_a,)),
            VmRequest("b", vcpus=8, memory_mib=32768, gpus=(gpu_b,)),
        ],
    )
    a, b = plan.vm("a"), plan.vm("b")
    assert a.node == dev_node[gpu_a] and b.node == dev_node[gpu_b]
    assert not set(a.held_cpus) & set(b.held_cpus)
    sib = siblings_of(host)
    assert not {sib[c] for c in a.held_cpus} & {sib[c] for c in b.held_cpus}, "a core split across VMs"
    assert_sibling_paired(host, a)
    assert_sibling_paired(host, b)


def test_over_asking_tenant_names_node_resource_need_free():
    host = load("seed002_2x16c")
    # node 1 has 15 cores left after the host reserve: 30 threads, minus a core for the emulator.
    with pytest.raises(PlacementError) as err:
        place(host, [VmRequest("greedy", vcpus=40, memory_mib=8192, gpus=("0000:ca:00.0",))])
    e = err.value
    assert e.vm == "greedy"
    (short,) = e.shortages
    assert (short.node, short.resource, short.need, short.free) == (1, "cpus", 40, 30)
    assert "node 1: cpus need 40, free 30" in str(e)


def test_hugepage_overcommit_is_refused_with_numbers():
    host = load("seed002_2x16c")
    reqs = [
        VmRequest("a", vcpus=4, memory_mib=100 * 1024, gpus=("0000:65:00.0",)),
        VmRequest("b", vcpus=4, memory_mib=30 * 1024, vfs=("0000:41:02.1",)),
    ]
    with pytest.raises(PlacementError) as err:
        place(host, reqs)
    (short,) = err.value.shortages
    assert (short.node, short.resource, short.need, short.free) == (0, "1G hugepages", 30, 20)


def test_preferred_policy_falls_back_to_another_node_required_does_not():
    host = load("seed002_2x16c")
    big = VmRequest("big", vcpus=24, memory_mib=4096, vfs=("0000:41:02.0",))
    small_req = VmRequest("small", vcpus=12, memory_mib=4096, gpus=("0000:65:00.0",), numa_policy="required")
    with pytest.raises(PlacementError) as err:
        place(host, [big, small_req])
    assert err.value.shortages[0].node == 0
    small_pref = VmRequest("small", vcpus=12, memory_mib=4096, gpus=("0000:65:00.0",), numa_policy="preferred")
    plan = place(host, [big, small_pref])
    assert plan.vm("big").node == 0 and plan.vm("small").node == 1
    small_sock = VmRequest("small", vcpus=12, memory_mib=4096, gpus=("0000:65:00.0",), numa_policy="socket")
    with pytest.raises(PlacementError):
        place(host, [big, small_sock])


def test_thread_policies():
    host = load("seed004_a10")
    sib = siblings_of(host)
    plan = place(
        host,
        [
            VmRequest("iso", vcpus=4, memory_mib=4096, gpus=("0000:17:00.0",), thread_policy="isolate"),
            VmRequest("req", vcpus=4, memory_mib=4096, gpus=("0000:31:00.0",), thread_policy="require"),
            VmRequest("odd", vcpus=3, memory_mib=4096, gpus=("0000:b1:00.0",), thread_policy="prefer"),
        ],
    )
    iso = plan.vm("iso")
    assert len({sib[c] for c in iso.vcpupin}) == 4 and iso.topology.threads == 1
    # the idle siblings of an isolated vCPU's core are held, so nobody else lands there
    assert all(sib[c] <= set(iso.held_cpus) for c in iso.vcpupin)
    assert_sibling_paired(host, plan.vm("req"))
    odd = plan.vm("odd")
    assert odd.topology.threads == 1 and odd.topology.cores == 3
    assert all(sib[c] <= set(odd.held_cpus) for c in odd.vcpupin)
    with pytest.raises(PlacementError, match="node 0: SMT threads per core .* need 2, free 1"):
        nosmt = host_from_dict(
            {**json.loads((FIX / "seed004_a10.json").read_text()), "siblings": [[c] for c in range(64)]}
        )
        place(nosmt, [VmRequest("r", vcpus=2, memory_mib=1024, thread_policy="require")])


def test_require_with_odd_vcpus_is_refused():
    with pytest.raises(PlacementError, match="do not fill whole 2-thread cores"):
        place(load("seed004_a10"), [VmRequest("r", vcpus=3, memory_mib=1024, thread_policy="require")])


def test_emulator_share_uses_host_reserve_of_the_node():
    host = load("seed002_2x16c")
    plan = place(
        host, [VmRequest("s", vcpus=4, memory_mib=2048, gpus=("0000:ca:00.0",), emulator_threads="share", iothreads=1)]
    )
    s = plan.vm("s")
    assert s.emulatorpin == (16, 48) and s.iothreadpin == ((16, 48),)
    assert len(s.held_cpus) == 4


def test_deterministic_and_appending_a_vm_moves_nobody():
    host = load("seed004_l40s")
    reqs = [VmRequest(f"vm{i}", vcpus=6, memory_mib=8192, iothreads=1) for i in range(5)]
    p1 = place(host, reqs)
    p2 = place(host, list(reqs))
    assert p1.vms == p2.vms
    p3 = place(host, reqs + [VmRequest("late", vcpus=10, memory_mib=8192)])
    assert p3.vms[:5] == p1.vms


def test_report_lists_every_cpu_with_its_holder():
    host = load("seed002_2x16c")
    plan = place(host, [VmRequest("tenant-a", vcpus=2, memory_mib=2048, gpus=("0000:65:00.0",), iothreads=1)])
    text = plan.report()
    a = plan.vm("tenant-a")
    assert f"cpu {a.vcpupin[0]:>3} core 0/" in text
    assert text.count("tenant-a (vcpu ") == 2
    assert "tenant-a (emulator)" in text and "tenant-a (iothread 1)" in text
    assert text.count("  cpu ") == 64
    assert "1G pages 118/120 free" in text
    assert text.count(" host") == 4


def test_duplicate_device_and_unknown_device_are_errors():
    host = load("seed002_2x16c")
    with pytest.raises(PlacementError, match="already given"):
        place(host, [VmRequest("a", 2, 1024, gpus=("0000:65:00.0",)), VmRequest("b", 2, 1024, gpus=("0000:65:00.0",))])
    with pytest.raises(PlacementError, match="not on this host"):
        place(host, [VmRequest("a", 2, 1024, gpus=("0000:99:00.0",))])
    with pytest.raises(PlacementError, match="whole number"):
        place(host, [VmRequest("a", 2, 1500, page_size="1G")])


def test_cpuset_roundtrip():
    assert cpuset_str([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert parse_cpuset("0-2,5,7-8") == (0, 1, 2, 5, 7, 8)
    assert parse_cpuset("0-7,^3") == (0, 1, 2, 4, 5, 6, 7)
