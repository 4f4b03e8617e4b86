"""Hugepages2M: 2 MiB hugepages reserved per NUMA node at runtime and at every boot, verified, restorable.

Seed 002 §6 option B (runtime 2M pages, "may fragment") and seed 000 §4.1; 1 GiB pages need the kernel command line
(seed 002 §6 option A) and are added by PassthroughHost to KernelCmdline. Reservations are per node so a VM's memory
sits beside its GPU; `vm.nr_hugepages` would spread them over all nodes.

Inputs: host, per_node ({"1": 512}), version. Outputs: allocated ({"1": 512}), prior_counts, prior (unit file).
If the kernel hands out fewer pages than asked (fragmented memory), create puts the counts back, fails, and says
how many it got: a VM started on half its pages fails later in a worse place.
"""

from __future__ import annotations

from typing import Any, Optional

import pulumi
from pulumi import dynamic
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ReadResult, UpdateResult

from access.shell import Script, quote, sh
from facts.files import FileState
from facts.host import read_host_facts
from providers.base import HostProvider
from providers.pristine import capture_and_read, restore_lines, write_lines

UNIT = "/etc/systemd/system/gpuhost-hugepages.service"
WANTS = "/etc/systemd/system/multi-user.target.wants/gpuhost-hugepages.service"
SIZE_KB = 2048


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


class Hugepages2MProvider(HostProvider):
    VERSION = "1"
    OUTPUT_ONLY = ("prior", "prior_counts", "allocated")

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        per = news.get("per_node") or {}
        if not isinstance(per, dict) or not per:
            failures.append(CheckFailure("per_node", "a map of NUMA node -> number of 2 MiB pages"))
        else:
            for k, v in per.items():
                if not str(k).isdigit() or not isinstance(v, (int, float)) or int(v) < 0 or int(v) != v:
                    failures.append(CheckFailure(f"per_node.{k}", f"want node number -> page count, got {k!r}: {v!r}"))
        return CheckResult(news, failures)

    def _set_counts(self, counts: dict) -> list[str]:
        return [f"echo {int(c)} > {quote(nr_path(n))}" for n, c in sorted(counts.items())]

    def _apply(self, props: dict, olds: Optional[dict]) -> dict:
        conn = self.conn(props)
        facts, pristine = capture_and_read(conn, [UNIT, WANTS])
        per = {str(k): int(v) for k, v in props["per_node"].items()}
        missing = [n for n in per if int(n) not in facts.nodes]
        if missing:
            raise RuntimeError(
                f"{conn.spec.name}: no NUMA node {', '.join(missing)} on this host "
                f"(nodes: {', '.join(str(n) for n in facts.nodes)}); nothing changed"
            )
        prior_counts = (olds or {}).get("prior_counts") or {
            str(n): facts.nodes[int(n)].hugepages.get(SIZE_KB, {}).get("nr", 0) for n in per
        }
        unit = render_unit(per).encode()
        s = Script().raw("set -e")
        cur = facts.files[UNIT]
        if not (cur.exists and cur.content == unit):
            s.extend(write_lines(UNIT, unit, "0644", "0:0"))
            s.raw("systemctl daemon-reload")
        s.raw(sh("systemctl", "enable", "gpuhost-hugepages.service") + " >/dev/null 2>&1")
        s.extend(self._set_counts(per))
        s.raw("sync; echo 1 > /proc/sys/vm/compact_memory 2>/dev/null || true")
        s.extend(self._set_counts(per))
        for n in sorted(per):
            s.raw(f"printf 'got %s %s\\n' {quote(n)} \"$(cat {quote(nr_path(n))})\"")
        out = conn.run(s.render()).stdout
        got = {ln.split()[1]: int(ln.split()[2]) for ln in out.splitlines() if ln.startswith("got ")}
        short = {n: (got.get(n, 0), per[n]) for n in per if got.get(n, 0) < per[n]}
        if short:
            undo = Script().raw("set -e").extend(self._set_counts(prior_counts))
            if not olds:
                undo.raw(sh("systemctl", "disable", "gpuhost-hugepages.service") + " || true")
                undo.extend(restore_lines(pristine))
                undo.raw("systemctl daemon-reload")
            conn.run(undo.render())
            raise RuntimeError(
                f"{conn.spec.name}: the kernel reserved fewer 2 MiB hugepages than asked — "
                + "; ".join(f"node {n}: got {g} of {w}" for n, (g, w) in short.items())
                + " (memory is fragmented). Reserve them at boot (hugepages= on the kernel command line, or 1G pages) "
                "or free memory on that node; the previous counts were put back."
            )
        return self.outputs(
            props,
            prior=(olds or {}).get("prior") or {k: v.model_dump() for k, v in pristine.items()},
            prior_counts=prior_counts,
            allocated=got,
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(f"{self.spec(props).name}:hugepages-2M", self._apply(props, None))

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        return UpdateResult(self._apply(news, olds))

    def diff_known(self, _id: str, olds: dict, news: dict) -> DiffResult:
        d = super().diff_known(_id, olds, news)
        want = {str(k): int(v) for k, v in (news.get("per_node") or {}).items()}
        if (
            not d.changes
            and olds.get("allocated") is not None
            and any(int((olds.get("allocated") or {}).get(n, 0)) != c for n, c in want.items())
        ):
            return DiffResult(changes=True, replaces=[], delete_before_replace=None)
        return d

    def read(self, id_: str, props: dict) -> ReadResult:
        facts = read_host_facts(self.conn(props))
        got = {
            str(n): facts.nodes[int(n)].hugepages.get(SIZE_KB, {}).get("nr", 0)
            for n in (props.get("per_node") or {})
            if int(n) in facts.nodes
        }
        return ReadResult(id_, {**props, "allocated": got})

    def delete(self, _id: str, props: dict) -> None:
        prior = {k: FileState.model_validate(v) for k, v in (props.get("prior") or {}).items()}
        s = Script().raw("set -e")
        s.raw(sh("systemctl", "disable", "gpuhost-hugepages.service") + " >/dev/null 2>&1 || true")
        s.extend(restore_lines(prior)).raw("systemctl daemon-reload")
        s.extend(self._set_counts(props.get("prior_counts") or {}))
        self.conn(props).run(s.render())


class Hugepages2M(dynamic.Resource, module="host", name="Hugepages2M"):
    allocated: pulumi.Output[dict]

    def __init__(self, name: str, args: dict, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(
            Hugepages2MProvider(),
            name,
            {**{k: None for k in Hugepages2MProvider.OUTPUT_ONLY}, **args, "version": Hugepages2MProvider.VERSION},
            opts,
        )
