"""VfioBinding: hand GPU functions (and VFs) to vfio-pci, persistently and live, with full restore.

Seeds 000 §3.4 / 001 §5.2 (modules-load + nouveau blacklist + `options vfio-pci ids=` + initramfs) and 002 §4
(per-address `driverctl set-override`). Inputs: host, devices (every function to bind), mode ("address" | "ids"),
ids (vendor:device list, ids mode), blacklist_nouveau, disable_vga, version.
Outputs: drivers (address -> driver in use now), prior_drivers, prior (pristine files), pending_reboot.
"""

from __future__ import annotations

import base64
import re
from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, DiffResult, ReadResult

from access.shell import Script, quote, sh
from access.ssh import Conn
from facts.files import FileState
from facts.host import facts_script, parse_host_facts, read_host_facts
from facts.model import HostFacts, normalize_pci
from plans.preflight import binding_refusals, report
from plans.vfio import (
    claims_script,
    initramfs_read,
    parse_claimers,
    parse_initramfs,
    plan_initramfs,
    plan_initramfs_restore,
    stamp,
)
from pristine import Change, Record
from providers.base import HostProvider, HostResource

MODULES_LOAD = "/etc/modules-load.d/gpuhost-vfio.conf"
MODPROBE_VFIO = "/etc/modprobe.d/gpuhost-vfio.conf"
BLACKLIST = "/etc/modprobe.d/gpuhost-blacklist-nouveau.conf"
FILES = [MODULES_LOAD, MODPROBE_VFIO, BLACKLIST]
# The sections the plan and the safety checks use, in the order HostPreflight carves them out of its whole read.
READ_SECTIONS = [
    "os-release",
    "iommu-groups",
    "pci",
    "pci-links",
    "pci-net",
    "driverctl",
    "tools",
    "kmods",
    "net-default",
    "net-ssh",
    "net-addrs",
    "net-pci",
    "ssh-session",
    "net-links",
    "initramfs-stamp",
]


def driverctl_file(addr: str) -> str:
    return f"/etc/driverctl.d/pci-{addr}"


def vfio_modules(available: list[str]) -> list[str]:
    # vfio_virqfd was folded into vfio in Linux 6.2; listing a missing module makes systemd-modules-load fail.
    wanted = ("vfio", "vfio_pci", "vfio_iommu_type1", "vfio_virqfd")
    if not available:
        return list(wanted[:3])
    return [m for m in wanted if m in available]


def _sysfs_rebind(addr: str, override: str) -> list[str]:
    d = quote(f"/sys/bus/pci/devices/{addr}")
    return [
        f"printf '%s\\n' {quote(override)} > {d}/driver_override",
        f"if [ -e {d}/driver ]; then printf '%s' {quote(addr)} > {d}/driver/unbind; fi",
        f"printf '%s' {quote(addr)} > /sys/bus/pci/drivers_probe || true",
    ]


def render_files(props: dict, facts: HostFacts) -> dict[str, bytes]:
    devices = expand_functions(facts, props["devices"])
    files = {
        MODULES_LOAD: (
            "\n".join(["# gpuhost: load VFIO early (seed 000 §3.4)", *vfio_modules(facts.kmods_available)]) + "\n"
        ).encode()
    }
    lines = ["# gpuhost: make vfio-pci claim passthrough devices before their host drivers"]
    if props.get("mode") == "ids":
        ids = props.get("ids") or sorted({facts.pci[a].vendor_device for a in devices if a in facts.pci})
        opt = f"options vfio-pci ids={','.join(ids)}"
        if props.get("disable_vga", True):
            opt += " disable_vga=1"
        lines.append(opt)
    # Host drivers the devices had; once bound to vfio they are gone from sysfs, so the ones already written
    # into our file stay (re-runs converge instead of dropping them).
    written = set()
    cur = facts.files.get(MODPROBE_VFIO)
    if cur is not None and cur.exists:
        written = set(re.findall(r"^softdep (\S+) pre: vfio-pci$", cur.text, re.M))
    host_drivers = sorted(
        {
            (facts.pci[a].driver or "").replace("-", "_")  # the filter below keeps only devices with a driver
            for a in devices
            if a in facts.pci and facts.pci[a].driver and facts.pci[a].driver != "vfio-pci"
        }
        | written
    )
    for drv in host_drivers:
        lines.append(f"softdep {drv} pre: vfio-pci")
    files[MODPROBE_VFIO] = ("\n".join(lines) + "\n").encode()
    if props.get("blacklist_nouveau", True):
        files[BLACKLIST] = b"blacklist nouveau\noptions nouveau modeset=0\n"
    return files


def initramfs_cmd(family: str) -> str:
    if family == "rhel":
        return sh("dracut", "-f", "--regenerate-all") + " >/dev/null 2>&1"
    return sh("update-initramfs", "-u", "-k", "all") + " >/dev/null 2>&1"


def _slots(addresses: list[str]) -> set[str]:
    return {normalize_pci(a).rsplit(".", 1)[0] for a in addresses}


def _slot_drivers_cmd(slot: str) -> str:
    """Prints "address driver override" for every function of a slot (driver/override "-" when none)."""
    return (
        f"for d in {quote('/sys/bus/pci/devices/' + slot)}.*; do a=${{d##*/}}; "
        'drv=-; [ -e "$d/driver" ] && drv=$(basename "$(readlink "$d/driver")"); '
        "ov=$(driverctl list-overrides 2>/dev/null | awk -v a=\"$a\" '$1 == a {print $2}'); "
        'printf \'%s %s %s\\n\' "$a" "$drv" "${ov:--}"; done'
    )


def _parse_slot_drivers(text: str) -> dict[str, tuple[Optional[str], Optional[str]]]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            out[parts[0]] = (None if parts[1] == "-" else parts[1], None if parts[2] == "-" else parts[2])
    return out


def expand_functions(facts: HostFacts, addresses: list[str]) -> list[str]:
    """Every function of each device's slot: a GPU and its audio function pass through together (seed 000 §4.2)."""
    out: list[str] = []
    for a in addresses:
        for d in facts.slot_functions(a) or []:
            if d.physfn is None and d.address not in out:
                out.append(d.address)
        if normalize_pci(a) not in out:
            out.append(normalize_pci(a))
    return out


def _split_host_read(props: dict) -> tuple[dict, Optional[str]]:
    """HostPreflight's read comes as "<the guarded read> <the initramfs listing>" (base64 each): (props with the
    guarded read alone, the listing or None)."""
    hint, listing = props.get("host_read"), None
    if isinstance(hint, str) and " " in hint:
        guarded_b64, _, listing_b64 = hint.partition(" ")
        props = {**props, "host_read": guarded_b64}
        try:
            listing = base64.b64decode(listing_b64, validate=True).decode(errors="replace")
        except ValueError:
            listing = None
    return props, listing


def _bindable(name: str, props: dict, facts: HostFacts) -> list[str]:
    """Every function to bind (each device's whole slot); raises, nothing changed, for an unknown address, a device
    the safety checks refuse, or binding by address without driverctl."""
    unknown = [normalize_pci(a) for a in props["devices"] if normalize_pci(a) not in facts.pci]
    if unknown:
        raise RuntimeError(f"{name}: unknown PCI address(es) {', '.join(unknown)}; nothing changed")
    devices = expand_functions(facts, props["devices"])
    # The safety checks on the read that the guard compares again under the lock, right before binding.
    refused = binding_refusals(facts, devices)
    if refused:
        raise RuntimeError(f"{name}: refusing to bind to vfio-pci; nothing changed:\n" + report(refused))
    if props.get("mode", "address") == "address" and "driverctl" not in facts.tools:
        raise RuntimeError(
            f"{name}: binding by address needs driverctl (seed 002 §4): install it, or use mode 'ids'; nothing changed"
        )
    return devices


def _file_steps(ch: Change, wanted: dict[str, bytes], facts: HostFacts, pristine: Optional[dict]) -> Optional[bool]:
    """Write the wanted module files, remove one no longer wanted if gpuhost made it. Whether a file changes; None
    when one would be removed before the records are read (the caller plans again with them)."""
    changed_files = False
    for path in FILES:
        cur = facts.files.get(path)
        if path in wanted:
            if not (cur and cur.exists and cur.content == wanted[path]):
                ch.write(path, wanted[path], "0644", "0:0")
                changed_files = True
        elif cur and cur.exists:
            if pristine is None:
                return None
            if not pristine[path].exists:
                ch.script.raw(sh("rm", "-f", path))
                changed_files = True
    return changed_files


def _bind_steps(s: Script, props: dict, facts: HostFacts, devices: list[str], live: bool) -> None:
    """Each device not yet on vfio-pci (with its override): a driverctl override, or a sysfs rebind in ids mode."""
    for a in devices:
        if facts.pci[a].driver == "vfio-pci" and facts.driverctl_overrides.get(a) == "vfio-pci":
            continue
        if props.get("mode", "address") == "address":
            # Without an active IOMMU vfio-pci cannot probe: persist the override, bind at next boot.
            s.add("driverctl", *([] if live else ["--nobind"]), "set-override", a, "vfio-pci")
        elif live:
            s.extend(_sysfs_rebind(a, "vfio-pci"))


def _drivers_after(out: str, drivers: dict[str, Optional[str]]) -> dict[str, Optional[str]]:
    """`drivers` (as read before the change) updated from the change's "@@driver <address> <link>" lines."""
    for ln in out.splitlines():
        parts = ln.split()
        if len(parts) >= 2 and parts[0] == "@@driver" and parts[1] in drivers:
            drivers[parts[1]] = parts[2].rsplit("/", 1)[-1] if len(parts) > 2 else None
    return drivers


class VfioBindingProvider(HostProvider):
    # 6: an initramfs rebuild says every 5 s what it waits for (providers.progress);
    # 5: planned from HostPreflight's read (the initramfs listed once), record, check and change in one round trip;
    # 4: the drivers after binding printed by the change itself; 3: drivers/overrides recorded on the host;
    # 2: device-safety checks right before binding
    VERSION = "6"
    KIND = "vfio"
    OUTPUT_ONLY = ("prior", "prior_drivers", "prior_overrides", "drivers", "pending_reboot", "initramfs")

    @classmethod
    def writes(cls, inputs: dict) -> list:
        devices = [d for d in inputs.get("devices") or [] if isinstance(d, str)]
        return [*FILES, *(driverctl_file(d) for d in devices)]

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        devs = news.get("devices") or []
        if not devs:
            failures.append(CheckFailure("devices", "at least one PCI address to bind"))
        for a in devs:
            if not isinstance(a, str) or not re.fullmatch(r"([0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]", a):
                failures.append(CheckFailure("devices", f"not a PCI address: {a!r} (want 0000:65:00.0)"))
        if news.get("mode", "address") not in ("address", "ids"):
            failures.append(CheckFailure("mode", "must be 'address' (driverctl) or 'ids' (vfio-pci ids=)"))
        return CheckResult(news, failures)

    def _paths(self, props: dict) -> list[str]:
        # Sibling functions are not known before the read; their driverctl files are recorded as absent/present
        # by prior_overrides instead.
        return [MODULES_LOAD, MODPROBE_VFIO, BLACKLIST] + [driverctl_file(normalize_pci(a)) for a in props["devices"]]

    def _record(self, props: dict) -> Record:
        # Drivers and driverctl overrides of every function in each device's slot, as first found: a re-create
        # after a dropped connection must not take vfio-pci for the original driver.
        return Record(
            self.owner(props),
            files=self._paths(props),
            values={f"pci/{slot}/drivers": _slot_drivers_cmd(slot) for slot in sorted(_slots(props["devices"]))},
        )

    @classmethod
    def read_spec(cls, inputs: dict) -> dict:
        """What the plan is made from (HostPreflight reads it too, and the initramfs listing of `pci_slots` once):
        the devices, their drivers and overrides, the IOMMU groups, the tools, the SSH session's NIC and the boot
        display, the module files, and the initramfs images' stamp."""
        return {"sections": READ_SECTIONS, "files": FILES, "pci_slots": sorted(_slots(inputs["devices"]))}

    def _converge(self, props: dict, olds: Optional[dict]) -> dict:
        """HostPreflight's read (facts) → the plan (`_plan_change`) → record, check and change in one round trip
        (`converge`) → the drivers as the change left them, and what delete restores."""
        conn = self.conn(props)
        rec = self._record(props)
        slots = _slots(props["devices"])
        props, listing = _split_host_read(props)
        # What the last plan was made from (the initramfs listing is kept for the next plan while it holds).
        made: dict = {"listing": listing}

        def plan_from(read: bytes, pristine: Optional[dict], _values) -> Optional[Change]:
            return self._plan_change(conn, props, slots, read.decode(errors="replace"), pristine, made)

        read = facts_script(files=FILES, sections=READ_SECTIONS)
        out, pristine, values, _, _ = self.converge(conn, props, rec, read, plan_from)
        facts, devices, initramfs, live = made["facts"], made["devices"], made["initramfs"], made["live"]
        first = {a: v for text in values.values() for a, v in _parse_slot_drivers(text).items()}
        prior_drivers = {a: (first[a][0] if a in first else facts.pci[a].driver) for a in devices}
        prior_overrides = {a: (first[a][1] if a in first else facts.driverctl_overrides.get(a)) for a in devices}
        drivers = _drivers_after(out, {a: facts.pci[a].driver for a in devices if a in facts.pci})
        pending = not live or any(d != "vfio-pci" for d in drivers.values())
        if live and pending:
            bad = {a: d for a, d in drivers.items() if d != "vfio-pci"}
            raise RuntimeError(
                f"{conn.spec.name}: vfio-pci did not take {bad}; check `lspci -nnk` and dmesg "
                "(a host driver grabbed it first: blacklist/initramfs, seed 000 §3.4)"
            )
        return self.outputs(
            props,
            prior={k: v.model_dump() for k, v in pristine.items()},
            prior_drivers=prior_drivers,
            prior_overrides=prior_overrides,
            drivers=drivers,
            pending_reboot=pending,
            initramfs=initramfs.sentences[0],
        )

    def _plan_change(
        self, conn: Conn, props: dict, slots: set[str], text: str, pristine: Optional[dict], made: dict
    ) -> Optional[Change]:
        """The change for one read of the host: the module files, the bindings, an initramfs rebuild when one is
        needed, and the drivers printed after it. None: a file is to be removed, so the records are read first.
        `made` gets what the plan was made from (and keeps the initramfs listing for the next plan)."""
        facts = parse_host_facts(text)
        devices = _bindable(conn.spec.name, props, facts)
        wanted = render_files(props, facts)
        ch = Change(self.owner(props))
        s = ch.script
        changed_files = _file_steps(ch, wanted, facts, pristine)
        if changed_files is None:
            return None  # removed only if gpuhost made it: read the records first
        live = facts.iommu.active
        _bind_steps(s, props, facts, devices, live)
        # The listing holds while the images' stamp in this read is the one it was made with (else: list again).
        if made["listing"] is None or stamp(made["listing"]) != stamp(text):
            made["listing"] = self.guarded(
                conn, "listing the initramfs", lambda: conn.run(initramfs_read(slots)).stdout
            )
        listing = made["listing"]
        # The initramfs is rebuilt only when a driver inside it would claim a device before vfio-pci (plans.vfio).
        claimers = parse_claimers(listing)
        initramfs = plan_initramfs(
            parse_initramfs(listing),
            {a: claimers.get(a, set()) for a in devices},
            blacklisted=["nouveau"] if BLACKLIST in wanted else [],
            wanted=[p.rsplit("/", 1)[1] for p in wanted if "/modprobe.d/" in p],
            files_changed=changed_files,
            command=initramfs_cmd(facts.os.family),
        ).plan
        for action in initramfs.actions:
            s.raw(action.command)
        # The PCI drivers (and the modprobe/driverctl files) are the vfio class's; an initramfs rebuild is the
        # boot class's too (update-grub lists /boot while update-initramfs writes it).
        ch.classes = ("boot", "vfio") if initramfs.actions else ("vfio",)
        if not ch.empty:
            # The drivers as they are after the change, printed by the change itself (no second read).
            for a in devices:
                link = quote(f"/sys/bus/pci/devices/{a}/driver")
                s.raw(f"printf '@@driver %s %s\\n' {quote(a)} \"$(readlink {link} 2>/dev/null || true)\"")
        made.update(facts=facts, devices=devices, initramfs=initramfs, live=live)
        return ch

    def diff_known(self, _id: str, olds: dict, news: dict) -> DiffResult:
        drivers = olds.get("drivers") or {}
        drifted = not olds.get("pending_reboot") and any(v != "vfio-pci" for v in drivers.values())
        return self.also_changed(super().diff_known(_id, olds, news), drifted)

    def read(self, id_: str, props: dict) -> ReadResult:
        facts = read_host_facts(self.conn(props), files=[MODULES_LOAD, MODPROBE_VFIO, BLACKLIST])
        devices = sorted(props.get("prior_drivers") or expand_functions(facts, props["devices"]))
        drivers = {a: (facts.pci[a].driver if a in facts.pci else None) for a in devices}
        wanted = render_files(props, facts)
        files_ok = all(facts.files[p].exists and facts.files[p].content == c for p, c in wanted.items())
        pending = not facts.iommu.active or (
            files_ok
            and any(d != "vfio-pci" for d in drivers.values())
            and all(facts.driverctl_overrides.get(a) == "vfio-pci" for a in devices)
        )
        outs = {**props, "drivers": drivers, "pending_reboot": pending}
        if not files_ok:
            outs["blacklist_nouveau"] = facts.files[BLACKLIST].exists
            outs["mode"] = "drifted"
        return ReadResult(id_, outs)

    def delete(self, _id: str, props: dict) -> None:
        conn = self.conn(props)
        out = conn.run(facts_script() + "\n" + claims_script(_slots(props["devices"]))).stdout
        facts = parse_host_facts(out)
        prior = {k: FileState.model_validate(v) for k, v in (props.get("prior") or {}).items()}
        ch = Change(self.owner(props))
        s = ch.script
        for a in sorted(props.get("prior_drivers") or expand_functions(facts, props["devices"])):
            before = (props.get("prior_overrides") or {}).get(a)
            if props.get("mode", "address") == "address":
                if before:
                    s.add("driverctl", "set-override", a, before)
                else:
                    s.raw(sh("driverctl", "unset-override", a) + " || true")
            else:
                s.extend(_sysfs_rebind(a, ""))
        ch.restore(prior)
        # After the restore: rebuild only an initramfs that carries gpuhost's config (else it is as found).
        for action in plan_initramfs_restore(parse_initramfs(out), initramfs_cmd(facts.os.family)).actions:
            s.raw(action.command)
        ch.forget(self._record(props))
        with self.ticking(props, conn, ch):
            ch.run(conn)


class VfioBinding(HostResource, module="host", name="VfioBinding"):
    drivers: pulumi.Output[dict]
    pending_reboot: pulumi.Output[bool]

    PROVIDER = VfioBindingProvider
    DEFAULTS = {"mode": "address", "blacklist_nouveau": True, "disable_vga": True}
