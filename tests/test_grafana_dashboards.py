"""Grafana provisioning generated with grafana-foundation-sdk: loads back, binds to the provisioned datasource, parses."""

import json
from pathlib import Path

import pytest
import yaml
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prom_model

from plans.monitoring import dcgm, grafana, promql, rules
from plans.monitoring.model import MonitoringGraph
from testbed.servers.prometheus import available, promtool

FIXTURES = Path(__file__).parent / "fixtures" / "monitoring"


@pytest.fixture(scope="module")
def graph():
    return MonitoringGraph.model_validate(json.loads((FIXTURES / "graph.json").read_text()))


@pytest.fixture(scope="module")
def files(graph):
    return grafana.provisioning_files(graph, prometheus_url="http://127.0.0.1:9090")


def _load(text: str) -> model.Dashboard:
    register_default_plugins()  # lets from_json decode prometheus targets and panel options into typed models
    return model.Dashboard.from_json(json.loads(text))


def _panels(d: model.Dashboard) -> list[model.Panel]:
    """The dashboard's panels (rows left out)."""
    return [p for p in d.panels or [] if isinstance(p, model.Panel)]


def _steps(p: model.Panel) -> list:
    """The threshold steps of a panel that has thresholds."""
    assert p.field_config is not None and p.field_config.defaults.thresholds is not None, p.title
    return p.field_config.defaults.thresholds.steps


def test_datasource_file_provisions_the_fixed_uid(files):
    ds = yaml.safe_load(files["datasources/gpuhost.yaml"])["datasources"]
    assert [(d["uid"], d["type"], d["url"]) for d in ds] == [
        (grafana.DATASOURCE_UID, "prometheus", "http://127.0.0.1:9090")
    ]
    provider = yaml.safe_load(files["dashboards/gpuhost.yaml"])["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"] == "/var/lib/grafana/dashboards/gpuhost"


def test_dashboards_load_back_and_every_query_uses_the_provisioned_uid(files):
    uid = yaml.safe_load(files["datasources/gpuhost.yaml"])["datasources"][0]["uid"]
    seen = {}
    for name in ("json/gpuhost-gpu.json", "json/gpuhost-serving.json"):
        d = _load(files[name])
        panels = _panels(d)
        assert panels, name
        for p in panels:
            assert p.datasource is not None and p.datasource.uid == uid, (name, p.title)
            assert p.targets, (name, p.title)
            for t in p.targets:
                assert isinstance(t, prom_model.Dataquery), (name, p.title, type(t))
                ds = t.datasource
                assert ds is not None and (ds["uid"] if isinstance(ds, dict) else getattr(ds, "uid", None)) == uid
                assert t.expr
        for v in d.templating.list_val or []:
            assert v.datasource is not None and v.datasource.uid == uid
        seen[d.uid] = {p.title for p in panels}
        # Round trip: the model re-encodes to the same JSON.
        assert grafana.dashboard_json(d) == files[name]
    assert {
        "GPU utilization",
        "SM occupancy / SM active",
        "Frame buffer free",
        "PCIe throughput",
        "Power",
        "Temperature",
    } <= seen[grafana.GPU_DASHBOARD_UID]
    assert {
        "QPS",
        "Request latency p50 / p95 / p99",
        "Queue vs compute time per request",
        "Average batch size",
        "Failures",
    } <= seen[grafana.SERVING_DASHBOARD_UID]


def test_a_panel_on_another_datasource_is_caught(files):
    data = json.loads(files["json/gpuhost-gpu.json"])
    data["panels"][1]["datasource"] = {"type": "prometheus", "uid": "someone-elses"}
    d = _load(json.dumps(data))
    wrong = [p.title for p in _panels(d) if p.datasource is None or p.datasource.uid != grafana.DATASOURCE_UID]
    assert wrong == [data["panels"][1]["title"]]


def test_thresholds_come_from_the_slos(graph):
    serving = grafana.serving_dashboard(graph).build()
    by_title = {p.title: p for p in _panels(serving)}
    steps = _steps(by_title["Request latency p50 / p95 / p99"])
    # The strictest service SLO in the graph (yolo, 50 ms) is the line on the shared dashboard.
    assert [s.value for s in steps] == [None, min(s.slo.p95_latency_ms for s in graph.services)]
    queue = _steps(by_title["Queue vs compute time per request"])
    assert queue[-1].value == 20.0
    tighter = graph.model_copy(update={"gpu": graph.gpu.model_copy(update={"fb_free_min_mib": 2048})})
    fb = {p.title: p for p in _panels(grafana.gpu_dashboard(tighter).build())}["Frame buffer free"]
    assert _steps(fb)[-1].value == 2048


def test_every_dashboard_and_rule_expression_parses_with_promtool(graph, tmp_path):
    if not available():
        pytest.skip("promtool not installed")
    exprs = [promql.expand_grafana(e) for e in grafana.queries(graph)] + rules.expressions(graph)
    check = {
        "groups": [
            {"name": "parse", "rules": [{"record": f"gpuhost_parse:e{i}", "expr": e} for i, e in enumerate(exprs)]}
        ]
    }
    (tmp_path / "parse.yml").write_text(yaml.safe_dump(check))
    rc, out = promtool("check", "rules", str(tmp_path / "parse.yml"))
    assert rc == 0, out
    assert f"SUCCESS: {len(exprs)} rules found" in out


def test_promtool_parse_check_catches_a_broken_expression(tmp_path):
    if not available():
        pytest.skip("promtool not installed")
    check = {"groups": [{"name": "parse", "rules": [{"record": "gpuhost_parse:bad", "expr": "sum by (model (x)"}]}]}
    (tmp_path / "parse.yml").write_text(yaml.safe_dump(check))
    rc, out = promtool("check", "rules", str(tmp_path / "parse.yml"))
    assert rc != 0 and "parse error" in out


def test_dcgm_metrics_used_are_in_the_generated_counters_file(graph):
    counters = dcgm.exported_metrics(dcgm.counters_csv())
    used = set()
    for e in grafana.queries(graph) + rules.expressions(graph):
        used |= {m for m in promql.metric_names(e) if m.startswith("DCGM_")}
    used |= {v.metric for v in grafana.variable_queries() if v.metric.startswith("DCGM_")}
    assert used, "dashboards and rules read DCGM metrics"
    assert used <= counters, used - counters
    # And what the seeds watch is on.
    assert {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_XID_ERRORS",
    } <= counters


def test_a_dcgm_field_missing_from_the_counters_file_is_reported(graph):
    without_occupancy = tuple(c for c in dcgm.COUNTERS if c.field != "DCGM_FI_PROF_SM_OCCUPANCY")
    counters = dcgm.exported_metrics(dcgm.counters_csv(without_occupancy))
    dcgm_exprs = [e for e in grafana.queries(graph) if "DCGM_" in e]
    missing = promql.unexported(dcgm_exprs, counters)
    assert {m for ms in missing.values() for m in ms} == {"DCGM_FI_PROF_SM_OCCUPANCY"}


@pytest.mark.parametrize(
    "expr, names",
    [
        (
            'sum by (service, model) (rate(nv_inference_count{model=~"$model"}[$__rate_interval]))',
            {"nv_inference_count"},
        ),
        ("rate(a_total[1m]) / ignoring (reason) group_left (x) b", {"a_total", "b"}),
        (
            '1 - avg without (cpu) (rate(node_cpu_seconds_total{mode="idle"}[5m])) > bool 0.5',
            {"node_cpu_seconds_total"},
        ),
        ("gpuhost:triton_batch_size:avg1m offset 5m and on (model) up", {"gpuhost:triton_batch_size:avg1m", "up"}),
        ('histogram_quantile(0.95, sum by (le) (rate(x_bucket{a="sum(y)"}[5m]))) * 1e3', {"x_bucket"}),
    ],
)
def test_metric_names_lexer(expr, names):
    assert promql.metric_names(expr) == names


def test_dcgm_container_is_pinned_and_uses_the_counters_file():
    spec = dcgm.container_spec()
    assert not spec.image.endswith(":latest") and ":" in spec.image.rsplit("/", 1)[1]
    args = dcgm.docker_run_args(spec)
    assert args[args.index("--gpus") + 1] == "all"
    assert args[args.index("-f") + 1] == dcgm.COUNTERS_PATH
    assert "SYS_ADMIN" in args  # profiling fields (DCGM_FI_PROF_*) need it
    with pytest.raises(ValueError):
        dcgm.container_spec(image="nvcr.io/nvidia/k8s/dcgm-exporter:latest")
    with pytest.raises(ValueError):
        dcgm.parse_counters_csv("DCGM_FI_DEV_GPU_UTIL, histogram, nope\n")


def test_adaptive_window_panel_is_in_the_generated_json_where_a_service_runs_the_controller(graph):
    """Seed 004's panel: window (right axis, µs), p95 and target (ms), per service and model; only in stacks whose
    services run an adaptive-window controller (otherwise its metrics would exist nowhere)."""
    assert grafana.WINDOW_PANEL_TITLE not in json.dumps(
        json.loads(grafana.provisioning_files(graph, "http://p")["json/gpuhost-serving.json"])
    )
    first = graph.services[0].model_copy(update={"window_port": 9108})
    windowed = graph.model_copy(update={"services": (first, *graph.services[1:])})
    serving = json.loads(grafana.provisioning_files(windowed, "http://p")["json/gpuhost-serving.json"])
    (panel,) = [p for p in serving["panels"] if p.get("title") == grafana.WINDOW_PANEL_TITLE]
    exprs = {t["refId"]: t["expr"] for t in panel["targets"]}
    assert exprs == {
        "A": 'gpuhost_adaptive_window_p95_ms{service=~"$service",model=~"$model"}',
        "B": 'gpuhost_adaptive_window_target_p95_ms{service=~"$service",model=~"$model"}',
        "C": 'gpuhost_adaptive_window_us{service=~"$service",model=~"$model"}',
    }
    assert panel["fieldConfig"]["defaults"]["unit"] == "ms"
    (override,) = panel["fieldConfig"]["overrides"]
    assert override["matcher"] == {"id": "byFrameRefID", "options": "C"}
    assert {p["id"]: p["value"] for p in override["properties"]} == {"unit": "µs", "custom.axisPlacement": "right"}
    assert all(t["datasource"]["uid"] == grafana.DATASOURCE_UID for t in panel["targets"])
    # Every metric the panel reads is one the controller exports.
    from serving.adaptive_window import ModelState, WindowPolicy, render_metrics

    exported = render_metrics(WindowPolicy(), {"m": ModelState(window_us=600, p95_ms=12.0)})
    assert all(
        promql.metric_names(e) <= {ln.split("{")[0] for ln in exported.splitlines() if not ln.startswith("#")}
        for e in exprs.values()
    )
