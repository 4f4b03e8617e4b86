"""Prometheus config and rules generated from the stack graph, checked and unit-tested by the real promtool."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from plans.monitoring import prometheus, rules
from plans.monitoring.model import MonitoringGraph, ServingSlo, TritonTarget
from testbed.servers.prometheus import available, promtool

FIXTURES = Path(__file__).parent / "fixtures" / "monitoring"
pytestmark = pytest.mark.skipif(not available(), reason="Debian prometheus/promtool not installed")


def sample_graph(**over) -> MonitoringGraph:
    data = json.loads((FIXTURES / "graph.json").read_text())
    data.update(over)
    return MonitoringGraph.model_validate(data)


def _write(tmp: Path, graph: MonitoringGraph) -> Path:
    graph = graph.model_copy(update={"rules_path": str(tmp / "gpuhost.rules.yml")})
    (tmp / "gpuhost.rules.yml").write_text(rules.render_rules(graph))
    (tmp / "prometheus.yml").write_text(prometheus.render_config(graph))
    return tmp


def test_config_passes_promtool_check_config(tmp_path):
    _write(tmp_path, sample_graph())
    rc, out = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert rc == 0, out
    assert "1 rule files found" in out


def test_every_host_guest_and_service_becomes_a_labelled_target():
    g = sample_graph()
    jobs = {j["job_name"]: j for j in prometheus.scrape_jobs(g)}
    node = {sc["targets"][0]: sc["labels"] for sc in jobs["node"]["static_configs"]}
    assert node == {
        "10.20.0.11:9100": {"host": "hk-gpu01", "tenant": "shared", "role": "host"},
        "10.20.1.21:9100": {"host": "vm-tenant-a", "tenant": "tenant-a", "role": "guest"},
        "10.20.1.22:9100": {"host": "vm-tenant-b", "tenant": "tenant-b", "role": "guest"},
    }
    # The passthrough host has its GPUs on vfio-pci and no NVIDIA driver: no dcgm-exporter there.
    assert [sc["targets"][0] for sc in jobs["dcgm"]["static_configs"]] == ["10.20.1.21:9400", "10.20.1.22:9400"]
    triton = {sc["targets"][0]: sc["labels"] for sc in jobs["triton"]["static_configs"]}
    assert triton["10.20.1.21:8002"] == {"host": "vm-tenant-a", "tenant": "tenant-a", "service": "yolo"}
    assert triton["10.20.1.22:8002"]["service"] == "sdxl"


def test_graph_rejects_a_service_on_an_unknown_host():
    with pytest.raises(ValueError, match="unknown host"):
        sample_graph(services=[{"name": "x", "address": "1.2.3.4", "host": "nope"}])


def test_broken_config_is_rejected_by_promtool(tmp_path):
    _write(tmp_path, sample_graph())
    bad = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    bad["scrape_configs"][1]["static_configs"][0]["targets"] = ["no port here:"]
    bad["global"]["scrape_interval"] = "soon"
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(bad))
    rc, out = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert rc != 0 and "FAILED" in out


def test_rules_pass_promtool_check_rules(tmp_path):
    _write(tmp_path, sample_graph())
    rc, out = promtool("check", "rules", str(tmp_path / "gpuhost.rules.yml"))
    assert rc == 0 and "FAILED" not in out, out  # lint findings print FAILED with exit code 0
    g = sample_graph()
    # 7 recording rules, 3 alerts per service, 3 GPU alerts, 1 target alert.
    assert f"SUCCESS: {7 + 3 * len(g.services) + 3 + 1} rules found" in out


def test_seed_thresholds_hand_written_rule_tests_pass(tmp_path):
    _write(tmp_path, sample_graph())
    shutil.copy(FIXTURES / "seed_rules_test.yml", tmp_path)
    rc, out = promtool("test", "rules", "seed_rules_test.yml", cwd=tmp_path)
    assert rc == 0, out


def test_generated_rule_tests_pass(tmp_path):
    g = sample_graph()
    _write(tmp_path, g)
    (tmp_path / "generated_test.yml").write_text(rules.render_rule_tests(g, "gpuhost.rules.yml"))
    rc, out = promtool("test", "rules", "generated_test.yml", cwd=tmp_path)
    assert rc == 0, out


@pytest.mark.parametrize(
    "service_slo",
    [
        {"queue_duration_ms": 30.0},  # seed 001's 20 ms moved: 25 ms waits no longer alert
        {"p95_latency_ms": 60.0},  # seed 004's 50 ms moved: 51 ms p95 no longer alerts
        {"p95_for": "10m"},  # "for 5 minutes" moved: still pending at 6m
    ],
)
def test_rule_tests_fail_when_a_threshold_changes(tmp_path, service_slo):
    """The promtool tests are not vacuous: rules rendered with a mutated SLO fail both test files."""
    good = sample_graph()
    yolo = good.services[0]
    mutated_yolo = yolo.model_copy(update={"slo": yolo.slo.model_copy(update=service_slo)})
    mutated = good.model_copy(update={"services": (mutated_yolo,) + good.services[1:]})
    assert rules.render_rules(mutated) != rules.render_rules(good)

    _write(tmp_path, mutated)
    shutil.copy(FIXTURES / "seed_rules_test.yml", tmp_path)
    (tmp_path / "generated_test.yml").write_text(rules.render_rule_tests(good, "gpuhost.rules.yml"))
    rc_seed, out_seed = promtool("test", "rules", "seed_rules_test.yml", cwd=tmp_path)
    rc_gen, out_gen = promtool("test", "rules", "generated_test.yml", cwd=tmp_path)
    assert rc_seed != 0 and "FAILED" in out_seed, out_seed
    assert rc_gen != 0 and "FAILED" in out_gen, out_gen


def test_gpu_free_memory_threshold_change_fails_the_seed_test(tmp_path):
    g = sample_graph()
    _write(tmp_path, g.model_copy(update={"gpu": g.gpu.model_copy(update={"fb_free_min_mib": 1024})}))
    shutil.copy(FIXTURES / "seed_rules_test.yml", tmp_path)
    rc, out = promtool("test", "rules", "seed_rules_test.yml", cwd=tmp_path)
    assert rc != 0 and "GpuFramebufferFreeLow" in out


def test_each_service_gets_its_own_slo_threshold():
    g = sample_graph()
    exprs = {(r["alert"], r["expr"]) for grp in rules.rules(g)["groups"] for r in grp["rules"] if "alert" in r}
    assert (
        "TritonP95LatencyAboveSlo",
        'gpuhost:triton_request_duration_us:p95{job="triton",service="yolo"} > 50000',
    ) in exprs
    assert (
        "TritonP95LatencyAboveSlo",
        'gpuhost:triton_request_duration_us:p95{job="triton",service="sdxl"} > 2.5e+06',
    ) in exprs


def test_slo_durations_are_validated():
    with pytest.raises(ValueError):
        ServingSlo(p95_for="five minutes")
    with pytest.raises(ValueError):
        TritonTarget(name="Bad Name", address="x", host="h")
