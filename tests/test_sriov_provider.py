"""SriovVfs' check through the SDK's provider server, against a real host here (this machine over the local sshd,
which has no SR-IOV PF): bad inputs fail before SSH, an unknown PF fails after one real facts read, and values not
known during preview skip the host entirely. The emulated host's PF is exercised in test_sriov_testhost.py."""

import pytest
from pulumi.output import Unknown

from providers.base import host_input
from providers.sriov import UNKNOWN, SriovVfs, SriovVfsProvider
from testbed.provider_server import ProviderError

TYPE = "gpuhost:host:SriovVfs"


def _inputs(spec, **over):
    return {
        "host": host_input(spec),
        "pf": "0000:82:00.0",
        "num_vfs": 2,
        **SriovVfs.DEFAULTS,  # what the resource fills in for fields the stack leaves out
        **{k: None for k in SriovVfsProvider.OUTPUT_ONLY},
        "version": SriovVfsProvider.VERSION,
        **over,
    }


def test_bad_inputs_fail_in_check_without_touching_the_host(local_sshd, provider_server_for):
    r = provider_server_for().resource(SriovVfsProvider(), TYPE, "bad")
    spec = local_sshd.host_spec()
    for over, field in (
        ({"pf": "0000:82:00.0; reboot"}, "pf"),
        ({"num_vfs": -1}, "num_vfs"),
        ({"numa_policy": "maybe"}, "numa_policy"),
        ({"vfs": [{"mac": "nope"}]}, "vfs.0.mac"),
        ({"irq_cpus": [-1]}, "irq_cpus"),
    ):
        with pytest.raises(ProviderError) as e:
            r.check(_inputs(spec, **over))
        assert e.value.details.startswith(field), e.value.details
    with pytest.raises(ProviderError) as e:
        r.check({k: v for k, v in _inputs(spec).items() if k != "host"})
    assert "host: missing" in e.value.details


def test_reading_a_pf_is_one_round_trip_by_address_or_by_an_unknown_name(conn):
    """``read_state``: facts, the PF's detail and its boot unit in one round trip for a PCI address; a name is
    resolved from a facts read first, and a name no interface has is answered from that one read (it was read twice
    before)."""
    from access import ssh
    from providers.sriov import read_state

    def hits() -> int:
        return ssh.ROUNDTRIPS.by_host.get(conn.spec.name, 0)

    for pf in ("0000:ff:1f.7", "gpuhostnone0"):
        n = hits()
        facts, detail, unit, addr = read_state(conn, pf)
        assert hits() - n == 1 and addr == pf and unit is None and not detail.irqs, pf
        assert facts.kernel and facts.boot_id and pf not in facts.pci


def test_unknown_pf_fails_after_one_real_read_and_unknowns_skip_the_host(local_sshd, provider_server_for):
    srv = provider_server_for()
    r = srv.resource(SriovVfsProvider(), TYPE, "unknown-pf")
    spec = local_sshd.host_spec()
    with pytest.raises(ProviderError) as e:
        r.check(_inputs(spec, pf="0000:ff:1f.7"))
    assert "pf: unknown PF 0000:ff:1f.7: no such PCI device on this host" in e.value.details
    with pytest.raises(ProviderError) as e:
        r.check(_inputs(spec, pf="gpuhostnone0"))
    assert "unknown PF 'gpuhostnone0'" in e.value.details
    # During preview a value from another resource may be unknown: check passes it on without reading the host.
    checked = r.check(_inputs(spec, pf=UNKNOWN))
    assert isinstance(checked["pf"], Unknown) and checked.get("plan") is None
