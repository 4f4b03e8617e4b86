"""InferenceGateway: seed 001's Redis Stream queue and weighted, health-aware queue workers on one host.

Children (all named ``f"{name}-…"``, parented to the component):
  * ``{name}-packages``: SystemPackages redis-server and python3-venv (delete removes what it installed);
  * ``{name}-runtime``: HostRuntime: a venv with the workers' pinned requirements, and Debian's own
    ``redis-server.service`` stopped while the gateway's Redis holds port 6379 (delete puts both back as found);
  * ``{name}-redis-auth``: ManagedFile, root-only, Redis's ``requirepass`` line from secret config (only when
    ``redis_auth``: Redis bound beyond loopback); the units get it as a systemd credential, and its content, digest
    and prior stay secret in state;
  * ``{name}-redis``: SystemdService ``gpuhost-gateway-redis.service`` with its redis.conf (AOF on, noeviction);
  * ``{name}-worker-<i>``: SystemdService per queue worker (one consumer of the group, its own metrics port);
    worker 0 also owns the serving package and worker.json, whose digest sits in every worker's unit file, so a
    code or config change restarts them all.

Usage::

    InferenceGateway("sdxl-gen", InferenceGatewayArgs(host=spec, gateway=GatewaySpec(
        name="sdxl-gen", models=("sdxl",), backends=(
            GatewayBackend(name="sdxl-mig", weight=3, address="10.20.0.13"),
            GatewayBackend(name="sdxl-4090", weight=2, address="10.20.4.11")))))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi
from pydantic import BaseModel, ConfigDict

from access.ssh import HostSpec
from components.wiring import Child, Later, Wired
from plans import gateway as gw
from plans import values as val
from plans.host_runtime import Runtime
from providers.base import host_input
from providers.host_runtime import HostRuntime
from providers.managed_file import ManagedFile
from providers.service_state import SystemPackages
from providers.systemd_service import SystemdService

SERVING_DIR = Path(__file__).resolve().parents[1] / "serving"


def serving_code() -> dict[str, str]:
    return {m: (SERVING_DIR / m).read_text() for m in gw.SERVING_MODULES}


class InferenceGatewayArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    host: HostSpec
    gateway: gw.GatewaySpec
    # Redis's password when gateway.redis_auth: a Pulumi secret Output from secret config (never a plain value here).
    redis_password: Any = None


def children(name: str, args: InferenceGatewayArgs) -> list[Child]:
    """Packages → runtime (venv, Debian's redis stopped) → Redis → workers (worker 0 first) → the HTTP front."""
    spec, host = args.gateway, host_input(args.host)
    out = [
        Child("packages", SystemPackages, {"host": host, "packages": ["redis-server", "python3-venv"]}),
        Child(
            "runtime",
            HostRuntime,
            {
                "host": host,
                "runtime": Runtime(
                    venv=spec.venv,
                    requirements=gw.REQUIREMENTS,
                    conflicts=("redis-server.service",) if spec.redis_port == 6379 else (),
                ).model_dump(mode="json"),
            },
            # after the packages: Debian starts its redis-server when the package is installed
            after=("packages",),
        ),
    ]
    if spec.redis_auth:
        out.append(
            Child(
                "redis-auth",
                ManagedFile,
                {
                    "host": host,
                    "path": spec.auth_file,
                    "content": Later(args.redis_password, gw.auth_line),
                    "mode": "0600",
                    "owner": "root:root",
                },
                after=("runtime",),
                # the password, its digest and whatever file was there before stay encrypted in state
                secret_outputs=("content", "sha256", "prior"),
            )
        )
    out.append(
        Child(
            "redis",
            SystemdService,
            {"host": host, "unit": gw.REDIS_UNIT, "files": gw.redis_files(spec)},
            ("runtime", *(("redis-auth",) if spec.redis_auth else ())),
        )
    )
    shared = gw.shared_files(spec, serving_code())
    for i in range(spec.workers):
        out.append(
            Child(
                f"worker-{i}",
                SystemdService,
                {"host": host, "unit": gw.worker_unit_name(i), "files": gw.worker_files(spec, i, shared)},
                after=("redis", *(("worker-0",) if i else ())),
            )
        )
    out.append(
        Child(
            "front",
            SystemdService,
            {"host": host, "unit": gw.FRONT_UNIT, "files": gw.front_files(spec, shared)},
            after=("redis", "worker-0"),
        )
    )
    return out


class InferenceGateway(Wired, type_name="gpuhost:serving:InferenceGateway", children=children):
    def wire(self, args: InferenceGatewayArgs, made: dict[str, Any]) -> dict[str, Any]:
        spec = args.gateway
        self.packages, self.runtime, self.redis, self.front = (
            made["packages"],
            made["runtime"],
            made["redis"],
            made["front"],
        )
        self.workers = [made[f"worker-{i}"] for i in range(spec.workers)]
        where = args.host.address if spec.redis_bind in ("0.0.0.0", "::") else spec.redis_bind
        self.redis_url = pulumi.Output.from_input(f"redis://{where}:{spec.redis_port}/0")
        self.metrics_targets = pulumi.Output.from_input([f"{args.host.address}:{p}" for p in spec.metrics_ports])
        front_at = args.host.address if spec.front_listen in ("0.0.0.0", "::") else spec.front_listen
        self.front_url = pulumi.Output.from_input(
            f"http://{val.host_port(front_at, spec.front_port)}/v2/models/<model>/infer"
        )
        return {"redis_url": self.redis_url, "metrics_targets": self.metrics_targets, "front_url": self.front_url}
