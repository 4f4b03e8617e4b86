"""What the Prometheus-live tests share: a one-host graph around a local Triton, and inference load on it.

Usage::

    graph = local_graph("sleepsvc", "sleep", metrics_port=..., prom_port=..., workdir=tmp, node_exporter_port=...)
    sent = infer_load(triton.http_url, "sleep", lambda h: [one_input(h)], seconds=3, threads=3)
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from plans.monitoring.model import HostTarget, MonitoringGraph, ServingSlo, TritonTarget


def local_graph(
    service: str,
    model: str,
    *,
    metrics_port: int,
    prom_port: int,
    workdir: Path,
    node_exporter_port: Optional[int] = None,
    window_port: Optional[int] = None,
) -> MonitoringGraph:
    """One host ("local"), one Triton service of tenant-a serving `model` with a 50 ms p95 SLO, scraped every
    second; the rules file in `workdir`."""
    host = {"node_exporter_port": node_exporter_port} if node_exporter_port is not None else {}
    return MonitoringGraph(
        hosts=[HostTarget(name="local", address="127.0.0.1", role="host", **host)],
        services=[
            TritonTarget(
                name=service,
                address="127.0.0.1",
                host="local",
                tenant="tenant-a",
                metrics_port=metrics_port,
                window_port=window_port,
                models=(model,),
                slo=ServingSlo(p95_latency_ms=50),
            )
        ],
        scrape_interval="1s",
        evaluation_interval="1s",
        rules_path=str(workdir / "gpuhost.rules.yml"),
        self_address=f"127.0.0.1:{prom_port}",
    )


def infer_load(url: str, model: str, inputs: Callable[[Any], list], seconds: float, threads: int) -> int:
    """`threads` clients inferring `model` back to back for `seconds`; `inputs(tritonclient.http)` makes one
    request's inputs. Returns how many requests were answered."""
    import tritonclient.http as httpclient  # imported by the tests that reach a live Triton only

    sent = [0]
    stop = time.monotonic() + seconds

    def worker() -> None:
        c = httpclient.InferenceServerClient(url.replace("http://", ""))
        while time.monotonic() < stop:
            c.infer(model, inputs(httpclient))
            sent[0] += 1

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sent[0]
