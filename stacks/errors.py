"""The one error a stack's config raises: every problem at once, one line per bad field, each with its fix.

Usage::

    raise ConfigError([f"fleet.hosts[{i}].vms[{k}]: {why}; {fix}"])
    raise FieldProblems([f"sysctl name {k!r} ...", ...])   # in a validator: one line each at the field's path
"""

from __future__ import annotations


class ConfigError(ValueError):
    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("stack config is invalid:\n" + "\n".join(f"  - {ln}" for ln in lines))


class FieldProblems(ValueError):
    """Several problems one validator found in one field (two bad sysctls of `sysctls`): the loader gives each its
    own line at the field's config path."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("; ".join(lines))


class Problem(str):
    """One line of a ConfigError, ``"{path}: {text}"``, that keeps its config path apart: the loader leaves out a
    cross-field finding under a path whose bad value it already reported, by the path, not by reading the line.

    >>> Problem("fleet.hosts[0].vms[1].gpus", "0000:81:00.0 is already given to VM 'a'").path
    'fleet.hosts[0].vms[1].gpus'
    """

    path: str

    def __new__(cls, path: str, text: str) -> Problem:
        line = super().__new__(cls, f"{path}: {text}")
        line.path = path
        return line
