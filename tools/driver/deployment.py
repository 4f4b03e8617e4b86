"""One deployment: registrations from the program turned into steps, run as soon as their dependencies are done."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional, Protocol

from pulumi.runtime.proto import (
    provider_pb2,
    resource_pb2,
)

from tools.driver.config import StackConfig
from tools.driver.provider import DynamicProvider, ProviderError
from tools.driver.state import Resource
from tools.driver.steps import SYMBOLS, Outcome, Step
from tools.driver.values import (
    STACK_REFERENCE,
    STACK_TYPE,
    UNKNOWN,
    differs,
    mark_secret,
    plain,
    to_py,
    to_struct,
    user_props,
)


class Driver(Protocol):
    """What a deployment uses of the driver that builds it (tools.driver.driver.Driver): the stack's names and
    config, its output and program logs, the state file, stack references and the delete order. A protocol, so this module imports
    nothing of the driver's."""

    stack: str
    project: str
    passphrase: Optional[str]
    continue_on_error: bool
    parallel: int
    logs: list[str]

    def config(self) -> StackConfig: ...

    def emit(self, line: str) -> None: ...

    def _cipher(self, salt: str | None = None) -> Any: ...

    def _save(self, resources: list[Resource], config: dict | None) -> None: ...

    def read_stack_reference(self, inputs: dict) -> dict: ...

    def read_stack_resource_outputs(self, args: dict) -> dict: ...

    def _delete_all(
        self, resources: list[Resource], prov: DynamicProvider, outcome: Outcome, done: Callable[[Resource], None]
    ) -> None: ...


class Deployment:
    """One preview or up: the step generator and executor for registrations coming from the program.

    The program registers a resource only once its inputs are resolved (and, through the SDK's dependency
    handling, once its depends_on resources are registered, which here means their steps are done): so executing
    each step inside its RegisterResource call runs every step as soon as its dependencies are done, as many in
    parallel as the program allows, at most ``parallel`` at once (pkg/resource/deploy/step_executor.go runs chains
    in parallel the same way, on DegreeOfParallelism() workers: the CLI's --parallel).
    """

    def __init__(
        self, driver: Driver, outcome: Outcome, old: dict[str, Resource], prov: DynamicProvider, dry_run: bool
    ):
        self.d, self.outcome, self.old, self.prov, self.dry_run = driver, outcome, old, prov, dry_run
        self.new: dict[str, Resource] = {}
        self.order: list[str] = []
        self.pending_deletes: list[Resource] = []  # old halves of create-before-delete replacements
        self.deleted_for_replace: dict[str, Resource] = {}
        self.stack_outputs: dict = {}
        self.root_urn = ""
        self.lock = threading.RLock()
        self.failed = False
        self.skipped: set[str] = set()  # continue-on-error: URNs whose step failed or was skipped
        self.prior_pending: set[int] = set()  # pending deletes left by an earlier run (by identity)
        self._sealed: dict | None = None
        self.workers = threading.BoundedSemaphore(max(1, driver.parallel))  # the step executor's workers

    # -- urns --------------------------------------------------------------------------------------------------
    def urn(self, parent: str, type_: str, name: str) -> str:
        # sdk/go/common/resource/urn.go NewURN: a child's type is qualified by its parent's, except the Stack's.
        qualified = type_
        if parent and not parent.split("::")[2].endswith(STACK_TYPE):
            qualified = parent.split("::")[2] + "$" + type_
        return f"urn:pulumi:{self.d.stack}::{self.d.project}::{qualified}::{name}"

    # -- the step generator (pkg/resource/deploy/step_generator.go) ---------------------------------------------
    def register(self, req) -> resource_pb2.RegisterResourceResponse:
        urn = self.urn(req.parent, req.type, req.name)
        if self.failed:
            raise StepFailed(f"{req.name}: not started, an earlier step failed")
        self._refuse_unimplemented(req)
        goal = to_py(req.object)
        deps = list(req.dependencies)
        pdeps = {k: list(v.urns) for k, v in req.propertyDependencies.items()}
        if self.d.continue_on_error and self._skip_if_blocked(urn, req, goal, deps, pdeps):
            # The engine answers SKIP; this SDK's proto knows only SUCCESS and FAIL and treats any non-success
            # alike (outputs unknown), so FAIL it is.
            return resource_pb2.RegisterResourceResponse(urn=urn, result=resource_pb2.Result.FAIL)
        if not req.custom:
            return self._register_component(urn, req, goal, deps, pdeps)
        try:
            with self.workers:
                t0 = time.monotonic()
                step, res = self._custom(urn, req, goal, deps, pdeps)
        except ProviderError as e:
            if self._step_failed(urn, req, goal, e):
                return resource_pb2.RegisterResourceResponse(urn=urn, result=resource_pb2.Result.FAIL)
            raise StepFailed(str(e)) from None
        step.seconds = time.monotonic() - t0
        step.started = t0
        mark_secret(res.outputs, list(req.additionalSecretOutputs))
        self._record(urn, req, step, res)
        # Preview: the outputs of a create/update are the checked inputs; properties the provider alone fills in
        # are absent, which the SDK resolves as unknown in a dry run (provider_plugin.go Create/Update with
        # req.Preview when the provider does not support previews; sdk/python/lib/pulumi/runtime/resource.py).
        outs = res.outputs if req.acceptSecrets else plain(res.outputs)
        return resource_pb2.RegisterResourceResponse(urn=urn, id=res.id or "", object=to_struct(outs))

    def _refuse_unimplemented(self, req) -> None:
        """A resource option the driver does not implement fails the run, naming the option."""
        unsupported = unimplemented_options(req)
        if not unsupported:
            return
        with self.lock:
            self.failed = True
            self.outcome.errors.append(
                f"{req.name}: the driver does not implement the resource option(s) {', '.join(unsupported)}; "
                "run this program with the pulumi CLI"
            )
        raise StepFailed(f"{req.name}: unsupported resource options {unsupported}")

    def _skip_if_blocked(self, urn: str, req, goal: dict, deps: list[str], pdeps: dict) -> bool:
        """With continue-on-error: whether the resource is skipped, and its skip recorded and shown.

        deployment_executor.go handleSingleEvent: a step that depends (dependencies, property dependencies,
        parent) on an errored or skipped one is skipped; the SDK resolves its outputs as unknown."""
        with self.lock:
            blocked = sorted(({*deps, req.parent, *(u for v in pdeps.values() for u in v)} - {""}) & self.skipped)
            if blocked:
                self.skipped.add(urn)
                self.outcome.steps.append(
                    Step("skip", urn, req.type, new=goal, keys=[b.rsplit("::", 1)[-1] for b in blocked])
                )
        if blocked:
            self.d.emit(
                f"  ⊘  {req.type}  {req.name}  skipped (depends on {', '.join(b.rsplit('::', 1)[-1] for b in blocked)})"
            )
        return bool(blocked)

    def _register_component(
        self, urn: str, req, goal: dict, deps: list[str], pdeps: dict
    ) -> resource_pb2.RegisterResourceResponse:
        """A component (or the stack): recorded, no provider call, no outputs."""
        res = Resource(urn, req.type, False, req.parent, "", goal, {}, deps, pdeps)
        with self.lock:
            self.new[urn] = res
            self.order.append(urn)
            if req.type == STACK_TYPE:
                self.root_urn = urn
            op = "same" if urn in self.old else "create"
            self.outcome.steps.append(Step(op, urn, req.type, new=goal))
        return resource_pb2.RegisterResourceResponse(urn=urn, object=to_struct({}))

    def _step_failed(self, urn: str, req, goal: dict, e: ProviderError) -> bool:
        """A provider call failed: recorded and shown; whether the run carries on without the resource.

        step_executor.go cancelDueToError: by default the first failed step cancels the run (steps in flight
        finish, none starts); with continue-on-error only its dependents are skipped. A Check or Diff failure
        is the step generator's and always ends the run (deployment_executor.go Execute)."""
        carry_on = self.d.continue_on_error and e.method in ("Create", "Update", "Delete")
        with self.lock:
            if carry_on:
                self.skipped.add(urn)
            else:
                self.failed = True
            self.outcome.errors.append(str(e) + ("\n" + e.details if e.method != "Check" else ""))
            self.outcome.steps.append(
                Step("create" if urn not in self.old else "update", urn, req.type, new=goal, error=str(e))
            )
        self.d.emit(f"  ✗  {req.type}  {req.name}: {e}")
        return carry_on

    def _record(self, urn: str, req, step: Step, res: Resource) -> None:
        """A custom resource's step done: kept in the new state (saved unless previewing) and shown."""
        with self.lock:
            self.new[urn] = res
            self.order.append(urn)
            self.outcome.steps.append(step)
            if not self.dry_run:
                self.save()
        if step.op != "same" and not self.dry_run:
            verb = {"create": "created", "update": "updated", "replace": "replaced"}[step.op]
            self.d.emit(
                f"  {SYMBOLS[step.op]:<2} {req.type}  {req.name}  "
                f"{'(' + step.op + ')' if self.dry_run else verb + f' ({step.seconds:.1f}s)'}"
            )

    def _custom(self, urn: str, req, goal: dict, deps: list[str], pdeps: dict) -> tuple[Step, Resource]:
        old = self.old.get(urn)
        if urn in self.deleted_for_replace:
            old = None
        res = Resource(urn, req.type, True, req.parent, "", {}, {}, deps, pdeps, bool(req.deleteBeforeReplace))
        # Check: olds are the old inputs (empty for a new resource), news the program's goal.
        checked = self.prov.check(urn, old.inputs if old else {}, goal)
        res.inputs = checked
        if old is None:
            op = "replace" if urn in self.deleted_for_replace else "create"
            if self.dry_run:
                res.outputs = {k: v for k, v in checked.items()}
            else:
                res.id, res.outputs = self.prov.create(urn, checked)
            prior = self.deleted_for_replace.get(urn)
            return Step(op, urn, req.type, old=prior.inputs if prior else None, new=checked), res
        d = self.prov.diff(urn, old.id, old.outputs, old.inputs, checked)
        changes = d.changes
        keys: list[str] = []
        if changes == provider_pb2.DiffResponse.DIFF_UNKNOWN:
            # step_generator.go diffResource: an unknown diff is the engine's own comparison of old and new inputs.
            keys = sorted(k for k in set(old.inputs) | set(checked) if differs(old.inputs.get(k), checked.get(k)))
            changes = provider_pb2.DiffResponse.DIFF_SOME if keys else provider_pb2.DiffResponse.DIFF_NONE
        else:
            keys = sorted(
                k
                for k in set(user_props(old.inputs)) | set(user_props(checked))
                if differs(old.inputs.get(k), checked.get(k))
            )
        if changes == provider_pb2.DiffResponse.DIFF_NONE:
            res.id, res.inputs, res.outputs = old.id, old.inputs, old.outputs
            return Step("same", urn, req.type, old=old.inputs, new=checked), res
        if d.replaces:
            dbr = d.delete_before_replace or bool(req.deleteBeforeReplace)
            step = Step("replace", urn, req.type, old=old.inputs, new=checked, keys=keys, replace_keys=d.replaces)
            if self.dry_run:
                res.outputs = dict(checked)
                return step, res
            if dbr:
                # step_generator.go: delete-before-replace first deletes the dependents whose Diff, with the inputs
                # that come from this resource made unknown, says they must be replaced (calculateDependentReplacements).
                for dep in self._dependent_replacements(old):
                    self.prov.delete(dep.urn, dep.id, dep.outputs, dep.inputs)
                    with self.lock:
                        self.deleted_for_replace[dep.urn] = dep
                        self.old.pop(dep.urn, None)
                    self.d.emit(f"  -  {dep.type}  {dep.name}  deleted (replaced with {old.name})")
                self.prov.delete(urn, old.id, old.outputs, old.inputs)
                with self.lock:
                    self.old.pop(urn, None)
                    self.save()
                res.id, res.outputs = self.prov.create(urn, checked)
            else:
                # Create the new one now; the old one is deleted at the end of the run (step_generator.go:
                # create-replacement, then deleteDependentsAndReplace / the executor's final deletes).
                res.id, res.outputs = self.prov.create(urn, checked)
                with self.lock:
                    self.pending_deletes.append(old)
            return step, res
        step = Step("update", urn, req.type, old=old.inputs, new=checked, keys=keys)
        res.id = old.id
        if self.dry_run:
            res.outputs = dict(checked)
        else:
            res.outputs = self.prov.update(urn, old.id, old.outputs, old.inputs, checked)
        return step, res

    def _dependent_replacements(self, root: Resource) -> list[Resource]:
        """step_generator.go calculateDependentReplacements: dependents (transitively) whose inputs that depend on
        a resource being replaced become unknown, and whose Diff then asks for a replacement; deepest first."""
        replace = {root.urn}
        out: list[Resource] = []
        olds = list(self.old.values())
        for r in olds:  # state order is dependency order
            if r.urn == root.urn or not r.custom:
                continue
            touched = False
            inputs = {}
            for k, v in r.inputs.items():
                if any(u in replace for u in r.property_dependencies.get(k, [])):
                    touched, v = True, UNKNOWN
                inputs[k] = v
            if not touched:
                continue
            d = self.prov.diff(r.urn, r.id, r.outputs, r.inputs, inputs)
            if d.replaces:
                replace.add(r.urn)
                out.append(r)
        return list(reversed(out))

    # -- reads and invokes (pkg/resource/deploy/source_eval.go resmon.ReadResource / Invoke) ----------------------
    def read_resource(self, req) -> resource_pb2.ReadResourceResponse:
        """A `get` (ResourceOptions(id=...)) or a StackReference: step_generator.go GenerateReadSteps and
        step.go ReadStep.Apply. Reads run in previews too; an unknown id reads nothing; the provider gets the
        program's properties as both state and inputs; the result is recorded External (never deleted through the
        provider). A managed resource of the same URN with another id is relinquished: deleted at the end of the
        run (the read-replacement step)."""
        urn = self.urn(req.parent, req.type, req.name)
        if self.failed:
            raise StepFailed(f"{req.name}: not started, an earlier step failed")
        if not req.id:
            raise BuiltinError(f"Expected an ID for {urn}")
        props = to_py(req.properties)
        res = Resource(urn, req.type, True, req.parent, req.id, props, {}, list(req.dependencies), external=True)
        t0 = time.monotonic()
        package = req.type.split(":", 1)[0]
        if req.id == UNKNOWN:
            pass
        elif req.type == STACK_REFERENCE:
            unknown = sorted(k for k in props if k != "name")
            if unknown:
                raise BuiltinError(f'unknown property "{unknown[0]}"')
            res.outputs = self.d.read_stack_reference(props)
        elif package == "pulumi":
            raise BuiltinError(f"unrecognized resource type '{req.type}'")
        elif package != "pulumi-python":
            raise BuiltinError(f"the driver runs dynamic providers only, not package '{package}'")
        else:
            # The dynamic provider always answers with properties (at least `__provider`), so the engine's
            # "resource does not exist" (no outputs at all) never fires for it; an empty id keeps the asked one.
            rid, res.outputs, _ = self.prov.read(urn, req.id, props, props)
            res.id = rid or req.id
        mark_secret(res.outputs, list(req.additionalSecretOutputs))
        with self.lock:
            old = self.old.get(urn)
            step = Step("read", urn, req.type, old=old.inputs if old else None, new=props)
            step.seconds, step.started = time.monotonic() - t0, t0
            self.new[urn] = res
            self.order.append(urn)
            self.outcome.steps.append(step)
            if old is not None and not old.external and old.id != res.id:
                self.pending_deletes.append(old)
                self.outcome.steps.append(Step("delete", urn, old.type, old=old.inputs))
            if not self.dry_run:
                self.save()
        outs = res.outputs if req.acceptSecrets else plain(res.outputs)
        return resource_pb2.ReadResourceResponse(urn=urn, id=res.id, properties=to_struct(outs))

    def _unresolved(self, roots: list[str]) -> bool:
        """resourcetracker.Tracker.HasUnresolved: a custom resource without an id yet (a create in a preview), or
        one beneath a component, makes an invoke that depends on it unknown. URNs not registered in this run are
        skipped. (The tracker also waits for registrations in flight beneath a component; the driver does not.)"""
        with self.lock:
            frontier, seen = list(roots), set()
            while frontier:
                u = frontier.pop()
                r = self.new.get(u)
                if r is None or u in seen:
                    continue
                seen.add(u)
                if r.custom:
                    if not r.id:
                        return True
                    continue
                frontier += [x.urn for x in self.new.values() if x.parent == u]
        return False

    def invoke(self, req) -> resource_pb2.ResourceInvokeResponse:
        """The functions of the engine's builtin provider (pkg/resource/deploy/builtins.go Invoke); dynamic
        providers have none. With dependsOn, an invoke whose dependencies are not all created answers unknown."""
        tok = req.tok
        if req.dependsOn and self._unresolved(list(req.dependsOn)):
            return resource_pb2.ResourceInvokeResponse(unknown=True)
        args = to_py(req.args)
        package = tok.split(":", 1)[0]
        if package != "pulumi":
            raise BuiltinError(f"the driver runs dynamic providers only, which have no functions (package '{package}')")
        if tok == "pulumi:pulumi:getResource":
            urn = args.get("urn")
            with self.lock:
                r = self.new.get(urn) if isinstance(urn, str) else None
            if r is None:
                raise BuiltinError(f"unknown resource {urn}")
            out = {"urn": urn, "id": r.id, "provider": "", "state": r.outputs}
        elif tok == "pulumi:pulumi:readStackOutputs":
            out = self.d.read_stack_reference(args)
        elif tok == "pulumi:pulumi:readStackResourceOutputs":
            out = self.d.read_stack_resource_outputs(args)
        else:
            raise BuiltinError(f"unrecognized function name: '{tok}'")
        return resource_pb2.ResourceInvokeResponse(**{"return": to_struct(out)})

    def outputs(self, req) -> None:
        outs = to_py(req.outputs)
        with self.lock:
            if req.urn in self.new:
                self.new[req.urn].outputs = outs
            if req.urn == self.root_urn:
                self.stack_outputs = outs

    # -- end of the run ----------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Resources in the old state the program did not register are deleted (reverse dependency order); so are
        the old halves of create-before-delete replacements. Preview only lists them."""
        # A resource whose step failed or was skipped (continue-on-error) is still declared: it stays.
        gone = [r for u, r in self.old.items() if u not in self.new and u not in self.skipped]
        doomed = gone + self.pending_deletes
        if not doomed:
            return
        if self.dry_run:
            for r in gone + [r for r in self.pending_deletes if id(r) in self.prior_pending]:
                self.outcome.steps.append(Step("delete", r.urn, r.type, old=r.inputs))
            return

        def done(r: Resource) -> None:
            with self.lock:
                if self.old.get(r.urn) is r:
                    self.old.pop(r.urn)
                self.pending_deletes = [x for x in self.pending_deletes if x is not r]
                self.save()

        shown = {r.urn for r in gone} | {r.urn for r in self.pending_deletes if id(r) in self.prior_pending}
        deletes = Outcome("delete")
        self.d._delete_all(doomed, self.prov, deletes, done)
        # Deletes of this run's replaced resources' old halves are part of their replace step, not steps of their own.
        self.outcome.steps += [s for s in deletes.steps if s.urn in shown]
        self.outcome.errors += deletes.errors

    def save(self) -> None:
        with self.lock:
            # Keep what the run did not touch (a failed run keeps the rest of the old state), in dependency order.
            merged: list[Resource] = [self.new[u] for u in self.order]
            seen = set(self.order)
            kept = [r for u, r in self.old.items() if u not in seen] + self.pending_deletes
            for r in self.pending_deletes:
                r.pending_delete = True
            if self._sealed is None and self.d.passphrase:
                # the state's key (PBKDF2: once per run, not per save), shared by the config and the resources
                self._sealed = self.d.config().sealed(self.d.passphrase, self.d._cipher())
            self.d._save(kept + merged if kept else merged, self._sealed)


class StepFailed(Exception):
    pass


def unimplemented_options(req) -> list[str]:
    """Resource options the SDK sends whatever the monitor supports, and the driver does not implement: refused
    rather than silently ignored (a protected or ignore-changes resource would otherwise be updated or deleted)."""
    t = req.customTimeouts
    present = {
        "protect": req.protect,
        "ignoreChanges": list(req.ignoreChanges),
        "replaceOnChanges": list(req.replaceOnChanges),
        "aliases": list(req.aliasURNs) or list(req.aliases),
        "import": req.importId,
        "retainOnDelete": req.retainOnDelete,
        "customTimeouts": bool(t.create or t.update or t.delete),
        "hideDiffs": list(req.hideDiffs),
        "remote": req.remote,
    }
    return [k for k, v in present.items() if v]


class BuiltinError(Exception):
    """An error of the engine's builtin provider (the `pulumi` package: stack references, getResource)."""
