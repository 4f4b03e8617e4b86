"""A connection attempt to a host that is still booting (the port resets before sshd's banner) fails with
HostUnreachable and leaves stderr clean: no paramiko traceback in `./gpuhost.sh up`'s transcript.

Run in a fresh interpreter with no logging configured, as `python -m testbed.testhost start` and the providers run
(pytest's own log capture would hide what Python's last-resort handler prints)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import socket, threading, time
from access import keys, ssh
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(8)
def resetting():  # like QEMU's user-mode network before the guest's sshd listens: accept, then close
    while True:
        c, _ = srv.accept(); time.sleep(0.2); c.close()
threading.Thread(target=resetting, daemon=True).start()
keys.set_private_key("k", open(KEY).read())
spec = ssh.HostSpec(name="booting", address="127.0.0.1", port=srv.getsockname()[1], user="u", key_name="k",
                    host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHSjxmMSS99qqBTPfIhsNlYjWA7ki3lxWCVfiLJAvK7H",
                    connect_timeout=3)
try:
    ssh.connect(spec, attempts=2)
except ssh.HostUnreachable as e:
    print("unreachable:", e)
"""


def test_failed_connect_to_a_booting_host_prints_no_paramiko_traceback(tmp_path):
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    p = subprocess.run(
        [sys.executable, "-c", f"KEY = {str(key)!r}\n" + SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "unreachable: booting: cannot connect" in p.stdout, p.stdout + p.stderr
    assert "Error reading SSH protocol banner" in p.stdout  # the cause is still reported, once, in the error
    assert p.stderr == "", p.stderr
