"""Docker runtime rollback puts back the previous deploy's image, not only its model repository.

No Docker engine exists on this machine: the scripts run for real in bash (ServingSnapshot's own snapshot and restore
scripts, on temp dirs) with a stand-in `docker` on PATH that records its argv instead of running containers, and the
real docker CLI parses the generated `docker run` (against a socket with no daemon: flags it refuses fail before it
tries to connect). The component runs under Pulumi mocks.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pulumi
import pytest

from plans.triton_runtime import (
    DockerRuntime,
    container_spec,
    docker_gpus_flag,
    docker_rollback_restart,
    docker_run_script,
    docker_unroll,
)
from providers.serving_snapshot import restore_script, snapshot_script

OLD = "nvcr.io/nvidia/tritonserver:24.05-py3@sha256:" + "1" * 64
NEW = "nvcr.io/nvidia/tritonserver:24.08-py3@sha256:" + "2" * 64


def _script(image: str, gpus=("all",), digest="d1") -> str:
    rt = DockerRuntime(image=image, gpus=list(gpus), env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"})
    c = container_spec(rt, ["--model-repository=/models", "--strict-readiness=true"])
    return docker_run_script(c, docker_gpus_flag(list(gpus)), {"gpuhost.repository-digest": digest})


def _run_argv(script: str) -> list[str]:
    line = next(ln for ln in script.splitlines() if ln.startswith("docker run "))
    return shlex.split(line)


def test_run_script_starts_the_declared_image_with_the_declared_flags():
    argv = _run_argv(_script(OLD, gpus=("MIG-1f4c6b1e-3c1a-5d55-9a3e-0b8d2f6a7c10", "0")))
    i = argv.index(OLD)
    assert argv[i + 1 :] == ["tritonserver", "--model-repository=/models", "--strict-readiness=true"]
    flags = argv[:i]
    assert flags[flags.index("--name") + 1] == "triton" and flags[flags.index("--restart") + 1] == "always"
    assert flags[flags.index("--gpus") + 1] == '"device=MIG-1f4c6b1e-3c1a-5d55-9a3e-0b8d2f6a7c10,0"'
    assert flags[flags.index("--shm-size") + 1] == "1024m"
    # Published on loopback by default (Triton binds all interfaces inside the container; only these reach it).
    assert [flags[k + 1] for k, f in enumerate(flags) if f == "-p"] == [
        "127.0.0.1:8000:8000",
        "127.0.0.1:8001:8001",
        "127.0.0.1:8002:8002",
    ]
    assert [flags[k + 1] for k, f in enumerate(flags) if f == "-v"] == ["/srv/triton-repo:/models:ro"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in flags and "gpuhost.repository-digest=d1" in flags
    assert [flags[k + 1] for k, f in enumerate(flags) if f == "--ulimit"] == [
        "memlock=-1:-1",
        "stack=67108864:67108864",
    ]
    assert docker_gpus_flag(["all"]) == "all"


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI")
def test_the_real_docker_cli_accepts_the_generated_run_flags(tmp_path):
    """The docker CLI (no engine here) parses every flag before connecting: reaching 'Cannot connect' means the
    generated flags are valid; a broken one is refused while parsing (not vacuous)."""
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock", "DOCKER_CONFIG": str(tmp_path)}
    for gpus in (("all",), ("MIG-1f4c6b1e-3c1a-5d55-9a3e-0b8d2f6a7c10", "1")):
        argv = _run_argv(_script(OLD, gpus=gpus))
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
        assert p.returncode != 0 and "Cannot connect to the Docker daemon" in p.stderr, p.stderr
    broken = [a if a != "1024m" else "lots" for a in _run_argv(_script(OLD))]
    p = subprocess.run(broken, env=env, capture_output=True, text=True, timeout=30)
    assert "Cannot connect" not in p.stderr and "--shm-size" in p.stderr, p.stderr


STANDIN = """#!/bin/sh
# stand-in for the docker CLI (no Docker engine here): records argv; `container inspect` finds the running one
echo "$*" >> "$DOCKER_LOG"
case "$1 $2" in "container inspect") [ -e "$DOCKER_STATE/$3" ]; exit $? ;; esac
case "$1" in
  rename) mv "$DOCKER_STATE/$2" "$DOCKER_STATE/$3" ;;
  rm) rm -f "$DOCKER_STATE/$3" ;;
  run) touch "$DOCKER_STATE/triton" ;;
esac
exit 0
"""


def _env(tmp_path: Path) -> dict:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(STANDIN)
    (bindir / "docker").chmod(0o755)
    (tmp_path / "state").mkdir()
    return {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "DOCKER_LOG": str(tmp_path / "docker.log"),
        "DOCKER_STATE": str(tmp_path / "state"),
    }


def _sh(script: str, env: dict) -> str:
    p = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_failed_gate_restarts_the_previous_image_with_docker_standin(tmp_path):
    """Deploy 1 (OLD) ran; deploy 2 takes the snapshot, writes its own script (NEW) and starts NEW; the gate fails:
    restore puts deploy 1's repository and script back and its restart step runs OLD, keeping NEW as -failed."""
    env = _env(tmp_path)
    root, snap, run = tmp_path / "repo", tmp_path / "snap" / "svc", tmp_path / "svc.docker-run.sh"
    root.mkdir()
    (root / ".gpuhost-digest").write_text("d1")
    run.write_text(_script(OLD, digest="d1"))
    (tmp_path / "state" / "triton").touch()  # deploy 1's container runs
    assert "taken" in _sh(snapshot_script(str(root), str(snap), [str(run)]), env)
    # deploy 2 changes the repository and its script, and pulumi-docker replaces the container with NEW
    (root / ".gpuhost-digest").write_text("d2")
    run.write_text(_script(NEW, digest="d2"))
    restart = [docker_rollback_restart(str(run), "triton")]
    (tmp_path / "docker.log").write_text("")
    assert "restored" in _sh(restore_script(str(root), str(snap), [str(run)], restart), env).split()
    log = (tmp_path / "docker.log").read_text().splitlines()
    runs = [ln for ln in log if ln.startswith("run ")]
    assert len(runs) == 1 and f" {OLD} tritonserver " in runs[0] and NEW not in runs[0]
    assert "gpuhost.repository-digest=d1" in runs[0]
    assert log.index("rename triton triton-failed") < log.index(runs[0])
    assert "update --restart=no triton" in log and "stop triton" in log
    assert (root / ".gpuhost-digest").read_text() == "d1" and run.read_text() == _script(OLD, digest="d1")
    # The next deploy first undoes the swap: the container Pulumi created (NEW) runs under its name again, so its
    # replacement or update finds what Pulumi's state records (no clash on the name or the ports).
    (tmp_path / "docker.log").write_text("")
    _sh(snapshot_script(str(root), str(snap), [str(run)], [docker_unroll("triton", "always")]), env)
    assert (tmp_path / "docker.log").read_text().splitlines() == [
        "container inspect triton-failed",
        "rm -f triton",
        "rename triton-failed triton",
        "update --restart=always triton",
        "start triton",
    ]
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["triton"]
    # and without a swap it does nothing
    (tmp_path / "docker.log").write_text("")
    _sh(snapshot_script(str(root), str(snap), [str(run)], [docker_unroll("triton", "always")]), env)
    assert (tmp_path / "docker.log").read_text().splitlines() == ["container inspect triton-failed"]


def test_previous_deploy_without_a_script_falls_back_to_restarting_the_container(tmp_path):
    env = _env(tmp_path)
    root, snap, run = tmp_path / "repo", tmp_path / "snap" / "svc", tmp_path / "svc.docker-run.sh"
    root.mkdir()
    _sh(snapshot_script(str(root), str(snap), [str(run)]), env)  # a deploy from before the scripts: none there
    run.write_text(_script(NEW))
    _sh(restore_script(str(root), str(snap), [str(run)], [docker_rollback_restart(str(run), "triton")]), env)
    assert (tmp_path / "docker.log").read_text().splitlines() == ["restart triton"]
    assert not run.exists()


# ------------------------------------------------------------------------------------ the component under mocks


def test_docker_service_writes_its_run_script_and_rolls_back_with_it():
    """TritonService under Pulumi mocks (no Docker engine, no guest): the script names the image and GPUs the
    container is declared with, the snapshot keeps it, and every gate's rollback restarts from it."""
    from components.triton_service import ArtifactSpec, TritonService, TritonServiceArgs
    from plans.triton_repo import sdxl, yolov8n
    from tests.componentmocks import docker_outputs, use_mocks
    from tests.test_triton_component import HOST

    mig = "MIG-1f4c6b1e-3c1a-5d55-9a3e-0b8d2f6a7c10"
    args = TritonServiceArgs(
        host=HOST,
        gpu_model="NVIDIA H200",
        gpu_count=1,
        models=[yolov8n(), sdxl()],
        endpoint="http://10.0.0.5:80",
        docker=DockerRuntime(image=OLD, gpus=[mig]),
        artifacts=[
            ArtifactSpec(
                model="sdxl", dest="/srv/triton-repo/sdxl/1/model.py", sha256="a" * 64, url="https://m.example/s.py"
            )
        ],
    )
    mocks = use_mocks(docker_outputs, stack_key=True)

    @pulumi.runtime.test
    def program():
        return TritonService("serving", args).repository_digest.apply(lambda d: d)

    program()
    by = {r.name: r for r in mocks.resources}
    script = by["serving-triton-run"].inputs
    path = "/var/lib/gpuhost/serving/serving.docker-run.sh"
    assert script["path"] == path and script["mode"] == "0700"
    argv = _run_argv(script["content"])
    container = by["serving-triton"].inputs
    assert argv[argv.index(OLD) + 1 :] == container["command"]
    assert argv[argv.index("--gpus") + 1] == f'"{container["gpus"]}"' == f'"device={mig}"'
    digest = next(lb["value"] for lb in container["labels"] if lb["label"] == "gpuhost.repository-digest")
    assert f"gpuhost.repository-digest={digest}" in argv
    snap = by["serving-snapshot"].inputs
    assert snap["files"] == [path, "/etc/nginx/nginx.conf"]
    assert snap["restart"][0] == docker_rollback_restart(path, "triton")
    assert snap["prepare"] == [docker_unroll("triton", "always")]
    gates = [r for n, r in by.items() if n.endswith("-gate")]
    assert gates and all(g.inputs["rollback"]["files"] == snap["files"] for g in gates)
    assert all(g.inputs["rollback"]["restart"] == snap["restart"] for g in gates)
