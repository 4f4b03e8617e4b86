"""Engine build and runtime plans: facts in → actions out (pure; no GPU, no Docker here). MIG: tests/test_mig.py."""

import json
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from pydantic import ValidationError

from plans.presets import mps_environment, preset_for
from plans.triton_engine import EngineBuild, ShapeRange, build_command, cache_key, plan_rebuild, trtexec_args
from plans.triton_repo import resnet50_fp16, sdxl, yolov8n
from plans.triton_runtime import (
    DockerRuntime,
    ProcessRuntime,
    ServerOptions,
    container_spec,
    parse_unit_exec,
    server_args,
    systemd_unit,
)

FIX = Path(__file__).parent / "fixtures"
SHA = "a" * 64


def _build(**kw):
    base = dict(
        model="yolov8n",
        onnx_path="/srv/onnx/yolov8n_simp.onnx",
        onnx_sha256=SHA,
        plan_path="/srv/triton-repo/yolov8n/1/model.plan",
        gpu_model="NVIDIA H200",
        shapes={"images": ShapeRange(min=[1, 3, 640, 640], opt=[4, 3, 640, 640], max=[8, 3, 640, 640])},
    )
    return EngineBuild(**{**base, **kw})


def test_trtexec_command_has_shapes_precision_and_kept_timing_cache():
    args = trtexec_args(_build())
    assert "--minShapes=images:1x3x640x640" in args and "--optShapes=images:4x3x640x640" in args
    assert "--maxShapes=images:8x3x640x640" in args and "--fp16" in args and "--int8" not in args
    assert "--timingCacheFile=/var/lib/gpuhost/tensorrt/timing.cache" in args
    int8 = trtexec_args(_build(precision="int8", calib_dir="/srv/calib/yolov8n"))
    assert "--int8" in int8 and "--fp16" in int8 and "--calib=/srv/calib/yolov8n/calibration.cache" in int8
    script = build_command(_build(onnx_path="/srv/onnx/it's.onnx"))
    line = next(x for x in script.splitlines() if x.startswith("docker run"))
    argv = shlex.split(line)
    assert argv[:6] == ["docker", "run", "--rm", "--gpus", "device=0", "-v"]
    assert "nvcr.io/nvidia/tensorrt:24.05-py3" in argv and "--onnx=/srv/onnx/it's.onnx" in argv
    assert "mv /srv/triton-repo/yolov8n/1/model.plan.tmp /srv/triton-repo/yolov8n/1/model.plan" in script


def test_int8_without_calibration_and_bad_shapes_are_refused():
    with pytest.raises(ValidationError, match="calib_dir"):
        _build(precision="int8")
    with pytest.raises(ValidationError, match="min <= opt <= max"):
        ShapeRange(min=[8, 3, 640, 640], opt=[4, 3, 640, 640], max=[8, 3, 640, 640])


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(onnx_sha256="b" * 64), "onnx_sha256"),
        (dict(precision="int8", calib_dir="/c"), "precision"),
        (dict(gpu_model="NVIDIA L40S"), "gpu_model"),
        (dict(image="nvcr.io/nvidia/tensorrt:24.08-py3"), "tensorrt_version"),
        (
            dict(shapes={"images": ShapeRange(min=[1, 3, 640, 640], opt=[8, 3, 640, 640], max=[16, 3, 640, 640])}),
            "shapes",
        ),
    ],
)
def test_rebuild_only_when_a_key_input_changes_and_says_which(change, field):
    built = _build()
    stored = json.dumps(__import__("plans.triton_engine", fromlist=["key_inputs"]).key_inputs(built))
    same = plan_rebuild(stored, built)
    assert not same.rebuild and "same inputs" in same.reason
    changed = _build(**change)
    decision = plan_rebuild(stored, changed)
    assert decision.rebuild and field in decision.changed and field in decision.reason
    assert cache_key(changed) != cache_key(built)
    assert plan_rebuild(stored, built, plan_exists=False).rebuild


def test_an_engine_keyed_in_camel_case_before_is_neither_rebuilt_nor_changed():
    """TensorRTEngine up to VERSION 2 wrote camelCase keys, in state and in the guest's <plan>.key: an engine built
    then is the same engine, and its state diffs value by value against the snake_case inputs."""
    from plans.triton_engine import OLD_KEYS, key_inputs
    from providers.tensorrt_engine import TensorRTEngineProvider, engine_inputs

    camel = {new: old for old, new in OLD_KEYS.items()}
    built = _build()
    old_key = json.dumps({camel.get(k, k): v for k, v in key_inputs(built).items()}, sort_keys=True)
    assert "onnxSha256" in old_key and not plan_rebuild(old_key, built).rebuild
    other = plan_rebuild(old_key, _build(gpu_model="NVIDIA L40S"))
    assert other.rebuild and other.changed == ["gpu_model"]
    news = {"host": {"name": "h"}, **engine_inputs(built), "version": "3"}
    olds = {**{camel.get(k, k): v for k, v in news.items()}, "version": "2", "decision": "built"}
    assert "gpuModel" in olds and TensorRTEngineProvider().diff("e", olds, news).changes is False
    d = TensorRTEngineProvider().diff("e", olds, {**news, "gpu_model": "NVIDIA L40S"})
    assert d.changes and d.replaces == []


def test_server_args_turn_on_rate_limit_and_cache_when_models_need_them():
    plain = server_args(ServerOptions(), [yolov8n()])
    assert "--exit-on-error=false" in plain and "--rate-limit=execution_count" not in plain
    assert not any(a.startswith("--cache-config") for a in plain)
    from plans.triton_model import ModelSpec

    limited = ModelSpec.model_validate(
        {
            **yolov8n().model_dump(by_alias=True),
            "instance_group": [
                {"kind": "KIND_GPU", "count": 1, "rate_limiter": {"resources": [{"name": "R", "count": 1}]}}
            ],
        }
    )
    args = server_args(ServerOptions(), [limited, resnet50_fp16().model_copy(update={"response_cache": True})])
    assert "--rate-limit=execution_count" in args
    assert any(a.startswith("--cache-config=local,size=") for a in args)


def test_container_spec_pins_image_ports_gpus_shm_restart_and_mps_env():
    env = mps_environment(preset_for("4090"), 0)
    spec = container_spec(
        DockerRuntime(gpus=["MIG-1f4c6b1e-3c1a-5d55-9a3e-0b8d2f6a7c10"], env=env, shm_size_mib=2048),
        server_args(ServerOptions(), [sdxl()]),
    )
    assert spec["image"] == "nvcr.io/nvidia/tritonserver:24.05-py3"
    assert [(p["internal"], p["external"]) for p in spec["ports"]] == [(8000, 8000), (8001, 8001), (8002, 8002)]
    assert spec["device_requests"][0]["device_ids"] == ["MIG-1f4c6b1e-3c1a-5d55-9a3e-0b8d2f6a7c10"]
    assert spec["shm_size"] == 2048 and spec["restart"] == "always"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60" in spec["envs"]
    assert spec["command"][:2] == ["/bin/sh", "-c"] and " --exit-on-error=false " in spec["command"][2]
    with pytest.raises(ValidationError):
        DockerRuntime(image="nvcr.io/nvidia/tritonserver:24.05-py3; rm -rf /")


def test_systemd_unit_runs_triton_under_numactl_and_survives_odd_values():
    unit = systemd_unit(
        ProcessRuntime(numa_node=1, env={"X": 'a "b" $HOME 100%'}),
        server_args(ServerOptions(model_repository="/srv/triton repo"), [yolov8n()]),
    )
    argv, env = parse_unit_exec(unit)
    assert argv[:3] == ["/usr/bin/numactl", "--cpunodebind=1", "--membind=1"]
    assert argv[3] == "/opt/tritonserver/bin/tritonserver" and "--model-repository=/srv/triton repo" in argv
    assert env == {"X": 'a "b" $HOME 100%'}
    assert "$$HOME" in unit and "100%%" in unit


def test_systemd_unit_execstart_really_starts_triton_here(tmp_path):
    """The rendered ExecStart (numactl node 0 + the wheel's tritonserver) run as systemd would run it."""
    from testbed.servers.triton import (
        _pytriton_dirs,
        free_port,
        prepare_backend_dir,
        triton_available,
        triton_env,
        write_sleep_model,
    )

    if not triton_available() or not Path("/usr/bin/numactl").exists():
        pytest.skip("needs the pytriton wheel and numactl")
    write_sleep_model(tmp_path / "models", "echo", sleep_ms=0)
    backends = prepare_backend_dir(tmp_path / "work")
    port = free_port()
    opts = ServerOptions(
        model_repository=str(tmp_path / "models"),
        http_port=port,
        grpc_port=free_port(),
        metrics_port=free_port(),
        backend_directory=str(backends),
    )
    unit = systemd_unit(
        ProcessRuntime(
            binary=str(_pytriton_dirs()[0] / "bin" / "tritonserver"),
            numa_node=0,
            env={"LD_LIBRARY_PATH": triton_env()["LD_LIBRARY_PATH"], "PATH": triton_env()["PATH"]},
        ),
        server_args(opts, []),
    )
    argv, env = parse_unit_exec(unit)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, status = time.monotonic() + 60, 0
        while time.monotonic() < deadline and status != 200:
            assert proc.poll() is None, "tritonserver from the unit's ExecStart exited"
            try:
                status = urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/echo/ready").status
            except OSError:
                time.sleep(0.2)
        assert status == 200
        allowed = Path(f"/proc/{proc.pid}/status").read_text()
        assert "Mems_allowed_list:\t0" in allowed  # numactl --membind=0 took effect
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ------------------------------------------------------------------ where Triton listens, and its restricted APIs


def test_triton_binds_loopback_and_restricts_its_dangerous_apis_to_the_hosts_key():
    from plans.triton_runtime import CONTROL_KEY_PATH, KEY_REF

    args = server_args(ServerOptions(), [sdxl()])
    for flag in ("--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"):
        assert flag in args
    assert not any("0.0.0.0" in a for a in args)
    apis = "model-repository,shared-memory,logging,trace"
    assert f"--http-restricted-api={apis}:gpuhost-control-key={KEY_REF}" in args
    assert f"--grpc-restricted-protocol={apis}:gpuhost-control-key={KEY_REF}" in args
    # The unit expands the key from its EnvironmentFile (the $ of ${...} not doubled); nothing else is expanded.
    unit = systemd_unit(ProcessRuntime(env={"X": "$HOME"}), args)
    assert f"EnvironmentFile={CONTROL_KEY_PATH}" in unit.splitlines()
    assert f'"--http-restricted-api={apis}:gpuhost-control-key=${{GPUHOST_TRITON_CONTROL_KEY}}"' in unit
    assert 'Environment="X=$$HOME"' in unit
    argv, _ = parse_unit_exec(unit)
    assert argv[argv.index("/opt/tritonserver/bin/tritonserver") + 1 :] == args
    # Docker: the shell sources the mounted key file; the key itself is in no input.
    spec = container_spec(DockerRuntime(), args)
    run = spec["command"][2]
    assert run.startswith(f". {CONTROL_KEY_PATH} && exec tritonserver ")
    assert f'--http-restricted-api={apis}:gpuhost-control-key="$GPUHOST_TRITON_CONTROL_KEY" ' in run
    assert {"host_path": CONTROL_KEY_PATH, "container_path": CONTROL_KEY_PATH, "read_only": True} in spec["volumes"]
    assert [p["ip"] for p in spec["ports"]] == ["127.0.0.1"] * 3
    # An explicit address, and no restriction asked for: no key anywhere.
    plain = server_args(ServerOptions(http_address="10.0.0.5", restrict_apis=False), [sdxl()])
    assert "--http-address=10.0.0.5" in plain and not any("restricted" in a for a in plain)
    assert "EnvironmentFile" not in systemd_unit(ProcessRuntime(), plain)
    assert container_spec(DockerRuntime(), plain)["command"][0] == "tritonserver"
    with pytest.raises(ValidationError):
        ServerOptions(http_address="triton.example; rm -rf /")


def test_the_docker_run_script_publishes_each_port_on_its_address():
    from plans.triton_runtime import docker_run_script

    spec = container_spec(DockerRuntime(publish={8000: "10.0.0.5", 8002: "fd00::7"}), server_args(ServerOptions(), []))
    script = docker_run_script(spec, "all", {})
    assert "-p 10.0.0.5:8000:8000" in script and "-p 127.0.0.1:8001:8001" in script
    assert "-p '[fd00::7]:8002:8002'" in script
