"""Load and check the stack's config: `gpuhost:fleet` (structured) and `gpuhost:sshPrivateKey` (a Pulumi secret).

Every problem is reported at once, one line per bad field (`stacks.schema`) or inconsistency (`stacks.checks`,
and `stacks.paths` on the program's own list of components), before any SSH connection or resource registration:
the components are listed once (`stacks.program.plan`), checked, and only then declared.

Usage (in __main__.py)::

    program = load(pulumi.Config("gpuhost"))   # raises ConfigError listing every bad field; nothing registered
    outputs = program.declare()                # the components, registered in order
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import stat
from typing import Any, Optional

import pulumi
from pulumi.runtime.config import is_config_secret
from pydantic import ValidationError

from access.ssh import SshError, load_pkey
from stacks.checks import fleet_problems, placement_problems
from stacks.errors import ConfigError, FieldProblems
from stacks.paths import collisions
from stacks.program import Program, plan
from stacks.rawconfig import fleet_json, path_of, scrubbed, value_problems, visible
from stacks.schema import Fleet, find_private_keys


def _loc(loc: tuple) -> str:
    out = ""
    for p in loc:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p) if p != "[key]" else ""
    return out


def _bound(e: dict) -> str:
    ctx = e.get("ctx") or {}
    word = {"gt": "above", "ge": "at least", "lt": "below", "le": "at most"}
    want = " and ".join(f"{word[k]} {ctx[k]}" for k in ("gt", "ge", "lt", "le") if k in ctx)
    return f"{e['input']!r} is out of range (use a value {want})"


def _typed(what: str, example: str):
    def msg(e: dict) -> str:
        x = e["input"]
        shown = str(x).lower() if isinstance(x, bool) else repr(x)
        return f"{shown} is not {what} (write {example}, unquoted: true/false and quoted numbers are refused)"

    return msg


# pydantic's own words per error type, as one line that says what to write instead.
_TYPE_MSG = {
    "int_type": _typed("a whole number", "e.g. 8"),
    "int_from_float": _typed("a whole number", "e.g. 8"),
    "int_parsing": _typed("a whole number", "e.g. 8"),
    "float_type": _typed("a number", "e.g. 2.5"),
    "float_parsing": _typed("a number", "e.g. 2.5"),
    "bool_type": lambda e: f"{e['input']!r} is not true or false (write true or false)",
    "string_type": lambda e: f"{e['input']!r} is not a string (quote it)",
    "finite_number": lambda e: f"{e['input']!r} is not a finite number (inf and NaN are refused: write a number)",
    "greater_than": _bound,
    "greater_than_equal": _bound,
    "less_than": _bound,
    "less_than_equal": _bound,
    "too_long": lambda e: f"{len(e['input'])} items, at most {(e.get('ctx') or {}).get('max_length')} (remove some)",
}


def errors_of(err: ValidationError, prefix: str = "fleet", skip: tuple[tuple, ...] = ()) -> list[str]:
    """One line per error; none for a field under a location in `skip` (reported already, by `value_problems`).
    A validator's own ValueError is its message as raised; `FieldProblems` is a line per problem."""
    lines = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if p not in ("function-after", "function-before"))
        if any(loc[: len(s)] == s for s in skip):
            continue
        where = _loc(loc)
        raised = (e.get("ctx") or {}).get("error") if e["type"] == "value_error" else None
        if e["type"] in ("less_than_equal", "greater_than_equal") and str(e["loc"][-1]).endswith("port"):
            found = [f"{e['input']!r} is not a TCP port (use 1-65535)"]
        elif isinstance(raised, FieldProblems):
            found = raised.lines
        elif raised is not None:
            found = [str(raised)]
        else:
            typed = _TYPE_MSG.get(e["type"])
            found = [typed(e) if typed else e["msg"]]
        base = f"{prefix}.{where}" if where else prefix
        lines += [f"{base}: {msg}" for msg in found]
    return lines


def parse_fleet(raw: Any) -> Fleet:
    """Check every field, then the fields against each other (also when some fields are bad: the good ones are
    still cross-checked), and raise one ConfigError with a line per problem."""
    if raw is None:
        raise ConfigError(["gpuhost:fleet: missing (see Pulumi.dev.yaml for the shape)"])
    chars, refused = value_problems(raw)  # too deep or too big raises here, before anything walks it again
    lines = [
        f"{where}: looks like a private key in plain config; keys belong in "
        "`pulumi config set --secret gpuhost:sshPrivateKey`"
        for _, where in find_private_keys(raw)
    ] + chars
    raw, quiet = scrubbed(raw, refused)
    dropped: list[str] = [path_of(loc) for loc in quiet]
    try:
        fleet: Optional[Fleet] = Fleet.model_validate(raw)
    except ValidationError as e:
        lines += errors_of(e, skip=quiet)
        fleet, more = _good_part(raw, e)
        dropped += more
    if fleet is not None:
        # a finding under a path whose bad value was dropped (and reported above) would be noise
        lines += [p for p in fleet_problems(fleet, frozenset(dropped)) if not _under(p.path, dropped)]
        if not lines:
            lines += placement_problems(fleet)
        if not lines:
            lines += _artifact_problems(fleet)
    if lines:
        # a value quoted by a message is shown with its control characters escaped, never raw
        raise ConfigError(list(dict.fromkeys(visible(ln) for ln in lines)))
    assert fleet is not None
    return fleet


def _under(path: str, dropped: list[str]) -> bool:
    """Whether config path `path` is one of `dropped` or inside one (`fleet.hosts[0].vms` holds `...vms[1].gpus`)."""
    return any(path == d or path.startswith((d + ".", d + "[")) for d in dropped)


def _file_sha256(path: str) -> tuple[str, str]:
    """(problem, sha256) of a local artifact: a regular file, hashed in 1 MiB chunks (an engine or a diffusion
    model is gigabytes: never read whole). A FIFO would block the loader and a device never ends: refused by type
    before a byte is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return f"cannot read {path} here ({e.strerror}); give a file on this machine", ""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return f"{path} is not a regular file; give the artifact file itself", ""
    with os.fdopen(fd, "rb", buffering=0) as f:
        h = hashlib.sha256()
        try:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        except OSError as e:
            return f"cannot read {path} here ({e.strerror}); give a file on this machine", ""
    return "", h.hexdigest()


def _artifact_problems(fleet: Fleet) -> list[str]:
    """Artifacts given by ``path`` (a file on this machine) checked before any resource: the sha256 the config
    pins, and for a yolov8n_torch model the weights' layout (``serving/models/yolov8n_weights.py``: which key or
    node, expected vs found shape). A ``url`` artifact is checked where it lands: its sha256 by ModelArtifact
    before it is moved in, its layout by the Triton backend at load, with the same message."""
    out = []
    for i, s in enumerate(fleet.services):
        for k, m in enumerate(s.models):
            a = m.artifact
            if a is None or a.path is None:
                continue
            at = f"fleet.services[{i}].models[{k}].artifact"
            problem, got = _file_sha256(a.path)
            if problem:
                out.append(f"{at}.path: {problem}")
                continue
            if got != a.sha256:
                out.append(f"{at}.sha256: {a.path} has sha256 {got}, config says {a.sha256} (pin the file's sha256)")
                continue
            if m.preset == "yolov8n_torch":
                # imported only here: it imports torch, which a stack without a yolov8n_torch path never needs
                from serving.models.yolov8n_weights import WeightsError, load_model, read_artifact

                try:
                    load_model(read_artifact(a.path), trusted=True, what=a.path)
                except WeightsError as e:
                    out.append(f"{at}.path: not YOLOv8n weights: {e}")
    return out


def _good_part(raw: Any, err: ValidationError, rounds: int = 4) -> tuple[Optional[Fleet], list[str]]:
    """The fleet without its bad fields (each dropped back to its default), for the cross-field checks; and the
    config paths dropped, whose cross-field findings would be noise. None when a required field is bad."""
    doc = copy.deepcopy(raw)
    dropped: list[str] = []
    for _ in range(rounds):
        for e in err.errors():
            loc = tuple(p for p in e["loc"] if p not in ("function-after", "function-before"))
            if not loc:
                return None, dropped
            parent = doc
            try:
                for p in loc[:-1]:
                    parent = parent[p]
                if isinstance(parent, list):
                    # Dropping a list item would shift its siblings' paths: drop the whole list instead.
                    holder = doc
                    for p in loc[:-2]:
                        holder = holder[p]
                    del holder[loc[-2]]
                    dropped.append("fleet." + _loc(loc[:-1]))
                else:
                    del parent[loc[-1]]
                    dropped.append("fleet." + _loc(loc))
            except (KeyError, IndexError, TypeError):
                return None, dropped
        try:
            return Fleet.model_validate(doc), dropped
        except ValidationError as e2:
            err = e2
    return None, dropped


def load(config: pulumi.Config) -> Program:
    """The stack's components, checked and not yet declared (`Program.declare` registers them). ConfigError: every
    bad field and inconsistency of the config, one line each (the program's own findings only when the fields are
    all good, as they need a whole fleet)."""
    lines: list[str] = []
    fleet, program = None, None
    try:
        fleet = parse_fleet(fleet_json(config.get("fleet")))
    except ConfigError as e:
        lines += e.lines
    guest_keys: tuple[str, ...] = ()
    key_lines: list[str] = []
    try:
        guest_keys = (guest_public_key(config),)
    except ConfigError as e:
        key_lines = e.lines
    if fleet is not None:
        program, found = _checked_program(fleet, guest_keys)
        lines += found
    key_names = {"sshPrivateKey"} | ({h.ssh.key_name for h in fleet.hosts} if fleet else set())
    for name in sorted(key_names):
        full = f"gpuhost:{name}"
        if config.get(name) is None:
            lines.append(f"{full}: missing; set it with `pulumi config set --secret {name} < key`")
        elif not is_config_secret(full):
            lines.append(
                f"{full}: stored in plaintext; re-set it with `pulumi config set --secret {name} < key` "
                "so it is encrypted in the stack file and never shown"
            )
    if fleet is not None:
        lines += gateway_secret_problems(config, fleet)
    if not lines:
        lines += key_lines
    if lines:
        raise ConfigError(lines)
    assert program is not None  # a fleet with no problem has its program
    return program


def _checked_program(fleet: Fleet, guest_keys: tuple[str, ...]) -> tuple[Optional[Program], list[str]]:
    """(the program, its problems): what only listing the components finds (a VF shortage, a VM that cannot fit:
    `plan`'s refusals) and resources that would write one path (`stacks.paths`)."""
    try:
        program = plan(fleet, guest_keys)
    except ConfigError as e:
        return None, [visible(ln) for ln in e.lines]
    return program, list(dict.fromkeys(visible(ln) for ln in collisions(program.components, fleet)))


REDIS_PASSWORD_RE = re.compile(r"[A-Za-z0-9._~+/=-]{16,256}")


def gateway_secret_problems(config: pulumi.Config, fleet: Fleet) -> list[str]:
    """Each gateway's Redis password: set, stored as a secret, and a value Redis's config line takes as it is (the
    value is never quoted in a message)."""
    out = []
    for i, g in enumerate(fleet.gateways):
        name = g.redis_password_secret
        if name is None:
            continue
        full, fix = f"gpuhost:{name}", f"`pulumi config set --secret {name} <password>`"
        value = config.get(name)
        if value is None:
            out.append(f"{full}: missing (fleet.gateways[{i}].redis_password_secret names it); set it with {fix}")
        elif not is_config_secret(full):
            out.append(f"{full}: stored in plaintext; re-set it with {fix} so it is encrypted and never shown")
        elif not REDIS_PASSWORD_RE.fullmatch(value):
            out.append(f"{full}: Redis's password must be 16-256 letters, digits or ._~+/=- ; re-set it with {fix}")
    return out


def guest_public_key(config: pulumi.Config) -> str:
    """The public half of `gpuhost:sshPrivateKey`, as an authorized_keys line ("ssh-ed25519 AAAA... gpuhost").

    gpuhost reaches every guest with that key (through the host as jump), so cloud-init authorizes this line for
    the guest user. Only the public line leaves this function; the private key stays in the secret config value.
    """
    pem = config.get("sshPrivateKey")
    if pem is None:
        raise ConfigError(
            ["gpuhost:sshPrivateKey: missing; set it with `pulumi config set --secret sshPrivateKey < key`"]
        )
    try:
        key = load_pkey(pem)
    except SshError:
        # paramiko's message may quote the key material; say what is wrong without it
        raise ConfigError(
            ["gpuhost:sshPrivateKey: not an unencrypted ed25519, ECDSA or RSA private key (PEM or OpenSSH format)"]
        ) from None
    return f"{key.get_name()} {key.get_base64()} gpuhost"
