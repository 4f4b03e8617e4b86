"""The SSH-NIC guard on the emulated server: the management address on a bridge, on a bond, and sshd on another
port — binding the NIC under the session is refused in preview (HostPreflight's check) and by VfioBinding itself.

The guest's NIC is the e1000e at 0000:41:00.0 (QEMU user-mode net forwards 127.0.0.1:<port> to it). Each topology is
made by one detached script in the guest, so our own SSH session never depends on a half-done move, with a
dead-man restore should the test lose the host; the test restores it itself and checks the NIC is back.
Set GPUHOST_CAPTURE_DIR to keep the raw facts of each topology (tests/fixtures/facts/testhost_*.txt came from here).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from access import keys
from access import ssh as access_ssh
from access.shell import quote
from facts.host import parse_host_facts, read_raw, split_sections
from providers.base import host_input
from providers.preflight import HostPreflightProvider
from providers.vfio import VfioBindingProvider
from testbed.provider_server import ProviderError, ProviderServer
from testbed.servers import free_port
from testbed.testhost.machine import hmp

pytestmark = pytest.mark.testhost

NIC = "0000:41:00.0"
KEY = "sshPrivateKey"

_MOVE = r"""
IF=$(ls /sys/bus/pci/devices/0000:41:00.0/net)
A=$(ip -o -4 addr show dev "$IF" | awk '{print $4; exit}')
R=$(ip -4 route show default | head -n 1)
MAC=$(cat /sys/class/net/$IF/address)
cat > /run/gpuhost-restore.sh <<EOF
ip addr flush dev __UPPER__ 2>/dev/null
ip link set $IF nomaster 2>/dev/null
ip link del __UPPER__ 2>/dev/null
ip link set $IF up
ip addr add $A dev $IF 2>/dev/null
[ -n "$R" ] && ip route replace $R dev $IF
rm -f /run/systemd/network/00-gpuhost-test.network
networkctl reload
true
EOF
cat > /run/gpuhost-move.sh <<EOF
set -x
mkdir -p /run/systemd/network
printf '[Match]\\nName=%s\\n\\n[Link]\\nUnmanaged=yes\\n' $IF > /run/systemd/network/00-gpuhost-test.network
networkctl reload
__MAKE__
ip link set __UPPER__ address $MAC
ip link set __UPPER__ up
ip -4 addr flush dev $IF
ip addr add $A dev __UPPER__
[ -n "$R" ] && ip route replace $R dev __UPPER__
sleep 240; [ -e /sys/class/net/__UPPER__ ] && sh /run/gpuhost-restore.sh
EOF
setsid sh /run/gpuhost-move.sh >/run/gpuhost-move.log 2>&1 </dev/null &
echo "$IF"
"""

TOPOLOGIES = {
    "bridge": ("br0", "ip link add br0 type bridge; ip link set $IF master br0"),
    "bond": (
        "bond0",
        "ip link add bond0 type bond mode active-backup; ip link set $IF down; ip link set $IF master bond0",
    ),
}


def _run(th, command: str, timeout: float = 120):
    """th.ssh, riding out the moment the address moves (the pooled connection may need a fresh one)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return th.ssh(command, timeout=60)
        except access_ssh.HostUnreachable:
            if time.monotonic() > deadline:
                raise
            access_ssh.close_all()
            time.sleep(2)


def _capture(name: str, raw: str) -> None:
    d = os.environ.get("GPUHOST_CAPTURE_DIR")
    if d:
        Path(d, f"testhost_{name}.txt").write_text(raw)


@contextmanager
def address_on(th, kind: str):
    upper, make = TOPOLOGIES[kind]
    script = _MOVE.replace("__MAKE__", make).replace("__UPPER__", upper)
    iface = th.ssh(script).stdout.strip()
    try:
        _run(
            th,
            f"for i in $(seq 60); do ip -o -4 addr show dev {quote(upper)} | grep -q inet && exit 0; sleep 1; "
            "done; cat /run/gpuhost-move.log; exit 1",
        )
        yield iface, upper
    finally:
        _run(th, "setsid sh /run/gpuhost-restore.sh >/run/gpuhost-restore.log 2>&1 </dev/null &")
        # networkd manages the NIC again and its DHCP lease puts the address back: wait for both.
        _run(
            th,
            f"for i in $(seq 120); do [ ! -e /sys/class/net/{upper} ] && ip -o -4 addr show dev {quote(iface)} "
            "| grep -q inet && exit 0; sleep 1; done; exit 1",
        )
        out = _run(th, f"ip -o -4 addr show dev {quote(iface)}; readlink /sys/bus/pci/devices/{NIC}/driver").stdout
        assert "inet " in out and out.strip().endswith("/e1000e"), out


@pytest.fixture
def server(testhost):
    """A provider server per test: its connections (and their ports) are the test's own."""
    keys.set_private_key(KEY, testhost.private_key_pem)  # this process reads the host too (facts captures)
    with ProviderServer({f"gpuhost:{KEY}": testhost.private_key_pem}) as srv:
        yield srv


def _preview_refuses(server, spec, name: str) -> str:
    r = server.resource(HostPreflightProvider(), "gpuhost:host:HostPreflight", f"{name}-preflight")
    with pytest.raises(ProviderError) as e:
        r.check(
            {
                "host": host_input(spec),
                "gpus": [],
                "devices": [NIC],
                "enables_iommu": True,
                "acs_override_acknowledged": False,
                "allow_unsafe_interrupts_acknowledged": False,
                "bind_by_ids": False,
                "report": None,
                "failed": None,
                "version": HostPreflightProvider.VERSION,
            }
        )
    return str(e.value)


def _provider_refuses(server, spec, name: str) -> str:
    r = server.resource(VfioBindingProvider(), "gpuhost:host:VfioBinding", f"{name}-vfio")
    inputs = {
        "host": host_input(spec),
        "devices": [NIC],
        "mode": "address",
        "blacklist_nouveau": False,
        "disable_vga": False,
        "prior": None,
        "prior_drivers": None,
        "prior_overrides": None,
        "drivers": None,
        "pending_reboot": None,
        "version": VfioBindingProvider.VERSION,
    }
    checked = r.check(inputs)  # the provider's own check is pure; the host is read when it would bind
    with pytest.raises(ProviderError) as e:
        r.create(checked)
    return str(e.value)


def _unchanged(th) -> None:
    # Nothing bound, no file written, and no pristine record left by the refused create (it would refuse the next
    # owner of those files).
    out = th.ssh(
        f"readlink /sys/bus/pci/devices/{NIC}/driver; ls /etc/modprobe.d /etc/driverctl.d 2>/dev/null; "
        "{ find /var/lib/gpuhost/pristine -name '*.owner' 2>/dev/null || true; }"
    ).stdout
    assert out.splitlines()[0].endswith("/e1000e") and "gpuhost-vfio" not in out and f"pci-{NIC}" not in out, out


@pytest.mark.parametrize("kind", ["bridge", "bond"])
def test_nic_under_a_bridge_or_bond_is_refused(testhost, server, kind):
    th = testhost
    spec = th.host_spec(key_name=KEY)
    with address_on(th, kind) as (iface, upper):
        raw = read_raw(access_ssh.connect(spec))
        _capture(kind, raw)
        facts = parse_host_facts(raw)
        assert iface in facts.network.lower[upper] and upper in facts.network.ssh_ifaces
        log = th.ssh("cat /run/gpuhost-move.log").stdout
        assert iface not in facts.network.ssh_ifaces, log  # the NIC has no address: the old guard saw nothing here
        assert NIC in facts.network.protected_pci
        preview = _preview_refuses(server, spec, f"guard-{kind}")
        assert f"{NIC} carries the SSH session or the default route (through {upper})" in preview
        bound = _provider_refuses(server, spec, f"guard-{kind}")
        assert f"{NIC} carries the SSH session or the default route (through {upper})" in bound
        _unchanged(th)


def test_sshd_on_another_port_is_refused(testhost, server):
    th = testhost
    port = free_port()
    th.ssh("/usr/sbin/sshd -p 2022 -o PidFile=/run/sshd-2022.pid")
    reply = hmp(th.workdir / "qmp.sock", f"hostfwd_add net0 tcp:127.0.0.1:{port}-:2022")
    assert "error" not in str(reply), reply
    try:
        spec = th.host_spec(key_name=KEY, port=port)
        access_ssh.close_all()  # no session of ours on port 22 while the host is read
        conn = access_ssh.connect(spec)
        # Closed sessions linger a moment in a TCG guest: wait until none is established on port 22.
        conn.run(
            "for i in $(seq 90); do [ -z \"$(ss -Htn state established '( sport = :22 )')\" ] && exit 0; "
            "sleep 1; done; exit 1"
        )
        raw = read_raw(conn)
        _capture("sshd_2022", raw)
        facts = parse_host_facts(raw)
        assert facts.network.session.endswith(" 2022")
        assert split_sections(raw).get("net-ssh", "").strip() == ""  # what the port-22 guard saw: nothing
        assert NIC in facts.network.protected_pci
        assert f"{NIC} carries the SSH session" in _preview_refuses(server, spec, "guard-2022")
        assert f"{NIC} carries the SSH session" in _provider_refuses(server, spec, "guard-2022")
        access_ssh.close_all()
        _unchanged(th)
    finally:
        hmp(th.workdir / "qmp.sock", f"hostfwd_remove net0 tcp:127.0.0.1:{port}")
        access_ssh.close_all()
        th.ssh("kill $(cat /run/sshd-2022.pid)")
