"""testbed/mocks.py's lean runtime swaps SDK functions for cheaper ones that must answer exactly as the SDK's do; each
stand-in is compared here with the SDK function it replaces, on inputs where the answers differ from each other,
and the SDK's own functions are back once a run ends."""

from __future__ import annotations

import importlib
import pkgutil

import pulumi
import pulumi._types as sdk_types
import pulumi.dynamic.dynamic as sdk_dynamic
import pytest
from pulumi.output import UNKNOWN
from pulumi.runtime import resource_cycle_breaker as sdk_cycles
from pulumi.runtime import rpc
from pulumi.runtime._serialization import _serialize

import providers
import providers.base
from testbed import mocks

shared: list = [1, 2]
UNKNOWN_CASES = [
    1,
    "x",
    None,
    UNKNOWN,
    [],
    {},
    [1, [2, {"a": UNKNOWN}]],
    {"a": {"b": [1, 2]}},
    {"a": shared, "b": shared},  # the same list twice: seen once
    [{"k": (UNKNOWN,)}],  # inside a tuple the SDK does not look
    {"x": [None, {"y": UNKNOWN}]},
]


@pytest.mark.parametrize("value", UNKNOWN_CASES, ids=repr)
def test_contains_unknowns_answers_as_the_sdk(value):
    assert mocks._contains_unknowns(value) is mocks._SDK["contains_unknowns"](value)


def test_contains_unknowns_cases_are_not_all_the_same_answer():
    answers = {mocks._SDK["contains_unknowns"](v) for v in UNKNOWN_CASES}
    assert answers == {True, False}


class _Node:
    """Stands for a resource in the cycle breaker's graph (it reads one attribute of each)."""

    def __init__(self, name: str):
        self.name = name


def test_reachable_answers_as_the_sdk_on_every_pair():
    n = {k: _Node(k) for k in "abcdefg"}
    edges = [("a", "b"), ("b", "c"), ("c", "d"), ("a", "e"), ("e", "d"), ("f", "g"), ("d", "b")]
    for src, dst in edges:
        sdk_cycles._add_dep(n[src], n[dst])  # type: ignore[arg-type]
    answers = []
    for x in n.values():
        for y in n.values():
            got = mocks._reachable(x, y)
            assert got is mocks._SDK["_reachable"](x, y), (x.name, y.name)
            answers.append(got)
    assert True in answers and False in answers


def _provider_classes() -> list[type]:
    for m in pkgutil.iter_modules(providers.__path__):
        importlib.import_module(f"providers.{m.name}")
    out, todo = [], [providers.base.Provider]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("providers."):
            out.append(cls)
    return sorted(out, key=lambda c: c.__qualname__)


def test_a_stateless_providers_pickle_is_the_sdks_and_each_class_its_own():
    classes = _provider_classes()
    assert len(classes) >= 20
    mocks._provider_bytes.clear()
    texts = {}
    for cls in classes:
        sdk_text, _ = _serialize(True, mocks._SDK["serialize_provider"], cls())
        first, _ = _serialize(True, mocks._memo_serialize_provider, cls())
        again, _ = _serialize(True, mocks._memo_serialize_provider, cls())
        assert first == again == sdk_text, cls
        texts[cls] = sdk_text
    assert len(set(texts.values())) == len(classes)


def test_a_provider_with_state_is_pickled_every_time():
    p = providers.base.Provider()
    p.note = "one"  # type: ignore[attr-defined]
    first, _ = _serialize(True, mocks._memo_serialize_provider, p)
    p.note = "two"  # type: ignore[attr-defined]
    second, _ = _serialize(True, mocks._memo_serialize_provider, p)
    assert first != second
    assert second == _serialize(True, mocks._SDK["serialize_provider"], p)[0]


def test_once_per_type_answers_as_the_sdk():
    from pulumi_docker import Container, RemoteImage

    for cls in (Container, RemoteImage, pulumi.CustomResource):
        assert mocks._once_per_type(mocks._SDK["resource_types"])(cls) == mocks._SDK["resource_types"](cls)
    once = mocks._once_per_type(mocks._SDK["unwrap_type"])
    for t in (pulumi.Output[int], pulumi.Input[str], int, list[int]):  # type: ignore[misc]
        assert once(t) == once(t) == mocks._SDK["unwrap_type"](t)


def test_the_sdks_functions_are_back_after_a_run():
    with mocks.lean_runtime():
        assert rpc.contains_unknowns is mocks._contains_unknowns
        assert pulumi.Output._track is mocks._track
    for module, name, _ in mocks._SHORTCUTS:
        assert getattr(module, name) is mocks._SDK[name], name
    assert sdk_types.resource_types is mocks._SDK["resource_types"]
    assert sdk_dynamic.serialize_provider is mocks._SDK["serialize_provider"]


def _settled(transfer, resolve_args: tuple) -> tuple:
    """What an Output made by `transfer` holds after its resolver is called with `resolve_args`: (value, known,
    secret, dependency names) or the error's text. On a thread of its own, whose event loop it may set and close
    (this thread's loop is the one the mocks' programs run on)."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(_settled_here, transfer, resolve_args).result()


def _settled_here(transfer, resolve_args: tuple) -> tuple:
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        res = pulumi.CustomResource.__new__(pulumi.CustomResource)
        res._name = "r"  # type: ignore[attr-defined]
        dep = _Node("dep")
        resolvers = transfer(res, {"urn": None, "id": None, "size": None}, True)
        assert sorted(resolvers) == ["size"]
        value, known, secret, failed = resolve_args
        resolvers["size"](value, known, secret, {dep}, failed)

        async def read():
            data = await res.size._data  # type: ignore[attr-defined]
            names = sorted("self" if d is res else d.name for d in data.resources)
            return data.value, data.is_known, data.is_secret, names

        try:
            return loop.run_until_complete(read())
        except RuntimeError as e:
            return ("error", str(e))
    finally:
        asyncio.set_event_loop(None)
        loop.close()


@pytest.mark.parametrize(
    "resolve_args",
    [
        (3, True, False, None),
        ({"a": UNKNOWN}, True, True, None),
        (None, False, False, None),
        (0, True, False, RuntimeError("x")),
    ],
    ids=["known", "unknown-inside-secret", "not-known", "failed"],
)
def test_transfer_properties_settles_as_the_sdk(resolve_args):
    got = _settled(mocks._transfer_properties, resolve_args)
    assert got == _settled(mocks._SDK["transfer_properties"], resolve_args)
    assert got != _settled(mocks._SDK["transfer_properties"], (4, True, False, None))
