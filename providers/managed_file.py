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
from pulumi import dynamic
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, UpdateResult

from access.shell import sh
from access.ssh import put_script
from facts.files import FileState, files_script, parse_files
from providers.base import HostProvider


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
        if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/"):
            failures.append(CheckFailure("path", f"must be an absolute path without '..': {path!r}"))
        if not isinstance(news.get("content"), str):
            failures.append(CheckFailure("content", "must be a string"))
        mode = news.get("mode")
        if mode is not None and not (isinstance(mode, str) and mode.isdigit() and len(mode) in (3, 4)):
            failures.append(CheckFailure("mode", f"must be an octal string like '0644': {mode!r}"))
        return CheckResult(news, failures)

    def _state(self, conn, path: str) -> FileState:
        return parse_files(conn.run(files_script([path]).render()).stdout)[path]

    def create(self, props: dict[str, Any]) -> CreateResult:
        conn = self.conn(props)
        prior = self._state(conn, props["path"])
        conn.put(props["path"], props["content"].encode(), mode=props.get("mode"), owner=props.get("owner"))
        return CreateResult(
            f"{self.spec(props).name}:{props['path']}",
            self.outputs(props, prior=prior.model_dump(), sha256=sha256(props["content"])),
        )

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        conn = self.conn(news)
        conn.put(news["path"], news["content"].encode(), mode=news.get("mode"), owner=news.get("owner"))
        return UpdateResult(self.outputs(news, prior=olds.get("prior"), sha256=sha256(news["content"])))

    def delete(self, _id: str, props: dict) -> None:
        prior = FileState.model_validate(props["prior"])
        cmd, data = restore_script(prior)
        self.conn(props).run(cmd, input=data)

    def read(self, id_: str, props: dict) -> ReadResult:
        now = self._state(self.conn(props), props["path"])
        content = now.text if now.exists else None
        outs = {**props, "content": content, "sha256": sha256(content) if content is not None else None}
        if now.exists:
            outs["mode"] = now.mode.zfill(4)
        return ReadResult(id_, outs)


class ManagedFile(dynamic.Resource, module="host", name="ManagedFile"):
    path: pulumi.Output[str]
    sha256: pulumi.Output[str]

    def __init__(self, name: str, args: dict, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(
            ManagedFileProvider(),
            name,
            {"prior": None, "sha256": None, **args, "version": ManagedFileProvider.VERSION},
            opts,
        )
