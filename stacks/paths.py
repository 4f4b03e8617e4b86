"""One file, one owner: resources of one stack that would write the same host path are refused at load.

The loader checks the program's own list of components (`stacks.program.plan`: nothing registered, nothing
reached): each one's children come from its pure `children(name, args)` function (the class's `CHILDREN`),
`components.wiring.writes` reads the paths each child writes, and two children from different places in the config
that write one path on one machine are reported, one line per pair of config paths, with the fix.

Usage (in stacks.load.load)::

    lines = collisions(program.components, fleet)   # ["fleet.gateways[1]: would write ... on trt-a10-01, ..."]
"""

from __future__ import annotations

import re

from components.wiring import Write, writes
from stacks.program import Planned
from stacks.schema import Fleet


def _what(where: str, fleet: Fleet | None) -> str:
    """A config path with the name it holds, for the message (`fleet.gateways[0] (gw-a)`)."""
    m = fleet and re.fullmatch(r"fleet\.(services|gateways)\[(\d+)\]", where)
    if m:
        return f"{where} ({getattr(fleet, m.group(1))[int(m.group(2))].name})"
    return where


_FIX = {
    "fleet.services": "serve both models from one service",
    "fleet.gateways": "one gateway per host (its units and /etc/gpuhost/gateway are fixed paths): move one to another "
    "host, or serve both from one gateway",
}


def collisions(components: list[Planned], fleet: Fleet | None = None) -> list[str]:
    """One line per pair of config paths whose children would write the same file on one machine."""
    owner: dict[tuple[str, str], tuple[str, Write]] = {}
    clashes: dict[tuple[str, str, str], list[str]] = {}
    for p in components:
        for w in writes(p.name, p.children):
            key = (w.machine, w.path)
            if key not in owner:
                owner[key] = (p.where, w)
                continue
            first_where, first = owner[key]
            if first.child == w.child:
                continue
            paths = clashes.setdefault((p.where, first_where, w.machine), [])
            if w.path not in paths:
                paths.append(w.path)
    lines = []
    for (where, first_where, machine), paths in clashes.items():
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        like = "another of its resources" if where == first_where else _what(first_where, fleet)
        fix = next((f for k, f in _FIX.items() if where.startswith(k)), "give each its own path or machine")
        lines.append(
            f"{where}: would write {shown} on {machine}, as {like} does (one file has one owner: each would undo "
            f"the other's change and restore its own original on destroy); {fix}"
        )
    return lines
