"""Access-layer hardening against a real sshd on loopback: pool keys, NUL bytes, whole-script errors, large files,
and a reboot wait that keeps its deadline and stops at a host-key mismatch."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import time

import pytest

from access import keys, ssh
from access.shell import Script, quote, sh
from providers.reboot import wait_for_new_boot

OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL/kSwgf9qVUgtkwpJuQBIIevT94BAXy29qU5XlIfwG3"


def test_a_wrong_pin_never_reuses_a_good_pooled_connection(conn, local_sshd):
    assert conn.run("echo ok").stdout == "ok\n"
    with pytest.raises(ssh.HostKeyMismatch):
        ssh.connect(local_sshd.host_spec(host_key=OTHER_KEY), attempts=1)
    keys.set_private_key("otherKey", local_sshd.client_key_pem)
    with pytest.raises(ssh.HostKeyMismatch):  # the key name is part of the pool key too
        ssh.connect(local_sshd.host_spec(host_key=OTHER_KEY, key_name="otherKey"), attempts=1)


def test_nul_bytes_are_refused_before_the_shell(conn):
    with pytest.raises(ValueError, match="NUL"):
        quote("a\x00; touch /tmp/gpuhost-nul")
    with pytest.raises(ValueError, match="NUL"):
        conn.run("printf 'a\x00b'")
    assert not os.path.exists("/tmp/gpuhost-nul")


def test_a_failing_script_shows_every_line_and_its_stderr(conn):
    s = Script().raw("set -e").add("echo", "first").add("ls", "/nonexistent-gpuhost-dir").add("echo", "never")
    with pytest.raises(ssh.CommandFailed) as e:
        conn.run(s.render())
    msg = str(e.value)
    assert "  | ls /nonexistent-gpuhost-dir" in msg and "  | echo never" in msg
    assert "No such file or directory" in msg and "exit code 2" in msg


def _inlined_write(path: str, content: bytes, mode: str, owner: str) -> list[str]:
    """A script that carries a file's content in its own text (base64), as large scripts do."""
    b64 = base64.b64encode(content).decode()
    return [
        f"printf '%s' {quote(b64)} | base64 -d > {quote(path)}",
        sh("chmod", mode, path),
        sh("chown", owner, path),
    ]


def test_a_200_kib_file_goes_over_stdin_not_argv(conn, tmp_path):
    content = os.urandom(200 * 1024)
    path = str(tmp_path / "big.bin")
    script = "set -e\n" + "\n".join(_inlined_write(path, content, "0640", f"{os.getuid()}:{os.getgid()}")) + "\n"
    assert len(script) > 256 * 1024  # base64 inlined: far past one argv string's 128 KiB
    conn.run(script)
    got = open(path, "rb").read()
    assert hashlib.sha256(got).digest() == hashlib.sha256(content).digest()
    assert oct(os.stat(path).st_mode & 0o777) == "0o640"
    home = os.path.expanduser("~")
    assert not [n for n in os.listdir(home) if n.startswith(".gpuhost-")]  # the staged script removed itself
    # A failing large script still names itself and its stderr.
    with pytest.raises(ssh.CommandFailed) as e:
        conn.run(script + sh("false") + "\n")
    assert "characters …" in str(e.value) and "exit code 1" in str(e.value)


def test_reboot_wait_keeps_its_deadline(local_sshd):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens here once the socket closes
    spec = local_sshd.host_spec(port=closed, connect_timeout=30.0)
    t0 = time.monotonic()
    with pytest.raises(ssh.HostUnreachable, match="did not come back within 4s"):
        wait_for_new_boot(spec, "old-boot", timeout=4)
    assert time.monotonic() - t0 < 20  # the 4 s deadline, not connect_timeout's 30 s a try


def test_reboot_wait_stops_at_a_host_key_mismatch(local_sshd):
    keys.set_private_key("sshPrivateKey", local_sshd.client_key_pem)
    spec = local_sshd.host_spec(host_key=OTHER_KEY)
    t0 = time.monotonic()
    with pytest.raises(ssh.HostKeyMismatch):
        wait_for_new_boot(spec, "old-boot", timeout=120)
    assert time.monotonic() - t0 < 15


def test_facts_find_the_session_from_the_session_itself(conn, local_sshd):
    """sshd here listens on a random port, not 22: the session's own SSH_CONNECTION still names its interface."""
    from facts.host import read_host_facts

    f = read_host_facts(conn)
    client, _cport, local, lport = f.network.session.split()
    assert (local, int(lport)) == ("127.0.0.1", local_sshd.port)
    assert f.network.ssh_ifaces == ["lo"]
