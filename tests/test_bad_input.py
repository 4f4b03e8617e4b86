"""Every class of bad input is refused by the stack loader with one exact line per field, and 0 resources registered.

The whole program runs under Pulumi mocks (no engine here) on the hk-prod fleet with one thing broken; the recording
monitor counts what the engine would have been asked to create before the error. `BAD` is the table of the closing
note: class → the error line the user sees → resources registered (always 0).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from stacks.load import ConfigError
from testbed.mocks import attempt_program
from testbed.stackfiles import stack_config


def H(f, i=0):
    return f["hosts"][i]


def _set(path_fn, key, value):
    return lambda f: path_fn(f).__setitem__(key, value)


BAD = [
    (
        "kernel arg with $()",
        lambda f: H(f).setdefault("kernel", {}).__setitem__("extra_args", ["x=$(id)"]),
        [
            "fleet.hosts[0].kernel.extra_args[0]: kernel argument 'x=$(id)' may hold only letters, digits and "
            "_ . , : / = + @ % - (no spaces, quotes, $, backticks or shell characters)"
        ],
    ),
    (
        "kernel arg with backticks",
        lambda f: H(f).setdefault("kernel", {}).__setitem__("remove_args", ["a=`id`"]),
        [
            "fleet.hosts[0].kernel.remove_args[0]: kernel argument 'a=`id`' may hold only letters, digits and "
            "_ . , : / = + @ % - (no spaces, quotes, $, backticks or shell characters)"
        ],
    ),
    (
        "unsafe arg, other spelling",
        lambda f: (
            H(f).setdefault("kernel", {}).__setitem__("extra_args", ["vfio-iommu-type1.allow-unsafe-interrupts=1"])
        ),
        [
            "fleet.hosts[0].kernel.extra_args[0]: 'vfio-iommu-type1.allow-unsafe-interrupts=1' "
            "(vfio_iommu_type1.allow_unsafe_interrupts) weakens isolation between devices and VMs (seeds: last resort "
            "only); set allow_unsafe_interrupts_acknowledged: true on the host to use it"
        ],
    ),
    (
        "guest user",
        _set(lambda f: H(f)["vms"][0], "guest_user", "a b;x"),
        [
            "fleet.hosts[0].vms[0].guest_user: user name 'a b;x' may hold only a POSIX login name: lower-case letters, "
            "digits, _ and -, starting with a letter or _ (at most 32)"
        ],
    ),
    (
        "VM address",
        _set(lambda f: H(f)["vms"][0], "address", "10.0.0.1;id"),
        [
            "fleet.hosts[0].vms[0].address: address '10.0.0.1;id' is neither an IP address nor a DNS host name "
            "(letters, digits, '-' and '.')"
        ],
    ),
    (
        "service name",
        _set(lambda f: f["services"][0], "name", "Bad Name"),
        [
            "fleet.services[0].name: service name 'Bad Name' may hold only lower-case letters, digits and '-' (a DNS "
            "label, at most 63, no leading or trailing '-')"
        ],
    ),
    (
        "model name",
        _set(lambda f: f["services"][0]["models"][0], "name", "../x"),
        [
            "fleet.services[0].models[0].name: model name '../x' may hold only letters, digits, _ . - (it is a "
            "directory of the model repository, at most 64)"
        ],
    ),
    (
        "frame input on a model that takes no frames",
        _set(lambda f: f["services"][0]["models"][0], "input", "raw"),
        [
            "fleet.services[0].models[0].input: only preset yolov8n_torch takes frames as jpeg or raw; preset "
            "yolov8n has its own input signature (remove input)"
        ],
    ),
    (
        "JPEG decoder on a model that decodes no frames",
        _set(lambda f: f["services"][0]["models"][0], "jpeg_decoder", "nvjpeg"),
        [
            "fleet.services[0].models[0].jpeg_decoder: only preset yolov8n_torch with input jpeg decodes frames; "
            "preset yolov8n decodes none (remove jpeg_decoder)"
        ],
    ),
    (
        "JPEG decoder on a model that takes raw pixels",
        lambda f: f["services"][0]["models"][0].update(preset="yolov8n_torch", input="raw", jpeg_decoder="exact"),
        [
            "fleet.services[0].models[0].jpeg_decoder: only preset yolov8n_torch with input jpeg decodes frames; "
            "input raw takes frames letterboxed by the client (remove jpeg_decoder, or set input: jpeg)"
        ],
    ),
    (
        "compile on a model gpuhost does not compile",
        _set(lambda f: f["services"][0]["models"][0], "compile", "none"),
        [
            "fleet.services[0].models[0].compile: only preset yolov8n_torch is compiled by gpuhost; preset yolov8n "
            "runs as its artifact is (remove compile)"
        ],
    ),
    (
        "hugepages beyond memory",
        _set(lambda f: H(f)["hugepages"], "count", 4000),
        [
            "fleet.hosts[0].hugepages.count: 4000 x 1 GiB pages but the host has 2 x 256 GiB and keeps 10% of each "
            "node for itself: at most 460"
        ],
    ),
    (
        "2M hugepages beyond a node",
        _set(lambda f: H(f, 3)["hugepages"]["per_node"], "0", 10**6),
        [
            "fleet.hosts[3].hugepages.per_node: 1000000 x 2 MiB pages on node 0 but the node has 128 GiB and keeps 10% "
            "for the host: at most 58982"
        ],
    ),
    (
        "two hosts, one SSH endpoint",
        _set(lambda f: H(f, 2)["ssh"], "address", "10.20.0.12"),
        [
            "fleet.hosts[2].ssh: 10.20.0.12:22 is host 'trt-a10-01' already (one SSH endpoint is one machine; two hosts "
            "there would undo each other's changes)"
        ],
    ),
    (
        "two guests, one address",
        _set(lambda f: H(f)["vms"][1], "address", "10.20.1.11"),
        [
            "fleet.hosts[0].vms[1].address: 10.20.1.11 is 'trt-l40s-01/tenant-rt-a' already (each guest needs its own "
            "address)"
        ],
    ),
    (
        "two services, one guest",
        lambda f: f["services"].append(dict(f["services"][0], name="yolo-2")),
        [
            "fleet.services[5]: runs on trt-l40s-01/tenant-rt-a like services[0] (yolo-rt); both would write "
            "/srv/triton-repo, /etc/nginx/nginx.conf, /etc/systemd/system/gpuhost-triton.service and Triton's ports; "
            "serve both models from one service"
        ],
    ),
    (
        "two gateways, one host (same unit files)",
        lambda f: f["gateways"].append(
            dict(f["gateways"][0], name="sdxl-gen-2", redis_port=6380, front_port=8091, metrics_port=9480)
        ),
        [
            "fleet.gateways[1]: would write /etc/systemd/system/gpuhost-gateway-redis.service, "
            "/etc/gpuhost/gateway/redis.conf, /etc/systemd/system/gpuhost-gateway-worker-0.service and 11 more on "
            "a100-mig-01, as fleet.gateways[0] (sdxl-gen) does (one file has one owner: each would undo the other's "
            "change and restore its own original on destroy); one gateway per host (its units and "
            "/etc/gpuhost/gateway are fixed paths): move one to another host, or serve both from one gateway"
        ],
    ),
    (
        "nginx port out of range",
        _set(lambda f: f["services"][0], "nginx_port", 70000),
        ["fleet.services[0].nginx_port: 70000 is not a TCP port (use 1-65535)"],
    ),
    (
        "nginx on Triton's port",
        _set(lambda f: f["services"][0], "nginx_port", 8001),
        [
            "fleet.services[0].nginx_port: port 8001 on trt-l40s-01/tenant-rt-a is also Triton's gRPC port "
            "(fleet.services[0]); one port has one listener on a machine: choose another port"
        ],
    ),
    (
        "prometheus port out of range",
        _set(lambda f: f["monitoring"], "prometheus_port", 0),
        ["fleet.monitoring.prometheus_port: 0 is not a TCP port (use 1-65535)"],
    ),
    (
        "sysctl name with a newline",
        _set(lambda f: H(f)["tuning"]["sysctls"], "net.core.x\nfoo", "1"),
        [
            'fleet.hosts[0].tuning.sysctls: key "net.core.x\\nfoo" holds a control character (U+000A line break at character 10); config values are printable text on one line: remove them'
        ],
    ),
    (
        "sysctl value with $",
        _set(lambda f: H(f)["tuning"]["sysctls"], "net.core.somaxconn", "$(id)"),
        ["fleet.hosts[0].tuning.sysctls: sysctl value '$(id)' may hold only letters, digits, spaces and _ . , : / + -"],
    ),
    (
        "tuned profile with shell characters",
        _set(lambda f: H(f)["tuning"], "tuned_profile", "x;reboot"),
        [
            "fleet.hosts[0].tuning.tuned_profile: tuned profile 'x;reboot' may hold only one profile name: letters, "
            "digits, _ . - (as `tuned-adm list` shows)"
        ],
    ),
    (
        "MIG layout the GPU cannot hold",
        _set(lambda f: H(f, 2)["gpus"][1], "mig", ["3g.40gb", "3g.40gb", "1g.10gb"]),
        [
            "fleet.hosts[2].gpus[1].mig: the layout needs 9 of 8 memory slices of a A100-80GB (`nvidia-smi mig -lgip` "
            "lists what fits)"
        ],
    ),
    (
        "MIG profile the GPU lacks",
        _set(lambda f: H(f, 2)["gpus"][1], "mig", ["7g.80gb", "7g.80gb"]),
        [
            "fleet.hosts[2].gpus[1].mig: 2 x 7g.80gb but at most 1 fit a A100-80GB (`nvidia-smi mig -lgip` lists what "
            "fits)",
            "fleet.hosts[2].gpus[1].mig: the layout needs 14 of 7 compute slices of a A100-80GB (`nvidia-smi mig -lgip` "
            "lists what fits)",
            "fleet.hosts[2].gpus[1].mig: the layout needs 16 of 8 memory slices of a A100-80GB (`nvidia-smi mig -lgip` "
            "lists what fits)",
        ],
    ),
    (
        "host-owned GPU in a VM",
        _set(lambda f: H(f)["gpus"][0], "passthrough", False),
        [
            "fleet.hosts[0].vms[0].gpus: 0000:4b:00.0 is declared passthrough: false (the host keeps it); a VM cannot "
            "have it (libvirt would detach it from the host driver at VM start); set passthrough: true or remove it "
            "from the VM"
        ],
    ),
    (
        "IPv6 written with a zone/garbage",
        _set(lambda f: H(f)["vms"][0], "address", "fd00::11%eth0;id"),
        [
            "fleet.hosts[0].vms[0].address: address 'fd00::11%eth0;id' is neither an IP address nor a DNS host name "
            "(letters, digits, '-' and '.')"
        ],
    ),
    (
        "VM image path with ..",
        _set(lambda f: H(f)["vms"][0], "image", "/var/lib/../../etc/shadow"),
        ["fleet.hosts[0].vms[0].image: image '/var/lib/../../etc/shadow' may not contain . or .. components"],
    ),
    (
        "service on a VM without address",
        lambda f: H(f)["vms"][0].pop("address"),
        [
            "fleet.services[0].vm: VM 'tenant-rt-a' has no address, so the service cannot reach it; set address on "
            "that VM"
        ],
    ),
    (
        "guest reached over SSH without a pin",
        lambda f: H(f)["vms"][0].pop("host_key"),
        [
            "fleet.hosts[0].vms[0].host_key: missing; gpuhost reaches VM 'tenant-rt-a' over SSH at 10.20.1.11: set its "
            "host key line (strict host keys), or insecure_accept_unknown_host_key on a throwaway dev host"
        ],
    ),
    (
        "fingerprint pin on a host Docker reaches",
        _set(lambda f: H(f, 5)["ssh"], "host_key", "SHA256:" + "A" * 43),
        [
            "fleet.hosts[5].ssh.host_key: Docker reaches this host over SSH (monitoring) and needs the key line "
            "('ssh-ed25519 AAAA...'), not its SHA256 fingerprint, to write known_hosts"
        ],
    ),
    (
        "NUL in a jump user",
        _set(lambda f: H(f)["ssh"]["jump"], "user", "ops\x00"),
        [
            "fleet.hosts[0].ssh.jump.user: value holds a control character (U+0000 NUL at character 3); config values are printable text on one line: remove them"
        ],
    ),
]


def S(f, i=0):
    return f["services"][i]


def G(f, i=0):
    return f["gateways"][i]


def _extra(*args):
    return lambda f: H(f).setdefault("kernel", {}).__setitem__("extra_args", list(args))


def _artifact(**kv):
    def mutate(f):
        a = S(f)["models"][0]["artifact"]
        if "path" in kv:
            a.pop("url")
        a.update(kv)

    return mutate


def _guest_of_trt_l40s_on_a10(f):
    """trt-a10-01's guests on trt-l40s-01's subnet, one of them with tenant-rt-a's address."""
    h = H(f, 1)
    h["vm_network"]["gateway"] = "10.20.1.1"
    for k, vm in enumerate(h["vms"]):
        vm["address"] = f"10.20.1.{21 + k}"
    h["vms"][2]["address"] = "10.20.1.11"


def _guest_on_host_address(f):
    H(f)["vm_network"]["gateway"] = "10.20.0.1"
    H(f)["vms"][0]["address"] = "10.20.0.13"
    H(f)["vms"][1]["address"] = "10.20.0.22"


# Issue 25 §3: the classes still open after round 1, each refused at load with one line per field.
BAD_ROUND2 = [
    (
        "bool for a count",
        lambda f: S(f)["acceptance"].__setitem__("concurrency", True),
        [
            "fleet.services[0].acceptance.concurrency: true is not a whole number (write e.g. 8, unquoted: true/false and quoted numbers are refused)"
        ],
    ),
    (
        "bool for a float",
        lambda f: S(f)["slo"].__setitem__("p95_ms", True),
        [
            "fleet.services[0].slo.p95_ms: true is not a number (write e.g. 2.5, unquoted: true/false and quoted numbers are refused)"
        ],
    ),
    (
        "NaN SLO",
        lambda f: S(f)["slo"].__setitem__("p99_ms", float("nan")),
        ["fleet.services[0].slo.p99_ms: nan is not a finite number (inf and NaN are refused: write a number)"],
    ),
    (
        "inf weight",
        lambda f: G(f)["backends"][0].__setitem__("weight", float("inf")),
        ["fleet.gateways[0].backends[0].weight: inf is not a finite number (inf and NaN are refused: write a number)"],
    ),
    (
        "-inf ramp",
        lambda f: G(f).__setitem__("ramp_s", float("-inf")),
        ["fleet.gateways[0].ramp_s: -inf is not a finite number (inf and NaN are refused: write a number)"],
    ),
    (
        "quoted number",
        lambda f: H(f)["vms"][0].__setitem__("vcpus", "16"),
        [
            "fleet.hosts[0].vms[0].vcpus: '16' is not a whole number (write e.g. 8, unquoted: true/false and quoted numbers are refused)"
        ],
    ),
    (
        "fraction for a count",
        lambda f: H(f)["vms"][0].__setitem__("iothreads", 2.5),
        [
            "fleet.hosts[0].vms[0].iothreads: 2.5 is not a whole number (write e.g. 8, unquoted: true/false and quoted numbers are refused)"
        ],
    ),
    (
        "batch size unbounded",
        lambda f: S(f)["models"][0].__setitem__("max_batch_size", 10**9),
        ["fleet.services[0].models[0].max_batch_size: 1000000000 is out of range (use a value at most 4096)"],
    ),
    (
        "batching window unbounded",
        lambda f: S(f).__setitem__("adaptive_window", {"max_us": 10**12}),
        ["fleet.services[0].adaptive_window.max_us: 1000000000000 is out of range (use a value at most 60000000)"],
    ),
    (
        "idle time unbounded",
        lambda f: G(f).__setitem__("claim_idle_ms", 10**15),
        ["fleet.gateways[0].claim_idle_ms: 1000000000000000 is out of range (use a value at most 86400000)"],
    ),
    (
        "topology unbounded",
        lambda f: H(f)["topology"].__setitem__("cores_per_socket", 10**6),
        ["fleet.hosts[0].topology.cores_per_socket: 1000000 is out of range (use a value at most 1024)"],
    ),
    (
        "CPU range of billions",
        lambda f: H(f).__setitem__("reserved_cpus", "0-4000000000"),
        [
            "fleet.hosts[0].reserved_cpus: CPU 4000000000 in CPU list '0-4000000000' is beyond the largest CPU number 8191 (write CPU numbers 0-8191, e.g. \"0-1,32-33\")"
        ],
    ),
    (
        "CPU list, non-ASCII digit",
        lambda f: H(f).__setitem__("reserved_cpus", "0-1,\u0663"),
        [
            "fleet.hosts[0].reserved_cpus: bad CPU number '٣' in CPU list '0-1,٣' (write CPU numbers 0-8191, e.g. \"0-1,32-33\")"
        ],
    ),
    (
        "CPU list with a bool",
        lambda f: H(f).__setitem__("reserved_cpus", [0, True]),
        ['fleet.hosts[0].reserved_cpus: CPU numbers are whole numbers 0-8191 (e.g. "0-1,32-33"), not [True]'],
    ),
    (
        "host name with a trailing newline",
        lambda f: H(f, 5).__setitem__("name", "mon-01\n"),
        [
            "fleet.hosts[5].name: value holds a control character (U+000A line break at character 6); config values are printable text on one line: remove them"
        ],
    ),
    (
        "VM name with a trailing newline",
        lambda f: H(f, 1)["vms"][3].__setitem__("name", "tenant-b-4\n"),
        [
            "fleet.hosts[1].vms[3].name: value holds a control character (U+000A line break at character 10); config values are printable text on one line: remove them"
        ],
    ),
    (
        "bridge with a trailing newline",
        lambda f: H(f)["vm_network"].__setitem__("bridge", "br0\n"),
        [
            "fleet.hosts[0].vm_network.bridge: value holds a control character (U+000A line break at character 3); config values are printable text on one line: remove them"
        ],
    ),
    (
        "sha256 with a trailing newline",
        lambda f: S(f)["models"][0]["artifact"].__setitem__("sha256", "3f1c" * 16 + "\n"),
        [
            "fleet.services[0].models[0].artifact.sha256: value holds a control character (U+000A line break at character 64); config values are printable text on one line: remove them"
        ],
    ),
    (
        "extra arg overrides hugepages",
        _extra("hugepages=8"),
        [
            "fleet.hosts[0].kernel.extra_args[0]: 'hugepages=8' sets hugepages, which gpuhost sets itself from hugepages.count; set it through that field, or add 'hugepages' to kernel.overrides_acknowledged to replace gpuhost's value"
        ],
    ),
    (
        "extra arg overrides intel_iommu (dash spelling)",
        _extra("intel-iommu=off"),
        [
            "fleet.hosts[0].kernel.extra_args[0]: 'intel-iommu=off' sets intel_iommu, which gpuhost sets itself from cpu_vendor; set it through that field, or add 'intel_iommu' to kernel.overrides_acknowledged to replace gpuhost's value"
        ],
    ),
    (
        "extra arg overrides vfio-pci.ids",
        _extra("vfio-pci.ids=10de:2684"),
        [
            "fleet.hosts[0].kernel.extra_args[0]: 'vfio-pci.ids=10de:2684' sets vfio_pci.ids, which gpuhost sets itself from gpus[] and bind; set it through that field, or add 'vfio_pci.ids' to kernel.overrides_acknowledged to replace gpuhost's value"
        ],
    ),
    (
        "extra arg overrides isolation",
        _extra("rcu_nocbs=2-31"),
        [
            "fleet.hosts[0].kernel.extra_args[0]: 'rcu_nocbs=2-31' sets rcu_nocbs, which gpuhost sets itself from kernel.isolate_vm_cpus and reserved_cpus; set it through that field, or add 'rcu_nocbs' to kernel.overrides_acknowledged to replace gpuhost's value"
        ],
    ),
    (
        "extra arg overrides iommu.passthrough",
        _extra("iommu.passthrough=0"),
        [
            "fleet.hosts[0].kernel.extra_args[0]: 'iommu.passthrough=0' sets iommu.passthrough, which gpuhost sets itself from kernel.iommu_passthrough; set it through that field, or add 'iommu.passthrough' to kernel.overrides_acknowledged to replace gpuhost's value"
        ],
    ),
    (
        "remove_args drops what gpuhost adds",
        lambda f: H(f).setdefault("kernel", {}).__setitem__("remove_args", ["intel_iommu", "hugepages"]),
        [
            "fleet.hosts[0].kernel.remove_args[0]: 'intel_iommu' removes intel_iommu, which gpuhost adds on this host from cpu_vendor; change that field instead of removing the argument",
            "fleet.hosts[0].kernel.remove_args[1]: 'hugepages' removes hugepages, which gpuhost adds on this host from hugepages.count; change that field instead of removing the argument",
        ],
    ),
    (
        "acknowledgement of nothing",
        lambda f: H(f).__setitem__("kernel", {"overrides_acknowledged": ["quiet", "hugepages"]}),
        [
            "fleet.hosts[0].kernel.overrides_acknowledged[0]: gpuhost does not set quiet, so there is nothing to acknowledge; remove it",
            "fleet.hosts[0].kernel.overrides_acknowledged[1]: no kernel.extra_args entry sets hugepages; remove it, or add the argument it acknowledges",
        ],
    ),
    (
        "noiommu without acknowledgement",
        _extra("vfio.enable-unsafe-noiommu-mode=1"),
        [
            "fleet.hosts[0].kernel.extra_args[0]: 'vfio.enable-unsafe-noiommu-mode=1' (vfio.enable_unsafe_noiommu_mode) weakens isolation between devices and VMs (seeds: last resort only); set allow_unsafe_interrupts_acknowledged: true on the host to use it"
        ],
    ),
    (
        "gateway front on sshd's port",
        lambda f: G(f).__setitem__("front_port", 22),
        [
            "fleet.gateways[0].front_port: port 22 on a100-mig-01 is also sshd (fleet.hosts[2].ssh.port); one port has one listener on a machine: choose another port"
        ],
    ),
    (
        "Prometheus on node-exporter's port",
        lambda f: f["monitoring"].__setitem__("prometheus_port", 9100),
        [
            "fleet.monitoring.prometheus_port: port 9100 on mon-01 is also node-exporter (fleet.monitoring); one port has one listener on a machine: choose another port"
        ],
    ),
    (
        "gateway worker metrics on dcgm-exporter's port",
        lambda f: G(f).__setitem__("metrics_port", 9399),
        [
            "fleet.gateways[0].metrics_port: port 9400 on a100-mig-01 is also dcgm-exporter (fleet.monitoring); one port has one listener on a machine: choose another port"
        ],
    ),
    (
        "adaptive-window controller on Triton's port",
        lambda f: S(f).__setitem__("adaptive_window", {"listen": "0.0.0.0:8002"}),
        [
            "fleet.services[0].adaptive_window.listen: port 8002 on trt-l40s-01/tenant-rt-a is also Triton's metrics port (fleet.services[0]); one port has one listener on a machine: choose another port"
        ],
    ),
    (
        "nginx on the guest's sshd port",
        lambda f: S(f).__setitem__("nginx_port", 22),
        [
            "fleet.services[0].nginx_port: port 22 on trt-l40s-01/tenant-rt-a is also the guest's sshd (fleet.hosts[0].vms[0]); one port has one listener on a machine: choose another port"
        ],
    ),
    (
        "VM outside its subnet",
        lambda f: H(f)["vms"][0].__setitem__("address", "10.20.9.11"),
        [
            "fleet.hosts[0].vms[0].address: 10.20.9.11 is outside the VM subnet 10.20.1.0/24 (with the gateway 10.20.1.1); use an address inside it, or fix vm_network.prefix_length"
        ],
    ),
    (
        "VM address of another host's guest",
        _guest_of_trt_l40s_on_a10,
        [
            "fleet.hosts[1].vms[2].address: 10.20.1.11 is 'trt-l40s-01/tenant-rt-a' already (each guest needs its own address)"
        ],
    ),
    (
        "VM address of a host",
        _guest_on_host_address,
        ["fleet.hosts[0].vms[0].address: 10.20.0.13 is 'a100-mig-01' already (each guest needs its own address)"],
    ),
    (
        "VM address of a jump host",
        lambda f: (
            H(f)["vm_network"].__setitem__("gateway", "10.20.0.1"),
            H(f)["vms"][0].__setitem__("address", "10.20.0.2"),
            H(f)["vms"][1].__setitem__("address", "10.20.0.22"),
        ),
        [
            "fleet.hosts[0].vms[0].address: 10.20.0.2 is 'the jump host of trt-l40s-01' already (each guest needs its own address)"
        ],
    ),
    (
        "VM on the gateway's address",
        lambda f: H(f)["vms"][0].__setitem__("address", "10.20.1.1"),
        ["fleet.hosts[0].vms[0].address: 10.20.1.1 is the gateway of vm_network; give the guest its own address"],
    ),
    (
        "DNS server with a zone",
        lambda f: H(f)["vm_network"].__setitem__("dns", ["fe80::1%eth0"]),
        [
            "fleet.hosts[0].vm_network.dns: address 'fe80::1%eth0' is not an IP address (e.g. 10.20.1.1 or fd00::1, without a %zone)"
        ],
    ),
    (
        "gateway with a zone",
        lambda f: H(f)["vm_network"].__setitem__("gateway", "10.20.1.1%eth0"),
        [
            "fleet.hosts[0].vm_network.gateway: address '10.20.1.1%eth0' is not an IP address (e.g. 10.20.1.1 or fd00::1, without a %zone)"
        ],
    ),
    (
        "2M pages without topology",
        lambda f: H(f, 5).__setitem__("hugepages", {"size": "2M", "per_node": {"0": 1000}}),
        [
            "fleet.hosts[5].hugepages.per_node: pages on node(s) [0] on a host without topology, so gpuhost cannot check that the host holds them; declare topology (sockets, cores_per_socket, threads_per_core, memory_gib_per_node) on this host"
        ],
    ),
    (
        "1G pages without topology",
        lambda f: H(f, 5).__setitem__("hugepages", {"size": "1G", "count": 64}),
        [
            "fleet.hosts[5].hugepages.count: 64 pages on a host without topology, so gpuhost cannot check that the host holds them; declare topology (sockets, cores_per_socket, threads_per_core, memory_gib_per_node) on this host"
        ],
    ),
    (
        "per-node pages on a missing node",
        lambda f: H(f, 3)["hugepages"]["per_node"].__setitem__("3", 10),
        ["fleet.hosts[3].hugepages.per_node: node 3 but the topology has 1 nodes (0-0)"],
    ),
    (
        "per-node key not a number",
        lambda f: H(f, 3)["hugepages"]["per_node"].__setitem__("0x1", 10),
        ["fleet.hosts[3].hugepages.per_node.0x1: NUMA node '0x1' is not a node number (write 0, 1, ... below 64)"],
    ),
    (
        "SR-IOV PF on a missing node",
        lambda f: H(f, 4)["sriov"][0].__setitem__("numa_node", 5),
        ["fleet.hosts[4].sriov[0].numa_node: 5 but the topology has 2 nodes (0-1)"],
    ),
    (
        "GPU twice, short upper-case spelling",
        lambda f: H(f)["gpus"].append({"address": "4B:00.0", "model": "L40S"}),
        [
            "fleet.hosts[0].gpus[2].address: 0000:4b:00.0 is gpus[0] already (one PCI device, one entry); remove one of them"
        ],
    ),
    (
        "GPU twice, no domain",
        lambda f: H(f, 1)["gpus"].append({"address": "b1:00.0", "model": "A10"}),
        [
            "fleet.hosts[1].gpus[4].address: 0000:b1:00.0 is gpus[2] already (one PCI device, one entry); remove one of them"
        ],
    ),
    (
        "service on a host whose GPUs are all vfio",
        lambda f: S(f, 1).pop("vm"),
        [
            "fleet.services[1].host: all of host trt-a10-01's GPUs are bound to vfio for VMs (passthrough: true), so Triton on the host has none to use; run the service in a VM that has a GPU (vm:), or keep a GPU on the host (passthrough: false)"
        ],
    ),
    (
        "service on a host without GPUs",
        lambda f: (S(f, 1).__setitem__("host", "mon-01"), S(f, 1).pop("vm")),
        [
            "fleet.services[1].host: host mon-01 declares no GPU, so Triton on the host has none to use; run the service in a VM that has a GPU (vm:), or keep a GPU on the host (passthrough: false)"
        ],
    ),
    (
        "service in a VM without GPUs",
        lambda f: H(f, 1)["vms"][0].__setitem__("gpus", []),
        [
            "fleet.services[1].vm: VM 'tenant-b-1' has no GPU (its gpus is empty), so Triton there has none to use; give the VM a GPU of the host, or run the service where one is"
        ],
    ),
    (
        "service NUMA node a guest lacks",
        lambda f: S(f).__setitem__("numa_node", 1),
        ["fleet.services[0].numa_node: 1 but a guest sees one NUMA node (0); drop numa_node or set 0"],
    ),
    (
        "artifact URL with user:password",
        _artifact(url="https://bob:hunter2@models.hk.internal/yolov8n.onnx"),
        [
            "fleet.services[0].models[0].artifact.url: url holds credentials (user:password@), which belong in secret config (`pulumi config set --secret ...`), not in the URL"
        ],
    ),
    (
        "artifact URL with a presigned signature",
        _artifact(url="https://models.hk.internal/y.onnx?X-Amz-Signature=abc&X-Amz-Credential=AKIA"),
        [
            "fleet.services[0].models[0].artifact.url: url carries a credential (X-Amz-Credential, X-Amz-Signature), which belongs in secret config (`pulumi config set --secret ...`), not in the URL"
        ],
    ),
    (
        "artifact URL with a token",
        _artifact(url="https://models.hk.internal/y.onnx?v=3&access_token=abc"),
        [
            "fleet.services[0].models[0].artifact.url: url carries a credential (access_token), which belongs in secret config (`pulumi config set --secret ...`), not in the URL"
        ],
    ),
    (
        "artifact URL with a token in its fragment",
        _artifact(url="https://models.hk.internal/y.onnx#access_token=abc"),
        [
            "fleet.services[0].models[0].artifact.url: url carries a credential (access_token), which belongs in secret config (`pulumi config set --secret ...`), not in the URL"
        ],
    ),
    (
        "GPU that is an SR-IOV PF too",
        lambda f: H(f, 4)["sriov"][0].__setitem__("pf", "65:00.1"),
        [
            "fleet.hosts[4].sriov[0].pf: 0000:65:00.1 is a function of gpus[0] already (one PCI device, one entry); remove one of them"
        ],
    ),
    (
        "artifact URL port out of range",
        _artifact(url="https://models.hk.internal:99999/y.onnx"),
        [
            "fleet.services[0].models[0].artifact.url: url 'https://models.hk.internal:99999/y.onnx': the port is not a TCP port (use 1-65535)"
        ],
    ),
    (
        "artifact URL host invalid",
        _artifact(url="https://-models-/y.onnx"),
        [
            "fleet.services[0].models[0].artifact.url: url 'https://-models-/y.onnx': '-models-' is neither an IP address nor a DNS host name"
        ],
    ),
    (
        "artifact path with ..",
        _artifact(path="/srv/models/../../etc/shadow"),
        [
            "fleet.services[0].models[0].artifact.path: path '/srv/models/../../etc/shadow' may not contain . or .. components"
        ],
    ),
    (
        "artifact path relative",
        _artifact(path="models/y.onnx"),
        [
            "fleet.services[0].models[0].artifact.path: path 'models/y.onnx' may hold only an absolute path of letters, digits, _ . + - and /"
        ],
    ),
    (
        "artifact path with NUL",
        _artifact(path="/srv/y.onnx\x00"),
        [
            "fleet.services[0].models[0].artifact.path: value holds a control character (U+0000 NUL at character 11); config values are printable text on one line: remove them"
        ],
    ),
    (
        "jump host key invalid",
        lambda f: H(f)["ssh"]["jump"].__setitem__("host_key", "ssh-ed25519 not-base64!!"),
        [
            "fleet.hosts[0].ssh.jump.host_key: host_key's key data is not base64: Only base64 data is allowed (pin the key line `ssh-keyscan -t ed25519 HOST` prints, 'ssh-ed25519 AAAA...', or its 'SHA256:...' fingerprint)"
        ],
    ),
    (
        "TensorRT model on a MIG host",
        lambda f: S(f, 2)["models"].append(
            {
                "name": "r50",
                "preset": "resnet50_fp16",
                "artifact": {"url": "https://m.hk.internal/r.onnx", "sha256": "a" * 64},
            }
        ),
        [
            "fleet.services[2].models[1].preset: resnet50_fp16 builds a TensorRT engine, and the build runs on a whole GPU (docker --gpus device=0), not on this service's MIG device; on a MIG host use a python-backend preset (yolov8n_torch, sdxl), or serve the model from a VM"
        ],
    ),
    (
        "MIG service on the process runtime",
        lambda f: S(f, 2).__setitem__("runtime", "process"),
        [
            "fleet.services[2].runtime: process runs Triton without a device binding, but on a MIG host the service is bound to one MIG device (it would see every GPU); use runtime: docker"
        ],
    ),
    (
        "bool for a NUMA node",
        lambda f: H(f)["gpus"][0].__setitem__("numa_node", False),
        [
            "fleet.hosts[0].gpus[0].numa_node: false is not a whole number (write e.g. 8, unquoted: true/false and quoted numbers are refused)"
        ],
    ),
]


def _run(mutate):
    cfg, secret = stack_config("hk-prod")
    fleet = json.loads(cfg["gpuhost:fleet"])
    mutate(fleet)
    cfg["gpuhost:fleet"] = json.dumps(fleet)
    return attempt_program(cfg, secret, stack="hk-prod")


@pytest.mark.parametrize("what, mutate, lines", BAD, ids=[b[0] for b in BAD])
def test_bad_input_refused_before_any_resource(what, mutate, lines):
    rec, err = _run(mutate)
    assert isinstance(err, ConfigError), f"{what}: {err!r}"
    assert err.lines == lines
    assert len(rec.registrations) == 0


def test_field_and_cross_field_errors_come_together():
    """A bad field elsewhere does not hide a VM that cannot fit, nor a port out of range."""

    def mutate(f):
        H(f)["vms"][0]["guest_user"] = "a b"
        H(f)["vms"][1]["vcpus"] = 40
        f["services"][1]["nginx_port"] = 0

    rec, err = _run(mutate)
    assert isinstance(err, ConfigError)
    assert sorted(err.lines) == sorted(
        [
            "fleet.hosts[0].vms[0].guest_user: user name 'a b' may hold only a POSIX login name: lower-case letters, "
            "digits, _ and -, starting with a letter or _ (at most 32)",
            "fleet.services[1].nginx_port: 0 is not a TCP port (use 1-65535)",
            "fleet.hosts[0].vms[1].vcpus: 40 vCPUs do not fit on node 1 of trt-l40s-01: 32 CPUs per node, about 2 "
            "reserved for the host, so at most 30",
        ]
    )
    assert len(rec.registrations) == 0


def test_ipv6_guest_is_bracketed_in_urls_and_scrape_targets():
    def mutate(f):
        H(f)["vm_network"] = {"bridge": "br0", "prefix_length": 64, "gateway": "fd00::1", "dns": ["fd00::53"]}
        H(f)["vms"][0]["address"] = "FD00:0::11"
        H(f)["vms"][1]["address"] = "fd00::12"

    rec, err = _run(mutate)
    assert err is None
    assert rec.exports["endpoints"]["yolo-rt"] == "http://[fd00::11]:80"
    gate = rec.by_name("yolo-rt-yolov8n-gate")
    assert gate.inputs["url"] == "http://[fd00::11]:80"
    prom = [r for r in rec.registrations if "prometheus.yml" in json.dumps(r.inputs, default=str)]
    assert prom and "[fd00::11]:9100" in json.dumps(prom[0].inputs, default=str)
    assert "fd00::11:9100" not in json.dumps(prom[0].inputs, default=str).replace("[fd00::11]:9100", "")


def test_good_stacks_still_load():
    for stack in ("hk-prod", "dev"):
        cfg, secret = stack_config(stack)
        rec, err = attempt_program(cfg, secret, stack=stack)
        assert err is None and len(rec.registrations) >= 10


@pytest.mark.parametrize("what, mutate, lines", BAD_ROUND2, ids=[b[0] for b in BAD_ROUND2])
def test_round2_bad_input_refused_before_any_resource(what, mutate, lines):
    rec, err = _run(mutate)
    assert isinstance(err, ConfigError), f"{what}: {err!r}"
    assert err.lines == lines
    assert len(rec.registrations) == 0


def test_acknowledged_override_and_unsafe_mode_load():
    """The explicit fields let a stack do what the refusals stop: its hugepages= replaces gpuhost's, noiommu with
    the unsafe-interrupts acknowledgement."""

    def mutate(f):
        H(f)["kernel"] = {
            "extra_args": ["hugepages=8", "vfio.enable_unsafe_noiommu_mode=1"],
            "overrides_acknowledged": ["hugepages"],
        }
        H(f)["allow_unsafe_interrupts_acknowledged"] = True

    rec, err = _run(mutate)
    assert err is None
    add = [r for r in rec.registrations if r.type.endswith("KernelCmdline") and "trt-l40s-01" in r.name][0]
    assert "hugepages=8" in add.inputs["add"] and "hugepages=384" not in add.inputs["add"]


def test_a_gpu_spelled_two_ways_in_two_vms_is_one_gpu():
    """The second VM names tenant-rt-a's GPU as 4B:00.0: one device, so it is refused as already given."""
    rec, err = _run(lambda f: H(f)["vms"][1].__setitem__("gpus", ["4B:00.0"]))
    assert isinstance(err, ConfigError)
    assert "fleet.hosts[0].vms[1].gpus: 0000:4b:00.0 is already given to VM 'tenant-rt-a'" in err.lines[0]
    assert len(rec.registrations) == 0


# -- round 3 (issue 38 §4): pins, control characters, nesting ------------------------------------------------------
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL/kSwgf9qVUgtkwpJuQBIIevT94BAXy29qU5XlIfwG3"
FP = "SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s"
PIN_LINE = (
    "a pin is one line: the key `ssh-keyscan -t ed25519 HOST` prints ('ssh-ed25519 AAAA...') or its 'SHA256:...' "
    "fingerprint"
)
ONE_LINE = "config values are printable text on one line: remove them"


def _nested(depth: int) -> Any:
    v: Any = "x"
    for _ in range(depth):
        v = {"a": v}
    return v


def _chars(path: str, found: str, fix: str = ONE_LINE, what: str = "value") -> list[str]:
    return [f"{path}: {what} holds {found}; {fix}"]


BAD_ROUND3 = [
    (
        "jump host pinned by fingerprint, Docker through it",
        lambda f: H(f)["ssh"]["jump"].__setitem__("host_key", FP),
        [
            "fleet.hosts[0].ssh.jump.host_key: Docker reaches this host through its jump host over SSH (monitoring) "
            "and needs the jump host's key line ('ssh-ed25519 AAAA...'), not its SHA256 fingerprint, to write "
            "known_hosts"
        ],
    ),
    (
        "jump host key with a second known_hosts line",
        lambda f: H(f)["ssh"]["jump"].__setitem__("host_key", f"{KEY}\n@cert-authority * {KEY}"),
        _chars("fleet.hosts[0].ssh.jump.host_key", "a control character (U+000A line break at character 80)", PIN_LINE),
    ),
    (
        "host key with a carriage return and a second line",
        lambda f: H(f, 2)["ssh"].__setitem__("host_key", f"{KEY}\r\n@revoked * {KEY}"),
        _chars(
            "fleet.hosts[2].ssh.host_key",
            "control characters (U+000D carriage return at character 80, U+000A line break at character 81)",
            PIN_LINE,
        ),
    ),
    (
        "guest key with a vertical tab",
        lambda f: H(f)["vms"][0].__setitem__("host_key", KEY.replace(" ", "\x0b")),
        _chars("fleet.hosts[0].vms[0].host_key", "a control character (U+000B at character 11)", PIN_LINE),
    ),
    (
        "jump host fingerprint of the wrong length",
        lambda f: H(f)["ssh"]["jump"].__setitem__("host_key", FP + "="),
        [
            "fleet.hosts[0].ssh.jump.host_key: a SHA256 fingerprint is 'SHA256:' and 43 base64 characters, no "
            "padding, as `ssh-keygen -lf` prints it (pin the key line `ssh-keyscan -t ed25519 HOST` prints, "
            "'ssh-ed25519 AAAA...', or its 'SHA256:...' fingerprint)"
        ],
    ),
    (
        "artifact URL with ESC and DEL",
        _artifact(url="https://models.hk.internal/y\x1b[31m.onnx\x7f"),
        _chars(
            "fleet.services[0].models[0].artifact.url",
            "control characters (U+001B ESC at character 28, U+007F DEL at character 38)",
            "percent-encode them (e.g. %1B)",
        ),
    ),
    (
        "C1 next-line in a GPU model",
        lambda f: H(f)["gpus"][0].__setitem__("model", "L40S\x85"),
        _chars("fleet.hosts[0].gpus[0].model", "a control character (U+0085 at character 4)"),
    ),
    (
        "bidi override in a service name",
        lambda f: S(f).__setitem__("name", "yolo\u202ert"),
        _chars("fleet.services[0].name", "a control character (U+202E bidi control at character 4)"),
    ),
    (
        "line separator in a guest user",
        lambda f: H(f)["vms"][0].__setitem__("guest_user", "ops\u2028root"),
        _chars("fleet.hosts[0].vms[0].guest_user", "a control character (U+2028 line separator at character 3)"),
    ),
    (
        "tab in a sysctl value",
        lambda f: H(f)["tuning"]["sysctls"].__setitem__("net.core.somaxconn", "4096\t1"),
        _chars("fleet.hosts[0].tuning.sysctls.net.core.somaxconn", "a control character (U+0009 tab at character 4)"),
    ),
    (
        "ESC in an unknown key",
        lambda f: H(f)["ssh"].__setitem__("x\x1b]8;;", "y"),
        _chars("fleet.hosts[0].ssh", "a control character (U+001B ESC at character 1)", what='key "x\\u001b]8;;"'),
    ),
    (
        "a bad value and a control character elsewhere, each its own line",
        lambda f: (H(f)["vms"][0].__setitem__("guest_user", "a b"), H(f, 1)["ssh"].__setitem__("user", "ops\x07")),
        [
            "fleet.hosts[1].ssh.user: value holds a control character (U+0007 at character 3); " + ONE_LINE,
            "fleet.hosts[0].vms[0].guest_user: user name 'a b' may hold only a POSIX login name: lower-case letters, "
            "digits, _ and -, starting with a letter or _ (at most 32)",
        ],
    ),
    (
        "nested 30 deep",
        lambda f: H(f).__setitem__("labels", _nested(30)),
        [
            "gpuhost:fleet: nested more than 20 levels deep (at fleet.hosts[0].labels.a.a.a...); a stack config is "
            "a few levels deep (hosts[].vms[].gpus[]): remove the extra nesting"
        ],
    ),
]


@pytest.mark.parametrize("what, mutate, lines", BAD_ROUND3, ids=[b[0] for b in BAD_ROUND3])
def test_round3_bad_input_refused_before_any_resource(what, mutate, lines):
    rec, err = _run(mutate)
    assert isinstance(err, ConfigError), f"{what}: {err!r}"
    assert err.lines == lines
    assert len(rec.registrations) == 0


@pytest.mark.parametrize("depth", [1000, 5000, 100_000])
def test_config_nested_thousands_deep_is_one_line_not_a_recursion_error(depth):
    cfg, secret = stack_config("hk-prod")
    fleet = json.loads(cfg["gpuhost:fleet"])
    H(fleet)["labels"] = "@deep@"
    cfg["gpuhost:fleet"] = json.dumps(fleet).replace('"@deep@"', "[" * depth + "]" * depth)
    rec, err = attempt_program(cfg, secret, stack="hk-prod")
    assert isinstance(err, ConfigError), repr(err)[:300]
    assert err.lines == [
        "gpuhost:fleet: nested more than 20 levels deep"
        + (" (at fleet.hosts[0].labels[0][0][0][0]...)" if depth < 990 else "")
        + "; a stack config is a few levels deep (hosts[].vms[].gpus[]): remove the extra nesting"
    ]
    assert len(rec.registrations) == 0


def test_good_stacks_pinned_by_fingerprint_where_docker_does_not_reach_still_load():
    """A fingerprint stays a good pin for a jump host Docker does not go through: without monitoring, Docker reaches
    only trt-l40s-01's guests, through the host itself as their jump."""

    def mutate(f):
        f.pop("monitoring")
        H(f)["ssh"]["jump"]["host_key"] = FP

    rec, err = _run(mutate)
    assert err is None, err
    assert len(rec.registrations) > 10
