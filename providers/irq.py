"""IrqIsolation: irqbalance bans the VMs' CPUs; named devices' IRQs move to host-reserved CPUs. Restorable.

Seed 002 §9 ("irqbalance 禁用 VM 的核", the IRQ-affinity script) and its pitfall "SR-IOV VF 没吞吐". Decisions are in
plans/irq.py. Inputs: host, banned_cpus (list), pin ([{"match": "nvme|mlx5", "cpus": [0, 1]}]), version.
Outputs: config_path, banned, pinned ({irq: cpus}), unmovable (kernel-managed IRQs), plan, and what delete puts
back: prior (the irqbalance files as first found) and prior_affinity ({irq: cpus as first found}); both are
recorded on the host (pristine/) before the first change, so a re-run after a dropped connection keeps them.
Runtime affinities do not survive a reboot: refresh shows a moved IRQ as a change of `pin`, the next `up` repairs it.
"""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure

from facts.cpulist import parse_cpulist
from facts.files import FileState
from facts.host import facts_script, parse_host_facts, read_host_facts
from plans import irq as plan
from pristine import Change, Record
from providers.base import HostResource, TemplateProvider
from providers.effects import Effect, host_name

PATHS = list(plan.PATHS)
AFFINITY = "irq/affinity"


def _cpus(v) -> bool:
    # Numbers cross gRPC as doubles: 3.0 is CPU 3.
    return isinstance(v, list) and all(isinstance(c, (int, float)) and c >= 0 and int(c) == c for c in v)


class IrqIsolationProvider(TemplateProvider):
    VERSION = "3"
    KIND = "irq-isolation"
    INPUTS = ("host", "banned_cpus", "pin")
    OUTPUT_ONLY = ("prior", "prior_affinity", "config_path", "banned", "pinned", "unmovable", "plan")

    # Which of PATHS depends on the host's OS family: both count.
    @classmethod
    def writes(cls, inputs: dict) -> list:
        return list(PATHS)

    def effects(self, olds: dict | None, news: dict) -> list[Effect]:
        # A new ban list is a new irqbalance config: irqbalance restarts to read it (plans.irq).
        if olds is None or olds.get("banned_cpus") == news.get("banned_cpus"):
            return []
        return [Effect("restart", host_name(news), "irqbalance", "restarts (if running) to read the new ban list")]

    def validate(self, news: dict) -> list[CheckFailure]:
        failures: list[CheckFailure] = []
        banned = news.get("banned_cpus") or []
        if not _cpus(banned):
            failures.append(CheckFailure("banned_cpus", "a list of CPU numbers"))
            banned = []
        for i, p in enumerate(news.get("pin") or []):
            if not isinstance(p, dict) or not p.get("match") or not _cpus(p.get("cpus")) or not p.get("cpus"):
                failures.append(CheckFailure(f"pin[{i}]", "needs match (regex on /proc/interrupts) and cpus"))
            elif {int(c) for c in p["cpus"]} & {int(c) for c in banned}:
                failures.append(CheckFailure(f"pin[{i}].cpus", "pins IRQs onto CPUs that are banned for VMs"))
        return failures

    def _record(self, props: dict) -> Record:
        return Record(self.owner(props), files=PATHS, values={AFFINITY: plan.AFFINITY_CMD})

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        conn = self.conn(props)
        rec = self._record(props)
        out, files, values = self.record_and_read(conn, props, rec, facts_script(files=PATHS))
        facts = parse_host_facts(out)
        first = plan.parse_affinities(values.get(AFFINITY, ""))
        before = (prior or {}).get("prior_affinity") or {}
        skip = [str(i) for i in (prior or {}).get("unmovable") or []]
        path = plan.irqbalance_path(facts.os.family)
        d = plan.plan_irq(
            facts.os.family,
            facts.files[path],
            facts.interrupts,
            [int(c) for c in props.get("banned_cpus") or []],
            props.get("pin") or [],
            restore={i: first.get(i) or [int(c) for c in c_] for i, c_ in before.items()},
            skip=skip,
        )
        ran = self.run_plan(conn, props, d.plan)
        refused = set(plan.unmovable(ran.last_stdout)) | (set(skip) & set(d.targets))
        now = {i.irq: i.affinity for i in facts.interrupts}
        return {
            "prior": {k: v.model_dump() for k, v in files.items()},
            # An IRQ that appeared after the first record (a VF created since) has only its value of now.
            "prior_affinity": {i: first.get(i) or before.get(i) or now.get(i, []) for i in d.targets},
            "config_path": d.path,
            "banned": d.banned,
            "pinned": {i: c for i, c in d.targets.items() if i not in refused},
            "unmovable": sorted(refused, key=int),
            "plan": d.plan.sentences,
        }

    def observe(self, props: dict) -> dict:
        facts = read_host_facts(self.conn(props), files=PATHS)
        st = facts.files[plan.irqbalance_path(facts.os.family)]
        banned = parse_cpulist((plan.get_shell_var(st.text, plan.VAR) if st.exists else None) or "")
        wanted = props.get("banned_cpus") or []
        return {
            "banned_cpus": wanted if set(banned) == {int(c) for c in wanted} else banned,
            "pin": plan.observed_pin(props.get("pin") or [], props.get("pinned") or {}, facts.interrupts),
        }

    def restore(self, props: dict) -> Change:
        prior = {k: FileState.model_validate(v) for k, v in (props.get("prior") or {}).items()}
        ch = Change(self.owner(props)).restore(prior).add([plan.RESTART])
        ch.add(plan.affinity_command(i, c) for i, c in sorted((props.get("prior_affinity") or {}).items()) if c)
        return ch.forget(self._record(props))


class IrqIsolation(HostResource, module="host", name="IrqIsolation"):
    banned: pulumi.Output[str]
    pinned: pulumi.Output[dict]

    PROVIDER = IrqIsolationProvider
    DEFAULTS = {"pin": []}
