"""How tritonserver runs on the guest: its arguments, the Docker container, or a systemd unit under numactl.

* ``server_args``: ``--metrics-config=summary_latencies=true`` (the p95 alert's series),
  ``--exit-on-error=false`` (one broken model must not take the others down, seed 004),
  ``--rate-limit=execution_count`` when a model declares rate-limiter resources, ``--cache-config``
  when a model enables ``response_cache``, ports 8000/8001/8002 bound to loopback unless the stack names an address
  (``--http-address``/``--grpc-address``/``--metrics-address``; never Triton's default 0.0.0.0 unless asked), and
  the model-repository, shared-memory, logging and trace APIs restricted (``--http-restricted-api``,
  ``--grpc-restricted-protocol``) to requests carrying the host's control key (``CONTROL_KEY_PATH``, generated on
  the host by ``providers/control_key.py``, never in Pulumi state): the flags name it as ``${KEY_VAR}``, which the
  systemd unit expands from its ``EnvironmentFile`` and the container's ``/bin/sh`` from the mounted file. HTTP
  clients send it as the header ``gpuhost-control-key``, gRPC clients as ``triton-grpc-protocol-gpuhost-control-key``.
  Caveat: Triton takes the key only on its command line, so while it runs the key is in its argv
  (``/proc/<pid>/cmdline``), readable by any local user of the machine unless ``/proc`` is mounted ``hidepid=2``;
  the restriction keeps out whoever reaches Triton's ports, not a local user who can read other processes.
* ``container_spec``: the pulumi-docker ``Container`` arguments (NGC image pinned, ports, GPU device
  requests — whole GPUs or MIG UUIDs —, shm size, memlock/stack ulimits, restart policy, MPS env).
* ``systemd_unit``: the process runtime (seed 002 §11): ``numactl --cpunodebind=N --membind=N
  tritonserver ...`` with the environment, restart policy and limits in the unit.

Usage::

    args = server_args(ServerOptions(), specs)
    unit = systemd_unit(ProcessRuntime(numa_node=0), args)        # text of triton.service
    spec = container_spec(DockerRuntime(image="nvcr.io/nvidia/tritonserver:24.05-py3"), args)
"""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from access.shell import Script, quote, sh
from plans.triton_model import ModelSpec, needs_rate_limit, needs_response_cache

_IMAGE = r"^[a-z0-9.\-/:_@]+$"


# The host's Triton control key (systemd EnvironmentFile syntax, one line, root 0600): see the module docstring.
CONTROL_KEY_PATH = "/etc/gpuhost/triton-control.env"
KEY_VAR = "GPUHOST_TRITON_CONTROL_KEY"
KEY_REF = "${" + KEY_VAR + "}"
CONTROL_HEADER = "gpuhost-control-key"
GRPC_CONTROL_HEADER = "triton-grpc-protocol-" + CONTROL_HEADER  # Triton prefixes the gRPC metadata key
# Code loading (model-repository), memory mapping (shared-memory) and server-side settings: the operator's only.
RESTRICTED_APIS = ("model-repository", "shared-memory", "logging", "trace")
_IP = r"^([0-9]{1,3}(\.[0-9]{1,3}){3}|[0-9a-fA-F:]*:[0-9a-fA-F:.]*)$"


class ServerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    model_repository: str = "/models"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    # Where Triton's listeners bind (IP literals: Triton does not resolve names); loopback unless the stack names one.
    http_address: str = Field("127.0.0.1", pattern=_IP)
    grpc_address: str = Field("127.0.0.1", pattern=_IP)
    metrics_address: str = Field("127.0.0.1", pattern=_IP)
    # Restrict RESTRICTED_APIS to requests with the host's control key (KEY_REF expanded where Triton starts).
    restrict_apis: bool = True
    exit_on_error: bool = False
    strict_readiness: bool = True
    response_cache_bytes: int = 256 * 1024 * 1024
    backend_directory: Optional[str] = None
    # p50/p95/p99 summaries (nv_inference_request_summary_us & co.): the p95 alert and the latency panels read
    # them; without this flag Triton exports only counters and those series never exist.
    latency_summaries: bool = True
    extra: list[str] = []


def server_args(o: ServerOptions, specs: list[ModelSpec]) -> list[str]:
    args = [
        f"--model-repository={o.model_repository}",
        f"--http-address={o.http_address}",
        f"--http-port={o.http_port}",
        f"--grpc-address={o.grpc_address}",
        f"--grpc-port={o.grpc_port}",
        f"--metrics-address={o.metrics_address}",
        f"--metrics-port={o.metrics_port}",
        f"--exit-on-error={'true' if o.exit_on_error else 'false'}",
        f"--strict-readiness={'true' if o.strict_readiness else 'false'}",
    ]
    if o.latency_summaries:
        args.append("--metrics-config=summary_latencies=true")
    if o.backend_directory:
        args.append(f"--backend-directory={o.backend_directory}")
    if needs_rate_limit(specs):
        args.append("--rate-limit=execution_count")
    if needs_response_cache(specs):
        args.append(f"--cache-config=local,size={o.response_cache_bytes}")
    if o.restrict_apis:
        args += restricted_args(KEY_REF)
    return args + list(o.extra)


def restricted_args(key: str) -> list[str]:
    """The two flags restricting RESTRICTED_APIS to requests carrying ``key`` (Triton 2.51's syntax:
    ``<apis>:<header>=<value>``).

    >>> restricted_args("k")[0]
    '--http-restricted-api=model-repository,shared-memory,logging,trace:gpuhost-control-key=k'
    """
    apis = ",".join(RESTRICTED_APIS)
    return [
        f"--http-restricted-api={apis}:{CONTROL_HEADER}={key}",
        f"--grpc-restricted-protocol={apis}:{CONTROL_HEADER}={key}",
    ]


def uses_control_key(args: list[str]) -> bool:
    return any(KEY_REF in a for a in args)


def parse_control_key(text: str) -> str:
    """The key from the control key file's text (``KEY_VAR=<hex>``); ValueError when it holds none."""
    for line in text.splitlines():
        name, _, value = line.strip().partition("=")
        if name == KEY_VAR and re.fullmatch(r"[0-9a-f]{64}", value):
            return value
    raise ValueError(f"no {KEY_VAR}=<64 hex digits> line")


# ---------------------------------------------------------------- Docker


class DockerRuntime(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # Pinned: a tag plus, in production, the digest (``...:24.05-py3@sha256:...``).
    image: str = Field("nvcr.io/nvidia/tritonserver:24.05-py3", pattern=_IMAGE)
    name: str = "triton"
    host_repository: str = "/srv/triton-repo"
    # "all", GPU indexes ("0", "1") or MIG UUIDs ("MIG-…").
    gpus: list[str] = ["all"]
    shm_size_mib: int = 1024
    restart: Literal["no", "always", "unless-stopped", "on-failure"] = "always"
    env: dict[str, str] = {}
    ports: dict[int, int] = {8000: 8000, 8001: 8001, 8002: 8002}
    # The host address each container port is published on (Docker's default would be every interface); Triton
    # itself binds 0.0.0.0 inside the container's own network namespace, which only these published ports reach.
    publish: dict[int, str] = {}


def _sh_word(arg: str) -> str:
    """``arg`` as one /bin/sh word, KEY_REF left for the shell to expand (from the sourced key file)."""
    if KEY_REF not in arg:
        return quote(arg)
    return f'"${KEY_VAR}"'.join(quote(part) if part else "" for part in arg.split(KEY_REF))


def container_spec(rt: DockerRuntime, args: list[str]) -> dict:
    """Keyword arguments for ``pulumi_docker.Container`` (plain data; the component wraps them). Arguments naming
    the control key run through ``/bin/sh``, which reads the key from the mounted file (never in the spec)."""
    volumes = [{"host_path": rt.host_repository, "container_path": "/models", "read_only": True}]
    command = ["tritonserver", *args]
    if uses_control_key(args):
        run = f". {quote(CONTROL_KEY_PATH)} && exec tritonserver " + " ".join(_sh_word(a) for a in args)
        command = ["/bin/sh", "-c", run]
        volumes.append({"host_path": CONTROL_KEY_PATH, "container_path": CONTROL_KEY_PATH, "read_only": True})
    if rt.gpus == ["all"]:
        device_requests = [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]
    else:
        device_requests = [{"driver": "nvidia", "device_ids": list(rt.gpus), "capabilities": [["gpu"]]}]
    return {
        "name": rt.name,
        "image": rt.image,
        "command": command,
        "ports": [
            {"internal": i, "external": e, "ip": rt.publish.get(i, "127.0.0.1")} for i, e in sorted(rt.ports.items())
        ],
        "device_requests": device_requests,
        "shm_size": rt.shm_size_mib,
        # NGC's recommendation for Triton: unlimited locked memory, 64 MiB stack.
        "ulimits": [{"name": "memlock", "soft": -1, "hard": -1}, {"name": "stack", "soft": 67108864, "hard": 67108864}],
        "restart": rt.restart,
        "envs": [f"{k}={v}" for k, v in sorted(rt.env.items())],
        "volumes": volumes,
        "must_run": True,
    }


# ---------------------------------------------------------------- systemd + numactl


class ProcessRuntime(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    binary: str = "/opt/tritonserver/bin/tritonserver"
    numa_node: Optional[int] = 0
    numactl: str = "/usr/bin/numactl"
    user: str = "triton"
    env: dict[str, str] = {}
    restart: Literal["always", "on-failure", "no"] = "always"
    description: str = "Triton Inference Server (gpuhost)"


def systemd_quote(arg: str) -> str:
    """Quote one ExecStart word for systemd (its own rules, not a shell): "…" with \\ and " escaped,
    $ and % doubled so systemd expands neither variables nor specifiers."""
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("%", "%%")
    # The one variable gpuhost means: the control key, from the unit's EnvironmentFile.
    return '"' + escaped.replace("$" + KEY_REF, KEY_REF) + '"'


def exec_start(rt: ProcessRuntime, args: list[str]) -> list[str]:
    argv = []
    if rt.numa_node is not None:
        argv += [rt.numactl, f"--cpunodebind={rt.numa_node}", f"--membind={rt.numa_node}"]
    return argv + [rt.binary, *args]


def systemd_unit(rt: ProcessRuntime, args: list[str]) -> str:
    lines = [
        "[Unit]",
        f"Description={rt.description}",
        "After=network-online.target nvidia-persistenced.service",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"User={rt.user}",
    ]
    for k, v in sorted(rt.env.items()):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise ValueError(f"bad environment variable name {k!r}")
        lines.append(f"Environment={systemd_quote(f'{k}={v}')}")
    if uses_control_key(args):
        lines.append(f"EnvironmentFile={CONTROL_KEY_PATH}")
    lines += [
        "ExecStart=" + " ".join(systemd_quote(a) for a in exec_start(rt, args)),
        f"Restart={rt.restart}",
        "RestartSec=2",
        "LimitMEMLOCK=infinity",
        "LimitSTACK=67108864",
        "LimitNOFILE=1048576",
        # Triton drains in-flight requests on SIGTERM (exit timeout 30 s).
        "TimeoutStopSec=40",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def parse_unit_exec(unit_text: str) -> tuple[list[str], dict[str, str]]:
    """(argv of ExecStart, Environment) back from a unit rendered by ``systemd_unit``."""
    argv: list[str] = []
    env: dict[str, str] = {}
    word = re.compile(r'"((?:[^"\\]|\\.)*)"')

    def unquote(s: str) -> str:
        return re.sub(r"\\(.)", r"\1", s).replace("$$", "$").replace("%%", "%")

    for line in unit_text.splitlines():
        if line.startswith("ExecStart="):
            argv = [unquote(m.group(1)) for m in word.finditer(line[len("ExecStart=") :])]
        elif line.startswith("Environment="):
            m = word.match(line[len("Environment=") :])
            assert m is not None, f"systemd_unit quotes every Environment= value: {line!r}"
            k, _, v = unquote(m.group(1)).partition("=")
            env[k] = v
    return argv, env


# ---------------------------------------------------------------- Docker rollback: the deploy's own `docker run`


def docker_gpus_value(ids: list[str]) -> str:
    """Docker's device request: `all` only when asked for by name (["all"]), else `device=a,b`. An empty list
    (a MIG binding whose UUID is not known) fails: it never widens to every GPU of the machine."""
    ids = list(ids or [])
    if not ids:
        raise ValueError(
            "no GPU device to bind Triton to (a MIG binding whose MIG UUID is not known); refusing to run it with "
            "--gpus all: finish the MIG layout (nvidia-smi -L lists the MIG devices) and run up again"
        )
    return "all" if ids == ["all"] else "device=" + ",".join(ids)


def docker_gpus_flag(ids: list[str]) -> str:
    """`--gpus` as the docker CLI reads it: `all`, or `"device=a,b"` (quoted: the CLI splits the value as CSV)."""
    v = docker_gpus_value(ids)
    return v if v == "all" else f'"{v}"'


def docker_run_script(c: dict, gpus: str, labels: dict[str, str]) -> str:
    """A script that (re)starts this deploy's Triton container exactly as declared: `c` from `container_spec`.

    Every Docker deploy writes it on the guest (TritonService's `triton-run` file) and ServingSnapshot keeps the
    previous deploy's copy, so a failed gate puts back the previous image (by the reference that deploy pinned,
    `tag@sha256:...` in production) and its flags, not only its model repository. A container of the same name is
    stopped, kept as `<name>-failed` with no restart policy (its logs show why the gate failed), then the declared
    one runs.
    """
    name = c["name"]
    failed = f"{name}-failed"
    run: list[str] = ["docker", "run", "-d", "--name", name, "--restart", c["restart"]]
    run += ["--shm-size", f"{int(c['shm_size'])}m", "--gpus", gpus]
    for u in c["ulimits"]:
        run += ["--ulimit", f"{u['name']}={u['soft']}:{u['hard']}"]
    for p in c["ports"]:
        run += [
            "-p",
            (f"[{p['ip']}]" if ":" in p.get("ip", "") else p.get("ip", "0.0.0.0"))
            + f":{p['external']}:{p['internal']}",
        ]
    for e in c["envs"]:
        run += ["-e", e]
    for v in c["volumes"]:
        run += ["-v", f"{v['host_path']}:{v['container_path']}" + (":ro" if v.get("read_only") else "")]
    for k, val in sorted(labels.items()):
        run += ["--label", f"{k}={val}"]
    run += [c["image"], *c["command"]]
    s = Script().raw("set -e")
    s.raw(f"{sh('docker', 'rm', '-f', failed)} >/dev/null 2>&1 || true")
    s.raw(f"if {sh('docker', 'container', 'inspect', name)} >/dev/null 2>&1; then")
    s.raw(f"  {sh('docker', 'update', '--restart=no', name)} >/dev/null")
    s.raw(f"  {sh('docker', 'stop', name)} >/dev/null")
    s.raw(f"  {sh('docker', 'rename', name, failed)}")
    s.raw("fi")
    s.add(*run)
    return s.render()


def docker_unroll(name: str, restart: str) -> list[str]:
    """Run first by the next deploy (ServingSnapshot's `prepare`): when a rollback swapped containers, remove the
    restored one and put the container Pulumi created back under its name, running, with its restart policy, so
    the deploy replaces or updates what its state records (no name or port clash)."""
    failed = f"{name}-failed"
    s = Script().raw(f"if {sh('docker', 'container', 'inspect', failed)} >/dev/null 2>&1; then")
    s.raw(f"  {sh('docker', 'rm', '-f', name)} >/dev/null 2>&1 || true")
    s.raw(f"  {sh('docker', 'rename', failed, name)}")
    s.raw(f"  {sh('docker', 'update', f'--restart={restart}', name)} >/dev/null")
    s.raw(f"  {sh('docker', 'start', name)} >/dev/null")
    s.raw("fi")
    return ["sh", "-c", s.render()]


def docker_rollback_restart(run_path: str, name: str) -> list[str]:
    """The rollback's restart step for the Docker runtime: the restored `docker_run_script` when the previous
    deploy left one, else (a deploy from before these scripts) a plain restart of the container."""
    return [
        "sh",
        "-c",
        f"if [ -e {quote(run_path)} ]; then sh {quote(run_path)}; else {sh('docker', 'restart', name)}; fi",
    ]
