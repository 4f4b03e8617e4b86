"""nginx in front of Triton (seed 000 §7.2, seed 004): one rendered ``nginx.conf``, checked with ``nginx -t``.

HTTP: ``/infer`` goes to the default model's v2 infer endpoint; of Triton's v2 API only what a client of the served
models needs is forwarded (an allowlist: anyone can send what nginx forwards): health live/ready (GET), each served
model's metadata, ready and config (GET) and infer (POST), with or without a version. Triton's model-control
(repository load/unload: code that runs on the host), shared-memory, logging, trace and statistics APIs, and every
model the stack does not serve, answer 404 (a wrong method 403) from nginx itself. The path Triton gets is nginx's
normalized ``$uri`` (``..`` resolved), never the raw request line. Both go over an upstream with keepalive
(``proxy_http_version 1.1`` + ``Connection ""``, otherwise nginx
opens a TCP connection per request and p95 pays for it), request buffering off so tensors stream
straight through, and a body limit sized for tensors. gRPC: a separate HTTP/2 listener with
``grpc_pass`` and a high ``keepalive_requests`` so long-lived client channels are not cut every 1000
calls; only ModelInfer, ServerLive/Ready, ModelReady, ModelMetadata and ModelConfig are forwarded, every other
method (repository, shared memory, logging, trace, statistics) answers 404. ``/nginx-health`` answers 200 from
nginx itself (load balancers, and the load gate's own
overhead measurement).

Usage::

    text = render(NginxSpec(default_model="yolov8n"))
    render(NginxSpec(listen_http=18080, listen_grpc=18081, upstream_http="127.0.0.1:8000",
                     upstream_grpc="127.0.0.1:8001", default_model="sleep", prefix="/tmp/nginx"))

Every value is validated before it reaches the text (names, addresses, sizes), so a config value
cannot inject a directive.
"""

from __future__ import annotations

import re
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

_NAME = r"^[A-Za-z0-9_.\-]+$"
_HOSTPORT = r"^[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$"
_SIZE = r"^[0-9]+[kKmMgG]?$"
_PATH = r"^/[A-Za-z0-9_./\-]*$"


class NginxSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    default_model: str = Field(pattern=_NAME)
    # The models nginx forwards requests for (empty: the default model alone).
    models: tuple[Annotated[str, Field(pattern=_NAME)], ...] = ()
    listen_http: int = Field(80, ge=1, le=65535)
    listen_grpc: Optional[int] = Field(8081, ge=1, le=65535)
    listen_address: str = Field("0.0.0.0", pattern=r"^[0-9.]+$|^\[[0-9a-fA-F:]+\]$")
    upstream_http: str = Field("127.0.0.1:8000", pattern=_HOSTPORT)
    upstream_grpc: str = Field("127.0.0.1:8001", pattern=_HOSTPORT)
    # Idle keepalive connections each worker keeps to Triton.
    upstream_keepalive: int = Field(64, ge=1)
    # Requests per keepalive connection (client side and upstream); high for gRPC channels.
    keepalive_requests: int = Field(100000, ge=1)
    # A 8×3×640×640 FP32 batch is ~39 MB as JSON-less binary; leave headroom.
    client_max_body_size: str = Field("64m", pattern=_SIZE)
    # Memory for one request body and one response (a 640×640 uint8 image is 1.2 MB, a raw YOLOv8n output
    # 1.4 MB in FP16), so neither goes through a temp file on disk between Triton and the client (issue 18).
    body_buffer_size: str = Field("2m", pattern=_SIZE)
    proxy_read_timeout_s: int = Field(60, ge=1)
    worker_processes: str = Field("auto", pattern=r"^(auto|[0-9]+)$")
    worker_connections: int = Field(4096, ge=16)
    user: Optional[str] = Field("www-data", pattern=_NAME)
    # Where pid, logs and temp files live; "" = Debian's defaults under /var.
    prefix: str = Field("", pattern=r"^$|" + _PATH)
    access_log: bool = False

    @model_validator(mode="after")
    def _default_is_served(self) -> "NginxSpec":
        if self.models and self.default_model not in self.models:
            raise ValueError(
                f"default_model {self.default_model!r} is not one of the served models {list(self.models)}"
            )
        return self

    @property
    def served(self) -> tuple[str, ...]:
        return self.models or (self.default_model,)


# The gRPC methods a client of the served models calls (inference.GRPCInferenceService); nothing else is forwarded.
GRPC_METHODS = ("ModelInfer", "ServerLive", "ServerReady", "ModelReady", "ModelMetadata", "ModelConfig")


def _v2_locations(spec: NginxSpec) -> list[str]:
    """Triton's v2 HTTP API for the served models only (see the module docstring); the rest answers 404."""
    names = "|".join(re.escape(m) for m in sorted(set(spec.served)))
    model = f"^/v2/models/({names})(/versions/[0-9]{{1,19}})?"
    # $uri: nginx's normalized path; Triton's API takes no query arguments on these routes.
    upstream = "proxy_pass http://triton_http$uri;"

    def allowed(match: str, method: str) -> list[str]:
        return [
            f"        location {match} {{",
            f"            limit_except {method} {{ deny all; }}",
            f"            {upstream}",
            "        }",
        ]

    return [
        *allowed("= /v2/health/live", "GET"),
        *allowed("= /v2/health/ready", "GET"),
        *allowed(f'~ "{model}/infer$"', "POST"),
        *allowed(f'~ "{model}(/ready|/config)?$"', "GET"),
        "        location / {",
        "            return 404;",
        "        }",
    ]


def _quarter_mb_chunks(size: str) -> str:
    """Chunk size so 32 proxy buffers hold ``size`` (at least 8k)."""
    unit = {"k": 1024, "m": 1024**2, "g": 1024**3}.get(size[-1].lower(), 1)
    total = int(size.rstrip("kKmMgG")) * unit
    return f"{max(8, total // 32 // 1024)}k"


def render(spec: NginxSpec) -> str:
    """The complete ``nginx.conf`` text (no ``daemon`` directive: systemd or the test launcher decides)."""
    pid, error_log, access, temps = _files(spec)
    lines = [f"user {spec.user};"] if spec.user else []
    lines += [
        f"worker_processes {spec.worker_processes};",
        f"pid {pid};",
        f"error_log {error_log} warn;",
        "",
        f"events {{ worker_connections {spec.worker_connections}; }}",
        "",
        "http {",
        "    sendfile on;",
        "    tcp_nopush on;",
        "    tcp_nodelay on;",
        "    keepalive_timeout 65;",
        f"    keepalive_requests {spec.keepalive_requests};",
        f"    access_log {access};",
        *temps,
        *_http_server(spec),
    ]
    if spec.listen_grpc:
        lines += _grpc_server(spec)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _files(spec: NginxSpec) -> tuple[str, str, str, list[str]]:
    """(pid file, error log, access log or "off", temp-path directives): under ``prefix``, or Debian's own."""
    if not spec.prefix:
        # Debian's nginx.service waits for /run/nginx.pid (PIDFile=) and stops by it: another pid path makes
        # `systemctl start nginx` time out with this config in place.
        access = "/var/log/nginx/triton-access.log" if spec.access_log else "off"
        return "/run/nginx.pid", "/var/log/nginx/triton-error.log", access, []
    p = spec.prefix.rstrip("/")
    temps = [
        f"    {d} {p}/{d.removesuffix('_path')};"
        for d in ("client_body_temp_path", "proxy_temp_path", "fastcgi_temp_path", "uwsgi_temp_path", "scgi_temp_path")
    ]
    return f"{p}/nginx.pid", f"{p}/error.log", f"{p}/access.log" if spec.access_log else "off", temps


def _server_start(upstream: str, address: str, listen: str, spec: NginxSpec) -> list[str]:
    """An upstream to Triton with idle keepalive connections (without them nginx opens one per request), and the
    start of the server in front of it: its listener and body limit."""
    return [
        "",
        f"    upstream {upstream} {{",
        f"        server {address};",
        f"        keepalive {spec.upstream_keepalive};",
        f"        keepalive_requests {spec.keepalive_requests};",
        "    }",
        "",
        "    server {",
        f"        listen {spec.listen_address}:{listen};",
        f"        client_max_body_size {spec.client_max_body_size};",
    ]


def _http_server(spec: NginxSpec) -> list[str]:
    """The HTTP upstream (keepalive) and server: health from nginx itself, ``/infer``, the allowed v2 routes."""
    return [
        *_server_start("triton_http", spec.upstream_http, f"{spec.listen_http} reuseport", spec),
        "        proxy_http_version 1.1;",
        '        proxy_set_header Connection "";',
        "        proxy_request_buffering off;",
        f"        client_body_buffer_size {spec.body_buffer_size};",
        "        proxy_buffer_size 64k;",
        f"        proxy_buffers 32 {_quarter_mb_chunks(spec.body_buffer_size)};",
        "        proxy_busy_buffers_size 256k;",
        "        proxy_max_temp_file_size 0;",
        f"        proxy_read_timeout {spec.proxy_read_timeout_s}s;",
        "",
        "        location = /nginx-health {",
        "            access_log off;",
        '            return 200 "ok\\n";',
        "        }",
        "        location = /infer {",
        f"            proxy_pass http://triton_http/v2/models/{spec.default_model}/infer;",
        "        }",
        *_v2_locations(spec),
        "    }",
    ]


def _grpc_server(spec: NginxSpec) -> list[str]:
    """The HTTP/2 gRPC upstream and server: only GRPC_METHODS are passed, everything else answers 404."""
    return [
        *_server_start("triton_grpc", spec.upstream_grpc, f"{spec.listen_grpc} http2", spec),
        f"        grpc_read_timeout {spec.proxy_read_timeout_s}s;",
        f"        grpc_buffer_size {spec.body_buffer_size};",
        f"        client_body_buffer_size {spec.body_buffer_size};",
        f"        http2_body_preread_size {spec.body_buffer_size};",
        *(
            line
            for m in GRPC_METHODS
            for line in (
                f"        location = /inference.GRPCInferenceService/{m} {{",
                "            grpc_pass grpc://triton_grpc;",
                "        }",
            )
        ),
        "        location / {",
        "            return 404;",
        "        }",
        "    }",
    ]
