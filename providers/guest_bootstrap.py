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

import posixpath
from functools import partial
from typing import Optional

import pulumi

from plans.guest_bootstrap import MPS_ENV_DIR, MPS_UNIT, BootstrapConfig, parse_facts, plan, read_script
from pristine import Change
from providers.base import HostResource, TemplateProvider
from providers.managed_file import remove_dirs_lines


class GuestBootstrapProvider(TemplateProvider):
    VERSION = "3"  # 2: on the template; a guest no longer bootstrapped reads as drift; 3: /etc/gpuhost removed
    KIND = "guest-bootstrap"
    INPUTS = ("host", "config")
    MODELS = {"config": BootstrapConfig}
    OUTPUT_ONLY = ("checks", "applied", "done")

    def _plan(self, conn, cfg: BootstrapConfig):
        return plan(
            parse_facts(self.guarded(conn, "reading the guest", lambda: conn.run(read_script(cfg)).stdout)), cfg
        )

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        cfg = BootstrapConfig.model_validate(props.get("config") or {})
        conn = self.conn(props)
        applied = []
        for step in self._plan(conn, cfg).steps:
            self.guarded(conn, step.name, partial(conn.run, step.script, input=step.input), changing=True)
            applied.append(step.name)
        after = self._plan(conn, cfg)
        return {"checks": after.checks, "applied": applied, "done": not after.steps}

    def observe(self, props: dict) -> dict:
        cfg = BootstrapConfig.model_validate(props.get("config") or {})
        p = self._plan(self.conn(props), cfg)
        # The guest in the input's terms: this config when every step holds, else the steps it still needs.
        seen = props.get("config") if not p.steps else {"steps needed": [s.name for s in p.steps]}
        return {"config": seen, "checks": p.checks, "done": not p.steps}

    def restore(self, props: dict) -> Change:
        cfg = BootstrapConfig.model_validate(props.get("config") or {})
        ch = Change(self.owner(props))
        if cfg.mps:
            ch.add(["systemctl disable --now nvidia-mps 2>/dev/null || true"])
            ch.script.add("rm", "-f", MPS_UNIT, *[f"{MPS_ENV_DIR}/{n}.env" for n in sorted(cfg.mps.instances)])
            ch.add(["systemctl daemon-reload 2>/dev/null || true"])
            # the directories the env files made (/etc/gpuhost is gpuhost's own), when nothing else is in them
            ch.add(remove_dirs_lines([posixpath.dirname(MPS_ENV_DIR), MPS_ENV_DIR]))
        return ch


class GuestBootstrap(HostResource, module="vm", name="GuestBootstrap"):
    checks: pulumi.Output[dict]
    applied: pulumi.Output[list]
    done: pulumi.Output[bool]

    PROVIDER = GuestBootstrapProvider
