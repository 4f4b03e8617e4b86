"""The one command builder: every value that reaches a remote shell passes through here.

Usage::

    from access.shell import sh, Script
    sh("tee", "/etc/modprobe.d/vfio.conf")            # -> "tee /etc/modprobe.d/vfio.conf"
    sh("echo", "a b; rm -rf /")                       # -> "echo 'a b; rm -rf /'"
    s = Script()
    s.add("cat", "/proc/cmdline")
    s.raw("set -e")                                   # constant text only, never a value
    s.pipe(["lspci", "-nn"], ["grep", "-i", "vga"])
    text = s.render()

Nothing else in gpuhost formats values into shell strings (testinfra's rule): planners produce argument lists,
and `sh` quotes each one with `shlex.quote`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Iterable, Sequence, Union

Arg = Union[str, int, float]


def quote(value: Arg) -> str:
    if isinstance(value, bool):
        raise TypeError("booleans are ambiguous as shell arguments; pass a string")
    s = str(value)
    if "\x00" in s:
        # No quoting can carry a NUL through sh -c / execve: the value would be cut short silently.
        raise ValueError(f"a shell argument may not contain a NUL byte: {s[:60]!r}")
    return shlex.quote(s)


def sh(*args: Arg) -> str:
    """Quote each argument and join them into one simple command."""
    if not args:
        raise ValueError("sh() needs at least the program name")
    return " ".join(quote(a) for a in args)


def pipe(*commands: Sequence[Arg]) -> str:
    return " | ".join(sh(*c) for c in commands)


def redirect_to(command: Sequence[Arg], path: str, append: bool = False) -> str:
    return f"{sh(*command)} {'>>' if append else '>'} {quote(path)}"


@dataclass
class Script:
    """A multi-line POSIX sh script built from quoted commands.

    `raw` takes constant text written in this repository (control flow, section markers) and must never receive
    a value that came from config, facts or the network.
    """

    lines: list[str] = field(default_factory=list)

    def add(self, *args: Arg) -> "Script":
        self.lines.append(sh(*args))
        return self

    def pipe(self, *commands: Sequence[Arg]) -> "Script":
        self.lines.append(pipe(*commands))
        return self

    def write(self, command: Sequence[Arg], path: str, append: bool = False) -> "Script":
        self.lines.append(redirect_to(command, path, append))
        return self

    def assign(self, name: str, value: Arg) -> "Script":
        if not name.isidentifier():
            raise ValueError(f"not a shell variable name: {name!r}")
        self.lines.append(f"{name}={quote(value)}")
        return self

    def raw(self, text: str) -> "Script":
        self.lines.append(text)
        return self

    def extend(self, lines: Iterable[str]) -> "Script":
        self.lines.extend(lines)
        return self

    def render(self) -> str:
        return "\n".join(self.lines) + "\n"
