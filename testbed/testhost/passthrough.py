"""PassthroughHost on the emulated GPU server: the values tests and benchmarks give it, and what they compare.

* ``host_config(th)``: a one-host stack's ``Host`` for a started ``TestHost`` (its GPU and audio function, NUMA
  node 1, 2M hugepages, tuning, nvme IRQ pinning);
* ``host_flow(srv, h)``: PassthroughHost's own children driven through the provider server;
* ``WATCHED`` / ``snapshot(th)``: the files it writes, as sha256, mode and owner (or absence), in one round trip;
* ``runtime(th)``: what the running host shows (kernel command line, the two functions' drivers, hugepages on
  node 1, boot id, a sysctl).

Usage::

    h = host_config(th, reserved_cpus="0-3")
    before = snapshot(th)
"""

from __future__ import annotations

from components import passthrough_host
from stacks.args import passthrough_args
from stacks.schema import Host
from testbed.provider_server import ChildFlow, ProviderServer

GPU = "0000:81:00.0"
AUDIO = "0000:81:00.1"
WATCHED = [
    "/etc/default/grub",
    "/boot/grub/grub.cfg",
    "/etc/modules-load.d/gpuhost-vfio.conf",
    "/etc/modprobe.d/gpuhost-vfio.conf",
    "/etc/modprobe.d/gpuhost-blacklist-nouveau.conf",
    "/etc/default/irqbalance",
    "/etc/sysctl.d/99-gpuhost.conf",
    "/etc/systemd/system/gpuhost-hugepages.service",
    "/etc/systemd/system/multi-user.target.wants/gpuhost-hugepages.service",
    f"/etc/driverctl.d/pci-{GPU}",
    f"/etc/driverctl.d/pci-{AUDIO}",
]


def hostname(th) -> str:
    return th.name.replace("_", "-").lower()


def host_config(th, **over) -> Host:
    cfg = {
        "name": hostname(th),
        "ssh": {
            "address": th.address,
            "port": th.port,
            "user": th.user,
            "host_key": th.host_key_line,
            "key_name": "sshPrivateKey",
        },
        "topology": {
            "sockets": 2,
            "cores_per_socket": 2,
            "threads_per_core": 2,
            "memory_gib_per_node": 2,
            "numbering": "sequential",
        },
        "reserved_cpus": "0-1",
        "gpus": [{"address": GPU, "numa_node": 1, "functions": [0, 1]}],
        "hugepages": {"size": "2M", "per_node": {1: 64}},
        "tuning": {
            "tuned_profile": "latency-performance",
            "governor": "performance",
            "sysctls": {"net.core.somaxconn": "4096", "net.ipv4.tcp_fin_timeout": "10"},
        },
        "irq_pin": ["nvme"],
    }
    cfg.update(over)
    return Host.model_validate(cfg)


def host_flow(srv: ProviderServer, h: Host) -> ChildFlow:
    """PassthroughHost's own children (components.passthrough_host.children) driven through the provider server."""
    return ChildFlow(srv, h.name, passthrough_host.children(h.name, passthrough_args(h)))


def snapshot(th) -> dict:
    """sha256, mode and owner of every watched file (or absence), in one round trip."""
    out = th.ssh(
        "for f in " + " ".join(WATCHED) + "; do if [ -e $f ]; then echo \"$f $(stat -c '%a %u %g' $f) "
        '$(sha256sum < $f | cut -c1-64)"; else echo "$f absent"; fi; done'
    ).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def runtime(th) -> dict:
    out = th.ssh(
        f"cat /proc/cmdline; basename $(readlink /sys/bus/pci/devices/{GPU}/driver 2>/dev/null) 2>/dev/null "
        f"|| echo none; basename $(readlink /sys/bus/pci/devices/{AUDIO}/driver 2>/dev/null) 2>/dev/null "
        "|| echo none; cat /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages; "
        "cat /proc/sys/kernel/random/boot_id; sysctl -n net.core.somaxconn"
    ).stdout.splitlines()
    return {
        "cmdline": out[0].split(),
        "gpu": out[1],
        "audio": out[2],
        "hugepages1": int(out[3]),
        "boot_id": out[4],
        "somaxconn": out[5],
    }
