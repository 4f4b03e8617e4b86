"""Run the whole program (or a component) under Pulumi mocks and record every registration as the engine sees it.

The recording monitor keeps what plain Mocks lose: each resource's parent URN, its dependency URNs and which
inputs arrive as secrets, so tests can assert parents, dependency edges and secrecy, and find duplicate URNs
(which mocks do not reject by themselves).

Usage::

    rec = run_program(config={"gpuhost:fleet": fleet_dict, "gpuhost:sshPrivateKey": pem},
                      secret_keys=["gpuhost:sshPrivateKey"])
    rec.of_type("gpuhost:host:KernelCmdline")[0].inputs["add"]
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import gc
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pulumi
import pulumi._types as sdk_types
import pulumi.dynamic.dynamic as sdk_dynamic
from google.protobuf import struct_pb2
from pulumi.output import Unknown, _OutputData
from pulumi.runtime import _serialization as sdk_serialization
from pulumi.runtime import mocks as pm
from pulumi.runtime import resource as sdk_resource
from pulumi.runtime import resource_cycle_breaker as sdk_cycles
from pulumi.runtime import rpc
from pulumi.runtime import settings as sdk_settings
from pulumi.runtime.proto import resource_pb2, source_pb2
from pulumi.runtime.settings import SETTINGS

SECRET_SIG = rpc._special_secret_sig if hasattr(rpc, "_special_secret_sig") else "1b47061264138c4ac30d75fd1eb44270"


@dataclass
class Registration:
    """One registration as the engine received it. `inputs` are deserialized from the request on first read: the
    mock engine's own work, which a run (and the 100-host bench) need not do for inputs nobody reads."""

    urn: str
    type: str
    name: str
    parent: str
    dependencies: list[str]
    # the inputs (a dict), or the request's Struct until `inputs` is first read
    _inputs: Any
    secret_inputs: list[str]
    custom: bool
    secret_outputs: list[str] = field(default_factory=list)

    @property
    def inputs(self) -> dict:
        if not isinstance(self._inputs, dict):
            pm._ensure_event_loop()  # deserializing resource references needs one on this thread
            self._inputs = rpc.deserialize_properties(self._inputs)
        return self._inputs

    @inputs.setter
    def inputs(self, value: dict) -> None:
        self._inputs = value


def _secret_keys(struct) -> list[str]:
    out = []
    for k, v in struct.fields.items():
        sv = v.struct_value if v.HasField("struct_value") else None
        if sv is not None and "4dabf18193072939515e22adb298388d" in sv.fields:
            sig = sv.fields["4dabf18193072939515e22adb298388d"].string_value
            if sig == SECRET_SIG or sig == "1b47061264138c4ac30d75fd1eb44270":
                out.append(k)
    return out


class RecordingMonitor(pm.MockMonitor):
    """pulumi's MockMonitor that also records each registration. Its RegisterResource is MockMonitor's own, with the
    request's inputs deserialized at most once for both the mocks and the record, and only when read: EchoMocks reads
    them for a few types, a test when it asks (deserializing every resource's inputs at registration was a twentieth
    of the 100-host bench, work that the engine, not the program, does)."""

    def __init__(self, mocks):
        super().__init__(mocks)
        self.registrations: list[Registration] = []
        # urn -> (registration, computed outputs): resources whose state (inputs + computed) is built when read
        self._lazy: dict[str, tuple[Registration, dict]] = {}

    def RegisterResource(self, request):
        if request.type == "pulumi:pulumi:Stack":
            return super().RegisterResource(request)
        urn = self.make_urn(request.parent, request.type, request.name)
        # EchoMocks answering with the inputs: their struct is the answer (a mock with its own new_resource is asked)
        mocks = self.mocks
        echo = mocks if isinstance(mocks, EchoMocks) and type(mocks).new_resource is EchoMocks.new_resource else None
        # EchoMocks reads the inputs of a few types only: the others' stay serialized until a test reads them
        lazy = echo is not None and not echo.reads_inputs(request.type)
        reg = Registration(
            urn=urn,
            type=request.type,
            name=request.name,
            parent=request.parent,
            dependencies=list(request.dependencies),
            _inputs=request.object,
            secret_inputs=_secret_keys(request.object),
            custom=bool(request.custom),
            secret_outputs=list(request.additionalSecretOutputs),
        )
        args = pm.MockResourceArgs(
            typ=request.type,
            name=request.name,
            inputs={} if lazy else dict(reg.inputs),
            provider=request.provider,
            resource_id=request.importId,
            custom=request.custom or False,
            transforms=pm._resolve_callbacks(request.transforms),
        )
        if echo is not None:
            # outputs = the inputs (already serialized: the request's struct) + what the mock computes
            computed = echo.computed(args)
            id_ = f"{request.name}-id"
            state = None if lazy else {**reg.inputs, **computed}
            if lazy:
                self._lazy[urn] = (reg, computed)
            obj = struct_pb2.Struct()
            obj.CopyFrom(request.object)
            for k, v in _run_now(rpc.serialize_properties(computed, {})).fields.items():
                obj.fields[k].CopyFrom(v)
        else:
            new_id, state = self.mocks.new_resource(args)
            id_ = new_id or ""  # the SDK's own mock monitor answers an unknown id as ""
            obj = _run_now(rpc.serialize_properties(state, {}))
        self.resources[urn] = pm.MockMonitor.ResourceRegistration(urn, id_, state)  # type: ignore[arg-type]
        self.registrations.append(reg)
        return resource_pb2.RegisterResourceResponse(urn=urn, id=id_, object=obj)

    def _states(self) -> None:
        """Each lazily kept resource's state (its inputs and what the mock computed), before anyone reads one."""
        for urn, (reg, computed) in self._lazy.items():
            self.resources[urn] = self.resources[urn]._replace(state={**reg.inputs, **computed})
        self._lazy.clear()

    def Invoke(self, request):
        self._states()  # getResource answers a resource's state
        return super().Invoke(request)

    def get_registered_resources(self):
        self._states()
        return super().get_registered_resources()


class EchoMocks(pulumi.runtime.Mocks):
    """Outputs are the inputs, plus what providers compute that the program reads back."""

    # The types (by the end of their type token) whose computed outputs `computed` derives from their inputs; the
    # one list `reads_inputs` answers from too, so a type added here gets its inputs deserialized.
    SRIOV, VFIO, MIG = ":SriovVfs", "/host:VfioBinding", "/gpu:MigLayout"

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        return [f"{args.name}-id", {**args.inputs, **self.computed(args)}]

    def reads_inputs(self, typ: str) -> bool:
        """Whether `computed` reads the inputs of a resource of type `typ` (a subclass that overrides `computed`
        reads every type's)."""
        if type(self).computed is not EchoMocks.computed:
            return True
        return typ.endswith((self.SRIOV, self.VFIO, self.MIG))

    def computed(self, args: pulumi.runtime.MockResourceArgs) -> dict:
        """The outputs that are not inputs."""
        outs: dict = {}
        if args.typ == "docker:index/remoteImage:RemoteImage":
            outs["imageId"] = "sha256:" + "0" * 64
        if args.typ.endswith(self.SRIOV):
            pf = str(args.inputs.get("pf", "0000:41:00.0"))
            n = int(args.inputs.get("num_vfs", 0) or 0)
            base = pf.rsplit(":", 1)[0]
            outs["vf_addresses"] = [f"{base}:{(i + 1) // 8:02x}.{(i + 1) % 8}" for i in range(n)]
        if args.typ.endswith(self.VFIO):
            # the drivers the provider reads back once bound (HostReboot's expected running state comes from them)
            outs["drivers"] = {a: "vfio-pci" for a in args.inputs.get("devices") or []}
        if args.typ.endswith(self.MIG):
            # nvidia-smi -L's MIG UUIDs, one per instance of the layout (what the real provider reads back)
            outs["mig_uuids"] = {
                gpu: [
                    f"MIG-{gpu}{i}000000-0000-4000-8000-{args.name[:4].encode().hex():0>12}"
                    for i in range(len(profiles))
                ]
                for gpu, profiles in (args.inputs.get("layout") or {}).items()
            }
        return outs

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


def _run_now(coro: Any) -> Any:
    """The result of a coroutine that never waits (serializing the plain values a mock returns), without a loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a mock returned a value that must be awaited (an Output or a resource); return plain values")


class _Inline(concurrent.futures.ThreadPoolExecutor):
    """The event loop's executor under mocks: runs each monitor call at once, on the loop's thread. The SDK sends
    every RPC through a thread pool; with the mock monitor in-process that only added a thread hand-off per resource
    and let the pool's threads reorder the registrations (the mocks plan listed them in a different order each run).
    """

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        fut: concurrent.futures.Future = concurrent.futures.Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine, as the pool would
            fut.set_exception(e)
        return fut


def _no_stack_trace() -> source_pb2.StackTrace:
    return source_pb2.StackTrace()


def _contains_unknowns(val: Any) -> bool:
    """rpc.contains_unknowns without its per-call closure: the SDK defines a nested recursive `impl` (annotated
    `set[int]`) on every call, some 170,000 calls in a 100-host run, and each leaves a function, its cell, a
    GenericAlias and two tuples in a reference cycle for the collector (two thirds of what the run left behind)."""
    if isinstance(val, Unknown):
        return True
    return isinstance(val, dict | list) and _unknowns_in(val, set())


def _unknowns_in(val: Any, seen_ids: set[int]) -> bool:
    """rpc.contains_unknowns's `impl`, the same walk and answer."""
    if isinstance(val, Unknown):
        return True
    if id(val) in seen_ids:
        return False
    seen_ids.add(id(val))
    if isinstance(val, dict):
        return any(_unknowns_in(val[k], seen_ids) for k in val)
    if isinstance(val, list):
        return any(_unknowns_in(x, seen_ids) for x in val)
    return False


def _reachable(from_resource: Any, to_resource: Any) -> bool:
    """resource_cycle_breaker._reachable (is `to_resource` among `from_resource`'s transitive dependencies?) as one
    loop: the SDK's nested generators pass every resource up through each level of the chain (4.3 million generator
    steps for 7,000 dependency checks in a 100-host run)."""
    todo, visited = [from_resource], set()
    while todo:
        r = todo.pop()
        if r in visited:
            continue
        if r == to_resource:
            return True
        visited.add(r)
        todo.extend(sdk_cycles._deps(r))
    return False


def _once_per_type(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`fn` of a type (a pure function of it), computed once per type: the SDK asks again for every resource or
    property. An unhashable argument is passed through uncached."""
    answers: dict[Any, Any] = {}

    def once(t: Any) -> Any:
        try:
            return answers[t]
        except KeyError:
            answers[t] = fn(t)
            return answers[t]
        except TypeError:
            return fn(t)

    return once


_provider_bytes: dict[type, str] = {}


def _memo_serialize_provider(provider: Any) -> str:
    """dynamic.serialize_provider once per provider class for providers that hold no state of their own (every
    gpuhost provider): dill pickles such an instance as its class and an empty dict, the same string each time.
    A provider with instance state, or one whose pickling captured a secret, is pickled every time as before."""
    if vars(provider):
        return _sdk_serialize_provider(provider)
    cls = type(provider)
    if cls not in _provider_bytes:
        text = _sdk_serialize_provider(provider)
        if sdk_serialization._var_serialization_contained_secrets.get():
            return text
        _provider_bytes[cls] = text
    return _provider_bytes[cls]


def _debug(msg: str, resource: Any = None, stream_id: Optional[int] = None, ephemeral: Optional[bool] = None) -> None:
    """pulumi.log.debug, which the SDK calls several times per resource: the mock engine hands a debug message to
    its logger's `debug`, so while that logger drops debug messages, building the log request is skipped."""
    engine = sdk_settings.get_engine()
    if resource is None and isinstance(engine, pm.MockEngine) and not engine.logger.isEnabledFor(logging.DEBUG):
        return
    _sdk_debug(msg, resource, stream_id, ephemeral)


def _track(self: pulumi.Output) -> None:
    """Output._track (the run's set of pending outputs, each removed once it resolves) reading the settings' lock and
    set once per output instead of twice more at resolution (a context-variable lookup each, 570,000 of them)."""
    lock, outputs = SETTINGS.lock, SETTINGS.outputs
    with lock:
        outputs.add(self._data)
    self._data.add_done_callback(functools.partial(_untrack_done, lock, outputs))


def _untrack_done(lock: Any, outputs: set, fut: Any) -> None:
    """Output._track's `cleanup`: a cancelled or failed output stays in the set for the program's end to report."""
    if fut.cancelled() or fut.exception() is not None:
        return
    with lock:
        outputs.discard(fut)


def _transfer_properties(res: pulumi.Resource, props: dict, custom: bool) -> dict[str, Callable[..., None]]:
    """rpc.transfer_properties (an Output attribute per property, and the resolver the registration calls) with one
    future per property holding the Output's data: the SDK makes four futures (value, known, secret, dependencies)
    and a task that awaits them into the same data, per property, set or not (pulumi-docker's Container has 78)."""
    resolvers: dict[str, Callable[..., None]] = {}
    for name in props:
        if name == "urn" or (name == "id" and custom):
            continue  # handled by the SDK elsewhere
        data: Any = asyncio.Future()
        resolvers[name] = functools.partial(_resolve_data, res, data)
        res.__dict__[name] = pulumi.Output._from_data(data)
    return resolvers


def _resolve_data(
    r: pulumi.Resource, data: Any, value: Any, is_known: bool, is_secret: bool, deps: Any, failed: Any
) -> None:
    """transfer_properties's `do_resolve`: the property's dependencies are `deps` and the resource itself. The data
    is settled one loop turn later, where the SDK's task would wake to gather its four futures, so everything
    waiting on the property runs in the same order as with the SDK's own (the registrations keep their order)."""
    deps_union = set(deps) if deps else set()
    deps_union.add(r)
    outcome = (
        None
        if failed is not None
        else _OutputData(resources=deps_union, value=value, is_known=is_known, is_secret=is_secret)
    )
    data.get_loop().call_soon(_settle, data, outcome, failed)


def _settle(data: Any, outcome: Any, failed: Any) -> None:
    if data.cancelled():  # as the SDK's task would be: nothing left to settle
        return
    if failed is not None:
        data.set_exception(failed)
    else:
        data.set_result(outcome)


_sdk_debug = pulumi.log.debug
_sdk_serialize_provider = sdk_dynamic.serialize_provider
# (module, attribute, stand-in): SDK functions that lean_runtime replaces with ones that answer the same, cheaper
_SHORTCUTS = (
    (rpc, "contains_unknowns", _contains_unknowns),
    (sdk_cycles, "_reachable", _reachable),
    # a resource class's output types: the SDK makes a throwaway class and resolves its type hints per resource
    (sdk_types, "resource_types", _once_per_type(sdk_types.resource_types)),
    # Output[T], Input[T], Optional[...] unwrapped to T, once per annotation instead of once per property value
    (sdk_types, "unwrap_type", _once_per_type(sdk_types.unwrap_type)),
    (sdk_dynamic, "serialize_provider", _memo_serialize_provider),
    (pulumi.log, "debug", _debug),
    (pulumi.Output, "_track", _track),
    (rpc, "transfer_properties", _transfer_properties),
)
_SDK = {name: getattr(module, name) for module, name, _ in _SHORTCUTS}  # the SDK's own, by name


@contextmanager
def lean_runtime() -> Iterator[None]:
    """While the program runs under mocks, skip what costs time and changes nothing it registers:

    - the cyclic garbage collector: the SDK makes some 35 Outputs, futures and tasks per resource, all alive until
      the run ends, and each full collection walks every one of them again (half the time of a 100-host run);
      collection resumes afterwards;
    - the stack trace the SDK takes at each resource for the engine's diagnostics (source positions): the mock
      monitor drops it, and walking the stack with a file URI per frame was a tenth of the run;
    - per-resource work of the SDK whose answer is the same every time or cheaper to reach (`_SHORTCUTS`: the
      unknowns check, the dependency-cycle check, a resource class's output types and unwrapped annotations, a
      stateless provider's pickle, debug messages nobody logs, the pending-output bookkeeping) and the loop's
      debug-mode question. The registrations are the same byte for byte (docs/benchmarks-history.md says how that
      was checked).
    """
    enabled = gc.isenabled()
    stack_trace = sdk_resource._get_stack_trace
    loop = pm._ensure_event_loop()  # the loop pulumi.runtime.test runs the program on
    executor = loop._default_executor  # type: ignore[attr-defined]
    gc.disable()
    sdk_resource._get_stack_trace = _no_stack_trace
    loop.set_default_executor(_Inline(max_workers=1))
    quiet_loop = not loop.get_debug()
    if quiet_loop:
        # every future, task and callback handle asks its loop get_debug() (half a million calls in a 100-host run);
        # a loop not in debug mode answers False, which `bool()` answers without a Python frame
        loop.get_debug = bool  # type: ignore[method-assign]
    originals = [(module, name, getattr(module, name)) for module, name, _ in _SHORTCUTS]
    for module, name, stand_in in _SHORTCUTS:
        setattr(module, name, stand_in)
    try:
        yield
    finally:
        for module, name, original in originals:
            setattr(module, name, original)
        if quiet_loop:
            del loop.get_debug
        loop._default_executor = executor  # type: ignore[attr-defined]
        sdk_resource._get_stack_trace = stack_trace
        if enabled:
            gc.enable()


@dataclass
class Recording:
    registrations: list[Registration] = field(default_factory=list)
    exports: dict = field(default_factory=dict)
    # the exports once every Output in them resolved (what `pulumi stack output` would show)
    resolved_exports: Any = None

    def of_type(self, t: str) -> list[Registration]:
        return [r for r in self.registrations if r.type == t]

    def by_name(self, name: str) -> Registration:
        return next(r for r in self.registrations if r.name == name)

    def by_urn(self, urn: str) -> Registration:
        return next(r for r in self.registrations if r.urn == urn)

    def duplicate_urns(self) -> list[str]:
        seen, dup = set(), []
        for r in self.registrations:
            if r.urn in seen:
                dup.append(r.urn)
            seen.add(r.urn)
        return dup

    def types(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.registrations:
            out[r.type] = out.get(r.type, 0) + 1
        return out


def run_program(
    config: dict[str, Any], secret_keys: list[str], stack: str = "test", body: Optional[Callable[[], dict]] = None
) -> Recording:
    """Run the program as __main__ does (or `body`) fresh under mocks with this stack config."""
    mocks = EchoMocks()
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project="gpuhost", stack=stack, preview=False, monitor=monitor)
    cfg = {k: (json.dumps(v) if not isinstance(v, str) else v) for k, v in config.items()}
    pulumi.runtime.set_all_config(cfg, secret_keys)
    rec = Recording()

    def default_body():
        from stacks.load import load

        return load(pulumi.Config("gpuhost")).declare()

    @pulumi.runtime.test
    def program():
        out = (body or default_body)()
        rec.exports = out

        def resolved(v: Any) -> Any:
            rec.resolved_exports = v
            return v

        return pulumi.Output.from_input(out).apply(resolved)

    try:
        with lean_runtime():
            program()
    finally:
        rec.registrations = monitor.registrations
    return rec


def attempt_program(
    config: dict[str, Any], secret_keys: list[str], stack: str = "test", mocks: Optional[EchoMocks] = None
) -> tuple[Recording, Optional[BaseException]]:
    """Run the program and keep what was registered even when it fails: (recording, the error or None).

    A bad config must fail with nothing registered; `len(rec.registrations)` says how many resources the engine
    would have seen before the error. `mocks`: what providers answer (EchoMocks by default).
    """
    mocks = mocks or EchoMocks()
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project="gpuhost", stack=stack, preview=False, monitor=monitor)
    cfg = {k: (json.dumps(v) if not isinstance(v, str) else v) for k, v in config.items()}
    pulumi.runtime.set_all_config(cfg, secret_keys)
    rec = Recording()
    error: list[BaseException] = []

    @pulumi.runtime.test
    def program():
        from stacks.load import load

        try:
            out = load(pulumi.Config("gpuhost")).declare()
        except Exception as e:  # noqa: BLE001 - the error is the result under test
            error.append(e)
            return None
        rec.exports = out
        return pulumi.Output.from_input(out).apply(lambda v: v)

    try:
        with lean_runtime():
            program()
    except Exception as e:  # noqa: BLE001 - errors raised inside resource callbacks surface here
        error.append(e)
    rec.registrations = list(monitor.registrations)
    return rec, (error[0] if error else None)
