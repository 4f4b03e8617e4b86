"""TritonControlKey: the host's Triton control key, generated on the host and never known to Pulumi.

Triton's model-repository, shared-memory, logging and trace APIs answer only requests that carry this key
(plans/triton_runtime.py: ``--http-restricted-api`` / ``--grpc-restricted-protocol``). The key file
(``KEY_VAR=<64 hex digits>``, root 0600) is made on the host from /dev/urandom when it is missing or not a key file,
and kept as it is otherwise (a re-run, another TritonService on the machine); Triton's unit reads it as its
``EnvironmentFile``, the Docker runtime mounts it, the operator's ``reload-triton-window`` (run as root) sends it.
Its content never leaves the host: no input, output or state holds it or its hash.

Rollback as ManagedFile's, byte for byte: the first create records the path as found (file, link or absence) and
its missing parent directories in the pristine store; delete puts the recorded original back from that host-side
copy (so a key or any other file that was there is not carried through the state either), then removes the
directories it made when empty. ``read`` reports the file's mode (None when missing or not a key file), so a
removed or broken key shows as drift and the next ``up`` makes a new one.

Usage::

    TritonControlKey("gpu-a-serving-control-key", {"host": host_input(spec), "path": CONTROL_KEY_PATH,
                     "mode": "0600"})
"""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure

from access.shell import quote
from plans.triton_runtime import KEY_VAR
from pristine import Change, Record, restore_from_store_lines
from providers.base import HostResource, TemplateProvider
from providers.managed_file import (
    dirs_key,
    make_dirs_lines,
    missing_dirs_command,
    record_file_and_parents,
    remove_dirs_lines,
)

_KEY_LINE = f"{KEY_VAR}=[0-9a-f]{{64}}"


def generate_lines(path: str) -> list[str]:
    """Keep a key file that is one (a regular file with one key line), else write a new key atomically; then
    root 0600 either way. The key is made and written on the host only (never in the script's text or stdin)."""
    q = quote(path)
    return [
        f"if [ -L {q} ] || [ ! -f {q} ] || [ \"$(grep -cxE '{_KEY_LINE}' {q})\" != 1 ]; then",
        f"  tmp=$(mktemp {quote(path + '.gpuhost.XXXXXX')})",
        f"  printf '{KEY_VAR}=%s\\n' \"$(od -An -N32 -tx1 /dev/urandom | tr -d ' \\n')\" > \"$tmp\"",
        '  chmod 0600 "$tmp"; chown 0:0 "$tmp"; sync "$tmp"',
        f'  mv -f -T "$tmp" {q}',
        "fi",
        f"chmod 0600 {q}; chown 0:0 {q}",
        f"stat -c 'gpuhost-key-stamp %i:%Y' {q}",
    ]


def parse_stamp(stdout: str) -> str:
    """The key file's identity (inode and mtime: a new key is a new file) from the script's output; '' if none.
    Not secret, and it changes exactly when the key does: Triton's restart trigger follows it."""
    for line in stdout.splitlines():
        if line.startswith("gpuhost-key-stamp "):
            return line.split(" ", 1)[1].strip()
    return ""


def observe_script(path: str) -> str:
    """Prints the key file's mode when it is a key file (regular, root-owned, one key line), else nothing."""
    q = quote(path)
    return (
        f'if [ ! -L {q} ] && [ -f {q} ] && [ "$(stat -c %u {q})" = 0 ] && '
        f"[ \"$(grep -cxE '{_KEY_LINE}' {q})\" = 1 ]; then stat -c '%a gpuhost-key-stamp %i:%Y' {q}; fi"
    )


class TritonControlKeyProvider(TemplateProvider):
    VERSION = "4"
    KIND = "control-key"
    # Another path is another file: the old one goes back as found, the new one is recorded first.
    REPLACE_ON = ("host", "path")
    INPUTS = ("host", "path", "mode")
    OUTPUT_ONLY = ("found", "made_dirs", "stamp")
    PATHS = ("path",)

    def validate(self, news: dict) -> list[CheckFailure]:
        if news.get("mode") != "0600":
            return [CheckFailure("mode", f"the control key is root's alone: '0600', not {news.get('mode')!r}")]
        return []

    def _record(self, props: dict) -> Record:
        path = props["path"]
        return Record(
            self.owner(props), files=[path], values={dirs_key(path, "control-key"): missing_dirs_command(path)}
        )

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        conn = self.conn(props)
        path = props["path"]
        key = dirs_key(path, "control-key")
        found, made = record_file_and_parents(self, conn, props, self._record(props), path, key)
        ch = Change(self.owner(props)).add(make_dirs_lines(made)).add(generate_lines(path))
        res = self.guarded(conn, f"writing {path}", lambda: ch.run(conn), changing=True)
        # What was found, without its content (that stays in the host's pristine store).
        kind = "absent" if not found.exists else "link" if found.link is not None else "file"
        return {"found": kind, "made_dirs": made, "stamp": parse_stamp(res.stdout)}

    def observe(self, props: dict) -> dict:
        out = self.conn(props).run(observe_script(props["path"])).stdout.strip()
        mode = out.split(" ", 1)[0] if out else ""
        return {
            "mode": mode.zfill(4) if mode else None,
            "stamp": parse_stamp(out.replace(" gpuhost-key", "\ngpuhost-key")),
        }

    def restore(self, props: dict) -> Change:
        ch = Change(self.owner(props)).add(restore_from_store_lines(props["path"], props.get("found") == "absent"))
        return ch.add(remove_dirs_lines(list(props.get("made_dirs") or []))).forget(self._record(props))


class TritonControlKey(HostResource, module="serving", name="TritonControlKey"):
    found: pulumi.Output[str]
    made_dirs: pulumi.Output[list]
    stamp: pulumi.Output[str]

    PROVIDER = TritonControlKeyProvider
