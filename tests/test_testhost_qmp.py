"""`hmp`, the emulated server's monitor access the end-to-end tests use (hostfwd_add / hostfwd_remove), against a real
QEMU with no machine at all: it starts in a moment and answers on its QMP socket like the emulated server's."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from testbed.servers import stop_process
from testbed.testhost.machine import QEMU, hmp


@pytest.fixture
def qmp_sock(tmp_path: Path):
    if not Path(QEMU).exists():
        pytest.skip("qemu-system-x86_64 is not installed")
    sock = tmp_path / "qmp.sock"
    args = [QEMU, "-machine", "none", "-nodefaults", "-display", "none", "-no-user-config"]
    proc = subprocess.Popen([*args, "-qmp", f"unix:{sock},server=on,wait=off"], start_new_session=True)
    try:
        deadline = time.monotonic() + 60  # a generous bound: a busy machine only makes it slower, never wrong
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "QEMU did not open its QMP socket"
            time.sleep(0.05)
        yield sock
    finally:
        stop_process(proc)


def test_a_monitor_command_answers_with_its_text(qmp_sock):
    reply = hmp(qmp_sock, "info version")
    assert set(reply) == {"return"}
    version = subprocess.run([QEMU, "--version"], capture_output=True, text=True, check=True).stdout
    number = re.compile(r"\d+\.\d+\.\d+")
    assert number.findall(reply["return"])[:1] == number.findall(version)[:1] != []


def test_each_call_is_its_own_session(qmp_sock):
    assert "unknown command" in hmp(qmp_sock, "no_such_command")["return"]
    assert hmp(qmp_sock, "info version")["return"].strip()
