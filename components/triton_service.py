"""TritonService: snapshot → model artifacts → TensorRT engines → model repository → Triton (Docker or
systemd+numactl, started) → nginx (installed, `nginx -t` on the target, reloaded) → one acceptance gate per model.

Children (all named ``f"{name}-…"``, parented to the component):
  * ``{name}-snapshot``: ServingSnapshot (what the guest served before this deploy; a failed gate restores it);
  * ``{name}-control-key``: TritonControlKey (the host's key for Triton's restricted APIs, made on the host);
  * ``{name}-{model}-artifact``: ModelArtifact per artifact (ONNX or model.py from a URL or path, sha256-checked);
  * ``{name}-{model}-engine``: TensorRTEngine per TensorRT model (after its ONNX arrived);
  * ``{name}-models``: TritonModelRepository (config.pbtxt per model, validated; ``.gpuhost-digest`` marker);
  * Docker runtime: ``{name}-docker`` provider at ``ssh://user@guest`` (gpuhost's pins and key), ``{name}-triton-image`` (pinned image),
    ``{name}-triton-run`` (this deploy's `docker run` script on the guest: the snapshot keeps the previous one, so a
    failed gate brings back the previous image and flags), ``{name}-triton`` container (ports 8000/8001/8002, GPUs or MIG UUIDs, shm, restart, MPS env); or process
    runtime: ``{name}-triton-unit`` (systemd unit, numactl-bound to the GPU's node) and ``{name}-triton-service``
    (enabled, restarted on every repository or unit change);
  * ``{name}-nginx-pkg``, ``{name}-nginx-conf``, ``{name}-nginx``: nginx installed, its config, checked and
    reloaded;
  * ``{name}-{model}-gate``: AcceptanceGate through nginx per model, chained so their loads never overlap.

Usage::

    TritonService("gpu-a-serving", TritonServiceArgs(host=spec, gpu_model="NVIDIA H200", gpu_count=1,
                  models=[yolov8n()], endpoint="http://10.0.0.5:80", slo_p95_ms=8.0,
                  artifacts=[ArtifactSpec(model="yolov8n", dest="/srv/onnx/yolov8n.onnx", sha256="…", url="…")]))
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal, Optional

import pulumi
import pulumi_docker as docker
from pydantic import BaseModel, ConfigDict, Field

from access.ssh import HostSpec
from components.wiring import Child, DockerEngine, Later, Ref, Wired
from plans.adaptive_window import SCRIPT_PATH as WINDOW_SCRIPT_PATH
from plans.adaptive_window import UNIT_NAME as WINDOW_UNIT_NAME
from plans.adaptive_window import UNIT_PATH as WINDOW_UNIT_PATH
from plans.adaptive_window import AdaptiveWindow, controller_unit, with_flags
from plans.adaptive_window import server_flags as window_server_flags
from plans.nginx import NginxSpec
from plans.nginx import render as render_nginx
from plans.presets import apply_preset
from plans.triton_engine import EngineBuild
from plans.triton_model import ModelSpec
from plans.triton_repo import repository_digest, repository_files
from plans.triton_runtime import (
    CONTROL_KEY_PATH,
    DockerRuntime,
    ProcessRuntime,
    ServerOptions,
    container_spec,
    docker_gpus_flag,
    docker_gpus_value,
    docker_rollback_restart,
    docker_run_script,
    docker_unroll,
    server_args,
    systemd_unit,
)
from providers.base import host_input
from providers.control_key import TritonControlKey
from providers.managed_file import ManagedFile
from providers.model_artifact import ModelArtifact
from providers.service_state import SystemPackages
from providers.serving_snapshot import MARKER, ServingSnapshot
from providers.systemd_service import ServiceState, SystemdService
from providers.tensorrt_engine import TensorRTEngine, engine_inputs
from providers.triton_gate import AcceptanceGate
from providers.triton_repository import TritonModelRepository, repository_inputs
from serving.kserve import signature
from serving.models import yolov8n_files

UNIT_PATH = "/etc/systemd/system/gpuhost-triton.service"
ADAPTIVE_WINDOW_PY = Path(__file__).resolve().parents[1] / "serving" / "adaptive_window.py"


class ArtifactSpec(BaseModel):
    """A model file delivered to the guest: `url` fetched there or `path` uploaded from here, sha256-checked."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str
    dest: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    url: Optional[str] = None
    path: Optional[str] = None


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
    # tritonserver's own options (backend directory, extra flags); repository and ports are set per runtime.
    server: ServerOptions = ServerOptions()
    # GPU devices Triton gets, known only once MIG is laid out (an Output of MIG UUIDs); None: docker.gpus.
    devices: Optional[Any] = None
    # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of this Triton when the guest runs MPS (vms[].mps).
    mps_percentage: Optional[int] = Field(None, ge=1, le=100)
    artifacts: list[ArtifactSpec] = []
    engines: list[EngineBuild] = []
    nginx_conf_path: str = "/etc/nginx/nginx.conf"
    nginx_listen: int = 80
    # Install, check and reload nginx on the target (off for a test that runs its own nginx).
    manage_nginx: bool = True
    # An offline target (no network): install nginx from the .debs in this directory on the target.
    nginx_debs_dir: Optional[str] = None
    # Where the gate reaches nginx from the Pulumi host; None skips the gate.
    endpoint: Optional[str] = None
    # Gate only this model (default: one gate per model).
    gate_model: Optional[str] = None
    gate_concurrency: int = 8
    gate_duration_s: float = 30.0
    gate_max_requests: int = 200_000
    gate_rate: Optional[float] = None
    slo_p95_ms: Optional[float] = 8.0  # seed 000: p95 < 8 ms (640×640 detection)
    slo_p99_ms: Optional[float] = None
    slo_max_error_rate: float = 0.0
    slo_min_rps: Optional[float] = None
    gate_ready_timeout_s: float = 300
    gate_request_timeout_s: float = 30
    # python-backend model code shipped inline (tests); production python models come as artifacts.
    model_py: Optional[str] = None
    snapshot_dir: str = "/var/lib/gpuhost/serving"
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


def _specs(args: TritonServiceArgs) -> list[ModelSpec]:
    return [apply_preset(m, args.gpu_model) if args.use_presets else m for m in args.models]


def gate_signature(spec: ModelSpec) -> dict:
    """The gate's request signature from the model's own config (a batch of one); a model that takes JPEG frames
    (``yolov8n_torch``, ``input: jpeg``) marks its ``images`` input ``content: jpeg``, so the gate sends frames."""
    sig = signature([t.model_dump() for t in spec.inputs], [t.model_dump() for t in spec.outputs], spec.max_batch_size)
    if spec.parameters.get("input") == "jpeg":
        for t in sig["inputs"]:
            if t["name"] == "images":
                t["content"] = "jpeg"
    return sig


def connect_address(bind: str) -> str:
    """Where a client on the same machine reaches a listener bound to ``bind`` (all interfaces: loopback)."""
    if bind in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{bind}]" if ":" in bind else bind


def _mps_env(pct: Optional[int]) -> dict[str, str]:
    if pct is None:
        return {}
    from plans.guest_bootstrap import MPS_LOG, MPS_PIPE

    return {
        "CUDA_MPS_PIPE_DIRECTORY": MPS_PIPE,
        "CUDA_MPS_LOG_DIRECTORY": MPS_LOG,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct),
    }


def repository(name: str, args: TritonServiceArgs) -> tuple[dict[str, bytes], str]:
    """The model repository's files (with its digest marker) and its digest; pure."""
    specs = _specs(args)
    # Python models that name their code (``model_code``) ship it from this repository (yolov8n_torch).
    code = {
        k: v
        for m in specs
        if m.parameters.get("model_code") == "yolov8n"
        for k, v in yolov8n_files(m.name, m.version).items()
    }
    shipped = {a.dest for a in args.artifacts} | {f"{args.repository_root}/{k}" for k in code}
    for s in specs:
        if s.parameters.get("model_code") == "yolov8n" and s.parameters.get("random_weights_for_benchmarks") != "true":
            w = s.parameters.get("weights")
            if not w or f"{args.repository_root}/{s.name}/{s.version}/{w}" not in shipped:
                raise ValueError(
                    f"{name}: model {s.name!r} has no weights file{f' {w!r}' if w else ''}: give it an artifact "
                    "(its YOLOv8n weights); a stack may not serve random weights"
                )
        py = f"{args.repository_root}/{s.name}/{s.version}/model.py"
        if s.platform == "python" and args.model_py is None and py not in shipped:
            raise ValueError(
                f"{name}: python model {s.name!r} has no model.py: give it an artifact "
                f"(dest {py}); gpuhost ships no stand-in"
            )
    files = repository_files(
        specs,
        gpu_count=args.gpu_count,
        model_py=args.model_py.encode() if args.model_py is not None else None,
        model_files=code,
    )
    digest = repository_digest(files)
    files[MARKER] = digest.encode()
    return files, digest


def children(name: str, args: TritonServiceArgs) -> list[Child]:
    """TritonService's resources in declaration order (see the module docstring); pure."""
    specs = _specs(args)
    files, digest = repository(name, args)
    repo_inputs = repository_inputs(files)
    host = host_input(args.host)

    # -- server definition (pure) ---------------------------------------------------------------------------------
    env = _mps_env(args.mps_percentage)
    window_flags = adaptive_window_flags(args, specs)
    o = args.server
    if args.runtime == "docker":
        # Inside the container's own network namespace Triton binds every interface of it; the host side is only
        # the published ports, each on the address the stack gives (loopback by default).
        inside = {"model_repository": "/models", "http_address": "0.0.0.0", "grpc_address": "0.0.0.0"}
        srv_args = with_flags(
            server_args(o.model_copy(update={**inside, "metrics_address": "0.0.0.0"}), specs), window_flags
        )
        publish = {o.http_port: o.http_address, o.grpc_port: o.grpc_address, o.metrics_port: o.metrics_address}
        rt = args.docker.model_copy(
            update={
                "host_repository": args.repository_root,
                "env": {**env, **args.docker.env},
                "publish": {**publish, **args.docker.publish},
            }
        )
        c = container_spec(rt, srv_args)
        runtime_id = hashlib.sha256(json.dumps(c, sort_keys=True).encode()).hexdigest()
        # This deploy's own `docker run` on the guest: the snapshot keeps the previous deploy's, so a failed gate
        # restarts the previous image and flags, not this deploy's container (plans.triton_runtime).
        run_path = f"{args.snapshot_dir}/{name}.docker-run.sh"
        server_files: list[str] = [run_path]
        restart = [docker_rollback_restart(run_path, c["name"])]
    else:
        srv_args = with_flags(
            server_args(args.server.model_copy(update={"model_repository": args.repository_root}), specs),
            window_flags,
        )
        rt_p = args.process.model_copy(update={"env": {**env, **args.process.env}})
        unit = systemd_unit(rt_p, srv_args)
        runtime_id = hashlib.sha256(unit.encode()).hexdigest()
        server_files = [UNIT_PATH]
        restart = [["systemctl", "daemon-reload"], ["systemctl", "restart", "gpuhost-triton"]]
    nginx_text = render_nginx(
        NginxSpec(
            default_model=specs[0].name,
            models=tuple(sp.name for sp in specs),
            listen_http=args.nginx_listen,
            upstream_http=f"{connect_address(o.http_address)}:{o.http_port}",
            upstream_grpc=f"{connect_address(o.grpc_address)}:{o.grpc_port}",
        )
    )
    if args.manage_nginx:
        server_files.append(args.nginx_conf_path)
        restart.append(["systemctl", "reload-or-restart", "nginx"])

    # -- snapshot of what serves now, before anything below changes it --------------------------------------------
    deploy_id = hashlib.sha256(
        json.dumps(
            {
                "repo": digest,
                "runtime": runtime_id,
                "nginx": nginx_text,
                "artifacts": [a.model_dump() for a in args.artifacts],
                "engines": [e.model_dump(mode="json") for e in args.engines],
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()
    rollback = {
        "host": host,
        "root": args.repository_root,
        "snapshot": f"{args.snapshot_dir}/{name}",
        "files": server_files,
        "restart": restart,
    }
    prepare = [docker_unroll(c["name"], c["restart"])] if args.runtime == "docker" else []
    out = [Child("snapshot", ServingSnapshot, {**rollback, "trigger": deploy_id, "prepare": prepare})]
    key = ("control-key",) if o.restrict_apis else ()
    if o.restrict_apis:
        out.append(
            Child(
                "control-key", TritonControlKey, {"host": host, "path": CONTROL_KEY_PATH, "mode": "0600"}, ("snapshot",)
            )
        )

    # -- model artifacts, engines, repository ---------------------------------------------------------------------
    artifacts: dict[str, str] = {}  # dest -> suffix
    for a in args.artifacts:
        artifacts[a.dest] = f"{a.model}-artifact"
        out.append(
            Child(
                f"{a.model}-artifact",
                ModelArtifact,
                {"host": host, "dest": a.dest, "sha256": a.sha256, "url": a.url, "path": a.path},
                after=("snapshot",),
            )
        )
    engines = []
    for b in args.engines:
        mine = tuple(sfx for dest, sfx in artifacts.items() if dest == b.onnx_path)
        engines.append(f"{b.model}-engine")
        out.append(Child(f"{b.model}-engine", TensorRTEngine, {"host": host, **engine_inputs(b)}, ("snapshot", *mine)))
    out.append(
        Child(
            "models",
            TritonModelRepository,
            {"host": host, "root": args.repository_root, **repo_inputs},
            after=("snapshot", *artifacts.values(), *engines),
        )
    )

    # -- Triton ---------------------------------------------------------------------------------------------------
    if args.runtime == "docker":
        # gpuhost's own pins, key and jump host, not the runner's ~/.ssh (access/docker_ssh.py).
        out.append(Child("docker", DockerEngine, {"spec": args.host}))
        out.append(
            Child("triton-image", docker.RemoteImage, {"name": rt.image, "keep_locally": True}, provider="docker")
        )
        devices = args.devices if args.devices is not None else list(rt.gpus)
        out.append(
            Child(
                "triton-run",
                ManagedFile,
                {
                    "host": host,
                    "path": run_path,
                    "content": Later(
                        devices,
                        lambda ids: docker_run_script(
                            c,
                            docker_gpus_flag(list(ids or [])),
                            {"gpuhost.repository-digest": digest, "gpuhost.gpus": ",".join(ids or [])},
                        ),
                    ),
                    "mode": "0700",
                    "owner": "root:root",
                },
                after=("snapshot", *key),
            )
        )
        out.append(
            Child(
                "triton",
                docker.Container,
                {
                    "name": c["name"],
                    "image": Ref("triton-image", "image_id"),
                    "command": c["command"],
                    "ports": [docker.ContainerPortArgs(**p) for p in c["ports"]],
                    # docker's --gpus syntax: "all" or "device=<index|GPU-uuid|MIG-uuid>,...".
                    # An empty list (MIG UUID not known) fails: never widened to "all".
                    "gpus": Later(devices, lambda ids: docker_gpus_value(list(ids or []))),
                    "shm_size": c["shm_size"],
                    "restart": c["restart"],
                    # A new control key (a new file on the host) replaces the container: Triton reads it at start.
                    "envs": [*c["envs"], Ref("control-key", "stamp", lambda k: f"GPUHOST_CONTROL_KEY_STAMP={k}")]
                    if o.restrict_apis
                    else c["envs"],
                    "must_run": True,
                    "ulimits": [docker.ContainerUlimitArgs(**u) for u in c["ulimits"]],
                    "volumes": [docker.ContainerVolumeArgs(**v) for v in c["volumes"]],
                    # A repository change restarts Triton through this label.
                    "labels": Later(
                        devices,
                        lambda ids: [
                            docker.ContainerLabelArgs(label="gpuhost.repository-digest", value=digest),
                            docker.ContainerLabelArgs(label="gpuhost.gpus", value=",".join(ids or [])),
                        ],
                    ),
                },
                after=("models", *key),
                provider="docker",
            )
        )
        started = ["triton"]
        server_defs: list[str] = []
    else:
        out.append(
            Child(
                "triton-unit",
                ManagedFile,
                {"host": host, "path": UNIT_PATH, "content": unit, "mode": "0644", "owner": "root:root"},
                after=("snapshot",),
            )
        )
        out.append(
            Child(
                "triton-service",
                ServiceState,
                {
                    "host": host,
                    "unit": "gpuhost-triton",
                    "action": "restart",
                    "user": rt_p.user,
                    "check": [rt_p.numactl, "--hardware"] if rt_p.numa_node is not None else [],
                    # A new control key (a new file on the host) restarts Triton, which reads it only at start.
                    "trigger": (
                        Ref("control-key", "stamp", lambda k: f"{digest}:{runtime_id}:{k}")
                        if o.restrict_apis
                        else f"{digest}:{runtime_id}"
                    ),
                },
                after=("models", "triton-unit", *key),
            )
        )
        started = ["triton-service"]
        server_defs = ["triton-unit"]

    # -- nginx ----------------------------------------------------------------------------------------------------
    if args.manage_nginx:
        out.append(
            Child(
                "nginx-pkg",
                SystemPackages,
                {"host": host, "packages": ["nginx"], "debs_dir": args.nginx_debs_dir},
                after=("snapshot",),
            )
        )
        out.append(
            Child(
                "nginx-conf",
                ManagedFile,
                {
                    "host": host,
                    "path": args.nginx_conf_path,
                    "content": nginx_text,
                    "mode": "0644",
                    "owner": "root:root",
                },
                after=("nginx-pkg",),
            )
        )
        out.append(
            Child(
                "nginx",
                ServiceState,
                {
                    "host": host,
                    "unit": "nginx",
                    "action": "reload",
                    "check": ["nginx", "-t", "-c", args.nginx_conf_path],
                    "trigger": hashlib.sha256(nginx_text.encode()).hexdigest(),
                },
                after=("nginx-conf",),
            )
        )
        started.append("nginx")

    if args.adaptive_window:
        unit_text = controller_unit(
            args.adaptive_window,
            [m.name for m in specs],
            triton_url=f"http://{connect_address(o.http_address)}:{o.http_port}",
            metrics_url=f"http://{connect_address(o.metrics_address)}:{o.metrics_port}",
        )
        out.append(
            Child(
                "adaptive-window",
                SystemdService,
                {
                    "host": host,
                    "unit": WINDOW_UNIT_NAME,
                    "files": {WINDOW_UNIT_PATH: unit_text, WINDOW_SCRIPT_PATH: ADAPTIVE_WINDOW_PY.read_text()},
                },
                # After Triton is defined and started (the unit file, then the running service, in the process
                # runtime).
                after=(*server_defs, started[0]),
            )
        )

    # -- one gate per model, one after the other ------------------------------------------------------------------
    if args.endpoint:
        names = [s.name for s in specs]
        gates: list[str] = []
        for s in specs:
            if args.gate_model and s.name != args.gate_model:
                continue
            out.append(
                Child(
                    f"{s.name}-gate",
                    AcceptanceGate,
                    {
                        "url": args.endpoint,
                        "models": names,
                        "model": s.name,
                        "request": gate_signature(s),
                        "concurrency": args.gate_concurrency,
                        "duration_s": args.gate_duration_s,
                        "max_requests": args.gate_max_requests,
                        "rate": args.gate_rate,
                        "p95_ms": args.slo_p95_ms,
                        "p99_ms": args.slo_p99_ms,
                        "max_error_rate": args.slo_max_error_rate,
                        "min_rps": args.slo_min_rps,
                        "ready_timeout_s": args.gate_ready_timeout_s,
                        "request_timeout_s": args.gate_request_timeout_s,
                        "rollback": rollback,
                        "expect_digest": digest,
                        "trigger": f"{digest}:{runtime_id}:{deploy_id}",
                    },
                    after=(*started, *gates[-1:]),
                )
            )
            gates.append(f"{s.name}-gate")
    return out


class TritonService(Wired, type_name="gpuhost:serving:TritonService", children=children):
    # A new label (the repository digest, the GPUs) or control-key stamp recreates the container: Triton restarts.
    RECREATED = {"triton": "container is recreated: Triton restarts"}
    RECREATED_DERIVED = (("labels",),)

    def wire(self, args: TritonServiceArgs, made: dict[str, Any]) -> dict[str, Any]:
        specs = _specs(args)
        self.snapshot = made["snapshot"]
        self.artifacts = {a.model + ":" + a.dest: made[f"{a.model}-artifact"] for a in args.artifacts}
        self.engines = [made[f"{b.model}-engine"] for b in args.engines]
        self.repository = made["models"]
        self.server = made.get("triton") or made["triton-service"]
        self.unit = made.get("triton-unit")
        self.nginx_conf = made.get("nginx-conf")
        self.adaptive_window = made.get("adaptive-window")
        self.gates = [r for r in made.values() if isinstance(r, AcceptanceGate)]
        self.gate = self.gates[0] if self.gates else None
        _, digest = repository(self.component_name, args)

        self.repository_digest = pulumi.Output.from_input(digest)
        self.gate_result = (
            pulumi.Output.all(*[g.result for g in self.gates]).apply(
                lambda rs: dict(zip([s.name for s in specs if not args.gate_model or s.name == args.gate_model], rs))
            )
            if self.gates
            else pulumi.Output.from_input(None)
        )
        return {"repositoryDigest": self.repository_digest, "gateResult": self.gate_result}
