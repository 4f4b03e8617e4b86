"""The program: stack config → components, with the dependencies the seeds' order demands.

host prep (and its one reboot) → SR-IOV VFs → tenant VMs pinned beside their GPU → guest services → monitoring.

Usage (what __main__.py does)::

    fleet, _key = stacks.load.load(pulumi.Config("gpuhost"))
    outputs = build(fleet)
"""

from __future__ import annotations

from typing import Optional

from pulumi import ResourceOptions

from access.ssh import HostSpec, JumpHost
from components.inference_gateway import InferenceGateway, InferenceGatewayArgs
from components.monitoring_stack import MonitoringStack, MonitoringStackArgs
from components.passthrough_host import PassthroughHost, PassthroughHostArgs, host_spec
from components.pinned_vm import PinnedVM, PinnedVMArgs
from components.sriov_nic import SriovNic, SriovNicArgs
from components.triton_service import TritonService, TritonServiceArgs
from plans import placement as pl
from plans.gateway import GatewayBackend, GatewaySpec
from plans.monitoring.model import GatewayTarget, HostTarget, MonitoringGraph, ServingSlo, TritonTarget
from plans.triton_engine import EngineBuild, ShapeRange
from plans.triton_repo import resnet50_fp16, sdxl, yolov8n, yolov8n_torch
from plans.values import host_port
from providers.base import host_input
from providers.mig import MigLayout
from providers.tensorrt_engine import TensorRTEngine, engine_inputs
from stacks.load import ConfigError
from stacks.schema import Fleet, Gateway, Host, Vm

PRESETS = {"yolov8n": yolov8n, "yolov8n_torch": yolov8n_torch, "resnet50_fp16": resnet50_fp16, "sdxl": sdxl}


def solver_host(h: Host) -> pl.Host:
    """The placement solver's view of a host, from the topology declared in stack config."""
    t = h.topology
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


def plan_host(i: int, h: Host) -> Optional[pl.HostPlacement]:
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
        backends.append(GatewayBackend(name=s.name, weight=b.weight, address=where.address, dcgm_port=dcgm))
    models = set.intersection(*({m.name for m in services[b.service].models} for b in g.backends))
    spec = GatewaySpec(
        name=g.name,
        backends=tuple(backends),
        models=tuple(sorted(models)),
        workers=g.workers,
        slots=g.slots,
        max_depth=g.max_depth,
        redis_bind=g.redis_bind,
        redis_port=g.redis_port,
        metrics_port=g.metrics_port,
        claim_idle_ms=g.claim_idle_ms,
        ramp_s=g.ramp_s,
        queue_ms_shift=g.queue_ms_shift,
        queue_ms_drain=g.queue_ms_drain,
    )
    return host_spec(next(x for x in fleet.hosts if x.name == g.host)), spec


def build(fleet: Fleet) -> dict:
    # Plan every host before declaring anything: a VM that cannot fit fails the program with no resource
    # registered.
    placements = {h.name: plan_host(i, h) for i, h in enumerate(fleet.hosts)}
    exports: dict = {"placement": {}, "pending_reboot": {}, "endpoints": {}}
    vms: dict[tuple[str, str], PinnedVM] = {}
    hosts: dict[str, PassthroughHost] = {}
    guests: dict[tuple[str, str], HostSpec] = {}
    for h in fleet.hosts:
        spec = host_spec(h)
        # Rollout: with max_parallel_reboots k, host i's reboot waits for host i-k's verified reboot.
        k = fleet.rollout.max_parallel_reboots
        earlier = list(hosts.values())
        after = [earlier[-k].reboot] if len(earlier) >= k else []
        ph = PassthroughHost(h.name, PassthroughHostArgs(host=h, reboot_after=after, drain_timeout_s=h.drain_timeout_s))
        hosts[h.name] = ph
        exports["pending_reboot"][h.name] = ph.pending_reboot
        nics = []
        for j, pf in enumerate(h.sriov):
            nics.append(
                SriovNic(
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
                    ResourceOptions(depends_on=[ph]),
                )
            )
        plan = placements[h.name]
        if plan is not None:
            exports["placement"][h.name] = plan.report()
        vf_pool = [n.vf_addresses for n in nics]
        taken = 0
        for vm in h.vms:
            vfs_out = None
            if vm.vfs and vf_pool:
                start = taken
                taken += vm.vfs
                vfs_out = vf_pool[0].apply(lambda all_vfs, s=start, n=vm.vfs: list(all_vfs or [])[s : s + n])
            gs = guest_spec(h, vm)
            if gs:
                guests[(h.name, vm.name)] = gs
            vms[(h.name, vm.name)] = PinnedVM(
                f"{h.name}-{vm.name}",
                PinnedVMArgs(
                    host=spec,
                    placement=plan.vm(vm.name),
                    gpus=tuple(a for g in vm.gpus for a in gpu_functions(h, g)),
                    vfs_output=vfs_out,
                    base_image=vm.image,
                    consumer_card=any(g.consumer for g in h.gpus if g.address in vm.gpus),
                    guest=gs,
                    **(
                        {"domain_type": "qemu", "cpu_mode": "maximum", "loader": None, "nvram_template": None}
                        if vm.emulated
                        else {}
                    ),
                ),
                ResourceOptions(depends_on=[ph, *nics]),
            )

    migs: dict[str, MigLayout] = {}
    for h in fleet.hosts:
        mig_gpus = [g for g in sorted(h.gpus, key=lambda g: g.address) if g.mig]
        if mig_gpus:
            # nvidia-smi numbers GPUs in PCI bus order
            order = [g.address for g in sorted(h.gpus, key=lambda g: g.address) if not g.passthrough]
            migs[h.name] = MigLayout(
                f"{h.name}-mig",
                {
                    "host": host_input(host_spec(h)),
                    "layout": {str(order.index(g.address)): list(g.mig) for g in mig_gpus},
                },
                ResourceOptions(depends_on=[hosts[h.name]]),
            )

    services = []
    for s in fleet.services:
        h = next(x for x in fleet.hosts if x.name == s.host)
        where = guests.get((s.host, s.vm)) if s.vm else host_spec(h)
        if where is None:
            raise ConfigError([f"services: {s.name} runs in VM {s.vm} which has no address for SSH"])
        deps = [vms[(s.host, s.vm)]] if s.vm else [hosts[s.host]]
        if s.host in migs and not s.vm:
            deps.append(migs[s.host])
        models = [PRESETS[m.preset]().model_copy(update={"name": m.name}) for m in s.models]
        for m, spec in zip(s.models, models):
            if m.onnx_sha256 and spec.platform == "tensorrt_plan":
                inp = spec.inputs[0]
                batch = max(1, spec.max_batch_size)
                build = EngineBuild(
                    model=m.name,
                    onnx_path=f"/srv/onnx/{m.name}.onnx",
                    onnx_sha256=m.onnx_sha256,
                    plan_path=f"/srv/triton-repo/{m.name}/1/model.plan",
                    shapes={
                        inp.name: ShapeRange(
                            min=[1, *inp.dims], opt=[max(1, batch // 2), *inp.dims], max=[batch, *inp.dims]
                        )
                    },
                    precision=m.precision,
                    calib_dir=m.calib_dir,
                    gpu_model=s.gpu_model,
                )
                deps.append(
                    TensorRTEngine(
                        f"{s.name}-{m.name}-engine",
                        {"host": host_input(where), **engine_inputs(build)},
                        ResourceOptions(depends_on=list(deps)),
                    )
                )
        gpu_count = max(1, len([g for vm in h.vms if vm.name == s.vm for g in vm.gpus]) if s.vm else len(h.gpus))
        svc = TritonService(
            s.name,
            TritonServiceArgs(
                host=where,
                gpu_model=s.gpu_model,
                gpu_count=gpu_count,
                models=models,
                runtime=s.runtime,
                endpoint=f"http://{host_port(where.address, s.nginx_port)}",
                nginx_listen=s.nginx_port,
                slo_p95_ms=s.slo.p95_ms,
                gate_concurrency=s.acceptance.concurrency,
                gate_duration_s=s.acceptance.duration_s,
                adaptive_window=s.adaptive_window,
            ),
            ResourceOptions(depends_on=deps),
        )
        services.append(svc)
        exports["endpoints"][s.name] = f"http://{host_port(where.address, s.nginx_port)}"

    gateways = []
    by_service = dict(zip((s.name for s in fleet.services), services))
    for g in fleet.gateways:
        gw_host, gw_spec = gateway_spec(fleet, g, guests)
        gateways.append(
            InferenceGateway(
                g.name,
                InferenceGatewayArgs(host=gw_host, gateway=gw_spec),
                ResourceOptions(depends_on=[hosts[g.host], *(by_service[b.service] for b in g.backends)]),
            )
        )
        redis_at = gw_host.address if gw_spec.redis_bind in ("0.0.0.0", "::") else gw_spec.redis_bind
        exports.setdefault("gateways", {})[g.name] = f"redis://{redis_at}:{gw_spec.redis_port}/0 on {g.host}"

    if fleet.monitoring:
        graph = MonitoringGraph(
            hosts=[HostTarget(name=h.name, address=h.ssh.address, role="host") for h in fleet.hosts],
            guests=[
                HostTarget(name=f"{hn}-{vn}", address=g.address, role="guest", tenant=vn, gpu_driver=True)
                for (hn, vn), g in guests.items()
            ],
            services=[
                TritonTarget(
                    name=s.name,
                    address=(
                        guests.get((s.host, s.vm)) or host_spec(next(x for x in fleet.hosts if x.name == s.host))
                    ).address,
                    host=f"{s.host}-{s.vm}" if s.vm else s.host,
                    tenant=s.vm,
                    models=tuple(m.name for m in s.models),
                    slo=ServingSlo(p95_latency_ms=s.slo.p95_ms),
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
        mon_host = host_spec(next(x for x in fleet.hosts if x.name == fleet.monitoring.host))
        machines = {h.name: host_spec(h) for h in fleet.hosts}
        machines.update({f"{hn}-{vn}": g for (hn, vn), g in guests.items()})
        mon = MonitoringStack(
            "monitoring",
            MonitoringStackArgs(graph=graph, monitoring_host=mon_host, machines=machines),
            ResourceOptions(depends_on=services + gateways + list(vms.values())),
        )
        exports["grafana"] = mon.grafana_url
        exports["prometheus"] = mon.prometheus_url
    return exports
