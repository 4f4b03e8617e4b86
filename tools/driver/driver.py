"""The driver: preview, up, refresh and destroy of one stack (see tools/driver/engine.py for the semantics)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any, TextIO

import grpc
from pulumi.runtime.proto import (
    engine_pb2_grpc,
    provider_pb2,
    resource_pb2_grpc,
)

from tools.driver.config import StackConfig
from tools.driver.deployment import BuiltinError, Deployment
from tools.driver.monitor import Engine, Monitor
from tools.driver.provider import DiffResult, DynamicProvider, ProviderError, project_python
from tools.driver.state import Resource
from tools.driver.steps import Outcome, Step
from tools.driver.values import (
    ROOT,
    STACK_REFERENCE,
    STACK_TYPE,
    differs,
    has_secret,
    seal_secrets,
    unseal_secrets,
    user_props,
)

# ---- the driver -------------------------------------------------------------------------------------------------


class Driver:
    """Runs the project's program and executes its steps with the engine's semantics (see the module docstring).

    Args:
        root: project root (Pulumi.yaml, __main__.py, .venv).
        stack: stack name; config from Pulumi.<stack>.yaml unless `config` is given.
        passphrase: the stack's secrets passphrase (default: PULUMI_CONFIG_PASSPHRASE).
        state: state file (default <root>/.pulumi-state/driver/<stack>.json).
        out: where the progress and the outcome go (None: silent).
        parallel: the program's parallelism (the CLI's --parallel).
        continue_on_error: the CLI's `up --continue-on-error`: a failed step skips only its dependents.
    """

    def __init__(
        self,
        root: Path = ROOT,
        stack: str = "dev",
        *,
        passphrase: str | None = None,
        config: StackConfig | None = None,
        state: Path | None = None,
        out: TextIO | None = sys.stdout,
        parallel: int = 16,
        project: str = "gpuhost",
        continue_on_error: bool = False,
    ):
        self.root = Path(root)
        self.stack = stack
        self.project = project
        self.passphrase = passphrase or os.environ.get("PULUMI_CONFIG_PASSPHRASE")
        self._config = config
        self.state_path = Path(state) if state else self.root / ".pulumi-state" / "driver" / f"{stack}.json"
        self.out = out
        self.parallel = parallel
        self.continue_on_error = continue_on_error
        self.logs: list[str] = []
        self._lock = threading.RLock()
        self._ciphers: dict[str, Any] = {}

    # -- state file --------------------------------------------------------------------------------------------
    def config(self) -> StackConfig:
        if self._config is None:
            self._config = StackConfig.load(self.root, self.stack, self.passphrase, self.project)
        return self._config

    def load_state(self) -> dict:
        if self.state_path.exists():
            return json.loads(self.state_path.read_text())
        return {"version": 1, "stack": self.stack, "config": None, "resources": []}

    def resources(self) -> list[Resource]:
        return self._decode(self.load_state())

    def _cipher(self, salt: str | None = None) -> Any:
        """The stack's secrets cipher (PBKDF2 from the passphrase: made once per salt). Without a salt: the one of
        the state's stored config, or a new one that the next save stores."""
        from pulumi_crypto import PassphraseCipher

        if not self.passphrase:
            raise SystemExit("the state has secrets: set PULUMI_CONFIG_PASSPHRASE")
        if salt is None and self.state_path.exists():
            salt = (self.load_state().get("config") or {}).get("encryptionsalt")
        key = salt or ""
        with self._lock:
            if key not in self._ciphers:
                c = PassphraseCipher(self.passphrase, salt_state=salt) if salt else PassphraseCipher(self.passphrase)
                self._ciphers[key] = self._ciphers[c.salt_state] = c
            return self._ciphers[key]

    def _decode(self, doc: dict) -> list[Resource]:
        salt = (doc.get("config") or {}).get("encryptionsalt")

        def decrypt(text: str) -> str:
            return self._cipher(salt).decrypt(text)

        out = []
        for r in doc["resources"]:
            res = Resource.from_json(r)
            res.inputs, res.outputs = unseal_secrets(res.inputs, decrypt), unseal_secrets(res.outputs, decrypt)
            out.append(res)
        return out

    def _save(self, resources: list[Resource], config: dict | None) -> None:
        # Secret values are kept encrypted with the stack's key, as in the engine's checkpoint; never in plaintext.
        salt = (config or {}).get("encryptionsalt")

        def encrypt(text: str) -> str:
            return self._cipher(salt).encrypt(text)

        docs = []
        for r in resources:
            d = r.to_json()
            d["inputs"], d["outputs"] = seal_secrets(r.inputs, encrypt), seal_secrets(r.outputs, encrypt)
            docs.append(d)
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {"version": 1, "stack": self.stack, "config": config, "resources": docs}, indent=1, sort_keys=True
            )
        )
        tmp.replace(self.state_path)

    def _stored_config(self) -> StackConfig:
        doc = self.load_state().get("config")
        if not doc:
            return self.config()
        if not self.passphrase:
            raise SystemExit("the state's config has secrets: set PULUMI_CONFIG_PASSPHRASE")
        return StackConfig.unseal(doc, self.passphrase)

    # -- the builtin provider's backend (pkg/resource/deploy/builtins.go, pkg/backend/backend.go backendClient) --
    def _other_stack(self, name: str) -> list[Resource]:
        # A stack reference names `org/project/stack` or `stack`; the driver's stacks are state files side by side.
        stack = str(name).rsplit("/", 1)[-1]
        path = self.state_path.with_name(f"{stack}.json")
        if not path.exists():
            raise BuiltinError(f'unknown stack "{name}"')
        return self._decode(json.loads(path.read_text()))

    def read_stack_reference(self, inputs: dict) -> dict:
        """builtins.go readStackReference: the stack's outputs, and the names of those that are secret."""
        name = inputs.get("name")
        if not isinstance(name, str):
            raise BuiltinError('property "name" must be a string')
        root = next((r for r in self._other_stack(name) if r.type == STACK_TYPE), None)
        outputs = dict(root.outputs) if root else {}
        return {
            "name": name,
            "outputs": outputs,
            "secretOutputNames": sorted(k for k, v in outputs.items() if has_secret(v)),
        }

    def read_stack_resource_outputs(self, args: dict) -> dict:
        """builtins.go readStackResourceOutputs: every resource of the stack, by URN, with its type and outputs."""
        name = args.get("stackName")
        if not isinstance(name, str):
            raise BuiltinError("expected 'stackName' to be a string")
        return {
            "name": name,
            "outputs": {r.urn: {"type": r.type, "outputs": r.outputs} for r in self._other_stack(name)},
        }

    def emit(self, line: str) -> None:
        if self.out is not None:
            with self._lock:
                print(line, file=self.out, flush=True)

    def plugin_line(self, line: str) -> None:
        """A line the provider process wrote to stderr (a progress line of a long step, a warning), shown as it
        arrives as the engine shows it: an info message of the stack (plugin.go runtrace, Diag.Infoerrf with no
        URN, which the display attaches to the stack's row). Without a display it goes to the driver's stderr."""
        with self._lock:
            self.logs.append(f"info: {line}")
        if self.out is None:
            print(line, file=sys.stderr, flush=True)
        else:
            self.emit(f"     {STACK_TYPE}  {self.project}-{self.stack}  {line}")

    # -- operations --------------------------------------------------------------------------------------------
    def preview(self) -> Outcome:
        return self._run_program(dry_run=True)

    def up(self) -> Outcome:
        return self._run_program(dry_run=False)

    def refresh(self) -> Outcome:
        """pkg/resource/deploy/step.go RefreshStep.Apply: Read(id, old inputs, old outputs); an empty id means the
        resource is gone (dropped from state); returned inputs replace the stored ones. The drift shown is what the
        provider's Diff says between the refreshed outputs and the (refreshed) inputs, as `pulumi refresh --diff`."""
        t0 = time.monotonic()
        outcome = Outcome("refresh")
        self.emit(f"Refreshing ({self.stack}):")
        resources = self.resources()
        cfg = self._stored_config()
        prov = DynamicProvider(self.root, self.project, cfg, self.plugin_line).start()
        try:
            by_urn = {r.urn: r for r in resources}

            def one(r: Resource) -> None:
                if not r.custom:
                    return
                t = time.monotonic()
                ins: dict | None
                if r.type == STACK_REFERENCE:  # the engine's builtin provider, not the dynamic one
                    id_, outs, ins = r.id, self.read_stack_reference(r.inputs), r.inputs
                else:
                    id_, outs, ins = prov.read(r.urn, r.id, r.outputs, r.inputs)
                with self._lock:
                    if not id_:
                        by_urn.pop(r.urn, None)
                        outcome.steps.append(Step("delete", r.urn, r.type, old=r.inputs, seconds=time.monotonic() - t))
                        return
                old_outputs, old_inputs = r.outputs, r.inputs
                r.id, r.outputs = id_, outs
                if ins is not None:
                    r.inputs = ins
                # step.go RefreshStep.Apply: Diff with the refreshed inputs/outputs as the olds and the old inputs as
                # the news, then inverted for display: what the host changed, relative to what the stack wants.
                if r.external:
                    # step.go RefreshStep.Apply: an external resource (a read, a stack reference) is not diffed
                    # against a desired state; what changed is its outputs (and inputs), compared as they are.
                    d = DiffResult(provider_pb2.DiffResponse.DIFF_UNKNOWN, [], False)
                else:
                    d = prov.diff(r.urn, r.id, r.outputs, r.inputs, old_inputs)
                drift = d.changes == provider_pb2.DiffResponse.DIFF_SOME
                keys = sorted(
                    k
                    for k in set(user_props(r.inputs)) | set(user_props(old_inputs))
                    if differs(r.inputs.get(k), old_inputs.get(k))
                )
                if d.changes == provider_pb2.DiffResponse.DIFF_UNKNOWN:
                    drift = bool(keys)
                if not keys:
                    keys = sorted(
                        k
                        for k in set(user_props(outs)) | set(user_props(old_outputs))
                        if differs(outs.get(k), old_outputs.get(k))
                    )
                    drift = drift or (r.external and bool(keys))
                st = Step(
                    "refresh" if drift else "read",
                    r.urn,
                    r.type,
                    old=old_inputs,
                    new=r.inputs,
                    keys=keys,
                    seconds=time.monotonic() - t,
                )
                with self._lock:
                    outcome.steps.append(st)

            self._parallel([r for r in resources if r.custom], one, outcome)
            self._save([r for r in resources if r.urn in by_urn], self.load_state().get("config"))
        finally:
            prov.stop()
        outcome.seconds = time.monotonic() - t0
        self.emit(outcome.render())
        return outcome

    def destroy(self) -> Outcome:
        """Delete every resource, dependents before what they depend on, independent ones in parallel
        (pkg/resource/deploy/deployment_executor.go with the step executor's parallel chains; the dependency graph
        of pkg/resource/graph)."""
        t0 = time.monotonic()
        outcome = Outcome("destroy")
        self.emit(f"Destroying ({self.stack}):")
        resources = self.resources()
        state_cfg = self.load_state().get("config")
        prov = DynamicProvider(self.root, self.project, self._stored_config(), self.plugin_line).start()
        try:
            remaining = {id(r) for r in resources}

            def done(r: Resource) -> None:
                with self._lock:
                    remaining.discard(id(r))
                    self._save([x for x in resources if id(x) in remaining], state_cfg)

            self._delete_all(resources, prov, outcome, done)
        finally:
            prov.stop()
        outcome.seconds = time.monotonic() - t0
        self.emit(outcome.render())
        return outcome

    # -- deletes in reverse dependency order, in parallel ------------------------------------------------------
    def _delete_all(
        self, resources: list[Resource], prov: DynamicProvider, outcome: Outcome, done: Callable[[Resource], None]
    ) -> None:
        # Keyed by position: a resource pending deletion (the old half of a replacement) shares its URN with the
        # live one. r may go once nothing left depends on it (dependencies, property dependencies or parent).
        at: dict[str, list[int]] = {}
        for i, r in enumerate(resources):
            at.setdefault(r.urn, []).append(i)
        dependents: dict[int, set[int]] = {i: set() for i in range(len(resources))}
        for i, r in enumerate(resources):
            for d in set(r.dependencies) | {r.parent} | {x for v in r.property_dependencies.values() for x in v}:
                for j in at.get(d, []):
                    if d != r.urn:
                        dependents[j].add(i)
        cond = threading.Condition()
        failed: list[str] = []
        pending = set(range(len(resources)))
        running: set[int] = set()

        def work(i: int) -> None:
            r = resources[i]
            t = time.monotonic()
            err = None
            try:
                # step.go DeleteStep.Apply: an external resource (read, not managed) only leaves the state.
                if r.custom and r.id and not r.external and not r.type.startswith("pulumi:"):
                    prov.delete(r.urn, r.id, r.outputs, r.inputs)
            except ProviderError as e:
                err = str(e)
            st = Step("delete", r.urn, r.type, old=r.inputs, seconds=time.monotonic() - t, error=err)
            with cond:
                outcome.steps.append(st)
                running.discard(i)
                if err:
                    failed.append(err)
                    outcome.errors.append(err)
                else:
                    pending.discard(i)
                    done(r)
                cond.notify_all()
            if r.custom:
                self.emit(f"  -  {r.type}  {r.name}  deleted" + (f": {err}" if err else f" ({st.seconds:.1f}s)"))

        with futures.ThreadPoolExecutor(max_workers=self.parallel) as pool:
            with cond:
                while pending and not failed:
                    ready = [u for u in pending if u not in running and not (dependents[u] & pending)]
                    for u in ready:
                        running.add(u)
                        pool.submit(work, u)
                    if not running:
                        break
                    cond.wait()
                while running:
                    cond.wait()

    def _parallel(self, items: list, fn: Callable[[Any], None], outcome: Outcome) -> None:
        with futures.ThreadPoolExecutor(max_workers=self.parallel) as pool:
            for f in [pool.submit(fn, x) for x in items]:
                try:
                    f.result()
                except (ProviderError, BuiltinError) as e:
                    outcome.errors.append(str(e))

    # -- preview / up: run the program against our resource monitor -------------------------------------------
    def _run_program(self, dry_run: bool) -> Outcome:
        t0 = time.monotonic()
        outcome = Outcome("preview" if dry_run else "update")
        self.emit(f"{'Previewing update' if dry_run else 'Updating'} ({self.stack}):")
        cfg = self.config()
        stored = self.resources()
        old = {r.urn: r for r in stored if not r.pending_delete}
        prov = DynamicProvider(self.root, self.project, cfg, self.plugin_line).start()
        dep = Deployment(self, outcome, old, prov, dry_run)
        dep.pending_deletes = [r for r in stored if r.pending_delete]
        dep.prior_pending = {id(r) for r in dep.pending_deletes}
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=256))
        resource_pb2_grpc.add_ResourceMonitorServicer_to_server(Monitor(dep), server)
        engine_pb2_grpc.add_EngineServicer_to_server(Engine(dep), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env.update(
                PULUMI_CONFIG=json.dumps(cfg.values),
                PULUMI_CONFIG_SECRET_KEYS=json.dumps(cfg.secret_keys),
                PULUMI_PROJECT=self.project,
                PULUMI_STACK=self.stack,
                PULUMI_DRY_RUN=str(dry_run).lower(),
            )
            addr = f"127.0.0.1:{port}"
            cmd = [
                project_python(self.root),
                "-u",
                str(Path(__file__).with_name("langhost.py")),
                "--monitor",
                addr,
                "--engine",
                addr,
                "--project",
                self.project,
                "--stack",
                self.stack,
                "--parallel",
                str(self.parallel),
                "--dry_run",
                str(dry_run).lower(),
                "--root_directory",
                str(self.root),
                ".",
            ]
            p = subprocess.run(cmd, cwd=self.root, env=env, capture_output=True, text=True, check=False)
            if p.returncode != 0 and not outcome.errors:
                outcome.errors.append(f"the program failed (exit {p.returncode}):\n{(p.stderr or p.stdout)[-4000:]}")
            elif p.returncode != 0 and self.out is not None:
                tail = "\n".join(ln for ln in (p.stderr or "").splitlines()[-8:])
                self.emit(f"  program: {tail}")
            # deletes of what the program no longer declares, and replaced resources' old halves; with
            # continue-on-error they run after failed steps too (deployment_executor.go performPostSteps)
            if not outcome.errors or (self.continue_on_error and p.returncode == 0 and not dep.failed):
                dep.finish()
        finally:
            server.stop(0)
            prov.stop()
        if not dry_run:
            dep.save()
        outcome.outputs = dep.stack_outputs
        outcome.seconds = time.monotonic() - t0
        self.emit(outcome.render())
        return outcome
