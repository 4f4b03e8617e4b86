"""Run the Ansible baseline (bench/ansible/) against an emulated host and count its SSH round trips.

Round trips are counted by wrapping the ssh/sftp/scp binaries Ansible's ssh connection plugin starts
(ANSIBLE_SSH_EXECUTABLE & co. point at one-line shell wrappers that append a line to a log, then exec the real
binary): each wrapped process is one command or one file transfer over the ControlPersist master, which is what
gpuhost's access.ssh counts as a round trip (one exec on the pooled connection). `count_vvv` cross-checks the
count against `-vvv`'s "SSH: EXEC" lines.

Usage::

    a = AnsibleRun(workdir, host)             # host: testbed.testhost.machine.TestHost (started)
    r = a.playbook()                          # -> PlaybookResult(wall_s, roundtrips, changed, tasks, ...)
    r = a.playbook("--check", "--diff")
    f = a.adhoc_setup()                       # `ansible gpu -m setup`
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent / "ansible"
RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


@dataclass
class PlaybookResult:
    wall_s: float
    roundtrips: int
    rc: int
    changed: int | None
    ok: int | None
    failed: int | None
    tasks: list[dict] = field(default_factory=list)
    stdout: str = ""

    def changed_tasks(self) -> list[str]:
        return [t["name"] for t in self.tasks if t.get("changed")]

    def task_time(self, *names: str) -> float:
        return sum((t["end"] or t["start"]) - t["start"] for t in self.tasks if t["name"] in names)

    def time_from(self, name: str) -> float:
        """Seconds from the start of task `name` to the end of the play (the reboot decision onward)."""
        start = next((t["start"] for t in self.tasks if t["name"] == name), None)
        if start is None:
            return 0.0
        end = max((t["end"] or t["start"]) for t in self.tasks)
        return end - start


class AnsibleRun:
    def __init__(self, workdir: Path, host):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.log = self.dir / "ssh-execs.log"
        self.wrappers = self.dir / "wrappers"
        self.wrappers.mkdir(exist_ok=True)
        for tool in ("ssh", "sftp", "scp"):
            real = shutil.which(tool)
            w = self.wrappers / tool
            w.write_text(f'#!/bin/sh\necho {tool} >> {self.log}\nexec {real} "$@"\n')
            w.chmod(0o755)
        kh = self.dir / "known_hosts"
        kh.write_text(f"[{host.address}]:{host.port} {host.host_key_line}\n")
        (self.dir / "inventory.ini").write_text(
            "[gpu]\n"
            f"{host.name} ansible_host={host.address} ansible_port={host.port} ansible_user={host.user} "
            f"ansible_ssh_private_key_file={host.private_key_path} "
            f"ansible_ssh_common_args='-o UserKnownHostsFile={kh} -o StrictHostKeyChecking=yes "
            "-o IdentitiesOnly=yes'\n"
        )
        self.runs = 0

    def _env(self, timer_out: Path | None) -> tuple[dict, Path]:
        self.runs += 1
        cp = self.dir / f"cp{self.runs}"  # a fresh ControlPersist master per run: no warm connection carried over
        cp.mkdir(exist_ok=True)
        env = dict(
            os.environ,
            ANSIBLE_CONFIG=str(HERE / "ansible.cfg"),
            ANSIBLE_SSH_CONTROL_PATH_DIR=str(cp),
            ANSIBLE_SSH_EXECUTABLE=str(self.wrappers / "ssh"),
            ANSIBLE_SFTP_EXECUTABLE=str(self.wrappers / "sftp"),
            ANSIBLE_SCP_EXECUTABLE=str(self.wrappers / "scp"),
            ANSIBLE_LOCAL_TEMP=str(self.dir / "tmp"),
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_FORCE_COLOR="0",
        )
        if timer_out:
            env.update(ANSIBLE_CALLBACKS_ENABLED="bench_timer", BENCH_TIMER_OUT=str(timer_out))
        return env, cp

    def _close_master(self, cp: Path) -> None:
        for sock in cp.iterdir():
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True, timeout=30)

    def _run(self, argv: list[str], timer_out: Path | None = None) -> tuple[subprocess.CompletedProcess, float, int]:
        env, cp = self._env(timer_out)
        self.log.write_text("")
        t0 = time.monotonic()
        p = subprocess.run(argv, cwd=HERE, env=env, capture_output=True, text=True, timeout=3600)
        wall = time.monotonic() - t0
        rts = len(self.log.read_text().splitlines())
        self._close_master(cp)
        return p, wall, rts

    def playbook(self, *extra: str) -> PlaybookResult:
        timer = self.dir / f"timer{self.runs + 1}.json"
        p, wall, rts = self._run(
            ["ansible-playbook", "-i", str(self.dir / "inventory.ini"), "host_prep.yml", *extra], timer
        )
        (self.dir / f"playbook{self.runs}.out").write_text(p.stdout + p.stderr)
        m = RECAP.search(p.stdout)
        tasks = json.loads(timer.read_text())["tasks"] if timer.exists() else []
        return PlaybookResult(
            wall,
            rts,
            p.returncode,
            int(m.group(3)) if m else None,
            int(m.group(2)) if m else None,
            int(m.group(5)) if m else None,
            tasks,
            p.stdout,
        )

    def adhoc_setup(self) -> tuple[float, int, int]:
        """`ansible gpu -m setup`: (wall seconds, round trips, number of top-level facts)."""
        p, wall, rts = self._run(["ansible", "-i", str(self.dir / "inventory.ini"), "gpu", "-m", "setup", "-o"])
        if p.returncode != 0:
            raise RuntimeError(f"ansible -m setup failed: {p.stdout[-2000:]} {p.stderr[-2000:]}")
        body = p.stdout.split("=>", 1)[1] if "=>" in p.stdout else "{}"
        try:
            n = len(json.loads(body)["ansible_facts"])
        except Exception:
            n = -1
        return wall, rts, n

    def count_vvv(self) -> tuple[int, int]:
        """Cross-check: (`SSH: EXEC` lines in -vvv output, wrapper count) for one `ansible -m setup`."""
        p, _, rts = self._run(["ansible", "-vvv", "-i", str(self.dir / "inventory.ini"), "gpu", "-m", "setup"])
        return len(re.findall(r"SSH: EXEC", p.stdout + p.stderr)), rts
