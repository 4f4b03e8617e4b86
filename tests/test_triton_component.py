"""TritonService under Pulumi mocks (no Docker engine, no GPU here: declared resources only)."""

import json

import pulumi
import pytest

from access.ssh import HostSpec
from plans.triton_repo import sdxl, yolov8n
from plans.triton_runtime import DockerRuntime
from tests.componentmocks import docker_outputs, use_mocks

HOST = HostSpec(name="gpu-a-guest", address="10.0.0.5", user="ops", host_key="ssh-ed25519 " + "A" * 68)


def _run(**over):
    from components.triton_service import ArtifactSpec, TritonService, TritonServiceArgs

    args = TritonServiceArgs(
        **{
            "host": HOST,
            "gpu_model": "NVIDIA H200",
            "gpu_count": 1,
            "models": [yolov8n(), sdxl()],
            "endpoint": "http://10.0.0.5:80",
            "artifacts": [
                ArtifactSpec(
                    model="sdxl",
                    dest="/srv/triton-repo/sdxl/1/model.py",
                    sha256="a" * 64,
                    url="https://models.example/sdxl.py",
                )
            ],
            **over,
        }
    )
    mocks = use_mocks(docker_outputs, stack_key=True)

    @pulumi.runtime.test
    def program():
        svc = TritonService("serving", args)
        return svc.repository_digest.apply(lambda d: d)

    program()
    return mocks.resources


def _one(resources, typ):
    found = [r for r in resources if r.typ == typ]
    assert len(found) == 1, [r.typ for r in resources]
    return found[0]


def test_docker_runtime_mocked_declares_pinned_image_ports_gpus_and_ssh_engine():
    res = _run(docker=DockerRuntime(gpus=["MIG-1f4c6b1e-3c1a-5d55-9a3e-0b8d2f6a7c10"]))
    names = [(r.typ, r.name) for r in res]
    assert len(names) == len(set(names)), "duplicate URNs"
    assert any(t == "gpuhost:serving:TritonService" for t, _ in names)
    assert all(n.startswith("serving-") for t, n in names if t != "gpuhost:serving:TritonService")
    provider = _one(res, "pulumi:providers:docker")
    assert provider.inputs["host"] == "ssh://ops@10.0.0.5:22"
    # Docker's ssh trusts only gpuhost's pin and key: no ssh_config, a generated known_hosts, the secret key file.
    opts = json.loads(provider.inputs["sshOpts"])  # provider config arrives JSON-encoded
    assert opts[:2] == ["-F", "/dev/null"] and "StrictHostKeyChecking=yes" in opts and "IdentityAgent=none" in opts
    known_hosts = next(o.split("=", 1)[1] for o in opts if o.startswith("UserKnownHostsFile="))
    assert open(known_hosts).read() == f"10.0.0.5 {HOST.host_key}\n"
    assert _one(res, "docker:index/remoteImage:RemoteImage").inputs["name"] == "nvcr.io/nvidia/tritonserver:24.05-py3"
    c = _one(res, "docker:index/container:Container").inputs
    assert [(p["internal"], p["external"]) for p in c["ports"]] == [(8000, 8000), (8001, 8001), (8002, 8002)]
    assert c["gpus"] == "device=MIG-1f4c6b1e-3c1a-5d55-9a3e-0b8d2f6a7c10"
    assert c["shmSize"] == 1024 and c["restart"] == "always"
    run = c["command"][2]
    assert " --exit-on-error=false " in run and " --metrics-config=summary_latencies=true " in run
    # Triton binds every interface of its container only; the host publishes each port on loopback.
    assert " --http-address=0.0.0.0 " in run and [p["ip"] for p in c["ports"]] == ["127.0.0.1"] * 3
    # The control key: made on the host before the container runs, read from a file there, in no input.
    key = _one(res, "pulumi-python:dynamic/serving:TritonControlKey")
    assert key.inputs["path"] == "/etc/gpuhost/triton-control.env" and key.inputs["mode"] == "0600"
    assert '"$GPUHOST_TRITON_CONTROL_KEY"' in run
    assert {"label": "gpuhost.repository-digest"}.items() <= c["labels"][0].items()


def test_repository_holds_preset_configs_and_gate_triggers_on_digest():
    res = _run()
    repo = next(r for r in res if r.name == "serving-models")
    # model.py comes from its artifact, not from a stand-in
    assert set(repo.inputs["files"]) == {"yolov8n/config.pbtxt", "sdxl/config.pbtxt", ".gpuhost-digest"}
    gates = [r for r in res if r.name.endswith("-gate")]
    assert [g.inputs["model"] for g in gates] == ["yolov8n", "sdxl"]
    gate = gates[0]
    digest = gate.inputs["expect_digest"]
    assert gate.inputs["p95_ms"] == 8.0 and gate.inputs["trigger"].startswith(digest)


def test_python_model_without_artifact_is_refused():
    with pytest.raises(ValueError, match="ships no stand-in"):
        _run(artifacts=[])


def test_process_runtime_declares_a_numactl_unit_instead_of_containers():
    res = _run(runtime="process")
    assert not [r for r in res if r.typ.startswith("docker:")]
    unit = next(r for r in res if r.name == "serving-triton-unit")
    assert '"/usr/bin/numactl" "--cpunodebind=0" "--membind=0"' in unit.inputs["content"]


def test_kind_gpu_model_on_a_gpu_less_guest_fails_naming_the_field():
    from plans.triton_model import ModelConfigError

    with pytest.raises(ModelConfigError, match=r"instance_group\[0\]\.kind"):
        _run(gpu_count=0)


def test_yolov8n_torch_ships_its_code_takes_the_h200_preset_and_gates_with_raw_uint8_images():
    """The GPU fast path as a user deploys it: model.py + yolov8n.py beside the config (not the stand-in), the
    H200 preset's window/instances/batch, and a gate that sends one raw uint8 image and checks the outputs."""
    from components.triton_service import ArtifactSpec
    from plans.triton_model import parse_config
    from plans.triton_repo import yolov8n_torch

    weights = ArtifactSpec(
        model="yolov8n", dest="/srv/triton-repo/yolov8n/1/weights.onnx", sha256="b" * 64, url="https://m.example/y.onnx"
    )
    with pytest.raises(ValueError, match="has no weights file: give it an artifact .* may not serve random weights"):
        _run(models=[yolov8n_torch()], artifacts=[], gate_model="yolov8n")
    res = _run(models=[yolov8n_torch(weights="weights.onnx", input="raw")], artifacts=[weights], gate_model="yolov8n")
    repo = next(r for r in res if r.name == "serving-models")
    code = {"yolov8n/config.pbtxt", "yolov8n/1/model.py", "yolov8n/1/yolov8n.py", "yolov8n/1/yolov8n_weights.py"}
    assert code <= set(repo.inputs["files"])
    assert next(r for r in res if r.name == "serving-yolov8n-artifact").inputs["dest"].endswith("/1/weights.onnx")
    gate = next(r for r in res if r.name == "serving-yolov8n-gate")
    assert gate.inputs["request"]["inputs"] == [{"name": "images", "datatype": "UINT8", "shape": [1, 640, 640, 3]}]
    assert [o["name"] for o in gate.inputs["request"]["outputs"]] == ["detections", "num_detections"]
    from components.triton_service import TritonServiceArgs, _specs

    spec = _specs(TritonServiceArgs(host=HOST, gpu_model="NVIDIA H200", gpu_count=1, models=[yolov8n_torch()]))[0]
    from plans.triton_repo import repository_files

    cfg = parse_config(repository_files([spec], gpu_count=1)["yolov8n/config.pbtxt"].decode())
    assert cfg.max_batch_size == 8 and cfg.instance_group[0].count == 3
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 200
