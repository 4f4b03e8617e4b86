"""Changes: one mutating script with its stdin, run under the host lock (`Change`), and the attempt around a
provider's create/update that drops the records a failed try made fresh (`attempt`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from access.shell import Script, quote
from facts.files import FileState
from pristine.lock import locked
from pristine.record import Record, fresh_entries, prune_lines


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
