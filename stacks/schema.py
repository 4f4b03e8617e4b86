"""The stack's configuration as typed models: one clear error per bad field, before any SSH or resource.

`Pulumi.<stack>.yaml` holds `gpuhost:fleet` (this schema, as structured config) and `gpuhost:sshPrivateKey` (a Pulumi
secret). `stacks.load` reads both; `Fleet.model_validate` does every check below.

Example (YAML)::

    gpuhost:fleet:
      hosts:
        - name: trt-l40s-01
          ssh: {address: 10.20.0.11, user: ops, host_key: "ssh-ed25519 AAAA..."}
          cpu_vendor: intel
          topology: {sockets: 2, cores_per_socket: 16, threads_per_core: 2, memory_gib_per_node: 256}
          reserved_cpus: "0-1,32-33"
          gpus: [{address: "0000:65:00.0", model: L40S, numa_node: 0}]
          vms: [{name: tenant-a, vcpus: 8, memory_gib: 32, gpus: ["0000:65:00.0"]}]
"""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from facts.cpulist import CpuListError, parse_cpulist
from facts.model import normalize_pci
from plans.adaptive_window import AdaptiveWindow  # one definition of the controller's settings
from plans.sriov import VfSettings  # one definition of per-VF settings

PCI_RE = re.compile(r"^([0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def pci_address(v: str) -> str:
    if not isinstance(v, str) or not PCI_RE.match(v.strip()):
        raise ValueError(f"not a PCI address: {v!r} (want domain:bus:slot.function, e.g. 0000:65:00.0)")
    return normalize_pci(v)


def cpu_list(v) -> list[int]:
    if isinstance(v, list):
        if not all(isinstance(x, int) and x >= 0 for x in v):
            raise ValueError("CPU list must hold non-negative integers")
        return sorted(set(v))
    try:
        return parse_cpulist(str(v))
    except CpuListError as e:
        raise ValueError(str(e)) from None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Jump(Strict):
    address: str
    port: int = Field(22, ge=1, le=65535)
    user: str = "root"
    host_key: Optional[str] = None


class Ssh(Strict):
    address: str
    port: int = Field(22, ge=1, le=65535)
    user: str = "root"
    host_key: Optional[str] = Field(None, description="known_hosts-style 'type base64' or 'SHA256:...' pin")
    insecure_accept_unknown_host_key: bool = False
    jump: Optional[Jump] = None
    key_name: str = "sshPrivateKey"

    @model_validator(mode="after")
    def _pin_required(self):
        if not self.host_key and not self.insecure_accept_unknown_host_key:
            raise ValueError(
                "host_key is required (strict host-key checking); "
                "insecure_accept_unknown_host_key is only for throwaway dev hosts"
            )
        if self.host_key:
            from access.ssh import HostSpec

            HostSpec(name="x", address=self.address, host_key=self.host_key)  # same pin rules as the access layer
        return self


class Gpu(Strict):
    address: str
    model: str = Field("generic", description="L40S, A10, A100, H100, H200, 4090 ... (selects Triton presets)")
    numa_node: Optional[int] = Field(None, description="expected node; preflight compares with the host")
    consumer: bool = Field(False, description="consumer card (4090): hide KVM / set hv_vendor_id (seed 001)")
    passthrough: bool = Field(
        True,
        description="bind to vfio-pci for a VM; false keeps the host's NVIDIA driver "
        "(MIG on the host, seed 001 route A)",
    )
    mig: Optional[list[str]] = Field(None, description="MIG profile layout, e.g. ['2g.20gb','2g.20gb','1g.10gb']")
    functions: list[int] = Field(
        default_factory=lambda: [0],
        description="PCI functions of the card's slot that "
        "pass through together: [0, 1] for a GPU with an HDA audio function (seed 000 §4.2)",
    )

    _addr = field_validator("address")(lambda cls, v: pci_address(v))


class SriovPf(Strict):
    pf: str = Field(description="PCI address of the physical function")
    num_vfs: int = Field(ge=0)
    numa_policy: Literal["require", "prefer"] = "require"
    numa_node: Optional[int] = None
    vfio: bool = True
    vfs: list[VfSettings] = Field(default_factory=list)

    _addr = field_validator("pf")(lambda cls, v: pci_address(v))


class Topology(Strict):
    sockets: int = Field(ge=1)
    cores_per_socket: int = Field(ge=1)
    threads_per_core: int = Field(1, ge=1, le=8)
    memory_gib_per_node: int = Field(ge=1)
    nodes_per_socket: int = Field(1, ge=1)
    numbering: Literal["interleaved", "sequential"] = Field(
        "interleaved",
        description="interleaved: sibling threads are N and N+cores (Intel servers, lscpu shows CPU 0 "
        "and 32 on one core); sequential: siblings adjacent (QEMU guests, some AMD BIOSes)",
    )

    @property
    def nodes(self) -> int:
        return self.sockets * self.nodes_per_socket

    @property
    def cpus_per_node(self) -> int:
        return self.cores_per_socket * self.threads_per_core // self.nodes_per_socket


class Hugepages(Strict):
    size: Literal["1G", "2M"] = "1G"
    count: int = Field(0, ge=0, description="1G: total at boot (kernel command line); 2M: per node in per_node")
    per_node: dict[int, int] = Field(default_factory=dict, description="2M pages per NUMA node at runtime")


class Kernel(Strict):
    iommu_passthrough: bool = Field(True, description="iommu=pt")
    kvm_ignore_msrs: bool = False
    video_efifb_off: bool = False
    isolate_vm_cpus: bool = Field(False, description="isolcpus/nohz_full for VM CPUs (seed 002 advanced)")
    extra_args: list[str] = Field(default_factory=list)
    remove_args: list[str] = Field(default_factory=list)


class Tuning(Strict):
    tuned_profile: Optional[str] = "latency-performance"
    governor: Optional[str] = "performance"
    sysctls: dict[str, str] = Field(default_factory=dict)


class Vm(Strict):
    name: str
    vcpus: int = Field(ge=1)
    memory_gib: float = Field(gt=0, description="guest memory; a whole number of pages of page_size")
    page_size: Literal["1G", "2M", "4K"] = "1G"
    gpus: list[str] = Field(default_factory=list, description="GPU function-0 addresses; all slot functions follow")
    vfs: int = Field(0, ge=0, description="SR-IOV VFs from a PF on the GPU's node")
    thread_policy: Literal["prefer", "require", "isolate"] = "prefer"
    emulator_threads: Literal["share", "isolate"] = "isolate"
    iothreads: int = Field(1, ge=0)
    image: Optional[str] = Field(
        "/var/lib/libvirt/images/base.qcow2", description="base qcow2 the disk overlays; null gives an empty disk"
    )
    emulated: bool = Field(
        False, description="hypervisor without KVM (the emulated dev server): TCG domain, SeaBIOS, CPU model 'maximum'"
    )
    guest_user: str = "ubuntu"
    mps: bool = Field(False, description="CUDA MPS in the guest (seed 001 route B)")
    address: Optional[str] = Field(None, description="guest IP for SSH (through the host as jump) and scraping")
    host_key: Optional[str] = Field(None, description="the guest's SSH host key pin")

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if not NAME_RE.match(v):
            raise ValueError(f"VM name {v!r}: lower-case letters, digits and '-'")
        return v

    _gpus = field_validator("gpus")(lambda cls, v: [pci_address(x) for x in v])


class Host(Strict):
    name: str
    ssh: Ssh
    os_family: Literal["debian", "rhel"] = "debian"
    cpu_vendor: Literal["intel", "amd"] = "intel"
    reboot: Literal["auto", "never"] = "auto"
    topology: Optional[Topology] = None
    reserved_cpus: list[int] = Field(default_factory=list, description="host CPUs kept off VMs (cpulist)")
    gpus: list[Gpu] = Field(default_factory=list)
    bind: Literal["address", "ids"] = "address"
    sriov: list[SriovPf] = Field(default_factory=list)
    hugepages: Hugepages = Field(default_factory=Hugepages)
    kernel: Kernel = Field(default_factory=Kernel)
    tuning: Tuning = Field(default_factory=Tuning)
    irq_pin: list[str] = Field(
        default_factory=list, description="regexes of /proc/interrupts names to move to reserved CPUs (nvme, mlx5 ...)"
    )
    vms: list[Vm] = Field(default_factory=list)
    acs_override_acknowledged: bool = False
    allow_unsafe_interrupts_acknowledged: bool = False

    _name = field_validator("name")(lambda cls, v: _check_name(v))
    _reserved = field_validator("reserved_cpus", mode="before")(lambda cls, v: cpu_list(v))

    @model_validator(mode="after")
    def _consistent(self):
        errors = []
        gpu_addrs = {g.address for g in self.gpus}
        seen: dict[str, str] = {}
        names = set()
        for i, vm in enumerate(self.vms):
            if vm.name in names:
                errors.append(f"vms[{i}].name: {vm.name!r} appears twice on host {self.name}")
            names.add(vm.name)
            for a in vm.gpus:
                if a not in gpu_addrs:
                    errors.append(
                        f"vms[{i}].gpus: {a} is not one of this host's gpus[] ({', '.join(sorted(gpu_addrs))})"
                    )
                if a in seen:
                    errors.append(
                        f"vms[{i}].gpus: {a} is already given to VM {seen[a]!r} (a GPU passes through to one VM only)"
                    )
                seen[a] = vm.name
            if self.topology:
                nodes = {g.numa_node for g in self.gpus if g.address in vm.gpus and g.numa_node is not None}
                reserved_per_node = len(self.reserved_cpus) // max(1, self.topology.nodes)
                cap = self.topology.cpus_per_node - reserved_per_node
                if vm.vcpus > cap:
                    where = f"node {sorted(nodes)[0]}" if nodes else "any node"
                    errors.append(
                        f"vms[{i}].vcpus: {vm.vcpus} vCPUs do not fit on {where} of {self.name}: "
                        f"{self.topology.cpus_per_node} CPUs per node, about {reserved_per_node} reserved "
                        f"for the host, so at most {cap}"
                    )
                if vm.memory_gib > self.topology.memory_gib_per_node:
                    errors.append(
                        f"vms[{i}].memory_gib: {vm.memory_gib} GiB exceeds a node's "
                        f"{self.topology.memory_gib_per_node} GiB"
                    )
        for i, g in enumerate(self.gpus):
            if self.topology and g.numa_node is not None and g.numa_node >= self.topology.nodes:
                errors.append(f"gpus[{i}].numa_node: {g.numa_node} but the topology has {self.topology.nodes} nodes")
        if self.topology:
            ncpu = self.topology.sockets * self.topology.cores_per_socket * self.topology.threads_per_core
            bad = [c for c in self.reserved_cpus if c >= ncpu]
            if bad:
                errors.append(f"reserved_cpus: CPU(s) {bad} beyond this host's {ncpu} CPUs")
        for k in self.kernel.extra_args:
            key = k.split("=", 1)[0]
            if key == "pcie_acs_override" and not self.acs_override_acknowledged:
                errors.append(
                    "kernel.extra_args: pcie_acs_override needs acs_override_acknowledged: true "
                    "(it fakes IOMMU isolation; seeds: last resort only)"
                )
            if key == "vfio_iommu_type1.allow_unsafe_interrupts" and not self.allow_unsafe_interrupts_acknowledged:
                errors.append(
                    "kernel.extra_args: allow_unsafe_interrupts needs allow_unsafe_interrupts_acknowledged: true"
                )
        if errors:
            raise ValueError("; ".join(errors))
        return self


def _check_name(v: str) -> str:
    if not NAME_RE.match(v):
        raise ValueError(f"host name {v!r}: lower-case letters, digits and '-'")
    return v


class Slo(Strict):
    p95_ms: float = Field(gt=0)
    p99_ms: Optional[float] = Field(None, gt=0)
    max_error_rate: float = Field(0.0, ge=0, le=1)


class Acceptance(Strict):
    concurrency: int = Field(8, ge=1, le=1024)
    duration_s: float = Field(10, gt=0, le=600)
    rate: Optional[float] = Field(None, gt=0, description="requests/s; open loop when set")


class ServiceModel(Strict):
    name: str
    preset: Literal["yolov8n", "resnet50_fp16", "sdxl"]
    workload: Optional[Literal["low_latency", "throughput", "diffusion"]] = None
    max_batch_size: Optional[int] = Field(None, ge=1)
    instance_count: Optional[int] = Field(None, ge=1)
    max_queue_delay_us: Optional[int] = Field(None, ge=0)
    onnx_sha256: Optional[str] = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="TensorRT models: the ONNX file on the guest (/srv/onnx/<name>.onnx)"
        " the engine is built from; its hash decides rebuilds",
    )
    precision: Literal["fp32", "fp16", "int8"] = "fp16"
    calib_dir: Optional[str] = None


class Service(Strict):
    name: str
    host: str
    vm: Optional[str] = Field(None, description="the PinnedVM guest it runs in; the host itself when omitted")
    gpu_model: str = "generic"
    runtime: Literal["docker", "process"] = "docker"
    image: str = "nvcr.io/nvidia/tritonserver:24.05-py3"
    models: list[ServiceModel]
    nginx_port: int = Field(80, ge=1, le=65535)
    slo: Slo
    acceptance: Acceptance = Field(default_factory=Acceptance)
    numa_node: Optional[int] = None
    adaptive_window: Optional[AdaptiveWindow] = Field(
        None,
        description="seed 004: a controller moving each model's batching window toward a p95 target "
        "({target_p95_ms, step_us, period_s, min_us, max_us}; seed values as defaults)",
    )


class Monitoring(Strict):
    host: str
    prometheus_port: int = 9090
    grafana_port: int = 3000


class Fleet(Strict):
    hosts: list[Host]
    services: list[Service] = Field(default_factory=list)
    monitoring: Optional[Monitoring] = None

    @model_validator(mode="after")
    def _refs(self):
        errors = []
        names = [h.name for h in self.hosts]
        for n in {n for n in names if names.count(n) > 1}:
            errors.append(f"hosts: name {n!r} appears twice")
        hosts = {h.name: h for h in self.hosts}
        for i, s in enumerate(self.services):
            h = hosts.get(s.host)
            if h is None:
                errors.append(f"services[{i}].host: unknown host {s.host!r}")
            elif s.vm and s.vm not in {v.name for v in h.vms}:
                errors.append(f"services[{i}].vm: host {s.host} has no VM {s.vm!r}")
        if self.monitoring and self.monitoring.host not in hosts:
            errors.append(f"monitoring.host: unknown host {self.monitoring.host!r}")
        for _key, where in _find_private_keys(self.model_dump()):
            errors.append(
                f"{where}: looks like a private key in plain config; keys belong in "
                "`pulumi config set --secret gpuhost:sshPrivateKey`"
            )
        if errors:
            raise ValueError("; ".join(errors))
        return self


def _find_private_keys(obj, path="fleet"):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _find_private_keys(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _find_private_keys(v, f"{path}[{i}]")
    elif isinstance(obj, str) and "PRIVATE KEY-----" in obj:
        yield obj, path
