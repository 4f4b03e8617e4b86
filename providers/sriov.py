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
the PF's IRQ list: IRQ numbers change between boots), prior_unit_enabled, prior (the unit, its wants link and the
driverctl files as first found). All of it is recorded on the host before the first change (pristine/), so a
re-run after a dropped connection reports the host's real originals, not what the dropped run had set.

Persistence is a systemd unit (see `plans.sriov.render_unit` for why not a udev rule); vfio-pci overrides are
driverctl's (`/etc/driverctl.d/pci-<vf>`), re-applied by the unit after the VFs exist.

Usage::

    SriovVfs("gpu-a-sriov", {"host": host_input(spec), "pf": "0000:41:00.0", "num_vfs": 4, "numa_node": 0,
                             "vfio": True, "irq_cpus": [0, 32]})
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult
from pulumi.runtime import rpc
from pydantic import ValidationError

from access.errors import HostError
from access.shell import Script, quote, sh
from facts.cpulist import parse_cpulist
from facts.files import FileState
from facts.host import facts_script, parse_host_facts, read_host_facts, split_sections
from facts.model import HostFacts, PciDevice, normalize_pci
from plans import irq as irq_plan
from plans import sriov as plan
from pristine import Change, Record
from providers.base import HostResource, TemplateProvider, unknown_paths, validation_failures
from providers.effects import Effect, host_name

UNKNOWN = rpc.UNKNOWN  # the SDK's placeholder for a value not known during preview
WANT_KEYS = ("pf", "num_vfs", "numa_node", "numa_policy", "vfio", "vfs", "irq_cpus")


def want_of(props: dict) -> plan.SriovWant:
    # Not strict here: the engine hands numbers over as floats (protobuf Struct), so a VLAN of 100 arrives as 100.0;
    # the stack loader checked the config's own types strictly before any resource.
    return plan.SriovWant.model_validate({k: props[k] for k in WANT_KEYS if props.get(k) is not None}, strict=False)


def read_state(conn, pf_ref: str) -> tuple[HostFacts, plan.PfDetail, Optional[str], str]:
    """(facts, PF detail, boot unit text or None, PF address) in one round trip (two for an interface name)."""
    addr = normalize_pci(pf_ref) if plan.PCI_RE.match(normalize_pci(pf_ref)) else None
    if addr is None:
        named = read_host_facts(conn)
        dev, _ = plan.resolve_pf(named, pf_ref)
        if dev is None:  # no such interface: what was read is the answer (the plan refuses it by name)
            return named, plan.PfDetail(), None, pf_ref
        addr = dev.address
    out = conn.run(facts_script(files=[plan.unit_path(addr)]) + plan.pf_detail_script(addr)).stdout
    facts = parse_host_facts(out)
    detail = plan.parse_pf_detail(split_sections(out).get("sriov-pf", ""))
    st = facts.files.get(plan.unit_path(addr))
    return facts, detail, (st.text if st and st.exists else None), addr


def _in_use_guard(facts: HostFacts, vfs: list[str]) -> list[str]:
    """Fail before touching the count while a VM (any process) holds a VF's VFIO group: removing a VF that is in use
    blocks in the kernel until the VM lets go."""
    groups = sorted({g for a in vfs if a in facts.pci and (g := facts.pci[a].iommu_group) is not None})
    if not groups:
        return []
    rx = " -> /dev/vfio/(" + "|".join(str(g) for g in groups) + ")$"
    return [
        f"if ls -l /proc/[0-9]*/fd 2>/dev/null | grep -qE {quote(rx)}; then "
        f"echo {quote('a VF of this PF is open through VFIO (a running VM?): detach it first; nothing changed')} >&2; "
        "exit 3; fi"
    ]


def _affinity_lines(target: dict[str, list[int]]) -> list[str]:
    return [irq_plan.affinity_command(i, c) for i, c in sorted(target.items(), key=lambda kv: int(kv[0]))]


def _write_numvfs(pf: str, n: int) -> str:
    return f"printf '%s' {quote(str(n))} > {quote(f'/sys/bus/pci/devices/{pf}/sriov_numvfs')}"


def _write_autoprobe(pf: str, on: bool) -> str:
    return f"printf '%s' {quote('1' if on else '0')} > {quote(f'/sys/bus/pci/devices/{pf}/sriov_drivers_autoprobe')}"


def _wants(pf: str) -> str:
    return f"{plan.WANTS_DIR}/{plan.unit_name(pf)}"


def _affinity_now(irqs: list[str]) -> str:
    """Prints "<irq> <cpus>" per PF vector, in vector order (IRQ numbers are digits: int() keeps them so)."""
    return "; ".join(f'echo "{int(q)} $(cat /proc/irq/{int(q)}/smp_affinity_list 2>/dev/null)"' for q in irqs) or "true"


def _refuse_unready(name: str, p: plan.SriovPlan, want: plan.SriovWant, facts: HostFacts) -> None:
    """Raise, before any record or change, for a plan with errors or a host that cannot bind VFs to vfio-pci."""
    if p.errors:
        raise HostError(name, p.sentence, fix="change the inputs (see `pulumi preview`)")
    if want.vfio and want.num_vfs:
        if not facts.iommu.active:
            raise HostError(
                name,
                "the IOMMU is not active (no /sys/kernel/iommu_groups), so vfio-pci cannot take the VFs",
                fix="enable it first (PassthroughHost, seed 002 §3)",
            )
        if "driverctl" not in facts.tools:
            raise HostError(name, "binding VFs to vfio-pci needs driverctl (seed 002 §4/§5)", fix="install it")


def _bind(s: Script, pf: str, vfs: Optional[list[str]]) -> None:
    """vfio-pci overrides for `vfs` (None: every VF the PF has once the count is written), then a wait for them."""
    s.add("modprobe", "vfio-pci")
    if vfs is not None:
        for vf_addr in vfs:
            s.add("driverctl", "set-override", vf_addr, "vfio-pci")
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


def _check_applied(
    name: str, pf: str, want: plan.SriovWant, numvfs: Optional[int], drivers: dict[str, Optional[str]]
) -> None:
    """Raise (the host changed) when the read-back count or the VFs' drivers are not what the plan set."""
    if numvfs != want.num_vfs:
        raise HostError(
            name,
            f"sriov_numvfs of {pf} is {numvfs} after writing {want.num_vfs}",
            fix="see dmesg",
            changed=True,
        )
    if want.vfio and any(d != plan.VFIO for d in drivers.values()):
        bad = {a: d for a, d in drivers.items() if d != plan.VFIO}
        raise HostError(name, f"vfio-pci did not take {bad}", fix="check dmesg (IOMMU group of the VF?)", changed=True)


def _unmovable(applied: str, kinds: list[str], olds: dict, irqs: list[str]) -> list[str]:
    """The PF IRQs the kernel refused to move: from this run's output, else (nothing re-pinned) as recorded before."""
    unmovable = irq_plan.unmovable(applied)
    if "irq" not in kinds and olds.get("irq_movable") is not None:
        # Nothing was re-pinned this time: what refused before (kernel-managed) still refuses.
        was = olds["irq_movable"]
        unmovable = [i for pos, i in enumerate(irqs) if pos < len(was) and not was[pos]]
    return unmovable


def _vf_config(want: plan.SriovWant, dev: PciDevice, applied: str) -> dict[str, str]:
    """Per VF index with settings: "applied: <ip link args>", or why the PF's driver does not support them."""
    failed_cfg = {}
    for ln in applied.splitlines():
        if ln.startswith("vfcfg-fail "):
            _, vf, rest = ln.split(" ", 2)
            failed_cfg[int(vf)] = rest.strip()
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
    return vf_config


def _priors(
    olds: dict, pristine: dict[str, FileState], firsts: dict[str, str], p: plan.SriovPlan, want: plan.SriovWant
) -> tuple[dict, dict, list]:
    """What delete restores: (files, driverctl overrides, IRQ affinities by vector position), from the host's
    records (first attempt wins, across re-runs and updates)."""
    prior_files = {k: v.model_dump() for k, v in pristine.items()}
    prior_files.update(olds.get("prior") or {})
    prior_overrides = dict(olds.get("prior_overrides") or {})
    for a in p.vf_addresses if want.vfio else []:
        if a not in prior_overrides:
            was = pristine.get(plan.driverctl_file(a))
            prior_overrides[a] = was.text.strip() if was is not None and was.exists else None
    prior_affinity = olds.get("prior_affinity")
    if not prior_affinity:
        first = [ln.split(" ", 1) for ln in firsts.get("irq-affinity", "").splitlines() if ln.strip()]
        prior_affinity = [[q, parse_cpulist(c[0]) if c else []] for q, *c in first] if want.irq_cpus else []
    return prior_files, prior_overrides, prior_affinity


class SriovVfsProvider(TemplateProvider):
    VERSION = "2"
    KIND = "sriov"
    INPUTS = ("host", *WANT_KEYS, "persist")
    # A different PF (or host) is a different set of VFs: restore the old PF, then set up the new one.
    REPLACE_ON = ("host", "pf")

    def effects(self, olds: dict | None, news: dict) -> list[Effect]:
        # The kernel changes a non-zero VF count only through 0 (plans.sriov): every VF goes away, then the new ones.
        if olds is None or olds.get("num_vfs") == news.get("num_vfs"):
            return []
        return [
            Effect("restart", host_name(news), f"VFs of {news.get('pf')}", "removed and created again (a VM's VF goes)")
        ]

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

    @classmethod
    def writes(cls, inputs: dict) -> list:
        pf = inputs.get("pf")
        return [plan.unit_path(pf)] if isinstance(pf, str) and plan.PCI_RE.match(pf) else []

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

    # What the PF had before gpuhost, recorded on the host the first time (pristine/): the unit and its wants
    # link, each VF's driverctl override file, the VF count, autoprobe and the PF vectors' affinities.
    def _record(self, props: dict, pf: str, files: list[str], irqs: Sequence[str] = ()) -> Record:
        d = f"/sys/bus/pci/devices/{pf}"
        return Record(
            self.owner(props),
            files=sorted({plan.unit_path(pf), _wants(pf), *files}),
            values={
                f"sriov/{pf}/numvfs": sh("cat", f"{d}/sriov_numvfs"),
                f"sriov/{pf}/autoprobe": sh("cat", f"{d}/sriov_drivers_autoprobe"),
                f"sriov/{pf}/irq-affinity": _affinity_now(list(irqs)),
            },
        )

    # -- create / update ----------------------------------------------------------------------------------------
    def create(self, props: dict[str, Any]) -> CreateResult:
        out = self.outputs(props, **self.apply(props, None))
        return CreateResult(f"{self.spec(props).name}:sriov:{out['pf_address']}", out)

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        """Read the PF (facts), plan, record the originals, change the host in one script, read it back."""
        conn = self.conn(props)
        name = conn.spec.name
        want = want_of(props)
        facts, detail, unit_text, pf = read_state(conn, want.pf)
        p = plan.plan_sriov(facts, detail, want, unit_text)
        _refuse_unready(name, p, want, facts)
        dev = facts.pci[pf]
        olds = prior or {}
        rec = self._record(props, pf, [plan.driverctl_file(a) for a in p.vf_addresses if want.vfio], detail.irqs)
        _, pristine, values = self.record_and_read(conn, props, rec, "")
        firsts = {k.rsplit("/", 1)[1]: v for k, v in values.items()}

        ch = self._change(props, p, want, facts, pf, unit_text)
        applied = ""
        if not ch.empty:
            self.guarded(conn, p.sentence, lambda: ch.run(conn), changing=True)
            applied = ch.last_stdout

        after, adetail, _, _ = read_state(conn, pf)
        adev = after.pci[pf]
        vfs = list(adev.vfs)
        drivers = {a: (after.pci[a].driver if a in after.pci else None) for a in vfs}
        _check_applied(name, pf, want, adev.sriov_numvfs, drivers)
        unmovable = _unmovable(applied, p.kinds(), olds, adetail.irqs)
        prior_files, prior_overrides, prior_affinity = _priors(olds, pristine, firsts, p, want)
        aff_now = {q.irq: q.affinity for q in after.interrupts}
        autoprobe = firsts.get("autoprobe")
        return {
            "plan": p.sentence,
            "pf_address": pf,
            "vf_addresses": vfs,
            "numvfs": adev.sriov_numvfs,
            "drivers": drivers,
            "unit": plan.unit_name(pf),
            "pinned": {i: aff_now.get(i, []) for i in p.irq_targets if i not in unmovable},
            "unmovable": unmovable,
            "irq_movable": [i in p.irq_targets and i not in unmovable for i in adetail.irqs],
            "vf_config": _vf_config(want, dev, applied),
            "unsupported": p.unsupported,
            "warnings": p.warnings,
            "prior_numvfs": int(firsts.get("numvfs") or 0),
            "prior_autoprobe": autoprobe == "1" if autoprobe in ("0", "1") else None,
            "prior_overrides": prior_overrides,
            "prior_affinity": prior_affinity,
            "prior_unit_enabled": FileState.model_validate(prior_files[_wants(pf)]).exists,
            "prior": prior_files,
        }

    def _change(
        self, props: dict, p: plan.SriovPlan, want: plan.SriovWant, facts: HostFacts, pf: str, unit_text: Optional[str]
    ) -> Change:
        """The plan's actions as one script: the count (through 0), autoprobe, vfio-pci overrides, the boot unit,
        per-VF settings (a refusal printed as `vfcfg-fail <vf> <why>`, not fatal) and the PF IRQs' affinity."""
        dev = facts.pci[pf]
        bind_vfs: list[str] = next((a.data["vfs"] for a in p.actions if a.kind == "bind"), [])
        ch = Change(self.owner(props))
        s = ch.script
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
            _bind(s, pf, bind_vfs if p.vf_addresses else None)
        if "persist" in kinds:
            if unit_text != p.unit_text:
                ch.write(plan.unit_path(pf), p.unit_text.encode(), "0644", "0:0")
            s.add("systemctl", "daemon-reload")
            s.add("systemctl", "enable", "--quiet", plan.unit_name(pf))
        for act in [x for x in p.actions if x.kind == "vf-config"]:
            cmd = sh("ip", "link", "set", "dev", act.data["netdev"], "vf", str(act.data["vf"]), *act.data["args"])
            s.raw(
                f"if ! out=$({cmd} 2>&1); then echo \"vfcfg-fail {int(act.data['vf'])} $out\" | tr '\\n' ' '; echo; fi"
            )
        s.extend(_affinity_lines(p.irq_targets) if "irq" in kinds else [])
        return ch

    # -- read: what the host really has, in the inputs' terms, so refresh shows drift ---------------------------
    def observe(self, props: dict) -> dict:
        conn = self.conn(props)
        pf = props.get("pf_address") or props["pf"]
        facts, detail, unit_text, pf = read_state(conn, pf)
        dev = facts.pci.get(pf)
        if dev is None:
            return {"numvfs": None, "vf_addresses": [], "drivers": {}}
        vfs = list(dev.vfs)
        drivers = {a: (facts.pci[a].driver if a in facts.pci else None) for a in vfs}
        outs: dict[str, Any] = {"numvfs": dev.sriov_numvfs, "vf_addresses": vfs, "drivers": drivers}
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
        return outs

    # -- delete: the PF as it was ------------------------------------------------------------------------------
    def restore(self, props: dict) -> Change:
        conn = self.conn(props)
        pf = props.get("pf_address") or props["pf"]
        facts, detail, _, pf = read_state(conn, pf)
        dev = facts.pci.get(pf)
        prior = {k: FileState.model_validate(v) for k, v in (props.get("prior") or {}).items()}
        ch = Change(self.owner(props))
        s = ch.script
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
        ch.restore(prior)  # the unit, its wants link (as a link), the driverctl files
        s.add("systemctl", "daemon-reload")
        irqs_now = detail.irqs
        restore_aff = {}
        for pos, (_irq, cpus) in enumerate(props.get("prior_affinity") or []):
            # IRQ numbers change between boots; the PF's n-th vector is the same vector.
            now = irqs_now[pos] if pos < len(irqs_now) else None
            if now is not None and cpus:
                restore_aff[now] = [int(c) for c in cpus]  # numbers come back from state as floats
        s.extend(_affinity_lines(restore_aff))
        return ch.forget(self._record(props, pf, list(prior)))


def _unknown(props: dict) -> bool:
    """Whether a value is not known yet (preview): the SDK hands check an `Unknown`, or None outside a dry run."""
    return any(props.get(k) is None for k in ("host", "pf", "num_vfs")) or bool(
        unknown_paths({k: props.get(k) for k in ("host", *WANT_KEYS)})
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
