"""Debian's redis-server for tests: a real server on a free loopback port, no persistence, data under a temp dir.

Usage::

    with start_redis(tmp_path) as srv:
        r = redis.Redis(port=srv.port)
        r.ping()

    redis_server = redis_fixture()          # in a test module: one server per module, flushed per test by `r`
"""

from __future__ import annotations

import dataclasses
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Literal, Optional

from testbed.servers import LaunchedServer, free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def available() -> bool:
    return Path(REDIS_SERVER).exists()


@dataclasses.dataclass
class RedisHandle(LaunchedServer):
    port: int
    workdir: Path
    process: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def start_redis(
    workdir: Optional[Path] = None, *, ready_timeout: float = 15.0, port: Optional[int] = None
) -> RedisHandle:
    """redis-server on ``port`` (default: a free one; a stopped server's port starts it again there)."""
    workdir = Path(workdir or tempfile.mkdtemp(prefix="gpuhost-redis-"))
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log_path = workdir / "redis.log"
    cmd = [
        REDIS_SERVER,
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(workdir),
        "--daemonize",
        "no",
        "--protected-mode",
        "yes",
        "--logfile",
        str(log_path),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    h = RedisHandle(port=port, workdir=workdir, process=proc, log_path=log_path)
    try:
        wait_ping(port, proc, ready_timeout)
    except (RuntimeError, TimeoutError) as e:
        h.stop()
        raise type(e)(f"{e}\n{h.log()[-3000:]}") from None
    return h


def wait_ping(port: int, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """Until a Redis on loopback `port` answers PING (raw socket: no client retries to wait through)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"redis-server on port {port} not ready after {timeout}s")


def redis_fixture(scope: Literal["session", "module", "function"] = "module"):
    """A pytest fixture: one redis-server for the module (skips when Debian's redis-server is missing)."""
    import pytest

    @pytest.fixture(scope=scope)
    def _redis(tmp_path_factory):
        if not available():
            pytest.skip("redis-server is not installed (APT_PACKAGES in gpuhost.sh)")
        with start_redis(tmp_path_factory.mktemp("redis")) as h:
            yield h

    return _redis


def job_queue_fixture():
    """A pytest fixture ``queue(**config)``: a ``serving.queue.JobQueue`` with its group, on the module's flushed
    redis-server (the fixture named ``redis_srv``, from ``redis_fixture``)."""
    import pytest
    import redis

    from serving.queue import JobQueue, QueueConfig

    @pytest.fixture
    def _queue(redis_srv):
        client = redis.Redis(port=redis_srv.port)
        client.flushall()

        def make(**config) -> JobQueue:
            q = JobQueue(client, QueueConfig(**config))
            q.ensure_group()
            return q

        yield make
        client.close()

    return _queue
