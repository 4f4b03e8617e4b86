"""PassthroughHost on the emulated GPU server, every provider driven through the SDK's provider server.

On the session's shared host (left as found: the module ends with destroy and a reboot): apply (one reboot) → second run is a no-op → hand-edited grub shows as drift →
destroy restores every file byte for byte and, after a reboot, the original drivers. Plus: a host dropping the SSH
connection mid-apply, and preflight refusing bad input without touching the host.
"""

from __future__ import annotations

import threading
import time

import pytest

from components import passthrough_host
from stacks.args import passthrough_args
from stacks.schema import Host
from tests.engine import ChildFlow, ProviderError, ProviderServer
from tests.testhost.fixtures import kernel_starts

pytestmark = pytest.mark.testhost

GPU = "0000:81:00.0"
AUDIO = "0000:81:00.1"
WATCHED = [
    "/etc/default/grub",
    "/boot/grub/grub.cfg",
    "/etc/modules-load.d/gpuhost-vfio.conf",
    "/etc/modprobe.d/gpuhost-vfio.conf",
    "/etc/modprobe.d/gpuhost-blacklist-nouveau.conf",
    "/etc/default/irqbalance",
    "/etc/sysctl.d/99-gpuhost.conf",
    "/etc/systemd/system/gpuhost-hugepages.service",
    "/etc/systemd/system/multi-user.target.wants/gpuhost-hugepages.service",
    f"/etc/driverctl.d/pci-{GPU}",
    f"/etc/driverctl.d/pci-{AUDIO}",
]


def hostname(th) -> str:
    return th.name.replace("_", "-").lower()


def host_config(th, **over) -> Host:
    cfg = {
        "name": hostname(th),
        "ssh": {
            "address": th.address,
            "port": th.port,
            "user": th.user,
            "host_key": th.host_key_line,
            "key_name": "sshPrivateKey",
        },
        "topology": {
            "sockets": 2,
            "cores_per_socket": 2,
            "threads_per_core": 2,
            "memory_gib_per_node": 2,
            "numbering": "sequential",
        },
        "reserved_cpus": "0-1",
        "gpus": [{"address": GPU, "numa_node": 1, "functions": [0, 1]}],
        "hugepages": {"size": "2M", "per_node": {1: 64}},
        "tuning": {
            "tuned_profile": "latency-performance",
            "governor": "performance",
            "sysctls": {"net.core.somaxconn": "4096", "net.ipv4.tcp_fin_timeout": "10"},
        },
        "irq_pin": ["nvme"],
    }
    cfg.update(over)
    return Host.model_validate(cfg)


def host_flow(srv: ProviderServer, h: Host) -> ChildFlow:
    """PassthroughHost's own children (components.passthrough_host.children) driven through the provider server."""
    return ChildFlow(srv, h.name, passthrough_host.children(h.name, passthrough_args(h)))


def snapshot(th) -> dict:
    """sha256, mode and owner of every watched file (or absence), in one round trip."""
    out = th.ssh(
        "for f in " + " ".join(WATCHED) + "; do if [ -e $f ]; then echo \"$f $(stat -c '%a %u %g' $f) "
        '$(sha256sum < $f | cut -c1-64)"; else echo "$f absent"; fi; done'
    ).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def runtime(th) -> dict:
    out = th.ssh(
        f"cat /proc/cmdline; basename $(readlink /sys/bus/pci/devices/{GPU}/driver 2>/dev/null) 2>/dev/null "
        f"|| echo none; basename $(readlink /sys/bus/pci/devices/{AUDIO}/driver 2>/dev/null) 2>/dev/null "
        "|| echo none; cat /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages; "
        "cat /proc/sys/kernel/random/boot_id; sysctl -n net.core.somaxconn"
    ).stdout.splitlines()
    return {
        "cmdline": out[0].split(),
        "gpu": out[1],
        "audio": out[2],
        "hugepages1": int(out[3]),
        "boot_id": out[4],
        "somaxconn": out[5],
    }


@pytest.fixture(scope="module")
def roundtrip_log(tmp_path_factory):
    return tmp_path_factory.mktemp("rt") / "roundtrips.log"


@pytest.fixture(scope="module")
def server(testhost, roundtrip_log):
    import os

    os.environ["GPUHOST_ROUNDTRIP_LOG"] = str(roundtrip_log)  # inherited by the provider server process
    try:
        with ProviderServer({"gpuhost:sshPrivateKey": testhost.private_key_pem}) as srv:
            yield srv
    finally:
        os.environ.pop("GPUHOST_ROUNDTRIP_LOG", None)


@pytest.fixture(scope="module")
def pristine(testhost):
    return {"files": snapshot(testhost), "run": runtime(testhost), "boots": kernel_starts(testhost)}


@pytest.fixture(scope="module")
def applied(testhost, server, pristine):
    flow = host_flow(server, host_config(testhost))
    t0 = time.monotonic()
    ops = flow.up()
    took = time.monotonic() - t0
    return flow, ops, took


def test_reading_all_facts_is_one_round_trip(testhost):
    from access import ssh as access_ssh
    from facts.host import read_host_facts

    conn = testhost.conn()
    before = access_ssh.ROUNDTRIPS.by_host[conn.spec.name]
    f = read_host_facts(conn, sysctls=["vm.nr_hugepages"], files=["/etc/default/grub"])
    assert access_ssh.ROUNDTRIPS.by_host[conn.spec.name] == before + 1
    assert f.device(GPU).numa_node == 1 and f.files["/etc/default/grub"].exists and f.sysctls["vm.nr_hugepages"]


def test_preflight_failures_change_nothing(testhost, server, pristine):
    """Unknown PCI address, a GPU in the dirty group, the boot display: check fails, no file changes."""
    for gpu, words in [
        ("0000:99:00.0", "unknown PCI address"),
        ("0000:43:01.0", "not clean"),
        ("0000:00:02.0", "boot display"),
    ]:
        h = host_config(testhost, gpus=[{"address": gpu}])
        flow = host_flow(server, h)
        with pytest.raises(ProviderError) as e:
            flow.up()
        assert words in e.value.details, e.value.details
        assert flow.res["cmdline"].id is None  # preflight failed first: nothing else was attempted
    assert snapshot(testhost) == pristine["files"]


def test_first_apply_needs_exactly_one_reboot(testhost, applied, pristine):
    flow, ops, took = applied
    assert set(ops.values()) == {"create"}
    after = runtime(testhost)
    assert after["boot_id"] != pristine["run"]["boot_id"]
    assert flow.res["reboot"].outputs["rebooted"] is True and flow.res["reboot"].outputs["pending"] == []
    assert {"intel_iommu=on", "iommu=pt"} <= set(after["cmdline"])
    assert after["gpu"] == "vfio-pci" and after["audio"] == "vfio-pci"
    assert after["hugepages1"] == 64
    assert after["somaxconn"] == "4096"
    banned = testhost.ssh("grep ^IRQBALANCE_BANNED_CPULIST= /etc/default/irqbalance").stdout.strip()
    assert banned == "IRQBALANCE_BANNED_CPULIST=2-7"
    # exactly one reboot: the serial console shows one more kernel start than before the apply
    assert kernel_starts(testhost) == pristine["boots"] + 1


def test_second_run_plans_no_change_and_no_reboot(testhost, applied, roundtrip_log):
    flow, _, _ = applied
    boot = runtime(testhost)["boot_id"]
    roundtrip_log.write_text("")
    previews = flow.preview()
    assert {k: v.changes for k, v in previews.items()} == {k: False for k in previews}
    assert set(flow.up().values()) == {"same"}
    # preview + up of an unchanged stack: only preflight's check reads the host, one round trip each time (read
    # before the test's own SSH check below, which the same log records under the same host name)
    lines = [x for x in roundtrip_log.read_text().splitlines() if x == hostname(testhost)]
    assert runtime(testhost)["boot_id"] == boot
    assert len(lines) == 2 and len(lines) <= len(flow.suffixes)


def test_hand_edit_of_grub_is_drift(testhost, applied):
    flow, _, _ = applied
    testhost.ssh("sed -i 's/^GRUB_CMDLINE_LINUX=.*/GRUB_CMDLINE_LINUX=\"quiet\"/' /etc/default/grub")
    refreshed = flow.res["cmdline"].refresh()
    assert refreshed["configured"] == ["quiet"]
    assert flow.res["cmdline"].preview(flow.inputs("cmdline")).changes is True
    assert flow.res["cmdline"].up(flow.inputs("cmdline"))[0] == "update"
    assert 'GRUB_CMDLINE_LINUX="quiet intel_iommu=on iommu=pt"' in testhost.ssh("cat /etc/default/grub").stdout


def test_dropped_connection_mid_apply_is_clear_and_rerun_converges(testhost, server, applied):
    """The host drops every SSH session while a provider is writing; the error names the host, a re-run converges."""
    flow, _, _ = applied
    sysctl = flow.res["sysctls"]
    inputs = flow.inputs("sysctls")
    inputs["values"] = {**inputs["values"], "net.core.netdev_max_backlog": "250000"}

    def drop():
        time.sleep(0.5)
        testhost.ssh("nohup sh -c 'pkill -KILL -f \"sshd: gpuadmin\"' >/dev/null 2>&1 &", check=False)

    killer = threading.Thread(target=drop)
    # slow the apply down on the host so the drop lands inside it
    testhost.ssh(
        "printf '#!/bin/sh\\nsleep 5\\nexec /sbin/sysctl \"$@\"\\n' > /usr/local/sbin/sysctl; "
        "chmod +x /usr/local/sbin/sysctl"
    )
    killer.start()
    with pytest.raises(ProviderError) as e:
        sysctl.up(inputs)
    killer.join()
    assert hostname(testhost) in e.value.details and ("connection" in e.value.details or "closed" in e.value.details)
    testhost.wait_ssh(120)
    testhost.ssh("rm -f /usr/local/sbin/sysctl")
    assert sysctl.up(inputs)[0] == "update"
    assert testhost.ssh("sysctl -n net.core.netdev_max_backlog").stdout.strip() == "250000"
    assert sysctl.preview(inputs).changes is False


def test_destroy_restores_files_byte_for_byte_and_drivers_after_reboot(testhost, applied, pristine):
    flow, _, _ = applied
    flow.destroy()
    snap = snapshot(testhost)
    # grub.cfg is regenerated from the restored /etc/default/grub (update-grub); its bytes may embed a
    # timestamp-free but kernel-list-dependent text, so compare what generates it
    for path in WATCHED:
        if path != "/boot/grub/grub.cfg":
            assert snap[path] == pristine["files"][path], path
    testhost.reboot()
    back = runtime(testhost)
    assert back["gpu"] == pristine["run"]["gpu"] and back["audio"] == pristine["run"]["audio"]
    assert "intel_iommu=on" not in back["cmdline"] and back["hugepages1"] == pristine["run"]["hugepages1"]
    assert back["somaxconn"] == pristine["run"]["somaxconn"]
    assert snapshot(testhost)["/boot/grub/grub.cfg"] == pristine["files"]["/boot/grub/grub.cfg"]


def test_preflight_without_iommu_names_the_fix(testhost_noiommu):
    """The emulated server is itself a QEMU guest: preflight says so and names the vIOMMU fix, not a BIOS setting
    (the bare-metal wording, "enable VT-d", is tested on captures in tests/test_guards.py)."""
    th = testhost_noiommu
    before = snapshot(th)
    with ProviderServer({"gpuhost:sshPrivateKey": th.private_key_pem}) as srv:
        flow = host_flow(srv, host_config(th))
        with pytest.raises(ProviderError) as e:
            flow.up()
    assert "no DMAR/IVRS ACPI table" in e.value.details and "VM guest" in e.value.details
    assert "intel-iommu" in e.value.details and "enable VT-d" not in e.value.details
    assert snapshot(th) == before
