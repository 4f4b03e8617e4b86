"""KernelCmdline: add/remove kernel arguments the seeds' way (/etc/default/grub + update-grub; grubby on RHEL).

Inputs: host, add (list), remove (list), acknowledged (flags allowing risky args), family, version.
Outputs: configured (GRUB_CMDLINE_LINUX now), running (/proc/cmdline), pending_reboot, plan, prior (the grub file
as first found, recorded on the host before the first change: a re-run after a dropped connection keeps it).
Delete restores /etc/default/grub byte for byte and regenerates the boot config; the running kernel keeps its
arguments until the next reboot (reported by read as pending_reboot). Decisions are in plans/cmdline.py.
"""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure

from access.errors import HostError
from facts.files import FileState
from facts.host import facts_script, parse_host_facts, read_host_facts
from plans import cmdline as plan
from plans.values import kernel_arg
from pristine import Change, Record
from providers.base import HostResource, TemplateProvider

GRUB = plan.GRUB


class KernelCmdlineProvider(TemplateProvider):
    # 4: update-grub says every 5 s what it waits for (providers.progress); 3: planned from HostPreflight's read;
    # record, check and change in one round trip
    VERSION = "4"
    KIND = "kernel-cmdline"
    INPUTS = ("host", "add", "remove", "acknowledged", "family")
    OUTPUT_ONLY = ("prior", "configured", "running", "pending_reboot", "plan")

    @classmethod
    def writes(cls, inputs: dict) -> list:
        return [GRUB]

    def validate(self, news: dict) -> list[CheckFailure]:
        failures: list[CheckFailure] = []
        for field in ("add", "remove"):
            for a in news.get(field) or []:
                try:
                    kernel_arg(a)
                except ValueError as e:
                    failures.append(CheckFailure(field, str(e)))
        for err in plan.unsafe_args(news.get("add") or [], set(news.get("acknowledged") or [])):
            failures.append(CheckFailure("add", err))
        return failures

    def _record(self, props: dict) -> Record:
        return Record(self.owner(props), files=[GRUB])

    # What the plan is made from: HostPreflight reads it too (`host_read`), so the first change needs no read.
    READ = {"sections": ["os-release", "cmdline"], "files": [GRUB]}

    @classmethod
    def read_spec(cls, inputs: dict) -> dict:
        return cls.READ

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        conn = self.conn(props)
        rec = self._record(props)
        add, remove = list(props.get("add") or []), list(props.get("remove") or [])
        made: dict = {}

        def plan_from(read: bytes, _files, _values) -> Change:
            facts = parse_host_facts(read.decode(errors="replace"))
            current = facts.files[GRUB]
            if not current.exists:
                raise HostError(
                    conn.spec.name, f"{GRUB} does not exist", fix="is this a GRUB-booted host?", changed=False
                )
            cp = plan.plan_cmdline(current.text, facts.cmdline, add, remove)
            made.update(cp=cp, running=facts.cmdline)
            # update-grub / grubby: the boot loader's config, which tuned's [bootloader] and initramfs tools touch too
            return self.to_change(props, plan.boot_plan(cp, current, facts.os.family), classes=("boot",))

        _, files, _, _, _ = self.converge(conn, props, rec, facts_script(**self.READ), plan_from)
        cp = made["cp"]
        return {
            "prior": files[GRUB].model_dump(),
            "configured": cp.configured,
            "running": made["running"],
            "pending_reboot": cp.pending_reboot,
            "plan": cp.sentence,
        }

    def observe(self, props: dict) -> dict:
        facts = read_host_facts(self.conn(props), files=[GRUB])
        text = facts.files[GRUB].text
        add, remove = list(props.get("add") or []), list(props.get("remove") or [])
        configured, _ = plan.find_value(text)
        cp = plan.plan_cmdline(text, facts.cmdline, add, remove)
        if cp.file_change:  # a hand edit: shown as the arguments that no longer hold
            add = [a for a in add if a in configured]
            remove = [r for r in remove if plan.apply_args(configured, [], [r]) == configured]
        return {
            "add": add,
            "remove": remove,
            "configured": configured,
            "running": facts.cmdline,
            "pending_reboot": cp.pending_reboot,
            "plan": cp.sentence,
        }

    def restore(self, props: dict) -> Change:
        prior = FileState.model_validate(props["prior"])
        family = props.get("family") or read_host_facts(self.conn(props)).os.family
        # RHEL: grubby put the added arguments into every kernel's BLS entry; they come out the same way.
        undo = plan.regenerate_lines(family, [], (props.get("add") or []) if family == "rhel" else [])
        return Change(self.owner(props)).restore({GRUB: prior}).add(undo).forget(self._record(props))


class KernelCmdline(HostResource, module="host", name="KernelCmdline"):
    configured: pulumi.Output[list]
    running: pulumi.Output[list]
    pending_reboot: pulumi.Output[bool]

    PROVIDER = KernelCmdlineProvider
    DEFAULTS = {"acknowledged": []}
