"""The device-safety guards hold for every spelling and topology (pure: facts sections in, findings out).

Network sections are written the way the facts script prints them (`ip -o addr`, `/sys/class/net/*/lower_*`,
the session's SSH_CONNECTION); the emulated server shows the same on a live bridge and bond in
tests/test_ssh_nic_guard_testhost.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from facts.host import parse_host_facts, parse_network, parse_virt
from plans.preflight import PreflightWant, active_overrides, binding_refusals, failures, preflight

FIX = Path(__file__).parent / "fixtures" / "facts"
NIC = "0000:41:00.0"
PCI = f"ens1 /sys/devices/pci0000:40/0000:40:00.0/{NIC}\nens2 /sys/devices/pci0000:40/0000:40:00.1/0000:42:00.0\n"


@pytest.fixture(scope="module")
def fresh():
    return parse_host_facts((FIX / "testhost_fresh.txt").read_text())


@pytest.mark.parametrize(
    "what, addrs, links",
    [
        ("plain NIC", "ens1 10.0.2.15/24", ""),
        ("bridge", "br0 10.0.2.15/24", "br0 ens1"),
        ("bond", "bond0 10.0.2.15/24", "bond0 ens1 ens2"),
        ("VLAN on a bond", "bond0.100 10.0.2.15/24", "bond0 ens1 ens2\nbond0.100 bond0"),
        ("macvlan on a bridge", "mv0 10.0.2.15/24", "br0 ens1\nmv0 br0"),
    ],
)
def test_session_nic_found_through_any_stack_and_any_port(what, addrs, links):
    # sshd on 2022, so `ss sport = :22` (the old guard) finds nothing: only the session itself says where it is.
    net = parse_network("", "", addrs, PCI, session="10.0.2.2 51234 10.0.2.15 2022", links=links)
    assert NIC in net.protected_pci, what
    assert net.carrier_of(NIC) == [addrs.split()[0]]


def test_session_local_address_not_a_nic_of_ours_protects_nothing_else():
    net = parse_network("", "", "br0 10.0.2.15/24\nens2 10.9.0.1/24", PCI, "10.0.2.2 1 10.0.2.15 22", "br0 ens1")
    assert net.protected_pci == {NIC}


def test_binding_refusals_name_the_interface(fresh):
    f = fresh.model_copy(deep=True)
    f.network = parse_network("", "", "br0 10.0.2.15/24", PCI, "10.0.2.2 5 10.0.2.15 22", "br0 ens1")
    refused = binding_refusals(f, [NIC])
    assert len(refused) == 1 and "through br0" in refused[0].message and refused[0].status == "FAIL"
    assert any("through br0" in x.message for x in failures(preflight(f, PreflightWant(devices=[NIC]))))


@pytest.mark.parametrize(
    "where, setup",
    [
        ("running kernel command line", lambda f: f.cmdline.append("pcie-acs-override=downstream,multifunction")),
        (
            "/etc/default/grub GRUB_CMDLINE_LINUX_DEFAULT",
            lambda f: f.boot_config.append('GRUB_CMDLINE_LINUX_DEFAULT="quiet pcie_acs_override=downstream"'),
        ),
        ("boot loader entry", lambda f: f.boot_config.append("BLS root=/dev/sda1 pcie-acs_override=id:10de:2684")),
    ],
)
def test_acs_override_already_present_is_reported_not_passed(fresh, where, setup):
    f = fresh.model_copy(deep=True)
    setup(f)
    assert active_overrides(f) == {"pcie_acs_override": [where]}
    findings = preflight(f, PreflightWant(gpus=["0000:81:00.0"]))
    fail = [x for x in failures(findings) if x.check == "override pcie_acs_override"]
    assert fail and where in fail[0].message and "acs_override_acknowledged" in fail[0].fix
    group = next(x for x in findings if x.check == "gpu 0000:81:00.0 iommu-group")
    assert group.status == "WARN" and "without real isolation" in group.message  # no silent PASS
    acked = preflight(f, PreflightWant(gpus=["0000:81:00.0"], acs_override_acknowledged=True))
    assert not [x for x in failures(acked) if x.check.startswith("override")]
    assert next(x for x in acked if x.check == "override pcie_acs_override").status == "WARN"


@pytest.mark.parametrize(
    "setup, where",
    [
        (
            lambda f: f.module_params.update({"vfio_iommu_type1.allow_unsafe_interrupts": "Y"}),
            "/sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts",
        ),
        (
            lambda f: f.module_config.update(
                {"/etc/modprobe.d/x.conf": "options vfio-iommu-type1 allow-unsafe-interrupts=1\n"}
            ),
            "/etc/modprobe.d/x.conf",
        ),
        (lambda f: f.cmdline.append("vfio_iommu_type1.allow-unsafe-interrupts=1"), "running kernel command line"),
    ],
)
def test_unsafe_interrupts_already_present_is_reported(fresh, setup, where):
    f = fresh.model_copy(deep=True)
    setup(f)
    fail = [
        x
        for x in failures(preflight(f, PreflightWant(gpus=["0000:81:00.0"])))
        if x.check == "override vfio_iommu_type1.allow_unsafe_interrupts"
    ]
    assert fail and where in fail[0].message


def test_parameter_set_to_off_is_not_an_override(fresh):
    f = fresh.model_copy(deep=True)
    f.module_params["vfio_iommu_type1.allow_unsafe_interrupts"] = "N"
    f.cmdline.append("vfio_iommu_type1.allow_unsafe_interrupts=0")
    assert active_overrides(f) == {}


def _without_iommu_table(fresh, virt: str):
    """Preflight's findings, and its iommu-firmware one, for a machine (`virt`: the read's virt section) whose
    firmware shows no DMAR or IVRS table."""
    f = fresh.model_copy(deep=True)
    f.virt = parse_virt(virt)
    f.iommu.dmar_table = False
    f.iommu.ivrs_table = False
    findings = preflight(f, PreflightWant(gpus=["0000:81:00.0"]))
    return findings, next(x for x in findings if x.check == "iommu-firmware")


def test_vm_guest_is_told_it_is_a_guest_not_to_fix_its_bios(fresh):
    findings, fw = _without_iommu_table(
        fresh, "detect=kvm\nsys_vendor=QEMU\nproduct_name=Standard PC (Q35 + ICH9, 2009)\ncpu_hypervisor=1"
    )
    assert fw.status == "FAIL" and "VM guest (kvm, QEMU Standard PC" in fw.message and "BIOS" not in fw.fix
    assert next(x for x in findings if x.check == "machine").status == "WARN"


def test_bare_metal_without_the_table_is_told_to_enable_vt_d(fresh):
    findings, fw = _without_iommu_table(fresh, "detect=none\nsys_vendor=Supermicro\nproduct_name=SYS-420GP-TNR")
    assert fw.status == "FAIL" and "off in firmware" in fw.message and "enable VT-d" in fw.fix
    assert not any(x.check == "machine" for x in findings)


def test_bare_metal_is_not_a_guest():
    v = parse_virt("detect=none\nsys_vendor=Supermicro\nproduct_name=SYS-420GP-TNR")
    assert not v.guest
    assert not parse_virt("detect=docker").guest  # a container on bare metal is not a VM


@pytest.mark.parametrize("capture, upper", [("testhost_bridge.txt", "br0"), ("testhost_bond.txt", "bond0")])
def test_real_captures_of_the_emulated_server(capture, upper):
    """Captured from the emulated server with its management address moved (tests/test_ssh_nic_guard_testhost.py,
    GPUHOST_CAPTURE_DIR): the session's interface, followed down to the e1000e."""
    f = parse_host_facts((FIX / capture).read_text())
    assert f.network.session.split()[2] == "10.0.2.15" and f.network.ssh_ifaces == [upper]
    assert f.network.protected_pci == {NIC} and f.network.carrier_of(NIC) == [upper]
    assert f.virt.guest and f.virt.detect == "qemu"
    refused = failures(preflight(f, PreflightWant(devices=[NIC])))
    assert any(f"(through {upper})" in x.message for x in refused)
    # A QEMU guest is told so (a WARN), and its vIOMMU passes: no BIOS advice.
    assert next(x for x in preflight(f, PreflightWant()) if x.check == "machine").status == "WARN"


def test_real_capture_sshd_on_another_port():
    """Captured over a second sshd on port 2022 with no session on 22: `ss sport = :22` (the old guard) saw nothing."""
    raw = (FIX / "testhost_sshd_2022.txt").read_text()
    from facts.host import split_sections

    assert split_sections(raw)["net-ssh"].strip() == ""
    f = parse_host_facts(raw)
    assert f.network.session.endswith(" 10.0.2.15 2022") and f.network.protected_pci == {NIC}
    assert binding_refusals(f, [NIC]) and "(through ens1)" in binding_refusals(f, [NIC])[0].message
