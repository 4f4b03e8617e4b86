"""What every gpuhost dynamic provider shares: keys from secret config, a pooled connection, input diffs.

A provider subclass is small and picklable (Pulumi stores it with dill in the state): it holds no connection, no
key and no cache. It opens (or reuses, per process) the SSH connection from the `host` input on each call.

Usage::

    class KernelCmdlineProvider(HostProvider):
        VERSION = "1"
        REPLACE_ON = ()                          # inputs whose change needs delete+create (none here)
        def create(self, props): conn = self.conn(props); ...

    class KernelCmdline(dynamic.Resource, module="host", name="KernelCmdline"):
        def __init__(self, name, args, opts=None):
            super().__init__(KernelCmdlineProvider(), name, {**args, "version": KernelCmdlineProvider.VERSION},
                             opts)
"""

from __future__ import annotations

from typing import Any, Iterable

from pulumi.dynamic import CheckFailure, CheckResult, ConfigureRequest, DiffResult, ResourceProvider
from pydantic import ValidationError

from access import keys
from access.ssh import Conn, HostSpec, connect

# Inputs that are bookkeeping, never a reason to touch the host.
_IGNORED = {"__provider", "version"}


def host_input(spec: HostSpec) -> dict:
    """The `host` input of every host resource: how to reach it (no secret)."""
    return spec.model_dump(mode="json")


def validation_failures(err: ValidationError, prefix: str = "") -> list[CheckFailure]:
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        out.append(CheckFailure(f"{prefix}{loc}" if loc else prefix.rstrip("."), e["msg"]))
    return out


class HostProvider(ResourceProvider):
    VERSION = "0"
    # Inputs whose change means delete-then-create instead of update (documented per provider).
    REPLACE_ON: tuple[str, ...] = ("host",)
    DELETE_BEFORE_REPLACE = True
    # Properties the provider fills in (declared as None inputs so Pulumi exposes them); never diffed.
    OUTPUT_ONLY: tuple[str, ...] = ()

    def configure(self, req: ConfigureRequest) -> None:
        # Private keys come from the stack's secret config, which the engine sends to the provider process.
        for k, v in getattr(req.config, "_props", {}).items():
            name = k.split(":", 1)[-1]
            if name.endswith("PrivateKey") and isinstance(v, str) and v.strip():
                keys.set_private_key(name, v)

    # -- helpers for subclasses -------------------------------------------------------------------------------
    @staticmethod
    def spec(props: dict) -> HostSpec:
        return HostSpec.model_validate(props["host"])

    def conn(self, props: dict) -> Conn:
        return connect(self.spec(props))

    def check_host(self, news: dict) -> list[CheckFailure]:
        if "host" not in news:
            return [CheckFailure("host", "missing: how to reach the host")]
        try:
            HostSpec.model_validate(news["host"])
        except ValidationError as e:
            return validation_failures(e, "host.")
        return []

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return CheckResult(news, self.check_host(news))

    def changed_keys(self, olds: dict, news: dict, keys_: Iterable[str] | None = None) -> list[str]:
        names = set(keys_) if keys_ is not None else (set(olds) | set(news)) - _IGNORED
        return sorted(k for k in names if k not in _IGNORED and olds.get(k) != news.get(k))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Outputs carry every input back (see `outputs`), so comparing them with the new inputs shows what the
        # stack wants changed; version bumps alone re-run nothing.
        changed = self.changed_keys(olds, news, [k for k in news if k not in _IGNORED and k not in self.OUTPUT_ONLY])
        replaces = [k for k in changed if k in self.REPLACE_ON]
        return DiffResult(
            changes=bool(changed),
            replaces=replaces,
            delete_before_replace=self.DELETE_BEFORE_REPLACE if replaces else None,
        )

    @staticmethod
    def outputs(props: dict, **extra: Any) -> dict:
        out = {k: v for k, v in props.items() if k != "__provider"}
        out.update(extra)
        return out
