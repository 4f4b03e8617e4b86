"""The emulated server's start banner says what to do next, and only what applies: `./gpuhost.sh up` (through the
pulumi CLI or the deployment driver) sets the dev stack's config itself; the `pulumi config set` hint is for a host
started by hand where that CLI exists. The host here is a plain record of what a started TestHost reports."""

from types import SimpleNamespace

import pytest

from testbed.testhost.__main__ import banner

HOST = SimpleNamespace(
    timings={"boot_s": 71.5},
    serial_log="/tmp/serial.log",
    address="127.0.0.1",
    port=42425,
    user="gpuadmin",
    private_key_path="/tmp/key",
    host_key_line="ssh-ed25519 AAAAtest",
)


@pytest.mark.parametrize("by_up,cli", [("driver", False), ("driver", True), ("cli", True)])
def test_started_by_up_no_config_hint(by_up, cli):
    text = banner(HOST, "dev", by_up, cli)
    assert "config set --secret" not in text and "Point the dev stack" not in text
    assert "./gpuhost.sh up" in text and "port:             42425" in text
    assert ("deployment driver" in text) == (by_up == "driver")


def test_by_hand_with_the_cli_keeps_the_hint():
    text = banner(HOST, "lab", None, True)
    assert "pulumi config set --secret gpuhost:sshPrivateKey < /tmp/key" in text
    assert 'host_key: "ssh-ed25519 AAAAtest"' in text and "--name lab" in text


def test_by_hand_without_the_cli_points_at_up():
    text = banner(HOST, "dev", None, False)
    assert "pulumi config set" not in text and "No pulumi CLI on PATH" in text
