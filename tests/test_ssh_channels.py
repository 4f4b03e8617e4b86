"""A command whose SSH channel does not open at once (a busy host right after its reboot, sshd's MaxSessions) is
retried within a bounded wait of its own, and reported as "nothing was run" when it never opens; one operation's
failure never closes the connection another operation on the same host is using. Real sshd on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from access import keys, ssh
from access.shell import sh
from testbed.servers.sshd import LocalSshd


@pytest.fixture
def one_session_sshd():
    """sshd allowing one session channel per connection: a second concurrent command's channel open is refused."""
    with LocalSshd(max_sessions=1) as srv:
        keys.set_private_key(srv.key_name, srv.client_key_pem)
        ssh.close_all()
        yield srv
        ssh.close_all()


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True, check=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        p, pp = (int(x) for x in line.split())
        children.setdefault(pp, []).append(p)
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # a process of an earlier, closed connection that has just exited
        pass


def _background(conn, command: str) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def go():
        try:
            box["result"] = conn.run(command)
        except Exception as e:  # noqa: BLE001 - the test asserts on it
            box["error"] = e

    t = threading.Thread(target=go)
    t.start()
    return t, box


def _started(conn, tmp_path, command: str) -> tuple[threading.Thread, dict]:
    """``command`` in the background, returned once it runs on the host (it holds its session then): a fixed sleep
    would let a busy machine's slower session start the test's next command first."""
    flag = tmp_path / "started"
    t, box = _background(conn, f"touch {sh(str(flag))}; {command}")
    deadline = time.monotonic() + 30
    while not flag.exists():
        assert time.monotonic() < deadline and "error" not in box, box.get("error", "the command did not start")
        time.sleep(0.02)
    return t, box


def test_a_channel_refused_while_another_command_runs_is_retried_and_runs_once(one_session_sshd, tmp_path):
    conn = ssh.connect(one_session_sshd.host_spec())
    mark = tmp_path / "ran"
    t, box = _started(conn, tmp_path, "sleep 2; echo first")  # it holds the one session
    res = conn.run(f"echo x >> {sh(str(mark))}; echo second")
    t.join()
    assert box["result"].stdout.strip() == "first"
    assert res.stdout.strip() == "second"
    assert mark.read_text() == "x\n"  # run exactly once


def test_a_channel_that_never_opens_says_nothing_was_run_and_spares_the_other_command(
    one_session_sshd, tmp_path, monkeypatch
):
    monkeypatch.setattr(ssh, "CHANNEL_OPEN_WAIT", 1.5)
    conn = ssh.connect(one_session_sshd.host_spec())
    mark = tmp_path / "ran"
    t, box = _started(conn, tmp_path, "sleep 4; echo first")
    with pytest.raises(ssh.NothingRan, match="nothing was run"):
        conn.run(f"touch {sh(str(mark))}")
    t.join()
    # The failed open closed nothing: the command running meanwhile finished on the same connection.
    assert "error" not in box, box.get("error")
    assert box["result"].stdout.strip() == "first"
    assert not mark.exists()
    assert ssh.connect(one_session_sshd.host_spec()) is conn and conn.run("echo again").stdout.strip() == "again"


def test_a_channel_open_that_times_out_on_a_stalled_sshd_is_retried(local_sshd, tmp_path):
    """The per-connection sshd is stopped (SIGSTOP) for 3 s: channel opens time out after connect_timeout (1 s) and
    are retried; the command runs once, after the stall."""
    keys.set_private_key(local_sshd.key_name, local_sshd.client_key_pem)
    ssh.close_all()
    conn = ssh.connect(local_sshd.host_spec(connect_timeout=1.0))
    conn.run("true")
    stalled = _descendants(local_sshd.proc.pid)
    assert stalled, "no per-connection sshd process found"
    for p in stalled:
        _signal(p, signal.SIGSTOP)

    def resume() -> None:
        for p in stalled:
            _signal(p, signal.SIGCONT)

    timer = threading.Timer(3.0, resume)
    timer.start()
    try:
        t0 = time.monotonic()
        mark = tmp_path / "ran"
        res = conn.run(f"echo x >> {sh(str(mark))}; echo done")
        took = time.monotonic() - t0
    finally:
        timer.join()
    assert res.stdout.strip() == "done" and mark.read_text() == "x\n"
    assert took >= 2.5, f"the command answered in {took:.1f} s although sshd was stopped for 3 s"
    ssh.close_all()


def test_drop_while_a_command_runs_lets_it_finish(local_sshd, tmp_path):
    keys.set_private_key(local_sshd.key_name, local_sshd.client_key_pem)
    ssh.close_all()
    spec = local_sshd.host_spec()
    conn = ssh.connect(spec)
    t, box = _started(conn, tmp_path, "sleep 1.5; echo finished")
    ssh.drop(spec)  # e.g. another resource's reboot wait forgetting the host's connection
    t.join()
    assert "error" not in box, box.get("error")
    assert box["result"].stdout.strip() == "finished"
    assert not conn.alive  # closed once its last command finished
    assert ssh.connect(spec) is not conn
    ssh.close_all()
