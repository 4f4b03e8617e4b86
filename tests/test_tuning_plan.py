"""plans.tuning: facts in, actions out (no SSH)."""

from __future__ import annotations

import pytest

from plans.tuning import NO_CPUFREQ, NO_TUNED, TuningFacts, TuningWant, observed, plan_tuning, restore_plan

LAT = "latency-performance"


@pytest.mark.parametrize(
    ("want", "facts", "whys", "applied", "skipped"),
    [
        (
            TuningWant(LAT, "performance"),
            TuningFacts(True, "balanced", {0: "powersave", 1: "performance"}),
            [f"tuned profile is balanced, want {LAT}", "cpu0 governor is powersave, want performance"],
            {"tuned_profile": LAT, "governor": "performance"},
            {},
        ),
        (
            TuningWant(LAT, "performance"),
            TuningFacts(True, LAT, {0: "performance"}),
            ["the tuned profile and governors already hold, or the host has neither"],
            {"tuned_profile": LAT, "governor": "performance"},
            {},
        ),
        (
            TuningWant(LAT, "performance"),
            TuningFacts(False, None, {}),
            ["the tuned profile and governors already hold, or the host has neither"],
            {},
            {"tuned_profile": NO_TUNED, "governor": NO_CPUFREQ},
        ),
        (
            TuningWant(LAT, None),
            TuningFacts(True, None, {0: "powersave"}),
            [f"tuned profile is none, want {LAT}"],
            {"tuned_profile": LAT},
            {},
        ),
        (
            TuningWant(None, "performance"),
            TuningFacts(False, None, {2: "schedutil", 10: "schedutil"}),
            ["cpu2 governor is schedutil, want performance", "cpu10 governor is schedutil, want performance"],
            {"governor": "performance"},
            {},
        ),
        (
            TuningWant(),
            TuningFacts(True, "balanced", {0: "powersave"}),
            [plan_tuning(TuningWant(), TuningFacts()).plan.noop_reason],
            {},
            {},
        ),
    ],
)
def test_tuning_plan(want, facts, whys, applied, skipped):
    t = plan_tuning(want, facts)
    assert t.plan.sentences == whys
    assert (t.applied, t.skipped) == (applied, skipped)


def test_tuning_commands_are_quoted_and_per_cpu():
    t = plan_tuning(TuningWant(LAT, "performance"), TuningFacts(True, "balanced", {3: "powersave"}))
    assert [a.command for a in t.plan.actions] == [
        "tuned-adm profile latency-performance",
        "printf '%s' performance > /sys/devices/system/cpu/cpu3/cpufreq/scaling_governor",
    ]


@pytest.mark.parametrize(
    ("applied", "profile", "govs", "commands"),
    [
        ({"tuned_profile": LAT}, "balanced", {}, ["tuned-adm profile balanced"]),
        ({"tuned_profile": LAT}, "", {}, ["tuned-adm off"]),
        (
            {"governor": "performance"},
            "balanced",
            {"10": "powersave", "2": "schedutil"},
            [
                "printf '%s' schedutil > /sys/devices/system/cpu/cpu2/cpufreq/scaling_governor",
                "printf '%s' powersave > /sys/devices/system/cpu/cpu10/cpufreq/scaling_governor",
            ],
        ),
        ({}, "balanced", {"0": "powersave"}, []),
    ],
)
def test_restore_plan_puts_back_only_what_was_applied(applied, profile, govs, commands):
    assert [a.command for a in restore_plan(applied, profile, govs).actions] == commands


@pytest.mark.parametrize(
    ("profile", "mode", "command"),
    [
        # tuned chose the profile itself (auto; an empty or missing profile_mode means auto): it chooses again
        ("virtual-guest", "auto\n", "tuned-adm auto_profile"),
        ("virtual-guest", "", "tuned-adm auto_profile"),
        ("", "", "tuned-adm auto_profile"),  # recorded while tuned was still starting at boot
        # pinned by hand (manual): that profile, or off
        ("balanced", "manual\n", "tuned-adm profile balanced"),
        ("", "manual", "tuned-adm off"),
        # not recorded (state from before the mode was): as before
        ("balanced", None, "tuned-adm profile balanced"),
    ],
)
def test_restore_plan_follows_tuneds_profile_mode(profile, mode, command):
    assert [a.command for a in restore_plan({"tuned_profile": LAT}, profile, {}, mode).actions] == [command]


@pytest.mark.parametrize(
    ("applied", "facts", "seen"),
    [
        (
            {"tuned_profile": LAT, "governor": "performance"},
            TuningFacts(True, LAT, {0: "performance"}),
            (LAT, "performance"),
        ),
        ({"tuned_profile": LAT}, TuningFacts(True, "balanced", {}), ("balanced", "performance")),
        ({}, TuningFacts(False, None, {}), (LAT, "performance")),
        (
            {"governor": "performance"},
            TuningFacts(True, None, {0: "performance", 1: "powersave", 3: "powersave"}),
            (LAT, "powersave on cpu1,cpu3"),
        ),
    ],
)
def test_observed_reads_drift_only_for_what_was_applied(applied, facts, seen):
    o = observed(TuningWant(LAT, "performance"), applied, facts)
    assert (o["tuned_profile"], o["governor"]) == seen
