"""bench/driver_bench.py's account of the host lock: the pure split on a fixture, and the log stream on a real sshd."""

from __future__ import annotations

import os
import shlex
import threading
import time
import uuid

from access import keys, ssh
from bench.driver_bench import LockWatch, lock_account, lock_holds, parse_lock_log
from pristine import LOCK, Change, locked
from testbed.servers import wait_until

# Host epoch 1000.0 is the start of the `up`. a holds 1002-1010; b waits from 1003, holds 1010-1011; c never waits;
# the reboot step's hold is cut off by the reboot (no "released").
LOG = """\
1002.0 acquired bench/a
1003.0 waiting bench/b
1010.0 released bench/a
1010.0 acquired bench/b
1011.0 released bench/b
1012.0 acquired bench/c
1012.5 released bench/c
1013.0 acquired bench/other
1013.5 released bench/other
1016.0 acquired bench/reboot
1016.1 acq
"""
STEPS = [
    {"name": "a", "type": "KernelCmdline", "start_s": 1.0, "seconds": 10.0},
    {"name": "b", "type": "VfioBinding", "start_s": 1.5, "seconds": 11.0},
    {"name": "c", "type": "Sysctls", "start_s": 11.0, "seconds": 2.0},
    {"name": "reboot", "type": "HostReboot", "start_s": 14.0, "seconds": 90.0},
]


def test_lock_account_splits_each_step_and_finds_the_critical_path():
    holds = lock_holds(parse_lock_log(LOG.splitlines()))
    assert [(h["holder"], h["waiting"], h["acquired"], h["released"]) for h in holds] == [
        ("bench/a", None, 1002.0, 1010.0),
        ("bench/b", 1003.0, 1010.0, 1011.0),
        ("bench/c", None, 1012.0, 1012.5),
        ("bench/other", None, 1013.0, 1013.5),
        ("bench/reboot", None, 1016.0, None),
    ]
    acc = lock_account(STEPS, holds, host_t0=1000.0, reboot_start_s=14.0)
    a, b, c = (acc["steps"][n] for n in "abc")
    assert (a["wait_s"], a["hold_s"], a["rest_s"], a["waited_behind"]) == (0.0, 8.0, 2.0, [])
    assert (b["wait_s"], b["hold_s"], b["rest_s"], b["waited_behind"]) == (7.0, 1.0, 3.0, ["a"])
    assert (c["wait_s"], c["hold_s"], c["rest_s"]) == (0.0, 0.5, 1.5)
    assert acc["steps"]["reboot"]["cut_off"] and not b["cut_off"]
    assert acc["unmatched_holders"] == ["bench/other"]
    assert acc["critical"]["step"] == "c" and acc["critical"]["ends_s"] == 13.0
    # held 8 + 1 + 0.5 + 0.5 s of the 12 s from the first acquisition (2 s) to the reboot decision (14 s)
    assert acc["lock_busy_s"] == 10.0 and acc["lock_first_acquired_s"] == 2.0
    assert acc["lock_busy_share"] == round(10.0 / 12.0, 3)


def test_lock_account_with_classes_lets_other_classes_overlap():
    """boot and sysctl holds overlap (different classes): sysctl waited behind nothing; the second boot hold waited
    behind the first; the busy time is their union."""
    log = [
        "1001.0 acquired bench/g boot",
        "1001.5 waiting bench/h boot",
        "1002.0 acquired bench/s sysctl",
        "1003.0 released bench/s sysctl",
        "1005.0 released bench/g boot",
        "1005.0 acquired bench/h boot",
        "1006.0 released bench/h boot",
    ]
    from bench.driver_bench import lock_classes

    steps = [
        {"name": "g", "type": "KernelCmdline", "start_s": 0.5, "seconds": 4.6},
        {"name": "h", "type": "VfioBinding", "start_s": 0.5, "seconds": 5.6},
        {"name": "s", "type": "Sysctls", "start_s": 1.5, "seconds": 1.6},
        {"name": "reboot", "type": "HostReboot", "start_s": 6.5, "seconds": 9.0},
    ]
    acc = lock_account(steps, lock_holds(parse_lock_log(log)), 1000.0, 6.5, lock_classes(log))
    assert acc["steps"]["h"]["waited_behind"] == ["g"] and acc["steps"]["h"]["wait_s"] == 3.5
    assert acc["steps"]["s"]["waited_behind"] == [] and acc["steps"]["s"]["classes"] == "sysctl"
    assert acc["lock_busy_s"] == 5.0 and acc["held_by_class_s"] == {"boot": 5.0, "sysctl": 1.0}
    assert acc["critical"]["step"] == "h"


class _Host:
    def __init__(self, srv):
        self.srv, self.name = srv, "lockwatch-test"

    def host_spec(self, **over):
        return self.srv.host_spec(**over)


def _logged(line_end: str) -> bool:
    """Whether the machine's lock log (the local sshd runs on this machine) has a line ending so."""
    return os.path.exists(LOCK + ".log") and any(
        ln.endswith(line_end) for ln in open(LOCK + ".log").read().splitlines()
    )


def test_lock_watch_streams_waiting_acquired_released_over_its_own_connection(local_sshd, tmp_path):
    """A hold the test ends with a marker file once the second change is seen waiting in the lock log (and 0.5 s
    more): the order of the five lines and the second change's wait are caused, not timed."""
    keys.set_private_key("sshPrivateKey", local_sshd.client_key_pem)
    tag = uuid.uuid4().hex
    marker = tmp_path / "release"
    hold = f"i=0; while [ ! -e {shlex.quote(str(marker))} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done"
    watch = LockWatch(_Host(local_sshd))
    offset = watch.sample_clock(3)
    assert abs(offset) < 1.0  # the same machine's clock
    watch.start()
    threads: list[threading.Thread] = []
    try:
        conn = ssh.connect(local_sshd.host_spec())
        assert conn.client is not watch.conn.client
        threads.append(threading.Thread(target=lambda: conn.run(locked(hold, f"test/held-{tag}"))))
        threads[-1].start()
        wait_until("the test's hold acquired", lambda: _logged(f"acquired test/held-{tag}"))
        second = Change(f"test/second-{tag}").add(["true"])
        threads.append(threading.Thread(target=lambda: second.run(ssh.connect(local_sshd.host_spec()))))
        threads[-1].start()
        wait_until("the second change waiting", lambda: _logged(f"waiting test/second-{tag}"))
        time.sleep(0.5)  # the second change waits at least this long: the hold ends only after it
        marker.touch()
        for t in threads:
            t.join(60)
        wait_until("the watch streamed the five lines", lambda: sum(ln.endswith(tag) for _, ln in watch.lines) >= 5)
    finally:
        marker.touch()
        watch.stop()
    events = [(ev, who) for _, ev, who in parse_lock_log([ln for _, ln in watch.lines]) if who.endswith(tag)]
    assert events == [
        ("acquired", f"test/held-{tag}"),
        ("waiting", f"test/second-{tag}"),
        ("released", f"test/held-{tag}"),
        ("acquired", f"test/second-{tag}"),
        ("released", f"test/second-{tag}"),
    ]
    holds = [h for h in lock_holds(parse_lock_log([ln for _, ln in watch.lines])) if h["holder"].endswith(tag)]
    assert holds[1]["acquired"] - holds[1]["waiting"] >= 0.5
