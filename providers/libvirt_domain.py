"""LibvirtDomain: one tenant VM as a libvirt domain (seed 002 §八), defined from `plans.domain_xml`.

create = disk overlay + cloud-init seed + define + start. update = pin changes applied live where libvirt can
(vcpupin/emulatorpin/iothreadpin), anything else by graceful shutdown, redefine and start, and if define or start
fails the previous definition is put back (and started again if it was running) before the error is raised.
delete = graceful shutdown, destroy after `shutdown_timeout`, undefine with its NVRAM; then the seed ISO path and the
disk are put back as create found them (plans.vm_storage): through `host`, both are recorded on the host the first
time (pristine/ `Record` through the base's `record_and_read`, tagged with the owner), so a re-run after a
dropped connection still knows the real original. A file found at the seed ISO path comes back byte for byte (content, mode, owner), a
path that was empty is emptied; a disk that was there is never removed (`keep_disk: false` removes only the overlay
this resource made) and gets its mode and owner back. With `uri` only there is no host record: a seed ISO volume
already there is refused (it could not be put back), and `disk_created` is what this create saw.
Through `host`, whether libvirt's autostart directory (/etc/libvirt/qemu/autostart, which libvirtd makes when a
domain is first set to autostart) existed is recorded too, before anything changes; the `made_dirs` output names
it when it did not, and delete removes it after the domain is undefined, only when empty (another domain's
autostart link keeps it), as ManagedFile does with the parent directories it made.
read = the live domain XML parsed back into the `domain` input's terms, so refresh shows drift.

How libvirt is reached:
  * `uri` given (e.g. `test:///default`, `qemu:///system`): opened directly.
  * otherwise through the project's own SSH connection (`access.ssh`, pinned host key, jump host, key from secret
    config): a channel runs `virt-ssh-helper qemu:///system` on the host (libvirt's own ssh helper, `nc -U` on the
    daemon socket where it is missing) and a private 0700 Unix socket here bridges libvirt's `qemu+unix://` client
    to it. Unlike `qemu+ssh://` with `keyfile=`, no key is written to disk, and fingerprint pins and jump hosts
    work exactly as for every other gpuhost resource.

Usage::

    LibvirtDomain("gpu-a-tenant-a", {"host": host_input(spec), "domain": spec_dict,
                  "storage": {"base_image": "/var/lib/libvirt/images/jammy.qcow2", "capacity_gib": 40},
                  "cloud_init": {"user": "ops", "ssh_authorized_keys": ["ssh-ed25519 AAAA..."]}})
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any, Optional
from xml.sax.saxutils import escape

import libvirt
import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, UpdateResult
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import pristine
from access.shell import quote, sh
from access.ssh import Conn, HostSpec, connect
from facts.files import FileState
from plans import vm_storage
from plans.domain_xml import CloudInit, DomainSpec, cpuset_str, parse, render_element, seed_iso
from pristine import Change, Record
from providers.base import HostProvider, HostResource, is_safe_abs_path, validation_failures
from providers.effects import Effect, host_name
from providers.managed_file import remove_dirs_lines

# Changes libvirt applies to a running domain without a restart.
LIVE_FIELDS = {"vcpupin", "emulatorpin", "iothreadpin"}

# libvirtd makes it (0755 root) when a domain of qemu:///system is first set to autostart.
AUTOSTART_DIR = "/etc/libvirt/qemu/autostart"

# The domain's <metadata> names the resource that defined it (its `owner_tag`): a create whose result never came
# back (a dropped connection) leaves the domain defined and running, and the re-run adopts that one domain instead
# of failing on the name. A domain with another owner, or none, is never adopted.
OWNER_NS = "https://gpuhost.invalid/libvirt-domain"


def domain_xml(spec: DomainSpec, owner: Optional[str], uuid: Optional[str] = None) -> str:
    """`render(spec)` with the owner's mark in <metadata> (none without an owner tag)."""
    root = render_element(spec, uuid)
    if owner:
        ET.SubElement(ET.SubElement(root, "metadata"), f"{{{OWNER_NS}}}owner").text = owner
    ET.indent(root)
    return ET.tostring(root, encoding="unicode") + "\n"


def owner_of(dom: libvirt.virDomain) -> Optional[str]:
    """The owner tag in the domain's persistent definition, or None."""
    mark = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)).find(f"metadata/{{{OWNER_NS}}}owner")
    return mark.text if mark is not None else None


class Storage(BaseModel):
    """Where the VM's disk comes from: a qcow2 overlay on `base_image`, created in the libvirt pool whose
    directory holds `domain.disk` (seed 002: virtio disk from a base image)."""

    model_config = ConfigDict(extra="forbid")
    base_image: Optional[str] = None
    capacity_gib: int = Field(20, gt=0)


class DomainInputs(BaseModel):
    model_config = ConfigDict(extra="ignore")
    host: Optional[dict] = None
    uri: Optional[str] = None
    remote_uri: str = "qemu:///system"
    domain: DomainSpec
    storage: Storage = Field(default_factory=Storage)
    cloud_init: Optional[CloudInit] = None
    start: bool = True
    # libvirt starts the domain when libvirtd starts (after a host reboot): a tenant comes back on its own.
    autostart: bool = True
    keep_disk: bool = True
    shutdown_timeout: float = Field(60, ge=0)


# ------------------------------------------------------------------------------------------- libvirt connection


class _Tunnel:
    """A 0700 Unix socket here whose every connection is an SSH channel to the host's libvirt daemon."""

    def __init__(self, spec: HostSpec, remote_uri: str):
        self.spec = spec
        self.conn = connect(spec)
        self.dir = tempfile.mkdtemp(prefix="gpuhost-libvirt-")
        os.chmod(self.dir, 0o700)
        self.path = os.path.join(self.dir, "sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(4)
        script = (
            "if command -v virt-ssh-helper >/dev/null 2>&1; then exec "
            + sh("virt-ssh-helper", remote_uri)
            + "; else exec "
            + sh("nc", "-U", "/var/run/libvirt/libvirt-sock")
            + "; fi"
        )
        self.command = script if spec.user == "root" else sh("sudo", "-n", "sh", "-c", script)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            transport = self.conn.client.get_transport()
            assert transport is not None  # the connection is open while the forward runs
            chan = transport.open_session()
            chan.exec_command(self.command)
            threading.Thread(
                target=self._pump, args=(client.recv, chan.sendall, chan.shutdown_write), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(chan.recv, client.sendall, lambda c=client: c.shutdown(1)), daemon=True
            ).start()

    @staticmethod
    def _pump(recv, send, done) -> None:
        try:
            while True:
                data = recv(65536)
                if not data:
                    break
                send(data)
        except OSError:
            pass
        finally:
            try:
                done()
            except OSError:
                pass

    @property
    def alive(self) -> bool:
        """The SSH transport under the tunnel is up (libvirt notices a dead tunnel only when a call fails)."""
        transport = self.conn.client.get_transport()
        return transport is not None and transport.is_active()

    def close(self) -> None:
        self.server.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# Per-process pool (like access.ssh's): libvirt connections and their tunnels, keyed by URI or host.
_POOL: dict[Any, tuple[libvirt.virConnect, Optional[_Tunnel]]] = {}
_POOL_LOCK = threading.Lock()
_QUIET: list[bool] = []


def _no_print(_ctx: Any, _err: Any) -> None:
    """libvirt's default error handler prints every error to stderr ("libvirt: QEMU Driver error : Domain not
    found"), expected lookups included; the error still reaches the caller as libvirtError with its message."""


def _quiet_libvirt() -> None:
    """Replace libvirt's printing error handler once per process (it is process-wide)."""
    if not _QUIET:
        libvirt.registerErrorHandler(_no_print, None)
        _QUIET.append(True)


def open_libvirt(inputs: DomainInputs) -> libvirt.virConnect:
    """A live libvirt connection for these inputs, reused within this process."""
    if inputs.uri:
        key: Any = inputs.uri
    elif inputs.host:
        spec = HostSpec.model_validate(inputs.host)
        key = (spec.address, spec.port, spec.user, spec.jump, inputs.remote_uri)
    else:
        raise ValueError("LibvirtDomain needs `uri` or `host`")
    with _POOL_LOCK:
        _quiet_libvirt()
        got = _POOL.get(key)
        if got is not None:
            try:
                if got[0].isAlive() and (got[1] is None or got[1].alive):
                    return got[0]
            except libvirt.libvirtError:
                pass
            _POOL.pop(key, None)
            if got[1]:
                got[1].close()
        tunnel = None
        if inputs.uri:
            lv = libvirt.open(inputs.uri)
        else:
            tunnel = _Tunnel(spec, inputs.remote_uri)
            scheme = inputs.remote_uri.split(":", 1)[0]
            path = inputs.remote_uri.split("://", 1)[1] or "/system"
            lv = libvirt.open(f"{scheme}+unix://{path}?socket={tunnel.path}")
        _POOL[key] = (lv, tunnel)
        return lv


def close_all() -> None:
    with _POOL_LOCK:
        items = list(_POOL.values())
        _POOL.clear()
    for lv, tunnel in items:
        try:
            lv.close()
        except libvirt.libvirtError:
            pass
        if tunnel:
            tunnel.close()


# ------------------------------------------------------------------------------------------- domain operations


def _lookup(lv: libvirt.virConnect, name: str) -> Optional[libvirt.virDomain]:
    try:
        return lv.lookupByName(name)
    except libvirt.libvirtError as e:
        if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise


def shutdown(dom: libvirt.virDomain, timeout: float) -> str:
    """Graceful ACPI shutdown, destroy after `timeout` seconds. Returns how it went down."""
    if not dom.isActive():
        return "inactive"
    deadline = time.monotonic() + timeout
    next_ask = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() >= next_ask:
            try:
                dom.shutdown()  # asked again now and then: a guest still booting misses the first ACPI event
            except libvirt.libvirtError:
                if not dom.isActive():
                    return "shutdown"
            next_ask = time.monotonic() + 10
        if not dom.isActive():
            return "shutdown"
        time.sleep(0.25)
    if dom.isActive():
        dom.destroy()
        return "destroyed"
    return "shutdown"


def _undefine(dom: libvirt.virDomain) -> None:
    """Undefine with the VM's NVRAM (its UEFI variables are part of it); drivers without NVRAM (test://) refuse
    that flag, so fall back to fewer flags only on that refusal."""
    for flags in (
        libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
        | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
        | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA,
        0,
    ):
        try:
            dom.undefineFlags(flags)
            return
        except libvirt.libvirtError as e:
            if flags == 0 or e.get_error_code() not in (libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_INVALID_ARG):
                raise


def _pool_for(lv: libvirt.virConnect, path: str) -> libvirt.virStoragePool:
    """The storage pool whose target directory holds `path`."""
    want = os.path.dirname(path)
    for pool in lv.listAllStoragePools(0):
        target = pool.XMLDesc(0).split("<path>", 1)[-1].split("</path>", 1)[0] if "<path>" in pool.XMLDesc(0) else ""
        if os.path.normpath(target) == os.path.normpath(want):
            if not pool.isActive():
                pool.create(0)
            pool.refresh(0)
            return pool
    raise RuntimeError(f"no libvirt storage pool has the directory {want!r}; define one (virsh pool-define-as)")


def _volume(lv: libvirt.virConnect, path: str) -> Optional[libvirt.virStorageVol]:
    try:
        return lv.storageVolLookupByPath(path)
    except libvirt.libvirtError:
        return None


def ensure_overlay(lv: libvirt.virConnect, path: str, storage: Storage) -> bool:
    """Create the qcow2 overlay at `path` backed by `storage.base_image` unless a volume is there. True if made."""
    if _volume(lv, path) is not None:
        return False
    pool = _pool_for(lv, path)  # refreshed: a file put there since the pool was last read is a volume now
    if _volume(lv, path) is not None:
        return False
    xml = (
        "<volume><name>{}</name><capacity unit='GiB'>{}</capacity>"
        "<target><format type='qcow2'/></target>"
        "<backingStore><path>{}</path><format type='qcow2'/></backingStore></volume>"
    ).format(escape(os.path.basename(path)), storage.capacity_gib, escape(storage.base_image or ""))
    pool.createXML(xml, 0)
    return True


def write_seed(lv: libvirt.virConnect, path: str, data: bytes) -> bool:
    """(Re)create the seed ISO volume at `path` with `data`. False where the driver cannot upload (test://)."""
    old = _volume(lv, path)
    if old is not None:
        old.delete(0)
    pool = _pool_for(lv, path)
    vol = pool.createXML(
        "<volume><name>{}</name><capacity unit='bytes'>{}</capacity><target><format type='raw'/></target></volume>".format(
            escape(os.path.basename(path)), len(data)
        ),
        0,
    )
    stream = lv.newStream(0)
    try:
        vol.upload(stream, 0, len(data), 0)
    except libvirt.libvirtError as e:
        if e.get_error_code() == libvirt.VIR_ERR_NO_SUPPORT:
            return False
        raise
    stream.send(data)
    stream.finish()
    return True


def _delete_volume(lv: libvirt.virConnect, path: Optional[str]) -> None:
    if path:
        vol = _volume(lv, path)
        if vol is not None:
            vol.delete(0)


def _live_pins(dom: libvirt.virDomain, ncpus: int, spec: DomainSpec) -> None:
    def cpumap(cpus):
        return tuple(i in set(cpus) for i in range(ncpus))

    # AFFECT_CURRENT on a running domain is the live one (the persistent definition was already redefined);
    # some drivers (test://) accept only CURRENT.
    flags = libvirt.VIR_DOMAIN_AFFECT_CURRENT
    for i, cpu in enumerate(spec.vcpupin):
        dom.pinVcpuFlags(i, cpumap([cpu]), flags)
    if spec.emulatorpin:
        dom.pinEmulator(cpumap(spec.emulatorpin), flags)
    for i, cs in enumerate(spec.iothreadpin):
        dom.pinIOThread(i + 1, cpumap(cs), flags)


def state_name(dom: libvirt.virDomain) -> str:
    st = dom.state()[0]
    return {
        libvirt.VIR_DOMAIN_RUNNING: "running",
        libvirt.VIR_DOMAIN_SHUTOFF: "shutoff",
        libvirt.VIR_DOMAIN_PAUSED: "paused",
        libvirt.VIR_DOMAIN_SHUTDOWN: "shutdown",
        libvirt.VIR_DOMAIN_CRASHED: "crashed",
    }.get(st, str(st))


class UpdateFailed(RuntimeError):
    """Define or start of the new definition failed; the previous one was restored (named in the message)."""


class LibvirtDomainProvider(HostProvider):
    # 3: the seed ISO path and the disk recorded on the host and put back as found on delete; 4: the autostart
    # directory libvirtd made on gpuhost's request removed on delete
    VERSION = "4"
    # A new name or another host is another domain: delete the old one first (it holds the GPU).
    REPLACE_ON = ("host", "uri", "remote_uri")
    OUTPUT_ONLY = (
        "uuid",
        "state",
        "domid",
        "seed_uploaded",
        "disk_created",
        "xml_sha256",
        # what the seed ISO path held and the disk's `disk_stat` when first recorded (through `host` only)
        "seed_found",
        "disk_found",
        # libvirt's autostart directory when it did not exist before the first create (through `host` only)
        "made_dirs",
    )

    @classmethod
    def writes(cls, inputs: dict) -> list:
        domain = inputs.get("domain")  # known unless it waits for VF addresses
        return [domain.get(k) for k in ("disk", "seed_iso", "nvram")] if isinstance(domain, Mapping) else []

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures: list[CheckFailure] = []
        try:
            inp = DomainInputs.model_validate(news)
        except ValidationError as e:
            return CheckResult(news, validation_failures(e))
        if not inp.uri and not inp.host:
            failures.append(CheckFailure("host", "give `host` (SSH) or `uri` (a libvirt URI)"))
        if inp.host:
            failures += self.check_host(news)
        if inp.storage.base_image and not inp.domain.disk:
            failures.append(CheckFailure("domain.disk", "a base image needs the overlay's path in domain.disk"))
        if inp.cloud_init and not inp.domain.seed_iso:
            failures.append(CheckFailure("domain.seed_iso", "cloud_init needs the seed ISO path in domain.seed_iso"))
        for f in ("disk", "seed_iso"):
            path = getattr(inp.domain, f)
            if path is not None and (not is_safe_abs_path(path) or path == "/"):
                failures.append(CheckFailure(f"domain.{f}", f"must be an absolute path without '..': {path!r}"))
        # Normalised inputs (PCI addresses in full form, defaults written out) so that state, refresh and new
        # inputs compare field by field.
        news = {
            **news,
            "domain": inp.domain.model_dump(mode="json"),
            "storage": inp.storage.model_dump(mode="json"),
            "cloud_init": inp.cloud_init.model_dump(mode="json") if inp.cloud_init else None,
        }
        return CheckResult(news, failures)

    def diff_known(self, id_: str, olds: dict, news: dict):
        d = super().diff_known(id_, olds, news)
        if (olds.get("domain") or {}).get("name") != (news.get("domain") or {}).get("name"):
            d.replaces = sorted(set(d.replaces or []) | {"domain"})
            d.delete_before_replace = True
            d.changes = True
        return d

    def effects(self, olds: dict | None, news: dict) -> list[Effect]:
        # What `update` does to a running guest: pins alone apply live; another definition or seed means a
        # shutdown and a start; a replacement (another name or host) shuts the old domain down for good first.
        if olds is None:
            return []
        od, nd = olds.get("domain") or {}, news.get("domain") or {}
        name = str(nd.get("name") or od.get("name"))
        if self.replaces(olds, news, self.changed_keys(olds, news)) or od.get("name") != nd.get("name"):
            return [Effect("restart", host_name(olds), str(od.get("name")), "shuts down and is deleted (replaced)")]
        redefined = {k for k in set(od) | set(nd) if od.get(k) != nd.get(k)} - LIVE_FIELDS
        if redefined or olds.get("cloud_init") != news.get("cloud_init"):
            return [Effect("restart", host_name(news), name, "shuts down (ACPI) and starts again, redefined")]
        return []

    # -- the seed ISO path and the disk, as found -----------------------------------------------------------------
    @staticmethod
    def _on_host(inp: DomainInputs) -> bool:
        """Files are recorded and restored over `host`'s SSH (libvirt reached through it too); not with `uri`."""
        return bool(inp.host) and not inp.uri

    @staticmethod
    def _paths(inp: DomainInputs) -> tuple[Optional[str], Optional[str]]:
        """(seed ISO path gpuhost writes, disk path gpuhost may make): None where it writes or makes nothing."""
        seed = inp.domain.seed_iso if inp.cloud_init else None
        disk = inp.domain.disk if inp.storage.base_image else None
        return seed, disk

    @staticmethod
    def _dirs_key(inp: DomainInputs) -> str:
        return f"libvirt-domain/{inp.domain.name}/missing-dirs"

    def _record(self, props: dict, inp: DomainInputs, dirs: bool = True) -> Record:
        """The seed ISO path, the disk and (`dirs`) whether the autostart directory was missing, as first found."""
        seed, disk = self._paths(inp)
        values = {vm_storage.disk_key(disk): vm_storage.disk_stat(disk)} if disk else {}
        if dirs:
            values[self._dirs_key(inp)] = f"[ -e {quote(AUTOSTART_DIR)} ] || echo {quote(AUTOSTART_DIR)}"
        return Record(self.owner(props), files=[seed] if seed else [], values=values)

    def _found(
        self, conn: Conn, props: dict, inp: DomainInputs, disk: Optional[str]
    ) -> tuple[Optional[dict], Optional[str], bool, list[str]]:
        """Record the seed ISO path, the disk of `inp` and whether the autostart directory is missing the first
        time, before anything changes (one round trip; not a change yet: a create refused here drops the records it
        made fresh). Returns (seed path as first found, disk as first found, whether the disk at `disk` is there
        now, the directories that were missing)."""
        seed, rec_disk = self._paths(inp)
        out, files, values = self.record_and_read(
            conn, props, self._record(props, inp), vm_storage.disk_now(disk) if disk else ""
        )
        return (
            files[seed].model_dump() if seed else None,
            values.get(vm_storage.disk_key(rec_disk)) if rec_disk else None,
            bool(disk) and vm_storage.parse_disk_now(out),
            [d for d in values.get(self._dirs_key(inp), "").splitlines() if d == AUTOSTART_DIR],
        )

    def _write_seed(self, lv: libvirt.virConnect, props: dict, inp: DomainInputs, conn: Optional[Conn]) -> bool:
        """The cloud-init seed at its path: over SSH under the host lock, or as a libvirt volume with `uri`."""
        path = inp.domain.seed_iso
        assert path and inp.cloud_init
        data = seed_iso(inp.cloud_init, inp.domain.name)
        if conn is None:
            return write_seed(lv, path, data)
        ch = Change(self.owner(props)).write(path, data, vm_storage.SEED_MODE, vm_storage.SEED_OWNER)
        self.guarded(conn, f"writing the cloud-init seed ISO {path}", lambda: ch.run(conn), changing=True)
        return True

    def _release(self, lv: libvirt.virConnect, props: dict, delete_disk: bool, gone: bool = True) -> None:
        """Put the seed ISO path and the disk back as create found them. `gone`: the domain is undefined (delete,
        a failed create), so the autostart directory it made goes too when empty, and its record."""
        inp = DomainInputs.model_validate(props)
        seed, disk = self._paths(inp)
        disk_created = bool(props.get("disk_created"))
        if not self._on_host(inp):
            _delete_volume(lv, seed)
            if delete_disk and disk_created:
                _delete_volume(lv, disk)
            return
        found = props.get("seed_found")
        # state of version 2 (no record): the seed was removed and a disk this create saw made was removed
        seed_found = FileState.model_validate(found) if found else FileState(path=seed or "", exists=False)
        disk_found = vm_storage.parse_disk(props.get("disk_found")) or (
            vm_storage.DiskFound(exists=False) if disk_created else None
        )
        plan = vm_storage.release_plan(seed, seed_found, disk, disk_found, delete_disk)
        conn = self.conn(props)
        made = remove_dirs_lines(list(props.get("made_dirs") or [])) if gone else []
        self.run_plan(conn, props, plan, then=made + self._record(props, inp, dirs=gone).forget_lines())

    # -- create ---------------------------------------------------------------------------------------------------
    def create(self, props: dict) -> CreateResult:
        inp = DomainInputs.model_validate(props)
        lv = open_libvirt(inp)
        spec = inp.domain
        owner = props.get("owner_tag")
        left = _lookup(lv, spec.name)
        if left is not None and (not owner or owner_of(left) != owner):
            raise RuntimeError(f"domain {spec.name!r} already exists on this host; import it or pick another name")
        seed, disk = self._paths(inp)
        conn = self.conn(props) if self._on_host(inp) else None
        seed_found: Optional[dict] = None
        disk_found: Optional[str] = None
        made_dirs: list[str] = []
        if conn is not None:
            # the first record wins: a re-run after a dropped connection reads what the first create found
            seed_found, disk_found, disk_there, made_dirs = self._found(conn, props, inp, disk)
            disk_created = disk_found == "absent"
        else:
            if seed and left is None and _volume(lv, seed) is not None:
                raise RuntimeError(
                    f"{seed} (domain.seed_iso) is there already; with `uri` it could not be put back on delete: "
                    "move it away, or reach the host through `host`"
                )
            disk_there = disk_created = False
        seed_uploaded = False
        dom = None
        xml = ""
        try:
            pristine.changing()  # libvirt's changes too: from here on the records describe the original, kept
            if disk:
                made = False if disk_there else ensure_overlay(lv, disk, inp.storage)
                disk_created = disk_created or made
            if seed:
                seed_uploaded = self._write_seed(lv, props, inp, conn)
            # `left`: this resource's own domain from a create whose result was lost; redefined in place (its UUID)
            if left is not None:
                _settle(left, 120)
            xml = domain_xml(spec, owner, uuid=left.UUIDString() if left is not None else None)
            dom = lv.defineXML(xml)
            dom.setAutostart(1 if inp.autostart else 0)
            if inp.start and not dom.isActive():
                dom.create()
            elif inp.start and dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED:
                dom.resume()  # an adopted domain whose start was cut off by the drop (QEMU up, CPUs not resumed)
        except Exception as e:
            # nothing of a failed create may stay behind: the GPU would be held by a half-made domain
            try:
                if dom is not None:
                    if dom.isActive():
                        dom.destroy()
                    _undefine(dom)
                made_by = {
                    "disk_created": disk_created,
                    "seed_found": seed_found,
                    "disk_found": disk_found,
                    "made_dirs": made_dirs,
                }
                self._release(lv, {**props, **made_by}, delete_disk=True)
            except Exception as undo:  # noqa: BLE001 - the create's own error is the one to raise
                e.add_note(f"undoing the failed create failed too: {undo}")
            raise
        assert dom is not None
        return CreateResult(
            dom.UUIDString(),
            self._outs(
                props,
                dom,
                disk_created,
                seed_uploaded,
                xml,
                seed_found=seed_found,
                disk_found=disk_found,
                made_dirs=made_dirs,
            ),
        )

    def _outs(self, props, dom, disk_created, seed_uploaded, xml, **found) -> dict:
        return self.outputs(
            props,
            uuid=dom.UUIDString(),
            state=state_name(dom),
            domid=dom.ID(),
            disk_created=disk_created,
            seed_uploaded=seed_uploaded,
            xml_sha256=hashlib.sha256(xml.encode()).hexdigest(),
            **found,
        )

    # -- update ---------------------------------------------------------------------------------------------------
    def update(self, id_: str, olds: dict, news: dict) -> UpdateResult:
        """Record the paths this resource had not written before, then rewrite the seed and make the disk, redefine
        (pins live, else a restart; the previous definition back on failure), set autostart, and put a seed ISO
        path or disk the domain no longer uses back as found."""
        old = DomainInputs.model_validate(olds)
        new = DomainInputs.model_validate(news)
        lv = open_libvirt(new)
        dom = lv.lookupByUUIDString(id_)
        (old_seed, old_disk), (seed, disk) = self._paths(old), self._paths(new)
        new_seed, new_disk = (seed if seed != old_seed else None), (disk if disk != old_disk else None)
        conn = self.conn(news) if self._on_host(new) else None
        found, disk_created, disk_there = self._found_new(conn, olds, news, new, new_seed, new_disk, disk)
        pristine.changing()
        seed_uploaded = bool(olds.get("seed_uploaded"))
        if seed and (new_seed or new.cloud_init != old.cloud_init):
            seed_uploaded = self._rewrite_seed(lv, dom, news, new, conn)
        if disk and not disk_there:
            made = ensure_overlay(lv, disk, new.storage)
            if conn is None:
                disk_created = made or (disk_created and not new_disk)
        dom, xml = _redefine(lv, dom, new, news.get("owner_tag"))
        if bool(dom.autostart()) != new.autostart:
            dom.setAutostart(1 if new.autostart else 0)
        self._release_unused(lv, olds, (old_seed, old_disk), (seed, disk))
        if not seed:
            found["seed_found"] = None
        if not disk:
            found["disk_found"], disk_created = None, False
        return UpdateResult(self._outs(news, dom, disk_created, seed_uploaded, xml, **found))

    def _found_new(
        self,
        conn: Optional[Conn],
        olds: dict,
        news: dict,
        new: DomainInputs,
        new_seed: Optional[str],
        new_disk: Optional[str],
        disk: Optional[str],
    ) -> tuple[dict, bool, bool]:
        """Record the seed ISO path and the disk this update starts to use (through `host` only; the first record
        wins). Returns (seed_found, disk_found and made_dirs for state, disk_created, whether the disk is there)."""
        found = {k: olds.get(k) for k in ("seed_found", "disk_found", "made_dirs")}
        disk_created = bool(olds.get("disk_created"))
        disk_there = False
        if conn is not None and (new_seed or disk):
            # only a path this resource did not write or make before is recorded now (a state of version 2 has
            # no record of the old paths: recording them now would take gpuhost's own seed for the original)
            part = new.model_copy(
                update={
                    "cloud_init": new.cloud_init if new_seed else None,
                    "storage": new.storage if new_disk else Storage(base_image=None),
                }
            )
            seed_found, disk_found, disk_there, _ = self._found(conn, news, part, disk)
            if new_seed:
                found["seed_found"] = seed_found
            if new_disk:
                found["disk_found"], disk_created = disk_found, disk_found == "absent"
        return found, disk_created, disk_there

    def _rewrite_seed(
        self, lv: libvirt.virConnect, dom: libvirt.virDomain, news: dict, new: DomainInputs, conn: Optional[Conn]
    ) -> bool:
        """Write the new cloud-init seed with the domain shut down, then start it again if it ran."""
        was = dom.isActive()
        if was:
            shutdown(dom, new.shutdown_timeout)
        seed_uploaded = self._write_seed(lv, news, new, conn)
        if was:
            dom.create()
        return seed_uploaded

    def _release_unused(
        self,
        lv: libvirt.virConnect,
        olds: dict,
        old_paths: tuple[Optional[str], Optional[str]],
        paths: tuple[Optional[str], Optional[str]],
    ) -> None:
        """A seed ISO path or disk the domain no longer uses goes back as found (a disk's data is never deleted
        here). `old_paths`, `paths`: (seed ISO, disk) before and after the update."""
        (old_seed, old_disk), (seed, disk) = old_paths, paths
        gone_seed, gone_disk = old_seed is not None and old_seed != seed, old_disk is not None and old_disk != disk
        if gone_seed or gone_disk:
            gone = {**olds, "cloud_init": olds.get("cloud_init") if gone_seed else None}
            if not gone_disk:
                gone["storage"] = {**(olds.get("storage") or {}), "base_image": None}
            self._release(lv, gone, delete_disk=False, gone=False)

    # -- delete ---------------------------------------------------------------------------------------------------
    def delete(self, id_: str, props: dict) -> None:
        inp = DomainInputs.model_validate(props)
        lv = open_libvirt(inp)
        try:
            dom = lv.lookupByUUIDString(id_)
        except libvirt.libvirtError:
            dom = _lookup(lv, inp.domain.name)
        if dom is not None:
            shutdown(dom, inp.shutdown_timeout)
            _undefine(dom)
        self._release(lv, props, delete_disk=not inp.keep_disk)

    # -- read -----------------------------------------------------------------------------------------------------
    def read(self, id_: str, props: dict) -> ReadResult:
        inp = DomainInputs.model_validate(props)
        lv = open_libvirt(inp)
        try:
            dom = lv.lookupByUUIDString(id_)
        except libvirt.libvirtError as e:
            if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return ReadResult("", {})
            raise
        live = parse(dom.XMLDesc(0))
        outs = {
            **props,
            "domain": live.model_dump(mode="json"),
            "state": state_name(dom),
            "domid": dom.ID(),
            "autostart": bool(dom.autostart()),
        }
        return ReadResult(id_, outs)


def _settle(dom: libvirt.virDomain, timeout: float) -> None:
    """Wait (at most `timeout` s) while libvirtd still finishes a start (paused, reason "starting up"): a create cut
    off by a dropped connection leaves the start running on the host."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and dom.state() == [
        libvirt.VIR_DOMAIN_PAUSED,
        libvirt.VIR_DOMAIN_PAUSED_STARTING_UP,
    ]:
        time.sleep(0.5)


def _redefine(
    lv: libvirt.virConnect, dom: libvirt.virDomain, new: DomainInputs, owner: Optional[str]
) -> tuple[libvirt.virDomain, str]:
    """(the domain, its new XML) after defining `new.domain`: nothing when the live definition already matches;
    pins alone on a running domain of the same shape apply live; else shut down, define and start again. On a
    libvirt error the previous definition goes back (started again if it ran) and UpdateFailed says so."""
    spec = new.domain
    live_xml = parse(dom.XMLDesc(0))
    changed = {f for f in DomainSpec.model_fields if getattr(live_xml, f) != getattr(spec, f)}
    xml = domain_xml(spec, owner, uuid=dom.UUIDString())
    previous = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE)
    running = bool(dom.isActive())
    if not changed:
        pass
    elif running and changed <= LIVE_FIELDS and _same_shape(live_xml, spec):
        lv.defineXML(xml)
        try:
            _live_pins(dom, lv.getCPUMap(0)[0], spec)
        except libvirt.libvirtError as e:
            lv.defineXML(previous)
            raise UpdateFailed(f"live pinning of {spec.name!r} failed ({e}); previous definition restored") from e
    else:
        if running:
            shutdown(dom, new.shutdown_timeout)
        try:
            dom = lv.defineXML(xml)
            if running or new.start:
                dom.create()
        except libvirt.libvirtError as e:
            dom = lv.defineXML(previous)
            if running:
                dom.create()
            raise UpdateFailed(
                f"update of {spec.name!r} failed: {e.get_error_message()}; previous definition restored"
                + (" and started" if running else "")
            ) from e
    return dom, xml


def _same_shape(a: DomainSpec, b: DomainSpec) -> bool:
    return len(a.vcpupin) == len(b.vcpupin) and len(a.iothreadpin) == len(b.iothreadpin)


class LibvirtDomain(HostResource, module="vm", name="LibvirtDomain"):
    uuid: pulumi.Output[str]
    state: pulumi.Output[str]

    PROVIDER = LibvirtDomainProvider


__all__ = ["LibvirtDomain", "LibvirtDomainProvider", "DomainInputs", "Storage", "UpdateFailed", "cpuset_str"]
