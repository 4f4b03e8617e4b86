"""Triton's side of monitoring: the tritonserver flags that expose what the rules and dashboards read.

Usage::

    metrics_args("2.51.0")   # ["--allow-metrics=true", "--metrics-port=8002", "--metrics-config=summary_latencies=true"]

TritonService adds these to its tritonserver command. Summary latencies (nv_inference_*_summary_us with quantile
labels, the source of the p95 alert) exist from Triton 2.33 (NGC 23.04) on; older servers get the counters only and
the p95 alert/panel stay empty rather than wrong.
"""

from __future__ import annotations

SUMMARY_LATENCIES_SINCE = (2, 33)


def _version(v: str) -> tuple[int, int]:
    parts = v.strip().lstrip("v").split(".")
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0


def supports_summary_latencies(version: str) -> bool:
    return _version(version) >= SUMMARY_LATENCIES_SINCE


def metrics_args(version: str, port: int = 8002) -> list[str]:
    args = ["--allow-metrics=true", f"--metrics-port={port}"]
    if supports_summary_latencies(version):
        args.append("--metrics-config=summary_latencies=true")
    return args
