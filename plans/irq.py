"""IRQ isolation plans (seed 002 §9): irqbalance's banned CPU list and device IRQ affinities. Pure.

Usage::

    text = set_shell_var(old_text, "IRQBALANCE_BANNED_CPULIST", "2-7")
    irqs = matching_irqs(facts.interrupts, r"nvme|mlx5")
"""

from __future__ import annotations

import re

from facts.model import Irq

VAR = "IRQBALANCE_BANNED_CPULIST"


def irqbalance_path(family: str) -> str:
    return "/etc/sysconfig/irqbalance" if family == "rhel" else "/etc/default/irqbalance"


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
