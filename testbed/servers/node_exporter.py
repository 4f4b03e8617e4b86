"""Debian's prometheus-node-exporter on a loopback port, for tests.

Usage::

    with start_node_exporter() as ne:
        urllib.request.urlopen(ne.url + "/metrics")
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

from testbed.servers import LaunchedServer, free_port

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or "/usr/bin/prometheus-node-exporter"


def available() -> bool:
    return Path(NODE_EXPORTER).exists()


@dataclasses.dataclass
class NodeExporterHandle(LaunchedServer):
    address: str  # host:port, as a scrape target
    url: str
    process: subprocess.Popen


def start_node_exporter(ready_timeout: float = 15.0) -> NodeExporterHandle:
    port = free_port()
    # Only the collectors the dashboards read: keeps each scrape cheap on a 2-core CI box.
    cmd = [
        NODE_EXPORTER,
        f"--web.listen-address=127.0.0.1:{port}",
        "--collector.disable-defaults",
        "--collector.cpu",
        "--collector.meminfo",
        "--collector.netdev",
        "--collector.uname",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    h = NodeExporterHandle(address=f"127.0.0.1:{port}", url=f"http://127.0.0.1:{port}", process=proc)
    return h.wait_ready(
        "node exporter",
        h.url + "/metrics",
        ready_timeout,
        lambda: (proc.stderr.read() if proc.stderr else b"").decode(errors="replace")[-2000:],
    )
