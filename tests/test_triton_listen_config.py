"""Where Triton listens, from stack config (issue 38 §1): loopback unless `services[].triton_listen` names an IP;
the loader says, one line per field, where a reader on another machine needs one."""

from __future__ import annotations

import json

import pytest

from stacks.load import ConfigError, parse_fleet
from testbed.mocks import run_program
from testbed.stackfiles import stack_config


def hk_fleet() -> dict:
    cfg, _ = stack_config("hk-prod")
    return json.loads(cfg["gpuhost:fleet"])


def lines(fleet: dict) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse_fleet(fleet)
    return [ln.strip().removeprefix("- ") for ln in str(e.value).splitlines()[1:]]


@pytest.mark.parametrize("value", ["triton.example", "0.0.0.0:8000", "10.0.0.300", "10.0.0.5\n"])
def test_a_triton_listen_that_is_not_an_ip_is_refused_with_its_path(value):
    fleet = hk_fleet()
    fleet["services"][0]["triton_listen"] = value
    got = lines(fleet)
    assert len(got) == 1 and got[0].startswith("fleet.services[0].triton_listen: "), got


def test_a_gateway_on_another_machine_needs_the_backends_triton_listen():
    fleet = hk_fleet()
    del fleet["services"][3]["triton_listen"]
    assert lines(fleet) == [
        "fleet.gateways[0].backends[1].service: sdxl-4090's Triton listens on loopback only and gateway sdxl-gen "
        "runs on a100-mig-01: set fleet.services[3].triton_listen to the address the gateway reaches it at "
        "(e.g. 10.20.4.11)"
    ]


def test_the_program_binds_loopback_metrics_for_prometheus_and_the_given_address():
    cfg, secret = stack_config("hk-prod")
    rec = run_program(cfg, secret, stack="hk-prod")
    by_name = {r.name: r for r in rec.registrations}
    # yolo-rt (docker, no triton_listen): HTTP and gRPC published on loopback, metrics on the guest's address.
    ports = {p["internal"]: p["ip"] for p in by_name["yolo-rt-triton"].inputs["ports"]}
    assert ports == {8000: "127.0.0.1", 8001: "127.0.0.1", 8002: "10.20.1.11"}
    # sdxl-4090: everything on its triton_listen, where the gateway on another host connects.
    ports = {p["internal"]: p["ip"] for p in by_name["sdxl-4090-triton"].inputs["ports"]}
    assert ports == {8000: "10.20.4.11", 8001: "10.20.4.11", 8002: "10.20.4.11"}
    assert "server 10.20.4.11:8000;" in by_name["sdxl-4090-nginx-conf"].inputs["content"]
    # resnet-rhel (process runtime): the unit's own flags.
    unit = by_name["resnet-rhel-triton-unit"].inputs["content"]
    assert '"--http-address=127.0.0.1"' in unit and '"--metrics-address=10.20.5.11"' in unit
    assert "0.0.0.0" not in unit
