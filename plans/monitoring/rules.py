"""Recording and alerting rules from the stack's SLOs, plus `promtool test rules` cases that pin the thresholds.

Usage::

    text = render_rules(graph)             # -> graph.rules_path on the monitoring host; `promtool check rules` passes
    tests = render_rule_tests(graph, "gpuhost.rules.yml")   # `promtool test rules` file for the same graph

Recording rules (per Triton target, model and version; Triton's counters are cumulative microseconds):
  gpuhost:triton_requests:rate1m                 successful requests per second (QPS)
  gpuhost:triton_request_duration_us:avg1m       average request latency
  gpuhost:triton_queue_duration_us:avg1m         average time a request waited in the scheduler queue
  gpuhost:triton_compute_infer_duration_us:avg1m average model execution time per request
  gpuhost:triton_batch_size:avg1m                nv_inference_count / nv_inference_exec_count (seed 004: is the
                                                 dynamic batching window doing anything?)
  gpuhost:triton_failures:ratio5m                failed / all requests
  gpuhost:triton_request_duration_us:p95         Triton's own p95 (summary latencies, --metrics-config
                                                 summary_latencies=true); summaries cannot be aggregated, so per target
Alerts:
  TritonP95LatencyAboveSlo   p95 above the service SLO for 5m                 (seed 004)
  TritonQueueDurationHigh    average queue time above 20 ms for 1m            (seed 001 §8)
  TritonFailureRatioHigh     failures above the service's ratio for 5m
  GpuFramebufferFreeLow      DCGM free frame buffer below 1.5 GB              (seed 001 §8)
  GpuXidError                the last XID DCGM saw is non-zero
  GpuTemperatureHigh         GPU temperature above the limit
  ScrapeTargetDown           an exporter or Triton endpoint stopped answering
"""

from __future__ import annotations

import re
from typing import Any

from plans.monitoring import gateway, yaml_text
from plans.monitoring.alerting import fmt, promtool_case, series_labels
from plans.monitoring.model import MonitoringGraph, TritonTarget, tenant_label
from plans.monitoring.prometheus import JOB_DCGM, JOB_NODE, JOB_TRITON
from plans.values import host_port

REC_QPS = "gpuhost:triton_requests:rate1m"
REC_REQUEST_AVG = "gpuhost:triton_request_duration_us:avg1m"
REC_QUEUE_AVG = "gpuhost:triton_queue_duration_us:avg1m"
REC_COMPUTE_AVG = "gpuhost:triton_compute_infer_duration_us:avg1m"
REC_BATCH_AVG = "gpuhost:triton_batch_size:avg1m"
REC_FAILURE_RATIO = "gpuhost:triton_failures:ratio5m"
REC_P95 = "gpuhost:triton_request_duration_us:p95"

# Triton >= 2.4x splits failures by `reason`; summing it away keeps the ratio one-to-one with successes.
_FAILURES_5M = "sum without (reason) (rate(nv_inference_request_failure[5m]))"


def recording_rules() -> list[dict[str, str]]:
    per_request = "rate(nv_inference_request_success[1m])"
    return [
        {"record": REC_QPS, "expr": per_request},
        {"record": REC_REQUEST_AVG, "expr": f"rate(nv_inference_request_duration_us[1m]) / {per_request}"},
        {"record": REC_QUEUE_AVG, "expr": f"rate(nv_inference_queue_duration_us[1m]) / {per_request}"},
        {"record": REC_COMPUTE_AVG, "expr": f"rate(nv_inference_compute_infer_duration_us[1m]) / {per_request}"},
        {"record": REC_BATCH_AVG, "expr": "rate(nv_inference_count[1m]) / rate(nv_inference_exec_count[1m])"},
        {
            "record": REC_FAILURE_RATIO,
            "expr": f"{_FAILURES_5M} / ({_FAILURES_5M} + rate(nv_inference_request_success[5m]))",
        },
        {"record": REC_P95, "expr": 'nv_inference_request_summary_us{quantile="0.95"}'},
    ]


def _service_selector(s: TritonTarget) -> str:
    return f'{{job="{JOB_TRITON}",service="{s.name}"}}'


def service_alerts(s: TritonTarget) -> list[dict[str, Any]]:
    # The `service` rule label equals the series' own; it is there because promtool's linter calls same-named alerts
    # with equal rule labels duplicates, across the whole file.
    sel = _service_selector(s)
    slo = s.slo
    return [
        {
            "alert": "TritonP95LatencyAboveSlo",
            "expr": f"{REC_P95}{sel} > {fmt(slo.p95_latency_ms * 1000)}",
            "for": slo.p95_for,
            "labels": {"severity": "warning", "slo": "p95_latency", "service": s.name},
            "annotations": {
                "summary": f"{s.name}: p95 of {{{{ $labels.model }}}} above {fmt(slo.p95_latency_ms)} ms for {slo.p95_for}",
                "description": "Tighten max_queue_delay_microseconds by 100-200us (seed 004).",
            },
        },
        {
            "alert": "TritonQueueDurationHigh",
            "expr": f"{REC_QUEUE_AVG}{sel} > {fmt(slo.queue_duration_ms * 1000)}",
            "for": slo.queue_for,
            "labels": {"severity": "warning", "slo": "queue_duration", "service": s.name},
            "annotations": {
                "summary": f"{s.name}: {{{{ $labels.model }}}} requests queue over {fmt(slo.queue_duration_ms)} ms",
                "description": "Add instances or shift weight to other instances (seed 001).",
            },
        },
        {
            "alert": "TritonFailureRatioHigh",
            "expr": f"{REC_FAILURE_RATIO}{sel} > {fmt(slo.max_failure_ratio)}",
            "for": "5m",
            "labels": {"severity": "critical", "slo": "failures", "service": s.name},
            "annotations": {
                "summary": f"{s.name}: {{{{ $labels.model }}}} fails over {fmt(slo.max_failure_ratio * 100)}% of requests",
            },
        },
    ]


def gpu_alerts(graph: MonitoringGraph) -> list[dict[str, Any]]:
    g = graph.gpu
    return [
        {
            "alert": "GpuFramebufferFreeLow",
            "expr": f"DCGM_FI_DEV_FB_FREE < {fmt(g.fb_free_min_mib)}",
            "for": g.fb_free_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "GPU {{ $labels.gpu }} on {{ $labels.host }} has {{ $value }} MiB free",
                "description": "Below 1.5 GB free: lower instance_group count or restart the instance to defrag (seed 001).",
            },
        },
        {
            "alert": "GpuXidError",
            "expr": "DCGM_FI_DEV_XID_ERRORS > 0",
            "labels": {"severity": "critical"},
            "annotations": {"summary": "GPU {{ $labels.gpu }} on {{ $labels.host }} reported XID {{ $value }}"},
        },
        {
            "alert": "GpuTemperatureHigh",
            "expr": f"DCGM_FI_DEV_GPU_TEMP > {fmt(g.temperature_max_c)}",
            "for": g.temperature_for,
            "labels": {"severity": "warning"},
            "annotations": {"summary": "GPU {{ $labels.gpu }} on {{ $labels.host }} at {{ $value }} C"},
        },
    ]


def target_alerts() -> list[dict[str, Any]]:
    jobs = "|".join((JOB_NODE, JOB_DCGM, JOB_TRITON))
    return [
        {
            "alert": "ScrapeTargetDown",
            "expr": f'up{{job=~"{jobs}"}} == 0',
            "for": "1m",
            "labels": {"severity": "critical"},
            "annotations": {"summary": "{{ $labels.job }} on {{ $labels.host }} ({{ $labels.instance }}) is down"},
        },
    ]


def rules(graph: MonitoringGraph) -> dict[str, Any]:
    # One group per service, each with its own thresholds.
    return {
        "groups": [
            {"name": "gpuhost-triton-recording", "rules": recording_rules()},
            *({"name": f"gpuhost-serving-{s.name}", "rules": service_alerts(s)} for s in graph.services),
            {"name": "gpuhost-gpu-alerts", "rules": gpu_alerts(graph)},
            {"name": "gpuhost-targets", "rules": target_alerts()},
            *gateway.rule_groups(graph),
        ]
    }


def render_rules(graph: MonitoringGraph) -> str:
    data = rules(graph)
    header = "# gpuhost: generated by plans.monitoring.rules from the stack's SLOs; do not edit by hand.\n"
    return header + yaml_text(data, sort_keys=False, default_flow_style=False, allow_unicode=True)


def expressions(graph: MonitoringGraph) -> list[str]:
    """Every PromQL expression in the rules (for the parse and metric-existence checks)."""
    data = rules(graph)
    return [r["expr"] for g in data["groups"] for r in g["rules"]]


def recorded_metrics() -> frozenset[str]:
    return frozenset(r["record"] for r in recording_rules())


# ------------------------------------------------------------------ promtool test rules cases


_TEMPLATE = re.compile(r"\{\{ \$(labels\.([A-Za-z_][A-Za-z0-9_]*)|value) \}\}")


def expand_annotations(rule: dict[str, Any], labels: dict[str, str], value: float) -> dict[str, str]:
    """Expand the two template forms the rules use ({{ $labels.x }}, {{ $value }}) as Prometheus would."""

    def one(text: str) -> str:
        out = _TEMPLATE.sub(lambda m: labels[m.group(2)] if m.group(2) else fmt(value), text)
        if "{{" in out:
            raise ValueError(f"template form not supported by the test generator: {text!r}")
        return out

    return {k: one(v) for k, v in rule.get("annotations", {}).items()}


def _rule(rules_: list[dict[str, Any]], alert: str) -> dict[str, Any]:
    return next(r for r in rules_ if r.get("alert") == alert)


def _expected(rule: dict[str, Any], labels: dict[str, str], value: float) -> dict[str, Any]:
    exp = {**labels, **rule.get("labels", {})}
    return {"exp_labels": exp, "exp_annotations": expand_annotations(rule, exp, value)}


def _triton_series_labels(s: TritonTarget, model: str) -> dict[str, str]:
    return {
        "job": JOB_TRITON,
        "instance": host_port(s.address, s.metrics_port),
        "host": s.host,
        "tenant": tenant_label(s.tenant),
        "service": s.name,
        "model": model,
        "version": "1",
    }


def _service_cases(s: TritonTarget) -> list[dict[str, Any]]:
    model = s.models[0] if s.models else "model"
    base = _triton_series_labels(s, model)
    slo = s.slo
    alerts = service_alerts(s)
    cases: list[dict[str, Any]] = []

    # p95: a flat summary quantile 10% above / below the SLO for 10 minutes.
    p95_rule = _rule(alerts, "TritonP95LatencyAboveSlo")
    for factor, fires in ((1.1, True), (0.9, False)):
        p95_us = slo.p95_latency_ms * 1000 * factor
        labels = {**base, "quantile": "0.95"}
        series = [("nv_inference_request_summary_us" + series_labels(labels), f"{fmt(p95_us)}x10")]
        expected = [_expected(p95_rule, labels, p95_us)] if fires else []
        cases.append(promtool_case("1m", series, p95_rule, [("6m", expected)]))

    # Queue: 10 requests per 15 s, each waiting 1.25x / 0.75x the threshold.
    queue_rule = _rule(alerts, "TritonQueueDurationHigh")
    for factor, fires in ((1.25, True), (0.75, False)):
        per_request_us = slo.queue_duration_ms * 1000 * factor
        series = [
            ("nv_inference_request_success" + series_labels(base), "0+10x20"),
            ("nv_inference_queue_duration_us" + series_labels(base), f"0+{fmt(10 * per_request_us)}x20"),
        ]
        expected = [_expected(queue_rule, base, per_request_us)] if fires else []
        cases.append(promtool_case("15s", series, queue_rule, [("4m", expected)]))
    return cases


def _gpu_cases(graph: MonitoringGraph) -> list[dict[str, Any]]:
    g = graph.gpu
    gpu_rules = gpu_alerts(graph)
    gpu = {
        "job": JOB_DCGM,
        "instance": "gpu-vm:9400",
        "host": "gpu-vm",
        "tenant": "shared",
        "role": "guest",
        "gpu": "0",
        "UUID": "GPU-00000000-0000-0000-0000-000000000000",
    }
    cases: list[dict[str, Any]] = []
    fb_rule = _rule(gpu_rules, "GpuFramebufferFreeLow")
    for free, fires in ((g.fb_free_min_mib - 100, True), (g.fb_free_min_mib + 100, False)):
        series = [("DCGM_FI_DEV_FB_FREE" + series_labels(gpu), f"{fmt(free)}x10")]
        cases.append(promtool_case("1m", series, fb_rule, [("6m", [_expected(fb_rule, gpu, free)] if fires else [])]))
    xid_rule = _rule(gpu_rules, "GpuXidError")
    series = [("DCGM_FI_DEV_XID_ERRORS" + series_labels(gpu), "0 0 79 79")]
    cases.append(promtool_case("1m", series, xid_rule, [("1m", []), ("2m", [_expected(xid_rule, gpu, 79)])]))
    down_rule = _rule(target_alerts(), "ScrapeTargetDown")
    node = {"job": JOB_NODE, "instance": "gpu-vm:9100", "host": "gpu-vm", "tenant": "shared", "role": "guest"}
    series = [("up" + series_labels(node), "1 1 0 0 0 0 0")]
    cases.append(promtool_case("30s", series, down_rule, [("1m", []), ("3m", [_expected(down_rule, node, 0)])]))
    return cases


def rule_tests(graph: MonitoringGraph, rules_file: str) -> dict[str, Any]:
    tests: list[dict[str, Any]] = []
    for s in graph.services:
        tests += _service_cases(s)
    tests += _gpu_cases(graph)
    for g in graph.gateways:
        tests += gateway.rule_tests(g)
    return {"rule_files": [rules_file], "evaluation_interval": "15s", "tests": tests}


def render_rule_tests(graph: MonitoringGraph, rules_file: str) -> str:
    return yaml_text(rule_tests(graph, rules_file), sort_keys=False, default_flow_style=False)


def alert_names(graph: MonitoringGraph) -> list[str]:
    data = rules(graph)
    return [r["alert"] for g in data["groups"] for r in g["rules"] if "alert" in r]
