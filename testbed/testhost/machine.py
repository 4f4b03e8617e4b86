"""The emulated two-socket GPU server: QEMU command line, start/stop/reboot, SSH.

Usage::

    from testbed.testhost.image import ensure_image
    from testbed.testhost.machine import TestHost, SshKey

    key = SshKey.generate(workdir)                    # per run; handed to the guest through fw_cfg at boot
    with TestHost(ensure_image(), workdir / "h1", key=key) as host:   # fresh qcow2 overlay over the base
        host.ssh("cat /proc/cmdline").stdout          # root via sudo; access.ssh underneath, strict host key
        host.reboot()                                 # graceful, waits for the new boot; host.reboots == 1
        spec = host.host_spec()                       # access.ssh.HostSpec for providers under test

Machine (``machine_args``)::

    q35,kernel-irqchip=split + intel-iommu,intremap=on (left out for the no-IOMMU variant)
    8 vCPUs = 2 sockets x 2 cores x 2 threads; NUMA node 0 = CPUs 0-3 + 2 GiB, node 1 = CPUs 4-7 + 2 GiB
    pcie.0: cirrus-vga (the boot display, boot_vga=1), virtio-blk root disk
    pxb-pcie "pxb0" numa_node=0, bus 0x40:
        root port -> e1000e (SSH, user-mode net, hostfwd 127.0.0.1:<port> -> :22, restrict=on)
        root port -> pcie-pci-bridge -> pci-serial + pci-testdev   (the dirty IOMMU group)
    pxb-pcie "pxb1" numa_node=1, bus 0x80:
        root port -> bochs-display (fn 0, multifunction) + ich9-intel-hda (fn 1)   (the GPU stand-in)
        root port -> nvme (SR-IOV PF, nvme-subsys, sriov_max_vfs=4)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from testbed.servers import free_port

QEMU = shutil.which("qemu-system-x86_64") or "/usr/bin/qemu-system-x86_64"
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")

USER = "gpuadmin"
NODE_MEM_MIB = 2048
SRIOV_MAX_VFS = 4

# Addresses the tests and providers can rely on (the pxb bus numbers fix them).
GPU_BUS = 0x81
GPU_FN0 = "0000:81:00.0"
GPU_FN1 = "0000:81:00.1"
NVME_PF = "0000:82:00.0"


def qemu_available() -> bool:
    return Path(QEMU).exists()


_ACCEL: Optional[str] = None


def accel() -> str:
    """'kvm' when /dev/kvm really works, else 'tcg' (here /dev/kvm exists but cannot create a VM).

    Probed by asking QEMU itself to start a KVM machine, which is the only test that catches every failure mode
    (missing module, no permission, nested virt off). Override with GPUHOST_TESTHOST_ACCEL=tcg|kvm."""
    global _ACCEL
    if _ACCEL:
        return _ACCEL
    forced = os.environ.get("GPUHOST_TESTHOST_ACCEL")
    if forced:
        _ACCEL = forced
        return forced
    _ACCEL = "tcg"
    if os.access("/dev/kvm", os.R_OK | os.W_OK):
        # Run the real firmware for a few seconds: some hosts open /dev/kvm and create a VM fine, then fail the
        # first emulated instruction ("KVM internal error ... emulation failure") and QEMU hangs paused.
        try:
            p = subprocess.Popen(
                [
                    QEMU,
                    "-accel",
                    "kvm",
                    "-machine",
                    "q35",
                    "-nodefaults",
                    "-display",
                    "none",
                    "-m",
                    "256",
                    "-drive",
                    f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            try:
                _, err = p.communicate(timeout=6)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
                if b"error" not in err.lower() and b"failure" not in err.lower():
                    _ACCEL = "kvm"
        except OSError:
            pass
    return _ACCEL


def _firmware_and_serial(vars_fd: Path, serial_log: Path) -> list[str]:
    """UEFI (OVMF's code read-only, this machine's own copy of its variables) and the serial console into a file."""
    return [
        "-drive",
        f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
        "-drive",
        f"if=pflash,format=raw,unit=1,file={vars_fd}",
        "-serial",
        f"file:{serial_log}",
    ]


def hmp(qmp_sock: Path, command_line: str) -> dict:
    """A human-monitor command (`hostfwd_add ...`, `info version`) through the machine's QMP socket: QMP's reply to
    it, `{"return": "<the monitor's text>"}` or `{"error": {...}}`; events QEMU sends meanwhile are passed over."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(qmp_sock))
        f = s.makefile("rw")
        f.readline()  # the greeting
        for cmd in (
            {"execute": "qmp_capabilities"},
            {"execute": "human-monitor-command", "arguments": {"command-line": command_line}},
        ):
            f.write(json.dumps(cmd) + "\n")
            f.flush()
            while True:
                reply = json.loads(f.readline())
                if "return" in reply or "error" in reply:
                    break
        return reply


def _cpu_args(iommu: bool) -> list[str]:
    """Accelerator, CPU model and machine type (KVM when the host has it, else TCG), the IOMMU when asked."""
    if accel() == "kvm":
        a = ["-accel", "kvm", "-cpu", "host"]
    else:
        # An Intel model: with QEMU's default AMD-flavoured TCG CPUs the guest sees no SMT siblings (no topoext).
        # Single-threaded TCG by default: with one host thread per vCPU (thread=multi) on a loaded 2-core host we saw
        # a halted vCPU miss its timer wakeup after a reboot (RCU stall, boot hung in the initramfs).
        thread = os.environ.get("GPUHOST_TESTHOST_TCG_THREAD", "single")
        a = ["-accel", f"tcg,thread={thread},tb-size=256", "-cpu", "Nehalem"]
    a += ["-machine", "q35,kernel-irqchip=split" if accel() == "kvm" or iommu else "q35"]
    if iommu:
        a += ["-device", "intel-iommu,intremap=on"]
    return a


def _topology_args() -> list[str]:
    """2 sockets × 2 cores × 2 threads over two NUMA nodes of NODE_MEM_MIB each."""
    return [
        "-smp",
        "8,sockets=2,cores=2,threads=2",
        "-m",
        f"{2 * NODE_MEM_MIB}M",
        "-object",
        f"memory-backend-ram,id=mem0,size={NODE_MEM_MIB}M",
        "-object",
        f"memory-backend-ram,id=mem1,size={NODE_MEM_MIB}M",
        "-numa",
        "node,nodeid=0,cpus=0-3,memdev=mem0",
        "-numa",
        "node,nodeid=1,cpus=4-7,memdev=mem1",
    ]


def _root_complex_args(disk: Path) -> list[str]:
    """The boot display and the root disk on the root complex."""
    return [
        # The boot display on the root complex, so one VGA-class device reports boot_vga=1. Cirrus, not QEMU's
        # std VGA: that shares 1234:1111 with the bochs-display GPU stand-in, and on a real server the BMC's
        # display never has the GPU's vendor:device either (binding by ids must not take the console).
        "-device",
        "cirrus-vga,bus=pcie.0,addr=0x2",
        "-drive",
        f"if=none,id=root,file={disk},format=qcow2,cache=unsafe,discard=unmap",
        "-device",
        "virtio-blk-pci,drive=root,bus=pcie.0,addr=0x3,bootindex=0",
    ]


def _node0_args(port: int) -> list[str]:
    """NUMA node 0: the SSH NIC (forwarded from ``port`` on loopback) and the dirty IOMMU group."""
    return [
        "-device",
        "pxb-pcie,id=pxb0,bus_nr=64,numa_node=0,bus=pcie.0,addr=0x4",
        "-device",
        "pcie-root-port,id=rp_net,bus=pxb0,chassis=1,slot=1,addr=0x0",
        # restrict=on: the guest reaches nothing but the forwarded port (loopback only, no outside network).
        "-netdev",
        f"user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22",
        # An Intel e1000e rather than virtio-net: like a server NIC, its netdev hangs off the PCI function itself
        # (virtio's hangs off a virtio bus device), which is what the facts' SSH-NIC protection looks for.
        "-device",
        "e1000e,netdev=net0,bus=rp_net,romfile=",
        "-device",
        "pcie-root-port,id=rp_legacy,bus=pxb0,chassis=2,slot=2,addr=0x1",
        # Conventional PCI behind a PCIe-to-PCI bridge shares one requester ID: one group, never passable alone.
        "-device",
        "pcie-pci-bridge,id=pcibr0,bus=rp_legacy,addr=0x0",
        "-device",
        "pci-serial,bus=pcibr0,addr=0x1",
        "-device",
        "pci-testdev,bus=pcibr0,addr=0x2",
    ]


def _node1_args() -> list[str]:
    """NUMA node 1: the GPU stand-in (display fn 0 + HDA audio fn 1 of one slot) and the SR-IOV NVMe PF."""
    return [
        "-device",
        "pxb-pcie,id=pxb1,bus_nr=128,numa_node=1,bus=pcie.0,addr=0x5",
        "-device",
        "pcie-root-port,id=rp_gpu,bus=pxb1,chassis=3,slot=3,addr=0x0",
        "-device",
        "bochs-display,id=gpu0,bus=rp_gpu,addr=0x0.0,multifunction=on,romfile=",
        "-device",
        "ich9-intel-hda,id=gpu0audio,bus=rp_gpu,addr=0x0.1",
        "-device",
        "pcie-root-port,id=rp_nvme,bus=pxb1,chassis=4,slot=4,addr=0x1",
        "-device",
        "nvme-subsys,id=nvmesubsys0,nqn=nqn.2024-01.io.gpuhost:testhost",
        # QEMU 7.2's constraints for an SR-IOV NVMe PF: flexible queues >= 2 per VF, flexible interrupts >= 1
        # per VF, and the PF keeps >= 2 queue pairs and >= 1 vector of its own.
        "-device",
        (
            f"nvme,id=nvme0,serial=gpuhostsriov0,subsys=nvmesubsys0,bus=rp_nvme,"
            f"sriov_max_vfs={SRIOV_MAX_VFS},sriov_vq_flexible={2 * SRIOV_MAX_VFS},"
            f"sriov_vi_flexible={SRIOV_MAX_VFS},max_ioqpairs={2 * SRIOV_MAX_VFS + 2},"
            f"msix_qsize={SRIOV_MAX_VFS + 2}"
        ),
    ]


def machine_args(
    *,
    disk: Path,
    vars_fd: Path,
    serial_log: Path,
    port: int,
    iommu: bool = True,
    fw_cfg: dict[str, Path] | None = None,
    qmp: Optional[Path] = None,
) -> list[str]:
    """The full QEMU command line of the emulated GPU server (see the module docstring for the layout)."""
    a = [QEMU, "-name", "gpuhost-testhost", "-nodefaults", "-display", "none", "-no-user-config"]
    a += _cpu_args(iommu)
    a += _topology_args()
    a += _firmware_and_serial(vars_fd, serial_log)
    a += _root_complex_args(disk)
    a += _node0_args(port)
    a += _node1_args()
    for name, path in (fw_cfg or {}).items():
        a += ["-fw_cfg", f"name=opt/gpuhost/{name},file={path}"]
    if qmp:
        a += ["-qmp", f"unix:{qmp},server=on,wait=off"]
    return a


def build_boot(disk: Path, serial_log: Path, timeout: float = 900) -> None:
    """Boot a freshly assembled disk once with the 'build' flag: the guest runs update-grub and powers off."""
    work = disk.parent
    vars_fd = work / "build-vars.fd"
    shutil.copy(OVMF_VARS, vars_fd)
    flag = work / "build-flag"
    flag.write_text("1\n")
    args = [
        QEMU,
        "-nodefaults",
        "-display",
        "none",
        "-no-user-config",
        "-machine",
        "q35",
        "-smp",
        "2",
        "-m",
        "2048",
        "-no-reboot",
        "-accel",
        "kvm" if accel() == "kvm" else "tcg,thread=multi",
        *_firmware_and_serial(vars_fd, serial_log),
        "-drive",
        f"if=none,id=root,file={disk},format=qcow2",
        "-device",
        "virtio-blk-pci,drive=root,bootindex=0",
        "-fw_cfg",
        f"name=opt/gpuhost/build,file={flag}",
    ]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise RuntimeError(f"build boot did not power off in {timeout} s; serial log: {serial_log}") from None
    finally:
        vars_fd.unlink(missing_ok=True)
        flag.unlink(missing_ok=True)
    log = serial_log.read_text(errors="replace")
    settled = "gpuhost-seed: tuned profile: " in log and "gpuhost-seed: tuned profile:  (" not in log
    if p.returncode != 0 or "Generating grub configuration file" not in log or "done" not in log or not settled:
        raise RuntimeError(
            f"build boot failed (rc {p.returncode}): {err.decode()[-2000:]}\nserial log: {serial_log}\n{log[-3000:]}"
        )


@dataclass(frozen=True)
class SshKey:
    """A per-run ed25519 client key (OpenSSH private key format, which access.ssh and paramiko load)."""

    private_key_path: Path

    @classmethod
    def generate(cls, directory: Path) -> "SshKey":
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "id_ed25519"
        if not path.exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuhost-testhost", "-f", str(path)], check=True
            )
        return cls(path)

    @property
    def public_key_path(self) -> Path:
        return self.private_key_path.with_suffix(".pub")

    @property
    def private_key_pem(self) -> str:
        return self.private_key_path.read_text()


class TestHost:
    """One emulated GPU server on a fresh copy-on-write overlay of a base disk.

    Args:
        image: the BaseImage (`ensure_image()`), for the host key and the default backing disk.
        workdir: where the overlay, OVMF vars, serial log and QMP socket live (kept after stop for debugging).
        key: per-run client key, authorized in the guest at boot through fw_cfg (no disk edits).
        iommu: False leaves the intel-iommu device out (as if VT-d were off in firmware).
        backing: a different qcow2 to overlay (e.g. the prepared intel_iommu=on base), default image.disk.
        name: host name in access.ssh (round-trip counters, error messages).
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(
        self,
        image,
        workdir: Path,
        key: SshKey,
        *,
        iommu: bool = True,
        backing: Optional[Path] = None,
        name: str = "testhost",
    ):
        self.image = image
        self.workdir = Path(workdir)
        self.key = key
        self.iommu = iommu
        self.backing = Path(backing or image.disk)
        self.name = name
        self.port: Optional[int] = None
        self.proc: Optional[subprocess.Popen] = None
        self.pid: Optional[int] = None
        self.reboots = 0
        self.timings: dict[str, float | list[float]] = {}

    # ---- properties tests and stacks use -------------------------------------------------------------------
    address = "127.0.0.1"
    user = USER

    @property
    def private_key_path(self) -> Path:
        return self.key.private_key_path

    @property
    def private_key_pem(self) -> str:
        return self.key.private_key_pem

    @property
    def host_key_line(self) -> str:
        return self.image.host_key_line

    @property
    def serial_log(self) -> Path:
        return self.workdir / "serial.log"

    @property
    def overlay(self) -> Path:
        return self.workdir / "disk.qcow2"

    @property
    def key_name(self) -> str:
        return f"testhost-{self.name}"

    def host_spec(self, **overrides):
        """An access.ssh.HostSpec pinned to the guest's real host key (strict checking)."""
        from access.ssh import HostSpec

        kw = dict(
            name=self.name,
            address=self.address,
            port=self.port,
            user=self.user,
            host_key=self.host_key_line,
            key_name=self.key_name,
            connect_timeout=15.0,
        )
        kw.update(overrides)
        return HostSpec(**kw)

    # ---- lifecycle -----------------------------------------------------------------------------------------
    def __enter__(self) -> "TestHost":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def create_overlay(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.overlay.unlink(missing_ok=True)
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(self.backing), str(self.overlay)],
            check=True,
        )
        shutil.copy(OVMF_VARS, self.workdir / "vars.fd")

    def start(self, timeout: float = 600, fresh: bool = True) -> None:
        """Boot the host (a fresh overlay unless fresh=False) and wait until SSH answers."""
        from access import keys

        if fresh or not self.overlay.exists():
            self.create_overlay()
        keys.set_private_key(self.key_name, self.private_key_pem)
        t0 = time.monotonic()
        for _attempt in range(3):
            self.port = free_port()
            self.serial_log.write_bytes(b"")
            args = machine_args(
                disk=self.overlay,
                vars_fd=self.workdir / "vars.fd",
                serial_log=self.serial_log,
                port=self.port,
                iommu=self.iommu,
                qmp=self.workdir / "qmp.sock",
                fw_cfg={"authorized_keys": self.key.public_key_path},
            )
            (self.workdir / "qemu.cmdline").write_text(" ".join(args) + "\n")
            self.proc = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=open(self.workdir / "qemu.stderr", "wb"), start_new_session=True
            )
            self.pid = self.proc.pid
            time.sleep(1.0)
            if self.proc.poll() is None:
                break
            err = (self.workdir / "qemu.stderr").read_text(errors="replace")
            if "hostfwd" not in err and "Could not set up host forwarding" not in err:
                raise RuntimeError(f"QEMU exited at start: {err[-3000:]}")
        self._save_state()
        self.wait_ssh(timeout)
        self.settle(timeout)
        self.timings["boot_s"] = round(time.monotonic() - t0, 1)

    def settle(self, timeout: float = 600) -> str:
        """Wait until the boot has finished starting its units (`systemctl is-system-running --wait`), so that a
        test's runtime reads do not race the boot; returns the state ("running" or "degraded")."""
        out = self.ssh(
            f"timeout {int(timeout)} systemctl is-system-running --wait || true", timeout=timeout + 30
        ).stdout.strip()
        if out not in ("running", "degraded"):
            raise self._fail(
                f"the boot did not settle within {int(timeout)} s: systemctl is-system-running says {out!r}"
            )
        return out

    def _save_state(self) -> None:
        state = {
            "pid": self.pid,
            "port": self.port,
            "user": self.user,
            "address": self.address,
            "private_key_path": str(self.private_key_path),
            "host_key_line": self.host_key_line,
            "serial_log": str(self.serial_log),
            "iommu": self.iommu,
            "backing": str(self.backing),
            "name": self.name,
        }
        (self.workdir / "state.json").write_text(json.dumps(state, indent=2))

    def running(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        if self.pid:
            try:
                os.kill(self.pid, 0)
                return True
            except ProcessLookupError:
                return False
        return False

    def _fail(self, msg: str) -> RuntimeError:
        tail = self.serial_log.read_text(errors="replace")[-2500:] if self.serial_log.exists() else ""
        return RuntimeError(f"{self.name}: {msg}\nserial log: {self.serial_log}\n--- serial tail ---\n{tail}")

    def _try_boot_id(self) -> Optional[str]:
        from access import ssh as access_ssh

        spec = self.host_spec(connect_timeout=5.0)
        try:
            conn = access_ssh.connect(spec, attempts=1)
            return conn.run("cat /proc/sys/kernel/random/boot_id", timeout=20).stdout.strip()
        except (access_ssh.HostKeyMismatch, access_ssh.HostKeyUnknown):
            raise
        except Exception:
            access_ssh.drop(spec)
            return None

    def wait_ssh(self, timeout: float = 600, not_boot_id: Optional[str] = None) -> str:
        """Wait until SSH runs a command (and, with not_boot_id, until it runs in a new boot); return boot_id."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise self._fail(
                    "QEMU exited while waiting for SSH: "
                    + (self.workdir / "qemu.stderr").read_text(errors="replace")[-2000:]
                )
            if self._banner():
                bid = self._try_boot_id()
                if bid and bid != not_boot_id:
                    return bid
            time.sleep(2.0)
        raise self._fail(f"SSH on 127.0.0.1:{self.port} not ready within {timeout} s")

    def _banner(self) -> bool:
        # slirp accepts on the forwarded port even while the guest has no sshd; only a banner means sshd is up.
        try:
            with socket.create_connection((self.address, self.port), timeout=3) as s:
                s.settimeout(5)
                return s.recv(4).startswith(b"SSH-")
        except OSError:
            return False

    def ssh(self, command: str, check: bool = True, timeout: float = 300, input=None):
        """Run a command as root (sudo -n for gpuadmin) over access.ssh; returns access.ssh.Result."""
        from access import ssh as access_ssh

        return access_ssh.connect(self.host_spec()).run(command, input=input, check=check, timeout=timeout)

    def conn(self):
        from access import ssh as access_ssh

        return access_ssh.connect(self.host_spec())

    def reboot(self, timeout: float = 900) -> float:
        """Graceful reboot (systemctl reboot in the guest); waits for SSH in the *new* boot. Returns seconds."""
        from access import ssh as access_ssh

        t0 = time.monotonic()
        before = self.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()
        # Detached so the SSH exec returns before sshd goes away.
        self.ssh("nohup sh -c 'sleep 1; systemctl reboot' >/dev/null 2>&1 &")
        access_ssh.drop(self.host_spec())
        self.wait_ssh(timeout, not_boot_id=before)
        self.settle(timeout)
        self.reboots += 1
        took = round(time.monotonic() - t0, 1)
        reboots = self.timings.setdefault("reboots_s", [])
        assert isinstance(reboots, list)
        reboots.append(took)
        return took

    def poweroff(self, timeout: float = 300) -> None:
        """Graceful shutdown (the overlay's filesystem is clean afterwards); waits for QEMU to exit."""
        from access import ssh as access_ssh

        self.ssh("nohup sh -c 'sleep 1; systemctl poweroff' >/dev/null 2>&1 &")
        access_ssh.drop(self.host_spec())
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(1)
        if self.running():
            raise self._fail(f"did not power off within {timeout} s")
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def stop(self) -> None:
        """Stop QEMU at once (the overlay is throwaway); idempotent."""
        from access import ssh as access_ssh

        if self.port:
            access_ssh.drop(self.host_spec())
        if self.running() and self.pid:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            for _ in range(50):
                if not self.running():
                    break
                time.sleep(0.1)
            else:
                os.kill(self.pid, signal.SIGKILL)
        self._reap()
