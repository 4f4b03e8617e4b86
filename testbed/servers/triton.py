"""A real Triton Inference Server on loopback, for tests (CPU, python backend).

The ``tritonserver`` binary comes from the ``nvidia-pytriton`` wheel, launched the way the benchmarks launch it
(``bench/servers.py``: the python backend and this interpreter's stub in a private backend directory, this venv's
``bin`` first on PATH), here with the tests' own flags (metrics every 200 ms, a short exit timeout, strict
readiness) and waited for until both HTTP and metrics answer.

Usage::

    repo = tmp_path / "models"
    write_sleep_model(repo, "sleep", sleep_ms=20, max_batch_size=8)
    with start_triton(repo) as triton:
        requests.get(triton.http_url + "/v2/health/ready")   # 200
        requests.get(triton.metrics_url + "/metrics")        # Prometheus text

    # in a test module: one server for the module
    triton = triton_fixture(lambda repo: write_sleep_model(repo, "sleep", sleep_ms=5))

Model helpers: ``write_python_model`` writes any stand-in (config.pbtxt text + the generic
``serving/standin_model.py``), ``write_sleep_model`` an echo model FP32 ``INPUT0 -> OUTPUT0``
that sleeps ``sleep_ms`` once per (dynamic) batch.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Literal, Sequence

from bench.servers import Triton, launch_triton, wait_ready
from bench.servers import free_port as free_port
from bench.servers import prepare_backend_dir as prepare_backend_dir
from bench.servers import pytriton_dirs as _pytriton_dirs
from bench.servers import triton_available as triton_available
from bench.servers import triton_env as triton_env

REPO_ROOT = Path(__file__).resolve().parents[2]
STANDIN_MODEL = REPO_ROOT / "serving" / "standin_model.py"


@dataclasses.dataclass
class TritonHandle(Triton):
    """``bench.servers.Triton`` with the names the tests use and, where it made one, its work directory removed on
    stop."""

    workdir: Path = Path(".")
    _owns_workdir: bool = False

    @property
    def http_url(self) -> str:
        return self.http

    @property
    def grpc_url(self) -> str:
        return self.grpc

    @property
    def metrics_url(self) -> str:
        return self.metrics

    def stop(self, timeout: float = 15.0) -> None:
        super().stop(timeout)
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def start_triton(
    model_repository: Path,
    *,
    log_path: Path | None = None,
    extra_args: Sequence[str] = (),
    workdir: Path | None = None,
    ready_timeout: float = 90.0,
    verbose: bool = False,
) -> TritonHandle:
    """Start tritonserver on free loopback ports and wait for ``/v2/health/ready``.

    Args:
      model_repository: directory with ``<model>/config.pbtxt`` and ``<model>/1/...``.
      log_path: where stdout/stderr go (default: ``<workdir>/triton.log``).
      extra_args: more tritonserver flags, e.g. ``("--model-control-mode=explicit",)``.
      workdir: scratch directory for the backend copy (default: a temp dir removed on stop).
      ready_timeout: seconds to wait for readiness before failing with the log tail.
    """
    owns = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="gpuhost-triton-"))
    backends = prepare_backend_dir(workdir)
    dist, _ = _pytriton_dirs()
    log_path = Path(log_path or workdir / "triton.log")
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    args = [
        f"--model-repository={Path(model_repository).resolve()}",
        f"--backend-directory={backends}",
        f"--cache-directory={dist / 'caches'}",
        "--http-address=127.0.0.1",
        f"--http-port={ports['http']}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={ports['grpc']}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={ports['metrics']}",
        "--allow-gpu-metrics=false",
        "--allow-cpu-metrics=false",
        # Counters are scraped at an interval; keep it short so tests read fresh values.
        "--metrics-interval-ms=200",
        "--exit-on-error=true",
        # Open keep-alive client connections otherwise hold shutdown for the default 30 s.
        "--exit-timeout-secs=5",
        "--strict-readiness=true",
        f"--log-verbose={1 if verbose else 0}",
        *extra_args,
    ]
    handle = TritonHandle(launch_triton(args, log_path), ports, log_path, workdir, owns)
    # Triton opens its metrics port after HTTP is ready: tests read /metrics first thing, so wait for both.
    ready = [handle.http_url + "/v2/health/ready", handle.metrics_url + "/metrics"]
    wait_ready("tritonserver", handle.process, ready, ready_timeout, lambda: handle.log()[-4000:], handle.stop)
    return handle


# ---------------------------------------------------------------- model repositories


def write_python_model(repository: Path, name: str, config_pbtxt: str, *, version: int = 1) -> Path:
    """Write ``<repository>/<name>/config.pbtxt`` and the generic stand-in ``model.py``.

    ``config_pbtxt`` must say ``backend: "python"``; any I/O signature works (see
    ``serving/standin_model.py``). Returns the model directory.
    """
    model_dir = Path(repository) / name
    (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config_pbtxt)
    shutil.copy2(STANDIN_MODEL, model_dir / str(version) / "model.py")
    return model_dir


def sleep_model_config(
    name: str,
    *,
    sleep_ms: float = 0.0,
    max_batch_size: int = 8,
    preferred_batch_size: Iterable[int] = (),
    max_queue_delay_microseconds: int = 0,
    dynamic_batching: bool = True,
    instance_count: int = 1,
    dims: Sequence[int] = (-1,),
) -> str:
    """config.pbtxt text of an FP32 echo model that sleeps ``sleep_ms`` per batch."""
    dims_text = ", ".join(str(d) for d in dims)
    lines = [
        f'name: "{name}"',
        'backend: "python"',
        f"max_batch_size: {max_batch_size}",
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims_text} ] }} ]',
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims_text} ] }} ]',
        f"instance_group [ {{ kind: KIND_CPU count: {instance_count} }} ]",
        f'parameters {{ key: "sleep_ms" value {{ string_value: "{sleep_ms}" }} }}',
    ]
    if dynamic_batching and max_batch_size > 0:
        preferred = " ".join(f"preferred_batch_size: {p}" for p in preferred_batch_size)
        lines.append(f"dynamic_batching {{ {preferred} max_queue_delay_microseconds: {max_queue_delay_microseconds} }}")
    return "\n".join(lines) + "\n"


def write_sleep_model(repository: Path, name: str = "sleep", **kwargs) -> Path:
    """Echo model ``INPUT0 -> OUTPUT0`` (FP32) sleeping ``sleep_ms`` once per batch; see ``sleep_model_config``."""
    return write_python_model(repository, name, sleep_model_config(name, **kwargs))


# ---------------------------------------------------------------- pytest

_Scope = Literal["session", "package", "module", "class", "function"]


def triton_fixture(populate: Callable[[Path], object], *, scope: _Scope = "module", extra_args: Sequence[str] = ()):
    """A pytest fixture: a model repository filled by ``populate(repo)`` served by one Triton.

    Example (module scope: one Triton for the whole test module)::

        triton = triton_fixture(lambda repo: write_sleep_model(repo, "sleep", sleep_ms=5))

        def test_ready(triton):
            assert requests.get(triton.http_url + "/v2/health/ready").status_code == 200
    """
    import pytest

    @pytest.fixture(scope=scope)
    def _triton(tmp_path_factory):
        if not triton_available():
            pytest.skip("tritonserver from the nvidia-pytriton wheel is not installed")
        base = tmp_path_factory.mktemp("triton")
        repo = base / "models"
        repo.mkdir()
        populate(repo)
        handle = start_triton(repo, workdir=base / "work", extra_args=extra_args)
        try:
            yield handle
        finally:
            handle.stop()

    return _triton


def gate_inputs(url: str, model: str, **over) -> dict:
    """AcceptanceGate's inputs for `model` served behind `url`: one second of load, no error allowed (``over``: the
    request, the load's shape, the SLO and the rest)."""
    return {
        "url": url,
        "models": [model],
        "model": model,
        "duration_s": 1,
        "max_error_rate": 0.0,
        "trigger": "digest-1",
        **over,
    }
