"""Rollout across hosts on two emulated GPU servers, through the deployment driver: with
`rollout.max_parallel_reboots: 1`, the second host's reboot starts only after the first host is verified back.

Host A is the session's shared emulated server, host B one more fresh overlay of the same image (the issue asks for
two machines; each costs a boot under TCG, so only B is extra). The stack is the smallest that needs a reboot: a
kernel argument on each host (no VFIO, hugepages or VMs, so no initramfs rebuild). The serial consoles are watched
while the up runs: the time B's kernel starts shutting down is compared with the time A's HostReboot step was
verified (new boot, wanted arguments running). Both hosts are restored (destroy, then a reboot of A).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from testbed.testhost.fixtures import kernel_starts
from tests.progress_lines import Display, dones, tail, waits
from tools.driver import Driver, StackConfig

# A whole-stack run (8 min under TCG): in `./gpuhost.sh test`'s devstack session, after the dev stack end to end.
pytestmark = [pytest.mark.testhost, pytest.mark.devstack]

ROOT = Path(__file__).resolve().parent.parent
SHUTDOWN = ("reboot: Restarting system", "systemd-shutdown", "Reached target reboot.target", "Stopping ")


def host(name: str, th) -> dict:
    return {
        "name": name,
        "ssh": {"address": th.address, "port": th.port, "user": th.user, "host_key": th.host_key_line},
        "kernel": {"iommu_passthrough": False, "extra_args": [f"gpuhost.rollout={name}"]},
        "tuning": {"tuned_profile": None, "governor": None},
    }


class ConsoleWatch(threading.Thread):
    """Records, per host, the first moment its serial console shows the reboot beginning and the next kernel start."""

    def __init__(self, hosts: dict):
        super().__init__(daemon=True)
        self.hosts = hosts
        self.base = {n: len(h.serial_log.read_bytes()) for n, h in hosts.items()}
        self.shutdown_at: dict[str, float] = {}  # time.monotonic(), comparable with the driver's step records
        self.kernel_at: dict[str, float] = {}
        self.wall = time.time() - time.monotonic()  # monotonic + wall = UTC epoch seconds, for the record
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for n, h in self.hosts.items():
                text = h.serial_log.read_bytes()[self.base[n] :].decode(errors="replace")
                if n not in self.shutdown_at and any(m in text for m in SHUTDOWN):
                    self.shutdown_at[n] = time.monotonic()
                if n not in self.kernel_at and "Linux version" in text:
                    self.kernel_at[n] = time.monotonic()
            time.sleep(0.2)


def test_second_hosts_reboot_starts_after_the_first_is_verified_back(testhost, testhost_overlay, tmp_path):
    a, b = testhost, testhost_overlay("rollout-b")
    boots = {"a": kernel_starts(a), "b": kernel_starts(b)}
    fleet = {"hosts": [host("rollout-a", a), host("rollout-b", b)], "rollout": {"max_parallel_reboots": 1}}
    cfg = StackConfig({}, []).with_values(fleet=fleet, sshPrivateKey=a.private_key_pem)
    cfg.secret_keys.append("gpuhost:sshPrivateKey")
    shown = Display()  # up's output as the user sees it
    d = Driver(ROOT, "rollout", passphrase="test", config=cfg, state=tmp_path / "rollout.json", out=shown)
    watch = ConsoleWatch({"a": a, "b": b})
    watch.start()
    try:
        up = d.up()
    finally:
        watch.stop.set()
        watch.join()
    try:
        assert not up.errors, up.errors
        assert kernel_starts(a) == boots["a"] + 1 and kernel_starts(b) == boots["b"] + 1
        ra, rb = up.step("rollout-a-reboot"), up.step("rollout-b-reboot")
        a_verified = ra.started + ra.seconds
        assert rb.started >= a_verified  # the driver started B's reboot step only after A's completed
        # Each reboot wait (a boot under TCG: minutes, far past the 5 s tick) said in up's output, on the stack's row,
        # what it waited for, the time and the bound, and then that it was done.
        seen, row = shown.getvalue(), "pulumi:pulumi:Stack  gpuhost-rollout"
        for n in ("rollout-a", "rollout-b"):
            back = f"{n} to come back from its reboot"
            assert waits(seen, f"{n}-reboot", back, row), f"no progress line of {n}'s reboot in:\n{tail(seen)}"
            assert dones(seen, f"{n}-reboot", back, row), f"no closing line of {n}'s reboot in:\n{tail(seen)}"

        def utc(t: float) -> str:
            return time.strftime("%H:%M:%S", time.gmtime(t + watch.wall)) + f".{int(t * 10) % 10}"

        print(
            f"\nrollout (UTC, serial consoles and driver steps): A reboot step started {utc(ra.started)}, "
            f"A console shutdown {utc(watch.shutdown_at['a'])}, A new kernel {utc(watch.kernel_at['a'])}, "
            f"A verified back {utc(a_verified)}; B reboot step started {utc(rb.started)}, "
            f"B console shutdown {utc(watch.shutdown_at['b'])}, B new kernel {utc(watch.kernel_at['b'])}, "
            f"B verified back {utc(rb.started + rb.seconds)}"
        )
        # A went down and came back while B's console stayed quiet; B's shutdown began after A was verified.
        assert watch.shutdown_at["a"] < a_verified
        assert watch.shutdown_at["b"] > a_verified
        assert "gpuhost.rollout=rollout-b" in b.ssh("cat /proc/cmdline").stdout
    finally:
        gone = d.destroy()
        a.reboot()  # A is the session's shared host: its kernel arguments back to the pristine ones
    assert not gone.errors, gone.errors
    assert "gpuhost.rollout" not in a.ssh("cat /proc/cmdline").stdout
