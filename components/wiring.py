"""Wiring as data: a component's children as a list of `Child` specs, built by one pure function per component.

Each component module has a `children(name, args) -> list[Child]` function (no Pulumi call, no I/O); the component
declares exactly that list (`declare`), tests and the bench drive the same list through the SDK's provider server
(`testbed.provider_server.ChildFlow`), and the stack loader reads from it which host paths every resource writes
(`writes`, from each provider's own `writes`), to refuse two resources that would write the same file before the
first one is registered.

Outputs of an earlier child are referenced symbolically (`Ref`, made by `child.ref(output)`); `after` takes
`suffixes(*children)`, so a builder is given the children it depends on, not their names. A value that arrives from
outside the component later (another component's Output) is wrapped in `Later` when the component transforms it.

Usage::

    def children(name: str, args: MyArgs) -> list[Child]:      # one named builder per resource in a real one
        vfio = Child("vfio", VfioBinding, {"host": conn, "devices": args.gpus})
        reboot = Child("reboot", HostReboot, {"host": conn, "expect_drivers": vfio.ref("drivers", to_vfio_pci)},
                       after=suffixes(vfio))
        return [vfio, reboot]

    class MyComponent(Wired, type_name="gpuhost:host:MyComponent", children=children):
        def wire(self, args, made):                       # attributes and registered outputs from the children
            self.reboot = made["reboot"]
            return {"pending_reboot": self.reboot.pending}
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

import pulumi
import pulumi_docker as docker
from pulumi import dynamic

from access.ssh import HostSpec


@dataclass(frozen=True)
class Ref:
    """The output `output` of the earlier child `child` (by suffix), passed through `then` when given."""

    child: str
    output: str
    then: Optional[Callable[[Any], Any]] = None


@dataclass(frozen=True)
class Later:
    """A value from outside the component (an Output of another component, or a plain value), through `then`."""

    value: Any
    then: Callable[[Any], Any]


@dataclass(frozen=True)
class Child:
    """One child resource: named `f"{component}-{suffix}"`, of class `kind`, with these inputs.

    after: earlier children (suffixes) it waits for; after_outside: resources outside the component it waits for;
    provider: the suffix of an explicit provider child (pulumi-docker's Provider at a host's Docker engine).
    Dynamic resources (gpuhost's providers) take `inputs` as their props; other kinds take them as keyword
    arguments.
    """

    suffix: str
    kind: type
    inputs: Mapping[str, Any]
    after: tuple[str, ...] = ()
    after_outside: tuple[Any, ...] = field(default=(), compare=False)
    provider: Optional[str] = None
    # Earlier identities of this child (pulumi.Alias), so a move into a component is no replacement.
    aliases: tuple[Any, ...] = field(default=(), compare=False)
    # Outputs the engine keeps encrypted in state (what a secret input becomes: content, its digest, the prior).
    secret_outputs: tuple[str, ...] = ()

    @property
    def dynamic(self) -> bool:
        return issubclass(self.kind, dynamic.Resource)

    def ref(self, output: str, then: Optional[Callable[[Any], Any]] = None) -> Ref:
        """This child's output `output` as an input of a later child (through `then` when given)."""
        return Ref(self.suffix, output, then)


def suffixes(*children: Child) -> tuple[str, ...]:
    """The suffixes of earlier children, for `after`: a children function passes the children it built, not names.

    >>> suffixes(Child("preflight", object, {}), Child("cmdline", object, {}))
    ('preflight', 'cmdline')
    """
    return tuple(c.suffix for c in children)


def present(*children: Optional[Child]) -> list[Child]:
    """The children that a builder made (it returns None for a part the args leave out), in order."""
    return [c for c in children if c is not None]


# Leaf types that hold no Ref or Later: most of a fleet's input leaves, answered before the isinstance chain (a
# Mapping check is an ABC lookup; the 100-host program walks some 90,000 leaves twice).
_PLAIN = frozenset({str, int, float, bool, type(None), bytes})


def refs(value: Any) -> Iterator[Ref]:
    """Every Ref inside an input value (dicts, lists and tuples at any depth)."""
    if type(value) in _PLAIN:
        return
    if isinstance(value, Ref):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from refs(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from refs(v)


def resolve(value: Any, output_of: Callable[[Ref], Any], later: Callable[[Later], Any]) -> Any:
    """`value` with every Ref and Later replaced (by `output_of` and `later`), at any depth."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, Ref):
        return output_of(value)
    if isinstance(value, Later):
        return later(value)
    if isinstance(value, Mapping):
        return {k: resolve(v, output_of, later) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, output_of, later) for v in value]
    if isinstance(value, tuple):
        return tuple(resolve(v, output_of, later) for v in value)
    return value


def check_order(children: list[Child]) -> None:
    """Names unique; `after`, `provider` and every Ref point at an earlier child (a bug in a children function)."""
    seen: set[str] = set()
    for c in children:
        if c.suffix in seen:
            raise ValueError(f"child {c.suffix!r} declared twice")
        for dep in (*c.after, *([c.provider] if c.provider else []), *(r.child for r in refs(c.inputs))):
            if dep not in seen:
                raise ValueError(f"child {c.suffix!r} refers to {dep!r}, which is not an earlier child")
        seen.add(c.suffix)


def declare(parent: pulumi.Resource, name: str, children: list[Child]) -> dict[str, pulumi.Resource]:
    """Register `children` under `parent`, in order; returns the resources by suffix."""
    check_order(children)
    made: dict[str, pulumi.Resource] = {}

    def output_of(r: Ref) -> Any:
        out = getattr(made[r.child], r.output)
        return out.apply(r.then) if r.then else out

    def later(v: Later) -> Any:
        return pulumi.Output.from_input(v.value).apply(v.then)

    for c in children:
        inputs = resolve(dict(c.inputs), output_of, later)
        depends = [made[s] for s in c.after] + list(c.after_outside)
        opts = pulumi.ResourceOptions(
            parent=parent,
            depends_on=depends or None,
            provider=made[c.provider] if c.provider else None,  # type: ignore[arg-type]
            aliases=list(c.aliases) or None,
            additional_secret_outputs=list(c.secret_outputs) or None,
        )
        full = f"{name}-{c.suffix}"
        made[c.suffix] = c.kind(full, inputs, opts) if c.dynamic else c.kind(full, **inputs, opts=opts)
    return made


class Wired(pulumi.ComponentResource):
    """A component that declares exactly its module's pure ``children(name, args)`` list under itself, then sets its
    attributes and registers the outputs ``wire(args, made)`` returns (``made``: the children by suffix)."""

    TYPE: ClassVar[str]
    CHILDREN: ClassVar[Callable[..., list[Child]]]
    # Every component class by its type token (tools/plan_diff finds a child's component from its parent's type).
    BY_TYPE: ClassVar[dict[str, type[Wired]]] = {}
    # Children whose provider is not gpuhost's and recreates them on any change (pulumi-docker's containers), by
    # suffix pattern (fnmatch): what restarts then, in words. gpuhost's own providers say it themselves
    # (Provider.effects); tools/plan_diff reads both for a PR's "Restarts:" line.
    RECREATED: ClassVar[Mapping[str, str]] = {}
    # Inputs of those children that only carry a hash of others (labels that make a change recreate a container).
    RECREATED_DERIVED: ClassVar[tuple[tuple[str, ...], ...]] = ()

    def __init_subclass__(cls, *, type_name: str, children: Callable[..., list[Child]], **kwargs: Any):
        super().__init_subclass__(**kwargs)
        cls.TYPE, cls.CHILDREN = type_name, staticmethod(children)
        Wired.BY_TYPE[type_name] = cls

    def __init__(
        self,
        name: str,
        args: Any,
        opts: Optional[pulumi.ResourceOptions] = None,
        *,
        children: Optional[list[Child]] = None,
    ):
        """`children`: the list ``CHILDREN(name, args)`` already returned for these very args (the stack loader
        builds it to check the fleet before anything is registered); built here when not given."""
        super().__init__(self.TYPE, name, None, opts)
        self.component_name = name
        kids = self.CHILDREN(name, args) if children is None else children
        self.register_outputs(self.wire(args, declare(self, name, kids)))

    def wire(self, args: Any, made: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


class DockerEngine(docker.Provider):
    """pulumi-docker's provider at `spec`'s Docker engine over gpuhost's SSH trust (access/docker_ssh.py): the
    secret key is read from config here, at declaration, so that `children` functions stay pure."""

    def __init__(self, resource_name: str, spec: HostSpec, opts: Optional[pulumi.ResourceOptions] = None):
        from access import docker_ssh

        super().__init__(resource_name, opts=opts, **docker_ssh.provider_args(spec))


def container(
    suffix: str, image: str, inputs: Mapping[str, Any], provider: str, after: tuple[str, ...] = ()
) -> list[Child]:
    """A pinned image (`{suffix}-image`, kept on the host) and the container `suffix` running it, on the Docker
    engine child `provider`."""
    return [
        Child(f"{suffix}-image", docker.RemoteImage, {"name": image, "keep_locally": True}, provider=provider),
        Child(
            suffix, docker.Container, {"image": Ref(f"{suffix}-image", "image_id"), **inputs}, after, provider=provider
        ),
    ]


# -- what a child writes on its host ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Write:
    """One host path a child writes: `machine` is the host input's identity (its fleet name)."""

    machine: str
    path: str
    child: str


def writes(name: str, children: list[Child]) -> list[Write]:
    """The host paths `children` write, per machine: what each one's provider declares (`Provider.writes`)."""
    out: list[Write] = []
    for c in children:
        provider = getattr(c.kind, "PROVIDER", None)
        if not c.dynamic or provider is None or not isinstance(c.inputs.get("host"), Mapping):
            continue
        machine = str(c.inputs["host"].get("name"))
        out += [Write(machine, p, f"{name}-{c.suffix}") for p in provider.writes(dict(c.inputs)) if isinstance(p, str)]
    return out
