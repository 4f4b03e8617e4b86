"""Host tuning: the tuned profile and the CPU frequency governor (seeds 000 §8.2, 002 §2/§9), facts in, actions out.

What the host can do decides what is applied: without `tuned-adm` the profile is skipped, without a cpufreq driver
(firmware or hypervisor managed frequency) the governor is; each skip says why, and never fails the run.

Usage::

    t = plan_tuning(TuningWant(profile="latency-performance", governor="performance"),
                    TuningFacts(has_tuned=True, profile="balanced", governors={0: "powersave", 1: "performance"}))
    t.plan.sentences   # ["tuned profile is balanced, want latency-performance", "cpu0 governor is powersave, ..."]
    t.applied          # {"tuned_profile": "latency-performance", "governor": "performance"}
    restore_plan(t.applied, prior_profile="balanced", prior_governors={"0": "powersave"})   # on delete
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from access.shell import quote, sh
from plans.plan import Action, Plan, plan_of

NO_TUNED = "tuned is not installed (install tuned, seed 002 §2)"
NO_CPUFREQ = "no cpufreq driver on this host (frequency is firmware/hypervisor managed)"


@dataclass(frozen=True)
class TuningWant:
    profile: Optional[str] = None
    governor: Optional[str] = None


@dataclass(frozen=True)
class TuningFacts:
    has_tuned: bool = False
    profile: Optional[str] = None  # the active tuned profile; None when none is active
    governors: dict[int, str] = field(default_factory=dict)  # cpu -> scaling_governor


@dataclass(frozen=True)
class Tuning:
    plan: Plan
    applied: dict[str, str]  # input name -> value set (or already set)
    skipped: dict[str, str]  # input name -> why the host cannot do it


def governor_command(cpu: int, governor: str) -> str:
    return f"printf '%s' {quote(governor)} > /sys/devices/system/cpu/cpu{int(cpu)}/cpufreq/scaling_governor"


def plan_tuning(want: TuningWant, facts: TuningFacts) -> Tuning:
    actions: list[Action] = []
    applied: dict[str, str] = {}
    skipped: dict[str, str] = {}
    if want.profile:
        if facts.has_tuned:
            if facts.profile != want.profile:
                actions.append(
                    Action(
                        f"tuned profile is {facts.profile or 'none'}, want {want.profile}",
                        sh("tuned-adm", "profile", want.profile),
                    )
                )
            applied["tuned_profile"] = want.profile
        else:
            skipped["tuned_profile"] = NO_TUNED
    if want.governor:
        if facts.governors:
            for cpu, gov in sorted(facts.governors.items()):
                if gov != want.governor:
                    actions.append(
                        Action(
                            f"cpu{cpu} governor is {gov}, want {want.governor}", governor_command(cpu, want.governor)
                        )
                    )
            applied["governor"] = want.governor
        else:
            skipped["governor"] = NO_CPUFREQ
    return Tuning(
        plan_of(actions, "the tuned profile and governors already hold, or the host has neither"), applied, skipped
    )


def restore_plan(
    applied: dict, prior_profile: Optional[str], prior_governors: dict[str, str], prior_mode: Optional[str] = None
) -> Plan:
    """What delete runs: back to the profile and governors as first found (no profile then: tuned off).

    `prior_mode` is /etc/tuned/profile_mode as first found: "auto" (or empty: tuned's default) means tuned chose the
    recommended profile itself, so it goes back to choosing (`tuned-adm auto_profile`), not to a profile pinned by
    hand; None: not recorded (state from before it was)."""
    actions = []
    if "tuned_profile" in applied:
        if prior_mode is not None and prior_mode.strip() in ("", "auto"):
            was = prior_profile or "none yet"
            actions.append(
                Action(f"tuned back to its own choice (auto mode, was {was})", sh("tuned-adm", "auto_profile"))
            )
        elif prior_profile:
            actions.append(Action(f"tuned profile back to {prior_profile}", sh("tuned-adm", "profile", prior_profile)))
        else:
            actions.append(Action("no tuned profile was active: tuned off", sh("tuned-adm", "off")))
    if "governor" in applied:
        for cpu, gov in sorted(prior_governors.items(), key=lambda kv: int(kv[0])):
            actions.append(Action(f"cpu{cpu} governor back to {gov}", governor_command(int(cpu), gov)))
    return plan_of(actions, "nothing was tuned")


def observed(want: TuningWant, applied: dict, facts: TuningFacts) -> dict[str, Optional[str]]:
    """The host in the inputs' terms. What was skipped reads as wanted (the host cannot do it: no drift); a
    governor differing on some CPUs reads as their list, e.g. "powersave on cpu1,cpu3"."""
    out: dict[str, Optional[str]] = {"tuned_profile": want.profile, "governor": want.governor}
    if "tuned_profile" in applied:
        out["tuned_profile"] = facts.profile
    if "governor" in applied:
        off = {c: g for c, g in sorted(facts.governors.items()) if g != applied["governor"]}
        if off:
            out["governor"] = "; ".join(
                f"{g} on " + ",".join(f"cpu{c}" for c in off if off[c] == g) for g in sorted(set(off.values()))
            )
        elif not facts.governors:
            out["governor"] = None
    return out
