"""GuestBootstrap: the tenant guest's GPU stack, applied over SSH step by step (plans.guest_bootstrap).

create/update: one round trip reads the guest, the pure plan picks the steps still needed, each runs as one command,
and a second read confirms; `checks` (every step: ok / needed / absent: why) and `applied` come back as outputs.
Running it again applies nothing (each step checks before it acts). delete removes only the files gpuhost wrote
(the nvidia-mps unit and the per-instance MPS env files); packages stay, since a guest without its driver helps
nobody and the VM itself is usually deleted next.

Reach the guest through the hypervisor with `host.jump` when the guest has no public address.

Usage::

    GuestBootstrap("tenant-a-bootstrap", {"host": host_input(guest_spec),
                   "config": BootstrapConfig(mps=MpsConfig(instances={"triton-a": 60, "triton-b": 40})).model_dump()})
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckResult, CreateResult, ReadResult, UpdateResult
from pydantic import ValidationError

from access.shell import Script
from plans.guest_bootstrap import MPS_ENV_DIR, MPS_UNIT, BootstrapConfig, parse_facts, plan, read_script
from providers.base import HostProvider, HostResource, validation_failures


class GuestBootstrapProvider(HostProvider):
    VERSION = "1"
    REPLACE_ON = ("host",)
    OUTPUT_ONLY = ("checks", "applied", "done")

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        try:
            cfg = BootstrapConfig.model_validate(news.get("config") or {})
            news = {**news, "config": cfg.model_dump(mode="json")}
        except ValidationError as e:
            failures += validation_failures(e, "config.")
        return CheckResult(news, failures)

    def _apply(self, props: dict) -> dict:
        cfg = BootstrapConfig.model_validate(props.get("config") or {})
        conn = self.conn(props)
        before = plan(parse_facts(conn.run(read_script(cfg)).stdout), cfg)
        applied = []
        for step in before.steps:
            conn.run(step.script, input=step.input)
            applied.append(step.name)
        after = plan(parse_facts(conn.run(read_script(cfg)).stdout), cfg)
        return self.outputs(props, checks=after.checks, applied=applied, done=not after.steps)

    def create(self, props: dict) -> CreateResult:
        outs = self._apply(props)
        return CreateResult(f"{self.spec(props).name}:guest-bootstrap", outs)

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        return UpdateResult(self._apply(news))

    def read(self, id_: str, props: dict) -> ReadResult:
        cfg = BootstrapConfig.model_validate(props.get("config") or {})
        p = plan(parse_facts(self.conn(props).run(read_script(cfg)).stdout), cfg)
        return ReadResult(id_, {**props, "checks": p.checks, "done": not p.steps})

    def delete(self, _id: str, props: dict) -> None:
        cfg = BootstrapConfig.model_validate(props.get("config") or {})
        if not cfg.mps:
            return
        s = Script().raw("systemctl disable --now nvidia-mps 2>/dev/null || true")
        s.add("rm", "-f", MPS_UNIT, *[f"{MPS_ENV_DIR}/{n}.env" for n in sorted(cfg.mps.instances)])
        s.raw("systemctl daemon-reload 2>/dev/null || true")
        s.add("rmdir", "--ignore-fail-on-non-empty", MPS_ENV_DIR)
        self.conn(props).run(s.render())


class GuestBootstrap(HostResource, module="vm", name="GuestBootstrap"):
    checks: pulumi.Output[dict]
    applied: pulumi.Output[list]
    done: pulumi.Output[bool]

    PROVIDER = GuestBootstrapProvider
