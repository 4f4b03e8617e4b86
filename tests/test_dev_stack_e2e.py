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
from testbed.testhost.machine import hmp
from testbed.testhost.passthrough import snapshot
from tests.hostmanifest import differences, manifest
from tests.progress_lines import Display, dones, tail, waits
from tools.driver import Driver, StackConfig

# Part of `./gpuhost.sh test` (about 13 min under TCG), on its own emulated server (marker devstack, see gpuhost.sh).
pytestmark = [pytest.mark.testhost, pytest.mark.devstack]

ROOT = Path(__file__).resolve().parent.parent
NVME_PF = "0000:82:00.0"
TENANT = "gpuhost-e2e-running-tenant"
TENANT_XML = f"""<domain type='qemu'>
  <name>{TENANT}</name>
  <memory unit='MiB'>32</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices><serial type='pty'/></devices>
</domain>"""


def runtime(th) -> dict:
    """The runtime values the stack changes, once the host has finished booting (tuned, for one, settles its profile
    minutes after sshd answers under TCG). One value per line, whatever a file holds (an empty active_profile too)."""
    th.ssh("systemctl is-system-running --wait >/dev/null 2>&1 || true", timeout=900)
    out = th.ssh(
        'line() { printf "%s\\n" "$(echo $("$@" 2>/dev/null))"; }; '
        "line cat /proc/cmdline; "
        "for d in 0000:81:00.0 0000:81:00.1; do line basename $(readlink /sys/bus/pci/devices/$d/driver); done; "
        "line cat /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages; "
        "line sysctl -n net.core.somaxconn; line sysctl -n net.ipv4.tcp_fin_timeout; "
        f"line cat /sys/bus/pci/devices/{NVME_PF}/sriov_numvfs; "
        "line cat /etc/tuned/active_profile; line cat /etc/tuned/profile_mode; "
        "line grep -h ^IRQBALANCE_BANNED_CPULIST= /etc/default/irqbalance; "
        "line virsh list --all --name"
    ).stdout.splitlines()
    keys = ["cmdline", "gpu", "audio", "hugepages1", "somaxconn", "fin_timeout", "numvfs", "tuned", "tuned_mode"]
    keys += ["irqbalance", "domains"]
    assert len(out) == len(keys), out
    rt = dict(zip(keys, out, strict=True))
    rt["domains"] = " ".join(sorted(rt["domains"].split()))
    return rt


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
        assert th.ssh(sh("virsh", "domstate", TENANT)).stdout.strip() == "running"
        qlog = th.ssh(sh("cat", f"/var/log/libvirt/qemu/{TENANT}.log")).stdout
        assert qlog.count("shutting down") >= 1 and qlog.rfind("starting up") > qlog.find("shutting down")
        # the reboot ran after every host-prep step had finished
        steps = {s.name: s for s in up.steps}
        rb = steps["emulated-gpu-01-reboot"]
        for prep in ("cmdline", "vfio", "hugepages", "sysctls", "tuning"):
            s = steps[f"emulated-gpu-01-{prep}"]
            assert s.started + s.seconds <= rb.started + 0.01, prep
        rt = runtime(th)
        assert {"intel_iommu=on", "iommu=pt"} <= set(rt["cmdline"].split())
        assert (rt["gpu"], rt["audio"]) == ("vfio-pci", "vfio-pci")
        assert (rt["hugepages1"], rt["somaxconn"], rt["fin_timeout"]) == ("64", "4096", "10")
        assert rt["irqbalance"] == "IRQBALANCE_BANNED_CPULIST=2-7" and rt["tuned_mode"] == "manual"
        assert (rt["numvfs"], rt["tuned"]) == ("2", "latency-performance")
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
        assert 'intel_iommu=on iommu=pt"' in th.ssh("grep ^GRUB_CMDLINE_LINUX= /etc/default/grub").stdout
        assert th.ssh("sysctl -n net.core.somaxconn").stdout.strip() == "4096"

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
    assert runtime(th) == pristine_rt
