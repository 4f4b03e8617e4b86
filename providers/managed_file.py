"""ManagedFile: a whole file gpuhost owns on a host (modprobe.d, modules-load.d, sysctl.d, udev rules ...).

Create records what was there (content, mode, owner, or absence) and writes the wanted file atomically; delete puts
back exactly what create found, byte for byte, or removes the file if there was none. Read returns the file as it
is now, so `pulumi refresh` shows a hand edit as drift.

Usage::

    ManagedFile("gpu-a-vfio-modules", {"host": host_input(spec), "path": "/etc/modules-load.d/vfio.conf",
                "content": "vfio\\nvfio_pci\\n", "mode": "0644", "owner": "root:root"})
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, UpdateResult

from access.shell import sh
from access.ssh import put_script
from facts.files import FileState, files_script, parse_files
from facts.state import Change, Record
from providers.base import HostProvider, HostResource, is_safe_abs_path


def restore_script(prior: FileState) -> tuple[str, Optional[bytes]]:
    """Shell text (and stdin) that puts a file back exactly as `prior` recorded it."""
    if not prior.exists:
        return sh("rm", "-f", "--", prior.path), None
    return put_script(prior.path, mode=prior.mode, owner=f"{prior.uid}:{prior.gid}"), prior.content


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class ManagedFileProvider(HostProvider):
    VERSION = "1"
    REPLACE_ON = ("host", "path")
    OUTPUT_ONLY = ("prior", "sha256")

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        path = news.get("path", "")
        if not is_safe_abs_path(path):
            failures.append(CheckFailure("path", f"must be an absolute path without '..': {path!r}"))
        if not isinstance(news.get("content"), str):
            failures.append(CheckFailure("content", "must be a string"))
        mode = news.get("mode")
        if mode is not None and not (isinstance(mode, str) and mode.isdigit() and len(mode) in (3, 4)):
            failures.append(CheckFailure("mode", f"must be an octal string like '0644': {mode!r}"))
        return CheckResult(news, failures)

    def _state(self, conn, path: str) -> FileState:
        return parse_files(conn.run(files_script([path]).render()).stdout)[path]

    def _record(self, props: dict) -> Record:
        return Record(self.owner(props), files=[props["path"]])

    def _write(self, props: dict) -> dict:
        """Record the file as first found (on the host, first time only), then write it under the host lock."""
        conn = self.conn(props)
        rec = self._record(props)
        pristine, _ = rec.parse(conn.run(rec.script().render()).stdout, conn.spec.name)
        prior = pristine[props["path"]]
        # Mode and owner not given: keep what the file had (a new file gets 0644 root:root).
        mode = props.get("mode") or (prior.mode.zfill(4) if prior.exists and prior.mode else "0644")
        owner = props.get("owner") or (f"{prior.uid}:{prior.gid}" if prior.exists and prior.uid is not None else "0:0")
        Change(self.owner(props)).write(props["path"], props["content"].encode(), mode, owner).run(conn)
        return self.outputs(props, prior=prior.model_dump(), sha256=sha256(props["content"]))

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(f"{self.spec(props).name}:{props['path']}", self._write(props))

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        return UpdateResult(self._write(news))

    def delete(self, _id: str, props: dict) -> None:
        prior = FileState.model_validate(props["prior"])
        Change(self.owner(props)).restore({props["path"]: prior}).forget(self._record(props)).run(self.conn(props))

    def read(self, id_: str, props: dict) -> ReadResult:
        now = self._state(self.conn(props), props["path"])
        content = now.text if now.exists else None
        outs = {**props, "content": content, "sha256": sha256(content) if content is not None else None}
        if now.exists:
            outs["mode"] = now.mode.zfill(4)
        return ReadResult(id_, outs)


class ManagedFile(HostResource, module="host", name="ManagedFile"):
    path: pulumi.Output[str]
    sha256: pulumi.Output[str]

    PROVIDER = ManagedFileProvider
