"""Capture raw command output from the emulated GPU server as parser fixtures (tests/fixtures/testhost/).

Usage::

    python -m testbed.testhost capture [--out tests/fixtures/testhost]

Boots the default host (IOMMU device, Debian's default cmdline) and the no-IOMMU variant, runs each command in
`COMMANDS` (and the project's facts script), and writes ``<out>/<variant>/<name>.txt`` plus ``index.json``
({name: command}) so parser tests can state which command produced which text. Nothing is edited by hand.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

COMMANDS = {
    "cmdline": "cat /proc/cmdline",
    "lspci-nnk": "lspci -nnk",
    "lspci-tree": "lspci -tv",
    "iommu-groups": (
        'for d in /sys/kernel/iommu_groups/*/devices/*; do [ -e "$d" ] || continue; '
        'echo "IOMMU GROUP $(basename $(dirname $(dirname $d))) - $(lspci -nns $(basename $d))"; done'
    ),
    "interrupts": "cat /proc/interrupts",
    "lscpu-e": "lscpu -e",
    "lscpu": "lscpu",
    "numactl-H": "numactl -H",
    "dmesg-dmar": "dmesg | grep -iE 'DMAR|IOMMU|remapping' || true",
    "etc-default-grub": "cat /etc/default/grub",
    "grub-cfg": "cat /boot/grub/grub.cfg",
    "sriov-pf": (
        "cd /sys/bus/pci/devices/0000:82:00.0 && "
        "for f in sriov_totalvfs sriov_numvfs sriov_offset sriov_stride sriov_vf_device "
        'sriov_drivers_autoprobe numa_node; do echo "$f=$(cat $f)"; done'
    ),
    "numa-node-of-pci": 'for d in /sys/bus/pci/devices/*; do echo "${d##*/} $(cat $d/numa_node)"; done',
    "thread-siblings": (
        'for c in /sys/devices/system/cpu/cpu[0-9]*; do echo "${c##*/} $(cat $c/topology/thread_siblings_list)"; done'
    ),
    "driverctl-list-devices": "driverctl list-devices || true",
    "os-release": "cat /etc/os-release",
}

# Only on the IOMMU host: a state with VFs present and the GPU bound to vfio-pci, then restored.
WITH_VFS = (
    "echo 2 > /sys/bus/pci/devices/0000:82:00.0/sriov_numvfs && lspci -nnk -s 82: && "
    "ls -l /sys/bus/pci/devices/0000:82:00.0/ | grep virtfn; "
    "echo 0 > /sys/bus/pci/devices/0000:82:00.0/sriov_numvfs"
)
WITH_VFIO = (
    "modprobe vfio-pci; for a in 0000:81:00.0 0000:81:00.1; do "
    "echo vfio-pci > /sys/bus/pci/devices/$a/driver_override; "
    "echo $a > /sys/bus/pci/devices/$a/driver/unbind; echo $a > /sys/bus/pci/drivers_probe; done; "
    "lspci -nnk -s 81:00; ls -l /dev/vfio; "
    "for a in 0000:81:00.0 0000:81:00.1; do echo > /sys/bus/pci/devices/$a/driver_override; "
    "echo $a > /sys/bus/pci/devices/$a/driver/unbind; echo $a > /sys/bus/pci/drivers_probe; done"
)


def capture(out: Path) -> None:
    from facts.host import facts_script
    from testbed.testhost.image import ensure_image
    from testbed.testhost.machine import SshKey, TestHost

    img = ensure_image()
    work = Path(tempfile.mkdtemp(prefix="gpuhost-capture-"))
    key = SshKey.generate(work / "key")
    for variant, iommu in (("iommu", True), ("noiommu", False)):
        d = out / variant
        d.mkdir(parents=True, exist_ok=True)
        index = dict(COMMANDS)
        with TestHost(img, work / variant, key, iommu=iommu, name=f"capture-{variant}") as host:
            extra = {"facts-script": facts_script()}
            if iommu:
                extra.update({"sriov-with-2-vfs": WITH_VFS, "gpu-bound-to-vfio": WITH_VFIO})
            for name, cmd in {**COMMANDS, **extra}.items():
                (d / f"{name}.txt").write_text(host.ssh(cmd).stdout)
            index["facts-script"] = "facts.host.facts_script() (the project's one-round-trip reader)"
            if iommu:
                index.update({"sriov-with-2-vfs": WITH_VFS, "gpu-bound-to-vfio": WITH_VFIO})
        (d / "index.json").write_text(json.dumps(index, indent=2) + "\n")
        print(f"captured {len(index)} outputs into {d}")
