"""ManagedFile: a whole file gpuhost owns on a host (modprobe.d, modules-load.d, sysctl.d, udev rules ...).

Create records what was there (content, mode, owner, or absence) and writes the wanted file atomically; delete puts
back exactly what create found, byte for byte, or removes the file if there was none. Read returns the file as it
is now, so `pulumi refresh` shows a hand edit as drift.

Missing parent directories are made, top down, each ``0755 root:root`` whatever the file's own mode and owner (what
``mkdir -p`` as root with the usual umask gives: listable, only root writes). Which of them were missing is recorded
on the host with the file, the first time (pristine/), so a re-run after a dropped connection still knows;
the ``made_dirs`` output shows them. Delete puts the file back first, then removes those directories, deepest first
and only when empty: one another file still lives in stays (also when that file belongs to another ManagedFile that
was created later: its own record says the directory existed, so it is not removed after that one goes either).
A parent that exists but is not a directory is refused before anything changes.

Usage::

    ManagedFile("gpu-a-vfio-modules", {"host": host_input(spec), "path": "/etc/modules-load.d/vfio.conf",
                "content": "vfio\\nvfio_pci\\n", "mode": "0644", "owner": "root:root"})
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional

import pulumi
from pulumi.dynamic import CheckFailure

from access.errors import HostError
from access.shell import quote
from facts.files import FileState, files_script, parse_files
from pristine import Change, Record
from providers.base import HostResource, TemplateProvider

DIR_MODE = "0755"  # directories ManagedFile makes, root:root


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def parent_dirs(path: str) -> list[str]:
    """Every directory above `path` except /, top down: /etc/a/b/f -> [/etc, /etc/a, /etc/a/b]."""
    parts = [p for p in path.split("/") if p][:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def dirs_key(path: str, kind: str = "managed-file") -> str:
    """The record (pristine/ runtime value) of which of `path`'s parents were missing; one per file, so two
    ManagedFiles in one directory never share (and so never refuse) a record. `kind`: another provider that makes
    the parents of the files it writes the same way (MonitoringFiles) keeps its records apart."""
    return f"{kind}{path}/missing-dirs"


def missing_dirs_command(path: str) -> str:
    """Prints the parents of `path` that do not exist, one a line, top down (recorded the first time)."""
    return "; ".join(f"[ -e {quote(d)} ] || [ -L {quote(d)} ] || echo {quote(d)}" for d in parent_dirs(path)) or "true"


def not_dirs_guard(path: str) -> str:
    """Prints `@@notdir <d>` for each parent of `path` that exists and is not a directory, and then ends the script
    (before anything is recorded) if there was one."""
    lines = [
        f"if {{ [ -e {quote(d)} ] || [ -L {quote(d)} ]; }} && [ ! -d {quote(d)} ]; then echo '@@notdir' {quote(d)}; "
        "gp_notdir=1; fi"
        for d in parent_dirs(path)
    ]
    return "\n".join(["gp_notdir=", *lines, 'if [ -n "$gp_notdir" ]; then exit 0; fi', ""])


def parse_not_dirs(out: str) -> list[str]:
    return [ln[len("@@notdir ") :] for ln in out.splitlines() if ln.startswith("@@notdir ")]


def parse_missing(value: str, path: str) -> list[str]:
    """The recorded value as a list, kept only where it names a parent of `path` (top down)."""
    wanted = set(parent_dirs(path))
    return [d for d in value.splitlines() if d in wanted]


def record_file_and_parents(provider: Any, conn: Any, props: dict, rec: Any, path: str, key: str) -> tuple[Any, list]:
    """One round trip for a provider that writes ``path``: its parents checked first (a file in the way ends it
    before anything is recorded: HostError, nothing changed), then the record (first time only) and its read.
    Returns the file as first found and the parent directories that were missing (recorded under ``key``)."""
    out, pristine, values = provider.record_and_read(conn, props, rec, "", before=not_dirs_guard(path))
    blocked = parse_not_dirs(out)
    if blocked:
        raise HostError(
            conn.spec.name,
            f"cannot write {path}: {', '.join(blocked)} exists and is not a directory",
            fix=f"move it away, or choose another path than {path}",
            changed=False,
        )
    return pristine[path], parse_missing(values.get(key, ""), path)


def make_dirs_lines(dirs: list[str]) -> list[str]:
    """Make each directory (top down) that does not exist yet, 0755 root:root."""
    return [f"[ -d {quote(d)} ] || {{ mkdir -m {DIR_MODE} -- {quote(d)} && chown 0:0 -- {quote(d)}; }}" for d in dirs]


def remove_dirs_lines(dirs: list[str]) -> list[str]:
    """Remove each directory deepest first, only when empty (anything else in it, and so the directory, stays)."""
    return [f"rmdir -- {quote(d)} 2>/dev/null || true" for d in sorted(dirs, key=lambda d: -d.count("/"))]


class ManagedFileProvider(TemplateProvider):
    VERSION = "4"  # 2: on the template; 3: makes (and removes) missing parent directories; 4: shared helper
    KIND = "file"
    # Another path is another file: the old one goes back as found, the new one is recorded first.
    REPLACE_ON = ("host", "path")
    INPUTS = ("host", "path", "content", "mode", "owner")
    OUTPUT_ONLY = ("prior", "sha256", "made_dirs")

    @classmethod
    def writes(cls, inputs: dict) -> list:
        return [inputs["path"]]

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
        path = props["path"]
        return Record(self.owner(props), files=[path], values={dirs_key(path): missing_dirs_command(path)})

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        """Record the file and its missing parents as first found (on the host, first time only), then make the
        parents and write the file under the host lock."""
        conn = self.conn(props)
        path = props["path"]
        found, made = record_file_and_parents(self, conn, props, self._record(props), path, dirs_key(path))
        # Mode and owner not given: keep what the file had (a new file gets 0644 root:root).
        mode = props.get("mode") or (found.mode.zfill(4) if found.exists and found.mode else "0644")
        owner = props.get("owner") or (f"{found.uid}:{found.gid}" if found.exists and found.uid is not None else "0:0")
        ch = Change(self.owner(props)).add(make_dirs_lines(made)).write(path, props["content"].encode(), mode, owner)
        self.guarded(conn, f"writing {path}", lambda: ch.run(conn), changing=True)
        return {"prior": found.model_dump(), "sha256": sha256(props["content"]), "made_dirs": made}

    def observe(self, props: dict) -> dict:
        now = parse_files(self.conn(props).run(files_script([props["path"]]).render()).stdout)[props["path"]]
        content = now.text if now.exists else None
        out = {"content": content, "sha256": sha256(content) if content is not None else None}
        if now.exists and props.get("mode"):
            assert now.mode is not None  # files_script reports the mode of a file that exists
            out["mode"] = now.mode.zfill(4)
        return out

    def restore(self, props: dict) -> Change:
        prior = FileState.model_validate(props["prior"])
        ch = Change(self.owner(props)).restore({props["path"]: prior})
        # After the file: a directory it made is empty again unless something else lives there now.
        return ch.add(remove_dirs_lines(list(props.get("made_dirs") or []))).forget(self._record(props))


class ManagedFile(HostResource, module="host", name="ManagedFile"):
    path: pulumi.Output[str]
    sha256: pulumi.Output[str]
    made_dirs: pulumi.Output[list]

    PROVIDER = ManagedFileProvider
