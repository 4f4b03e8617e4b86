"""The queue gateway's workers (``python -m serving.worker``) for tests and benchmarks, against launched Tritons.

Usage::

    cfg = worker_config(redis.port, handles, {"mig-a": 3, "vm-b": 2}, slots=5, queue={"max_depth": 100})
    proc = spawn_worker(cfg, "w1", tmp_path)         # config and log beside each other in tmp_path
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from bench.servers import worker_backends

ROOT = Path(__file__).resolve().parents[2]


def worker_config(redis_port: int, handles: Mapping[str, Any], weights: Mapping[str, float], **fields: Any) -> dict:
    """A worker config: Redis on loopback ``redis_port``, one backend per name of ``weights`` from the handle of that
    name (``grpc``, ``http``, ``metrics``: a ``bench.servers.Triton``), then ``fields``."""
    return {"redis": {"host": "127.0.0.1", "port": redis_port}, "backends": worker_backends(handles, weights), **fields}


def spawn_worker(config: dict, consumer: str, workdir: Path) -> subprocess.Popen:
    """``python -m serving.worker`` as consumer ``consumer`` in its own session, its config written to
    ``workdir/<consumer>.json`` and its output appended to ``workdir/<consumer>.log``."""
    path = workdir / f"{consumer}.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), env.get("PYTHONPATH", "")) if x)
    with open(workdir / f"{consumer}.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "serving.worker", "--config", str(path), "--consumer", consumer],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
