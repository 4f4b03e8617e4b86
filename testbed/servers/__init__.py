"""Launchers for the real local servers tests use (sshd, Triton, nginx, Prometheus, node exporter)."""

import subprocess
from typing import Callable, Self

from bench.servers import free_port as free_port
from bench.servers import kill_group as kill_group
from bench.servers import stop_process as stop_process
from bench.servers import wait_ready


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
        """Itself once `url` answers 200. RuntimeError if the process exits first, TimeoutError after `timeout`;
        both with `output()` (what the server said), the server stopped (`bench.servers.wait_ready`)."""
        wait_ready(name, self.process, [url], timeout, output, self.stop)
        return self


def wait_until(what: str, cond: Callable[[], object], timeout: float = 60.0, interval: float = 0.1) -> None:
    """Poll `cond` until it is true; after `timeout` seconds fail naming `what` (a bounded wait, never a sleep)."""
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(interval)
