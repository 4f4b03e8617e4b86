"""TensorRTEngine: ONNX → TensorRT plan with trtexec in the TensorRT container on the guest (seed 000 §6.2).

Inputs: host, build (plans.triton_engine.EngineBuild), and the values that decide the engine as separate inputs
(onnx_sha256, shapes, precision, calib_sha256, gpu_model, tensorrt_version) so `pulumi preview` names the one that
changed; version. The guest keeps `<plan>.key` beside the plan and a timing cache that every rebuild reuses.
Rebuilt only when the key differs; read returns the key on the guest, so a hand-replaced plan shows as drift.
"""

from __future__ import annotations

import json
from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure, DiffResult
from pydantic import ValidationError

from access.shell import Script, quote, sh
from plans.triton_engine import EngineBuild, build_command, current_keys, key_inputs, plan_rebuild
from pristine import Change
from providers.base import HostResource, TemplateProvider, validation_failures

KEYS = ("onnx_sha256", "shapes", "precision", "calib_sha256", "gpu_model", "tensorrt_version")


def engine_inputs(b: EngineBuild) -> dict:
    return {"build": b.model_dump(mode="json"), **key_inputs(b)}


class TensorRTEngineProvider(TemplateProvider):
    VERSION = "3"  # 3: key inputs in snake_case (camelCase state and <plan>.key read through OLD_KEYS)
    KIND = "engine"
    INPUTS = ("host", "build", *KEYS)
    OUTPUT_ONLY = ("decision",)

    @classmethod
    def writes(cls, inputs: dict) -> list:
        return [(inputs.get("build") or {}).get("plan_path")]

    def diff(self, _id: str, olds: dict, news: dict) -> DiffResult:
        return super().diff(_id, current_keys(olds), news)

    def validate(self, news: dict) -> list[CheckFailure]:
        try:
            EngineBuild.model_validate(news.get("build") or {}).tensorrt_version  # noqa: B018 - raises for an image of unknown TensorRT version
        except ValidationError as e:
            return validation_failures(e, "build.")
        except ValueError as e:
            return [CheckFailure("build.image", str(e))]
        return []

    def _state(self, conn, b: EngineBuild) -> tuple[Optional[str], bool]:
        s = Script().raw(f"if [ -f {quote(b.plan_path)} ]; then echo PLAN; fi")
        s.raw(f"cat {quote(b.plan_path + '.key')} 2>/dev/null || true")
        out = self.guarded(conn, "reading the engine's key", lambda: conn.run(s.render()).stdout).splitlines()
        exists = bool(out) and out[0] == "PLAN"
        rest = "\n".join(out[1:] if exists else out).strip()
        return (rest or None), exists

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        b = EngineBuild.model_validate(props["build"])
        conn = self.conn(props)
        key, exists = self._state(conn, b)
        d = plan_rebuild(key, b, plan_exists=exists)
        if d.rebuild:
            self.guarded(conn, d.reason, lambda: conn.run(build_command(b), timeout=3600), changing=True)
        return {"decision": d.reason}

    def observe(self, props: dict) -> dict:
        key, exists = self._state(self.conn(props), EngineBuild.model_validate(props["build"]))
        stored = current_keys(json.loads(key)) if key and exists else {}
        return {k: stored.get(k) for k in KEYS}

    def restore(self, props: dict) -> Change:
        b = EngineBuild.model_validate(props["build"])
        # The engine is derived; the ONNX file and the timing cache stay for the next build.
        return Change(self.owner(props)).add([sh("rm", "-f", b.plan_path, b.plan_path + ".key", b.plan_path + ".tmp")])


class TensorRTEngine(HostResource, module="serving", name="TensorRTEngine"):
    decision: pulumi.Output[str]

    PROVIDER = TensorRTEngineProvider
