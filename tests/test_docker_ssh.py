"""Docker over SSH with gpuhost's own pins, key and jump host, against a real sshd and the real OpenSSH client.

pulumi-docker's connhelper runs `ssh <ssh_opts> -l user -p port -- host docker system dial-stdio`; no Docker engine
exists here, so the same argv runs `echo` instead of `docker system dial-stdio` (the SSH half is what is tested).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from access.docker_ssh import PinError, docker_host, known_hosts_line, materialise
from access.ssh import JumpHost
from testbed.servers.sshd import keygen

WRONG_PIN = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL/kSwgf9qVUgtkwpJuQBIIevT94BAXy29qU5XlIfwG3"


def _dial(spec, opts, home: Path, command="echo dial-ok") -> subprocess.CompletedProcess:
    argv = ["ssh", "-v", *opts, "-l", spec.user, "-p", str(spec.port), "--", spec.address, command]
    env = {**os.environ, "HOME": str(home)}
    env.pop("SSH_AUTH_SOCK", None)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture
def home(tmp_path, local_sshd):
    """A runner home whose ~/.ssh would let anything in: the authorized key as its default identity, a config
    that disables host-key checks, and a known_hosts trusting the server. None of it may be used."""
    h = tmp_path / "home"
    ssh_dir = h / ".ssh"
    ssh_dir.mkdir(parents=True)
    (ssh_dir / "id_ed25519").write_text(local_sshd.client_key_pem)
    os.chmod(ssh_dir / "id_ed25519", 0o600)
    (ssh_dir / "config").write_text("Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n")
    (ssh_dir / "known_hosts").write_text(f"[127.0.0.1]:{local_sshd.port} {local_sshd.host_key_line}\n")
    return h


def test_right_pin_and_secret_key_reach_the_host(local_sshd, tmp_path, home):
    spec = local_sshd.host_spec()
    opts = materialise(spec, local_sshd.client_key_pem, tmp_path / "gpuhost-ssh", scope="test")
    r = _dial(spec, opts, home)
    assert r.returncode == 0 and r.stdout == "dial-ok\n", r.stderr[-2000:]
    key = tmp_path / "gpuhost-ssh" / "test" / spec.name / "id"
    assert oct(key.stat().st_mode & 0o777) == "0o600" and f"IdentityFile={key}" in opts
    assert "-F" in opts and opts[opts.index("-F") + 1] == "/dev/null"


def test_wrong_pin_is_refused_before_authentication(local_sshd, tmp_path, home):
    marker = tmp_path / "ran"
    spec = local_sshd.host_spec(host_key=WRONG_PIN)
    opts = materialise(spec, local_sshd.client_key_pem, tmp_path / "gpuhost-ssh", scope="test")
    r = _dial(spec, opts, home, command=f"touch {marker}")
    assert r.returncode == 255 and "Host key verification failed" in r.stderr
    # The key exchange failed: no public key was ever offered, nothing ran.
    assert "Offering public key" not in r.stderr and "Authenticated to" not in r.stderr
    assert not marker.exists()


def test_runner_keys_are_not_used(local_sshd, tmp_path, home):
    """The runner's ~/.ssh/id_ed25519 is the authorized key; gpuhost's identity is another key: refused."""
    keygen(tmp_path / "other")
    spec = local_sshd.host_spec()
    opts = materialise(spec, (tmp_path / "other").read_text(), tmp_path / "gpuhost-ssh", scope="test")
    r = _dial(spec, opts, home)
    assert r.returncode == 255 and "Permission denied (publickey)" in r.stderr
    assert str(home / ".ssh" / "id_ed25519") not in r.stderr.split("Authentications that can continue")[-1]


def test_jump_host_goes_through_the_same_pins(local_sshd, tmp_path, home):
    # The target is named "localhost" and the jump "127.0.0.1" (one sshd plays both), so each has its own pin line.
    jump = JumpHost(address="127.0.0.1", port=local_sshd.port, user=local_sshd.user, host_key=local_sshd.host_key_line)
    spec = local_sshd.host_spec(address="localhost", jump=jump)
    opts = materialise(spec, local_sshd.client_key_pem, tmp_path / "gpuhost-ssh", scope="test")
    assert any(o.startswith("ProxyCommand=ssh -F /dev/null") for o in opts)
    r = _dial(spec, opts, home)
    assert r.returncode == 0 and r.stdout == "dial-ok\n", r.stderr[-2000:]
    bad = local_sshd.host_spec(address="localhost", jump=jump.model_copy(update={"host_key": WRONG_PIN}))
    r = _dial(bad, materialise(bad, local_sshd.client_key_pem, tmp_path / "gpuhost-ssh", scope="bad"), home)
    assert r.returncode == 255 and "Host key verification failed" in r.stderr


def test_known_hosts_forms():
    assert known_hosts_line("10.0.0.5", 22, WRONG_PIN) == f"10.0.0.5 {WRONG_PIN}"
    assert known_hosts_line("fd00::11", 2222, WRONG_PIN) == f"[fd00::11]:2222 {WRONG_PIN}"
    with pytest.raises(PinError, match="not its SHA256 fingerprint"):
        known_hosts_line("10.0.0.5", 22, "SHA256:abc")


def test_docker_host_brackets_ipv6(local_sshd):
    assert docker_host(local_sshd.host_spec(address="fd00::11", port=22)) == f"ssh://{local_sshd.user}@[fd00::11]:22"
