"""Facts parsers on captured output (pure; no host needed). Expected values were checked by hand against the
captures' raw text (tests/fixtures/facts/*.txt)."""

from pathlib import Path

import pytest

from facts.cpulist import CpuListError, cpumask, format_cpulist, parse_cpulist, parse_cpumask
from facts.host import (
    facts_script,
    parse_cmdline,
    parse_host_facts,
    parse_interrupts,
    parse_iommu,
    parse_network,
    parse_os_release,
    parse_pci,
    split_sections,
)

FIX = Path(__file__).parent / "fixtures" / "facts"


@pytest.fixture(scope="module")
def h200():
    """Captured on a real H200 passthrough guest (firecracker VM, Ubuntu 24.04, 16 vCPUs, 1 NUMA node)."""
    return parse_host_facts((FIX / "h200_guest.txt").read_text())


def test_h200_guest_os_kernel_cmdline(h200):
    assert h200.os.id == "ubuntu" and h200.os.version_id == "24.04" and h200.os.family == "debian"
    assert "console=ttyS0" in h200.cmdline and h200.cmdline_value("pci") == "realloc=off"


def test_h200_gpu_device_and_its_256g_bar_above_4g(h200):
    gpu = h200.device("00:06.0")
    assert gpu.vendor_device == "10de:2335" and gpu.class_code == "0x030200" and gpu.driver == "nvidia"
    assert gpu.is_display and not gpu.boot_vga and gpu.numa_node == -1
    big = max(gpu.bars, key=lambda b: b.size)
    assert big.index == 2 and big.size == 256 << 30 and big.prefetchable and big.above_4g and big.is_mem


def test_h200_topology_single_node_no_smt(h200):
    assert len(h200.cpus) == 16 and list(h200.nodes) == [0]
    assert all(c.siblings == [c.id] for c in h200.cpus)
    assert h200.nodes[0].cpus == list(range(16)) and h200.nodes[0].mem_total_kb == 4550128
    assert not h200.iommu.active and not h200.iommu.firmware_table


def test_cpulist_roundtrip_and_errors():
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"
    assert parse_cpulist("") == []
    with pytest.raises(CpuListError, match="backwards"):
        parse_cpulist("3-1")
    with pytest.raises(CpuListError):
        parse_cpulist("1,,2")
    # seed 002: banning CPUs 0-31 is 0xFFFFFFFF; a CPU above 31 starts a second word like the kernel prints
    assert cpumask(range(32)) == "ffffffff"
    assert cpumask([0, 1, 2, 3, 32]) == "1,0000000f"
    assert parse_cpumask("1,0000000f") == [0, 1, 2, 3, 32]


def test_os_release_rhel_family():
    text = 'NAME="Red Hat Enterprise Linux"\nID="rhel"\nID_LIKE="fedora"\nVERSION_ID="9.4"\n'
    o = parse_os_release(text)
    assert o.id == "rhel" and o.family == "rhel" and o.version_id == "9.4"


def test_cmdline_keeps_quoted_values():
    assert parse_cmdline('BOOT_IMAGE=/vmlinuz root=UUID=ab ro quiet "dyndbg=file x +p"\n') == [
        "BOOT_IMAGE=/vmlinuz",
        "root=UUID=ab",
        "ro",
        "quiet",
        "dyndbg=file x +p",
    ]


INTERRUPTS = """            CPU0       CPU1       CPU2       CPU3
   0:         46          0          0          0  IR-IO-APIC    2-edge      timer
  24:          0          0       1234          0  IR-PCI-MSIX-0000:81:00.0    0-edge      nvme0q0
  25:         10         20         30         40  IR-PCI-MSIX-0000:81:00.0    1-edge      nvme0q1
 NMI:          0          0          0          0   Non-maskable interrupts
 LOC:       1000       2000       3000       4000   Local timer interrupts
"""


def test_interrupts_with_affinity_and_remapping_evidence():
    irqs = parse_interrupts(INTERRUPTS, "0/smp_affinity_list:0-3\n24/smp_affinity_list:2\n25/smp_affinity_list:0-1\n")
    by = {i.irq: i for i in irqs}
    assert by["24"].counts == [0, 0, 1234, 0] and by["24"].affinity == [2]
    assert by["25"].chip == "IR-PCI-MSIX-0000:81:00.0" and by["25"].actions.endswith("nvme0q1")
    assert by["NMI"].chip == "" and by["LOC"].total == 10000
    io = parse_iommu("APIC\nDMAR\nFACP\n", "dmar0 dmar1", "1 0000:81:00.0\n1 0000:81:00.1\n", "", INTERRUPTS)
    assert io.dmar_table and io.interrupt_remapping and io.groups == {1: ["0000:81:00.0", "0000:81:00.1"]}


def test_network_finds_ssh_and_default_route_devices():
    n = parse_network(
        "default via 10.0.2.2 dev enp0s2 proto dhcp\n",
        "10.0.2.15:22\n",
        "lo 127.0.0.1/8\nenp0s2 10.0.2.15/24\n",
        "enp0s2 /sys/devices/pci0000:00/0000:00:02.0/virtio1\n",
    )
    assert n.ssh_ifaces == ["enp0s2"] and n.protected_pci == {"0000:00:02.0"}


def test_pci_sriov_pf_and_vfs_in_index_order():
    attrs = (
        "0000:82:00.0/vendor:0x1b36\n0000:82:00.0/device:0x0010\n0000:82:00.0/class:0x010802\n"
        "0000:82:00.0/numa_node:1\n0000:82:00.0/sriov_totalvfs:4\n0000:82:00.0/sriov_numvfs:2\n"
        "0000:82:00.0/driver_override:(null)\n0000:82:00.1/vendor:0x1b36\n0000:82:00.1/numa_node:1\n"
        "0000:82:00.2/vendor:0x1b36\n0000:83:01.2/vendor:0x1b36\n"
    )
    p = "/sys/devices/pci0000:80/0000:80:01.0/0000:82:00.0"
    links = (
        f"{p} driver ../../../../bus/pci/drivers/nvme\n{p} iommu_group ../../../../kernel/iommu_groups/12\n"
        f"{p} virtfn10 ../0000:83:01.2\n{p} virtfn0 ../0000:82:00.1\n{p} virtfn1 ../0000:82:00.2\n"
        "/sys/devices/pci0000:80/0000:80:01.0/0000:82:00.1 physfn ../0000:82:00.0\n"
        f"{p}/nvme/nvme0 driver ../../../../bus/nvme/drivers/foo\n"
    )
    res = "0000:82:00.0/resource:1:0x00000000fe000000 0x00000000fe003fff 0x0000000000140204\n"
    pci = parse_pci(attrs, links, "", res)
    pf = pci["0000:82:00.0"]
    assert pf.sriov_totalvfs == 4 and pf.sriov_numvfs == 2 and pf.driver == "nvme" and pf.iommu_group == 12
    assert pf.vfs == ["0000:82:00.1", "0000:82:00.2", "0000:83:01.2"] and pf.driver_override is None
    assert pci["0000:82:00.1"].physfn == "0000:82:00.0" and pci["0000:82:00.1"].driver is None
    assert pf.bars[0].index == 0 and pf.bars[0].size == 16 << 10


def test_script_quotes_extra_values_and_has_every_section():
    s = facts_script(sysctls=["vm.nr_hugepages"], files=["/etc/it's here"])
    assert "'/etc/it'\"'\"'s here'" in s
    sections = [ln.split()[1].rstrip(";") for ln in s.splitlines() if ln.startswith("echo @@")]
    for name in ["cmdline", "iommu-groups", "pci", "cpus", "nodes", "interrupts", "sysctls", "files", "end"]:
        assert f"@@{name}" in sections or name in sections
    assert split_sections("@@a\nx\n@@b\ny\nz\n") == {"a": "x", "b": "y\nz"}


@pytest.fixture(scope="module")
def emulated():
    """Captured from the emulated GPU server (testbed/testhost) as Debian boots it, before gpuhost touched it."""
    return parse_host_facts((FIX / "testhost_fresh.txt").read_text())


def test_emulated_host_layout(emulated):
    f = emulated
    assert f.os.family == "debian" and list(f.nodes) == [0, 1]
    assert {c.id: c.siblings for c in f.cpus}[6] == [6, 7] and f.nodes[1].cpus == [4, 5, 6, 7]
    gpu = f.device("0000:81:00.0")
    assert gpu.numa_node == 1 and gpu.driver == "bochs-drm" and gpu.is_display
    assert [d.address for d in f.slot_functions("0000:81:00.0")] == ["0000:81:00.0", "0000:81:00.1"]
    assert [d.address for d in f.group_members("0000:81:00.0")] == ["0000:81:00.0", "0000:81:00.1"]
    pf = f.device("0000:82:00.0")
    assert pf.sriov_totalvfs == 4 and pf.sriov_numvfs == 0 and pf.numa_node == 1
    dirty = f.group_members("0000:43:01.0")
    assert len([d for d in dirty if not d.is_bridge]) >= 2 and dirty[0].numa_node == 0
    assert f.iommu.interrupt_remapping and f.iommu.dmar_table
    assert f.network.protected_pci == {"0000:41:00.0"}
    assert f.device("0000:00:02.0").boot_vga
    assert "vfio_virqfd" in f.kmods_available and "driverctl" in f.tools
    assert f.files["/etc/default/grub"].exists and 'GRUB_CMDLINE_LINUX=""' in f.files["/etc/default/grub"].text


def test_preflight_on_emulated_host_captures(emulated):
    from plans.preflight import PreflightWant, failures, preflight

    assert not failures(preflight(emulated, PreflightWant(gpus=["0000:81:00.0"], enables_iommu=True)))
    dirty = failures(preflight(emulated, PreflightWant(gpus=["0000:43:01.0"])))
    assert any("not clean" in x.message and "0000:43:02.0" in x.message for x in dirty)
    unknown = failures(preflight(emulated, PreflightWant(gpus=["0000:99:00.0"])))
    assert unknown and "unknown PCI address 0000:99:00.0" in unknown[0].message
    boot = failures(preflight(emulated, PreflightWant(gpus=["0000:00:02.0"])))
    assert any(x.check.endswith("boot-display") for x in boot)
    nic = failures(preflight(emulated, PreflightWant(devices=["0000:41:00.0"])))
    assert any("SSH session" in x.message for x in nic)
