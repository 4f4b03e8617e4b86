"""A tenant VM's libvirt domain XML from its placement, and back.

`render(spec)` writes seed 002's domain (§八): q35, OVMF, `host-passthrough` CPU whose topology matches the
pinning, one guest NUMA cell backed strictly by the host node (`numatune` strict + `memnode`), hugepages,
`cputune` (vcpupin, emulatorpin, iothreadpin), `iothreads`, a virtio qcow2 disk served by IO thread 1, a
cloud-init NoCloud seed ISO, `hostdev` for every GPU function (`managed='yes'`, `<rom bar='on'/>`) and for every
VF, and, for consumer cards (seed 001 route B), `kvm hidden` / `hv_vendor_id`.

`parse(xml)` reads a domain XML (for instance libvirt's live `XMLDesc`) back into a `DomainSpec`, so that
`read` reports drift in the inputs' own terms. `parse(render(s)) == s` for every valid spec.

Example:
    spec = DomainSpec.from_placement(plan.vm("tenant-a"), disk="/var/lib/libvirt/images/tenant-a.qcow2",
                                     gpus=["0000:65:00.0", "0000:65:00.1"], vfs=["0000:41:02.3"])
    xml = render(spec)
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from plans.placement import PAGE_KIB, VmPlacement, cpuset_str, parse_cpuset

PCI_RE = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
DEFAULT_LOADER = "/usr/share/OVMF/OVMF_CODE_4M.fd"
DEFAULT_VARS = "/usr/share/OVMF/OVMF_VARS_4M.fd"


def _pci(address: str) -> str:
    a = address.strip().lower()
    if a.count(":") == 1:
        a = "0000:" + a
    if not PCI_RE.fullmatch(a):
        raise ValueError(f"not a PCI address: {address!r}")
    return a


class Topology(BaseModel):
    model_config = ConfigDict(frozen=True)
    sockets: int = 1
    cores: int = 1
    threads: int = 1


class DomainSpec(BaseModel):
    """Everything the domain XML says, in the inputs' terms.

    Args:
        name: domain name.
        domain_type: "kvm" in production; "qemu" (TCG) on the emulated host; "test" for libvirt's test driver.
        cpu_mode: "host-passthrough" (seed 002); "maximum" where there is no KVM (TCG cannot pass the host CPU).
        memory_mib / page_size: guest memory and its backing ("1G", "2M" hugepages or "4K").
        vcpupin: host CPU of each vCPU (index = vCPU); emulatorpin; iothreadpin: cpuset per IO thread.
        numa_node: host node for `numatune` strict (None: no numatune).
        topology: guest sockets/cores/threads; sockets*cores*threads == len(vcpupin).
        loader / nvram_template / nvram: OVMF code, vars template and the VM's own vars file (None: SeaBIOS).
        disk: the VM's qcow2 overlay path; seed_iso: the cloud-init NoCloud ISO path.
        kernel / initrd / cmdline: optional direct kernel boot (a tiny guest for tests).
        network: libvirt network for a virtio NIC (None: no NIC).
        bridge: a host bridge for the virtio NIC instead (seed 002: the tenant's own address on the fabric);
            mac: its MAC address, so cloud-init's static address lands on this NIC and not on a VF.
        console_log: write the serial console to this file on the host (None: a pty for `virsh console`).
        gpus: every function of every GPU (e.g. VGA and HDA); vfs: SR-IOV VFs.
        hide_kvm / hv_vendor_id: hide the hypervisor from consumer-card drivers (seed 001, 4090).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
    domain_type: Literal["kvm", "qemu", "test"] = "kvm"
    arch: str = "x86_64"
    machine: str = "q35"
    cpu_mode: Literal["host-passthrough", "maximum"] = "host-passthrough"
    memory_mib: int = Field(gt=0)
    page_size: Literal["1G", "2M", "4K"] = "1G"
    vcpupin: tuple[int, ...]
    emulatorpin: tuple[int, ...] = ()
    iothreadpin: tuple[tuple[int, ...], ...] = ()
    numa_node: Optional[int] = None
    topology: Topology
    loader: Optional[str] = DEFAULT_LOADER
    nvram_template: Optional[str] = DEFAULT_VARS
    nvram: Optional[str] = None
    disk: Optional[str] = None
    seed_iso: Optional[str] = None
    kernel: Optional[str] = None
    initrd: Optional[str] = None
    cmdline: Optional[str] = None
    network: Optional[str] = None
    bridge: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,15}$")
    mac: Optional[str] = Field(None, pattern=r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")
    console_log: Optional[str] = None
    gpus: tuple[str, ...] = ()
    vfs: tuple[str, ...] = ()
    hide_kvm: bool = False
    hv_vendor_id: Optional[str] = Field(default=None, pattern=r"^[A-Za-z0-9]{1,12}$")

    @field_validator("gpus", "vfs", mode="before")
    @classmethod
    def _norm_pci(cls, v):
        return tuple(_pci(a) for a in v)

    @model_validator(mode="before")
    @classmethod
    def _no_firmware_no_vars(cls, data):
        # SeaBIOS has no UEFI variable store: drop the vars template so a spec equals its own reading
        if isinstance(data, dict) and "loader" in data and data["loader"] is None:
            data = {**data, "nvram_template": None, "nvram": None}
        elif isinstance(data, dict) and not data.get("nvram") and isinstance(data.get("name"), str):
            # libvirt's own default, written out so that the live XML reads back equal
            data = {**data, "nvram": f"/var/lib/libvirt/qemu/nvram/{data['name']}_VARS.fd"}
        return data

    @model_validator(mode="after")
    def _consistent(self):
        t = self.topology
        if t.sockets * t.cores * t.threads != len(self.vcpupin):
            raise ValueError(f"topology {t.sockets}x{t.cores}x{t.threads} != {len(self.vcpupin)} vCPUs")
        if not self.vcpupin:
            raise ValueError("at least one vCPU")
        if self.page_size != "4K" and (self.memory_mib * 1024) % PAGE_KIB[self.page_size]:
            raise ValueError(f"memory {self.memory_mib} MiB is not a whole number of {self.page_size} pages")
        dup = set(self.gpus) & set(self.vfs)
        if dup or len(set(self.gpus)) != len(self.gpus) or len(set(self.vfs)) != len(self.vfs):
            raise ValueError("a PCI function is listed twice")
        return self

    @property
    def nvram_path(self) -> Optional[str]:
        return self.nvram if self.loader else None

    @classmethod
    def from_placement(cls, vm: VmPlacement, **rest) -> "DomainSpec":
        """A spec whose CPU/memory part is the solver's placement; `rest` fills the other fields."""
        return cls(
            name=rest.pop("name", vm.name),
            memory_mib=vm.memory_mib,
            page_size=vm.page_size,
            vcpupin=vm.vcpupin,
            emulatorpin=vm.emulatorpin,
            iothreadpin=vm.iothreadpin,
            numa_node=vm.node,
            topology=Topology(sockets=vm.topology.sockets, cores=vm.topology.cores, threads=vm.topology.threads),
            **rest,
        )


# ---------------------------------------------------------------------------------------------------- render


def _sub(parent: ET.Element, tag: str, text: Optional[str] = None, **attrs) -> ET.Element:
    e = ET.SubElement(parent, tag, {k.rstrip("_"): str(v) for k, v in attrs.items()})
    if text is not None:
        e.text = text
    return e


def _hostdev(devices: ET.Element, address: str, rom_bar: bool) -> None:
    m = PCI_RE.fullmatch(address)
    if m is None:
        raise ValueError(f"not a PCI address: {address!r}")
    dom, bus, slot, fn = m.groups()
    h = _sub(devices, "hostdev", mode="subsystem", type="pci", managed="yes")
    _sub(h, "driver", name="vfio")
    src = _sub(h, "source")
    _sub(src, "address", domain=f"0x{dom}", bus=f"0x{bus}", slot=f"0x{slot}", function=f"0x{fn}")
    if rom_bar:
        _sub(h, "rom", bar="on")


def render_element(spec: DomainSpec, uuid: Optional[str] = None) -> ET.Element:
    """The <domain> element, part by part in libvirt's own order: name, memory, CPU tuning, os, features, cpu,
    lifecycle, devices."""
    d = ET.Element("domain", {"type": spec.domain_type})
    _sub(d, "name", spec.name)
    if uuid:
        _sub(d, "uuid", uuid)
    _render_memory(d, spec)
    _render_cputune(d, spec)
    _render_os(d, spec)
    _render_features(d, spec)
    _render_cpu(d, spec)
    _sub(d, "on_poweroff", "destroy")
    _sub(d, "on_reboot", "restart")
    _sub(d, "on_crash", "destroy")
    _render_devices(_sub(d, "devices"), spec)
    return d


def _render_memory(d: ET.Element, spec: DomainSpec) -> None:
    _sub(d, "memory", str(spec.memory_mib), unit="MiB")
    _sub(d, "currentMemory", str(spec.memory_mib), unit="MiB")
    if spec.page_size != "4K":
        mb = _sub(d, "memoryBacking")
        hp = _sub(mb, "hugepages")
        _sub(hp, "page", size=str(PAGE_KIB[spec.page_size]), unit="KiB")


def _render_cputune(d: ET.Element, spec: DomainSpec) -> None:
    """vCPU count and pins, emulator and IO-thread pins, and the strict NUMA memory policy."""
    _sub(d, "vcpu", str(len(spec.vcpupin)), placement="static")
    if spec.iothreadpin:
        _sub(d, "iothreads", str(len(spec.iothreadpin)))
    ct = _sub(d, "cputune")
    for i, cpu in enumerate(spec.vcpupin):
        _sub(ct, "vcpupin", vcpu=i, cpuset=cpu)
    if spec.emulatorpin:
        _sub(ct, "emulatorpin", cpuset=cpuset_str(spec.emulatorpin))
    for i, cs in enumerate(spec.iothreadpin):
        _sub(ct, "iothreadpin", iothread=i + 1, cpuset=cpuset_str(cs))
    if spec.numa_node is not None:
        nt = _sub(d, "numatune")
        _sub(nt, "memory", mode="strict", nodeset=spec.numa_node)
        _sub(nt, "memnode", cellid=0, mode="strict", nodeset=spec.numa_node)


def _render_os(d: ET.Element, spec: DomainSpec) -> None:
    os_ = _sub(d, "os")
    _sub(os_, "type", "hvm", arch=spec.arch, machine=spec.machine)
    if spec.loader:
        _sub(os_, "loader", spec.loader, readonly="yes", type="pflash")
        nv = _sub(os_, "nvram", spec.nvram_path)
        if spec.nvram_template:
            nv.set("template", spec.nvram_template)
    if spec.kernel:
        _sub(os_, "kernel", spec.kernel)
        if spec.initrd:
            _sub(os_, "initrd", spec.initrd)
        if spec.cmdline:
            _sub(os_, "cmdline", spec.cmdline)
    else:
        _sub(os_, "boot", dev="hd")


def _render_features(d: ET.Element, spec: DomainSpec) -> None:
    feats = _sub(d, "features")
    _sub(feats, "acpi")
    _sub(feats, "apic")
    if spec.hv_vendor_id:
        hv = _sub(feats, "hyperv", mode="custom")
        _sub(hv, "vendor_id", state="on", value=spec.hv_vendor_id)
    if spec.hide_kvm:
        kvm = _sub(feats, "kvm")
        _sub(kvm, "hidden", state="on")


def _render_cpu(d: ET.Element, spec: DomainSpec) -> None:
    cpu_el = _sub(d, "cpu", mode=spec.cpu_mode, check="none")
    if spec.cpu_mode == "host-passthrough":
        cpu_el.set("migratable", "off")  # pinned to this host's GPU anyway; expose every host feature
    t = spec.topology
    _sub(cpu_el, "topology", sockets=t.sockets, dies=1, cores=t.cores, threads=t.threads)
    if spec.numa_node is not None:
        numa = _sub(cpu_el, "numa")
        _sub(numa, "cell", id=0, cpus=f"0-{len(spec.vcpupin) - 1}", memory=spec.memory_mib, unit="MiB")


def _render_devices(dev: ET.Element, spec: DomainSpec) -> None:
    """Disk and seed ISO, the NIC, passed-through GPUs and VFs, the serial console, no balloon."""
    if spec.disk:
        disk = _sub(dev, "disk", type="file", device="disk")
        drv = _sub(disk, "driver", name="qemu", type="qcow2", cache="none", io="native", discard="unmap")
        if spec.iothreadpin:
            drv.set("iothread", "1")
        _sub(disk, "source", file=spec.disk)
        _sub(disk, "target", dev="vda", bus="virtio")
    if spec.seed_iso:
        cd = _sub(dev, "disk", type="file", device="cdrom")
        _sub(cd, "driver", name="qemu", type="raw")
        _sub(cd, "source", file=spec.seed_iso)
        _sub(cd, "target", dev="sda", bus="sata")
        _sub(cd, "readonly")
    if spec.bridge:
        nic = _sub(dev, "interface", type="bridge")
        if spec.mac:
            _sub(nic, "mac", address=spec.mac)
        _sub(nic, "source", bridge=spec.bridge)
        _sub(nic, "model", type="virtio")
    elif spec.network:
        nic = _sub(dev, "interface", type="network")
        _sub(nic, "source", network=spec.network)
        _sub(nic, "model", type="virtio")
    for a in spec.gpus:
        _hostdev(dev, a, rom_bar=True)
    for a in spec.vfs:
        _hostdev(dev, a, rom_bar=False)
    kind = "file" if spec.console_log else "pty"
    for tag, target in (("serial", {}), ("console", {"type": "serial"})):
        el = _sub(dev, tag, type=kind)
        if spec.console_log:
            _sub(el, "source", path=spec.console_log)
        _sub(el, "target", **target, port=0)
    _sub(dev, "memballoon", model="none")  # ballooning and hugepage-pinned passthrough memory do not mix


def render(spec: DomainSpec, uuid: Optional[str] = None) -> str:
    """The domain XML text for `spec` (indented, no XML declaration); `uuid` to redefine an existing domain."""
    root = render_element(spec, uuid)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode") + "\n"


# ---------------------------------------------------------------------------------------------------- parse


def _mib(e: Optional[ET.Element]) -> int:
    if e is None:
        return 0
    unit = (e.get("unit") or "KiB").lower()
    factor = {
        "b": 1 / 1048576,
        "bytes": 1 / 1048576,
        "k": 1 / 1024,
        "kib": 1 / 1024,
        "kb": 1000 / 1048576,
        "m": 1,
        "mib": 1,
        "mb": 1e6 / 1048576,
        "g": 1024,
        "gib": 1024,
        "gb": 1e9 / 1048576,
        "t": 1048576,
        "tib": 1048576,
    }[unit]
    return int(round(int(e.text or "0") * factor))


def _attr(e: ET.Element, key: str) -> str:
    """An attribute the domain XML must have (libvirt always writes it); a clear error where it is missing."""
    v = e.get(key)
    if v is None:
        raise ValueError(f"domain XML: <{e.tag}> has no {key!r} attribute")
    return v


def _elem(d: ET.Element, path: str) -> ET.Element:
    e = d.find(path)
    if e is None:
        raise ValueError(f"domain XML: no <{path}>")
    return e


def _addr(a: ET.Element) -> str:
    return "{:04x}:{:02x}:{:02x}.{:x}".format(
        int(a.get("domain", "0"), 0),
        int(_attr(a, "bus"), 0),
        int(_attr(a, "slot"), 0),
        int(_attr(a, "function"), 0),
    )


def parse(xml: str) -> DomainSpec:
    """A domain XML (generated or live) in the inputs' terms. Things libvirt adds (uuid, guest PCI addresses,
    controllers, the expanded machine type `pc-q35-8.2`) are dropped or folded back (`q35`)."""
    d = ET.fromstring(xml)
    name = d.findtext("name")
    # read in document order, so that of several faults the first one is the one reported
    memory, page_size = _mib(d.find("memory")), _parse_page_size(d)
    nvcpu = int(d.findtext("vcpu") or "1")
    pins = {int(_attr(p, "vcpu")): parse_cpuset(_attr(p, "cpuset")) for p in d.findall("cputune/vcpupin")}
    emu = d.find("cputune/emulatorpin")
    niothreads = int(d.findtext("iothreads") or "0")
    iopins = {int(_attr(p, "iothread")): parse_cpuset(_attr(p, "cpuset")) for p in d.findall("cputune/iothreadpin")}
    numa_node = _parse_numa_node(d)
    ostype = _elem(d, "os/type")
    machine = ostype.get("machine", "q35")
    if re.match(r"^pc-q35-", machine):
        machine = "q35"
    loader = d.find("os/loader")
    nvram = d.find("os/nvram")
    cpu = d.find("cpu")
    topology = _parse_topology(cpu, nvcpu)
    disk, seed = _parse_disks(d)
    network, bridge, mac = _parse_nic(d)
    gpus, vfs = _parse_hostdevs(d)
    serial = d.find("devices/serial[@type='file']/source")
    vendor = d.find("features/hyperv/vendor_id")
    hidden = d.find("features/kvm/hidden")
    # model_construct: a live domain is read as it is, unvalidated (libvirt may hold values gpuhost never writes),
    # so the fields go in as parsed, whatever their declared Literal types allow.
    fields: dict[str, Any] = dict(
        name=name,
        domain_type=d.get("type"),
        arch=ostype.get("arch", "x86_64"),
        machine=machine,
        cpu_mode=cpu.get("mode") if cpu is not None else "host-passthrough",
        memory_mib=memory,
        page_size=page_size,
        vcpupin=tuple(pins[i][0] if len(pins.get(i, ())) == 1 else -1 for i in range(nvcpu)),
        emulatorpin=parse_cpuset(_attr(emu, "cpuset")) if emu is not None else (),
        iothreadpin=tuple(iopins.get(i, ()) for i in range(1, niothreads + 1)),
        numa_node=numa_node,
        topology=topology,
        loader=loader.text if loader is not None else None,
        nvram_template=nvram.get("template") if nvram is not None else None,
        nvram=nvram.text if nvram is not None else None,
        disk=disk,
        seed_iso=seed,
        kernel=d.findtext("os/kernel"),
        initrd=d.findtext("os/initrd"),
        cmdline=d.findtext("os/cmdline"),
        network=network,
        bridge=bridge,
        mac=mac,
        console_log=serial.get("path") if serial is not None else None,
        gpus=tuple(gpus),
        vfs=tuple(vfs),
        hide_kvm=hidden is not None and hidden.get("state") == "on",
        hv_vendor_id=vendor.get("value") if vendor is not None and vendor.get("state") == "on" else None,
    )
    return DomainSpec.model_construct(**fields)


def _parse_page_size(d: ET.Element) -> str:
    page = d.find("memoryBacking/hugepages/page")
    if page is not None:
        kib = (
            int(_attr(page, "size"))
            * {"kib": 1, "k": 1, "mib": 1024, "m": 1024, "gib": 1048576, "g": 1048576}[
                (page.get("unit") or "KiB").lower()
            ]
        )
        return {v: k for k, v in PAGE_KIB.items()}.get(kib, "4K")
    if d.find("memoryBacking/hugepages") is not None:
        return "2M"  # libvirt's default hugepage size on x86 when none is named
    return "4K"


def _parse_numa_node(d: ET.Element) -> Optional[int]:
    """The one node of a strict `numatune` memory policy; None without one, or with several nodes."""
    mem = d.find("numatune/memory")
    if mem is not None and mem.get("nodeset") is not None:
        nodes = parse_cpuset(_attr(mem, "nodeset"))
        return nodes[0] if len(nodes) == 1 else None
    return None


def _parse_topology(cpu: Optional[ET.Element], nvcpu: int) -> Topology:
    topo = cpu.find("topology") if cpu is not None else None
    if topo is None:
        return Topology(sockets=1, cores=nvcpu, threads=1)
    return Topology(
        sockets=int(topo.get("sockets", 1)), cores=int(topo.get("cores", 1)), threads=int(topo.get("threads", 1))
    )


def _parse_disks(d: ET.Element) -> tuple[Optional[str], Optional[str]]:
    """(the first disk's file, the first cdrom's file): the VM's overlay and its seed ISO."""
    disk: str | None = None
    seed: str | None = None
    for dk in d.findall("devices/disk"):
        src = dk.find("source")
        path = src.get("file") if src is not None else None
        if dk.get("device") == "disk" and disk is None:
            disk = path
        elif dk.get("device") == "cdrom" and seed is None:
            seed = path
    return disk, seed


def _parse_nic(d: ET.Element) -> tuple[Optional[str], Optional[str], Optional[str]]:
    """(libvirt network, host bridge, the bridge NIC's MAC)."""
    nic = d.find("devices/interface[@type='network']/source")
    network = nic.get("network") if nic is not None else None
    bridge: str | None = None
    mac: str | None = None
    br = d.find("devices/interface[@type='bridge']")
    if br is not None:
        br_source, br_mac = br.find("source"), br.find("mac")
        bridge = br_source.get("bridge") if br_source is not None else None
        mac = br_mac.get("address") if br_mac is not None else None
    return network, bridge, mac


def _parse_hostdevs(d: ET.Element) -> tuple[list[str], list[str]]:
    """(GPU functions, VFs) of the PCI hostdevs: a GPU is passed with its ROM BAR on, a VF without."""
    gpus: list[str] = []
    vfs: list[str] = []
    for h in d.findall("devices/hostdev[@type='pci']"):
        a = h.find("source/address")
        if a is None:
            continue
        rom = h.find("rom")
        (gpus if rom is not None and rom.get("bar") == "on" else vfs).append(_addr(a))
    return gpus, vfs


def drift(wanted: DomainSpec, live: DomainSpec) -> dict[str, tuple]:
    """Fields where the live domain differs from the wanted one: {field: (wanted, live)}."""
    out = {}
    for f in DomainSpec.model_fields:
        w, lv = getattr(wanted, f), getattr(live, f)
        if w != lv:
            out[f] = (w, lv)
    return out


# ---------------------------------------------------------------------------------------------------- cloud-init seed


class CloudInit(BaseModel):
    """The guest's first-boot identity, as a cloud-init NoCloud seed (an ISO9660 volume labelled `cidata`).

    Args:
        user: the login user created in the guest (sudo without password, key login only).
        ssh_authorized_keys: public keys for `user`. Public keys only: the seed is readable by the guest.
        hostname: defaults to the domain name.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    user: str = Field("ops", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    ssh_authorized_keys: tuple[str, ...] = ()
    hostname: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$")
    network: Optional["StaticNetwork"] = None

    @field_validator("ssh_authorized_keys")
    @classmethod
    def _public_only(cls, v):
        for k in v:
            if "PRIVATE KEY" in k or not k.split()[0].startswith(("ssh-", "ecdsa-", "sk-")):
                raise ValueError("ssh_authorized_keys takes public keys ('ssh-ed25519 AAAA...') only")
        return v


class StaticNetwork(BaseModel):
    """A static address for the bridged NIC (netplan v2 `network-config` in the NoCloud seed).

    Args:
        mac: the NIC to configure (the domain's bridged interface carries the same MAC).
        address: CIDR, e.g. "10.20.1.11/24"; gateway / dns: optional.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    mac: str = Field(pattern=r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")
    address: str
    gateway: Optional[str] = None
    dns: tuple[str, ...] = ()

    @field_validator("address")
    @classmethod
    def _address(cls, v):
        import ipaddress

        if "/" not in v:
            raise ValueError(f"address {v!r}: CIDR, e.g. 10.20.1.11/24")
        return str(ipaddress.ip_interface(v))

    @field_validator("gateway")
    @classmethod
    def _gateway(cls, v):
        import ipaddress

        return None if v is None else str(ipaddress.ip_address(v))

    @field_validator("dns")
    @classmethod
    def _dns(cls, v):
        import ipaddress

        return tuple(str(ipaddress.ip_address(a)) for a in v)


CloudInit.model_rebuild()


def vm_mac(name: str) -> str:
    """A stable locally administered MAC (QEMU's 52:54:00 prefix) for a VM's bridged NIC."""
    import hashlib

    h = hashlib.sha256(name.encode()).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in h[:3])


def network_config(net: StaticNetwork) -> str:
    """netplan v2 as JSON (valid YAML): the NIC matched by MAC, a static address, no DHCP."""
    import json

    eth: dict = {"match": {"macaddress": net.mac}, "set-name": "eth0", "dhcp4": False, "addresses": [net.address]}
    if net.gateway:
        eth["routes"] = [{"to": "default", "via": net.gateway}]
    if net.dns:
        eth["nameservers"] = {"addresses": list(net.dns)}
    return json.dumps({"version": 2, "ethernets": {"eth0": eth}}, indent=1) + "\n"


def cloud_init_files(ci: CloudInit, instance_id: str) -> dict[str, str]:
    """`meta-data` and `user-data` of the NoCloud seed. JSON is valid YAML, so no YAML library is needed and
    nothing can be injected through a key comment."""
    import json

    host = ci.hostname or re.sub(r"[^A-Za-z0-9-]", "-", instance_id)[:63]
    meta = json.dumps({"instance-id": instance_id, "local-hostname": host}, indent=1)
    user = {
        "hostname": host,
        "users": [
            {
                "name": ci.user,
                "sudo": "ALL=(ALL) NOPASSWD:ALL",
                "shell": "/bin/bash",
                "lock_passwd": True,
                "ssh_authorized_keys": list(ci.ssh_authorized_keys),
            }
        ],
        "ssh_pwauth": False,
        "disable_root": True,
    }
    files = {"meta-data": meta + "\n", "user-data": "#cloud-config\n" + json.dumps(user, indent=1) + "\n"}
    if ci.network:
        files["network-config"] = network_config(ci.network)
    return files


def seed_iso(ci: CloudInit, instance_id: str) -> bytes:
    """The NoCloud seed ISO (volume id `cidata`, Joliet + Rock Ridge names) as bytes, built in memory."""
    import io

    import pycdlib

    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident="cidata")
    for name, text in sorted(cloud_init_files(ci, instance_id).items()):
        data = text.encode()
        iso_name = name.upper().replace("-", "_") + ".;1"
        iso.add_fp(io.BytesIO(data), len(data), "/" + iso_name, rr_name=name, joliet_path="/" + name)
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()
