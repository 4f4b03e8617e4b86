"""The one plan shape: facts in, actions out, and a sentence when there is nothing to do (after pyinfra's noop).

An action is one shell command built with access.shell and the reason it is needed; a file to write travels as
`FileWrite` (its content goes over stdin, never into the command line). Providers run a plan's actions in order,
in one round trip, under the host lock; they decide nothing themselves.

Usage::

    p = plan_sysctls(wanted, runtime, file_text)
    if p.noop:
        print(p.noop_reason)                  # "every sysctl already has its value, in the file and live"
    for a in p.actions:
        print(a.why, a.command)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FileWrite:
    path: str
    content: bytes
    mode: str = "0644"
    owner: str = "0:0"


@dataclass(frozen=True)
class Action:
    why: str
    command: str = ""
    write: FileWrite | None = None


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...] = ()
    noop_reason: str = ""

    @property
    def noop(self) -> bool:
        return not self.actions

    def __post_init__(self) -> None:
        if not self.actions and not self.noop_reason:
            raise ValueError("an empty plan says why nothing is needed")

    @property
    def sentences(self) -> list[str]:
        return [a.why for a in self.actions] or [self.noop_reason]


def plan_of(actions: list[Action], noop_reason: str) -> Plan:
    return Plan(tuple(actions), "" if actions else noop_reason)


__all__ = ["Action", "FileWrite", "Plan", "plan_of"]
