"""Monitoring as pure planners: the stack graph in, Prometheus/Grafana/DCGM configuration text out.

Modules: `model` (targets and SLOs), `prometheus` (prometheus.yml), `rules` (recording/alerting rules and their
promtool unit tests), `dcgm` (dcgm-exporter counters and container), `grafana` (datasource and dashboards as code),
`promql` (metric names an expression reads), `files` (the set of files placed on the monitoring host),
`alerting` (what `rules` and `gateway` share: number and label notation, the promtool test case).
"""

from typing import Any

import yaml

# libyaml's emitter where PyYAML has it: the same text as yaml.safe_dump (checked on the hk-prod and 100-host rules,
# rule tests and prometheus.yml), about 10x faster on the 100-host rules.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def yaml_text(data: Any, **kw: Any) -> str:
    """`yaml.safe_dump(data, **kw)`, through libyaml when available."""
    return yaml.dump(data, Dumper=_DUMPER, **kw)
