"""HostTuning: tuned profile and CPU frequency governor (seeds 000 §8.2, 002 §2/§9), restorable.

Inputs: host, tuned_profile ("latency-performance"), governor ("performance"), version.
Outputs: applied (what was really set), skipped (what the host cannot do, and why), prior_profile, prior_governors.
"""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, DiffResult, ReadResult

from access.shell import quote, sh
from facts.host import facts_script, parse_governors, parse_host_facts, read_host_facts
from facts.state import Change, Record
from plans import values as allowed
from providers.base import HostProvider, HostResource


def _governor_lines(govs: dict) -> list[str]:
    return [
        f"printf '%s' {quote(g)} > /sys/devices/system/cpu/cpu{int(c)}/cpufreq/scaling_governor"
        for c, g in sorted(govs.items(), key=lambda kv: int(kv[0]))
    ]


class HostTuningProvider(HostProvider):
    VERSION = "2"
    KIND = "tuning"
    OUTPUT_ONLY = ("applied", "skipped", "prior_profile", "prior_governors")

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        # The stack loader refuses these first; a provider used on its own refuses them too (tuned writes the
        # profile name into its own config, the governor goes to sysfs).
        failures = self.check_host(news)
        for field, check in (("tuned_profile", allowed.tuned_profile), ("governor", allowed.governor)):
            if news.get(field) is not None:
                try:
                    check(news[field])
                except ValueError as e:
                    failures.append(CheckFailure(field, str(e)))
        return CheckResult(news, failures)

    def _record(self, props: dict) -> Record:
        # The tuned profile and governors as first found, on the host: a re-create after a dropped connection
        # must not take the profile it just set for the original.
        return Record(
            self.owner(props),
            values={
                "tuned/profile": "cat /etc/tuned/active_profile",
                "cpufreq/governors": "cd /sys/devices/system/cpu && grep -H . cpu[0-9]*/cpufreq/scaling_governor",
            },
        )

    def _converge(self, props: dict, olds: Optional[dict]) -> dict:
        conn = self.conn(props)
        rec = self._record(props)
        out, _, first = self.record_and_read(conn, props, rec, facts_script())
        facts = parse_host_facts(out)
        applied, skipped = {}, {}
        ch = Change(self.owner(props))
        s = ch.script
        prior_profile = first.get("tuned/profile", "").strip()
        prior_govs = {str(c): g for c, g in parse_governors(first.get("cpufreq/governors", "")).items()}
        want_profile = props.get("tuned_profile")
        if want_profile:
            if "tuned-adm" in facts.tools:
                if facts.tuned_profile != want_profile:
                    s.add("tuned-adm", "profile", want_profile)
                applied["tuned_profile"] = want_profile
            else:
                skipped["tuned_profile"] = "tuned is not installed (install tuned, seed 002 §2)"
        want_gov = props.get("governor")
        if want_gov:
            if facts.governors:
                s.extend(_governor_lines({c: want_gov for c in facts.governors if facts.governors[c] != want_gov}))
                applied["governor"] = want_gov
            else:
                skipped["governor"] = "no cpufreq driver on this host (frequency is firmware/hypervisor managed)"
        if not ch.empty:
            ch.run(conn)
        return self.outputs(
            props, applied=applied, skipped=skipped, prior_profile=prior_profile, prior_governors=prior_govs
        )

    def diff_known(self, _id: str, olds: dict, news: dict) -> DiffResult:
        return self.also_changed(super().diff_known(_id, olds, news), bool(olds.get("drift")))

    def read(self, id_: str, props: dict) -> ReadResult:
        facts = read_host_facts(self.conn(props))
        applied = props.get("applied") or {}
        drift = []
        if "tuned_profile" in applied and facts.tuned_profile != applied["tuned_profile"]:
            drift.append(f"tuned profile is {facts.tuned_profile!r}")
        if "governor" in applied and any(g != applied["governor"] for g in facts.governors.values()):
            drift.append("governor changed")
        return ReadResult(id_, {**props, "drift": drift})

    def delete(self, _id: str, props: dict) -> None:
        ch = Change(self.owner(props))
        s = ch.script
        applied = props.get("applied") or {}
        if "tuned_profile" in applied:
            prior = props.get("prior_profile")
            s.raw(sh("tuned-adm", "profile", prior) if prior else sh("tuned-adm", "off"))
        if "governor" in applied:
            s.extend(_governor_lines(props.get("prior_governors") or {}))
        ch.forget(self._record(props)).run(self.conn(props))


class HostTuning(HostResource, module="host", name="HostTuning"):
    applied: pulumi.Output[dict]
    skipped: pulumi.Output[dict]

    PROVIDER = HostTuningProvider
    DEFAULTS = {"tuned_profile": None, "governor": None}
