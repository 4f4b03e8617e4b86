"""Sysctls: what to write and set so the wanted kernel tunables hold now and after every boot (pure).

Seed 000 §8.3 and seed 001 §3. Facts in (runtime values, the drop-in file's text), actions out.

Usage::

    p = plan_sysctls({"net.core.somaxconn": "4096"}, {"net.core.somaxconn": "128"}, file_text=None)
    [a.why for a in p.actions]   # ["write /etc/sysctl.d/99-gpuhost.conf (1 value)", "net.core.somaxconn is 128 ..."]
"""

from __future__ import annotations

import re
from typing import Any

from access.shell import sh
from plans.plan import Action, FileWrite, Plan, plan_of

FILE = "/etc/sysctl.d/99-gpuhost.conf"
NAME = re.compile(r"^[a-z0-9_]+(\.[a-zA-Z0-9_-]+)+$")


class UnknownSysctl(ValueError):
    pass


def norm(v: Any) -> str:
    return " ".join(str(v).split())


def render(values: dict) -> str:
    return "# gpuhost: seed tuning (000 §8.3, 001 §3)\n" + "".join(f"{k} = {v}\n" for k, v in sorted(values.items()))


def parse_file(text: str | None) -> dict[str, str]:
    out = {}
    for line in (text or "").splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";")):
            k, v = line.split("=", 1)
            out[k.strip()] = norm(v)
    return out


def set_command(name: str, value: str) -> str:
    return sh("sysctl", "-q", "-w", f"{name}={value}")


def plan_sysctls(
    wanted: dict[str, Any], runtime: dict[str, str], file_text: str | None, restore: dict[str, str] | None = None
) -> Plan:
    """Actions that make `wanted` hold in the file and live; `restore` puts dropped names back to their priors.

    Raises UnknownSysctl when this kernel has no such name (an empty runtime value).
    """
    want = {k: norm(v) for k, v in wanted.items()}
    missing = sorted(k for k in want if runtime.get(k, "") == "")
    if missing:
        raise UnknownSysctl(f"unknown sysctl(s) {', '.join(missing)} on this kernel")
    actions = []
    text = render(want)
    if file_text != text:
        actions.append(
            Action(f"write {FILE} ({len(want)} values, read at every boot)", write=FileWrite(FILE, text.encode()))
        )
    for k, v in sorted(want.items()):
        if norm(runtime[k]) != v:
            actions.append(Action(f"{k} is {norm(runtime[k])} live, want {v}", set_command(k, v)))
    for k, v in sorted((restore or {}).items()):
        if k not in want and norm(runtime.get(k, "")) != norm(v):
            actions.append(Action(f"{k} is no longer managed: back to {norm(v)}", set_command(k, norm(v))))
    return plan_of(actions, "every sysctl already has its value, in the file and live")


def observed(wanted: dict[str, Any], runtime: dict[str, str], file_text: str | None) -> dict[str, str]:
    """The host's values in the input's terms: the live value, marked where the boot-time file says otherwise."""
    in_file = parse_file(file_text)
    out = {}
    for k in wanted:
        live = norm(runtime.get(k, ""))
        out[k] = live if in_file.get(k) == live else f"{live} (file: {in_file.get(k, 'missing')})"
    return out
