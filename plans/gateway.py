"""Seed 001's inference gateway on one host, pure: Redis config, the workers' JSON config, systemd units.

The stack's gateway section names TritonServices and weights (mig-a 3, vm-b 2); the program resolves each to an
address and this module renders the files the InferenceGateway component writes:

  * ``redis.conf``: loopback by default, AOF on (``appendfsync everysec``: a Redis restart keeps queued and pending
    jobs) and ``maxmemory-policy noeviction`` (an evicting Redis would drop queued jobs or stored results without
    a word; a full Redis refuses writes instead, and the submit script turns that into an error);
  * ``worker.json``: what ``python -m serving.worker`` reads (backends, queue, slots, reclaim idle time, policy);
  * ``gpuhost-gateway-redis.service`` and ``gpuhost-gateway-worker-<i>.service`` (one consumer each, its own
    metrics port counting up from ``metrics_port``), both ``DynamicUser=yes``.

Usage::

    spec = GatewaySpec(name="sdxl-gen", models=("sdxl",), backends=(
        GatewayBackend(name="sdxl-mig", weight=3, address="10.20.0.13"),
        GatewayBackend(name="sdxl-4090", weight=2, address="10.20.4.11")))
    shared = shared_files(spec, code)  # the serving package and worker.json, path -> content
    redis_files(spec)                  # its unit and redis.conf
    worker_files(spec, 0, shared)      # worker 0's unit (carrying the digest of `shared`) and the shared files
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from plans import values as val
from plans.triton_runtime import systemd_quote

# The worker's own pins, the same as requirements.txt (a test holds them equal). hiredis: redis-py's C reply parser,
# which it uses when installed (bench.queue_floor: ~30-40 µs less worker CPU a 107 KB frame's job).
REQUIREMENTS = ("redis==8.1.0", "hiredis==3.5.0", "tritonclient[grpc]==2.73.0", "numpy==1.26.4")
# What the front and the workers import: shipped to the gateway host (a module missing there fails at start).
SERVING_MODULES = (
    "__init__.py",
    "bytes_rows.py",
    "front.py",
    "metrics.py",
    "queue.py",
    "scheduler.py",
    "triton_wire.py",
    "worker.py",
)
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class GatewayBackend(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    weight: float = Field(gt=0)
    address: str
    grpc_port: int = Field(8001, ge=1, le=65535)
    http_port: int = Field(8000, ge=1, le=65535)
    metrics_port: int = Field(8002, ge=1, le=65535)
    # Triton's metrics and the guest's dcgm-exporter may listen elsewhere than its HTTP/gRPC (None: `address`).
    metrics_address: Optional[str] = None
    dcgm_address: Optional[str] = None
    dcgm_port: Optional[int] = Field(None, ge=1, le=65535)


class GatewaySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    backends: tuple[GatewayBackend, ...]
    models: tuple[str, ...] = ()
    workers: int = Field(2, ge=1, le=64)
    slots: int = Field(8, ge=1, le=1024)
    max_depth: int = Field(1000, ge=1)
    stream: str = "gen:queue"
    group: str = "workers"
    redis_bind: str = "127.0.0.1"
    redis_port: int = Field(6379, ge=1, le=65535)
    # Redis's memory limit: with noeviction, a write past it is refused (the front answers 503), where without one
    # nothing was ever "full" until the host ran out of memory.
    redis_maxmemory_mb: int = Field(1024, ge=16, le=64 * 1024 * 1024)
    metrics_port: int = Field(9470, ge=1, le=65535)
    metrics_address: str = "0.0.0.0"
    # The network the front serves; loopback unless the stack says otherwise (it has no authentication of its own).
    front_listen: str = "127.0.0.1"
    front_port: int = Field(8090, ge=1, le=65535)
    front_timeout_s: float = Field(30.0, gt=0)
    claim_idle_ms: int = Field(5000, ge=100)
    job_timeout_s: float = Field(60.0, gt=0)
    ramp_s: float = Field(10.0, ge=0)
    queue_ms_shift: float = Field(20.0, gt=0)
    queue_ms_drain: float = Field(100.0, gt=0)
    install_dir: str = "/opt/gpuhost/gateway"
    # Redis requires a password, from the root-only AUTH_FILE (written from secret config; its value is never here).
    redis_auth: bool = False
    # Per model: {"max_batch_size": n, "inputs": [{"name", "datatype", "dims"}]}: what the front accepts.
    front_models: dict[str, dict] = Field(default_factory=dict)
    config_dir: str = "/etc/gpuhost/gateway"

    @model_validator(mode="after")
    def _check(self) -> "GatewaySpec":
        if not _NAME.match(self.name):
            raise ValueError(f"gateway name {self.name!r}: lower-case letters, digits and '-'")
        if not self.backends:
            raise ValueError("a gateway needs at least one backend")
        names = [b.name for b in self.backends]
        if len(set(names)) != len(names):
            raise ValueError(f"backend names must be unique: {names}")
        if self.queue_ms_shift >= self.queue_ms_drain:
            raise ValueError("queue_ms_shift must be below queue_ms_drain")
        if self.metrics_port + self.workers - 1 > 65535:
            raise ValueError("metrics ports run past 65535")
        if self.redis_port in self.metrics_ports:
            raise ValueError(f"redis_port {self.redis_port} collides with a worker metrics port")
        if self.front_port in (self.redis_port, *self.metrics_ports):
            raise ValueError(f"front_port {self.front_port} collides with redis_port or a worker metrics port")
        if not is_loopback(self.redis_bind) and not self.redis_auth:
            raise ValueError(f"redis_bind {self.redis_bind} is not loopback: Redis then needs a password (redis_auth)")
        for p in (self.install_dir, self.config_dir):
            if not p.startswith("/") or ".." in p.split("/"):
                raise ValueError(f"not an absolute path: {p!r}")
        return self

    @property
    def metrics_ports(self) -> list[int]:
        return [self.metrics_port + i for i in range(self.workers)]

    @property
    def venv(self) -> str:
        return f"{self.install_dir}/venv"

    @property
    def auth_file(self) -> str:
        return f"{self.config_dir}/{AUTH_NAME}"


def is_loopback(address: str) -> bool:
    """A loopback IP (127.0.0.0/8, ::1); a host name or any other address is not."""
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


# The file with Redis's `requirepass` line; the units get it as a systemd credential of this name (their dynamic
# users cannot read the root-only file), Redis includes it, the workers and the front read the password from it.
AUTH_NAME = "redis-auth.conf"


def auth_line(password: str) -> str:
    """The password file's content (passwords are checked at load: letters, digits and ._~+/=- only)."""
    return f"requirepass {password}\n"


def _credential(spec: "GatewaySpec") -> list[str]:
    return [f"LoadCredential={AUTH_NAME}:{spec.auth_file}"] if spec.redis_auth else []


REDIS_UNIT = "gpuhost-gateway-redis.service"
FRONT_UNIT = "gpuhost-gateway-front.service"


def worker_unit_name(i: int) -> str:
    return f"gpuhost-gateway-worker-{i}.service"


def unit_names(spec: GatewaySpec) -> tuple[str, ...]:
    return (REDIS_UNIT, FRONT_UNIT, *(worker_unit_name(i) for i in range(spec.workers)))


def worker_config(spec: GatewaySpec) -> dict:
    return {
        "redis": {
            "host": "127.0.0.1" if spec.redis_bind in ("0.0.0.0", "::") else spec.redis_bind,
            "port": spec.redis_port,
            **({"password_file": AUTH_NAME} if spec.redis_auth else {}),
        },
        "front": {"models": spec.front_models, "timeout_s": spec.front_timeout_s},
        "queue": {"stream": spec.stream, "group": spec.group, "max_depth": spec.max_depth},
        "backends": [
            {
                "name": b.name,
                "weight": b.weight,
                "grpc": val.host_port(b.address, b.grpc_port),
                "http": f"http://{val.host_port(b.address, b.http_port)}",
                "metrics": f"http://{val.host_port(b.metrics_address or b.address, b.metrics_port)}/metrics",
                **(
                    {"dcgm": f"http://{val.host_port(b.dcgm_address or b.address, b.dcgm_port)}/metrics"}
                    if b.dcgm_port
                    else {}
                ),
            }
            for b in spec.backends
        ],
        "models": list(spec.models),
        "slots": spec.slots,
        "claim_idle_ms": spec.claim_idle_ms,
        "job_timeout_s": spec.job_timeout_s,
        "metrics_address": spec.metrics_address,
        "policy": {"ramp_s": spec.ramp_s, "queue_ms_shift": spec.queue_ms_shift, "queue_ms_drain": spec.queue_ms_drain},
    }


def redis_conf(spec: GatewaySpec) -> str:
    return "\n".join(
        [
            "# gpuhost: the inference gateway's Redis (seed 001 queue); generated, do not edit by hand.",
            f"bind {spec.redis_bind}",
            f"port {spec.redis_port}",
            "protected-mode yes",
            "daemonize no",
            "supervised systemd",
            "appendonly yes",
            "appendfsync everysec",
            'save ""',
            f"maxmemory {spec.redis_maxmemory_mb}mb",
            "maxmemory-policy noeviction",
            *([f"include /run/credentials/{REDIS_UNIT}/{AUTH_NAME}"] if spec.redis_auth else []),
            "",
        ]
    )


def redis_unit(spec: GatewaySpec) -> str:
    return "\n".join(
        [
            "[Unit]",
            f"Description=gpuhost inference gateway {spec.name}: Redis (job queue)",
            "After=network-online.target",
            "Wants=network-online.target",
            "",
            "[Service]",
            "Type=notify",
            "DynamicUser=yes",
            "StateDirectory=gpuhost-gateway-redis",
            # dir on the command line: redis-server checks a config file's dir when it parses it, before systemd's
            # StateDirectory= exists on a first start.
            "ExecStart=/usr/bin/redis-server "
            + systemd_quote(f"{spec.config_dir}/redis.conf")
            + " --dir /var/lib/gpuhost-gateway-redis",
            "Restart=always",
            "RestartSec=1",
            "LimitNOFILE=65536",
            *_credential(spec),
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )


def _python_unit(spec: GatewaySpec, role: str, argv: list[str], shared_sha256: str, extra: list[str]) -> str:
    """A gateway process's unit; the digest line makes new code or config a new unit file (SystemdService restarts)."""
    return "\n".join(
        [
            f"# gpuhost: serving code and worker.json sha256 {shared_sha256 or '-'}",
            "[Unit]",
            f"Description=gpuhost inference gateway {spec.name}: {role}",
            f"After={REDIS_UNIT} network-online.target",
            f"Requires={REDIS_UNIT}",
            "",
            "[Service]",
            "Type=simple",
            "DynamicUser=yes",
            "WorkingDirectory=" + systemd_quote(spec.install_dir),
            "ExecStart=" + " ".join(systemd_quote(a) for a in argv),
            "Restart=always",
            "RestartSec=1",
            *_credential(spec),
            *extra,
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )


def worker_unit(spec: GatewaySpec, i: int, shared_sha256: str = "") -> str:
    argv = [
        f"{spec.venv}/bin/python",
        "-m",
        "serving.worker",
        "--config",
        f"{spec.config_dir}/worker.json",
        "--consumer",
        f"{spec.name}-{i}",
        "--metrics-port",
        str(spec.metrics_ports[i]),
    ]
    # SIGTERM: the worker stops reading and lets its running jobs finish (unfinished ones are reclaimed).
    return _python_unit(
        spec, f"queue worker {i}", argv, shared_sha256, extra=["KillSignal=SIGTERM", "TimeoutStopSec=70"]
    )


def shared_files(spec: GatewaySpec, serving_code: dict[str, str]) -> dict[str, str]:
    """path -> content of what every worker reads: the serving package and worker.json."""
    missing = sorted(set(SERVING_MODULES) - set(serving_code))
    if missing:
        raise ValueError(f"serving modules missing: {missing}")
    files = {f"{spec.install_dir}/serving/{m}": serving_code[m] for m in SERVING_MODULES}
    files[f"{spec.config_dir}/worker.json"] = json.dumps(worker_config(spec), indent=2, sort_keys=True) + "\n"
    return files


def files_sha256(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for path, content in sorted(files.items()):
        h.update(path.encode() + b"\0" + content.encode() + b"\0")
    return h.hexdigest()


def redis_files(spec: GatewaySpec) -> dict[str, str]:
    return {f"/etc/systemd/system/{REDIS_UNIT}": redis_unit(spec), f"{spec.config_dir}/redis.conf": redis_conf(spec)}


def worker_files(spec: GatewaySpec, i: int, shared: dict[str, str]) -> dict[str, str]:
    """Worker i's unit file; worker 0 also owns the shared files (one owner each, so delete restores them once)."""
    files = {f"/etc/systemd/system/{worker_unit_name(i)}": worker_unit(spec, i, files_sha256(shared))}
    if i == 0:
        files.update(shared)
    return files


def front_unit(spec: GatewaySpec, shared_sha256: str = "") -> str:
    argv = [
        f"{spec.venv}/bin/python",
        "-m",
        "serving.front",
        "--config",
        f"{spec.config_dir}/worker.json",
        "--listen",
        spec.front_listen,
        "--port",
        str(spec.front_port),
        "--timeout",
        f"{spec.front_timeout_s:g}",
    ]
    return _python_unit(spec, "HTTP entry (KServe v2 JSON, 429 when the queue is full)", argv, shared_sha256, extra=[])


def front_files(spec: GatewaySpec, shared: dict[str, str]) -> dict[str, str]:
    return {f"/etc/systemd/system/{FRONT_UNIT}": front_unit(spec, files_sha256(shared))}
