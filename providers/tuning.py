"""HostTuning: tuned profile and CPU frequency governor (seeds 000 §8.2, 002 §2/§9), restorable.

Inputs: host, tuned_profile ("latency-performance"), governor ("performance"), version.
Outputs: applied (what was really set), skipped (what the host cannot do, and why), prior_profile, prior_mode,
prior_governors (as first found, also recorded on the host), prior_mode_file and prior_active_file
(/etc/tuned/profile_mode and /etc/tuned/active_profile as first found, put back byte for byte after `tuned-adm`
rewrote them: tuned reads both at boot, so the next boot chooses as it did before gpuhost; with only the mode file
back, an `auto_profile` left the recommended profile in active_profile and the next boot pinned it as "manual"),
plan. Decisions are in plans/tuning.py.
"""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure

from facts.files import FileState
from facts.host import facts_script, parse_governors, parse_host_facts, read_host_facts
from facts.model import HostFacts
from plans import tuning as plan
from plans import values as allowed
from pristine import Change, Record
from providers.base import HostResource, TemplateProvider

MODE_FILE = "/etc/tuned/profile_mode"
ACTIVE_FILE = "/etc/tuned/active_profile"


def _want(props: dict) -> plan.TuningWant:
    return plan.TuningWant(profile=props.get("tuned_profile"), governor=props.get("governor"))


def _facts(f: HostFacts) -> plan.TuningFacts:
    return plan.TuningFacts(has_tuned="tuned-adm" in f.tools, profile=f.tuned_profile, governors=dict(f.governors))


# tuned's own profiles without a [bootloader] section: applying one never rewrites the boot loader's config. Any
# other profile (realtime, cpu-partitioning, a site's own) may, so it also takes the "boot" lock (update-grub).
NO_BOOTLOADER = frozenset(
    {
        "accelerator-performance",
        "balanced",
        "desktop",
        "hpc-compute",
        "latency-performance",
        "network-latency",
        "network-throughput",
        "powersave",
        "throughput-performance",
        "virtual-guest",
        "virtual-host",
    }
)


def _classes(props: dict) -> tuple[str, ...]:
    # tuned's [sysctl] and [vm] plugins write the runtime sysctls that Sysctls records and sets.
    profile = props.get("tuned_profile")
    return ("sysctl",) if profile is None or profile in NO_BOOTLOADER else ("boot", "sysctl")


class HostTuningProvider(TemplateProvider):
    # 4: tuned's profile mode recorded, auto restored as auto; 5: planned from HostPreflight's read, one round trip per
    # change; 6: active_profile put back byte for byte too
    VERSION = "6"
    KIND = "tuning"
    INPUTS = ("host", "tuned_profile", "governor")
    OUTPUT_ONLY = (
        "applied",
        "skipped",
        "prior_profile",
        "prior_mode",
        "prior_mode_file",
        "prior_active_file",
        "prior_governors",
        "plan",
    )

    def validate(self, news: dict) -> list[CheckFailure]:
        # The stack loader refuses these first; a provider used on its own refuses them too (tuned writes the
        # profile name into its own config, the governor goes to sysfs).
        failures = []
        for field, check in (("tuned_profile", allowed.tuned_profile), ("governor", allowed.governor)):
            if news.get(field) is not None:
                try:
                    check(news[field])
                except ValueError as e:
                    failures.append(CheckFailure(field, str(e)))
        return failures

    def _record(self, props: dict) -> Record:
        # The tuned profile and governors as first found, on the host: a re-create after a dropped connection
        # must not take the profile it just set for the original.
        return Record(
            self.owner(props),
            files=[MODE_FILE, ACTIVE_FILE],
            values={
                "tuned/profile": "cat /etc/tuned/active_profile",
                "cpufreq/governors": "cd /sys/devices/system/cpu && grep -H . cpu[0-9]*/cpufreq/scaling_governor",
            },
        )

    READ = {"sections": ["tools", "tuned", "governors"], "files": []}

    @classmethod
    def read_spec(cls, inputs: dict) -> dict:
        """What the plan is made from (HostPreflight reads it too): tuned-adm present, the profile, the governors."""
        return cls.READ

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        conn = self.conn(props)
        made: dict = {}

        def plan_from(read: bytes, files, first) -> Optional[Change]:
            t = plan.plan_tuning(_want(props), _facts(parse_host_facts(read.decode(errors="replace"))))
            # What an earlier apply set and this one no longer manages goes back to what was first found.
            dropped = {k: v for k, v in ((prior or {}).get("applied") or {}).items() if k not in t.applied}
            if dropped and first is None:
                return None  # it goes back to the first-found profile and governors: read the records first
            made.update(t=t, undo=plan.restore_plan({}, "", {}, ""))
            ch = Change(self.owner(props), classes=() if dropped else _classes(props))
            if dropped:
                prior_mode = files[MODE_FILE].text.strip() if files[MODE_FILE].exists else ""
                prior_govs = {str(c): g for c, g in parse_governors(first.get("cpufreq/governors", "")).items()}
                undo = plan.restore_plan(dropped, first.get("tuned/profile", "").strip(), prior_govs, prior_mode)
                made["undo"] = undo
                ch.add(a.command for a in undo.actions)
                if "tuned_profile" in dropped:
                    ch.restore({MODE_FILE: files[MODE_FILE], ACTIVE_FILE: files[ACTIVE_FILE]})
            return self.to_change(props, t.plan, ch)

        _, files, first, _, _ = self.converge(conn, props, self._record(props), facts_script(**self.READ), plan_from)
        t, undo = made["t"], made["undo"]
        prior_profile = first.get("tuned/profile", "").strip()
        prior_mode = files[MODE_FILE].text.strip() if files[MODE_FILE].exists else ""
        prior_govs = {str(c): g for c, g in parse_governors(first.get("cpufreq/governors", "")).items()}
        return {
            "applied": t.applied,
            "skipped": t.skipped,
            "prior_profile": prior_profile,
            "prior_mode": prior_mode,
            "prior_mode_file": files[MODE_FILE].model_dump(),
            "prior_active_file": files[ACTIVE_FILE].model_dump(),
            "prior_governors": prior_govs,
            "plan": [a.why for a in undo.actions] + t.plan.sentences,
        }

    def observe(self, props: dict) -> dict:
        return plan.observed(_want(props), props.get("applied") or {}, _facts(read_host_facts(self.conn(props))))

    def restore(self, props: dict) -> Change:
        p = plan.restore_plan(
            props.get("applied") or {},
            props.get("prior_profile"),
            props.get("prior_governors") or {},
            props.get("prior_mode"),
        )
        ch = Change(self.owner(props)).add(a.command for a in p.actions)
        if "tuned_profile" in (props.get("applied") or {}):
            # tuned-adm wrote both ("manual" or "auto", the profile it set); state of version 4 has no active file
            kept = {MODE_FILE: props.get("prior_mode_file"), ACTIVE_FILE: props.get("prior_active_file")}
            ch.restore({p: FileState.model_validate(st) for p, st in kept.items() if st})
        return ch.forget(self._record(props))


class HostTuning(HostResource, module="host", name="HostTuning"):
    applied: pulumi.Output[dict]
    skipped: pulumi.Output[dict]

    PROVIDER = HostTuningProvider
    DEFAULTS = {"tuned_profile": None, "governor": None}
