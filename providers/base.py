"""What every gpuhost dynamic provider shares: keys from secret config, a pooled connection, unknown-safe check/diff.

A provider subclass is small and picklable (Pulumi stores it with dill in the state): it holds no connection, no
key and no cache. It opens (or reuses, per process) the SSH connection from the `host` input on each call.

Subclasses implement `check_known` and (optionally) `diff_known`; the base's `check` and `diff` wrap them so that a
value not known during preview (an input computed from another resource's output) is never validated and always
counts as "will change": the SDK passes such values as the string `UNKNOWN`, at any depth.

Replace reasons are inputs named in REPLACE_ON; for `host` only the host's identity (its fleet name) counts: a new
port, user, jump host, timeout or a rotated host key is an update, never a delete-before-replace of everything on
the host.

Usage::

    class KernelCmdlineProvider(HostProvider):
        VERSION = "1"
        REPLACE_ON = ("host",)                   # inputs whose change needs delete+create
        def check_known(self, olds, news): ...   # validation with every value known
        def create(self, props): conn = self.conn(props); ...

    class KernelCmdline(dynamic.Resource, module="host", name="KernelCmdline"):
        def __init__(self, name, args, opts=None):
            super().__init__(KernelCmdlineProvider(), name, {**args, **bookkeeping(KernelCmdlineProvider, name)},
                             opts)
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import pulumi
from pulumi import dynamic
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    ConfigureRequest,
    CreateResult,
    DiffResult,
    ReadResult,
    ResourceProvider,
    UpdateResult,
)
from pulumi.runtime.rpc import UNKNOWN
from pydantic import BaseModel, ValidationError

import pristine
from access import keys
from access.errors import HostError
from access.ssh import CommandFailed, Conn, HostSpec, HostUnreachable, NothingRan, connect
from plans.plan import Plan
from pristine import Change, Record
from providers import progress
from providers.effects import Effect, Path

# Inputs that are bookkeeping, never a reason to touch the host.
_IGNORED = {"__provider", "version", "owner_tag"}
# Hints for the first change, never diffed, never validated, never stored in the outputs (unknown in preview,
# absent when a resource is used on its own): what HostPreflight reads for the prep steps (`reads`), what its own
# check read (`checked`), and a step's read as HostPreflight made it (`host_read`, see HostProvider.converge).
HINTS = ("host_read", "checked", "reads")


def is_unknown(value: Any) -> bool:
    """A value the engine does not know yet (preview): the SDK's UNKNOWN string, or an `Unknown` in-process."""
    from pulumi.output import Unknown

    return isinstance(value, Unknown) or (isinstance(value, str) and value == UNKNOWN)


def unknown_paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths (tuples of keys and list positions) of every unknown inside `value`, at any depth."""
    if is_unknown(value):
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in unknown_paths(v, (*path, k))]
    if isinstance(value, list | tuple):
        return [p for i, v in enumerate(value) for p in unknown_paths(v, (*path, i))]
    return []


def is_safe_abs_path(path: Any) -> bool:
    """An absolute path without '..' (what gpuhost writes or removes on a host)."""
    return isinstance(path, str) and path.startswith("/") and ".." not in path.split("/")


def host_identity(host: Any) -> Any:
    """What makes a `host` input the same machine: its fleet name. Connection details are not part of it."""
    return host.get("name") if isinstance(host, dict) else host


def host_input(spec: HostSpec) -> dict:
    """The `host` input of every host resource: how to reach it (no secret)."""
    return spec.model_dump(mode="json")


def validation_failures(err: ValidationError, prefix: str = "") -> list[CheckFailure]:
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        out.append(CheckFailure(f"{prefix}{loc}" if loc else prefix.rstrip("."), e["msg"]))
    return out


class Provider(ResourceProvider):
    """Unknown-safe check and diff for every gpuhost dynamic provider (host-bound or not)."""

    VERSION = "0"
    # Inputs whose change means delete-then-create instead of update (documented per provider).
    REPLACE_ON: tuple[str, ...] = ()
    DELETE_BEFORE_REPLACE = True
    # Properties the provider fills in (declared as None inputs so Pulumi exposes them); never diffed.
    OUTPUT_ONLY: tuple[str, ...] = ()
    # Input paths that only carry a hash of other inputs (providers.effects): counted, not listed, in a PR's diff.
    DERIVED: tuple[Path, ...] = ()

    @classmethod
    def writes(cls, inputs: dict) -> list:
        """The host paths a resource with these inputs writes, for the one-owner check at load
        (`components.wiring.writes`); a value not known yet (an Output) is skipped there. Default: none."""
        return []

    def effects(self, olds: dict | None, news: dict) -> list[Effect]:
        """What applying olds → news (olds None: a create) does to what runs, for a PR's plan diff
        (providers.effects); asked only when the provider's diff has changes. Default: nothing that runs."""
        return []

    # -- check ------------------------------------------------------------------------------------------------
    def check_known(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return CheckResult(news, [])

    def check_unknown(self, olds: dict[str, Any], news: dict[str, Any]) -> list[CheckFailure]:
        """Validation that holds with some inputs unknown: per-input rules on known inputs only (default: none)."""
        return []

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        unknown = {p[0] for p in unknown_paths(news) if p and p[0] not in HINTS}
        if not unknown:
            return self.check_known(olds, news)
        # Preview with values from other resources not known yet: `up` checks again with the real values before
        # it changes this resource. Until then only what check_unknown validates on its own (the host's spec) is
        # checked: a cross-field rule would judge the placeholder. The unknowns go back untouched.
        failures = self.check_unknown(olds, news)
        known_keys = set(news) - unknown
        seen: set[tuple[str, str]] = set()
        kept = []
        for f in failures:
            if str(f.property).split(".")[0] in known_keys and (f.property, f.reason) not in seen:
                seen.add((f.property, f.reason))
                kept.append(f)
        return CheckResult(news, kept)

    # -- diff -------------------------------------------------------------------------------------------------
    def diffed_keys(self, news: dict) -> list[str]:
        return [k for k in news if k not in _IGNORED and k not in HINTS and k not in self.OUTPUT_ONLY]

    def changed_keys(self, olds: dict, news: dict, keys_: Iterable[str] | None = None) -> list[str]:
        names = set(keys_) if keys_ is not None else (set(olds) | set(news)) - _IGNORED - set(HINTS)
        return sorted(k for k in names if k not in _IGNORED and olds.get(k) != news.get(k))

    def replaces(self, olds: dict, news: dict, changed: Iterable[str]) -> list[str]:
        return sorted(k for k in changed if k in self.REPLACE_ON)

    def diff_result(self, olds: dict, news: dict, changed: list[str]) -> DiffResult:
        replaces = self.replaces(olds, news, changed)
        return DiffResult(
            changes=bool(changed),
            replaces=replaces,
            delete_before_replace=self.DELETE_BEFORE_REPLACE if replaces else None,
        )

    def diff_known(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Outputs carry every input back (see `outputs`), so comparing them with the new inputs shows what the
        # stack wants changed; version bumps alone re-run nothing.
        return self.diff_result(olds, news, self.changed_keys(olds, news, self.diffed_keys(news)))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        keys_ = self.diffed_keys(news)
        unknown = sorted({p[0] for p in unknown_paths({k: news[k] for k in keys_}) if p})
        if not unknown:
            return self.diff_known(_id, olds, news)
        # An unknown input will change (it may come out equal, but preview cannot say); never read it.
        changed = sorted(set(unknown) | set(self.changed_keys(olds, news, [k for k in keys_ if k not in unknown])))
        return self.diff_result(olds, news, changed)

    @staticmethod
    def outputs(props: dict, **extra: Any) -> dict:
        out = {k: v for k, v in props.items() if k != "__provider" and k not in HINTS}
        out.update(extra)
        return out


def _stdout(conn: Conn, script: str, stdin: bytes | None) -> str:
    return conn.run(script, input=stdin).stdout


def _one_attempt(method: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(method, "_one_attempt", False):
        return method

    def run(self: HostProvider, *args: Any) -> Any:
        with pristine.attempt():
            return method(self, *args)

    run._one_attempt = True  # type: ignore[attr-defined]
    run.__name__, run.__qualname__, run.__doc__ = method.__name__, method.__qualname__, method.__doc__
    return run


class HostProvider(Provider):
    REPLACE_ON: tuple[str, ...] = ("host",)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Every create/update runs as one attempt (pristine.attempt): one that fails before it changes the host
        # (a refusal after reading it) removes the records it made, so nothing of it stays on the host.
        super().__init_subclass__(**kwargs)
        for name in ("create", "update"):
            if name in cls.__dict__:
                setattr(cls, name, _one_attempt(cls.__dict__[name]))

    def configure(self, req: ConfigureRequest) -> None:
        # Private keys come from the stack's secret config, which the engine sends to the provider process (CLI
        # >= 3.139.0, see Pulumi.yaml); they are looked up by name, `gpuhost:<key_name>`, when a host needs one.
        keys.set_source(lambda name: req.config.get(f"gpuhost:{name}"))

    # -- helpers for subclasses -------------------------------------------------------------------------------
    KIND = "resource"

    def owner(self, props: dict) -> str:
        """Who records and changes things on the host: "<stack>/<resource>" (the `owner_tag` input)."""
        return props.get("owner_tag") or f"unnamed/{self.spec(props).name}-{type(self).__name__}"

    @staticmethod
    def spec(props: dict) -> HostSpec:
        return HostSpec.model_validate(props["host"])

    def conn(self, props: dict) -> Conn:
        return connect(self.spec(props))

    def check_host(self, news: dict) -> list[CheckFailure]:
        if "host" not in news:
            return [CheckFailure("host", "missing: how to reach the host")]
        if unknown_paths(news["host"]):
            return []
        try:
            HostSpec.model_validate(news["host"])
        except ValidationError as e:
            return validation_failures(e, "host.")
        return []

    def check_known(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return CheckResult(news, self.check_host(news))

    # Providers not yet on TemplateProvider implement `_converge(props, olds) -> outputs` (olds None on create).
    def _converge(self, props: dict, olds: dict | None) -> dict:
        raise NotImplementedError

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(f"{self.spec(props).name}:{self.KIND}", self._converge(props, None))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(self._converge(news, olds))

    def record_and_read(
        self, conn: Conn, props: dict, rec: Record, facts_text: str, before: str = ""
    ) -> tuple[str, dict, dict]:
        """One round trip: record (first time only) and read. Returns (output, pristine files, prior values).
        `before`: a check run first, which may end the script (`exit 0`) before anything is recorded."""
        text = before + rec.script().render() + facts_text
        out = self.guarded(conn, "reading the host", lambda: conn.run(text).stdout)
        pristine.note_fresh(conn, rec.owner, out)
        files, values = rec.parse(out, conn.spec.name)
        return out, files, values

    def run_plan(
        self, conn: Conn, props: dict, plan: Plan, change: Change | None = None, then: Iterable[str] = ()
    ) -> Change:
        """Run `change` (if given), the plan's actions, then the lines `then` (a check of the result): one script,
        one round trip, under the host lock."""
        ch = self.to_change(props, plan, change, then)
        if not ch.empty:
            with self.ticking(props, conn, ch):
                self.guarded(conn, ch.why, lambda: ch.run(conn), changing=True)
        return ch

    def ticking(self, props: dict, conn: Conn, ch: Change | None) -> contextlib.AbstractContextManager:
        """Progress lines while `ch` runs, when it runs a slow command (an initramfs rebuild, update-grub: minutes
        on a big host); see providers.progress. Bounded by the command timeout the change runs under."""
        what = progress.change_what(conn.spec.name, ch.script.render()) if ch is not None else None
        if what is None:
            return contextlib.nullcontext()
        label = progress.resource_label(self.owner(props), conn.spec.name)
        return progress.ticking(label, what, conn.spec.command_timeout)

    def to_change(
        self, props: dict, plan: Plan, change: Change | None = None, then: Iterable[str] = (), classes: tuple = ()
    ) -> Change:
        """`change` (or a new one, locking `classes`) with the plan's actions and the lines `then` added."""
        ch = change or Change(self.owner(props), classes=tuple(classes))
        for a in plan.actions:
            if a.write is not None:
                ch.write(a.write.path, a.write.content, a.write.mode, a.write.owner)
            if a.command:
                ch.add([a.command])
        ch.add(then)
        ch.why = "; ".join(a.why for a in plan.actions) or ch.why or "restoring what gpuhost found"
        return ch

    def converge(
        self,
        conn: Conn,
        props: dict,
        rec: Record,
        read: str,
        plan: Callable[[bytes, dict | None, dict | None], Change | None],
    ) -> tuple[str, dict, dict, bytes, Change | None]:
        """Record, check and change in ONE round trip per try, planned from what was read before (no read phase).

        `read`: the script whose output the plan is made from (facts.host.facts_script with the step's sections,
        files and sysctls); `props["host_read"]`: that output as HostPreflight read it (base64), when the component
        wired it. `plan(read_output, pristine_files, prior_values)` returns the Change (with its lock classes), or
        None when it needs the records first (they are None on the first try). Each try runs pristine.guarded:
        the records, the read again under the change's locks, the change only if the read is unchanged; otherwise
        the host's fresh read comes back in the same round trip and the plan is made again from it. A refusal
        raised by `plan` (an SSH NIC, an unknown node) comes before any change, so the attempt leaves no records.

        Returns (the last round trip's output, pristine files, prior values, the read the plan used, the Change)."""
        known = props.get("host_read")
        seen: bytes | None = None
        if isinstance(known, str) and known and not is_unknown(known):
            try:
                seen = base64.b64decode(known, validate=True)
            except ValueError:
                seen = None
        files: dict | None = None
        values: dict | None = None
        for _ in range(4):
            ch = plan(seen, files, values) if seen is not None else None
            sha = hashlib.sha256(seen).hexdigest() if seen is not None and ch is not None else None
            body = ch.script.render() if ch is not None else "true"
            script = pristine.guarded(rec, read, sha, body)
            # Only a change takes the locks; recording and reading alone never waited for them (the record itself
            # is under the pristine store's lock).
            whole = pristine.locked(script, rec.owner, ch.classes) if ch is not None else script
            stdin = bytes(ch.stdin) if ch is not None else None
            was = pristine.attempt_changed()
            with self.ticking(props, conn, ch):
                out = self.guarded(
                    conn,
                    (ch.why or "changing the host") if ch is not None else "recording and reading the host",
                    functools.partial(_stdout, conn, whole, stdin),
                    changing=ch is not None,
                )
            if "\n@@changing\n" not in "\n" + out:
                pristine.reset_changed(was)
            pristine.note_fresh(conn, rec.owner, out)
            files, values = rec.parse(out, conn.spec.name)
            fresh = pristine.stale_read(out)
            if fresh is None:
                return out, files, values, seen or b"", ch
            seen = fresh
        raise HostError(
            conn.spec.name,
            "the host kept changing between gpuhost's read and its change (4 tries)",
            fix="find what else is changing it (another tool, a hand edit in progress), then run `pulumi up` again",
            changed=pristine.attempt_changed(),
        )

    @staticmethod
    def guarded(conn: Conn, doing: str, fn: Callable[[], Any], changing: bool = False) -> Any:
        was = pristine.attempt_changed()
        if changing:
            pristine.changing()
        try:
            return fn()
        except (CommandFailed, HostUnreachable) as e:
            failed = e.result if isinstance(e, CommandFailed) else None
            # A failed command stopped a `set -e` script part-way; a lost connection leaves it unknown; a command
            # whose channel never opened did not run.
            changed: bool | None
            if isinstance(e, NothingRan):
                pristine.reset_changed(was)
                changed = was
            else:
                changed = (True if failed else None) if changing else False
            raise HostError(
                conn.spec.name,
                f"{doing}: the command failed (exit {failed.rc})" if failed else f"{doing}: {e}",
                fix="read the stderr below; the change runs as one script and stops at the first failure"
                if failed
                else "check the host is up and reachable, then run `pulumi up` again",
                changed=changed,
                stderr=failed.stderr if failed else "",
            ) from None

    @staticmethod
    def also_changed(d: DiffResult, drifted: bool) -> DiffResult:
        """`d`, or an in-place update when nothing in the inputs changed but the host drifted (seen by refresh)."""
        if drifted and not d.changes:
            return DiffResult(changes=True, replaces=[], delete_before_replace=None)
        return d

    def check_unknown(self, olds: dict[str, Any], news: dict[str, Any]) -> list[CheckFailure]:
        return self.check_host(news)

    def replaces(self, olds: dict, news: dict, changed: Iterable[str]) -> list[str]:
        out = super().replaces(olds, news, changed)
        # Same machine, other connection details (port, user, jump, timeouts, host key): an update.
        if "host" in out and host_identity(olds.get("host")) == host_identity(news.get("host")):
            if not unknown_paths(host_identity(news.get("host"))):
                out.remove("host")
        return out


class TemplateProvider(HostProvider):
    """The provider template: declare, observe, apply; the base does the rest the same way for every provider.

    A provider declares INPUTS (what the stack wants; diffed, the host by identity), OUTPUT_ONLY and REPLACE_ON,
    and implements:

    - `observe(props)`: the host's actual state in the inputs' own terms (one round trip); `read` returns it over
      the inputs, so `pulumi refresh` shows a hand edit as a change of that input and the next `up` repairs it.
    - `apply(props, prior)`: make the host match (prior: the old outputs on update, None on create); returns the
      output-only values. `record_and_read` records the pristine files and runtime values on the host (first time
      only) in the same round trip as the facts; `run_plan` runs a plan's actions under the host lock.
    - `restore(props)`: the Change that puts back what the records say (delete).

    Every failure is a HostError naming the host, the problem, the fix and whether anything changed.
    """

    INPUTS: tuple[str, ...] = ("host",)
    # Inputs validated by a pydantic model; check hands them on normalized (the model's JSON dump).
    MODELS: ClassVar[dict[str, type[BaseModel]]] = {}
    # Inputs naming a path on the host that gpuhost writes or removes: absolute, without '..', never "/".
    PATHS: tuple[str, ...] = ()

    def validate(self, news: dict) -> list[CheckFailure]:
        """The provider's own rules on its inputs, every value known (the host and MODELS are checked already)."""
        return []

    def check_known(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = self.check_host(news)
        for k, model in self.MODELS.items():
            try:
                news = {**news, k: model.model_validate(news.get(k) or {}).model_dump(mode="json")}
            except ValidationError as e:
                failures += validation_failures(e, f"{k}.")
        for k in self.PATHS:
            if not is_safe_abs_path(news.get(k)) or news.get(k) == "/":
                failures.append(CheckFailure(k, f"must be an absolute path without '..': {news.get(k)!r}"))
        return CheckResult(news, failures + self.validate(news))

    def observe(self, props: dict) -> dict:
        raise NotImplementedError

    def apply(self, props: dict, prior: dict | None) -> dict:
        raise NotImplementedError

    def restore(self, props: dict) -> Change:
        raise NotImplementedError

    # -- what the base supplies -------------------------------------------------------------------------------
    def diffed_keys(self, news: dict) -> list[str]:
        return [k for k in self.INPUTS if k in news]

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(f"{self.spec(props).name}:{self.KIND}", self.outputs(props, **self.apply(props, None)))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(self.outputs(news, **self.apply(news, olds)))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return ReadResult(id_, {**self.outputs(props), **self.observe(props)})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        ch = self.restore(props)
        if not ch.empty:
            conn = self.conn(props)
            with self.ticking(props, conn, ch):
                self.guarded(conn, "restoring what gpuhost found", lambda: ch.run(conn), changing=True)


HostProvider.create = _one_attempt(HostProvider.create)  # type: ignore[method-assign]
HostProvider.update = _one_attempt(HostProvider.update)  # type: ignore[method-assign]


def bookkeeping(provider: type[Provider], name: str) -> dict:
    """The inputs every gpuhost resource carries besides its own: provider version and owner tag (never diffed)."""
    return {"version": provider.VERSION, "owner_tag": f"{pulumi.get_stack()}/{name}"}


class HostResource(dynamic.Resource):
    """What every gpuhost dynamic resource declares the same way: the provider, output-only properties as None
    inputs (so Pulumi exposes them), input defaults, the version and the owner tag.

    Usage::

        class Sysctls(HostResource, module="host", name="Sysctls"):
            PROVIDER = SysctlsProvider
            DEFAULTS = {"file": None}
    """

    PROVIDER: ClassVar[type[Provider]]
    DEFAULTS: ClassVar[dict[str, Any]] = {}

    def __init__(self, name: str, args: dict, opts: pulumi.ResourceOptions | None = None):
        p = self.PROVIDER
        props = {**{k: None for k in p.OUTPUT_ONLY}, **self.DEFAULTS, **args, **bookkeeping(p, name)}
        super().__init__(p(), name, props, opts)
