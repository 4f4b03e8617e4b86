"""pristine: what a host had before gpuhost touched it, kept on the host (the write side of every provider:
the record of originals, the host lock, atomic changes over stdin). `facts/` reads a host; this package records
and changes it.

    record.py   Record: the first-time record of files and runtime values, its layout and parsers
    lock.py     the host lock and its resource classes; `guarded`, one record-reread-change round trip
    change.py   Change: one mutating script with its stdin; `attempt`, which drops a failed try's records

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

from pristine.change import Attempt, Change, attempt, attempt_changed, changing, note_fresh, reset_changed
from pristine.lock import CLASSES, LOCK, LOCK_WAIT_S, STORE_LOCK, guarded, lock_file, locked, stale_read
from pristine.record import (
    BASE,
    ROOT,
    Record,
    fresh_entries,
    owner_of,
    parse_priors,
    parse_pristine,
    prune_lines,
    restore_from_store_lines,
)

__all__ = [
    "BASE",
    "CLASSES",
    "LOCK",
    "LOCK_WAIT_S",
    "ROOT",
    "STORE_LOCK",
    "Attempt",
    "Change",
    "Record",
    "attempt",
    "attempt_changed",
    "changing",
    "fresh_entries",
    "guarded",
    "lock_file",
    "locked",
    "note_fresh",
    "owner_of",
    "parse_priors",
    "parse_pristine",
    "prune_lines",
    "reset_changed",
    "restore_from_store_lines",
    "stale_read",
]
