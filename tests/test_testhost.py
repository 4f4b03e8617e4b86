"""The emulated GPU server is a real host: facts read back, GRUB/initramfs changes survive real reboots, vfio-pci
binding and SR-IOV VF creation work in the guest and can be undone.

All tests boot Debian 12 under QEMU (testbed/testhost); nothing here is mocked. Facts come from the project's own
one-round-trip reader (`facts.host.read_host_facts`) over the project's SSH layer with the guest's host key pinned.
"""

from __future__ import annotations

import secrets

import pytest

from access.shell import Script, sh
from facts.host import read_host_facts

# second_session: ./gpuhost.sh test runs this file in the dev stack's session (its booted server, the other chain)
pytestmark = [pytest.mark.testhost, pytest.mark.second_session]

HDA_CLASS = 0x0403


def _gpu_standin(f):
    """The display-class device on NUMA node 1 with an audio function in the same slot (a GPU + its HDA)."""
    cands = [d for d in f.pci.values() if d.is_display and d.numa_node == 1 and not d.boot_vga and d.function == 0]
    assert len(cands) == 1, f"expected one display device on node 1, found {[d.address for d in cands]}"
    fn0 = cands[0]
    funcs = sorted((d for d in f.pci.values() if d.slot == fn0.slot), key=lambda d: d.address)
    return fn0, funcs


def _sriov_pf(f):
    pfs = [d for d in f.pci.values() if (d.sriov_totalvfs or 0) > 0]
    assert len(pfs) == 1, f"expected one SR-IOV PF, found {[d.address for d in pfs]}"
    return pfs[0]


def test_facts_of_fresh_host(testhost):
    f = read_host_facts(testhost.conn())

    assert f.os.id == "debian" and f.os.version_id == "12"
    # Debian as installed: nothing IOMMU-related on the command line...
    assert not [a for a in f.cmdline if a.startswith(("intel_iommu", "iommu", "vfio"))], f.cmdline
    # ...yet DMA remapping is on: Debian 12's kernel has CONFIG_INTEL_IOMMU_DEFAULT_ON_INTGPU_OFF=y.
    assert f.iommu.dmar_table and f.iommu.active
    assert f.iommu.interrupt_remapping, f.iommu.remapping_evidence

    # Two sockets = two NUMA nodes with memory each; SMT: every CPU has exactly one sibling in its own node.
    assert sorted(f.nodes) == [0, 1]
    assert all(len(n.cpus) == 4 and n.mem_total_kb > 1_500_000 for n in f.nodes.values()), f.nodes
    pairs = {tuple(sorted(c.siblings)) for c in f.cpus}
    assert len(pairs) == 4 and all(len(p) == 2 for p in pairs), pairs
    by_id = {c.id: c for c in f.cpus}
    assert all(by_id[a].node == by_id[b].node and by_id[a].core == by_id[b].core for a, b in pairs)

    # The GPU stand-in: display function 0 + HDA function 1 of one slot on node 1, alone in one IOMMU group.
    fn0, funcs = _gpu_standin(f)
    assert [d.function for d in funcs] == [0, 1]
    assert funcs[1].class_code.startswith(f"0x{HDA_CLASS:04x}"), funcs[1].class_code
    assert {d.numa_node for d in funcs} == {1}
    group = {d.iommu_group for d in funcs}
    assert len(group) == 1 and None not in group
    assert sorted(f.iommu.groups[group.pop()]) == [d.address for d in funcs], "GPU group is not clean"

    # The SR-IOV PF on node 1 can make VFs; none exist yet.
    pf = _sriov_pf(f)
    assert pf.numa_node == 1 and pf.sriov_totalvfs > 0 and pf.sriov_numvfs == 0 and not pf.vfs

    # A dirty group on node 0: a PCIe-to-PCI bridge sharing its group with the endpoints behind it.
    dirty = []
    for gid, members in f.iommu.groups.items():
        devs = [f.pci[a] for a in members if a in f.pci]
        if len(devs) >= 3 and any(d.is_bridge for d in devs) and all(d.numa_node == 0 for d in devs):
            dirty.append(gid)
    assert len(dirty) == 1, f.iommu.groups

    # The boot display is another device (what preflight must not hand to vfio), the SSH NIC sits on node 0.
    boot = [d for d in f.pci.values() if d.boot_vga]
    assert len(boot) == 1 and boot[0].address != fn0.address
    assert boot[0].vendor_device != fn0.vendor_device  # so binding by vendor:device cannot grab the console
    assert f.network.protected_pci and all(f.pci[a].numa_node == 0 for a in f.network.protected_pci)


def test_bind_gpu_functions_to_vfio_and_restore(testhost):
    conn = testhost.conn()
    before = read_host_facts(conn)
    _, funcs = _gpu_standin(before)
    original = {d.address: d.driver for d in funcs}
    assert all(original.values()), original  # bochs-drm and snd_hda_intel own them after boot

    def rebind(override: str) -> str:
        s = Script().raw("set -e").add("modprobe", "vfio-pci")
        for a in original:
            dev = f"/sys/bus/pci/devices/{a}"
            s.write(["echo", override], f"{dev}/driver_override")
            s.raw(f"if [ -e {sh(dev)}/driver ]; then").write(["echo", a], f"{dev}/driver/unbind").raw("fi")
            s.write(["echo", a], "/sys/bus/pci/drivers_probe")
        return s.render()

    conn.run(rebind("vfio-pci"))
    bound = read_host_facts(conn)
    assert {a: bound.pci[a].driver for a in original} == {a: "vfio-pci" for a in original}
    group = bound.pci[funcs[0].address].iommu_group
    assert conn.run(sh("test", "-c", f"/dev/vfio/{group}"), check=False).rc == 0, "no /dev/vfio/<group> node"

    conn.run(rebind(""))  # an empty override: the ordinary driver match applies again
    after = read_host_facts(conn)
    assert {a: after.pci[a].driver for a in original} == original
    assert all(not after.pci[a].driver_override for a in original)


def test_sriov_vfs_create_and_remove(testhost):
    conn = testhost.conn()
    pf = _sriov_pf(read_host_facts(conn))
    numvfs = f"/sys/bus/pci/devices/{pf.address}/sriov_numvfs"
    want = min(2, pf.sriov_totalvfs)

    conn.run(Script().write(["echo", want], numvfs).render())
    f = read_host_facts(conn)
    assert f.pci[pf.address].sriov_numvfs == want
    vfs = f.pci[pf.address].vfs
    assert len(vfs) == want
    for vf in vfs:
        assert f.pci[vf].physfn == pf.address and f.pci[vf].numa_node == 1
        assert f.pci[vf].iommu_group is not None and f.pci[vf].iommu_group != f.pci[pf.address].iommu_group

    conn.run(Script().write(["echo", 0], numvfs).render())
    g = read_host_facts(conn)
    assert g.pci[pf.address].sriov_numvfs == 0 and not g.pci[pf.address].vfs
    assert not set(vfs) & set(g.pci)


# An init-top script baked into the initramfs leaves a mark in /run: if it is there after the reboot, the kernel
# really booted the initramfs that update-initramfs rebuilt in the guest.
INITRAMFS_HOOK = "/etc/initramfs-tools/scripts/init-top/gpuhost-test-mark"
INITRAMFS_SCRIPT = """#!/bin/sh
[ "$1" = prereqs ] && exit 0
mkdir -p /run/gpuhost
echo {token} > /run/gpuhost/initramfs-mark
"""


def test_grub_cmdline_and_initramfs_changes_take_effect_after_reboot(testhost):
    conn = testhost.conn()
    token = f"gpuhost.test={secrets.token_hex(4)}"
    grub = "/etc/default/grub"
    original = conn.get(grub)
    assert b'GRUB_CMDLINE_LINUX=""' in original  # Debian's default, the state providers start from
    reboots = testhost.reboots

    # The runbooks' way: edit GRUB_CMDLINE_LINUX, update-grub; rebuild the initramfs; reboot. The initrd as found is
    # kept aside (same directory, so `mv` puts the very same bytes back): the restore does not rebuild it again.
    initrd = conn.run("readlink -f /initrd.img").stdout.strip()
    assert initrd.startswith("/boot/initrd.img-"), initrd
    before = conn.run(sh("sha256sum", initrd)).stdout
    conn.run(sh("cp", "-p", initrd, initrd + ".gpuhost-test"))
    conn.run(sh("sed", "-i", f's/^GRUB_CMDLINE_LINUX=""$/GRUB_CMDLINE_LINUX="{token}"/', grub))
    conn.put(INITRAMFS_HOOK, INITRAMFS_SCRIPT.format(token=token), mode="0755")
    conn.run(Script().raw("set -e").add("update-grub").add("update-initramfs", "-u").render(), timeout=1200)
    assert conn.run(sh("sha256sum", initrd)).stdout != before
    assert token in conn.run(sh("cat", "/boot/grub/grub.cfg")).stdout
    testhost.reboot()

    conn = testhost.conn()
    assert token in conn.run(sh("cat", "/proc/cmdline")).stdout.split()
    assert conn.run(sh("cat", "/run/gpuhost/initramfs-mark")).stdout.strip() == token

    # Restore: the original file byte for byte, the hook gone, grub.cfg regenerated, the initrd as found put back,
    # reboot.
    conn.put(grub, original, mode="0644")
    conn.run(
        Script()
        .raw("set -e")
        .add("rm", "-f", INITRAMFS_HOOK)
        .add("update-grub")
        .add("mv", initrd + ".gpuhost-test", initrd)
        .render(),
        timeout=1200,
    )
    assert conn.run(sh("sha256sum", initrd)).stdout == before
    testhost.reboot()

    conn = testhost.conn()
    assert token not in conn.run(sh("cat", "/proc/cmdline")).stdout
    assert conn.run(sh("test", "-e", "/run/gpuhost/initramfs-mark"), check=False).rc != 0
    assert conn.get(grub) == original
    assert testhost.reboots == reboots + 2


def test_noiommu_variant_has_no_iommu_groups(testhost_noiommu):
    f = read_host_facts(testhost_noiommu.conn())
    assert not f.iommu.dmar_table and not f.iommu.active and f.iommu.groups == {}
    # The devices are all still there, just not isolated.
    fn0, funcs = _gpu_standin(f)
    assert [d.function for d in funcs] == [0, 1] and all(d.iommu_group is None for d in funcs)
    assert _sriov_pf(f).sriov_totalvfs > 0
