"""MonitoringStack: exporters on every machine, Prometheus + Grafana on the monitoring host, config from the graph.

Usage::

    MonitoringStack("mon", MonitoringStackArgs(
        graph=graph,                                  # plans.monitoring.model.MonitoringGraph from the stack graph
        monitoring_host=HostSpec(name="mon01", address="10.20.0.5", user="ops", host_key="ssh-ed25519 AAAA..."),
        machines={"hk-gpu01": spec_gpu01, "vm-tenant-a": spec_vm_a},   # how to reach each exporter machine
    ))

Declares, per machine: a node-exporter container; where the NVIDIA driver runs, the dcgm-exporter counters file
(ManagedFile) and a dcgm-exporter container (`--gpus all`, pinned image). On the monitoring host: MonitoringFiles
(prometheus.yml, SLO rules, Grafana datasource/dashboard provisioning and dashboards; validated with promtool and
hot-reloaded), then Prometheus and Grafana containers reading those directories. Containers go through pulumi-docker
over SSH to each host's Docker engine.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pulumi
import pulumi_docker as docker
from pydantic import BaseModel, ConfigDict, Field, model_validator

from access.ssh import HostSpec
from components.wiring import Child, DockerEngine, Wired, container, suffixes
from plans.monitoring import dcgm, grafana, prometheus, rules
from plans.monitoring.model import HostTarget, MonitoringGraph
from providers.base import host_input
from providers.managed_file import ManagedFile
from providers.monitoring import MonitoringFiles

PROMETHEUS_IMAGE = "quay.io/prometheus/prometheus:v2.53.2"
GRAFANA_IMAGE = "docker.io/grafana/grafana-oss:10.4.8"
NODE_EXPORTER_IMAGE = "quay.io/prometheus/node-exporter:v1.8.2"
DASHBOARDS_DIR = "/var/lib/grafana/dashboards/gpuhost"  # Grafana's container view of grafana_dir/dashboards


class MonitoringStackArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    graph: MonitoringGraph
    monitoring_host: HostSpec
    machines: dict[str, HostSpec]
    config_dir: str = "/etc/gpuhost/prometheus"  # mounted at /etc/prometheus in the container
    grafana_dir: str = "/etc/gpuhost/grafana"  # provisioning/ and dashboards/ below it
    prometheus_image: str = PROMETHEUS_IMAGE
    grafana_image: str = GRAFANA_IMAGE
    node_exporter_image: str = NODE_EXPORTER_IMAGE
    dcgm_exporter_image: str = dcgm.DCGM_EXPORTER_IMAGE
    # promtool on the monitoring host validates staged files before they go live.
    promtool: str = "promtool"
    # Prometheus and Grafana listen here on the monitoring host (loopback: reach them through an SSH tunnel).
    listen_address: str = "127.0.0.1"
    prometheus_port: int = Field(9090, ge=1, le=65535)
    grafana_port: int = Field(3000, ge=1, le=65535)

    @model_validator(mode="after")
    def _every_machine_reachable(self) -> "MonitoringStackArgs":
        missing = sorted({m.name for m in self.graph.machines} - set(self.machines))
        if missing:
            raise ValueError(f"no access spec for machines {missing}")
        for image in (self.prometheus_image, self.grafana_image, self.node_exporter_image, self.dcgm_exporter_image):
            if image.endswith(":latest") or ":" not in image.rsplit("/", 1)[-1]:
                raise ValueError(f"images must be pinned to a tag: {image!r}")
        return self


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def children(name: str, args: MonitoringStackArgs) -> list[Child]:
    """Exporters per machine, then the monitoring host's files, Prometheus and Grafana; pure."""
    graph = container_view(args)
    prov = grafana.provisioning_files(graph, prometheus_url=prometheus_url(args), dashboards_dir=DASHBOARDS_DIR)
    exporters = [c for m in graph.machines for c in machine_exporters(m, args)]
    files = monitoring_files(graph, prov, args)
    engine = Child("monitoring-docker", DockerEngine, {"spec": args.monitoring_host})
    return [
        *exporters,
        files,
        engine,
        *prometheus_server(args, engine, files),
        *grafana_server(args, prov, engine, files),
    ]


def container_view(args: MonitoringStackArgs) -> MonitoringGraph:
    """The graph as Prometheus sees it: its files at /etc/prometheus inside the container, itself at the listen
    address."""
    return args.graph.model_copy(
        update={
            "rules_path": "/etc/prometheus/rules/gpuhost.rules.yml",
            "self_address": f"{args.listen_address}:{args.prometheus_port}",
        }
    )


def prometheus_url(args: MonitoringStackArgs) -> str:
    return f"http://{args.listen_address}:{args.prometheus_port}"


def machine_exporters(m: HostTarget, args: MonitoringStackArgs) -> list[Child]:
    """One machine's Docker engine, its node-exporter and, where the NVIDIA driver runs, its dcgm-exporter."""
    engine = Child(f"{m.name}-docker", DockerEngine, {"spec": args.machines[m.name]})
    node = node_exporter(m, args, engine)
    return [engine, *node, *(dcgm_exporter(m, args, engine) if m.gpu_driver else [])]


def node_exporter(m: HostTarget, args: MonitoringStackArgs, engine: Child) -> list[Child]:
    """node-exporter (pinned image and container) in the host's namespaces, reading the root file system."""
    return container(
        f"{m.name}-node-exporter",
        args.node_exporter_image,
        {
            "name": "gpuhost-node-exporter",
            "network_mode": "host",
            "pid_mode": "host",
            "restart": "unless-stopped",
            "command": ["--path.rootfs=/host", f"--web.listen-address=:{m.node_exporter_port}"],
            "volumes": [docker.ContainerVolumeArgs(host_path="/", container_path="/host", read_only=True)],
        },
        provider=engine.suffix,
    )


def dcgm_exporter(m: HostTarget, args: MonitoringStackArgs, engine: Child) -> list[Child]:
    """The dcgm-exporter counters file (ManagedFile), then dcgm-exporter (pinned image and container) reading it."""
    counters_csv = dcgm.counters_csv()
    counters = Child(
        f"{m.name}-dcgm-counters",
        ManagedFile,
        {
            "host": host_input(args.machines[m.name]),
            "path": dcgm.COUNTERS_PATH,
            "content": counters_csv,
            "mode": "0644",
            "owner": "root:root",
        },
    )
    cs = dcgm.container_spec(m.dcgm_exporter_port, image=args.dcgm_exporter_image)
    return [
        counters,
        *container(
            f"{m.name}-dcgm-exporter",
            cs.image,
            {
                "name": "gpuhost-dcgm-exporter",
                "gpus": cs.gpus,
                "restart": cs.restart,
                "command": list(cs.command),
                "capabilities": docker.ContainerCapabilitiesArgs(adds=list(cs.capabilities)),
                "ports": [docker.ContainerPortArgs(internal=c, external=h) for h, c in cs.ports.items()],
                "volumes": [
                    docker.ContainerVolumeArgs(host_path=h, container_path=c, read_only=True)
                    for h, c in cs.volumes.items()
                ],
                # A new counters file means a new container: dcgm-exporter reads it only at start.
                "labels": [docker.ContainerLabelArgs(label="gpuhost.counters-sha256", value=_sha(counters_csv))],
            },
            provider=engine.suffix,
            after=suffixes(counters),
        ),
    ]


def monitoring_files(graph: MonitoringGraph, prov: dict[str, str], args: MonitoringStackArgs) -> Child:
    """MonitoringFiles on the monitoring host: prometheus.yml, the SLO rules, Grafana's provisioning and dashboards
    (validated with promtool, then Prometheus hot-reloaded)."""
    cfg_path = f"{args.config_dir}/prometheus.yml"
    rules_host_path = f"{args.config_dir}/rules/gpuhost.rules.yml"
    files = {cfg_path: prometheus.render_config(graph), rules_host_path: rules.render_rules(graph)}
    for rel, text in prov.items():
        if rel.startswith("json/"):
            files[f"{args.grafana_dir}/dashboards/{rel[len('json/') :]}"] = text
        else:
            files[f"{args.grafana_dir}/provisioning/{rel}"] = text
    return Child(
        "files",
        MonitoringFiles,
        {
            "host": host_input(args.monitoring_host),
            "files": files,
            "config_path": cfg_path,
            "rules_paths": [rules_host_path],
            "reload": {"kind": "http", "url": prometheus_url(args), "when_running": True},
            "promtool": args.promtool,
        },
    )


def prometheus_server(args: MonitoringStackArgs, engine: Child, files: Child) -> list[Child]:
    """Prometheus (pinned image and container) on the monitoring host, reading the files' directory."""
    return container(
        "prometheus",
        args.prometheus_image,
        {
            "name": "gpuhost-prometheus",
            "network_mode": "host",
            "restart": "unless-stopped",
            "command": [
                "--config.file=/etc/prometheus/prometheus.yml",
                "--storage.tsdb.path=/prometheus",
                f"--web.listen-address={args.listen_address}:{args.prometheus_port}",
                "--web.enable-lifecycle",
            ],
            "volumes": [
                docker.ContainerVolumeArgs(host_path=args.config_dir, container_path="/etc/prometheus", read_only=True),
                docker.ContainerVolumeArgs(volume_name="gpuhost-prometheus-data", container_path="/prometheus"),
            ],
        },
        provider=engine.suffix,
        after=suffixes(files),
    )


def grafana_server(args: MonitoringStackArgs, prov: dict[str, str], engine: Child, files: Child) -> list[Child]:
    """Grafana (pinned image and container) on the monitoring host, reading its provisioning and dashboards."""
    return container(
        "grafana",
        args.grafana_image,
        {
            "name": "gpuhost-grafana",
            "network_mode": "host",
            "restart": "unless-stopped",
            "envs": [
                f"GF_SERVER_HTTP_ADDR={args.listen_address}",
                f"GF_SERVER_HTTP_PORT={args.grafana_port}",
                "GF_PATHS_PROVISIONING=/etc/grafana/provisioning",
            ],
            "volumes": [
                docker.ContainerVolumeArgs(
                    host_path=f"{args.grafana_dir}/provisioning",
                    container_path="/etc/grafana/provisioning",
                    read_only=True,
                ),
                docker.ContainerVolumeArgs(
                    host_path=f"{args.grafana_dir}/dashboards", container_path=DASHBOARDS_DIR, read_only=True
                ),
            ],
            # Dashboards reload by polling; a datasource change needs a fresh Grafana, hence this label.
            "labels": [
                docker.ContainerLabelArgs(
                    label="gpuhost.datasource-sha256", value=_sha(prov["datasources/gpuhost.yaml"])
                )
            ],
        },
        provider=engine.suffix,
        after=suffixes(files),
    )


class MonitoringStack(Wired, type_name="gpuhost:monitoring:MonitoringStack", children=children):
    RECREATED = {
        "*-node-exporter": "container is recreated: node-exporter restarts",
        "*-dcgm-exporter": "container is recreated: dcgm-exporter restarts",
        "prometheus": "container is recreated: Prometheus restarts",
        "grafana": "container is recreated: Grafana restarts",
    }
    RECREATED_DERIVED = (("labels",),)

    def wire(self, args: MonitoringStackArgs, made: dict[str, Any]) -> dict[str, Any]:
        self.exporters: dict[str, list[pulumi.Resource]] = {
            m.name: [made[s] for s in (f"{m.name}-node-exporter", f"{m.name}-dcgm-exporter") if s in made]
            for m in args.graph.machines
        }
        self.files = made["files"]
        self.prometheus = made["prometheus"]
        self.grafana = made["grafana"]
        self.prometheus_url = pulumi.Output.from_input(prometheus_url(args))
        self.grafana_url = pulumi.Output.from_input(f"http://{args.listen_address}:{args.grafana_port}")
        return {
            "prometheus_url": self.prometheus_url,
            "grafana_url": self.grafana_url,
            "dashboards": [grafana.GPU_DASHBOARD_UID, grafana.SERVING_DASHBOARD_UID],
        }
