"""SystemdService on the emulated GPU server, driven through the SDK's provider server like the engine drives it,
deploying the adaptive-window controller exactly as TritonService does (the unit TritonService renders, the
stdlib-only controller run by the guest's own python3): written, enabled, started; its /metrics answers on the
guest; a unit stopped by hand is drift that `up` repairs; delete stops it and restores the host byte for byte.
There is no Triton on this host: the controller counts failed periods, which is what it must do without one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from plans.adaptive_window import SCRIPT_PATH, UNIT_NAME, UNIT_PATH, AdaptiveWindow, controller_unit
from providers.systemd_service import SystemdServiceProvider
from testbed.provider_server import ProviderServer

pytestmark = pytest.mark.testhost
ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = (
    "for f in $(find /etc/systemd/system /usr/local/lib \\( -type f -o -type l \\) 2>/dev/null | sort); do "
    "if [ -L $f ]; then echo L $f $(readlink $f); else echo F $f $(sha256sum < $f | cut -c1-16) "
    "$(stat -c '%a %u %g' $f); fi; done"
)
METRICS = "python3 -c 'import urllib.request;print(urllib.request.urlopen(\"http://127.0.0.1:9108/metrics\").read().decode())'"


def _metrics(testhost, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        r = testhost.ssh(METRICS, check=False)
        if (r.rc == 0 and "gpuhost_adaptive_window_errors_total" in r.stdout) or time.monotonic() > deadline:
            return r.stdout
        time.sleep(1.0)


def test_controller_unit_written_enabled_started_drift_repaired_and_restored(testhost):
    before = testhost.ssh(SNAPSHOT).stdout
    unit = controller_unit(
        AdaptiveWindow(period_s=1, listen="127.0.0.1:9108"),
        ["standin"],
        triton_url="http://127.0.0.1:8000",
        metrics_url="http://127.0.0.1:8002",
    )
    inputs = {
        "host": testhost.host_spec(key_name="sshPrivateKey").model_dump(mode="json"),
        "unit": UNIT_NAME,
        "files": {UNIT_PATH: unit, SCRIPT_PATH: (ROOT / "serving" / "adaptive_window.py").read_text()},
        "priors": None,
        "sha256": None,
        "enabled": True,
        "active": True,
        "version": SystemdServiceProvider.VERSION,
    }
    with ProviderServer(config={"gpuhost:sshPrivateKey": testhost.private_key_pem}) as srv:
        r = srv.resource(SystemdServiceProvider(), "gpuhost:host:SystemdService", "adaptive-window")
        op, outs = r.up(inputs)
        assert op == "create" and not outs["priors"][UNIT_PATH]["exists"]
        assert testhost.ssh(f"systemctl is-enabled {UNIT_NAME}; systemctl is-active {UNIT_NAME}").stdout.split() == [
            "enabled",
            "active",
        ]
        text = _metrics(testhost)
        assert 'gpuhost_adaptive_window_target_p95_ms{model="standin"} 50' in text, text
        assert 'gpuhost_adaptive_window_bound_us{model="standin",bound="max"} 1500' in text, text

        assert r.preview(inputs).changes is False
        assert r.up(inputs)[0] == "same"

        testhost.ssh(f"systemctl stop {UNIT_NAME}")
        assert r.refresh()["active"] is False
        assert r.preview(inputs).changes is True
        assert r.up(inputs)[0] == "update"
        assert testhost.ssh(f"systemctl is-active {UNIT_NAME}").stdout.strip() == "active"

        r.destroy()
    assert testhost.ssh(f"systemctl is-active {UNIT_NAME}", check=False).stdout.strip() in ("inactive", "unknown")
    assert testhost.ssh(SNAPSHOT).stdout == before
