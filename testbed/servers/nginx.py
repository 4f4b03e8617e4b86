"""Real nginx (Debian's /usr/sbin/nginx) on loopback for tests: ``nginx -t`` and a foreground server.

Usage::

    conf = render(NginxSpec(default_model="sleep", listen_address="127.0.0.1", listen_http=free_port(),
                            listen_grpc=free_port(), upstream_http=..., prefix=str(tmp), user=run_user()))
    ok, out = check_config(conf, tmp)              # runs `nginx -t -c`
    with start_nginx(conf, tmp) as n:             # `nginx -c ... -g "daemon off;"`, waits for the port
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nginx-health")
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

from bench.servers import front_conf
from testbed.servers import stop_process

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def nginx_available() -> bool:
    return os.path.exists(NGINX)


def run_user() -> Optional[str]:
    """The ``user`` directive for a test nginx: as root, keep workers as root so they can use the temp dir."""
    return "root" if os.geteuid() == 0 else None


def _write(conf: str, workdir: Path) -> Path:
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "nginx.conf"
    path.write_text(conf)
    return path


def check_config(conf: str, workdir: Path) -> tuple[bool, str]:
    """Run ``nginx -t -c <conf>``; returns (ok, combined output)."""
    path = _write(conf, workdir)
    r = subprocess.run([NGINX, "-t", "-p", str(workdir), "-c", str(path)], capture_output=True, text=True, timeout=30)
    return r.returncode == 0, r.stdout + r.stderr


@dataclasses.dataclass
class NginxHandle:
    process: subprocess.Popen
    conf_path: Path
    workdir: Path
    http: str = ""  # set by tests that front Triton with it: the URL of its HTTP listener
    grpc: str = ""  # and the host:port of its gRPC listener

    def stop(self) -> None:
        stop_process(self.process)  # SIGTERM = fast shutdown

    def error_log(self) -> str:
        p = self.workdir / "error.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def __enter__(self) -> "NginxHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_nginx(conf: str, workdir: Path, *, wait_port: Optional[int] = None, timeout: float = 15.0) -> NginxHandle:
    """Start nginx in the foreground with ``conf``; waits until ``wait_port`` accepts connections."""
    path = _write(conf, workdir)
    ok, out = check_config(conf, workdir)
    if not ok:
        raise RuntimeError(f"nginx -t failed:\n{out}")
    log = open(Path(workdir) / "nginx.stdout", "ab")
    process = subprocess.Popen(
        [NGINX, "-p", str(workdir), "-c", str(path), "-g", "daemon off;"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    handle = NginxHandle(process, path, Path(workdir))
    deadline = time.monotonic() + timeout
    while wait_port and time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"nginx exited with {process.returncode}: {handle.error_log()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", wait_port), timeout=0.5):
                return handle
        except OSError:
            time.sleep(0.05)
    if wait_port:
        handle.stop()
        raise TimeoutError(f"nginx did not listen on {wait_port}: {handle.error_log()[-2000:]}")
    return handle


def served_models(http_port: int) -> tuple[str, ...]:
    """The models in a Triton's repository index (asked of Triton directly: nginx does not forward the index)."""
    import json
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{http_port}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return tuple(sorted({m["name"] for m in json.load(r)}))


def front_triton(triton_ports: dict[str, int], workdir: Path, default_model: str) -> NginxHandle:
    """nginx as production renders it (plans/nginx.py), one worker, on free loopback ports in front of the Triton
    listening on `triton_ports` (its "http" and "grpc"), forwarding for every model of its repository as a stack
    serving them would; the handle's `http` and `grpc` say where nginx listens."""
    models = served_models(triton_ports["http"])
    conf, http_port, grpc_port = front_conf(
        workdir, default_model, triton_ports["http"], triton_ports["grpc"], "1", models
    )
    handle = start_nginx(conf, workdir, wait_port=http_port)
    handle.http, handle.grpc = f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
    return handle


def front_triton_fixture(default_model: str):
    """A module-scoped pytest fixture: `front_triton` before the module's `triton` fixture (skips where nginx is not
    installed)."""
    import pytest

    @pytest.fixture(scope="module")
    def _nginx(triton, tmp_path_factory):
        if not nginx_available():
            pytest.skip("nginx is not installed")
        with front_triton(triton.ports, tmp_path_factory.mktemp("nginx"), default_model) as handle:
            yield handle

    return _nginx
