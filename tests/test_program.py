"""The whole program under Pulumi mocks, for the hk-prod and dev stacks as their YAML files define them.

Mocks stand in for the engine (no Pulumi CLI here) and for Docker/libvirt/SSH targets that do not exist here; the
assertions are on what the program declares: resource counts by type, parents, dependency edges, the inputs that
matter, secrets and URNs.
"""

import json

import pytest

from tests.mocks import run_program
from tests.stackfiles import stack_config, stack_file, test_key

KEY = "gpuhost:sshPrivateKey"


@pytest.fixture(scope="module")
def hk():
    cfg, secret = stack_config("hk-prod")
    return run_program(cfg, secret, stack="hk-prod")


@pytest.fixture(scope="module")
def dev():
    cfg, secret = stack_config("dev")
    return run_program(cfg, secret, stack="dev")


def test_stack_files_hold_no_plaintext_key_and_no_production_secret():
    dev = open("Pulumi.dev.yaml").read()
    assert "PRIVATE KEY" not in dev and "secure: v1:" in dev
    cfg, secret = stack_config("dev", decrypt=True)  # the dev passphrase is public by design
    assert secret == [KEY] and cfg[KEY].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    # hk-prod: nothing the repository (or PR code) can decrypt; the operators set the key with their passphrase.
    prod = stack_file("hk-prod")
    assert "PRIVATE KEY" not in open("Pulumi.hk-prod.yaml").read()
    assert "encryptionsalt" not in prod and not any(
        "secure" in v for v in prod["config"].values() if isinstance(v, dict)
    )
    cfg, secret = stack_config("hk-prod")
    assert secret == [KEY] and cfg[KEY] == test_key()  # tests run on their own throwaway key


def test_prod_stack_without_its_key_stops_before_any_resource():
    from stacks.load import ConfigError
    from tests.mocks import attempt_program

    cfg, _ = stack_config("hk-prod")
    del cfg[KEY]
    rec, err = attempt_program(cfg, [], stack="hk-prod")
    assert isinstance(err, ConfigError) and err.lines == [
        "gpuhost:sshPrivateKey: missing; set it with `pulumi config set --secret sshPrivateKey < key`"
    ]
    assert rec.registrations == []


def test_hk_prod_resource_counts_and_unique_urns(hk):
    t = hk.types()
    assert t["gpuhost:host:PassthroughHost"] == 6
    assert t["pulumi-python:dynamic/host:HostReboot"] == 6 and t["pulumi-python:dynamic/host:HostPreflight"] == 6
    assert t["gpuhost:vm:PinnedVM"] == 2 + 4 + 2 + 1
    assert t["gpuhost:net:SriovNic"] == 1
    assert t["gpuhost:serving:TritonService"] == 5
    assert t["gpuhost:monitoring:MonitoringStack"] == 1
    # VFIO only where GPUs pass through: not on the MIG host nor the monitoring host
    assert t["pulumi-python:dynamic/host:VfioBinding"] == 4
    assert hk.duplicate_urns() == []


def test_children_are_parented_to_their_component(hk):
    for r in hk.registrations:
        if (
            r.type.startswith("pulumi-python:dynamic/host:")
            and r.name.startswith("trt-l40s-01-")
            and "tenant" not in r.name
        ):
            parent = hk.by_urn(r.parent)
            assert parent.type == "gpuhost:host:PassthroughHost" and parent.name == "trt-l40s-01", r.name


def test_kernel_args_per_host(hk):
    add = {r.name: r.inputs["add"] for r in hk.of_type("pulumi-python:dynamic/host:KernelCmdline")}
    assert add["trt-l40s-01-cmdline"][:2] == ["intel_iommu=on", "iommu=pt"]
    assert {"default_hugepagesz=1G", "hugepagesz=1G", "hugepages=384"} <= set(add["trt-l40s-01-cmdline"])
    assert "video=efifb:off" in add["rtx4090-01-cmdline"]
    rhel = add["rhel-mt-01-cmdline"]
    assert "kvm.ignore_msrs=1" in rhel and any(a.startswith("isolcpus=") for a in rhel)
    assert not any(a.startswith("pcie_acs_override") for args in add.values() for a in args)


def test_pinning_on_the_gpu_node_with_sibling_pairs(hk):
    doms = {r.name: r.inputs for r in hk.of_type("pulumi-python:dynamic/vm:LibvirtDomain")}
    a = doms["trt-l40s-01-tenant-rt-a-domain"]["domain"]
    b = doms["trt-l40s-01-tenant-rt-b-domain"]["domain"]
    cpus_a = set(a["vcpupin"])
    cpus_b = set(b["vcpupin"])
    assert not cpus_a & cpus_b
    # node 0 of a 2x16x2 box holds CPUs 0-15 and 32-47; node 1 16-31 and 48-63
    assert cpus_a <= set(range(0, 16)) | set(range(32, 48)) and cpus_b <= set(range(16, 32)) | set(range(48, 64))
    assert not cpus_a & {0, 1, 32, 33}
    pins = a["vcpupin"]
    assert all(pins[i + 1] - pins[i] == 32 for i in range(0, len(pins), 2))  # vCPU pairs are sibling threads


def test_dependencies_host_prep_before_vms_before_services_before_monitoring(hk):
    def children(name):
        return {r.urn for r in hk.registrations if r.parent == hk.by_name(name).urn}

    vm = hk.by_name("trt-l40s-01-tenant-rt-a")
    # depends_on a component means on its children: the host's reboot (hence all host prep) comes first
    assert hk.by_name("trt-l40s-01-reboot").urn in vm.dependencies
    assert children("trt-l40s-01") <= set(vm.dependencies)
    svc = hk.by_name("yolo-rt")
    assert hk.by_name("trt-l40s-01-tenant-rt-a-domain").urn in svc.dependencies
    mon = hk.by_name("monitoring")
    assert hk.by_name("yolo-rt-gate").urn in mon.dependencies
    rhel_vm = hk.by_name("rhel-mt-01-tenant-a100")
    assert children("rhel-mt-01-sriov-0") <= set(rhel_vm.dependencies)
    reboot = hk.by_name("rhel-mt-01-reboot")
    assert {hk.by_name("rhel-mt-01-cmdline").urn, hk.by_name("rhel-mt-01-vfio").urn} <= set(reboot.dependencies)


def test_triton_ports_and_ssh_key_never_an_input(hk):
    conts = [r for r in hk.of_type("docker:index/container:Container") if r.name.endswith("-triton")]
    assert conts and all(sorted(p["internal"] for p in c.inputs["ports"]) == [8000, 8001, 8002] for c in conts)
    for r in hk.registrations:
        assert "PRIVATE KEY" not in json.dumps(r.inputs, default=str), r.name


def test_vf_from_sriov_reaches_the_tenant_domain(hk):
    dom = next(
        r for r in hk.of_type("pulumi-python:dynamic/vm:LibvirtDomain") if r.name == "rhel-mt-01-tenant-a100-domain"
    )
    assert len(dom.inputs["domain"]["vfs"]) == 1
    assert dom.inputs["domain"]["gpus"] == ["0000:65:00.0", "0000:65:00.1"]


def test_dev_stack_targets_the_emulated_host(dev):
    assert dev.by_name("emulated-gpu-01-cmdline").inputs["add"] == ["intel_iommu=on", "iommu=pt"]
    assert dev.by_name("emulated-gpu-01-vfio").inputs["devices"] == ["0000:81:00.0"]
    assert dev.by_name("emulated-gpu-01-irq").inputs["banned_cpus"] == [2, 3, 4, 5, 6, 7]
    dom = dev.by_name("emulated-gpu-01-tenant-a-domain").inputs["domain"]
    assert set(dom["vcpupin"]) <= {4, 5, 6, 7} and len(set(dom["vcpupin"])) == 2
    assert dev.duplicate_urns() == []


def _broken(mutate):
    cfg, secret = stack_config("hk-prod")
    fleet = json.loads(cfg["gpuhost:fleet"])
    mutate(fleet, cfg, secret)
    cfg["gpuhost:fleet"] = json.dumps(fleet)
    return cfg, secret


@pytest.mark.parametrize(
    "mutate, field, words",
    [
        (lambda f, c, s: f["hosts"][0]["vms"][0].update(vcpus=40), "hosts[0].vms[0].vcpus", "do not fit"),
        (
            lambda f, c, s: f["hosts"][1]["vms"][1].update(gpus=["0000:17:00.0"]),
            "hosts[1].vms[1].gpus",
            "already given",
        ),
        (lambda f, c, s: s.clear(), "gpuhost:sshPrivateKey", "plaintext"),
        (
            lambda f, c, s: f["hosts"][0]["gpus"][0].update(address="4b:00"),
            "hosts[0].gpus[0].address",
            "not a PCI address",
        ),
        (lambda f, c, s: f["hosts"][0].update(reserved_cpus="3-1"), "hosts[0].reserved_cpus", "backwards"),
    ],
)
def test_broken_config_fails_before_any_resource(mutate, field, words):
    cfg, secret = _broken(mutate)
    with pytest.raises(Exception) as e:
        run_program(cfg, secret, stack="hk-prod")
    msg = str(e.value)
    assert field in msg and words in msg, msg


def test_mig_layout_and_engine_builds_declared(hk):
    mig = hk.by_name("a100-mig-01-mig")
    assert mig.inputs["layout"] == {"0": ["2g.20gb", "2g.20gb", "1g.10gb", "1g.10gb"], "1": ["3g.40gb", "3g.40gb"]}
    assert mig.urn in hk.by_name("sdxl-mig").dependencies
    eng = hk.by_name("yolo-rt-yolov8n-engine")
    assert eng.inputs["shapes"] == {
        "images": {"min": [1, 3, 640, 640], "opt": [4, 3, 640, 640], "max": [8, 3, 640, 640]}
    }
    assert eng.inputs["precision"] == "fp16" and eng.inputs["gpuModel"] == "L40S"
    assert eng.urn in hk.by_name("yolo-rt").dependencies


def test_new_onnx_shows_as_that_input_changing_only():
    """What preview would show for an engine after a new ONNX export: onnxSha256 differs, nothing else."""
    cfg, secret = stack_config("hk-prod")
    base = run_program(cfg, secret, stack="hk-prod").by_name("yolo-rt-yolov8n-engine").inputs
    fleet = json.loads(cfg["gpuhost:fleet"])
    fleet["services"][0]["models"][0]["onnx_sha256"] = "0" * 64
    cfg["gpuhost:fleet"] = json.dumps(fleet)
    new = run_program(cfg, secret, stack="hk-prod").by_name("yolo-rt-yolov8n-engine").inputs
    changed = sorted(k for k in set(base) | set(new) if base.get(k) != new.get(k))
    assert changed == ["build", "onnxSha256"]


def test_each_reboot_waits_for_all_host_prep_and_the_previous_hosts_verified_reboot(hk):
    """Under the engine a step runs as soon as its dependencies are done: the reboot must depend on every host-prep
    resource of its host, and (rollout.max_parallel_reboots: 1 by default) on the previous host's reboot."""
    fleet = json.loads(stack_config("hk-prod")[0]["gpuhost:fleet"])
    reboots = [hk.by_name(f"{h['name']}-reboot") for h in fleet["hosts"]]
    prev = None
    for rb in reboots:
        host = rb.name.removesuffix("-reboot")
        prep = {
            r.urn
            for r in hk.registrations
            if r.name.startswith(f"{host}-")
            and r.type.split(":")[-1] in ("KernelCmdline", "VfioBinding", "Hugepages2M", "Sysctls", "HostTuning")
        }
        assert prep and prep <= set(rb.dependencies), (host, prep - set(rb.dependencies))
        if prev is not None:
            assert prev.urn in rb.dependencies, f"{rb.name} does not wait for {prev.name}"
        prev = rb
    assert rb.inputs["drain_timeout"] == 180


def test_max_parallel_reboots_two_lets_two_hosts_reboot_together():
    cfg, secret = stack_config("hk-prod")
    fleet = json.loads(cfg["gpuhost:fleet"]) if isinstance(cfg["gpuhost:fleet"], str) else cfg["gpuhost:fleet"]
    fleet["rollout"] = {"max_parallel_reboots": 2}
    rec = run_program({**cfg, "gpuhost:fleet": json.dumps(fleet)}, secret, stack="hk-prod")
    reboots = [rec.by_name(f"{h['name']}-reboot") for h in fleet["hosts"]]  # in the order of `hosts`
    waits = [[d for d in r.dependencies if d in {x.urn for x in reboots}] for r in reboots]
    assert waits[0] == [] and waits[1] == [] and waits[2] == [reboots[0].urn] and waits[3] == [reboots[1].urn]
