"""Launchers for the real local servers tests use (sshd, Triton, nginx, Prometheus, node exporter)."""

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import Callable, Self


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Terminate a launched server, kill it if it does not exit in time; idempotent.

    Servers are launched with ``start_new_session=True``; whatever is left of the session's process group
    afterwards (Triton's python-backend stubs outlive a SIGKILLed server) is killed too.
    """
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    kill_group(proc.pid)


def kill_group(pgid: int) -> None:
    """SIGKILL every process left in the group ``pgid`` (a launched server's session); no-op when none is."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class LaunchedServer:
    """A launched server's handle: `stop()` ends its process (and what is left of its session), and
    `with start_x(...) as handle:` stops it on the way out. Subclasses are dataclasses with a `process` field."""

    process: subprocess.Popen
    STOP_TIMEOUT = 10.0

    def stop(self) -> None:
        stop_process(self.process, timeout=self.STOP_TIMEOUT)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_ready(self, name: str, url: str, timeout: float, output: Callable[[], str]) -> Self:
        """Itself once `url` answers 200. RuntimeError if the process exits first; after `timeout`, the server
        stopped and TimeoutError; both with `output()` (what the server said)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.process.returncode}:\n{output()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, socket.timeout):
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"{name} not ready after {timeout}s:\n{output()}")
