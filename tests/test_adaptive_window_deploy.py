"""Deploying the adaptive window: stack config → TritonService → a systemd unit beside Triton.

The program runs under Pulumi mocks (no engine, no guest here: declared resources only); the unit's command line
and the Triton flags it needs are then run for real against a real Triton (pytriton wheel, CPU).
"""

import json
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from plans.adaptive_window import (
    SCRIPT_PATH,
    UNIT_NAME,
    UNIT_PATH,
    AdaptiveWindow,
    controller_argv,
    controller_unit,
    server_flags,
    with_flags,
)
from plans.triton_runtime import parse_unit_exec
from providers.systemd_service import SystemdServiceProvider, parse_status, start_lines, stop_lines
from stacks.load import ConfigError, parse_fleet
from testbed.mocks import run_program
from testbed.servers.triton import free_port, triton_fixture, write_sleep_model
from testbed.stackfiles import stack_config

ROOT = Path(__file__).resolve().parents[1]


def fleet_with(window, service=1):
    cfg, secret = stack_config("hk-prod")
    fleet = json.loads(cfg["gpuhost:fleet"])
    if window is not None:
        fleet["services"][service]["adaptive_window"] = window
    return cfg, secret, fleet


def test_seed_values_are_the_defaults():
    w = AdaptiveWindow()
    assert (w.target_p95_ms, w.step_us, w.period_s, w.min_us, w.max_us) == (50.0, 50, 10.0, 200, 1500)


@pytest.mark.parametrize(
    "window, line",
    [
        ({"min_us": 1500, "max_us": 200}, "fleet.services[1].adaptive_window: max_us: 1500"),
        ({"step_us": 0}, "fleet.services[1].adaptive_window.step_us: 0 is out of range (use a value at least 1)"),
        ({"step_us": 500, "min_us": 200, "max_us": 400}, "fleet.services[1].adaptive_window: step_us: 500 µs"),
        (
            {"target_p95_ms": -1},
            "fleet.services[1].adaptive_window.target_p95_ms: -1 is out of range (use a value above 0)",
        ),
        ({"period": 10}, "fleet.services[1].adaptive_window.period: Extra inputs are not permitted"),
    ],
)
def test_bad_adaptive_window_is_refused_with_its_config_path(window, line):
    _, _, fleet = fleet_with(window)
    with pytest.raises(ConfigError) as e:
        parse_fleet(fleet)
    assert any(
        ln.startswith(line.split(": ", 1)[0]) and line.split(": ", 1)[1].split(" ")[0] in ln for ln in e.value.lines
    ), e.value.lines


def test_controller_unit_runs_the_controller_with_the_configured_values():
    spec = AdaptiveWindow(target_p95_ms=48, period_s=5)
    unit = controller_unit(
        spec, ["resnet50", "yolo"], triton_url="http://127.0.0.1:8000", metrics_url="http://127.0.0.1:8002"
    )
    argv, _env = parse_unit_exec(unit)
    assert argv == controller_argv(
        spec, ["resnet50", "yolo"], triton_url="http://127.0.0.1:8000", metrics_url="http://127.0.0.1:8002"
    )
    assert argv[:2] == ["/usr/bin/python3", SCRIPT_PATH]
    assert argv[argv.index("--target-p95-ms") + 1] == "48" and argv[argv.index("--period-s") + 1] == "5"
    assert argv[argv.index("--min-us") + 1] == "200" and argv[argv.index("--max-us") + 1] == "1500"
    assert "WantedBy=multi-user.target" in unit and "Restart=always" in unit


def test_flags_are_added_once():
    args = ["--model-repository=/models", "--metrics-config=summary_latencies=true"]
    out = with_flags(args, server_flags())
    assert out == args + ["--model-control-mode=explicit", "--load-model=*"]
    assert with_flags(out, server_flags()) == out
    assert "--metrics-config=summary_quantiles=0.95:0.001" in with_flags(
        ["--metrics-config=summary_quantiles=0.95:0.001"], server_flags()
    )


def test_service_provider_scripts_and_status():
    assert start_lines("gpuhost-adaptive-window.service", "restart", [], None) == [
        "systemctl daemon-reload",
        "systemctl enable --quiet gpuhost-adaptive-window.service",
        "systemctl restart gpuhost-adaptive-window.service",
        "systemctl is-active --quiet gpuhost-adaptive-window.service",
    ]
    # A unit that did not exist before is stopped and disabled; one found enabled and running is left so.
    assert stop_lines("x.service", {"enabled": "", "active": "inactive"}) == [
        "systemctl stop x.service 2>/dev/null || true",
        "systemctl disable --quiet x.service 2>/dev/null || true",
    ]
    assert stop_lines("nginx", {"enabled": "enabled", "active": "active"}) == []
    files, enabled, active = parse_status("@@file /etc/x\nABSENT\n@@unit\nenabled=enabled\nactive=failed\n")
    assert not files["/etc/x"].exists and enabled and not active
    # A unit without [Install] cannot be enabled more than static: no drift that `up` could never repair.
    assert parse_status("@@unit\nenabled=static\nactive=active\n")[1:] == (True, True)
    assert parse_status("@@unit\nenabled=disabled\nactive=inactive\n")[1:] == (False, False)
    host = {"name": "h", "address": "10.0.0.1", "host_key": "ssh-ed25519 " + "A" * 68}
    provider = SystemdServiceProvider()
    good = {"host": host, "unit": "x.service", "files": {"/etc/systemd/system/x.service": "[Unit]\n"}}
    assert provider.check({}, good).failures == []
    bad = {**good, "unit": "x.service; rm -rf /"}
    assert [f.property for f in provider.check({}, bad).failures] == ["unit", "files"]
    elsewhere = {**good, "files": {"/tmp/x.service": ""}}
    assert [f.reason for f in provider.check({}, elsewhere).failures] == [
        "must include the unit file /etc/systemd/system/x.service"
    ]


def _service_resources(rec, service):
    comp = next(r for r in rec.of_type("gpuhost:serving:TritonService") if r.name == service)
    return [r for r in rec.registrations if r.parent == comp.urn]


def _triton_argv(children):
    for r in children:
        if r.type == "docker:index/container:Container":
            cmd = r.inputs["command"]
            # /bin/sh -c '. <key file> && exec tritonserver <args>': the arguments as the shell splits them.
            return shlex.split(cmd[2].split(" && exec ", 1)[1]) if cmd[0] == "/bin/sh" else cmd
        if r.name.endswith("-triton-unit"):
            return parse_unit_exec(r.inputs["content"])[0]
    raise AssertionError("no Triton runtime among " + str([r.name for r in children]))


def test_mocked_program_deploys_the_controller_only_where_config_asks_for_it():
    cfg, secret, fleet = fleet_with({"target_p95_ms": 48, "period_s": 10}, service=1)
    fleet["services"][4]["adaptive_window"] = {}
    cfg["gpuhost:fleet"] = json.dumps(fleet)
    rec = run_program(cfg, secret, stack="hk-prod")
    assert rec.duplicate_urns() == []
    # (the stack's InferenceGateway runs its Redis and workers as SystemdServices too)
    units = [u for u in rec.of_type("pulumi-python:dynamic/host:SystemdService") if u.inputs["unit"] == UNIT_NAME]
    assert sorted(u.name for u in units) == ["resnet-a10-adaptive-window", "resnet-rhel-adaptive-window"]
    for service, target in (("resnet-a10", "48"), ("resnet-rhel", "50")):
        children = _service_resources(rec, service)
        unit = next(r for r in children if r.name == f"{service}-adaptive-window")
        assert unit.inputs["unit"] == UNIT_NAME
        assert unit.inputs["files"][SCRIPT_PATH] == (ROOT / "serving" / "adaptive_window.py").read_text()
        argv, _ = parse_unit_exec(unit.inputs["files"][UNIT_PATH])
        assert argv[argv.index("--target-p95-ms") + 1] == target
        assert argv[argv.index("--model") + 1] == "resnet50"
        server = next(r for r in children if r.name in (f"{service}-triton", f"{service}-triton-unit"))
        assert server.urn in unit.dependencies
        triton_argv = _triton_argv(children)
        assert all(f in triton_argv for f in server_flags()), triton_argv
    # A service that does not ask keeps Triton's default (polling-free, no explicit control) flags.
    plain = _triton_argv(_service_resources(rec, "yolo-rt"))
    assert "--model-control-mode=explicit" not in plain


def standin(repo):
    write_sleep_model(repo, "standin", sleep_ms=1.0, max_batch_size=8, max_queue_delay_microseconds=300, dims=(4,))


triton = triton_fixture(standin, extra_args=tuple(server_flags()))


def test_deployed_command_line_runs_against_triton_started_with_the_deployed_flags(triton):
    port = free_port()
    spec = AdaptiveWindow(period_s=1, listen=f"127.0.0.1:{port}")
    argv = controller_argv(
        spec,
        ["standin"],
        triton_url=triton.http_url,
        metrics_url=triton.metrics_url,
        python=sys.executable,
        script=str(ROOT / "serving" / "adaptive_window.py"),
    )
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        text = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and 'action="hold"} 1' not in text:
            time.sleep(0.3)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                continue
        published = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/window", timeout=2))
        served = json.load(urllib.request.urlopen(triton.http_url + "/v2/models/standin/config", timeout=5))
    finally:
        proc.terminate()
        out = proc.communicate(timeout=10)[0]
    # No traffic: the controller holds the published window (no evidence to move on); Triton's own window (300 µs,
    # the server-side bound) is not the controller's to move.
    assert 'gpuhost_adaptive_window_us{model="standin"} 600' in text, out
    assert 'gpuhost_adaptive_window_decisions_total{model="standin",action="hold"} 1' in text, out
    assert 'gpuhost_adaptive_window_errors_total{model="standin"} 0' in text, out
    assert published == {"standin": 600}, out
    assert served["dynamic_batching"]["max_queue_delay_microseconds"] == 300
    assert proc.returncode == 0, out


def test_operator_reloads_tritons_window_by_hand_at_most_once_per_interval(triton, tmp_path):
    """The only way Triton's window changes: the operator's command on the host, rate limited per model."""
    script = [sys.executable, str(ROOT / "serving" / "adaptive_window.py"), "reload-triton-window"]
    state = tmp_path / "reloads.json"
    common = ["--triton-url", triton.http_url, "--model", "standin", "--state", str(state)]

    def served():
        config = json.load(urllib.request.urlopen(triton.http_url + "/v2/models/standin/config", timeout=5))
        return config["dynamic_batching"]["max_queue_delay_microseconds"]

    def run(*extra):
        return subprocess.run(script + common + list(extra), capture_output=True, text=True, timeout=120)

    before = served()
    first = run("--window-us", "450")
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"standin: Triton window {before} -> 450 µs by reload" in first.stdout
    assert served() == 450
    second = run("--window-us", "500")
    assert second.returncode == 2 and "refused: standin: Triton's window was reloaded" in second.stdout
    assert "one reload per 600 s: next allowed in" in second.stdout
    assert served() == 450  # refused before any request to Triton
    # Once the interval has passed (the recorded time moved back), the next reload goes through.
    state.write_text(json.dumps({"standin": json.loads(state.read_text())["standin"] - 601}))
    third = run("--window-us", str(before))
    assert third.returncode == 0, third.stdout + third.stderr
    assert served() == before


# ------------------------------------------------------------------ the controller's /metrics as a scrape target


def _window_graph(rules_path="/etc/prometheus/rules/gpuhost.rules.yml"):
    from plans.monitoring.model import HostTarget, MonitoringGraph, TritonTarget

    return MonitoringGraph(
        hosts=(HostTarget(name="gpu-a", address="10.0.0.5", role="host"),),
        guests=(HostTarget(name="gpu-a-t1", address="10.20.1.11", role="guest", tenant="t1", gpu_driver=True),),
        services=(
            TritonTarget(name="win", address="10.20.1.11", host="gpu-a-t1", tenant="t1", window_port=9108),
            TritonTarget(name="plain", address="10.0.0.5", host="gpu-a"),
            TritonTarget(name="win6", address="fd00::7", host="gpu-a", window_port=9200),
        ),
        rules_path=rules_path,
    )


def test_scrape_config_has_one_adaptive_window_target_per_service_that_runs_the_controller():
    from plans.monitoring import prometheus

    jobs = {j["job_name"]: j for j in prometheus.scrape_jobs(_window_graph())}
    groups = jobs["adaptive_window"]["static_configs"]
    assert [(g["targets"], g["labels"]) for g in groups] == [
        (["10.20.1.11:9108"], {"host": "gpu-a-t1", "tenant": "t1", "service": "win"}),
        (["[fd00::7]:9200"], {"host": "gpu-a", "tenant": "shared", "service": "win6"}),
    ]
    none = _window_graph().model_copy(update={"services": _window_graph().services[1:2]})
    assert "adaptive_window" not in {j["job_name"] for j in prometheus.scrape_jobs(none)}


@pytest.mark.skipif(not Path("/usr/bin/promtool").exists(), reason="Debian promtool not installed")
def test_mocked_program_scrapes_every_adaptive_window_controller_and_promtool_accepts_the_config(tmp_path):
    """Stack config → MonitoringFiles' prometheus.yml (the file gpuhost places on the monitoring host), checked by the
    real promtool; the program runs under Pulumi mocks (no monitoring host here)."""
    import yaml

    from testbed.servers import prometheus as prom

    cfg, secret, fleet = fleet_with({"target_p95_ms": 48}, service=1)
    fleet["services"][4]["adaptive_window"] = {"listen": "0.0.0.0:9200"}
    cfg["gpuhost:fleet"] = json.dumps(fleet)
    rec = run_program(cfg, secret, stack="hk-prod")
    files = next(r for r in rec.of_type("pulumi-python:dynamic/monitoring:MonitoringFiles")).inputs["files"]
    path = next(p for p in files if p.endswith("/prometheus.yml"))
    doc = yaml.safe_load(files[path])
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    triton = {g["labels"]["service"]: g for g in jobs["triton"]["static_configs"]}
    window = {g["labels"]["service"]: g for g in jobs["adaptive_window"]["static_configs"]}
    names = [s["name"] for s in fleet["services"]]
    assert sorted(window) == sorted([names[1], names[4]])
    for service, port in ((names[1], "9108"), (names[4], "9200")):
        address = triton[service]["targets"][0].rsplit(":", 1)[0]  # where that service's Triton is scraped
        assert window[service]["targets"] == [f"{address}:{port}"]
        assert window[service]["labels"] == triton[service]["labels"]
    # promtool: the placed config with its rule file where it can read it
    rules_path = next(p for p in files if p.endswith(".rules.yml"))
    (tmp_path / "gpuhost.rules.yml").write_text(files[rules_path])
    doc["rule_files"] = [str(tmp_path / "gpuhost.rules.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    rc, out = prom.promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert rc == 0, out
    # not vacuous: promtool rejects the same job with a target that is no host:port
    window[names[1]]["targets"] = ["10.20.1.11:9108/metrics"]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    rc, out = prom.promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert rc != 0, out


def test_a_loopback_only_controller_is_refused_when_monitoring_scrapes_it():
    _, _, fleet = fleet_with({"listen": "127.0.0.1:9108"})
    with pytest.raises(ConfigError) as e:
        parse_fleet(fleet)
    assert e.value.lines == [
        "fleet.services[1].adaptive_window.listen: 127.0.0.1:9108 is loopback only; Prometheus on the monitoring "
        "host scrapes the controller there (listen on 0.0.0.0:PORT)"
    ]
