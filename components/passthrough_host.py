"""PassthroughHost: one GPU server made ready for VFIO passthrough, the seeds' host half in one component.

Preflight → kernel command line, VFIO binding, hugepages, sysctls, IRQ isolation, tuning → one verified reboot.
Its children come from `children(name, args)` (pure; tests and the bench drive the same list), which reads top to
bottom as one call per resource (`preflight`, `cmdline`, `vfio_binding`, ..., `reboot`, `irq`); stack config turns
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
from components.wiring import Child, Wired, present, suffixes
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
    """PassthroughHost's resources in declaration order: preflight, the host prep, one reboot after all of it, then
    the IRQs (which a reboot would lose)."""
    conn = host_input(args.host)
    check = preflight(conn, args)
    vfio = vfio_binding(conn, args, check)
    prep = present(
        cmdline(conn, args, check),
        vfio,
        hugepages(conn, args, check),
        sysctls(conn, args, check),
        tuning(conn, args, check),
    )
    check, prep = read_once(check, prep)
    boot = reboot(conn, args, prep, vfio)
    return [check, *prep, boot, *present(irq(conn, args, boot))]


def preflight(conn: dict, args: PassthroughHostArgs) -> Child:
    """HostPreflight: refuses a host that cannot take the change (IOMMU, ACS, unsafe arguments) before any prep."""
    return Child(
        "preflight",
        HostPreflight,
        {
            "host": conn,
            "gpus": list(args.gpus),
            "devices": list(args.extra_vfio_devices),
            "enables_iommu": True,
            "acs_override_acknowledged": "acs_override_acknowledged" in args.acknowledged,
            "allow_unsafe_interrupts_acknowledged": "allow_unsafe_interrupts_acknowledged" in args.acknowledged,
            "bind_by_ids": args.bind == "ids",
        },
    )


def cmdline(conn: dict, args: PassthroughHostArgs, check: Child) -> Child:
    """KernelCmdline: the wanted kernel arguments in GRUB (they take effect at the reboot)."""
    return Child(
        "cmdline",
        KernelCmdline,
        {
            "host": conn,
            "family": args.os_family,
            "add": list(args.cmdline_add),
            "remove": list(args.cmdline_remove),
            "acknowledged": list(args.acknowledged),
        },
        after=suffixes(check),
    )


def vfio_binding(conn: dict, args: PassthroughHostArgs, check: Child) -> Optional[Child]:
    """VfioBinding of the GPUs and extra devices to vfio-pci (None when there are none)."""
    devices = list(args.gpus) + list(args.extra_vfio_devices)
    if not devices:
        return None
    return Child(
        "vfio",
        VfioBinding,
        {"host": conn, "devices": devices, "mode": args.bind, "blacklist_nouveau": True, "disable_vga": True},
        after=suffixes(check),
    )


def hugepages(conn: dict, args: PassthroughHostArgs, check: Child) -> Optional[Child]:
    """Hugepages2M per NUMA node (None when none are wanted)."""
    if not args.hugepages_2m_per_node:
        return None
    return Child(
        "hugepages", Hugepages2M, {"host": conn, "per_node": dict(args.hugepages_2m_per_node)}, suffixes(check)
    )


def sysctls(conn: dict, args: PassthroughHostArgs, check: Child) -> Optional[Child]:
    """Sysctls (None when none are wanted)."""
    if not args.sysctls:
        return None
    return Child("sysctls", Sysctls, {"host": conn, "values": dict(args.sysctls)}, suffixes(check))


def tuning(conn: dict, args: PassthroughHostArgs, check: Child) -> Child:
    """HostTuning: the tuned profile and the CPU governor."""
    return Child(
        "tuning",
        HostTuning,
        {"host": conn, "tuned_profile": args.tuned_profile, "governor": args.governor},
        suffixes(check),
    )


def read_once(check: Child, steps: list[Child]) -> tuple[Child, list[Child]]:
    """One read of the host per `up`: preflight reads what each prep step plans from (`reads`), each step gets it
    back (`host_read`) and checks it again inside its own change before changing anything."""
    reads = {c.suffix: _read_spec(c) for c in steps if _read_spec(c) is not None}
    check = replace(check, inputs={**check.inputs, "reads": reads})
    steps = [
        replace(c, inputs={**c.inputs, "host_read": check.ref("read_out", _Pick(c.suffix))}) if c.suffix in reads else c
        for c in steps
    ]
    return check, steps


def reboot(conn: dict, args: PassthroughHostArgs, prep: list[Child], vfio: Optional[Child]) -> Child:
    """HostReboot into the wanted kernel and drivers, verified. It waits for ALL host prep, not only the boot-time
    resources: under the engine every step runs as soon as its dependencies are done, so a sysctl or tuned change
    ordered only after preflight would run in parallel with the reboot (and its SSH session die with it)."""
    return Child(
        "reboot",
        HostReboot,
        {
            "host": conn,
            "policy": args.reboot,
            "expect_args": list(args.cmdline_add),
            "expect_absent": list(args.cmdline_remove),
            "expect_drivers": vfio.ref("drivers", _vfio_pci) if vfio else {},
            # Running libvirt domains are shut down gracefully before the reboot and started again after it.
            "drain_timeout": args.drain_timeout_s,
            # Ordering only: the wanted running state is in expect_*; pending flags would change on every refresh.
        },
        after=suffixes(*prep),
        after_outside=tuple(args.reboot_after),
    )


def irq(conn: dict, args: PassthroughHostArgs, boot: Child) -> Optional[Child]:
    """IrqIsolation once the host runs its final kernel (IRQ affinities are runtime state a reboot loses); None when
    no CPUs are kept free of IRQs."""
    if not args.irq_banned_cpus:
        return None
    return Child(
        "irq",
        IrqIsolation,
        {
            "host": conn,
            "banned_cpus": list(args.irq_banned_cpus),
            "pin": [{"match": m, "cpus": list(args.irq_cpus)} for m in args.irq_pin],
        },
        after=suffixes(boot),
    )


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
