"""The dynamic provider process, started and called as the engine does (provider_plugin.go)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from pulumi.runtime.proto import (
    provider_pb2,
    provider_pb2_grpc,
)

from tools.driver.config import StackConfig
from tools.driver.values import annotate_secrets, plain, to_py, to_struct

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
    """`python -u -m pulumi.dynamic` started as the engine starts the pulumi-python provider plugin.

    `on_stderr`: called with each non-blank line the provider process writes to stderr, as it arrives (from a
    reader thread). The engine does the same (sdk/go/common/resource/plugin/plugin.go `newPlugin`: `runtrace` on the
    plugin's stderr, each line to the display as an info message of the stack); this is where gpuhost's progress
    lines come from (providers/progress.py). None: stderr goes where the driver's goes."""

    def __init__(self, root: Path, project: str, config: StackConfig, on_stderr: Callable[[str], None] | None = None):
        self.root, self.project, self.config = root, project, config
        self.on_stderr = on_stderr
        self.proc: subprocess.Popen | None = None
        self.stub: Any = None
        self.channel: Any = None
        self.reader: threading.Thread | None = None

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
            stderr=subprocess.PIPE if self.on_stderr else None,
        )
        assert self.proc.stdout is not None
        if self.on_stderr is not None:
            # Read before anything else, as runtrace does: an early failure is told on stderr, and a full pipe
            # would stall the provider.
            self.reader = threading.Thread(target=self._forward, args=(self.proc.stderr,), daemon=True)
            self.reader.start()
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

    def _forward(self, stream: Any) -> None:
        assert self.on_stderr is not None
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")
            if line.strip():
                self.on_stderr(line)

    def stop(self) -> None:
        if self.channel:
            self.channel.close()
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.reader is not None:
            # Every line the provider wrote is shown before the run's summary (plugin.go Close waits for stderr to
            # drain); a child it left holding the pipe does not hold the driver up.
            self.reader.join(5)

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
        r = self._call("Diff", urn, _change_request(provider_pb2.DiffRequest, urn, id_, old_outputs, old_inputs, news))
        return DiffResult(r.changes, list(r.replaces), bool(r.deleteBeforeReplace))

    def create(self, urn: str, news: dict) -> tuple[str, dict]:
        r = self._call("Create", urn, provider_pb2.CreateRequest(urn=urn, properties=to_struct(plain(news))))
        return r.id, annotate_secrets(to_py(r.properties), news)

    def update(self, urn: str, id_: str, old_outputs: dict, old_inputs: dict, news: dict) -> dict:
        r = self._call(
            "Update", urn, _change_request(provider_pb2.UpdateRequest, urn, id_, old_outputs, old_inputs, news)
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


def _change_request(kind: Any, urn: str, id_: str, old_outputs: dict, old_inputs: dict, news: dict) -> Any:
    """A DiffRequest or an UpdateRequest: both carry the old state and the new inputs, plain."""
    return kind(
        id=id_,
        urn=urn,
        olds=to_struct(plain(old_outputs)),
        news=to_struct(plain(news)),
        old_inputs=to_struct(plain(old_inputs)),
    )


@dataclass
class DiffResult:
    changes: int
    replaces: list[str]
    delete_before_replace: bool
