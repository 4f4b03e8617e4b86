"""What each provider says a change does to what runs (providers.effects): facts in, effects out, no host.

These answers become the head of a pull request's plan comment (tools/plan_diff: Restarts, Gates re-run), so each
is checked against what the provider's own update code does: the case that acts and the case that does not.
"""

from __future__ import annotations

from typing import Any

import pytest

from providers.effects import Effect, matches
from providers.irq import IrqIsolationProvider
from providers.libvirt_domain import LIVE_FIELDS, LibvirtDomainProvider
from providers.mig import MigLayoutProvider
from providers.monitoring import MonitoringFilesProvider
from providers.sriov import SriovVfsProvider
from providers.systemd_service import SystemdServiceProvider
from providers.triton_gate import AcceptanceGateProvider

HOST = {"name": "gpu-a-tenant-a", "address": "10.0.0.5", "user": "ops"}


def _svc(**kw) -> dict:
    return {"host": HOST, "unit": "gpuhost-triton", "action": "restart", "trigger": "a", **kw}


def test_a_service_restarts_on_any_update_and_says_nothing_on_create():
    p = SystemdServiceProvider()
    assert p.effects(None, _svc()) == []
    assert p.effects(_svc(), _svc(trigger="b")) == [Effect("restart", "gpu-a-tenant-a", "gpuhost-triton", "restarts")]
    (reload,) = p.effects(_svc(unit="nginx", action="reload"), _svc(unit="nginx", action="reload", trigger="b"))
    assert reload.what == "nginx" and reload.how.startswith("reloads (no restart")


def test_a_renamed_unit_stops_the_old_one_and_starts_the_new():
    stop, start = SystemdServiceProvider().effects(_svc(), _svc(unit="gpuhost-triton-b"))
    assert (stop.what, stop.how) == ("gpuhost-triton", "stops (replaced)")
    assert (start.what, start.how) == ("gpuhost-triton-b", "starts in its place")


def _dom(**domain) -> dict:
    base = {"name": "tenant-a", "memory_mib": 4096, "vcpus": 4, "vcpupin": {"0": [2]}, "emulatorpin": [1]}
    return {"host": HOST, "domain": {**base, **domain}, "cloud_init": {"user": "ops"}, "shutdown_timeout": 60}


def test_a_vm_restarts_for_a_new_definition_but_not_for_pins_applied_live():
    p = LibvirtDomainProvider()
    assert {"vcpupin", "emulatorpin"} <= LIVE_FIELDS
    assert p.effects(_dom(), _dom(vcpupin={"0": [3]}, emulatorpin=[0])) == []
    (e,) = p.effects(_dom(), _dom(memory_mib=8192))
    assert (e.host, e.what, e.kind) == ("gpu-a-tenant-a", "tenant-a", "restart") and "shuts down" in e.how
    (seed,) = p.effects(_dom(), {**_dom(), "cloud_init": {"user": "ops", "packages": ["htop"]}})
    assert seed.what == "tenant-a"
    (gone,) = p.effects(_dom(), _dom(name="tenant-b"))
    assert gone.what == "tenant-a" and "replaced" in gone.how
    assert p.effects(None, _dom()) == []


def _gate(**kw) -> dict:
    rollback = {"host": HOST, "root": "/srv/triton-repo"}
    return {"url": "http://10.0.0.5:80", "model": "yolov8n", "concurrency": 8, "duration_s": 30, "max_requests": 1000,
            "rate": None, "p95_ms": 8.0, "p99_ms": None, "max_error_rate": 0.0, "min_rps": None, "rollback": rollback,
            "trigger": "t1", **kw}  # fmt: skip


@pytest.mark.parametrize("olds", [None, _gate()], ids=["created", "replaced"])
def test_a_gate_that_runs_says_where_and_how_big_its_load_is(olds):
    (e,) = AcceptanceGateProvider().effects(olds, _gate(trigger="t2", concurrency=16, rate=400.0))
    assert (e.kind, e.host, e.what) == ("gate", "gpu-a-tenant-a", "yolov8n")
    assert e.load["connections"] == 16 and e.load["duration_s"] == 30 and e.load["max_requests"] == 1000
    assert e.load["rate_rps"] == 400.0 and e.load["p95_ms"] == 8.0 and e.load["url"] == "http://10.0.0.5:80"
    (bare,) = AcceptanceGateProvider().effects(None, _gate(rollback=None))
    assert bare.host == "10.0.0.5" and "fails the update" in bare.how


def test_a_mig_layout_change_names_only_the_gpu_whose_instances_go():
    p = MigLayoutProvider()
    old = {"host": HOST, "layout": {"0": ["3g.40gb", "3g.40gb"], "1": ["7g.80gb"]}}
    new = {"host": HOST, "layout": {"0": ["2g.20gb"] * 3, "1": ["7g.80gb"]}}
    assert [e.what for e in p.effects(old, new)] == ["GPU 0"]
    assert p.effects(old, old) == [] and p.effects(None, new) == []


def test_vfs_go_only_when_their_count_changes():
    p = SriovVfsProvider()
    old = {"host": HOST, "pf": "0000:41:00.0", "num_vfs": 8, "vfs": [{"mac": "02:00:00:00:00:01"}]}
    assert p.effects(old, {**old, "vfs": [{"mac": "02:00:00:00:00:02"}]}) == []
    (e,) = p.effects(old, {**old, "num_vfs": 4})
    assert e.what == "VFs of 0000:41:00.0" and "removed and created again" in e.how


def test_irqbalance_restarts_for_a_new_ban_list_only():
    p = IrqIsolationProvider()
    old = {"host": HOST, "banned_cpus": [2, 3], "pin": []}
    assert p.effects(old, {**old, "pin": [{"match": "nvme", "cpus": [0]}]}) == []
    assert [e.what for e in p.effects(old, {**old, "banned_cpus": [2, 3, 4]})] == ["irqbalance"]


def test_monitoring_reloads_prometheus_and_restarts_grafana_only_for_its_start_time_files():
    p = MonitoringFilesProvider()
    old: dict[str, Any] = {"host": HOST, "config_path": "/p/prometheus.yml", "grafana_unit": "grafana-server",
           "grafana_restart_on": ["/g/datasource.yaml"],
           "files": {"/p/prometheus.yml": "a", "/g/datasource.yaml": "d"}}  # fmt: skip
    (only,) = p.effects(old, {**old, "files": {**old["files"], "/p/prometheus.yml": "b"}})
    assert only.what == "Prometheus" and "no restart" in only.how
    both = p.effects(old, {**old, "files": {**old["files"], "/g/datasource.yaml": "e"}})
    assert [e.what for e in both] == ["Prometheus", "grafana-server"]


def test_derived_patterns_match_by_key_with_a_wildcard():
    assert matches(("files", "m/config.pbtxt", "sha256"), ("files", "*", "sha256"))
    assert not matches(("files", "m/config.pbtxt", "content"), ("files", "*", "sha256"))
    assert matches(("files", ".gpuhost-digest", "content"), ("files", ".gpuhost-digest"))
    assert not matches(("files",), ("files", "*", "sha256"))
