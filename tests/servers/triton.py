"""A real Triton Inference Server on loopback, for tests (CPU, python backend).

The ``tritonserver`` binary comes from the ``nvidia-pytriton`` wheel: its shared libraries
live in the wheel's ``nvidia_pytriton.libs`` and the python backend's stub is shipped per
Python version beside it. We copy the backend (``libtriton_python.so`` and its utils) plus
the stub for this interpreter into a private backend directory so site-packages stays
untouched, and put this venv's ``bin`` first on PATH: the stub embeds the system
``libpython3.11`` in isolated mode and takes its prefix (hence numpy) from ``python3`` on PATH.

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
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Literal, Sequence

from serving.health import http_status
from tests.servers import free_port, stop_process

REPO_ROOT = Path(__file__).resolve().parents[2]
STANDIN_MODEL = REPO_ROOT / "serving" / "standin_model.py"


def _pytriton_dirs() -> tuple[Path, Path]:
    import pytriton

    dist = Path(pytriton.__file__).resolve().parent / "tritonserver"
    libs = dist.parent.parent / "nvidia_pytriton.libs"
    return dist, libs


def triton_available() -> bool:
    """True when the wheel's tritonserver and the stub for this Python exist."""
    try:
        dist, libs = _pytriton_dirs()
    except ImportError:
        return False
    stub = dist / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}" / "triton_python_backend_stub"
    return (dist / "bin" / "tritonserver").exists() and libs.is_dir() and stub.exists()


def prepare_backend_dir(workdir: Path) -> Path:
    """Copy the python backend and this interpreter's stub into ``workdir/backends``."""
    dist, _ = _pytriton_dirs()
    backends = workdir / "backends"
    python = backends / "python"
    python.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(dist / "backends" / "python" / name, python / name)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    shutil.copy2(stub, python / "triton_python_backend_stub")
    # The stub finds libcudart through a relative RUNPATH ($ORIGIN/../../../../nvidia_pytriton.libs);
    # LD_LIBRARY_PATH covers it from the copied location.
    return backends


def triton_env() -> dict[str, str]:
    """Environment for tritonserver and its python stubs."""
    _, libs = _pytriton_dirs()
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(libs), env.get("LD_LIBRARY_PATH", "")) if p)
    # The stub embeds libpython with an isolated config (PYTHONPATH is ignored) and finds its
    # prefix by looking up ``python3`` on PATH; a venv's bin first makes that this venv.
    env["PATH"] = os.pathsep.join([str(Path(sys.prefix) / "bin"), env.get("PATH", "")])
    return env


@dataclasses.dataclass
class TritonHandle:
    http_url: str
    grpc_url: str  # host:port, as tritonclient.grpc wants it
    metrics_url: str
    ports: dict[str, int]
    process: subprocess.Popen
    workdir: Path
    log_path: Path
    _owns_workdir: bool = False

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        stop_process(self.process, timeout=timeout)
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "TritonHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


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
    cmd = [
        str(dist / "bin" / "tritonserver"),
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
    log = open(log_path, "ab")
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=triton_env(), start_new_session=True)
    log.close()
    handle = TritonHandle(
        http_url=f"http://127.0.0.1:{ports['http']}",
        grpc_url=f"127.0.0.1:{ports['grpc']}",
        metrics_url=f"http://127.0.0.1:{ports['metrics']}",
        ports=ports,
        process=process,
        workdir=workdir,
        log_path=log_path,
        _owns_workdir=owns,
    )
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = handle.log()[-4000:]
            handle.stop()
            raise RuntimeError(f"tritonserver exited with {process.returncode}:\n{tail}")
        # Triton opens its metrics port after HTTP is ready: tests read /metrics first thing, so wait for both.
        if (
            http_status(handle.http_url + "/v2/health/ready") == 200
            and http_status(handle.metrics_url + "/metrics") == 200
        ):
            return handle
        time.sleep(0.2)
    tail = handle.log()[-4000:]
    handle.stop()
    raise TimeoutError(f"tritonserver not ready after {ready_timeout}s:\n{tail}")


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
        "durationS": 1,
        "maxErrorRate": 0.0,
        "trigger": "digest-1",
        **over,
    }
