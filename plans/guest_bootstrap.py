"""The tenant guest's GPU stack (seed 000 §5, seed 002 §十, seed 001 route B): facts of the guest in, steps out.

Steps, each one only when its check says it is needed:

1. `driver`: the NVIDIA driver package (`nvidia-driver-550` on Ubuntu, `nvidia-driver` on Debian/RHEL; settable).
2. `docker`: Docker from the distribution (`docker.io` / `docker`), enabled and running. No `curl | sh`.
3. `toolkit-repo` + `toolkit`: NVIDIA's libnvidia-container repository (signed-by keyring) and
   nvidia-container-toolkit.
4. `runtime`: `nvidia-ctk runtime configure --runtime=docker` and a Docker restart, when daemon.json lacks the
   nvidia runtime.
5. `persistence`: `nvidia-smi -pm 1` and nvidia-persistenced enabled, when a GPU reports persistence off.
6. `mps` (optional): an `nvidia-mps` systemd unit running `nvidia-cuda-mps-control -d` and one env file per
   inference instance with its `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (seed 001: 60/40 or 50/50 per instance).

`read_script()` is the one round trip that gathers `GuestFacts`; `parse_facts(text)` is its pure parser;
`plan(facts, config)` is pure and returns `GuestPlan(steps, checks, noop_reason)`.

Example:
    facts = parse_facts(conn.run(read_script()).stdout)
    p = plan(facts, BootstrapConfig(mps=MpsConfig(instances={"triton-a": 60, "triton-b": 40})))
    for step in p.steps: conn.run(step.script)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from access.shell import Script, quote, sh
from facts.model import os_family

MPS_PIPE = "/tmp/nvidia-mps"
MPS_LOG = "/var/log/nvidia-mps"
MPS_ENV_DIR = "/etc/gpuhost/mps"
MPS_UNIT = "/etc/systemd/system/nvidia-mps.service"
DAEMON_JSON = "/etc/docker/daemon.json"
APT_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
APT_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
YUM_REPO = "/etc/yum.repos.d/nvidia-container-toolkit.repo"
NVIDIA_GPGKEY = "https://nvidia.github.io/libnvidia-container/gpgkey"
APT_SOURCE = "deb [signed-by=" + APT_KEYRING + "] https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /"
YUM_SOURCE = "https://nvidia.github.io/libnvidia-container/stable/rpm/nvidia-container-toolkit.repo"


class MpsConfig(BaseModel):
    """CUDA MPS for several inference instances sharing one GPU (seed 001 route B).

    Args:
        instances: instance name → CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (1..100).
        visible_devices: CUDA_VISIBLE_DEVICES for the daemon and the instances.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    instances: dict[str, int]
    visible_devices: str = Field("0", pattern=r"^[0-9,]+$")

    @field_validator("instances")
    @classmethod
    def _pct(cls, v: dict[str, int]) -> dict[str, int]:
        for name, pct in v.items():
            if not (1 <= pct <= 100):
                raise ValueError(f"thread percentage of {name!r} must be 1..100, got {pct}")
            if not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"instance name {name!r}: letters, digits, '-' and '_' only")
        return v


class BootstrapConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    driver_package: Optional[str] = Field(None, pattern=r"^[a-z0-9][a-z0-9.+-]*$")
    persistence: bool = True
    mps: Optional[MpsConfig] = None
    # Steps to act on; the others are still checked and reported (a guest without a GPU cannot take a driver).
    only: Optional[tuple[str, ...]] = None


@dataclass(frozen=True)
class GuestFacts:
    os_id: str = ""
    os_like: tuple[str, ...] = ()
    version_id: str = ""
    packages: frozenset[str] = frozenset()
    services: dict[str, str] = field(default_factory=dict)
    gpus: tuple[dict, ...] = ()
    nvidia_smi: bool = False
    daemon_json: Optional[str] = None
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256 ("" = absent)

    @property
    def family(self) -> str:
        return os_family(self.os_id, self.os_like)


@dataclass(frozen=True)
class GuestStep:
    name: str
    why: str
    script: str
    input: Optional[bytes] = None


@dataclass(frozen=True)
class GuestPlan:
    """What a guest needs: whole scripts run in the guest, in order, and the state of every check. Not
    `plans.plan.Plan` (a host's shell actions under the host lock)."""

    steps: tuple[GuestStep, ...]
    checks: dict[str, str]  # every step: "ok", "needed" or "absent: <why it cannot apply here>"
    noop_reason: str = ""


# ------------------------------------------------------------------------------------------------------ facts


def _watched_files(config: Optional[BootstrapConfig] = None) -> list[str]:
    files = [MPS_UNIT, APT_LIST, YUM_REPO]
    if config and config.mps:
        files += [f"{MPS_ENV_DIR}/{n}.env" for n in sorted(config.mps.instances)]
    return files


def read_script(config: Optional[BootstrapConfig] = None) -> str:
    """One round trip: os-release, installed packages, services, nvidia-smi, daemon.json, file hashes."""
    s = Script()
    s.raw("echo '## os'; cat /etc/os-release 2>/dev/null")
    s.raw("echo '## packages'")
    s.raw(
        "if command -v dpkg-query >/dev/null 2>&1; then dpkg-query -W -f '${Package} ${db:Status-Status}\\n' "
        "2>/dev/null | awk '$2==\"installed\"{print $1}'; elif command -v rpm >/dev/null 2>&1; then "
        "rpm -qa --qf '%{NAME}\\n'; fi"
    )
    s.raw("echo '## services'")
    for unit in ("docker", "nvidia-persistenced", "nvidia-mps"):
        s.raw(f"printf '%s %s\\n' {quote(unit)} \"$(systemctl is-active {quote(unit)} 2>/dev/null || true)\"")
    s.raw("echo '## nvidia-smi'")
    s.raw(
        "if command -v nvidia-smi >/dev/null 2>&1; then echo present; nvidia-smi "
        "--query-gpu=index,name,persistence_mode,driver_version --format=csv,noheader 2>/dev/null || true; "
        "else echo absent; fi"
    )
    s.raw("echo '## daemon.json'")
    s.raw(f"cat {quote(DAEMON_JSON)} 2>/dev/null || true")
    s.raw("echo '## files'")
    for f in _watched_files(config):
        s.raw(f"if [ -f {quote(f)} ]; then sha256sum {quote(f)}; else echo - {quote(f)}; fi")
    s.raw("echo '## end'")
    return s.render()


def parse_facts(text: str) -> GuestFacts:
    sections: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        if line.startswith("## "):
            cur = line[3:].strip()
            sections[cur] = []
        elif cur:
            sections[cur].append(line)
    osr = {}
    for line in sections.get("os", []):
        k, sep, v = line.partition("=")
        if sep:
            osr[k] = v.strip().strip('"')
    services = {}
    for line in sections.get("services", []):
        parts = line.split()
        if parts:
            services[parts[0]] = parts[1] if len(parts) > 1 else "unknown"
    smi = sections.get("nvidia-smi", [])
    gpus = []
    for line in smi[1:]:
        cols = [c.strip() for c in line.split(",")]
        if len(cols) >= 4:
            gpus.append({"index": cols[0], "name": cols[1], "persistence_mode": cols[2], "driver": cols[3]})
    files = {}
    for line in sections.get("files", []):
        h, _, path = line.partition(" ")
        files[path.strip()] = "" if h == "-" else h
    dj = "\n".join(sections.get("daemon.json", [])).strip()
    return GuestFacts(
        os_id=osr.get("ID", ""),
        os_like=tuple(osr.get("ID_LIKE", "").split()),
        version_id=osr.get("VERSION_ID", ""),
        packages=frozenset(p.strip() for p in sections.get("packages", []) if p.strip()),
        services=services,
        gpus=tuple(gpus),
        nvidia_smi=bool(smi) and smi[0].strip() == "present",
        daemon_json=dj or None,
        files=files,
    )


# ------------------------------------------------------------------------------------------------------ plan


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _install(family: str, *pkgs: str) -> str:
    if family == "debian":
        return "DEBIAN_FRONTEND=noninteractive " + sh("apt-get", "install", "-y", "--no-install-recommends", *pkgs)
    return sh("dnf", "install", "-y", *pkgs)


def _put(path: str, mode: str = "0644") -> str:
    """Shell text writing stdin to `path` atomically."""
    from access.ssh import put_script

    return put_script(path, mode=mode, owner="root:root")


def mps_unit(mps: MpsConfig) -> str:
    return (
        "[Unit]\nDescription=NVIDIA CUDA MPS control daemon (gpuhost)\nAfter=nvidia-persistenced.service\n\n"
        "[Service]\nType=forking\n"
        f"Environment=CUDA_VISIBLE_DEVICES={mps.visible_devices}\n"
        f"Environment=CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE}\nEnvironment=CUDA_MPS_LOG_DIRECTORY={MPS_LOG}\n"
        f"ExecStartPre=/bin/mkdir -p {MPS_PIPE} {MPS_LOG}\n"
        "ExecStart=/usr/bin/nvidia-cuda-mps-control -d\n"
        "ExecStop=/bin/sh -c 'echo quit | /usr/bin/nvidia-cuda-mps-control'\n"
        "Restart=on-failure\n\n[Install]\nWantedBy=multi-user.target\n"
    )


def mps_env(mps: MpsConfig, pct: int) -> str:
    """The env file of one instance (docker --env-file, or systemd EnvironmentFile)."""
    return (
        f"CUDA_VISIBLE_DEVICES={mps.visible_devices}\nCUDA_MPS_PIPE_DIRECTORY={MPS_PIPE}\n"
        f"CUDA_MPS_LOG_DIRECTORY={MPS_LOG}\nCUDA_MPS_ACTIVE_THREAD_PERCENTAGE={pct}\n"
    )


def _runtime_configured(daemon_json: Optional[str]) -> bool:
    if not daemon_json:
        return False
    try:
        return "nvidia" in (json.loads(daemon_json).get("runtimes") or {})
    except (ValueError, AttributeError):
        return False


class _Wanted:
    """The steps a plan has so far and the state of every check (`want` records both)."""

    def __init__(self) -> None:
        self.steps: list[GuestStep] = []
        self.checks: dict[str, str] = {}

    def want(self, name: str, needed: bool, why: str, script: str, data: Optional[bytes] = None) -> None:
        self.checks[name] = "needed" if needed else "ok"
        if needed:
            self.steps.append(GuestStep(name, why, script, data))


def plan(facts: GuestFacts, config: BootstrapConfig) -> GuestPlan:
    """Steps the guest needs, in order, each with the reason; `checks` says the state of every step."""
    if facts.family == "unknown":
        return GuestPlan((), {"os": f"absent: unsupported guest OS {facts.os_id!r}"}, "nothing to do on an unknown OS")
    w = _Wanted()
    driver_and_docker_steps(w, facts, config)
    toolkit_steps(w, facts)
    if config.persistence:
        persistence_steps(w, facts)
    if config.mps:
        mps_steps(w, facts, config.mps)
    steps, checks = w.steps, w.checks
    if config.only is not None:
        steps = [s for s in steps if s.name in config.only or s.name.split(":")[0] in config.only]
    noop = "" if steps else "guest GPU stack is as wanted (" + ", ".join(f"{k}: {v}" for k, v in checks.items()) + ")"
    return GuestPlan(tuple(steps), checks, noop)


def _apt_update(family: str) -> str:
    return "apt-get update -q && " if family == "debian" else ""


def driver_and_docker_steps(w: _Wanted, facts: GuestFacts, config: BootstrapConfig) -> None:
    fam = facts.family
    driver = config.driver_package or ("nvidia-driver-550" if facts.os_id == "ubuntu" else "nvidia-driver")
    docker_pkg = "docker.io" if fam == "debian" else "docker"
    # A working nvidia-smi counts as a driver even without the package: images often bake it in from the runfile
    # (the captured H200 guest has no nvidia package at all).
    have_driver = driver in facts.packages or any(g.get("driver") for g in facts.gpus)
    w.want(
        "driver",
        not have_driver,
        f"install the NVIDIA driver ({driver})",
        Script().raw(_apt_update(fam) + _install(fam, driver)).render(),
    )
    w.want(
        "docker",
        docker_pkg not in facts.packages or facts.services.get("docker") != "active",
        f"install Docker ({docker_pkg}) and start it",
        Script()
        .raw(_apt_update(fam) + _install(fam, docker_pkg))
        .add("systemctl", "enable", "--now", "docker")
        .render(),
    )


def toolkit_steps(w: _Wanted, facts: GuestFacts) -> None:
    """NVIDIA's container toolkit: its repository, the package, and the nvidia runtime registered with Docker."""
    fam = facts.family
    if fam == "debian":
        # apt itself expands $(ARCH) in a sources line, as in NVIDIA's own list file
        repo = (
            Script()
            .raw("set -e")
            .raw(
                sh("curl", "-fsSL", NVIDIA_GPGKEY)
                + " | "
                + sh("gpg", "--batch", "--yes", "--dearmor", "-o", APT_KEYRING)
            )
        )
        repo_script, repo_data = repo.render() + _put(APT_LIST), (APT_SOURCE + "\n").encode()
        have_repo = bool(facts.files.get(APT_LIST))
    else:
        repo_script, repo_data = Script().raw("set -e").add("curl", "-fsSL", "-o", YUM_REPO, YUM_SOURCE).render(), None
        have_repo = bool(facts.files.get(YUM_REPO))
    toolkit_installed = "nvidia-container-toolkit" in facts.packages
    w.want(
        "toolkit-repo",
        not have_repo and not toolkit_installed,
        "add NVIDIA's container toolkit repository",
        repo_script,
        repo_data,
    )
    w.want(
        "toolkit",
        not toolkit_installed,
        "install nvidia-container-toolkit",
        Script().raw(_apt_update(fam) + _install(fam, "nvidia-container-toolkit")).render(),
    )
    w.want(
        "runtime",
        not _runtime_configured(facts.daemon_json),
        "register the nvidia runtime with Docker (nvidia-ctk runtime configure)",
        Script()
        .raw("set -e")
        .add("nvidia-ctk", "runtime", "configure", "--runtime=docker")
        .add("systemctl", "restart", "docker")
        .render(),
    )


def persistence_steps(w: _Wanted, facts: GuestFacts) -> None:
    """Persistence mode on every GPU; without nvidia-smi yet, only right after a driver install in this plan."""
    script = (
        Script().add("nvidia-smi", "-pm", "1").raw("systemctl enable --now nvidia-persistenced 2>/dev/null || true")
    ).render()
    if facts.nvidia_smi:
        off = [g["index"] for g in facts.gpus if g["persistence_mode"].lower() != "enabled"]
        w.want("persistence", bool(off), f"persistence mode on (GPUs off: {off or 'none'})", script)
        return
    w.checks["persistence"] = "absent: no nvidia-smi (driver not installed or no GPU in this guest)"
    if "driver" in [s.name for s in w.steps]:
        w.steps.append(GuestStep("persistence", "enable persistence mode after the driver install", script))


def mps_steps(w: _Wanted, facts: GuestFacts, config: MpsConfig) -> None:
    """CUDA MPS: the daemon's unit, one env file per instance, and the daemon running (once there is a driver)."""
    unit = mps_unit(config).encode()
    w.want(
        "mps-unit",
        facts.files.get(MPS_UNIT) != _sha(unit),
        "write the nvidia-mps systemd unit",
        _put(MPS_UNIT) + Script().add("systemctl", "daemon-reload").render(),
        unit,
    )
    for name, pct in sorted(config.instances.items()):
        env = mps_env(config, pct).encode()
        path = f"{MPS_ENV_DIR}/{name}.env"
        w.want(
            f"mps-env:{name}",
            facts.files.get(path) != _sha(env),
            f"instance {name}: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={pct}",
            Script().add("mkdir", "-p", MPS_ENV_DIR).render() + _put(path),
            env,
        )
    if not facts.nvidia_smi:
        w.checks["mps-daemon"] = "absent: no nvidia-smi, the MPS daemon cannot run without the driver"
    else:
        w.want(
            "mps-daemon",
            facts.services.get("nvidia-mps") != "active",
            "start the MPS control daemon",
            Script().add("systemctl", "enable", "--now", "nvidia-mps").render(),
        )
