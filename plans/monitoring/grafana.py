"""Grafana provisioning as code: the Prometheus datasource (fixed uid) and two dashboards built with
grafana-foundation-sdk.

Usage::

    files = provisioning_files(graph, prometheus_url="http://127.0.0.1:9090")
    # {"datasources/gpuhost.yaml": ..., "dashboards/gpuhost.yaml": ..., "dashboards/gpuhost/gpu.json": ..., ...}
    for d in dashboards(graph):            # grafana_foundation_sdk.models.dashboard.Dashboard objects
        print(d.uid, [p.title for p in d.panels])

Every query names `DATASOURCE_UID`, the uid the datasource file provisions, so a dashboard never binds to whatever
datasource happens to be the default. Thresholds come from the stack's SLOs (the strictest service wins on the shared
serving dashboard). `queries(graph)` lists every PromQL expression and variable query for the tests that check each one
parses and that each metric it reads is really exported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.builders import stat, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prom_m

from plans.monitoring import rules as r
from plans.monitoring import yaml_text
from plans.monitoring.model import GpuSlo, MonitoringGraph

DATASOURCE_UID = "gpuhost-prometheus"
DATASOURCE_NAME = "gpuhost Prometheus"
DASHBOARD_FOLDER = "gpuhost"
GPU_DASHBOARD_UID = "gpuhost-gpu"
SERVING_DASHBOARD_UID = "gpuhost-serving"

DS = model.DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)


@dataclass(frozen=True)
class VariableQuery:
    """A `label_values(metric, label)` template variable: the metric must be exported for the variable to fill."""

    name: str
    metric: str
    label: str
    matchers: str = ""

    @property
    def query(self) -> str:
        return f"label_values({self.metric}{self.matchers}, {self.label})"


def _target(expr: str, legend: str, ref: str) -> prom.Dataquery:
    return prom.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DS)


def _thresholds(limit: Optional[float]) -> dash.ThresholdsConfig:
    steps = [model.Threshold(value=None, color="green")]
    if limit is not None:
        steps.append(model.Threshold(value=limit, color="red"))
    return dash.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(steps)


def _ts(
    title: str,
    unit: str,
    targets: list[tuple[str, str]],
    *,
    limit: Optional[float] = None,
    description: str = "",
    width: int = 12,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .unit(unit)
        .datasource(DS)
        .span(width)
        .height(8)
        .thresholds(_thresholds(limit))
        .line_width(1)
        .fill_opacity(10)
        .legend(
            common_b.VizLegendOptions()
            .display_mode(common_m.LegendDisplayMode.LIST)
            .placement(common_m.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common_b.VizTooltipOptions().mode(common_m.TooltipDisplayMode.MULTI).sort(common_m.SortOrder.DESCENDING)
        )
    )
    if description:
        panel = panel.description(description)
    if limit is not None:
        panel = panel.thresholds_style(
            common_b.GraphThresholdsStyleConfig().mode(common_m.GraphTresholdsStyleMode.LINE)
        )
    for i, (expr, legend) in enumerate(targets):
        panel = panel.with_target(_target(expr, legend, chr(ord("A") + i)))
    return panel


def _variable(v: VariableQuery, label: str) -> dash.QueryVariable:
    return (
        dash.QueryVariable(v.name)
        .label(label)
        .datasource(DS)
        .query(v.query)
        .multi(True)
        .include_all(True)
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
    )


def _dashboard(
    title: str, uid: str, tags: list[str], since: str, variables: Iterable[tuple[VariableQuery, str]]
) -> dash.Dashboard:
    """A read-only gpuhost dashboard refreshed every 30 s, showing from `since` (e.g. "now-3h") to now, with its
    query variables, each with its label."""
    d = dash.Dashboard(title).uid(uid).tags(["gpuhost", *tags]).refresh("30s").time(since, "now").readonly()
    for v, label in variables:
        d = d.with_variable(_variable(v, label))
    return d


# --------------------------------------------------------------------------------------------- GPU dashboard

GPU_VARIABLES = (
    VariableQuery("host", "DCGM_FI_DEV_GPU_UTIL", "host"),
    VariableQuery("gpu", "DCGM_FI_DEV_GPU_UTIL", "gpu", '{host=~"$host"}'),
    VariableQuery("node", "node_uname_info", "host"),
)
_GPU = '{host=~"$host",gpu=~"$gpu"}'
_NODE = '{host=~"$node"}'
_PER_GPU = "{{host}} GPU{{gpu}}"


def _gpu_ts(title: str, unit: str, *fields: str | tuple[str, str], **panel: Any) -> timeseries.Panel:
    """A time series of DCGM fields, one line per GPU of the chosen hosts; a field given as (field, word) has the
    word in its legend. ``panel``: _ts's keywords."""
    named = [(f, "") if isinstance(f, str) else f for f in fields]
    targets = [(f"{f}{_GPU}", f"{_PER_GPU} {word}" if word else _PER_GPU) for f, word in named]
    return _ts(title, unit, targets, **panel)


def gpu_dashboard(graph: MonitoringGraph) -> dash.Dashboard:
    """Two rows: the GPUs as DCGM reports them (thresholds from the GPU SLO), the machines as node exporter does."""
    labels = ("Host", "GPU", "Machine (node exporter)")
    d = _dashboard("gpuhost / GPUs", GPU_DASHBOARD_UID, ["gpu", "dcgm"], "now-3h", zip(GPU_VARIABLES, labels))
    d = d.with_row(dash.Row("GPU (DCGM)"))
    for panel in _gpu_panels(graph.gpu):
        d = d.with_panel(panel)
    d = d.with_row(dash.Row("Machines (node exporter)"))
    for panel in _machine_panels():
        d = d.with_panel(panel)
    return d


def _gpu_panels(g: GpuSlo) -> list[Builder[model.Panel]]:
    return [
        _gpu_ts("GPU utilization", "percent", "DCGM_FI_DEV_GPU_UTIL"),
        _gpu_ts(
            "SM occupancy / SM active",
            "percentunit",
            ("DCGM_FI_PROF_SM_OCCUPANCY", "occupancy"),
            ("DCGM_FI_PROF_SM_ACTIVE", "active"),
            description="Seed 001 §8 SM_OCCUPANCY, seed 004 sm_util.",
        ),
        _gpu_ts(
            "Frame buffer free",
            "mbytes",
            "DCGM_FI_DEV_FB_FREE",
            limit=g.fb_free_min_mib,
            description="Alert below 1.5 GB free (seed 001 §8).",
        ),
        _gpu_ts("Frame buffer used", "mbytes", "DCGM_FI_DEV_FB_USED"),
        _gpu_ts("PCIe throughput", "Bps", ("DCGM_FI_PROF_PCIE_TX_BYTES", "TX"), ("DCGM_FI_PROF_PCIE_RX_BYTES", "RX")),
        _gpu_ts("Memory copy utilization", "percent", "DCGM_FI_DEV_MEM_COPY_UTIL"),
        _gpu_ts("Power", "watt", "DCGM_FI_DEV_POWER_USAGE"),
        _gpu_ts("Temperature", "celsius", "DCGM_FI_DEV_GPU_TEMP", limit=g.temperature_max_c),
        _ts("SM clock", "hertz", [(f"DCGM_FI_DEV_SM_CLOCK{_GPU} * 1000000", _PER_GPU)]),
        stat.Panel()
        .title("Last XID error")
        .datasource(DS)
        .span(12)
        .height(8)
        .thresholds(_thresholds(1))
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .with_target(_target(f"max by (host, gpu) (DCGM_FI_DEV_XID_ERRORS{_GPU})", _PER_GPU, "A")),
    ]


def _machine_panels() -> list[Builder[model.Panel]]:
    rx = 'rate(node_network_receive_bytes_total{host=~"$node",device!="lo"}[$__rate_interval])'
    tx = 'rate(node_network_transmit_bytes_total{host=~"$node",device!="lo"}[$__rate_interval])'
    return [
        _ts(
            "CPU busy",
            "percentunit",
            [
                (
                    '1 - avg by (host) (rate(node_cpu_seconds_total{mode="idle",host=~"$node"}[$__rate_interval]))',
                    "{{host}}",
                )
            ],
        ),
        _ts("Memory available", "bytes", [(f"node_memory_MemAvailable_bytes{_NODE}", "{{host}}")]),
        _ts(
            "Hugepages free / total",
            "short",
            [
                (f"node_memory_HugePages_Free{_NODE}", "{{host}} free"),
                (f"node_memory_HugePages_Total{_NODE}", "{{host}} total"),
            ],
            description="Seed 000 §3: VM memory comes from reserved hugepages.",
        ),
        _ts("Network", "Bps", [(rx, "{{host}} {{device}} rx"), (tx, "{{host}} {{device}} tx")]),
    ]


# ----------------------------------------------------------------------------------------- serving dashboard

SERVING_VARIABLES = (
    VariableQuery("service", "nv_inference_request_success", "service"),
    VariableQuery("model", "nv_inference_request_success", "model", '{service=~"$service"}'),
    VariableQuery("instance", "nv_inference_request_success", "instance", '{service=~"$service"}'),
)
_SEL = '{service=~"$service",model=~"$model",instance=~"$instance"}'
_PER_MODEL = "{{service}} {{model}}"


def _strictest(graph: MonitoringGraph, attr: str) -> Optional[float]:
    values = [getattr(s.slo, attr) for s in graph.services]
    return min(values) if values else None


def serving_dashboard(graph: MonitoringGraph) -> dash.Dashboard:
    p95_ms = _strictest(graph, "p95_latency_ms")
    queue_ms = _strictest(graph, "queue_duration_ms")
    failure_ratio = _strictest(graph, "max_failure_ratio")
    summary = "nv_inference_request_summary_us"
    labels = ("Service", "Model", "Instance")
    d = (
        _dashboard(
            "gpuhost / Serving (Triton)", SERVING_DASHBOARD_UID, ["triton"], "now-1h", zip(SERVING_VARIABLES, labels)
        )
        .with_panel(_ts("QPS", "reqps", [(f"sum by (service, model) ({r.REC_QPS}{_SEL})", _PER_MODEL)]))
        .with_panel(
            _ts(
                "Request latency p50 / p95 / p99",
                "ms",
                [
                    (
                        f'{summary}{{quantile="{q}",service=~"$service",model=~"$model",instance=~"$instance"}} / 1000',
                        f"{_PER_MODEL} {name}",
                    )
                    for q, name in (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"))
                ],
                limit=p95_ms,
                description="Triton summary latencies; the red line is the p95 SLO (seed 004).",
            )
        )
        .with_panel(
            _ts(
                "Queue vs compute time per request",
                "ms",
                [
                    (f"{r.REC_QUEUE_AVG}{_SEL} / 1000", _PER_MODEL + " queue"),
                    (f"{r.REC_COMPUTE_AVG}{_SEL} / 1000", _PER_MODEL + " compute"),
                    (f"{r.REC_REQUEST_AVG}{_SEL} / 1000", _PER_MODEL + " request"),
                ],
                limit=queue_ms,
                description="The red line is the queue alert (20 ms for 1 min, seed 001 §8).",
            )
        )
        .with_panel(
            _ts(
                "Average batch size",
                "short",
                [(f"{r.REC_BATCH_AVG}{_SEL}", _PER_MODEL)],
                description="nv_inference_count / nv_inference_exec_count: is dynamic batching batching?",
            )
        )
        .with_panel(
            _ts(
                "Failures",
                "reqps",
                [
                    (
                        f"sum by (service, model, reason) (rate(nv_inference_request_failure{_SEL}[$__rate_interval]))",
                        _PER_MODEL + " {{reason}}",
                    ),
                ],
            )
        )
        .with_panel(
            _ts("Failure ratio", "percentunit", [(f"{r.REC_FAILURE_RATIO}{_SEL}", _PER_MODEL)], limit=failure_ratio)
        )
        .with_panel(
            _ts(
                "Pending requests (queue depth)",
                "short",
                [(f"sum by (service, model) (nv_inference_pending_request_count{_SEL})", _PER_MODEL)],
            )
        )
        .with_panel(
            _ts(
                "Executions per second",
                "short",
                [(f"sum by (service, model) (rate(nv_inference_exec_count{_SEL}[$__rate_interval]))", _PER_MODEL)],
            )
        )
    )
    if any(s.window_port is not None for s in graph.services):
        d = d.with_panel(window_panel())
    return d


WINDOW_PANEL_TITLE = "Adaptive batching window: window, p95, target"
_WIN_SEL = '{service=~"$service",model=~"$model"}'  # the controller's own instance, not Triton's


def window_panel() -> timeseries.Panel:
    """Seed 004's adaptive window: the micro-batching window the controller set (right axis, µs) against the p95
    it decided on and the target (left axis, ms); one step per period shows as a staircase."""
    panel = _ts(
        WINDOW_PANEL_TITLE,
        "ms",
        [
            (f"gpuhost_adaptive_window_p95_ms{_WIN_SEL}", _PER_MODEL + " p95"),
            (f"gpuhost_adaptive_window_target_p95_ms{_WIN_SEL}", _PER_MODEL + " target"),
            (f"gpuhost_adaptive_window_us{_WIN_SEL}", _PER_MODEL + " window (µs, right)"),
        ],
        description="Client micro-batching window moved in process every period, ±step toward the p95 target, "
        "inside the clamp (serving/adaptive_window.py, job adaptive_window).",
        width=24,
    )
    return panel.override_by_query(
        "C",
        [
            model.DynamicConfigValue(id_val="unit", value="µs"),
            model.DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
        ],
    )


# ----------------------------------------------------------------------------------------------- provisioning


def dashboards(graph: MonitoringGraph) -> list[model.Dashboard]:
    out = [gpu_dashboard(graph).build(), serving_dashboard(graph).build()]
    for d in out:
        # Stable panel ids keep shared links and alert annotations pointing at the same panel across renders.
        for i, p in enumerate(d.panels or [], start=1):
            p.id_val = i
    return out


def dashboard_json(d: model.Dashboard) -> str:
    return json.dumps(d, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def datasource_yaml(prometheus_url: str) -> str:
    data = {
        "apiVersion": 1,
        "datasources": [
            {
                "name": DATASOURCE_NAME,
                "uid": DATASOURCE_UID,
                "type": "prometheus",
                "access": "proxy",
                "url": prometheus_url,
                "isDefault": True,
                "editable": False,
                "jsonData": {"timeInterval": "15s"},
            }
        ],
    }
    return yaml_text(data, sort_keys=False)


def dashboard_provider_yaml(dashboards_dir: str) -> str:
    data = {
        "apiVersion": 1,
        "providers": [
            {
                "name": "gpuhost",
                "folder": DASHBOARD_FOLDER,
                "type": "file",
                "disableDeletion": True,
                "allowUiUpdates": False,
                # Grafana re-reads the directory this often: placing a new JSON is the reload.
                "updateIntervalSeconds": 10,
                "options": {"path": dashboards_dir, "foldersFromFilesStructure": False},
            }
        ],
    }
    return yaml_text(data, sort_keys=False)


def provisioning_files(
    graph: MonitoringGraph, prometheus_url: str, dashboards_dir: str = "/var/lib/grafana/dashboards/gpuhost"
) -> dict[str, str]:
    """Relative path (under Grafana's provisioning dir, or `dashboards_dir` for the JSON) -> content."""
    files = {
        "datasources/gpuhost.yaml": datasource_yaml(prometheus_url),
        "dashboards/gpuhost.yaml": dashboard_provider_yaml(dashboards_dir),
    }
    for d in dashboards(graph):
        files[f"json/{d.uid}.json"] = dashboard_json(d)
    return files


def _panels(d: model.Dashboard) -> list[model.Panel]:
    return [p for p in (d.panels or []) if isinstance(p, model.Panel)]


def queries(graph: MonitoringGraph) -> list[str]:
    """Every PromQL expression of every dashboard panel, in order."""
    out: list[str] = []
    for d in dashboards(graph):
        for p in _panels(d):
            out += [t.expr for t in (p.targets or []) if isinstance(t, prom_m.Dataquery)]  # every target is PromQL
    return out


def variable_queries() -> tuple[VariableQuery, ...]:
    return GPU_VARIABLES + SERVING_VARIABLES
