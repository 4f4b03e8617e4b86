"""File state (content, mode, owner, or absence) of several paths in one round trip, for byte-exact restore.

Usage::

    states = read_files(conn, ["/etc/default/grub", "/etc/modprobe.d/vfio.conf"])
    states["/etc/modprobe.d/vfio.conf"]      # FileState(exists=False) when absent
"""

from __future__ import annotations

import base64
from typing import Iterable, Optional

from pydantic import BaseModel

from access.shell import Script, quote


class FileState(BaseModel):
    path: str
    exists: bool
    mode: Optional[str] = None  # octal string, e.g. "644"
    uid: Optional[int] = None
    gid: Optional[int] = None
    content_b64: Optional[str] = None
    link: Optional[str] = None  # a symlink's target (pristine copies only): restored as a link, never followed

    @property
    def content(self) -> bytes:
        return base64.b64decode(self.content_b64 or "")

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")


def files_script(paths: Iterable[str], script: Optional[Script] = None, section: str = "file") -> Script:
    s = script or Script()
    for p in paths:
        q = quote(p)
        s.raw(f"echo '@@{section}' {q}")
        s.raw(f"if [ -f {q} ]; then stat -c '%a %u %g' {q}; base64 -w0 {q}; echo; else echo ABSENT; fi")
    return s


def parse_files(text: str, section: str = "file") -> dict[str, FileState]:
    out: dict[str, FileState] = {}
    marker = f"@@{section} "
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(marker):
            path = line[len(marker) :]
            nxt = lines[i + 1] if i + 1 < len(lines) else "ABSENT"
            if nxt == "ABSENT":
                out[path] = FileState(path=path, exists=False)
                i += 2
                continue
            mode, uid, gid = nxt.split()
            content = lines[i + 2] if i + 2 < len(lines) else ""
            out[path] = FileState(path=path, exists=True, mode=mode, uid=int(uid), gid=int(gid), content_b64=content)
            i += 3
            continue
        i += 1
    return out


def read_files(conn, paths: list[str]) -> dict[str, FileState]:
    from access.shell import Script  # noqa: F401  (kept local to show the single round trip)

    return parse_files(conn.run(files_script(paths).render()).stdout)
