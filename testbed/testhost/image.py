"""Build (once) and cache the Debian 12 base disk of the emulated GPU server.

Usage::

    from testbed.testhost.image import ensure_image
    img = ensure_image()              # builds on first use (a few minutes), then reuses the cache
    img.disk                          # .../base.qcow2: GPT disk, ESP with GRUB EFI + ext4 root
    img.host_key_line                 # "ssh-ed25519 AAAA..." of the guest's sshd, pinned by tests

or from a shell: ``python -m testbed.testhost build [--force]``.

Recipe: ``debootstrap --variant=minbase`` of bookworm from Debian's mirror, then the packages in `PACKAGES`
installed with apt inside the chroot (apt resolves the virtual ``logind`` that polkitd needs, which debootstrap's
own resolver does not), a ``gpuadmin`` user with passwordless sudo, systemd-networkd DHCP on the NIC, and
a small ``gpuhost-seed`` unit that reads per-run settings from QEMU's fw_cfg (the per-run SSH key). The disk is
assembled from files because loop partitions do not appear here: ``mkfs.ext4 -d`` for the root, mtools for the
ESP, ``sfdisk`` + ``dd`` for the GPT, ``qemu-img convert`` to qcow2.

Boot path: OVMF -> ``EFI/BOOT/BOOTX64.EFI`` (``grub-mkimage`` from the guest's own grub-efi-amd64-bin) whose
embedded config finds the root by UUID and loads ``/boot/grub/grub.cfg`` -- the file ``update-grub`` wrote
*inside the guest*. The build boots the image once with a ``build`` flag in fw_cfg so the guest runs
``update-grub`` itself and powers off; until that file exists the embedded config boots ``/vmlinuz``.

The cache lives in ``$GPUHOST_TESTHOST_CACHE`` (default ``~/.cache/gpuhost/testhost``) under a directory named by
the hash of this file and the package list; change either and the next run rebuilds.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

SUITE = "bookworm"
MIRROR = os.environ.get("GPUHOST_DEBIAN_MIRROR", "http://deb.debian.org/debian")

# What a Debian GPU host as the runbooks install it carries (seeds 000/002): grub + initramfs tooling, kmod,
# pciutils, numactl, irqbalance, tuned, driverctl, cpupower, libvirt with qemu for PinnedVM, python3 for ansible.
PACKAGES = [
    "linux-image-amd64",
    "systemd-sysv",
    "libpam-systemd",
    "dbus",
    "udev",
    "openssh-server",
    "sudo",
    "kmod",
    "pciutils",
    "numactl",
    "grub-efi-amd64",
    "grub-efi-amd64-bin",
    "initramfs-tools",
    "irqbalance",
    "tuned",
    "driverctl",
    "linux-cpupower",
    "nvme-cli",
    "iproute2",
    "procps",
    "python3",
    "e2fsprogs",
    "dosfstools",
    "libvirt-daemon-system",
    "qemu-system-x86",
    "qemu-utils",
    "ovmf",
    "less",
    # initramfs-tools only recommends zstd; without it mkinitramfs falls back to gzip -9, minutes under TCG.
    "zstd",
]

USER = "gpuadmin"
ROOT_FS_MIB = 6144
ESP_MIB = 64

# GRUB modules linked into BOOTX64.EFI; the full module set is also copied to /boot/grub/x86_64-efi (what
# grub-install would do) so every `insmod` in the guest's grub.cfg resolves.
GRUB_MODULES = (
    "part_gpt part_msdos fat ext2 search search_fs_uuid search_label configfile normal linux echo test "
    "all_video efi_gop efi_uga video_bochs video_cirrus gfxterm gzio serial terminal loadenv minicmd ls cat "
    "sleep reboot halt boot chain font gettext"
).split()

GRUB_EMBEDDED_CFG = """\
search --no-floppy --fs-uuid --set=root {root_uuid}
set prefix=($root)/boot/grub
if [ -f $prefix/grub.cfg ]; then
  configfile $prefix/grub.cfg
else
  echo "gpuhost: no /boot/grub/grub.cfg yet, booting /vmlinuz for the first update-grub"
  linux /vmlinuz root=UUID={root_uuid} ro console=ttyS0,115200n8 no_timer_check
  initrd /initrd.img
  boot
fi
"""

# /etc/default/grub as Debian writes it, with a serial console (a headless server) and a 1 s menu.
# GRUB_CMDLINE_LINUX stays empty as after installation: providers append to it.
DEFAULT_GRUB = """\
# If you change this file, run 'update-grub' afterwards to update
# /boot/grub/grub.cfg.
# For full documentation of the options in this file, see:
#   info -f grub -n 'Simple configuration'

GRUB_DEFAULT=0
GRUB_TIMEOUT=1
GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`
# no_timer_check: under TCG on a loaded machine the kernel's IO-APIC timer self-test can miss its window and panic
# ("timer doesn't work through Interrupt-remapped IO-APIC"); VMs commonly boot with it. GRUB_CMDLINE_LINUX, the
# variable gpuhost manages, stays empty as Debian installs it. mitigations=off: the emulated Nehalem is "vulnerable"
# to Meltdown, and page-table isolation's CR3 switch on every syscall flushes TCG's soft TLB (a test host runs
# thousands of short processes).
GRUB_CMDLINE_LINUX_DEFAULT="console=tty0 console=ttyS0,115200n8 no_timer_check mitigations=off"
GRUB_CMDLINE_LINUX=""
GRUB_TERMINAL="console serial"
GRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"
"""

SEED_SCRIPT = """\
#!/bin/sh
# gpuhost test host: per-run settings arrive through QEMU fw_cfg (-fw_cfg name=opt/gpuhost/...), so a cached
# disk can be booted with a fresh SSH key without editing the disk image.
set -eu
modprobe qemu_fw_cfg 2>/dev/null || true
D=/sys/firmware/qemu_fw_cfg/by_name/opt/gpuhost
[ -d "$D" ] || exit 0
if [ -r "$D/authorized_keys/raw" ]; then
  for h in /root /home/gpuadmin; do
    install -d -m 0700 "$h/.ssh"
    cat "$D/authorized_keys/raw" > "$h/.ssh/authorized_keys"
    chmod 0600 "$h/.ssh/authorized_keys"
  done
  chown -R gpuadmin:gpuadmin /home/gpuadmin/.ssh
fi
if [ -r "$D/build/raw" ]; then
  echo "gpuhost-seed: image build boot: update-initramfs, update-grub, then power off" > /dev/console
  update-initramfs -u > /dev/console 2>&1
  update-grub > /dev/console 2>&1
  sync
  # Power off once tuned has made its first-boot choice (it writes /etc/tuned/active_profile after its unit is
  # already active, minutes after sshd answers under TCG): every test host then starts from a host that has booted
  # before, whose runtime reads do not change under a test's feet.
  systemd-run --no-block --unit=gpuhost-build-settle -p After=tuned.service -p Wants=tuned.service \
    sh -c 'for i in $(seq 600); do [ -s /etc/tuned/active_profile ] && break; sleep 1; done; \
      echo "gpuhost-seed: tuned profile: $(cat /etc/tuned/active_profile) ($(cat /etc/tuned/profile_mode))" \
      > /dev/console; sync; systemctl poweroff'
fi
"""

SEED_UNIT = """\
[Unit]
Description=gpuhost test host: read per-run settings from QEMU fw_cfg
DefaultDependencies=no
After=local-fs.target systemd-modules-load.service
Before=ssh.service sysinit.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/gpuhost-seed
RemainAfterExit=yes

[Install]
WantedBy=sysinit.target
"""

NETWORK = """\
[Match]
Name=en* eth*

[Network]
DHCP=ipv4
"""

CHROOT_SETUP = """\
set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8
mount -t proc proc "$R/proc"
mount -t sysfs sys "$R/sys"
mount --bind /dev "$R/dev"
mount --bind "$APT_CACHE" "$R/var/cache/apt/archives"
printf '#!/bin/sh\\nexit 101\\n' > "$R/usr/sbin/policy-rc.d"
chmod 0755 "$R/usr/sbin/policy-rc.d"
chroot "$R" apt-get update -q
chroot "$R" apt-get install -y -q --no-install-recommends "$@"
rm -f "$R/usr/sbin/policy-rc.d"
"""


def recipe_hash() -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update("\n".join([SUITE, MIRROR, *PACKAGES]).encode())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    env = os.environ.get("GPUHOST_TESTHOST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "gpuhost" / "testhost"


def _log(msg: str) -> None:
    print(f"[testhost] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, check=True, **kw)
    except subprocess.CalledProcessError as e:
        out = (e.stdout or b"")[-4000:] if isinstance(e.stdout, bytes) else (e.stdout or "")[-4000:]
        err = (e.stderr or b"")[-4000:] if isinstance(e.stderr, bytes) else (e.stderr or "")[-4000:]
        raise RuntimeError(f"command failed ({e.returncode}): {' '.join(cmd)[:300]}\n{out!s}\n{err!s}") from None


@dataclass(frozen=True)
class BaseImage:
    """A built, cached base disk. `dir` holds base.qcow2 and manifest.json."""

    dir: Path
    manifest: dict

    @property
    def disk(self) -> Path:
        return self.dir / "base.qcow2"

    @property
    def host_key_line(self) -> str:
        return self.manifest["host_key_line"]

    @property
    def root_uuid(self) -> str:
        return self.manifest["root_uuid"]

    @property
    def kernel(self) -> str:
        return self.manifest["kernel"]

    @classmethod
    def load(cls, d: Path) -> "BaseImage":
        return cls(d, json.loads((d / "manifest.json").read_text()))


def ensure_image(force: bool = False) -> BaseImage:
    """The cached base image for the current recipe, built first if missing (under a lock, so concurrent test
    processes build it once)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    dest = root / recipe_hash()
    with open(root / f".lock-{dest.name}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if force and dest.exists():
            shutil.rmtree(dest)
        if not (dest / "manifest.json").exists():
            build(dest)
        return BaseImage.load(dest)


def build(dest: Path) -> None:
    if os.geteuid() != 0:
        raise RuntimeError("building the test host image needs root (debootstrap, chroot, mount)")
    t0 = time.monotonic()
    times: dict[str, float] = {}
    work = Path(tempfile.mkdtemp(prefix=f".build-{dest.name}-", dir=dest.parent))
    try:
        rootfs = work / "root"
        debs = cache_root() / "debs"
        debs.mkdir(exist_ok=True)
        _log(f"debootstrap {SUITE} from {MIRROR} into {rootfs}")
        _run(
            ["debootstrap", "--variant=minbase", f"--cache-dir={debs}", SUITE, str(rootfs), MIRROR], capture_output=True
        )
        times["debootstrap_s"] = round(time.monotonic() - t0, 1)
        _log(f"apt-get install {len(PACKAGES)} packages in the chroot")
        t = time.monotonic()
        env = dict(os.environ, R=str(rootfs), APT_CACHE=str(debs))
        # A private mount namespace: the chroot's proc/sys/dev mounts vanish with the process even if it dies.
        _run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", CHROOT_SETUP, "sh", *PACKAGES],
            env=env,
            capture_output=True,
        )
        times["packages_s"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        root_uuid = str(uuid.uuid4())
        esp_id = uuid.uuid4().hex[:8].upper()
        manifest = configure(rootfs, root_uuid, esp_id)
        efi = work / "BOOTX64.EFI"
        make_grub_efi(rootfs, root_uuid, efi)
        raw = work / "disk.raw"
        assemble_disk(rootfs, efi, root_uuid, esp_id, raw, work)
        qcow = work / "base.qcow2"
        _run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(qcow)], capture_output=True)
        raw.unlink()
        shutil.rmtree(rootfs)
        times["disk_s"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        _log("first boot: update-grub inside the guest")
        from testbed.testhost.machine import build_boot

        build_boot(qcow, work / "build-serial.log")
        times["first_boot_s"] = round(time.monotonic() - t, 1)
        times["total_s"] = round(time.monotonic() - t0, 1)
        manifest.update(recipe=dest.name, built_at=time.time(), times=times, root_uuid=root_uuid, esp_id=esp_id)
        (work / "manifest.json").write_text(json.dumps(manifest, indent=2))
        if dest.exists():
            shutil.rmtree(dest)
        work.rename(dest)
        _log(f"image ready in {times['total_s']} s: {dest} {times}")
    except BaseException:
        # Keep the failed build's logs, drop the heavy parts.
        for p in ("root", "disk.raw"):
            q = work / p
            if q.is_dir():
                subprocess.run(["rm", "-rf", "--one-file-system", str(q)], check=False)
            elif q.exists():
                q.unlink()
        _log(f"image build failed; what is left is in {work}")
        raise


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def configure(r: Path, root_uuid: str, esp_id: str) -> dict:
    """Turn the chroot into a bootable, reachable host. Returns facts for the manifest."""
    _write(r / "etc/hostname", "gpuhost-test\n")
    _write(r / "etc/hosts", "127.0.0.1\tlocalhost\n127.0.1.1\tgpuhost-test\n::1\tlocalhost ip6-localhost\n")
    _write(
        r / "etc/fstab",
        f"UUID={root_uuid} / ext4 errors=remount-ro 0 1\n"
        f"UUID={esp_id[:4]}-{esp_id[4:]} /boot/efi vfat umask=0077 0 1\n",
    )
    (r / "boot/efi").mkdir(parents=True, exist_ok=True)
    _write(r / "etc/default/grub", DEFAULT_GRUB)
    # MODULES=dep (a stock initramfs-tools setting) instead of "most": the initrd holds what the root disk needs,
    # not ~every driver, so update-initramfs and the initramfs stage of each boot take seconds instead of minutes
    # under TCG. It must be generated in the booted guest (the chroot cannot see the root device): build boot.
    conf = r / "etc/initramfs-tools/initramfs.conf"
    text = conf.read_text()
    if "\nMODULES=most\n" not in text:
        raise RuntimeError(f"{conf} has no MODULES=most line to change")
    conf.write_text(text.replace("\nMODULES=most\n", "\nMODULES=dep\n"))
    _write(r / "etc/systemd/network/20-wired.network", NETWORK)
    _write(r / "usr/local/sbin/gpuhost-seed", SEED_SCRIPT, 0o755)
    _write(r / "etc/systemd/system/gpuhost-seed.service", SEED_UNIT)
    _write(r / f"etc/sudoers.d/{USER}", f"{USER} ALL=(ALL) NOPASSWD:ALL\n", 0o440)
    # No DNS inside the test network (user-mode net with restrict=on); keep sshd from waiting on lookups.
    _write(r / "etc/ssh/sshd_config.d/gpuhost.conf", "UseDNS no\nPasswordAuthentication no\n")
    chroot = ["chroot", str(r)]
    _run(chroot + ["useradd", "-m", "-s", "/bin/bash", "-G", "sudo", "-p", "*", USER], capture_output=True)
    _run(
        chroot + ["systemctl", "enable", "systemd-networkd.service", "gpuhost-seed.service", "ssh.service"],
        capture_output=True,
    )
    # Units that only cost boot time in a throwaway host and reach nothing here.
    _run(chroot + ["systemctl", "disable", "apt-daily.timer", "apt-daily-upgrade.timer"], capture_output=True)
    _run(chroot + ["systemctl", "mask", "systemd-networkd-wait-online.service"], capture_output=True)
    (r / "etc/machine-id").write_text("")  # generated at first boot, as after a real install
    kernels = sorted(p.name[len("vmlinuz-") :] for p in (r / "boot").glob("vmlinuz-*"))
    host_key = " ".join((r / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2])
    # grub-install's job, done by hand: the guest's full module set where its grub.cfg's insmod looks.
    shutil.copytree(r / "usr/lib/grub/x86_64-efi", r / "boot/grub/x86_64-efi", dirs_exist_ok=True)
    return {"host_key_line": host_key, "kernel": kernels[-1], "packages": PACKAGES, "user": USER}


def make_grub_efi(r: Path, root_uuid: str, out: Path) -> None:
    cfg = r / "tmp/gpuhost-embed.cfg"
    cfg.write_text(GRUB_EMBEDDED_CFG.format(root_uuid=root_uuid))
    _run(
        [
            "chroot",
            str(r),
            "grub-mkimage",
            "-O",
            "x86_64-efi",
            "-o",
            "/tmp/BOOTX64.EFI",
            "-c",
            "/tmp/gpuhost-embed.cfg",
            "-p",
            "/boot/grub",
            *GRUB_MODULES,
        ],
        capture_output=True,
    )
    shutil.move(r / "tmp/BOOTX64.EFI", out)
    cfg.unlink()


def assemble_disk(r: Path, efi: Path, root_uuid: str, esp_id: str, raw: Path, work: Path) -> None:
    esp = work / "esp.img"
    _run(["mkfs.vfat", "-F", "32", "-i", esp_id, "-n", "EFI", "-C", str(esp), str(ESP_MIB * 1024)], capture_output=True)
    _run(["mmd", "-i", str(esp), "::/EFI", "::/EFI/BOOT"], capture_output=True)
    _run(["mcopy", "-i", str(esp), str(efi), "::/EFI/BOOT/BOOTX64.EFI"], capture_output=True)
    rootimg = work / "root.ext4"
    _run(
        ["mkfs.ext4", "-q", "-F", "-L", "root", "-U", root_uuid, "-d", str(r), str(rootimg), f"{ROOT_FS_MIB}M"],
        capture_output=True,
    )
    start_esp = 1  # MiB
    start_root = start_esp + ESP_MIB
    total = start_root + ROOT_FS_MIB + 1  # +1 MiB for the backup GPT
    with open(raw, "wb") as f:
        f.truncate(total * 1024 * 1024)
    table = (
        "label: gpt\nunit: sectors\n"
        f"start={start_esp * 2048}, size={ESP_MIB * 2048}, type=C12A7328-F81F-11D2-BA4B-00A0C93EC3B8, "
        'name="EFI System Partition"\n'
        f"start={start_root * 2048}, size={ROOT_FS_MIB * 2048}, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, "
        'name="root"\n'
    )
    _run(["sfdisk", "-q", str(raw)], input=table.encode(), capture_output=True)
    for img, start in ((esp, start_esp), (rootimg, start_root)):
        _run(
            ["dd", f"if={img}", f"of={raw}", "bs=1M", f"seek={start}", "conv=notrunc,sparse", "status=none"],
            capture_output=True,
        )
        img.unlink()
