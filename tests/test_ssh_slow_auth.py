"""A host whose sshd is up but slow to answer authentication (still booting after a reboot, or overloaded) is a
delay, retried like a refused connection; a rejected key is an answer, raised at once.

Found on the emulated server under load: HostReboot's wait for the new boot failed with paramiko's
"Authentication timeout." instead of waiting. The server here is a real SSH server (paramiko's server side of the
protocol, in a thread), whose publickey check takes longer than the client's timeout.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import paramiko
import pytest
from paramiko.common import AUTH_FAILED, AUTH_SUCCESSFUL

from access import keys, ssh
from providers.reboot import wait_for_new_boot


class _Auth(paramiko.ServerInterface):
    def __init__(self, delay: float, accept: bool):
        self.delay, self.accept = delay, accept

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        time.sleep(self.delay)
        return AUTH_SUCCESSFUL if self.accept else AUTH_FAILED


class SlowSshd:
    """An SSH server on loopback answering publickey auth after `delay` seconds (or rejecting it)."""

    def __init__(self, delay: float, accept: bool = True):
        self.key = paramiko.ECDSAKey.generate()
        self.auth = _Auth(delay, accept)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.transports: list[paramiko.Transport] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            t = paramiko.Transport(client)
            t.add_server_key(self.key)
            self.transports.append(t)
            try:
                t.start_server(server=self.auth)
            except (paramiko.SSHException, EOFError, OSError):
                pass

    def spec(self, connect_timeout: float):
        return ssh.HostSpec(
            name=f"slow-sshd:{self.port}",
            address="127.0.0.1",
            port=self.port,
            user="ops",
            host_key=f"{self.key.get_name()} {self.key.get_base64()}",
            connect_timeout=connect_timeout,
        )

    def close(self):
        self.sock.close()
        for t in self.transports:
            t.close()


@pytest.fixture(scope="module", autouse=True)
def client_key(tmp_path_factory):
    path = tmp_path_factory.mktemp("slow-sshd") / "client"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    keys.set_private_key("sshPrivateKey", path.read_text())


# connect_timeout 4 s against an auth of 12 s: paramiko's key exchange runs under the same timeout, and on a busy
# 2-core machine a tighter one could end in the key exchange, not in the authentication this file is about.
CONNECT_TIMEOUT = 4.0


def test_authentication_timeout_is_retried_then_unreachable():
    srv = SlowSshd(delay=12.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(ssh.HostUnreachable, match="after 2 attempts: Authentication timeout"):
            ssh.connect(srv.spec(connect_timeout=CONNECT_TIMEOUT), attempts=2, backoff=0.1)
        assert len(srv.transports) == 2 and time.monotonic() - t0 < 2 * CONNECT_TIMEOUT + 10
    finally:
        srv.close()


def test_a_rejected_key_is_an_answer_not_retried():
    srv = SlowSshd(delay=0.0, accept=False)
    try:
        with pytest.raises(paramiko.AuthenticationException) as e:
            ssh.connect(srv.spec(connect_timeout=5), attempts=3, backoff=0.1)
        assert "timeout" not in str(e.value).lower() and len(srv.transports) == 1
    finally:
        srv.close()


def test_reboot_wait_keeps_waiting_through_slow_authentication():
    srv = SlowSshd(delay=12.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(
            ssh.HostUnreachable, match="did not come back within 10s after reboot.*Authentication timeout"
        ):
            wait_for_new_boot(srv.spec(connect_timeout=CONNECT_TIMEOUT), "old-boot-id", timeout=10)
        assert time.monotonic() - t0 >= 9.5 and len(srv.transports) >= 1
    finally:
        srv.close()
