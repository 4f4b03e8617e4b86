"""MonitoringFiles through the SDK's provider server, over a real local sshd, against a real Prometheus.

Create places the generated config and rules and reloads Prometheus in place (same PID); a rules file promtool rejects
never reaches the live paths; delete restores the operator's own prometheus.yml byte for byte.
"""

import json
import os
from pathlib import Path
from typing import Any

import pytest

from plans.monitoring import prometheus, rules
from plans.monitoring.model import MonitoringGraph
from providers.base import host_input
from providers.monitoring import MonitoringFilesProvider
from testbed.provider_server import ProviderError
from testbed.servers import prometheus as prom_server

FIXTURES = Path(__file__).parent / "fixtures" / "monitoring"
pytestmark = pytest.mark.skipif(not prom_server.available(), reason="Debian prometheus not installed")

OPERATOR_CONFIG = "# hand-written by an operator\nglobal:\n  scrape_interval: 30s\nscrape_configs: []\n"


def _rule_groups(prom) -> dict[str, list[str]]:
    data = prom._get("/api/v1/rules")["data"]["groups"]
    return {g["name"]: [r["query"] for r in g["rules"]] for g in data}


def test_place_validate_reload_in_place_and_restore(local_sshd, provider_server_for, tmp_path):
    etc = tmp_path / "etc" / "prometheus"
    graph = MonitoringGraph.model_validate(json.loads((FIXTURES / "graph.json").read_text()))
    graph = graph.model_copy(update={"rules_path": str(etc / "rules" / "gpuhost.rules.yml")})
    cfg_path, rules_path = str(etc / "prometheus.yml"), graph.rules_path

    with prom_server.start_prometheus(OPERATOR_CONFIG, workdir=etc) as prom:
        graph = graph.model_copy(update={"self_address": f"127.0.0.1:{prom.port}"})
        before = (etc / "prometheus.yml").read_bytes()
        rules_dir_was = (etc / "rules").exists()  # the rules file's directory: made by create when missing
        pid = prom.process.pid
        srv = provider_server_for()
        r = srv.resource(MonitoringFilesProvider(), "gpuhost:monitoring:MonitoringFiles", "mon-files")
        inputs: dict[str, Any] = {
            "host": host_input(local_sshd.host_spec()),
            "files": {cfg_path: prometheus.render_config(graph), rules_path: rules.render_rules(graph)},
            "config_path": cfg_path,
            "rules_paths": [rules_path],
            "reload": {"kind": "http", "url": prom.url},
            "grafana_unit": None,
            "grafana_restart_on": [],
            "promtool": "promtool",
            "prior": None,
            "sha256": None,
            "version": MonitoringFilesProvider.VERSION,
        }
        op, outs = r.up(inputs)
        assert op == "create"
        assert outs["prior"][cfg_path]["exists"] and not outs["prior"][rules_path]["exists"]
        assert outs["made_dirs"] == ([] if rules_dir_was else [str(etc / "rules")])
        assert "gpuhost: monitoring" in prom.config_text()
        groups = _rule_groups(prom)
        assert any('service="yolo"} > 50000' in q for q in groups["gpuhost-serving-yolo"])
        assert prom.process.pid == pid and prom.process.poll() is None  # reloaded, not restarted

        assert r.preview(inputs).changes is False
        assert r.refresh()["files"] == inputs["files"]

        # A rules file promtool rejects: the update fails and the live files and the running rules stay as they were.
        broken = {
            **inputs,
            "files": {**inputs["files"], rules_path: "groups:\n- name: x\n  rules:\n  - record: a\n    expr: sum(\n"},
        }
        with pytest.raises(ProviderError):
            r.up(broken)
        assert Path(rules_path).read_text() == inputs["files"][rules_path]
        assert not [p for p in os.listdir(etc / "rules") if p.endswith(".gpuhost-staged")]
        assert _rule_groups(prom) == groups

        # A tighter SLO reaches the running Prometheus through the same reload.
        yolo = graph.services[0]
        tighter = graph.model_copy(
            update={
                "services": (yolo.model_copy(update={"slo": yolo.slo.model_copy(update={"p95_latency_ms": 40})}),)
                + graph.services[1:]
            }
        )
        updated = {**inputs, "files": {**inputs["files"], rules_path: rules.render_rules(tighter)}}
        assert r.up(updated)[0] == "update"
        assert any('service="yolo"} > 40000' in q for q in _rule_groups(prom)["gpuhost-serving-yolo"])
        assert prom.process.pid == pid

        r.destroy()
        assert (etc / "prometheus.yml").read_bytes() == before
        assert not os.path.exists(rules_path) and (etc / "rules").exists() == rules_dir_was
        assert "gpuhost: monitoring" not in prom.config_text()  # reloaded back onto the operator's config
        assert prom.process.pid == pid


def test_check_rejects_paths_and_reload_kind(local_sshd, provider_server_for):
    srv = provider_server_for()
    r = srv.resource(MonitoringFilesProvider(), "gpuhost:monitoring:MonitoringFiles", "bad")
    with pytest.raises(ProviderError) as e:
        r.up(
            {
                "host": host_input(local_sshd.host_spec()),
                "files": {"etc/x.yml": "a"},
                "config_path": "/nope",
                "rules_paths": [],
                "reload": {"kind": "pkill"},
                "prior": None,
                "sha256": None,
                "version": "1",
            }
        )
    assert "files" in e.value.details and "config_path" in e.value.details and "reload" in e.value.details
