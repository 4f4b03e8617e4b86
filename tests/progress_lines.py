"""What a user sees of a long step in `up`'s output (providers/progress.py): the driver's display kept for
assertions, and the progress lines of one resource in it.

Usage::

    shown = Display()
    Driver(ROOT, "dev", ..., out=shown).up()
    lines = waits(shown.getvalue(), "gpu-a-reboot", "gpu-a to come back", row="pulumi:pulumi:Stack  gpuhost-dev")
    assert lines, f"no progress line of the reboot in up's output; its tail:\\n{tail(shown.getvalue())}"
"""

from __future__ import annotations

import io
import re
import sys


class Display(io.StringIO):
    """The driver's `out`: each write goes on to stdout (`pytest -s` shows the run as it goes) and is kept."""

    def write(self, s: str) -> int:
        sys.stdout.write(s)
        return super().write(s)


def _lines(text: str, row: str, pattern: str) -> list[str]:
    found = re.compile(rf"^\s*{re.escape(row)}\s*{pattern}$")
    return [ln for ln in text.splitlines() if found.match(ln)]


def waits(text: str, label: str, what: str, row: str = "") -> list[str]:
    """The lines in which `label` says it waits for `what`... (elapsed of the bound); `row`: what the display puts
    before a provider's line (the driver: the stack's type and name).

    >>> waits("  S  gpuhost: a-reboot: waiting for a to come back (new boot): 6 s of 900 s", "a-reboot", "a to", "S")
    ['  S  gpuhost: a-reboot: waiting for a to come back (new boot): 6 s of 900 s']
    """
    return _lines(text, row, rf"gpuhost: {re.escape(label)}: waiting for {re.escape(what)}.*: \d+ s of \d+ s")


def dones(text: str, label: str, what: str, row: str = "") -> list[str]:
    """The closing lines of `label`'s waits for `what`... (only a wait that ticked has one)."""
    return _lines(text, row, rf"gpuhost: {re.escape(label)}: done waiting for {re.escape(what)}.* after \d+ s")


def tail(text: str, n: int = 40) -> str:
    """The last `n` lines, for an assertion's message."""
    return "\n".join(text.splitlines()[-n:])
