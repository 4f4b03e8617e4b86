"""A deployment driver with the Pulumi engine's semantics, for running gpuhost stacks where the CLI cannot be had.

It is a conformance driver, not a product engine: users run the real `pulumi` CLI. It exists so that the whole
program (stack config → `__main__.py` → components → dynamic providers) is exercised the way the engine exercises
it: resources registered concurrently, steps run as soon as their dependencies are done (at most `parallel` at
once, the CLI's --parallel), unknowns during preview, replacements, refresh and destroy order. Everything below is
reproduced from the pulumi/pulumi source (read at github.com/pulumi/pulumi, commit 1b5949891b); each rule cites
the file it comes from.

Usage::

    d = Driver(stack="dev", passphrase="gpuhost-dev")          # state: .pulumi-state/driver/dev.json
    outcome = d.preview()                                        # prints what `pulumi preview --diff` prints
    d.up(); d.refresh(); d.destroy()
    outcome.counts()   # {"create": 12, "same": 3, ...}

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

Where each part lives (one responsibility a module):

- `values.py`: property values on the wire: to/from protobuf Structs, unknowns, secrets (seal, unseal, annotate).
- `config.py`: `StackConfig`, the stack's config as the CLI hands it to the program and the providers.
- `provider.py`: `DynamicProvider`, the `python -m pulumi.dynamic` process and its gRPC calls.
- `state.py`: `Resource`, one resource as the state file stores it.
- `steps.py`: `Step` and `Outcome` (an operation's steps, outputs and errors), and how they are printed.
- `deployment.py`: `Deployment`, registrations turned into steps that run as soon as their dependencies are done.
- `monitor.py`: the gRPC services the program talks to (ResourceMonitor, Engine).
- `driver.py`: `Driver`: preview, up, refresh and destroy of one stack; its state file.
- `display.py`: property values printed as `pulumi preview --diff` prints them.
- `langhost.py`: the program's process (the language host's part).

This module is the package's front: the names callers and the conformance tests import.
"""

from tools.driver.config import StackConfig
from tools.driver.deployment import Deployment
from tools.driver.driver import Driver
from tools.driver.provider import DynamicProvider, ProviderError
from tools.driver.steps import Outcome, Step
from tools.driver.values import SECRET_SIG, SIG, UNKNOWN, is_secret, plain

__all__ = [
    "SECRET_SIG",
    "SIG",
    "UNKNOWN",
    "Deployment",
    "Driver",
    "DynamicProvider",
    "Outcome",
    "ProviderError",
    "StackConfig",
    "Step",
    "is_secret",
    "plain",
]
