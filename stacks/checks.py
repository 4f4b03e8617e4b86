"""Cross-field checks of the fleet: what no single field shows, reported with the same one-line-per-path format.

Pure: a parsed `Fleet` in, lines `fleet.<path>: <problem> (<fix>)` out, [] when the stack is consistent. The loader
runs these even when some fields are bad (on the fields that are good), so one run lists every problem.

Usage::

    for line in fleet_problems(fleet): print(line)
"""

from __future__ import annotations

import ipaddress
from typing import Iterator, Optional

from plans import values as val
from plans.cmdline import UNSAFE, owned_by
from plans.gateway import is_loopback
from plans.mig import layout_problems
from stacks.args import cmdline_args
from stacks.errors import ConfigError, Problem
from stacks.program import model_spec, place_vms
from stacks.schema import Fleet, Host, Jump, Service, Topology, Vm

# Presets whose model code gpuhost ships itself (serving/models): the artifact is their weights file.
WEIGHTS_ONLY = ("yolov8n_torch",)

# What one TritonService writes on its machine (components/triton_service.py): two services on one machine would
# overwrite each other's files and fight over Triton's ports.
SERVICE_FILES = ("/srv/triton-repo", "/etc/nginx/nginx.conf", "/etc/systemd/system/gpuhost-triton.service")
TRITON_PORTS = (8000, 8001, 8002)
# Share of each node's memory the host keeps when hugepages are reserved (kernel, page cache, libvirt, QEMU's own
# overhead): a box whose memory is all hugepages does not boot to a usable state.
HOST_KEEP_PERCENT = 10


def host_problems(i: int, h: Host) -> Iterator[Problem]:
    """One host's consistency: its VMs, devices, GPUs, what its topology must hold, its kernel arguments."""
    at = f"fleet.hosts[{i}]"
    yield from _vm_problems(at, h)
    yield from _device_problems(at, h)
    yield from _gpu_problems(at, h)
    yield from _topology_problems(at, h)
    yield from _kernel_arg_problems(at, h)


def _vm_problems(at: str, h: Host) -> Iterator[Problem]:
    """VM names unique on the host; each VM's GPUs declared, passed through, given to it alone; each VM fits a node."""
    gpus = {g.address: g for g in h.gpus}
    seen_gpu: dict[str, str] = {}
    names: set[str] = set()
    for j, vm in enumerate(h.vms):
        if vm.name in names:
            yield Problem(
                f"{at}.vms[{j}].name", f"{vm.name!r} appears twice on host {h.name} (VM names are unique per host)"
            )
        names.add(vm.name)
        for a in vm.gpus:
            g = gpus.get(a)
            if g is None:
                yield (
                    Problem(
                        f"{at}.vms[{j}].gpus",
                        f"{a} is not one of this host's gpus[] ({', '.join(sorted(gpus)) or 'none declared'})",
                    )
                )
            elif not g.passthrough:
                yield (
                    Problem(
                        f"{at}.vms[{j}].gpus",
                        f"{a} is declared passthrough: false (the host keeps it); a VM cannot "
                        "have it (libvirt would detach it from the host driver at VM start); set passthrough: true "
                        "or remove it from the VM",
                    )
                )
            if a in seen_gpu:
                yield (
                    Problem(
                        f"{at}.vms[{j}].gpus",
                        f"{a} is already given to VM {seen_gpu[a]!r} (a GPU passes through to one VM only)",
                    )
                )
            seen_gpu[a] = vm.name
        if h.topology:
            yield from _vm_fit_problems(f"{at}.vms[{j}]", h, vm, h.topology)


def _vm_fit_problems(at: str, h: Host, vm: Vm, t: Topology) -> Iterator[Problem]:
    """A VM's vCPUs within one node's CPUs less the host's share, its memory within one node's."""
    gpus = {g.address: g for g in h.gpus}
    nodes = sorted(n for a in vm.gpus if a in gpus for n in [gpus[a].numa_node] if n is not None)
    reserved_per_node = len(h.reserved_cpus) // max(1, t.nodes)
    cap = t.cpus_per_node - reserved_per_node
    if vm.vcpus > cap:
        where = f"node {nodes[0]}" if nodes else "any node"
        yield (
            Problem(
                f"{at}.vcpus",
                f"{vm.vcpus} vCPUs do not fit on {where} of {h.name}: "
                f"{t.cpus_per_node} CPUs per node, about {reserved_per_node} reserved for the host, "
                f"so at most {cap}",
            )
        )
    if vm.memory_gib > t.memory_gib_per_node:
        yield Problem(f"{at}.memory_gib", f"{vm.memory_gib} GiB exceeds a node's {t.memory_gib_per_node} GiB")


def _gpu_problems(at: str, h: Host) -> Iterator[Problem]:
    """Each GPU's NUMA node within the topology; MIG only on a GPU the host keeps, in a layout that fits."""
    t = h.topology
    for k, g in enumerate(h.gpus):
        if t and g.numa_node is not None and g.numa_node >= t.nodes:
            yield Problem(f"{at}.gpus[{k}].numa_node", f"{g.numa_node} but the topology has {t.nodes} nodes")
        if g.mig:
            if g.passthrough:
                yield (
                    Problem(
                        f"{at}.gpus[{k}].mig",
                        "MIG is cut on the host's NVIDIA driver; set passthrough: false (seed 001 route A) or drop mig",
                    )
                )
            for problem in layout_problems(g.model, g.mig):
                yield Problem(f"{at}.gpus[{k}].mig", f"{problem} (`nvidia-smi mig -lgip` lists what fits)")


def _topology_problems(at: str, h: Host) -> Iterator[Problem]:
    """Reserved CPUs, hugepages and SR-IOV nodes within the topology; without one, no hugepages."""
    t = h.topology
    if t:
        ncpu = t.sockets * t.cores_per_socket * t.threads_per_core
        bad = [c for c in h.reserved_cpus if c >= ncpu]
        if bad:
            yield Problem(f"{at}.reserved_cpus", f"CPU(s) {bad} beyond this host's {ncpu} CPUs")
        yield from _hugepage_problems(at, h, t)
        for k, p in enumerate(h.sriov):
            if p.numa_node is not None and p.numa_node >= t.nodes:
                yield Problem(
                    f"{at}.sriov[{k}].numa_node",
                    f"{p.numa_node} but the topology has {t.nodes} nodes (0-{t.nodes - 1})",
                )
        return
    # Without a topology nothing bounds these by the machine: refuse them until the host declares one.
    why = (
        "on a host without topology, so gpuhost cannot check that the host holds them; declare topology "
        "(sockets, cores_per_socket, threads_per_core, memory_gib_per_node) on this host"
    )
    if h.hugepages.count:
        yield Problem(f"{at}.hugepages.count", f"{h.hugepages.count} pages {why}")
    if h.hugepages.per_node:
        yield Problem(f"{at}.hugepages.per_node", f"pages on node(s) {sorted(h.hugepages.per_node)} {why}")


def _kernel_arg_problems(at: str, h: Host) -> Iterator[Problem]:
    """kernel.extra_args: unsafe ones acknowledged, gpuhost's own ones acknowledged as overrides; every
    acknowledgement used; remove_args never removing what gpuhost adds."""
    ack = {flag for flag in UNSAFE.values() if getattr(h, flag)}
    overrides = set(h.kernel.overrides_acknowledged)
    for k, arg in enumerate(h.kernel.extra_args):
        name = val.param_name(arg)
        flag = UNSAFE.get(name)
        owner = owned_by(name)
        if flag:
            if flag not in ack:
                yield (
                    Problem(
                        f"{at}.kernel.extra_args[{k}]",
                        f"{arg!r} ({name}) weakens isolation between devices "
                        f"and VMs (seeds: last resort only); set {flag}: true on the host to use it",
                    )
                )
        elif owner and name not in overrides:
            yield (
                Problem(
                    f"{at}.kernel.extra_args[{k}]",
                    f"{arg!r} sets {name}, which gpuhost sets itself from {owner}; set "
                    f"it through that field, or add {name!r} to kernel.overrides_acknowledged to replace gpuhost's value",
                )
            )
    set_names = {val.param_name(a) for a in h.kernel.extra_args}
    for k, name in enumerate(h.kernel.overrides_acknowledged):
        if not owned_by(name):
            yield (
                Problem(
                    f"{at}.kernel.overrides_acknowledged[{k}]",
                    f"gpuhost does not set {name}, so there is nothing to acknowledge; remove it",
                )
            )
        elif name not in set_names:
            yield (
                Problem(
                    f"{at}.kernel.overrides_acknowledged[{k}]",
                    f"no kernel.extra_args entry sets {name}; remove it, or add the argument it acknowledges",
                )
            )
    # Removing what gpuhost adds on this host would leave the running command line never matching (a reboot due
    # on every run): the field that adds it is the switch.
    own = {val.param_name(a) for a in cmdline_args(h)} - {val.param_name(a) for a in h.kernel.extra_args}
    for k, arg in enumerate(h.kernel.remove_args):
        name = val.param_name(arg)
        if name in own:
            yield (
                Problem(
                    f"{at}.kernel.remove_args[{k}]",
                    f"{arg!r} removes {name}, which gpuhost adds on this host from "
                    f"{owned_by(name) or 'its own settings'}; change that field instead of removing the argument",
                )
            )


def _device_problems(at: str, h: Host) -> Iterator[Problem]:
    """One PCI function, one entry: GPUs (every function of their slot) and SR-IOV PFs, whatever the spelling
    (the schema normalises 81:00.0, 0000:81:00.0 and upper case to one address)."""
    owner: dict[str, str] = {}
    for k, g in enumerate(h.gpus):
        for f in g.functions:
            a = g.address[:-1] + str(f)
            if a in owner:
                yield (
                    Problem(
                        f"{at}.gpus[{k}].address",
                        f"{a} is {owner[a]} already (one PCI device, one entry); remove one of them",
                    )
                )
                break
            owner[a] = f"gpus[{k}]" if f == int(g.address[-1]) else f"a function of gpus[{k}]"
    for k, p in enumerate(h.sriov):
        if p.pf in owner:
            yield Problem(
                f"{at}.sriov[{k}].pf",
                f"{p.pf} is {owner[p.pf]} already (one PCI device, one entry); remove one of them",
            )
        owner.setdefault(p.pf, f"sriov[{k}]")


def _hugepage_problems(at: str, h: Host, t: Topology) -> Iterator[Problem]:
    hp = h.hugepages
    node_mib = t.memory_gib_per_node * 1024
    keep_mib = node_mib * HOST_KEEP_PERCENT // 100
    if hp.size == "1G" and hp.count:
        # hugepages=N at boot spreads the pages evenly over the nodes; each node keeps memory for the host.
        most = (node_mib - keep_mib) // 1024 * t.nodes
        if hp.count > most:
            yield (
                Problem(
                    f"{at}.hugepages.count",
                    f"{hp.count} x 1 GiB pages but the host has {t.nodes} x "
                    f"{t.memory_gib_per_node} GiB and keeps {HOST_KEEP_PERCENT}% of each node for itself: at most "
                    f"{most}",
                )
            )
    for node, count in sorted(hp.per_node.items()):
        if node >= t.nodes:
            yield Problem(
                f"{at}.hugepages.per_node", f"node {node} but the topology has {t.nodes} nodes (0-{t.nodes - 1})"
            )
        elif hp.size == "2M" and count * 2 > node_mib - keep_mib:
            yield (
                Problem(
                    f"{at}.hugepages.per_node",
                    f"{count} x 2 MiB pages on node {node} but the node has "
                    f"{t.memory_gib_per_node} GiB and keeps {HOST_KEEP_PERCENT}% for the host: at most "
                    f"{(node_mib - keep_mib) // 2}",
                )
            )


def _endpoint(address: str, port: int, jump) -> tuple:
    return (jump.address, jump.port) if jump else (), address.lower(), port


def fleet_problems(fleet: Fleet, unknown: frozenset[str] = frozenset()) -> list[Problem]:
    """`unknown`: config paths whose (bad) values were dropped; checks that hinge on them stay quiet."""
    out: list[Problem] = []
    for i, h in enumerate(fleet.hosts):
        out += host_problems(i, h)
    out += _host_identity_problems(fleet)
    out += _address_problems(fleet)
    out += _service_problems(fleet, unknown)
    out += _pin_problems(fleet)
    out += _monitoring_problems(fleet)
    out += gateway_problems(fleet)
    out += triton_listen_problems(fleet, lambda s: service_address(fleet, s))
    out += port_problems(fleet)
    return out


def _host_identity_problems(fleet: Fleet) -> list[Problem]:
    """One name and one SSH endpoint per host."""
    out: list[Problem] = []
    first_name: dict[str, int] = {}
    endpoints: dict[tuple, str] = {}
    for i, h in enumerate(fleet.hosts):
        if h.name in first_name:
            out.append(Problem(f"fleet.hosts[{i}].name", f"{h.name!r} appears twice (hosts[{first_name[h.name]}] too)"))
        first_name.setdefault(h.name, i)
        ep = _endpoint(h.ssh.address, h.ssh.port, h.ssh.jump)
        if ep in endpoints:
            out.append(
                Problem(
                    f"fleet.hosts[{i}].ssh",
                    f"{h.ssh.address}:{h.ssh.port} is host {endpoints[ep]!r} already "
                    "(one SSH endpoint is one machine; two hosts there would undo each other's changes)",
                )
            )
        endpoints.setdefault(ep, h.name)
    return out


def _address_problems(fleet: Fleet) -> list[Problem]:
    """Each host's network, and one address per machine across the stack (hosts, jump hosts, guests)."""
    out: list[Problem] = []
    # One address, one machine across the stack: every host's SSH address (and jump host) and every guest.
    addresses: dict[str, str] = {}
    for h in fleet.hosts:
        addresses.setdefault(h.ssh.address.lower(), h.name)
    for h in fleet.hosts:
        if h.ssh.jump:
            addresses.setdefault(h.ssh.jump.address.lower(), f"the jump host of {h.name}")
    for i, h in enumerate(fleet.hosts):
        out += _network_problems(i, h)
        for j, vm in enumerate(h.vms):
            if not vm.address:
                continue
            other = addresses.get(vm.address.lower())
            if other:
                out.append(
                    Problem(
                        f"fleet.hosts[{i}].vms[{j}].address",
                        f"{vm.address} is {other!r} already (each guest needs its own address)",
                    )
                )
            addresses.setdefault(vm.address.lower(), f"{h.name}/{vm.name}")
        if fleet.monitoring:
            for j, vm in enumerate(h.vms):
                if vm.address and len(f"{h.name}-{vm.name}") > 63:
                    out.append(
                        Problem(
                            f"fleet.hosts[{i}].vms[{j}].name",
                            f"monitoring labels the guest "
                            f"{h.name}-{vm.name!s}, longer than 63 characters; shorten the host or VM name",
                        )
                    )
    return out


def _service_problems(fleet: Fleet, unknown: frozenset[str]) -> list[Problem]:
    """Each service: its name, models and artifacts, its host or VM, its GPUs and MIG device; one per machine."""
    out: list[Problem] = []
    services_on: dict[tuple, int] = {}
    svc_names: dict[str, int] = {}
    for i, s in enumerate(fleet.services):
        at = f"fleet.services[{i}]"
        if s.name in svc_names:
            out.append(Problem(f"{at}.name", f"{s.name!r} appears twice (services[{svc_names[s.name]}] too)"))
        svc_names.setdefault(s.name, i)
        out += _model_name_problems(at, s)
        sh, where = _service_machine(fleet, at, s, unknown)
        out += where
        if sh is None:
            continue
        out += _service_gpu_problems(at, s, sh)
        out += _model_problems(at, s)
        out += _service_mig_problems(at, s, sh)
        machine = (s.host, s.vm)
        if machine in services_on:
            j = services_on[machine]
            out.append(
                Problem(
                    at,
                    f"runs on {s.host}{'/' + s.vm if s.vm else ''} like services[{j}] "
                    f"({fleet.services[j].name}); both would write {', '.join(SERVICE_FILES)} and Triton's ports; "
                    "serve both models from one service",
                )
            )
        services_on.setdefault(machine, i)
    return out


def _model_name_problems(at: str, s: Service) -> list[Problem]:
    """At least one model, each name once (one repository directory per model)."""
    out = []
    models = [x.name for x in s.models]
    for k, mname in enumerate(models):
        if models.index(mname) != k:
            out.append(
                Problem(
                    f"{at}.models[{k}].name",
                    f"{mname!r} appears twice in this service (one repository directory per model)",
                )
            )
    if not s.models:
        out.append(Problem(f"{at}.models", "a service needs at least one model"))
    return out


def _service_machine(
    fleet: Fleet, at: str, s: Service, unknown: frozenset[str]
) -> tuple[Optional[Host], list[Problem]]:
    """(the service's host, problems): None when its host or VM does not exist (nothing more to check then); a VM
    it runs in must have an address, unless that address was dropped as bad (`unknown`)."""
    hosts = {h.name: h for h in fleet.hosts}
    sh = hosts.get(s.host)
    if sh is None:
        return None, [Problem(f"{at}.host", f"unknown host {s.host!r} (hosts: {', '.join(hosts) or 'none'})")]
    if not s.vm:
        return sh, []
    svm = next((v for v in sh.vms if v.name == s.vm), None)
    if svm is None:
        return None, [
            Problem(
                f"{at}.vm", f"host {s.host} has no VM {s.vm!r} (VMs: {', '.join(v.name for v in sh.vms) or 'none'})"
            )
        ]
    hi = next(k for k, x in enumerate(fleet.hosts) if x.name == s.host)
    if not svm.address and f"fleet.hosts[{hi}].vms[{sh.vms.index(svm)}].address" not in unknown:
        return sh, [
            Problem(f"{at}.vm", f"VM {s.vm!r} has no address, so the service cannot reach it; set address on that VM")
        ]
    return sh, []


def _model_problems(at: str, s: Service) -> list[Problem]:
    """Each model's artifact (gpuhost ships no stand-in), and input/jpeg_decoder/compile only where the preset takes
    them."""
    out = []
    for k, mdl in enumerate(s.models):
        if mdl.artifact is None and mdl.preset in WEIGHTS_ONLY:
            out.append(
                Problem(
                    f"{at}.models[{k}].artifact",
                    f"required for preset {mdl.preset}: its weights file (an Ultralytics "
                    "yolov8n.onnx or yolov8n.pt, a state_dict or safetensors; url or path, and sha256); a stack may "
                    "not serve random weights",
                )
            )
        elif mdl.artifact is None:
            out.append(
                Problem(
                    f"{at}.models[{k}].artifact",
                    f"required for preset {mdl.preset}: the model's file (url or path, "
                    "and sha256); gpuhost ships no stand-in",
                )
            )
        if "input" in mdl.model_fields_set and mdl.preset != "yolov8n_torch":
            out.append(
                Problem(
                    f"{at}.models[{k}].input",
                    f"only preset yolov8n_torch takes frames as jpeg or raw; preset "
                    f"{mdl.preset} has its own input signature (remove input)",
                )
            )
        if "compile" in mdl.model_fields_set and mdl.preset != "yolov8n_torch":
            out.append(
                Problem(
                    f"{at}.models[{k}].compile",
                    f"only preset yolov8n_torch is compiled by gpuhost; preset {mdl.preset} runs as its artifact "
                    "is (remove compile)",
                )
            )
        if "jpeg_decoder" in mdl.model_fields_set and (mdl.preset, mdl.input) != ("yolov8n_torch", "jpeg"):
            out.append(
                Problem(
                    f"{at}.models[{k}].jpeg_decoder",
                    "only preset yolov8n_torch with input jpeg decodes frames; "
                    + (
                        "input raw takes frames letterboxed by the client (remove jpeg_decoder, or set input: jpeg)"
                        if mdl.preset == "yolov8n_torch"
                        else f"preset {mdl.preset} decodes none (remove jpeg_decoder)"
                    ),
                )
            )
    return out


def _service_mig_problems(at: str, s: Service, sh: Host) -> list[Problem]:
    """A MIG binding names a MIG GPU of the service's host (not in a VM) and one of its instances."""
    if not s.mig:
        return []
    g = next((g for g in sh.gpus if g.address == s.mig.gpu and g.mig), None)
    if s.vm or g is None:
        return [
            Problem(
                f"{at}.mig.gpu",
                f"{s.mig.gpu} is not a MIG GPU of host {s.host}"
                + (" (a service in a VM has its GPU passed through whole)" if s.vm else ""),
            )
        ]
    if s.mig.instance >= len(g.mig or []):
        return [Problem(f"{at}.mig.instance", f"{s.mig.instance} but {s.mig.gpu} has {len(g.mig or [])} MIG instances")]
    return []


def _monitoring_problems(fleet: Fleet) -> list[Problem]:
    """The monitoring host and ports, and controllers it can scrape."""
    out: list[Problem] = []
    hosts = {h.name: h for h in fleet.hosts}
    m = fleet.monitoring
    if m:
        if m.host not in hosts:
            out.append(
                Problem("fleet.monitoring.host", f"unknown host {m.host!r} (hosts: {', '.join(hosts) or 'none'})")
            )
        if m.prometheus_port == m.grafana_port:
            out.append(Problem("fleet.monitoring.grafana_port", f"{m.grafana_port} is the prometheus_port too"))
        for i, s in enumerate(fleet.services):
            if s.adaptive_window and s.adaptive_window.loopback_only:
                out.append(
                    Problem(
                        f"fleet.services[{i}].adaptive_window.listen",
                        f"{s.adaptive_window.listen} is loopback only; "
                        "Prometheus on the monitoring host scrapes the controller there (listen on 0.0.0.0:PORT)",
                    )
                )
    return out


def _service_gpu_problems(at: str, s, h: Host) -> list[Problem]:
    """A service needs a GPU it can use where it runs: its VM's passed-through GPUs, or on the host one the host's
    NVIDIA driver keeps (passthrough: false); a MIG binding needs a runtime that binds the device."""
    if s.vm:
        vm = next((v for v in h.vms if v.name == s.vm), None)
        if vm is not None and not vm.gpus:
            return [
                Problem(
                    f"{at}.vm",
                    f"VM {s.vm!r} has no GPU (its gpus is empty), so Triton there has none to use; give the "
                    "VM a GPU of the host, or run the service where one is",
                )
            ]
        if vm is not None and s.numa_node not in (None, 0):
            return [
                Problem(f"{at}.numa_node", f"{s.numa_node} but a guest sees one NUMA node (0); drop numa_node or set 0")
            ]
        return []
    usable = [g for g in h.gpus if not g.passthrough]
    if not usable:
        why = (
            f"all of host {h.name}'s GPUs are bound to vfio for VMs (passthrough: true)"
            if h.gpus
            else f"host {h.name} declares no GPU"
        )
        return [
            Problem(
                f"{at}.host",
                f"{why}, so Triton on the host has none to use; run the service in a VM that has a GPU "
                "(vm:), or keep a GPU on the host (passthrough: false)",
            )
        ]
    out = []
    if any(g.mig for g in h.gpus):
        for k, m in enumerate(s.models):
            if model_spec(m, s.gpu_model).platform == "tensorrt_plan":
                out.append(
                    Problem(
                        f"{at}.models[{k}].preset",
                        f"{m.preset} builds a TensorRT engine, and the build runs on a whole GPU "
                        "(docker --gpus device=0), not on this service's MIG device; on a MIG host use a python-backend "
                        "preset (yolov8n_torch, sdxl), or serve the model from a VM",
                    )
                )
    if any(g.mig for g in h.gpus) and s.runtime == "process":
        out.append(
            Problem(
                f"{at}.runtime",
                "process runs Triton without a device binding, but on a MIG host the service is bound to "
                "one MIG device (it would see every GPU); use runtime: docker",
            )
        )
    if s.numa_node is not None and h.topology and s.numa_node >= h.topology.nodes:
        out.append(Problem(f"{at}.numa_node", f"{s.numa_node} but host {h.name} has {h.topology.nodes} NUMA nodes"))
    return out


def _network_problems(i: int, h: Host) -> list[Problem]:
    """Static guest addresses on the host's bridge (vm_network): IP addresses inside one subnet with the gateway,
    not the subnet's own network or broadcast address, nor the gateway."""
    net = h.vm_network
    if net is None:
        return []
    at = f"fleet.hosts[{i}]"
    out: list[Problem] = []
    subnet: Optional[ipaddress._BaseNetwork] = None
    if net.gateway:
        gw = ipaddress.ip_address(net.gateway)
        if net.prefix_length > gw.max_prefixlen:
            return [
                Problem(
                    f"{at}.vm_network.prefix_length",
                    f"{net.prefix_length} but the gateway is IPv{gw.version} (at most {gw.max_prefixlen})",
                )
            ]
        subnet = ipaddress.ip_network(f"{gw}/{net.prefix_length}", strict=False)
    for j, vm in enumerate(h.vms):
        if not vm.address:
            continue
        where = f"{at}.vms[{j}].address"
        try:
            ip = ipaddress.ip_address(vm.address)
        except ValueError:
            out.append(
                Problem(
                    where,
                    f"{vm.address!r} is a host name, but vm_network gives guests static IP addresses; write the guest's IP",
                )
            )
            continue
        if subnet is None:
            if net.prefix_length > ip.max_prefixlen:
                out.append(
                    Problem(
                        f"{at}.vm_network.prefix_length",
                        f"{net.prefix_length} but guest addresses are IPv{ip.version} (at most {ip.max_prefixlen})",
                    )
                )
                return out
            subnet = ipaddress.ip_network(f"{ip}/{net.prefix_length}", strict=False)
        if ip.version != subnet.version or ip not in subnet:
            what = f"with the gateway {net.gateway}" if net.gateway else "with the host's other guests"
            out.append(
                Problem(
                    where,
                    f"{ip} is outside the VM subnet {subnet} ({what}); use an address inside it, or fix vm_network.prefix_length",
                )
            )
        elif ip == subnet.network_address or (
            ip.version == 4 and subnet.prefixlen < 31 and ip == subnet.broadcast_address
        ):
            out.append(
                Problem(
                    where,
                    f"{ip} is the {'network' if ip == subnet.network_address else 'broadcast'} address of {subnet}; use a host address inside it",
                )
            )
        elif net.gateway and ip == ipaddress.ip_address(net.gateway):
            out.append(Problem(where, f"{ip} is the gateway of vm_network; give the guest its own address"))
    return out


# Fixed listeners gpuhost puts on machines besides the configurable ports (Triton's three, the exporters).
NODE_EXPORTER_PORT = 9100
DCGM_EXPORTER_PORT = 9400


def port_problems(fleet: Fleet) -> list[Problem]:
    """One machine, one listener per port: every port the stack opens on a host or guest, with the config path
    that opens it; a clash names both paths. Pairs inside one gateway or the monitoring block are reported by
    their own checks."""
    listeners: dict[str, list[tuple[int, str, str, bool]]] = {}  # machine -> (port, path, what, fixed)

    def on(machine: str, port: int, path: str, what: str, fixed: bool = False) -> None:
        listeners.setdefault(machine, []).append((port, path, what, fixed))

    hosts = {h.name: h for h in fleet.hosts}
    for i, h in enumerate(fleet.hosts):
        on(h.name, h.ssh.port, f"fleet.hosts[{i}].ssh.port", "sshd")
        for j, vm in enumerate(h.vms):
            if vm.address:
                on(f"{h.name}/{vm.name}", 22, f"fleet.hosts[{i}].vms[{j}]", "the guest's sshd", True)
    served: set[str] = set()
    for i, s in enumerate(fleet.services):
        m = f"{s.host}/{s.vm}" if s.vm else s.host
        if s.host not in hosts or m in served:  # two services on one machine: reported by fleet_problems
            continue
        served.add(m)
        at = f"fleet.services[{i}]"
        for port, what in zip(TRITON_PORTS, ("HTTP", "gRPC", "metrics")):
            on(m, port, at, f"Triton's {what} port", True)
        on(m, s.nginx_port, f"{at}.nginx_port", "nginx")
        if s.adaptive_window:
            on(m, s.adaptive_window.port, f"{at}.adaptive_window.listen", "the adaptive-window controller")
    for i, g in enumerate(fleet.gateways):
        at = f"fleet.gateways[{i}]"
        on(g.host, g.redis_port, f"{at}.redis_port", "the gateway's Redis")
        on(g.host, g.front_port, f"{at}.front_port", "the gateway's HTTP entry")
        for w in range(g.workers):
            on(g.host, g.metrics_port + w, f"{at}.metrics_port", f"gateway worker {w}'s metrics")
    mon = fleet.monitoring
    if mon:
        on(mon.host, mon.prometheus_port, "fleet.monitoring.prometheus_port", "Prometheus")
        on(mon.host, mon.grafana_port, "fleet.monitoring.grafana_port", "Grafana")
        for h in fleet.hosts:
            on(h.name, NODE_EXPORTER_PORT, "fleet.monitoring", "node-exporter", True)
            if any(not g.passthrough for g in h.gpus):
                on(h.name, DCGM_EXPORTER_PORT, "fleet.monitoring", "dcgm-exporter", True)
            for vm in h.vms:
                if vm.address:
                    on(f"{h.name}/{vm.name}", NODE_EXPORTER_PORT, "fleet.monitoring", "node-exporter", True)
                    on(f"{h.name}/{vm.name}", DCGM_EXPORTER_PORT, "fleet.monitoring", "dcgm-exporter", True)
    out: list[Problem] = []
    for machine, ls in listeners.items():
        first: dict[int, tuple[int, str, str, bool]] = {}
        # Fixed listeners first, so the line goes to the path the user can change.
        for port, path, what, fixed in sorted(ls, key=lambda x: not x[3]):
            if port not in first:
                first[port] = (port, path, what, fixed)
                continue
            _, fpath, fwhat, _ = first[port]
            same_block = (path.startswith("fleet.gateways") and fpath.split(".")[:2] == path.split(".")[:2]) or (
                path.startswith("fleet.monitoring.") and fpath.startswith("fleet.monitoring.")
            )
            if same_block or (fpath, fwhat) == (path, what):
                continue
            out.append(
                Problem(
                    path,
                    f"port {port} on {machine} is also {fwhat} ({fpath}); one port has one listener on a "
                    "machine: choose another port",
                )
            )
    return out


def service_address(fleet: Fleet, s) -> Optional[str]:
    """The address of the machine a service runs on (its guest's, or its host's SSH address); None if unknown."""
    h = next((x for x in fleet.hosts if x.name == s.host), None)
    if h is None:
        return None
    if s.vm:
        return next((v.address for v in h.vms if v.name == s.vm), None)
    return h.ssh.address


def triton_listen_problems(fleet: Fleet, machine_address) -> list[Problem]:
    """Triton listens on loopback unless told: a reader on another machine needs ``triton_listen``; the metrics
    bind the machine's address for Prometheus, which must then be an IP (Triton resolves no names)."""
    out: list[Problem] = []
    services = {s.name: (i, s) for i, s in enumerate(fleet.services)}
    for i, s in enumerate(fleet.services):
        addr = machine_address(s)
        if fleet.monitoring and not s.triton_listen and addr is not None:
            try:
                ipaddress.ip_address(addr)
            except ValueError:
                out.append(
                    Problem(
                        f"fleet.services[{i}].triton_listen",
                        f"Prometheus scrapes Triton's metrics at {addr!r}, a host name "
                        "Triton cannot bind: set triton_listen to that machine's IP address",
                    )
                )
    for gi, g in enumerate(fleet.gateways):
        for j, b in enumerate(g.backends):
            if b.service not in services:
                continue
            si, s = services[b.service]
            if not s.triton_listen and (s.vm or s.host != g.host):
                out.append(
                    Problem(
                        f"fleet.gateways[{gi}].backends[{j}].service",
                        f"{s.name}'s Triton listens on loopback only and "
                        f"gateway {g.name} runs on {g.host}: set fleet.services[{si}].triton_listen to the address the "
                        f"gateway reaches it at (e.g. {machine_address(s) or 'its IP'})",
                    )
                )
    return out


def gateway_problems(fleet: Fleet) -> list[Problem]:
    """Seed 001 gateways: on a known host, in front of known services that share a model, ports apart, Redis beyond
    loopback only with a password."""
    out: list[Problem] = []
    hosts = [h.name for h in fleet.hosts]
    services = {s.name: s for s in fleet.services}
    names = [g.name for g in fleet.gateways]
    for i, g in enumerate(fleet.gateways):
        at = f"fleet.gateways[{i}]"
        if names.index(g.name) != i:
            out.append(Problem(f"{at}.name", f"{g.name!r} appears twice (gateway names are unique)"))
        if g.host not in hosts:
            out.append(Problem(f"{at}.host", f"unknown host {g.host!r} (hosts: {', '.join(hosts) or 'none'})"))
        refs = [b.service for b in g.backends]
        for j, b in enumerate(g.backends):
            if b.service not in services:
                out.append(
                    Problem(
                        f"{at}.backends[{j}].service",
                        f"unknown service {b.service!r} (services: {', '.join(services) or 'none'})",
                    )
                )
            elif refs.index(b.service) != j:
                out.append(
                    Problem(f"{at}.backends[{j}].service", f"{b.service!r} listed twice (one weight per backend)")
                )
        known = [services[r] for r in refs if r in services]
        if known and not set.intersection(*({m.name for m in s.models} for s in known)):
            out.append(Problem(f"{at}.backends", "the services share no model, so no job could run on all of them"))
        if g.queue_ms_shift >= g.queue_ms_drain:
            out.append(Problem(f"{at}.queue_ms_shift", f"must be below queue_ms_drain ({g.queue_ms_drain:g})"))
        if g.metrics_port <= g.redis_port < g.metrics_port + g.workers:
            out.append(Problem(f"{at}.redis_port", f"{g.redis_port} collides with a worker metrics port"))
        if g.front_port == g.redis_port or g.metrics_port <= g.front_port < g.metrics_port + g.workers:
            out.append(Problem(f"{at}.front_port", f"{g.front_port} collides with redis_port or a worker metrics port"))
        if not is_loopback(g.redis_bind) and g.redis_password_secret is None:
            out.append(
                Problem(
                    f"{at}.redis_bind",
                    f"{g.redis_bind} is not loopback, and Redis has no password: set "
                    f"{at}.redis_password_secret: gatewayRedisPassword and "
                    "`pulumi config set --secret gatewayRedisPassword <password>` (or bind 127.0.0.1)",
                )
            )
        if g.metrics_port + g.workers - 1 > 65535:
            out.append(Problem(f"{at}.metrics_port", f"{g.workers} workers count up past port 65535"))
    return out


def _pin_problems(fleet: Fleet) -> list[Problem]:
    """Every machine gpuhost reaches over SSH needs a pin (or the host's explicit insecure flag); one that Docker
    reaches (its own OpenSSH client, access/docker_ssh.py) needs the key line itself: a fingerprint cannot be
    written into known_hosts."""
    out: list[Problem] = []
    docker_hosts: dict[str, str] = {}
    docker_guests: dict[tuple[str, str], str] = {}
    for i, s in enumerate(fleet.services):
        if s.runtime == "docker":
            if s.vm:
                docker_guests.setdefault((s.host, s.vm), f"services[{i}] ({s.name})")
            else:
                docker_hosts.setdefault(s.host, f"services[{i}] ({s.name})")
    if fleet.monitoring:
        for h in fleet.hosts:
            docker_hosts.setdefault(h.name, "monitoring")
            for vm in h.vms:
                if vm.address:
                    docker_guests.setdefault((h.name, vm.name), "monitoring")
    for i, h in enumerate(fleet.hosts):
        at = f"fleet.hosts[{i}]"
        guests_by_docker = [why for (hn, _), why in docker_guests.items() if hn == h.name]
        if (h.name in docker_hosts or guests_by_docker) and (h.ssh.host_key or "").startswith("SHA256:"):
            why = docker_hosts.get(h.name) or f"{guests_by_docker[0]}, through this host as jump"
            out.append(
                Problem(
                    f"{at}.ssh.host_key",
                    f"Docker reaches this host over SSH ({why}) and needs the key line "
                    "('ssh-ed25519 AAAA...'), not its SHA256 fingerprint, to write known_hosts",
                )
            )
        j = h.ssh.jump
        if j is not None and j.host_key is None and not h.ssh.insecure_accept_unknown_host_key:
            out.append(Problem(f"{at}.ssh.jump.host_key", "missing; pin the jump host's key (strict host keys)"))
        elif j is not None and h.name in docker_hosts and (j.host_key or "").startswith("SHA256:"):
            # Docker's ssh reaches the host through a ProxyCommand to the jump host, checked against known_hosts too
            out.append(
                Problem(
                    f"{at}.ssh.jump.host_key",
                    f"Docker reaches this host through its jump host over SSH "
                    f"({docker_hosts[h.name]}) and needs the jump host's key line ('ssh-ed25519 AAAA...'), not its "
                    "SHA256 fingerprint, to write known_hosts",
                )
            )
        for k, vm in enumerate(h.vms):
            if not vm.address:
                continue
            if vm.host_key is None and not h.ssh.insecure_accept_unknown_host_key:
                out.append(
                    Problem(
                        f"{at}.vms[{k}].host_key",
                        f"missing; gpuhost reaches VM {vm.name!r} over SSH at "
                        f"{vm.address}: set its host key line (strict host keys), or "
                        "insecure_accept_unknown_host_key on a throwaway dev host",
                    )
                )
            elif (vm.host_key or "").startswith("SHA256:") and (h.name, vm.name) in docker_guests:
                out.append(
                    Problem(
                        f"{at}.vms[{k}].host_key",
                        f"Docker reaches this guest over SSH "
                        f"({docker_guests[(h.name, vm.name)]}) and needs the key line, not its SHA256 "
                        "fingerprint, to write known_hosts",
                    )
                )
    return out


def _via_host(h: Host):
    """Guests are reached through their host: the host's own endpoint is the jump."""
    return Jump(address=h.ssh.address, port=h.ssh.port, user=h.ssh.user)


def placement_problems(fleet: Fleet) -> list[str]:
    """The NUMA placement of every host's VMs (the same solver the program uses), as config lines."""
    out = []
    for i, h in enumerate(fleet.hosts):
        try:
            place_vms(i, h)
        except ConfigError as e:
            out += e.lines
    return out
