"""bench/queue_gpu.py's --pin-cpus: the roles' CPUs read or refused with the fix, and a process tree really moved
(every thread of a real process and of its child, read back from the kernel)."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.queue_gpu import parse_pin, pin_tree


def test_roles_and_ranges_are_read():
    assert parse_pin("", 16) == {}
    assert parse_pin("load:0-5, gateway:6-9+12 ,triton:10-11+13-15", 16) == {
        "load": {0, 1, 2, 3, 4, 5},
        "gateway": {6, 7, 8, 9, 12},
        "triton": {10, 11, 13, 14, 15},
    }
    assert parse_pin("triton:3", 4) == {"triton": {3}}
    assert parse_pin("gateway:4-7,redis:8", 16) == {"gateway": {4, 5, 6, 7}, "redis": {8}}  # Redis apart


@pytest.mark.parametrize(
    "bad", ["clients:0-3", "load:0-3,load:4-5", "load:0-16", "load", "load:a-b", "load:", "load:3-1"]
)
def test_a_bad_value_is_refused_with_the_fix(bad):
    with pytest.raises(SystemExit, match=r"--pin-cpus: .* e\.g\. load:0-5,gateway:6-9,triton:10-15"):
        parse_pin(bad, 16)


def test_every_thread_of_a_process_and_its_child_is_moved(tmp_path: Path):
    """A real process with a second thread and a child process (a stand-in for Triton and its stubs)."""
    script = (
        "import subprocess, sys, threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(tmp_path / 'child')!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    child = 0
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "child").exists() or not (tmp_path / "child").read_text():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        child = int((tmp_path / "child").read_text())
        target = {min(os.sched_getaffinity(0))}
        assert pin_tree(proc.pid, target) >= 3  # the parent's two threads and the child's one
        for pid in (proc.pid, child):
            for task in Path(f"/proc/{pid}/task").iterdir():
                assert os.sched_getaffinity(int(task.name)) == target
        assert pin_tree(proc.pid, None) == 0
    finally:
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait(10)
