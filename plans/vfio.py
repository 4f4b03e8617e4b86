"""VfioBinding's initramfs decision: rebuild it only when a driver in it would claim a device before vfio-pci (pure).

Why the runbooks rebuild the initramfs (seed 000 §3.4): a module that is *inside* the initramfs loads from there,
before the root filesystem (and its /etc/modprobe.d softdeps, blacklist and driverctl overrides) exists, so it
can take the GPU first. The config must then be baked into the initramfs (initramfs-tools and dracut copy
/etc/modprobe.d). When no module that claims the devices is in any initramfs image, the device is bound in the root
filesystem stage, where modprobe.d + modules-load.d + driverctl already apply: a rebuild changes nothing but
costs minutes (and the old image stays byte for byte as found).

Facts (one shell section each, read in the provider's one round trip):

- ``@@initramfs``: per image in /boot, ``@image <path>`` then its module files and any gpuhost modprobe.d file
  (``lsinitramfs`` or dracut's ``lsinitrd``); ``@image <path> unlisted`` when it cannot be listed.
- ``@@vfio-claimers``: per device, ``<address> <module>...``: the modules whose aliases match its modalias
  (``modprobe -R``: every driver that *could* claim it, also while vfio-pci holds it) and the module of the driver
  bound now.

Usage::

    text = conn.run(facts_script() + claims_script(["0000:81:00"])).stdout
    images, claimers = parse_initramfs(text), parse_claimers(text)
    p = plan_initramfs(images, claimers, blacklisted={"nouveau"}, wanted={"gpuhost-vfio.conf"},
                       files_changed=True, command="update-initramfs -u -k all")
    p.noop, p.sentences
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

from access.shell import quote
from plans.plan import Action, Plan, plan_of

VFIO_MODULES = frozenset({"vfio", "vfio_pci", "vfio_pci_core", "vfio_iommu_type1", "vfio_virqfd"})
OURS = re.compile(r"(?:^|/)modprobe\.d/(gpuhost-[^/]+\.conf)$")
KO = re.compile(r"(?:^|/)([^/]+)\.ko(?:\.(?:xz|zst|gz))?$")

_LIST = r"""
echo @@initramfs
for i in /boot/initrd.img-* /boot/initramfs-*.img; do
  [ -f "$i" ] || continue
  case "$i" in *kdump*) continue;; esac
  if command -v lsinitramfs >/dev/null 2>&1; then l=lsinitramfs; elif command -v lsinitrd >/dev/null 2>&1; then l=lsinitrd; else echo "@image $i unlisted"; continue; fi
  if o=$($l "$i" 2>/dev/null) && [ -n "$o" ]; then echo "@image $i"; printf '%s\n' "$o" | awk '{print $NF}' | grep -E '\.ko(\.(xz|zst|gz))?$|modprobe\.d/gpuhost-[^/]*\.conf$' || true; else echo "@image $i unlisted"; fi
done
echo @@vfio-claimers
"""

_CLAIMERS = (
    'for d in {slot}.*; do [ -e "$d" ] || continue; a=${{d##*/}}; m=; '
    '[ -r "$d/modalias" ] && m=$(modprobe -R "$(cat "$d/modalias")" 2>/dev/null | tr \'\\n\' \' \'); '
    'b=; [ -e "$d/driver/module" ] && b=$(basename "$(readlink "$d/driver/module")"); '
    'echo "$a $m $b"; done'
)


def initramfs_read(slots: Iterable[str]) -> str:
    """The images' stamp (facts.host's `initramfs-stamp` section, which VfioBinding's guarded read prints too), then
    claims_script: read once per `up` (by HostPreflight), it holds as long as the stamp the guard reads does."""
    from facts.host import EXTRA_SECTIONS

    return EXTRA_SECTIONS["initramfs-stamp"] + "\n" + claims_script(slots)


def stamp(text: str) -> list[str]:
    """The `initramfs-stamp` section of a read: one line per image (path, size, mtime, ctime, inode)."""
    return [ln for ln in _section(text, "initramfs-stamp") if ln.strip()]


def claims_script(slots: Iterable[str]) -> str:
    """Shell text printing the @@initramfs and @@vfio-claimers sections for every function of each PCI slot
    ("0000:81:00"; quoted)."""
    lines = [_LIST.strip()] + [_CLAIMERS.format(slot=quote("/sys/bus/pci/devices/" + s)) for s in sorted(slots)]
    return "\n".join(lines) + "\necho @@vfio-end\n"


@dataclass(frozen=True)
class Image:
    path: str
    listed: bool = True
    modules: frozenset[str] = frozenset()
    ours: frozenset[str] = frozenset()  # gpuhost modprobe.d files baked into it


@dataclass(frozen=True)
class Decision:
    plan: Plan
    early: dict[str, list[str]] = field(default_factory=dict)  # image -> claiming modules inside it


def _mod(name: str) -> str:
    return name.replace("-", "_")


def _section(text: str, name: str) -> list[str]:
    out: list[str] = []
    on = False
    for line in text.splitlines():
        if line.startswith("@@") and " " not in line:
            on = line == f"@@{name}"
        elif on:
            out.append(line)
    return out


def parse_initramfs(text: str) -> list[Image]:
    images: list[Image] = []
    cur: dict | None = None
    for line in _section(text, "initramfs"):
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "@image" and len(parts) >= 2:
            if cur:
                images.append(Image(cur["path"], cur["listed"], frozenset(cur["mods"]), frozenset(cur["ours"])))
            cur = {"path": parts[1], "listed": parts[2:] != ["unlisted"], "mods": set(), "ours": set()}
        elif cur is not None:
            m = OURS.search(parts[-1])
            if m:
                cur["ours"].add(m.group(1))
                continue
            k = KO.search(parts[-1])
            if k:
                cur["mods"].add(_mod(k.group(1)))
    if cur:
        images.append(Image(cur["path"], cur["listed"], frozenset(cur["mods"]), frozenset(cur["ours"])))
    return images


def parse_claimers(text: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for line in _section(text, "vfio-claimers"):
        parts = line.split()
        if parts:
            out.setdefault(parts[0], set()).update(_mod(p) for p in parts[1:])
    return out


def plan_initramfs(
    images: list[Image],
    claimers: dict[str, set[str]],
    blacklisted: Iterable[str],
    wanted: Iterable[str],
    files_changed: bool,
    command: str,
) -> Decision:
    """Rebuild the initramfs (with `command`) only when it must carry gpuhost's module config.

    `claimers`: address -> modules that can claim it; `blacklisted`: modules gpuhost blacklists (nouveau);
    `wanted`: the gpuhost modprobe.d file names the config has now; `files_changed`: this run rewrites them.
    """
    grabbers = {m for mods in claimers.values() for m in mods} | {_mod(b) for b in blacklisted}
    grabbers -= VFIO_MODULES
    wanted = set(wanted)
    if not images:
        return Decision(plan_of([], "no initramfs image in /boot: every module loads from the root filesystem"))
    unlisted = [i.path for i in images if not i.listed]
    if unlisted and files_changed:
        why = f"cannot list {', '.join(unlisted)}: rebuild it so it carries the new module config to be safe"
        return Decision(plan_of([Action(why, command)], ""))
    early = {i.path: sorted(grabbers & i.modules) for i in images if grabbers & i.modules}
    if early:
        stale = [i.path for i in images if i.listed and not wanted <= i.ours]
        if files_changed or stale:
            first = next(iter(early))
            why = (
                f"{', '.join(early[first])} is in {first} and would claim the device before vfio-pci: rebuild the "
                "initramfs with the vfio config (seed 000 §3.4)"
            )
            return Decision(plan_of([Action(why, command)], ""), early)
        return Decision(plan_of([], "every initramfs already carries the vfio config"), early)
    baked = [i.path for i in images if i.ours]
    if baked and files_changed:
        why = f"{', '.join(baked)} carries an older copy of gpuhost's module config: rebuild it"
        return Decision(plan_of([Action(why, command)], ""))
    mods = ", ".join(sorted(grabbers)) or "no host driver"
    return Decision(
        plan_of(
            [],
            f"{mods}: not in any initramfs, so the devices are bound from the root filesystem "
            "(modprobe.d, driverctl): no initramfs rebuild",
        )
    )


def plan_initramfs_restore(images: list[Image], command: str) -> Plan:
    """On destroy: rebuild only an initramfs that carries gpuhost's config (else it is still as found)."""
    baked = [i.path for i in images if i.ours or not i.listed]
    if baked:
        return plan_of([Action(f"{', '.join(baked)} may carry gpuhost's module config: rebuild it", command)], "")
    return plan_of([], "no initramfs carries gpuhost's module config: left as found")


__all__ = [
    "Decision",
    "Image",
    "claims_script",
    "initramfs_read",
    "parse_claimers",
    "parse_initramfs",
    "plan_initramfs",
    "plan_initramfs_restore",
    "stamp",
]
