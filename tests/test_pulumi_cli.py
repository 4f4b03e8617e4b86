"""Through the real engine: `pulumi preview`/`up`/`destroy` of the dev stack against the emulated GPU server.

The Pulumi CLI cannot be installed on the machines this project is built on; this test runs wherever `pulumi` is
on PATH and is reported as skipped elsewhere.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.pulumi_cli,
    pytest.mark.testhost,
    pytest.mark.skipif(
        shutil.which("pulumi") is None, reason="the Pulumi CLI is not on PATH (it cannot be installed here)"
    ),
]


def test_preview_up_noop_destroy_dev_stack(testhost, tmp_path):
    env = dict(
        os.environ,
        PULUMI_BACKEND_URL=f"file://{tmp_path}",
        PULUMI_CONFIG_PASSPHRASE="gpuhost-dev",
        PULUMI_SKIP_UPDATE_CHECK="1",
    )

    def pulumi(*args, **kw):
        return subprocess.run(
            ["pulumi", *args, "--stack", "dev", "--non-interactive"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
            **kw,
        )

    subprocess.run(["pulumi", "stack", "select", "dev", "--create", "--non-interactive"], cwd=ROOT, env=env, check=True)
    pulumi("config", "set", "--path", "fleet.hosts[0].ssh.port", str(testhost.port))
    pulumi("config", "set", "--path", "fleet.hosts[0].ssh.host_key", testhost.host_key_line)
    pulumi("config", "set", "--secret", "sshPrivateKey", input=testhost.private_key_pem)
    preview = pulumi("preview", "--json")
    steps = json.loads(preview.stdout)["steps"]
    assert any(s["op"] == "create" and s["urn"].endswith("emulated-gpu-01-cmdline") for s in steps)
    before = testhost.ssh("sha256sum /etc/default/grub").stdout
    assert testhost.ssh("sha256sum /etc/default/grub").stdout == before  # preview changed nothing
    pulumi("up", "--yes")
    assert "intel_iommu=on" in testhost.ssh("cat /proc/cmdline").stdout
    again = json.loads(pulumi("preview", "--json").stdout)
    assert all(s["op"] == "same" for s in again["steps"])
    pulumi("destroy", "--yes")
    assert testhost.ssh("sha256sum /etc/default/grub").stdout == before
