"""PassthroughHost on the emulated GPU server, its children driven through the SDK's provider server: reading the
host is one round trip, and preflight refuses bad input (an unknown device, a dirty IOMMU group, the boot display, a
host without an IOMMU) without touching the host.

The walk a user takes (apply with one reboot → no-op run → hand-edited grub as drift → destroy restoring every file
byte for byte and, after a reboot, the original drivers) runs through the whole program and the deployment driver in
tests/test_dev_stack_e2e.py; a connection dropped mid-apply, per provider, in tests/test_state_testhost.py. WATCHED,
snapshot and runtime here are what those tests compare.
"""

from __future__ import annotations

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


def test_reading_all_facts_is_one_round_trip(testhost):
    from access import ssh as access_ssh
    from facts.host import read_host_facts

    conn = testhost.conn()
    before = access_ssh.ROUNDTRIPS.by_host[conn.spec.name]
    f = read_host_facts(conn, sysctls=["vm.nr_hugepages"], files=["/etc/default/grub"])
    assert access_ssh.ROUNDTRIPS.by_host[conn.spec.name] == before + 1
    gpu = f.device(GPU)
    assert (
        gpu is not None and gpu.numa_node == 1 and f.files["/etc/default/grub"].exists and f.sysctls["vm.nr_hugepages"]
    )


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
