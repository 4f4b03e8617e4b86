"""Cross-field checks of the fleet: what no single field shows, reported with the same one-line-per-path format.

Pure: a parsed `Fleet` in, lines `fleet.<path>: <problem> (<fix>)` out, [] when the stack is consistent. The loader
runs these even when some fields are bad (on the fields that are good), so one run lists every problem.

Usage::

    for line in fleet_problems(fleet): print(line)
"""

from __future__ import annotations

from typing import Iterator

from plans import values as val
from plans.cmdline import UNSAFE
from plans.mig_fit import layout_problems
from stacks.schema import Fleet, Host, Topology

# Presets whose model code gpuhost ships itself (serving/models): the artifact is their weights file.
WEIGHTS_ONLY = ("yolov8n_torch",)

# What one TritonService writes on its machine (components/triton_service.py): two services on one machine would
# overwrite each other's files and fight over Triton's ports.
SERVICE_FILES = ("/srv/triton-repo", "/etc/nginx/nginx.conf", "/etc/systemd/system/gpuhost-triton.service")
TRITON_PORTS = (8000, 8001, 8002)
# Share of each node's memory the host keeps when hugepages are reserved (kernel, page cache, libvirt, QEMU's own
# overhead): a box whose memory is all hugepages does not boot to a usable state.
HOST_KEEP_PERCENT = 10


def host_problems(i: int, h: Host) -> Iterator[str]:
    at = f"fleet.hosts[{i}]"
    gpus = {g.address: g for g in h.gpus}
    seen_gpu: dict[str, str] = {}
    names: set[str] = set()
    t = h.topology
    for j, vm in enumerate(h.vms):
        if vm.name in names:
            yield f"{at}.vms[{j}].name: {vm.name!r} appears twice on host {h.name} (VM names are unique per host)"
        names.add(vm.name)
        for a in vm.gpus:
            g = gpus.get(a)
            if g is None:
                yield (
                    f"{at}.vms[{j}].gpus: {a} is not one of this host's gpus[] "
                    f"({', '.join(sorted(gpus)) or 'none declared'})"
                )
            elif not g.passthrough:
                yield (
                    f"{at}.vms[{j}].gpus: {a} is declared passthrough: false (the host keeps it); a VM cannot "
                    "have it (libvirt would detach it from the host driver at VM start); set passthrough: true "
                    "or remove it from the VM"
                )
            if a in seen_gpu:
                yield (
                    f"{at}.vms[{j}].gpus: {a} is already given to VM {seen_gpu[a]!r} "
                    "(a GPU passes through to one VM only)"
                )
            seen_gpu[a] = vm.name
        if t:
            nodes = sorted(n for a in vm.gpus if a in gpus for n in [gpus[a].numa_node] if n is not None)
            reserved_per_node = len(h.reserved_cpus) // max(1, t.nodes)
            cap = t.cpus_per_node - reserved_per_node
            if vm.vcpus > cap:
                where = f"node {nodes[0]}" if nodes else "any node"
                yield (
                    f"{at}.vms[{j}].vcpus: {vm.vcpus} vCPUs do not fit on {where} of {h.name}: "
                    f"{t.cpus_per_node} CPUs per node, about {reserved_per_node} reserved for the host, "
                    f"so at most {cap}"
                )
            if vm.memory_gib > t.memory_gib_per_node:
                yield f"{at}.vms[{j}].memory_gib: {vm.memory_gib} GiB exceeds a node's {t.memory_gib_per_node} GiB"
    for k, g in enumerate(h.gpus):
        if t and g.numa_node is not None and g.numa_node >= t.nodes:
            yield f"{at}.gpus[{k}].numa_node: {g.numa_node} but the topology has {t.nodes} nodes"
        if g.mig:
            if g.passthrough:
                yield (
                    f"{at}.gpus[{k}].mig: MIG is cut on the host's NVIDIA driver; set passthrough: false "
                    "(seed 001 route A) or drop mig"
                )
            for problem in layout_problems(g.model, g.mig):
                yield f"{at}.gpus[{k}].mig: {problem} (`nvidia-smi mig -lgip` lists what fits)"
    if t:
        ncpu = t.sockets * t.cores_per_socket * t.threads_per_core
        bad = [c for c in h.reserved_cpus if c >= ncpu]
        if bad:
            yield f"{at}.reserved_cpus: CPU(s) {bad} beyond this host's {ncpu} CPUs"
        yield from _hugepage_problems(at, h, t)
    ack = {flag for flag in UNSAFE.values() if getattr(h, flag)}
    for k, arg in enumerate(h.kernel.extra_args):
        flag = UNSAFE.get(val.param_name(arg))
        if flag and flag not in ack:
            yield (
                f"{at}.kernel.extra_args[{k}]: {arg!r} ({val.param_name(arg)}) weakens isolation between devices "
                f"and VMs (seeds: last resort only); set {flag}: true on the host to use it"
            )


def _hugepage_problems(at: str, h: Host, t: Topology) -> Iterator[str]:
    hp = h.hugepages
    node_mib = t.memory_gib_per_node * 1024
    keep_mib = node_mib * HOST_KEEP_PERCENT // 100
    if hp.size == "1G" and hp.count:
        # hugepages=N at boot spreads the pages evenly over the nodes; each node keeps memory for the host.
        most = (node_mib - keep_mib) // 1024 * t.nodes
        if hp.count > most:
            yield (
                f"{at}.hugepages.count: {hp.count} x 1 GiB pages but the host has {t.nodes} x "
                f"{t.memory_gib_per_node} GiB and keeps {HOST_KEEP_PERCENT}% of each node for itself: at most "
                f"{most}"
            )
    for node, count in sorted(hp.per_node.items()):
        if node >= t.nodes:
            yield f"{at}.hugepages.per_node: node {node} but the topology has {t.nodes} nodes (0-{t.nodes - 1})"
        elif hp.size == "2M" and count * 2 > node_mib - keep_mib:
            yield (
                f"{at}.hugepages.per_node: {count} x 2 MiB pages on node {node} but the node has "
                f"{t.memory_gib_per_node} GiB and keeps {HOST_KEEP_PERCENT}% for the host: at most "
                f"{(node_mib - keep_mib) // 2}"
            )


def _endpoint(address: str, port: int, jump) -> tuple:
    return (jump.address, jump.port) if jump else (), address.lower(), port


def fleet_problems(fleet: Fleet, unknown: frozenset[str] = frozenset()) -> list[str]:
    """`unknown`: config paths whose (bad) values were dropped; checks that hinge on them stay quiet."""
    out: list[str] = []
    for i, h in enumerate(fleet.hosts):
        out += host_problems(i, h)
    hosts = {h.name: h for h in fleet.hosts}
    first_name: dict[str, int] = {}
    endpoints: dict[tuple, str] = {}
    for i, h in enumerate(fleet.hosts):
        if h.name in first_name:
            out.append(f"fleet.hosts[{i}].name: {h.name!r} appears twice (hosts[{first_name[h.name]}] too)")
        first_name.setdefault(h.name, i)
        ep = _endpoint(h.ssh.address, h.ssh.port, h.ssh.jump)
        if ep in endpoints:
            out.append(
                f"fleet.hosts[{i}].ssh: {h.ssh.address}:{h.ssh.port} is host {endpoints[ep]!r} already "
                "(one SSH endpoint is one machine; two hosts there would undo each other's changes)"
            )
        endpoints.setdefault(ep, h.name)
    for i, h in enumerate(fleet.hosts):
        jump = _via_host(h)
        for j, vm in enumerate(h.vms):
            if not vm.address:
                continue
            ep = _endpoint(vm.address, 22, jump)
            direct = _endpoint(vm.address, 22, None)
            other = endpoints.get(ep) or endpoints.get(direct)
            if other:
                out.append(
                    f"fleet.hosts[{i}].vms[{j}].address: {vm.address} is {other!r} already "
                    "(each guest needs its own address)"
                )
            endpoints.setdefault(ep, f"{h.name}/{vm.name}")
        if fleet.monitoring:
            for j, vm in enumerate(h.vms):
                if vm.address and len(f"{h.name}-{vm.name}") > 63:
                    out.append(
                        f"fleet.hosts[{i}].vms[{j}].name: monitoring labels the guest "
                        f"{h.name}-{vm.name!s}, longer than 63 characters; shorten the host or VM name"
                    )
    services_on: dict[tuple, int] = {}
    svc_names: dict[str, int] = {}
    for i, s in enumerate(fleet.services):
        at = f"fleet.services[{i}]"
        if s.name in svc_names:
            out.append(f"{at}.name: {s.name!r} appears twice (services[{svc_names[s.name]}] too)")
        svc_names.setdefault(s.name, i)
        models = [x.name for x in s.models]
        for k, mname in enumerate(models):
            if models.index(mname) != k:
                out.append(
                    f"{at}.models[{k}].name: {mname!r} appears twice in this service (one repository directory per model)"
                )
        if not s.models:
            out.append(f"{at}.models: a service needs at least one model")
        if s.nginx_port in TRITON_PORTS:
            out.append(
                f"{at}.nginx_port: {s.nginx_port} is one of Triton's own ports {list(TRITON_PORTS)} on the "
                "same machine; use 80 or another free port"
            )
        sh = hosts.get(s.host)
        if sh is None:
            out.append(f"{at}.host: unknown host {s.host!r} (hosts: {', '.join(hosts) or 'none'})")
            continue
        if s.vm:
            svm = next((v for v in sh.vms if v.name == s.vm), None)
            if svm is None:
                out.append(
                    f"{at}.vm: host {s.host} has no VM {s.vm!r} (VMs: {', '.join(v.name for v in sh.vms) or 'none'})"
                )
                continue
            hi = next(k for k, x in enumerate(fleet.hosts) if x.name == s.host)
            if not svm.address and f"fleet.hosts[{hi}].vms[{sh.vms.index(svm)}].address" not in unknown:
                out.append(
                    f"{at}.vm: VM {s.vm!r} has no address, so the service cannot reach it; set address on that VM"
                )
        for k, mdl in enumerate(s.models):
            if mdl.artifact is None and mdl.preset in WEIGHTS_ONLY:
                out.append(
                    f"{at}.models[{k}].artifact: required for preset {mdl.preset}: its weights file (an Ultralytics "
                    "yolov8n.onnx or yolov8n.pt, a state_dict or safetensors; url or path, and sha256); a stack may "
                    "not serve random weights"
                )
            elif mdl.artifact is None:
                out.append(
                    f"{at}.models[{k}].artifact: required for preset {mdl.preset}: the model's file (url or path, "
                    "and sha256); gpuhost ships no stand-in"
                )
            if "input" in mdl.model_fields_set and mdl.preset != "yolov8n_torch":
                out.append(
                    f"{at}.models[{k}].input: only preset yolov8n_torch takes frames as jpeg or raw; preset "
                    f"{mdl.preset} has its own input signature (remove input)"
                )
        if s.mig:
            g = next((g for g in sh.gpus if g.address == s.mig.gpu and g.mig), None)
            if s.vm or g is None:
                out.append(
                    f"{at}.mig.gpu: {s.mig.gpu} is not a MIG GPU of host {s.host}"
                    + (" (a service in a VM has its GPU passed through whole)" if s.vm else "")
                )
            elif s.mig.instance >= len(g.mig or []):
                out.append(f"{at}.mig.instance: {s.mig.instance} but {s.mig.gpu} has {len(g.mig or [])} MIG instances")
        machine = (s.host, s.vm)
        if machine in services_on:
            j = services_on[machine]
            out.append(
                f"{at}: runs on {s.host}{'/' + s.vm if s.vm else ''} like services[{j}] "
                f"({fleet.services[j].name}); both would write {', '.join(SERVICE_FILES)} and Triton's ports; "
                "serve both models from one service"
            )
        services_on.setdefault(machine, i)
    out += _pin_problems(fleet)
    m = fleet.monitoring
    if m:
        if m.host not in hosts:
            out.append(f"fleet.monitoring.host: unknown host {m.host!r} (hosts: {', '.join(hosts) or 'none'})")
        if m.prometheus_port == m.grafana_port:
            out.append(f"fleet.monitoring.grafana_port: {m.grafana_port} is the prometheus_port too")
        for i, s in enumerate(fleet.services):
            if s.host == m.host and not s.vm and s.nginx_port in (m.prometheus_port, m.grafana_port):
                out.append(f"fleet.services[{i}].nginx_port: {s.nginx_port} is taken by monitoring on {m.host}")
            if s.adaptive_window and s.adaptive_window.loopback_only:
                out.append(
                    f"fleet.services[{i}].adaptive_window.listen: {s.adaptive_window.listen} is loopback only; "
                    "Prometheus on the monitoring host scrapes the controller there (listen on 0.0.0.0:PORT)"
                )
    out += gateway_problems(fleet)
    return out


def gateway_problems(fleet: Fleet) -> list[str]:
    """Seed 001 gateways: on a known host, in front of known services that share a model, ports apart."""
    out: list[str] = []
    hosts = [h.name for h in fleet.hosts]
    services = {s.name: s for s in fleet.services}
    names = [g.name for g in fleet.gateways]
    for i, g in enumerate(fleet.gateways):
        at = f"fleet.gateways[{i}]"
        if names.index(g.name) != i:
            out.append(f"{at}.name: {g.name!r} appears twice (gateway names are unique)")
        if g.host not in hosts:
            out.append(f"{at}.host: unknown host {g.host!r} (hosts: {', '.join(hosts) or 'none'})")
        refs = [b.service for b in g.backends]
        for j, b in enumerate(g.backends):
            if b.service not in services:
                out.append(
                    f"{at}.backends[{j}].service: unknown service {b.service!r} "
                    f"(services: {', '.join(services) or 'none'})"
                )
            elif refs.index(b.service) != j:
                out.append(f"{at}.backends[{j}].service: {b.service!r} listed twice (one weight per backend)")
        known = [services[r] for r in refs if r in services]
        if known and not set.intersection(*({m.name for m in s.models} for s in known)):
            out.append(f"{at}.backends: the services share no model, so no job could run on all of them")
        if g.queue_ms_shift >= g.queue_ms_drain:
            out.append(f"{at}.queue_ms_shift: must be below queue_ms_drain ({g.queue_ms_drain:g})")
        if g.metrics_port <= g.redis_port < g.metrics_port + g.workers:
            out.append(f"{at}.redis_port: {g.redis_port} collides with a worker metrics port")
        if g.front_port == g.redis_port or g.metrics_port <= g.front_port < g.metrics_port + g.workers:
            out.append(f"{at}.front_port: {g.front_port} collides with redis_port or a worker metrics port")
        if g.metrics_port + g.workers - 1 > 65535:
            out.append(f"{at}.metrics_port: {g.workers} workers count up past port 65535")
    return out


def _pin_problems(fleet: Fleet) -> list[str]:
    """Every machine gpuhost reaches over SSH needs a pin (or the host's explicit insecure flag); one that Docker
    reaches (its own OpenSSH client, access/docker_ssh.py) needs the key line itself: a fingerprint cannot be
    written into known_hosts."""
    out: list[str] = []
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
                f"{at}.ssh.host_key: Docker reaches this host over SSH ({why}) and needs the key line "
                "('ssh-ed25519 AAAA...'), not its SHA256 fingerprint, to write known_hosts"
            )
        j = h.ssh.jump
        if j is not None and j.host_key is None and not h.ssh.insecure_accept_unknown_host_key:
            out.append(f"{at}.ssh.jump.host_key: missing; pin the jump host's key (strict host keys)")
        for k, vm in enumerate(h.vms):
            if not vm.address:
                continue
            if vm.host_key is None and not h.ssh.insecure_accept_unknown_host_key:
                out.append(
                    f"{at}.vms[{k}].host_key: missing; gpuhost reaches VM {vm.name!r} over SSH at "
                    f"{vm.address}: set its host key line (strict host keys), or "
                    "insecure_accept_unknown_host_key on a throwaway dev host"
                )
            elif (vm.host_key or "").startswith("SHA256:") and (h.name, vm.name) in docker_guests:
                out.append(
                    f"{at}.vms[{k}].host_key: Docker reaches this guest over SSH "
                    f"({docker_guests[(h.name, vm.name)]}) and needs the key line, not its SHA256 "
                    "fingerprint, to write known_hosts"
                )
    return out


def _via_host(h: Host):
    """Guests are reached through their host: the host's own endpoint is the jump."""
    from stacks.schema import Jump

    return Jump(address=h.ssh.address, port=h.ssh.port, user=h.ssh.user)


def placement_problems(fleet: Fleet) -> list[str]:
    """The NUMA placement of every host's VMs (the same solver the program uses), as config lines."""
    from stacks.load import ConfigError
    from stacks.program import plan_host

    out = []
    for i, h in enumerate(fleet.hosts):
        try:
            plan_host(i, h)
        except ConfigError as e:
            out += e.lines
    return out
