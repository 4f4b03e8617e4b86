"""The adaptive batching window as deployed (seed 004): what Triton must run with and the controller's systemd unit.

* ``AdaptiveWindow``: the stack-config block (``services[].adaptive_window``), seed values as defaults;
* ``server_flags``: Triton flags — latency summaries (the unit's p95 source: the clients are not gpuhost's) and
  explicit model control with every model loaded at start, for the operator's rate-limited
  ``reload-triton-window`` action only (the control loop never reloads a model);
* ``controller_unit``: the unit running ``serving/adaptive_window.py`` next to Triton: it publishes the clients'
  micro-batching window on ``/window`` and its decisions on ``/metrics``. A client in gpuhost's own process
  (``serving.microbatch.MicroBatcher``) runs the same controller in process instead (``adaptive_window.in_process``).

Usage::

    spec = AdaptiveWindow(target_p95_ms=50)
    args = with_flags(server_args(opts, specs), server_flags())
    unit = controller_unit(spec, ["resnet50"], triton_url="http://127.0.0.1:8000",
                           metrics_url="http://127.0.0.1:8002")
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from plans.triton_runtime import systemd_quote

UNIT_NAME = "gpuhost-adaptive-window.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
# An existing directory on Debian/Ubuntu: nothing to create at deploy or remove at delete.
SCRIPT_PATH = "/usr/local/lib/gpuhost-adaptive-window.py"


class AdaptiveWindow(BaseModel):
    """Seed 004: every 10 s, ±50 µs toward the p95 target, clamped to [200, 1500] µs."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
    target_p95_ms: float = Field(50.0, gt=0, le=3_600_000, description="p95 the window steers to (ms)")
    step_us: int = Field(50, ge=1, le=60_000_000, description="window change per period (µs)")
    period_s: float = Field(10.0, gt=0, le=3600, description="seconds between decisions")
    min_us: int = Field(200, ge=0, le=60_000_000, description="smallest window (µs)")
    max_us: int = Field(1500, ge=0, le=60_000_000, description="largest window (µs)")
    initial_us: int = Field(
        600, ge=0, le=60_000_000, description="window published before the first decision (µs; seed: 600)"
    )
    listen: str = Field(
        "0.0.0.0:9108",
        pattern=r"^[0-9A-Za-z.\-\[\]:]+:[0-9]{1,5}$",
        description="host:port of the controller's /metrics (decisions for Prometheus)",
    )

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        from plans.values import address

        host, _, port = v.rpartition(":")
        if not 1 <= int(port) <= 65535:
            raise ValueError(f"listen {v!r}: port {int(port)} is not a TCP port (use 1-65535)")
        try:
            address(host)
        except ValueError:
            raise ValueError(f"listen {v!r}: {host!r} is not an IP address or host name (e.g. 0.0.0.0:9108)") from None
        return v

    @property
    def port(self) -> int:
        """The port of the controller's /metrics (Prometheus scrapes it at the service's address)."""
        return int(self.listen.rsplit(":", 1)[1])

    @property
    def loopback_only(self) -> bool:
        """True when `listen` binds loopback only, where no other machine (the monitoring host) can scrape it."""
        host = self.listen.rsplit(":", 1)[0].strip("[]")
        return host == "localhost" or host.startswith("127.") or host == "::1"

    @model_validator(mode="after")
    def _clamp(self):
        if self.max_us < self.min_us:
            raise ValueError(f"max_us: {self.max_us} µs is below min_us {self.min_us} µs")
        if self.max_us > self.min_us and self.step_us > self.max_us - self.min_us:
            raise ValueError(f"step_us: {self.step_us} µs is wider than the clamp [{self.min_us}, {self.max_us}] µs")
        if not self.min_us <= self.initial_us <= self.max_us:
            raise ValueError(f"initial_us: {self.initial_us} µs is outside the clamp [{self.min_us}, {self.max_us}] µs")
        return self


def server_flags() -> list[str]:
    return ["--model-control-mode=explicit", "--load-model=*", "--metrics-config=summary_latencies=true"]


def _option(arg: str) -> str:
    name, _, value = arg.partition("=")
    # --metrics-config is given once per key (summary_latencies=..., summary_quantiles=...).
    return f"{name}={value.split('=', 1)[0]}" if name == "--metrics-config" else name


def with_flags(args: list[str], flags: list[str]) -> list[str]:
    """``args`` plus each flag whose option is not already given (another part may turn summaries on too)."""
    have = {_option(a) for a in args}
    return list(args) + [f for f in flags if _option(f) not in have]


def controller_argv(
    spec: AdaptiveWindow,
    models: list[str],
    *,
    triton_url: str,
    metrics_url: str,
    python: str = "/usr/bin/python3",
    script: str = SCRIPT_PATH,
) -> list[str]:
    argv = [python, script, "--triton-url", triton_url, "--metrics-url", metrics_url]
    for m in models:
        argv += ["--model", m]
    return argv + [
        "--target-p95-ms",
        f"{spec.target_p95_ms:g}",
        "--step-us",
        str(spec.step_us),
        "--period-s",
        f"{spec.period_s:g}",
        "--min-us",
        str(spec.min_us),
        "--max-us",
        str(spec.max_us),
        "--initial-us",
        str(spec.initial_us),
        "--listen",
        spec.listen,
    ]


def controller_unit(
    spec: AdaptiveWindow,
    models: list[str],
    *,
    triton_url: str,
    metrics_url: str,
    after: str = "gpuhost-triton.service docker.service",
) -> str:
    if not models:
        raise ValueError("the adaptive window needs at least one model")
    argv = controller_argv(spec, models, triton_url=triton_url, metrics_url=metrics_url)
    return (
        "\n".join(
            [
                "[Unit]",
                "Description=gpuhost adaptive batching window (seed 004)",
                f"After=network-online.target {after}",
                "Wants=network-online.target",
                "",
                "[Service]",
                "Type=simple",
                # It only talks HTTP to Triton on loopback: no privileges needed.
                "DynamicUser=yes",
                "ExecStart=" + " ".join(systemd_quote(a) for a in argv),
                "Restart=always",
                "RestartSec=5",
                "",
                "[Install]",
                "WantedBy=multi-user.target",
            ]
        )
        + "\n"
    )
