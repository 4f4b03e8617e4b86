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

`children` reads top to bottom as one builder per part (`snapshot`, `control_key`, `artifacts`, `engines`,
`model_repository`, `docker_triton` or `process_triton`, `nginx`, `window_controller`, `gates`), each given the
children it depends on; what the deploy is before any child (`Deploy`: the repository, how Triton runs, nginx's
config, the rollback and the deploy's id) comes first, pure.

Usage::

    TritonService("gpu-a-serving", TritonServiceArgs(host=spec, gpu_model="NVIDIA H200", gpu_count=1,
                  models=[yolov8n()], endpoint="http://10.0.0.5:80", slo_p95_ms=8.0,
                  artifacts=[ArtifactSpec(model="yolov8n", dest="/srv/onnx/yolov8n.onnx", sha256="…", url="…")]))
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import pulumi
import pulumi_docker as docker
from pydantic import BaseModel, ConfigDict, Field

from access.ssh import HostSpec
from components.wiring import Child, DockerEngine, Later, Wired, present, suffixes
from gate.kserve import signature
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
    """TritonService's resources in declaration order (see the module docstring), one builder per part; pure."""
    d = deploy(name, args)
    snap = snapshot(d)
    key = control_key(d, snap)
    arts = artifacts(d, snap)
    engs = engines(d, snap, arts)
    repo = model_repository(d, snap, arts, engs)
    if isinstance(d.server, DockerServer):
        triton = docker_triton(d, d.server, snap, key, repo)
    else:
        triton = process_triton(d, d.server, snap, key, repo)
    web = nginx(d, snap)  # [] when the stack runs its own nginx
    window = window_controller(d, triton)
    serving = [triton.started, *web[-1:]]  # what runs before a gate: Triton, and nginx reloaded
    return [snap, *present(key), *arts, *engs, repo, *triton.children, *web, *present(window), *gates(d, serving)]


# -- what one deploy is, before any child (pure) ------------------------------------------------------------------


@dataclass(frozen=True)
class DockerServer:
    """Triton in a container: the runtime (with the stack's env and published ports), its `docker run` spec
    (plans.triton_runtime.container_spec) and the path of this deploy's run script on the guest. The snapshot keeps
    the previous deploy's script, so a failed gate restarts the previous image and flags, not this deploy's."""

    runtime: DockerRuntime
    spec: dict
    run_path: str

    @property
    def id(self) -> str:
        return hashlib.sha256(json.dumps(self.spec, sort_keys=True).encode()).hexdigest()

    def files(self) -> list[str]:
        return [self.run_path]

    def restart(self) -> list[list[str]]:
        return [docker_rollback_restart(self.run_path, self.spec["name"])]

    def prepare(self) -> list[list[str]]:
        return [docker_unroll(self.spec["name"], self.spec["restart"])]


@dataclass(frozen=True)
class ProcessServer:
    """Triton as a systemd unit (numactl-bound to the GPU's node)."""

    runtime: ProcessRuntime
    unit: str

    @property
    def id(self) -> str:
        return hashlib.sha256(self.unit.encode()).hexdigest()

    def files(self) -> list[str]:
        return [UNIT_PATH]

    def restart(self) -> list[list[str]]:
        return [["systemctl", "daemon-reload"], ["systemctl", "restart", "gpuhost-triton"]]

    def prepare(self) -> list[list[str]]:
        return []


def docker_server(name: str, args: TritonServiceArgs, specs: list[ModelSpec]) -> DockerServer:
    """Inside the container's own network namespace Triton binds every interface of it; the host side is only the
    published ports, each on the address the stack gives (loopback by default)."""
    o = args.server
    inside = {"model_repository": "/models", "http_address": "0.0.0.0", "grpc_address": "0.0.0.0"}
    srv_args = with_flags(
        server_args(o.model_copy(update={**inside, "metrics_address": "0.0.0.0"}), specs),
        adaptive_window_flags(args, specs),
    )
    publish = {o.http_port: o.http_address, o.grpc_port: o.grpc_address, o.metrics_port: o.metrics_address}
    rt = args.docker.model_copy(
        update={
            "host_repository": args.repository_root,
            "env": {**_mps_env(args.mps_percentage), **args.docker.env},
            "publish": {**publish, **args.docker.publish},
        }
    )
    return DockerServer(rt, container_spec(rt, srv_args), f"{args.snapshot_dir}/{name}.docker-run.sh")


def process_server(args: TritonServiceArgs, specs: list[ModelSpec]) -> ProcessServer:
    """Triton's systemd unit, serving the repository where it lies on the host."""
    srv_args = with_flags(
        server_args(args.server.model_copy(update={"model_repository": args.repository_root}), specs),
        adaptive_window_flags(args, specs),
    )
    rt = args.process.model_copy(update={"env": {**_mps_env(args.mps_percentage), **args.process.env}})
    return ProcessServer(rt, systemd_unit(rt, srv_args))


def nginx_conf(args: TritonServiceArgs, specs: list[ModelSpec]) -> str:
    """nginx's config in front of Triton's HTTP and gRPC ports."""
    o = args.server
    return render_nginx(
        NginxSpec(
            default_model=specs[0].name,
            models=tuple(sp.name for sp in specs),
            listen_http=args.nginx_listen,
            upstream_http=f"{connect_address(o.http_address)}:{o.http_port}",
            upstream_grpc=f"{connect_address(o.grpc_address)}:{o.grpc_port}",
        )
    )


@dataclass(frozen=True)
class Deploy:
    """One deploy of a TritonService, before any child: the models (presets applied), the repository's files and
    digest, how Triton runs and nginx's config; `rollback` and `id` follow from them."""

    name: str
    args: TritonServiceArgs
    specs: list[ModelSpec]
    host: dict
    files: dict[str, bytes]
    digest: str
    server: DockerServer | ProcessServer
    nginx: str

    @property
    def rollback(self) -> dict:
        """What a failed gate restores (the snapshot's files) and restarts."""
        nginx = self.args.manage_nginx
        return {
            "host": self.host,
            "root": self.args.repository_root,
            "snapshot": f"{self.args.snapshot_dir}/{self.name}",
            "files": [*self.server.files(), *([self.args.nginx_conf_path] if nginx else [])],
            "restart": [*self.server.restart(), *([["systemctl", "reload-or-restart", "nginx"]] if nginx else [])],
        }

    @property
    def id(self) -> str:
        """Changes with anything this deploy changes on the guest: a new snapshot and new gates."""
        what = {
            "repo": self.digest,
            "runtime": self.server.id,
            "nginx": self.nginx,
            "artifacts": [a.model_dump() for a in self.args.artifacts],
            "engines": [e.model_dump(mode="json") for e in self.args.engines],
        }
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def deploy(name: str, args: TritonServiceArgs) -> Deploy:
    """The deploy `args` describe; raises ValueError for a model without its weights or model.py, or an adaptive
    window over a model that does not batch dynamically."""
    specs = _specs(args)
    files, digest = repository(name, args)
    server = docker_server(name, args, specs) if args.runtime == "docker" else process_server(args, specs)
    return Deploy(name, args, specs, host_input(args.host), files, digest, server, nginx_conf(args, specs))


# -- the children, in declaration order ---------------------------------------------------------------------------


def snapshot(d: Deploy) -> Child:
    """ServingSnapshot of what serves now, before anything below changes it (a failed gate restores it)."""
    return Child("snapshot", ServingSnapshot, {**d.rollback, "trigger": d.id, "prepare": d.server.prepare()})


def control_key(d: Deploy, snap: Child) -> Optional[Child]:
    """TritonControlKey: the host's key for Triton's restricted APIs, made on the host (None: APIs unrestricted)."""
    if not d.args.server.restrict_apis:
        return None
    return Child(
        "control-key", TritonControlKey, {"host": d.host, "path": CONTROL_KEY_PATH, "mode": "0600"}, suffixes(snap)
    )


def artifacts(d: Deploy, snap: Child) -> list[Child]:
    """ModelArtifact per artifact (ONNX or model.py from a URL or path, sha256-checked)."""
    return [
        Child(
            f"{a.model}-artifact",
            ModelArtifact,
            {"host": d.host, "dest": a.dest, "sha256": a.sha256, "url": a.url, "path": a.path},
            after=suffixes(snap),
        )
        for a in d.args.artifacts
    ]


def _by_dest(arts: list[Child]) -> dict[str, Child]:
    """The artifact children by destination (the last one of a destination given twice, which the load refuses)."""
    return {a.inputs["dest"]: a for a in arts}


def engines(d: Deploy, snap: Child, arts: list[Child]) -> list[Child]:
    """TensorRTEngine per TensorRT model, after the ONNX it is built from arrived."""
    onnx = _by_dest(arts)
    return [
        Child(
            f"{b.model}-engine",
            TensorRTEngine,
            {"host": d.host, **engine_inputs(b)},
            suffixes(snap, *present(onnx.get(b.onnx_path))),
        )
        for b in d.args.engines
    ]


def model_repository(d: Deploy, snap: Child, arts: list[Child], engs: list[Child]) -> Child:
    """TritonModelRepository: config.pbtxt per model (validated) and the ``.gpuhost-digest`` marker."""
    return Child(
        "models",
        TritonModelRepository,
        {"host": d.host, "root": d.args.repository_root, **repository_inputs(d.files)},
        after=suffixes(snap, *_by_dest(arts).values(), *engs),
    )


@dataclass(frozen=True)
class Triton:
    """Triton's children in one runtime: `started` runs Triton, `defined` are the files it starts from."""

    children: list[Child]
    started: Child
    defined: list[Child]


def docker_triton(d: Deploy, srv: DockerServer, snap: Child, key: Optional[Child], repo: Child) -> Triton:
    """pulumi-docker's provider at the guest's engine (gpuhost's own pins, key and jump host, not the runner's
    ~/.ssh: access/docker_ssh.py), the pinned image, this deploy's run script and the container."""
    engine = Child("docker", DockerEngine, {"spec": d.args.host})
    image = Child(
        "triton-image", docker.RemoteImage, {"name": srv.runtime.image, "keep_locally": True}, provider=engine.suffix
    )
    devices = d.args.devices if d.args.devices is not None else list(srv.runtime.gpus)
    run = run_script(d, srv, devices, after=suffixes(snap, *present(key)))
    box = triton_container(d, srv, devices, image, key, after=suffixes(repo, *present(key)), provider=engine.suffix)
    return Triton([engine, image, run, box], started=box, defined=[])


def run_script(d: Deploy, srv: DockerServer, devices: Any, after: tuple[str, ...]) -> Child:
    """This deploy's own `docker run` on the guest, mode 0700 (plans.triton_runtime.docker_run_script)."""
    c, digest = srv.spec, d.digest
    return Child(
        "triton-run",
        ManagedFile,
        {
            "host": d.host,
            "path": srv.run_path,
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
        after=after,
    )


def triton_container(
    d: Deploy,
    srv: DockerServer,
    devices: Any,
    image: Child,
    key: Optional[Child],
    after: tuple[str, ...],
    provider: str,
) -> Child:
    """The Triton container (ports, GPUs or MIG UUIDs, shm, restart, MPS env); a new label or key recreates it."""
    c, digest = srv.spec, d.digest
    return Child(
        "triton",
        docker.Container,
        {
            "name": c["name"],
            "image": image.ref("image_id"),
            "command": c["command"],
            "ports": [docker.ContainerPortArgs(**p) for p in c["ports"]],
            # docker's --gpus syntax: "all" or "device=<index|GPU-uuid|MIG-uuid>,...".
            # An empty list (MIG UUID not known) fails: never widened to "all".
            "gpus": Later(devices, lambda ids: docker_gpus_value(list(ids or []))),
            "shm_size": c["shm_size"],
            "restart": c["restart"],
            # A new control key (a new file on the host) replaces the container: Triton reads it at start.
            "envs": [*c["envs"], key.ref("stamp", lambda k: f"GPUHOST_CONTROL_KEY_STAMP={k}")] if key else c["envs"],
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
        after=after,
        provider=provider,
    )


def process_triton(d: Deploy, srv: ProcessServer, snap: Child, key: Optional[Child], repo: Child) -> Triton:
    """Triton's systemd unit, then the service (enabled, restarted on every repository or unit change)."""
    unit = Child(
        "triton-unit",
        ManagedFile,
        {"host": d.host, "path": UNIT_PATH, "content": srv.unit, "mode": "0644", "owner": "root:root"},
        after=suffixes(snap),
    )
    trigger = f"{d.digest}:{srv.id}"
    service = Child(
        "triton-service",
        ServiceState,
        {
            "host": d.host,
            "unit": "gpuhost-triton",
            "action": "restart",
            "user": srv.runtime.user,
            "check": [srv.runtime.numactl, "--hardware"] if srv.runtime.numa_node is not None else [],
            # A new control key (a new file on the host) restarts Triton, which reads it only at start.
            "trigger": key.ref("stamp", lambda k: f"{trigger}:{k}") if key else trigger,
        },
        after=suffixes(repo, unit, *present(key)),
    )
    return Triton([unit, service], started=service, defined=[unit])


def nginx(d: Deploy, snap: Child) -> list[Child]:
    """nginx installed, its config, then checked (`nginx -t` on the target) and reloaded; [] when not managed."""
    if not d.args.manage_nginx:
        return []
    conf_path = d.args.nginx_conf_path
    pkg = Child(
        "nginx-pkg",
        SystemPackages,
        {"host": d.host, "packages": ["nginx"], "debs_dir": d.args.nginx_debs_dir},
        after=suffixes(snap),
    )
    conf = Child(
        "nginx-conf",
        ManagedFile,
        {"host": d.host, "path": conf_path, "content": d.nginx, "mode": "0644", "owner": "root:root"},
        after=suffixes(pkg),
    )
    service = Child(
        "nginx",
        ServiceState,
        {
            "host": d.host,
            "unit": "nginx",
            "action": "reload",
            "check": ["nginx", "-t", "-c", conf_path],
            "trigger": hashlib.sha256(d.nginx.encode()).hexdigest(),
        },
        after=suffixes(conf),
    )
    return [pkg, conf, service]


def window_controller(d: Deploy, triton: Triton) -> Optional[Child]:
    """Seed 004's adaptive batching window: its controller unit, after Triton is defined and started."""
    if not d.args.adaptive_window:
        return None
    o = d.args.server
    unit_text = controller_unit(
        d.args.adaptive_window,
        [m.name for m in d.specs],
        triton_url=f"http://{connect_address(o.http_address)}:{o.http_port}",
        metrics_url=f"http://{connect_address(o.metrics_address)}:{o.metrics_port}",
    )
    return Child(
        "adaptive-window",
        SystemdService,
        {
            "host": d.host,
            "unit": WINDOW_UNIT_NAME,
            "files": {WINDOW_UNIT_PATH: unit_text, WINDOW_SCRIPT_PATH: ADAPTIVE_WINDOW_PY.read_text()},
        },
        after=suffixes(*triton.defined, triton.started),
    )


def gates(d: Deploy, serving: list[Child]) -> list[Child]:
    """AcceptanceGate through nginx per model (or only `gate_model`), chained so their loads never overlap; [] when
    the stack gives no endpoint."""
    args, rollback, digest, runtime_id, deploy_id = d.args, d.rollback, d.digest, d.server.id, d.id
    if not args.endpoint:
        return []
    names = [s.name for s in d.specs]
    out: list[Child] = []
    for s in d.specs:
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
                after=suffixes(*serving, *out[-1:]),
            )
        )
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
