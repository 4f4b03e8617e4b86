"""`./gpuhost.sh up`: boot the emulated GPU server, point the dev stack at it, preview and up the dev stack.

With the Pulumi CLI on PATH it runs the real thing (`pulumi preview --diff`, `pulumi up`; state in `.pulumi-state/`,
file backend). Without it, it says so in one line and runs the same program through the deployment driver
(tools/driver: the engine's semantics, state in `.pulumi-state/driver/dev.json`), so a new machine still shows the
emulated server prepared, the preview, the diff and the outcome. The dev stack's passphrase is "gpuhost-dev".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PASSPHRASE = "gpuhost-dev"


def emulated_host(by: str) -> dict:
    """Boot (or reuse) the emulated server named dev; returns its state (port, host key line, key path). `by`: "cli"
    or "driver", how this run points the dev stack at it (the host's banner says so instead of a by-hand hint)."""
    py = str(ROOT / ".venv" / "bin" / "python")
    st = subprocess.run(
        [py, "-m", "testbed.testhost", "status", "--name", "dev"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if st.returncode != 0 or not json.loads(st.stdout or "{}").get("running"):
        print("== booting the emulated GPU server (QEMU; a few minutes under TCG)", flush=True)
        subprocess.run([py, "-m", "testbed.testhost", "start", "--name", "dev", "--by-up", by], cwd=ROOT, check=True)
        st = subprocess.run(
            [py, "-m", "testbed.testhost", "status", "--name", "dev"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(st.stdout)


def with_cli(pulumi: str, st: dict) -> int:
    env = dict(
        os.environ,
        PULUMI_BACKEND_URL=os.environ.get("PULUMI_BACKEND_URL", f"file://{ROOT}/.pulumi-state"),
        PULUMI_CONFIG_PASSPHRASE=os.environ.get("PULUMI_CONFIG_PASSPHRASE", PASSPHRASE),
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


def dev_config(st: dict, passphrase: str):
    """Pulumi.dev.yaml with the booted server's port, host key and per-run key (secret), as `pulumi config set`
    would leave it; the file itself is not rewritten."""
    from tools.driver import StackConfig

    cfg = StackConfig.load(ROOT, "dev", passphrase)
    fleet = json.loads(cfg.values["gpuhost:fleet"])
    fleet["hosts"][0]["ssh"].update(port=st["port"], host_key=st["host_key_line"])
    cfg = cfg.with_values(fleet=fleet, sshPrivateKey=Path(st["private_key_path"]).read_text())
    if "gpuhost:sshPrivateKey" not in cfg.secret_keys:
        cfg.secret_keys.append("gpuhost:sshPrivateKey")
    return cfg


def with_driver(st: dict) -> int:
    from tools.driver import Driver

    passphrase = os.environ.get("PULUMI_CONFIG_PASSPHRASE", PASSPHRASE)
    d = Driver(ROOT, "dev", passphrase=passphrase, config=dev_config(st, passphrase))
    outcome = d.preview()
    if outcome.errors:
        return 1
    return 1 if d.up().errors else 0


def main() -> int:
    pulumi = shutil.which("pulumi")
    if not pulumi:
        print(
            "pulumi CLI not found on PATH (https://www.pulumi.com/docs/install/): running the dev stack through "
            "gpuhost's deployment driver (tools/driver) instead.",
            flush=True,
        )
    st = emulated_host("cli" if pulumi else "driver")
    return with_cli(pulumi, st) if pulumi else with_driver(st)


if __name__ == "__main__":
    sys.exit(main())
