"""Sysctls: the seeds' kernel/network tuning in /etc/sysctl.d, applied now, restorable to the old runtime values.

Seed 000 §8.3 and seed 001 §3 (somaxconn, netdev_max_backlog, tcp_tw_reuse, ...). Inputs: host, values
({"net.core.somaxconn": "4096"}), version. Outputs: prior (the pristine file), prior_values (runtime values as
first found, also recorded on the host), plan (what the last apply did, or why nothing).
Decisions are in plans/sysctls.py; the file and the old values are recorded on the host before the first change.
"""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure

from access.errors import HostError
from access.shell import sh
from facts.files import FileState
from facts.host import facts_script, parse_host_facts, read_host_facts
from plans import sysctls as plan
from plans import values as allowed
from pristine import Change, Record
from providers.base import HostResource, TemplateProvider

FILE = plan.FILE


class SysctlsProvider(TemplateProvider):
    VERSION = "3"  # 3: planned from HostPreflight's read; record, check and change in one round trip
    KIND = "sysctls"
    INPUTS = ("host", "values")
    OUTPUT_ONLY = ("prior", "prior_values", "plan")

    @classmethod
    def writes(cls, inputs: dict) -> list:
        return [FILE]

    def validate(self, news: dict) -> list[CheckFailure]:
        values = news.get("values")
        if not isinstance(values, dict) or not values:
            return [CheckFailure("values", "a map of sysctl name -> value")]
        failures: list[CheckFailure] = []
        for k, v in values.items():
            # The loader's allow-lists (plans/values.py), again: the file is parsed by systemd-sysctl.
            for check, x in ((allowed.sysctl_name, k), (allowed.sysctl_value, v)):
                try:
                    check(x)
                except ValueError as e:
                    failures.append(CheckFailure(f"values.{k}", str(e)))
        return failures

    def _record(self, props: dict, names) -> Record:
        return Record(
            self.owner(props), files=[FILE], values={f"sysctl/{k}": sh("sysctl", "-n", k) for k in sorted(names)}
        )

    @classmethod
    def read_spec(cls, inputs: dict) -> dict:
        """What the plan is made from (HostPreflight reads it too): the values now and the file."""
        return {"sections": [], "sysctls": sorted(inputs.get("values") or {}), "files": [FILE]}

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        conn = self.conn(props)
        dropped = sorted(set((prior or {}).get("prior_values") or {}) - set(props["values"]))
        rec = self._record(props, [*props["values"], *dropped])
        made: dict = {}

        def plan_from(read: bytes, _files, values) -> Optional[Change]:
            if dropped and values is None:
                return None  # the dropped names go back to their first-found values: read the records first
            facts = parse_host_facts(read.decode(errors="replace"))
            priors = {k.removeprefix("sysctl/"): v for k, v in (values or {}).items()}
            try:
                p = plan.plan_sysctls(
                    props["values"],
                    facts.sysctls,
                    facts.files[FILE].text if facts.files[FILE].exists else None,
                    restore={k: priors[k] for k in dropped},
                )
            except plan.UnknownSysctl as e:
                raise HostError(
                    conn.spec.name, str(e), fix="check the name (`sysctl -a`) or drop it", changed=False
                ) from None
            made["p"] = p
            # Forgetting records (dropped names) takes the host lock alone: the store's clean-up must not interleave.
            ch = Change(self.owner(props), classes=() if dropped else ("sysctl",))
            ch.forget(Record(rec.owner, values={f"sysctl/{k}": "" for k in dropped}))
            return self.to_change(props, p, ch)

        spec = {"sections": [], "sysctls": sorted(rec_names(rec)), "files": [FILE]}
        _, files, values, _, _ = self.converge(conn, props, rec, facts_script(**spec), plan_from)
        priors = {k.removeprefix("sysctl/"): v for k, v in values.items()}
        return {
            "prior": files[FILE].model_dump(),
            "prior_values": {k: priors[k] for k in props["values"]},
            "plan": made["p"].sentences,
        }

    def observe(self, props: dict) -> dict:
        facts = read_host_facts(self.conn(props), sysctls=sorted(props.get("values") or {}), files=[FILE])
        text = facts.files[FILE].text if facts.files[FILE].exists else None
        return {"values": plan.observed(props.get("values") or {}, facts.sysctls, text)}

    def restore(self, props: dict) -> Change:
        prior = props.get("prior_values") or {}
        ch = Change(self.owner(props))
        if props.get("prior"):
            ch.restore({FILE: FileState.model_validate(props["prior"])})
        ch.add(plan.set_command(k, v) for k, v in sorted(prior.items()) if v != "")
        return ch.forget(self._record(props, prior))


def rec_names(rec: Record) -> list[str]:
    return [k.removeprefix("sysctl/") for k in rec.values]


class Sysctls(HostResource, module="host", name="Sysctls"):
    values: pulumi.Output[dict]

    PROVIDER = SysctlsProvider
