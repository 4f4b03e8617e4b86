"""The p95 alert and the latency panels read series that a Triton started with gpuhost's own arguments exports.

A real Triton (pytriton wheel, CPU) runs with the arguments `plans.triton_runtime.server_args` generates for a
TritonService (only the repository, ports and loopback addresses swapped for the test's); a real Prometheus (Debian's)
scrapes it with the generated scrape config and rules. After some load, every expression of the p95 alert (its
recording rule and the alert's left-hand side) and every target of every latency panel (unit ms) of the serving
dashboard returns data. Without `--metrics-config=summary_latencies=true` in the generated arguments, the summary
series, hence all of these, never exist (checked against a plain start too).
"""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from plans.monitoring import grafana, prometheus, promql, rules
from plans.monitoring.model import MonitoringGraph
from plans.triton_repo import repository_files, resnet50_fp16, standin
from plans.triton_runtime import ServerOptions, server_args
from testbed.servers import prometheus as prom_server
from testbed.servers.triton import STANDIN_MODEL, start_triton, triton_available
from tests.promlive import infer_load, local_graph

pytestmark = pytest.mark.skipif(
    not (prom_server.available() and triton_available()), reason="Debian prometheus / pytriton's tritonserver missing"
)

MODEL = "resnet50"
# The test's own values for what start_triton sets (repository, ports, addresses) or what would stop a test run.
_OWN = ("--model-repository=", "--http-port=", "--grpc-port=", "--metrics-port=", "--exit-on-error=")


def generated_args(specs) -> list[str]:
    return [a for a in server_args(ServerOptions(), specs) if not a.startswith(_OWN)]


def _specs():
    # No response cache: identical load requests would all be cache hits, measuring the cache, not the model.
    return [
        standin(
            resnet50_fp16().model_copy(
                update={
                    "name": MODEL,
                }
            ),
            sleep_ms=3,
        )
    ]


def _populate(repo):
    for path, content in repository_files(_specs(), gpu_count=0, model_py=STANDIN_MODEL.read_bytes()).items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(content)


def _inputs(httpclient) -> list:
    x = httpclient.InferInput("input", [1, 3, 224, 224], "FP16")
    x.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float16), binary_data=True)
    return [x]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    base = tmp_path_factory.mktemp("metrics-live")
    (base / "models").mkdir()
    _populate(base / "models")
    args = generated_args(_specs())
    with start_triton(base / "models", workdir=base / "triton", extra_args=args) as triton:
        port = prom_server.free_port()
        (base / "prom").mkdir()
        graph = local_graph(
            "resnet-svc", MODEL, metrics_port=triton.ports["metrics"], prom_port=port, workdir=base / "prom"
        )  # the rules file lands in Prometheus's workdir
        with prom_server.start_prometheus(
            prometheus.render_config(graph),
            workdir=base / "prom",
            port=port,
            extra_files={"gpuhost.rules.yml": rules.render_rules(graph)},
        ) as prom:
            prom.wait_for('up{job="triton"} == 1', timeout=30)
            t0 = time.monotonic()
            sent = infer_load(triton.http_url, MODEL, _inputs, seconds=4, threads=3)
            prom.wait_for(f"{rules.REC_P95} > 0", timeout=30)
            prom.wait_for(f"{rules.REC_QUEUE_AVG} >= 0", timeout=30)
            yield {
                "graph": graph,
                "prom": prom,
                "triton": triton,
                "args": args,
                "sent": sent,
                "ready_s": time.monotonic() - t0,
            }


def p95_alert_expressions(graph: MonitoringGraph) -> list[str]:
    """The p95 alert's expression without its threshold, and the recording rule it reads."""
    data = rules.rules(graph)
    alert = next(r for g in data["groups"] for r in g["rules"] if "p95" in r.get("alert", "").lower())
    lhs = re.split(r"\s+>\s+", alert["expr"])[0]
    recorded = next(r["expr"] for g in data["groups"] for r in g["rules"] if r.get("record") == rules.REC_P95)
    return [lhs, recorded]


def latency_panel_targets(graph: MonitoringGraph) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for d in grafana.dashboards(graph):
        for p in grafana._panels(d):
            unit = p.field_config.defaults.unit if p.field_config and p.field_config.defaults else None
            if unit == "ms":
                out[str(p.title)] = [promql.expand_grafana(getattr(t, "expr", "")) for t in p.targets or []]
    return out


def test_generated_arguments_turn_latency_summaries_on(served):
    assert "--metrics-config=summary_latencies=true" in served["args"]
    import urllib.request

    text = urllib.request.urlopen(served["triton"].metrics_url + "/metrics", timeout=5).read().decode()
    assert re.search(rf'^nv_inference_request_summary_us{{model="{MODEL}",.*quantile="0.95".*}} [0-9.e+]+$', text, re.M)


def test_every_p95_alert_expression_has_data(served):
    prom, graph = served["prom"], served["graph"]
    exprs = p95_alert_expressions(graph)
    assert rules.REC_P95 in exprs[0] and "summary" in exprs[1]
    for e in exprs:
        result = prom.query(e)
        assert result, f"no data for {e}"
        assert {r["metric"].get("model") for r in result} == {MODEL}
    labels = prom.query(exprs[0])[0]["metric"]
    assert (labels["service"], labels["tenant"]) == ("resnet-svc", "tenant-a")


def test_every_latency_panel_has_data(served):
    prom = served["prom"]
    panels = latency_panel_targets(served["graph"])
    assert {"Request latency p50 / p95 / p99", "Queue vs compute time per request"} <= set(panels)
    empty = {e for exprs in panels.values() for e in exprs if not prom.query(e)}
    assert not empty, empty
    p95 = prom.query(next(e for e in panels["Request latency p50 / p95 / p99"] if '"0.95"' in e))
    assert 0 < float(p95[0]["value"][1]) < 5000  # ms: the stand-in sleeps 3 ms per batch


def test_without_the_flag_the_summaries_do_not_exist(tmp_path):
    """The control: the same Triton without gpuhost's flag exports no summary, so the alert could never fire."""
    import urllib.request

    (tmp_path / "models").mkdir()
    _populate(tmp_path / "models")
    plain = [a for a in generated_args(_specs()) if not a.startswith("--metrics-config")]
    with start_triton(tmp_path / "models", workdir=tmp_path / "t", extra_args=plain) as triton:
        infer_load(triton.http_url, MODEL, _inputs, seconds=1, threads=1)
        text = urllib.request.urlopen(triton.metrics_url + "/metrics", timeout=5).read().decode()
    assert "nv_inference_request_success" in text and "nv_inference_request_summary_us" not in text


def test_with_the_response_cache_triton_exports_no_request_summary(tmp_path):
    """Why no shipped preset enables the response cache: with it on, this Triton exports no
    nv_inference_request_summary_us for the model at all (only queue/compute summaries), so the p95 alert and the
    p50/p95/p99 panel read nothing for it, and identical gate requests would measure cache hits."""
    import urllib.request

    (tmp_path / "models").mkdir()
    cached = [standin(resnet50_fp16().model_copy(update={"name": MODEL, "response_cache": True}), sleep_ms=3)]
    for path, content in repository_files(cached, gpu_count=0, model_py=STANDIN_MODEL.read_bytes()).items():
        (tmp_path / "models" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "models" / path).write_bytes(content)
    args = generated_args(cached)
    assert any(a.startswith("--cache-config=") for a in args)
    with start_triton(tmp_path / "models", workdir=tmp_path / "t", extra_args=args) as triton:
        infer_load(triton.http_url, MODEL, _inputs, seconds=1, threads=1)
        text = urllib.request.urlopen(triton.metrics_url + "/metrics", timeout=5).read().decode()
    assert "nv_cache_num_hits" in text and "nv_inference_queue_summary_us" in text
    assert "nv_inference_request_summary_us" not in text
