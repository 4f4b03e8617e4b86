"""Launchers for the real local servers tests use (sshd, Triton, nginx, Prometheus, node exporter)."""

import subprocess


def stop_process(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Terminate a launched server, kill it if it does not exit in time; idempotent."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
