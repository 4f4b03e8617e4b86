"""What a host needs before gpuhost's own Python services run there: a pinned venv, and no conflicting unit.
Packages come from SystemPackages and the units themselves from SystemdService (providers/).

Facts in, steps out, each step only when its check says so:

1. ``venv``: a virtual environment with pinned requirements; rebuilt when the pinned list changes (its sha256 is
   kept in ``<venv>/gpuhost-requirements.sha256``).
2. ``conflicts``: units that must not run beside ours (Debian's own ``redis-server.service`` holds port 6379
   and starts on install), stopped and disabled; delete puts back what they were.

``read_script`` is the one round trip; ``parse_facts`` its pure parser; ``plan`` is pure; ``restore_steps``
undoes what the recorded ``prior`` facts say gpuhost changed.

Example::

    want = Runtime(venv="/opt/gpuhost/gateway/venv", requirements=("redis==8.1.0",),
                   conflicts=("redis-server.service",))
    p = plan(parse_facts(conn.run(read_script(want)).stdout), want)
    for step in p.steps: conn.run(step.script)
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Optional

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from access.shell import Script, quote

_UNIT = re.compile(r"^[A-Za-z0-9@_.:-]+\.service$")
_PKG = re.compile(r"^[a-z0-9][a-z0-9.+-]*$")
_REQ = re.compile(r"^[A-Za-z0-9_.\-\[\],]+==[A-Za-z0-9_.!+-]+$")
# Each item of these fields must match its pattern; what the error says when one does not.
_EACH = {
    "conflicts": (_UNIT, "not a systemd service unit name"),
    "requirements": (_REQ, "requirements must be pinned (name==version)"),
}


class Runtime(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    venv: str = ""
    requirements: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()

    @field_validator("conflicts", "requirements")
    @classmethod
    def _each_well_formed(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        pattern, problem = _EACH[info.field_name or ""]
        for item in v:
            if not pattern.match(item):
                raise ValueError(f"{problem}: {item!r}")
        return v

    @field_validator("venv")
    @classmethod
    def _venv(cls, v: str) -> str:
        if v and (not v.startswith("/") or ".." in v.split("/") or v.rstrip("/") in ("", "/usr", "/opt")):
            raise ValueError(f"venv must be a dedicated absolute path: {v!r}")
        return v

    @property
    def requirements_sha256(self) -> str:
        return hashlib.sha256("\n".join(sorted(self.requirements)).encode()).hexdigest()


@dataclass(frozen=True)
class UnitState:
    enabled: str  # systemctl is-enabled: enabled, disabled, static, masked, not-found ...
    active: str  # systemctl is-active: active, inactive, failed ...


@dataclass(frozen=True)
class Facts:
    units: dict[str, UnitState]
    venv_sha256: str  # "" when there is no venv gpuhost built


@dataclass(frozen=True)
class Step:
    name: str
    why: str
    script: str


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    noop_reason: str = ""


def read_script(want: Runtime) -> str:
    s = Script()
    for u in want.conflicts:
        s.raw(
            f"e=$(systemctl is-enabled {quote(u)} 2>/dev/null); a=$(systemctl is-active {quote(u)} 2>/dev/null); "
            f'printf \'unit %s %s %s\\n\' {quote(u)} "${{e:-not-found}}" "${{a:-unknown}}"'
        )
    if want.venv:
        marker = f"{want.venv}/gpuhost-requirements.sha256"
        s.raw(f'echo "venv $(cat {quote(marker)} 2>/dev/null || true)"')
    return s.render()


def parse_facts(text: str) -> Facts:
    units: dict[str, UnitState] = {}
    venv = ""
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "unit" and len(parts) >= 2:
            enabled = parts[2] if len(parts) > 2 else "not-found"
            active = parts[3] if len(parts) > 3 else "unknown"
            units[parts[1]] = UnitState(enabled=enabled or "not-found", active=active)
        elif parts[0] == "venv":
            venv = parts[1] if len(parts) > 1 else ""
    return Facts(units=units, venv_sha256=venv)


def _venv_script(want: Runtime) -> str:
    s = Script().raw("set -e")
    s.add("rm", "-rf", "--", want.venv)
    s.add("python3", "-m", "venv", want.venv)
    s.add(f"{want.venv}/bin/pip", "install", "-q", "--disable-pip-version-check", *want.requirements)
    s.write(["echo", want.requirements_sha256], f"{want.venv}/gpuhost-requirements.sha256")
    return s.render()


def plan(facts: Facts, want: Runtime) -> Plan:
    steps: list[Step] = []
    if want.venv and facts.venv_sha256 != want.requirements_sha256:
        why = "create" if not facts.venv_sha256 else "rebuild (pinned requirements changed)"
        steps.append(Step("venv", f"{why} {want.venv}", _venv_script(want)))
    running = [
        c
        for c in want.conflicts
        if facts.units.get(c, UnitState("not-found", "")).active == "active"
        or facts.units.get(c, UnitState("not-found", "")).enabled == "enabled"
    ]
    if running:
        s = Script()
        for c in running:
            s.add("systemctl", "disable", "--now", "--quiet", c)
        steps.append(Step("conflicts", f"stop and disable {', '.join(running)}", s.render()))
    if not steps:
        return Plan((), "venv current, no conflicting unit running")
    return Plan(tuple(steps))


def restore_steps(prior: Optional[Facts], want: Runtime) -> list[Step]:
    """Undo what gpuhost changed, from the facts recorded before its first apply (None: nothing was recorded,
    a create that failed before its first read; then nothing is undone)."""
    if prior is None:
        return []
    s = Script()
    for c in want.conflicts:
        was = prior.units.get(c, UnitState("not-found", "inactive"))
        if was.enabled == "enabled":
            s.add("systemctl", "enable", "--quiet", c)
        if was.active == "active":
            s.add("systemctl", "start", c)
    if want.venv and not prior.venv_sha256:
        s.add("rm", "-rf", "--", want.venv)
    return [Step("restore", "put conflicting units and the venv back as found", s.render())] if s.lines else []


def facts_to_dict(f: Facts) -> dict:
    return {
        "units": {u: {"enabled": s.enabled, "active": s.active} for u, s in f.units.items()},
        "venv_sha256": f.venv_sha256,
    }


def facts_from_dict(d: dict) -> Facts:
    return Facts(
        units={u: UnitState(**s) for u, s in (d.get("units") or {}).items()},
        venv_sha256=d.get("venv_sha256") or "",
    )
