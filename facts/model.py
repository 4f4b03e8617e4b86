"""Typed host facts: what one read of a host tells the planners. Pure data, no I/O."""

from __future__ import annotations

from typing import Iterable, Optional

from pydantic import BaseModel, Field

from facts.files import FileState

PREFETCH = 0x8
MEM64 = 0x4
IORESOURCE_MEM = 0x200
IORESOURCE_PREFETCH = 0x2000


def os_family(os_id: str, id_like: Iterable[str]) -> str:
    """`debian`, `rhel` or `unknown`, from os-release's ID and ID_LIKE (a host's or a guest's)."""
    ids = {os_id, *id_like}
    if ids & {"debian", "ubuntu"}:
        return "debian"
    if ids & {"rhel", "centos", "fedora", "rocky", "almalinux"}:
        return "rhel"
    return "unknown"


class OsInfo(BaseModel):
    id: str = ""
    id_like: list[str] = Field(default_factory=list)
    version_id: str = ""
    pretty_name: str = ""

    @property
    def family(self) -> str:
        return os_family(self.id, self.id_like)


class Bar(BaseModel):
    index: int
    start: int
    end: int
    flags: int

    @property
    def size(self) -> int:
        return self.end - self.start + 1 if self.end else 0

    @property
    def assigned(self) -> bool:
        return self.start != 0 or self.end != 0

    @property
    def is_mem(self) -> bool:
        return bool(self.flags & IORESOURCE_MEM)

    @property
    def prefetchable(self) -> bool:
        return bool(self.flags & IORESOURCE_PREFETCH)

    @property
    def above_4g(self) -> bool:
        return self.start >= 1 << 32


class PciDevice(BaseModel):
    address: str
    vendor: str = ""
    device: str = ""
    class_code: str = ""
    driver: Optional[str] = None
    driver_override: Optional[str] = None
    numa_node: int = -1
    iommu_group: Optional[int] = None
    sriov_totalvfs: Optional[int] = None
    sriov_numvfs: Optional[int] = None
    vfs: list[str] = Field(default_factory=list)
    physfn: Optional[str] = None
    boot_vga: bool = False
    net: list[str] = Field(default_factory=list)
    bars: list[Bar] = Field(default_factory=list)

    @property
    def slot(self) -> str:
        return self.address.rsplit(".", 1)[0]

    @property
    def function(self) -> int:
        return int(self.address.rsplit(".", 1)[1], 16)

    @property
    def vendor_device(self) -> str:
        return f"{self.vendor.removeprefix('0x')}:{self.device.removeprefix('0x')}"

    @property
    def base_class(self) -> int:
        return int(self.class_code, 16) >> 16 if self.class_code else -1

    @property
    def is_bridge(self) -> bool:
        return self.class_code.startswith("0x0604") or self.class_code.startswith("0x0600")

    @property
    def is_display(self) -> bool:
        return self.base_class == 0x03


class Cpu(BaseModel):
    id: int
    core: int
    socket: int
    node: int
    siblings: list[int]


class NumaNode(BaseModel):
    id: int
    cpus: list[int] = Field(default_factory=list)
    mem_total_kb: int = 0
    mem_free_kb: int = 0
    # page size in kB -> {"nr": n, "free": n}
    hugepages: dict[int, dict[str, int]] = Field(default_factory=dict)


class Irq(BaseModel):
    irq: str
    counts: list[int] = Field(default_factory=list)
    chip: str = ""
    actions: str = ""
    affinity: list[int] = Field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts)


class Iommu(BaseModel):
    dmar_table: bool = False
    ivrs_table: bool = False
    units: list[str] = Field(default_factory=list)
    groups: dict[int, list[str]] = Field(default_factory=dict)
    interrupt_remapping: bool = False
    remapping_evidence: str = ""

    @property
    def firmware_table(self) -> bool:
        return self.dmar_table or self.ivrs_table

    @property
    def active(self) -> bool:
        return bool(self.groups)


class Network(BaseModel):
    default_route_ifaces: list[str] = Field(default_factory=list)
    ssh_ifaces: list[str] = Field(default_factory=list)
    iface_pci: dict[str, str] = Field(default_factory=dict)
    # The session's own SSH_CONNECTION, as sshd set it for gpuhost's connection: "client port local-address port".
    session: str = ""
    # Interfaces stacked on others (bond -> slaves, bridge -> ports, VLAN/macvlan -> parent): /sys/class/net/X/lower_*
    lower: dict[str, list[str]] = Field(default_factory=dict)

    def pci_of(self, iface: str) -> set[str]:
        """The PCI functions under an interface, following bonds, bridges, VLANs and macvlans down."""
        out: set[str] = set()
        todo, seen = [iface], set()
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            if i in self.iface_pci:
                out.add(self.iface_pci[i])
            todo += self.lower.get(i, [])
        return out

    @property
    def protected_ifaces(self) -> list[str]:
        return list(dict.fromkeys([*self.ssh_ifaces, *self.default_route_ifaces]))

    @property
    def protected_pci(self) -> set[str]:
        """PCI devices carrying the SSH session or the default route (through any bond, bridge or VLAN on top):
        never to be bound to vfio."""
        return {a for i in self.protected_ifaces for a in self.pci_of(i)}

    def carrier_of(self, pci: str) -> list[str]:
        """Which protected interfaces a PCI function carries ("ens1 (SSH session)")."""
        return [i for i in self.protected_ifaces if pci in self.pci_of(i)]


class Virt(BaseModel):
    """Is this machine itself a VM guest? (systemd-detect-virt, DMI, the CPU's hypervisor flag)."""

    detect: str = ""
    sys_vendor: str = ""
    product_name: str = ""
    cpu_hypervisor: bool = False

    @property
    def guest(self) -> bool:
        return self.cpu_hypervisor or (self.detect not in ("", "none") and self.detect not in _CONTAINERS)

    @property
    def what(self) -> str:
        name = self.detect if self.detect not in ("", "none") else ""
        dmi = " ".join(x for x in (self.sys_vendor, self.product_name) if x)
        return ", ".join(x for x in (name, dmi) if x) or "hypervisor CPU flag"


_CONTAINERS = ("docker", "podman", "lxc", "lxc-libvirt", "systemd-nspawn", "openvz", "rkt", "wsl", "proot", "pouch")


class HostFacts(BaseModel):
    os: OsInfo = Field(default_factory=OsInfo)
    kernel: str = ""
    cmdline: list[str] = Field(default_factory=list)
    iommu: Iommu = Field(default_factory=Iommu)
    pci: dict[str, PciDevice] = Field(default_factory=dict)
    cpus: list[Cpu] = Field(default_factory=list)
    online: list[int] = Field(default_factory=list)
    isolated: list[int] = Field(default_factory=list)
    nodes: dict[int, NumaNode] = Field(default_factory=dict)
    modules: list[str] = Field(default_factory=list)
    module_config: dict[str, str] = Field(default_factory=dict)
    irqbalance_active: Optional[bool] = None
    tuned_profile: Optional[str] = None
    governors: dict[int, str] = Field(default_factory=dict)
    interrupts: list[Irq] = Field(default_factory=list)
    network: Network = Field(default_factory=Network)
    driverctl_overrides: dict[str, str] = Field(default_factory=dict)
    sysctls: dict[str, str] = Field(default_factory=dict)
    files: dict[str, FileState] = Field(default_factory=dict)
    boot_id: str = ""
    tools: list[str] = Field(default_factory=list)
    kmods_available: list[str] = Field(default_factory=list)
    pci_errors: list[str] = Field(default_factory=list)
    virt: Virt = Field(default_factory=Virt)
    # GRUB_CMDLINE_LINUX(_DEFAULT)= lines of /etc/default/grub and `BLS options ...` of /boot/loader/entries: what
    # the next boot will run (plans.cmdline parses them).
    boot_config: list[str] = Field(default_factory=list)
    # Live module parameters that weaken isolation ({"vfio_iommu_type1.allow_unsafe_interrupts": "Y"}).
    module_params: dict[str, str] = Field(default_factory=dict)

    # -- questions planners ask -----------------------------------------------------------------------------------
    def device(self, address: str) -> Optional[PciDevice]:
        return self.pci.get(normalize_pci(address))

    def slot_functions(self, address: str) -> list[PciDevice]:
        d = self.device(address)
        if d is None:
            return []
        return sorted((x for x in self.pci.values() if x.slot == d.slot), key=lambda x: x.function)

    def group_members(self, address: str) -> list[PciDevice]:
        d = self.device(address)
        if d is None or d.iommu_group is None:
            return []
        return [self.pci[a] for a in self.iommu.groups.get(d.iommu_group, []) if a in self.pci]

    def cmdline_value(self, key: str) -> Optional[str]:
        for arg in self.cmdline:
            k, sep, v = arg.partition("=")
            if k == key:
                return v if sep else ""
        return None

    def siblings_of(self, cpu: int) -> list[int]:
        for c in self.cpus:
            if c.id == cpu:
                return c.siblings
        return [cpu]


def normalize_pci(address: str) -> str:
    a = address.strip().lower()
    if a.count(":") == 1:
        a = "0000:" + a
    return a
