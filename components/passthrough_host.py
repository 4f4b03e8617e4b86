"""PassthroughHost: one GPU server made ready for VFIO passthrough, the seeds' host half in one component.

Preflight → kernel command line, VFIO binding, hugepages, sysctls, IRQ isolation, tuning → one verified reboot.
Its children come from `children(name, args)` (pure; tests and the bench drive the same list); stack config turns
into `PassthroughHostArgs` in `stacks/args.py`.

Usage::

    host = PassthroughHost("trt-l40s-01", stacks.args.passthrough_args(fleet.hosts[0]))
    pulumi.export("pending_reboot", host.pending_reboot)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, Optional

from pulumi import Output
from pydantic import BaseModel, ConfigDict, Field

from access.ssh import HostSpec
from components.wiring import Child, Ref, Wired
from providers.base import host_input
from providers.hugepages import Hugepages2M
from providers.irq import IrqIsolation
from providers.kernel_cmdline import KernelCmdline
from providers.preflight import HostPreflight
from providers.reboot import HostReboot
from providers.sysctls import Sysctls
from providers.tuning import HostTuning
from providers.vfio import VfioBinding


class PassthroughHostArgs(BaseModel):
    """Args:
    host: how to reach the server (SSH).
    os_family: "debian" (grub) or "rhel" (grubby).
    gpus / extra_vfio_devices: PCI functions bound to vfio-pci (`bind`: by address or by vendor:device ids).
    cmdline_add / cmdline_remove: kernel arguments (the wanted ones, computed in stacks/args.py from the seeds).
    acknowledged: the unsafe kernel arguments the operator acknowledged (preflight otherwise refuses them).
    hugepages_2m_per_node: 2 MiB pages per NUMA node ({} for none; 1 GiB pages go on the command line).
    sysctls, tuned_profile, governor: runtime tuning.
    reboot: "auto" or "never" (report `pending_reboot` instead).
    irq_banned_cpus / irq_cpus / irq_pin: CPUs irqbalance keeps off (the VMs' ones), and where IRQs matching
    `irq_pin` go (the host's reserve).
    reboot_after: resources this host's reboot waits for (an earlier host's verified reboot, `rollout`).
    drain_timeout_s: running VMs get an ACPI shutdown and this long before the reboot.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    host: HostSpec
    os_family: Literal["debian", "rhel"] = "debian"
    gpus: tuple[str, ...] = ()
    extra_vfio_devices: tuple[str, ...] = ()
    bind: Literal["address", "ids"] = "address"
    cmdline_add: tuple[str, ...] = ()
    cmdline_remove: tuple[str, ...] = ()
    acknowledged: tuple[str, ...] = ()
    hugepages_2m_per_node: dict[str, int] = Field(default_factory=dict)
    sysctls: dict[str, str] = Field(default_factory=dict)
    tuned_profile: Optional[str] = None
    governor: Optional[str] = None
    reboot: Literal["auto", "never"] = "auto"
    irq_banned_cpus: tuple[int, ...] = ()
    irq_cpus: tuple[int, ...] = ()
    irq_pin: tuple[str, ...] = ()
    reboot_after: tuple[Any, ...] = ()
    drain_timeout_s: int = 180


def _vfio_pci(drivers: Any) -> dict[str, str]:
    return {a: "vfio-pci" for a in (drivers or {})}


def _read_spec(c: Child) -> Optional[dict]:
    """What the step plans its change from (its provider's `read_spec`), or None: it reads the host itself."""
    spec = getattr(getattr(c.kind, "PROVIDER", None), "read_spec", None)
    return spec(dict(c.inputs)) if spec else None


@dataclass(frozen=True)
class _Pick:
    """One step's read out of HostPreflight's `read_out` (None when it has none: the step reads for itself)."""

    suffix: str

    def __call__(self, read_out: Any) -> Optional[str]:
        return (read_out or {}).get(self.suffix) if isinstance(read_out, dict) else None


def children(name: str, args: PassthroughHostArgs) -> list[Child]:
    """PassthroughHost's resources in declaration order (HostReboot after all host prep, IRQs after the reboot)."""
    conn = host_input(args.host)
    gpus = list(args.gpus)
    devices = gpus + list(args.extra_vfio_devices)
    out = [
        Child(
            "preflight",
            HostPreflight,
            {
                "host": conn,
                "gpus": gpus,
                "devices": list(args.extra_vfio_devices),
                "enables_iommu": True,
                "acs_override_acknowledged": "acs_override_acknowledged" in args.acknowledged,
                "allow_unsafe_interrupts_acknowledged": "allow_unsafe_interrupts_acknowledged" in args.acknowledged,
                "bind_by_ids": args.bind == "ids",
            },
        ),
        Child(
            "cmdline",
            KernelCmdline,
            {
                "host": conn,
                "family": args.os_family,
                "add": list(args.cmdline_add),
                "remove": list(args.cmdline_remove),
                "acknowledged": list(args.acknowledged),
            },
            after=("preflight",),
        ),
    ]
    if devices:
        out.append(
            Child(
                "vfio",
                VfioBinding,
                {"host": conn, "devices": devices, "mode": args.bind, "blacklist_nouveau": True, "disable_vga": True},
                after=("preflight",),
            )
        )
    if args.hugepages_2m_per_node:
        out.append(
            Child(
                "hugepages", Hugepages2M, {"host": conn, "per_node": dict(args.hugepages_2m_per_node)}, ("preflight",)
            )
        )
    if args.sysctls:
        out.append(Child("sysctls", Sysctls, {"host": conn, "values": dict(args.sysctls)}, ("preflight",)))
    out.append(
        Child(
            "tuning",
            HostTuning,
            {"host": conn, "tuned_profile": args.tuned_profile, "governor": args.governor},
            ("preflight",),
        )
    )
    # One read of the host per `up`: preflight reads what each prep step plans from (`reads`), each step gets it
    # back (`host_read`) and checks it again inside its own change before changing anything.
    steps = [c for c in out if c.suffix != "preflight"]
    reads = {c.suffix: _read_spec(c) for c in steps if _read_spec(c) is not None}
    out[0] = replace(out[0], inputs={**out[0].inputs, "reads": reads})
    out[1:] = [
        replace(c, inputs={**c.inputs, "host_read": Ref("preflight", "read_out", _Pick(c.suffix))})
        if c.suffix in reads
        else c
        for c in steps
    ]
    # The reboot waits for ALL host prep, not only the boot-time resources: under the engine every step runs as
    # soon as its dependencies are done, so a sysctl or tuned change ordered only after preflight would run in
    # parallel with the reboot (and its SSH session die with it).
    prep = [c.suffix for c in out if c.suffix not in ("preflight",)]
    out.append(
        Child(
            "reboot",
            HostReboot,
            {
                "host": conn,
                "policy": args.reboot,
                "expect_args": list(args.cmdline_add),
                "expect_absent": list(args.cmdline_remove),
                "expect_drivers": Ref("vfio", "drivers", _vfio_pci) if devices else {},
                # Running libvirt domains are shut down gracefully before the reboot and started again after it.
                "drain_timeout": args.drain_timeout_s,
                # Ordering only: the wanted running state is in expect_*; pending flags would change on every refresh.
            },
            after=tuple(prep),
            after_outside=tuple(args.reboot_after),
        )
    )
    # IRQ affinities are runtime state a reboot loses: pin them once the host runs its final kernel.
    if args.irq_banned_cpus:
        out.append(
            Child(
                "irq",
                IrqIsolation,
                {
                    "host": conn,
                    "banned_cpus": list(args.irq_banned_cpus),
                    "pin": [{"match": m, "cpus": list(args.irq_cpus)} for m in args.irq_pin],
                },
                after=("reboot",),
            )
        )
    return out


class PassthroughHost(Wired, type_name="gpuhost:host:PassthroughHost", children=children):
    def wire(self, args: PassthroughHostArgs, made: dict[str, Any]) -> dict[str, Any]:
        self.preflight_check = made["preflight"]
        self.cmdline = made["cmdline"]
        self.vfio = made.get("vfio")
        self.hugepages = made.get("hugepages")
        self.sysctls = made.get("sysctls")
        self.tuning = made["tuning"]
        self.reboot = made["reboot"]
        self.irq = made.get("irq")
        self.pending_reboot = self.reboot.pending
        self.drivers = self.vfio.drivers if self.vfio else Output.from_input({})
        self.preflight = self.preflight_check.report
        return {
            "pending_reboot": self.pending_reboot,
            "drivers": self.drivers,
            "preflight": self.preflight,
            "cmdline": self.cmdline.configured,
        }
