"""PassthroughHost's resources driven through the SDK's provider server in the order the component declares them.

The component (components/passthrough_host.py) is what `pulumi up` runs; without the CLI, tests and benchmarks use
this flow: the same input builders, the same providers, the same order, one DrivenResource per child resource, and
outputs wired into HostReboot exactly as the component wires them.

Usage::

    with ProviderServer({"gpuhost:testhost-x": pem}) as srv:
        flow = PassthroughFlow(srv, host_cfg)
        flow.up()            # {"preflight": "create", ..., "reboot": "create"}
        flow.preview()       # {"preflight": DiffOutcome(changes=False), ...}
        flow.destroy()
"""

from __future__ import annotations

from typing import Optional

from components.passthrough_host import acknowledged, cmdline_args, host_spec, vm_cpus
from providers.base import host_input
from providers.hugepages import Hugepages2MProvider
from providers.irq import IrqIsolationProvider
from providers.kernel_cmdline import KernelCmdlineProvider
from providers.preflight import HostPreflightProvider
from providers.reboot import HostRebootProvider
from providers.sysctls import SysctlsProvider
from providers.tuning import HostTuningProvider
from providers.vfio import VfioBindingProvider
from stacks.schema import Host
from tests.engine import DiffOutcome, ProviderServer


def declared(h: Host, extra_devices: Optional[list[str]] = None) -> list[tuple[str, object, dict]]:
    """(suffix, provider, inputs) in declaration order, mirroring PassthroughHost (HostReboot's inputs last)."""
    conn = host_input(host_spec(h))
    gpus = [g.address for g in h.gpus if g.passthrough]
    out: list[tuple[str, object, dict]] = [
        (
            "preflight",
            HostPreflightProvider(),
            {
                "host": conn,
                "gpus": gpus,
                "devices": list(extra_devices or []),
                "enables_iommu": True,
                "acs_override_acknowledged": h.acs_override_acknowledged,
                "allow_unsafe_interrupts_acknowledged": h.allow_unsafe_interrupts_acknowledged,
                "bind_by_ids": h.bind == "ids",
                "report": None,
                "failed": None,
                "version": "1",
            },
        ),
        (
            "cmdline",
            KernelCmdlineProvider(),
            {
                "host": conn,
                "family": h.os_family,
                "add": cmdline_args(h),
                "remove": list(h.kernel.remove_args),
                "acknowledged": acknowledged(h),
                **{k: None for k in KernelCmdlineProvider.OUTPUT_ONLY},
                "version": KernelCmdlineProvider.VERSION,
            },
        ),
    ]
    if gpus or extra_devices:
        out.append(
            (
                "vfio",
                VfioBindingProvider(),
                {
                    "host": conn,
                    "devices": gpus + list(extra_devices or []),
                    "mode": h.bind,
                    "blacklist_nouveau": True,
                    "disable_vga": True,
                    **{k: None for k in VfioBindingProvider.OUTPUT_ONLY},
                    "version": VfioBindingProvider.VERSION,
                },
            )
        )
    if h.hugepages.size == "2M" and h.hugepages.per_node:
        out.append(
            (
                "hugepages",
                Hugepages2MProvider(),
                {
                    "host": conn,
                    "per_node": {str(k): v for k, v in h.hugepages.per_node.items()},
                    **{k: None for k in Hugepages2MProvider.OUTPUT_ONLY},
                    "version": Hugepages2MProvider.VERSION,
                },
            )
        )
    if h.tuning.sysctls:
        out.append(
            (
                "sysctls",
                SysctlsProvider(),
                {
                    "host": conn,
                    "values": dict(h.tuning.sysctls),
                    **{k: None for k in SysctlsProvider.OUTPUT_ONLY},
                    "version": SysctlsProvider.VERSION,
                },
            )
        )
    out.append(
        (
            "tuning",
            HostTuningProvider(),
            {
                "host": conn,
                "tuned_profile": h.tuning.tuned_profile,
                "governor": h.tuning.governor,
                **{k: None for k in HostTuningProvider.OUTPUT_ONLY},
                "version": HostTuningProvider.VERSION,
            },
        )
    )
    out.append(
        (
            "reboot",
            HostRebootProvider(),
            {
                "host": conn,
                "policy": h.reboot,
                "expect_args": cmdline_args(h),
                "expect_absent": list(h.kernel.remove_args),
                "expect_drivers": {},
                **{k: None for k in HostRebootProvider.OUTPUT_ONLY},
                "version": HostRebootProvider.VERSION,
            },
        )
    )
    # After the reboot, as the component orders it: IRQ affinities do not survive a reboot.
    if vm_cpus(h):
        out.append(
            (
                "irq",
                IrqIsolationProvider(),
                {
                    "host": conn,
                    "banned_cpus": vm_cpus(h),
                    "pin": [{"match": m, "cpus": list(h.reserved_cpus)} for m in h.irq_pin],
                    **{k: None for k in IrqIsolationProvider.OUTPUT_ONLY},
                    "version": IrqIsolationProvider.VERSION,
                },
            )
        )
    return out


class PassthroughFlow:
    def __init__(self, srv: ProviderServer, h: Host, extra_devices: Optional[list[str]] = None):
        self.h = h
        self.items = declared(h, extra_devices)
        self.res = {
            s: srv.resource(p, f"gpuhost:host:{type(p).__name__.removesuffix('Provider')}", f"{h.name}-{s}")
            for s, p, _ in self.items
        }

    def inputs(self, suffix: str, base: dict) -> dict:
        if suffix != "reboot":
            return base
        # As the component wires it: expected drivers from VfioBinding's output.
        vfio = self.res.get("vfio")
        drivers = (vfio.outputs.get("drivers") or {}) if vfio else {}
        return {**base, "expect_drivers": {a: "vfio-pci" for a in drivers}}

    def up(self) -> dict[str, str]:
        return {s: self.res[s].up(self.inputs(s, inp))[0] for s, _, inp in self.items}

    def preview(self) -> dict[str, DiffOutcome]:
        return {s: self.res[s].preview(self.inputs(s, inp)) for s, _, inp in self.items}

    def refresh(self) -> dict[str, dict]:
        return {s: self.res[s].refresh() for s, _, _ in self.items}

    def destroy(self) -> None:
        for s, _, _ in reversed(self.items):
            self.res[s].destroy()
