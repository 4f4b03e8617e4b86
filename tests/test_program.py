"""The whole program under Pulumi mocks, for the hk-prod and dev stacks as their YAML files define them.

Mocks stand in for the engine (no Pulumi CLI here) and for Docker/libvirt/SSH targets that do not exist here; the
assertions are on what the program declares: resource counts by type, parents, dependency edges, the inputs that
matter, secrets and URNs.
"""

import json
from typing import Any, Optional

import pytest

from testbed.mocks import run_program
from testbed.stackfiles import stack_config, stack_file, throwaway_key

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
    assert secret == [KEY] and cfg[KEY] == throwaway_key()  # tests run on their own throwaway key


def test_prod_stack_without_its_key_stops_before_any_resource():
    from stacks.load import ConfigError
    from testbed.mocks import attempt_program

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
    assert doms["trt-l40s-01-tenant-rt-a-domain"]["shutdown_timeout"] == 120  # vms[].shutdown_timeout_s default


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
    assert hk.by_name("yolo-rt-yolov8n-gate").urn in mon.dependencies
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
    # the emulated server runs no libvirt `default` network: its VM gets no NIC (the driver's first up failed on it)
    assert dom.get("network") is None
    assert dom.get("disk") is None  # image: null, and the emulated server has no storage pool for an empty disk
    # vms[].shutdown_timeout_s reaches the domain (the firmware-only guest never answers ACPI)
    assert dev.by_name("emulated-gpu-01-tenant-a-domain").inputs["shutdown_timeout"] == 15
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
        "images": {"min": [1, 3, 640, 640], "opt": [8, 3, 640, 640], "max": [16, 3, 640, 640]}  # L40S preset: 16
    }
    assert eng.inputs["precision"] == "fp16" and eng.inputs["gpu_model"] == "L40S"
    # built inside the service, after its ONNX artifact arrived and before the repository changes
    assert eng.parent == hk.by_name("yolo-rt").urn
    assert hk.by_name("yolo-rt-yolov8n-artifact").urn in eng.dependencies
    assert eng.urn in hk.by_name("yolo-rt-models").dependencies


def test_new_onnx_shows_as_that_input_changing_only():
    """What preview would show for an engine after a new ONNX export: onnx_sha256 differs, nothing else."""
    cfg, secret = stack_config("hk-prod")
    base = run_program(cfg, secret, stack="hk-prod").by_name("yolo-rt-yolov8n-engine").inputs
    fleet = json.loads(cfg["gpuhost:fleet"])
    fleet["services"][0]["models"][0]["artifact"]["sha256"] = "0" * 64
    cfg["gpuhost:fleet"] = json.dumps(fleet)
    new = run_program(cfg, secret, stack="hk-prod").by_name("yolo-rt-yolov8n-engine").inputs
    changed = sorted(k for k in set(base) | set(new) if base.get(k) != new.get(k))
    assert changed == ["build", "onnx_sha256"]


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


# ---------------------------------------------------------------- serving, wired from guest to gate

import base64  # noqa: E402

from plans.triton_model import parse_config  # noqa: E402


def _repo_config(hk, service: str, model: str):
    files = hk.by_name(f"{service}-models").inputs["files"]
    return parse_config(base64.b64decode(files[f"{model}/config.pbtxt"]["content"]).decode())


def test_every_serving_guest_is_bootstrapped_with_mps_where_asked(hk):
    serving_vms = {
        ("trt-l40s-01", "tenant-rt-a"),
        ("trt-a10-01", "tenant-b-1"),
        ("rtx4090-01", "vm-b-1"),
        ("rhel-mt-01", "tenant-a100"),
    }
    for host, vm in serving_vms:
        b = hk.by_name(f"{host}-{vm}-bootstrap")
        assert b.parent == hk.by_name(f"{host}-{vm}").urn
        assert hk.by_name(f"{host}-{vm}-domain").urn in b.dependencies
        svc = next(
            r
            for r in hk.of_type("gpuhost:serving:TritonService")
            if hk.by_name(f"{host}-{vm}-domain").urn in r.dependencies
        )
        assert b.urn in svc.dependencies  # the guest is ready before anything serves there
    mps = hk.by_name("rtx4090-01-vm-b-1-bootstrap").inputs["config"]["mps"]
    assert mps["instances"] == {"sdxl-4090": 100}
    assert hk.by_name("trt-l40s-01-tenant-rt-a-bootstrap").inputs["config"].get("mps") is None
    # the process-runtime guest gets no Docker
    assert hk.by_name("rhel-mt-01-tenant-a100-bootstrap").inputs["config"]["only"] == ["driver", "persistence", "mps"]
    # Triton in the MPS guest carries its thread share
    conts = {r.name: r.inputs for r in hk.of_type("docker:index/container:Container")}
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100" in conts["sdxl-4090-triton"]["envs"]
    assert not any(e.startswith("CUDA_MPS") for e in conts["yolo-rt-triton"]["envs"])


def test_vms_get_bridge_and_static_address_through_cloud_init(hk):
    d = hk.by_name("trt-l40s-01-tenant-rt-a-domain").inputs
    assert d["domain"]["bridge"] == "br0" and d["domain"].get("network") is None
    net = d["cloud_init"]["network"]
    assert net["address"] == "10.20.1.11/24" and net["gateway"] == "10.20.1.1"
    assert net["mac"] == d["domain"]["mac"]
    from plans.domain_xml import CloudInit, cloud_init_files

    cfg = json.loads(cloud_init_files(CloudInit.model_validate(d["cloud_init"]), "x")["network-config"])
    assert cfg["ethernets"]["eth0"]["addresses"] == ["10.20.1.11/24"]
    assert cfg["ethernets"]["eth0"]["match"]["macaddress"] == net["mac"]


def test_a10_service_carries_the_a10_preset_and_config_overrides_win(hk):
    a10 = _repo_config(hk, "resnet-a10", "resnet50")
    # seed 004 A10: small batches (1/2/4), 3 instances, 500 us window
    assert a10.max_batch_size == 4 and a10.instance_group[0].count == 3
    assert list(a10.dynamic_batching.preferred_batch_size) == [1, 2, 4]
    assert a10.dynamic_batching.max_queue_delay_microseconds == 500
    l40s = _repo_config(hk, "yolo-rt", "yolov8n")
    assert l40s.max_batch_size == 16 and l40s.instance_group[0].count == 2
    rhel = _repo_config(hk, "resnet-rhel", "resnet50")  # max_batch_size / max_queue_delay_us set in config
    assert rhel.max_batch_size == 32 and rhel.dynamic_batching.max_queue_delay_microseconds == 1500
    assert list(rhel.dynamic_batching.preferred_batch_size) == [2, 4, 8, 16]  # the A100 preset fills the rest


def test_config_instance_count_and_workload_reach_the_model_config():
    def mutate(f, c, s):
        f["services"][1]["models"][0].update(instance_count=5, workload="throughput")

    cfg, secret = _broken(mutate)
    rec = run_program(cfg, secret, stack="hk-prod")
    m = _repo_config(rec, "resnet-a10", "resnet50")
    assert m.instance_group[0].count == 5 and m.max_batch_size == 16  # A10 throughput preset: batch 16


def test_each_gate_request_matches_its_model_config(hk):
    gates = {r.name: r.inputs for r in hk.of_type("pulumi-python:dynamic/serving:AcceptanceGate")}
    assert set(gates) == {
        "yolo-rt-yolov8n-gate",
        "resnet-a10-resnet50-gate",
        "sdxl-mig-sdxl-gate",
        "sdxl-4090-sdxl-gate",
        "resnet-rhel-resnet50-gate",
    }
    for name, g in gates.items():
        service, model = (
            name.removesuffix("-gate").split("-" + name.removesuffix("-gate").split("-")[-1])[0],
            name.removesuffix("-gate").split("-")[-1],
        )
        cfg = _repo_config(hk, service, model)
        want_in = [
            (t.name, pbtype(t.data_type).replace("STRING", "BYTES"), [1, *t.dims]) for t in cfg.input if not t.optional
        ]
        got_in = [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in g["request"]["inputs"]]
        assert got_in == want_in, name
        assert [t["name"] for t in g["request"]["outputs"]] == [t.name for t in cfg.output]
    assert [t["datatype"] for t in gates["sdxl-mig-sdxl-gate"]["request"]["inputs"]][0] == "BYTES"  # the prompt
    assert gates["resnet-a10-resnet50-gate"]["request"]["inputs"][0]["datatype"] == "FP16"
    # the binary body a gate sends: a small JSON header plus raw tensor bytes, not 1.2 M floats as JSON
    from providers.triton_gate import request_body

    body, headers = request_body(gates["yolo-rt-yolov8n-gate"])
    hlen = int(headers["Inference-Header-Content-Length"])
    assert hlen < 400 and len(body) - hlen == 3 * 640 * 640 * 4


def pbtype(v: int) -> str:
    from tritonclient.grpc import model_config_pb2 as pb

    return pb.DataType.Name(v).removeprefix("TYPE_")


def test_gates_carry_every_slo_field_and_a_rollback(hk):
    y = hk.by_name("yolo-rt-yolov8n-gate").inputs
    assert (y["p95_ms"], y["p99_ms"], y["max_error_rate"]) == (8, 15, 0.001)
    r = hk.by_name("resnet-a10-resnet50-gate").inputs
    assert r["rate"] == 400 and r["concurrency"] == 16 and r["p99_ms"] == 80
    assert y["rollback"]["snapshot"] == "/var/lib/gpuhost/serving/yolo-rt"
    marker = hk.by_name("yolo-rt-models").inputs["files"][".gpuhost-digest"]["content"]
    assert y["expect_digest"] == base64.b64decode(marker).decode()
    snap = hk.by_name("yolo-rt-snapshot")
    assert snap.urn in hk.by_name("yolo-rt-yolov8n-artifact").dependencies


def test_the_gates_readiness_wait_allows_for_a_model_that_compiles_at_load(hk):
    """A deploy whose model compiles when Triton loads it (yolov8n_torch on a GPU, compile auto: 2-3 minutes on an
    H200 host) must not be failed and rolled back by the gate's 300 s wait for readiness; the stack's own
    ``acceptance.ready_timeout_s`` wins over either default."""
    assert {g.inputs["ready_timeout_s"] for g in hk.of_type("pulumi-python:dynamic/serving:AcceptanceGate")} == {300}

    def gate_wait(acceptance: Optional[dict] = None, **model) -> float:
        def mutate(f, c, s):
            f["services"][0]["models"][0].update(preset="yolov8n_torch", **model)
            f["services"][0]["acceptance"].update(acceptance or {})

        cfg, secret = _broken(mutate)
        return run_program(cfg, secret, stack="hk-prod").by_name("yolo-rt-yolov8n-gate").inputs["ready_timeout_s"]

    assert gate_wait() == 900  # compile auto, the default
    assert gate_wait(compile="inductor") == 900
    assert gate_wait(compile="none") == 300
    assert gate_wait(compile="none", acceptance={"ready_timeout_s": 45}) == 45
    assert gate_wait(acceptance={"ready_timeout_s": 1800}) == 1800


def test_mig_service_bound_to_its_mig_uuid_and_the_mig_host_has_dcgm(hk):
    c = hk.by_name("sdxl-mig-triton").inputs
    assert c["gpus"].startswith("device=MIG-") and "," not in c["gpus"]
    mig = hk.by_name("a100-mig-01-mig")
    assert mig.urn in hk.by_name("sdxl-mig").dependencies
    assert hk.by_name("monitoring-a100-mig-01-dcgm-exporter")
    assert not [r for r in hk.registrations if r.name == "monitoring-trt-l40s-01-dcgm-exporter"]


def test_triton_runs_with_latency_summaries_image_and_numa_from_config(hk):
    for c in hk.of_type("docker:index/container:Container"):
        if c.name.endswith("-triton"):
            assert " --metrics-config=summary_latencies=true " in c.inputs["command"][2]
    unit = hk.by_name("resnet-rhel-triton-unit").inputs["content"]
    assert '"--metrics-config=summary_latencies=true"' in unit
    assert '"--cpunodebind=0" "--membind=0"' in unit
    svc = hk.by_name("resnet-rhel-triton-service").inputs
    assert svc["unit"] == "gpuhost-triton" and svc["action"] == "restart"
    nginx = hk.by_name("resnet-rhel-nginx").inputs
    assert nginx["check"] == ["nginx", "-t", "-c", "/etc/nginx/nginx.conf"] and nginx["action"] == "reload"
    assert hk.by_name("resnet-rhel-nginx-pkg").inputs["packages"] == ["nginx"]
    assert hk.by_name("resnet-rhel-nginx-conf").urn in hk.by_name("resnet-rhel-nginx").dependencies


def test_service_image_and_monitoring_ports_from_config():
    def mutate(f, c, s):
        f["services"][0]["image"] = "nvcr.io/nvidia/tritonserver:24.08-py3"
        f["monitoring"].update(prometheus_port=19090, grafana_port=13000)

    cfg, secret = _broken(mutate)
    rec = run_program(cfg, secret, stack="hk-prod")
    assert rec.by_name("yolo-rt-triton-image").inputs["name"] == "nvcr.io/nvidia/tritonserver:24.08-py3"
    assert "--web.listen-address=127.0.0.1:19090" in rec.by_name("monitoring-prometheus").inputs["command"]
    assert "GF_SERVER_HTTP_PORT=13000" in rec.by_name("monitoring-grafana").inputs["envs"]


def test_model_artifacts_from_config_no_standin(hk):
    a = hk.by_name("sdxl-mig-sdxl-artifact").inputs
    assert a["dest"] == "/srv/triton-repo/sdxl/1/model.py" and len(a["sha256"]) == 64 and a["url"].startswith("https")
    files = hk.by_name("sdxl-mig-models").inputs["files"]
    assert "sdxl/1/model.py" not in files  # the artifact provides it; no stand-in
    assert hk.by_name("yolo-rt-yolov8n-artifact").inputs["dest"] == "/srv/onnx/yolov8n.onnx"


@pytest.mark.parametrize(
    "mutate, field, words",
    [
        (lambda f, c, s: f["services"][0]["models"][0].pop("artifact"), "services[0].models[0].artifact", "required"),
        (lambda f, c, s: f["services"][0]["models"][0]["artifact"].update(path="/x"), "artifact", "exactly one"),
        (
            lambda f, c, s: f["services"][2].update(mig={"gpu": "0000:17:00.0", "instance": 9}),
            "services[2].mig.instance",
            "4 MIG instances",
        ),
    ],
)
def test_bad_serving_config_fails_before_any_resource(mutate, field, words):
    cfg, secret = _broken(mutate)
    with pytest.raises(Exception) as e:
        run_program(cfg, secret, stack="hk-prod")
    assert field in str(e.value) and words in str(e.value), str(e.value)


def test_vfs_come_from_a_pf_on_the_vms_node():
    def mutate(f, c, s):
        h = f["hosts"][4]
        h["sriov"] = [
            {"pf": "0000:c1:00.0", "num_vfs": 4, "numa_node": 1},
            {"pf": "0000:41:00.0", "num_vfs": 8, "numa_node": 0},
        ]

    cfg, secret = _broken(mutate)
    rec = run_program(cfg, secret, stack="hk-prod")
    vfs = rec.by_name("rhel-mt-01-tenant-a100-domain").inputs["domain"]["vfs"]
    assert len(vfs) == 1 and vfs[0].startswith("0000:41:")  # the GPU (and VM) sit on node 0


def test_the_program_is_listed_once_then_checked_and_declared(monkeypatch):
    """The loader lists the components once (`stacks.program.build` behind `plan`), checks that list and declares
    it: no second run of the program between the check and the registrations."""
    import stacks.program

    runs: list[str] = []
    build = stacks.program.build

    def counted(fleet, *args, **kwargs):
        runs.append(fleet.hosts[0].name)
        return build(fleet, *args, **kwargs)

    monkeypatch.setattr(stacks.program, "build", counted)
    rec = run_program(*stack_config("dev"), stack="dev")
    assert runs == ["emulated-gpu-01"] and rec.of_type("gpuhost:host:PassthroughHost")


@pytest.mark.parametrize("stack", ["hk-prod", "dev"])
def test_children_functions_are_the_wiring_and_every_resource_is_under_a_component(stack, hk, dev):
    """What each component registers is exactly its pure `children(name, args)` list (which tests, the bench and
    the load-time path check use), and nothing is declared outside a component."""
    from stacks.load import parse_fleet
    from stacks.program import plan

    rec = {"hk-prod": hk, "dev": dev}[stack]
    cfg, _ = stack_config(stack)
    comps = plan(parse_fleet(json.loads(cfg["gpuhost:fleet"]))).components
    stack_urn = next(r.parent for r in rec.registrations if r.type == "gpuhost:host:PassthroughHost")
    assert [r.name for r in rec.registrations if r.custom and r.parent == stack_urn] == []
    assert sorted(r.name for r in rec.registrations if not r.custom) == sorted(p.name for p in comps)
    wanted = {(p.name, f"{p.name}-{c.suffix}") for p in comps for c in p.children}
    got = {(rec.by_urn(r.parent).name, r.name) for r in rec.registrations if r.custom}
    assert got == wanted and len(wanted) == sum(len(p.children) for p in comps)


def test_components_take_args_not_stack_config():
    """Stack config → component args happens in stacks/ only: no component imports stacks.*."""
    from pathlib import Path

    for f in sorted(Path("components").glob("*.py")):
        imports = [ln for ln in f.read_text().splitlines() if ln.lstrip().startswith(("import ", "from "))]
        assert not [ln for ln in imports if " stacks" in ln], f


def _public_line_of(pem: str) -> str:
    """The test key's public half, derived here with `cryptography` (the program uses paramiko)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_private_key(pem.encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def test_new_guests_authorize_the_public_half_of_the_stack_key(hk):
    """`up` alone yields a guest gpuhost can log in to: every cloud-init seed authorizes, for the guest user that
    GuestBootstrap/Triton connect as, the public half of gpuhost:sshPrivateKey (the key those providers use)."""
    import paramiko

    from plans.domain_xml import CloudInit, cloud_init_files

    want = _public_line_of(throwaway_key())
    seeded = [r for r in hk.of_type("pulumi-python:dynamic/vm:LibvirtDomain") if r.inputs.get("cloud_init")]
    assert len(seeded) >= 2
    for r in seeded:
        ci = CloudInit.model_validate(r.inputs["cloud_init"])
        assert [" ".join(k.split()[:2]) for k in ci.ssh_authorized_keys] == [want], r.name
        user = json.loads(cloud_init_files(ci, r.name)["user-data"].removeprefix("#cloud-config\n"))
        assert user["users"][0]["ssh_authorized_keys"] == list(ci.ssh_authorized_keys)
        # the user that logs in is the one the guest's SSH spec names (bootstrap reaches the guest as it)
        boot = hk.by_name(r.name.removesuffix("-domain") + "-bootstrap").inputs["host"]
        assert user["users"][0]["name"] == boot["user"] and boot["key_name"] == "sshPrivateKey"
    # the authorized key verifies a signature made with the stack's private key
    priv = paramiko.Ed25519Key.from_private_key(__import__("io").StringIO(throwaway_key()))
    typ, b64 = CloudInit.model_validate(seeded[0].inputs["cloud_init"]).ssh_authorized_keys[0].split()[:2]
    pub = paramiko.PKey.from_type_string(typ, __import__("base64").b64decode(b64))
    msg = b"gpuhost guest login"
    assert pub.verify_ssh_sig(msg, paramiko.Message(priv.sign_ssh_data(msg).asbytes()))


def test_private_key_reaches_no_resource_input_state_or_output(hk):
    """Inputs are what Pulumi stores in state (the mocks echo them as outputs): none holds the private key or any
    line of its body; exports neither."""
    pem = throwaway_key()
    body = [ln for ln in pem.splitlines() if ln and not ln.startswith("-----")]
    assert body
    blobs = [json.dumps(r.inputs, default=str) for r in hk.registrations]
    assert hk.resolved_exports and hk.resolved_exports["placement"]
    blobs.append(json.dumps(hk.resolved_exports, default=str))
    for blob in blobs:
        assert "PRIVATE KEY" not in blob
        assert not any(ln in blob for ln in body)
    assert _public_line_of(pem).split()[1] in "".join(blobs)  # the public half does land there


def test_a_stack_key_that_is_not_a_private_key_is_refused_before_any_resource():
    from stacks.load import ConfigError
    from testbed.mocks import attempt_program

    cfg, secret = stack_config("hk-prod")
    cfg[KEY] = "not-a-key AAAAsecretmaterial"
    rec, err = attempt_program(cfg, secret, stack="hk-prod")
    assert isinstance(err, ConfigError) and err.lines == [
        "gpuhost:sshPrivateKey: not an unencrypted ed25519, ECDSA or RSA private key (PEM or OpenSSH format)"
    ]
    assert "secretmaterial" not in str(err)
    assert rec.registrations == []


def test_docker_services_write_their_run_script_after_the_snapshot_and_roll_back_with_it(hk):
    """Docker runtime (mocks: no Docker engine here): every container's service writes its `docker run` script only
    after the snapshot kept the previous one, and its gates' rollback restarts from that script."""
    from plans.triton_runtime import docker_rollback_restart

    containers = [r for r in hk.of_type("docker:index/container:Container") if r.name.endswith("-triton")]
    assert len(containers) >= 2
    for c in containers:
        svc = c.name.removesuffix("-triton")
        run = hk.by_name(f"{svc}-triton-run")
        assert hk.by_name(f"{svc}-snapshot").urn in run.dependencies
        path = run.inputs["path"]
        gates = [r for r in hk.registrations if r.name.startswith(f"{svc}-") and r.name.endswith("-gate")]
        for g in gates:
            assert path in g.inputs["rollback"]["files"]
            assert docker_rollback_restart(path, c.inputs["name"]) in g.inputs["rollback"]["restart"]


def test_preflight_reads_what_each_prep_step_plans_from(hk):
    """One read of the host per `up`: HostPreflight's `reads` is each prep step's own read_spec (the script the step's
    guard runs again before its change), and every step that plans from it depends on the preflight."""
    from providers.hugepages import Hugepages2MProvider
    from providers.kernel_cmdline import KernelCmdlineProvider
    from providers.sysctls import SysctlsProvider
    from providers.tuning import HostTuningProvider
    from providers.vfio import VfioBindingProvider

    kinds: dict[str, Any] = {  # each has a read_spec classmethod (the providers that plan from the preflight's read)
        "KernelCmdline": KernelCmdlineProvider,
        "Hugepages2M": Hugepages2MProvider,
        "Sysctls": SysctlsProvider,
        "HostTuning": HostTuningProvider,
        "VfioBinding": VfioBindingProvider,
    }
    preflights = [r for r in hk.registrations if r.type.endswith(":HostPreflight")]
    assert preflights
    for pf in preflights:
        host = pf.name.removesuffix("-preflight")
        steps = {
            r.name.removeprefix(f"{host}-"): r
            for r in hk.registrations
            if r.name.startswith(f"{host}-") and r.type.split(":")[-1] in kinds
        }
        assert set(pf.inputs["reads"]) == set(steps), host
        for suffix, r in steps.items():
            spec = kinds[r.type.split(":")[-1]].read_spec(r.inputs)
            assert pf.inputs["reads"][suffix] == spec, (r.name, pf.inputs["reads"][suffix], spec)
            assert pf.urn in r.dependencies, r.name
    # The wiring itself (under mocks the preflight's read_out is None, and a None input is not registered).
    from components.passthrough_host import PassthroughHostArgs, children
    from components.wiring import Ref

    args = PassthroughHostArgs.model_validate(
        {
            "host": {"name": "h", "address": "10.0.0.1"},
            "gpus": ["0000:81:00.0"],
            "hugepages_2m_per_node": {"1": 64},
            "sysctls": {"net.core.somaxconn": "4096"},
            "tuned_profile": "latency-performance",
        }
    )
    made = {c.suffix: c for c in children("h", args)}
    for suffix in ("cmdline", "hugepages", "sysctls", "tuning", "vfio"):
        ref = made[suffix].inputs["host_read"]
        assert isinstance(ref, Ref) and (ref.child, ref.output) == ("preflight", "read_out"), suffix
        assert ref.then is not None and ref.then({suffix: "b64", "other": "x"}) == "b64" and ref.then(None) is None
    # VfioBinding's read also names the slots whose initramfs listing HostPreflight reads once (not guarded again)
    assert made["preflight"].inputs["reads"]["vfio"]["pci_slots"] == ["0000:81:00"]
