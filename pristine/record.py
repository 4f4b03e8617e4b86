"""The first-time record of what a resource is about to change: files (`cp -a` under ROOT/files<path>) and runtime
values (ROOT/runtime/<key>), each tagged with its owner; the store's layout, its pruning and the parsers of what a
record-and-read round trip prints. See the package docstring for the layout."""

from __future__ import annotations

import base64
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field

from access.errors import HostError
from access.shell import Script, quote
from facts.files import FileState

BASE = "/var/lib/gpuhost"  # everything gpuhost keeps on a host; removed when the last of it goes
ROOT = BASE + "/pristine"

# Shell functions (constant text): every value reaches them as a quoted argument.
_FUNCTIONS = r"""gp_new() {
  if [ -e "$1" ] || [ -L "$1" ] || [ -e "$1.absent" ]; then
    if [ -f "$1.owner" ] && [ "$(cut -f1 "$1.owner")" != "$2" ]; then
      printf '@@refused %s\t%s\n' "$3" "$(cat "$1.owner")"
    fi
    return 1
  fi
  # The owner tag first: it keeps its directories non-empty, so a forget pruning them under the host lock (this
  # read does not hold it) never removes one between the mkdir and the write; if it did, make them again.
  gp_i=0
  until { mkdir -p "$(dirname "$1")" && printf '%s\t%s\n' "$2" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$1.owner"; } 2>/dev/null; do
    gp_i=$((gp_i + 1)); [ "$gp_i" -lt 20 ] || { echo "gpuhost: cannot record $1" >&2; exit 75; }
  done
  printf '@@fresh %s\n' "$1"
  return 0
}
gp_show() {
  echo "@@pristine $2"
  if [ -L "$1" ]; then echo "LINK $(printf %s "$(readlink "$1")" | base64 -w0)";
  elif [ -f "$1" ]; then stat -c '%a %u %g' "$1"; base64 -w0 "$1"; echo;
  else echo ABSENT; fi
}
gp_record_file() {
  if gp_new "$ROOT/files$1" "$2" "$1"; then
    # copy to a temporary name first: a record cut short by a dropped connection is never taken as the original
    if [ -L "$1" ] || [ -f "$1" ]; then cp -a "$1" "$ROOT/files$1.tmp" && mv -f -T "$ROOT/files$1.tmp" "$ROOT/files$1";
    else : > "$ROOT/files$1.absent"; fi
  fi
  gp_show "$ROOT/files$1" "$1"
}"""


def _entry(key: str) -> str:
    return f"{ROOT}/runtime/{key}"


def owner_of(stack: str, resource: str) -> str:
    return f"{stack}/{resource}"


@dataclass
class Record:
    """The files and runtime values one resource is about to change, recorded on the host the first time.

    `values` maps a key ("sysctl/net.core.somaxconn", "pci/0000:65:00.0/driver") to the command (built with
    access.shell) that prints the value now; its output is what gets recorded.
    """

    owner: str
    files: list[str] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)

    def script(self, script: Script | None = None) -> Script:
        s = script or Script()
        s.assign("ROOT", ROOT).raw(_FUNCTIONS)
        for p in self.files:
            s.raw(f"gp_record_file {quote(p)} {quote(self.owner)}")
        for key, cmd in sorted(self.values.items()):
            e = quote(_entry(key))
            t = quote(_entry(key) + ".tmp")
            s.raw(
                f"if gp_new {e} {quote(self.owner)} {quote(key)}; then ( {cmd} ) > {t} 2>/dev/null; mv -f {t} {e}; fi"
            )
            s.raw(f"echo '@@prior' {quote(key)}; base64 -w0 {e}; echo")
        return s

    def parse(self, out: str, host: str = "") -> tuple[dict[str, FileState], dict[str, str]]:
        """({path: FileState as first found}, {key: value as first found}); refuses records of another owner."""
        refused = [ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("@@refused ")]
        if refused:
            what = "; ".join(
                f"{r.split(chr(9))[0]} was recorded by {r.split(chr(9))[1]} at {r.split(chr(9))[2]}"
                if r.count("\t") >= 2
                else r
                for r in refused
            )
            raise HostError(
                host,
                f"the pristine record of another owner is in the way: {what} (this is {self.owner})",
                fix="destroy that stack's resource first, or remove its record under "
                f"{ROOT} if it is stale and the file is as the distribution shipped it",
                changed=False,
            )
        return parse_pristine(out), parse_priors(out)

    def entries(self) -> list[str]:
        """The record entries of this record on the host (each with its `.owner`, `.absent`, `.tmp` siblings)."""
        return [ROOT + "/files" + p for p in self.files] + [_entry(key) for key in sorted(self.values)]

    def forget_lines(self) -> list[str]:
        """Remove the records, then the store's directories they leave empty (`prune_lines`)."""
        lines = []
        for p in self.files:
            c = ROOT + "/files" + p
            lines.append(f"rm -f -- {quote(c)} {quote(c + '.absent')} {quote(c + '.owner')}")
        for key in sorted(self.values):
            lines.append(f"rm -f -- {quote(_entry(key))} {quote(_entry(key) + '.owner')}")
        return lines + prune_lines(self.entries())


def restore_from_store_lines(path: str, found_absent: bool) -> list[str]:
    """Put back the store's own copy of ``path`` (content, mode, owner; a link as a link), or remove the file when
    it was absent: for a file whose content must never be carried in state (a key); ``Change.restore`` puts back
    what state holds. The store's layout is this module's (``files<path>``, ``files<path>.absent``)."""
    rec, q = quote(f"{ROOT}/files{path}"), quote(path)
    tmp = quote(path + ".gpuhost.restore")
    gone = f"[ -e {quote(f'{ROOT}/files{path}.absent')} ]" + (" || true" if found_absent else "")
    return [
        f"if [ -L {rec} ] || [ -f {rec} ]; then cp -a {rec} {tmp} && mv -f -T {tmp} {q};",
        f"elif {gone}; then rm -f -- {q}; fi",
    ]


def prune_lines(entries: Iterable[str]) -> list[str]:
    """After records are removed: the directories of the store that held them, deepest first, each removed only
    when empty, up to and including BASE (/var/lib/gpuhost) once nothing of gpuhost is left in it. A directory
    that still holds anything (another record, a file of someone else) stays, and so do all above it. Run under
    the host lock; a record being made meanwhile (not under the lock) re-makes its directories (`gp_new`)."""
    dirs: set[str] = set()
    for e in entries:
        d = posixpath.dirname(e)
        while d == BASE or d.startswith(BASE + "/"):
            dirs.add(d)
            d = posixpath.dirname(d)
    if not dirs:
        return []
    ordered = sorted(dirs, key=lambda d: (-d.count("/"), d))
    return [f"rmdir -- {' '.join(quote(d) for d in ordered)} 2>/dev/null || true"]


def fresh_entries(out: str) -> list[str]:
    """The record entries this round trip created (not found): what a failed attempt removes again."""
    return [ln[len("@@fresh ") :] for ln in out.splitlines() if ln.startswith("@@fresh ")]


def parse_pristine(out: str) -> dict[str, FileState]:
    res: dict[str, FileState] = {}
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("@@pristine "):
            continue
        path = line[len("@@pristine ") :]
        nxt = lines[i + 1] if i + 1 < len(lines) else "ABSENT"
        if nxt == "ABSENT":
            res[path] = FileState(path=path, exists=False)
        elif nxt.startswith("LINK "):
            res[path] = FileState(path=path, exists=True, link=base64.b64decode(nxt[5:]).decode())
        else:
            mode, uid, gid = nxt.split()
            content = lines[i + 2] if i + 2 < len(lines) else ""
            res[path] = FileState(path=path, exists=True, mode=mode, uid=int(uid), gid=int(gid), content_b64=content)
    return res


def parse_priors(out: str) -> dict[str, str]:
    res: dict[str, str] = {}
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("@@prior "):
            raw = lines[i + 1] if i + 1 < len(lines) else ""
            res[line[len("@@prior ") :]] = base64.b64decode(raw).decode(errors="replace").strip()
    return res
