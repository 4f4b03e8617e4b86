"""HostPreflight: the seeds' BIOS/IOMMU/slot checks, run in `check` so `pulumi preview` fails before any change.

Inputs: host, gpus, devices, enables_iommu, acs_override_acknowledged, allow_unsafe_interrupts_acknowledged,
bind_by_ids, version. Outputs: report (one line per check), failed (bool).
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, UpdateResult

from facts.host import read_host_facts
from plans.preflight import PreflightWant, failures, preflight, report
from providers.base import HostProvider, HostResource

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


class HostPreflightProvider(HostProvider):
    VERSION = "1"
    OUTPUT_ONLY = ("report", "failed")

    def _run(self, props: dict):
        return preflight(read_host_facts(self.conn(props)), want_of(props))

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        bad = self.check_host(news)
        if bad:
            return CheckResult(news, bad)
        findings = self._run(news)
        return CheckResult(news, [CheckFailure("preflight", str(f)) for f in failures(findings)])

    def create(self, props: dict[str, Any]) -> CreateResult:
        findings = self._run(props)
        if failures(findings):
            raise RuntimeError("preflight failed:\n" + report(failures(findings)))
        return CreateResult(
            f"{self.spec(props).name}:preflight", self.outputs(props, report=[str(f) for f in findings], failed=False)
        )

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        return UpdateResult(self.create(news).outs)

    def read(self, id_: str, props: dict) -> ReadResult:
        findings = self._run(props)
        return ReadResult(id_, {**props, "report": [str(f) for f in findings], "failed": bool(failures(findings))})

    def delete(self, _id: str, props: dict) -> None:
        return None


class HostPreflight(HostResource, module="host", name="HostPreflight"):
    report: pulumi.Output[list]

    PROVIDER = HostPreflightProvider
