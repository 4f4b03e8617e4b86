"""The one error a stack's config raises: every problem at once, one line per bad field, each with its fix.

Usage::

    raise ConfigError([f"fleet.hosts[{i}].vms[{k}]: {why}; {fix}"])
"""

from __future__ import annotations


class ConfigError(ValueError):
    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("stack config is invalid:\n" + "\n".join(f"  - {ln}" for ln in lines))
