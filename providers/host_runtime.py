"""HostRuntime: a pinned venv and no conflicting unit on a host (plans.host_runtime).

create: one round trip reads the host (kept as ``prior``), the pure plan's steps run, a second read confirms.
update: the same against the new wants (a changed pin list rebuilds the venv).
read: what the host has now (``state``), so `pulumi refresh` shows a conflicting unit started again as drift.
delete: conflicting units it stopped are enabled/started again and the venv it built is removed: the host is back
as ``prior`` found it.

Usage::

    HostRuntime("gw-runtime", {"host": host_input(spec), "runtime": Runtime(venv="/opt/gpuhost/gateway/venv",
                requirements=("redis==8.1.0",), conflicts=("redis-server.service",)).model_dump()},
                opts=ResourceOptions(depends_on=[packages]))     # SystemPackages: python3-venv, redis-server
"""

from __future__ import annotations

import hashlib
from functools import partial
from typing import Optional

import pulumi

from access.errors import HostError
from plans.host_runtime import Runtime, facts_from_dict, facts_to_dict, parse_facts, plan, read_script, restore_steps
from pristine import Change, Record
from providers.base import HostResource, TemplateProvider


def _state(facts) -> dict:
    return {u: f"{s.enabled}/{s.active}" for u, s in facts.units.items()}


class HostRuntimeProvider(TemplateProvider):
    VERSION = "3"  # 3: on the template, its steps under the host lock; the host as first found is recorded on the host
    KIND = "runtime"
    INPUTS = ("host", "runtime")
    MODELS = {"runtime": Runtime}
    OUTPUT_ONLY = ("prior", "applied", "state")

    def _record(self, props: dict, want: Runtime) -> Record:
        # One record per resource (its owner tag names it): the conflicting units and the venv as first found.
        key = hashlib.sha256(self.owner(props).encode()).hexdigest()[:16]
        return Record(self.owner(props), values={f"host-runtime/{key}": read_script(want)})

    def _facts(self, conn, want: Runtime):
        return parse_facts(self.guarded(conn, "reading the host", lambda: conn.run(read_script(want)).stdout))

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        want = Runtime.model_validate(props["runtime"])
        conn = self.conn(props)
        _, _, first = self.record_and_read(conn, props, self._record(props, want), "")
        before = self._facts(conn, want)
        applied = []
        for step in plan(before, want).steps:
            ch = Change(self.owner(props)).add([step.script])  # under the host lock, like every change
            self.guarded(conn, step.name, partial(ch.run, conn), changing=True)
            applied.append(step.name)
        after = self._facts(conn, want)
        left = plan(after, want).steps
        if left:
            raise HostError(
                self.spec(props).name,
                "still not converged after apply: " + "; ".join(f"{s.name}: {s.why}" for s in left),
                fix="run the step by hand on the host to see its error",
                changed=bool(applied),
            )
        found = (prior or {}).get("prior") or facts_to_dict(parse_facts(next(iter(first.values()), "")))
        return {"prior": found, "applied": applied, "state": _state(after)}

    def observe(self, props: dict) -> dict:
        facts = self._facts(self.conn(props), Runtime.model_validate(props["runtime"]))
        return {"state": _state(facts)}

    def restore(self, props: dict) -> Change:
        want = Runtime.model_validate(props["runtime"])
        prior = props.get("prior")
        ch = Change(self.owner(props)).add(
            s.script for s in restore_steps(facts_from_dict(prior) if prior else None, want)
        )
        return ch.forget(self._record(props, want))


class HostRuntime(HostResource, module="host", name="HostRuntime"):
    prior: pulumi.Output[dict]
    applied: pulumi.Output[list]
    state: pulumi.Output[dict]

    PROVIDER = HostRuntimeProvider
