"""ModelArtifact: a model file on the guest (an ONNX export, a python backend's model.py), verified by sha256.

The file comes from `url` (fetched on the guest with curl or wget) or from `path` on the machine running Pulumi
(streamed over SSH). It lands in a temporary file next to `dest`, and only a matching sha256 moves it into place: a
wrong download fails `up` naming both hashes and leaves what was there. Create keeps what `dest` held before
(under /var/lib/gpuhost/pristine/artifacts), and which of `dest`'s parent directories were missing (the fetch makes
them); delete puts that back byte for byte, or removes the file when there was none, then removes those directories
(deepest first, only when empty) and the store's directories the record leaves empty. Read returns the sha256 on
the guest, so a hand-replaced model shows as drift.

Usage::

    ModelArtifact("yolo-rt-yolov8n-artifact", {"host": host_input(guest), "dest": "/srv/onnx/yolov8n.onnx",
                  "sha256": "3f1c…", "url": "https://models.example/yolov8n.onnx"})
"""

from __future__ import annotations

import hashlib
import os
from typing import Optional

from pulumi.dynamic import CheckFailure

from access.shell import Script, quote, sh
from pristine import Change, prune_lines
from providers.base import HostResource, TemplateProvider
from providers.managed_file import missing_dirs_command

PRIOR_DIR = "/var/lib/gpuhost/pristine/artifacts"


def prior_path(dest: str) -> str:
    return f"{PRIOR_DIR}/{hashlib.sha256(dest.encode()).hexdigest()[:16]}"


def sha_script(dest: str) -> str:
    return f"if [ -f {quote(dest)} ]; then sha256sum {quote(dest)} | cut -d' ' -f1; else echo absent; fi"


def record_script(dest: str) -> str:
    """What `dest` held, kept aside the first time only (a re-run after a dropped connection keeps the real
    original); prints `existed` or `absent` for it, the sha256 of that original (the kept copy; `absent`), then the
    sha256 now. The file is copied, not listed: a model is too big to travel back in the output."""
    kept = prior_path(dest)
    s = Script().add("mkdir", "-p", PRIOR_DIR)
    s.raw(f"if [ ! -e {quote(kept)} ] && [ ! -e {quote(kept + '.absent')} ]; then")
    s.raw(f"  {{ {missing_dirs_command(dest)}; }} > {quote(kept + '.dirs')}")
    s.raw(
        f"  if [ -f {quote(dest)} ]; then cp -a -- {quote(dest)} {quote(kept + '.tmp')} && mv -f {quote(kept + '.tmp')} {quote(kept)};"
    )
    s.raw(f"  else : > {quote(kept + '.absent')}; fi")
    s.raw("fi")
    s.raw(f"if [ -e {quote(kept)} ]; then echo existed; else echo absent; fi")
    return s.raw(sha_script(kept)).raw(sha_script(dest)).render()


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


class ModelArtifactProvider(TemplateProvider):
    # 2: on the template; what dest held is kept on the host the first time only; 3: dest's parent directories it
    # made removed on delete
    VERSION = "3"
    KIND = "artifact"
    # Another dest is another file: the old one goes back as found.
    REPLACE_ON = ("host", "dest")
    INPUTS = ("host", "dest", "sha256", "url", "path")
    OUTPUT_ONLY = ("prior_existed", "found_sha256")

    @classmethod
    def writes(cls, inputs: dict) -> list:
        return [inputs["dest"]]

    PATHS = ("dest",)

    def validate(self, news: dict) -> list[CheckFailure]:
        failures = []
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
        return failures

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        conn, dest = self.conn(props), props["dest"]
        ch = Change(self.owner(props)).add([record_script(dest)])
        self.guarded(conn, f"keeping what {dest} held", lambda: ch.run(conn), changing=True)
        # `found`: what dest held when first recorded (a re-run after a dropped connection finds the new model).
        existed, found, now = ch.last_stdout.split()[-3:]
        if now != props["sha256"]:
            get = Change(self.owner(props)).add([fetch_script(dest, props["sha256"], props.get("url"))])
            if props.get("path") is not None:
                with open(props["path"], "rb") as f:
                    get.stdin += f.read()
            self.guarded(conn, f"fetching {dest}", lambda: get.run(conn), changing=True)
        old = prior or {}
        return {
            "prior_existed": old.get("prior_existed") if prior else existed == "existed",
            "found_sha256": old.get("found_sha256") if prior else found,
        }

    def observe(self, props: dict) -> dict:
        now = self.conn(props).run(sha_script(props["dest"])).stdout.strip()
        return {"sha256": None if now == "absent" else now}

    def restore(self, props: dict) -> Change:
        dest, kept = props["dest"], prior_path(props["dest"])
        put_back = sh("mv", "-f", "--", kept, dest) if props.get("prior_existed") else sh("rm", "-f", "--", dest)
        # the directories the fetch made for dest, deepest first (a path's ancestors in reverse order), when empty
        made = (
            f'sort -r {quote(kept + ".dirs")} 2>/dev/null | while read -r d; do rmdir -- "$d" 2>/dev/null || true; done'
        )
        forget = sh("rm", "-f", "--", kept, kept + ".absent", kept + ".dirs")
        return Change(self.owner(props)).add([put_back, made, forget, *prune_lines([kept])])


class ModelArtifact(HostResource, module="serving", name="ModelArtifact"):
    PROVIDER = ModelArtifactProvider
    DEFAULTS = {"url": None, "path": None}
