"""KernelCmdline: add/remove kernel arguments the seeds' way (/etc/default/grub + update-grub; grubby on RHEL).

Inputs: host, add (list), remove (list), acknowledged (flags allowing risky args), version.
Outputs: configured (GRUB_CMDLINE_LINUX now), running (/proc/cmdline), pending_reboot, prior (pristine grub file).
Delete restores /etc/default/grub byte for byte and regenerates the boot config; the running kernel keeps its
arguments until the next reboot (reported by read as pending_reboot).
"""

from __future__ import annotations

from typing import Any, Optional

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ReadResult, UpdateResult

from access.shell import Script, sh
from facts.files import FileState
from facts.host import read_host_facts
from plans import cmdline as plan
from plans.values import kernel_arg
from providers.base import HostProvider, HostResource
from providers.pristine import capture_and_read, restore_lines, write_lines

GRUB = "/etc/default/grub"


def _regen(family: str, add: list[str], remove: list[str]) -> list[str]:
    cmds = plan.regenerate_commands(family)
    if family == "rhel":
        cmds += plan.grubby_commands(add, remove)
    return [
        sh(*c) + " >/dev/null 2>&1 || { echo 'regenerating the boot config failed' >&2; exit 1; }"
        if c[0] in ("update-grub", "grub2-mkconfig")
        else sh(*c)
        for c in cmds
    ]


class KernelCmdlineProvider(HostProvider):
    VERSION = "1"
    OUTPUT_ONLY = ("prior", "configured", "running", "pending_reboot", "plan")

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        for field in ("add", "remove"):
            for a in news.get(field) or []:
                try:
                    kernel_arg(a)
                except ValueError as e:
                    failures.append(CheckFailure(field, str(e)))
        for err in plan.unsafe_args(news.get("add") or [], set(news.get("acknowledged") or [])):
            failures.append(CheckFailure("add", err))
        return CheckResult(news, failures)

    def _apply(self, props: dict, prior: Optional[dict]) -> dict:
        conn = self.conn(props)
        facts, pristine = capture_and_read(conn, [GRUB])
        current = facts.files[GRUB]
        if not current.exists:
            raise RuntimeError(f"{conn.spec.name}: {GRUB} does not exist; is this a GRUB-booted host?")
        add, remove = list(props.get("add") or []), list(props.get("remove") or [])
        p = plan.plan_cmdline(current.text, facts.cmdline, add, remove)
        if p.file_change:
            new = plan.edit_grub_default(current.text, add, remove).encode()
            s = (
                Script()
                .raw("set -e")
                .extend(write_lines(GRUB, new, current.mode.zfill(4), f"{current.uid}:{current.gid}"))
            )
            s.extend(_regen(facts.os.family, add, remove))
            conn.run(s.render())
        return self.outputs(
            props,
            prior=prior or pristine[GRUB].model_dump(),
            configured=p.configured,
            running=facts.cmdline,
            pending_reboot=p.pending_reboot,
            plan=p.sentence,
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = self._apply(props, None)
        return CreateResult(f"{self.spec(props).name}:kernel-cmdline", outs)

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        return UpdateResult(self._apply(news, olds.get("prior")))

    def diff_known(self, _id: str, olds: dict, news: dict) -> DiffResult:
        configured = olds.get("configured")
        drifted = (
            configured is not None
            and plan.apply_args(configured, news.get("add") or [], news.get("remove") or []) != configured
        )
        return self.also_changed(super().diff_known(_id, olds, news), drifted)

    def read(self, id_: str, props: dict) -> ReadResult:
        facts = read_host_facts(self.conn(props), files=[GRUB])
        text = facts.files[GRUB].text
        p = plan.plan_cmdline(text, facts.cmdline, props.get("add") or [], props.get("remove") or [])
        configured, _ = plan.find_value(text)
        return ReadResult(
            id_,
            {
                **props,
                "configured": configured,
                "running": facts.cmdline,
                "pending_reboot": p.pending_reboot,
                "plan": p.sentence,
            },
        )

    def delete(self, _id: str, props: dict) -> None:
        prior = FileState.model_validate(props["prior"])
        conn = self.conn(props)
        family = read_host_facts(conn).os.family if not props.get("family") else props["family"]
        s = Script().raw("set -e").extend(restore_lines({GRUB: prior}))
        s.extend(_regen(family, [], props.get("add") or []) if family == "rhel" else _regen(family, [], []))
        conn.run(s.render())


class KernelCmdline(HostResource, module="host", name="KernelCmdline"):
    configured: pulumi.Output[list]
    running: pulumi.Output[list]
    pending_reboot: pulumi.Output[bool]

    PROVIDER = KernelCmdlineProvider
    DEFAULTS = {"acknowledged": []}
