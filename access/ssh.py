"""SSH host access: strict host keys, keys from secret config, one pooled connection per host, counted round trips.

Usage::

    from access import keys
    from access.ssh import HostSpec, connect
    keys.set_private_key("sshPrivateKey", pem_text)       # done by providers' configure() from secret config
    spec = HostSpec(name="gpu-a", address="10.0.0.5", user="ops", host_key="ssh-ed25519 AAAA...")
    conn = connect(spec)
    out = conn.run(sh("cat", "/proc/cmdline")).stdout    # one exec = one round trip (ROUNDTRIPS)
    conn.put("/etc/modprobe.d/vfio.conf", b"options vfio-pci ids=10de:26b5\\n", mode="0644", owner="root:root")

Host keys are checked strictly: the pinned key (a known_hosts-style "type base64" line) or fingerprint
("SHA256:...") from stack config must match before any authentication or command happens. Accepting an unknown key
is possible only with `insecure_accept_unknown_host_key=True`, meant for throwaway dev hosts.
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import secrets
import select
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Optional

import paramiko
from pydantic import BaseModel, ConfigDict, Field, field_validator

from access import keys
from access.shell import quote, sh

log = logging.getLogger("gpuhost.ssh")
# paramiko's transport thread logs each failed attempt (a reset while sshd boots, "Error reading SSH protocol
# banner") with a traceback at ERROR; with no logging configured, Python's last-resort handler printed those on
# stderr of `./gpuhost.sh up` and the provider processes, although connect() reports the outcome itself
# (HostUnreachable after its attempts). A NullHandler keeps them off stderr; a configured root logger still gets them.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class SshError(RuntimeError):
    """Base of every access-layer error; messages name the host."""


class HostKeyMismatch(SshError):
    pass


class HostKeyUnknown(SshError):
    pass


class HostUnreachable(SshError):
    pass


class NothingRan(HostUnreachable):
    """No channel could be opened for a command within CHANNEL_OPEN_WAIT (reconnecting as needed): the command never
    started, so the host was not changed by it."""


class CommandFailed(SshError):
    """A command exited non-zero. The message holds the whole script (long ones shortened in the middle, where the
    inlined file contents are) and its stderr, so `update-initramfs` failing inside a bigger script is visible."""

    SCRIPT_CHARS = 4000
    STDERR_CHARS = 4000

    def __init__(self, host: str, command: str, result: "Result"):
        self.result = result
        self.command = command
        text = command.strip()
        if len(text) > self.SCRIPT_CHARS:
            half = self.SCRIPT_CHARS // 2
            text = f"{text[:half]}\n  … {len(text) - 2 * half} characters …\n{text[-half:]}"
        script = text if "\n" not in text else "\n" + "\n".join("  | " + ln for ln in text.splitlines())
        err = result.stderr.strip()
        if len(err) > self.STDERR_CHARS:
            err = "…" + err[-self.STDERR_CHARS :]
        out = result.stdout.strip()[-1000:] if not err else ""
        super().__init__(
            f"{host}: command failed with exit code {result.rc}: {script}\nstderr: {err or '(empty)'}"
            + (f"\nstdout: {out}" if out else "")
        )


class JumpHost(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    address: str
    port: int = Field(22, ge=1, le=65535)
    user: str = "root"
    host_key: Optional[str] = None
    insecure_accept_unknown_host_key: bool = False


class HostSpec(BaseModel):
    """How to reach one host. Holds no secret: the private key is looked up by `key_name` in `access.keys`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    address: str
    port: int = Field(22, ge=1, le=65535)
    user: str = "root"
    host_key: Optional[str] = None
    insecure_accept_unknown_host_key: bool = False
    jump: Optional[JumpHost] = None
    connect_timeout: float = Field(10.0, gt=0)
    command_timeout: float = Field(900.0, gt=0)
    key_name: str = "sshPrivateKey"

    @field_validator("host_key")
    @classmethod
    def _pin_form(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        v = v.strip()
        if v.startswith("SHA256:"):
            return v
        parts = v.split()
        if len(parts) < 2 or not parts[0].startswith(("ssh-", "ecdsa-", "sk-")):
            raise ValueError("host_key must be 'type base64' (as in known_hosts) or a 'SHA256:...' fingerprint")
        try:
            base64.b64decode(parts[1], validate=True)
        except Exception as e:
            raise ValueError(f"host_key's key data is not base64: {e}") from None
        return " ".join(parts[:2])


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str


class RoundTrips:
    """Counts SSH execs (round trips) per host and in total; benchmarks and tests assert on it."""

    def __init__(self) -> None:
        self.by_host: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, host: str) -> None:
        with self._lock:
            self.by_host[host] += 1
            # Providers run in the engine's provider process: benchmarks and tests read the count from a file.
            log = os.environ.get("GPUHOST_ROUNDTRIP_LOG")
            if log:
                with open(log, "a") as f:
                    f.write(host + "\n")

    @property
    def total(self) -> int:
        return sum(self.by_host.values())

    def reset(self) -> None:
        with self._lock:
            self.by_host.clear()


ROUNDTRIPS = RoundTrips()
# How long one command may wait for its session channel to open, across retries and reconnects. A freshly rebooted,
# busy host can take longer than the TCP connect timeout to answer a channel open; a channel that never opened ran
# nothing, so waiting (bounded) and retrying is safe.
CHANNEL_OPEN_WAIT = 120.0
# One argv string may not exceed MAX_ARG_STRLEN (128 KiB) on Linux; stay well below it (sudo adds its own words).
ARGV_LIMIT = 96 * 1024


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def fingerprint_of_line(line: str) -> str:
    if line.startswith("SHA256:"):
        return line
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


class _PinnedKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Checks the server key against the pin before authentication; raises with both fingerprints."""

    def __init__(self, host: str, pin: Optional[str], insecure: bool):
        self.host, self.pin, self.insecure = host, pin, insecure

    def missing_host_key(self, client, hostname, key):  # noqa: D401 - paramiko API
        got = fingerprint(key)
        if self.pin is None:
            if self.insecure:
                log.warning("%s: accepting unknown host key %s (insecure_accept_unknown_host_key)", self.host, got)
                return
            raise HostKeyUnknown(
                f"{self.host}: no host key pinned and strict checking is on; the host presented {got}. "
                f"Pin it in stack config (hosts[].host_key) after verifying it out of band."
            )
        want = fingerprint_of_line(self.pin)
        if got != want:
            raise HostKeyMismatch(
                f"{self.host}: host key mismatch: pinned {want}, host presented {got}. Refusing to connect; "
                f"nothing was run. If the host was reinstalled, verify and update the pin."
            )


def load_pkey(pem: str) -> paramiko.PKey:
    """A private key from its PEM or OpenSSH text: ed25519, ECDSA or RSA, unencrypted. SshError when none reads it
    (its message may quote the key material: show it to no one).

    Usage::

        key = load_pkey(config.get("sshPrivateKey"))   # key.get_name(), key.get_base64(): the public half
    """
    errors = []
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key(io.StringIO(pem))
        except Exception as e:  # try the next key type
            errors.append(f"{cls.__name__}: {e}")
    raise SshError("private key from config could not be loaded: " + "; ".join(errors))


class Conn:
    """One authenticated SSH connection to a host; commands run with sudo when the user is not root."""

    def __init__(self, spec: HostSpec, client: paramiko.SSHClient, jump: Optional[paramiko.SSHClient]):
        self.spec = spec
        self.client = client
        self.jump = jump
        self.lock = threading.Lock()  # the counters below
        self._dial = threading.Lock()  # one reconnect at a time
        self._inflight = 0  # commands running on this connection (several resources share one host's connection)
        self._retired = False  # dropped from the pool while commands ran: the last one to finish closes it

    @property
    def alive(self) -> bool:
        t = self.client.get_transport()
        return bool(t and t.is_active())

    def _transport(self) -> paramiko.Transport:
        """The live transport, reconnecting in place when this connection died (every user of it gets the new one)."""
        with self._dial:
            t = self.client.get_transport()
            if t is not None and t.is_active():
                return t
            fresh = _open(self.spec)
            old = (self.client, self.jump)
            self.client, self.jump = fresh.client, fresh.jump
            for c in old:
                if c is not None:
                    c.close()
            t = self.client.get_transport()
            assert t is not None  # _open connected it
            return t

    def _channel(self, wait: float) -> tuple[paramiko.Transport, paramiko.Channel]:
        """A session channel, retried for up to `wait` seconds: a slow channel open (a busy host just after its
        reboot), one sshd refused (MaxSessions) and a connection found dead (reconnected) are all waited for. When
        none opened, NothingRan says so: no command started."""
        deadline = time.monotonic() + wait
        delay, tries = 0.5, 0
        last: Optional[BaseException] = None
        while True:
            tries += 1
            left = deadline - time.monotonic()
            try:
                t = self._transport()
                return t, t.open_session(timeout=max(0.5, min(self.spec.connect_timeout, left)))
            except (HostKeyMismatch, HostKeyUnknown):
                raise
            except paramiko.AuthenticationException as e:
                if "timeout" not in str(e).lower():  # a reconnect whose key is rejected: an answer, not a delay
                    raise NothingRan(f"{self.spec.name}: reconnecting: {e}; nothing was run") from e
                last = e
            except (paramiko.SSHException, EOFError, OSError) as e:
                last = e
            if time.monotonic() + delay >= deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise NothingRan(
            f"{self.spec.name}: could not open an SSH channel in {wait:.0f} s ({tries} tries, last: "
            f"{last or 'timed out'}); nothing was run"
        )

    def _done(self) -> None:
        with self.lock:
            self._inflight -= 1
            close = self._retired and self._inflight == 0
        if close:
            self.close()

    def retire(self) -> None:
        """Close now when idle, else when the last running command finishes (never under a running command)."""
        with self.lock:
            self._retired = True
            close = self._inflight == 0
        if close:
            self.close()

    def _wrap(self, command: str) -> str:
        if self.spec.user == "root":
            return command
        return sh("sudo", "-n", "sh", "-c", command)

    def _wrap_file(self, path: str) -> str:
        return sh("sh", path) if self.spec.user == "root" else sh("sudo", "-n", "sh", path)

    def run(
        self, command: str, input: Optional[bytes | str] = None, check: bool = True, timeout: Optional[float] = None
    ) -> Result:
        """Run one command (a string built with access.shell) as root; one round trip.

        A NUL byte never reaches the shell (it would cut the command short). A command longer than ARGV_LIMIT
        (one argv string may not exceed 128 KiB on Linux: `Argument list too long`) is first sent over stdin into a
        private file in the login user's home, which the script deletes as it starts: one extra round trip, for
        scripts that inline large file contents only.
        """
        if "\x00" in command:
            raise ValueError(f"{self.spec.name}: a command may not contain a NUL byte")
        if len(command.encode()) > ARGV_LIMIT:
            name = f".gpuhost-{secrets.token_hex(8)}.sh"
            self._exec(
                sh("sh", "-c", 'umask 077 && cat > "$1"', "sh", name),
                'rm -f -- "$0"\n' + command,
                True,
                timeout,
                raw=True,
            )
            return self._exec(self._wrap_file(name), input, check, timeout, raw=True, shown=command)
        return self._exec(command, input, check, timeout)

    def _exec(
        self,
        command: str,
        input: Optional[bytes | str],
        check: bool,
        timeout: Optional[float],
        raw: bool = False,
        shown: Optional[str] = None,
    ) -> Result:
        ROUNDTRIPS.add(self.spec.name)
        limit = timeout or self.spec.command_timeout
        with self.lock:
            self._inflight += 1
        try:
            t, chan = self._channel(min(CHANNEL_OPEN_WAIT, limit))
            rc, out, err = self._finish(t, chan, command if raw else self._wrap(command), input, limit)
        finally:
            self._done()
        res = Result(rc, out.decode(errors="replace"), err.decode(errors="replace"))
        if check and rc != 0:
            raise CommandFailed(self.spec.name, shown or command, res)
        return res

    def _finish(
        self, t: paramiko.Transport, chan: paramiko.Channel, command: str, input: Optional[bytes | str], limit: float
    ) -> tuple[int, bytearray, bytearray]:
        """Run `command` on an open channel and collect its output. A failure here may come after the command
        started: the host's state is not known (HostUnreachable). Only a connection that is really dead is dropped
        from the pool, and it is closed only once no other command runs on it."""
        try:
            chan.settimeout(limit)
            chan.exec_command(command)
            if input is not None:
                chan.sendall(input.encode() if isinstance(input, str) else input)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + limit
            while True:
                select.select([chan], [], [], 1.0)
                while chan.recv_ready():
                    out += chan.recv(65536)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if not t.is_active():
                    raise HostUnreachable(f"{self.spec.name}: connection lost while running a command")
                if time.monotonic() > deadline:
                    raise socket.timeout()
            rc = chan.recv_exit_status()
        except (socket.timeout, TimeoutError) as e:
            raise HostUnreachable(f"{self.spec.name}: command timed out after {limit}s") from e
        except (paramiko.SSHException, EOFError, OSError) as e:
            self._forget_if_dead(t)
            raise HostUnreachable(f"{self.spec.name}: connection lost during a command: {e}") from e
        finally:
            chan.close()
        if rc == -1:
            self._forget_if_dead(t)
            raise HostUnreachable(f"{self.spec.name}: connection dropped before the command finished")
        return rc, out, err

    def _forget_if_dead(self, t: paramiko.Transport) -> None:
        if not t.is_active():
            with _POOL_LOCK:
                if _POOL.get(_pool_key(self.spec)) is self:
                    _POOL.pop(_pool_key(self.spec), None)

    def put(self, path: str, data: bytes | str, mode: Optional[str] = None, owner: Optional[str] = None) -> None:
        """Write a file atomically (temp file in the same directory, fsync, rename), keeping or setting mode/owner.

        An existing file's mode and owner are kept unless `mode`/`owner` are given; a new file gets 0644 root:root.
        """
        self.run(put_script(path, mode, owner), input=data)

    def get(self, path: str) -> bytes:
        res = self.run(sh("cat", "--", path))
        return res.stdout.encode()

    def close(self) -> None:
        self.client.close()
        if self.jump:
            self.jump.close()


def put_script(path: str, mode: Optional[str] = None, owner: Optional[str] = None) -> str:
    """The shell text `Conn.put` runs; stdin is the file's content. Usable inside a bigger script too."""
    p = quote(path)
    lines = [
        "set -e",
        f"tmp=$(mktemp {quote(path + '.gpuhost.XXXXXX')})",
        "trap 'rm -f \"$tmp\"' EXIT",
        'cat > "$tmp"',
        f'if [ -e {p} ]; then chmod --reference={p} "$tmp"; chown --reference={p} "$tmp"; '
        f'else chmod 0644 "$tmp"; chown 0:0 "$tmp"; fi',
    ]
    if mode is not None:
        lines.append(f'chmod {quote(mode)} "$tmp"')
    if owner is not None:
        lines.append(f'chown {quote(owner)} "$tmp"')
    lines += ['sync "$tmp"', f'mv -f "$tmp" {p}', "trap - EXIT", f"sync {quote(_dirname(path))} 2>/dev/null || true"]
    return "\n".join(lines) + "\n"


def _dirname(path: str) -> str:
    d = path.rsplit("/", 1)[0]
    return d or "/"


_POOL: dict[tuple, Conn] = {}
_POOL_LOCK = threading.Lock()


def _pool_key(spec: HostSpec) -> tuple:
    # Everything that decides whom we trust and who we are: a wrong pin or another key must never be answered by
    # a connection opened with the right ones.
    return (
        spec.address,
        spec.port,
        spec.user,
        spec.jump,
        spec.host_key,
        spec.insecure_accept_unknown_host_key,
        spec.key_name,
    )


def drop(spec: HostSpec) -> None:
    """Forget the host's pooled connection (the next connect() opens a new one); it is closed once no command runs
    on it, so a caller's drop never cuts another operation's command short."""
    with _POOL_LOCK:
        c = _POOL.pop(_pool_key(spec), None)
    if c:
        try:
            c.retire()
        except Exception:
            pass


def close_all() -> None:
    with _POOL_LOCK:
        conns = list(_POOL.values())
        _POOL.clear()
    for c in conns:
        try:
            c.close()
        except Exception:
            pass


def _client(host: str, pin: Optional[str], insecure: bool) -> paramiko.SSHClient:
    c = paramiko.SSHClient()
    # No system/user known_hosts: the pin in stack config is the only source of trust.
    c.set_missing_host_key_policy(_PinnedKeyPolicy(host, pin, insecure))
    return c


def _open(spec: HostSpec) -> Conn:
    pkey = load_pkey(keys.get_private_key(spec.key_name, spec.name))
    jump_client = None
    sock = None
    if spec.jump:
        j = spec.jump
        jump_client = _client(f"{spec.name} (jump {j.address})", j.host_key, j.insecure_accept_unknown_host_key)
        jump_client.connect(
            j.address,
            port=j.port,
            username=j.user,
            pkey=pkey,
            timeout=spec.connect_timeout,
            allow_agent=False,
            look_for_keys=False,
            banner_timeout=spec.connect_timeout,
        )
        jump_transport = jump_client.get_transport()
        assert jump_transport is not None  # connect() succeeded
        sock = jump_transport.open_channel("direct-tcpip", (spec.address, spec.port), ("127.0.0.1", 0))
    client = _client(spec.name, spec.host_key, spec.insecure_accept_unknown_host_key)
    client.connect(
        spec.address,
        port=spec.port,
        username=spec.user,
        pkey=pkey,
        sock=sock,
        timeout=spec.connect_timeout,
        banner_timeout=spec.connect_timeout,
        auth_timeout=spec.connect_timeout,
        allow_agent=False,
        look_for_keys=False,
    )
    transport = client.get_transport()
    assert transport is not None  # connect() succeeded
    transport.set_keepalive(15)
    return Conn(spec, client, jump_client)


def connect(spec: HostSpec, attempts: int = 4, backoff: float = 1.0) -> Conn:
    """A pooled, authenticated connection; retries with backoff on connect errors only (never on key problems)."""
    key = _pool_key(spec)
    with _POOL_LOCK:
        c = _POOL.get(key)
        if c and c.alive:
            return c
        if c:
            _POOL.pop(key, None)
    last: Exception | None = None
    for i in range(attempts):
        try:
            c = _open(spec)
            break
        except (HostKeyMismatch, HostKeyUnknown, SshError):
            raise
        except (OSError, paramiko.SSHException, EOFError) as e:
            # A rejected key is an answer, raised at once; "Authentication timeout." is sshd up but too slow to
            # answer (a host still booting after a reboot, or overloaded): a delay, retried like a refused connect.
            if isinstance(e, paramiko.AuthenticationException) and "timeout" not in str(e).lower():
                raise
            last = e
            if i + 1 < attempts:
                time.sleep(backoff * (2**i))
    else:
        raise HostUnreachable(
            f"{spec.name}: cannot connect to {spec.address}:{spec.port} after {attempts} attempts: {last}"
        )
    with _POOL_LOCK:
        _POOL[key] = c
    return c
