"""AcceptanceGate: health gate, warmup and a bounded load run through nginx; ``up`` fails when the SLO is missed.

Runs from where Pulumi runs, against ``url`` (the nginx front). It waits for ``/v2/health/ready`` and
every model's ready, sends warmup requests, measures the load tool's own floor on nginx's
``/nginx-health``, then runs the load (``serving.loadgate``) and checks the SLO. Every answer's outputs are
checked against the model config the server reports (names, datatypes, shapes, bytes): a 200 with empty
outputs is a failure, not a success (the python client does this; wrk, which cannot read bodies, runs only with
``checkOutputs: false``). ``bodySpec: {input, shape, datatype, binary: true}`` sends the tensor as raw bytes.
Outputs are the numbers (p50/p95/p99, throughput, error rate, wrong outputs, overhead).
Any change of ``trigger`` (the repository digest, the runtime's image) or of the load/SLO inputs
re-runs the gate as a replacement, so every deploy that changes serving is measured again.

Usage::

    AcceptanceGate("gpu-a-gate", {"url": "http://10.0.0.5:80", "models": ["yolov8n"], "model": "yolov8n",
                   "body": infer_body_json, "concurrency": 8, "durationS": 30, "maxRequests": 200000,
                   "p95Ms": 8.0, "maxErrorRate": 0.0, "trigger": repo.digest})
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Optional

import pulumi
from pulumi import dynamic
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult

from providers.base import Provider
from serving import loadgate
from serving.health import wait_ready, warmup


def request_body(props: dict) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """The infer request the gate sends and its headers: given whole (`body`, JSON), or built here from `bodySpec`
    so a large tensor (a 640x640 image is 1.2 M numbers) never travels as a resource input or sits in state.
    ``bodySpec.binary`` sends the tensor as raw bytes (KServe binary extension; seeded random values, never
    zeros) and asks for binary outputs."""
    spec = props.get("bodySpec")
    if spec and spec.get("binary"):
        import math
        import random

        shape = [int(d) for d in spec["shape"]]
        dtype = spec.get("datatype", "FP32")
        data = random.Random(0).randbytes(loadgate.DTYPE_BYTES[dtype] * math.prod(shape))
        return loadgate.binary_request([(spec["input"], dtype, shape, data)])
    if spec:
        body = loadgate.infer_body(spec["input"], [int(d) for d in spec["shape"]], spec.get("datatype", "FP32"))
    else:
        body = props["body"].encode()
    return body, (("Content-Type", "application/json"),)


def response_check(url: str, model: str, props: dict) -> Optional[loadgate.ResponseCheck]:
    """What every answer must hold, from the model config the server reports (names, datatypes, shapes, bytes):
    a 200 with empty or misshapen outputs fails the gate (``checkOutputs: false`` turns this off)."""
    if not props.get("checkOutputs", True):
        return None
    with urllib.request.urlopen(f"{url}/v2/models/{model}/config", timeout=30) as r:
        config = json.loads(r.read())
    spec = props.get("bodySpec") or {}
    batch = int(spec["shape"][0]) if spec.get("shape") and int(config.get("max_batch_size", 0)) > 0 else 1
    return loadgate.ResponseCheck.from_config(config, batch=batch)


class AcceptanceGateProvider(Provider):
    VERSION = "3"
    _BOOKKEEPING = {"__provider", "version", "result", "overhead"}

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = []
        if not str(news.get("url", "")).startswith(("http://", "https://")):
            failures.append(CheckFailure("url", "must be an http(s) URL of the nginx front"))
        for key, low in (("concurrency", 1), ("durationS", 0.1), ("maxRequests", 1)):
            if not isinstance(news.get(key), (int, float)) or news[key] < low:
                failures.append(CheckFailure(key, f"must be a number >= {low}"))
        if news.get("p95Ms") is not None and news["p95Ms"] <= 0:
            failures.append(CheckFailure("p95Ms", "must be > 0"))
        return CheckResult(news, failures)

    def diff_known(self, _id: str, olds: dict, news: dict) -> DiffResult:
        changed = sorted(k for k in set(olds) | set(news) if k not in self._BOOKKEEPING and olds.get(k) != news.get(k))
        return DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=True)

    def diffed_keys(self, news: dict) -> list[str]:
        return [k for k in news if k not in self._BOOKKEEPING]

    def replaces(self, olds: dict, news: dict, changed) -> list[str]:
        # A gate result stands for exactly the inputs it was measured with: any change measures again.
        return sorted(changed)

    def create(self, props: dict) -> CreateResult:
        url = props["url"].rstrip("/")
        wait_ready(url, list(props.get("models") or []), timeout_s=float(props.get("readyTimeoutS", 300)))
        body, headers = request_body(props)
        model = props["model"]
        concurrency = int(props["concurrency"])
        warmup(
            url,
            model,
            body,
            count=int(props.get("warmupRequests", 20)),
            concurrency=min(4, concurrency),
            headers=dict(headers),
        )
        check = response_check(url, model, props)
        spec = loadgate.LoadSpec(
            url=f"{url}/v2/models/{model}/infer",
            body=body,
            headers=headers,
            concurrency=concurrency,
            duration_s=float(props["durationS"]),
            max_requests=int(props["maxRequests"]),
            tool=props.get("tool", "auto"),
            check=check,
            # One client process per 4 connections: one process's GIL would queue requests at high concurrency.
            processes=max(1, min(os.cpu_count() or 1, concurrency // 4)),
        )
        floor = loadgate.overhead(spec, f"{url}/nginx-health")
        result = loadgate.run(spec)
        slo = loadgate.Slo(p95_ms=props.get("p95Ms"), max_error_rate=float(props.get("maxErrorRate", 0.0)))
        loadgate.check_slo(result, slo)  # GateFailed carries the numbers into `pulumi up`'s error
        out = {k: v for k, v in props.items() if k != "__provider"}
        out["result"] = result.as_dict()
        out["overhead"] = floor.as_dict()
        return CreateResult(f"gate-{model}", out)

    def delete(self, _id: str, _props: dict) -> None:
        return None


class AcceptanceGate(dynamic.Resource, module="serving", name="AcceptanceGate"):
    result: pulumi.Output[dict]
    overhead: pulumi.Output[dict]

    def __init__(self, name: str, args: dict, opts: pulumi.ResourceOptions | None = None):
        super().__init__(
            AcceptanceGateProvider(),
            name,
            {"result": None, "overhead": None, **args, "version": AcceptanceGateProvider.VERSION},
            opts,
        )
