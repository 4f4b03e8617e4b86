"""SriovVfs on the emulated GPU server's SR-IOV NVMe PF (0000:82:00.0, NUMA node 1, sriov_totalvfs=4), driven through
the SDK's provider server like the engine drives it.

One host for the module and one reboot in all; the tests run in file order and share the resource's state the way
one stack's successive `pulumi` commands would:
  1. check refuses (too many VFs, a PF without SR-IOV, the wrong node, an unknown PF) with nothing changed;
  2. create 2 VFs bound to vfio-pci, persistent; reboot; the same count and bindings; a second run plans no change;
  3. 2 -> 3 shows as a count change in preview and applies through 0 (the kernel log shows the VFs removed);
  4. a PinnedVM domain on the host's libvirtd gets a VF from the output as hostdev (defined, not started);
  5. delete restores the host byte for byte (unit, wants symlink, driverctl files), VF count 0, autoprobe, IRQs.

The PF is an NVMe controller, so it has no netdev: per-VF MAC/VLAN settings are reported "not supported by nvme".
"""

from __future__ import annotations

import time

import pytest

from access.shell import quote, sh
from facts.host import read_host_facts
from plans.placement import VmRequest, from_facts, place
from providers.irq import IrqIsolationProvider
from providers.libvirt_domain import LibvirtDomainProvider
from providers.sriov import SriovVfsProvider
from testbed.provider_server import ProviderError, ProviderServer
from testbed.testhost.host import BootId, Host, Output, PciDriver, ServiceState, SriovNumvfs
from testbed.testhost.machine import GPU_FN0, NVME_PF

pytestmark = pytest.mark.testhost

TYPE = "gpuhost:host:SriovVfs"
SYS = f"/sys/bus/pci/devices/{NVME_PF}"
UNIT = "gpuhost-sriov-0000-82-00.0.service"
DOMAIN = "tenant-vf"
OVERRIDES = sh("driverctl", "list-overrides")

# Everything SriovVfs may touch, as one listing: files with hash and mode/owner, symlinks with their target, the
# PF's VF count and autoprobe, and the affinity of each of the PF's IRQs by position.
SNAPSHOT = "\n".join(
    [
        "for f in $(find /etc/systemd/system /etc/driverctl.d /etc/udev/rules.d \\( -type f -o -type l \\) 2>/dev/null "
        "| sort); do if [ -L $f ]; then echo L $f $(readlink $f); else echo F $f $(sha256sum < $f | cut -c1-16) "
        "$(stat -c '%a %u %g' $f); fi; done",
        f"echo numvfs $(cat {quote(SYS + '/sriov_numvfs')}) autoprobe $(cat {quote(SYS + '/sriov_drivers_autoprobe')})",
    ]
)
IRQS = f"for q in $(ls {quote(SYS + '/msi_irqs')} | sort -n); do echo $(cat /proc/irq/$q/smp_affinity_list); done"


def snapshot(conn) -> list[str]:
    return conn.run(SNAPSHOT).stdout.splitlines()


def pf_irq_affinities(conn) -> list[list[int]]:
    from facts.cpulist import parse_cpulist

    return [parse_cpulist(ln) for ln in conn.run(IRQS).stdout.splitlines()]


def inputs(spec, **over) -> dict:
    base = {
        "host": spec,
        "pf": NVME_PF,
        "num_vfs": 2,
        "numa_node": 1,
        "numa_policy": "require",
        "vfio": True,
        "vfs": [{"mac": "02:00:00:00:82:01", "vlan": 100}],
        "irq_cpus": [0, 1],
        "persist": True,
        **{k: None for k in SriovVfsProvider.OUTPUT_ONLY},
        "version": SriovVfsProvider.VERSION,
    }
    return {**base, **over}


class Stack:
    """One stack's state of the SriovVfs resource across `pulumi` runs (each run: a fresh provider process)."""

    def __init__(self, host):
        self.host = host
        self.spec = host.host_spec(key_name="sshPrivateKey").model_dump(mode="json")
        self.state: tuple = (None, {}, {})
        self.before: list[str] = []
        self.timings: dict[str, float] = {}

    def run(self, fn):
        with ProviderServer(config={"gpuhost:sshPrivateKey": self.host.private_key_pem}) as srv:
            r = srv.resource(SriovVfsProvider(), TYPE, "testhost-nvme-sriov")
            r.id, r.inputs, r.outputs = self.state
            try:
                return fn(r)
            finally:
                self.state = (r.id, r.inputs, r.outputs)


@pytest.fixture(scope="module")
def stack(testhost):
    """The resource's stack, on a host whose irqbalance bans the VM CPUs 2-7 (PassthroughHost's IrqIsolation, as in
    production): without the ban irqbalance moves the PF's IRQs back to the PF's node (CPUs 4-7) after each boot."""
    s = Stack(testhost)
    s.before = snapshot(testhost.conn())
    isolation = {
        "host": s.spec,
        "banned_cpus": [2, 3, 4, 5, 6, 7],
        "pin": [],
        **{k: None for k in IrqIsolationProvider.OUTPUT_ONLY},
        "version": IrqIsolationProvider.VERSION,
    }
    with ProviderServer(config={"gpuhost:sshPrivateKey": testhost.private_key_pem}) as srv:
        irq = srv.resource(IrqIsolationProvider(), "gpuhost:host:IrqIsolation", "testhost-irq-isolation")
        irq.up(isolation)
        try:
            yield s
        finally:
            print("sriov timings:", s.timings)
            if s.state[0] is not None:  # a failed test left the resource: put the host back anyway
                s.run(lambda r: r.destroy())
            irq.destroy()


def timed(stack, key, fn):
    t0 = time.monotonic()
    out = fn()
    stack.timings[key] = round(time.monotonic() - t0, 1)
    return out


def test_check_refuses_what_the_hardware_rules_out_and_nothing_changes(testhost, stack):
    conn = testhost.conn()
    assert "numvfs 0 autoprobe 1" in stack.before

    def refuse(r):
        got = {}
        overs: dict[str, dict[str, object]] = {
            "too_many": {"num_vfs": 5},
            "no_sriov": {"pf": GPU_FN0},
            "wrong_node": {"numa_node": 0},
            "unknown": {"pf": "0000:9a:00.0"},
        }
        for label, over in overs.items():
            with pytest.raises(ProviderError) as e:
                r.preview(inputs(stack.spec, **over))
            got[label] = e.value.details
        prefer = r.check(inputs(stack.spec, numa_node=0, numa_policy="prefer"))
        return got, prefer

    got, prefer = timed(stack, "check_failures_s", lambda: stack.run(refuse))
    assert "num_vfs: 5 VFs asked for but 0000:82:00.0 supports at most 4 (sriov_totalvfs=4)" in got["too_many"]
    assert f"pf: {GPU_FN0} (1234:1111, driver bochs-drm) has no SR-IOV capability" in got["no_sriov"]
    assert "0000:82:00.0 (node 1, up to 4 VFs)" in got["no_sriov"]
    assert "numa_node: PF 0000:82:00.0 sits on NUMA node 1, not on node 0" in got["wrong_node"]
    assert "unknown PF 0000:9a:00.0" in got["unknown"]
    assert "warning: PF 0000:82:00.0 sits on NUMA node 1, not on node 0" in prefer["plan"]
    assert snapshot(conn) == stack.before, "a refused check changed the host"
    assert stack.state[0] is None


def test_two_vfs_on_vfio_survive_a_reboot_and_the_next_run_plans_no_change(testhost, stack):
    conn = testhost.conn()
    want = inputs(stack.spec)
    plan = stack.run(lambda r: r.check(want))["plan"]
    assert "create 2 VF(s) on 0000:82:00.0 (sriov_numvfs 0 -> 2)" in plan
    assert "bind 0000:82:00.1, 0000:82:00.2 to vfio-pci" in plan

    op, outs = timed(stack, "create_s", lambda: stack.run(lambda r: r.up(want)))
    assert op == "create"
    vfs = ["0000:82:00.1", "0000:82:00.2"]
    assert outs["vf_addresses"] == vfs and outs["numvfs"] == 2
    assert outs["drivers"] == {a: "vfio-pci" for a in vfs}
    assert outs["vf_config"] == {"0": "not supported by nvme: the PF has no network interface"}
    assert outs["prior_numvfs"] == 0 and outs["prior_autoprobe"] is True
    # nvme's I/O queue vector is kernel-managed (it refuses a new affinity); the admin queue's moves.
    assert outs["unmovable"] and outs["pinned"] and all(set(c) <= {0, 1} for c in outs["pinned"].values())
    assert all(set(c) <= {0, 1} for c, movable in zip(pf_irq_affinities(conn), outs["irq_movable"]) if movable)
    created = Host(testhost.ssh).read(Output(OVERRIDES), ServiceState(UNIT), BootId())
    overrides = created.check_output(OVERRIDES)
    assert f"{vfs[0]} vfio-pci" in overrides
    assert f"{vfs[1]} vfio-pci" in overrides
    assert created.service(UNIT).is_enabled

    stack.timings["reboot_s"] = testhost.reboot()
    rebooted = Host(testhost.ssh).read(BootId(), SriovNumvfs(NVME_PF), *map(PciDriver, vfs), ServiceState(UNIT))
    assert rebooted.boot_id != created.boot_id
    assert rebooted.pci_device(NVME_PF).sriov_numvfs == 2
    assert rebooted.pci_device(vfs[0]).driver == "vfio-pci"
    assert rebooted.pci_device(vfs[1]).driver == "vfio-pci"
    assert rebooted.service(UNIT).is_running

    def second_run(r):
        refreshed = r.refresh()
        return refreshed, r.check(want), r.preview(want), r.up(want)[0]

    refreshed, checked, preview, op = timed(stack, "second_run_s", lambda: stack.run(second_run))
    assert refreshed["num_vfs"] == 2 and refreshed["vfio"] is True and refreshed["persist"] is True
    assert refreshed["drivers"] == {a: "vfio-pci" for a in vfs}
    assert preview.changes is False and op == "same"
    for action in ("refused", "create", "bind", "write", "autoprobe", "sriov_numvfs"):
        assert action not in checked["plan"], checked["plan"]


def test_two_to_three_previews_as_a_count_change_and_goes_through_zero(testhost, stack):
    conn = testhost.conn()
    want = inputs(stack.spec, num_vfs=3)
    log_from = int(conn.run("dmesg | wc -l").stdout)

    def change(r):
        return r.check(want)["plan"], r.preview(want), r.up(want)

    plan, preview, (op, outs) = timed(stack, "update_2_to_3_s", lambda: stack.run(change))
    assert "set sriov_numvfs of 0000:82:00.0 2 -> 0 first" in plan and "(sriov_numvfs 0 -> 3)" in plan
    assert preview.changes is True and preview.replaces == []
    assert op == "update" and outs["numvfs"] == 3
    assert outs["vf_addresses"] == ["0000:82:00.1", "0000:82:00.2", "0000:82:00.3"]
    assert set(outs["drivers"].values()) == {"vfio-pci"}
    assert outs["prior_numvfs"] == 0  # still what the host had before gpuhost
    log = conn.run(f"dmesg | tail -n +{int(log_from) + 1}").stdout
    # Through 0: the two existing VFs left the bus before three were created.
    gone = [ln for ln in log.splitlines() if "Removing from iommu group" in ln]
    added = [ln for ln in log.splitlines() if "Adding to iommu group" in ln]
    assert any("0000:82:00.1" in ln for ln in gone) and any("0000:82:00.2" in ln for ln in gone), log
    assert log.index("0000:82:00.2: Removing") < log.index("0000:82:00.3: Adding"), log
    assert len(added) == 3, log
    unit = Host(testhost.ssh).file(f"/etc/systemd/system/{UNIT}").content_string
    assert "ExecStart" in unit
    assert "echo 3 > $$d/sriov_numvfs" in unit


def test_pinned_vm_domain_gets_a_vf_from_the_output_as_hostdev(testhost, stack):
    conn = testhost.conn()
    vf = stack.state[2]["vf_addresses"][0]
    from components.pinned_vm import PinnedVMArgs

    host = from_facts(read_host_facts(conn))
    placement = place(host, [VmRequest(DOMAIN, vcpus=1, memory_mib=128, page_size="4K", vfs=(vf,))]).vm(DOMAIN)
    assert placement.node == 1  # the VF's node
    args = PinnedVMArgs(
        placement=placement,
        vfs=(vf,),
        domain_type="qemu",
        cpu_mode="maximum",
        loader=None,
        network=None,
        uri=None,
        host=testhost.host_spec(key_name="sshPrivateKey"),
    )
    spec = args.domain_spec(DOMAIN)
    conn.run("systemctl start libvirtd")
    dom_inputs = {
        "host": stack.spec,
        "domain": spec.model_dump(mode="json"),
        "start": False,
        "version": LibvirtDomainProvider.VERSION,
    }
    with ProviderServer(config={"gpuhost:sshPrivateKey": testhost.private_key_pem}) as srv:
        r = srv.resource(LibvirtDomainProvider(), "gpuhost:vm:LibvirtDomain", DOMAIN)
        try:
            op, outs = r.up(dom_inputs)
            assert op == "create" and outs["state"] == "shutoff"
            xml = conn.run(sh("virsh", "dumpxml", DOMAIN, "--inactive")).stdout
        finally:
            r.destroy()
    dom, bus, rest = vf.split(":")
    slot, fn = rest.split(".")
    assert "<hostdev mode='subsystem' type='pci' managed='yes'>" in xml
    assert (f"<address domain='0x{dom}' bus='0x{bus}' slot='0x{slot}' function='0x{fn}'/>") in xml, xml
    assert DOMAIN not in conn.run(sh("virsh", "list", "--all", "--name")).stdout.split()


def test_delete_restores_the_host_byte_for_byte(testhost, stack):
    conn = testhost.conn()
    prior_affinity = [[int(c) for c in cpus] for _, cpus in stack.state[2]["prior_affinity"]]
    timed(stack, "delete_s", lambda: stack.run(lambda r: r.destroy()))
    after = snapshot(conn)
    assert after == stack.before, "\n".join(sorted(set(after) ^ set(stack.before)))
    assert pf_irq_affinities(conn) == prior_affinity
    assert conn.run(sh("ls", "/etc/driverctl.d")).stdout.strip() == ""
    assert not conn.run(sh("ls", f"{SYS}/")).stdout.count("virtfn")
