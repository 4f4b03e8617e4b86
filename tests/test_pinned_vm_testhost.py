"""PinnedVM on the emulated GPU server: its domain (real libvirtd, real QEMU TCG inside TCG, real vfio-pci) and its
guest bootstrap provider (one emulated host boot serves both tests).

The chain is the production one: the host's facts (one SSH round trip) → `from_facts` → the placement solver puts
the tenant on node 1 (the GPU stand-in's node, CPUs 4-7) → `DomainSpec` → LibvirtDomain through the SDK's provider
server, reaching libvirtd over the project's SSH (tunnelled `virt-ssh-helper`).

Setup done directly over SSH and undone afterwards (PassthroughHost's job in production): the GPU stand-in's two
functions bound to vfio-pci with driver_override, 2M hugepages on node 1, a `gpuhost` dir pool with a small blank
base image. No KVM in the emulated host, so the domain is `type='qemu'` with `cpu mode='maximum'`; production keeps
kvm/host-passthrough.

The guest has nothing to boot (a blank disk, a seed ISO that is no boot medium): its firmware (OVMF, from the spec's
NVRAM template) finds nothing and waits, the same in every run, so what the test asserts is what gpuhost and libvirt did — the running QEMU holds both GPU functions
through vfio-pci and its memory in node 1's 2M hugepages, its vCPUs pinned as planned — never how fast a guest OS
boots under nested emulation on a busy machine. It never answers the ACPI shutdown either, so every stop takes the
provider's `shutdown_timeout` (2 s here) and then the destroy path.
"""

from __future__ import annotations

import time

import pytest

from access.shell import Script, sh
from facts.host import read_host_facts
from plans.domain_xml import DomainSpec
from plans.placement import VmRequest, from_facts, place
from providers.libvirt_domain import LibvirtDomainProvider
from testbed.provider_server import ProviderError, ProviderServer
from testbed.testhost.host import Domains, FileStat, Host, Hugepages, PciDriver, SysfsValue
from testbed.testhost.machine import GPU_FN0, GPU_FN1

pytestmark = pytest.mark.testhost

TYPE = "gpuhost:vm:LibvirtDomain"
POOL_DIR = "/var/lib/libvirt/images"
NAME = "tenant-stand-in"


def rebind(addr: str, override: str) -> Script:
    """The PCI function `addr` unbound from its driver and probed again with driver_override `override`: "vfio-pci"
    binds it to vfio-pci, "" clears the override so its own driver takes it back (the override is read at probe)."""
    dev = f"/sys/bus/pci/devices/{addr}"
    s = Script()
    s.raw(f"echo {sh(override)} > {sh(dev + '/driver_override')}")
    s.raw(f"if [ -e {sh(dev + '/driver')} ]; then echo {sh(addr)} > {sh(dev + '/driver/unbind')}; fi")
    s.raw(f"echo {sh(addr)} > /sys/bus/pci/drivers_probe")
    return s


HP = "/sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages"


@pytest.fixture(scope="module")
def prepared(testhost):
    """Host set up for the domain; everything restored after the module."""
    conn = testhost.conn()
    host = Host(conn.run)
    prior = host.read(Hugepages(node=1), PciDriver(GPU_FN0), PciDriver(GPU_FN1))
    prior_hp = prior.hugepages(node=1)
    assert isinstance(prior_hp, int), prior_hp
    setup = Script().raw("set -e").add("modprobe", "vfio-pci")
    for a in (GPU_FN0, GPU_FN1):
        setup.lines += rebind(a, "vfio-pci").lines
    setup.raw(f"echo 160 > {sh(HP)}")
    setup.add("systemctl", "start", "libvirtd")
    setup.add("mkdir", "-p", POOL_DIR)
    setup.raw(
        f"virsh pool-info gpuhost >/dev/null 2>&1 || {sh('virsh', 'pool-define-as', 'gpuhost', 'dir', '--target', POOL_DIR)}"
    )
    setup.raw("virsh pool-start gpuhost >/dev/null 2>&1 || true")
    setup.add("qemu-img", "create", "-q", "-f", "qcow2", f"{POOL_DIR}/base.qcow2", "64M")
    conn.run(setup.render())
    bound = host.read(PciDriver(GPU_FN0), PciDriver(GPU_FN1))
    assert bound.pci_device(GPU_FN0).driver == "vfio-pci"
    assert bound.pci_device(GPU_FN1).driver == "vfio-pci"
    yield conn
    undo = Script()
    undo.raw(f"virsh destroy {sh(NAME)} >/dev/null 2>&1 || true")
    undo.raw(f"virsh undefine --nvram {sh(NAME)} >/dev/null 2>&1 || true")
    for a in (GPU_FN0, GPU_FN1):
        undo.lines += rebind(a, "").lines
    undo.raw(f"echo {sh(prior_hp)} > {sh(HP)}")
    undo.raw("virsh pool-destroy gpuhost >/dev/null 2>&1 || true; virsh pool-undefine gpuhost >/dev/null 2>&1 || true")
    undo.add(
        "rm",
        "-f",
        f"/var/log/libvirt/qemu/{NAME}-console.log",
        f"{POOL_DIR}/base.qcow2",
        f"{POOL_DIR}/{NAME}.qcow2",
        f"{POOL_DIR}/{NAME}-seed.iso",
    )
    conn.run(undo.render(), check=False)
    # the GPU stand-in's own drivers took its functions back
    after = host.read(PciDriver(GPU_FN0), PciDriver(GPU_FN1))
    assert after.pci_device(GPU_FN0).driver == prior.pci_device(GPU_FN0).driver
    assert after.pci_device(GPU_FN1).driver == prior.pci_device(GPU_FN1).driver


def test_pinned_domain_on_node1_with_gpu_hostdevs_lifecycle(testhost, prepared):
    conn = prepared
    host = from_facts(read_host_facts(conn))
    plan = place(host, [VmRequest(NAME, vcpus=2, memory_mib=256, page_size="2M", gpus=(GPU_FN0, GPU_FN1))])
    vm = plan.vm(NAME)
    print(plan.report())
    assert vm.node == 1 and set(vm.vcpupin) <= {4, 5, 6, 7}
    spec = DomainSpec.from_placement(
        vm,
        domain_type="qemu",
        cpu_mode="maximum",
        loader=None,
        network=None,
        disk=f"{POOL_DIR}/{NAME}.qcow2",
        seed_iso=f"{POOL_DIR}/{NAME}-seed.iso",
        console_log=f"/var/log/libvirt/qemu/{NAME}-console.log",
        gpus=(GPU_FN0, GPU_FN1),
    )
    spec_in = spec.model_dump(mode="json")
    inputs = {
        "host": testhost.host_spec(key_name="sshPrivateKey").model_dump(mode="json"),
        "domain": spec_in,
        "storage": {"base_image": f"{POOL_DIR}/base.qcow2", "capacity_gib": 1},
        "cloud_init": {"user": "ops", "ssh_authorized_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI ops@x"]},
        "shutdown_timeout": 2,
        "version": LibvirtDomainProvider.VERSION,
    }
    free_hp = SysfsValue("/sys/devices/system/node/node1/hugepages/hugepages-2048kB/free_hugepages")
    free_before = Host(conn.run).get(free_hp)
    assert isinstance(free_before, int), free_before
    with ProviderServer(config={"gpuhost:sshPrivateKey": testhost.private_key_pem}) as srv:
        r = srv.resource(LibvirtDomainProvider(), TYPE, NAME)
        t0 = time.monotonic()
        op, outs = r.up(inputs)
        create_s = time.monotonic() - t0
        assert op == "create" and outs["disk_created"] is True and outs["seed_uploaded"] is True

        # virsh on the host confirms pinning, node, hugepages and both GPU functions
        pins = conn.run(sh("virsh", "vcpupin", NAME, "--config")).stdout
        for i, cpu in enumerate(vm.vcpupin):
            assert any(
                line.split() == [f"{i}", str(cpu)] or line.replace(":", " ").split() == [str(i), str(cpu)]
                for line in pins.splitlines()
            ), pins
        xml = conn.run(sh("virsh", "dumpxml", NAME, "--inactive")).stdout
        assert "<memory mode='strict' nodeset='1'/>" in xml
        assert "<page size='2048' unit='KiB'/>" in xml
        assert xml.count("<hostdev mode='subsystem' type='pci' managed='yes'>") == 2
        assert "bus='0x81' slot='0x00' function='0x1'" in xml and "<rom bar='on'/>" in xml

        # the seed ISO that landed through libvirt's volume upload is a cidata volume with our user-data
        iso = conn.run(sh("head", "-c", "40000", f"{POOL_DIR}/{NAME}-seed.iso")).stdout
        assert "CIDATA" in iso.upper()

        # started: the running QEMU holds both GPU functions through vfio-pci, its memory is hugepage-backed and bound
        # to node 1 (strict), its vCPUs run where the plan put them
        assert outs["state"] == "running", outs["state"]
        assert conn.run(sh("virsh", "domstate", NAME)).stdout.strip() == "running"
        pid = conn.run(sh("cat", f"/run/libvirt/qemu/{NAME}.pid")).stdout.strip()
        qemu = conn.run(sh("cat", f"/proc/{pid}/cmdline")).stdout.replace("\0", " ")
        print(qemu)
        assert qemu.count("vfio-pci") == 2 and GPU_FN0 in qemu and GPU_FN1 in qemu, qemu
        assert "/dev/hugepages" in qemu, qemu
        numatune = conn.run(sh("virsh", "numatune", NAME)).stdout
        assert [ln.split() for ln in numatune.splitlines() if ln.strip()] == [
            ["numa_mode", ":", "strict"],
            ["numa_nodeset", ":", "1"],
        ], numatune
        taken = free_before - Host(conn.run).get(free_hp)
        print(f"2M pages taken on node 1: {taken}")
        live = conn.run(sh("virsh", "vcpupin", NAME)).stdout
        for i, cpu in enumerate(vm.vcpupin):
            assert any(line.replace(":", " ").split() == [str(i), str(cpu)] for line in live.splitlines()), live
        print(f"create (define + start) {create_s:.1f}s")

        # refresh: no drift; a hand edit shows as drift
        assert r.refresh()["domain"] == r.inputs["domain"]
        conn.run(sh("virsh", "emulatorpin", NAME, "4", "--live", "--config"))
        assert r.refresh()["domain"]["emulatorpin"] == [4]
        r.outputs["domain"] = r.inputs["domain"]

        # an update libvirt cannot start (a hostdev that does not exist) restores the previous definition
        broken = {**inputs, "domain": {**spec_in, "gpus": [GPU_FN0, GPU_FN1, "0000:8f:00.0"]}}
        with pytest.raises(ProviderError, match="previous definition restored"):
            r.up(broken)
        xml_after = conn.run(sh("virsh", "dumpxml", NAME, "--inactive")).stdout
        assert "bus='0x8f'" not in xml_after and xml_after.count("<hostdev ") == 2

        # delete stops the guest (destroyed once the ACPI request went unanswered), then leaves no domain; its
        # hugepages are free again; the disk stays (keep_disk default), the seed goes
        r.destroy()
        gone = Host(conn.run).read(
            Domains(), free_hp, FileStat(f"{POOL_DIR}/{NAME}.qcow2"), FileStat(f"{POOL_DIR}/{NAME}-seed.iso")
        )
        assert NAME not in gone.domains
        assert gone.get(free_hp) == free_before
        assert gone.file(f"{POOL_DIR}/{NAME}.qcow2").is_file
        assert not gone.file(f"{POOL_DIR}/{NAME}-seed.iso").exists


def test_guest_bootstrap_is_idempotent_with_nvidia_steps_absent(testhost):
    """GuestBootstrap over SSH on the emulated host (Debian 12, no NVIDIA GPU or driver, no network): the NVIDIA
    and Docker steps are checked and reported (driver/toolkit 'needed', persistence and MPS daemon 'absent'), while
    the steps that can run here — the nvidia-mps unit and the per-instance MPS env files — are applied once and
    then never again."""
    from plans.guest_bootstrap import MPS_ENV_DIR, MPS_UNIT
    from providers.guest_bootstrap import GuestBootstrapProvider

    conn = testhost.conn()
    spec = testhost.host_spec(key_name="sshPrivateKey").model_dump(mode="json")
    cfg = {"mps": {"instances": {"triton-a": 60, "triton-b": 40}}, "only": ["mps-unit", "mps-env"]}
    inputs = {"host": spec, "config": cfg, "version": GuestBootstrapProvider.VERSION}
    with ProviderServer(config={"gpuhost:sshPrivateKey": testhost.private_key_pem}) as srv:
        r = srv.resource(GuestBootstrapProvider(), "gpuhost:vm:GuestBootstrap", "stand-in-guest")
        op, outs = r.up(inputs)
        assert op == "create"
        assert outs["applied"] == ["mps-unit", "mps-env:triton-a", "mps-env:triton-b"]
        assert outs["checks"]["driver"] == "needed" and outs["checks"]["toolkit"] == "needed"
        assert outs["checks"]["persistence"].startswith("absent:")
        assert outs["checks"]["mps-daemon"].startswith("absent:")
        assert outs["checks"]["mps-unit"] == "ok" and outs["done"] is True
        env = conn.run(sh("cat", f"{MPS_ENV_DIR}/triton-a.env")).stdout
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60\n" in env
        assert "nvidia-cuda-mps-control -d" in conn.run(sh("cat", MPS_UNIT)).stdout

        # same inputs: no change; a forced re-apply does nothing (each step checks first)
        assert r.preview(inputs).changes is False
        assert (
            srv.resource(GuestBootstrapProvider(), "gpuhost:vm:GuestBootstrap", "again").up(inputs)[1]["applied"] == []
        )

        # a new split rewrites only the files that differ
        inputs2 = {**inputs, "config": {**cfg, "mps": {"instances": {"triton-a": 50, "triton-b": 40}}}}
        op, outs = r.up(inputs2)
        assert op == "update" and outs["applied"] == ["mps-env:triton-a"]

        r.destroy()
        left = conn.run(f"ls {sh(MPS_ENV_DIR)} {sh(MPS_UNIT)} 2>&1 || true").stdout
        assert "No such file" in left
