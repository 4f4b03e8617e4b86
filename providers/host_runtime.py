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

from typing import Any, Optional

import pulumi
from pulumi import dynamic
from pulumi.dynamic import CheckResult, CreateResult, ReadResult, UpdateResult
from pydantic import ValidationError

from plans.host_runtime import (
    Runtime,
    facts_from_dict,
    facts_to_dict,
    parse_facts,
    plan,
    read_script,
    restore_steps,
)
from providers.base import HostProvider, validation_failures


def _state(facts) -> dict:
    return {u: f"{s.enabled}/{s.active}" for u, s in facts.units.items()}


class HostRuntimeProvider(HostProvider):
    VERSION = "2"
    REPLACE_ON = ("host",)
    OUTPUT_ONLY = ("prior", "applied", "state")

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        try:
            news = {**news, "runtime": Runtime.model_validate(news.get("runtime") or {}).model_dump(mode="json")}
        except ValidationError as e:
            failures += validation_failures(e, "runtime.")
        return CheckResult(news, failures)

    def _apply(self, props: dict, prior: Optional[dict]) -> dict:
        want = Runtime.model_validate(props["runtime"])
        conn = self.conn(props)
        before = parse_facts(conn.run(read_script(want)).stdout)
        applied = []
        for step in plan(before, want).steps:
            conn.run(step.script)
            applied.append(step.name)
        after = parse_facts(conn.run(read_script(want)).stdout)
        left = plan(after, want).steps
        if left:
            raise RuntimeError(
                f"{self.spec(props).name}: still not converged after apply: "
                + "; ".join(f"{s.name}: {s.why}" for s in left)
            )
        return self.outputs(props, prior=prior or facts_to_dict(before), applied=applied, state=_state(after))

    def create(self, props: dict) -> CreateResult:
        return CreateResult(f"{self.spec(props).name}:runtime", self._apply(props, None))

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        return UpdateResult(self._apply(news, olds.get("prior")))

    def read(self, id_: str, props: dict) -> ReadResult:
        want = Runtime.model_validate(props["runtime"])
        facts = parse_facts(self.conn(props).run(read_script(want)).stdout)
        return ReadResult(id_, {**props, "state": _state(facts)})

    def delete(self, _id: str, props: dict) -> None:
        want = Runtime.model_validate(props["runtime"])
        conn = self.conn(props)
        prior = props.get("prior")
        for step in restore_steps(facts_from_dict(prior) if prior else None, want):
            conn.run(step.script)


class HostRuntime(dynamic.Resource, module="host", name="HostRuntime"):
    prior: pulumi.Output[dict]
    applied: pulumi.Output[list]
    state: pulumi.Output[dict]

    def __init__(self, name: str, args: dict, opts: Optional[pulumi.ResourceOptions] = None):
        props: dict[str, Any] = {k: None for k in HostRuntimeProvider.OUTPUT_ONLY}
        props.update(args)
        props["version"] = HostRuntimeProvider.VERSION
        super().__init__(HostRuntimeProvider(), name, props, opts)
