"""HostPreflight: the seeds' BIOS/IOMMU/slot checks, run in `check` so `pulumi preview` fails before any change.

Inputs: host, gpus, devices, enables_iommu, acs_override_acknowledged, allow_unsafe_interrupts_acknowledged,
bind_by_ids, version. Outputs: report (one line per check), failed (bool).
"""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure

from access.errors import HostError
from facts.host import read_host_facts
from facts.state import Change
from plans.preflight import PreflightWant, failures, preflight, report
from providers.base import HostResource, TemplateProvider

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


class HostPreflightProvider(TemplateProvider):
    VERSION = "2"  # 2: on the template
    KIND = "preflight"
    INPUTS = ("host", *WANT_KEYS)
    OUTPUT_ONLY = ("report", "failed")

    def _run(self, props: dict):
        conn = self.conn(props)
        return preflight(self.guarded(conn, "reading the host", lambda: read_host_facts(conn)), want_of(props))

    def validate(self, news: dict) -> list[CheckFailure]:
        # Run in check, so `pulumi preview` fails before any change anywhere.
        if self.check_host(news):
            return []
        return [CheckFailure("preflight", str(f)) for f in failures(self._run(news))]

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        findings = self._run(props)
        if failures(findings):
            raise HostError(
                self.spec(props).name,
                "preflight failed:\n" + report(failures(findings)),
                fix="each line above says what to change (BIOS, kernel, slot); then run `pulumi up` again",
                changed=False,
            )
        return {"report": [str(f) for f in findings], "failed": False}

    def observe(self, props: dict) -> dict:
        findings = self._run(props)
        return {"report": [str(f) for f in findings], "failed": bool(failures(findings))}

    def restore(self, props: dict) -> Change:
        return Change(self.owner(props))  # it reads the host only


class HostPreflight(HostResource, module="host", name="HostPreflight"):
    report: pulumi.Output[list]

    PROVIDER = HostPreflightProvider
