"""Sysctls: the seeds' kernel/network tuning in /etc/sysctl.d, applied now, restorable to the old runtime values.

Seed 000 §8.3 and seed 001 §3 (somaxconn, netdev_max_backlog, tcp_tw_reuse, ...). Inputs: host, values
({"net.core.somaxconn": "4096"}), file (default /etc/sysctl.d/99-gpuhost.conf), version.
Outputs: current (runtime values now), prior_values, prior (pristine file).
"""

from __future__ import annotations

import re
from typing import Any, Optional

import pulumi
from pulumi import dynamic
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ReadResult, UpdateResult

from access.shell import Script, quote
from facts.files import FileState
from facts.host import read_host_facts
from providers.base import HostProvider
from providers.pristine import capture_and_read, restore_lines, write_lines

FILE = "/etc/sysctl.d/99-gpuhost.conf"
_NAME = re.compile(r"^[a-z0-9_]+(\.[a-zA-Z0-9_-]+)+$")


def render(values: dict) -> str:
    return "# gpuhost: seed tuning (000 §8.3, 001 §3)\n" + "".join(f"{k} = {v}\n" for k, v in sorted(values.items()))


def norm(v: Any) -> str:
    return " ".join(str(v).split())


def set_lines(values: dict) -> list[str]:
    return [f"sysctl -q -w {quote(f'{k}={v}')}" for k, v in sorted(values.items())]


class SysctlsProvider(HostProvider):
    VERSION = "1"
    OUTPUT_ONLY = ("prior", "prior_values", "current")

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        for k, v in (news.get("values") or {}).items():
            if not _NAME.match(k):
                failures.append(CheckFailure(f"values.{k}", "not a sysctl name like net.core.somaxconn"))
            if "\n" in str(v):
                failures.append(CheckFailure(f"values.{k}", "value must be one line"))
        return CheckResult(news, failures)

    def _apply(self, props: dict, olds: Optional[dict]) -> dict:
        conn = self.conn(props)
        values = {k: norm(v) for k, v in props["values"].items()}
        names = sorted(set(values) | set((olds or {}).get("prior_values") or {}))
        facts, pristine = capture_and_read(conn, [FILE], sysctls=names)
        missing = [k for k in values if facts.sysctls.get(k, "") == ""]
        if missing:
            raise RuntimeError(
                f"{conn.spec.name}: unknown sysctl(s) {', '.join(missing)} on this kernel; nothing changed"
            )
        prior_values = (olds or {}).get("prior_values") or {}
        prior_values = {**{k: facts.sysctls[k] for k in values if k not in prior_values}, **prior_values}
        s = Script().raw("set -e").extend(write_lines(FILE, render(values).encode(), "0644", "0:0"))
        dropped = {k: v for k, v in prior_values.items() if k not in values}
        s.extend(set_lines(values)).extend(set_lines(dropped))
        conn.run(s.render())
        return self.outputs(
            props,
            prior=(olds or {}).get("prior") or pristine[FILE].model_dump(),
            prior_values={k: v for k, v in prior_values.items() if k in values},
            current=values,
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(f"{self.spec(props).name}:sysctls", self._apply(props, None))

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        return UpdateResult(self._apply(news, olds))

    def diff_known(self, _id: str, olds: dict, news: dict) -> DiffResult:
        d = super().diff_known(_id, olds, news)
        want = {k: norm(v) for k, v in (news.get("values") or {}).items()}
        if not d.changes and olds.get("current") is not None and olds["current"] != want:
            return DiffResult(changes=True, replaces=[], delete_before_replace=None)
        return d

    def read(self, id_: str, props: dict) -> ReadResult:
        facts = read_host_facts(self.conn(props), sysctls=sorted(props.get("values") or {}), files=[FILE])
        current = {k: facts.sysctls.get(k, "") for k in props.get("values") or {}}
        if facts.files[FILE].text != render({k: norm(v) for k, v in props["values"].items()}):
            current["<file>"] = "drifted: " + FILE
        return ReadResult(id_, {**props, "current": current})

    def delete(self, _id: str, props: dict) -> None:
        prior = FileState.model_validate(props["prior"])
        s = Script().raw("set -e").extend(restore_lines({FILE: prior}))
        s.extend(set_lines(props.get("prior_values") or {}))
        self.conn(props).run(s.render())


class Sysctls(dynamic.Resource, module="host", name="Sysctls"):
    current: pulumi.Output[dict]

    def __init__(self, name: str, args: dict, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(
            SysctlsProvider(),
            name,
            {**{k: None for k in SysctlsProvider.OUTPUT_ONLY}, **args, "version": SysctlsProvider.VERSION},
            opts,
        )
