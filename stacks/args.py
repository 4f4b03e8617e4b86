"""Stack config → component args: what a `stacks.schema` host means for each component (no resource here).

Usage::

    PassthroughHost(h.name, passthrough_args(h, reboot_after=[...]))
    spec = host_spec(h)                         # how gpuhost reaches the host (SSH)
"""

from __future__ import annotations

from typing import Any

from access.ssh import HostSpec, JumpHost
from components.passthrough_host import PassthroughHostArgs
from facts.cpulist import format_cpulist
from plans.values import param_name
from stacks.schema import Host


def same_fields(src: Any, *names: str) -> dict[str, Any]:
    """The named fields of a config model, as keyword arguments of a spec whose fields have the same names."""
    return {n: getattr(src, n) for n in names}


def host_spec(h: Host) -> HostSpec:
    j = h.ssh.jump
    return HostSpec(
        name=h.name,
        **same_fields(
            h.ssh,
            "address",
            "port",
            "user",
            "host_key",
            "insecure_accept_unknown_host_key",
            "key_name",
            "connect_timeout",
        ),
        jump=JumpHost(address=j.address, port=j.port, user=j.user, host_key=j.host_key) if j else None,
    )


def all_cpus(h: Host) -> list[int]:
    t = h.topology
    return list(range(t.sockets * t.cores_per_socket * t.threads_per_core)) if t else []


def vm_cpus(h: Host) -> list[int]:
    """CPUs given to VMs: everything but the host reserve (the reserve keeps IRQs, emulator threads, sshd)."""
    return [c for c in all_cpus(h) if c not in set(h.reserved_cpus)]


def cmdline_args(h: Host) -> list[str]:
    """The kernel arguments this host needs (seed 000 §3.2, 001 §5.1, 002 §3/§6/§13)."""
    k = h.kernel
    args = ["amd_iommu=on" if h.cpu_vendor == "amd" else "intel_iommu=on"]
    if k.iommu_passthrough:
        args.append("iommu=pt")
    if k.kvm_ignore_msrs:
        args.append("kvm.ignore_msrs=1")
    if k.video_efifb_off:
        args.append("video=efifb:off")
    if h.hugepages.size == "1G" and h.hugepages.count:
        args += ["default_hugepagesz=1G", "hugepagesz=1G", f"hugepages={h.hugepages.count}"]
    if k.isolate_vm_cpus and vm_cpus(h):
        cl = format_cpulist(vm_cpus(h))
        args += [f"isolcpus={cl}", f"nohz_full={cl}"]
    # An acknowledged override (kernel.overrides_acknowledged) replaces gpuhost's own value: one word per
    # parameter, so the running command line can match what is asked for.
    extra = {param_name(a) for a in k.extra_args}
    return [a for a in args if param_name(a) not in extra] + list(k.extra_args)


def acknowledged(h: Host) -> list[str]:
    return [n for n in ("acs_override_acknowledged", "allow_unsafe_interrupts_acknowledged") if getattr(h, n)]


def passthrough_args(
    h: Host, reboot_after: tuple[Any, ...] = (), extra_vfio_devices: tuple[str, ...] = ()
) -> PassthroughHostArgs:
    """PassthroughHost's args for host `h` (reboot_after: resources its reboot waits for, see `rollout`)."""
    return PassthroughHostArgs(
        host=host_spec(h),
        os_family=h.os_family,
        gpus=tuple(g.address for g in h.gpus if g.passthrough),
        extra_vfio_devices=tuple(extra_vfio_devices),
        bind=h.bind,
        cmdline_add=tuple(cmdline_args(h)),
        cmdline_remove=tuple(h.kernel.remove_args),
        acknowledged=tuple(acknowledged(h)),
        hugepages_2m_per_node=(
            {str(k): v for k, v in h.hugepages.per_node.items()} if h.hugepages.size == "2M" else {}
        ),
        sysctls=dict(h.tuning.sysctls),
        tuned_profile=h.tuning.tuned_profile,
        governor=h.tuning.governor,
        reboot=h.reboot,
        irq_banned_cpus=tuple(vm_cpus(h)),
        irq_cpus=tuple(h.reserved_cpus),
        irq_pin=tuple(h.irq_pin),
        reboot_after=tuple(reboot_after),
        drain_timeout_s=h.drain_timeout_s,
    )
