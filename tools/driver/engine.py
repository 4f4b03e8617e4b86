"""A deployment driver with the Pulumi engine's semantics, for running gpuhost stacks where the CLI cannot be had.

It is a conformance driver, not a product engine: users run the real `pulumi` CLI. It exists so that the whole
program (stack config → `__main__.py` → components → dynamic providers) is exercised the way the engine exercises
it: resources registered concurrently, steps run as soon as their dependencies are done, unknowns during preview,
replacements, refresh and destroy order. Everything below is reproduced from the pulumi/pulumi source (read at
github.com/pulumi/pulumi, commit 1b5949891b); each rule cites the file it comes from.

Usage::

    d = Driver(stack="dev", passphrase="gpuhost-dev")          # state: .pulumi-state/driver/dev.json
    plan = d.preview()                                           # prints a `pulumi preview --diff`-like plan
    d.up(); d.refresh(); d.destroy()
    plan.counts()   # {"create": 12, "same": 3, ...}

    python -m tools.driver preview|up|refresh|destroy --stack dev

Processes, as the engine starts them:
- the program: `<project>/.venv/bin/python -u tools/driver/langhost.py ... .` (cwd = project root), config in
  PULUMI_CONFIG (JSON object of namespaced keys, objects as JSON strings) and PULUMI_CONFIG_SECRET_KEYS; it talks
  gRPC to this driver's ResourceMonitor and Engine services (sdk/python/cmd/pulumi-language-python-exec).
- the dynamic provider: `<project>/.venv/bin/python -u -m pulumi.dynamic`, cwd = project root, env
  PULUMI_RUNTIME_VIRTUALENV/TOOLCHAIN, PULUMI_PROJECT, PULUMI_CONFIG (pkg/resource/plugin/provider_plugin.go,
  NewProvider), one process per provider configuration, Configure'd with every stack config key (secrets decrypted
  and marked secret, objects as JSON strings). refresh and destroy configure it from the config stored at the last
  up, as the engine does from the provider's state (pkg/resource/deploy/providers/registry.go).

The resource monitor also answers what the SDK asks besides registrations (source_eval.go): ReadResource (`get`
and StackReference, as external resources), Invoke of the builtin provider's functions (getResource,
readStackOutputs, readStackResourceOutputs; other stacks are the driver's state files side by side),
SupportsFeature/GetDeploymentInfo (yes only to what the driver implements: secrets, resource references). A failed
step cancels the run as the engine's step executor does, or with `continue_on_error` skips only its dependents.
Secret values keep their secret bit through the provider (annotateSecrets, additionalSecretOutputs) and are stored
encrypted with the stack's key. Not reproduced: aliases, protect, ignoreChanges, replaceOnChanges, deletedWith,
transforms, hooks, imports, targets, non-dynamic provider plugins (the SDK refuses what the monitor says it lacks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc
import yaml
from google.protobuf import empty_pb2, json_format, struct_pb2
from pulumi.runtime.proto import (
    engine_pb2,
    engine_pb2_grpc,
    provider_pb2,
    provider_pb2_grpc,
    resource_pb2,
    resource_pb2_grpc,
)

from tools.driver import display

ROOT = Path(__file__).resolve().parents[2]
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # sdk/go/common/resource/plugin/rpc.go UnknownStringValue
SIG = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
PROVIDER_KEY = "__provider"
RESOURCE_SIG = "5cf8f73096256a8f31e491e813e4eb8e"
STACK_TYPE = "pulumi:pulumi:Stack"
STACK_REFERENCE = "pulumi:pulumi:StackReference"
DYNAMIC_PROVIDER = "pulumi:providers:pulumi-python"


# ---- property values (the wire form, as JSON: unknowns are the sentinel string, secrets the signature object) ----


def to_py(s: struct_pb2.Struct | None) -> dict:
    return json_format.MessageToDict(s) if s is not None else {}


def to_struct(d: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(d)
    return s


def is_secret(v: Any) -> bool:
    return isinstance(v, dict) and v.get(SIG) == SECRET_SIG


def plain(v: Any) -> Any:
    """Secrets unwrapped: the dynamic provider answers Configure with acceptSecrets=False, so the engine strips them
    before every provider call (provider_plugin.go: MarshalOptions{KeepSecrets: protocol.acceptSecrets}). It does
    not accept resources either, so a resource reference goes as its id (unknown while a preview has none), a
    component's as its URN (sdk/go/common/resource/plugin/rpc.go MarshalPropertyValue, KeepResources false)."""
    if is_secret(v):
        return plain(v.get("value"))
    if isinstance(v, dict) and v.get(SIG) == RESOURCE_SIG:
        return (v["id"] or UNKNOWN) if "id" in v else v.get("urn", "")
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def has_secret(v: Any) -> bool:
    if is_secret(v):
        return True
    if isinstance(v, dict):
        return any(has_secret(x) for x in v.values())
    if isinstance(v, list):
        return any(has_secret(x) for x in v)
    return False


def annotate_secrets(outs: dict, ins: dict) -> dict:
    """The provider was given plain values (it does not accept secrets), so what comes back under the name of a
    secret input is marked secret again (pkg/resource/plugin/provider_plugin.go annotateSecrets, after Check,
    Create, Read and Update)."""
    for k, i in ins.items():
        if k not in outs:
            continue
        o = outs[k]
        if isinstance(o, dict) and isinstance(i, dict) and not is_secret(o) and not is_secret(i):
            annotate_secrets(o, i)
        elif not is_secret(o) and has_secret(i):
            outs[k] = {SIG: SECRET_SIG, "value": o}
    return outs


def mark_secret(outputs: dict, keys: list[str]) -> None:
    """additionalSecretOutputs: those outputs are made secret once the step is done (step_executor.go; `id` cannot
    be, pulumi/pulumi#2717)."""
    for k in keys:
        if k != "id" and k in outputs and not is_secret(outputs[k]):
            outputs[k] = {SIG: SECRET_SIG, "value": outputs[k]}


def seal_secrets(v: Any, encrypt: Callable[[str], str]) -> Any:
    """State form of a value: a secret's value encrypted, as the engine's checkpoint keeps it (`ciphertext`)."""
    if is_secret(v):
        return {SIG: SECRET_SIG, "ciphertext": encrypt(json.dumps(v.get("value")))}
    if isinstance(v, dict):
        return {k: seal_secrets(x, encrypt) for k, x in v.items()}
    if isinstance(v, list):
        return [seal_secrets(x, encrypt) for x in v]
    return v


def unseal_secrets(v: Any, decrypt: Callable[[str], str]) -> Any:
    if isinstance(v, dict) and v.get(SIG) == SECRET_SIG and "ciphertext" in v:
        return {SIG: SECRET_SIG, "value": json.loads(decrypt(v["ciphertext"]))}
    if isinstance(v, dict):
        return {k: unseal_secrets(x, decrypt) for k, x in v.items()}
    if isinstance(v, list):
        return [unseal_secrets(x, decrypt) for x in v]
    return v


def has_unknown(v: Any) -> bool:
    if v == UNKNOWN:
        return True
    if isinstance(v, dict):
        return any(has_unknown(x) for x in v.values())
    if isinstance(v, list):
        return any(has_unknown(x) for x in v)
    return False


def norm(v: Any) -> Any:
    """Struct numbers are doubles: 64.0 and 64 are one value (comparison and display)."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {k: norm(x) for k, x in v.items()}
    if isinstance(v, list):
        return [norm(x) for x in v]
    return v


def differs(a: Any, b: Any) -> bool:
    """Values compared as the engine's diff does: secrets unwrapped, 64.0 == 64 (step_generator.go
    unwrapResourceSecretsAndOutputs)."""
    return norm(plain(a)) != norm(plain(b))


def user_props(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != PROVIDER_KEY}


# ---- stack config -------------------------------------------------------------------------------------------------


@dataclass
class StackConfig:
    """Namespaced config values as the engine hands them out: strings, objects as JSON strings, secrets decrypted."""

    values: dict[str, str]
    secret_keys: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, root: Path, stack: str, passphrase: str | None, project: str = "gpuhost") -> StackConfig:
        doc = yaml.safe_load((root / f"Pulumi.{stack}.yaml").read_text()) or {}
        cipher = None
        values, secret = {}, []
        for k, v in (doc.get("config") or {}).items():
            key = k if ":" in k else f"{project}:{k}"
            if isinstance(v, dict) and set(v) == {"secure"}:
                if cipher is None:
                    if passphrase is None:
                        raise SystemExit(f"stack {stack} has secrets: set PULUMI_CONFIG_PASSPHRASE")
                    from pulumi_crypto import PassphraseCipher

                    cipher = PassphraseCipher(passphrase, salt_state=doc["encryptionsalt"])
                values[key] = cipher.decrypt(v["secure"])
                secret.append(key)
            else:
                values[key] = v if isinstance(v, str) else json.dumps(v)
        return cls(values, secret)

    def with_values(self, **updates: Any) -> StackConfig:
        """A copy with some keys replaced (`fleet=...` objects are JSON-encoded); for tests and `gpuhost.sh up`."""
        v = dict(self.values)
        for k, x in updates.items():
            key = k if ":" in k else f"gpuhost:{k}"
            v[key] = x if isinstance(x, str) else json.dumps(x)
        return StackConfig(v, list(self.secret_keys))

    def configure_args(self) -> dict:
        # Secrets go out marked secret; the dynamic provider's Configure unwraps them (dynamic/__main__.py).
        return {k: ({SIG: SECRET_SIG, "value": v} if k in self.secret_keys else v) for k, v in self.values.items()}

    def sealed(self, passphrase: str, cipher: Any = None) -> dict:
        """For the state file: secrets encrypted with the stack passphrase, never in plaintext."""
        from pulumi_crypto import PassphraseCipher

        c = cipher or PassphraseCipher(passphrase)
        return {
            "encryptionsalt": c.salt_state,
            "values": {k: ({"secure": c.encrypt(v)} if k in self.secret_keys else v) for k, v in self.values.items()},
        }

    @classmethod
    def unseal(cls, doc: dict, passphrase: str) -> StackConfig:
        from pulumi_crypto import PassphraseCipher

        c = PassphraseCipher(passphrase, salt_state=doc["encryptionsalt"])
        values, secret = {}, []
        for k, v in doc["values"].items():
            if isinstance(v, dict):
                values[k] = c.decrypt(v["secure"])
                secret.append(k)
            else:
                values[k] = v
        return cls(values, secret)


# ---- the dynamic provider process -------------------------------------------------------------------------------


class ProviderError(RuntimeError):
    def __init__(self, method: str, urn: str, details: str):
        self.method, self.urn, self.details = method, urn, details
        last = [ln for ln in details.strip().splitlines() if ln.strip()][-1:] or [details]
        super().__init__(f"{urn.rsplit('::', 1)[-1]}: {method} failed: {last[0]}")


def project_python(root: Path) -> str:
    venv = root / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


class DynamicProvider:
    """`python -u -m pulumi.dynamic` started as the engine starts the pulumi-python provider plugin."""

    def __init__(self, root: Path, project: str, config: StackConfig):
        self.root, self.project, self.config = root, project, config
        self.proc: subprocess.Popen | None = None
        self.stub: Any = None
        self.channel: Any = None

    def start(self) -> DynamicProvider:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(
            PULUMI_PROJECT=self.project,
            PULUMI_RUNTIME_VIRTUALENV=".venv",
            PULUMI_RUNTIME_TOOLCHAIN="pip",
            PULUMI_CONFIG=json.dumps(self.config.values),
        )
        self.proc = subprocess.Popen(
            [project_python(self.root), "-u", "-m", "pulumi.dynamic"],
            cwd=self.root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=None,
        )
        assert self.proc.stdout is not None
        port = int(self.proc.stdout.readline().decode().strip())
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(self.channel).result(timeout=60)
        self.stub = provider_pb2_grpc.ResourceProviderStub(self.channel)
        self.stub.Configure(
            provider_pb2.ConfigureRequest(
                args=to_struct(self.config.configure_args()), acceptSecrets=True, acceptResources=True
            )
        )
        return self

    def stop(self) -> None:
        if self.channel:
            self.channel.close()
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def _call(self, method: str, urn: str, req):
        try:
            return getattr(self.stub, method)(req)
        except grpc.RpcError as e:
            raise ProviderError(method, urn, e.details() or str(e)) from None

    def check(self, urn: str, olds: dict, news: dict) -> dict:
        r = self._call(
            "Check", urn, provider_pb2.CheckRequest(urn=urn, olds=to_struct(plain(olds)), news=to_struct(plain(news)))
        )
        if r.failures:
            raise ProviderError("Check", urn, "\n".join(f"{f.property}: {f.reason}" for f in r.failures))
        return annotate_secrets(to_py(r.inputs), news)

    def diff(self, urn: str, id_: str, old_outputs: dict, old_inputs: dict, news: dict) -> DiffResult:
        r = self._call(
            "Diff",
            urn,
            provider_pb2.DiffRequest(
                id=id_,
                urn=urn,
                olds=to_struct(plain(old_outputs)),
                news=to_struct(plain(news)),
                old_inputs=to_struct(plain(old_inputs)),
            ),
        )
        return DiffResult(r.changes, list(r.replaces), bool(r.deleteBeforeReplace))

    def create(self, urn: str, news: dict) -> tuple[str, dict]:
        r = self._call("Create", urn, provider_pb2.CreateRequest(urn=urn, properties=to_struct(plain(news))))
        return r.id, annotate_secrets(to_py(r.properties), news)

    def update(self, urn: str, id_: str, old_outputs: dict, old_inputs: dict, news: dict) -> dict:
        r = self._call(
            "Update",
            urn,
            provider_pb2.UpdateRequest(
                id=id_,
                urn=urn,
                olds=to_struct(plain(old_outputs)),
                news=to_struct(plain(news)),
                old_inputs=to_struct(plain(old_inputs)),
            ),
        )
        return annotate_secrets(to_py(r.properties), news)

    def delete(self, urn: str, id_: str, outputs: dict, inputs: dict) -> None:
        self._call(
            "Delete",
            urn,
            provider_pb2.DeleteRequest(
                id=id_, urn=urn, properties=to_struct(plain(outputs)), old_inputs=to_struct(plain(inputs))
            ),
        )

    def read(self, urn: str, id_: str, outputs: dict, inputs: dict) -> tuple[str, dict, dict | None]:
        r = self._call(
            "Read",
            urn,
            provider_pb2.ReadRequest(
                id=id_, urn=urn, properties=to_struct(plain(outputs)), inputs=to_struct(plain(inputs))
            ),
        )
        ins = annotate_secrets(to_py(r.inputs), inputs) if r.HasField("inputs") else None
        return r.id, annotate_secrets(to_py(r.properties), outputs), ins


@dataclass
class DiffResult:
    changes: int
    replaces: list[str]
    delete_before_replace: bool


# ---- state ------------------------------------------------------------------------------------------------------


@dataclass
class Resource:
    urn: str
    type: str
    custom: bool
    parent: str = ""
    id: str = ""
    inputs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    dependencies: list[str] = field(default_factory=list)
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    delete_before_replace: bool = False
    # Read with ReadResource (`get`, a StackReference): the engine's External, never deleted through the provider
    external: bool = False
    # The old half of a create-before-delete replacement whose run ended before deleting it: the engine's
    # `Delete: true`, deleted at the end of the next up (step_generator.go GenerateDeletes) or by destroy
    pending_delete: bool = False

    @property
    def name(self) -> str:
        return self.urn.rsplit("::", 1)[-1]

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, d: dict) -> Resource:
        return cls(**d)


# ---- steps and the plan -----------------------------------------------------------------------------------------

SYMBOLS = {
    "create": "+",
    "update": "~",
    "replace": "+-",
    "delete": "-",
    "same": " ",
    "refresh": "~",
    "read": ">",
    "skip": "⊘",
}


@dataclass
class Step:
    op: str
    urn: str
    type: str
    old: dict | None = None  # old inputs (or outputs for refresh)
    new: dict | None = None  # new (checked) inputs
    keys: list[str] = field(default_factory=list)
    replace_keys: list[str] = field(default_factory=list)
    seconds: float = 0.0
    started: float = 0.0
    error: str | None = None

    @property
    def name(self) -> str:
        return self.urn.rsplit("::", 1)[-1]


@dataclass
class Plan:
    kind: str
    steps: list[Step] = field(default_factory=list)
    outputs: dict = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.steps:
            op = "failed" if s.error else s.op
            out[op] = out.get(op, 0) + 1
        return out

    def changes(self) -> int:
        return sum(1 for s in self.steps if s.op not in ("same", "read"))

    def of(self, op: str) -> list[Step]:
        return [s for s in self.steps if s.op == op]

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def render(self) -> str:
        lines = []
        for s in self.steps:
            # up and destroy print each step as it finishes; their summary lists only failures
            # a preview lists what the program reads (`>` in the CLI); a refresh's reads are its no-drift steps
            if s.op == "same" or (s.op == "read" and self.kind != "preview"):
                continue
            if self.kind in ("update", "destroy") and not s.error and s.op != "skip":
                continue
            diff = ""
            if s.keys and s.op in ("update", "replace", "refresh"):
                # the CLI's progress line: `[diff: ~key]`, replacing keys listed the same way
                diff = "  [diff: " + ", ".join(f"~{k}" for k in s.keys) + "]"
            elif s.op == "skip":
                diff = "  (depends on " + ", ".join(s.keys) + ")"
            lines.append(
                f"  {SYMBOLS[s.op]:<2} {s.type}  {s.name}  ({s.op}){diff}"
                + (f"  [{s.seconds:.1f}s]" if s.seconds >= 0.05 and self.kind != "preview" else "")
            )
            lines += self._details(s)
            if s.error:
                lines.append(f"      error: {s.error}")
        c = self.counts()
        lines.append("Resources:")
        done = {
            "create": "created",
            "update": "updated",
            "replace": "replaced",
            "delete": "deleted",
            "refresh": "drifted",
            "skip": "skipped",
        }
        if c.get("failed"):
            lines.append(f"    ✗ {c['failed']} failed")
        for op in ("create", "update", "replace", "delete", "refresh", "skip"):
            if c.get(op):
                lines.append(
                    f"    {SYMBOLS[op]} {c[op]} "
                    + (f"to {op}" if self.kind == "preview" and op != "refresh" else done[op])
                )
        lines.append(f"    {c.get('same', 0) + c.get('read', 0)} unchanged")
        if self.outputs:
            lines.append("Outputs:")
            lines += display.print_object(self.outputs, indent=1)
        for e in self.errors:
            lines.append(f"error: {e}")
        lines.append(f"Duration: {self.seconds:.0f}s")
        return "\n".join(lines)

    def _details(self, s: Step) -> list[str]:
        """The step's properties as `pulumi preview --diff` prints them (pkg/backend/display/object_diff.go
        getResourcePropertiesDetails): a create's new inputs, a delete's old ones, otherwise the old/new diff."""
        old, new = s.old or {}, s.new or {}
        if s.op == "create":
            return display.print_object(new, indent=2)
        if s.op == "delete":
            return display.print_object(old, indent=2)
        if s.op in ("update", "replace", "refresh"):
            return display.print_object_diff(old, new, indent=2)
        return []


# ---- the driver -------------------------------------------------------------------------------------------------


class Driver:
    """Runs the project's program and executes its steps with the engine's semantics (see the module docstring).

    Args:
        root: project root (Pulumi.yaml, __main__.py, .venv).
        stack: stack name; config from Pulumi.<stack>.yaml unless `config` is given.
        passphrase: the stack's secrets passphrase (default: PULUMI_CONFIG_PASSPHRASE).
        state: state file (default <root>/.pulumi-state/driver/<stack>.json).
        out: where the plan and progress go (None: silent).
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

    # -- operations --------------------------------------------------------------------------------------------
    def preview(self) -> Plan:
        return self._run_program(dry_run=True)

    def up(self) -> Plan:
        return self._run_program(dry_run=False)

    def refresh(self) -> Plan:
        """pkg/resource/deploy/step.go RefreshStep.Apply: Read(id, old inputs, old outputs); an empty id means the
        resource is gone (dropped from state); returned inputs replace the stored ones. The drift shown is what the
        provider's Diff says between the refreshed outputs and the (refreshed) inputs, as `pulumi refresh --diff`."""
        t0 = time.monotonic()
        plan = Plan("refresh")
        self.emit(f"Refreshing ({self.stack}):")
        resources = self.resources()
        cfg = self._stored_config()
        prov = DynamicProvider(self.root, self.project, cfg).start()
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
                        plan.steps.append(Step("delete", r.urn, r.type, old=r.inputs, seconds=time.monotonic() - t))
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
                    plan.steps.append(st)

            self._parallel([r for r in resources if r.custom], one, plan)
            self._save([r for r in resources if r.urn in by_urn], self.load_state().get("config"))
        finally:
            prov.stop()
        plan.seconds = time.monotonic() - t0
        self.emit(plan.render())
        return plan

    def destroy(self) -> Plan:
        """Delete every resource, dependents before what they depend on, independent ones in parallel
        (pkg/resource/deploy/deployment_executor.go with the step executor's parallel chains; the dependency graph
        of pkg/resource/graph)."""
        t0 = time.monotonic()
        plan = Plan("destroy")
        self.emit(f"Destroying ({self.stack}):")
        resources = self.resources()
        state_cfg = self.load_state().get("config")
        prov = DynamicProvider(self.root, self.project, self._stored_config()).start()
        try:
            remaining = {id(r) for r in resources}

            def done(r: Resource) -> None:
                with self._lock:
                    remaining.discard(id(r))
                    self._save([x for x in resources if id(x) in remaining], state_cfg)

            self._delete_all(resources, prov, plan, done)
        finally:
            prov.stop()
        plan.seconds = time.monotonic() - t0
        self.emit(plan.render())
        return plan

    # -- deletes in reverse dependency order, in parallel ------------------------------------------------------
    def _delete_all(
        self, resources: list[Resource], prov: DynamicProvider, plan: Plan, done: Callable[[Resource], None]
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
                plan.steps.append(st)
                running.discard(i)
                if err:
                    failed.append(err)
                    plan.errors.append(err)
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

    def _parallel(self, items: list, fn: Callable[[Any], None], plan: Plan) -> None:
        with futures.ThreadPoolExecutor(max_workers=self.parallel) as pool:
            for f in [pool.submit(fn, x) for x in items]:
                try:
                    f.result()
                except (ProviderError, BuiltinError) as e:
                    plan.errors.append(str(e))

    # -- preview / up: run the program against our resource monitor -------------------------------------------
    def _run_program(self, dry_run: bool) -> Plan:
        t0 = time.monotonic()
        plan = Plan("preview" if dry_run else "update")
        self.emit(f"{'Previewing update' if dry_run else 'Updating'} ({self.stack}):")
        cfg = self.config()
        stored = self.resources()
        old = {r.urn: r for r in stored if not r.pending_delete}
        prov = DynamicProvider(self.root, self.project, cfg).start()
        dep = Deployment(self, plan, old, prov, dry_run)
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
            if p.returncode != 0 and not plan.errors:
                plan.errors.append(f"the program failed (exit {p.returncode}):\n{(p.stderr or p.stdout)[-4000:]}")
            elif p.returncode != 0 and self.out is not None:
                tail = "\n".join(ln for ln in (p.stderr or "").splitlines()[-8:])
                self.emit(f"  program: {tail}")
            # deletes of what the program no longer declares, and replaced resources' old halves; with
            # continue-on-error they run after failed steps too (deployment_executor.go performPostSteps)
            if not plan.errors or (self.continue_on_error and p.returncode == 0 and not dep.failed):
                dep.finish()
        finally:
            server.stop(0)
            prov.stop()
        if not dry_run:
            dep.save()
        plan.outputs = dep.stack_outputs
        plan.seconds = time.monotonic() - t0
        self.emit(plan.render())
        return plan


class Deployment:
    """One preview or up: the step generator and executor for registrations coming from the program.

    The program registers a resource only once its inputs are resolved (and, through the SDK's dependency
    handling, once its depends_on resources are registered, which here means their steps are done): so executing
    each step inside its RegisterResource call runs every step as soon as its dependencies are done, as many in
    parallel as the program allows (pkg/resource/deploy/step_executor.go runs chains in parallel the same way).
    """

    def __init__(self, driver: Driver, plan: Plan, old: dict[str, Resource], prov: DynamicProvider, dry_run: bool):
        self.d, self.plan, self.old, self.prov, self.dry_run = driver, plan, old, prov, dry_run
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
        unsupported = unimplemented_options(req)
        if unsupported:
            with self.lock:
                self.failed = True
                self.plan.errors.append(
                    f"{req.name}: the driver does not implement the resource option(s) {', '.join(unsupported)}; "
                    "run this program with the pulumi CLI"
                )
            raise StepFailed(f"{req.name}: unsupported resource options {unsupported}")
        goal = to_py(req.object)
        deps = list(req.dependencies)
        pdeps = {k: list(v.urns) for k, v in req.propertyDependencies.items()}
        if self.d.continue_on_error:
            # deployment_executor.go handleSingleEvent: a step that depends (dependencies, property dependencies,
            # parent) on an errored or skipped one is skipped; the SDK resolves its outputs as unknown.
            with self.lock:
                blocked = sorted(({*deps, req.parent, *(u for v in pdeps.values() for u in v)} - {""}) & self.skipped)
                if blocked:
                    self.skipped.add(urn)
                    self.plan.steps.append(
                        Step("skip", urn, req.type, new=goal, keys=[b.rsplit("::", 1)[-1] for b in blocked])
                    )
            if blocked:
                self.d.emit(
                    f"  ⊘  {req.type}  {req.name}  skipped (depends on {', '.join(b.rsplit('::', 1)[-1] for b in blocked)})"
                )
                # The engine answers SKIP; this SDK's proto knows only SUCCESS and FAIL and treats any non-success
                # alike (outputs unknown), so FAIL it is.
                return resource_pb2.RegisterResourceResponse(urn=urn, result=resource_pb2.Result.FAIL)
        if not req.custom:
            res = Resource(urn, req.type, False, req.parent, "", goal, {}, deps, pdeps)
            with self.lock:
                self.new[urn] = res
                self.order.append(urn)
                if req.type == STACK_TYPE:
                    self.root_urn = urn
                op = "same" if urn in self.old else "create"
                self.plan.steps.append(Step(op, urn, req.type, new=goal))
            return resource_pb2.RegisterResourceResponse(urn=urn, object=to_struct({}))
        t0 = time.monotonic()
        try:
            step, res = self._custom(urn, req, goal, deps, pdeps)
        except ProviderError as e:
            # step_executor.go cancelDueToError: by default the first failed step cancels the run (steps in flight
            # finish, none starts); with continue-on-error only its dependents are skipped. A Check or Diff failure
            # is the step generator's and always ends the run (deployment_executor.go Execute).
            carry_on = self.d.continue_on_error and e.method in ("Create", "Update", "Delete")
            with self.lock:
                if carry_on:
                    self.skipped.add(urn)
                else:
                    self.failed = True
                self.plan.errors.append(str(e) + ("\n" + e.details if e.method != "Check" else ""))
                self.plan.steps.append(
                    Step("create" if urn not in self.old else "update", urn, req.type, new=goal, error=str(e))
                )
            self.d.emit(f"  ✗  {req.type}  {req.name}: {e}")
            if carry_on:
                return resource_pb2.RegisterResourceResponse(urn=urn, result=resource_pb2.Result.FAIL)
            raise StepFailed(str(e)) from None
        step.seconds = time.monotonic() - t0
        step.started = t0
        mark_secret(res.outputs, list(req.additionalSecretOutputs))
        with self.lock:
            self.new[urn] = res
            self.order.append(urn)
            self.plan.steps.append(step)
            if not self.dry_run:
                self.save()
        if step.op != "same" and not self.dry_run:
            verb = {"create": "created", "update": "updated", "replace": "replaced"}[step.op]
            self.d.emit(
                f"  {SYMBOLS[step.op]:<2} {req.type}  {req.name}  "
                f"{'(' + step.op + ')' if self.dry_run else verb + f' ({step.seconds:.1f}s)'}"
            )
        # Preview: the outputs of a create/update are the checked inputs; properties the provider alone fills in
        # are absent, which the SDK resolves as unknown in a dry run (provider_plugin.go Create/Update with
        # req.Preview when the provider does not support previews; sdk/python/lib/pulumi/runtime/resource.py).
        outs = res.outputs if req.acceptSecrets else plain(res.outputs)
        return resource_pb2.RegisterResourceResponse(urn=urn, id=res.id or "", object=to_struct(outs))

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
            self.plan.steps.append(step)
            if old is not None and not old.external and old.id != res.id:
                self.pending_deletes.append(old)
                self.plan.steps.append(Step("delete", urn, old.type, old=old.inputs))
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
                self.plan.steps.append(Step("delete", r.urn, r.type, old=r.inputs))
            return

        def done(r: Resource) -> None:
            with self.lock:
                if self.old.get(r.urn) is r:
                    self.old.pop(r.urn)
                self.pending_deletes = [x for x in self.pending_deletes if x is not r]
                self.save()

        shown = {r.urn for r in gone} | {r.urn for r in self.pending_deletes if id(r) in self.prior_pending}
        plan = Plan("delete")
        self.d._delete_all(doomed, self.prov, plan, done)
        # Deletes of this run's replaced resources' old halves are part of their replace step, not steps of their own.
        self.plan.steps += [s for s in plan.steps if s.urn in shown]
        self.plan.errors += plan.errors

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


class Monitor(resource_pb2_grpc.ResourceMonitorServicer):
    """The engine's resource monitor as the Python SDK uses it (sdk/proto/resource.proto)."""

    def __init__(self, dep: Deployment):
        self.dep = dep

    # source_eval.go supportsFeatureID answers yes to more; the driver says yes only to what it implements, so the
    # SDK refuses the rest clearly (e.g. "does not support the DeletedWith option") instead of it being ignored.
    FEATURES = {
        "secrets": resource_pb2.RESOURCE_MONITOR_FEATURE_SECRETS,
        "resourceReferences": resource_pb2.RESOURCE_MONITOR_FEATURE_RESOURCE_REFERENCES,
    }

    def SupportsFeature(self, request, context):
        return resource_pb2.SupportsFeatureResponse(hasSupport=request.id in self.FEATURES)

    def GetDeploymentInfo(self, request, context):
        d = self.dep.d
        cfg = d.config()
        return resource_pb2.DeploymentInfo(
            project=d.project,
            stack=d.stack,
            organization="organization",
            config=cfg.values,
            configSecretKeys=cfg.secret_keys,
            dryRun=self.dep.dry_run,
            parallel=d.parallel,
            supportedFeatures=[
                *self.FEATURES.values(),
                resource_pb2.RESOURCE_MONITOR_FEATURE_INVOKE_DEPENDS_ON,
                resource_pb2.RESOURCE_MONITOR_FEATURE_INVOKE_PARENT,
            ],
        )

    def RegisterResource(self, request, context):
        try:
            return self.dep.register(request)
        except StepFailed as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        except Exception as e:  # noqa: BLE001 -- a driver bug must not hang the program
            import traceback

            self.dep.plan.errors.append(f"driver: {e}\n{traceback.format_exc()}")
            self.dep.failed = True
            context.abort(grpc.StatusCode.INTERNAL, str(e))

    def RegisterResourceOutputs(self, request, context):
        self.dep.outputs(request)
        return empty_pb2.Empty()

    def Invoke(self, request, context):
        try:
            return self.dep.invoke(request)
        except BuiltinError as e:
            context.abort(grpc.StatusCode.UNKNOWN, f"invocation of {request.tok} returned an error: {e}")

    def ReadResource(self, request, context):
        try:
            return self.dep.read_resource(request)
        except StepFailed as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        except (BuiltinError, ProviderError) as e:
            with self.dep.lock:  # a failed read fails the run like any step (step_executor.go cancelDueToError)
                self.dep.failed = True
                self.dep.plan.errors.append(f"{request.name}: read failed: {e}")
            context.abort(grpc.StatusCode.UNKNOWN, str(e))

    def SignalAndWaitForShutdown(self, request, context):
        return empty_pb2.Empty()

    def RegisterStackTransform(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "transforms are not supported by the driver")


class Engine(engine_pb2_grpc.EngineServicer):
    def __init__(self, dep: Deployment):
        self.dep = dep
        self.root = ""

    def Log(self, request, context):
        sev = {
            engine_pb2.DEBUG: "debug",
            engine_pb2.INFO: "info",
            engine_pb2.WARNING: "warning",
            engine_pb2.ERROR: "error",
        }.get(request.severity, "info")
        msg = request.message.rstrip()
        self.dep.d.logs.append(f"{sev}: {msg}")
        if sev == "error":
            with self.dep.lock:
                self.dep.plan.errors.append(msg)
        if sev in ("warning", "error", "info"):
            self.dep.d.emit(f"  {sev}: {msg}")
        return empty_pb2.Empty()

    def GetRootResource(self, request, context):
        return engine_pb2.GetRootResourceResponse(urn=self.root)

    def SetRootResource(self, request, context):
        self.root = request.urn
        return engine_pb2.SetRootResourceResponse()
