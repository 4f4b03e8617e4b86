"""TensorRTEngine: ONNX → TensorRT plan with trtexec in the TensorRT container on the guest (seed 000 §6.2).

Inputs: host, build (plans.triton_engine.EngineBuild), and the values that decide the engine as separate inputs
(onnxSha256, shapes, precision, calibSha256, gpuModel, tensorrtVersion) so `pulumi preview` names the one that
changed; version. The guest keeps `<plan>.key` beside the plan and a timing cache that every rebuild reuses.
Rebuilt only when the key differs; read returns the key on the guest, so a hand-replaced plan shows as drift.
"""

from __future__ import annotations

from typing import Any, Optional

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, UpdateResult
from pydantic import ValidationError

from access.shell import Script, quote, sh
from plans.triton_engine import EngineBuild, build_command, key_inputs, plan_rebuild
from providers.base import HostProvider, HostResource, validation_failures

KEYS = ("onnxSha256", "shapes", "precision", "calibSha256", "gpuModel", "tensorrtVersion")


def engine_inputs(b: EngineBuild) -> dict:
    return {"build": b.model_dump(mode="json"), **key_inputs(b)}


class TensorRTEngineProvider(HostProvider):
    VERSION = "1"
    OUTPUT_ONLY = ("decision",)

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        try:
            b = EngineBuild.model_validate(news.get("build") or {})
            b.tensorrt_version  # noqa: B018 - raises for an image of unknown TensorRT version
        except ValidationError as e:
            failures += validation_failures(e, "build.")
        except ValueError as e:
            failures.append(CheckFailure("build.image", str(e)))
        return CheckResult(news, failures)

    def _state(self, conn, b: EngineBuild) -> tuple[Optional[str], bool]:
        s = Script().raw(f"if [ -f {quote(b.plan_path)} ]; then echo PLAN; fi")
        s.raw(f"cat {quote(b.plan_path + '.key')} 2>/dev/null || true")
        out = conn.run(s.render()).stdout.splitlines()
        exists = bool(out) and out[0] == "PLAN"
        rest = "\n".join(out[1:] if exists else out).strip()
        return (rest or None), exists

    def _apply(self, props: dict) -> dict:
        b = EngineBuild.model_validate(props["build"])
        conn = self.conn(props)
        key, exists = self._state(conn, b)
        d = plan_rebuild(key, b, plan_exists=exists)
        if d.rebuild:
            conn.run(build_command(b), timeout=3600)
        return self.outputs(props, decision=d.reason)

    def create(self, props: dict[str, Any]) -> CreateResult:
        b = EngineBuild.model_validate(props["build"])
        return CreateResult(f"{self.spec(props).name}:{b.plan_path}", self._apply(props))

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        return UpdateResult(self._apply(news))

    def read(self, id_: str, props: dict) -> ReadResult:
        import json

        b = EngineBuild.model_validate(props["build"])
        key, exists = self._state(self.conn(props), b)
        stored = json.loads(key) if key and exists else {}
        return ReadResult(id_, {**props, **{k: stored.get(k) for k in KEYS}})

    def delete(self, _id: str, props: dict) -> None:
        b = EngineBuild.model_validate(props["build"])
        # The engine is derived; the ONNX file and the timing cache stay for the next build.
        self.conn(props).run(sh("rm", "-f", b.plan_path, b.plan_path + ".key", b.plan_path + ".tmp"))


class TensorRTEngine(HostResource, module="serving", name="TensorRTEngine"):
    decision: pulumi.Output[str]

    PROVIDER = TensorRTEngineProvider
