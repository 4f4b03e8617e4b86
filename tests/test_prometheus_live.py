"""A real Prometheus (Debian's) scrapes a real Triton (pytriton wheel) and a real node exporter, on loopback.

One Prometheus, one Triton and one node exporter for the whole module; scrape and rule evaluation every second.
Every PromQL expression of the generated rules and dashboards must parse in Prometheus's query API, and every
Triton/node metric they read must return data from this scrape; DCGM metrics are checked against the generated
counters file in test_grafana_dashboards.py, since no DCGM can run here (no GPU).
"""

import threading

import numpy as np
import pytest

from plans.monitoring import grafana, prometheus, promql, rules
from plans.monitoring import triton as triton_plan
from plans.monitoring.model import MonitoringGraph, ServingSlo
from serving import adaptive_window as aw
from testbed.servers import node_exporter as ne_server
from testbed.servers import prometheus as prom_server
from testbed.servers.triton import triton_fixture, write_sleep_model
from tests.promlive import infer_load, local_graph

pytestmark = pytest.mark.skipif(
    not (prom_server.available() and ne_server.available()),
    reason="Debian prometheus / prometheus-node-exporter not installed",
)

MODEL = "sleep"
triton = triton_fixture(
    lambda repo: write_sleep_model(repo, MODEL, sleep_ms=2, max_batch_size=8, max_queue_delay_microseconds=2000),
    extra_args=[a for a in triton_plan.metrics_args("2.51.0") if a.startswith("--metrics-config")],
)


def _inputs(httpclient) -> list:
    x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    return [x]


@pytest.fixture(scope="module")
def stack(triton, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("prom")
    # The adaptive-window controller as the unit beside Triton runs it (p95 from Triton's summary, the clients'
    # window published), its /metrics on the port the graph names: scraped as job adaptive_window.
    api = aw.Triton(triton.http_url, triton.metrics_url)
    policy = aw.WindowPolicy(target_p95_ms=50, period_s=1, min_requests=1)
    controller = aw.Controller(policy, [MODEL], aw.TritonP95(api), aw.PublishedWindow([MODEL], 600))
    window_port = prom_server.free_port()
    window_server = aw.serve_metrics(controller, "127.0.0.1", window_port)
    stop = threading.Event()
    runner = threading.Thread(target=controller.run, args=(stop,), daemon=True)
    runner.start()
    with ne_server.start_node_exporter() as ne:
        port = prom_server.free_port()
        graph = local_graph(
            "sleepsvc",
            MODEL,
            metrics_port=triton.ports["metrics"],
            prom_port=port,
            workdir=workdir,
            node_exporter_port=int(ne.address.rsplit(":", 1)[1]),
            window_port=window_port,
        )
        with prom_server.start_prometheus(
            prometheus.render_config(graph),
            workdir=workdir,
            port=port,
            extra_files={"gpuhost.rules.yml": rules.render_rules(graph)},
        ) as prom:
            prom.wait_for('up{job="triton"} == 1', timeout=20)
            sent = infer_load(triton.http_url, MODEL, _inputs, seconds=3, threads=3)
            # rate()[1m] needs two samples with traffic between them, then one rule evaluation.
            prom.wait_for(f"{rules.REC_BATCH_AVG} > 0", timeout=20)
            # A decision taken on that traffic (2 ms model, 50 ms target: widen), scraped.
            prom.wait_for('gpuhost_adaptive_window_decisions_total{action="widen"} >= 1', timeout=20)
            yield graph, prom, sent
    stop.set()
    runner.join(timeout=10)
    window_server.shutdown()


def used_expressions(graph: MonitoringGraph) -> list[str]:
    exprs = [promql.expand_grafana(e) for e in grafana.queries(graph)] + rules.expressions(graph)
    return exprs + [v.metric for v in grafana.variable_queries()]


def missing_live_metrics(prom, exprs: list[str]) -> dict[str, set[str]]:
    """Expression -> metrics it reads (DCGM aside) for which Prometheus holds no data right now."""
    out: dict[str, set[str]] = {}
    cache: dict[str, bool] = {}
    for e in exprs:
        for m in promql.metric_names(e):
            if m.startswith("DCGM_"):
                continue
            if m not in cache:
                cache[m] = bool(prom.query(f"count({m})"))
            if not cache[m]:
                out.setdefault(e, set()).add(m)
    return out


def test_prometheus_scrapes_triton_and_node_exporter_with_stack_labels(stack):
    graph, prom, sent = stack
    jobs = {"prometheus", "node", "triton", "adaptive_window"}
    # Each target once up at the same evaluation: a scrape past its 1 s timeout on a busy machine is `up 0` for
    # that second only, so one read of `up` would fail on the machine, not on the config.
    prom.wait_for(f"count(up == 1) == {len(jobs)}", timeout=20)
    assert {r["metric"]["job"] for r in prom.query("up")} == jobs
    # Triton refreshes its counters every 200 ms and Prometheus scrapes every second: wait for the last requests.
    series = prom.wait_for(f'nv_inference_request_success{{model="{MODEL}"}} >= {sent}', timeout=10)
    assert len(series) == 1
    labels = series[0]["metric"]
    assert (labels["host"], labels["tenant"], labels["service"]) == ("local", "tenant-a", "sleepsvc")
    assert float(series[0]["value"][1]) >= sent > 0
    node = prom.query('node_uname_info{job="node"}')
    assert node and node[0]["metric"]["host"] == "local" and node[0]["metric"]["role"] == "host"


def test_prometheus_scrapes_the_adaptive_window_decisions_with_stack_labels(stack, measured):
    graph, prom, _ = stack
    series = {
        name: prom.query(f'{name}{{job="adaptive_window",model="{MODEL}"}}')
        for name in (
            "gpuhost_adaptive_window_us",
            "gpuhost_adaptive_window_p95_ms",
            "gpuhost_adaptive_window_target_p95_ms",
        )
    }
    for name, result in series.items():
        assert len(result) == 1, name
        labels = result[0]["metric"]
        assert (labels["host"], labels["tenant"], labels["service"]) == ("local", "tenant-a", "sleepsvc"), name
    assert float(series["gpuhost_adaptive_window_target_p95_ms"][0]["value"][1]) == 50
    # The window and the decisions that moved it, from one scrape (one query, one evaluation time): widened from
    # 600 µs by whole 50 µs steps (the fixture waited for a widen), one per widen less one per narrow, in the clamp.
    # Whether a period also narrowed it depends on the 2 ms model's p95 on the shared machine, so that is not assumed.
    scrape = prom.query(
        f'{{__name__=~"gpuhost_adaptive_window_us|gpuhost_adaptive_window_decisions_total",'
        f'job="adaptive_window",model="{MODEL}"}}'
    )
    window = next(float(x["value"][1]) for x in scrape if x["metric"]["__name__"] == "gpuhost_adaptive_window_us")
    actions = {x["metric"]["action"]: float(x["value"][1]) for x in scrape if "action" in x["metric"]}
    assert actions["widen"] >= 1 and actions["clamp"] == 0, actions
    assert window == 600 + 50 * (actions["widen"] - actions["narrow"]) and 200 <= window <= 1500, (window, actions)
    # The p95 the decisions were based on: finite and positive while Triton's summary holds requests (its quantiles
    # go NaN about a minute after the last one, and this test may run later than that), so over the whole run.
    p95 = prom.query(f'max_over_time(gpuhost_adaptive_window_p95_ms{{job="adaptive_window",model="{MODEL}"}}[1h])')
    assert len(p95) == 1 and 0 < float(p95[0]["value"][1]) < float("inf"), p95
    measured(f"adaptive window {window:.0f} us after {actions}; largest p95 scraped {float(p95[0]['value'][1]):.2f} ms")
    # The Grafana panel's queries return this data (the dashboard carries the panel: the graph has a window port).
    assert grafana.WINDOW_PANEL_TITLE in grafana.provisioning_files(graph, "http://p")["json/gpuhost-serving.json"]


def test_every_rule_and_dashboard_expression_parses_in_prometheus(stack):
    graph, prom, _ = stack
    exprs = used_expressions(graph)
    assert len(exprs) > 30
    for e in exprs:
        prom.query(e)  # raises QueryError (400 bad_data) on a parse error
    with pytest.raises(prom_server.QueryError) as err:
        prom.query("sum by (model (nv_inference_count)")
    assert err.value.status == 400 and "parse error" in err.value.error


def test_every_triton_and_node_metric_used_returns_data(stack):
    graph, prom, _ = stack
    exprs = used_expressions(graph)
    read = {m for e in exprs for m in promql.metric_names(e) if not m.startswith("DCGM_")}
    # Raw Triton and node metrics plus our recording rules, all fed by the real scrape.
    assert {
        "nv_inference_request_summary_us",
        "nv_inference_queue_duration_us",
        "nv_inference_exec_count",
        "node_cpu_seconds_total",
        rules.REC_BATCH_AVG,
        rules.REC_P95,
    } <= read
    assert missing_live_metrics(prom, exprs) == {}


def test_a_dashboard_querying_a_metric_nobody_exports_fails_the_check(stack):
    graph, prom, _ = stack
    typo = 'sum by (model) (rate(nv_inference_request_sucess{service=~"$service"}[$__rate_interval]))'
    exprs = used_expressions(graph) + [promql.expand_grafana(typo)]
    missing = missing_live_metrics(prom, exprs)
    assert list(missing.values()) == [{"nv_inference_request_sucess"}]


def test_recording_rules_compute_from_real_counters(stack):
    _, prom, _ = stack
    batch = prom.query(f'{rules.REC_BATCH_AVG}{{model="{MODEL}"}}')
    assert batch and 1.0 <= float(batch[0]["value"][1]) <= 8.0
    qps = prom.query(f"{rules.REC_QPS}")
    assert qps and float(qps[0]["value"][1]) > 0
    compute = float(prom.query(rules.REC_COMPUTE_AVG)[0]["value"][1])
    assert compute >= 2000  # the stand-in sleeps 2 ms per batch, in microseconds
    p95 = prom.query(rules.REC_P95)
    assert p95 and p95[0]["metric"]["quantile"] == "0.95"
    # Nothing alerts on a healthy 2 ms model with a 50 ms SLO.
    firing = prom.query('ALERTS{alertstate="firing",alertname=~"Triton.*"}')
    assert firing == []


def test_reload_picks_up_new_rules_without_restart(stack):
    graph, prom, _ = stack
    pid = prom.process.pid
    rules_file = prom.workdir / "gpuhost.rules.yml"
    original = rules_file.read_text()
    try:
        tight = graph.services[0].model_copy(update={"slo": ServingSlo(p95_latency_ms=0.001, p95_for="0s")})
        rules_file.write_text(rules.render_rules(graph.model_copy(update={"services": (tight,)})))
        prom.reload()
        prom.wait_for('ALERTS{alertname="TritonP95LatencyAboveSlo",alertstate="firing"}', timeout=15)
        assert prom.process.pid == pid and prom.process.poll() is None
    finally:
        rules_file.write_text(original)
        prom.reload()
