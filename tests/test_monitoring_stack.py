"""MonitoringStack under Pulumi mocks: what it declares, with which inputs, parents and dependencies.

Docker containers are mocks-only here (no Docker engine on this machine): these tests check the declared
containers' inputs, not running containers.
"""

import json
from pathlib import Path

import pulumi
import pytest
import yaml

from access.ssh import HostSpec
from plans.monitoring import dcgm
from plans.monitoring.model import MonitoringGraph
from tests.componentmocks import docker_outputs, use_mocks

FIXTURES = Path(__file__).parent / "fixtures" / "monitoring"


def _spec(name, address):
    return HostSpec(name=name, address=address, user="ops", host_key="ssh-ed25519 " + "A" * 68)


def _args(**over):
    from components.monitoring_stack import MonitoringStackArgs

    graph = MonitoringGraph.model_validate(json.loads((FIXTURES / "graph.json").read_text()))
    machines = {m.name: _spec(m.name, m.address) for m in graph.machines}
    return MonitoringStackArgs(graph=graph, monitoring_host=_spec("mon01", "10.20.0.5"), machines=machines, **over)


def _run(args):
    """Run a fresh program under mocks; returns the recorded resource registrations."""
    from components.monitoring_stack import MonitoringStack

    mocks = use_mocks(docker_outputs, stack_key=True)

    @pulumi.runtime.test
    def program():
        stack = MonitoringStack("mon", args)
        return pulumi.Output.all(stack.prometheus_url, stack.urn).apply(lambda v: v)

    program()
    return mocks.resources


@pytest.fixture(scope="module")
def declared():
    return _run(_args())


def _by_type(resources, typ):
    return [r for r in resources if r.typ == typ]


def test_declares_component_type_and_unique_urns(declared):
    names = [(r.typ, r.name) for r in declared]
    assert len(names) == len(set(names)), "duplicate URNs"
    assert any(t == "gpuhost:monitoring:MonitoringStack" for t, _ in names)
    assert all(n.startswith("mon-") for t, n in names if t != "gpuhost:monitoring:MonitoringStack")


def test_mocked_containers_node_exporter_everywhere_dcgm_only_where_the_driver_is(declared):
    containers = {r.name: r.inputs for r in _by_type(declared, "docker:index/container:Container")}
    assert {n for n in containers if n.endswith("-node-exporter")} == {
        "mon-hk-gpu01-node-exporter",
        "mon-vm-tenant-a-node-exporter",
        "mon-vm-tenant-b-node-exporter",
    }
    assert {n for n in containers if n.endswith("-dcgm-exporter")} == {
        "mon-vm-tenant-a-dcgm-exporter",
        "mon-vm-tenant-b-dcgm-exporter",
    }
    d = containers["mon-vm-tenant-a-dcgm-exporter"]
    assert d["gpus"] == "all" and d["capabilities"]["adds"] == ["SYS_ADMIN"]
    assert d["command"][:2] == ["-f", dcgm.COUNTERS_PATH]
    images = {r.inputs["name"] for r in _by_type(declared, "docker:index/remoteImage:RemoteImage")}
    assert images and not any(i.endswith(":latest") for i in images)
    assert dcgm.DCGM_EXPORTER_IMAGE in images
    assert "--web.enable-lifecycle" in containers["mon-prometheus"]["command"]


def test_counters_file_and_monitoring_files_are_declared_with_real_content(declared):
    files = [r for r in declared if r.typ.startswith("pulumi-python:dynamic")]
    counters = [r for r in files if r.name.endswith("-dcgm-counters")]
    assert len(counters) == 2 and all(r.inputs["content"] == dcgm.counters_csv() for r in counters)
    mon = next(r for r in files if r.name == "mon-files")
    placed = mon.inputs["files"]
    cfg = yaml.safe_load(placed["/etc/gpuhost/prometheus/prometheus.yml"])
    assert cfg["rule_files"] == ["/etc/prometheus/rules/gpuhost.rules.yml"]
    assert {j["job_name"] for j in cfg["scrape_configs"]} == {"prometheus", "node", "dcgm", "triton"}
    assert "/etc/gpuhost/grafana/provisioning/datasources/gpuhost.yaml" in placed
    assert "/etc/gpuhost/grafana/dashboards/gpuhost-serving.json" in placed
    assert mon.inputs["reload"]["kind"] == "http" and mon.inputs["version"]


def test_first_deploy_reload_tolerates_a_prometheus_not_started_yet(declared):
    from providers.monitoring import reload_command

    mon = next(r for r in declared if r.name == "mon-files")
    cmd = reload_command(mon.inputs["reload"])
    assert cmd.startswith("if curl") and "/-/ready" in cmd and "/-/reload" in cmd


def test_unpinned_image_or_unreachable_machine_is_rejected():
    with pytest.raises(ValueError, match="pinned"):
        _args(grafana_image="grafana/grafana:latest")
    from components.monitoring_stack import MonitoringStackArgs

    a = _args()
    with pytest.raises(ValueError, match="no access spec"):
        MonitoringStackArgs(graph=a.graph, monitoring_host=a.monitoring_host, machines={})
