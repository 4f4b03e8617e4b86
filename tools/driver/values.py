"""Property values on the wire (as JSON): unknowns are the sentinel string, secrets the signature object."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.protobuf import json_format, struct_pb2

ROOT = Path(__file__).resolve().parents[2]
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # sdk/go/common/resource/plugin/rpc.go UnknownStringValue
SIG = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
PROVIDER_KEY = "__provider"
RESOURCE_SIG = "5cf8f73096256a8f31e491e813e4eb8e"
STACK_TYPE = "pulumi:pulumi:Stack"
STACK_REFERENCE = "pulumi:pulumi:StackReference"
DYNAMIC_PROVIDER = "pulumi:providers:pulumi-python"


# ---- property values (the wire form, as JSON: unknowns are the sentinel string, secrets the signature object) ----


def to_py(s: struct_pb2.Struct | None) -> dict:
    return json_format.MessageToDict(s) if s is not None else {}


def to_struct(d: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(d)
    return s


def is_secret(v: Any) -> bool:
    return isinstance(v, dict) and v.get(SIG) == SECRET_SIG


def plain(v: Any) -> Any:
    """Secrets unwrapped: the dynamic provider answers Configure with acceptSecrets=False, so the engine strips them
    before every provider call (provider_plugin.go: MarshalOptions{KeepSecrets: protocol.acceptSecrets}). It does
    not accept resources either, so a resource reference goes as its id (unknown while a preview has none), a
    component's as its URN (sdk/go/common/resource/plugin/rpc.go MarshalPropertyValue, KeepResources false)."""
    if is_secret(v):
        return plain(v.get("value"))
    if isinstance(v, dict) and v.get(SIG) == RESOURCE_SIG:
        return (v["id"] or UNKNOWN) if "id" in v else v.get("urn", "")
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def _anywhere(v: Any, found: Callable[[Any], bool]) -> bool:
    """Whether `found` holds for v or for any value nested in its objects and arrays."""
    if found(v):
        return True
    if isinstance(v, dict):
        return any(_anywhere(x, found) for x in v.values())
    if isinstance(v, list):
        return any(_anywhere(x, found) for x in v)
    return False


def has_secret(v: Any) -> bool:
    return _anywhere(v, is_secret)


def annotate_secrets(outs: dict, ins: dict) -> dict:
    """The provider was given plain values (it does not accept secrets), so what comes back under the name of a
    secret input is marked secret again (pkg/resource/plugin/provider_plugin.go annotateSecrets, after Check,
    Create, Read and Update)."""
    for k, i in ins.items():
        if k not in outs:
            continue
        o = outs[k]
        if isinstance(o, dict) and isinstance(i, dict) and not is_secret(o) and not is_secret(i):
            annotate_secrets(o, i)
        elif not is_secret(o) and has_secret(i):
            outs[k] = {SIG: SECRET_SIG, "value": o}
    return outs


def mark_secret(outputs: dict, keys: list[str]) -> None:
    """additionalSecretOutputs: those outputs are made secret once the step is done (step_executor.go; `id` cannot
    be, pulumi/pulumi#2717)."""
    for k in keys:
        if k != "id" and k in outputs and not is_secret(outputs[k]):
            outputs[k] = {SIG: SECRET_SIG, "value": outputs[k]}


def seal_secrets(v: Any, encrypt: Callable[[str], str]) -> Any:
    """State form of a value: a secret's value encrypted, as the engine's checkpoint keeps it (`ciphertext`)."""
    if is_secret(v):
        return {SIG: SECRET_SIG, "ciphertext": encrypt(json.dumps(v.get("value")))}
    if isinstance(v, dict):
        return {k: seal_secrets(x, encrypt) for k, x in v.items()}
    if isinstance(v, list):
        return [seal_secrets(x, encrypt) for x in v]
    return v


def unseal_secrets(v: Any, decrypt: Callable[[str], str]) -> Any:
    if isinstance(v, dict) and v.get(SIG) == SECRET_SIG and "ciphertext" in v:
        return {SIG: SECRET_SIG, "value": json.loads(decrypt(v["ciphertext"]))}
    if isinstance(v, dict):
        return {k: unseal_secrets(x, decrypt) for k, x in v.items()}
    if isinstance(v, list):
        return [unseal_secrets(x, decrypt) for x in v]
    return v


def has_unknown(v: Any) -> bool:
    return _anywhere(v, lambda x: x == UNKNOWN)


def norm(v: Any) -> Any:
    """Struct numbers are doubles: 64.0 and 64 are one value (comparison and display)."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {k: norm(x) for k, x in v.items()}
    if isinstance(v, list):
        return [norm(x) for x in v]
    return v


def differs(a: Any, b: Any) -> bool:
    """Values compared as the engine's diff does: secrets unwrapped, 64.0 == 64 (step_generator.go
    unwrapResourceSecretsAndOutputs)."""
    return norm(plain(a)) != norm(plain(b))


def user_props(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != PROVIDER_KEY}
