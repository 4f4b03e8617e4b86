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
from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure

from facts.files import FileState, files_script, parse_files
from facts.state import Change, Record
from providers.base import HostResource, TemplateProvider


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class ManagedFileProvider(TemplateProvider):
    VERSION = "2"  # 2: on the template
    KIND = "file"
    # Another path is another file: the old one goes back as found, the new one is recorded first.
    REPLACE_ON = ("host", "path")
    INPUTS = ("host", "path", "content", "mode", "owner")
    OUTPUT_ONLY = ("prior", "sha256")
    PATHS = ("path",)

    def validate(self, news: dict) -> list[CheckFailure]:
        failures = []
        if not isinstance(news.get("content"), str):
            failures.append(CheckFailure("content", "must be a string"))
        mode = news.get("mode")
        if mode is not None and not (isinstance(mode, str) and mode.isdigit() and len(mode) in (3, 4)):
            failures.append(CheckFailure("mode", f"must be an octal string like '0644': {mode!r}"))
        return failures

    def _record(self, props: dict) -> Record:
        return Record(self.owner(props), files=[props["path"]])

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        """Record the file as first found (on the host, first time only), then write it under the host lock."""
        conn = self.conn(props)
        _, pristine, _ = self.record_and_read(conn, props, self._record(props), "")
        found = pristine[props["path"]]
        # Mode and owner not given: keep what the file had (a new file gets 0644 root:root).
        mode = props.get("mode") or (found.mode.zfill(4) if found.exists and found.mode else "0644")
        owner = props.get("owner") or (f"{found.uid}:{found.gid}" if found.exists and found.uid is not None else "0:0")
        ch = Change(self.owner(props)).write(props["path"], props["content"].encode(), mode, owner)
        self.guarded(conn, f"writing {props['path']}", lambda: ch.run(conn), changing=True)
        return {"prior": found.model_dump(), "sha256": sha256(props["content"])}

    def observe(self, props: dict) -> dict:
        now = parse_files(self.conn(props).run(files_script([props["path"]]).render()).stdout)[props["path"]]
        content = now.text if now.exists else None
        out = {"content": content, "sha256": sha256(content) if content is not None else None}
        if now.exists and props.get("mode"):
            out["mode"] = now.mode.zfill(4)
        return out

    def restore(self, props: dict) -> Change:
        prior = FileState.model_validate(props["prior"])
        return Change(self.owner(props)).restore({props["path"]: prior}).forget(self._record(props))


class ManagedFile(HostResource, module="host", name="ManagedFile"):
    path: pulumi.Output[str]
    sha256: pulumi.Output[str]

    PROVIDER = ManagedFileProvider
