"""PassthroughHost on the emulated GPU server, its children driven through the SDK's provider server: reading the
host is one round trip, and preflight refuses bad input (an unknown device, a dirty IOMMU group, the boot display, a
host without an IOMMU) without touching the host.

The walk a user takes (apply with one reboot → no-op run → hand-edited grub as drift → destroy restoring every file
byte for byte and, after a reboot, the original drivers) runs through the whole program and the deployment driver in
tests/test_dev_stack_e2e.py; a connection dropped mid-apply, per provider, in tests/test_state_testhost.py. The
values and what those tests compare (WATCHED, snapshot, runtime) are in testbed/testhost/passthrough.py.
"""

from __future__ import annotations

import pytest

from testbed.provider_server import ProviderError, ProviderServer
from testbed.testhost.fixtures import kernel_starts
from testbed.testhost.passthrough import GPU, host_config, host_flow, runtime, snapshot

pytestmark = pytest.mark.testhost


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
