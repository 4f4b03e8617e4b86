"""Drive a dynamic provider exactly as the Pulumi engine does: through the SDK's own gRPC provider server.

The Pulumi CLI cannot be installed here, so tests reach the engine's contract from the other side: they start
`python -m pulumi.dynamic` (the same server the engine launches for Python dynamic providers), send it Configure
with the stack's config, and then Check/Diff/Create/Read/Update/Delete with the provider pickled into `__provider`
the way `pulumi.dynamic.Resource` does. This is a driver for tests, not an engine: it keeps one resource's state.

Usage::

    with ProviderServer(config={"gpuhost:sshPrivateKey": pem}) as srv:
        r = srv.resource(KernelCmdlineProvider(), "gpuhost:host:KernelCmdline", "gpu-a-cmdline")
        r.up({"host": spec, "add": ["intel_iommu=on"], "version": "1"})   # check -> create
        assert r.preview(same_inputs).changes is False                     # check -> diff
        r.refresh()                                                        # read
        r.destroy()                                                        # delete
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import grpc
from google.protobuf import struct_pb2
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import rpc
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from testbed.servers import stop_process

ROOT = Path(__file__).resolve().parent.parent
PROVIDER_KEY = "__provider"


class ProviderError(RuntimeError):
    """A provider method raised; `details` holds the provider's traceback text as the engine would show it."""

    def __init__(self, method: str, details: str):
        self.method, self.details = method, details
        last = [ln for ln in details.strip().splitlines() if ln.strip()][-1:] or [details]
        super().__init__(f"{method} failed: {last[0]}")


def _ser(props: dict) -> struct_pb2.Struct:
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(rpc.serialize_properties(props, {}))
    finally:
        loop.close()


def _de(s: struct_pb2.Struct) -> dict:
    return rpc.deserialize_properties(s, keep_unknowns=True) if s is not None else {}


def _strip(props: dict) -> dict:
    return {k: v for k, v in props.items() if k != PROVIDER_KEY}


@dataclass
class DiffOutcome:
    changes: Optional[bool]
    replaces: list[str]
    delete_before_replace: bool


class ProviderServer:
    """One `python -m pulumi.dynamic` process, configured with the stack's config like the engine does.

    `on_stderr`: called with each non-blank line the provider writes to stderr, as it arrives (the stream the engine
    shows in `pulumi up`: progress lines of long steps, providers/progress.py); the lines still reach this process's
    stderr. None: the provider writes to this process's stderr directly."""

    def __init__(
        self,
        config: Optional[dict[str, Any]] = None,
        project: str = "gpuhost",
        on_stderr: Optional[Callable[[str], None]] = None,
    ):
        self.config = config or {}
        self.project = project
        self.on_stderr = on_stderr
        self.reader: threading.Thread | None = None
        self.proc: subprocess.Popen | None = None
        self.channel = None
        self.stub: Optional[provider_pb2_grpc.ResourceProviderStub] = None

    def __enter__(self) -> "ProviderServer":
        env = dict(
            os.environ,
            PULUMI_PROJECT=self.project,
            PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "pulumi.dynamic"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if self.on_stderr else None,
        )
        assert self.proc.stdout is not None  # stdout=PIPE
        if self.proc.stderr is not None:
            # Read from the start, as the engine does: a full pipe would stall the provider.
            self.reader = threading.Thread(target=self._forward, args=(self.proc.stderr,), daemon=True)
            self.reader.start()
        port = int(self.proc.stdout.readline().decode().strip())
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.stub = stub = provider_pb2_grpc.ResourceProviderStub(self.channel)
        # The engine sends every config value of the stack, secrets included (unwrapped by the server).
        stub.Configure(provider_pb2.ConfigureRequest(args=_ser(self.config), acceptSecrets=True))
        return self

    def _forward(self, stream: Any) -> None:
        assert self.on_stderr is not None
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")
            print(line, file=sys.stderr, flush=True)
            if line.strip():
                self.on_stderr(line)

    def __exit__(self, *exc) -> None:
        if self.channel:
            self.channel.close()
        if self.proc:
            stop_process(self.proc, timeout=5)
        if self.reader is not None:
            self.reader.join(5)

    def resource(self, provider, type_: str, name: str) -> "DrivenResource":
        return DrivenResource(self, serialize_provider(provider), type_, name)

    def call(self, method: str, req):
        try:
            return getattr(self.stub, method)(req)
        except grpc.RpcError as e:
            raise ProviderError(method, e.details() or str(e)) from None


@dataclass
class DrivenResource:
    """One resource's life as the engine would drive it; keeps id, inputs and outputs like a state file."""

    server: ProviderServer
    provider: str
    type_: str
    name: str
    id: Optional[str] = None
    inputs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    @property
    def urn(self) -> str:
        return f"urn:pulumi:test::gpuhost::{self.type_}::{self.name}"

    def created_id(self) -> str:
        """The id create returned: diff, update, read and delete are about a resource that exists."""
        assert self.id is not None, f"{self.name}: not created yet"
        return self.id

    def _with_provider(self, props: dict) -> dict:
        return {**props, PROVIDER_KEY: self.provider}

    def _existing(self, kind: Any, **props: dict) -> Any:
        """A request about the created resource (Diff, Update, Read, Delete): its id and URN, and each property
        set given, with the provider in it as the engine sends it."""
        return kind(id=self.created_id(), urn=self.urn, **{k: _ser(self._with_provider(v)) for k, v in props.items()})

    def check(self, news: dict) -> dict:
        self.calls.append("check")
        req = provider_pb2.CheckRequest(
            urn=self.urn,
            olds=_ser(self._with_provider(self.inputs)) if self.inputs else _ser({}),
            news=_ser(self._with_provider(news)),
        )
        if not self.inputs:
            # First check of a new resource: olds are empty, the provider is found in news.
            req = provider_pb2.CheckRequest(urn=self.urn, olds=_ser({}), news=_ser(self._with_provider(news)))
        resp = self.server.call("Check", req)
        if resp.failures:
            raise ProviderError("Check", "\n".join(f"{f.property}: {f.reason}" for f in resp.failures))
        return _strip(_de(resp.inputs))

    def diff(self, checked: dict) -> DiffOutcome:
        self.calls.append("diff")
        req = self._existing(provider_pb2.DiffRequest, olds=self.outputs, news=checked, old_inputs=self.inputs)
        resp = self.server.call("Diff", req)
        changes = {provider_pb2.DiffResponse.DIFF_SOME: True, provider_pb2.DiffResponse.DIFF_NONE: False}.get(
            resp.changes
        )
        return DiffOutcome(changes, list(resp.replaces), resp.deleteBeforeReplace)

    def create(self, checked: dict) -> dict:
        self.calls.append("create")
        resp = self.server.call(
            "Create", provider_pb2.CreateRequest(urn=self.urn, properties=_ser(self._with_provider(checked)))
        )
        self.id = resp.id
        self.inputs, self.outputs = checked, _strip(_de(resp.properties))
        return self.outputs

    def update(self, checked: dict) -> dict:
        self.calls.append("update")
        req = self._existing(provider_pb2.UpdateRequest, olds=self.outputs, news=checked, old_inputs=self.inputs)
        resp = self.server.call("Update", req)
        self.inputs, self.outputs = checked, _strip(_de(resp.properties))
        return self.outputs

    def delete(self) -> None:
        self.calls.append("delete")
        self.server.call(
            "Delete", self._existing(provider_pb2.DeleteRequest, properties=self.outputs, old_inputs=self.inputs)
        )
        self.id, self.inputs, self.outputs = None, {}, {}

    def read(self) -> dict:
        """`pulumi refresh`: the engine passes prior outputs and inputs and takes back what the host has."""
        self.calls.append("read")
        resp = self.server.call(
            "Read", self._existing(provider_pb2.ReadRequest, properties=self.outputs, inputs=self.inputs)
        )
        return _strip(_de(resp.properties))

    # -- engine-shaped flows ----------------------------------------------------------------------------------
    def preview(self, inputs: dict) -> DiffOutcome:
        """What `pulumi preview` does for this resource: check, then diff against state (no apply)."""
        checked = self.check(inputs)
        if self.id is None:
            return DiffOutcome(True, [], False)
        return self.diff(checked)

    def up(self, inputs: dict) -> tuple[str, dict]:
        """What `pulumi up` does: check; create if new, else diff and update/replace when needed.

        Returns (operation, outputs) where operation is 'create', 'update', 'replace' or 'same'.
        """
        checked = self.check(inputs)
        if self.id is None:
            return "create", self.create(checked)
        d = self.diff(checked)
        if not d.changes:
            return "same", self.outputs
        if d.replaces:
            if d.delete_before_replace:
                self.delete()
                return "replace", self.create(checked)
            old = DrivenResource(self.server, self.provider, self.type_, self.name, self.id, self.inputs, self.outputs)
            self.id = None
            outs = self.create(checked)
            old.delete()
            return "replace", outs
        return "update", self.update(checked)

    def refresh(self) -> dict:
        self.outputs = self.read()
        return self.outputs

    def destroy(self) -> None:
        if self.id is not None:
            self.delete()


class ChildFlow:
    """A component's children (its pure `children(name, args)` list) driven through one provider server in
    declaration order, outputs of earlier children wired in as the component wires them.

    Usage::

        with ProviderServer({"gpuhost:sshPrivateKey": pem}) as srv:
            flow = ChildFlow(srv, name, passthrough_host.children(name, args))
            flow.up()            # {"preflight": "create", ..., "reboot": "create"}
            flow.preview()       # {"preflight": DiffOutcome(changes=False), ...}
            flow.inputs("cmdline")
            flow.destroy()
    """

    def __init__(self, srv: ProviderServer, name: str, children: list):
        from components.wiring import check_order

        check_order(children)
        self.name = name
        self.children = [c for c in children if c.dynamic]
        self.res = {
            c.suffix: srv.resource(
                c.kind.PROVIDER(), f"pulumi-python:{c.kind._resource_type_name}", f"{name}-{c.suffix}"
            )
            for c in self.children
        }

    @property
    def suffixes(self) -> list[str]:
        return [c.suffix for c in self.children]

    def inputs(self, suffix: str) -> dict:
        """The child's props as its resource class sends them, earlier children's outputs resolved from state."""
        from components.wiring import resolve

        c = next(x for x in self.children if x.suffix == suffix)
        p = c.kind.PROVIDER

        def output_of(r):
            v = self.res[r.child].outputs.get(r.output)
            return r.then(v) if r.then else v

        def later(v):
            return v.then(v.value)

        given = resolve(dict(c.inputs), output_of, later)
        return {**{k: None for k in p.OUTPUT_ONLY}, **c.kind.DEFAULTS, **given, "version": p.VERSION}

    def up(self) -> dict[str, str]:
        return {s: self.res[s].up(self.inputs(s))[0] for s in self.suffixes}

    def preview(self) -> dict[str, DiffOutcome]:
        return {s: self.res[s].preview(self.inputs(s)) for s in self.suffixes}

    def refresh(self) -> dict[str, dict]:
        return {s: self.res[s].refresh() for s in self.suffixes}

    def destroy(self) -> None:
        for s in reversed(self.suffixes):
            self.res[s].destroy()
