"""PinnedVM: one tenant VM of seed 002 — pinned vCPUs and hugepage memory on its GPU's NUMA node, the GPU (every
function) and an SR-IOV VF passed through — and, optionally, the guest's GPU stack (driver, Docker,
nvidia-container-toolkit, persistence mode, MPS).

The placement comes from the host-wide solver (`plans.placement.place`), run once per host over all its VMs, so
that no two VMs share a core; each VM's `VmPlacement` is handed to its PinnedVM.

Usage::

    plan = place(from_facts(host_facts, reserved_cpus=[0, 32]), requests)
    for req in requests:
        PinnedVM(req.name, PinnedVMArgs(host=spec, placement=plan.vm(req.name), gpus=req.gpus, vfs=req.vfs,
                 base_image="/var/lib/libvirt/images/jammy.qcow2",
                 cloud_init=CloudInit(user="ops", ssh_authorized_keys=[pub])))
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from access.ssh import HostSpec
from components.wiring import Child, Later, Wired
from plans.domain_xml import DEFAULT_LOADER, DEFAULT_VARS, CloudInit, DomainSpec
from plans.guest_bootstrap import BootstrapConfig
from plans.placement import VmPlacement, cpuset_str
from providers.base import host_input
from providers.guest_bootstrap import GuestBootstrap
from providers.libvirt_domain import LibvirtDomain


class PinnedVMArgs(BaseModel):
    """Args:
    host: the hypervisor (SSH).
    placement: this VM's share of the host's placement plan.
    gpus / vfs: PCI functions to pass through (every function of each GPU; VFs on the same node).
    base_image: qcow2 the VM's disk overlays; disk_dir must be a libvirt storage pool's directory.
    consumer_card: hide KVM and set a Hyper-V vendor id (seed 001's 4090 route).
    guest / bootstrap: how to reach the guest and what to install there (optional).
    uri: a libvirt URI instead of SSH (tests: `test:///default`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    host: Optional[HostSpec] = None
    uri: Optional[str] = None
    placement: VmPlacement
    gpus: tuple[str, ...] = ()
    vfs: tuple[str, ...] = ()
    # VF addresses known only once SriovNic has carved them (its `vf_addresses` output, sliced per VM).
    vfs_output: Optional[Any] = None
    base_image: Optional[str] = None
    # False: no disk device at all (a firmware-only guest; the emulated dev server has no storage pool for one).
    with_disk: bool = True
    disk_dir: str = "/var/lib/libvirt/images"
    capacity_gib: int = Field(40, gt=0)
    cloud_init: Optional[CloudInit] = None
    network: Optional[str] = "default"
    # A host bridge instead of the libvirt network (the guest's static address comes from cloud_init.network).
    bridge: Optional[str] = None
    mac: Optional[str] = None
    consumer_card: bool = False
    domain_type: Literal["kvm", "qemu", "test"] = "kvm"
    cpu_mode: Literal["host-passthrough", "maximum"] = "host-passthrough"
    loader: Optional[str] = DEFAULT_LOADER
    nvram_template: Optional[str] = DEFAULT_VARS
    keep_disk: bool = True
    shutdown_timeout: float = 120
    guest: Optional[HostSpec] = None
    bootstrap: Optional[BootstrapConfig] = None

    def domain_spec(self, name: str) -> DomainSpec:
        return DomainSpec.from_placement(
            self.placement,
            name=name,
            domain_type=self.domain_type,
            cpu_mode=self.cpu_mode,
            loader=self.loader,
            nvram_template=self.nvram_template,
            disk=f"{self.disk_dir.rstrip('/')}/{name}.qcow2" if self.with_disk else None,
            seed_iso=f"{self.disk_dir.rstrip('/')}/{name}-seed.iso" if self.cloud_init else None,
            network=None if self.bridge else self.network,
            bridge=self.bridge,
            mac=self.mac,
            gpus=self.gpus,
            vfs=self.vfs,
            hide_kvm=self.consumer_card,
            hv_vendor_id="gpuhost" if self.consumer_card else None,
        )


def children(name: str, args: PinnedVMArgs) -> list[Child]:
    """The libvirt domain, then (with a guest address and a bootstrap config) the guest's GPU stack."""
    if not args.host and not args.uri:
        raise ValueError("PinnedVM needs `host` or `uri`")
    domain: Any = args.domain_spec(args.placement.name).model_dump(mode="json")
    if args.vfs_output is not None:
        domain = Later(
            args.vfs_output,
            lambda vfs: (
                args.model_copy(update={"vfs": tuple(vfs or ()), "vfs_output": None})
                .domain_spec(args.placement.name)
                .model_dump(mode="json")
            ),
        )
    dom_inputs: dict[str, Any] = {
        "domain": domain,
        "storage": {"base_image": args.base_image, "capacity_gib": args.capacity_gib},
        "cloud_init": args.cloud_init.model_dump(mode="json") if args.cloud_init else None,
        "keep_disk": args.keep_disk,
        "shutdown_timeout": args.shutdown_timeout,
    }
    if args.uri:
        dom_inputs["uri"] = args.uri
    else:
        assert args.host is not None
        dom_inputs["host"] = host_input(args.host)
    out = [Child("domain", LibvirtDomain, dom_inputs)]
    if args.guest and args.bootstrap:
        out.append(
            Child(
                "bootstrap",
                GuestBootstrap,
                {"host": host_input(args.guest), "config": args.bootstrap.model_dump(mode="json")},
                after=("domain",),
            )
        )
    return out


class PinnedVM(Wired, type_name="gpuhost:vm:PinnedVM", children=children):
    def wire(self, args: PinnedVMArgs, made: dict[str, Any]) -> dict[str, Any]:
        self.domain = made["domain"]
        outputs = {
            "uuid": self.domain.uuid,
            "state": self.domain.state,
            "vcpus": cpuset_str(args.placement.vcpupin),
            "node": args.placement.node,
        }
        self.bootstrap = made.get("bootstrap")
        if self.bootstrap is not None:
            outputs["bootstrap_done"] = self.bootstrap.done
        self.uuid = self.domain.uuid
        self.state = self.domain.state
        return outputs
