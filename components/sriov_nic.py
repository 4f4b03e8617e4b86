"""SriovNic: SR-IOV VFs of one PF on the GPU's NUMA node, bound to vfio-pci, persistent, PF IRQs on host CPUs.

Seed 002 §5 ("把符合 GPU 同 NUMA 的 VF 设备也 driverctl set-override ... vfio-pci") and the pitfall "SR-IOV VF 没吞吐"
(VF on the far node, IRQs on VM cores). Thin: one `SriovVfs` host resource; `vf_addresses` feed PinnedVM's `vfs`.

Usage::

    nic = SriovNic("hk-gpu01-ens1f0", SriovNicArgs(host=spec, pf="0000:41:00.0", num_vfs=4, numa_node=0,
                                                   irq_cpus=[0, 32], vfs=[VfSettings(vlan=100)]))
    PinnedVM("tenant-a", PinnedVMArgs(..., vfs=...))   # nic.vf_addresses.apply(lambda v: v[:1])
"""

from __future__ import annotations

from typing import Any

from access.ssh import HostSpec
from components.wiring import Child, Wired
from plans.sriov import SriovWant
from providers.base import host_input
from providers.sriov import SriovVfs


class SriovNicArgs(SriovWant):
    """Args:
    host: the hypervisor (SSH).
    pf: PCI address or interface name of the physical function.
    num_vfs: how many VFs (the count changes through 0; VMs using VFs must let go first).
    numa_node / numa_policy: the GPU's node; "require" refuses a PF elsewhere, "prefer" warns.
    vfio: bind every VF to vfio-pci (driverctl, persistent) for passthrough.
    vfs: per-VF MAC/VLAN/trust/spoofchk by index (PF netdev drivers only; reported otherwise).
    irq_cpus: host-reserved CPUs for the PF's IRQs.
    """

    host: HostSpec  # the rest is SriovWant's: one definition of what is asked of a PF, checked in one place

    def want(self) -> SriovWant:
        return SriovWant(**self.model_dump(exclude={"host"}))


def children(name: str, args: SriovNicArgs) -> list[Child]:
    """One SriovVfs: the VFs, their vfio binding and the PF's IRQ pinning."""
    want = args.want()
    return [
        Child(
            "vfs",
            SriovVfs,
            {
                "host": host_input(args.host),
                "pf": want.pf,
                "num_vfs": want.num_vfs,
                "numa_node": want.numa_node,
                "numa_policy": want.numa_policy,
                "vfio": want.vfio,
                "vfs": [v.model_dump() for v in want.vfs],
                "irq_cpus": want.irq_cpus,
            },
        )
    ]


class SriovNic(Wired, type_name="gpuhost:net:SriovNic", children=children):
    def wire(self, args: SriovNicArgs, made: dict[str, Any]) -> dict[str, Any]:
        self.vfs = made["vfs"]
        self.vf_addresses = self.vfs.vf_addresses
        self.pf_address = self.vfs.pf_address
        return {"vf_addresses": self.vf_addresses, "pf_address": self.pf_address}
