"""The monitoring graph: what gets scraped and which SLOs the alerts enforce.

The stack graph (PassthroughHost hosts, PinnedVM guests, TritonService endpoints) is turned into this typed list by
the program; everything else in `plans.monitoring` is a pure function of it.

Usage::

    graph = MonitoringGraph(
        hosts=[HostTarget(name="gpu01", address="10.0.0.5", role="host")],
        guests=[HostTarget(name="vm-a", address="10.0.1.10", role="guest", tenant="tenant-a", gpu_driver=True)],
        services=[TritonTarget(name="yolo", address="10.0.1.10", host="vm-a", tenant="tenant-a",
                               models=["yolov8n"], slo=ServingSlo(p95_latency_ms=50))],
    )

Why a passthrough host gets no dcgm-exporter: its GPUs are bound to vfio-pci and the host must not load the NVIDIA
driver (seed 000 §10, "宿主机误装NVIDIA驱动"), so DCGM can only run where the driver is: in the guests, or on a bare
metal host that keeps the GPU (MIG plan of seed 001). `gpu_driver` says which.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d))+$")


def _check_name(v: str) -> str:
    if not _NAME.match(v):
        raise ValueError(f"not a DNS-style name: {v!r}")
    return v


# A target's name, a label value in every series and alert: checked where the field is declared.
Name = Annotated[str, AfterValidator(_check_name)]


def _check_duration(v: str) -> str:
    if not _DURATION.match(v):
        raise ValueError(f"not a Prometheus duration: {v!r}")
    return v


class ServingSlo(BaseModel):
    """Service level objectives of one Triton service; the alert thresholds derive from these.

    Defaults are the seeds' numbers: p95 target 50 ms held for 5 minutes (seed 004: p95 120 ms → 48 ms, "p95 连续 5
    分钟高于阈值"), queue time per request above 20 ms for 1 minute (seed 001 §8), and failures.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    p95_latency_ms: float = Field(50.0, gt=0)
    p95_for: str = "5m"
    queue_duration_ms: float = Field(20.0, gt=0)
    queue_for: str = "1m"
    # Failed requests as a fraction of all requests over 5 minutes.
    max_failure_ratio: float = Field(0.01, ge=0, le=1)

    @field_validator("p95_for", "queue_for")
    @classmethod
    def _durations(cls, v: str) -> str:
        return _check_duration(v)


class GpuSlo(BaseModel):
    """GPU guard rails (seed 001 §8: free frame buffer below 1.5 GB → fewer instances / restart to defrag)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # dcgm-exporter reports frame buffer in MiB; 1.5 GB as the seed writes it, counted in MiB.
    fb_free_min_mib: float = Field(1536.0, gt=0)
    fb_free_for: str = "5m"
    temperature_max_c: float = Field(85.0, gt=0)
    temperature_for: str = "5m"

    @field_validator("fb_free_for", "temperature_for")
    @classmethod
    def _durations(cls, v: str) -> str:
        return _check_duration(v)


class HostTarget(BaseModel):
    """A machine with a node exporter: a PassthroughHost (`role="host"`) or a PinnedVM guest (`role="guest"`).

    Args:
      name: the stack's name for it; becomes the `host` label.
      address: what the monitoring host dials (IP or DNS name, no port).
      tenant: the tenant a guest belongs to; hosts are shared and usually have none (label "shared").
      gpu_driver: the NVIDIA driver runs here, so dcgm-exporter does too.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Name
    address: str
    role: Literal["host", "guest"]
    tenant: Optional[str] = None
    gpu_driver: bool = False
    node_exporter_port: int = Field(9100, ge=1, le=65535)
    dcgm_exporter_port: int = Field(9400, ge=1, le=65535)


class TritonTarget(BaseModel):
    """A TritonService endpoint; its metrics port (8002 in the seeds) is scraped.

    Args:
      name: service name; becomes the `service` label.
      host: the HostTarget name it runs on (label `host`).
      models: the models it serves; dashboards offer them and alerts cover them (Triton adds `model` itself).
      window_port: the port of the service's adaptive-window controller /metrics (plans.adaptive_window, seed 004;
        9108 by default) at the same address, when the service runs one; scraped as job `adaptive_window`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Name
    address: str
    host: str
    tenant: Optional[str] = None
    metrics_port: int = Field(8002, ge=1, le=65535)
    # Where Triton's metrics listen when not at `address` (the service's triton_listen).
    metrics_address: Optional[str] = None
    window_port: Optional[int] = Field(None, ge=1, le=65535)
    models: tuple[str, ...] = ()
    slo: ServingSlo = ServingSlo()


class GatewayTarget(BaseModel):
    """An InferenceGateway (seed 001's queue + scheduler): its workers' metrics endpoints and its latency SLO.

    Args:
      name: gateway name; becomes the `gateway` label.
      host: the HostTarget name it runs on (label `host`).
      metrics_ports: one per queue worker.
      p95_latency_s: end-to-end p95 including queueing (seed 001: 2.5 s).
      max_depth: the queue depth at which submits are refused; the backlog alert fires at `backlog_ratio` of it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Name
    address: str
    host: str
    metrics_ports: tuple[int, ...]
    p95_latency_s: float = Field(2.5, gt=0)
    p95_for: str = "5m"
    max_depth: int = Field(1000, ge=1)
    backlog_ratio: float = Field(0.8, gt=0, le=1)
    backlog_for: str = "1m"
    drained_for: str = "1m"

    @field_validator("p95_for", "backlog_for", "drained_for")
    @classmethod
    def _durations(cls, v: str) -> str:
        return _check_duration(v)


class MonitoringGraph(BaseModel):
    """Every scrape target of the stack plus the global settings of the monitoring host."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    hosts: tuple[HostTarget, ...] = ()
    guests: tuple[HostTarget, ...] = ()
    services: tuple[TritonTarget, ...] = ()
    gateways: tuple[GatewayTarget, ...] = ()
    gpu: GpuSlo = GpuSlo()
    scrape_interval: str = "15s"
    evaluation_interval: str = "15s"
    # Where the rule files live on the monitoring host (Prometheus's rule_files).
    rules_path: str = "/etc/prometheus/rules/gpuhost.rules.yml"
    # Self-scrape so a dead Prometheus target list or rule evaluation shows up too.
    self_address: str = "127.0.0.1:9090"

    @field_validator("scrape_interval", "evaluation_interval")
    @classmethod
    def _durations(cls, v: str) -> str:
        return _check_duration(v)

    @model_validator(mode="after")
    def _consistent(self) -> "MonitoringGraph":
        names = [h.name for h in self.hosts + self.guests]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"host/guest names must be unique: {dupes}")
        if any(h.role != "host" for h in self.hosts) or any(g.role != "guest" for g in self.guests):
            raise ValueError("hosts must have role='host' and guests role='guest'")
        services = [s.name for s in self.services]
        if len(set(services)) != len(services):
            raise ValueError("service names must be unique")
        for s in self.services:
            if s.host not in names:
                raise ValueError(f"service {s.name!r} runs on unknown host {s.host!r}")
        for g in self.gateways:
            if g.host not in names:
                raise ValueError(f"gateway {g.name!r} runs on unknown host {g.host!r}")
        if len({g.name for g in self.gateways}) != len(self.gateways):
            raise ValueError("gateway names must be unique")
        return self

    @property
    def machines(self) -> tuple[HostTarget, ...]:
        return self.hosts + self.guests

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted({m for s in self.services for m in s.models}))


def tenant_label(tenant: Optional[str]) -> str:
    return tenant or "shared"
