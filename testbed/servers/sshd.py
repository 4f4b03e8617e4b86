"""A real OpenSSH server on 127.0.0.1 with per-run host and client keys, for tests that need an SSH target here.

Usage::

    with LocalSshd() as srv:
        spec = srv.host_spec()            # access.ssh.HostSpec pinned to this server's real host key
        keys.set_private_key(spec.key_name, srv.client_key_pem)
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from testbed.servers import free_port, stop_process

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def keygen(path: Path, kind: str = "ed25519") -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)


class LocalSshd:
    def __init__(self, key_name: str = "sshPrivateKey", max_sessions: int = 100):
        self.dir = Path(tempfile.mkdtemp(prefix="gpuhost-sshd-"))
        os.chmod(self.dir, 0o700)
        self.port = free_port()
        self.user = getpass.getuser()
        self.key_name = key_name
        self.max_sessions = max_sessions
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "LocalSshd":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def host_key_line(self) -> str:
        return " ".join((self.dir / "host_ed25519.pub").read_text().split()[:2])

    @property
    def client_key_pem(self) -> str:
        return (self.dir / "client").read_text()

    def start(self) -> None:
        keygen(self.dir / "host_ed25519")
        keygen(self.dir / "client")
        (self.dir / "authorized_keys").write_text((self.dir / "client.pub").read_text())
        os.chmod(self.dir / "authorized_keys", 0o600)
        Path("/run/sshd").mkdir(exist_ok=True)
        cfg = self.dir / "sshd_config"
        cfg.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.dir}/host_ed25519\n"
            f"AuthorizedKeysFile {self.dir}/authorized_keys\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin prohibit-password\n"
            "UsePAM no\nStrictModes no\nAllowTcpForwarding yes\nMaxStartups 100\n"
            f"MaxSessions {self.max_sessions}\n"
            f"PidFile {self.dir}/sshd.pid\nLogLevel ERROR\n"
        )
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=open(self.dir / "sshd.log", "wb")
        )
        deadline = time.time() + 15
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("sshd exited: " + (self.dir / "sshd.log").read_text())
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH"):
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("sshd did not start listening")

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc, timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def host_spec(self, **over):
        from access.ssh import HostSpec

        args = dict(
            name=f"local-sshd:{self.port}",
            address="127.0.0.1",
            port=self.port,
            user=self.user,
            host_key=self.host_key_line,
            key_name=self.key_name,
        )
        args.update(over)
        return HostSpec(**args)
