"""Host access against a real sshd on loopback: quoting, strict host keys, round trips, atomic put."""

import os
import stat
import subprocess

import pytest

from access import keys, ssh
from access.shell import Script, sh

NASTY = [
    "two words",
    'it\'s "quoted"',
    "$(touch /tmp/gpuhost-pwned-1)",
    "`touch /tmp/gpuhost-pwned-2`",
    "a; touch /tmp/gpuhost-pwned-3",
    "line1\nline2; touch /tmp/gpuhost-pwned-4\n",
    "$HOME ${PATH} * ? [a] ~ & | < > \\ !",
    "",
]


@pytest.mark.parametrize("value", NASTY)
def test_command_builder_delivers_values_intact_and_runs_nothing(conn, value):
    for i in range(1, 5):
        if os.path.exists(f"/tmp/gpuhost-pwned-{i}"):
            os.remove(f"/tmp/gpuhost-pwned-{i}")
    out = conn.run(sh("printf", "%s", value)).stdout
    assert out == value
    # and through a multi-line script, as providers send them
    s = Script().assign("v", value).raw('printf "%s" "$v"')
    assert conn.run(s.render()).stdout == value
    assert not any(os.path.exists(f"/tmp/gpuhost-pwned-{i}") for i in range(1, 5))


def test_pinned_host_key_mismatch_is_refused_with_both_fingerprints(local_sshd, tmp_path):
    keys.set_private_key("sshPrivateKey", local_sshd.client_key_pem)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    wrong = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    spec = local_sshd.host_spec(name="gpu-hk-01", host_key=wrong)
    ssh.close_all()
    before = ssh.ROUNDTRIPS.by_host[spec.name]
    with pytest.raises(ssh.HostKeyMismatch) as e:
        ssh.connect(spec)
    msg = str(e.value)
    assert "gpu-hk-01" in msg
    assert ssh.fingerprint_of_line(wrong) in msg
    assert ssh.fingerprint_of_line(local_sshd.host_key_line) in msg
    assert ssh.ROUNDTRIPS.by_host[spec.name] == before  # nothing ran


def test_fingerprint_pin_works_and_unknown_key_refused_unless_insecure(local_sshd):
    keys.set_private_key("sshPrivateKey", local_sshd.client_key_pem)
    ssh.close_all()
    fp = ssh.fingerprint_of_line(local_sshd.host_key_line)
    assert ssh.connect(local_sshd.host_spec(host_key=fp)).run("true").rc == 0
    ssh.close_all()
    with pytest.raises(ssh.HostKeyUnknown):
        ssh.connect(local_sshd.host_spec(host_key=None))
    c = ssh.connect(local_sshd.host_spec(host_key=None, insecure_accept_unknown_host_key=True))
    assert c.run("echo ok").stdout == "ok\n"
    ssh.close_all()


def test_roundtrips_counted_and_connection_reused(conn):
    name = conn.spec.name
    n = ssh.ROUNDTRIPS.by_host[name]
    conn.run("true")
    conn.run("true")
    assert ssh.ROUNDTRIPS.by_host[name] == n + 2
    assert ssh.connect(conn.spec) is conn


def test_failed_command_names_host_and_stderr(conn):
    with pytest.raises(ssh.CommandFailed) as e:
        conn.run(sh("ls", "/nonexistent-gpuhost"))
    assert conn.spec.name in str(e.value) and "nonexistent-gpuhost" in str(e.value)


def test_put_is_atomic_and_keeps_mode_and_owner(conn, tmp_path):
    p = tmp_path / "grub"
    p.write_text("old\n")
    os.chmod(p, 0o600)
    os.chown(p, 0, 4)
    conn.put(str(p), b"new\n")
    st = os.stat(p)
    assert p.read_text() == "new\n" and stat.S_IMODE(st.st_mode) == 0o600 and st.st_gid == 4
    assert [x.name for x in tmp_path.iterdir()] == ["grub"]  # no temp file left behind
    conn.put(str(tmp_path / "fresh"), b"x", mode="0640")
    assert stat.S_IMODE(os.stat(tmp_path / "fresh").st_mode) == 0o640


def test_missing_key_is_a_clear_error(local_sshd):
    keys.clear()
    ssh.close_all()
    with pytest.raises(keys.MissingKey) as e:
        ssh.connect(local_sshd.host_spec(name="gpu-hk-02"))
    assert "gpu-hk-02" in str(e.value) and "config set --secret" in str(e.value)
