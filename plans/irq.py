"""IRQ isolation (seed 002 §9): irqbalance's banned CPU list and device IRQ affinities. Facts in, actions out.

Which IRQs move (a `pin` regex on /proc/interrupts' chip and action names), to which CPUs, and what irqbalance
bans are decided here; the provider runs the actions and records what the host had. The banned list *replaces*
irqbalance's default (which skips isolcpus/nohz_full CPUs), so isolated CPUs are banned too.

Usage::

    d = plan_irq("debian", irqbalance_file, facts.interrupts, banned_cpus=[2, 3], pin=[{"match": "nvme", "cpus": [0]}])
    d.targets          # {"43": [0], "44": [0]}
    d.plan.sentences   # ["write /etc/default/irqbalance: ban CPUs 2-3 ...", "IRQ 43 (nvme0q0) is on 6, pin to 0", ...]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from access.shell import quote
from facts.cpulist import format_cpulist, parse_cpulist
from facts.files import FileState
from facts.model import Irq
from plans.plan import Action, FileWrite, Plan, plan_of

VAR = "IRQBALANCE_BANNED_CPULIST"
PATHS = ("/etc/default/irqbalance", "/etc/sysconfig/irqbalance")
# Every IRQ's affinity at once (constant text): recorded on the host the first time, so a re-run after a dropped
# connection restores what the host had, not what the dropped run set.
AFFINITY_CMD = "cd /proc/irq && grep -H . [0-9]*/smp_affinity_list"
RESTART = "if systemctl is-active -q irqbalance; then systemctl restart irqbalance; fi"


def irqbalance_path(family: str) -> str:
    return PATHS[1] if family == "rhel" else PATHS[0]


def set_shell_var(text: str, name: str, value: str) -> str:
    """Set NAME=value in a shell-variable file, replacing the last active assignment or appending one."""
    pat = re.compile(rf"^\s*(export\s+)?{re.escape(name)}=.*$")
    lines = text.splitlines(keepends=True)
    idx = [i for i, ln in enumerate(lines) if pat.match(ln.rstrip("\n"))]
    new = f"{name}={value}\n"
    if idx:
        lines[idx[-1]] = new
        return "".join(lines)
    sep = "" if not text or text.endswith("\n") else "\n"
    return f"{text}{sep}# gpuhost: keep IRQs off the CPUs given to VMs (seed 002 §9)\n{new}"


def get_shell_var(text: str, name: str) -> str | None:
    val = None
    for ln in text.splitlines():
        m = re.match(rf"^\s*(export\s+)?{re.escape(name)}=(.*)$", ln)
        if m:
            val = m.group(2).strip().strip('"').strip("'")
    return val


def matching_irqs(interrupts: list[Irq], pattern: str) -> list[Irq]:
    rx = re.compile(pattern)
    return [i for i in interrupts if i.irq.isdigit() and (rx.search(i.actions) or rx.search(i.chip))]


def parse_affinities(text: str) -> dict[str, list[int]]:
    """{irq: cpus} from AFFINITY_CMD's output ("43/smp_affinity_list:0-7" per line)."""
    out = {}
    for line in text.splitlines():
        head, sep, value = line.partition(":")
        irq = head.split("/", 1)[0]
        if sep and irq.isdigit():
            out[irq] = parse_cpulist(value)
    return out


def affinity_command(irq: str, cpus: list[int]) -> str:
    """Set one IRQ's affinity; a kernel-managed IRQ refuses (EIO) and is reported as `unmovable <irq>`."""
    n = int(irq)
    return (
        f"printf '%s' {quote(format_cpulist(int(c) for c in cpus))} > /proc/irq/{n}/smp_affinity_list 2>/dev/null "
        f"|| echo unmovable {n}"
    )


def unmovable(stdout: str) -> list[str]:
    return sorted({ln.split()[1] for ln in stdout.splitlines() if ln.startswith("unmovable ")}, key=int)


@dataclass(frozen=True)
class IrqPlan:
    plan: Plan
    path: str  # the irqbalance file of this OS family
    banned: str  # its banned CPU list, as written
    targets: dict[str, list[int]] = field(default_factory=dict)  # irq -> the CPUs it is pinned to


def _on(affinity: list[int], cpus: list[int]) -> bool:
    # irqbalance may narrow an IRQ to some of the allowed CPUs: that still holds.
    return bool(affinity) and set(affinity) <= set(cpus)


def plan_irq(
    family: str,
    current: FileState,
    interrupts: list[Irq],
    banned_cpus: list[int],
    pin: list[dict],
    restore: dict[str, list[int]] | None = None,
    skip: Sequence[str] = (),
) -> IrqPlan:
    """What to write and move so irqbalance bans `banned_cpus` and each `pin` entry's IRQs sit on its CPUs.

    `restore` ({irq: cpus as first found}) puts IRQs no longer pinned back; `skip` are IRQs the kernel refused to
    move before (kernel-managed vectors), not tried again.
    """
    path = irqbalance_path(family)
    banned = format_cpulist(int(c) for c in banned_cpus)
    new = set_shell_var(current.text if current.exists else "", VAR, banned).encode()
    aff = {i.irq: i.affinity for i in interrupts}
    names = {i.irq: i.actions for i in interrupts}
    targets: dict[str, list[int]] = {}
    for entry in pin:
        for hit in matching_irqs(interrupts, entry["match"]):
            targets[hit.irq] = sorted(int(c) for c in entry["cpus"])
    actions = []
    rewrite = not (current.exists and current.content == new)
    if rewrite:
        mode = (current.mode or "644").zfill(4) if current.exists else "0644"
        owner = f"{current.uid}:{current.gid}" if current.exists else "0:0"
        actions.append(
            Action(f"write {path}: irqbalance bans CPUs {banned or '(none)'}", write=FileWrite(path, new, mode, owner))
        )
        actions.append(Action("restart irqbalance (if running) so it reads the new ban list", RESTART))
    for irq, cpus in sorted(targets.items(), key=lambda kv: int(kv[0])):
        # A restarted irqbalance may move IRQs among the CPUs it may use: pin all of them again after it.
        if irq not in skip and (rewrite or not _on(aff.get(irq, []), cpus)):
            now = format_cpulist(aff.get(irq, [])) or "?"
            actions.append(
                Action(
                    f"IRQ {irq} ({names.get(irq, '')}) is on CPUs {now}, pin to {format_cpulist(cpus)}",
                    affinity_command(irq, cpus),
                )
            )
    for irq, cpus in sorted((restore or {}).items(), key=lambda kv: int(kv[0])):
        if irq not in targets and irq in aff and cpus and sorted(aff[irq]) != sorted(int(c) for c in cpus):
            actions.append(
                Action(
                    f"IRQ {irq} is no longer pinned: back to CPUs {format_cpulist(int(c) for c in cpus)}",
                    affinity_command(irq, [int(c) for c in cpus]),
                )
            )
    noop = f"irqbalance already bans CPUs {banned or '(none)'} and every pinned IRQ is in place"
    return IrqPlan(plan_of(actions, noop), path, banned, targets)


def observed_pin(pin: list[dict], pinned: dict[str, list[int]], interrupts: list[Irq]) -> list[dict]:
    """`pin` in the host's terms: an entry whose pinned IRQ left its CPUs shows the CPUs the IRQ is on now."""
    aff = {i.irq: i.affinity for i in interrupts}
    out = []
    for p in pin:
        cpus = sorted(int(c) for c in p.get("cpus") or [])
        mine = [i.irq for i in matching_irqs(interrupts, p["match"]) if i.irq in pinned]
        moved = sorted({c for i in mine if not _on(aff.get(i, []), cpus) for c in aff.get(i, [])})
        out.append({**p, "cpus": moved} if moved else p)
    return out
