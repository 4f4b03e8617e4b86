"""ServingSnapshot: what a guest serves, copied aside before a deploy changes it, so a failed gate can put it back.

Runs first in a TritonService (before artifacts, engines, repository and server files change): when `trigger` (a
hash over everything the deploy writes) changes, it copies the model repository (configs, model files, built
engines, the `.gpuhost-digest` marker) and the server's files (the systemd unit, nginx.conf) to `snapshot`.
`restore` (called by the AcceptanceGate on failure) puts them back and restarts the server; `served_digest` reads
the marker, so a gate can tell whether the guest serves this deploy or a rolled-back one. `prepare`: commands run
before the snapshot is taken (the Docker runtime undoes an earlier rollback's container swap there, so what runs is
what Pulumi recorded). Delete removes the snapshot directory (it is gpuhost's own), and under /var/lib/gpuhost the
directories above it that it leaves empty.

Usage::

    rb = {"host": host_input(spec), "root": "/srv/triton-repo", "snapshot": "/var/lib/gpuhost/serving/svc",
          "files": ["/etc/systemd/system/gpuhost-triton.service"],
          "restart": [["systemctl", "daemon-reload"], ["systemctl", "restart", "gpuhost-triton"]]}
    ServingSnapshot("svc-snapshot", {**rb, "trigger": digest})
    restore(rb)   # True when a snapshot went back
"""

from __future__ import annotations

from typing import Optional

from access.shell import Script, quote, sh
from access.ssh import HostSpec, connect
from pristine import Change, prune_lines
from providers.base import HostResource, TemplateProvider

MARKER = ".gpuhost-digest"


def snapshot_script(
    root: str, snapshot: str, files: list[str], prepare: tuple[list[str], ...] | list[list[str]] = ()
) -> str:
    new = snapshot + ".new"
    s = Script().raw("set -e")
    for argv in prepare:
        s.add(*argv)
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


class ServingSnapshotProvider(TemplateProvider):
    VERSION = "3"  # 2: on the template; 3: the empty directories above the snapshot removed
    KIND = "snapshot"
    REPLACE_ON = ("host", "snapshot")
    INPUTS = ("host", "root", "snapshot", "files", "restart", "trigger", "prepare")
    OUTPUT_ONLY = ("taken",)
    DERIVED = (("trigger",),)  # a hash over everything the deploy writes, each shown itself
    PATHS = ("root", "snapshot")

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        conn = self.conn(props)
        ch = Change(self.owner(props)).add(
            [
                snapshot_script(
                    props["root"],
                    props["snapshot"],
                    list(props.get("files") or []),
                    [list(a) for a in props.get("prepare") or []],
                )
            ]
        )
        self.guarded(conn, "taking the serving snapshot", lambda: ch.run(conn), changing=True)
        return {"taken": "taken" in ch.last_stdout.split()}

    def observe(self, props: dict) -> dict:
        return {}

    def restore(self, props: dict) -> Change:
        # and the directories of gpuhost's own tree above it that it leaves empty (/var/lib/gpuhost/serving, ...)
        return Change(self.owner(props)).add(
            [sh("rm", "-rf", "--", props["snapshot"]), *prune_lines([props["snapshot"]])]
        )


class ServingSnapshot(HostResource, module="serving", name="ServingSnapshot"):
    PROVIDER = ServingSnapshotProvider
