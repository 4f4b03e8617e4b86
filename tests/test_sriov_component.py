"""SriovNic under Pulumi mocks: one SriovVfs child with the typed args as inputs, parented, unique URNs, no secret
in inputs, and `vf_addresses` passed through from the provider's output."""

import pulumi
import pytest
from pydantic import ValidationError

from access.ssh import HostSpec
from tests.componentmocks import use_mocks

HOST = HostSpec(name="hk-gpu01", address="10.0.0.5", user="ops", host_key="ssh-ed25519 " + "A" * 68)


def _vf_outputs(args, outs: dict) -> None:
    if "num_vfs" in outs:  # what SriovVfs' create returns: the VFs it made
        outs["vf_addresses"] = [f"0000:41:00.{2 + i}" for i in range(int(outs["num_vfs"]))]
        outs["pf_address"] = "0000:41:00.0"


def run(build):
    mocks = use_mocks(_vf_outputs)
    got: dict = {}

    @pulumi.runtime.test
    def program():
        nics = build()
        return pulumi.Output.all(
            *[n.vf_addresses for n in nics], *[n.urn for n in nics], *[n.vfs.urn for n in nics]
        ).apply(lambda v: got.update(values=v))

    program()
    return mocks.resources, got["values"]


def test_declares_one_parented_sriov_vfs_per_nic_and_passes_vf_addresses():
    from components.sriov_nic import SriovNic, SriovNicArgs
    from plans.sriov import VfSettings

    def build():
        return [
            SriovNic(
                "hk-gpu01-ens1f0",
                SriovNicArgs(
                    host=HOST, pf="41:00.0", num_vfs=2, numa_node=0, irq_cpus=[32, 0], vfs=[VfSettings(vlan=100)]
                ),
            ),
            SriovNic(
                "hk-gpu01-ens2f0",
                SriovNicArgs(host=HOST, pf="ens2f0", num_vfs=1, numa_node=1, numa_policy="prefer", vfio=False),
            ),
        ]

    resources, values = run(build)
    vf_a, vf_b, urn_a, urn_b, child_a, child_b = values
    assert vf_a == ["0000:41:00.2", "0000:41:00.3"] and vf_b == ["0000:41:00.2"]

    # Registration order of the children is the async runtime's, not the program's: compare by name.
    comps = sorted((r for r in resources if r.typ == "gpuhost:net:SriovNic"), key=lambda r: r.name)
    kids = sorted((r for r in resources if r.typ != "gpuhost:net:SriovNic"), key=lambda r: r.name)
    assert [c.name for c in comps] == ["hk-gpu01-ens1f0", "hk-gpu01-ens2f0"]
    assert [k.name for k in kids] == ["hk-gpu01-ens1f0-vfs", "hk-gpu01-ens2f0-vfs"]
    assert all(k.typ.endswith("host:SriovVfs") for k in kids)
    assert len({(r.typ, r.name) for r in resources}) == len(resources), "duplicate URNs"
    assert child_a.endswith("gpuhost:net:SriovNic$" + kids[0].typ + "::hk-gpu01-ens1f0-vfs")  # parented

    a = kids[0].inputs
    assert a["pf"] == "0000:41:00.0" and a["num_vfs"] == 2 and a["numa_node"] == 0 and a["vfio"] is True
    assert a["irq_cpus"] == [0, 32] and a["vfs"][0]["vlan"] == 100
    assert a["host"]["address"] == "10.0.0.5" and a["version"]
    assert not any("PRIVATE KEY" in str(v) for v in a.values()), "no secret in inputs"
    b = kids[1].inputs
    assert b["pf"] == "ens2f0" and b["numa_policy"] == "prefer" and b["vfio"] is False


def test_bad_args_fail_before_anything_is_declared():
    from components.sriov_nic import SriovNicArgs

    with pytest.raises(ValidationError):
        SriovNicArgs(host=HOST, pf="41:00.0 && reboot", num_vfs=1)
    with pytest.raises(ValidationError):
        SriovNicArgs(host=HOST, pf="41:00.0", num_vfs=1, numa_policy="maybe")
