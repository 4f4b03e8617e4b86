"""Health gate and warmup for a Triton endpoint (direct or through nginx), standard library only.

Usage::

    wait_ready("http://127.0.0.1:8000", ["yolov8n", "sdxl"], timeout_s=300)   # raises NotReady naming what is not
    warmup("http://127.0.0.1:8000", "yolov8n", body, count=20, concurrency=4)  # -> list of latencies (ms)

Seed 000 §10: a big engine cold-starts slowly; send warmup requests (concurrently) before traffic and
before the acceptance gate measures anything.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Optional


class NotReady(RuntimeError):
    pass


def http_status(url: str, timeout: float = 2.0) -> int:
    """The status a GET of `url` answers; 0 when nothing answers (refused, timed out, not HTTP)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return 0


def wait_ready(base_url: str, models: list[str], *, timeout_s: float = 120.0, interval_s: float = 0.5) -> float:
    """Wait for ``/v2/health/ready`` and ``/v2/models/<m>/ready`` of each model; returns seconds waited."""
    base = base_url.rstrip("/")
    start = time.monotonic()
    pending = ["/v2/health/ready"] + [f"/v2/models/{m}/ready" for m in models]
    while True:
        pending = [p for p in pending if http_status(base + p) != 200]
        if not pending:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise NotReady(f"{base}: not ready after {timeout_s:.0f}s: {', '.join(pending)}")
        time.sleep(interval_s)


def warmup(
    base_url: str,
    model: str,
    body: bytes,
    *,
    count: int = 10,
    concurrency: int = 1,
    timeout_s: float = 60.0,
    headers: Optional[dict[str, str]] = None,
) -> list[float]:
    """POST ``body`` to the model's v2 infer ``count`` times; every answer must be 200. Returns latencies (ms)."""
    url = f"{base_url.rstrip('/')}/v2/models/{model}/infer"

    def one(_):
        req = urllib.request.Request(
            url, data=body, method="POST", headers=headers or {"Content-Type": "application/json"}
        )
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            raise NotReady(f"warmup of {model}: HTTP {e.code}: {e.read()[:300]!r}") from None
        if status != 200:
            raise NotReady(f"warmup of {model}: HTTP {status}")
        return (time.perf_counter() - t0) * 1000

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, range(count)))
