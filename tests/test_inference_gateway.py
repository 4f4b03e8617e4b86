"""InferenceGateway from stack config to files: the program's wiring under Pulumi mocks (hk-prod's seed 001 host
pair), the rendered files against the real consumers (redis-server reads redis.conf, the worker reads worker.json,
promtool checks and unit-tests the rules), and HostRuntime's pure plan on captured facts.

Mocks stand in for the engine and for the SSH hosts (none exist here); everything else is real.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis as redis_client
import yaml

from components.inference_gateway import serving_code
from plans import gateway as gw
from plans import host_runtime as hr
from plans.monitoring import prometheus, rules
from plans.monitoring.model import GatewayTarget, MonitoringGraph
from plans.triton_runtime import parse_unit_exec
from providers.base import host_input
from serving.worker import WorkerConfig
from stacks.checks import fleet_problems
from stacks.schema import Fleet
from testbed.mocks import run_program
from testbed.servers import prometheus as prom
from testbed.servers import redis as redis_srv
from testbed.servers import stop_process
from testbed.stackfiles import stack_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hk():
    cfg, secret = stack_config("hk-prod")
    return run_program(cfg, secret, stack="hk-prod")


def _files(rec, name: str) -> dict[str, str]:
    return rec.by_name(name).inputs["files"]


# ------------------------------------------------------------------ program wiring (mocks)


def test_hk_prod_gateway_in_front_of_seed_001_routes(hk):
    t = hk.types()
    assert t["gpuhost:serving:InferenceGateway"] == 1
    assert t["pulumi-python:dynamic/host:HostRuntime"] == 1
    gw_reg = hk.by_name("sdxl-gen")
    children = [r for r in hk.registrations if r.parent == gw_reg.urn]
    assert sorted(r.name for r in children) == [
        "sdxl-gen-front",
        "sdxl-gen-packages",
        "sdxl-gen-redis",
        "sdxl-gen-runtime",
        "sdxl-gen-worker-0",
        "sdxl-gen-worker-1",
    ]
    # Deployed after both TritonServices and the host it runs on.
    # (the engine sees a dependency on a component as one on its children)
    deps = {hk.by_urn(u).name for u in gw_reg.dependencies}
    for component in ("sdxl-mig", "sdxl-4090", "a100-mig-01"):
        assert any(d.startswith(component + "-") for d in deps), component
    assert hk.duplicate_urns() == []

    cfg = json.loads(_files(hk, "sdxl-gen-worker-0")["/etc/gpuhost/gateway/worker.json"])
    backends = {b["name"]: b for b in cfg["backends"]}
    # mig-a route: Triton on the A100 host itself, the gateway's machine: over loopback, where Triton listens, its
    # metrics on the host's address for Prometheus; vm-b route: in the 4090 VM (its triton_listen), DCGM there too.
    assert backends["sdxl-mig"]["weight"] == 3 and backends["sdxl-mig"]["grpc"] == "127.0.0.1:8001"
    assert backends["sdxl-mig"]["metrics"] == "http://10.20.0.13:8002/metrics"
    assert "dcgm" not in backends["sdxl-mig"]
    assert backends["sdxl-4090"]["weight"] == 2 and backends["sdxl-4090"]["grpc"] == "10.20.4.11:8001"
    assert backends["sdxl-4090"]["dcgm"] == "http://10.20.4.11:9400/metrics"
    assert cfg["models"] == ["sdxl"] and cfg["queue"]["max_depth"] == 500 and cfg["slots"] == 8
    # What the worker process will read back.
    wc = WorkerConfig.from_dict(cfg)
    assert [b.weight for b in wc.backends] == [3, 2] and wc.models == ("sdxl",)

    runtime = hk.by_name("sdxl-gen-runtime").inputs["runtime"]
    assert runtime["conflicts"] == ["redis-server.service"]
    assert hk.by_name("sdxl-gen-packages").inputs["packages"] == ["redis-server", "python3-venv"]
    rt_deps = {hk.by_urn(u).name for u in hk.by_name("sdxl-gen-runtime").dependencies}
    assert rt_deps == {"sdxl-gen-packages"}  # Debian starts its own redis-server on install: stop it after
    assert runtime["requirements"] == list(gw.REQUIREMENTS)
    # Workers start after Redis; worker 1 after worker 0, which owns the code and config.
    w1 = hk.by_name("sdxl-gen-worker-1")
    assert {hk.by_urn(u).name for u in w1.dependencies} == {"sdxl-gen-redis", "sdxl-gen-worker-0"}
    assert set(_files(hk, "sdxl-gen-worker-1")) == {"/etc/systemd/system/gpuhost-gateway-worker-1.service"}
    assert hk.exports["gateways"]["sdxl-gen"] == "redis://127.0.0.1:6379/0 on a100-mig-01"
    # Redis refuses writes past a limit (the front answers 503): a quarter of a100-mig-01's 256 GiB NUMA node.
    conf = next(v for k, v in _files(hk, "sdxl-gen-redis").items() if k.endswith("redis.conf"))
    assert "\nmaxmemory 65536mb\nmaxmemory-policy noeviction\n" in conf


def test_a_gateways_redis_limit_from_config_wins_over_the_hosts_memory():
    from stacks.program import gateway_spec

    for over, want in (({}, 65536), ({"redis_maxmemory_mb": 512}, 512)):
        fleet = Fleet.model_validate(_fleet(**over))
        _, spec = gateway_spec(fleet, fleet.gateways[0], {})
        assert spec.redis_maxmemory_mb == want and f"maxmemory {want}mb" in gw.redis_conf(spec)


def test_hk_prod_monitoring_scrapes_the_workers_and_alerts(hk):
    files = hk.of_type("pulumi-python:dynamic/monitoring:MonitoringFiles")[0].inputs["files"]
    cfg = yaml.safe_load(next(v for k, v in files.items() if k.endswith("prometheus.yml")))
    job = next(j for j in cfg["scrape_configs"] if j["job_name"] == "gateway")
    assert job["static_configs"] == [
        {"targets": ["10.20.0.13:9470", "10.20.0.13:9471"], "labels": {"host": "a100-mig-01", "gateway": "sdxl-gen"}}
    ]
    text = next(v for k, v in files.items() if k.endswith("gpuhost.rules.yml"))
    alerts = {r["alert"]: r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "alert" in r}
    assert (
        alerts["GatewayP95AboveSlo"]["expr"] == 'gpuhost:gateway_job_latency_seconds:p95_5m{gateway="sdxl-gen"} > 2.5'
    )
    assert alerts["GatewayQueueBacklog"]["expr"].endswith("> 400")  # 80 % of max_depth 500


def test_code_or_config_change_restarts_every_worker(hk):
    spec = gw.GatewaySpec(name="g", backends=(gw.GatewayBackend(name="a", weight=1, address="10.0.0.1"),), workers=2)
    code = serving_code()
    before = gw.shared_files(spec, code)
    after = gw.shared_files(spec.model_copy(update={"slots": 16}), code)
    for i in range(2):
        assert gw.worker_files(spec, i, before) != gw.worker_files(spec, i, after)  # unit text carries the digest
    assert gw.worker_files(spec, 1, before).keys() == {"/etc/systemd/system/gpuhost-gateway-worker-1.service"}


def _fleet(**gateway) -> dict:
    fleet = copy.deepcopy(yaml.safe_load((ROOT / "Pulumi.hk-prod.yaml").read_text())["config"]["gpuhost:fleet"])
    fleet["gateways"] = [
        {"name": "g", "host": "a100-mig-01", "backends": [{"service": "sdxl-mig", "weight": 3}], **gateway}
    ]
    return fleet


@pytest.mark.parametrize(
    "over, message",
    [
        ({"host": "nowhere"}, "fleet.gateways[0].host: unknown host 'nowhere'"),
        ({"backends": [{"service": "nope", "weight": 1}]}, "fleet.gateways[0].backends[0].service: unknown service"),
        (
            {"backends": [{"service": "sdxl-mig", "weight": 3}, {"service": "resnet-a10", "weight": 1}]},
            "the services share no model",
        ),
        ({"backends": [{"service": "sdxl-mig", "weight": 3}, {"service": "sdxl-mig", "weight": 1}]}, "listed twice"),
        ({"queue_ms_shift": 200}, "queue_ms_shift: must be below queue_ms_drain"),
        ({"redis_port": 9471}, "collides with a worker metrics port"),
        ({"front_port": 9470}, "front_port: 9470 collides"),
        ({"backends": [{"service": "sdxl-mig", "weight": 0}]}, "greater than 0"),
        ({"redis_maxmemory_mb": 8}, "greater than or equal to 16"),
    ],
)
def test_bad_gateway_config_refused_before_any_resource(over, message):
    try:
        lines: list[str] = list(fleet_problems(Fleet.model_validate(_fleet(**over))))
    except ValueError as e:  # field-level errors
        lines = [str(e)]
    assert any(message in line for line in lines), lines


# ------------------------------------------------------------------ rendered files against their real readers


def _spec() -> gw.GatewaySpec:
    return gw.GatewaySpec(
        name="sdxl-gen",
        models=("sdxl",),
        backends=(
            gw.GatewayBackend(name="sdxl-mig", weight=3, address="10.20.0.13"),
            gw.GatewayBackend(name="sdxl-4090", weight=2, address="10.20.4.11", dcgm_port=9400),
        ),
    )


def test_worker_pins_match_requirements_txt():
    pins = {ln.split("==")[0]: ln for ln in (ROOT / "requirements.txt").read_text().splitlines() if "==" in ln}
    for req in gw.REQUIREMENTS:
        name = req.split("==")[0].split("[")[0]
        assert pins[name].split("==")[1] == req.split("==")[1], req


def test_redis_conf_runs_in_real_redis_server(tmp_path):
    if not redis_srv.available():
        pytest.skip("redis-server is not installed")
    conf = tmp_path / "redis.conf"
    conf.write_text(gw.redis_conf(_spec()))
    port = redis_srv.free_port()
    # The unit's systemd parts (supervision, state directory) are replaced for a plain foreground run.
    p = subprocess.Popen(
        ["redis-server", str(conf), "--port", str(port), "--dir", str(tmp_path), "--supervised", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        redis_srv.wait_ping(port, p)
        r = redis_client.Redis(port=port)
        assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert r.config_get("maxmemory") == {"maxmemory": str(_spec().redis_maxmemory_mb * 1024 * 1024)}
        assert r.config_get("appendonly") == {"appendonly": "yes"}
        assert r.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert r.config_get("bind")["bind"] == "127.0.0.1"
    finally:
        stop_process(p)


def test_worker_unit_runs_the_worker_with_its_config():
    spec = _spec()
    unit = gw.worker_unit(spec, 1, "abc")
    argv, _env = parse_unit_exec(unit)
    assert argv == [
        "/opt/gpuhost/gateway/venv/bin/python",
        "-m",
        "serving.worker",
        "--config",
        "/etc/gpuhost/gateway/worker.json",
        "--consumer",
        "sdxl-gen-1",
        "--metrics-port",
        "9471",
    ]
    assert "Requires=gpuhost-gateway-redis.service" in unit and "DynamicUser=yes" in unit
    argv, _env = parse_unit_exec(gw.front_unit(spec, "abc"))
    assert argv[1:] == [
        "-m",
        "serving.front",
        "--config",
        "/etc/gpuhost/gateway/worker.json",
        "--listen",
        "127.0.0.1",
        "--port",
        "8090",
        "--timeout",
        "30",
    ]
    from serving.front import main as _front  # noqa: F401

    files = gw.shared_files(spec, serving_code())
    assert set(files) >= {f"/opt/gpuhost/gateway/serving/{m}" for m in gw.SERVING_MODULES}
    for m in gw.SERVING_MODULES:
        assert files[f"/opt/gpuhost/gateway/serving/{m}"] == (ROOT / "serving" / m).read_text()


def test_the_shipped_modules_are_all_the_front_and_the_worker_import(tmp_path):
    """The gateway host gets SERVING_MODULES alone: the front and the worker import from such a copy (isolated: no
    repository on the path), with the runtime's packages."""
    (tmp_path / "serving").mkdir()
    for m in gw.SERVING_MODULES:
        (tmp_path / "serving" / m).write_text((ROOT / "serving" / m).read_text())
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import serving.front, serving.worker; print(serving.front.__file__)"
    got = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == str(tmp_path / "serving" / "front.py")


def _graph(p95_s: float = 2.5) -> MonitoringGraph:
    return MonitoringGraph(
        hosts=[{"name": "a100-mig-01", "address": "10.20.0.13", "role": "host"}],
        gateways=[
            GatewayTarget(
                name="sdxl-gen",
                address="10.20.0.13",
                host="a100-mig-01",
                metrics_ports=(9470, 9471),
                p95_latency_s=p95_s,
                max_depth=500,
            )
        ],
    )


@pytest.mark.skipif(not prom.available(), reason="Debian prometheus/promtool not installed")
def test_gateway_rules_pass_promtool_and_their_tests(tmp_path):
    g = _graph().model_copy(update={"rules_path": str(tmp_path / "gpuhost.rules.yml")})
    (tmp_path / "gpuhost.rules.yml").write_text(rules.render_rules(g))
    (tmp_path / "prometheus.yml").write_text(prometheus.render_config(g))
    rc, out = prom.promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert rc == 0, out
    rc, out = prom.promtool("check", "rules", str(tmp_path / "gpuhost.rules.yml"))
    assert rc == 0 and "FAILED" not in out, out
    (tmp_path / "t.yml").write_text(rules.render_rule_tests(g, "gpuhost.rules.yml"))
    rc, out = prom.promtool("test", "rules", "t.yml", cwd=tmp_path)
    assert rc == 0, out
    # Not vacuous: the same tests against rules with the SLO moved to 3.5 s fail.
    (tmp_path / "gpuhost.rules.yml").write_text(rules.render_rules(_graph(3.5)))
    rc, out = prom.promtool("test", "rules", "t.yml", cwd=tmp_path)
    assert rc != 0 and "GatewayP95AboveSlo" in out


# ------------------------------------------------------------------ HostRuntime's plan on captured facts

WANT = hr.Runtime(venv="/opt/gpuhost/gateway/venv", requirements=gw.REQUIREMENTS, conflicts=("redis-server.service",))


def test_fresh_host_builds_venv_and_stops_debians_redis():
    facts = hr.parse_facts("unit redis-server.service enabled active\nvenv \n")
    p = hr.plan(facts, WANT)
    assert [s.name for s in p.steps] == ["venv", "conflicts"]
    assert "'tritonclient[grpc]==2.73.0'" in p.steps[0].script  # quoted by the command builder
    assert "systemctl disable --now --quiet redis-server.service" in p.steps[1].script
    done = hr.parse_facts(f"unit redis-server.service disabled inactive\nvenv {WANT.requirements_sha256}\n")
    p = hr.plan(done, WANT)
    assert p.steps == () and "no conflicting unit" in p.noop_reason


def test_changed_pins_rebuild_the_venv():
    facts = hr.parse_facts(f"unit redis-server.service not-found unknown\nvenv {'0' * 64}\n")
    assert [s.name for s in hr.plan(facts, WANT).steps] == ["venv"]


def test_restore_puts_back_what_was_found():
    prior = hr.parse_facts("unit redis-server.service enabled active\nvenv \n")
    (step,) = hr.restore_steps(prior, WANT)
    assert "systemctl enable --quiet redis-server.service" in step.script
    assert "systemctl start redis-server.service" in step.script
    assert "rm -rf -- /opt/gpuhost/gateway/venv" in step.script
    # A venv that was there before stays; nothing recorded (create failed before reading): nothing undone.
    kept = hr.parse_facts(f"unit redis-server.service disabled inactive\nvenv {'1' * 64}\n")
    assert hr.restore_steps(kept, WANT) == []
    assert hr.restore_steps(None, WANT) == []


def test_runtime_refuses_unpinned_or_odd_values():
    with pytest.raises(ValueError, match="pinned"):
        hr.Runtime(requirements=("redis",))
    with pytest.raises(ValueError, match="systemd service unit"):
        hr.Runtime(conflicts=("redis; rm -rf /",))
    with pytest.raises(ValueError, match="dedicated"):
        hr.Runtime(venv="/usr")


def test_host_runtime_provider_builds_and_removes_the_venv_over_ssh(local_sshd, provider_server_for, tmp_path):
    """HostRuntime through the SDK's provider server against the real local sshd: a pinned venv is built once,
    a re-run changes nothing, delete removes it.
    Needs pip to reach the package index (or its cache), like `./gpuhost.sh setup` does."""
    from providers.host_runtime import HostRuntimeProvider

    venv = tmp_path / "gw" / "venv"
    want = hr.Runtime(
        venv=str(venv),
        requirements=("redis==8.1.0",),
        conflicts=("gpuhost-test-absent.service",),
    )
    srv = provider_server_for()
    r = srv.resource(HostRuntimeProvider(), "gpuhost:host:HostRuntime", "gw-runtime")
    inputs = {
        "host": host_input(local_sshd.host_spec()),
        "runtime": want.model_dump(mode="json"),
        "prior": None,
        "applied": None,
        "state": None,
        "version": HostRuntimeProvider.VERSION,
    }
    op, outs = r.up(inputs)
    assert op == "create" and outs["applied"] == ["venv"], outs
    assert outs["prior"]["venv_sha256"] == ""
    check = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import redis; print(redis.__version__)"], capture_output=True, text=True
    )
    assert check.stdout.strip() == "8.1.0", check.stderr
    assert r.up(inputs)[0] == "same"
    r.delete()
    assert not venv.exists()
