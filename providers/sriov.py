"""SriovVfs: SR-IOV VFs on one PF — count (through 0), persistent at boot, vfio-pci bound, per-VF settings, PF IRQs
pinned to host-reserved CPUs — and a delete that puts everything back. Seed 002 §5, §9, pitfall "SR-IOV VF 没吞吐".

Inputs: host, pf (PCI address or interface name), num_vfs, numa_node, numa_policy ("require" | "prefer"),
vfio (bind every VF to vfio-pci), vfs ([{mac, vlan, trust, spoofchk}] by VF index), irq_cpus, persist, version.
check reads the host (one round trip) and runs `plans.sriov.plan_sriov`: a PF without SR-IOV, more VFs than
sriov_totalvfs, a PF on the wrong NUMA node (policy require) or an unknown PF fail there, before anything changes;
the plan's sentence comes back as the `plan` input so that `pulumi preview` shows it next to the changed inputs.
Outputs: pf_address, vf_addresses (for PinnedVM hostdevs), numvfs, drivers ({vf: driver}), unit, pinned
({irq: cpus}), unmovable (kernel-managed IRQs), vf_config ({vf: result}), unsupported (reasons), warnings, and
the prior state delete restores: prior_numvfs, prior_autoprobe, prior_overrides, prior_affinity (by position in
the PF's IRQ list: IRQ numbers change between boots), prior_unit_enabled, prior (pristine files).

Persistence is a systemd unit (see `plans.sriov.render_unit` for why not a udev rule); vfio-pci overrides are
driverctl's (`/etc/driverctl.d/pci-<vf>`), re-applied by the unit after the VFs exist.

Usage::

    SriovVfs("gpu-a-sriov", {"host": host_input(spec), "pf": "0000:41:00.0", "num_vfs": 4, "numa_node": 0,
                             "vfio": True, "irq_cpus": [0, 32]})
"""

from __future__ import annotations

from typing import Any, Optional

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, UpdateResult
from pydantic import ValidationError

from access.shell import Script, quote, sh
from facts.cpulist import format_cpulist
from facts.files import FileState, parse_files
from facts.host import facts_script, parse_host_facts, read_host_facts, split_sections
from facts.model import HostFacts, normalize_pci
from plans import sriov as plan
from providers.base import HostProvider, HostResource, validation_failures
from providers.pristine import capture_script, restore_lines, write_lines

UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # the SDK's placeholder for a value not known during preview
WANT_KEYS = ("pf", "num_vfs", "numa_node", "numa_policy", "vfio", "vfs", "irq_cpus")


def want_of(props: dict) -> plan.SriovWant:
    return plan.SriovWant.model_validate({k: props[k] for k in WANT_KEYS if props.get(k) is not None})


def read_state(conn, pf_ref: str) -> tuple[HostFacts, plan.PfDetail, Optional[str], str]:
    """(facts, PF detail, boot unit text or None, PF address) in one round trip (two for an interface name)."""
    addr = normalize_pci(pf_ref) if plan.PCI_RE.match(normalize_pci(pf_ref)) else None
    if addr is None:
        dev, _ = plan.resolve_pf(read_host_facts(conn), pf_ref)
        if dev is None:
            return read_host_facts(conn), plan.PfDetail(), None, pf_ref
        addr = dev.address
    out = conn.run(facts_script(files=[plan.unit_path(addr)]) + plan.pf_detail_script(addr)).stdout
    facts = parse_host_facts(out)
    detail = plan.parse_pf_detail(split_sections(out).get("sriov-pf", ""))
    st = facts.files.get(plan.unit_path(addr))
    return facts, detail, (st.text if st and st.exists else None), addr


def _in_use_guard(facts: HostFacts, vfs: list[str]) -> list[str]:
    """Fail before touching the count while a VM (any process) holds a VF's VFIO group: removing a VF that is in use
    blocks in the kernel until the VM lets go."""
    groups = sorted({facts.pci[a].iommu_group for a in vfs if a in facts.pci and facts.pci[a].iommu_group is not None})
    if not groups:
        return []
    rx = " -> /dev/vfio/(" + "|".join(str(g) for g in groups) + ")$"
    return [
        f"if ls -l /proc/[0-9]*/fd 2>/dev/null | grep -qE {quote(rx)}; then "
        f"echo {quote('a VF of this PF is open through VFIO (a running VM?): detach it first; nothing changed')} >&2; "
        "exit 3; fi"
    ]


def _affinity_lines(target: dict[str, list[int]]) -> list[str]:
    return [
        f"printf '%s' {quote(format_cpulist(int(x) for x in c))} > /proc/irq/{int(i)}/smp_affinity_list 2>/dev/null "
        f"|| echo unmovable {int(i)}"
        for i, c in sorted(target.items(), key=lambda kv: int(kv[0]))
    ]


def _write_numvfs(pf: str, n: int) -> str:
    return f"printf '%s' {quote(str(n))} > {quote(f'/sys/bus/pci/devices/{pf}/sriov_numvfs')}"


def _write_autoprobe(pf: str, on: bool) -> str:
    return f"printf '%s' {quote('1' if on else '0')} > {quote(f'/sys/bus/pci/devices/{pf}/sriov_drivers_autoprobe')}"


class SriovVfsProvider(HostProvider):
    VERSION = "1"
    # A different PF (or host) is a different set of VFs: restore the old PF, then set up the new one.
    REPLACE_ON = ("host", "pf")
    OUTPUT_ONLY = (
        "plan",
        "pf_address",
        "vf_addresses",
        "numvfs",
        "drivers",
        "unit",
        "pinned",
        "unmovable",
        "irq_movable",
        "vf_config",
        "unsupported",
        "warnings",
        "prior_numvfs",
        "prior_autoprobe",
        "prior_overrides",
        "prior_affinity",
        "prior_unit_enabled",
        "prior",
    )

    # -- check: everything the host's hardware rules out fails here, before any change --------------------------
    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        if _unknown(news):
            # Preview with a value from another resource not known yet: the next `up` checks again with it.
            return CheckResult(news, failures)
        try:
            want = want_of(news)
        except ValidationError as e:
            return CheckResult(news, failures + validation_failures(e))
        if failures:
            return CheckResult(news, failures)
        facts, detail, unit_text, _ = read_state(self.conn(news), want.pf)
        p = plan.plan_sriov(facts, detail, want, unit_text)
        failures += [CheckFailure(e.field, e.message) for e in p.errors]
        return CheckResult({**news, "plan": p.sentence}, failures)

    # -- create / update ----------------------------------------------------------------------------------------
    def _apply(self, props: dict, olds: Optional[dict]) -> dict:
        conn = self.conn(props)
        want = want_of(props)
        facts, detail, unit_text, pf = read_state(conn, want.pf)
        p = plan.plan_sriov(facts, detail, want, unit_text)
        if p.errors:
            raise RuntimeError(f"{conn.spec.name}: {p.sentence}; nothing changed")
        name = conn.spec.name
        if want.vfio and want.num_vfs:
            if not facts.iommu.active:
                raise RuntimeError(
                    f"{name}: the IOMMU is not active (no /sys/kernel/iommu_groups), so vfio-pci "
                    "cannot take the VFs; enable it first (PassthroughHost, seed 002 §3); nothing changed"
                )
            if "driverctl" not in facts.tools:
                raise RuntimeError(
                    f"{name}: binding VFs to vfio-pci needs driverctl (seed 002 §4/§5); install it; nothing changed"
                )
        dev = facts.pci[pf]
        olds = olds or {}
        bind_vfs = next((a.data["vfs"] for a in p.actions if a.kind == "bind"), [])
        paths = [plan.unit_path(pf)] + [plan.driverctl_file(a) for a in p.vf_addresses if want.vfio]
        s = Script().raw("set -e").raw("echo @@pristine-files")
        capture_script(paths, s)
        kinds = p.kinds()
        if "numvfs" in kinds and dev.vfs:
            s.extend(_in_use_guard(facts, dev.vfs))
        if "numvfs-zero" in kinds:
            s.raw(_write_numvfs(pf, 0))
        if "autoprobe" in kinds:
            s.raw(_write_autoprobe(pf, False))
        if "numvfs" in kinds:
            s.raw(_write_numvfs(pf, want.num_vfs))
            s.raw("udevadm settle -t 30 || true")
        if "bind" in kinds:
            s.add("modprobe", "vfio-pci")
            if p.vf_addresses:
                for a in bind_vfs:
                    s.add("driverctl", "set-override", a, "vfio-pci")
            else:
                # No offset/stride in sysfs: the VFs' addresses are known only now that they exist.
                s.raw(
                    f"for v in {quote(f'/sys/bus/pci/devices/{pf}')}/virtfn*; do "
                    'driverctl set-override "$(basename "$(readlink "$v")")" vfio-pci; done'
                )
            # driverctl@pci-<vf>.service (its udev rule, for VFs whose override file already existed) may be
            # re-probing the same VFs right now: wait until every VF is on vfio-pci before reading back.
            s.raw(
                f"for v in {quote(f'/sys/bus/pci/devices/{pf}')}/virtfn*; do j=0; while [ $j -lt 300 ]; do "
                '[ "$(basename "$(readlink "$v/driver" 2>/dev/null)" 2>/dev/null)" = vfio-pci ] && break; '
                "sleep 0.1; j=$((j+1)); done; done"
            )
        unit = plan.unit_path(pf)
        if "persist" in kinds:
            if unit_text != p.unit_text:
                s.extend(write_lines(unit, p.unit_text.encode(), "0644", "0:0"))
            s.add("systemctl", "daemon-reload")
            s.add("systemctl", "enable", "--quiet", plan.unit_name(pf))
        vf_cfg_actions = [a for a in p.actions if a.kind == "vf-config"]
        for a in vf_cfg_actions:
            cmd = sh("ip", "link", "set", "dev", a.data["netdev"], "vf", str(a.data["vf"]), *a.data["args"])
            s.raw(f"if ! out=$({cmd} 2>&1); then echo \"vfcfg-fail {int(a.data['vf'])} $out\" | tr '\\n' ' '; echo; fi")
        s.extend(_affinity_lines(p.irq_targets) if any(k == "irq" for k in kinds) else [])
        s.raw("echo @@applied")
        out = conn.run(s.render()).stdout
        pristine = parse_files(split_sections(out).get("pristine-files", ""), section="pristine")
        applied = split_sections(out).get("applied", "") + "\n" + out

        after, adetail, _, _ = read_state(conn, pf)
        adev = after.pci[pf]
        vfs = list(adev.vfs)
        drivers = {a: (after.pci[a].driver if a in after.pci else None) for a in vfs}
        if adev.sriov_numvfs != want.num_vfs:
            raise RuntimeError(
                f"{name}: sriov_numvfs of {pf} is {adev.sriov_numvfs} after writing {want.num_vfs}; see dmesg"
            )
        if want.vfio and any(d != plan.VFIO for d in drivers.values()):
            bad = {a: d for a, d in drivers.items() if d != plan.VFIO}
            raise RuntimeError(f"{name}: vfio-pci did not take {bad}; check dmesg (IOMMU group of the VF?)")
        unmovable = sorted({ln.split()[1] for ln in applied.splitlines() if ln.startswith("unmovable ")}, key=int)
        if "irq" not in kinds and olds.get("irq_movable") is not None:
            # Nothing was re-pinned this time: what refused before (kernel-managed) still refuses.
            was = olds["irq_movable"]
            unmovable = [i for pos, i in enumerate(adetail.irqs) if pos < len(was) and not was[pos]]
        failed_cfg = {}
        for ln in applied.splitlines():
            if ln.startswith("vfcfg-fail "):
                _, i, rest = ln.split(" ", 2)
                failed_cfg[int(i)] = rest.strip()
        vf_config: dict[str, str] = {}
        for i, st in enumerate(want.vfs):
            if st.empty:
                continue
            if not dev.net:
                vf_config[str(i)] = f"not supported by {dev.driver}: the PF has no network interface"
            elif i in failed_cfg:
                vf_config[str(i)] = f"not supported by {dev.driver}: {failed_cfg[i]}"
            else:
                vf_config[str(i)] = "applied: " + " ".join(st.ip_args())

        # What delete restores: the first record wins across updates (the host as gpuhost found it).
        prior_files = {k: v.model_dump() for k, v in pristine.items()}
        prior_files.update(olds.get("prior") or {})
        prior_overrides = dict(olds.get("prior_overrides") or {})
        for a in p.vf_addresses if want.vfio else []:
            if a not in prior_overrides:
                st = pristine.get(plan.driverctl_file(a))
                prior_overrides[a] = st.text.strip() if st is not None and st.exists else None
        prior_affinity = olds.get("prior_affinity")
        if prior_affinity is None:
            aff = {q.irq: q.affinity for q in facts.interrupts}
            prior_affinity = [[i, aff.get(i, [])] for i in detail.irqs] if want.irq_cpus else []
        aff_now = {q.irq: q.affinity for q in after.interrupts}
        return self.outputs(
            props,
            plan=p.sentence,
            pf_address=pf,
            vf_addresses=vfs,
            numvfs=adev.sriov_numvfs,
            drivers=drivers,
            unit=plan.unit_name(pf),
            pinned={i: aff_now.get(i, []) for i in p.irq_targets if i not in unmovable},
            unmovable=unmovable,
            irq_movable=[i in p.irq_targets and i not in unmovable for i in adetail.irqs],
            vf_config=vf_config,
            unsupported=p.unsupported,
            warnings=p.warnings,
            prior_numvfs=olds.get("prior_numvfs", dev.sriov_numvfs or 0),
            prior_autoprobe=olds.get("prior_autoprobe", detail.autoprobe),
            prior_overrides=prior_overrides,
            prior_affinity=prior_affinity,
            prior_unit_enabled=olds.get("prior_unit_enabled", bool(detail.unit_enabled)),
            prior=prior_files,
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        out = self._apply(props, None)
        return CreateResult(f"{self.spec(props).name}:sriov:{out['pf_address']}", out)

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        return UpdateResult(self._apply(news, olds))

    # -- read: what the host really has, in the inputs' terms, so refresh shows drift ---------------------------
    def read(self, id_: str, props: dict) -> ReadResult:
        conn = self.conn(props)
        pf = props.get("pf_address") or props["pf"]
        facts, detail, unit_text, pf = read_state(conn, pf)
        dev = facts.pci.get(pf)
        if dev is None:
            return ReadResult(id_, {**props, "numvfs": None, "vf_addresses": [], "drivers": {}})
        vfs = list(dev.vfs)
        drivers = {a: (facts.pci[a].driver if a in facts.pci else None) for a in vfs}
        outs = {**props, "numvfs": dev.sriov_numvfs, "vf_addresses": vfs, "drivers": drivers}
        outs["num_vfs"] = dev.sriov_numvfs
        if props.get("vfio") and vfs:
            outs["vfio"] = all(
                d == plan.VFIO and facts.driverctl_overrides.get(a) == plan.VFIO for a, d in drivers.items()
            )
        try:
            wanted_unit = plan.render_unit(pf, want_of(props), dev.net[0] if dev.net else None)
        except (ValidationError, ValueError):
            wanted_unit = None
        outs["persist"] = bool(unit_text == wanted_unit and detail.unit_enabled)
        aff = {q.irq: q.affinity for q in facts.interrupts}
        want_cpus = sorted(int(c) for c in props.get("irq_cpus") or [])
        movable = props.get("irq_movable") or []
        # By position in the PF's vector list: IRQ numbers change between boots, the n-th vector does not.
        moved = [
            aff.get(i)
            for pos, i in enumerate(detail.irqs)
            if pos < len(movable) and movable[pos] and not plan.on_cpus(aff.get(i), want_cpus)
        ]
        if want_cpus and moved:
            outs["irq_cpus"] = moved[0]
        return ReadResult(id_, outs)

    # -- delete: the PF as it was ------------------------------------------------------------------------------
    def delete(self, _id: str, props: dict) -> None:
        conn = self.conn(props)
        pf = props.get("pf_address") or props["pf"]
        facts, detail, _, pf = read_state(conn, pf)
        dev = facts.pci.get(pf)
        prior = {k: FileState.model_validate(v) for k, v in (props.get("prior") or {}).items()}
        s = Script().raw("set -e")
        unit = plan.unit_name(pf)
        prior_numvfs = int(props.get("prior_numvfs") or 0)
        if dev is not None:
            if (dev.sriov_numvfs or 0) != prior_numvfs and dev.vfs:
                s.extend(_in_use_guard(facts, dev.vfs))
            s.raw(f"systemctl disable --quiet {quote(unit)} 2>/dev/null || true")
            if (dev.sriov_numvfs or 0) != prior_numvfs:
                if dev.sriov_numvfs:
                    s.raw(_write_numvfs(pf, 0))
                if props.get("prior_autoprobe") is not None:
                    s.raw(_write_autoprobe(pf, bool(props["prior_autoprobe"])))
                if prior_numvfs:
                    s.raw(_write_numvfs(pf, prior_numvfs))
                s.raw("udevadm settle -t 30 || true")
            elif props.get("prior_autoprobe") is not None:
                s.raw(_write_autoprobe(pf, bool(props["prior_autoprobe"])))
        for a, before in sorted((props.get("prior_overrides") or {}).items()):
            exists = quote(f"/sys/bus/pci/devices/{a}")
            # VFs that no longer exist need only their override file put back (below).
            if before:
                s.raw(f"if [ -e {exists} ]; then {sh('driverctl', 'set-override', a, before)}; fi")
            else:
                s.raw(f"if [ -e {exists} ]; then {sh('driverctl', 'unset-override', a)} || true; fi")
        s.extend(restore_lines(prior))
        s.add("systemctl", "daemon-reload")
        if props.get("prior_unit_enabled") and prior.get(plan.unit_path(pf), FileState(path="", exists=False)).exists:
            s.add("systemctl", "enable", "--quiet", unit)
        irqs_now = detail.irqs
        restore_aff = {}
        for pos, (_irq, cpus) in enumerate(props.get("prior_affinity") or []):
            # IRQ numbers change between boots; the PF's n-th vector is the same vector.
            now = irqs_now[pos] if pos < len(irqs_now) else None
            if now is not None and cpus:
                restore_aff[now] = [int(c) for c in cpus]  # numbers come back from state as floats
        s.extend(_affinity_lines(restore_aff))
        conn.run(s.render())


def _unknown(props: dict) -> bool:
    """Whether a value is not known yet (preview): the SDK hands check an `Unknown`, or None outside a dry run."""
    from pulumi.output import Unknown

    def bad(v):
        if isinstance(v, Unknown) or (isinstance(v, str) and v == UNKNOWN):
            return True
        if isinstance(v, dict):
            return any(bad(x) for x in v.values())
        if isinstance(v, list):
            return any(bad(x) for x in v)
        return False

    return any(props.get(k) is None for k in ("host", "pf", "num_vfs")) or any(
        bad(props.get(k)) for k in ("host", *WANT_KEYS)
    )


class SriovVfs(HostResource, module="host", name="SriovVfs"):
    pf_address: pulumi.Output[str]
    vf_addresses: pulumi.Output[list]
    numvfs: pulumi.Output[int]
    drivers: pulumi.Output[dict]
    plan: pulumi.Output[str]

    PROVIDER = SriovVfsProvider
    DEFAULTS = {
        "numa_node": None,
        "numa_policy": "require",
        "vfio": True,
        "vfs": [],
        "irq_cpus": [],
        "persist": True,
    }
