"""testbed/testhost/host.py without an emulated server: its batch runs in a real local `sh` (dash on Debian, as on
the emulated host), so quoting, framing and parsing are checked on what a shell really does with them."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from access.shell import sh
from testbed.testhost.host import (
    BootId,
    FileContent,
    FileStat,
    Host,
    KernelCmdline,
    Output,
    PciDriver,
    Probe,
    ServiceState,
    SriovNumvfs,
    Sysctl,
    batch_script,
    parse_batch,
)

# Each one would run something, end a quote or a frame if it reached the shell unquoted.
HOSTILE = ["a b", "it's", 'q"uote', "$(touch PWNED)", "`touch PWNED`", "x; touch PWNED", "-rf", "*", "new\nline"]


class LocalShell:
    """Runs commands in /bin/sh here, as TestHost.ssh runs them there; counts the round trips."""

    def __init__(self, cwd):
        self.cwd = cwd
        self.calls: list[str] = []

    def __call__(self, command: str, timeout: float = 300, **_):
        self.calls.append(command)
        return subprocess.run(["sh", "-c", command], cwd=self.cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def shell(tmp_path):
    return LocalShell(tmp_path)


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_path_is_one_argument_and_its_bytes_come_back_exactly(tmp_path, shell, name):
    path = tmp_path / name
    text = "0 0 AAAA\nline two\n\n$HOME `id`\nno trailing newline"  # a fake frame line and shell text too
    path.write_text(text)
    os.chmod(path, 0o640)
    now = Host(shell).read(FileStat(str(path)), FileContent(str(path)))
    f = now.file(str(path))
    assert f.exists and f.is_file
    assert f.content_string == text
    assert f.sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert f.mode == 0o640
    assert f.user == subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    assert f.group == subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()
    assert not (tmp_path / "PWNED").exists()
    assert len(shell.calls) == 1  # one round trip for the whole read


def test_trailing_newlines_and_an_empty_file_are_kept(tmp_path, shell):
    (tmp_path / "nl").write_text("x\n\n\n")
    (tmp_path / "empty").write_text("")
    now = Host(shell).read(FileContent(str(tmp_path / "nl")), FileContent(str(tmp_path / "empty")))
    assert now.file(str(tmp_path / "nl")).content_string == "x\n\n\n"
    assert now.file(str(tmp_path / "empty")).content_string == ""


def test_a_missing_file_does_not_exist_and_its_content_raises(tmp_path, shell):
    gone = str(tmp_path / "gone")
    now = Host(shell).read(FileStat(gone), FileContent(gone))
    assert not now.file(gone).exists
    assert now.file(gone).mode is None and now.file(gone).sha256 is None
    with pytest.raises(FileNotFoundError, match="gone"):
        _ = now.file(gone).content_string


def test_a_directory_has_a_mode_and_no_sha256(tmp_path, shell):
    d = tmp_path / "dir"
    d.mkdir(mode=0o750)
    os.chmod(d, 0o750)
    f = Host(shell).read(FileStat(str(d))).file(str(d))
    assert f.exists and not f.is_file
    assert f.mode == 0o750 and f.sha256 is None


def test_kernel_cmdline_and_boot_id_as_this_machine_shows_them(shell):
    now = Host(shell).read(KernelCmdline(), BootId())
    with open("/proc/cmdline") as f:
        assert now.kernel_cmdline == tuple(f.read().split())
    with open("/proc/sys/kernel/random/boot_id") as f:
        assert now.boot_id == f.read().strip()


def test_a_read_answers_only_what_it_read_and_never_goes_back(shell):
    now = Host(shell).read(KernelCmdline())
    with pytest.raises(KeyError, match="Sysctl"):
        now.sysctl("net.core.somaxconn")
    assert len(shell.calls) == 1


def test_a_live_host_reads_one_property_per_round_trip(shell):
    host = Host(shell)
    assert host.kernel_cmdline and host.boot_id
    assert len(shell.calls) == 2


def test_two_reads_of_the_same_values_are_equal_and_a_change_shows(tmp_path, shell):
    p = str(tmp_path / "f")
    (tmp_path / "f").write_text("a")
    host = Host(shell)
    before = host.read(FileContent(p), KernelCmdline())
    assert host.read(FileContent(p), KernelCmdline()) == before
    (tmp_path / "f").write_text("b")
    after = host.read(FileContent(p), KernelCmdline())
    assert after != before and after.values != before.values


def test_every_value_in_a_probe_command_is_quoted_by_access_shell():
    assert Sysctl("a; reboot").command() == "sysctl -n 'a; reboot'"
    assert (
        FileStat("/etc/a b").command() == "stat -c '%F|%a|%U|%G' -- '/etc/a b' && { sha256sum < '/etc/a b' || true; }"
    )
    assert PciDriver("0000:81:00.0").command() == "readlink /sys/bus/pci/devices/0000:81:00.0/driver"
    assert ServiceState("x$(id)").command() == "systemctl is-active 'x$(id)'; systemctl is-enabled 'x$(id)'"


def test_parsers_on_the_emulated_hosts_answers():
    # As captured on the emulated server (testbed/testhost) after the dev stack's up.
    assert PciDriver("0000:81:00.0").parse("../../../bus/pci/drivers/vfio-pci\n", 0) == "vfio-pci"
    assert PciDriver("0000:82:00.1").parse("", 1) is None
    assert Sysctl("net.core.somaxconn").parse("4096\n", 0) == 4096
    assert Sysctl("kernel.ostype").parse("Linux\n", 0) == "Linux"
    assert Sysctl("no.such").parse("", 255) is None
    assert SriovNumvfs("0000:82:00.0").parse("2\n", 0) == 2
    assert ServiceState("tuned").parse("active\nenabled\n", 0) == ("active", "enabled")
    assert ServiceState("gone").parse("inactive\n", 4) == ("inactive", "")


def test_a_probe_the_host_did_not_answer_is_an_error_not_a_none():
    probes: list[Probe] = [KernelCmdline(), BootId()]
    out = "0 0 cm9vdD0vZGV2L3NkYQo=\n"  # only the first: the script was cut short
    with pytest.raises(RuntimeError, match="BootId"):
        parse_batch(probes, out)
    assert "readlink" in batch_script([PciDriver("0000:81:00.0")])


def test_check_output_is_a_probe_too_and_a_failed_command_fails_the_read(shell):
    host = Host(shell)
    now = host.read(Output(sh("printf", "%s\n", "a b", "c")), BootId())
    assert now.check_output(sh("printf", "%s\n", "a b", "c")) == "a b\nc"
    assert len(shell.calls) == 1
    with pytest.raises(RuntimeError, match="exited 3"):
        host.read(Output("exit 3"))
