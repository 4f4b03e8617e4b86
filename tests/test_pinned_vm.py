"""PinnedVM under Pulumi mocks: one LibvirtDomain (and a GuestBootstrap when asked) per tenant, built from the
host-wide placement; types, parents, inputs, dependencies, unique URNs, no secret in inputs."""

import json
from pathlib import Path
from unittest import mock

import pulumi
import pytest

from access.ssh import HostSpec
from plans.domain_xml import CloudInit
from plans.guest_bootstrap import BootstrapConfig, MpsConfig
from plans.placement import VmRequest, host_from_dict, place
from tests.componentmocks import use_mocks

FIX = Path(__file__).parent / "fixtures" / "placement"
HOST = HostSpec(name="hk-gpu01", address="10.0.0.5", user="ops", host_key="ssh-ed25519 " + "A" * 68)


def _domain_outputs(args, outs: dict) -> None:
    """What LibvirtDomain and GuestBootstrap return."""
    outs.setdefault("uuid", f"uuid-{args.name}")
    outs.setdefault("state", "running")
    outs.setdefault("done", True)


def run_program(build):
    """Run a fresh program under mocks; returns (registrations, every child's URN by name)."""
    mocks = use_mocks(_domain_outputs)
    urns = {}

    @pulumi.runtime.test
    def program():
        comps = build()
        kids = [k for c in comps for k in (c.domain, c.bootstrap) if k is not None]
        return pulumi.Output.all(*[k.urn for k in kids]).apply(
            lambda us: urns.update({u.rsplit("::", 1)[1]: u for u in us})
        )

    program()
    return mocks.resources, urns


@pytest.fixture(scope="module")
def declared():
    from components.pinned_vm import PinnedVM, PinnedVMArgs

    host = host_from_dict(json.loads((FIX / "seed002_2x16c.json").read_text()))
    reqs = [
        VmRequest("tenant-a", 8, 16384, gpus=("0000:65:00.0", "0000:65:00.1"), vfs=("0000:41:02.0",), iothreads=1),
        VmRequest("tenant-b", 8, 16384, gpus=("0000:ca:00.0", "0000:ca:00.1"), vfs=("0000:c1:02.0",)),
    ]
    plan = place(host, reqs)
    guest = HostSpec(
        name="tenant-a",
        address="192.168.122.10",
        user="ops",
        host_key="ssh-ed25519 " + "B" * 68,
        jump={"address": "10.0.0.5", "user": "ops", "host_key": "ssh-ed25519 " + "A" * 68},
    )

    def build():
        out = []
        for r in reqs:
            extra = {}
            if r.name == "tenant-a":
                extra = dict(
                    guest=guest,
                    bootstrap=BootstrapConfig(mps=MpsConfig(instances={"t1": 60, "t2": 40})),
                    consumer_card=True,
                )
            out.append(
                PinnedVM(
                    r.name,
                    PinnedVMArgs(
                        host=HOST,
                        placement=plan.vm(r.name),
                        gpus=r.gpus,
                        vfs=r.vfs,
                        base_image="/var/lib/libvirt/images/jammy.qcow2",
                        cloud_init=CloudInit(user="ops", ssh_authorized_keys=("ssh-ed25519 AAAAC3Nz ops@laptop",)),
                        **extra,
                    ),
                )
            )
        return out

    seen_depends = {}
    import components.pinned_vm as mod

    class SpyBootstrap(mod.GuestBootstrap, module="vm", name="GuestBootstrap"):
        def __init__(self, name, args, opts=None):
            seen_depends[name] = list(opts.depends_on or [])
            super().__init__(name, args, opts)

    with mock.patch.object(mod, "GuestBootstrap", SpyBootstrap):  # the component module's name, for one run
        res, urns = run_program(build)
    return plan, res, urns, seen_depends


def test_types_parents_and_unique_urns(declared):
    _, res, urns, _ = declared
    names = [(r.typ, r.name) for r in res]
    assert len(names) == len(set(names))
    comps = [r for r in res if r.typ == "gpuhost:vm:PinnedVM"]
    assert sorted(r.name for r in comps) == ["tenant-a", "tenant-b"]
    assert sorted(urns) == ["tenant-a-bootstrap", "tenant-a-domain", "tenant-b-domain"]
    # a child's URN type chain starts with its parent's type
    assert "::gpuhost:vm:PinnedVM$pulumi-python:dynamic/vm:LibvirtDomain::tenant-a-domain" in urns["tenant-a-domain"]
    assert "::gpuhost:vm:PinnedVM$pulumi-python:dynamic/vm:GuestBootstrap::" in urns["tenant-a-bootstrap"]


def test_domain_inputs_carry_the_placement_and_devices(declared):
    plan, res, _, _ = declared
    dom = next(r for r in res if r.name == "tenant-a-domain").inputs
    vm = plan.vm("tenant-a")
    assert dom["domain"]["vcpupin"] == list(vm.vcpupin) and dom["domain"]["numa_node"] == vm.node == 0
    assert dom["domain"]["gpus"] == ["0000:65:00.0", "0000:65:00.1"] and dom["domain"]["vfs"] == ["0000:41:02.0"]
    assert dom["domain"]["hide_kvm"] is True and dom["domain"]["hv_vendor_id"] == "gpuhost"
    assert dom["domain"]["disk"] == "/var/lib/libvirt/images/tenant-a.qcow2"
    assert dom["storage"]["base_image"] == "/var/lib/libvirt/images/jammy.qcow2"
    assert dom["version"] and dom["host"]["address"] == "10.0.0.5"
    b = next(r for r in res if r.name == "tenant-b-domain").inputs
    assert b["domain"]["hide_kvm"] is False and b["domain"]["numa_node"] == 1
    assert not set(dom["domain"]["vcpupin"]) & set(b["domain"]["vcpupin"])


def test_bootstrap_only_where_asked_and_after_the_domain(declared):
    _, res, _, depends = declared
    boots = [r for r in res if r.name.endswith("-bootstrap")]
    assert [r.name for r in boots] == ["tenant-a-bootstrap"]
    (b,) = boots
    assert b.inputs["host"]["jump"]["address"] == "10.0.0.5"
    assert b.inputs["config"]["mps"]["instances"] == {"t1": 60, "t2": 40}
    assert [type(d).__name__ for d in depends["tenant-a-bootstrap"]] == ["LibvirtDomain"]


def test_no_private_key_anywhere_in_inputs(declared):
    _, res, _, _ = declared
    assert "PRIVATE KEY" not in json.dumps([r.inputs for r in res], default=str)
