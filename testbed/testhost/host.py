"""What a host shows, asked one property at a time (after pytest-testinfra), read in one round trip.

A test names the values it will check, reads them in one SSH exec, then asserts one property per line:

    host = Host(testhost.ssh)                      # anything that runs a command: TestHost.ssh, Connection.run
    now = host.read(Sysctl("net.core.somaxconn"), PciDriver(GPU_FN0), FileStat("/etc/default/grub"))
    assert now.sysctl("net.core.somaxconn") == 4096
    assert now.pci_device(GPU_FN0).driver == "vfio-pci"
    assert now.file("/etc/default/grub").mode == 0o644
    assert now.file("/etc/default/grub").user == "root"
    assert host.service("tuned").is_running        # not read before: one round trip of its own

A property that was not in the read fails with KeyError naming it (a read is a snapshot: it does not go back to
the host). Two reads compare equal when they read the same values (`pristine == runtime()`).

Each probe is a command built by access.shell (every value quoted: testinfra's rule) and a pure parser of its
output and exit status; the batch frames each probe's output in base64, so any content (newlines, markers, a
missing trailing newline) comes back as it was.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from access.shell import Script, quote, sh

PCI = "/sys/bus/pci/devices"


def _int_or_text(text: str) -> Union[int, str]:
    s = text.strip()
    try:
        return int(s)
    except ValueError:
        return s


@dataclass(frozen=True)
class Sysctl:
    """`sysctl -n NAME`: an int when the value is one (testinfra's rule), else the text; None when unknown."""

    name: str

    def command(self) -> str:
        return sh("sysctl", "-n", self.name)

    def parse(self, out: str, rc: int) -> Optional[Union[int, str]]:
        return _int_or_text(out) if rc == 0 else None


@dataclass(frozen=True)
class KernelCmdline:
    """The running kernel's arguments, in order (/proc/cmdline)."""

    def command(self) -> str:
        return sh("cat", "/proc/cmdline")

    def parse(self, out: str, rc: int) -> tuple[str, ...]:
        return tuple(out.split())


@dataclass(frozen=True)
class BootId:
    def command(self) -> str:
        return sh("cat", "/proc/sys/kernel/random/boot_id")

    def parse(self, out: str, rc: int) -> str:
        return out.strip()


@dataclass(frozen=True)
class PciDriver:
    """The driver bound to a PCI function (the name of its `driver` link), None when unbound."""

    addr: str

    def command(self) -> str:
        return sh("readlink", f"{PCI}/{self.addr}/driver")

    def parse(self, out: str, rc: int) -> Optional[str]:
        return out.strip().rsplit("/", 1)[-1] if rc == 0 and out.strip() else None


@dataclass(frozen=True)
class SysfsValue:
    """One sysfs (or procfs) value: an int when it is one; None when the file is not there."""

    path: str

    def command(self) -> str:
        return sh("cat", self.path)

    def parse(self, out: str, rc: int) -> Optional[Union[int, str]]:
        return _int_or_text(out) if rc == 0 else None


def SriovNumvfs(addr: str) -> SysfsValue:
    return SysfsValue(f"{PCI}/{addr}/sriov_numvfs")


def Hugepages(node: int, size_kb: int = 2048) -> SysfsValue:
    return SysfsValue(f"/sys/devices/system/node/node{node}/hugepages/hugepages-{size_kb}kB/nr_hugepages")


@dataclass(frozen=True)
class FileStat:
    """Type, mode, owner and (regular files) sha256 of a path, the path itself (a link is not followed)."""

    path: str

    def command(self) -> str:
        stat = sh("stat", "-c", "%F|%a|%U|%G", "--", self.path)
        # stdin, not a name argument: sha256sum escapes a name with a newline or a backslash in its output.
        return f"{stat} && {{ {sh('sha256sum')} < {quote(self.path)} || true; }}"

    def parse(self, out: str, rc: int) -> Optional[dict[str, Any]]:
        lines = out.splitlines()
        if rc != 0 or not lines:
            return None
        kind, mode, user, group = lines[0].rsplit("|", 3)
        sha = lines[1].split()[0] if len(lines) > 1 and kind.startswith("regular") else None
        return {"type": kind, "mode": int(mode, 8), "user": user, "group": group, "sha256": sha}


@dataclass(frozen=True)
class FileContent:
    """A file's bytes as text, exactly (None when it cannot be read)."""

    path: str

    def command(self) -> str:
        return sh("cat", "--", self.path)

    def parse(self, out: str, rc: int) -> Optional[str]:
        return out if rc == 0 else None


@dataclass(frozen=True)
class ServiceState:
    """`systemctl is-active` and `is-enabled` of a unit, as their one-word answers."""

    name: str

    def command(self) -> str:
        return f"{sh('systemctl', 'is-active', self.name)}; {sh('systemctl', 'is-enabled', self.name)}"

    def parse(self, out: str, rc: int) -> tuple[str, str]:
        active, enabled = (out.split() + ["", ""])[:2]
        return active, enabled


@dataclass(frozen=True)
class DomainState:
    """`virsh domstate NAME` ("running", "shut off"), None when libvirt has no such domain."""

    name: str

    def command(self) -> str:
        return sh("virsh", "domstate", self.name)

    def parse(self, out: str, rc: int) -> Optional[str]:
        return out.strip() if rc == 0 else None


@dataclass(frozen=True)
class Domains:
    """Every libvirt domain's name, defined or running, sorted."""

    def command(self) -> str:
        return sh("virsh", "list", "--all", "--name")

    def parse(self, out: str, rc: int) -> tuple[str, ...]:
        return tuple(sorted(out.split()))


@dataclass(frozen=True)
class Output:
    """A command's stdout as it printed it (testinfra's check_output, for what has no property here); `command`
    comes from access.shell. A failed command is an error: the read raises."""

    command_text: str

    def command(self) -> str:
        return self.command_text

    def parse(self, out: str, rc: int) -> str:
        if rc != 0:
            raise RuntimeError(f"{self.command_text!r} exited {rc} on the host")
        return out


Probe = Union[
    Sysctl,
    KernelCmdline,
    BootId,
    PciDriver,
    SysfsValue,
    FileStat,
    FileContent,
    ServiceState,
    DomainState,
    Domains,
    Output,
]


def batch_script(probes: list[Probe]) -> str:
    """One sh script that runs every probe and prints, per probe, `INDEX RC BASE64(STDOUT)` on one line.

    The trailing `x` keeps the output's trailing newlines through `$(...)`; stderr is dropped (rc says it)."""
    s = Script()
    for i, p in enumerate(probes):
        s.raw(f"o=$( ( {p.command()} ) 2>/dev/null; r=$?; echo x; exit $r ); r=$?")
        s.raw(f'printf "%s %s " {i} "$r"; printf "%s" "${{o%x}}" | base64 -w0; echo')
    return s.render()


def parse_batch(probes: list[Probe], out: str) -> dict[Probe, Any]:
    """The batch's output, probe by probe, through each probe's parser; a probe with no line is an error."""
    got: dict[int, tuple[int, str]] = {}
    for line in out.splitlines():
        index, rc, *data = line.split(" ", 2)
        got[int(index)] = int(rc), base64.b64decode("".join(data)).decode(errors="replace")
    missing = [p for i, p in enumerate(probes) if i not in got]
    if missing:
        raise RuntimeError(f"the host did not answer for {missing}: {out[-500:]!r}")
    return {p: p.parse(got[i][1], got[i][0]) for i, p in enumerate(probes)}


class Host:
    """A host asked like pytest-testinfra's: `file(path)`, `service(name)`, `sysctl(name)`, `kernel_cmdline`,
    `pci_device(addr)`, `boot_id`, `check_output(cmd)`.

    Args:
        run: runs one shell command on the host and returns an object with `.stdout` (TestHost.ssh,
            access.ssh Connection.run): called once per `read` and once per property of a live host.
        values: what a `read` got; a host with values answers from them only (see `read`).
    """

    def __init__(self, run: Callable[..., Any], values: Optional[dict[Probe, Any]] = None):
        self._run = run
        self.values = values

    def read(self, *probes: Probe, timeout: float = 300) -> "Host":
        """The probes' values in one round trip, as a Host that answers from them."""
        out = self._run(batch_script(list(probes)), timeout=timeout).stdout
        return Host(self._run, parse_batch(list(probes), out))

    def get(self, probe: Probe) -> Any:
        if self.values is not None:
            if probe not in self.values:
                raise KeyError(f"{probe} was not read (read: {list(self.values)})")
            return self.values[probe]
        return self.read(probe).get(probe)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Host) and self.values is not None and self.values == other.values

    def __repr__(self) -> str:
        return f"Host({self.values!r})" if self.values is not None else "Host(live)"

    def check_output(self, command: str) -> str:
        """A command's stdout, stripped (testinfra's check_output); `command` comes from access.shell."""
        return self.get(Output(command)).strip()

    def sysctl(self, name: str) -> Optional[Union[int, str]]:
        return self.get(Sysctl(name))

    @property
    def kernel_cmdline(self) -> tuple[str, ...]:
        return self.get(KernelCmdline())

    @property
    def boot_id(self) -> str:
        return self.get(BootId())

    @property
    def domains(self) -> tuple[str, ...]:
        return self.get(Domains())

    def hugepages(self, node: int, size_kb: int = 2048) -> Optional[Union[int, str]]:
        return self.get(Hugepages(node, size_kb))

    def file(self, path: str) -> "File":
        return File(self, path)

    def service(self, name: str) -> "Service":
        return Service(self, name)

    def pci_device(self, addr: str) -> "PciDevice":
        return PciDevice(self, addr)

    def domain(self, name: str) -> "Domain":
        return Domain(self, name)


@dataclass(frozen=True)
class File:
    host: Host
    path: str

    def _stat(self, key: str) -> Any:
        st = self.host.get(FileStat(self.path))
        return None if st is None else st[key]

    @property
    def exists(self) -> bool:
        return self.host.get(FileStat(self.path)) is not None

    @property
    def mode(self) -> Optional[int]:
        return self._stat("mode")

    @property
    def user(self) -> Optional[str]:
        return self._stat("user")

    @property
    def group(self) -> Optional[str]:
        return self._stat("group")

    @property
    def sha256(self) -> Optional[str]:
        return self._stat("sha256")

    @property
    def is_file(self) -> bool:
        return (self._stat("type") or "").startswith("regular")

    @property
    def content_string(self) -> str:
        """The file's text; FileNotFoundError when it could not be read (testinfra raises too)."""
        text = self.host.get(FileContent(self.path))
        if text is None:
            raise FileNotFoundError(f"{self.path} could not be read on the host")
        return text

    def lines_starting(self, prefix: str) -> list[str]:
        """The content's lines that start with `prefix` (a config key's assignments, say)."""
        return [ln for ln in self.content_string.splitlines() if ln.startswith(prefix)]


@dataclass(frozen=True)
class Service:
    host: Host
    name: str

    @property
    def is_running(self) -> bool:
        return self.host.get(ServiceState(self.name))[0] == "active"

    @property
    def is_enabled(self) -> bool:
        return self.host.get(ServiceState(self.name))[1] == "enabled"


@dataclass(frozen=True)
class PciDevice:
    host: Host
    addr: str

    @property
    def driver(self) -> Optional[str]:
        return self.host.get(PciDriver(self.addr))

    @property
    def sriov_numvfs(self) -> Optional[Union[int, str]]:
        return self.host.get(SriovNumvfs(self.addr))


@dataclass(frozen=True)
class Domain:
    host: Host
    name: str

    @property
    def state(self) -> Optional[str]:
        return self.host.get(DomainState(self.name))
