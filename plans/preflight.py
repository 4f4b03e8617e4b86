"""Preflight: can this host pass these GPUs through? PASS/WARN/FAIL per check, each failure naming the seeds' fix.

Pure: facts in, findings out. Providers run it in `check`, so `pulumi preview` fails before anything changes.

Usage::

    findings = preflight(facts, PreflightWant(gpus=["0000:81:00.0"], enables_iommu=True))
    failures = [f for f in findings if f.status == "FAIL"]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from facts.model import HostFacts, PciDevice, normalize_pci
from plans.cmdline import UNSAFE, parse_value
from plans.values import param_name

Status = Literal["PASS", "WARN", "FAIL"]
LARGE_BAR = 256 << 20  # seed 000: without Above 4G Decoding a GPU's BAR is squeezed to 256 MB below 4 GiB


@dataclass
class Finding:
    check: str
    status: Status
    message: str
    fix: str = ""

    def __str__(self) -> str:
        return f"[{self.status}] {self.check}: {self.message}" + (f" — fix: {self.fix}" if self.fix else "")


@dataclass
class PreflightWant:
    gpus: list[str] = field(default_factory=list)
    # Other devices to hand to vfio (e.g. SR-IOV VFs); same safety checks, no slot/BAR checks.
    devices: list[str] = field(default_factory=list)
    enables_iommu: bool = False  # this stack adds intel_iommu=on/amd_iommu=on (pending reboot is fine)
    acs_override_acknowledged: bool = False
    allow_unsafe_interrupts_acknowledged: bool = False
    bind_by_ids: bool = False  # `options vfio-pci ids=` claims every device with these IDs


SUPPORTED = ("debian", "rhel")


def preflight(f: HostFacts, w: PreflightWant) -> list[Finding]:
    """Every check, in the order a reader fixes them: the OS, the IOMMU, overrides, then each GPU and device."""
    overrides = active_overrides(f)
    # the stack turns the IOMMU on itself: what only an active IOMMU shows is known after its reboot
    pending = not f.iommu.active and w.enables_iommu and f.iommu.firmware_table
    out = [
        os_check(f),
        *iommu_firmware_checks(f),
        *override_checks(overrides, w),
        iommu_active_check(f, pending),
        interrupt_remapping_check(f, w, pending),
    ]
    protected = f.network.protected_pci
    faked_groups = "pcie_acs_override" in overrides
    for raw in w.gpus:
        out += gpu_checks(f, w, normalize_pci(raw), protected, faked_groups, pending)
    for raw in w.devices:
        out += device_checks(f, normalize_pci(raw), protected)
    return out


def os_check(f: HostFacts) -> Finding:
    fam = f.os.family
    if fam in SUPPORTED:
        return Finding("os", "PASS", f"{f.os.pretty_name or f.os.id} ({fam} family)")
    return Finding(
        "os", "FAIL", f"unsupported OS {f.os.id!r} {f.os.version_id}", "use a Debian/Ubuntu or RHEL-family host"
    )


def iommu_firmware_checks(f: HostFacts) -> list[Finding]:
    """Is this machine a VM guest (a warning), and does its firmware describe an IOMMU (DMAR/IVRS)?"""
    out = []
    guest = f.virt.guest
    if guest:
        out.append(
            Finding(
                "machine",
                "WARN",
                f"this machine is a VM guest ({f.virt.what}): passthrough here is nested and "
                "needs the hypervisor to give it a virtual IOMMU and the devices",
            )
        )
    if f.iommu.firmware_table:
        out.append(Finding("iommu-firmware", "PASS", "DMAR (Intel VT-d)" if f.iommu.dmar_table else "IVRS (AMD-Vi)"))
    elif guest:
        out.append(
            Finding(
                "iommu-firmware",
                "FAIL",
                f"no DMAR/IVRS ACPI table, and this machine is a VM guest "
                f"({f.virt.what}): its hypervisor gives it no virtual IOMMU (not a BIOS setting)",
                "run gpuhost against the bare-metal host, or give this VM a vIOMMU (QEMU: -machine q35 "
                "-device intel-iommu,intremap=on; libvirt: <iommu model='intel'/>)",
            )
        )
    else:
        out.append(
            Finding(
                "iommu-firmware",
                "FAIL",
                "no DMAR/IVRS ACPI table: the IOMMU is off in firmware",
                "enable VT-d (Intel) or SVM + IOMMU (AMD) in BIOS, then reboot",
            )
        )
    return out


def override_checks(overrides: dict[str, list[str]], w: PreflightWant) -> list[Finding]:
    """One finding per isolation override already set: a warning when acknowledged, else a failure."""
    acked = {
        flag
        for flag, on in (
            ("acs_override_acknowledged", w.acs_override_acknowledged),
            ("allow_unsafe_interrupts_acknowledged", w.allow_unsafe_interrupts_acknowledged),
        )
        if on
    }
    out = []
    for name, where in sorted(overrides.items()):
        flag = UNSAFE[name]
        text = f"{name} is already set ({'; '.join(where)})"
        if flag in acked:
            out.append(Finding(f"override {name}", "WARN", text + f"; acknowledged with {flag}"))
        else:
            out.append(
                Finding(
                    f"override {name}",
                    "FAIL",
                    text + ": " + _OVERRIDE_WHY[name],
                    f"remove it from there and reboot, or set {flag}: true on the host to accept the risk",
                )
            )
    return out


def iommu_active_check(f: HostFacts, pending: bool) -> Finding:
    if f.iommu.active:
        return Finding("iommu-active", "PASS", f"{len(f.iommu.groups)} IOMMU groups")
    if pending:
        return Finding(
            "iommu-active",
            "WARN",
            "no IOMMU groups yet; this stack adds intel_iommu=on/amd_iommu=on, active after its reboot",
        )
    return Finding(
        "iommu-active",
        "FAIL",
        "no IOMMU groups: the kernel is not using the IOMMU",
        "add intel_iommu=on iommu=pt (or amd_iommu=on iommu=pt) to the kernel command line and reboot",
    )


def interrupt_remapping_check(f: HostFacts, w: PreflightWant, pending: bool) -> Finding:
    if f.iommu.interrupt_remapping:
        return Finding("interrupt-remapping", "PASS", f.iommu.remapping_evidence or "enabled")
    if pending:
        return Finding("interrupt-remapping", "WARN", "cannot be verified until the IOMMU is active (after reboot)")
    if w.allow_unsafe_interrupts_acknowledged:
        return Finding(
            "interrupt-remapping",
            "WARN",
            "interrupt remapping is off; running with "
            "vfio_iommu_type1.allow_unsafe_interrupts=1 as acknowledged — a VM can inject interrupts",
        )
    return Finding(
        "interrupt-remapping",
        "FAIL",
        "interrupt remapping is not enabled; gpuhost will not set vfio_iommu_type1.allow_unsafe_interrupts",
        "enable x2APIC / interrupt remapping in BIOS (VT-d), or acknowledge the risk explicitly with "
        "allow_unsafe_interrupts_acknowledged",
    )


def gpu_checks(
    f: HostFacts, w: PreflightWant, addr: str, protected: set[str], faked_groups: bool, pending: bool
) -> list[Finding]:
    """One GPU: it exists, its slot's functions, device safety, its IOMMU group, BARs, NUMA node, `ids=` binding."""
    d = f.device(addr)
    if d is None:
        displays = sorted(x.address for x in f.pci.values() if x.is_display)
        return [
            Finding(
                f"gpu {addr}",
                "FAIL",
                f"unknown PCI address {addr}: no such device on this host "
                f"(display-class devices here: {', '.join(displays) or 'none'})",
                "check `lspci -nn | egrep -i 'nvidia|vga|3d'` and fix the address in stack config",
            )
        ]
    funcs = f.slot_functions(addr)
    out = [
        Finding(
            f"gpu {addr} functions",
            "PASS",
            "slot functions: " + ", ".join(f"{x.address} [{x.vendor_device}]" for x in funcs),
        )
    ]
    _device_safety(f, addr, protected, out)
    out += gpu_group_checks(f, w, addr, d, funcs, faked_groups, pending)
    out.append(gpu_bars_check(addr, d))
    if len(f.nodes) > 1 and d.numa_node < 0:
        out.append(Finding(f"gpu {addr} numa", "WARN", "firmware reports no NUMA node for this device"))
    else:
        out.append(Finding(f"gpu {addr} numa", "PASS", f"NUMA node {max(d.numa_node, 0)}"))
    if w.bind_by_ids:
        out += bind_by_ids_checks(f, addr, d, funcs, protected)
    return out


def gpu_group_checks(
    f: HostFacts,
    w: PreflightWant,
    addr: str,
    d: PciDevice,
    funcs: list[PciDevice],
    faked_groups: bool,
    pending: bool,
) -> list[Finding]:
    """Does the GPU's IOMMU group hold only its own slot (and bridges)? Nothing to say without groups yet."""
    if d.iommu_group is None:
        if pending:
            return [Finding(f"gpu {addr} iommu-group", "WARN", "group membership known only after the IOMMU is active")]
        return []
    slot_addrs = {x.address for x in funcs}
    intruders = [m for m in f.group_members(addr) if m.address not in slot_addrs and not m.is_bridge]
    if intruders:
        names = ", ".join(f"{m.address} [{m.vendor_device}] ({m.driver or 'no driver'})" for m in intruders)
        if w.acs_override_acknowledged:
            return [
                Finding(
                    f"gpu {addr} iommu-group",
                    "WARN",
                    f"IOMMU group {d.iommu_group} also holds {names}; "
                    "pcie_acs_override acknowledged — isolation between these devices is NOT real",
                )
            ]
        return [
            Finding(
                f"gpu {addr} iommu-group",
                "FAIL",
                f"IOMMU group {d.iommu_group} is not clean: it also holds {names}",
                "move the GPU to another slot or adjust PCIe bifurcation/ACS in BIOS; pass the whole "
                "group through; pcie_acs_override only as a last resort with "
                "acs_override_acknowledged",
            )
        ]
    if faked_groups:
        return [
            Finding(
                f"gpu {addr} iommu-group",
                "WARN",
                f"group {d.iommu_group} holds only this slot, but "
                "pcie_acs_override is active: the kernel splits groups without real isolation",
            )
        ]
    return [Finding(f"gpu {addr} iommu-group", "PASS", f"group {d.iommu_group} holds only this slot (and bridges)")]


def gpu_bars_check(addr: str, d: PciDevice) -> Finding:
    """Seed 000: a memory BAR must be assigned, and a large prefetchable one must sit above 4 GiB."""
    mem = [b for b in d.bars if b.is_mem and b.index < 6]
    if d.bars and not any(b.assigned for b in mem):
        return Finding(
            f"gpu {addr} bars",
            "FAIL",
            "no memory BAR assigned (not enough MMIO)",
            "enable Above 4G Decoding (and Resizable BAR) in BIOS",
        )
    low_large = [b for b in mem if b.prefetchable and b.size >= LARGE_BAR and not b.above_4g]
    if low_large:
        return Finding(
            f"gpu {addr} bars",
            "FAIL",
            "large prefetchable BAR placed below 4 GiB: "
            + ", ".join(f"BAR{b.index} {b.size >> 20} MiB at {b.start:#x}" for b in low_large),
            "enable Above 4G Decoding / Resizable BAR in BIOS",
        )
    return Finding(
        f"gpu {addr} bars",
        "PASS",
        ", ".join(
            f"BAR{b.index} {b.size >> 20 if b.size >= 1 << 20 else b.size} "
            f"{'MiB' if b.size >= 1 << 20 else 'B'}{' >4G' if b.above_4g else ''}"
            for b in mem
            if b.assigned
        )
        or "no memory BARs",
    )


def bind_by_ids_checks(
    f: HostFacts, addr: str, d: PciDevice, funcs: list[PciDevice], protected: set[str]
) -> list[Finding]:
    """`vfio-pci ids=` claims every device with the slot's IDs: none of the others may be the console or SSH NIC."""
    ids = {x.vendor_device for x in funcs}
    others = [x for x in f.pci.values() if x.vendor_device in ids and x.slot != d.slot]
    bad = [x for x in others if x.boot_vga or x.address in protected]
    if not bad:
        return []
    return [
        Finding(
            f"gpu {addr} bind-by-ids",
            "FAIL",
            "`vfio-pci ids=` would also claim "
            + ", ".join(f"{x.address} ({'boot display' if x.boot_vga else 'SSH/route NIC'})" for x in bad),
            "bind by PCI address (driverctl / driver_override) instead",
        )
    ]


def device_checks(f: HostFacts, addr: str, protected: set[str]) -> list[Finding]:
    """Another device for vfio (an SR-IOV VF): it exists, and the device-safety checks."""
    if f.device(addr) is None:
        return [Finding(f"device {addr}", "FAIL", f"unknown PCI address {addr}: no such device on this host")]
    out: list[Finding] = []
    _device_safety(f, addr, protected, out)
    return out


_OVERRIDE_WHY = {
    "pcie_acs_override": "IOMMU groups are split by the kernel without hardware isolation, so a clean group "
    "proves nothing",
    "vfio_iommu_type1.allow_unsafe_interrupts": "vfio accepts devices without interrupt remapping, so a VM can "
    "inject interrupts into the host",
    "vfio.enable_unsafe_noiommu_mode": "vfio hands out devices with no IOMMU at all, so a device can DMA anywhere "
    "in the host's memory",
}
_FALSE = ("", "0", "n", "no", "off", "false")


def active_overrides(f: HostFacts) -> dict[str, list[str]]:
    """Isolation overrides already in force or about to be: {parameter: [where it is set]}.

    Looks at the running kernel (/proc/cmdline), the next boot (GRUB_CMDLINE_LINUX(_DEFAULT), BLS entries), the
    live module parameter and modprobe.d `options` lines; names compared as the kernel does (`-` = `_`).
    """
    out: dict[str, list[str]] = {}

    def note(arg: str, where: str) -> None:
        name = param_name(arg)
        if name in UNSAFE:
            value = arg.split("=", 1)[1] if "=" in arg else "1"
            if name == "pcie_acs_override" or value.strip().lower() not in _FALSE:
                out.setdefault(name, [])
                if where not in out[name]:
                    out[name].append(where)

    for a in f.cmdline:
        note(a, "running kernel command line")
    for line in f.boot_config:
        if line.startswith("BLS "):
            args, where = line[4:].split(), "boot loader entry"
        else:
            var, _, value = line.partition("=")
            args, where = parse_value(value), f"/etc/default/grub {var.split()[-1]}"
        for a in args:
            note(a, where)
    for p, value in f.module_params.items():
        if value.strip().lower() not in _FALSE:
            mod, _, par = p.partition(".")
            note(f"{p}={value.strip()}", f"/sys/module/{mod}/parameters/{par}")
    for path, text in f.module_config.items():
        for line in text.splitlines():
            words = line.split()
            if len(words) >= 3 and words[0] == "options":
                for w in words[2:]:
                    note(f"{words[1]}.{w}", path)
    return out


def _device_safety(f: HostFacts, addr: str, protected: set[str], out: list[Finding]) -> None:
    # callers check the device exists, and then its slot's functions include it
    for x in f.slot_functions(addr):
        if x.boot_vga:
            out.append(
                Finding(
                    f"{addr} boot-display",
                    "FAIL",
                    f"{x.address} is the boot display (boot_vga=1); binding it to vfio takes the console away",
                    "pass through a GPU that is not the primary display, or make the onboard VGA primary",
                )
            )
        if x.address in protected:
            out.append(
                Finding(
                    f"{addr} ssh-nic",
                    "FAIL",
                    f"{x.address} carries the SSH session or the default route (through "
                    f"{', '.join(f.network.carrier_of(x.address)) or 'its interface'}); binding it to vfio cuts this "
                    "host off",
                    "choose another device",
                )
            )


def binding_refusals(f: HostFacts, addresses: list[str]) -> list[Finding]:
    """The device-safety checks alone (boot display, the NIC under the SSH session or default route), for the
    binding provider to repeat right before it binds: preview may be skipped, the host may have changed."""
    out: list[Finding] = []
    for a in addresses:
        if f.device(a) is not None:
            _device_safety(f, normalize_pci(a), f.network.protected_pci, out)
    return out


def failures(findings: list[Finding]) -> list[Finding]:
    return [x for x in findings if x.status == "FAIL"]


def report(findings: list[Finding]) -> str:
    return "\n".join(str(x) for x in findings)
