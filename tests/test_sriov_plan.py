"""plans/sriov.py: facts in, actions out, on seed 002's host layout (a ConnectX PF pair on node 0 next to the
H200 at 65:00.0, one more ConnectX and an igb with SR-IOV off on node 1), written as typed facts."""

import pytest
from pydantic import ValidationError

from facts.model import HostFacts, Irq, Network, PciDevice
from plans import sriov
from plans.sriov import SriovWant, VfSettings, parse_pf_detail, plan_sriov

CX = dict(vendor="0x15b3", device="0x101d", class_code="0x020000")


def _pf(address: str, node: int, group: int, net: str, vfs: tuple[str, ...] = (), **over) -> PciDevice:
    """A ConnectX PF with 8 VFs possible (``over``: another NIC's fields)."""
    return PciDevice(
        **{
            "address": address,
            "numa_node": node,
            "sriov_totalvfs": 8,
            "sriov_numvfs": len(vfs),
            "driver": "mlx5_core",
            "iommu_group": group,
            "net": [net],
            "vfs": list(vfs),
            **CX,
            **over,
        }
    )


def _vf(address: str, group: int, **over) -> PciDevice:
    """A VF of the ConnectX PF 41:00.1, bound to vfio-pci (``over``: other fields)."""
    return PciDevice(
        **{
            "address": address,
            "numa_node": 0,
            "driver": "vfio-pci",
            "iommu_group": group,
            "physfn": "0000:41:00.1",
            "vendor": "0x15b3",
            "device": "0x101e",
            "class_code": "0x020000",
            **over,
        }
    )


SEED_PCI = [
    _pf("0000:41:00.0", 0, 30, "ens1f0"),
    _pf("0000:41:00.1", 0, 31, "ens1f1", vfs=("0000:41:03.2", "0000:41:03.3")),
    _vf("0000:41:03.2", 40, driver="mlx5_core", net=["ens1f1v0"]),
    _vf("0000:41:03.3", 41),
    PciDevice(
        address="0000:65:00.0",
        numa_node=0,
        driver="vfio-pci",
        iommu_group=50,
        vendor="0x10de",
        device="0x2335",
        class_code="0x030200",
    ),
    _pf("0000:c1:00.0", 1, 70, "ens2f0"),
    _pf("0000:c2:00.0", 1, 71, "eno1", sriov_totalvfs=0, driver="igb", vendor="0x8086", device="0x1521"),
]


def seed_host(**over) -> HostFacts:
    pci = {d.address: d.model_copy(deep=True) for d in SEED_PCI}
    net = Network(iface_pci={d.net[0]: a for a, d in pci.items() if d.net})
    irqs = [
        Irq(
            irq="120", chip="IR-PCI-MSIX-0000:41:00.0", actions="mlx5_async0@pci:0000:41:00.0", affinity=list(range(64))
        ),
        Irq(irq="121", chip="IR-PCI-MSIX-0000:41:00.0", actions="mlx5_comp0@pci:0000:41:00.0", affinity=[7]),
    ]
    return HostFacts(pci=pci, network=net, interrupts=irqs, online=list(range(64)), **over)


DETAIL = parse_pf_detail(
    "sriov_offset 2\nsriov_stride 1\nsriov_drivers_autoprobe 1\nmsi_irqs 120 121 \nirq 0\nunit_enabled \n"
)


def test_create_on_the_gpus_node_binds_persists_and_pins_in_that_order():
    p = plan_sriov(seed_host(), DETAIL, SriovWant(pf="41:00.0", num_vfs=4, numa_node=0, irq_cpus=[0, 32]))
    assert not p.errors
    assert p.kinds() == ["autoprobe", "numvfs", "persist", "bind", "irq"]
    # The VF routing IDs follow from the PF's offset/stride before the VFs exist.
    assert p.vf_addresses == ["0000:41:00.2", "0000:41:00.3", "0000:41:00.4", "0000:41:00.5"]
    bind = next(a for a in p.actions if a.kind == "bind")
    assert bind.data["vfs"] == p.vf_addresses and "driverctl" in bind.sentence
    irq = next(a for a in p.actions if a.kind == "irq")
    assert irq.data["irqs"] == ["120", "121"] and "0,32" in irq.sentence and "0-63" in irq.sentence
    assert "create 4 VF(s) on 0000:41:00.0 (sriov_numvfs 0 -> 4)" in p.sentence


def test_count_change_goes_through_zero_and_says_so():
    p = plan_sriov(seed_host(), DETAIL, SriovWant(pf="0000:41:00.1", num_vfs=3, vfio=False))
    assert p.kinds()[:2] == ["numvfs-zero", "numvfs"]
    zero = p.actions[0]
    assert "2 -> 0 first" in zero.sentence and "EBUSY" in zero.sentence
    assert "0000:41:03.2, 0000:41:03.3" in zero.sentence  # the VFs that will disappear are named
    assert p.actions[1].data == {"to": 3}


def test_same_count_already_bound_and_persisted_is_a_noop_with_a_reason():
    f = seed_host()
    f.driverctl_overrides = {"0000:41:03.2": "vfio-pci", "0000:41:03.3": "vfio-pci"}
    f.pci["0000:41:03.2"].driver = "vfio-pci"
    want = SriovWant(pf="ens1f1", num_vfs=2)
    unit = sriov.render_unit("0000:41:00.1", want, "ens1f1")
    detail = DETAIL.model_copy(update={"unit_enabled": True, "autoprobe": False})
    p = plan_sriov(f, detail, want, unit_text=unit)
    assert p.noop and p.actions == []
    assert p.sentence.startswith("no change: 2 VF(s) on 0000:41:00.1")
    assert p.vf_addresses == ["0000:41:03.2", "0000:41:03.3"]


def test_only_the_vf_still_on_the_host_driver_is_rebound():
    f = seed_host()
    f.driverctl_overrides = {"0000:41:03.3": "vfio-pci"}
    want = SriovWant(pf="0000:41:00.1", num_vfs=2)
    p = plan_sriov(
        f,
        DETAIL.model_copy(update={"autoprobe": False, "unit_enabled": True}),
        want,
        unit_text=sriov.render_unit("0000:41:00.1", want, "ens1f1"),
    )
    assert p.kinds() == ["bind"]
    assert p.actions[0].data["vfs"] == ["0000:41:03.2"]


def test_more_vfs_than_totalvfs_names_both_numbers():
    p = plan_sriov(seed_host(), DETAIL, SriovWant(pf="0000:41:00.0", num_vfs=9))
    assert [e.field for e in p.errors] == ["num_vfs"]
    msg = str(p.errors[0])
    assert "9 VFs" in msg and "at most 8" in msg and "sriov_totalvfs=8" in msg
    assert p.actions == [] and p.sentence.startswith("refused:")


def test_pf_without_sriov_and_firmware_disabled_sriov_are_clear():
    p = plan_sriov(seed_host(), DETAIL, SriovWant(pf="0000:65:00.0", num_vfs=1))
    assert p.errors[0].field == "pf"
    assert "0000:65:00.0 (10de:2335, driver vfio-pci) has no SR-IOV capability" in str(p.errors[0])
    assert "0000:41:00.0 (node 0, up to 8 VFs)" in str(p.errors[0])  # where SR-IOV is available
    q = plan_sriov(seed_host(), DETAIL, SriovWant(pf="eno1", num_vfs=1))
    assert "sriov_totalvfs=0" in str(q.errors[0]) and "BIOS" in str(q.errors[0])


def test_wrong_numa_node_refused_with_require_warned_with_prefer():
    want = dict(pf="0000:c1:00.0", num_vfs=2, numa_node=0)
    p = plan_sriov(seed_host(), DETAIL, SriovWant(**want))
    assert [e.field for e in p.errors] == ["numa_node"]
    assert "sits on NUMA node 1, not on node 0" in str(p.errors[0])
    assert "0000:41:00.0" in str(p.errors[0])  # the PFs that would be right
    q = plan_sriov(seed_host(), DETAIL, SriovWant(**want, numa_policy="prefer"))
    assert not q.errors and "numa_node" not in q.kinds()
    assert len(q.warnings) == 1 and "warning: PF 0000:c1:00.0 sits on NUMA node 1" in q.sentence
    assert "numvfs" in q.kinds()


def test_unknown_pf_by_address_and_by_name():
    p = plan_sriov(seed_host(), DETAIL, SriovWant(pf="0000:99:00.0", num_vfs=1))
    assert "unknown PF 0000:99:00.0" in str(p.errors[0])
    q = plan_sriov(seed_host(), DETAIL, SriovWant(pf="ens9", num_vfs=1))
    assert "unknown PF 'ens9'" in str(q.errors[0]) and "ens1f0" in str(q.errors[0])


def test_vf_settings_applied_where_the_pf_has_a_netdev_and_reported_where_not():
    want = SriovWant(
        pf="0000:41:00.1",
        num_vfs=2,
        vfio=False,
        vfs=[VfSettings(mac="02:AA:00:00:00:01", vlan=100, trust=True, spoofchk=False)],
    )
    have = parse_pf_detail(
        'iplink ens1f1 [{"ifname":"ens1f1","vfinfo_list":[{"vf":0,"address":"00:00:00:00:00:00",'
        '"spoofchk":true,"trust":false},{"vf":1,"address":"00:00:00:00:00:00"}]}]\n'
    )
    p = plan_sriov(seed_host(), have, want)
    cfg = [a for a in p.actions if a.kind == "vf-config"]
    assert len(cfg) == 1
    assert cfg[0].data["args"] == ["mac", "02:aa:00:00:00:01", "vlan", "100", "spoofchk", "off", "trust", "on"]
    # Already applied: nothing to do for the VF.
    done = parse_pf_detail(
        'iplink ens1f1 [{"vfinfo_list":[{"vf":0,"address":"02:aa:00:00:00:01",'
        '"vlan_list":[{"vlan":100}],"spoofchk":false,"trust":true}]}]\n'
    )
    assert "vf-config" not in plan_sriov(seed_host(), done, want).kinds()


def test_vf_settings_on_a_pf_without_netdev_are_reported_not_supported():
    f = seed_host()
    f.pci["0000:41:00.0"].net = []
    f.pci["0000:41:00.0"].driver = "nvme"
    p = plan_sriov(f, DETAIL, SriovWant(pf="0000:41:00.0", num_vfs=1, vfs=[VfSettings(vlan=5)]))
    assert "vf-config" not in p.kinds()
    assert p.unsupported == [
        "per-VF mac/vlan/trust/spoofchk not supported by nvme: PF 0000:41:00.0 has no "
        "network interface (`ip link set <pf> vf N` needs one)"
    ]


def test_bad_wants_fail_validation_or_plan():
    with pytest.raises(ValidationError):
        SriovWant(pf="0000:41:00.0; reboot", num_vfs=1)
    with pytest.raises(ValidationError):
        SriovWant(pf="0000:41:00.0", num_vfs=-1)
    with pytest.raises(ValidationError):
        VfSettings(mac="02:00:00:00:00")
    p = plan_sriov(seed_host(), DETAIL, SriovWant(pf="0000:41:00.0", num_vfs=1, vfs=[VfSettings(), VfSettings()]))
    assert [e.field for e in p.errors] == ["vfs"]
    q = plan_sriov(seed_host(), DETAIL, SriovWant(pf="0000:41:00.0", num_vfs=1, irq_cpus=[200]))
    assert [e.field for e in q.errors] == ["irq_cpus"]


def test_vf_address_arithmetic_crosses_device_and_bus_boundaries():
    assert sriov.vf_address("0000:41:00.0", 2, 1, 0) == "0000:41:00.2"
    assert sriov.vf_address("0000:41:00.0", 2, 1, 6) == "0000:41:01.0"
    assert sriov.vf_address("0000:41:00.0", 0x80, 2, 0) == "0000:41:10.0"
    assert sriov.vf_address("0000:41:1f.7", 1, 1, 0) == "0000:42:00.0"


def test_unit_orders_before_libvirt_and_its_script_is_valid_sh(tmp_path):
    import subprocess

    want = SriovWant(pf="0000:82:00.0", num_vfs=2, irq_cpus=[0, 1])
    text = sriov.render_unit("0000:82:00.0", want, None)
    assert "Before=libvirtd.service" in text and "WantedBy=multi-user.target" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    script = line.removeprefix("ExecStart=/bin/sh -ec '").removesuffix("'")
    assert "$" not in script.replace("$$", "")  # every shell $ is escaped from systemd's expansion
    (tmp_path / "u.sh").write_text(script.replace("$$", "$"))
    assert subprocess.run(["sh", "-n", str(tmp_path / "u.sh")]).returncode == 0
    body = script.replace("$$", "$")
    # Autoprobe off before the count is written (no host driver grabs a VF), and the count through 0.
    assert body.index("sriov_drivers_autoprobe") < body.index("echo 2 >")
    assert "[ $c = 0 ] || echo 0 > $d/sriov_numvfs" in body
    assert "echo 0-1 > /proc/irq/$q/smp_affinity_list" in body
    no_vfio = sriov.render_unit("0000:82:00.0", want.model_copy(update={"vfio": False}), None)
    assert "vfio" not in no_vfio and "sriov_drivers_autoprobe" not in no_vfio


def test_pf_detail_parser_on_ip_json_and_missing_fields():
    d = parse_pf_detail(
        "sriov_offset 1\nsriov_stride 1\nsriov_drivers_autoprobe 0\nmsi_irqs 25 24 26 \n"
        "unit_enabled enabled\niplink eth0 not json\n"
    )
    assert (d.offset, d.stride, d.autoprobe, d.unit_enabled) == (1, 1, False, True)
    assert d.irqs == ["24", "25", "26"] and d.vfinfo == {"eth0": {}}
    e = parse_pf_detail("irq 11\nunit_enabled disabled\n")
    assert e.irqs == ["11"] and e.unit_enabled is False and e.offset is None


# -- the emulated host's real capture (tests/fixtures/facts/testhost_fresh.txt: facts.host's one-round-trip read) --


def captured_testhost_facts() -> HostFacts:
    from pathlib import Path

    from facts.host import parse_host_facts

    return parse_host_facts((Path(__file__).parent / "fixtures" / "facts" / "testhost_fresh.txt").read_text())


# The PF's sysfs on that host as `pf_detail_script` prints it (QEMU's NVMe PF: first VF offset 1, stride 1; MSI-X
# vectors 43 (admin queue) and 44 (I/O queue)).
TESTHOST_DETAIL = parse_pf_detail(
    "sriov_offset 1\nsriov_stride 1\nsriov_drivers_autoprobe 1\nmsi_irqs 43 44 \nirq 10\nunit_enabled \n"
)


def test_emulated_host_nvme_pf_on_node_1_plans_vfs_and_names_them():
    f = captured_testhost_facts()
    p = plan_sriov(
        f,
        TESTHOST_DETAIL,
        SriovWant(
            pf="0000:82:00.0", num_vfs=2, numa_node=1, irq_cpus=[0, 1], vfs=[VfSettings(mac="02:00:00:00:82:01")]
        ),
    )
    assert not p.errors
    assert p.kinds() == ["autoprobe", "numvfs", "persist", "bind", "irq"]
    assert p.vf_addresses == ["0000:82:00.1", "0000:82:00.2"]
    assert p.unsupported and "not supported by nvme" in p.unsupported[0]


def test_emulated_host_refusals_name_the_numbers_and_the_device():
    f = captured_testhost_facts()
    too_many = plan_sriov(f, TESTHOST_DETAIL, SriovWant(pf="0000:82:00.0", num_vfs=5))
    assert str(too_many.errors[0]) == ("5 VFs asked for but 0000:82:00.0 supports at most 4 (sriov_totalvfs=4)")
    gpu = plan_sriov(f, TESTHOST_DETAIL, SriovWant(pf="0000:81:00.0", num_vfs=1))
    assert str(gpu.errors[0]).startswith("0000:81:00.0 (1234:1111, driver bochs-drm) has no SR-IOV capability")
    far = plan_sriov(f, TESTHOST_DETAIL, SriovWant(pf="0000:82:00.0", num_vfs=1, numa_node=0))
    assert "sits on NUMA node 1, not on node 0" in str(far.errors[0]) and "node 0: none" in str(far.errors[0])
