"""A tenant VM's disk and cloud-init seed ISO: what LibvirtDomain found there, and what puts it back (pure).

LibvirtDomain records both paths on the host the first time (pristine/ `Record`): the seed ISO as a file
(content, mode, owner, or its absence), the disk only as `disk_stat` prints it (a disk is too big to copy; gpuhost
never writes into a disk it found, it only has to leave it as found: mode and owner, which libvirt's DAC labelling
changes while the VM runs). Facts in, actions out: `release_plan` is what delete (and a failed create) runs after
the domain is gone.

Usage::

    rec = Record(owner, files=[seed], values={disk_key(disk): disk_stat(disk)})
    found = parse_disk(values[disk_key(disk)])                  # DiskFound(exists=True, mode="640", uid=0, gid=4)
    p = release_plan(seed, seed_found, disk, found, delete_disk=not keep_disk)
    [a.why for a in p.actions]        # ["put the seed ISO path back as found (...)", "give the disk ... back ..."]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from access.shell import quote, sh
from facts.files import FileState
from plans.plan import Action, FileWrite, Plan, plan_of

# What the provider writes at the seed ISO path: libvirt's own default for a volume in a dir pool (root, 0600).
SEED_MODE = "0600"
SEED_OWNER = "0:0"
_STAT = re.compile(r"^([0-7]{3,4}) (\d+) (\d+)$")


def disk_key(path: str) -> str:
    """The Record value key of the disk at `path` (under the pristine store's runtime/)."""
    return f"libvirt-disk{path}"


def disk_stat(path: str) -> str:
    """Prints `<octal mode> <uid> <gid>` of the disk (a symlink followed: libvirt labels the image), or `absent`.
    Always exits 0: the record runs under `set -e`."""
    q = quote(path)
    return f"if [ -e {q} ]; then stat -L -c '%a %u %g' {q}; else echo absent; fi"


def disk_now(path: str) -> str:
    """Prints `@@disk-now present` or `@@disk-now absent` (whether the overlay is still to be made)."""
    return f"if [ -e {quote(path)} ]; then echo '@@disk-now present'; else echo '@@disk-now absent'; fi"


def parse_disk_now(out: str) -> bool:
    return "@@disk-now present" in out.splitlines()


@dataclass(frozen=True)
class DiskFound:
    exists: bool
    mode: str = ""
    uid: int = 0
    gid: int = 0


def parse_disk(value: Optional[str]) -> Optional[DiskFound]:
    """`disk_stat`'s output as recorded; None where nothing was recorded (no base image: gpuhost makes no disk)."""
    if value is None:
        return None
    if value.strip() == "absent":
        return DiskFound(exists=False)
    m = _STAT.match(value.strip())
    if not m:
        raise ValueError(f"not a recorded disk state: {value!r}")
    return DiskFound(exists=True, mode=m.group(1), uid=int(m.group(2)), gid=int(m.group(3)))


def release_plan(
    seed: Optional[str],
    seed_found: Optional[FileState],
    disk: Optional[str],
    disk_found: Optional[DiskFound],
    delete_disk: bool,
) -> Plan:
    """Put the seed ISO path back as it was found and leave the disk as found: remove only a disk gpuhost made,
    and only when `delete_disk`; a disk it found gets its mode and owner back (its content was never written)."""
    actions = []
    if seed and seed_found is not None:
        if not seed_found.exists:
            actions.append(Action(f"remove the seed ISO {seed} (the path was empty)", sh("rm", "-f", "--", seed)))
        elif seed_found.link is not None:
            actions.append(
                Action(f"put the symlink {seed} back as found", sh("ln", "-sfn", "-T", seed_found.link, seed))
            )
        else:
            mode, owner = (seed_found.mode or "644").zfill(4), f"{seed_found.uid}:{seed_found.gid}"
            actions.append(
                Action(
                    f"put the seed ISO path {seed} back as found ({len(seed_found.content)} bytes, {mode} {owner})",
                    write=FileWrite(seed, seed_found.content, mode, owner),
                )
            )
    if disk and disk_found is not None:
        if not disk_found.exists and delete_disk:
            actions.append(Action(f"remove the disk {disk} gpuhost made", sh("rm", "-f", "--", disk)))
        elif disk_found.exists:
            q, mode, owner = quote(disk), disk_found.mode.zfill(4), f"{disk_found.uid}:{disk_found.gid}"
            actions.append(
                Action(
                    f"give the disk {disk} it found its mode and owner back ({mode} {owner})",
                    # chown before chmod: chown clears set-id bits
                    f"if [ -e {q} ]; then {sh('chown', owner, disk)}; {sh('chmod', mode, disk)}; fi",
                )
            )
    return plan_of(actions, "nothing at the seed ISO or disk paths to put back (the disk gpuhost made is kept)")


__all__ = [
    "DiskFound",
    "SEED_MODE",
    "SEED_OWNER",
    "disk_key",
    "disk_now",
    "disk_stat",
    "parse_disk",
    "parse_disk_now",
    "release_plan",
]
