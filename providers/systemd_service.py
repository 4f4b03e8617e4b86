"""SystemdService: a service gpuhost owns on a host — its files (unit, program) written, the unit enabled and started.

Create records what each path held (content, mode, owner, or absence), writes the files, reloads systemd and runs
``systemctl enable`` and ``start``; update writes the new files and restarts the unit; delete stops and disables
the unit and puts back exactly what create found. Read returns the files as they are and whether the unit is
enabled and active, so `pulumi refresh` shows a hand edit or a stopped service as drift.

Usage::

    SystemdService("svc-adaptive-window", {"host": host_input(spec), "unit": "gpuhost-adaptive-window.service",
                   "files": {"/etc/systemd/system/gpuhost-adaptive-window.service": unit_text,
                             "/usr/local/lib/gpuhost-adaptive-window.py": program}})
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, UpdateResult

from access.shell import Script, sh
from facts.files import FileState, files_script, parse_files
from providers.base import HostProvider, HostResource
from providers.managed_file import restore_script

UNIT_RE = re.compile(r"^[A-Za-z0-9@._\-]+\.service$")


def start_script(unit: str, *, restart: bool) -> str:
    s = Script().raw("set -e").add("systemctl", "daemon-reload").add("systemctl", "enable", "--quiet", unit)
    s.add("systemctl", "restart" if restart else "start", unit)
    return s.render()


def stop_script(unit: str) -> str:
    return Script().raw(sh("systemctl", "disable", "--now", "--quiet", unit) + " 2>/dev/null || true").render()


def status_script(unit: str, paths: list[str]) -> Script:
    s = files_script(paths)
    s.raw("echo '@@unit'")
    s.raw(sh("systemctl", "is-enabled", unit) + " 2>/dev/null || echo unknown")
    s.raw(sh("systemctl", "is-active", unit) + " 2>/dev/null || true")
    return s


def parse_status(text: str) -> tuple[dict[str, FileState], bool, bool]:
    """(files, enabled, active) from the output of ``status_script``."""
    files_part, _, unit_part = text.partition("@@unit\n")
    words = unit_part.split()
    return parse_files(files_part), words[:1] == ["enabled"], words[1:2] == ["active"]


def _sha(files: dict[str, str]) -> dict[str, str]:
    return {p: hashlib.sha256(c.encode()).hexdigest() for p, c in sorted(files.items())}


class SystemdServiceProvider(HostProvider):
    VERSION = "1"
    # Another unit name is another service: stop and restore the old one, then start the new one.
    REPLACE_ON = ("host", "unit")
    # `enabled` and `active` are wanted (True) as inputs and read back from the host: a unit stopped or disabled by
    # hand is drift that `up` repairs.
    OUTPUT_ONLY = ("priors", "sha256")

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        unit = news.get("unit")
        if not isinstance(unit, str) or not UNIT_RE.match(unit):
            failures.append(CheckFailure("unit", f"must be a unit name like 'name.service': {unit!r}"))
        files = news.get("files")
        if not isinstance(files, dict) or not files:
            failures.append(CheckFailure("files", "must map absolute paths to file contents"))
        else:
            for p, c in files.items():
                if not p.startswith("/") or ".." in p.split("/") or not isinstance(c, str):
                    failures.append(CheckFailure("files", f"bad entry {p!r}: absolute path to text content"))
            if isinstance(unit, str) and f"/etc/systemd/system/{unit}" not in files:
                failures.append(CheckFailure("files", f"must include the unit file /etc/systemd/system/{unit}"))
        for k in ("enabled", "active"):
            if news.get(k, True) is not True:
                failures.append(CheckFailure(k, "a SystemdService is always wanted enabled and running"))
        return CheckResult(news, failures)

    @staticmethod
    def _write(conn, files: dict[str, str]) -> None:
        for path, content in sorted(files.items()):
            conn.put(path, content.encode(), mode="0644", owner="root:root")

    def create(self, props: dict[str, Any]) -> CreateResult:
        conn = self.conn(props)
        paths = sorted(props["files"])
        found = parse_files(conn.run(files_script(paths).render()).stdout)
        self._write(conn, props["files"])
        conn.run(start_script(props["unit"], restart=False))
        priors = {p: found[p].model_dump() for p in paths}
        return CreateResult(
            f"{self.spec(props).name}:{props['unit']}",
            self.outputs(props, priors=priors, sha256=_sha(props["files"]), enabled=True, active=True),
        )

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        conn = self.conn(news)
        priors = dict(olds.get("priors") or {})
        added = sorted(set(news["files"]) - set(priors))
        if added:
            found = parse_files(conn.run(files_script(added).render()).stdout)
            priors.update({p: found[p].model_dump() for p in added})
        self._write(conn, news["files"])
        for gone in sorted(set(olds.get("files") or {}) - set(news["files"])):
            cmd, data = restore_script(FileState.model_validate(priors.pop(gone)))
            conn.run(cmd, input=data)
        conn.run(start_script(news["unit"], restart=True))
        return UpdateResult(self.outputs(news, priors=priors, sha256=_sha(news["files"]), enabled=True, active=True))

    def delete(self, _id: str, props: dict) -> None:
        conn = self.conn(props)
        conn.run(stop_script(props["unit"]))
        for _path, prior in sorted((props.get("priors") or {}).items()):
            cmd, data = restore_script(FileState.model_validate(prior))
            conn.run(cmd, input=data)
        conn.run(sh("systemctl", "daemon-reload"))

    def read(self, id_: str, props: dict) -> ReadResult:
        paths = sorted(props["files"])
        out = self.conn(props).run(status_script(props["unit"], paths).render()).stdout
        files, enabled, active = parse_status(out)
        now = {p: files[p].text for p in paths if files[p].exists}
        return ReadResult(id_, {**props, "files": now, "sha256": _sha(now), "enabled": enabled, "active": active})


class SystemdService(HostResource, module="host", name="SystemdService"):
    unit: pulumi.Output[str]
    active: pulumi.Output[bool]

    PROVIDER = SystemdServiceProvider
    DEFAULTS = {"enabled": True, "active": True}
