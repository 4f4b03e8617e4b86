"""plans/vm_storage.py: a VM's seed ISO path and disk as found, and what puts them back (facts in, actions out).

The commands run in a real local shell on temporary files (the same POSIX sh and coreutils as on a host).
"""

from __future__ import annotations

import base64
import os
import subprocess

import pytest

from access.shell import sh
from facts.files import FileState
from plans.vm_storage import DiskFound, disk_now, disk_stat, parse_disk, parse_disk_now, release_plan

SEED, DISK = "/var/lib/libvirt/images/t-seed.iso", "/var/lib/libvirt/images/t.qcow2"


def run(cmd: str) -> str:
    return subprocess.run(["sh", "-c", cmd], check=True, capture_output=True, text=True).stdout


def test_disk_stat_prints_mode_and_owner_or_absent_and_follows_a_link(tmp_path):
    disk = tmp_path / "a disk's 'name'.qcow2"
    assert run(disk_stat(str(disk))).strip() == "absent"
    assert not parse_disk_now(run(disk_now(str(disk))))
    disk.write_bytes(b"QFI\xfb")
    os.chmod(disk, 0o640)
    want = f"640 {os.getuid()} {os.getgid()}"
    assert run(disk_stat(str(disk))).strip() == want
    assert parse_disk_now(run(disk_now(str(disk))))
    link = tmp_path / "link.qcow2"
    link.symlink_to(disk)
    assert run(disk_stat(str(link))).strip() == want


@pytest.mark.parametrize(
    "value, found",
    [
        (None, None),
        ("absent", DiskFound(exists=False)),
        ("640 0 4", DiskFound(exists=True, mode="640", uid=0, gid=4)),
        ("4755 1000 1000\n", DiskFound(exists=True, mode="4755", uid=1000, gid=1000)),
    ],
)
def test_parse_disk(value, found):
    assert parse_disk(value) == found


@pytest.mark.parametrize("value", ["", "640 0", "rw-r----- 0 4", "stat: cannot stat"])
def test_parse_disk_refuses_what_disk_stat_never_prints(value):
    with pytest.raises(ValueError, match="not a recorded disk state"):
        parse_disk(value)


def test_a_found_seed_file_is_written_back_with_its_content_mode_and_owner():
    found = FileState(path=SEED, exists=True, mode="640", uid=0, gid=4, content_b64=base64.b64encode(b"ops\n").decode())
    (a,) = release_plan(SEED, found, None, None, delete_disk=True).actions
    assert a.write is not None and (a.write.path, a.write.content, a.write.mode, a.write.owner) == (
        SEED,
        b"ops\n",
        "0640",
        "0:4",
    )
    assert not a.command


def test_an_empty_seed_path_is_emptied_and_a_link_comes_back_as_a_link():
    (a,) = release_plan(SEED, FileState(path=SEED, exists=False), None, None, delete_disk=False).actions
    assert a.command == sh("rm", "-f", "--", SEED) and a.write is None
    (a,) = release_plan(SEED, FileState(path=SEED, exists=True, link="../x y.iso"), None, None, False).actions
    assert a.command == sh("ln", "-sfn", "-T", "../x y.iso", SEED)


@pytest.mark.parametrize("delete_disk", [True, False])
def test_a_disk_that_was_there_is_never_removed_only_given_its_mode_and_owner_back(delete_disk):
    (a,) = release_plan(None, None, DISK, DiskFound(True, "640", 0, 4), delete_disk).actions
    assert "rm" not in a.command.split()
    assert sh("chown", "0:4", DISK) in a.command and sh("chmod", "0640", DISK) in a.command


def test_a_disk_gpuhost_made_goes_only_when_asked():
    (a,) = release_plan(None, None, DISK, DiskFound(exists=False), delete_disk=True).actions
    assert a.command == sh("rm", "-f", "--", DISK)
    kept = release_plan(None, None, DISK, DiskFound(exists=False), delete_disk=False)
    assert kept.noop and "kept" in kept.noop_reason
    assert release_plan(None, None, DISK, None, delete_disk=True).noop  # no base image: gpuhost made no disk


def test_the_disk_restore_runs_in_a_shell_and_skips_a_disk_that_is_gone(tmp_path):
    disk = tmp_path / "t.qcow2"
    disk.write_bytes(b"data")
    os.chmod(disk, 0o600)
    found = DiskFound(True, "640", os.getuid(), os.getgid())
    (a,) = release_plan(None, None, str(disk), found, delete_disk=True).actions
    run(a.command)
    assert oct(disk.stat().st_mode & 0o7777) == "0o640" and disk.read_bytes() == b"data"
    disk.unlink()
    run(a.command)  # gone since: nothing to chown, no failure
    assert not disk.exists()
