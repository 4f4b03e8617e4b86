"""Preview with values not known yet: every provider's check and diff, through the SDK's own provider server.

Under the real engine any input computed from another resource's output is unknown during preview; the SDK hands
the provider the string `UNKNOWN` in its place, at any depth. The inputs here are the ones the program really
declares for the dev and hk-prod stacks (run under mocks), one of each provider type, plus inputs for those the
stacks leave off (every module in providers/ is covered). The providers are real; only the engine is stood in
for by testbed/provider_server.py's server.
"""

from __future__ import annotations

import copy
import inspect

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime.proto import provider_pb2

import providers
from providers.base import HINTS, UNKNOWN, HostProvider, HostResource, Provider, TemplateProvider, unknown_paths
from testbed.mocks import run_program
from testbed.provider_server import ProviderServer, _de, _ser
from testbed.stackfiles import stack_config

# Never diffed: the provider version and the owner tag (who records pristine state on the host).
BOOKKEEPING = ("version", "owner_tag")


def provider_classes() -> dict[str, type[Provider]]:
    import importlib
    import pkgutil

    out = {}
    for m in pkgutil.iter_modules(providers.__path__):
        if m.name == "base":
            continue
        mod = importlib.import_module(f"providers.{m.name}")
        for name, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ != mod.__name__:
                continue
            if issubclass(cls, Provider) and name.endswith("Provider"):
                out[name.removesuffix("Provider")] = cls
            elif issubclass(cls, HostResource):  # a resource type of its own over a shared provider (ServiceState)
                out.setdefault(cls._resource_type_name.rsplit(":", 1)[1], cls.PROVIDER)
    return out


def _not_in_the_stacks(host: dict) -> dict[str, dict]:
    """Inputs for providers neither stack file declares (the stacks leave those features off)."""
    unit = "/etc/systemd/system/gpuhost-adaptive-window.service"
    return {
        "GuestBootstrap": {
            "host": {**host, "name": "tenant-a"},
            "config": {"mps": {"instances": {"triton-a": 60}}},
            "version": "1",
        },
        "SystemdService": {
            "host": host,
            "unit": "gpuhost-adaptive-window.service",
            "files": {unit: "[Service]\nExecStart=/usr/bin/true\n", "/usr/local/lib/gpuhost-aw.py": "print()\n"},
            "version": "1",
        },
    }


class Samples(dict):
    def __repr__(self) -> str:  # hypothesis prints fixtures on failure; the inputs are tens of kB
        return f"<inputs of {len(self)} provider types>"


@pytest.fixture(scope="module")
def samples() -> dict[str, dict]:
    """Resource type name -> the inputs the program declares for one resource of that type."""
    out: dict[str, dict] = Samples()
    for stack in ("dev", "hk-prod"):
        cfg, secret = stack_config(stack)
        for r in run_program(cfg, secret, stack=stack).registrations:
            if r.type.startswith("pulumi-python:dynamic/"):
                out.setdefault(r.type.rsplit(":", 1)[1], {k: v for k, v in r.inputs.items() if k != "__provider"})
    for type_, inputs in _not_in_the_stacks(out["Sysctls"]["host"]).items():
        out.setdefault(type_, inputs)
    return out


@pytest.fixture(scope="module")
def server():
    with ProviderServer(config={}) as srv:
        yield srv


def _set(d, path, value):
    d = copy.deepcopy(d)
    cur = d
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return d


def _paths(v, path=()) -> list[tuple]:
    """Every input and every value nested inside it (dict entries, list items), containers included."""
    out = [path] if path else []
    if isinstance(v, dict):
        for k, x in v.items():
            out += _paths(x, (*path, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out += _paths(x, (*path, i))
    return out


def _preview(server, cls, inputs: dict, olds: dict | None, check: bool = True):
    """The engine's preview of one resource: Check (new or update), then Diff against state when it exists.

    check=False goes straight to Diff: with every value known, some checks read the host (preflight), and the
    stacks' hosts do not exist here.
    """
    prov = serialize_provider(cls())
    urn = f"urn:pulumi:test::gpuhost::pulumi-python:dynamic:{cls.__name__}::x"
    if not check:
        return [], inputs, _diff(server, prov, urn, inputs, olds)
    resp = server.call(
        "Check",
        provider_pb2.CheckRequest(
            urn=urn,
            olds=_ser({**olds, "__provider": prov}) if olds else _ser({}),
            news=_ser({**inputs, "__provider": prov}),
        ),
    )
    failures = [f"{f.property}: {f.reason}" for f in resp.failures]
    checked = {k: v for k, v in _de(resp.inputs).items() if k != "__provider"}
    return failures, checked, _diff(server, prov, urn, checked, olds) if olds else None


def _diff(server, prov: str, urn: str, news: dict, olds: dict | None):
    assert olds is not None
    return server.call(
        "Diff",
        provider_pb2.DiffRequest(
            id="x",
            urn=urn,
            olds=_ser({**olds, "__provider": prov}),
            news=_ser({**news, "__provider": prov}),
            old_inputs=_ser({**olds, "__provider": prov}),
        ),
    )


def test_every_provider_class_has_a_sample(samples):
    assert set(provider_classes()) == set(samples), "a provider without sample inputs escapes the unknowns test"


def _cases(samples) -> list[tuple[str, tuple]]:
    return [(t, p) for t, inputs in sorted(samples.items()) for p in _paths(inputs) if p[0] not in BOOKKEEPING]


def _assert_unknown_safe(server, cls, inputs, unknown_at):
    news = inputs
    for p in unknown_at:
        try:
            news = _set(news, p, UNKNOWN)
        except (KeyError, IndexError, TypeError):
            pass  # an enclosing value is already unknown
    for olds in (None, inputs):
        failures, checked, diff = _preview(server, cls, news, olds)
        assert failures == [], f"{cls.__name__}: unknown at {unknown_at} failed validation: {failures}"
        assert unknown_paths(checked), f"{cls.__name__}: check dropped the unknown at {unknown_at}"
        if diff is not None and any(p[0] not in HINTS for p in unknown_at):
            assert diff.changes == provider_pb2.DiffResponse.DIFF_SOME, f"{cls.__name__}: unknown read as no change"
        elif diff is not None:
            # What preflight read (a hint, unknown in every preview of a first `up`) is never a reason to change.
            assert diff.changes != provider_pb2.DiffResponse.DIFF_SOME, f"{cls.__name__}: a hint read as a change"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_unknown_input_neither_raises_nor_fails_check_or_diff(samples, server, data):
    classes = provider_classes()
    type_ = data.draw(st.sampled_from(sorted(samples)), label="type")
    paths = [p for p in _paths(samples[type_]) if p[0] not in BOOKKEEPING]
    chosen = data.draw(st.lists(st.sampled_from(paths), min_size=1, max_size=3, unique=True), label="unknown at")
    _assert_unknown_safe(server, classes[type_], samples[type_], sorted(chosen, key=len))


def test_every_single_input_unknown_sweep(samples, server):
    """The same property for each input path one at a time, so no path is left to chance."""
    classes = provider_classes()
    cases = _cases(samples)
    assert len(cases) > 200
    for type_, path in cases:
        _assert_unknown_safe(server, classes[type_], samples[type_], [path])


@pytest.mark.parametrize(
    "change,replaced",
    [
        (lambda h: {**h, "port": 2200}, False),
        (lambda h: {**h, "user": "deploy"}, False),
        (lambda h: {**h, "connect_timeout": 30.0, "command_timeout": 1800.0}, False),
        (lambda h: {**h, "host_key": "SHA256:" + "A" * 43}, False),
        (lambda h: {**h, "jump": {"address": "10.0.0.9", "insecure_accept_unknown_host_key": True}}, False),
        (lambda h: {**h, "name": h["name"] + "-other"}, True),
    ],
    ids=["port", "user", "timeouts", "host-key", "jump", "identity"],
)
def test_host_connection_details_update_identity_replaces(samples, server, change, replaced):
    for type_, cls in sorted(provider_classes().items()):
        if not issubclass(cls, HostProvider):
            continue
        olds = samples[type_]
        news = {**olds, "host": change(olds["host"])}
        failures, _, diff = _preview(server, cls, news, olds, check=False)
        assert not failures, (type_, failures)
        assert diff.changes == provider_pb2.DiffResponse.DIFF_SOME, type_
        assert ("host" in diff.replaces) == (replaced and "host" in cls.REPLACE_ON), (type_, list(diff.replaces))


def test_base_module_has_no_provider(samples):
    assert not [c for c in vars(providers).values() if inspect.isclass(c)]


def test_every_input_a_template_provider_is_given_is_declared(samples):
    """The template diffs only INPUTS: an input the program passes but the provider does not declare would never
    count as a change."""
    for type_, cls in sorted(provider_classes().items()):
        if issubclass(cls, TemplateProvider):
            # Hints (what preflight read, for the first change) are declared in providers.base, never diffed.
            extra = set(samples[type_]) - set(cls.INPUTS) - set(cls.OUTPUT_ONLY) - set(BOOKKEEPING) - set(HINTS)
            assert not extra, f"{type_}: inputs never diffed: {sorted(extra)}"
