"""`from_facts`: the lead's typed host facts become the solver's input."""

from facts.model import Cpu, HostFacts, NumaNode, PciDevice
from plans.placement import VmRequest, from_facts, place


def facts_2node():
    # 2 sockets × 4 cores × 2 threads, AMD-style numbering: siblings are (2k, 2k+1)
    cpus = []
    for s in range(2):
        for c in range(4):
            a = (s * 4 + c) * 2
            cpus += [
                Cpu(id=a, core=c, socket=s, node=s, siblings=[a, a + 1]),
                Cpu(id=a + 1, core=c, socket=s, node=s, siblings=[a, a + 1]),
            ]
    return HostFacts(
        cpus=cpus,
        online=[c.id for c in cpus if c.id != 15],
        isolated=[],
        nodes={
            0: NumaNode(id=0, cpus=list(range(8)), mem_free_kb=8 << 20, hugepages={1048576: {"nr": 4, "free": 4}}),
            1: NumaNode(
                id=1,
                cpus=list(range(8, 16)),
                mem_free_kb=8 << 20,
                hugepages={1048576: {"nr": 4, "free": 3}, 2048: {"nr": 512, "free": 512}},
            ),
        },
        pci={
            "0000:ca:00.0": PciDevice(address="0000:ca:00.0", numa_node=1),
            "0000:ca:00.1": PciDevice(address="0000:ca:00.1", numa_node=1),
        },
    )


def test_from_facts_carries_siblings_online_hugepages_and_devices():
    host = from_facts(facts_2node(), reserved_cpus=[8, 9])
    assert {g for g in host.siblings} >= {(0, 1), (14, 15)}
    assert [c.id for c in host.cpus if not c.online] == [15]
    assert host.nodes[1].hugepages_free == {"1G": 3, "2M": 512}
    assert host.nodes[0].memory_free_mib == 8192
    plan = place(host, [VmRequest("t", vcpus=4, memory_mib=3072, gpus=("0000:ca:00.0", "0000:ca:00.1"))])
    t = plan.vm("t")
    assert t.node == 1
    assert t.vcpupin == (10, 11, 12, 13)  # 8/9 reserved, siblings adjacent
    assert t.emulatorpin == (14,)  # 15 is offline: the emulator core has one thread left
    assert t.topology.threads == 2
