"""Debian's Prometheus and promtool for tests: a real server on loopback with temp storage, and promtool runs.

Usage::

    rc, out = promtool("check", "rules", "/tmp/x/gpuhost.rules.yml")
    with start_prometheus(config_text, workdir=tmp_path, extra_files={"gpuhost.rules.yml": rules_text}) as prom:
        prom.query("up")                  # -> list of {"metric": {...}, "value": [ts, "1"]}
        prom.wait_for('count(up == 1) >= 3', timeout=20)
        prom.reload()                     # POST /-/reload (started with --web.enable-lifecycle)

The config text may contain `{workdir}`, replaced by the server's directory (for rule_files paths).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Optional

from testbed.servers import LaunchedServer, free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def available() -> bool:
    return Path(PROMETHEUS).exists() and Path(PROMTOOL).exists()


def promtool(*args: str, cwd: Optional[Path] = None, timeout: float = 60) -> tuple[int, str]:
    """Run promtool; returns (exit code, stdout+stderr)."""
    p = subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


class QueryError(RuntimeError):
    def __init__(self, status: int, error_type: str, error: str):
        self.status, self.error_type, self.error = status, error_type, error
        super().__init__(f"{status} {error_type}: {error}")


@dataclasses.dataclass
class PrometheusHandle(LaunchedServer):
    url: str
    port: int
    workdir: Path
    process: subprocess.Popen
    log_path: Path
    STOP_TIMEOUT = 15.0  # not a field: Prometheus gets longer to exit

    def _get(self, path: str, params: dict[str, str] | None = None, method: str = "GET") -> Any:
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        req = urllib.request.Request(url, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                body = r.read()
        except urllib.error.HTTPError as e:
            body = e.read()
            try:
                data = json.loads(body)
            except ValueError:
                raise QueryError(e.code, "http", body.decode(errors="replace")) from None
            raise QueryError(e.code, data.get("errorType", ""), data.get("error", "")) from None
        return json.loads(body) if body.strip().startswith(b"{") else body.decode()

    def query(self, expr: str) -> list[dict]:
        """Instant query; raises QueryError (400 bad_data) when the expression does not parse."""
        return self._get("/api/v1/query", {"query": expr})["data"]["result"]

    def metric_names(self) -> set[str]:
        return set(self._get("/api/v1/label/__name__/values")["data"])

    def targets(self) -> list[dict]:
        return self._get("/api/v1/targets")["data"]["activeTargets"]

    def config_text(self) -> str:
        return self._get("/api/v1/status/config")["data"]["yaml"]

    def reload(self) -> None:
        self._get("/-/reload", method="POST")

    def wait_for(self, expr: str, timeout: float = 30.0) -> list[dict]:
        """Wait until `expr` returns a non-empty result."""
        deadline = time.monotonic() + timeout
        last: list[dict] = []
        while time.monotonic() < deadline:
            last = self.query(expr)
            if last:
                return last
            time.sleep(0.5)
        raise TimeoutError(f"{expr!r} still empty after {timeout}s; targets: {self.targets()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def start_prometheus(
    config_text: str,
    *,
    workdir: Optional[Path] = None,
    extra_files: dict[str, str] | None = None,
    ready_timeout: float = 30.0,
    port: Optional[int] = None,
) -> PrometheusHandle:
    """Start /usr/bin/prometheus on a free loopback port with storage under `workdir`."""
    workdir = Path(workdir or tempfile.mkdtemp(prefix="gpuhost-prom-"))
    workdir.mkdir(parents=True, exist_ok=True)
    for name, text in (extra_files or {}).items():
        (workdir / name).write_text(text)
    config = workdir / "prometheus.yml"
    config.write_text(config_text.replace("{workdir}", str(workdir)))
    port = port or free_port()
    log_path = workdir / "prometheus.log"
    cmd = [
        PROMETHEUS,
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
        "--storage.tsdb.retention.time=1h",
    ]
    log = open(log_path, "ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    h = PrometheusHandle(url=f"http://127.0.0.1:{port}", port=port, workdir=workdir, process=proc, log_path=log_path)
    return h.wait_ready("prometheus", h.url + "/-/ready", ready_timeout, lambda: h.log()[-3000:])
