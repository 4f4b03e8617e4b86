"""Private keys held for this process only, filled from Pulumi secret config; never in state or outputs.

Dynamic providers receive the stack's config in `configure()` (the engine sends it over gRPC) and call
`set_private_key(name, pem)`; the program checks the key exists with `config.require_secret`. Keeping keys here,
outside the pickled provider object, means `dill` never serialises a key into the state file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_KEYS: dict[str, str] = {}
_SOURCE: list[Callable[[str], object]] = []
_LOCK = threading.Lock()


class MissingKey(RuntimeError):
    pass


def set_private_key(name: str, pem: str) -> None:
    with _LOCK:
        _KEYS[name] = pem


def set_source(lookup: Callable[[str], object]) -> None:
    """Where keys not set by name come from: the configure request's `Config.get` (`gpuhost:<name>`)."""
    with _LOCK:
        _SOURCE[:] = [lookup]


def get_private_key(name: str, host: str = "") -> str:
    with _LOCK:
        pem = _KEYS.get(name)
        source = list(_SOURCE)
    if pem is None and source:
        value = source[0](name)
        if isinstance(value, str) and value.strip():
            pem = value
    if pem is None:
        where = f" for {host}" if host else ""
        raise MissingKey(
            f'no SSH private key{where}: set it with `pulumi config set --secret gpuhost:{name} "$(cat key)"`. '
            "If it is set, the Pulumi CLI is older than 3.139.0, which does not send stack config to dynamic "
            "providers (Pulumi.yaml requires >=3.139.0)"
        )
    return pem


def clear() -> None:
    with _LOCK:
        _KEYS.clear()
        _SOURCE.clear()
