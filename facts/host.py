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
from facts.model import (Bar, Cpu, HostFacts, Iommu, Irq, Network, NumaNode, OsInfo, PciDevice)

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
echo @@intremap; (dmesg 2>/dev/null | grep -iE 'remapping|x2apic|DMAR-IR|AMD-Vi.*Interrupt' | tail -n 20)
echo @@pci
for d in /sys/bus/pci/devices/*; do
  [ -e "$d" ] || continue
  a=${d##*/}
  printf 'dev %s' "$a"
  for f in vendor device class numa_node sriov_totalvfs sriov_numvfs boot_vga driver_override; do
    [ -r "$d/$f" ] && printf ' %s=%s' "$f" "$(cat "$d/$f" 2>/dev/null | tr -d ' ')"
  done
  [ -e "$d/driver" ] && printf ' driver=%s' "$(basename "$(readlink "$d/driver")")"
  [ -e "$d/iommu_group" ] && printf ' iommu_group=%s' "$(basename "$(readlink "$d/iommu_group")")"
  [ -e "$d/physfn" ] && printf ' physfn=%s' "$(basename "$(readlink "$d/physfn")")"
  [ -d "$d/net" ] && printf ' net=%s' "$(ls "$d/net" | tr '\n' ',')"
  echo
  for v in "$d"/virtfn*; do [ -e "$v" ] && echo "vf $a ${v##*/virtfn} $(basename "$(readlink "$v")")"; done
  [ -r "$d/resource" ] && head -n 7 "$d/resource" | awk -v a="$a" '{print "res", a, NR-1, $1, $2, $3}'
done
echo @@cpus
for c in /sys/devices/system/cpu/cpu[0-9]*; do
  [ -r "$c/topology/core_id" ] || continue
  echo "${c##*/cpu} $(cat $c/topology/core_id) $(cat $c/topology/physical_package_id) $(cat $c/topology/thread_siblings_list)"
done
echo @@cpu-online; cat /sys/devices/system/cpu/online
echo @@cpu-isolated; cat /sys/devices/system/cpu/isolated 2>/dev/null
echo @@nodes
for n in /sys/devices/system/node/node[0-9]*; do
  [ -d "$n" ] || continue
  i=${n##*/node}
  echo "node $i cpus $(cat $n/cpulist)"
  grep -E 'MemTotal|MemFree' $n/meminfo | awk -v i="$i" '{print "mem", i, $3, $4}'
  for h in $n/hugepages/hugepages-*; do [ -d "$h" ] && echo "huge $i ${h##*hugepages-} $(cat $h/nr_hugepages) $(cat $h/free_hugepages)"; done
done
echo @@modules; cut -d' ' -f1 /proc/modules 2>/dev/null
echo @@module-config
for f in __MODULE_CONFIG_GLOBS__; do
  [ -f "$f" ] || continue
  if grep -qiE 'vfio|nouveau|nvidia|kvm' "$f"; then echo "@file $f"; cat "$f"; fi
done
echo @@irqbalance; systemctl is-active irqbalance 2>/dev/null || true
echo @@tuned; (tuned-adm active 2>/dev/null || cat /etc/tuned/active_profile 2>/dev/null) | head -n 1
echo @@governors; for g in /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor; do [ -r "$g" ] && echo "${g%/cpufreq/*}" "$(cat $g)"; done
echo @@interrupts; cat /proc/interrupts
echo @@irq-affinity; for i in /proc/irq/[0-9]*; do echo "${i##*/} $(cat $i/smp_affinity_list 2>/dev/null)"; done
echo @@net-default; ip -o route show default 2>/dev/null
echo @@net-ssh; (ss -Htn state established '( sport = :22 )' 2>/dev/null || true) | awk '{print $3}'
echo @@net-addrs; ip -o addr show 2>/dev/null | awk '{print $2, $4}'
echo @@net-pci; for n in /sys/class/net/*; do [ -e "$n/device" ] && echo "${n##*/} $(basename "$(readlink "$n/device")")"; done
echo @@driverctl; (driverctl list-overrides 2>/dev/null || true)
echo @@tools; for t in driverctl update-initramfs dracut update-grub grub2-mkconfig grubby tuned-adm cpupower irqbalance systemctl virsh nvidia-smi; do command -v $t >/dev/null 2>&1 && echo $t; done
echo @@kmods; for m in vfio vfio_pci vfio_iommu_type1 vfio_virqfd nouveau nvidia; do modinfo -F filename $m >/dev/null 2>&1 && echo $m; done
echo @@pci-errors; (dmesg 2>/dev/null | grep -iE 'not enough MMIO|BAR [0-9]+: (no space|failed to assign)' | tail -n 20)
""".replace("__MODULE_CONFIG_GLOBS__", MODULE_CONFIG_GLOBS)


def facts_script(sysctls: Iterable[str] = (), files: Iterable[str] = ()) -> str:
    s = Script().raw(_SECTIONS.strip())
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
    return OsInfo(id=kv.get("ID", ""), id_like=kv.get("ID_LIKE", "").split(), version_id=kv.get("VERSION_ID", ""),
                  pretty_name=kv.get("PRETTY_NAME", ""))


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
    return Iommu(dmar_table=any(n.startswith("DMAR") for n in names), ivrs_table=any(n.startswith("IVRS") for n in names),
                 units=units.split(), groups=dict(sorted(g.items())), interrupt_remapping=enabled,
                 remapping_evidence=evidence)


def _int(v: Optional[str], base: int = 10, default=None):
    if v is None or v == "":
        return default
    try:
        return int(v, base)
    except ValueError:
        return default


def parse_pci(text: str) -> dict[str, PciDevice]:
    devs: dict[str, dict] = {}
    vfs: dict[str, dict[int, str]] = {}
    bars: dict[str, list[Bar]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "dev":
            kv = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
            addr = parts[1]
            devs[addr] = dict(
                address=addr, vendor=kv.get("vendor", ""), device=kv.get("device", ""),
                class_code=kv.get("class", ""), driver=kv.get("driver"),
                driver_override=None if kv.get("driver_override") in (None, "", "(null)") else kv["driver_override"],
                numa_node=_int(kv.get("numa_node"), default=-1), iommu_group=_int(kv.get("iommu_group")),
                sriov_totalvfs=_int(kv.get("sriov_totalvfs")), sriov_numvfs=_int(kv.get("sriov_numvfs")),
                physfn=kv.get("physfn"), boot_vga=kv.get("boot_vga") == "1",
                net=[n for n in kv.get("net", "").split(",") if n],
            )
        elif parts[0] == "vf" and len(parts) == 4:
            vfs.setdefault(parts[1], {})[int(parts[2])] = parts[3]
        elif parts[0] == "res" and len(parts) == 6:
            start, end, flags = (int(x, 16) for x in parts[3:6])
            bars.setdefault(parts[1], []).append(Bar(index=int(parts[2]), start=start, end=end, flags=flags))
    out = {}
    for addr, d in sorted(devs.items()):
        d["vfs"] = [v for _, v in sorted(vfs.get(addr, {}).items())]
        d["bars"] = bars.get(addr, [])
        out[addr] = PciDevice(**d)
    return out


def parse_cpus(text: str, nodes: dict[int, NumaNode]) -> list[Cpu]:
    node_of = {c: n.id for n in nodes.values() for c in n.cpus}
    out = []
    for line in text.splitlines():
        p = line.split()
        if len(p) == 4:
            cid = int(p[0])
            out.append(Cpu(id=cid, core=int(p[1]), socket=int(p[2]), node=node_of.get(cid, 0),
                           siblings=parse_cpulist(p[3])))
    return sorted(out, key=lambda c: c.id)


def parse_nodes(text: str) -> dict[int, NumaNode]:
    nodes: dict[int, NumaNode] = {}
    for line in text.splitlines():
        p = line.split()
        if not p:
            continue
        if p[0] == "node" and len(p) >= 3:
            nodes[int(p[1])] = NumaNode(id=int(p[1]), cpus=parse_cpulist(p[3] if len(p) > 3 else ""))
        elif p[0] == "mem" and len(p) == 4:
            n = nodes.setdefault(int(p[1]), NumaNode(id=int(p[1])))
            if p[2] == "MemTotal:":
                n.mem_total_kb = int(p[3])
            elif p[2] == "MemFree:":
                n.mem_free_kb = int(p[3])
        elif p[0] == "huge" and len(p) == 5:
            n = nodes.setdefault(int(p[1]), NumaNode(id=int(p[1])))
            size = int(p[2].removesuffix("kB"))
            n.hugepages[size] = {"nr": int(p[3]), "free": int(p[4])}
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
    for line in affinity_text.splitlines():
        p = line.split(maxsplit=1)
        if p:
            aff[p[0]] = parse_cpulist(p[1]) if len(p) > 1 else []
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
        tail = fields[len(counts):]
        chip = tail[0] if tail and irq.isdigit() else ""
        actions = " ".join(tail[1:]) if irq.isdigit() else " ".join(tail)
        out.append(Irq(irq=irq, counts=counts, chip=chip, actions=actions, affinity=aff.get(irq, [])))
    return out


def parse_network(default: str, ssh: str, addrs: str, pci: str) -> Network:
    defaults = []
    for line in default.splitlines():
        m = re.search(r"\bdev (\S+)", line)
        if m:
            defaults.append(m.group(1))
    local_ips = set()
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
        if len(p) == 2 and re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", p[1]):
            iface_pci[p[0]] = p[1]
    return Network(default_route_ifaces=defaults, ssh_ifaces=ssh_ifaces, iface_pci=iface_pci)


def parse_driverctl(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        p = line.split()
        if len(p) >= 2 and ":" in p[0]:
            out[p[0]] = p[1]
    return out


def parse_kv(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep:
            out[k] = v
    return out


def parse_governors(text: str) -> dict[int, str]:
    out = {}
    for line in text.splitlines():
        p = line.split()
        if len(p) == 2:
            out[int(p[0].rsplit("cpu", 1)[1])] = p[1]
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
        iommu=parse_iommu(get("acpi-tables"), get("iommu-units"), get("iommu-groups"), get("intremap"),
                          get("interrupts")),
        pci=parse_pci(get("pci")),
        cpus=parse_cpus(get("cpus"), nodes),
        online=parse_cpulist(get("cpu-online")),
        isolated=parse_cpulist(get("cpu-isolated")),
        nodes=nodes,
        modules=sorted(get("modules").split()),
        module_config=parse_module_config(get("module-config")),
        irqbalance_active=(get("irqbalance").strip() == "active") if get("irqbalance").strip() else None,
        tuned_profile=(get("tuned").strip().removeprefix("Current active profile: ") or None),
        governors=parse_governors(get("governors")),
        interrupts=parse_interrupts(get("interrupts"), get("irq-affinity")),
        network=parse_network(get("net-default"), get("net-ssh"), get("net-addrs"), get("net-pci")),
        driverctl_overrides=parse_driverctl(get("driverctl")),
        sysctls=parse_kv(get("sysctls")),
        tools=get("tools").split(),
        kmods_available=get("kmods").split(),
        pci_errors=[ln for ln in get("pci-errors").splitlines() if ln.strip()],
        files=parse_files(get("files"), section="f"),
    )


def read_host_facts(conn, sysctls: Iterable[str] = (), files: Iterable[str] = ()) -> HostFacts:
    """Everything about a host in exactly one SSH exec."""
    return parse_host_facts(conn.run(facts_script(sysctls, files)).stdout)


def read_raw(conn, sysctls: Iterable[str] = (), files: Iterable[str] = ()) -> str:
    """The raw output of the facts script (to capture fixtures)."""
    return conn.run(facts_script(sysctls, files)).stdout
