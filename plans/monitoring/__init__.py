"""Monitoring as pure planners: the stack graph in, Prometheus/Grafana/DCGM configuration text out.

Modules: `model` (targets and SLOs), `prometheus` (prometheus.yml), `rules` (recording/alerting rules and their
promtool unit tests), `dcgm` (dcgm-exporter counters and container), `grafana` (datasource and dashboards as code),
`promql` (metric names an expression reads), `files` (the set of files placed on the monitoring host).
"""
