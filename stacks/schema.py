"""The stack's configuration as typed models: one clear error per bad field, before any SSH or resource.

`Pulumi.<stack>.yaml` holds `gpuhost:fleet` (this schema, as structured config) and `gpuhost:sshPrivateKey` (a Pulumi
secret). `stacks.load` reads both: the models below check each field on its own (allow-lists from
`plans.values` for every value that lands in a file a tool parses or sources), then `stacks.checks` checks the
fields against each other (placement capacity, hugepages, MIG layouts, one SSH endpoint per host, one service per
guest ...). Every problem is one line with its config path.

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
from typing import Annotated, Callable, Literal, Optional
from urllib.parse import parse_qsl, urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from access.ssh import HostSpec
from facts.cpulist import MAX_CPUS, CpuListError, parse_cpulist
from facts.model import normalize_pci
from plans import values as val
from plans.adaptive_window import AdaptiveWindow  # one definition of the controller's settings
from plans.sriov import VfSettings  # one definition of per-VF settings
from stacks.errors import FieldProblems

# Every regex below is applied with fullmatch: `re.match(r"...$")` lets a trailing newline through.
PCI_RE = re.compile(r"([0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
BRIDGE_RE = re.compile(r"[A-Za-z0-9_.:-]{1,15}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")

# Upper bounds of counts no real machine or deploy exceeds (so a typo'd 10**12 is refused, not tried).
MAX_NODES = 64  # NUMA nodes (Linux's MAX_NUMNODES is 1024; no x86 server has more than 32)
MAX_TIMEOUT_S = 86400
MAX_GIB = 65536  # 64 TiB of memory per NUMA node or VM


def pci_address(v: str) -> str:
    if not isinstance(v, str) or not PCI_RE.fullmatch(v):
        raise ValueError(f"not a PCI address: {v!r} (want domain:bus:slot.function, e.g. 0000:65:00.0)")
    return normalize_pci(v)


def cpu_list(v) -> list[int]:
    """A cpulist string ("0-1,32-33") or a list of CPU numbers; every number below MAX_CPUS, checked before a
    range is expanded (so "0-4000000000" is refused, not built)."""
    if isinstance(v, list):
        bad = [x for x in v if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < MAX_CPUS]
        if bad:
            raise ValueError(f'CPU numbers are whole numbers 0-{MAX_CPUS - 1} (e.g. "0-1,32-33"), not {bad!r}')
        return sorted(set(v))
    if not isinstance(v, str):
        raise ValueError(f'{v!r} is not a CPU list (write a cpulist string like "0-1,32-33" or a list of CPU numbers)')
    try:
        return parse_cpulist(v)
    except CpuListError as e:
        raise ValueError(f'{e} (write CPU numbers 0-{MAX_CPUS - 1}, e.g. "0-1,32-33")') from None


def _node_key(v: object) -> object:
    """A NUMA node number as a map key: YAML/JSON hand keys over as strings ("0"); only ASCII digits count."""
    if isinstance(v, str):
        if not re.fullmatch(r"[0-9]{1,4}", v):
            raise ValueError(f"NUMA node {v!r} is not a node number (write 0, 1, ... below {MAX_NODES})")
        return int(v)
    return v


class Strict(BaseModel):
    """Every stack-config model: unknown keys refused; numbers strict (no bool for a number, no "8" for 8) and
    finite (no inf or NaN); new fields inherit both."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


NodeKey = Annotated[int, BeforeValidator(_node_key), Field(ge=0, lt=MAX_NODES)]
NumaNode = Annotated[int, Field(ge=0, lt=MAX_NODES)]


def _v(check, *fields: str):
    """A field validator running a `plans.values` checker (its ValueError becomes the field's one-line error)."""
    return field_validator(*fields)(lambda cls, v: check(v))


def _matching(regex: re.Pattern, what: str) -> Callable[[str], str]:
    """A checker: the value itself when `regex` matches all of it, else ValueError `what` (formatted with its repr)."""

    def check(v: str) -> str:
        if not regex.fullmatch(v):
            raise ValueError(what.format(repr(v)))
        return v

    return check


KernelArg = Annotated[str, AfterValidator(val.kernel_arg)]
MigProfile = Annotated[str, AfterValidator(val.mig_profile)]
IrqPattern = Annotated[str, AfterValidator(val.irq_pattern)]


PIN_FIX = (
    "pin the key line `ssh-keyscan -t ed25519 HOST` prints, 'ssh-ed25519 AAAA...', or its 'SHA256:...' fingerprint"
)
FINGERPRINT_RE = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")


def _pin(v: Optional[str]) -> Optional[str]:
    """A host key pin checked by the access layer's own rules (the same for hosts, jump hosts and guests), and a
    fingerprint in the one form the access layer compares with (`ssh-keygen -lf` prints it: 43 characters, no '=')."""
    if v is not None and v.strip().startswith("SHA256:") and not FINGERPRINT_RE.fullmatch(v):
        raise ValueError(
            "a SHA256 fingerprint is 'SHA256:' and 43 base64 characters, no padding, as `ssh-keygen -lf` prints it "
            f"({PIN_FIX})"
        )
    if v is not None:
        try:
            HostSpec(name="x", address="127.0.0.1", host_key=v)
        except ValidationError as e:
            why = " ".join(str(x["ctx"]["error"]) if x["type"] == "value_error" else x["msg"] for x in e.errors())
            raise ValueError(f"{why} ({PIN_FIX})") from None
    return v


class Jump(Strict):
    address: str
    port: int = Field(22, ge=1, le=65535)
    user: str = "root"
    host_key: Optional[str] = None

    _address = _v(val.address, "address")
    _user = _v(val.unix_user, "user")
    _host_key = _v(_pin, "host_key")


class Ssh(Strict):
    address: str
    port: int = Field(22, ge=1, le=65535)
    user: str = "root"
    host_key: Optional[str] = Field(None, description="known_hosts-style 'type base64' or 'SHA256:...' pin")
    insecure_accept_unknown_host_key: bool = False
    jump: Optional[Jump] = None
    key_name: str = "sshPrivateKey"
    # Seconds to connect, authenticate and open a command channel (the emulated dev server under TCG needs more).
    connect_timeout: float = Field(10.0, gt=0, le=600)

    _address = _v(val.address, "address")
    _user = _v(val.unix_user, "user")
    _key_name = _v(val.config_key, "key_name")
    _host_key = _v(_pin, "host_key")  # same pin rules as the access layer, reported at ssh.host_key

    @model_validator(mode="after")
    def _pin_required(self):
        if not self.host_key and not self.insecure_accept_unknown_host_key:
            raise ValueError(
                "host_key is required (strict host-key checking); "
                "insecure_accept_unknown_host_key is only for throwaway dev hosts"
            )
        return self


class Gpu(Strict):
    address: str
    model: str = Field("generic", description="L40S, A10, A100, H100, H200, 4090 ... (selects Triton presets)")
    numa_node: Optional[NumaNode] = Field(None, description="expected node; preflight compares with the host")
    consumer: bool = Field(False, description="consumer card (4090): hide KVM / set hv_vendor_id (seed 001)")
    passthrough: bool = Field(
        True,
        description="bind to vfio-pci for a VM; false keeps the host's NVIDIA driver "
        "(MIG on the host, seed 001 route A)",
    )
    mig: Optional[list[MigProfile]] = Field(
        None, description="MIG profile layout, e.g. ['2g.20gb','2g.20gb','1g.10gb']"
    )
    functions: list[int] = Field(
        default_factory=lambda: [0],
        description="PCI functions of the card's slot that "
        "pass through together: [0, 1] for a GPU with an HDA audio function (seed 000 §4.2)",
    )

    _addr = field_validator("address")(lambda cls, v: pci_address(v))
    _model = _v(val.gpu_model, "model")

    @field_validator("functions")
    @classmethod
    def _functions(cls, v: list[int]) -> list[int]:
        if not v or any(f < 0 or f > 7 for f in v) or len(set(v)) != len(v):
            raise ValueError(f"functions {v}: distinct PCI function numbers 0-7, e.g. [0] or [0, 1]")
        return v


class SriovPf(Strict):
    pf: str = Field(description="PCI address of the physical function")
    num_vfs: int = Field(ge=0, le=1024)
    numa_policy: Literal["require", "prefer"] = "require"
    numa_node: Optional[NumaNode] = None
    vfio: bool = True
    vfs: list[VfSettings] = Field(default_factory=list)

    _addr = field_validator("pf")(lambda cls, v: pci_address(v))


class Topology(Strict):
    sockets: int = Field(ge=1, le=16)
    cores_per_socket: int = Field(ge=1, le=1024)
    threads_per_core: int = Field(1, ge=1, le=8)
    memory_gib_per_node: int = Field(ge=1, le=MAX_GIB)
    nodes_per_socket: int = Field(1, ge=1, le=16)
    numbering: Literal["interleaved", "sequential"] = Field(
        "interleaved",
        description="interleaved: sibling threads are N and N+cores (Intel servers, lscpu shows CPU 0 "
        "and 32 on one core); sequential: siblings adjacent (QEMU guests, some AMD BIOSes)",
    )

    @model_validator(mode="after")
    def _size(self):
        if self.sockets * self.cores_per_socket * self.threads_per_core > MAX_CPUS:
            raise ValueError(
                f"{self.sockets} x {self.cores_per_socket} x {self.threads_per_core} CPUs is more than Linux numbers "
                f"({MAX_CPUS}); check sockets, cores_per_socket and threads_per_core"
            )
        if self.nodes > MAX_NODES:
            raise ValueError(f"nodes_per_socket: {self.nodes} NUMA nodes is more than {MAX_NODES}")
        return self

    @property
    def nodes(self) -> int:
        return self.sockets * self.nodes_per_socket

    @property
    def cpus_per_node(self) -> int:
        return self.cores_per_socket * self.threads_per_core // self.nodes_per_socket


class Hugepages(Strict):
    size: Literal["1G", "2M"] = "1G"
    # Bounds: 64 TiB of 1 GiB pages, 64 TiB of 2 MiB pages per node; the host's topology bounds them further.
    count: int = Field(
        0, ge=0, le=MAX_GIB, description="1G: total at boot (kernel command line); 2M: per node in per_node"
    )
    per_node: dict[NodeKey, Annotated[int, Field(ge=0, le=MAX_GIB * 512)]] = Field(
        default_factory=dict, description="2M pages per NUMA node at runtime"
    )


class Kernel(Strict):
    iommu_passthrough: bool = Field(True, description="iommu=pt")
    kvm_ignore_msrs: bool = False
    video_efifb_off: bool = False
    isolate_vm_cpus: bool = Field(False, description="isolcpus/nohz_full for VM CPUs (seed 002 advanced)")
    extra_args: list[KernelArg] = Field(default_factory=list)
    remove_args: list[KernelArg] = Field(default_factory=list)
    overrides_acknowledged: list[str] = Field(
        default_factory=list,
        description="parameter names gpuhost sets itself (hugepages, isolcpus, intel_iommu ...) that extra_args "
        "may set anyway: the stack's value then replaces gpuhost's",
    )

    @field_validator("overrides_acknowledged")
    @classmethod
    def _overrides(cls, v: list[str]) -> list[str]:
        return [val.param_name(val.kernel_arg(x)) for x in v]


class Tuning(Strict):
    tuned_profile: Optional[str] = "latency-performance"
    governor: Optional[str] = "performance"
    sysctls: dict[str, str] = Field(default_factory=dict)

    _profile = field_validator("tuned_profile")(lambda cls, v: val.tuned_profile(v) if v is not None else v)
    _governor = field_validator("governor")(lambda cls, v: val.governor(v) if v is not None else v)

    @field_validator("sysctls", mode="before")
    @classmethod
    def _sysctls(cls, v):
        if not isinstance(v, dict):
            return v
        errors, out = [], {}
        for k, x in v.items():
            try:
                out[val.sysctl_name(k)] = val.sysctl_value(x)
            except ValueError as e:
                errors.append(str(e))
        if errors:
            raise FieldProblems(errors)
        return out


class Vm(Strict):
    name: str
    vcpus: int = Field(ge=1, le=MAX_CPUS)
    memory_gib: float = Field(gt=0, le=MAX_GIB, description="guest memory; a whole number of pages of page_size")
    page_size: Literal["1G", "2M", "4K"] = "1G"
    gpus: list[str] = Field(default_factory=list, description="GPU function-0 addresses; all slot functions follow")
    vfs: int = Field(0, ge=0, le=64, description="SR-IOV VFs from a PF on the GPU's node")
    thread_policy: Literal["prefer", "require", "isolate"] = "prefer"
    emulator_threads: Literal["share", "isolate"] = "isolate"
    iothreads: int = Field(1, ge=0, le=64)
    image: Optional[str] = Field(
        "/var/lib/libvirt/images/base.qcow2", description="base qcow2 the disk overlays; null gives an empty disk"
    )
    emulated: bool = Field(
        False,
        description="hypervisor without KVM (the emulated dev server): TCG domain, SeaBIOS, CPU model 'maximum', no libvirt NIC, no disk without `image`",
    )
    guest_user: str = "ubuntu"
    mps: bool = Field(False, description="CUDA MPS in the guest (seed 001 route B)")
    address: Optional[str] = Field(None, description="guest IP for SSH (through the host as jump) and scraping")
    host_key: Optional[str] = Field(None, description="the guest's SSH host key pin")
    shutdown_timeout_s: int = Field(
        120,
        ge=0,
        le=MAX_TIMEOUT_S,
        description="graceful ACPI shutdown time before the domain is destroyed (delete, a change that needs a restart)",
    )

    _name = _v(
        _matching(NAME_RE, "VM name {}: lower-case letters, digits and '-' (at most 63, no leading or trailing '-')"),
        "name",
    )

    _gpus = field_validator("gpus")(lambda cls, v: [pci_address(x) for x in v])
    _user = _v(val.unix_user, "guest_user")
    _address = field_validator("address")(lambda cls, v: val.address(v) if v is not None else v)
    _image = field_validator("image")(lambda cls, v: val.abs_path(v, "image") if v is not None else v)

    _host_key = _v(_pin, "host_key")


class VmNetwork(Strict):
    """How tenant VMs of a host reach the fabric: a host bridge, each VM's static `address` set by cloud-init."""

    bridge: str = Field(description="host bridge, e.g. br0")
    prefix_length: int = Field(24, ge=1, le=128, description="the VMs' subnet: their addresses and the gateway")
    gateway: Optional[str] = None
    dns: list[str] = Field(default_factory=list, max_length=3)

    _bridge = _v(_matching(BRIDGE_RE, "bridge {}: an interface name of 1-15 letters, digits, _ . : -"), "bridge")

    @field_validator("gateway", "dns")
    @classmethod
    def _ips(cls, v):
        if isinstance(v, str):
            return val.ip_address(v)
        return [val.ip_address(a) for a in v or []]


class Host(Strict):
    name: str
    ssh: Ssh
    os_family: Literal["debian", "rhel"] = "debian"
    cpu_vendor: Literal["intel", "amd"] = "intel"
    reboot: Literal["auto", "never"] = "auto"
    # Before a reboot, running VMs get an ACPI shutdown and this long to finish it; then they are destroyed.
    drain_timeout_s: int = Field(180, ge=0, le=MAX_TIMEOUT_S)
    topology: Optional[Topology] = None
    reserved_cpus: list[int] = Field(default_factory=list, description="host CPUs kept off VMs (cpulist)")
    gpus: list[Gpu] = Field(default_factory=list, max_length=64)
    bind: Literal["address", "ids"] = "address"
    sriov: list[SriovPf] = Field(default_factory=list, max_length=64)
    hugepages: Hugepages = Field(default_factory=Hugepages)
    kernel: Kernel = Field(default_factory=Kernel)
    tuning: Tuning = Field(default_factory=Tuning)
    irq_pin: list[IrqPattern] = Field(
        default_factory=list, description="regexes of /proc/interrupts names to move to reserved CPUs (nvme, mlx5 ...)"
    )
    vms: list[Vm] = Field(default_factory=list)
    vm_network: Optional[VmNetwork] = Field(
        None, description="bridge + static addresses for the VMs; without it VMs sit on libvirt's NAT network"
    )
    acs_override_acknowledged: bool = False
    allow_unsafe_interrupts_acknowledged: bool = False

    _name = field_validator("name")(lambda cls, v: _check_name(v))
    _reserved = field_validator("reserved_cpus", mode="before")(lambda cls, v: cpu_list(v))


_check_name: Callable[[str], str] = _matching(
    NAME_RE, "host name {}: lower-case letters, digits and '-' (at most 63, no leading or trailing '-')"
)


class Slo(Strict):
    """What the acceptance gate holds a deploy to; a miss fails `up` and puts the previous deploy back."""

    p95_ms: float = Field(gt=0, le=3_600_000)
    p99_ms: Optional[float] = Field(None, gt=0, le=3_600_000)
    max_error_rate: float = Field(0.0, ge=0, le=1)
    min_throughput_rps: Optional[float] = Field(None, gt=0, le=10_000_000)


class Acceptance(Strict):
    concurrency: int = Field(8, ge=1, le=1024)
    duration_s: float = Field(10, gt=0, le=600)
    rate: Optional[float] = Field(None, gt=0, le=1_000_000, description="requests/s; open loop when set")
    ready_timeout_s: Optional[float] = Field(
        None,
        gt=0,
        le=3600,
        description="how long the gate waits for Triton and each model to be ready after a deploy before it fails "
        "`up` and puts the previous deploy back; default 300 s, or 900 s when a model compiles at load "
        "(yolov8n_torch on a GPU, compile auto or inductor: 2-3 minutes on an H200 host with an empty cache)",
    )


class Artifact(Strict):
    """The model itself: the ONNX export a TensorRT engine is built from, a python backend's model.py, or the
    weights file of a model whose code gpuhost ships (yolov8n_torch; a `path` file's layout is checked at load).
    Fetched on the guest from `url`, or uploaded from `path` on the machine running Pulumi; verified by sha256
    (a mismatch fails `up` and leaves the previous file in place)."""

    url: Optional[str] = None
    path: Optional[str] = None
    sha256: str

    _url = field_validator("url")(lambda cls, v: artifact_url(v) if v is not None else v)
    _path = field_validator("path")(lambda cls, v: val.abs_path(v, "path") if v is not None else v)

    _sha = _v(_matching(SHA256_RE, "sha256 {}: 64 lower-case hex digits (`sha256sum FILE`)"), "sha256")

    @model_validator(mode="after")
    def _one_source(self):
        if (self.url is None) == (self.path is None):
            raise ValueError("set exactly one of url or path")
        return self


class ServiceModel(Strict):
    """One model; the GPU's preset (plans/presets.py) fills what is not set here."""

    name: str
    # yolov8n_torch: YOLOv8n on the python backend's GPU fast path (uint8 in, NMS on the GPU) where no TensorRT is.
    preset: Literal["yolov8n", "yolov8n_torch", "resnet50_fp16", "sdxl"] = Field(
        description="the model's signature (inputs, outputs, platform)"
    )
    artifact: Optional[Artifact] = Field(
        None,
        description="the model itself (ONNX for TensorRT presets, model.py for sdxl); for yolov8n_torch, whose code "
        "gpuhost ships, its weights file (an Ultralytics yolov8n.onnx or yolov8n.pt checkpoint, a state_dict or "
        "safetensors; a pickled checkpoint is loaded because its sha256 is pinned here); required: a stack may not "
        "serve random weights",
    )
    workload: Optional[Literal["low_latency", "throughput", "diffusion"]] = None
    max_batch_size: Optional[int] = Field(None, ge=1, le=4096)
    instance_count: Optional[int] = Field(None, ge=1, le=64)
    max_queue_delay_us: Optional[int] = Field(None, ge=0, le=60_000_000)
    precision: Literal["fp32", "fp16", "int8"] = "fp16"
    calib_dir: Optional[str] = None
    input: Literal["jpeg", "raw"] = Field(
        "jpeg",
        description="yolov8n_torch: what a request carries in `images`: jpeg (an encoded frame of any size, decoded "
        "and letterboxed on the GPU, boxes in the frame's pixels) or raw (uint8 640x640x3, letterboxed by the "
        "client, boxes in that space)",
    )
    jpeg_decoder: Literal["exact", "nvjpeg"] = Field(
        "exact",
        description="yolov8n_torch with input jpeg, on a GPU: exact decodes every frame to libjpeg's pixels, the "
        "boxes users validated with Pillow/OpenCV/Ultralytics (baseline camera frames on the GPU from nvJPEG's planes, "
        "upsampled as libjpeg does; progressive, RGB-coded and CMYK frames with libjpeg on the host); nvjpeg gives "
        "nvJPEG every frame it decodes at all (progressive ones too), 4:2:0 pixels up to 48-73 levels off libjpeg's, "
        "so boxes may differ",
    )
    compile: Literal["auto", "inductor", "none"] = Field(
        "auto",
        description="yolov8n_torch: auto compiles the model with torch's inductor when Triton loads it (H200: the "
        "model's GPU time at batch 1 0.50 ms against 0.95 eager, about a minute more to load) and runs it eagerly "
        "where the python backend's environment cannot compile (no C compiler or triton package); inductor refuses to "
        "load there instead; none never compiles",
    )

    _name = _v(val.model_name, "name")
    _calib = field_validator("calib_dir")(lambda cls, v: val.abs_path(v, "calib_dir") if v is not None else v)


class MigBinding(Strict):
    """The MIG device a service on a MIG host runs on (seed 001 route A: one MIG device per Triton)."""

    gpu: str = Field(description="PCI address of the MIG-enabled GPU")
    instance: int = Field(0, ge=0, le=63, description="index into that GPU's mig layout")

    _addr = field_validator("gpu")(lambda cls, v: pci_address(v))


class Service(Strict):
    name: str
    host: str
    vm: Optional[str] = Field(None, description="the PinnedVM guest it runs in; the host itself when omitted")
    gpu_model: str = "generic"
    runtime: Literal["docker", "process"] = "docker"
    image: str = Field("nvcr.io/nvidia/tritonserver:24.05-py3", description="Triton's container image (docker runtime)")
    models: list[ServiceModel] = Field(max_length=64)
    nginx_port: int = Field(80, ge=1, le=65535)
    slo: Slo
    acceptance: Acceptance = Field(default_factory=Acceptance)
    numa_node: Optional[int] = Field(
        None,
        ge=0,
        lt=MAX_NODES,
        description="process runtime: numactl node for Triton; default: the node of the service's GPU (a guest "
        "sees one node: 0)",
    )
    mig: Optional[MigBinding] = Field(
        None, description="on a MIG host: the MIG device; default the first instance of the first MIG GPU"
    )
    adaptive_window: Optional[AdaptiveWindow] = Field(
        None,
        description="seed 004: a controller moving each model's batching window toward a p95 target "
        "({target_p95_ms, step_us, period_s, min_us, max_us}; seed values as defaults)",
    )
    triton_listen: Optional[str] = Field(
        None,
        description="IP address Triton's HTTP, gRPC and metrics listeners bind (nginx, gateway workers on other "
        "machines and Prometheus connect there). Default: loopback, metrics on the machine's address when "
        "monitoring scrapes it; 0.0.0.0 only when written here",
    )

    _name = field_validator("name")(lambda cls, v: val.dns_label(v, "service name"))
    _listen = field_validator("triton_listen")(lambda cls, v: v if v is None else ip_literal(v, "triton_listen"))
    _gpu_model = _v(val.gpu_model, "gpu_model")
    _image = _v(val.image_ref, "image")


def ip_literal(v: str, what: str) -> str:
    """An IP address as written (Triton binds IP literals only; it resolves no host name)."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(val._one_line(v, what)))
    except ValueError:
        raise ValueError(f"{v!r} is not an IP address (Triton binds an IP literal, e.g. 10.20.4.11)") from None


class Monitoring(Strict):
    host: str
    prometheus_port: int = Field(9090, ge=1, le=65535)
    grafana_port: int = Field(3000, ge=1, le=65535)


class Rollout(Strict):
    """How reboots roll across hosts: at most `max_parallel_reboots` hosts reboot at once; the next host's reboot
    waits until an earlier one is verified back (new boot, wanted kernel arguments and drivers running), so one
    kernel-argument change never takes every tenant down at once. Hosts go in the order of `hosts`."""

    max_parallel_reboots: int = Field(1, ge=1, le=1024)


class GatewayBackendRef(Strict):
    service: str = Field(description="a services[].name; its Triton serves the gateway's models")
    weight: float = Field(
        gt=0, le=1_000_000, description="share of the load by load-per-weight (seed 001: mig-a 3, vm-b 2)"
    )


class Gateway(Strict):
    """Seed 001's request queue (Redis Stream) and scheduler in front of several TritonServices."""

    name: str
    host: str = Field(description="where Redis and the queue workers run")
    backends: list[GatewayBackendRef] = Field(min_length=1)
    workers: int = Field(2, ge=1, le=64, description="queue worker processes, one consumer each")
    slots: int = Field(8, ge=1, le=1024, description="jobs in flight per worker")
    max_depth: int = Field(
        1000, ge=1, le=10_000_000, description="queued + running jobs; more submits are refused (HTTP 429)"
    )
    redis_bind: str = Field("127.0.0.1", description="address Redis listens on (loopback: workers only)")
    redis_password_secret: Optional[str] = Field(
        None,
        description="name of a secret config value with Redis's password (`pulumi config set --secret NAME`); "
        "required when redis_bind is not loopback",
    )
    front_listen: str = Field("127.0.0.1", description="address the HTTP entry listens on (loopback by default)")
    redis_port: int = Field(6379, ge=1, le=65535)
    redis_maxmemory_mb: Optional[int] = Field(
        None,
        ge=16,
        le=MAX_GIB * 1024,
        description="Redis's memory limit (MiB); past it writes are refused and the front answers 503. Default: a "
        "quarter of one NUMA node of the gateway host (its topology), else 1024",
    )
    metrics_port: int = Field(9470, ge=1, le=65535, description="worker 0's; the next workers count up")
    front_port: int = Field(8090, ge=1, le=65535, description="HTTP entry: POST /v2/models/<m>/infer, 429 when full")
    claim_idle_ms: int = Field(
        5000, ge=100, le=MAX_TIMEOUT_S * 1000, description="a job pending this long on a dead worker is reclaimed"
    )
    ramp_s: float = Field(
        10.0, ge=0, le=MAX_TIMEOUT_S, description="a backend back from a drain reaches full weight over this"
    )
    queue_ms_shift: float = Field(
        20.0, gt=0, le=3_600_000, description="Triton queue time where weight starts moving away"
    )
    queue_ms_drain: float = Field(
        100.0, gt=0, le=3_600_000, description="Triton queue time where the backend is drained"
    )
    slo_p95_s: float = Field(2.5, gt=0, le=3600, description="end-to-end p95 including queueing (alert)")

    _name = field_validator("name")(lambda cls, v: val.dns_label(v, "gateway name"))
    _bind = _v(val.address, "redis_bind", "front_listen")
    _secret = field_validator("redis_password_secret")(lambda cls, v: v if v is None else val.config_key(v))


def artifact_url(v: str) -> str:
    """An http(s) URL of a model artifact: a valid host and port, and no credentials (they come from secret
    config, never from a URL that lands in plain stack config, the state and every log line)."""
    s = val._one_line(v, "url")
    if not re.fullmatch(r"https?://[^\s'\"\\]+", s):
        raise ValueError(f"url {s!r}: an http:// or https:// URL without spaces or quotes")
    u = urlsplit(s)
    if "@" in u.netloc:
        raise ValueError(
            "url holds credentials (user:password@), which belong in secret config "
            "(`pulumi config set --secret ...`), not in the URL"
        )
    try:
        port = u.port
    except ValueError:
        raise ValueError(f"url {s!r}: the port is not a TCP port (use 1-65535)") from None
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"url {s!r}: port {port} is not a TCP port (use 1-65535)")
    host = u.hostname or ""
    try:
        val.address(host)
    except ValueError:
        raise ValueError(f"url {s!r}: {host!r} is neither an IP address nor a DNS host name") from None
    # The query and the fragment (an OAuth-style "#access_token=...").
    params = parse_qsl(u.query, keep_blank_values=True) + parse_qsl(u.fragment, keep_blank_values=True)
    secret_params = sorted({k for k, _ in params if val.secret_param(k)})
    if secret_params:
        raise ValueError(
            f"url carries a credential ({', '.join(secret_params)}), which belongs in secret config "
            "(`pulumi config set --secret ...`), not in the URL"
        )
    return s


class Fleet(Strict):
    hosts: list[Host]
    services: list[Service] = Field(default_factory=list)
    gateways: list[Gateway] = Field(default_factory=list)
    monitoring: Optional[Monitoring] = None
    rollout: Rollout = Field(default_factory=Rollout)


def find_private_keys(obj, path="fleet"):
    """(value, config path) of every string in `obj` that holds a private key (keys belong in secret config)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from find_private_keys(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from find_private_keys(v, f"{path}[{i}]")
    elif isinstance(obj, str) and "PRIVATE KEY-----" in obj:
        yield obj, path
