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
from components.wiring import Child, DockerEngine, Wired, container
from plans.monitoring import dcgm, grafana, prometheus, rules
from plans.monitoring.model import MonitoringGraph
from providers.base import host_input
from providers.managed_file import ManagedFile
from providers.monitoring import MonitoringFiles

PROMETHEUS_IMAGE = "quay.io/prometheus/prometheus:v2.53.2"
GRAFANA_IMAGE = "docker.io/grafana/grafana-oss:10.4.8"
NODE_EXPORTER_IMAGE = "quay.io/prometheus/node-exporter:v1.8.2"


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
    # Prometheus reads its files at /etc/prometheus inside the container.
    graph = args.graph.model_copy(
        update={
            "rules_path": "/etc/prometheus/rules/gpuhost.rules.yml",
            "self_address": f"{args.listen_address}:{args.prometheus_port}",
        }
    )
    out: list[Child] = []

    # -- exporters on every machine ----------------------------------------------------------------------------
    counters = dcgm.counters_csv()
    for m in graph.machines:
        spec = args.machines[m.name]
        engine = f"{m.name}-docker"
        out.append(Child(engine, DockerEngine, {"spec": spec}))
        out += container(
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
            provider=engine,
        )
        if m.gpu_driver:
            out.append(
                Child(
                    f"{m.name}-dcgm-counters",
                    ManagedFile,
                    {
                        "host": host_input(spec),
                        "path": dcgm.COUNTERS_PATH,
                        "content": counters,
                        "mode": "0644",
                        "owner": "root:root",
                    },
                )
            )
            cs = dcgm.container_spec(m.dcgm_exporter_port, image=args.dcgm_exporter_image)
            out += container(
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
                    "labels": [docker.ContainerLabelArgs(label="gpuhost.counters-sha256", value=_sha(counters))],
                },
                provider=engine,
                after=(f"{m.name}-dcgm-counters",),
            )

    # -- configuration on the monitoring host -------------------------------------------------------------------
    mon = args.monitoring_host
    cfg_path = f"{args.config_dir}/prometheus.yml"
    rules_host_path = f"{args.config_dir}/rules/gpuhost.rules.yml"
    dashboards_dir = "/var/lib/grafana/dashboards/gpuhost"  # container view of grafana_dir/dashboards
    prom_url = f"http://{args.listen_address}:{args.prometheus_port}"
    prov = grafana.provisioning_files(graph, prometheus_url=prom_url, dashboards_dir=dashboards_dir)
    files = {cfg_path: prometheus.render_config(graph), rules_host_path: rules.render_rules(graph)}
    for rel, text in prov.items():
        if rel.startswith("json/"):
            files[f"{args.grafana_dir}/dashboards/{rel[len('json/') :]}"] = text
        else:
            files[f"{args.grafana_dir}/provisioning/{rel}"] = text
    out.append(
        Child(
            "files",
            MonitoringFiles,
            {
                "host": host_input(mon),
                "files": files,
                "config_path": cfg_path,
                "rules_paths": [rules_host_path],
                "reload": {"kind": "http", "url": prom_url, "when_running": True},
                "promtool": args.promtool,
            },
        )
    )
    out.append(Child("monitoring-docker", DockerEngine, {"spec": mon}))
    out += container(
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
        provider="monitoring-docker",
        after=("files",),
    )
    out += container(
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
                    host_path=f"{args.grafana_dir}/dashboards", container_path=dashboards_dir, read_only=True
                ),
            ],
            # Dashboards reload by polling; a datasource change needs a fresh Grafana, hence this label.
            "labels": [
                docker.ContainerLabelArgs(
                    label="gpuhost.datasource-sha256", value=_sha(prov["datasources/gpuhost.yaml"])
                )
            ],
        },
        provider="monitoring-docker",
        after=("files",),
    )
    return out


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
        self.prometheus_url = pulumi.Output.from_input(f"http://{args.listen_address}:{args.prometheus_port}")
        self.grafana_url = pulumi.Output.from_input(f"http://{args.listen_address}:{args.grafana_port}")
        return {
            "prometheus_url": self.prometheus_url,
            "grafana_url": self.grafana_url,
            "dashboards": [grafana.GPU_DASHBOARD_UID, grafana.SERVING_DASHBOARD_UID],
        }
