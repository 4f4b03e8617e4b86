"""`./gpuhost.sh up`: boot the emulated GPU server, point the dev stack at it, and `pulumi up` the dev stack.

Needs the Pulumi CLI (https://www.pulumi.com/docs/install/), which you install; it is the one thing gpuhost cannot
bring. State stays local (`.pulumi-state/`, file backend); the dev stack's passphrase is "gpuhost-dev".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    pulumi = shutil.which("pulumi")
    if not pulumi:
        print(
            "gpuhost up needs the Pulumi CLI on PATH (install it: https://www.pulumi.com/docs/install/).\n"
            "Everything else works without it: ./gpuhost.sh test runs the suite, and\n"
            "`.venv/bin/python -m tests.testhost start --name dev` boots the emulated server by hand.",
            file=sys.stderr,
        )
        return 3
    py = str(ROOT / ".venv" / "bin" / "python")
    state = Path.home() / ".cache" / "gpuhost" / "testhost" / "run" / "dev" / "state.json"
    if os.environ.get("GPUHOST_TESTHOST_CACHE"):
        state = Path(os.environ["GPUHOST_TESTHOST_CACHE"]) / "run" / "dev" / "state.json"
    if (
        subprocess.run(
            [py, "-m", "tests.testhost", "status", "--name", "dev"], cwd=ROOT, capture_output=True
        ).returncode
        != 0
    ):
        subprocess.run([py, "-m", "tests.testhost", "start", "--name", "dev"], cwd=ROOT, check=True)
    st = json.loads(state.read_text())
    env = dict(
        os.environ,
        PULUMI_BACKEND_URL=os.environ.get("PULUMI_BACKEND_URL", f"file://{ROOT}/.pulumi-state"),
        PULUMI_CONFIG_PASSPHRASE=os.environ.get("PULUMI_CONFIG_PASSPHRASE", "gpuhost-dev"),
    )
    (ROOT / ".pulumi-state").mkdir(exist_ok=True)

    def p(*args, **kw):
        return subprocess.run([pulumi, *args], cwd=ROOT, env=env, check=True, **kw)

    p("stack", "select", "dev", "--create")
    p("config", "set", "--path", "fleet.hosts[0].ssh.port", str(st["port"]))
    p("config", "set", "--path", "fleet.hosts[0].ssh.host_key", st["host_key_line"])
    with open(st["private_key_path"]) as key:
        p("config", "set", "--secret", "sshPrivateKey", stdin=key)
    p("preview", "--diff")
    p("up", "--yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
