"""Docker over SSH with gpuhost's own trust: the pinned host key, the key from secret config, the jump host.

pulumi-docker reaches `ssh://` hosts through the OpenSSH client (docker's connhelper runs
`ssh <ssh_opts> -l user -p port -- host docker system dial-stdio`). Left alone, that client trusts the runner's
~/.ssh (known_hosts, keys, agent, config). Here it trusts nothing of the runner: `-F /dev/null` drops every
ssh_config, the only known_hosts file is one generated from the stack's pins, the only identity is the stack's
secret key (written 0600 for this stack and machine), no agent, batch mode, and a jump host goes through an explicit
ProxyCommand with the same options (command-line options do not reach a ProxyJump hop). A wrong pin fails the key
exchange, before authentication.

Pins must be full `type base64` lines: a `SHA256:` fingerprint cannot be written into known_hosts (the stack loader
says so for every machine Docker reaches).

Usage (in a component)::

    engine = docker.Provider(f"{name}-docker", **provider_args(spec), opts=child)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from access.ssh import HostSpec, JumpHost
from plans.values import url_host

DEFAULT_ROOT = Path(os.environ.get("GPUHOST_SSH_DIR", Path.home() / ".cache" / "gpuhost" / "ssh"))


class PinError(ValueError):
    pass


def _host_pattern(address: str, port: int) -> str:
    return address if port == 22 else f"[{address.strip('[]')}]:{port}"


def known_hosts_line(address: str, port: int, pin: Optional[str]) -> Optional[str]:
    """The known_hosts line for a pin (None without a pin). A fingerprint pin cannot be written: PinError."""
    if pin is None:
        return None
    if pin.startswith("SHA256:"):
        raise PinError(
            f"{address}:{port}: Docker over SSH needs the host key itself ('ssh-ed25519 AAAA...'), not its "
            "SHA256 fingerprint, to write known_hosts"
        )
    kind, data = pin.split()[:2]
    return f"{_host_pattern(address, port)} {kind} {data}"


def _common(key_path: Path, known_hosts: Path, strict: bool, connect_timeout: float) -> list[str]:
    return [
        "-F", "/dev/null",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"StrictHostKeyChecking={'yes' if strict else 'accept-new'}",
        "-o", "IdentitiesOnly=yes",
        "-o", "IdentityAgent=none",
        "-o", f"IdentityFile={key_path}",
        "-o", "BatchMode=yes",
        "-o", "PasswordAuthentication=no",
        "-o", "KbdInteractiveAuthentication=no",
        "-o", f"ConnectTimeout={max(1, int(connect_timeout))}",
    ]  # fmt: skip


def ssh_options(spec: HostSpec, key_path: Path, known_hosts: Path) -> list[str]:
    """The ssh flags for pulumi-docker's `ssh_opts` (paths must not contain spaces: gpuhost chooses them)."""
    opts = _common(key_path, known_hosts, not spec.insecure_accept_unknown_host_key, spec.connect_timeout)
    j: Optional[JumpHost] = spec.jump
    if j is not None:
        inner = ["ssh", *_common(key_path, known_hosts, not j.insecure_accept_unknown_host_key, spec.connect_timeout)]
        inner += ["-p", str(j.port), "-l", j.user, "-W", "%h:%p", j.address]
        opts += ["-o", "ProxyCommand=" + " ".join(inner)]
    return opts


def docker_host(spec: HostSpec) -> str:
    return f"ssh://{spec.user}@{url_host(spec.address)}:{spec.port}"


def known_hosts_text(spec: HostSpec) -> str:
    lines = [known_hosts_line(spec.address, spec.port, spec.host_key)]
    if spec.jump is not None:
        lines.append(known_hosts_line(spec.jump.address, spec.jump.port, spec.jump.host_key))
    return "".join(f"{ln}\n" for ln in lines if ln)


def materialise(spec: HostSpec, private_key_pem: str, root: Path = DEFAULT_ROOT, scope: str = "") -> list[str]:
    """Write this machine's identity (0600) and known_hosts under root/scope/name; return the ssh options."""
    d = root / (scope or "default") / spec.name
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(d, 0o700)
    key_path, kh = d / "id", d / "known_hosts"
    _write(key_path, private_key_pem if private_key_pem.endswith("\n") else private_key_pem + "\n", 0o600)
    _write(kh, known_hosts_text(spec), 0o600)
    return ssh_options(spec, key_path, kh)


def _write(path: Path, text: str, mode: int) -> None:
    try:  # already there as wanted (every Docker engine of a host writes the same two files): nothing to write
        st = path.stat()
        if st.st_mode & 0o777 == mode and st.st_uid == os.geteuid() and path.read_text() == text:
            return
    except OSError:
        pass
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # concurrent runs (tests, stacks) write the same path
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def provider_args(spec: HostSpec) -> dict[str, Any]:
    """`host` and `ssh_opts` for a pulumi_docker.Provider reaching `spec` with gpuhost's pins and key."""
    import pulumi

    known_hosts_text(spec)  # a fingerprint pin fails here, at declaration, not inside docker
    key = pulumi.Config("gpuhost").require_secret(spec.key_name)
    scope = f"{pulumi.get_project()}-{pulumi.get_stack()}"
    # Paths only, but derived from the secret: unsecret so preview shows them.
    opts = pulumi.Output.unsecret(key.apply(lambda pem: materialise(spec, pem, DEFAULT_ROOT, scope)))
    return {"host": docker_host(spec), "ssh_opts": opts}
