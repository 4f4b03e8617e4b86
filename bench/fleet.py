"""A generated fleet shaped like Pulumi.hk-prod.yaml, for timing the whole program under Pulumi mocks.

The five GPU host templates of hk-prod (L40S real-time, 4x A10, A100 MIG, 2x RTX 4090 with ids binding, RHEL
multi-tenant with SR-IOV) are repeated with fresh names, addresses and VM addresses until the fleet has `n` hosts,
one of which is the monitoring host; every template's services are repeated with their host.

Usage::

    cfg, secret = fleet_config(100)          # stack config as testbed.mocks.run_program takes it
    rec = run_program(cfg, secret, stack="bench-100")
"""

from __future__ import annotations

import copy
import json

import yaml

from testbed.stackfiles import ROOT, stack_config


def fleet(n: int) -> dict:
    doc = yaml.safe_load((ROOT / "Pulumi.hk-prod.yaml").read_text())["config"]["gpuhost:fleet"]
    mon_name = doc["monitoring"]["host"]
    templates = [h for h in doc["hosts"] if h["name"] != mon_name]
    mon = next(h for h in doc["hosts"] if h["name"] == mon_name)
    hosts, services = [copy.deepcopy(mon)], []
    for i in range(n - 1):
        t = templates[i % len(templates)]
        h = copy.deepcopy(t)
        h["name"] = f"{t['name']}-{i:03d}"
        h["ssh"]["address"] = f"10.{20 + i // 250}.{i % 250}.11"
        if h.get("vm_network"):
            h["vm_network"]["gateway"] = f"10.{100 + i // 250}.{i % 250}.1"  # the guests' own subnet
        for j, vm in enumerate(h.get("vms", [])):
            if "address" in vm:
                vm["address"] = f"10.{100 + i // 250}.{i % 250}.{11 + j}"
        hosts.append(h)
        for s in doc.get("services", []):
            if s["host"] == t["name"]:
                s2 = copy.deepcopy(s)
                s2["name"] = f"{s['name']}-{i:03d}"
                s2["host"] = h["name"]
                services.append(s2)
    return {"hosts": hosts, "services": services, "monitoring": dict(doc["monitoring"])}


def fleet_config(n: int) -> tuple[dict, list[str]]:
    cfg, secret = stack_config("hk-prod")
    cfg = dict(cfg)
    cfg["gpuhost:fleet"] = json.dumps(fleet(n))
    return cfg, secret
