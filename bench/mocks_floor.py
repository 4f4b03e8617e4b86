"""What the Pulumi SDK's mock runtime costs by itself, beside the 100-host program's figure (bench.run's pure phase).

Two programs, run by the same harness (testbed.mocks.run_program) as the real one:

- `trivial_body(n, components)`: `n` resources, `components` of them components and the rest custom resources of
  one input each under them: the runtime's cost per resource, whatever a program does.
- `replay_body(recording, outputs)`: the program's own registrations declared again from plain values (same types,
  names, parents, dependencies, inputs, secret inputs and outputs, and the same output properties per resource):
  what any program that registers exactly these resources costs. The program's figure minus this one is the cost
  of gpuhost's own code (config checks, plans, wiring, Output plumbing).

Usage::

    rec, outputs = record_with_outputs(cfg, secret, stack="bench-100")
    run_program(cfg, secret, stack="bench-100", body=replay_body(rec, outputs))
"""

from __future__ import annotations

from typing import Any, Callable
from unittest import mock

import pulumi

import testbed.mocks as tm

Outputs = dict[tuple[str, str], list[str]]


def trivial_body(n: int, components: int) -> Callable[[], dict]:
    def body() -> dict:
        parents = [pulumi.ComponentResource("bench:floor:Component", f"c{i}", None) for i in range(components)]
        for i in range(n - components):
            pulumi.CustomResource(
                "bench:floor:Plain", f"r{i}", {"v": i}, pulumi.ResourceOptions(parent=parents[i % components])
            )
        return {}

    return body


def record_with_outputs(config: dict, secret_keys: list[str], stack: str) -> tuple[tm.Recording, Outputs]:
    """The program's recording, and each resource's output property names ((type, name) → names): those a
    resource class declares beyond its inputs (pulumi-docker's Container has 78, gpuhost's output-only ones)."""
    outputs: Outputs = {}
    sdk = tm._transfer_properties

    def noting(res: Any, props: dict, custom: bool) -> Any:
        outputs[(res._type, res._name)] = list(props)
        return sdk(res, props, custom)

    shortcuts = tuple((m, n, noting if f is sdk else f) for m, n, f in tm._SHORTCUTS)
    with mock.patch.object(tm, "_SHORTCUTS", shortcuts):
        rec = tm.run_program(config, secret_keys, stack=stack)
    return rec, outputs


def replay_body(rec: tm.Recording, outputs: Outputs) -> Callable[[], dict]:
    def body() -> dict:
        made: dict[str, pulumi.Resource] = {}
        for r in rec.registrations:
            deps = [made[d] for d in dict.fromkeys(r.dependencies) if d in made and d != r.parent]
            opts = pulumi.ResourceOptions(
                parent=made.get(r.parent),
                depends_on=deps or None,
                additional_secret_outputs=r.secret_outputs or None,
            )
            if not r.custom:
                made[r.urn] = pulumi.ComponentResource(r.type, r.name, None, opts)
                continue
            props: dict[str, Any] = dict.fromkeys(outputs.get((r.type, r.name), ()))
            props.update({k: pulumi.Output.secret(v) if k in r.secret_inputs else v for k, v in r.inputs.items()})
            made[r.urn] = pulumi.CustomResource(r.type, r.name, props, opts)
        return {}

    return body
