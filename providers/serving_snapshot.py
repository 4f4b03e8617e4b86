"""ServingSnapshot: what a guest serves, copied aside before a deploy changes it, so a failed gate can put it back.

Runs first in a TritonService (before artifacts, engines, repository and server files change): when `trigger` (a
hash over everything the deploy writes) changes, it copies the model repository (configs, model files, built
engines, the `.gpuhost-digest` marker) and the server's files (the systemd unit, nginx.conf) to `snapshot`.
`restore` (called by the AcceptanceGate on failure) puts them back and restarts the server; `served_digest` reads
the marker, so a gate can tell whether the guest serves this deploy or a rolled-back one. Delete removes the
snapshot directory (it is gpuhost's own).

Usage::

    rb = {"host": host_input(spec), "root": "/srv/triton-repo", "snapshot": "/var/lib/gpuhost/serving/svc",
          "files": ["/etc/systemd/system/gpuhost-triton.service"],
          "restart": [["systemctl", "daemon-reload"], ["systemctl", "restart", "gpuhost-triton"]]}
    ServingSnapshot("svc-snapshot", {**rb, "trigger": digest})
    restore(rb)   # True when a snapshot went back
"""

from __future__ import annotations

from typing import Any, Optional

import pulumi
from pulumi import dynamic
from pulumi.dynamic import CreateResult, UpdateResult

from access.shell import Script, quote
from access.ssh import HostSpec, connect
from providers.base import HostProvider

MARKER = ".gpuhost-digest"


def snapshot_script(root: str, snapshot: str, files: list[str]) -> str:
    new = snapshot + ".new"
    s = Script().raw("set -e")
    s.raw(f"if [ -d {quote(root)} ]; then")
    s.raw(f"  rm -rf {quote(new)}; mkdir -p {quote(new + '/files')}")
    s.raw(f"  cp -a {quote(root)} {quote(new + '/repo')}")
    for i, f in enumerate(files):
        s.raw(f"  if [ -e {quote(f)} ]; then cp -a {quote(f)} {quote(f'{new}/files/{i}')}; fi")
    s.raw(f"  rm -rf {quote(snapshot)}; mv {quote(new)} {quote(snapshot)}; echo taken")
    s.raw("else echo none; fi")
    return s.render()


def restore_script(root: str, snapshot: str, files: list[str], restart: list[list[str]]) -> str:
    s = Script().raw("set -e")
    s.raw(f"if [ ! -d {quote(snapshot + '/repo')} ]; then echo none; exit 0; fi")
    s.raw(f"rm -rf {quote(root + '.gpuhost-restore')}")
    s.raw(f"cp -a {quote(snapshot + '/repo')} {quote(root + '.gpuhost-restore')}")
    s.raw(f"rm -rf {quote(root)}; mv {quote(root + '.gpuhost-restore')} {quote(root)}")
    for i, f in enumerate(files):
        kept = f"{snapshot}/files/{i}"
        s.raw(f"if [ -e {quote(kept)} ]; then cp -a {quote(kept)} {quote(f)}; else rm -f {quote(f)}; fi")
    for argv in restart:
        s.add(*argv)
    s.raw("echo restored")
    return s.render()


def _conn(rb: dict):
    return connect(HostSpec.model_validate(rb["host"]))


def restore(rb: dict) -> bool:
    out = (
        _conn(rb)
        .run(
            restore_script(
                rb["root"], rb["snapshot"], list(rb.get("files") or []), [list(a) for a in rb.get("restart") or []]
            )
        )
        .stdout
    )
    return "restored" in out.split()


def served_digest(rb: dict) -> str:
    return (
        _conn(rb)
        .run(Script().raw(f"cat {quote(rb['root'] + '/' + MARKER)} 2>/dev/null || true").render())
        .stdout.strip()
    )


class ServingSnapshotProvider(HostProvider):
    VERSION = "1"
    REPLACE_ON = ("host", "snapshot")
    OUTPUT_ONLY = ("taken",)

    def _take(self, props: dict) -> bool:
        out = self.conn(props).run(snapshot_script(props["root"], props["snapshot"], list(props.get("files") or [])))
        return "taken" in out.stdout.split()

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(
            f"{self.spec(props).name}:{props['snapshot']}", self.outputs(props, taken=self._take(props))
        )

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        return UpdateResult(self.outputs(news, taken=self._take(news)))

    def delete(self, _id: str, props: dict) -> None:
        self.conn(props).run(Script().raw(f"rm -rf {quote(props['snapshot'])}").render())


class ServingSnapshot(dynamic.Resource, module="serving", name="ServingSnapshot"):
    def __init__(self, name: str, args: dict, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(
            ServingSnapshotProvider(), name, {"taken": None, **args, "version": ServingSnapshotProvider.VERSION}, opts
        )
