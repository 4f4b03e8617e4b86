"""ModelArtifact: a model file on the guest (an ONNX export, a python backend's model.py), verified by sha256.

The file comes from `url` (fetched on the guest with curl or wget) or from `path` on the machine running Pulumi
(streamed over SSH). It lands in a temporary file next to `dest`, and only a matching sha256 moves it into place: a
wrong download fails `up` naming both hashes and leaves what was there. Create keeps what `dest` held before
(under /var/lib/gpuhost/pristine/artifacts); delete puts that back byte for byte, or removes the file when there
was none. Read returns the sha256 on the guest, so a hand-replaced model shows as drift.

Usage::

    ModelArtifact("yolo-rt-yolov8n-artifact", {"host": host_input(guest), "dest": "/srv/onnx/yolov8n.onnx",
                  "sha256": "3f1c…", "url": "https://models.example/yolov8n.onnx"})
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Optional

import pulumi
from pulumi import dynamic
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, UpdateResult

from access.shell import Script, quote, sh
from providers.base import HostProvider

PRIOR_DIR = "/var/lib/gpuhost/pristine/artifacts"


def prior_path(dest: str) -> str:
    return f"{PRIOR_DIR}/{hashlib.sha256(dest.encode()).hexdigest()[:16]}"


def sha_script(dest: str) -> str:
    return (
        Script()
        .raw(f"if [ -f {quote(dest)} ]; then sha256sum {quote(dest)} | cut -d' ' -f1; else echo absent; fi")
        .render()
    )


def fetch_script(dest: str, sha256: str, url: Optional[str]) -> str:
    """Shell text: fetch (url) or take stdin (path) into a temp file beside `dest`, check the hash, move it in."""
    s = Script().raw("set -e")
    s.add("mkdir", "-p", os.path.dirname(dest))
    s.assign("tmp", dest + ".gpuhost-download")
    s.raw("trap 'rm -f \"$tmp\"' EXIT")
    if url:
        s.raw(
            f'if command -v curl >/dev/null 2>&1; then curl -fsSL --retry 3 -o "$tmp" {quote(url)}; '
            f'else wget -q -O "$tmp" {quote(url)}; fi'
        )
    else:
        s.raw('cat > "$tmp"')
    s.assign("want", sha256)
    s.raw('got=$(sha256sum "$tmp" | cut -d" " -f1)')
    s.raw('if [ "$got" != "$want" ]; then echo "sha256 mismatch: got $got, want $want" >&2; exit 3; fi')
    s.raw('chmod 0644 "$tmp"')
    s.raw(f'mv -f "$tmp" {quote(dest)}')
    return s.render()


class ModelArtifactProvider(HostProvider):
    VERSION = "1"
    REPLACE_ON = ("host", "dest")
    OUTPUT_ONLY = ("prior_existed", "found_sha256")

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        dest = news.get("dest", "")
        if not isinstance(dest, str) or not dest.startswith("/") or ".." in dest.split("/"):
            failures.append(CheckFailure("dest", f"must be an absolute path without '..': {dest!r}"))
        if (news.get("url") is None) == (news.get("path") is None):
            failures.append(CheckFailure("url", "set exactly one of url or path"))
        path = news.get("path")
        if path is not None:
            if not os.path.isfile(path):
                failures.append(CheckFailure("path", f"no such file here: {path}"))
            else:
                with open(path, "rb") as f:
                    got = hashlib.file_digest(f, "sha256").hexdigest()
                if got != news.get("sha256"):
                    failures.append(
                        CheckFailure("sha256", f"{path} has sha256 {got}, config says {news.get('sha256')}")
                    )
        return CheckResult(news, failures)

    def _deliver(self, conn, props: dict) -> None:
        data = None
        if props.get("path") is not None:
            with open(props["path"], "rb") as f:
                data = f.read()
        conn.run(fetch_script(props["dest"], props["sha256"], props.get("url")), input=data)

    def create(self, props: dict[str, Any]) -> CreateResult:
        conn = self.conn(props)
        dest = props["dest"]
        found = conn.run(sha_script(dest)).stdout.strip()
        if found != "absent":
            conn.run(sh("mkdir", "-p", PRIOR_DIR) + " && " + sh("cp", "-a", "--", dest, prior_path(dest)))
        if found != props["sha256"]:
            self._deliver(conn, props)
        return CreateResult(
            f"{self.spec(props).name}:{dest}", self.outputs(props, prior_existed=found != "absent", found_sha256=found)
        )

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        conn = self.conn(news)
        if conn.run(sha_script(news["dest"])).stdout.strip() != news["sha256"]:
            self._deliver(conn, news)
        return UpdateResult(
            self.outputs(news, prior_existed=olds.get("prior_existed"), found_sha256=olds.get("found_sha256"))
        )

    def read(self, id_: str, props: dict) -> ReadResult:
        now = self.conn(props).run(sha_script(props["dest"])).stdout.strip()
        return ReadResult(id_, {**props, "sha256": None if now == "absent" else now})

    def delete(self, _id: str, props: dict) -> None:
        dest = props["dest"]
        if props.get("prior_existed"):
            self.conn(props).run(sh("mv", "-f", "--", prior_path(dest), dest))
        else:
            self.conn(props).run(sh("rm", "-f", "--", dest))


class ModelArtifact(dynamic.Resource, module="serving", name="ModelArtifact"):
    def __init__(self, name: str, args: dict, opts: Optional[pulumi.ResourceOptions] = None):
        props: dict = {k: None for k in ModelArtifactProvider.OUTPUT_ONLY}
        props.update({"url": None, "path": None, **args, "version": ModelArtifactProvider.VERSION})
        super().__init__(ModelArtifactProvider(), name, props, opts)
