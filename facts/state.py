"""What a host had before gpuhost touched it, kept on the host; atomic writes over stdin; the host lock.

Everything a provider changes is recorded on the host the first time, before the change, in the same round trip
that reads the facts, and tagged with the resource that recorded it. A later attempt (a re-run after the host
dropped the connection between the write and the result) finds the record and keeps it, so "before" is never a
half-applied state and `delete` restores the real original. Layout under ROOT (/var/lib/gpuhost/pristine):

    files<path>            the file as first found (`cp -a`: content, mode, owner; a symlink stays a symlink)
    files<path>.absent     the path did not exist
    runtime/<kind>/<key>   a runtime value as first found (a sysctl, a driver, a page count, an affinity, ...)
    <entry>.owner          "<stack>/<resource>" TAB "<UTC time>" of the resource that recorded it

A record owned by another stack or resource is never taken as the original: the read fails with the owner named.
Symlinks: a write replaces the link itself (its target is never touched) and restore puts the link back.

A create or update that fails before it changes anything (a refusal after reading the host: an unsafe device, a
missing tool) leaves no record behind: the records it made fresh are removed again (`attempt`). Otherwise they would
outlive the failed resource, which the engine never stores, and refuse the next owner of those paths.

Forgetting a record (on delete, or a failed attempt dropping its fresh ones) also removes the store's directories
it leaves empty, deepest first, up to and including /var/lib/gpuhost: after the last destroy nothing of gpuhost is
left on the host. A directory holding anything else (another record, a file that is not gpuhost's) stays.

Every mutating script runs under the host lock (`flock` on LOCK), so two runs, or two resources of one run, never
edit one host at the same time; who holds it is in LOCK.holder, and each hold is logged in LOCK.log ("<epoch> waiting|acquired|released
<holder>"; a "waiting" line only when the lock was taken and the script had to wait for it).

Usage::

    rec = Record(owner="prod/gpu-a-sysctls", files=[FILE], values={"sysctl/net.core.somaxconn": sh("sysctl", "-n", ...)})
    out = conn.run(rec.script().render() + facts_script(...)).stdout     # one round trip: record + read
    pristine, priors = rec.parse(out)                                      # {path: FileState}, {key: value}
    ch = Change("prod/gpu-a-sysctls"); ch.write(FILE, b"...", "0644", "0:0"); ch.run(conn)
    ch = Change(owner); ch.restore(pristine); ch.forget(rec); ch.run(conn)                   # on delete
"""

from __future__ import annotations

import base64
import posixpath
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from access.errors import HostError
from access.shell import Script, quote
from facts.files import FileState

BASE = "/var/lib/gpuhost"  # everything gpuhost keeps on a host; removed when the last of it goes
ROOT = BASE + "/pristine"
LOCK = "/run/gpuhost.lock"
LOCK_WAIT_S = 900

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


@dataclass
class Attempt:
    """One create or update: the records it made fresh (per connection and owner) and whether it began to change
    the host. Used through `attempt()`; `Change.run` (and any other change) calls `changing()`."""

    fresh: list[tuple[Any, str, list[str]]] = field(default_factory=list)
    changed: bool = False

    def drop_fresh(self) -> None:
        """Best effort: the host may be gone, and then the records stay (a re-run finds and keeps them)."""
        for conn, owner, entries in self.fresh:
            names = " ".join(quote(e + sfx) for e in entries for sfx in ("", ".owner", ".absent", ".tmp"))
            script = "\n".join([f"rm -f -- {names}", *prune_lines(entries)])
            try:
                conn.run(locked(script, owner), timeout=60)
            except Exception:  # noqa: BLE001 - the attempt's own error is what the user needs to see
                pass


_ATTEMPT: ContextVar[Attempt | None] = ContextVar("gpuhost_attempt", default=None)


@contextmanager
def attempt() -> Iterator[Attempt]:
    """Around a provider's create/update: if it fails before any change, the records it made fresh are dropped."""
    a = Attempt()
    token = _ATTEMPT.set(a)
    try:
        yield a
    except BaseException:
        if not a.changed:
            a.drop_fresh()
        raise
    finally:
        _ATTEMPT.reset(token)


def note_fresh(conn: Any, owner: str, out: str) -> None:
    """Remember the records a record-and-read round trip (its output `out`) created, for the current attempt."""
    a, entries = _ATTEMPT.get(), fresh_entries(out)
    if a is not None and entries:
        a.fresh.append((conn, owner, entries))


def changing() -> None:
    """The current attempt is about to change the host: its records describe the original now, keep them."""
    a = _ATTEMPT.get()
    if a is not None:
        a.changed = True


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


# Resource classes: changes that name theirs take the host lock shared and their class's lock exclusively, so
# changes of different classes run side by side and two of one class (or any change naming none) never do.
# What truly conflicts on a host: two writers of one file, the boot loader config and the initramfs (update-grub,
# grubby, update-initramfs, dracut, and tuned profiles with a [bootloader] section: "boot"), the runtime sysctls
# (systemd-sysctl, `sysctl -w`, tuned's [sysctl]: "sysctl"), the PCI drivers of the passthrough devices ("vfio"),
# the hugepage pools ("hugepages"). A change that names no class (a delete, a package install, anything else) takes
# the host lock exclusively: it runs alone, as before.
CLASSES = ("boot", "hugepages", "sysctl", "vfio")
STORE_LOCK = LOCK + ".store"  # the pristine store's own updates (record, forget): short, taken inside the others


def lock_file(cls: str) -> str:
    return f"{LOCK}.{cls}"


def locked(script: str, holder: str, classes: Iterable[str] = ()) -> str:
    """`script` run under the host lock; a second run waits (and says for whom) instead of interleaving.

    `classes`: the resource classes the script changes (CLASSES); it then takes the host lock shared and each
    class's lock exclusively (in CLASSES order, so two scripts never wait on each other in a circle). The lock log
    line then ends with the classes ("<epoch> acquired <holder> boot+vfio")."""
    q, h = quote(LOCK), quote(holder)
    cls = [c for c in CLASSES if c in set(classes)]
    unknown = set(classes) - set(CLASSES)
    if unknown:
        raise ValueError(f"unknown lock classes {sorted(unknown)}; known: {', '.join(CLASSES)}")
    tag = f" {'+'.join(cls)}" if cls else ""
    fds = [(9, LOCK, "-s " if cls else "", "the host lock")] + [
        (8 - i, lock_file(c), "", f"the host lock for {c}") for i, c in enumerate(cls)
    ]
    lines = []
    for fd, path, mode, what in fds:
        qp = quote(path)
        lines.append(
            f"exec {fd}>>{qp}\n"
            f'if ! flock -n {mode}{fd}; then echo "gpuhost: waiting for {what} held by $(cat {qp}.holder 2>/dev/null)" >&2; '
            f'[ -n "$gp_waited" ] || printf \'%s waiting %s\\n\' "$(date +%s.%N)" {h}{quote(tag) if tag else ""} >> {q}.log; gp_waited=1; '
            f"flock -w {LOCK_WAIT_S} {mode}{fd} || {{ echo 'gpuhost: {what} was not released in {LOCK_WAIT_S} s' >&2; exit 75; }}; fi"
        )
    for _, path, _, _ in fds:
        lines.append(f"printf '%s\\n' {h} > {quote(path)}.holder")
    closes = " ".join(f"{fd}>&-" for fd, _, _, _ in fds)
    t = quote(tag) if tag else ""
    return (
        "gp_waited=\n"
        + "\n".join(lines)
        + "\n"
        + f"printf '%s acquired %s\\n' \"$(date +%s.%N)\" {h}{t} >> {q}.log\n"
        + f"( {script}\n) {closes}\nrc=$?\n"
        + f"printf '%s released %s\\n' \"$(date +%s.%N)\" {h}{t} >> {q}.log\n"
        + "exit $rc\n"
    )


def guarded(rec: Record, read: str, expected_sha256: str | None, change_script: str) -> str:
    """One round trip, run under the change's locks: `rec` recorded (first time only; under STORE_LOCK), then the
    `read` run again and compared with what the plan was made from (sha256 of its output), then the change.

    If another owner's record is in the way, or the read differs (the host moved since it was read, or there was
    no earlier read: `expected_sha256` None), nothing is changed: the output says `@@unchanged` or `@@stale
    <the read's output, base64>`, so the caller plans again from that and sends the change once more. The change
    runs only after `@@changing` is printed. Nothing here reads the change's stdin."""
    want = quote(expected_sha256 or "-")
    return (
        f"gp_rec=$( ( flock -w {LOCK_WAIT_S} 6 || exit 75\n{rec.script().render()}\n) 6>>{quote(STORE_LOCK)} </dev/null ) "
        "|| { echo 'gpuhost: the pristine store lock was not released' >&2; exit 75; }\n"
        "printf '%s\\n' \"$gp_rec\"\n"
        'case "$gp_rec" in *"@@refused "*) echo "@@unchanged refused"; exit 0;; esac\n'
        "gp_read=$(mktemp)\n"
        f'( {read}\n) </dev/null >"$gp_read" 2>/dev/null\n'
        f'if [ "$(sha256sum < "$gp_read" | cut -c1-64)" != {want} ]; then '
        'printf \'@@stale \'; base64 -w0 "$gp_read"; echo; rm -f "$gp_read"; exit 0; fi\n'
        'rm -f "$gp_read"\n'
        "echo @@changing\n" + change_script
    )


def stale_read(out: str) -> bytes | None:
    """The fresh read a `guarded` round trip printed instead of changing (None: it changed, or was refused)."""
    for ln in out.splitlines():
        if ln.startswith("@@stale "):
            return base64.b64decode(ln[len("@@stale ") :])
    return None


def attempt_changed() -> bool:
    a = _ATTEMPT.get()
    return bool(a and a.changed)


def reset_changed(was: bool) -> None:
    """A `guarded` round trip that reported it changed nothing: the attempt is as unchanged as before it."""
    a = _ATTEMPT.get()
    if a is not None:
        a.changed = was


@dataclass
class Change:
    """One mutating script with its stdin: file contents travel over stdin (never in argv), run under the lock."""

    owner: str
    script: Script = field(default_factory=lambda: Script().raw("set -e"))
    stdin: bytearray = field(default_factory=bytearray)
    last_stdout: str = ""
    # The resource classes it changes (see `locked`); none: it takes the host lock exclusively.
    classes: tuple[str, ...] = ()
    why: str = ""  # what it does, for an error message

    def write(self, path: str, content: bytes, mode: str = "0644", owner: str = "0:0") -> Change:
        """Atomic: a temp file in the same directory, fsync, rename over the path (a symlink is replaced, not
        followed)."""
        self.stdin += content
        self.script.extend(
            [
                f"tmp=$(mktemp {quote(path + '.gpuhost.XXXXXX')})",
                f'head -c {len(content)} > "$tmp"',
                f'chmod {quote(mode)} "$tmp"',
                f'chown {quote(owner)} "$tmp"',
                'sync "$tmp"',
                f'mv -f -T "$tmp" {quote(path)}',
            ]
        )
        return self

    def remove(self, path: str) -> Change:
        self.script.raw(f"rm -f -- {quote(path)}")
        return self

    def restore(self, prior: dict[str, FileState]) -> Change:
        """Put every recorded file back exactly: content, mode and owner, a symlink as a symlink, or absence."""
        for path, st in sorted(prior.items()):
            if not st.exists:
                self.remove(path)
            elif st.link is not None:
                self.script.raw(f"ln -sfn -T {quote(st.link)} {quote(path)}")
            else:
                self.write(path, st.content, (st.mode or "644").zfill(4), f"{st.uid}:{st.gid}")
        return self

    def forget(self, record: Record) -> Change:
        self.script.extend(record.forget_lines())
        return self

    def add(self, lines: Iterable[str]) -> Change:
        self.script.extend(lines)
        return self

    @property
    def empty(self) -> bool:
        return len(self.script.lines) <= 1 and not self.stdin

    def render(self) -> str:
        return locked(self.script.render(), self.owner, self.classes)

    def run(self, conn):
        changing()
        res = conn.run(self.render(), input=bytes(self.stdin))
        self.last_stdout = res.stdout
        return res
