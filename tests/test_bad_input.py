"""Every class of bad input is refused by the stack loader with one exact line per field, and 0 resources registered.

The whole program runs under Pulumi mocks (no engine here) on the hk-prod fleet with one thing broken; the recording
monitor counts what the engine would have been asked to create before the error. `BAD` is the table of the closing
note: class → the error line the user sees → resources registered (always 0).
"""

from __future__ import annotations

import json

import pytest

from stacks.load import ConfigError
from tests.mocks import attempt_program
from tests.stackfiles import stack_config


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
            "/etc/gpuhost/gateway/redis.conf, /etc/systemd/system/gpuhost-gateway-worker-0.service and 9 more on "
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
            "fleet.services[0].nginx_port: 8001 is one of Triton's own ports [8000, 8001, 8002] on the same machine; "
            "use 80 or another free port"
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
        ["fleet.hosts[0].tuning.sysctls: sysctl name 'net.core.x\\nfoo' holds a NUL or line break"],
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
        ["fleet.hosts[0].ssh.jump.user: user name 'ops\\x00' holds a NUL or line break"],
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
        H(f)["vms"][0]["address"] = "FD00:0::11"

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
