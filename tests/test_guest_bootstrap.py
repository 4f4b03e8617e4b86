"""Guest bootstrap plan: captured guest facts in → steps out; an applied plan plans nothing."""

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from plans.guest_bootstrap import (
    APT_LIST,
    MPS_ENV_DIR,
    MPS_UNIT,
    BootstrapConfig,
    MpsConfig,
    parse_facts,
    plan,
    read_script,
)

FIX = Path(__file__).parent / "fixtures" / "guest_bootstrap"
CFG = BootstrapConfig(mps=MpsConfig(instances={"triton-a": 60, "triton-b": 40}))


def facts(name):
    return parse_facts((FIX / f"{name}_read.txt").read_text())


def test_fixture_is_the_output_of_todays_read_script():
    assert (FIX / "read_script.sh").read_text().strip() == read_script(CFG).strip()


def test_parse_real_h200_guest():
    f = facts("h200_guest")
    assert f.family == "debian" and f.os_id == "ubuntu" and f.version_id == "24.04"
    assert f.nvidia_smi and f.gpus == (
        {"index": "0", "name": "NVIDIA H200", "persistence_mode": "Enabled", "driver": "580.159.04"},
    )
    assert "docker.io" not in f.packages and len(f.packages) > 50
    assert f.files[MPS_UNIT] == "" and f.daemon_json is None


def test_h200_guest_needs_docker_toolkit_runtime_and_mps_but_not_driver_or_persistence():
    p = plan(facts("h200_guest"), CFG)
    names = [s.name for s in p.steps]
    assert names == [
        "docker",
        "toolkit-repo",
        "toolkit",
        "runtime",
        "mps-unit",
        "mps-env:triton-a",
        "mps-env:triton-b",
        "mps-daemon",
    ]
    assert p.checks["driver"] == "ok" and p.checks["persistence"] == "ok"
    env_a = next(s for s in p.steps if s.name == "mps-env:triton-a")
    assert b"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60\n" in (env_a.input or b"")
    assert "apt-get install -y --no-install-recommends docker.io" in p.steps[0].script
    assert "nvidia-ctk runtime configure --runtime=docker" in p.steps[3].script
    assert "curl" not in p.steps[0].script, "no curl | sh installers (seed 000's get.docker.com)"


def test_dev_box_without_gpu_reports_absent_and_plans_driver_first():
    p = plan(facts("debian12_dev"), CFG)
    assert p.steps[0].name == "driver" and "nvidia-driver" in p.steps[0].script
    assert p.checks["persistence"].startswith("absent:") and p.checks["mps-daemon"].startswith("absent:")
    assert "persistence" in [s.name for s in p.steps], "persistence follows the driver install"


def apply(f, steps, cfg):
    """What each step leaves behind, as facts (the provider test does it for real on the emulated host)."""
    pk, files, svc, dj = set(f.packages), dict(f.files), dict(f.services), f.daemon_json
    for s in steps:
        if s.name == "docker":
            pk.add("docker.io")
            svc["docker"] = "active"
        elif s.name == "toolkit-repo":
            files[APT_LIST] = hashlib.sha256(s.input).hexdigest()
        elif s.name == "toolkit":
            pk.add("nvidia-container-toolkit")
        elif s.name == "runtime":
            dj = '{"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}'
        elif s.name == "mps-unit":
            files[MPS_UNIT] = hashlib.sha256(s.input).hexdigest()
        elif s.name.startswith("mps-env:"):
            files[f"{MPS_ENV_DIR}/{s.name.split(':')[1]}.env"] = hashlib.sha256(s.input).hexdigest()
        elif s.name == "mps-daemon":
            svc["nvidia-mps"] = "active"
    return replace(f, packages=frozenset(pk), files=files, services=svc, daemon_json=dj)


def test_applied_plan_is_a_noop_with_a_reason():
    f = facts("h200_guest")
    p = plan(f, CFG)
    again = plan(apply(f, p.steps, CFG), CFG)
    assert again.steps == () and "as wanted" in again.noop_reason
    changed = BootstrapConfig(mps=MpsConfig(instances={"triton-a": 50, "triton-b": 50}))
    assert [s.name for s in plan(apply(f, p.steps, CFG), changed).steps] == ["mps-env:triton-a", "mps-env:triton-b"]


def test_only_limits_what_is_acted_on_but_checks_everything():
    p = plan(facts("h200_guest"), BootstrapConfig(mps=CFG.mps, only=("mps-unit", "mps-env")))
    assert [s.name for s in p.steps] == ["mps-unit", "mps-env:triton-a", "mps-env:triton-b"]
    assert p.checks["docker"] == "needed"


def test_rhel_guest_uses_dnf_and_the_rpm_repo():
    f = replace(facts("debian12_dev"), os_id="rocky", os_like=("rhel", "centos", "fedora"), packages=frozenset())
    p = plan(f, BootstrapConfig())
    assert "dnf install -y nvidia-driver" in p.steps[0].script
    assert "nvidia-container-toolkit.repo" in next(s for s in p.steps if s.name == "toolkit-repo").script


def test_config_validation():
    with pytest.raises(ValidationError, match="1..100"):
        MpsConfig(instances={"a": 120})
    with pytest.raises(ValidationError):
        MpsConfig(instances={"a;rm -rf /": 50})
    with pytest.raises(ValidationError):
        BootstrapConfig(driver_package="nvidia-driver; reboot")
