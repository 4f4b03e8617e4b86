"""TritonService: model repository → Triton (Docker or systemd+numactl) → nginx → acceptance gate, on one guest.

Children (all named ``f"{name}-…"``, parented to the component):
  * ``{name}-models``: TritonModelRepository (config.pbtxt per model, validated; presets applied per GPU);
  * Docker runtime: ``{name}-docker`` provider at ``ssh://user@guest``, ``{name}-triton-image``
    (pinned NGC image), ``{name}-triton`` container (ports 8000/8001/8002, device requests, shm, restart,
    MPS env); or process runtime: ``{name}-triton-unit`` (systemd unit file, numactl-bound);
  * ``{name}-nginx-conf``: nginx.conf for the front;
  * ``{name}-gate``: AcceptanceGate through nginx, re-run when the repository or runtime changes.

Usage::

    TritonService("gpu-a-serving", TritonServiceArgs(host=spec, gpu_model="NVIDIA H200", gpu_count=1,
                  models=[yolov8n()], endpoint="http://10.0.0.5:80", slo_p95_ms=8.0))
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal, Optional

import pulumi
import pulumi_docker as docker
from pydantic import BaseModel, ConfigDict

from access.ssh import HostSpec
from plans.adaptive_window import SCRIPT_PATH as WINDOW_SCRIPT_PATH
from plans.adaptive_window import UNIT_NAME as WINDOW_UNIT_NAME
from plans.adaptive_window import UNIT_PATH as WINDOW_UNIT_PATH
from plans.adaptive_window import AdaptiveWindow, controller_unit, with_flags
from plans.adaptive_window import server_flags as window_server_flags
from plans.nginx import NginxSpec
from plans.nginx import render as render_nginx
from plans.presets import apply_preset, mps_environment, preset_for
from plans.triton_model import ModelSpec
from plans.triton_repo import repository_files
from plans.triton_runtime import (
    DockerRuntime,
    ProcessRuntime,
    ServerOptions,
    container_spec,
    docker_host,
    server_args,
    systemd_unit,
)
from providers.base import host_input
from providers.managed_file import ManagedFile
from providers.systemd_service import SystemdService
from providers.triton_gate import AcceptanceGate
from providers.triton_repository import TritonModelRepository, repository_inputs
from serving.loadgate import DTYPE_BYTES
from serving.models import yolov8n_files

ADAPTIVE_WINDOW_PY = Path(__file__).resolve().parents[1] / "serving" / "adaptive_window.py"
STANDIN_MODEL_PY = Path(__file__).resolve().parents[1] / "serving" / "standin_model.py"


class TritonServiceArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    host: HostSpec
    gpu_model: str
    gpu_count: int
    models: list[ModelSpec]
    use_presets: bool = True
    repository_root: str = "/srv/triton-repo"
    runtime: Literal["docker", "process"] = "docker"
    docker: DockerRuntime = DockerRuntime()
    process: ProcessRuntime = ProcessRuntime()
    nginx_conf_path: str = "/etc/nginx/nginx.conf"
    nginx_listen: int = 80
    # Where the gate reaches nginx from the Pulumi host; None skips the gate.
    endpoint: Optional[str] = None
    gate_model: Optional[str] = None
    # (input, shape with batch, datatype); None: the gate model's first input, batch 1, sent as raw bytes.
    gate_input: Optional[tuple[str, list[int], str]] = None
    gate_concurrency: int = 8
    gate_duration_s: float = 30.0
    gate_max_requests: int = 200_000
    slo_p95_ms: Optional[float] = 8.0  # seed 000: p95 < 8 ms (640×640 detection)
    model_py: Optional[str] = None  # python-backend model code; default: the stand-in
    # Seed 004's adaptive batching window: a controller unit beside Triton, which then runs with explicit model
    # control and latency summaries.
    adaptive_window: Optional[AdaptiveWindow] = None


def adaptive_window_flags(args: TritonServiceArgs, specs: list[ModelSpec]) -> list[str]:
    """Triton flags the adaptive-window controller needs; every model must batch dynamically (a window to move)."""
    if not args.adaptive_window:
        return []
    fixed = [m.name for m in specs if m.dynamic_batching is None]
    if fixed:
        raise ValueError(f"adaptive_window: model(s) {', '.join(fixed)} have no dynamic_batching, no window to move")
    return window_server_flags()


def gate_input(spec: ModelSpec) -> tuple[str, list[int], str]:
    """The gate's request for ``spec``: its first input, one item (variable dims as 1), its datatype."""
    t = spec.inputs[0]
    dims = [1 if d < 0 else d for d in t.dims]
    return t.name, ([1, *dims] if spec.max_batch_size > 0 else dims), t.data_type


def _specs(args: TritonServiceArgs) -> list[ModelSpec]:
    return [apply_preset(m, args.gpu_model) if args.use_presets else m for m in args.models]


class TritonService(pulumi.ComponentResource):
    def __init__(self, name: str, args: TritonServiceArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("gpuhost:serving:TritonService", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        specs = _specs(args)
        model_py = args.model_py.encode() if args.model_py is not None else STANDIN_MODEL_PY.read_bytes()
        # Python models that name their code (``model_code``) ship it instead of the stand-in (yolov8n_torch).
        code = {
            k: v
            for m in specs
            if m.parameters.get("model_code") == "yolov8n"
            for k, v in yolov8n_files(m.name, m.version).items()
        }
        files = repository_files(specs, gpu_count=args.gpu_count, model_py=model_py, model_files=code)
        repo_inputs = repository_inputs(files)
        self.repository = TritonModelRepository(
            f"{name}-models", {"host": host_input(args.host), "root": args.repository_root, **repo_inputs}, opts=child
        )

        window_flags = adaptive_window_flags(args, specs)
        preset = preset_for(args.gpu_model)
        env = mps_environment(preset, 0)
        if args.runtime == "docker":
            srv_args = with_flags(server_args(ServerOptions(model_repository="/models"), specs), window_flags)
            rt = args.docker.model_copy(
                update={"host_repository": args.repository_root, "env": {**env, **args.docker.env}}
            )
            c = container_spec(rt, srv_args)
            engine = docker.Provider(
                f"{name}-docker", host=docker_host(args.host.user, args.host.address, args.host.port), opts=child
            )
            on_engine = pulumi.ResourceOptions(parent=self, provider=engine)
            image = docker.RemoteImage(f"{name}-triton-image", name=rt.image, keep_locally=True, opts=on_engine)
            self.server = docker.Container(
                f"{name}-triton",
                name=c["name"],
                image=image.image_id,
                command=c["command"],
                ports=[docker.ContainerPortArgs(**p) for p in c["ports"]],
                # docker's --gpus syntax: "all" or "device=<index|GPU-uuid|MIG-uuid>,...".
                gpus="all" if rt.gpus == ["all"] else "device=" + ",".join(rt.gpus),
                shm_size=c["shm_size"],
                restart=c["restart"],
                envs=c["envs"],
                must_run=True,
                ulimits=[docker.ContainerUlimitArgs(**u) for u in c["ulimits"]],
                volumes=[docker.ContainerVolumeArgs(**v) for v in c["volumes"]],
                # A repository change restarts Triton through this label.
                labels=[
                    docker.ContainerLabelArgs(label="gpuhost.repository-digest", value=repo_inputs["digest"]),
                    docker.ContainerLabelArgs(label="gpuhost.gpus", value=",".join(rt.gpus)),
                ],
                opts=pulumi.ResourceOptions(parent=self, provider=engine, depends_on=[self.repository]),
            )
            runtime_id = c["image"]
        else:
            srv_args = with_flags(
                server_args(ServerOptions(model_repository=args.repository_root), specs), window_flags
            )
            rt = args.process.model_copy(update={"env": {**env, **args.process.env}})
            unit = systemd_unit(rt, srv_args)
            self.server = ManagedFile(
                f"{name}-triton-unit",
                {
                    "host": host_input(args.host),
                    "path": "/etc/systemd/system/gpuhost-triton.service",
                    "content": unit,
                    "mode": "0644",
                    "owner": "root:root",
                },
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.repository]),
            )
            runtime_id = hashlib.sha256(unit.encode()).hexdigest()

        default_model = args.gate_model or specs[0].name
        self.nginx_conf = ManagedFile(
            f"{name}-nginx-conf",
            {
                "host": host_input(args.host),
                "path": args.nginx_conf_path,
                "content": render_nginx(NginxSpec(default_model=default_model, listen_http=args.nginx_listen)),
                "mode": "0644",
                "owner": "root:root",
            },
            opts=child,
        )

        self.adaptive_window = None
        if args.adaptive_window:
            opts_ = ServerOptions()
            unit_text = controller_unit(
                args.adaptive_window,
                [m.name for m in specs],
                triton_url=f"http://127.0.0.1:{opts_.http_port}",
                metrics_url=f"http://127.0.0.1:{opts_.metrics_port}",
            )
            self.adaptive_window = SystemdService(
                f"{name}-adaptive-window",
                {
                    "host": host_input(args.host),
                    "unit": WINDOW_UNIT_NAME,
                    "files": {WINDOW_UNIT_PATH: unit_text, WINDOW_SCRIPT_PATH: ADAPTIVE_WINDOW_PY.read_text()},
                },
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.server]),
            )

        self.gate = None
        if args.endpoint:
            input_name, shape, dtype = args.gate_input or gate_input(next(m for m in specs if m.name == default_model))
            self.gate = AcceptanceGate(
                f"{name}-gate",
                {
                    "url": args.endpoint,
                    "models": [s.name for s in specs],
                    "model": default_model,
                    "bodySpec": {
                        "input": input_name,
                        "shape": list(shape),
                        "datatype": dtype,
                        "binary": dtype in DTYPE_BYTES,
                    },
                    "concurrency": args.gate_concurrency,
                    "durationS": args.gate_duration_s,
                    "maxRequests": args.gate_max_requests,
                    "p95Ms": args.slo_p95_ms,
                    "maxErrorRate": 0.0,
                    "trigger": f"{repo_inputs['digest']}:{runtime_id}",
                },
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.server, self.nginx_conf]),
            )

        self.repository_digest = pulumi.Output.from_input(repo_inputs["digest"])
        self.gate_result = self.gate.result if self.gate else pulumi.Output.from_input(None)
        self.register_outputs({"repositoryDigest": self.repository_digest, "gateResult": self.gate_result})
