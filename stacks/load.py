"""Load and check the stack's config: `gpuhost:fleet` (structured) and `gpuhost:sshPrivateKey` (a Pulumi secret).

Every problem is reported at once, one line per bad field, before any SSH connection or resource registration.

Usage (in __main__.py)::

    fleet, key = load(pulumi.Config("gpuhost"))      # raises ConfigError listing every bad field
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.runtime.config import is_config_secret
from pydantic import ValidationError

from stacks.schema import Fleet


class ConfigError(ValueError):
    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("stack config is invalid:\n" + "\n".join(f"  - {ln}" for ln in lines))


def _loc(loc: tuple) -> str:
    out = ""
    for p in loc:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out


def errors_of(err: ValidationError, prefix: str = "fleet") -> list[str]:
    lines = []
    for e in err.errors():
        where = _loc(tuple(p for p in e["loc"] if p not in ("function-after", "function-before")))
        msg = e["msg"].removeprefix("Value error, ")
        base = f"{prefix}.{where}" if where else prefix
        # Cross-field checks report several fields at once, "a: ...; b: ..."; give each its own line.
        for part in msg.split("; "):
            head, sep, rest = part.partition(": ")
            if sep and (
                head.startswith(
                    ("vms[", "gpus[", "services[", "hosts", "reserved_cpus", "kernel.", "monitoring.", "fleet")
                )
                or head.endswith("]")
            ):
                lines.append(f"{base}.{head}: {rest}" if not head.startswith("fleet") else f"{head}: {rest}")
            else:
                lines.append(f"{base}: {part}")
    return lines


def parse_fleet(raw: Any) -> Fleet:
    if raw is None:
        raise ConfigError(["gpuhost:fleet: missing (see Pulumi.dev.yaml for the shape)"])
    try:
        return Fleet.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(errors_of(e)) from None


def load(config: pulumi.Config) -> tuple[Fleet, pulumi.Output[str]]:
    lines: list[str] = []
    fleet = None
    try:
        fleet = parse_fleet(config.get_object("fleet"))
    except ConfigError as e:
        lines += e.lines
    key_names = {"sshPrivateKey"} | ({h.ssh.key_name for h in fleet.hosts} if fleet else set())
    for name in sorted(key_names):
        full = f"gpuhost:{name}"
        if config.get(name) is None:
            lines.append(f"{full}: missing; set it with `pulumi config set --secret {name} < key`")
        elif not is_config_secret(full):
            lines.append(
                f"{full}: stored in plaintext; re-set it with `pulumi config set --secret {name} < key` "
                "so it is encrypted in the stack file and never shown"
            )
    if lines:
        raise ConfigError(lines)
    return fleet, config.require_secret("sshPrivateKey")
