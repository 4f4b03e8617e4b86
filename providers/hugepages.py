"""Hugepages2M: 2 MiB hugepages reserved per NUMA node at runtime and at every boot, verified, restorable.

Seed 002 §6 option B (runtime 2M pages, "may fragment") and seed 000 §4.1; 1 GiB pages need the kernel command line
(seed 002 §6 option A) and are added by PassthroughHost to KernelCmdline. Reservations are per node so a VM's memory
sits beside its GPU; `vm.nr_hugepages` would spread them over all nodes. Decisions are in plans/hugepages.py.

Inputs: host, per_node ({"1": 512}), version. Outputs: prior (unit files as first found), prior_counts (page counts
as first found, also recorded on the host), plan. If the kernel hands out fewer pages than asked (fragmented
memory), apply puts the counts back, fails, and says how many it got: a VM started on half its pages fails later
in a worse place.
"""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure

from access.errors import HostError
from access.shell import quote, sh
from facts.files import FileState
from facts.host import facts_script, parse_host_facts, read_host_facts
from plans import hugepages as plan
from pristine import Change, Record
from providers.base import HostResource, TemplateProvider

UNIT, WANTS, SIZE_KB = plan.UNIT, plan.WANTS, plan.SIZE_KB


def _counts(facts, nodes) -> dict[str, int]:
    return {str(n): facts.nodes[int(n)].hugepages.get(SIZE_KB, {}).get("nr", 0) for n in nodes if int(n) in facts.nodes}


class Hugepages2MProvider(TemplateProvider):
    VERSION = "4"  # 4: a new unit enabled without a daemon-reload; 3: planned from HostPreflight's read, one round trip
    KIND = "hugepages-2M"
    INPUTS = ("host", "per_node")
    OUTPUT_ONLY = ("prior", "prior_counts", "plan")

    @classmethod
    def writes(cls, inputs: dict) -> list:
        return [plan.UNIT, plan.WANTS]

    @classmethod
    def read_spec(cls, inputs: dict) -> dict:
        """What the plan is made from (HostPreflight reads it too): the 2 MiB page counts and the unit files."""
        return {"sections": ["hugepages-nr"], "files": [UNIT, WANTS]}

    def validate(self, news: dict) -> list[CheckFailure]:
        failures: list[CheckFailure] = []
        per = news.get("per_node") or {}
        if not isinstance(per, dict) or not per:
            failures.append(CheckFailure("per_node", "a map of NUMA node -> number of 2 MiB pages"))
        else:
            for k, v in per.items():
                if not str(k).isdigit() or not isinstance(v, (int, float)) or int(v) < 0 or int(v) != v:
                    failures.append(CheckFailure(f"per_node.{k}", f"want node number -> page count, got {k!r}: {v!r}"))
        return failures

    def _record(self, props: dict, nodes) -> Record:
        return Record(
            self.owner(props),
            files=[UNIT, WANTS],
            values={f"hugepages-2M/node{int(n)}": sh("cat", plan.nr_path(n)) for n in sorted(nodes, key=int)},
        )

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        conn = self.conn(props)
        per = {str(k): int(v) for k, v in props["per_node"].items()}
        dropped = sorted(set((prior or {}).get("prior_counts") or {}) - set(per))
        rec = self._record(props, [*per, *dropped])
        made: dict = {}

        def plan_from(read: bytes, _files, values) -> Optional[Change]:
            if dropped and values is None:
                return None  # the dropped nodes go back to their first-found counts: read the records first
            facts = parse_host_facts(read.decode(errors="replace"))
            firsts = {k.removeprefix("hugepages-2M/node"): int(v or 0) for k, v in (values or {}).items()}
            unit = facts.files[UNIT]
            try:
                p = plan.plan_hugepages(
                    per,
                    list(facts.nodes),
                    _counts(facts, per),
                    unit.text if unit.exists else None,
                    facts.files[WANTS].exists,
                )
            except plan.NoSuchNode as e:
                raise HostError(
                    conn.spec.name, str(e), fix="use a node the host has (`numactl -H`)", changed=False
                ) from None
            made.update(p=p, got=_counts(facts, per))
            # Forgetting records (dropped nodes) takes the host lock alone: the store's clean-up must not interleave.
            ch = Change(self.owner(props), classes=() if dropped else ("hugepages",))
            ch.add(plan.set_counts({n: firsts[n] for n in dropped}))
            ch.forget(Record(rec.owner, values={f"hugepages-2M/node{n}": "" for n in dropped}))
            if p.noop and not dropped:
                return ch
            then = [
                f"printf 'got %s %s\\n' {quote(n)} \"$(cat {quote(plan.nr_path(n))})\"" for n in sorted(per, key=int)
            ]
            return self.to_change(props, p, ch, then)

        spec = self.read_spec(props)
        out, files, values, _, _ = self.converge(conn, props, rec, facts_script(**spec), plan_from)
        firsts = {k.removeprefix("hugepages-2M/node"): int(v or 0) for k, v in values.items()}
        p, got = made["p"], made["got"]
        if not p.noop or dropped:
            got = {ln.split()[1]: int(ln.split()[2]) for ln in out.splitlines() if ln.startswith("got ")}
        short = {n: (got.get(n, 0), per[n]) for n in per if got.get(n, 0) < per[n]}
        if short:
            undo = Change(self.owner(props)).add(plan.set_counts({n: firsts[n] for n in per}))
            if prior is None:  # a failed create leaves nothing behind: the unit and its records go too
                undo.add([sh("systemctl", "disable", "gpuhost-hugepages.service") + " >/dev/null 2>&1 || true"])
                undo.restore(files).add(["systemctl daemon-reload"]).forget(rec)
            self.guarded(conn, "putting the page counts back", lambda: undo.run(conn), changing=True)
            raise HostError(
                conn.spec.name,
                "the kernel reserved fewer 2 MiB hugepages than asked: "
                + "; ".join(f"node {n}: got {g} of {w}" for n, (g, w) in short.items())
                + " (memory is fragmented); the page counts were put back",
                fix="reserve them at boot (hugepages= on the kernel command line, or 1G pages) or free memory on "
                "that node",
                changed=True,
            )
        return {
            "prior": {k: v.model_dump() for k, v in files.items()},
            "prior_counts": {n: firsts[n] for n in per},
            "plan": p.sentences,
        }

    def observe(self, props: dict) -> dict:
        facts = read_host_facts(self.conn(props), files=[UNIT])
        return {"per_node": _counts(facts, props.get("per_node") or {})}

    def restore(self, props: dict) -> Change:
        prior = {k: FileState.model_validate(v) for k, v in (props.get("prior") or {}).items()}
        ch = Change(self.owner(props))
        ch.add([sh("systemctl", "disable", "gpuhost-hugepages.service") + " >/dev/null 2>&1 || true"])
        ch.restore(prior).add(["systemctl daemon-reload"])
        ch.add(plan.set_counts(props.get("prior_counts") or {}))
        return ch.forget(self._record(props, props.get("prior_counts") or {}))


class Hugepages2M(HostResource, module="host", name="Hugepages2M"):
    per_node: pulumi.Output[dict]

    PROVIDER = Hugepages2MProvider
