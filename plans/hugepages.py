"""Hugepages2M: per-NUMA-node 2 MiB page reservations now and at every boot (pure).

Seed 002 §6 option B and seed 000 §4.1: reserve per node so a VM's memory sits beside its GPU. Facts in (the
nodes, their page counts now, the boot unit's text), actions out.

Usage::

    p = plan_hugepages({"1": 512}, nodes=[0, 1], counts={"1": 0}, unit_text=None)
"""

from __future__ import annotations

from access.shell import quote, sh
from plans.plan import Action, FileWrite, Plan, plan_of

UNIT = "/etc/systemd/system/gpuhost-hugepages.service"
WANTS = "/etc/systemd/system/multi-user.target.wants/gpuhost-hugepages.service"
SIZE_KB = 2048


class NoSuchNode(ValueError):
    pass


def nr_path(node: int | str) -> str:
    return f"/sys/devices/system/node/node{int(node)}/hugepages/hugepages-{SIZE_KB}kB/nr_hugepages"


def render_unit(per_node: dict) -> str:
    lines = [
        "# gpuhost: per-NUMA-node 2 MiB hugepages (seed 002 §6), before VMs start",
        "[Unit]",
        "Description=gpuhost per-node hugepage reservation",
        "DefaultDependencies=no",
        "Before=libvirtd.service libvirt-guests.service",
        "After=local-fs.target",
        "",
        "[Service]",
        "Type=oneshot",
        "RemainAfterExit=yes",
    ]
    for node, count in sorted(per_node.items(), key=lambda kv: int(kv[0])):
        # systemd does not run a shell: sh -c with a constant text and the numbers as positional arguments.
        lines.append(f'ExecStart=/bin/sh -c \'echo "$1" > "$2"\' sh {int(count)} {nr_path(node)}')
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


def set_counts(counts: dict) -> list[str]:
    return [f"echo {int(c)} > {quote(nr_path(n))}" for n, c in sorted(counts.items(), key=lambda kv: int(kv[0]))]


def plan_hugepages(
    per_node: dict, nodes: list[int], counts: dict[str, int], unit_text: str | None, enabled: bool
) -> Plan:
    want = {str(k): int(v) for k, v in per_node.items()}
    missing = [n for n in want if int(n) not in nodes]
    if missing:
        raise NoSuchNode(f"no NUMA node {', '.join(missing)} on this host (nodes: {', '.join(map(str, nodes))})")
    actions = []
    unit = render_unit(want)
    if unit_text != unit:
        actions.append(Action(f"write {UNIT} (reserves the pages at every boot)", write=FileWrite(UNIT, unit.encode())))
        if enabled:  # `systemctl enable` below reloads systemd itself: one reload, not two (seconds each)
            actions.append(Action("systemd reads the new unit", "systemctl daemon-reload"))
    if not enabled and unit_text is None:
        # A unit that did not exist has no copy in systemd to refresh: the link alone enables it (read at the next
        # boot, or when first asked for); the pages are set below, not by starting it. A daemon-reload re-runs every
        # generator and re-reads every unit: the longest part of this change under emulation, for nothing.
        actions.append(
            Action(
                "enable the unit (new: no reload)",
                sh("systemctl", "enable", "--no-reload", "gpuhost-hugepages.service") + " >/dev/null 2>&1",
            )
        )
    elif not enabled:
        actions.append(
            Action("enable the unit", sh("systemctl", "enable", "gpuhost-hugepages.service") + " >/dev/null 2>&1")
        )
    short = {n: c for n, c in want.items() if int(counts.get(n, 0)) != c}
    if short:
        why = "; ".join(f"node {n} has {counts.get(n, 0)} pages, want {c}" for n, c in sorted(short.items()))
        # Compacting memory between two tries gets more pages out of a fragmented node (seed 002 §6 "may fragment");
        # only when the first try fell short: compaction walks all of memory.
        fell_short = " || ".join(f'[ "$(cat {quote(nr_path(n))})" -ne {int(c)} ]' for n, c in sorted(short.items()))
        cmd = "\n".join(
            [
                *set_counts(short),
                f"if {fell_short}; then",
                "sync; echo 1 > /proc/sys/vm/compact_memory 2>/dev/null || true",
                *set_counts(short),
                "fi",
            ]
        )
        actions.append(Action(why, cmd))
    return plan_of(actions, "every node already has its pages, and the boot unit is in place")
