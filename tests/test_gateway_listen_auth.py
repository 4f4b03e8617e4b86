"""Where the queue gateway listens, and Redis beyond loopback only with a password from secret config.

The front listens where the stack says (loopback by default, never 0.0.0.0 by default); Redis binds loopback unless
the stack binds it elsewhere, and then only with `redis_password_secret` naming a secret config value (refused at
load otherwise, before any resource). The password reaches the host as a root-only file that the units get as a
systemd credential; it is a secret input and secret outputs, and in no other input in plaintext. The rendered
redis.conf runs in the real redis-server (the credential path replaced by the file itself, as systemd's
LoadCredential= would provide it), and the workers' and front's client code authenticates with it.
"""

from __future__ import annotations

import copy
import json
import subprocess

import pulumi
import pytest
import redis as redis_client

from plans import gateway as gw
from serving.front import redis_client as front_redis
from serving.worker import WorkerConfig, redis_password
from stacks.load import ConfigError, load
from testbed.mocks import run_program
from testbed.servers import redis as redis_srv
from testbed.servers import stop_process
from testbed.stackfiles import stack_config

PASSWORD = "Gw-redis.pass_0123456789~abc"
SECRET = "gatewayRedisPassword"


def _config(**gateway) -> tuple[dict, list[str]]:
    cfg, secret = stack_config("hk-prod")
    fleet = json.loads(cfg["gpuhost:fleet"])
    fleet["gateways"][0].update(gateway)
    cfg = {**cfg, "gpuhost:fleet": json.dumps(fleet)}
    return cfg, secret


def _load(cfg: dict, secret: list[str]) -> list[str]:
    """The load-time refusal lines of this config (what `pulumi up` prints before any resource)."""
    pulumi.runtime.set_all_config({k: v for k, v in cfg.items()}, secret)
    try:
        load(pulumi.Config("gpuhost"))
    except ConfigError as e:
        return e.lines
    return []


def test_defaults_listen_on_loopback_only():
    rec = run_program(*stack_config("hk-prod"), stack="hk-prod")
    files = rec.by_name("sdxl-gen-front").inputs["files"]
    unit = files["/etc/systemd/system/gpuhost-gateway-front.service"]
    assert '"--listen" "127.0.0.1"' in unit and "0.0.0.0" not in unit
    conf = rec.by_name("sdxl-gen-redis").inputs["files"]["/etc/gpuhost/gateway/redis.conf"]
    assert "bind 127.0.0.1\n" in conf and "requirepass" not in conf and "include" not in conf
    assert not [r for r in rec.registrations if r.name == "sdxl-gen-redis-auth"]
    worker = json.loads(rec.by_name("sdxl-gen-worker-0").inputs["files"]["/etc/gpuhost/gateway/worker.json"])
    assert "password_file" not in worker["redis"]
    # The front checks requests against the model the backends serve (sdxl's inputs, from its preset).
    assert set(worker["front"]["models"]) == {"sdxl"} and worker["front"]["models"]["sdxl"]["inputs"]


@pytest.mark.parametrize(
    "gateway, extra, message",
    [
        (
            {"redis_bind": "10.20.0.13"},
            {},
            "fleet.gateways[0].redis_bind: 10.20.0.13 is not loopback, and Redis has no password: set "
            "fleet.gateways[0].redis_password_secret: gatewayRedisPassword and "
            "`pulumi config set --secret gatewayRedisPassword <password>` (or bind 127.0.0.1)",
        ),
        (
            {"redis_bind": "0.0.0.0"},
            {},
            "fleet.gateways[0].redis_bind: 0.0.0.0 is not loopback, and Redis has no password",
        ),
        (
            {"redis_bind": "10.20.0.13", "redis_password_secret": SECRET},
            {},
            "gpuhost:gatewayRedisPassword: missing (fleet.gateways[0].redis_password_secret names it); set it with "
            "`pulumi config set --secret gatewayRedisPassword <password>`",
        ),
        (
            {"redis_bind": "10.20.0.13", "redis_password_secret": SECRET},
            {"plain": PASSWORD},
            "gpuhost:gatewayRedisPassword: stored in plaintext; re-set it with "
            "`pulumi config set --secret gatewayRedisPassword <password>` so it is encrypted and never shown",
        ),
        (
            {"redis_bind": "10.20.0.13", "redis_password_secret": SECRET},
            {"secret": "short pass\nbind 0.0.0.0"},
            "gpuhost:gatewayRedisPassword: Redis's password must be 16-256 letters, digits or ._~+/=- ; re-set it "
            "with `pulumi config set --secret gatewayRedisPassword <password>`",
        ),
        ({"redis_password_secret": "bad name!"}, {}, "fleet.gateways[0].redis_password_secret:"),
        ({"front_listen": "0.0.0.0 ; rm"}, {}, "fleet.gateways[0].front_listen:"),
    ],
)
def test_bad_listen_or_redis_auth_refused_at_load_before_any_resource(gateway, extra, message):
    cfg, secret = _config(**gateway)
    if "plain" in extra:
        cfg[f"gpuhost:{SECRET}"] = extra["plain"]
    if "secret" in extra:
        cfg[f"gpuhost:{SECRET}"] = extra["secret"]
        secret = [*secret, f"gpuhost:{SECRET}"]
    lines = _load(cfg, secret)
    assert any(message in ln for ln in lines), lines
    assert not any("short pass" in ln for ln in lines)  # a value is never quoted back


def test_bad_config_registers_nothing():
    cfg, secret = _config(redis_bind="10.20.0.13")
    from testbed.mocks import EchoMocks, RecordingMonitor

    monitor = RecordingMonitor(EchoMocks())
    pulumi.runtime.set_mocks(EchoMocks(), project="gpuhost", stack="hk-prod", preview=False, monitor=monitor)
    pulumi.runtime.set_all_config(cfg, secret)
    with pytest.raises(ConfigError, match="redis_bind"):
        load(pulumi.Config("gpuhost"))
    assert monitor.registrations == []


@pytest.fixture(scope="module")
def bound():
    cfg, secret = _config(redis_bind="10.20.0.13", redis_password_secret=SECRET, front_listen="10.20.0.13")
    cfg[f"gpuhost:{SECRET}"] = PASSWORD
    return run_program(cfg, [*secret, f"gpuhost:{SECRET}"], stack="hk-prod")


def test_redis_beyond_loopback_gets_its_password_as_a_secret(bound):
    auth = bound.by_name("sdxl-gen-redis-auth")
    assert auth.type.endswith("host:ManagedFile")
    assert auth.inputs["path"] == "/etc/gpuhost/gateway/redis-auth.conf" and auth.inputs["mode"] == "0600"
    assert auth.inputs["content"]["value"] == f"requirepass {PASSWORD}\n"
    assert "content" in auth.secret_inputs  # encrypted in state
    assert {"content", "sha256", "prior"} <= set(auth.secret_outputs)
    # Nowhere else in plaintext: not in redis.conf, worker.json, the units, exports.
    for r in bound.registrations:
        if r.name != "sdxl-gen-redis-auth":
            assert PASSWORD not in json.dumps(r.inputs, default=str), r.name
    assert PASSWORD not in json.dumps(bound.resolved_exports, default=str)
    redis_reg = bound.by_name("sdxl-gen-redis")
    assert auth.urn in redis_reg.dependencies  # the password file is there before Redis starts
    files = redis_reg.inputs["files"]
    conf = files["/etc/gpuhost/gateway/redis.conf"]
    assert "bind 10.20.0.13\n" in conf
    assert "include /run/credentials/gpuhost-gateway-redis.service/redis-auth.conf\n" in conf
    cred = "LoadCredential=redis-auth.conf:/etc/gpuhost/gateway/redis-auth.conf"
    assert cred in files["/etc/systemd/system/gpuhost-gateway-redis.service"]
    for name, unit in (("sdxl-gen-worker-1", "gpuhost-gateway-worker-1"), ("sdxl-gen-front", "gpuhost-gateway-front")):
        text = bound.by_name(name).inputs["files"][f"/etc/systemd/system/{unit}.service"]
        assert cred in text, name
    front = bound.by_name("sdxl-gen-front").inputs["files"]["/etc/systemd/system/gpuhost-gateway-front.service"]
    assert '"--listen" "10.20.0.13"' in front
    worker = json.loads(bound.by_name("sdxl-gen-worker-0").inputs["files"]["/etc/gpuhost/gateway/worker.json"])
    assert worker["redis"] == {"host": "10.20.0.13", "port": 6379, "password_file": "redis-auth.conf"}
    assert WorkerConfig.from_dict(worker).redis_password_file == "redis-auth.conf"


def test_spec_refuses_redis_beyond_loopback_without_auth():
    b = (gw.GatewayBackend(name="a", weight=1, address="10.0.0.1"),)
    with pytest.raises(ValueError, match="redis_bind 10.0.0.9 is not loopback"):
        gw.GatewaySpec(name="g", backends=b, redis_bind="10.0.0.9")
    assert gw.GatewaySpec(name="g", backends=b).front_listen == "127.0.0.1"


def test_rendered_auth_runs_in_real_redis_and_the_clients_use_it(tmp_path, monkeypatch):
    if not redis_srv.available():
        pytest.skip("redis-server is not installed")
    spec = gw.GatewaySpec(
        name="g", backends=(gw.GatewayBackend(name="a", weight=1, address="10.0.0.1"),), redis_auth=True
    )
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / gw.AUTH_NAME).write_text(gw.auth_line(PASSWORD))
    conf = gw.redis_conf(spec).replace(
        f"/run/credentials/{gw.REDIS_UNIT}/{gw.AUTH_NAME}", str(creds / gw.AUTH_NAME)
    )  # what systemd's LoadCredential= provides at that path
    (tmp_path / "redis.conf").write_text(conf)
    port = redis_srv.free_port()
    p = subprocess.Popen(
        [
            "redis-server",
            str(tmp_path / "redis.conf"),
            "--port",
            str(port),
            "--dir",
            str(tmp_path),
            "--supervised",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        import time

        deadline = time.monotonic() + 15
        while True:
            try:
                redis_client.Redis(port=port, password=PASSWORD, socket_timeout=2).ping()
                break
            except redis_client.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with pytest.raises(redis_client.AuthenticationError):
            redis_client.Redis(port=port, socket_timeout=2).ping()
        cfg = copy.deepcopy(gw.worker_config(spec))
        cfg["redis"]["port"] = port
        monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
        assert redis_password(cfg["redis"]) == PASSWORD
        assert front_redis(cfg).ping() is True  # the front's client
        wc = WorkerConfig.from_dict(cfg)
        assert redis_client.Redis(
            port=wc.redis_port, password=redis_password({"password_file": wc.redis_password_file})
        ).ping()  # what the worker builds
    finally:
        stop_process(p)
