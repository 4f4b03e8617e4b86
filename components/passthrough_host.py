"""PassthroughHost: one GPU server made ready for VFIO passthrough, the seeds' host half in one component.

Preflight → kernel command line, VFIO binding, hugepages, sysctls, IRQ isolation, tuning → one verified reboot.

Usage::

    host = PassthroughHost("trt-l40s-01", PassthroughHostArgs(host=fleet.hosts[0]))
    pulumi.export("pending_reboot", host.pending_reboot)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from pulumi import ComponentResource, Output, ResourceOptions

from access.ssh import HostSpec, JumpHost
from providers.base import host_input
from providers.hugepages import Hugepages2M
from providers.irq import IrqIsolation
from providers.kernel_cmdline import KernelCmdline
from providers.preflight import HostPreflight
from providers.reboot import HostReboot
from providers.sysctls import Sysctls
from providers.tuning import HostTuning
from providers.vfio import VfioBinding
from stacks.schema import Host


def host_spec(h: Host) -> HostSpec:
    j = h.ssh.jump
    return HostSpec(
        name=h.name,
        address=h.ssh.address,
        port=h.ssh.port,
        user=h.ssh.user,
        host_key=h.ssh.host_key,
        insecure_accept_unknown_host_key=h.ssh.insecure_accept_unknown_host_key,
        key_name=h.ssh.key_name,
        connect_timeout=h.ssh.connect_timeout,
        jump=JumpHost(address=j.address, port=j.port, user=j.user, host_key=j.host_key) if j else None,
    )


def all_cpus(h: Host) -> list[int]:
    t = h.topology
    return list(range(t.sockets * t.cores_per_socket * t.threads_per_core)) if t else []


def vm_cpus(h: Host) -> list[int]:
    """CPUs given to VMs: everything but the host reserve (the reserve keeps IRQs, emulator threads, sshd)."""
    return [c for c in all_cpus(h) if c not in set(h.reserved_cpus)]


def cmdline_args(h: Host) -> list[str]:
    """The kernel arguments this host needs (seed 000 §3.2, 001 §5.1, 002 §3/§6/§13)."""
    k = h.kernel
    args = ["amd_iommu=on" if h.cpu_vendor == "amd" else "intel_iommu=on"]
    if k.iommu_passthrough:
        args.append("iommu=pt")
    if k.kvm_ignore_msrs:
        args.append("kvm.ignore_msrs=1")
    if k.video_efifb_off:
        args.append("video=efifb:off")
    if h.hugepages.size == "1G" and h.hugepages.count:
        args += ["default_hugepagesz=1G", "hugepagesz=1G", f"hugepages={h.hugepages.count}"]
    if k.isolate_vm_cpus and vm_cpus(h):
        from facts.cpulist import format_cpulist

        cl = format_cpulist(vm_cpus(h))
        args += [f"isolcpus={cl}", f"nohz_full={cl}"]
    return args + list(k.extra_args)


def acknowledged(h: Host) -> list[str]:
    return [n for n in ("acs_override_acknowledged", "allow_unsafe_interrupts_acknowledged") if getattr(h, n)]


@dataclass
class PassthroughHostArgs:
    host: Host
    extra_vfio_devices: list[str] = field(default_factory=list)
    # Rollout: this host's reboot waits for these resources (earlier hosts' verified reboots, see stacks/program.py).
    reboot_after: list = field(default_factory=list)
    # libvirt domains on this host that the stack manages (drained before a reboot like any running domain).
    drain_timeout_s: int = 180


class PassthroughHost(ComponentResource):
    pending_reboot: Output
    drivers: Output
    preflight: Output

    def __init__(self, name: str, args: PassthroughHostArgs, opts: Optional[ResourceOptions] = None):
        super().__init__("gpuhost:host:PassthroughHost", name, None, opts)
        h = args.host
        conn = host_input(host_spec(h))
        child = ResourceOptions(parent=self)
        gpus = [g.address for g in h.gpus if g.passthrough]
        args_wanted = cmdline_args(h)

        self.preflight_check = HostPreflight(
            f"{name}-preflight",
            {
                "host": conn,
                "gpus": gpus,
                "devices": list(args.extra_vfio_devices),
                "enables_iommu": True,
                "acs_override_acknowledged": h.acs_override_acknowledged,
                "allow_unsafe_interrupts_acknowledged": h.allow_unsafe_interrupts_acknowledged,
                "bind_by_ids": h.bind == "ids",
            },
            child,
        )
        after_preflight = ResourceOptions(parent=self, depends_on=[self.preflight_check])

        self.cmdline = KernelCmdline(
            f"{name}-cmdline",
            {
                "host": conn,
                "family": h.os_family,
                "add": args_wanted,
                "remove": list(h.kernel.remove_args),
                "acknowledged": acknowledged(h),
            },
            after_preflight,
        )
        boot_time = [self.cmdline]
        self.vfio = None
        if gpus or args.extra_vfio_devices:
            self.vfio = VfioBinding(
                f"{name}-vfio",
                {
                    "host": conn,
                    "devices": gpus + list(args.extra_vfio_devices),
                    "mode": h.bind,
                    "blacklist_nouveau": True,
                    "disable_vga": True,
                },
                after_preflight,
            )
            boot_time.append(self.vfio)
        self.hugepages = None
        if h.hugepages.size == "2M" and h.hugepages.per_node:
            self.hugepages = Hugepages2M(
                f"{name}-hugepages",
                {"host": conn, "per_node": {str(k): v for k, v in h.hugepages.per_node.items()}},
                after_preflight,
            )
        self.sysctls = None
        if h.tuning.sysctls:
            self.sysctls = Sysctls(f"{name}-sysctls", {"host": conn, "values": dict(h.tuning.sysctls)}, after_preflight)
        self.tuning = HostTuning(
            f"{name}-tuning",
            {"host": conn, "tuned_profile": h.tuning.tuned_profile, "governor": h.tuning.governor},
            after_preflight,
        )

        expect_drivers = self.vfio.drivers.apply(lambda d: {a: "vfio-pci" for a in (d or {})}) if self.vfio else {}
        # The reboot waits for ALL host prep, not only the boot-time resources: under the engine every step runs as
        # soon as its dependencies are done, so a sysctl or tuned change ordered only after preflight would run in
        # parallel with the reboot (and its SSH session die with it).
        host_prep = [r for r in (self.hugepages, self.sysctls, self.tuning) if r is not None]
        self.reboot = HostReboot(
            f"{name}-reboot",
            {
                "host": conn,
                "policy": h.reboot,
                "expect_args": args_wanted,
                "expect_absent": list(h.kernel.remove_args),
                "expect_drivers": expect_drivers,
                # Running libvirt domains are shut down gracefully before the reboot and started again after it.
                "drain_timeout": args.drain_timeout_s,
                # Ordering only: the wanted running state is in expect_*; pending flags would change on every refresh.
            },
            ResourceOptions(parent=self, depends_on=boot_time + host_prep + list(args.reboot_after)),
        )

        # IRQ affinities are runtime state a reboot loses: pin them once the host runs its final kernel.
        self.irq = None
        if vm_cpus(h):
            self.irq = IrqIsolation(
                f"{name}-irq",
                {
                    "host": conn,
                    "banned_cpus": vm_cpus(h),
                    "pin": [{"match": m, "cpus": list(h.reserved_cpus)} for m in h.irq_pin],
                },
                ResourceOptions(parent=self, depends_on=[self.reboot]),
            )

        self.pending_reboot = self.reboot.pending
        self.drivers = self.vfio.drivers if self.vfio else Output.from_input({})
        self.preflight = self.preflight_check.report
        self.register_outputs(
            {
                "pending_reboot": self.pending_reboot,
                "drivers": self.drivers,
                "preflight": self.preflight,
                "cmdline": self.cmdline.configured,
            }
        )
