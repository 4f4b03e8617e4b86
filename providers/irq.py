"""IrqIsolation: irqbalance bans the VMs' CPUs; named devices' IRQs move to host-reserved CPUs. Restorable.

Seed 002 §9 ("irqbalance 禁用 VM 的核", the IRQ-affinity script) and its pitfall "SR-IOV VF 没吞吐". The banned list
*replaces* irqbalance's default (which skips isolcpus/nohz_full CPUs), so isolated CPUs are banned too.
Inputs: host, banned_cpus (list), pin ([{"match": "nvme|mlx5", "cpus": [0, 1]}]), version.
Outputs: config_path, banned, pinned ({irq: cpus}), unmovable (kernel-managed IRQs), prior_affinity, prior.
Runtime affinities are not persistent across reboots: read reports them as drift and the next `up` re-applies.
"""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, DiffResult, ReadResult

from access.shell import Script, quote
from facts.cpulist import format_cpulist
from facts.files import FileState
from facts.host import read_host_facts
from plans import irq as plan
from providers.base import HostProvider, HostResource
from providers.pristine import capture_and_read, restore_lines, write_lines

PATHS = ["/etc/default/irqbalance", "/etc/sysconfig/irqbalance"]


def _affinity_lines(target: dict[str, list[int]]) -> list[str]:
    return [
        f"printf '%s' {quote(format_cpulist(int(x) for x in c))} > /proc/irq/{int(i)}/smp_affinity_list 2>/dev/null "
        f"|| echo unmovable {int(i)}"
        for i, c in sorted(target.items(), key=lambda kv: int(kv[0]))
    ]


class IrqIsolationProvider(HostProvider):
    VERSION = "2"
    KIND = "irq-isolation"
    OUTPUT_ONLY = ("prior", "prior_affinity", "config_path", "banned", "pinned", "unmovable")

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        # Numbers cross gRPC as doubles: 3.0 is CPU 3.
        if not all(isinstance(c, (int, float)) and c >= 0 and int(c) == c for c in news.get("banned_cpus") or []):
            failures.append(CheckFailure("banned_cpus", "a list of CPU numbers"))
        for i, p in enumerate(news.get("pin") or []):
            if not p.get("match") or not p.get("cpus"):
                failures.append(CheckFailure(f"pin[{i}]", "needs match (regex on /proc/interrupts) and cpus"))
            if {int(c) for c in p.get("cpus") or []} & {int(c) for c in news.get("banned_cpus") or []}:
                failures.append(CheckFailure(f"pin[{i}].cpus", "pins IRQs onto CPUs that are banned for VMs"))
        return CheckResult(news, failures)

    def _targets(self, facts, props) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for p in props.get("pin") or []:
            for irq in plan.matching_irqs(facts.interrupts, p["match"]):
                out[irq.irq] = sorted(int(c) for c in p["cpus"])
        return out

    def _converge(self, props: dict, olds: Optional[dict]) -> dict:
        conn = self.conn(props)
        facts, pristine = capture_and_read(conn, PATHS)
        path = plan.irqbalance_path(facts.os.family)
        banned = format_cpulist(int(c) for c in props.get("banned_cpus") or [])
        cur = facts.files[path]
        new = plan.set_shell_var(cur.text if cur.exists else "", plan.VAR, banned).encode()
        targets = self._targets(facts, props)
        prior_aff = dict((olds or {}).get("prior_affinity") or {})
        for i in targets:
            prior_aff.setdefault(i, next(x.affinity for x in facts.interrupts if x.irq == i))
        s = Script().raw("set -e")
        if not (cur.exists and cur.content == new):
            s.extend(
                write_lines(
                    path,
                    new,
                    cur.mode.zfill(4) if cur.exists else "0644",
                    f"{cur.uid}:{cur.gid}" if cur.exists else "0:0",
                )
            )
            s.raw("if systemctl is-active -q irqbalance; then systemctl restart irqbalance; fi")
        s.extend(_affinity_lines(targets))
        out = conn.run(s.render()).stdout
        unmovable = sorted({ln.split()[1] for ln in out.splitlines() if ln.startswith("unmovable ")}, key=int)
        return self.outputs(
            props,
            prior=(olds or {}).get("prior") or {k: v.model_dump() for k, v in pristine.items()},
            prior_affinity=prior_aff,
            config_path=path,
            banned=banned,
            pinned={i: c for i, c in targets.items() if i not in unmovable},
            unmovable=unmovable,
        )

    def diff_known(self, _id: str, olds: dict, news: dict) -> DiffResult:
        banned = olds.get("banned")
        want = format_cpulist(int(c) for c in news.get("banned_cpus") or [])
        drifted = banned is not None and (banned != want or bool(olds.get("drift")))
        return self.also_changed(super().diff_known(_id, olds, news), drifted)

    def read(self, id_: str, props: dict) -> ReadResult:
        facts = read_host_facts(self.conn(props), files=PATHS)
        path = plan.irqbalance_path(facts.os.family)
        st = facts.files[path]
        banned = plan.get_shell_var(st.text, plan.VAR) if st.exists else None
        # irqbalance may narrow an IRQ to one of the allowed CPUs; drift is an IRQ outside them.
        drift = [
            i
            for i, c in (props.get("pinned") or {}).items()
            if not set(next((x.affinity for x in facts.interrupts if x.irq == i), c)) <= {int(v) for v in c}
        ]
        return ReadResult(id_, {**props, "banned": banned, "drift": drift})

    def delete(self, _id: str, props: dict) -> None:
        prior = {k: FileState.model_validate(v) for k, v in (props.get("prior") or {}).items()}
        s = Script().raw("set -e").extend(restore_lines(prior))
        s.raw("if systemctl is-active -q irqbalance; then systemctl restart irqbalance; fi")
        s.extend(_affinity_lines({i: c for i, c in (props.get("prior_affinity") or {}).items() if c}))
        self.conn(props).run(s.render())


class IrqIsolation(HostResource, module="host", name="IrqIsolation"):
    banned: pulumi.Output[str]
    pinned: pulumi.Output[dict]

    PROVIDER = IrqIsolationProvider
    DEFAULTS = {"pin": []}
