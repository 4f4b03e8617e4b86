"""HostPreflight: the seeds' BIOS/IOMMU/slot checks, run in `check` so `pulumi preview` fails before any change.

Inputs: host, gpus, devices, enables_iommu, acs_override_acknowledged, allow_unsafe_interrupts_acknowledged,
bind_by_ids, reads (the host-prep steps' own reads: {step: facts_script arguments, and VfioBinding's `pci_slots`};
not diffed), version.
Outputs: report (one line per check), failed (bool), read_out ({step: that read's output, base64}: each step plans
its first change from it and checks it again, in the change's own round trip, before changing anything; VfioBinding's
is followed by a space and its initramfs listing, base64, read once).
"""

from __future__ import annotations

from typing import Any, Optional

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult

from access.errors import HostError
from access.shell import Script, quote
from facts.host import facts_script, parse_host_facts, step_read_script
from plans.preflight import PreflightWant, failures, preflight, report
from plans.vfio import initramfs_read
from pristine import Change
from providers.base import HostResource, TemplateProvider, unknown_paths

WANT_KEYS = (
    "gpus",
    "devices",
    "enables_iommu",
    "acs_override_acknowledged",
    "allow_unsafe_interrupts_acknowledged",
    "bind_by_ids",
)


def want_of(props: dict) -> PreflightWant:
    return PreflightWant(**{k: props[k] for k in WANT_KEYS if props.get(k) is not None})


def read_script(reads: Any) -> str:
    """The whole read and the steps' own reads (`reads`: {step: facts_script keyword arguments, and `pci_slots`
    for VfioBinding's initramfs listing}), in one script: the whole read first (kept in a temporary file), then each
    step's read as one line `@@read <step> <its output, base64>[ <the listing, base64>]`: the bytes a step's guard
    compares before its change. A step's sections that the whole read has are carved out of it
    (facts.host.step_read_script), not run again."""
    whole = facts_script()
    if not isinstance(reads, dict) or unknown_paths(reads) or not reads:
        return whole
    s = Script().raw("gp_full=$(mktemp)").raw(f'( {whole}\n) >"$gp_full"').raw('cat "$gp_full"')
    for name, spec in sorted(reads.items()):
        s.raw(f"printf '@@read %s ' {quote(name)}")
        # Every key given explicitly: the engine may drop an empty list on the way (no sections is not all of them).
        read = step_read_script(
            '"$gp_full"', spec.get("sysctls") or [], spec.get("files") or [], spec.get("sections") or []
        )
        s.raw(f"( {read}\n) </dev/null 2>/dev/null | base64 -w0")
        if spec.get("pci_slots"):
            s.raw("printf ' '").raw(f"( {initramfs_read(spec['pci_slots'])}\n) </dev/null 2>/dev/null | base64 -w0")
        s.raw("echo")
    s.raw('rm -f "$gp_full"')
    return s.render()


def parse_reads(out: str) -> dict[str, str]:
    res = {}
    for ln in out.splitlines():
        if ln.startswith("@@read "):
            parts = ln.split(" ", 2)
            res[parts[1]] = parts[2] if len(parts) > 2 else ""
    return res


class HostPreflightProvider(TemplateProvider):
    VERSION = "3"  # 3: one read in check, used by create, with the steps' reads; 2: on the template
    KIND = "preflight"
    INPUTS = ("host", *WANT_KEYS)
    OUTPUT_ONLY = ("report", "failed", "read_out")

    def _read(self, props: dict) -> tuple[list, dict[str, str]]:
        """The findings and the steps' reads, in one round trip."""
        conn = self.conn(props)
        out = self.guarded(conn, "reading the host", lambda: conn.run(read_script(props.get("reads"))).stdout)
        return preflight(parse_host_facts(out), want_of(props)), parse_reads(out)

    def _run(self, props: dict):
        return self._read(props)[0]

    def check_known(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        # Run in check, so `pulumi preview` fails before any change anywhere. The read made here is the `up`'s one
        # read of the host: create reports these findings and hands on these reads (`checked`, a hint: never diffed).
        res = super().check_known(olds, news)
        if res.failures or unknown_paths(news.get("reads")):
            return res  # `reads` is computed from config, known in every real preview: never read with a placeholder
        findings, reads = self._read(news)
        bad = failures(findings)
        if bad:
            return CheckResult(news, [CheckFailure("preflight", str(f)) for f in bad])
        return CheckResult({**news, "checked": {"report": [str(f) for f in findings], "read_out": reads}}, [])

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        checked = props.get("checked")
        if isinstance(checked, dict) and not unknown_paths(checked):
            return {"report": checked["report"], "failed": False, "read_out": checked["read_out"]}
        findings, reads = self._read(props)
        if failures(findings):
            raise HostError(
                self.spec(props).name,
                "preflight failed:\n" + report(failures(findings)),
                fix="each line above says what to change (BIOS, kernel, slot); then run `pulumi up` again",
                changed=False,
            )
        return {"report": [str(f) for f in findings], "failed": False, "read_out": reads}

    def observe(self, props: dict) -> dict:
        findings = self._run(props)
        return {"report": [str(f) for f in findings], "failed": bool(failures(findings))}

    def restore(self, props: dict) -> Change:
        return Change(self.owner(props))  # it reads the host only


class HostPreflight(HostResource, module="host", name="HostPreflight"):
    report: pulumi.Output[list]
    read_out: pulumi.Output[dict]

    PROVIDER = HostPreflightProvider
