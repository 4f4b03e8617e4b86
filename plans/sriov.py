"""SR-IOV VFs on a PF (seed 002 §5 and its pitfall "SR-IOV VF 没吞吐"): facts in, actions out. Pure.

Usage::

    want = SriovWant(pf="0000:41:00.0", num_vfs=8, numa_node=0, numa_policy="require", vfio=True,
                     vfs=[VfSettings(mac="02:00:00:00:00:01", vlan=100)], irq_cpus=[0, 32])
    p = plan_sriov(facts, parse_pf_detail(detail_text), want)
    p.errors          # ["0000:41:00.0 supports at most 4 VFs (sriov_totalvfs=4); 8 were asked for"]
    p.actions         # [SriovAction("numvfs-zero", ..., "set sriov_numvfs 2 -> 0 first: ..."), ...]
    p.sentence        # every action's sentence, or why nothing is needed

The seed's lessons this encodes:
  * VFs must sit on the PF that shares the GPU's NUMA node (refused with policy "require", a warning with
    "prefer"); a VF on the far node "has no throughput".
  * The kernel refuses to change a non-zero `sriov_numvfs` to another non-zero value (EBUSY): a count change goes
    through 0, which removes every existing VF, and the plan says so.
  * VFs given to VMs go to vfio-pci with `driverctl set-override` (seed 002 §4/§5); the host driver should never
    touch them, so `sriov_drivers_autoprobe` is turned off before they are created.
  * The PF's IRQs move to host-reserved CPUs, never VM cores (seed 002 §9).

Besides `facts.host` (one round trip), the plan needs a few PF attributes that facts.host does not read: the
routing-ID offset/stride of the VFs (to name VF addresses before they exist), `sriov_drivers_autoprobe`, the
PF's MSI IRQs and, for a PF with a netdev, `ip -j link` (per-VF MAC/VLAN/trust/spoofchk). `pf_detail_script`
prints them (section `@@sriov-pf`), `parse_pf_detail` reads them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from access.shell import quote
from facts.cpulist import format_cpulist
from facts.model import HostFacts, PciDevice, normalize_pci

PCI_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
UNIT_DIR = "/etc/systemd/system"
WANTS_DIR = f"{UNIT_DIR}/multi-user.target.wants"
DRIVERCTL_DIR = "/etc/driverctl.d"
VFIO = "vfio-pci"


# ------------------------------------------------------------------------------------------------- wanted state


class VfSettings(BaseModel):
    """Per-VF network settings, applied with `ip link set <pf-netdev> vf N ...` (index = VF number)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
    mac: Optional[str] = None
    vlan: Optional[int] = Field(None, ge=0, le=4094)
    trust: Optional[bool] = None
    spoofchk: Optional[bool] = None

    @field_validator("mac")
    @classmethod
    def _mac(cls, v):
        if v is not None and not re.fullmatch(r"([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}", v):
            raise ValueError(f"not a MAC address: {v!r}")
        return v.lower() if v else v

    @property
    def empty(self) -> bool:
        return self.mac is None and self.vlan is None and self.trust is None and self.spoofchk is None

    def ip_args(self) -> list[str]:
        out: list[str] = []
        if self.mac is not None:
            out += ["mac", self.mac]
        if self.vlan is not None:
            out += ["vlan", str(self.vlan)]
        if self.spoofchk is not None:
            out += ["spoofchk", "on" if self.spoofchk else "off"]
        if self.trust is not None:
            out += ["trust", "on" if self.trust else "off"]
        return out


class SriovWant(BaseModel):
    """What the stack asks of one PF.

    Args:
        pf: PCI address ("0000:41:00.0" or "41:00.0") or network interface name ("ens1f0") of the PF.
        num_vfs: VFs to create (0 removes them).
        numa_node / numa_policy: the node the PF must ("require") or should ("prefer") sit on — the GPU's node.
        vfio: bind every VF to vfio-pci (persistent driverctl override) for passthrough.
        vfs: per-VF MAC/VLAN/trust/spoofchk, by VF index (needs a PF netdev whose driver supports it).
        irq_cpus: host-reserved CPUs for the PF's IRQs ([] leaves IRQs alone).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    pf: str
    num_vfs: int = Field(ge=0)
    numa_node: Optional[int] = Field(None, ge=0)
    numa_policy: Literal["require", "prefer"] = "require"
    vfio: bool = True
    vfs: list[VfSettings] = Field(default_factory=list)
    irq_cpus: list[int] = Field(default_factory=list)

    @field_validator("pf")
    @classmethod
    def _pf(cls, v: str) -> str:
        v = v.strip()
        a = normalize_pci(v)
        if PCI_RE.match(a):
            return a
        if IFNAME_RE.match(v):
            return v
        raise ValueError(f"not a PCI address or interface name: {v!r}")

    @field_validator("irq_cpus")
    @classmethod
    def _cpus(cls, v: list[int]) -> list[int]:
        if any(c < 0 for c in v):
            raise ValueError("CPU numbers are >= 0")
        return sorted(set(v))


# ------------------------------------------------------------------------------------ PF facts beyond facts.host


class PfDetail(BaseModel):
    offset: Optional[int] = None
    stride: Optional[int] = None
    autoprobe: Optional[bool] = None
    msi_irqs: list[str] = Field(default_factory=list)
    legacy_irq: Optional[str] = None
    # per netdev: VF index -> {"mac", "vlan", "trust", "spoofchk"} as `ip -j link` reports them
    vfinfo: dict[str, dict[int, dict]] = Field(default_factory=dict)
    unit_enabled: Optional[bool] = None

    @property
    def irqs(self) -> list[str]:
        if self.msi_irqs:
            return self.msi_irqs
        return [self.legacy_irq] if self.legacy_irq and self.legacy_irq != "0" else []


def unit_name(pf: str) -> str:
    """`gpuhost-sriov-0000-82-00.0.service`: the PF address with ':' spelled '-' (no escaping in shells)."""
    return f"gpuhost-sriov-{pf.replace(':', '-')}.service"


def unit_path(pf: str) -> str:
    return f"{UNIT_DIR}/{unit_name(pf)}"


def driverctl_file(addr: str) -> str:
    return f"{DRIVERCTL_DIR}/pci-{addr}"


def pf_detail_script(pf: str) -> str:
    """Shell text printing section `@@sriov-pf` for `pf` (a validated PCI address, quoted anyway)."""
    if not PCI_RE.match(pf):
        raise ValueError(f"not a PCI address: {pf!r}")
    d = quote(f"/sys/bus/pci/devices/{pf}")
    return (
        "\n".join(
            [
                "echo @@sriov-pf",
                f'for f in sriov_offset sriov_stride sriov_drivers_autoprobe; do [ -r {d}/$f ] && echo "$f $(cat {d}/$f)"; done',
                f"[ -d {d}/msi_irqs ] && echo \"msi_irqs $(ls {d}/msi_irqs | sort -n | tr '\\n' ' ')\"",
                f'[ -r {d}/irq ] && echo "irq $(cat {d}/irq)"',
                f'echo "unit_enabled $(systemctl is-enabled {quote(unit_name(pf))} 2>/dev/null || true)"',
                f'for n in {d}/net/*; do [ -e "$n" ] && echo "iplink ${{n##*/}} $(ip -j link show dev "${{n##*/}}" '
                "2>/dev/null | tr -d '\\n')\"; done",
                "true",
            ]
        )
        + "\n"
    )


def parse_pf_detail(text: str) -> PfDetail:
    d = PfDetail()
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        rest = rest.strip()
        if key == "sriov_offset" and rest.isdigit():
            d.offset = int(rest)
        elif key == "sriov_stride" and rest.isdigit():
            d.stride = int(rest)
        elif key == "sriov_drivers_autoprobe" and rest in ("0", "1"):
            d.autoprobe = rest == "1"
        elif key == "msi_irqs":
            d.msi_irqs = sorted(rest.split(), key=int)
        elif key == "irq":
            d.legacy_irq = rest or None
        elif key == "unit_enabled":
            d.unit_enabled = rest.startswith("enabled") if rest else False
        elif key == "iplink":
            name, _, js = rest.partition(" ")
            d.vfinfo[name] = parse_vfinfo(js)
    return d


def parse_vfinfo(js: str) -> dict[int, dict]:
    """`ip -j link show dev X` -> {vf: {mac, vlan, trust, spoofchk}} (empty when the PF lists no VFs)."""
    try:
        data = json.loads(js) if js.strip() else []
    except json.JSONDecodeError:
        return {}
    out: dict[int, dict] = {}
    for link in data if isinstance(data, list) else []:
        for vf in link.get("vfinfo_list") or []:
            vlans = vf.get("vlan_list") or []
            out[int(vf["vf"])] = {
                "mac": (vf.get("address") or vf.get("mac") or "").lower() or None,
                "vlan": int(vlans[0].get("vlan", 0)) if vlans else int(vf.get("vlan", 0) or 0),
                "trust": bool(vf.get("trust")) if "trust" in vf else None,
                "spoofchk": bool(vf.get("spoofchk")) if "spoofchk" in vf else None,
            }
    return out


# ----------------------------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class SriovAction:
    """One step of an SR-IOV plan: its kind (what the provider runs), the sentence, the values it needs.

    Not `plans.plan.Action` (a shell command and its reason): the SR-IOV provider builds its commands from `kind`.
    """

    kind: str
    sentence: str
    data: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Problem:
    """A reason the plan is refused; `field` names the input to fix (check failures carry it)."""

    field: str
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass
class SriovPlan:
    pf: Optional[str]
    want: SriovWant
    actions: list[SriovAction] = field(default_factory=list)
    errors: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Addresses the VFs have (or will have, from the PF's offset/stride) after the plan runs.
    vf_addresses: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    current_numvfs: Optional[int] = None
    irq_targets: dict[str, list[int]] = field(default_factory=dict)
    unit_text: str = ""

    @property
    def noop(self) -> bool:
        return not self.actions and not self.errors

    def kinds(self) -> list[str]:
        return [a.kind for a in self.actions]

    @property
    def sentence(self) -> str:
        if self.errors:
            return "refused: " + "; ".join(map(str, self.errors))
        parts = [a.sentence for a in self.actions] + [f"warning: {w}" for w in self.warnings]
        parts += [f"note: {u}" for u in self.unsupported]
        if not self.actions:
            parts.insert(
                0,
                f"no change: {self.want.num_vfs} VF(s) on {self.pf} as wanted"
                + (" (bound to vfio-pci, persistent)" if self.want.vfio and self.want.num_vfs else ""),
            )
        return "; ".join(parts)


def resolve_pf(f: HostFacts, pf: str) -> tuple[Optional[PciDevice], Optional[str]]:
    """(device, error) for a PCI address or interface name."""
    if PCI_RE.match(pf):
        dev = f.device(pf)
        if dev is None:
            return None, f"unknown PF {pf}: no such PCI device on this host ({_capable(f)})"
        return dev, None
    addr = f.network.iface_pci.get(pf)
    if addr is None:
        known = ", ".join(sorted(f.network.iface_pci)) or "none with a PCI device"
        return None, f"unknown PF {pf!r}: no network interface of that name (interfaces: {known}; {_capable(f)})"
    dev = f.device(addr)
    if dev is None:
        return None, f"unknown PF {pf!r}: interface {pf} points at {addr}, which is not in the PCI list"
    return dev, None


def _capable(f: HostFacts) -> str:
    pfs = [
        f"{d.address} (node {d.numa_node}, up to {d.sriov_totalvfs} VFs)" for d in f.pci.values() if d.sriov_totalvfs
    ]
    return "SR-IOV PFs here: " + (", ".join(pfs) if pfs else "none")


def on_cpus(affinity: Optional[list[int]], cpus: list[int]) -> bool:
    """An IRQ is where it should be when its affinity is non-empty and within `cpus`."""
    return bool(affinity) and set(affinity or ()) <= set(cpus)


def vf_address(pf: str, offset: int, stride: int, index: int) -> str:
    """The routing ID of VF `index` is the PF's + offset + index*stride (PCIe SR-IOV spec §2.1.2/§3.3.10)."""
    dom, bus, slot_fn = pf.split(":")
    slot, fn = slot_fn.split(".")
    rid = (int(bus, 16) << 8 | int(slot, 16) << 3 | int(fn, 16)) + offset + index * stride
    return f"{dom}:{rid >> 8 & 0xFF:02x}:{rid >> 3 & 0x1F:02x}.{rid & 7}"


def render_unit(pf: str, want: SriovWant, netdev: Optional[str]) -> str:
    """The boot-time unit: VFs before libvirtd, driverctl overrides re-applied, VF settings and IRQ pins.

    Why a systemd unit and not a udev rule (`ATTR{sriov_numvfs}="N"` on the PF's add event): the VF count can only
    be written once the PF's driver is bound (it provides sriov_configure), which a udev add rule races; a unit
    can wait for the driver, order itself Before=libvirtd (VMs with VF hostdevs autostart after it), re-apply
    the vfio-pci overrides after `udevadm settle` (driverctl's own udev rule can fire only once VFs exist), and
    re-pin IRQs whose numbers change between boots. RHEL and Debian hosts both boot with systemd.
    """
    if not PCI_RE.match(pf):
        raise ValueError(f"not a PCI address: {pf!r}")
    n = want.num_vfs
    exec_start = "/bin/sh -ec '" + unit_script(pf, want, netdev).replace("$", "$$") + "'"
    return "\n".join(
        [
            f"# Written by gpuhost (SriovNic, seed 002 §5): {n} SR-IOV VF(s) on {pf} at every boot.",
            "# Deleting the gpuhost resource restores what was here before; do not edit by hand.",
            "[Unit]",
            f"Description=gpuhost: {n} SR-IOV VF(s) on PCI {pf}" + (" for vfio-pci" if want.vfio and n else ""),
            "After=systemd-udev-trigger.service systemd-modules-load.service",
            # VMs that pass VFs through (libvirt autostart) need them to exist first.
            "Before=libvirtd.service virtqemud.service libvirt-guests.service",
            "",
            "[Service]",
            "Type=oneshot",
            "RemainAfterExit=yes",
            f"ExecStart={exec_start}",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )


# driverctl's udev rule starts driverctl@pci-<vf>.service for each new VF that has an override file; give it up to
# 30 s to bind, then bind what is still not on its override driver ourselves.
_REBIND_VFS = [
    "udevadm settle -t 30 || true",
    "for v in $d/virtfn*; do [ -e $v ] || continue; a=$(basename $(readlink $v)); o=" + DRIVERCTL_DIR + "/pci-$a;",
    "[ -f $o ] || continue; w=$(cat $o); p=/sys/bus/pci/devices/$a; j=0; cur=;",
    "while [ $j -lt 300 ]; do cur=; [ -e $p/driver ] && cur=$(basename $(readlink $p/driver));",
    '[ "$cur" = "$w" ] && break; sleep 0.1; j=$((j+1)); done;',
    '[ "$cur" = "$w" ] && continue;',
    "echo $w > $p/driver_override;",
    '[ -n "$cur" ] && echo $a > $p/driver/unbind;',
    "echo $a > /sys/bus/pci/drivers_probe || true; done",
]


def unit_script(pf: str, want: SriovWant, netdev: Optional[str]) -> str:
    """The unit's shell script on one line (`/bin/sh -ec` runs it): the count, vfio-pci, VF settings, IRQ pins."""
    script = " ".join(x if x.endswith((";", "then", "do")) else x + ";" for x in _unit_lines(pf, want, netdev))
    script = script.replace("then;", "then").replace("do;", "do")
    for bad in ("'", "\\", "%"):
        if bad in script:
            raise ValueError(f"unit script may not contain {bad!r} (systemd quoting): {script}")
    return script


def _unit_lines(pf: str, want: SriovWant, netdev: Optional[str]) -> list[str]:
    n = want.num_vfs
    vfio = want.vfio and n
    sh_lines = [
        f"d={quote(f'/sys/bus/pci/devices/{pf}')}",
        # The PF's driver provides sriov_configure; at boot it may still be probing.
        "i=0; while [ ! -e $d/driver ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done",
        "[ -e $d/driver ] || { echo PF has no driver, cannot create VFs >&2; exit 1; }",
    ]
    if vfio:
        sh_lines.append("modprobe vfio-pci")
    sh_lines += [f"c=$(cat $d/sriov_numvfs); if [ $c != {n} ]; then", "[ $c = 0 ] || echo 0 > $d/sriov_numvfs"]
    if vfio:
        sh_lines.append("echo 0 > $d/sriov_drivers_autoprobe")
    sh_lines += [f"echo {n} > $d/sriov_numvfs", "fi"]
    if vfio:
        sh_lines += _REBIND_VFS
    if netdev:
        for i, s in enumerate(want.vfs):
            if not s.empty:
                args = ["ip", "link", "set", "dev", quote(netdev), "vf", str(i), *(quote(a) for a in s.ip_args())]
                sh_lines.append(" ".join(args) + " || true")
    if want.irq_cpus:
        cpus = format_cpulist(want.irq_cpus)
        # Kernel-managed (per-queue) IRQs refuse a new affinity; that is expected, not a failure.
        sh_lines.append(
            f"for q in $(ls $d/msi_irqs 2>/dev/null); do echo {cpus} > /proc/irq/$q/smp_affinity_list "
            "2>/dev/null || true; done"
        )
    return sh_lines


def plan_sriov(
    f: HostFacts,
    detail: PfDetail,
    want: SriovWant,
    unit_text: Optional[str] = None,
    vf_state: Optional[dict[str, tuple[Optional[str], Optional[str]]]] = None,
) -> SriovPlan:
    """Compare the host with `want`; return the actions (each with a sentence), errors and warnings.

    Args:
        f: the host's facts; detail: `parse_pf_detail` of the same read.
        unit_text: the boot unit's current content (None: absent).
        vf_state: optional {vf address: (driver, driverctl override)} overriding what `f` says (tests).
    """
    dev, err = resolve_pf(f, want.pf)
    p = SriovPlan(pf=dev.address if dev else None, want=want)
    if err:
        p.errors.append(Problem("pf", err))
        return p
    assert dev is not None
    err = pf_refusal(f, dev, want)
    if err:
        p.errors.append(Problem("pf", err))
        return p
    check_want(p, f, dev)
    if p.errors:
        return p

    cur = dev.sriov_numvfs or 0
    p.current_numvfs = cur
    netdev = dev.net[0] if dev.net else None
    p.unit_text = render_unit(dev.address, want, netdev)
    p.actions += count_actions(dev, detail, want)
    p.vf_addresses = planned_vf_addresses(dev, detail, want.num_vfs)
    p.actions += persist_actions(dev.address, want, unit_text, p.unit_text, detail)
    p.actions += bind_actions(f, p.vf_addresses, want, cur, vf_state)
    vf_config_steps(p, dev, netdev, detail)
    irq_steps(p, f, dev.address, detail)
    return p


def pf_refusal(f: HostFacts, dev: PciDevice, want: SriovWant) -> Optional[str]:
    """Why this device cannot give VFs at all (a VF itself, no SR-IOV, SR-IOV off), or None."""
    name = dev.address
    if dev.physfn:
        return f"{name} is itself a VF of {dev.physfn}; give the PF"
    if dev.sriov_totalvfs is None:
        what = f"{dev.vendor_device}, driver {dev.driver or 'none'}"
        return (
            f"{name} ({what}) has no SR-IOV capability (no sriov_totalvfs in sysfs): it cannot "
            f"create VFs; {_capable(f)}"
        )
    if dev.sriov_totalvfs == 0 and want.num_vfs:
        return (
            f"{name} reports sriov_totalvfs=0: SR-IOV is off in the firmware or the device "
            "(seed 002 §1: enable SR-IOV in the BIOS)"
        )
    return None


def check_want(p: SriovPlan, f: HostFacts, dev: PciDevice) -> None:
    """The wanted count, NUMA node, VF settings and IRQ CPUs against this PF: errors (and a NUMA warning) on `p`."""
    want, name = p.want, dev.address
    total = dev.sriov_totalvfs or 0
    if want.num_vfs > total:
        p.errors.append(
            Problem(
                "num_vfs",
                f"{want.num_vfs} VFs asked for but {name} supports at most {total} (sriov_totalvfs={total})",
            )
        )
    if want.numa_node is not None and dev.numa_node != want.numa_node:
        msg = numa_mismatch(f, dev, want.numa_node)
        if want.numa_policy == "require":
            p.errors.append(Problem("numa_node", msg + " (numa_policy=require; use prefer to allow it)"))
        else:
            p.warnings.append(msg + " (numa_policy=prefer: going ahead)")
    if len(want.vfs) > want.num_vfs:
        p.errors.append(Problem("vfs", f"settings for {len(want.vfs)} VFs given but only {want.num_vfs} VFs asked for"))
    offline = [c for c in want.irq_cpus if f.online and c not in f.online]
    if offline:
        p.errors.append(
            Problem("irq_cpus", f"irq_cpus {format_cpulist(offline)} are not online CPUs ({format_cpulist(f.online)})")
        )


def numa_mismatch(f: HostFacts, dev: PciDevice, node: int) -> str:
    """Seed 002's pitfall: VFs on the far node lose throughput. Names the PFs that do sit on `node`."""
    where = (
        "reports no NUMA node (numa_node=-1), so it cannot be shown to be"
        if dev.numa_node < 0
        else f"sits on NUMA node {dev.numa_node}, not"
    )
    others = [d.address for d in f.pci.values() if d.sriov_totalvfs and d.numa_node == node]
    return (
        f"PF {dev.address} {where} on node {node}: VFs on the far node lose throughput (seed 002 pitfall "
        f"'SR-IOV VF 没吞吐'); SR-IOV PFs on node {node}: {', '.join(others) or 'none'}"
    )


def count_actions(dev: PciDevice, detail: PfDetail, want: SriovWant) -> list[SriovAction]:
    """The VF count, through 0 when it changes between two non-zero values; autoprobe off before vfio VFs appear."""
    name, cur, n = dev.address, dev.sriov_numvfs or 0, want.num_vfs
    out = []
    if cur != n and cur and n:
        out.append(
            SriovAction(
                "numvfs-zero",
                (
                    f"set sriov_numvfs of {name} {cur} -> 0 first: the kernel refuses to change a non-zero VF count "
                    f"directly (EBUSY), so the {cur} existing VF(s) {', '.join(dev.vfs)} disappear (detach them from VMs "
                    f"first)"
                ),
                {"from": cur},
            )
        )
    want_autoprobe = False if (want.vfio and n) else None
    if want_autoprobe is not None and detail.autoprobe is not None and detail.autoprobe != want_autoprobe:
        out.append(
            SriovAction(
                "autoprobe",
                (
                    f"turn off host-driver autoprobe for new VFs of {name} (sriov_drivers_autoprobe 1 -> 0): they go to "
                    "vfio-pci, no host driver should touch them"
                ),
                {"value": 0},
            )
        )
    if cur != n:
        out.append(
            SriovAction(
                "numvfs",
                (
                    f"create {n} VF(s) on {name} (sriov_numvfs {'0' if cur else cur} -> {n})"
                    if n
                    else f"remove the {cur} VF(s) of {name} (sriov_numvfs {cur} -> 0)"
                ),
                {"to": n},
            )
        )
    return out


def planned_vf_addresses(dev: PciDevice, detail: PfDetail, n: int) -> list[str]:
    """The existing VFs when the count stays, else from the PF's routing-ID offset/stride; [] when unknown until
    the VFs exist (read back after create)."""
    if (dev.sriov_numvfs or 0) == n and len(dev.vfs) == n:
        return list(dev.vfs)
    if detail.offset is not None and detail.stride is not None and n:
        return [vf_address(dev.address, detail.offset, detail.stride, i) for i in range(n)]
    return []


def persist_actions(
    name: str, want: SriovWant, unit_text: Optional[str], new_unit: str, detail: PfDetail
) -> list[SriovAction]:
    """Write, rewrite or enable the boot unit when it is not the wanted one, enabled."""
    if unit_text == new_unit and detail.unit_enabled is not False:
        return []
    n = want.num_vfs
    verb = "write" if unit_text is None else ("rewrite" if unit_text != new_unit else "enable")
    return [
        SriovAction(
            "persist",
            (
                f"{verb} {unit_path(name)} (enabled, Before=libvirtd): sets {n} VF(s) at every boot"
                + (" and re-applies their vfio-pci overrides" if want.vfio and n else "")
            ),
            {"path": unit_path(name)},
        )
    ]


def bind_actions(
    f: HostFacts,
    vf_addresses: list[str],
    want: SriovWant,
    cur: int,
    vf_state: Optional[dict[str, tuple[Optional[str], Optional[str]]]],
) -> list[SriovAction]:
    """vfio-pci for every VF not on it with a persistent driverctl override (all of them when the count changes)."""
    n = want.num_vfs
    if not (want.vfio and n):
        return []
    counted_new = cur != n
    todo = []
    for a in vf_addresses or [f"VF {i}" for i in range(n)]:
        if vf_state and a in vf_state:
            drv, ovr = vf_state[a]
        else:
            d = f.pci.get(a)
            drv, ovr = (d.driver if d else None), f.driverctl_overrides.get(a)
        if counted_new or drv != VFIO or ovr != VFIO:
            todo.append(a)
    if not todo:
        return []
    return [
        SriovAction(
            "bind",
            (f"bind {', '.join(todo)} to vfio-pci with driverctl set-override (persistent across reboots)"),
            {"vfs": todo},
        )
    ]


def vf_config_steps(p: SriovPlan, dev: PciDevice, netdev: Optional[str], detail: PfDetail) -> None:
    """Per-VF mac/vlan/trust/spoofchk through the PF's netdev: an action per VF that differs, or a note on `p`
    when the PF has no netdev."""
    wanted_cfg = {i: s for i, s in enumerate(p.want.vfs) if not s.empty}
    if not wanted_cfg:
        return
    name = dev.address
    if not netdev:
        p.unsupported.append(
            f"per-VF mac/vlan/trust/spoofchk not supported by {dev.driver or 'no driver'}: "
            f"PF {name} has no network interface (`ip link set <pf> vf N` needs one)"
        )
        return
    recount = (dev.sriov_numvfs or 0) != p.want.num_vfs
    have = detail.vfinfo.get(netdev, {})
    for i, s in wanted_cfg.items():
        now = have.get(i, {})
        diff = [
            k
            for k in ("mac", "vlan", "trust", "spoofchk")
            if getattr(s, k) is not None and (recount or now.get(k) != getattr(s, k))
        ]
        if diff:
            p.actions.append(
                SriovAction(
                    "vf-config",
                    (f"set VF {i} of {netdev} ({name}): " + " ".join(s.ip_args())),
                    {"vf": i, "args": s.ip_args(), "netdev": netdev},
                )
            )


def irq_steps(p: SriovPlan, f: HostFacts, name: str, detail: PfDetail) -> None:
    """The PF's IRQs to host-reserved CPUs (seed 002 §9): targets and an action on `p`, and a warning while
    irqbalance runs."""
    cpus = p.want.irq_cpus
    if not cpus:
        return
    if f.irqbalance_active:
        p.warnings.append(
            "irqbalance is active: unless it bans the VM CPUs (IrqIsolation, "
            "IRQBALANCE_BANNED_CPULIST) it moves the PF's IRQs to the PF's own node again after each "
            "boot (seed 002 §9); refresh reports that as drift"
        )
    aff = {q.irq: q.affinity for q in f.interrupts}
    for irq in detail.irqs:
        p.irq_targets[irq] = list(cpus)
    # On host-reserved CPUs means a subset of them: irqbalance (banned from VM CPUs) may pick one of them.
    moving = {i: aff.get(i) for i in p.irq_targets if not on_cpus(aff.get(i), cpus)}
    if moving:
        was = "; ".join(f"{i}: {format_cpulist(c or [])}" for i, c in sorted(moving.items(), key=lambda kv: int(kv[0])))
        p.actions.append(
            SriovAction(
                "irq",
                (
                    f"pin IRQs {', '.join(sorted(moving, key=int))} of {name} to host-reserved CPUs "
                    f"{format_cpulist(cpus)} (were {was}; kernel-managed queue IRQs may refuse)"
                ),
                {"irqs": sorted(moving, key=int)},
            )
        )
