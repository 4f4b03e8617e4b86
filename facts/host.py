"""Read a whole host in ONE round trip: one script prints every section; pure parsers turn each into typed facts.

Usage::

    facts = read_host_facts(conn, sysctls=["vm.nr_hugepages"], files=["/etc/default/grub"])
    facts.iommu.active, facts.device("0000:81:00.0").iommu_group, facts.files["/etc/default/grub"].text

The script is constant text written here; the only values in it (extra sysctl names and file paths) go through
`access.shell.quote`. Sections start with a line `@@<name>`; the parsers below take a section's text and nothing else,
so they are tested on captured output in tests/fixtures/facts/.
"""

from __future__ import annotations

import re
import shlex
from typing import Callable, Iterable, Optional

from access.shell import Script, quote
from facts.cpulist import parse_cpulist
from facts.files import files_script, parse_files
from facts.model import Bar, Cpu, HostFacts, Iommu, Irq, Network, NumaNode, OsInfo, PciDevice, Virt

# Files whose presence/content matters to vfio and nouveau decisions.
MODULE_CONFIG_GLOBS = "/etc/modprobe.d/* /etc/modules-load.d/* /etc/modules /usr/lib/modprobe.d/*"

_SECTIONS = r"""
echo @@os-release; cat /etc/os-release 2>/dev/null
echo @@kernel; uname -r
echo @@boot-id; cat /proc/sys/kernel/random/boot_id
echo @@cmdline; cat /proc/cmdline
echo @@acpi-tables; ls /sys/firmware/acpi/tables/ 2>/dev/null
echo @@iommu-units; ls /sys/class/iommu/ 2>/dev/null
echo @@iommu-groups; for d in /sys/kernel/iommu_groups/*/devices/*; do [ -e "$d" ] || continue; g=${d%/devices/*}; echo "${g##*/} ${d##*/}"; done
D=$(dmesg 2>/dev/null)
echo @@intremap; printf '%s\n' "$D" | grep -iE 'remapping|x2apic|DMAR-IR|AMD-Vi.*Interrupt' | tail -n 20
echo @@pci
P=/sys/bus/pci/devices
(cd $P && grep -H . */vendor */device */class */numa_node */sriov_totalvfs */sriov_numvfs */boot_vga */driver_override 2>/dev/null)
echo @@pci-links
find /sys/devices/pci[0-9a-f]*:* -type l \( -name driver -o -name iommu_group -o -name physfn -o -name 'virtfn*' \) -printf '%h %f %l\n' 2>/dev/null
echo @@pci-net
(cd $P && ls -d */net/* 2>/dev/null)
echo @@pci-res
(cd $P && grep -Hn . */resource 2>/dev/null)
echo @@cpus
(cd /sys/devices/system/cpu && grep -H . cpu[0-9]*/topology/core_id cpu[0-9]*/topology/physical_package_id cpu[0-9]*/topology/thread_siblings_list 2>/dev/null)
echo @@cpu-online; cat /sys/devices/system/cpu/online
echo @@cpu-isolated; cat /sys/devices/system/cpu/isolated 2>/dev/null
echo @@nodes
(cd /sys/devices/system/node && grep -H . node[0-9]*/cpulist node[0-9]*/hugepages/*/nr_hugepages node[0-9]*/hugepages/*/free_hugepages 2>/dev/null; grep -H -E 'MemTotal|MemFree' node[0-9]*/meminfo 2>/dev/null)
echo @@modules; cut -d' ' -f1 /proc/modules 2>/dev/null
echo @@module-config
for f in $(grep -liE 'vfio|nouveau|nvidia|kvm' __MODULE_CONFIG_GLOBS__ 2>/dev/null); do echo "@file $f"; cat "$f"; done
echo @@irqbalance; systemctl is-active irqbalance 2>/dev/null || true
echo @@tuned; cat /etc/tuned/active_profile 2>/dev/null
echo @@governors; (cd /sys/devices/system/cpu && grep -H . cpu[0-9]*/cpufreq/scaling_governor 2>/dev/null)
echo @@interrupts; cat /proc/interrupts
echo @@irq-affinity; (cd /proc/irq && grep -H . [0-9]*/smp_affinity_list 2>/dev/null)
echo @@net-default; ip -o route show default 2>/dev/null
echo @@net-ssh; (ss -Htn state established '( sport = :22 )' 2>/dev/null || true) | awk '{print $3}'
echo @@net-addrs; ip -o addr show 2>/dev/null | awk '{print $2, $4}'
echo @@net-pci; for n in /sys/class/net/*; do [ -e "$n/device" ] && echo "${n##*/} $(readlink -f "$n/device")"; done
echo @@driverctl; (cd /etc/driverctl.d 2>/dev/null && grep -H . pci-* 2>/dev/null)
echo @@tools; for t in driverctl update-initramfs dracut update-grub grub2-mkconfig grubby tuned-adm cpupower irqbalance systemctl virsh nvidia-smi; do command -v $t >/dev/null 2>&1 && echo $t; done
echo @@kmods; (k=/lib/modules/$(uname -r); cat $k/modules.dep $k/modules.builtin 2>/dev/null | grep -oE '/(vfio|vfio[-_]pci|vfio[-_]iommu[-_]type1|vfio[-_]virqfd|nouveau|nvidia)\.ko' | sort -u)
echo @@pci-errors; printf '%s\n' "$D" | grep -iE 'not enough MMIO|BAR [0-9]+: (no space|failed to assign)' | tail -n 20
echo @@virt
echo "detect=$(systemd-detect-virt 2>/dev/null)"
echo "sys_vendor=$(cat /sys/class/dmi/id/sys_vendor 2>/dev/null)"
echo "product_name=$(cat /sys/class/dmi/id/product_name 2>/dev/null)"
grep -qw hypervisor /proc/cpuinfo 2>/dev/null && echo cpu_hypervisor=1
echo @@boot-config
grep -hE '^[[:space:]]*(export[[:space:]]+)?GRUB_CMDLINE_LINUX(_DEFAULT)?=' /etc/default/grub 2>/dev/null
grep -h '^options' /boot/loader/entries/*.conf 2>/dev/null | sed 's/^options/BLS/'
echo @@module-params
for p in /sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts /sys/module/vfio/parameters/enable_unsafe_noiommu_mode; do [ -r "$p" ] && { m=${p#/sys/module/}; echo "${m%%/*}.${p##*/}=$(cat "$p")"; }; done
echo @@ssh-session
p=$$; while [ "${p:-1}" -gt 1 ]; do c=$(tr '\0' '\n' < /proc/$p/environ 2>/dev/null | sed -n 's/^SSH_CONNECTION=//p'); [ -n "$c" ] && { echo "$c"; break; }; p=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f2); done
echo @@net-links
for n in /sys/class/net/*; do l=; for x in "$n"/lower_*; do [ -e "$x" ] && l="$l ${x##*/lower_}"; done; echo "${n##*/}${l}"; done
""".replace("__MODULE_CONFIG_GLOBS__", MODULE_CONFIG_GLOBS)


def _split_sections(text: str) -> dict[str, str]:
    """_SECTIONS as {name: its shell text} in order; `D=$(dmesg ...)` (shared by two sections) goes to neither."""
    out: dict[str, list[str]] = {}
    cur = ""
    for line in text.strip().splitlines():
        m = re.match(r"^echo @@([a-z0-9-]+)", line)
        if m:
            cur = m.group(1)
        if not line.startswith("D="):
            out.setdefault(cur, []).append(line)
    return {k: "\n".join(v) for k, v in out.items()}


SECTIONS = _split_sections(_SECTIONS)
_DMESG = "D=$(dmesg 2>/dev/null)"
# Narrow sections that the full read does not print (a step's plan reads these instead of a volatile whole one).
EXTRA_SECTIONS = {
    # 2 MiB page counts per node (the `nodes` section also has free pages and free memory, which move all the time)
    "hugepages-nr": "echo @@nodes\n(cd /sys/devices/system/node && grep -H . "
    "node[0-9]*/hugepages/hugepages-2048kB/nr_hugepages 2>/dev/null)",
    # Each initramfs image's size, times and inode: a rebuild (a new file renamed into place) changes them, so an
    # earlier listing of the image (plans.vfio) still holds while these do. One exec for all images.
    "initramfs-stamp": "echo @@initramfs-stamp\n"
    "stat -c '%n %s %Y %Z %i' /boot/initrd.img-* /boot/initramfs-*.img 2>/dev/null || true",
}


def carved_script(full: str, sections: Iterable[str]) -> str:
    """Shell text printing `sections` (names of SECTIONS, in the order given) out of `full`, a file holding the
    output of the whole read (`facts_script()`): the same bytes as running them again a moment later, without
    running them. One awk for all of them."""
    names = list(sections)
    bad = [n for n in names if n not in SECTIONS]
    if bad:
        raise ValueError(f"not sections of the whole read: {', '.join(bad)}")
    prog = (
        'BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) at[w[i]] = i } '
        "/^@@[^ ]*$/ { k = substr($0, 3); on = (k in at) ? at[k] : 0 } "
        'on { b[on] = b[on] $0 "\\n" } '
        'END { for (i = 1; i <= n; i++) printf "%s", b[i] }'
    )
    return f"awk -v want={quote(' '.join(names))} {quote(prog)} {full}"


def step_read_script(full: str, sysctls: Iterable[str] = (), files: Iterable[str] = (), sections=()) -> str:
    """`facts_script(sysctls, files, sections)` for a step, with every section the whole read already printed (in
    the file `full`, a shell word) carved out of it instead of run again: same output, fewer commands on the host.
    Runs of such sections are carved; any other section (EXTRA_SECTIONS), the sysctls and the files run."""
    names = list(sections)
    live = facts_script(sysctls, files, [n for n in names if n not in SECTIONS])
    parts: list[str] = []
    run: list[str] = []
    for n in names:
        if n in SECTIONS:
            run.append(n)
            continue
        if run:
            parts.append(carved_script(full, run))
            run = []
        parts.append(EXTRA_SECTIONS[n])
    if run:
        parts.append(carved_script(full, run))
    # the tail of facts_script (sysctls, files, @@end) as it renders it
    tail = live[live.index("echo @@sysctls") :]
    return "\n".join([*parts, tail])


def facts_script(sysctls: Iterable[str] = (), files: Iterable[str] = (), sections: Iterable[str] | None = None) -> str:
    """The read: every section (or only `sections`, in the order given), then `sysctls` and `files`; parsed by
    parse_host_facts either way (a section not read parses as empty)."""
    if sections is None:
        body = _SECTIONS.strip()
    else:
        names = list(sections)
        unknown = [n for n in names if n not in SECTIONS and n not in EXTRA_SECTIONS]
        if unknown:
            raise ValueError(f"no such facts section: {', '.join(unknown)}")
        dmesg = [_DMESG] if {"intremap", "pci-errors"} & set(names) else []
        pci = ["P=/sys/bus/pci/devices"] if any(n.startswith("pci") for n in names) else []
        body = "\n".join([*dmesg, *pci, *(SECTIONS.get(n) or EXTRA_SECTIONS[n] for n in names)])
    s = Script().raw(body) if body else Script()
    s.raw("echo @@sysctls")
    for name in sysctls:
        s.raw(f"printf '%s=%s\\n' {quote(name)} \"$(sysctl -n {quote(name)} 2>/dev/null)\"")
    s.raw("echo @@files")
    files_script(files, s, section="f")
    s.raw("echo @@end")
    return s.render()


def split_sections(text: str) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    cur: Optional[str] = None
    for line in text.splitlines():
        if line.startswith("@@") and " " not in line:
            cur = line[2:]
            out.setdefault(cur, [])
        elif line.startswith("@@f "):
            out.setdefault("files", []).append(line)
        elif cur is not None:
            out[cur].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


# -- pure parsers, one per section -----------------------------------------------------------------------------


def parse_os_release(text: str) -> OsInfo:
    kv: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            k, _, v = line.partition("=")
            try:
                kv[k.strip()] = " ".join(shlex.split(v)) if v.strip() else ""
            except ValueError:
                kv[k.strip()] = v.strip().strip('"')
    return OsInfo(
        id=kv.get("ID", ""),
        id_like=kv.get("ID_LIKE", "").split(),
        version_id=kv.get("VERSION_ID", ""),
        pretty_name=kv.get("PRETTY_NAME", ""),
    )


def parse_cmdline(text: str) -> list[str]:
    return shlex.split(text.strip()) if text.strip() else []


def parse_iommu(tables: str, units: str, groups: str, intremap: str, interrupts: str) -> Iommu:
    names = tables.split()
    g: dict[int, list[str]] = {}
    for line in groups.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            g.setdefault(int(parts[0]), []).append(parts[1])
    for v in g.values():
        v.sort()
    evidence = ""
    enabled = False
    for line in intremap.splitlines():
        low = line.lower()
        if "remapping" in low and ("enabled" in low) and "not" not in low:
            enabled, evidence = True, line.strip()
    if not enabled:
        # IR-capable irq chips ("IR-PCI-MSI", "IR-IO-APIC") appear only when remapping is on.
        for line in interrupts.splitlines():
            if " IR-" in line:
                enabled, evidence = True, "/proc/interrupts shows IR- irq chips"
                break
    return Iommu(
        dmar_table=any(n.startswith("DMAR") for n in names),
        ivrs_table=any(n.startswith("IVRS") for n in names),
        units=units.split(),
        groups=dict(sorted(g.items())),
        interrupt_remapping=enabled,
        remapping_evidence=evidence,
    )


def _int(v: Optional[str], base: int = 10, default=None):
    if v is None or v == "":
        return default
    try:
        return int(v, base)
    except ValueError:
        return default


_PCI_ADDR = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


_GREP_H = re.compile(r"^((?:[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])?[^:]*):(.*)$")


def _grep_h(text: str):
    """Lines of `grep -H . files` as (path, value); paths may start with a PCI address (which has colons)."""
    for line in text.splitlines():
        m = _GREP_H.match(line)
        if m:
            yield m.group(1), m.group(2)


def parse_pci(attrs: str, links: str = "", nets: str = "", res: str = "") -> dict[str, PciDevice]:
    devs: dict[str, dict] = {}
    for path, value in _grep_h(attrs):
        addr, _, attr = path.partition("/")
        if not _PCI_ADDR.match(addr):
            continue
        devs.setdefault(addr, {"address": addr})[attr] = value.strip()
    vfs: dict[str, dict[int, str]] = {}
    for line in links.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        addr = parts[0].rstrip("/").rsplit("/", 1)[-1]
        if addr not in devs:
            continue
        name, target = parts[1], parts[2].rstrip("/").rsplit("/", 1)[-1]
        if name == "driver" and "/bus/pci/drivers/" in parts[2]:
            devs[addr]["driver"] = target
        elif name == "iommu_group" and "iommu_groups" in parts[2]:
            devs[addr]["iommu_group"] = target
        elif name == "physfn":
            devs[addr]["physfn"] = target
        elif name.startswith("virtfn") and name[6:].isdigit():
            vfs.setdefault(addr, {})[int(name[6:])] = target
    net: dict[str, list[str]] = {}
    for line in nets.splitlines():
        addr, _, rest = line.strip().partition("/net/")
        if addr in devs and rest:
            net.setdefault(addr, []).append(rest)
    bars: dict[str, list[Bar]] = {}
    for path, value in _grep_h(res):
        addr = path.split("/", 1)[0]
        num, _, vals = value.partition(":")
        parts = vals.split()
        if addr in devs and num.isdigit() and len(parts) == 3 and int(num) <= 7:
            start, end, flags = (int(x, 16) for x in parts)
            bars.setdefault(addr, []).append(Bar(index=int(num) - 1, start=start, end=end, flags=flags))
    out = {}
    for addr, kv in sorted(devs.items()):
        ov = kv.get("driver_override")
        out[addr] = PciDevice(
            address=addr,
            vendor=kv.get("vendor", ""),
            device=kv.get("device", ""),
            class_code=kv.get("class", ""),
            driver=kv.get("driver"),
            driver_override=None if ov in (None, "", "(null)") else ov,
            numa_node=_int(kv.get("numa_node"), default=-1),
            iommu_group=_int(kv.get("iommu_group")),
            sriov_totalvfs=_int(kv.get("sriov_totalvfs")),
            sriov_numvfs=_int(kv.get("sriov_numvfs")),
            physfn=kv.get("physfn"),
            boot_vga=kv.get("boot_vga") == "1",
            net=sorted(net.get(addr, [])),
            vfs=[v for _, v in sorted(vfs.get(addr, {}).items())],
            bars=bars.get(addr, []),
        )
    return out


def parse_cpus(text: str, nodes: dict[int, NumaNode]) -> list[Cpu]:
    node_of = {c: n.id for n in nodes.values() for c in n.cpus}
    kv: dict[int, dict[str, str]] = {}
    for path, value in _grep_h(text):
        m = re.match(r"^cpu(\d+)/topology/(\w+)$", path)
        if m:
            kv.setdefault(int(m.group(1)), {})[m.group(2)] = value.strip()
    out = []
    for cid, d in sorted(kv.items()):
        out.append(
            Cpu(
                id=cid,
                core=int(d.get("core_id", cid)),
                socket=int(d.get("physical_package_id", 0)),
                node=node_of.get(cid, 0),
                siblings=parse_cpulist(d.get("thread_siblings_list", str(cid))),
            )
        )
    return out


def parse_nodes(text: str) -> dict[int, NumaNode]:
    nodes: dict[int, NumaNode] = {}
    for path, value in _grep_h(text):
        m = re.match(r"^node(\d+)/(.*)$", path)
        if not m:
            continue
        n = nodes.setdefault(int(m.group(1)), NumaNode(id=int(m.group(1))))
        rest, value = m.group(2), value.strip()
        if rest == "cpulist":
            n.cpus = parse_cpulist(value)
        elif rest == "meminfo":
            p = value.split()
            if len(p) >= 4 and p[2] == "MemTotal:":
                n.mem_total_kb = int(p[3])
            elif len(p) >= 4 and p[2] == "MemFree:":
                n.mem_free_kb = int(p[3])
        else:
            h = re.match(r"^hugepages/hugepages-(\d+)kB/(nr|free)_hugepages$", rest)
            if h:
                n.hugepages.setdefault(int(h.group(1)), {"nr": 0, "free": 0})[h.group(2)] = int(value)
    return dict(sorted(nodes.items()))


def parse_module_config(text: str) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        if line.startswith("@file "):
            cur = line[6:]
            out[cur] = []
        elif cur is not None:
            out[cur].append(line)
    return {k: "\n".join(v) + ("\n" if v else "") for k, v in out.items()}


def parse_interrupts(text: str, affinity_text: str = "") -> list[Irq]:
    lines = text.splitlines()
    if not lines:
        return []
    ncpu = len(lines[0].split())
    aff = {}
    for path, value in _grep_h(affinity_text):
        aff[path.split("/", 1)[0]] = parse_cpulist(value)
    out = []
    for line in lines[1:]:
        head, _, rest = line.partition(":")
        irq = head.strip()
        fields = rest.split()
        counts = []
        for f in fields[:ncpu]:
            if f.isdigit():
                counts.append(int(f))
            else:
                break
        tail = fields[len(counts) :]
        chip = tail[0] if tail and irq.isdigit() else ""
        actions = " ".join(tail[1:]) if irq.isdigit() else " ".join(tail)
        out.append(Irq(irq=irq, counts=counts, chip=chip, actions=actions, affinity=aff.get(irq, [])))
    return out


def parse_network(default: str, ssh: str, addrs: str, pci: str, session: str = "", links: str = "") -> Network:
    """Which interfaces carry the default route and gpuhost's own SSH session, and the PCI functions under them.

    The session is found from the session itself (its SSH_CONNECTION's local address), so sshd on any port and
    an address on a bond, bridge or VLAN are found too; `ss` on port 22 is kept as a second source.
    """
    defaults = []
    for line in default.splitlines():
        m = re.search(r"\bdev (\S+)", line)
        if m:
            defaults.append(m.group(1))
    local_ips = set()
    sess = session.strip().splitlines()[0].strip() if session.strip() else ""
    parts = sess.split()
    if len(parts) == 4:
        local_ips.add(parts[2].removeprefix("::ffff:"))
    for line in ssh.splitlines():
        ip = line.strip().rsplit(":", 1)[0].strip("[]")
        if ip:
            local_ips.add(ip.removeprefix("::ffff:"))
    ssh_ifaces = []
    for line in addrs.splitlines():
        p = line.split()
        if len(p) == 2 and p[1].split("/")[0] in local_ips and p[0] not in ssh_ifaces:
            ssh_ifaces.append(p[0])
    iface_pci = {}
    for line in pci.splitlines():
        p = line.split()
        found = re.findall(r"/([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])(?=/|$)", p[1]) if len(p) == 2 else []
        if found:
            iface_pci[p[0]] = found[-1]
    lower = {}
    for line in links.splitlines():
        p = line.split()
        if len(p) > 1:
            lower[p[0]] = p[1:]
    return Network(default_route_ifaces=defaults, ssh_ifaces=ssh_ifaces, iface_pci=iface_pci, session=sess, lower=lower)


def parse_virt(text: str) -> Virt:
    kv = parse_kv(text)
    return Virt(
        detect=kv.get("detect", "").strip(),
        sys_vendor=kv.get("sys_vendor", "").strip(),
        product_name=kv.get("product_name", "").strip(),
        cpu_hypervisor=kv.get("cpu_hypervisor", "") == "1",
    )


def parse_driverctl(text: str) -> dict[str, str]:
    """`grep -H . /etc/driverctl.d/pci-*` lines: pci-0000:81:00.0:vfio-pci."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^pci-([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]):(\S+)$", line.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


def parse_kmods(text: str) -> list[str]:
    return sorted(
        {ln.strip().strip("/").removesuffix(".ko").replace("-", "_") for ln in text.splitlines() if ln.strip()}
    )


def parse_kv(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep:
            out[k] = v
    return out


def parse_governors(text: str) -> dict[int, str]:
    out = {}
    for path, value in _grep_h(text):
        m = re.match(r"^cpu(\d+)/", path)
        if m:
            out[int(m.group(1))] = value.strip()
    return out


def parse_host_facts(text: str) -> HostFacts:
    s = split_sections(text)
    get: Callable[[str], str] = lambda k: s.get(k, "")  # noqa: E731
    nodes = parse_nodes(get("nodes"))
    return HostFacts(
        os=parse_os_release(get("os-release")),
        kernel=get("kernel").strip(),
        boot_id=get("boot-id").strip(),
        cmdline=parse_cmdline(get("cmdline")),
        iommu=parse_iommu(
            get("acpi-tables"), get("iommu-units"), get("iommu-groups"), get("intremap"), get("interrupts")
        ),
        pci=parse_pci(get("pci"), get("pci-links"), get("pci-net"), get("pci-res")),
        cpus=parse_cpus(get("cpus"), nodes),
        online=parse_cpulist(get("cpu-online")),
        isolated=parse_cpulist(get("cpu-isolated")),
        nodes=nodes,
        modules=sorted(get("modules").split()),
        module_config=parse_module_config(get("module-config")),
        irqbalance_active=(get("irqbalance").strip() == "active") if get("irqbalance").strip() else None,
        tuned_profile=(get("tuned").strip() or None),
        governors=parse_governors(get("governors")),
        interrupts=parse_interrupts(get("interrupts"), get("irq-affinity")),
        network=parse_network(
            get("net-default"), get("net-ssh"), get("net-addrs"), get("net-pci"), get("ssh-session"), get("net-links")
        ),
        virt=parse_virt(get("virt")),
        boot_config=[ln.strip() for ln in get("boot-config").splitlines() if ln.strip()],
        module_params=parse_kv(get("module-params")),
        driverctl_overrides=parse_driverctl(get("driverctl")),
        sysctls=parse_kv(get("sysctls")),
        tools=get("tools").split(),
        kmods_available=parse_kmods(get("kmods")),
        pci_errors=[ln for ln in get("pci-errors").splitlines() if ln.strip()],
        files=parse_files(get("files"), section="f"),
    )


def read_host_facts(conn, sysctls: Iterable[str] = (), files: Iterable[str] = ()) -> HostFacts:
    """Everything about a host in exactly one SSH exec."""
    return parse_host_facts(conn.run(facts_script(sysctls, files)).stdout)


def read_raw(conn, sysctls: Iterable[str] = (), files: Iterable[str] = ()) -> str:
    """The raw output of the facts script (to capture fixtures)."""
    return conn.run(facts_script(sysctls, files)).stdout
