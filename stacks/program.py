"""The program: stack config → components, with the dependencies the seeds' order demands.

host prep (and its one reboot) → SR-IOV VFs → tenant VMs pinned beside their GPU → guest services → monitoring.

The components are made once, as a list (`plan`: each one's class, name, args, what it waits for and its children,
nothing registered), which the loader checks before `Program.declare` registers it in order. An output of a
component not declared yet is `Pending` in that list; `declare` passes the real Output.

Usage (what __main__.py does through stacks.load.load)::

    program = plan(fleet, guest_keys=("ssh-ed25519 AAAA... gpuhost",))   # ConfigError: a VM that cannot fit, ...
    outputs = program.declare()                                          # the stack's outputs
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import pulumi
from pulumi import ResourceOptions

from access.ssh import HostSpec, JumpHost
from components.inference_gateway import InferenceGateway, InferenceGatewayArgs
from components.mig_gpus import MigGpus, MigGpusArgs
from components.monitoring_stack import MonitoringStack, MonitoringStackArgs
from components.passthrough_host import PassthroughHost
from components.pinned_vm import PinnedVM, PinnedVMArgs
from components.sriov_nic import SriovNic, SriovNicArgs
from components.triton_service import ArtifactSpec, TritonService, TritonServiceArgs
from components.wiring import Child, Wired
from plans import placement as pl
from plans.domain_xml import CloudInit, StaticNetwork, vm_mac
from plans.gateway import GatewayBackend, GatewaySpec
from plans.guest_bootstrap import BootstrapConfig, MpsConfig
from plans.monitoring.model import GatewayTarget, HostTarget, MonitoringGraph, ServingSlo, TritonTarget
from plans.presets import apply_preset, gpu_key, preset_for
from plans.triton_engine import EngineBuild, ShapeRange
from plans.triton_model import DynamicBatching, InstanceGroup, ModelSpec
from plans.triton_repo import compiles_at_load, resnet50_fp16, sdxl, yolov8n, yolov8n_torch
from plans.triton_runtime import DockerRuntime, ProcessRuntime, ServerOptions
from plans.values import host_port
from stacks.args import host_spec, passthrough_args, same_fields
from stacks.errors import ConfigError
from stacks.schema import Artifact, Fleet, Gateway, Host, Service, ServiceModel, Vm

PRESETS: dict[str, Callable[[], ModelSpec]] = {
    "yolov8n": yolov8n,
    "yolov8n_torch": yolov8n_torch,
    "resnet50_fp16": resnet50_fp16,
    "sdxl": sdxl,
}


# Batching fields a GPU preset decides unless stack config sets them (plans/presets.py, seed 004).
_PRESET_FIELDS = {"max_batch_size", "instance_group", "dynamic_batching"}


def weights_file(artifact: Artifact) -> str:
    """A yolov8n_torch artifact's file name in the version directory: ``weights`` + the source's extension
    (the backend tells the format by content; the extension is for people)."""
    src = (artifact.path or artifact.url or "").split("?")[0]
    ext = os.path.splitext(src)[1].lower()
    return "weights" + (ext if ext in (".onnx", ".pt", ".pth", ".safetensors") else "")


def _with_weights(spec: ModelSpec, m: ServiceModel) -> ModelSpec:
    """yolov8n_torch: the ``weights`` parameter names the artifact's file (stacks.checks requires the artifact)."""
    if m.preset != "yolov8n_torch" or m.artifact is None:
        return spec
    return spec.model_copy(update={"parameters": {**spec.parameters, "weights": weights_file(m.artifact)}})


def model_spec(m: ServiceModel, gpu_model: str) -> ModelSpec:
    """The model's signature from its preset, batching from the GPU's preset, and what config sets on top."""
    base = (
        yolov8n_torch(input=m.input, jpeg_decoder=m.jpeg_decoder, compile=m.compile)
        if m.preset == "yolov8n_torch"
        else PRESETS[m.preset]()
    )
    try:
        gpu_key(gpu_model)
    except KeyError:
        return _with_weights(base.model_copy(update={"name": m.name}), m)
    workload = m.workload or base.workload
    data = base.model_dump(by_alias=True, exclude=_PRESET_FIELDS)
    data.update(name=m.name, workload=workload)
    if m.max_batch_size is not None:
        data["max_batch_size"] = m.max_batch_size
    if m.instance_count is not None:
        data["instance_group"] = [InstanceGroup(kind="KIND_GPU", count=m.instance_count).model_dump(by_alias=True)]
    if m.max_queue_delay_us is not None:
        data["dynamic_batching"] = DynamicBatching(max_queue_delay_microseconds=m.max_queue_delay_us)
    spec = ModelSpec.model_validate(data)
    spec = _with_weights(apply_preset(spec, gpu_model, workload), m)
    if spec.warmup and spec.max_batch_size and any(w.batch_size > spec.max_batch_size for w in spec.warmup):
        spec = spec.model_copy(update={"warmup": []})
    return spec


# How long the acceptance gate waits for Triton and every model to be ready (``acceptance.ready_timeout_s`` unset):
# the component's default, and for a load that compiles (``plans.triton_repo.compiles_at_load``) about five times the
# longest measured.
READY_TIMEOUT_S: float = TritonServiceArgs.model_fields["gate_ready_timeout_s"].default
COMPILE_READY_TIMEOUT_S = 900.0


def ready_timeout_s(s: Service, specs: list[ModelSpec]) -> float:
    """The gate's readiness wait for service ``s`` serving ``specs``: the stack's, else the default for its models."""
    if s.acceptance.ready_timeout_s is not None:
        return s.acceptance.ready_timeout_s
    return COMPILE_READY_TIMEOUT_S if any(compiles_at_load(x) for x in specs) else READY_TIMEOUT_S


def mig_devices(h: Host, s: Service, layout: Planned) -> Pending:
    """The MIG UUID the service is bound to (seed 001 route A: one MIG device per Triton)."""
    order = [g.address for g in sorted(h.gpus, key=lambda g: g.address) if not g.passthrough]
    gpu = s.mig.gpu if s.mig else next(g.address for g in sorted(h.gpus, key=lambda g: g.address) if g.mig)
    index, instance = str(order.index(gpu)), (s.mig.instance if s.mig else 0)

    def bound(u: Any) -> list[str]:
        # Fail closed: a MIG UUID that is not known (layout pending a reset, nvidia-smi -L short) fails the service;
        # it never runs with no device request, which Docker would widen to every GPU.
        uuids = list((u or {}).get(index) or [])
        if len(uuids) <= instance or not str(uuids[instance]).startswith("MIG-"):
            raise ValueError(
                f"service {s.name}: MIG instance {instance} of GPU {gpu} on {h.name} has no known MIG UUID "
                f"(nvidia-smi -L lists {len(uuids)}); Triton gets no GPU rather than all of them: finish the MIG "
                "layout (reset the GPU if its MIG mode is pending) and run up again"
            )
        return [str(uuids[instance])]

    return layout.mig_uuids.apply(bound)


def mps_share(fleet: Fleet, s: Service) -> int:
    """This service's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE among the services of its VM (seed 001: 60/40, 50/50)."""
    mates = [x.name for x in fleet.services if x.host == s.host and x.vm == s.vm]
    try:
        split = preset_for(
            s.gpu_model, "diffusion" if any(m.preset == "sdxl" for m in s.models) else "low_latency"
        ).mps_split
    except KeyError:
        split = []
    if len(split) != len(mates):
        split = [100 // len(mates)] * len(mates)
    return split[mates.index(s.name)]


def bootstrap_config(fleet: Fleet, h: Host, vm: Vm) -> BootstrapConfig:
    """The guest's GPU stack: Docker and the toolkit only where a docker-runtime service runs, MPS where asked."""
    mine = [s for s in fleet.services if s.host == h.name and s.vm == vm.name]
    mps = None
    if vm.mps:
        mps = MpsConfig(instances={s.name: mps_share(fleet, s) for s in mine} or {"default": 100})
    docker = any(s.runtime == "docker" for s in mine)
    only = None if docker else ("driver", "persistence", "mps")
    return BootstrapConfig(persistence=True, mps=mps, only=only)


def cloud_init(h: Host, vm: Vm, guest_keys: tuple[str, ...] = ()) -> Optional[CloudInit]:
    """The guest's seed: its static address and, for the guest user, the public keys gpuhost logs in with."""
    if not h.vm_network or not vm.address:
        return None
    n = h.vm_network
    return CloudInit(
        user=vm.guest_user,
        ssh_authorized_keys=guest_keys,
        hostname=vm.name,
        network=StaticNetwork(
            mac=vm_mac(f"{h.name}-{vm.name}"),
            address=f"{vm.address}/{n.prefix_length}",
            gateway=n.gateway,
            dns=tuple(n.dns),
        ),
    )


def solver_host(h: Host) -> pl.Host:
    """The placement solver's view of a host, from the topology declared in stack config."""
    t = h.topology
    assert t is not None  # place_vms refuses a host with VMs and no topology
    devices = {g.address: g.numa_node if g.numa_node is not None else -1 for g in h.gpus}
    hp1g = h.hugepages.count // t.nodes if h.hugepages.size == "1G" else 0
    base = pl.Host.uniform(
        sockets=t.sockets,
        cores_per_socket=t.cores_per_socket,
        threads_per_core=t.threads_per_core,
        memory_mib=t.memory_gib_per_node * 1024,
        hugepages_1g=hp1g,
        hugepages_2m=0,
        nodes_per_socket=t.nodes_per_socket,
        devices=devices,
        reserved_cpus=h.reserved_cpus,
    )
    nodes = tuple(
        pl.Node(
            id=n.id,
            memory_free_mib=n.memory_free_mib,
            hugepages_free={
                "1G": hp1g,
                "2M": int(h.hugepages.per_node.get(n.id, 0)) if h.hugepages.size == "2M" else 0,
            },
        )
        for n in base.nodes
    )
    cpus = base.cpus
    if t.numbering == "sequential":
        per_core = t.threads_per_core
        cores_per_node = t.cores_per_socket // t.nodes_per_socket
        cpus = tuple(
            pl.Cpu(
                id=i,
                core=(i // per_core) % t.cores_per_socket,
                socket=i // (per_core * t.cores_per_socket),
                node=i // (per_core * cores_per_node),
            )
            for i in range(t.sockets * t.cores_per_socket * per_core)
        )
    return pl.Host(cpus=cpus, nodes=nodes, devices=base.devices, reserved_cpus=base.reserved_cpus)


def gpu_functions(h: Host, address: str) -> tuple[str, ...]:
    g = next(x for x in h.gpus if x.address == address)
    base = address.rsplit(".", 1)[0]
    return tuple(f"{base}.{f}" for f in g.functions)


def vm_request(h: Host, vm: Vm) -> pl.VmRequest:
    return pl.VmRequest(
        name=vm.name,
        vcpus=vm.vcpus,
        memory_mib=int(vm.memory_gib * 1024),
        page_size=vm.page_size,
        gpus=tuple(vm.gpus),
        thread_policy=vm.thread_policy,
        emulator_threads=vm.emulator_threads,
        iothreads=vm.iothreads,
    )


def place_vms(i: int, h: Host) -> Optional[pl.HostPlacement]:
    """The NUMA placement of host `i`'s VMs (plans.placement's solver); None without VMs. ConfigError names the
    VM that does not fit, or the missing topology."""
    if not h.vms:
        return None
    if h.topology is None:
        raise ConfigError(
            [
                f"fleet.hosts[{i}].topology: needed to place VMs (sockets, cores_per_socket, "
                "threads_per_core, memory_gib_per_node)"
            ]
        )
    try:
        return pl.place(solver_host(h), [vm_request(h, vm) for vm in h.vms])
    except pl.PlacementError as e:
        idx = next((j for j, v in enumerate(h.vms) if v.name == e.vm), 0) if hasattr(e, "vm") else 0
        raise ConfigError([f"fleet.hosts[{i}].vms[{idx}]: {e}"]) from None


def guest_spec(h: Host, vm: Vm) -> Optional[HostSpec]:
    if not vm.address:
        return None
    return HostSpec(
        name=f"{h.name}-{vm.name}",
        address=vm.address,
        user=vm.guest_user,
        host_key=vm.host_key,
        insecure_accept_unknown_host_key=vm.host_key is None and h.ssh.insecure_accept_unknown_host_key,
        jump=JumpHost(address=h.ssh.address, port=h.ssh.port, user=h.ssh.user, host_key=h.ssh.host_key),
    )


def gateway_spec(fleet: Fleet, g: Gateway, guests: dict[tuple[str, str], HostSpec]) -> tuple[HostSpec, GatewaySpec]:
    """Where a gateway runs and its backends resolved to the addresses their TritonServices run at."""
    services = {s.name: s for s in fleet.services}
    backends = []
    for b in g.backends:
        s = services[b.service]
        where = guests.get((s.host, s.vm)) if s.vm else host_spec(next(x for x in fleet.hosts if x.name == s.host))
        if where is None:
            raise ConfigError([f"gateways: backend {s.name} runs in VM {s.vm} which has no address"])
        # dcgm-exporter runs where the NVIDIA driver does: in the guests (MonitoringStack); its XID drains a backend.
        dcgm = 9400 if fleet.monitoring and s.vm else None
        o = triton_server(fleet, s, where.address)
        backends.append(
            GatewayBackend(
                name=s.name,
                weight=b.weight,
                # Loopback on the gateway's own machine; elsewhere triton_listen (the loader requires it there).
                address=triton_reach(o.http_address, where.address),
                metrics_address=triton_reach(o.metrics_address, where.address),
                dcgm_address=where.address,
                dcgm_port=dcgm,
            )
        )
    models = set.intersection(*({m.name for m in services[b.service].models} for b in g.backends))
    gw_host = next(x for x in fleet.hosts if x.name == g.host)
    maxmemory = g.redis_maxmemory_mb or (
        gw_host.topology.memory_gib_per_node * 1024 // 4
        if gw_host.topology
        else GatewaySpec.model_fields["redis_maxmemory_mb"].default
    )
    spec = GatewaySpec(
        backends=tuple(backends),
        redis_maxmemory_mb=maxmemory,
        models=tuple(sorted(models)),
        redis_auth=g.redis_password_secret is not None,
        front_models=front_models(fleet, g, models),
        **same_fields(
            g,
            "name",
            "workers",
            "slots",
            "max_depth",
            "redis_bind",
            "front_listen",
            "redis_port",
            "metrics_port",
            "front_port",
            "claim_idle_ms",
            "ramp_s",
            "queue_ms_shift",
            "queue_ms_drain",
        ),
    )
    return host_spec(gw_host), spec


def front_models(fleet: Fleet, g: Gateway, models: set[str]) -> dict[str, dict]:
    """What the gateway's HTTP entry accepts per model: inputs (name, wire datatype, dims) and max batch size, from
    the first backend service's model spec (every backend serves the same model)."""
    services = {s.name: s for s in fleet.services}
    out: dict[str, dict] = {}
    for b in g.backends:
        s = services[b.service]
        for m in s.models:
            if m.name in models and m.name not in out:
                spec = model_spec(m, s.gpu_model)
                out[m.name] = {
                    "max_batch_size": spec.max_batch_size,
                    "inputs": [
                        {
                            "name": t.name,
                            "datatype": "BYTES" if t.data_type == "STRING" else t.data_type,
                            "dims": t.dims,
                        }
                        for t in spec.inputs
                    ],
                }
    return out


@dataclass(eq=False)
class Planned:
    """One component as the program declares it: its class, name, args and config path (`where`), its children
    (the class's pure `CHILDREN(name, args)`) and what it waits for (`after`: components, or their outputs).
    An attribute it would have once declared (`ph.reboot`, `mon.grafana_url`) is `Pending` until then."""

    cls: type
    name: str
    args: Any
    where: str
    children: list[Child] = field(default_factory=list)
    after: list[Any] = field(default_factory=list)

    def __getattr__(self, attr: str) -> Pending:
        if attr.startswith("_"):  # copy, pickle and friends ask for dunders: a plain missing attribute
            raise AttributeError(attr)
        return Pending(self, attr)


@dataclass(frozen=True, eq=False)
class Pending:
    """The output `attr` of the component `of`, passed through `then` in order: known once `of` is declared."""

    of: Planned
    attr: str
    then: tuple[Callable[[Any], Any], ...] = ()

    def apply(self, fn: Callable[[Any], Any]) -> Pending:
        return Pending(self.of, self.attr, (*self.then, fn))


def _waits(value: Any) -> bool:
    """Whether `value` holds a component not declared yet, or one of its outputs (in lists, tuples or dicts)."""
    if isinstance(value, Planned | Pending):
        return True
    if isinstance(value, dict):
        return any(_waits(v) for v in value.values())
    return isinstance(value, list | tuple) and any(_waits(v) for v in value)


@dataclass
class Program:
    """The fleet's components in declaration order, and the stack outputs (with `Pending` ones)."""

    components: list[Planned] = field(default_factory=list)
    exports: dict = field(default_factory=dict)

    def add(self, cls: type, name: str, args: Any, after: list, where: str) -> Planned:
        """List one component (a `Wired` class: its children are listed with it), after the ones it waits for."""
        if not issubclass(cls, Wired):
            raise TypeError(f"{where}: {cls.__name__} is not a Wired component (no pure children function)")
        p = Planned(cls, name, args, where, cls.CHILDREN(name, args), list(after))
        self.components.append(p)
        return p

    def declare(self) -> dict:
        """Register each component in order, its `Pending` args and dependencies made real; returns the outputs."""
        made: dict[int, Any] = {}

        def real(value: Any) -> Any:
            if isinstance(value, Planned):
                return made[id(value)]
            if isinstance(value, Pending):
                out = getattr(made[id(value.of)], value.attr)
                for fn in value.then:
                    out = out.apply(fn)
                return out
            if isinstance(value, dict):
                return {k: real(v) for k, v in value.items()}
            if isinstance(value, list):
                return [real(v) for v in value]
            if isinstance(value, tuple):
                return tuple(real(v) for v in value)
            return value

        for p in self.components:
            waiting = {k: real(v) for k in type(p.args).model_fields if _waits(v := getattr(p.args, k))}
            args = p.args.model_copy(update=waiting) if waiting else p.args
            after = [real(a) for a in p.after]
            # the children `add` listed are these args' own unless a Pending arg was made real
            kids = None if waiting else p.children
            made[id(p)] = p.cls(p.name, args, ResourceOptions(depends_on=after) if after else None, children=kids)
        return real(self.exports)


def plan(fleet: Fleet, guest_keys: tuple[str, ...] = ()) -> Program:
    """Every component of the fleet, in declaration order, with its children; nothing registered, nothing
    reached. ConfigError: what only the program finds (a VM that cannot fit, a VF shortage). `guest_keys`:
    public keys a new guest's user authorizes (cloud-init); the loader passes the public half of
    `gpuhost:sshPrivateKey` (`stacks.load.guest_public_key`), the key the providers reach guests with."""
    program = Program()
    program.exports = build(fleet, program.add, guest_keys)
    return program


New = Callable[[type, str, Any, list, str], Any]


def build(fleet: Fleet, new: New, guest_keys: tuple[str, ...] = ()) -> dict:
    """Make the fleet's components in the seeds' order; returns the stack outputs. `new(cls, name, args, after,
    where)` makes each one (`plan` passes `Program.add`; `where`: the config path it comes from)."""
    # Plan every host first: a VM that cannot fit is refused before any component is made.
    placements = {h.name: place_vms(i, h) for i, h in enumerate(fleet.hosts)}
    exports: dict = {"placement": {}, "pending_reboot": {}, "endpoints": {}}
    hosts = build_host_prep(fleet, new, exports)
    nics = build_nics(fleet, hosts, new)
    vms, guests = build_vms(fleet, placements, hosts, nics, new, guest_keys, exports)
    migs = build_migs(fleet, hosts, new)
    services = build_services(fleet, hosts, vms, guests, migs, new, exports)
    gateways = build_gateways(fleet, hosts, guests, services, new, exports)
    build_monitoring(fleet, guests, services + gateways + list(vms.values()), new, exports)
    return exports


def build_host_prep(fleet: Fleet, new: New, exports: dict) -> dict[str, Planned]:
    """Seed 002 host prep, one PassthroughHost per host, reboots rolled out `max_parallel_reboots` at a time."""
    hosts: dict[str, Planned] = {}
    for hi, h in enumerate(fleet.hosts):
        # Rollout: with max_parallel_reboots k, host i's reboot waits for host i-k's verified reboot.
        k = fleet.rollout.max_parallel_reboots
        earlier = list(hosts.values())
        after = [earlier[-k].reboot] if len(earlier) >= k else []
        ph = new(PassthroughHost, h.name, passthrough_args(h, reboot_after=tuple(after)), [], f"fleet.hosts[{hi}]")
        hosts[h.name] = ph
        exports["pending_reboot"][h.name] = ph.pending_reboot
    return hosts


def build_nics(fleet: Fleet, hosts: dict[str, Planned], new: New) -> dict[str, list[Planned]]:
    """Seed 002 SR-IOV: one SriovNic per PF of each host, after that host's prep."""
    nics: dict[str, list[Planned]] = {}
    for hi, h in enumerate(fleet.hosts):
        spec = host_spec(h)
        nics[h.name] = [
            new(
                SriovNic,
                f"{h.name}-sriov-{j}",
                SriovNicArgs(
                    host=spec,
                    pf=pf.pf,
                    num_vfs=pf.num_vfs,
                    numa_node=pf.numa_node,
                    numa_policy=pf.numa_policy,
                    vfio=pf.vfio,
                    vfs=[v.model_dump(exclude_none=True) for v in pf.vfs],
                    irq_cpus=h.reserved_cpus,
                ),
                [hosts[h.name]],
                f"fleet.hosts[{hi}].sriov[{j}]",
            )
            for j, pf in enumerate(h.sriov)
        ]
    return nics


def build_vms(
    fleet: Fleet,
    placements: dict[str, Optional[pl.HostPlacement]],
    hosts: dict[str, Planned],
    nics: dict[str, list[Planned]],
    new: New,
    guest_keys: tuple[str, ...],
    exports: dict,
) -> tuple[dict[tuple[str, str], Planned], dict[tuple[str, str], HostSpec]]:
    """Seed 002 VMs: one PinnedVM per VM at its planned placement, with its VFs and GPUs; and the guests gpuhost
    reaches over SSH (host, vm) → endpoint, for the services, gateways and monitoring in them."""
    vms: dict[tuple[str, str], Planned] = {}
    guests: dict[tuple[str, str], HostSpec] = {}
    for hi, h in enumerate(fleet.hosts):
        spec = host_spec(h)
        ph, host_nics = hosts[h.name], nics[h.name]
        placed = placements[h.name]
        if placed is not None:
            exports["placement"][h.name] = placed.report()
        # VFs come from a PF on the VM's own node (seed 002), each PF sliced on its own.
        taken = [0] * len(host_nics)
        for vm in h.vms:
            assert placed is not None  # a host with VMs has a placement (place_vms)
            vfs_out = _vm_vfs(fleet, h, vm, placed.vm(vm.name).node, host_nics, taken) if vm.vfs else None
            gs = guest_spec(h, vm)
            if gs:
                guests[(h.name, vm.name)] = gs
            vms[(h.name, vm.name)] = new(
                PinnedVM,
                f"{h.name}-{vm.name}",
                _pinned_vm_args(fleet, h, vm, spec, placed.vm(vm.name), vfs_out, gs, guest_keys),
                [ph, *host_nics],
                f"fleet.hosts[{hi}].vms[{h.vms.index(vm)}]",
            )
    return vms, guests


def _vm_vfs(fleet: Fleet, h: Host, vm: Vm, node: int, host_nics: list[Planned], taken: list[int]) -> Pending:
    """The VM's slice of the VFs of a PF on its node (else a PF with no node), counted in `taken` per PF."""
    pfi: Optional[int] = next((k for k, pf in enumerate(h.sriov) if pf.numa_node == node), None)
    if pfi is None:
        pfi = next((k for k, pf in enumerate(h.sriov) if pf.numa_node is None), None)
    if pfi is None or taken[pfi] + vm.vfs > h.sriov[pfi].num_vfs:
        raise ConfigError(
            [
                f"fleet.hosts[{fleet.hosts.index(h)}].vms[{h.vms.index(vm)}].vfs: "
                f"{vm.vfs} VF(s) wanted on node {node} but no SR-IOV PF there has them free"
            ]
        )
    start, end = taken[pfi], taken[pfi] + vm.vfs
    taken[pfi] = end
    return host_nics[pfi].vf_addresses.apply(lambda all_vfs: list(all_vfs or [])[start:end])


def _pinned_vm_args(
    fleet: Fleet,
    h: Host,
    vm: Vm,
    spec: HostSpec,
    placement: pl.VmPlacement,
    vfs_out: Optional[Pending],
    gs: Optional[HostSpec],
    guest_keys: tuple[str, ...],
) -> PinnedVMArgs:
    ci = cloud_init(h, vm, guest_keys)
    return PinnedVMArgs(
        host=spec,
        placement=placement,
        gpus=tuple(a for g in vm.gpus for a in gpu_functions(h, g)),
        vfs_output=vfs_out,
        base_image=vm.image,
        consumer_card=any(g.consumer for g in h.gpus if g.address in vm.gpus),
        guest=gs,
        bootstrap=bootstrap_config(fleet, h, vm) if gs else None,
        cloud_init=ci,
        bridge=h.vm_network.bridge if h.vm_network else None,
        mac=ci.network.mac if ci and ci.network else None,
        shutdown_timeout=vm.shutdown_timeout_s,
        **_emulated_domain(vm),
    )


def _emulated_domain(vm: Vm) -> dict[str, Any]:
    """A VM on the emulated server: TCG, no firmware, no libvirt NIC, and no disk without an image."""
    if not vm.emulated:
        return {}
    # No libvirt NIC: the emulated server has no `default` network running (its only link is the SSH port
    # forward), and the first up of the dev stack failed on it under the driver.
    return {
        "domain_type": "qemu",
        "cpu_mode": "maximum",
        "loader": None,
        "nvram_template": None,
        "network": None,
        # and no disk without an image: no storage pool there to make an empty one in
        "with_disk": vm.image is not None,
    }


def build_migs(fleet: Fleet, hosts: dict[str, Planned], new: New) -> dict[str, Planned]:
    """Seed 001 route A: the MIG layout of each host that keeps MIG GPUs on its own driver."""
    migs: dict[str, Planned] = {}
    for hi, h in enumerate(fleet.hosts):
        mig_gpus = [g for g in sorted(h.gpus, key=lambda g: g.address) if g.mig]
        if mig_gpus:
            # nvidia-smi numbers GPUs in PCI bus order
            order = [g.address for g in sorted(h.gpus, key=lambda g: g.address) if not g.passthrough]
            migs[h.name] = new(
                MigGpus,
                h.name,
                MigGpusArgs(
                    host=host_spec(h), layout={str(order.index(g.address)): list(g.mig or ()) for g in mig_gpus}
                ),
                [hosts[h.name]],
                f"fleet.hosts[{hi}].gpus",
            )
    return migs


def service_artifacts(s: Service, specs: list[ModelSpec], root: str) -> tuple[list[ArtifactSpec], list[EngineBuild]]:
    """What a service fetches into its repository (weights, model code, ONNX) and the TensorRT engines it builds."""
    artifacts, engines = [], []
    for m, mspec in zip(s.models, specs):
        if m.artifact is None:  # code gpuhost ships (stacks.checks allows no other case)
            continue
        if mspec.platform == "tensorrt_plan":
            dest = f"/srv/onnx/{m.name}.onnx"
            inp = mspec.inputs[0]
            batch = max(1, mspec.max_batch_size)
            engines.append(
                EngineBuild(
                    model=m.name,
                    onnx_path=dest,
                    onnx_sha256=m.artifact.sha256,
                    plan_path=f"{root}/{m.name}/{mspec.version}/model.plan",
                    shapes={
                        inp.name: ShapeRange(
                            min=[1, *inp.dims], opt=[max(1, batch // 2), *inp.dims], max=[batch, *inp.dims]
                        )
                    },
                    precision=m.precision,
                    calib_dir=m.calib_dir,
                    gpu_model=s.gpu_model,
                )
            )
        elif m.preset == "yolov8n_torch":  # the weights file, beside the model code gpuhost ships
            dest = f"{root}/{m.name}/{mspec.version}/{weights_file(m.artifact)}"
        else:
            dest = f"{root}/{m.name}/{mspec.version}/model.py"
        artifacts.append(
            ArtifactSpec(model=m.name, dest=dest, sha256=m.artifact.sha256, url=m.artifact.url, path=m.artifact.path)
        )
    return artifacts, engines


def triton_server(fleet: Fleet, s: Any, machine_address: str) -> ServerOptions:
    """Where the service's Triton listens (triton_addresses: loopback unless the stack says)."""
    listen, metrics = triton_addresses(fleet, s, machine_address)
    return ServerOptions(http_address=listen, grpc_address=listen, metrics_address=metrics)


def triton_addresses(fleet: Fleet, s: Any, machine_address: str) -> tuple[str, str]:
    """(HTTP/gRPC bind, metrics bind) of a service's Triton: its ``triton_listen``, else loopback, and the metrics
    on the machine's address when Prometheus (on another host, or through that address) scrapes it."""
    if s.triton_listen:
        return s.triton_listen, s.triton_listen
    return "127.0.0.1", machine_address if fleet.monitoring else "127.0.0.1"


def triton_reach(bind: str, machine_address: str) -> str:
    """Where another machine reaches a listener bound to ``bind``."""
    return machine_address if bind in ("0.0.0.0", "::") else bind


def build_services(
    fleet: Fleet,
    hosts: dict[str, Planned],
    vms: dict[tuple[str, str], Planned],
    guests: dict[tuple[str, str], HostSpec],
    migs: dict[str, Planned],
    new: New,
    exports: dict,
) -> list[Planned]:
    """Seed 001 services: one TritonService per service, on its host (MIG devices) or in its VM."""
    services = []
    for si, s in enumerate(fleet.services):
        h = next(x for x in fleet.hosts if x.name == s.host)
        where = guests.get((s.host, s.vm)) if s.vm else host_spec(h)
        if where is None:
            raise ConfigError([f"services: {s.name} runs in VM {s.vm} which has no address for SSH"])
        deps: list[Any] = [vms[(s.host, s.vm)]] if s.vm else [hosts[s.host]]
        devices = None
        if s.host in migs and not s.vm:
            deps.append(migs[s.host])
            devices = mig_devices(h, s, migs[s.host])
        specs = [model_spec(m, s.gpu_model) for m in s.models]
        root = "/srv/triton-repo"
        artifacts, engines = service_artifacts(s, specs, root)
        svm: Optional[Vm] = next((v for v in h.vms if v.name == s.vm), None)
        svc_gpus = [g for g in h.gpus if (svm and g.address in svm.gpus) or (not svm and not g.passthrough)]
        gpu_count = max(1, len(svm.gpus) if svm else len([g for g in h.gpus if not g.passthrough]) or len(h.gpus))
        # Inside a VM the guest sees one node (0); on the host, Triton goes to its GPU's node.
        node = (
            s.numa_node
            if s.numa_node is not None
            else (0 if svm else next((g.numa_node for g in svc_gpus if g.numa_node is not None), None))
        )
        svc = new(
            TritonService,
            s.name,
            TritonServiceArgs(
                host=where,
                gpu_model=s.gpu_model,
                gpu_count=gpu_count,
                models=specs,
                use_presets=False,
                runtime=s.runtime,
                docker=DockerRuntime(image=s.image),
                process=ProcessRuntime(numa_node=node),
                server=triton_server(fleet, s, where.address),
                devices=devices,
                mps_percentage=mps_share(fleet, s) if svm and svm.mps else None,
                artifacts=artifacts,
                engines=engines,
                repository_root=root,
                endpoint=f"http://{host_port(where.address, s.nginx_port)}",
                nginx_listen=s.nginx_port,
                adaptive_window=s.adaptive_window,
                slo_p95_ms=s.slo.p95_ms,
                slo_p99_ms=s.slo.p99_ms,
                slo_max_error_rate=s.slo.max_error_rate,
                slo_min_rps=s.slo.min_throughput_rps,
                gate_rate=s.acceptance.rate,
                gate_concurrency=s.acceptance.concurrency,
                gate_duration_s=s.acceptance.duration_s,
                gate_ready_timeout_s=ready_timeout_s(s, specs),
            ),
            deps,
            f"fleet.services[{si}]",
        )
        services.append(svc)
        exports["endpoints"][s.name] = f"http://{host_port(where.address, s.nginx_port)}"
    return services


def build_gateways(
    fleet: Fleet,
    hosts: dict[str, Planned],
    guests: dict[tuple[str, str], HostSpec],
    services: list[Planned],
    new: New,
    exports: dict,
) -> list[Planned]:
    """Seed 001 gateways: one InferenceGateway per gateway, after its host and the services behind it."""
    gateways = []
    by_service = dict(zip((s.name for s in fleet.services), services))
    for gi, g in enumerate(fleet.gateways):
        gw_host, gw_spec = gateway_spec(fleet, g, guests)
        gateways.append(
            new(
                InferenceGateway,
                g.name,
                InferenceGatewayArgs(
                    host=gw_host,
                    gateway=gw_spec,
                    # read at declaration, a secret Output: never a plain value in args, inputs or state
                    redis_password=(
                        pulumi.Config("gpuhost").get_secret(g.redis_password_secret)
                        if g.redis_password_secret
                        else None
                    ),
                ),
                [hosts[g.host], *(by_service[b.service] for b in g.backends)],
                f"fleet.gateways[{gi}]",
            )
        )
        redis_at = gw_host.address if gw_spec.redis_bind in ("0.0.0.0", "::") else gw_spec.redis_bind
        exports.setdefault("gateways", {})[g.name] = f"redis://{redis_at}:{gw_spec.redis_port}/0 on {g.host}"
    return gateways


def monitoring_graph(fleet: Fleet, guests: dict[tuple[str, str], HostSpec]) -> MonitoringGraph:
    """Every scrape target of the fleet: hosts, guests, Triton services and gateways."""
    return MonitoringGraph(
        # A host that keeps GPUs on its own NVIDIA driver (MIG, seed 001 route A) runs dcgm-exporter too.
        hosts=[
            HostTarget(
                name=h.name, address=h.ssh.address, role="host", gpu_driver=any(not g.passthrough for g in h.gpus)
            )
            for h in fleet.hosts
        ],
        guests=[
            HostTarget(name=f"{hn}-{vn}", address=g.address, role="guest", tenant=vn, gpu_driver=True)
            for (hn, vn), g in guests.items()
        ],
        services=[
            TritonTarget(
                name=s.name,
                address=(
                    (guests.get((s.host, s.vm)) if s.vm else None)
                    or host_spec(next(x for x in fleet.hosts if x.name == s.host))
                ).address,
                host=f"{s.host}-{s.vm}" if s.vm else s.host,
                tenant=s.vm,
                models=tuple(m.name for m in s.models),
                metrics_address=s.triton_listen if s.triton_listen not in (None, "0.0.0.0", "::") else None,
                window_port=s.adaptive_window.port if s.adaptive_window else None,
                slo=ServingSlo(
                    p95_latency_ms=s.slo.p95_ms,
                    max_failure_ratio=s.slo.max_error_rate or ServingSlo().max_failure_ratio,
                ),
            )
            for s in fleet.services
        ],
        gateways=[
            GatewayTarget(
                name=g.name,
                address=host_spec(next(x for x in fleet.hosts if x.name == g.host)).address,
                host=g.host,
                metrics_ports=tuple(range(g.metrics_port, g.metrics_port + g.workers)),
                p95_latency_s=g.slo_p95_s,
                max_depth=g.max_depth,
            )
            for g in fleet.gateways
        ],
    )


def build_monitoring(
    fleet: Fleet, guests: dict[tuple[str, str], HostSpec], after: list, new: New, exports: dict
) -> Optional[Planned]:
    """Seed 003 monitoring: Prometheus and Grafana on the monitoring host, after everything they scrape."""
    if not fleet.monitoring:
        return None
    mon_host = host_spec(next(x for x in fleet.hosts if x.name == fleet.monitoring.host))
    machines = {h.name: host_spec(h) for h in fleet.hosts}
    machines.update({f"{hn}-{vn}": g for (hn, vn), g in guests.items()})
    mon = new(
        MonitoringStack,
        "monitoring",
        MonitoringStackArgs(
            graph=monitoring_graph(fleet, guests),
            monitoring_host=mon_host,
            machines=machines,
            prometheus_port=fleet.monitoring.prometheus_port,
            grafana_port=fleet.monitoring.grafana_port,
        ),
        after,
        "fleet.monitoring",
    )
    exports["grafana"] = mon.grafana_url
    exports["prometheus"] = mon.prometheus_url
    return mon
