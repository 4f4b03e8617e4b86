"""Scrape job, rules and promtool test cases for InferenceGateways (seed 001's queue workers).

Every worker serves ``/metrics`` (serving.worker): queue depth, pending and lag of the consumer group, jobs per
backend and outcome, the end-to-end latency histogram (queueing included), backend health and effective weight.

Recording rules:
  gpuhost:gateway_jobs:rate1m                   jobs served per second, per gateway and backend (the split)
  gpuhost:gateway_job_latency_seconds:p95_5m    end-to-end p95 per gateway, from all workers' histograms
  gpuhost:gateway_queue_depth:max               jobs waiting or running (every worker reports the same stream)
Alerts (one group per gateway, its own thresholds):
  GatewayP95AboveSlo       p95 including queueing above the SLO for 5m       (seed 001: ≤ 2.5 s)
  GatewayQueueBacklog      depth above 80 % of max_depth for 1m: refusals are next
  GatewayJobsRefused       a full queue refused submits in the last 5m
  GatewayBackendDrained    a backend drained (failed health, XID, queue time) for 1m
  GatewayWorkerDown        a worker's metrics endpoint stopped answering for 1m
"""

from __future__ import annotations

from typing import Any

from plans import values as val
from plans.monitoring.alerting import fmt, promtool_case, series_labels
from plans.monitoring.model import GatewayTarget, MonitoringGraph
from serving.metrics import BUCKETS

JOB_GATEWAY = "gateway"
REC_RATE = "gpuhost:gateway_jobs:rate1m"
REC_P95 = "gpuhost:gateway_job_latency_seconds:p95_5m"
REC_DEPTH = "gpuhost:gateway_queue_depth:max"


def scrape_job(graph: MonitoringGraph) -> list[dict[str, Any]]:
    if not graph.gateways:
        return []
    return [
        {
            "job_name": JOB_GATEWAY,
            "static_configs": [
                {
                    "targets": [val.host_port(g.address, p) for p in g.metrics_ports],
                    "labels": {"host": g.host, "gateway": g.name},
                }
                for g in graph.gateways
            ],
        }
    ]


def recording_rules() -> list[dict[str, str]]:
    return [
        {"record": REC_RATE, "expr": 'sum by (gateway, backend) (rate(gpuhost_gateway_jobs_total{outcome="ok"}[1m]))'},
        {
            "record": REC_P95,
            "expr": "histogram_quantile(0.95, sum by (gateway, le) "
            "(rate(gpuhost_gateway_job_latency_seconds_bucket[5m])))",
        },
        {"record": REC_DEPTH, "expr": "max by (gateway) (gpuhost_gateway_queue_depth)"},
    ]


def alerts(g: GatewayTarget) -> list[dict[str, Any]]:
    sel = f'{{gateway="{g.name}"}}'
    backlog = g.max_depth * g.backlog_ratio
    return [
        {
            "alert": "GatewayP95AboveSlo",
            "expr": f"{REC_P95}{sel} > {fmt(g.p95_latency_s)}",
            "for": g.p95_for,
            "labels": {"severity": "warning", "slo": "p95_latency", "gateway": g.name},
            "annotations": {
                "summary": f"{g.name}: p95 including queueing above {fmt(g.p95_latency_s)} s for {g.p95_for}",
                "description": "Add backends or weight, or lower max_depth so callers see 429 sooner (seed 001).",
            },
        },
        {
            "alert": "GatewayQueueBacklog",
            "expr": f"{REC_DEPTH}{sel} > {fmt(backlog)}",
            "for": g.backlog_for,
            "labels": {"severity": "warning", "gateway": g.name},
            "annotations": {
                "summary": f"{g.name}: queue above {fmt(backlog)} of {g.max_depth} jobs; new jobs are refused at "
                f"{g.max_depth}",
            },
        },
        {
            "alert": "GatewayJobsRefused",
            "expr": f"max by (gateway) (increase(gpuhost_gateway_jobs_refused{sel}[5m])) > 0",
            "labels": {"severity": "warning", "gateway": g.name},
            "annotations": {"summary": f"{g.name}: the full queue refused submits in the last 5 minutes"},
        },
        {
            "alert": "GatewayBackendDrained",
            "expr": f"max by (gateway, backend) (gpuhost_gateway_backend_healthy{sel}) == 0",
            "for": g.drained_for,
            "labels": {"severity": "critical", "gateway": g.name},
            "annotations": {"summary": f"{g.name}: backend {{{{ $labels.backend }}}} is drained (health or XID)"},
        },
        {
            "alert": "GatewayWorkerDown",
            "expr": f'up{{job="{JOB_GATEWAY}",gateway="{g.name}"}} == 0',
            "for": "1m",
            "labels": {"severity": "critical", "gateway": g.name},
            "annotations": {"summary": f"{g.name}: worker {{{{ $labels.instance }}}} is down"},
        },
    ]


def rule_groups(graph: MonitoringGraph) -> list[dict[str, Any]]:
    if not graph.gateways:
        return []
    return [
        {"name": "gpuhost-gateway-recording", "rules": recording_rules()},
        *({"name": f"gpuhost-gateway-{g.name}", "rules": alerts(g)} for g in graph.gateways),
    ]


# ------------------------------------------------------------------ promtool test cases


def _rule(g: GatewayTarget, name: str) -> dict[str, Any]:
    return next(r for r in alerts(g) if r["alert"] == name)


def _exp(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    exp = {**labels, **rule["labels"]}
    ann = {
        k: v.replace("{{ $labels.backend }}", exp.get("backend", "")).replace(
            "{{ $labels.instance }}", exp.get("instance", "")
        )
        for k, v in rule["annotations"].items()
    }
    return {"exp_labels": exp, "exp_annotations": ann}


def rule_tests(g: GatewayTarget) -> list[dict[str, Any]]:
    worker = {
        "job": JOB_GATEWAY,
        "instance": val.host_port(g.address, g.metrics_ports[0]),
        "host": g.host,
        "gateway": g.name,
        "consumer": f"{g.name}-0",
        "stream": "gen:queue",
    }
    cases: list[dict[str, Any]] = []
    # p95: 10 jobs/s, all in the bucket just above (fires) or just below (does not) the SLO.
    above = [b for b in BUCKETS if b > g.p95_latency_s]
    below = [b for b in BUCKETS if b < g.p95_latency_s]
    bounds = [(fmt(b), b) for b in BUCKETS] + [("+Inf", float("inf"))]
    # An SLO beyond the histogram's range cannot be tested from buckets; the rule still renders.
    pairs = [(above[0], True), (below[-1], False)] if above and below else []
    gateway = {"gateway": g.name}
    for upper, fires in pairs:
        series = [
            (
                "gpuhost_gateway_job_latency_seconds_bucket" + series_labels({**worker, "backend": "b", "le": le_text}),
                f"0+{600 if le >= upper else 0}x15",
            )
            for le_text, le in bounds
        ]
        rule = _rule(g, "GatewayP95AboveSlo")
        cases.append(promtool_case("1m", series, rule, [("12m", [_exp(rule, gateway)] if fires else [])]))
    backlog = g.max_depth * g.backlog_ratio
    rule = _rule(g, "GatewayQueueBacklog")
    for depth, fires in ((min(g.max_depth, int(backlog) + 1), True), (int(backlog) - 1, False)):
        series = [("gpuhost_gateway_queue_depth" + series_labels(worker), f"{depth}x10")]
        cases.append(promtool_case("15s", series, rule, [("2m", [_exp(rule, gateway)] if fires else [])]))
    rule = _rule(g, "GatewayBackendDrained")
    healthy = {**worker, "backend": "vm-b"}
    series = [("gpuhost_gateway_backend_healthy" + series_labels(healthy), "1 1 0x10")]
    cases.append(
        promtool_case("15s", series, rule, [("30s", []), ("2m", [_exp(rule, {**gateway, "backend": "vm-b"})])])
    )
    rule = _rule(g, "GatewayJobsRefused")
    series = [("gpuhost_gateway_jobs_refused" + series_labels(worker), "0 0 0 4 4")]
    cases.append(promtool_case("1m", series, rule, [("2m", []), ("4m", [_exp(rule, gateway)])]))
    rule = _rule(g, "GatewayWorkerDown")
    up = {"job": JOB_GATEWAY, "instance": worker["instance"], "host": g.host, "gateway": g.name}
    cases.append(
        promtool_case(
            "30s", [("up" + series_labels(up), "1 1 0 0 0 0 0")], rule, [("1m", []), ("3m", [_exp(rule, up)])]
        )
    )
    return cases
