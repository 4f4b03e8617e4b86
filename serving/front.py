"""The queue's HTTP entry (seed 001: API gateway → Redis Stream): KServe v2 JSON in, the job's result out.

``POST /v2/models/<model>/infer`` with a KServe v2 JSON body queues one job and waits for its result:

  * 200: ``outputs`` as KServe v2 JSON, and where it ran and how long it took, in ``parameters`` and in the
    headers ``X-Gpuhost-Backend`` and ``X-Gpuhost-Latency-Ms`` (submit to result, queueing included);
  * 429 with ``Retry-After``: the queue is full (``max_depth`` jobs waiting or running); nothing was queued;
  * 504: no result within ``--timeout`` (the job stays queued; resubmitting with the same ``id`` does not queue it
    twice, and its result is still delivered once);
  * 502: the job failed on every backend (the message says why); 400: a body that is not a v2 request.

The request's ``id`` (or an ``Idempotency-Key`` header) is the job key. ``GET /v2/health/ready`` is 200 while Redis
answers.

Run::

    python -m serving.front --config /etc/gpuhost/gateway/worker.json --listen 0.0.0.0 --port 8090
"""

from __future__ import annotations

import argparse
import http.server
import json
import logging
import re
import sys
import time
from typing import Any, Optional

import numpy as np
import redis

from serving.queue import JobQueue, QueueConfig, QueueFull, ResultTimeout

log = logging.getLogger("gpuhost.front")

DTYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
_NAMES = {np.dtype(v).str: k for k, v in DTYPES.items()}
_PATH = re.compile(r"^/v2/models/([A-Za-z0-9_.-]{1,64})(?:/versions/[0-9]+)?/infer$")


class BadRequest(ValueError):
    pass


def parse_request(body: bytes) -> tuple[Optional[str], dict[str, np.ndarray]]:
    """(request id, inputs) of a KServe v2 JSON infer request."""
    try:
        doc = json.loads(body)
        inputs = {}
        for i in doc["inputs"]:
            dtype = DTYPES.get(i["datatype"])
            if dtype is None:
                raise BadRequest(f"input {i['name']!r}: datatype {i['datatype']!r} not supported")
            inputs[str(i["name"])] = np.asarray(i["data"], dtype=dtype).reshape([int(d) for d in i["shape"]])
    except BadRequest:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise BadRequest(f"not a KServe v2 JSON infer request: {e}") from None
    if not inputs:
        raise BadRequest("no inputs")
    rid = doc.get("id")
    return (str(rid) if rid not in (None, "") else None), inputs


def outputs_json(outputs: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    return [
        {"name": n, "datatype": _NAMES.get(a.dtype.str, "BYTES"), "shape": list(a.shape), "data": a.ravel().tolist()}
        for n, a in outputs.items()
    ]


class Front:
    def __init__(self, queue: JobQueue, *, timeout_s: float = 30.0):
        self.queue, self.timeout_s = queue, timeout_s

    def handle(self, model: str, body: bytes, key: Optional[str]) -> tuple[int, dict[str, str], dict[str, Any]]:
        """(status, headers, JSON body) for one infer request."""
        try:
            rid, inputs = parse_request(body)
        except BadRequest as e:
            return 400, {}, {"error": str(e)}
        key = key or rid
        t0 = time.time()
        try:
            key = self.queue.submit(model, inputs, key=key)
        except QueueFull as e:
            return 429, {"Retry-After": "1"}, {"error": str(e), "depth": e.depth, "max_depth": e.max_depth}
        try:
            res = self.queue.result(key, timeout_s=self.timeout_s, submitted_at=t0)
        except ResultTimeout as e:
            return 504, {}, {"error": str(e), "id": key}
        params = {
            "backend": res.backend,
            "latency_ms": round(res.latency_ms, 3),
            "queue_ms": round(res.queue_ms, 3),
            "service_ms": round(res.service_ms, 3),
            "attempts": res.attempts,
            "reclaimed": res.reclaimed,
        }
        headers = {"X-Gpuhost-Backend": res.backend, "X-Gpuhost-Latency-Ms": f"{res.latency_ms:.3f}"}
        if res.status != "ok":
            return 502, headers, {"error": res.error, "id": key, "parameters": params}
        return (
            200,
            headers,
            {"model_name": model, "id": key, "outputs": outputs_json(res.outputs), "parameters": params},
        )

    def server(self, address: str, port: int) -> http.server.ThreadingHTTPServer:
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, status: int, headers: dict[str, str], doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                m = _PATH.match(self.path.split("?")[0])
                if not m:
                    self._send(404, {}, {"error": f"no such endpoint: {self.path}"})
                    return
                self._send(*front.handle(m.group(1), body, self.headers.get("Idempotency-Key")))

            def do_GET(self):  # noqa: N802
                if self.path.split("?")[0] not in ("/v2/health/ready", "/v2/health/live"):
                    self._send(404, {}, {"error": f"no such endpoint: {self.path}"})
                    return
                try:
                    front.queue.r.ping()
                    self._send(200, {}, {"ready": True})
                except redis.RedisError as e:
                    self._send(503, {}, {"ready": False, "error": str(e)})

            def log_message(self, *a):
                pass

        return http.server.ThreadingHTTPServer((address, port), Handler)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the workers' JSON config (redis and queue sections)")
    ap.add_argument("--listen", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8090)
    ap.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open(a.config) as f:
        cfg = json.load(f)
    r = redis.Redis(
        host=cfg.get("redis", {}).get("host", "127.0.0.1"), port=int(cfg.get("redis", {}).get("port", 6379))
    )
    q = JobQueue(r, QueueConfig(**cfg.get("queue", {})))
    q.ensure_group()
    srv = Front(q, timeout_s=a.timeout).server(a.listen, a.port)
    log.info("front on %s:%d, stream %s", a.listen, a.port, q.cfg.stream)
    srv.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
