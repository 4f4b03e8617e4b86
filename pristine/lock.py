"""The host lock (`flock` on LOCK, holder and log beside it) and its resource classes, and `guarded`: record, read
again, compare, change, in one round trip under the change's locks."""

from __future__ import annotations

import base64
from collections.abc import Iterable

from access.shell import quote
from pristine.record import Record

LOCK = "/run/gpuhost.lock"
LOCK_WAIT_S = 900

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
