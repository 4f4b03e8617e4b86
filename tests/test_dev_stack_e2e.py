"""The dev stack, end to end, on the emulated GPU server, through the deployment driver (tools/driver).

The whole program runs as under the engine (stack config → __main__.py → components → dynamic providers in
`python -m pulumi.dynamic`), with steps in parallel as soon as their dependencies are done and unknowns in preview:
preview → up (one reboot; a running tenant VM drained before it and running after it) → preview: 0 changes →
hand edits of /etc/default/grub and a sysctl → refresh shows both as drift → up converges → the SSH port changes in
config → preview shows updates, no replace → up → destroy → the host as it was (files, runtime values, domains):
after a reboot, every path under /etc, /var/lib/gpuhost and /boot, directories included, has the type, mode, owner
and content it had before the first up (tests/hostmanifest.py), and nothing new is there.

Nothing is mocked. The "tenant already running" is a libvirt domain the test defines before the first up (a
firmware-only guest: it ignores the ACPI shutdown, so the drain destroys it after the host's drain_timeout_s).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from access.shell import sh
from providers.libvirt_domain import AUTOSTART_DIR
from testbed.servers import free_port
from testbed.testhost.fixtures import kernel_starts
from testbed.testhost.host import (
    Domains,
    DomainState,
    FileContent,
    Host,
    Hugepages,
    KernelCmdline,
    PciDriver,
    Probe,
    SriovNumvfs,
    Sysctl,
)
from testbed.testhost.machine import GPU_FN0, GPU_FN1, NVME_PF, hmp
from testbed.testhost.passthrough import snapshot
from tests.hostmanifest import differences, manifest
from tests.progress_lines import Display, dones, tail, waits
from tools.driver import Driver, StackConfig

# Part of `./gpuhost.sh test` (about 13 min under TCG), on its own emulated server (marker devstack, see gpuhost.sh).
pytestmark = [pytest.mark.testhost, pytest.mark.devstack]

ROOT = Path(__file__).resolve().parent.parent
TENANT = "gpuhost-e2e-running-tenant"
TENANT_XML = f"""<domain type='qemu'>
  <name>{TENANT}</name>
  <memory unit='MiB'>32</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices><serial type='pty'/></devices>
</domain>"""


# The runtime values the stack changes, read in one round trip (after the boot-settle wait: see runtime()).
RUNTIME: list[Probe] = [
    KernelCmdline(),
    PciDriver(GPU_FN0),
    PciDriver(GPU_FN1),
    Hugepages(node=1),
    Sysctl("net.core.somaxconn"),
    Sysctl("net.ipv4.tcp_fin_timeout"),
    SriovNumvfs(NVME_PF),
    FileContent("/etc/tuned/active_profile"),
    FileContent("/etc/tuned/profile_mode"),
    FileContent("/etc/default/irqbalance"),
    Domains(),
]


def runtime(th) -> Host:
    """RUNTIME, once the host has finished booting (tuned, for one, settles its profile minutes after sshd answers
    under TCG)."""
    th.ssh("systemctl is-system-running --wait >/dev/null 2>&1 || true", timeout=900)
    return Host(th.ssh).read(*RUNTIME)


def assert_deployed(now: Host) -> None:
    """The dev stack's host settings, as the running host shows them."""
    assert {"intel_iommu=on", "iommu=pt"} <= set(now.kernel_cmdline)
    assert now.pci_device(GPU_FN0).driver == "vfio-pci"
    assert now.pci_device(GPU_FN1).driver == "vfio-pci"
    assert now.hugepages(node=1) == 64
    assert now.sysctl("net.core.somaxconn") == 4096
    assert now.sysctl("net.ipv4.tcp_fin_timeout") == 10
    assert now.pci_device(NVME_PF).sriov_numvfs == 2
    assert now.file("/etc/tuned/active_profile").content_string.strip() == "latency-performance"
    assert now.file("/etc/tuned/profile_mode").content_string.strip() == "manual"
    irqbalance = now.file("/etc/default/irqbalance")
    assert irqbalance.lines_starting("IRQBALANCE_BANNED_CPULIST=") == ["IRQBALANCE_BANNED_CPULIST=2-7"]


def dev_config(th, port: int) -> StackConfig:
    cfg = StackConfig.load(ROOT, "dev", "gpuhost-dev")
    fleet = json.loads(cfg.values["gpuhost:fleet"])
    h = fleet["hosts"][0]
    h["ssh"].update(port=port, host_key=th.host_key_line)
    h["drain_timeout_s"] = 20
    return cfg.with_values(fleet=fleet, sshPrivateKey=th.private_key_pem)


def qmp(th, command: str) -> str:
    """A human-monitor command through the host's QMP socket (hostfwd_add/remove)."""
    return hmp(th.workdir / "qmp.sock", command).get("return", "")


def initrds(th) -> str:
    return th.ssh("sha256sum /boot/initrd.img-*").stdout


def test_dev_stack_preview_up_drift_port_change_destroy(testhost, tmp_path):
    th = testhost
    host = Host(th.ssh)
    times: dict[str, float] = {}
    pristine_files, pristine_rt, pristine_initrd = snapshot(th), runtime(th), initrds(th)
    t = time.monotonic()
    pristine_tree = manifest(th)
    print(f"manifest: {len(pristine_tree)} paths in {time.monotonic() - t:.1f} s", file=sys.stderr)
    # Every SSH exec of the provider processes (started by the driver, inheriting this) is logged by host name.
    rt_log = tmp_path / "roundtrips.log"
    os.environ["GPUHOST_ROUNDTRIP_LOG"] = str(rt_log)
    boots = kernel_starts(th)
    th.ssh("systemctl start libvirtd")
    th.ssh(f"cat > /tmp/{TENANT}.xml", input=TENANT_XML)
    th.ssh(f"virsh define /tmp/{TENANT}.xml && virsh autostart {TENANT} && virsh start {TENANT}")
    new_port = None
    shown = Display()  # up's output as the user sees it
    try:
        d = Driver(
            ROOT,
            "dev",
            passphrase="gpuhost-dev",
            config=dev_config(th, th.port),
            state=tmp_path / "dev.json",
            out=shown,
        )

        t = time.monotonic()
        plan = d.preview()
        times["preview"] = time.monotonic() - t
        assert not plan.errors, plan.errors
        assert plan.counts().get("create", 0) >= 10 and plan.changes() == plan.counts()["create"]
        text = plan.render()
        assert "[unknown]" in text  # e.g. the VM's VF address before the VFs exist
        assert snapshot(th) == pristine_files  # preview changed nothing

        t, start = time.monotonic(), len(shown.getvalue())
        up = d.up()
        times["up"] = time.monotonic() - t
        assert not up.errors, up.errors
        assert kernel_starts(th) == boots + 1  # exactly one reboot
        # The drain (the tenant ignores ACPI: drain_timeout_s, 20 s) and the reboot wait (firmware, GRUB and a kernel
        # under TCG: minutes), both far past the 5 s tick, said what they waited for, the time and the bound in up's
        # output, on the stack's row as the engine shows a provider's stderr.
        seen, row = shown.getvalue()[start:], "pulumi:pulumi:Stack  gpuhost-dev"
        off = f"{TENANT} on emulated-gpu-01 to shut down for the reboot"
        assert waits(seen, "emulated-gpu-01-reboot", off, row), f"no progress line of the drain in:\n{tail(seen)}"
        back = "emulated-gpu-01 to come back from its reboot"
        assert waits(seen, "emulated-gpu-01-reboot", back, row), f"no progress line of the reboot in:\n{tail(seen)}"
        assert dones(seen, "emulated-gpu-01-reboot", back, row), f"no closing line of the reboot in:\n{tail(seen)}"
        reboot = next(r for r in d.resources() if r.type.endswith("HostReboot"))
        assert reboot.outputs["rebooted"] is True and reboot.outputs["drained"] == [TENANT]
        # the tenant was shut down before the reboot and runs again after it
        tenant = host.read(DomainState(TENANT), FileContent(f"/var/log/libvirt/qemu/{TENANT}.log"))
        assert tenant.domain(TENANT).state == "running"
        qlog = tenant.file(f"/var/log/libvirt/qemu/{TENANT}.log").content_string
        assert qlog.count("shutting down") >= 1 and qlog.rfind("starting up") > qlog.find("shutting down")
        # the reboot ran after every host-prep step had finished
        steps = {s.name: s for s in up.steps}
        rb = steps["emulated-gpu-01-reboot"]
        for prep in ("cmdline", "vfio", "hugepages", "sysctls", "tuning"):
            s = steps[f"emulated-gpu-01-{prep}"]
            assert s.started + s.seconds <= rb.started + 0.01, prep
        assert_deployed(runtime(th))
        # No driver that claims the GPU or its audio function is in this host's initramfs (MODULES=dep): vfio-pci
        # binds from the root filesystem; the initramfs is not rebuilt, byte for byte as found.
        vfio = next(r for r in d.resources() if r.type.endswith("VfioBinding"))
        assert "no initramfs rebuild" in vfio.outputs["initramfs"], vfio.outputs["initramfs"]
        assert initrds(th) == pristine_initrd

        # An unchanged stack: preview plans nothing, and only the checks that validate against the hardware read the
        # host (the preflight; SriovVfs, the PF's VF limits), one round trip each; everything else diffs against
        # the state.
        rt_log.write_text("")
        again = d.preview()
        assert again.changes() == 0, again.render()
        reads = rt_log.read_text().splitlines().count("emulated-gpu-01")
        checkers = [r for r in d.resources() if r.type.endswith(("HostPreflight", "SriovVfs"))]
        assert reads == len(checkers) == 2, (reads, [r.urn for r in checkers])

        th.ssh("sed -i 's/^GRUB_CMDLINE_LINUX=.*/GRUB_CMDLINE_LINUX=\"quiet\"/' /etc/default/grub")
        th.ssh("sysctl -w net.core.somaxconn=1024")
        t = time.monotonic()
        ref = d.refresh()
        times["refresh"] = time.monotonic() - t
        drifted = {s.name for s in ref.of("refresh")}
        assert {"emulated-gpu-01-cmdline", "emulated-gpu-01-sysctls"} <= drifted, ref.render()

        t = time.monotonic()
        fix = d.up()
        times["converge"] = time.monotonic() - t
        assert not fix.errors, fix.errors
        assert {"emulated-gpu-01-cmdline", "emulated-gpu-01-sysctls"} <= {s.name for s in fix.of("update")}
        assert kernel_starts(th) == boots + 1  # the running kernel already matched: no reboot
        fixed = host.read(FileContent("/etc/default/grub"), Sysctl("net.core.somaxconn"))
        grub = fixed.file("/etc/default/grub").lines_starting("GRUB_CMDLINE_LINUX=")
        assert any('intel_iommu=on iommu=pt"' in ln for ln in grub), grub
        assert fixed.sysctl("net.core.somaxconn") == 4096

        # The SSH port changes (the host now also answers there): every resource on it updates, none is replaced.
        new_port = free_port()
        qmp(th, f"hostfwd_add net0 tcp:127.0.0.1:{new_port}-:22")
        d2 = Driver(ROOT, "dev", passphrase="gpuhost-dev", config=dev_config(th, new_port), state=tmp_path / "dev.json")
        pv = d2.preview()
        assert not pv.errors, pv.errors
        assert pv.counts().get("update", 0) >= 5 and not pv.of("replace") and not pv.of("delete"), pv.render()
        moved = d2.up()
        assert not moved.errors and not moved.of("replace"), moved.errors
        assert all(r.inputs["host"]["port"] == new_port for r in d2.resources() if "host" in r.inputs)
        assert kernel_starts(th) == boots + 1

        t = time.monotonic()
        gone = d2.destroy()
        times["destroy"] = time.monotonic() - t
        assert not gone.errors, gone.errors
        assert d2.resources() == []
        assert initrds(th) == pristine_initrd
    finally:
        os.environ.pop("GPUHOST_ROUNDTRIP_LOG", None)
        # The host is shared by the session: whatever a failure left behind is destroyed (restored) too.
        left = Driver(ROOT, "dev", passphrase="gpuhost-dev", state=tmp_path / "dev.json")
        if left.resources():
            left.destroy()
        th.ssh(f"virsh destroy {TENANT}; virsh undefine {TENANT}; rm -f /tmp/{TENANT}.xml", check=False)
        if AUTOSTART_DIR not in pristine_tree:  # libvirtd made it for the test's own tenant, not for gpuhost
            th.ssh(sh("rmdir", AUTOSTART_DIR), check=False)
        if new_port:
            qmp(th, f"hostfwd_remove net0 tcp:127.0.0.1:{new_port}")
        print("e2e timings (s):", {k: round(v, 1) for k, v in times.items()}, file=sys.stderr)
    # Restored files take effect at boot (kernel arguments, drivers): reboot once and compare everything.
    th.reboot()
    diff = differences(pristine_tree, manifest(th))
    print(
        f"after destroy and a reboot: {len(diff)} of {len(pristine_tree)} paths differ",
        *diff,
        sep="\n",
        file=sys.stderr,
    )
    assert diff == []
    assert runtime(th).values == pristine_rt.values
