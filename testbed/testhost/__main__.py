"""``python -m testbed.testhost build|start|stop|ssh|status``: the emulated GPU server by hand.

Usage::

    python -m testbed.testhost build [--force]          # build/refresh the cached base image, print its times
    python -m testbed.testhost start [--name dev] [--no-iommu]
                                                       # boot it (left running), print the dev-stack settings
    python -m testbed.testhost ssh [--name dev] [CMD...] # an interactive or one-shot ssh as gpuadmin
    python -m testbed.testhost status|stop [--name dev]
    python -m testbed.testhost capture [--out tests/fixtures/testhost]   # raw outputs for parser fixtures

State of a started host lives in ``$GPUHOST_TESTHOST_CACHE/run/<name>/`` (state.json, overlay, serial.log, key).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from testbed.testhost.image import cache_root, ensure_image


def _rundir(name: str) -> Path:
    return cache_root() / "run" / name


def _state(name: str) -> dict:
    p = _rundir(name) / "state.json"
    if not p.exists():
        sys.exit(f"no test host named {name!r} was started (no {p})")
    return json.loads(p.read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def cmd_build(a) -> None:
    t = time.monotonic()
    img = ensure_image(force=a.force)
    print(
        json.dumps(
            {
                "dir": str(img.dir),
                "kernel": img.kernel,
                "host_key_line": img.host_key_line,
                "times": img.manifest.get("times"),
                "took_s": round(time.monotonic() - t, 1),
            },
            indent=2,
        )
    )


def cmd_start(a) -> None:
    from testbed.testhost.machine import SshKey, TestHost

    d = _rundir(a.name)
    if (d / "state.json").exists() and _alive(json.loads((d / "state.json").read_text())["pid"]):
        sys.exit(f"{a.name} is already running; `python -m testbed.testhost stop --name {a.name}` first")
    img = ensure_image()
    key = SshKey.generate(d / "key")
    host = TestHost(img, d, key, iommu=not a.no_iommu, name=a.name)
    host.start()
    print(banner(host, a.name, a.by_up, shutil.which("pulumi") is not None))


def banner(host, name: str, by_up: str | None, cli: bool) -> str:
    """What to do next with a started host. `by_up`: "cli" or "driver" when `./gpuhost.sh up` started it (it points
    the dev stack at the host itself, so no hint to set config); `cli`: whether a pulumi CLI is on PATH, for a host
    started by hand (the `pulumi config set` hint only where that CLI exists)."""
    head = f"""test host {name!r} is up in {host.timings["boot_s"]} s (serial log: {host.serial_log})

  address:          {host.address}
  port:             {host.port}
  user:             {host.user}
  private key:      {host.private_key_path}
  host key line:    {host.host_key_line}
"""
    if by_up == "cli":
        nxt = "./gpuhost.sh up sets the dev stack's port, host key and key (secret) with `pulumi config set` now."
    elif by_up == "driver":
        nxt = (
            "./gpuhost.sh up hands the dev stack's port, host key and key (secret) to the deployment driver now "
            "(Pulumi.dev.yaml is not rewritten)."
        )
    elif cli:
        nxt = f"""Point the dev stack at it (Pulumi.dev.yaml host entry + the key as secret config):
  address: {host.address}
  port: {host.port}
  user: {host.user}
  host_key: "{host.host_key_line}"
and:  pulumi config set --secret gpuhost:sshPrivateKey < {host.private_key_path}"""
    else:
        nxt = (
            "No pulumi CLI on PATH: ./gpuhost.sh up points the dev stack at the host named dev and runs it through "
            "gpuhost's deployment driver (tools/driver)."
        )
    return f"""{head}
{nxt}

ssh:  python -m testbed.testhost ssh --name {name}
stop: python -m testbed.testhost stop --name {name}"""


def cmd_stop(a) -> None:
    st = _state(a.name)
    if _alive(st["pid"]):
        os.kill(st["pid"], signal.SIGTERM)
        for _ in range(50):
            if not _alive(st["pid"]):
                break
            time.sleep(0.1)
        else:
            os.kill(st["pid"], signal.SIGKILL)
        print(f"stopped {a.name} (pid {st['pid']})")
    else:
        print(f"{a.name} was not running")


def cmd_status(a) -> None:
    st = _state(a.name)
    st["running"] = _alive(st["pid"])
    print(json.dumps(st, indent=2))


def cmd_ssh(a) -> None:
    st = _state(a.name)
    kh = _rundir(a.name) / "known_hosts"
    kh.write_text(f"[{st['address']}]:{st['port']} {st['host_key_line']}\n")
    argv = [
        "ssh",
        "-i",
        st["private_key_path"],
        "-p",
        str(st["port"]),
        "-o",
        f"UserKnownHostsFile={kh}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "IdentitiesOnly=yes",
        f"{st['user']}@{st['address']}",
        *a.command,
    ]
    os.execvp("ssh", argv)


def cmd_capture(a) -> None:
    from testbed.testhost.capture import capture

    capture(Path(a.out))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m testbed.testhost", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--force", action="store_true", help="rebuild even if the cache is current")
    s = sub.add_parser("start")
    s.add_argument("--no-iommu", action="store_true", help="leave the intel-iommu device out (VT-d off)")
    s.add_argument(
        "--by-up",
        choices=("cli", "driver"),
        help="started by ./gpuhost.sh up, which points the dev stack at the host itself (through the pulumi CLI or "
        "the deployment driver): the banner says so instead of how to do it by hand",
    )
    for name in ("stop", "status"):
        sub.add_parser(name)
    c = sub.add_parser("capture")
    c.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "testhost"))
    x = sub.add_parser("ssh")
    x.add_argument("command", nargs=argparse.REMAINDER)
    for sp in sub.choices.values():
        if sp.prog.split()[-1] not in ("build", "capture"):
            sp.add_argument("--name", default="dev")
    a = p.parse_args(argv)
    {
        "build": cmd_build,
        "start": cmd_start,
        "stop": cmd_stop,
        "status": cmd_status,
        "ssh": cmd_ssh,
        "capture": cmd_capture,
    }[a.cmd](a)


if __name__ == "__main__":
    main()
