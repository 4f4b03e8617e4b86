"""Triton and nginx on loopback, from a model repository to ready: the one launcher of the benchmarks and the tests.

Triton is the real ``tritonserver`` of the nvidia-pytriton wheel. Its python backend and this interpreter's stub are
copied into a private backend directory (site-packages stays untouched); the stub links libpython from this
interpreter's LIBDIR and takes its prefix (torch, numpy) from ``python3`` on PATH, so this interpreter's directory
goes first there. Runs on the GPU device machine too: only the standard library, ``plans`` and the wheel.

* ``start_triton``: a repository's files written, Triton with gpuhost's own server arguments (``plans.triton_runtime``)
  on free ports, ready;
* ``start_servers``: that Triton and nginx with gpuhost's rendered config in front (``plans.nginx``), plus more nginx
  fronts by ``worker_processes``; ``nginx_timing``: the first front also logs nginx's own times per request
  (``with_timing_log``, ``read_timing``), a benchmark's addition to the rendered config, which logs nothing per
  request;
* ``launch_triton`` / ``wait_ready`` / ``stop_process``: the parts, for a caller with its own arguments
  (``testbed/servers/triton.py``);
* ``worker_backends``: ``serving.worker``'s backends config for such Tritons;
* ``get_json``, ``model_stats``, ``batch_sizes``, ``stats_delta``: Triton's statistics over a run.

Usage::

    s = start_servers(workdir, specs, files, "/usr/sbin/nginx", http_threads=16, nginx_workers=("4",))
    get_json(f"{s.nginx_http}/v2/models/{specs[0].name}/config")
    s.stop()

    triton = start_triton(workdir, specs, files, ready_timeout=300)   # Triton alone: triton.http, triton.grpc
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Self, Sequence

from gate.health import http_status
from plans.nginx import NginxSpec, render
from plans.triton_runtime import ServerOptions, server_args


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


# ---------------------------------------------------------------- processes


def kill_group(pgid: int) -> None:
    """SIGKILL every process left in the group ``pgid`` (a launched server's session); no-op when none is."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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


def wait_ready(
    name: str,
    proc: subprocess.Popen,
    urls: Sequence[str],
    timeout: float,
    output: Callable[[], str],
    stop: Callable[[], None],
) -> None:
    """Back once every one of ``urls`` answers 200. When the process exits first: RuntimeError; after
    ``timeout``: TimeoutError; both with ``output()`` (what the server said), after ``stop()`` (what is left of
    its session ends too)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = output()
            stop()
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")
        if all(http_status(u) == 200 for u in urls):
            return
        time.sleep(0.2)
    tail = output()
    stop()
    raise TimeoutError(f"{name} not ready after {timeout}s:\n{tail}")


# ---------------------------------------------------------------- Triton


def pytriton_dirs() -> tuple[Path, Path]:
    """The wheel's tritonserver tree and its shared libraries, found without importing pytriton (its client needs
    packages the device machine does not have)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("nvidia-pytriton is not installed (pip install the wheel, or put it on PYTHONPATH)")
    dist = Path(list(spec.submodule_search_locations)[0]).resolve() / "tritonserver"
    return dist, dist.parent.parent / "nvidia_pytriton.libs"


def _stub(dist: Path) -> Path:
    return dist / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}" / "triton_python_backend_stub"


def triton_available() -> bool:
    """True when the wheel's tritonserver and the stub for this Python exist."""
    try:
        dist, libs = pytriton_dirs()
    except ImportError:
        return False
    return (dist / "bin" / "tritonserver").exists() and libs.is_dir() and _stub(dist).exists()


def prepare_backend_dir(workdir: Path) -> Path:
    """Copy the python backend and this interpreter's stub into ``workdir/backends``; returns that directory."""
    dist, _ = pytriton_dirs()
    backends = Path(workdir) / "backends"
    python = backends / "python"
    python.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(dist / "backends" / "python" / name, python / name)
    # The stub finds libcudart through a relative RUNPATH ($ORIGIN/../../../../nvidia_pytriton.libs);
    # LD_LIBRARY_PATH covers it from the copied location.
    shutil.copy2(_stub(dist), python / "triton_python_backend_stub")
    return backends


def triton_env() -> dict[str, str]:
    """Environment for tritonserver and its python stubs."""
    _, libs = pytriton_dirs()
    env = dict(os.environ)
    # The stub links libpython3.X.so: take it from this interpreter's own LIBDIR (a venv's base Python).
    pylib = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(x for x in (str(libs), pylib, env.get("LD_LIBRARY_PATH", "")) if x)
    # The stub embeds libpython with an isolated config (PYTHONPATH is ignored) and finds its prefix by looking up
    # ``python3`` on PATH; this interpreter's directory first makes that this interpreter (or venv).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def launch_triton(args: Sequence[str], log_path: Path) -> subprocess.Popen:
    """The wheel's tritonserver with ``args``, in its own session, its output appended to ``log_path``."""
    dist, _ = pytriton_dirs()
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            [str(dist / "bin" / "tritonserver"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=triton_env(),
            start_new_session=True,
        )


def write_repository(repo: Path, files: Mapping[str, bytes]) -> Path:
    """``files`` ({relative path: content}, e.g. ``plans.triton_repo.repository_files``) under ``repo``."""
    for rel, content in files.items():
        p = repo / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)
    return repo


@dataclasses.dataclass
class Triton:
    process: subprocess.Popen
    ports: dict[str, int]
    log_path: Path

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"  # host:port, as tritonclient.grpc wants it

    @property
    def metrics(self) -> str:
        return f"http://127.0.0.1:{self.ports['metrics']}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        stop_process(self.process, timeout=timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_triton(
    workdir: Path,
    specs: Sequence[Any],
    files: Mapping[str, bytes],
    *,
    extra: Sequence[str] = (),
    ready_timeout: float = 600.0,
) -> Triton:
    """Triton serving ``files`` (written to ``workdir/models``) with gpuhost's server arguments for ``specs``
    (``plans.triton_model.ModelSpec``s) on free loopback ports, ready; its log at ``workdir/triton.log``.

    Args:
      extra: more tritonserver flags, e.g. ``("--http-thread-count=16",)``.
      ready_timeout: seconds to wait for ``/v2/health/ready`` (a GPU model's first load and CUDA graphs take long).
    """
    repo = write_repository(workdir / "models", files)
    backends = prepare_backend_dir(workdir)
    dist, _ = pytriton_dirs()
    ports = {k: free_port() for k in ("http", "grpc", "metrics")}
    opts = ServerOptions(
        model_repository=str(repo),
        http_port=ports["http"],
        grpc_port=ports["grpc"],
        metrics_port=ports["metrics"],
        exit_on_error=True,
        backend_directory=str(backends),
        extra=["--http-address=127.0.0.1", "--grpc-address=127.0.0.1", f"--cache-directory={dist / 'caches'}", *extra],
    )
    args = server_args(opts, list(specs))
    log("tritonserver " + " ".join(args))
    triton = Triton(launch_triton(args, workdir / "triton.log"), ports, workdir / "triton.log")
    tail = lambda: triton.log()[-6000:]  # noqa: E731
    wait_ready("tritonserver", triton.process, [triton.http + "/v2/health/ready"], ready_timeout, tail, triton.stop)
    return triton


def worker_backends(tritons: Mapping[str, Triton], weights: Mapping[str, float]) -> list[dict]:
    """``serving.worker``'s ``backends`` config for loopback Tritons: each name in ``weights`` with its weight and
    its Triton's gRPC, HTTP and metrics endpoints."""
    return [
        {
            "name": n,
            "weight": w,
            "grpc": tritons[n].grpc,
            "http": tritons[n].http,
            "metrics": tritons[n].metrics + "/metrics",
        }
        for n, w in weights.items()
    ]


# ---------------------------------------------------------------- nginx in front


def front_conf(
    prefix: Path, model: str, http_port: int, grpc_port: int, workers: str, models: tuple[str, ...] = ()
) -> tuple[str, int, int]:
    """gpuhost's rendered nginx.conf in front of a loopback Triton (``model`` the default, ``models`` all it
    forwards, empty: the default alone), listening on free loopback ports; returns (conf, HTTP port, gRPC port)."""
    listen_http, listen_grpc = free_port(), free_port()
    spec = NginxSpec(
        default_model=model,
        models=models,
        listen_address="127.0.0.1",
        listen_http=listen_http,
        listen_grpc=listen_grpc,
        upstream_http=f"127.0.0.1:{http_port}",
        upstream_grpc=f"127.0.0.1:{grpc_port}",
        prefix=str(prefix),
        user="root" if os.geteuid() == 0 else None,  # as root, workers stay root so they can use the temp dir
        worker_processes=workers,
    )
    return render(spec), listen_http, listen_grpc


# nginx's clock for one request (ms resolution): when it was logged, its time from the first byte read from the
# client to the last byte sent, and the upstream's connect, response-header and whole-response times.
TIMING_FORMAT = (
    "log_format gpuhost_timing '$msec $request_time $upstream_connect_time $upstream_header_time "
    "$upstream_response_time $status';"
)


TIMING_LOG = "timing.log"  # in the nginx front's prefix directory


def with_timing_log(conf: str, path: Path) -> str:
    """``conf`` (gpuhost's rendered nginx.conf) with nginx's times of every request logged to ``path``."""
    off = "    access_log off;\n"  # the http block's, the first in the rendered config
    if off not in conf:
        raise ValueError("the rendered nginx.conf has no http-level 'access_log off;' to replace")
    return conf.replace(off, f"    {TIMING_FORMAT}\n    access_log {path} gpuhost_timing;\n", 1)


def read_timing(path: Path, t0: float, t1: float) -> dict:
    """Means (ms) of nginx's times for the answered (200) requests it logged between wall-clock ``t0`` and ``t1``:
    ``request`` (client's first byte in to the last byte out), ``upstream_connect``, ``upstream_header``,
    ``upstream_response`` (Triton, from nginx's side of the connection), and ``requests``."""
    keys = ("request", "upstream_connect", "upstream_header", "upstream_response")
    sums, n = dict.fromkeys(keys, 0.0), 0
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        f = line.split()
        if len(f) != 6 or f[5] != "200":
            continue
        try:
            when, vals = float(f[0]), [float(v) for v in f[1:5]]
        except ValueError:  # "-": no upstream; "a, b": a retried upstream (neither is a plain answer)
            continue
        if t0 <= when <= t1:
            n += 1
            for k, v in zip(keys, vals):
                sums[k] += v
    return {"requests": n, **{f"{k}_ms": round(sums[k] / n * 1000, 3) if n else None for k in keys}}


def start_nginx(
    prefix: Path,
    nginx_bin: str,
    model: str,
    http_port: int,
    grpc_port: int,
    workers: str,
    models: tuple[str, ...] = (),
    *,
    timing: bool = False,
) -> tuple[subprocess.Popen, str, str]:
    """nginx with gpuhost's rendered config in front of Triton; returns (process, http URL, gRPC target).
    ``timing``: nginx's times of every request logged to ``prefix/TIMING_LOG`` (``with_timing_log``)."""
    conf, listen_http, listen_grpc = front_conf(prefix, model, http_port, grpc_port, workers, models)
    if timing:
        conf = with_timing_log(conf, prefix / TIMING_LOG)
    prefix.mkdir(exist_ok=True)
    (prefix / "nginx.conf").write_text(conf)
    cmd = [nginx_bin, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", str(prefix / "error.log")]
    t = subprocess.run([*cmd, "-t"], capture_output=True, text=True)
    if t.returncode:
        raise RuntimeError(f"nginx -t failed: {t.stderr}")
    proc = subprocess.Popen(
        [*cmd, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )
    nhttp = f"http://127.0.0.1:{listen_http}"
    wait_ready("nginx", proc, [nhttp + "/nginx-health"], 30, lambda: "", lambda: stop_process(proc))
    return proc, nhttp, f"127.0.0.1:{listen_grpc}"


@dataclasses.dataclass
class Servers:
    triton: Triton
    nginx: subprocess.Popen
    http: str  # Triton itself
    grpc: str
    nginx_http: str
    nginx_grpc: str
    workdir: Path
    # More nginx fronts by worker_processes (A/B of the rendered config's one knob that depends on the host).
    extra: dict = dataclasses.field(default_factory=dict)
    nginx_timing: Optional[Path] = None  # the first front's timing log (start_servers' nginx_timing)

    def base(self, via: str) -> str:
        """The HTTP URL of ``via``: ``nginx``, ``direct`` (Triton) or ``nginx-w<workers>``."""
        return {"nginx": self.nginx_http, "direct": self.http}.get(via) or self.extra[via.removeprefix("nginx-w")][1]

    def stop(self) -> None:
        for p in (*(x[0] for x in self.extra.values()), self.nginx):
            stop_process(p, timeout=20)
        self.triton.stop()

    def finish(
        self, out: Optional[Path] = None, log_name: str = "", report_prefixes: tuple[str, ...] = ()
    ) -> tuple[str, list[dict]]:
        """Stop everything, keep Triton's log (its last 4 MB as ``out/log_name`` where given), remove the work
        directory; returns the log's last 3,000 characters and the backend's JSON reports (its log lines that start
        with one of ``report_prefixes``: a name, a space, JSON)."""
        self.stop()
        text = self.triton.log()
        if out is not None and log_name:
            out.mkdir(parents=True, exist_ok=True)
            (out / log_name).write_text(text[-4_000_000:])
        shutil.rmtree(self.workdir, ignore_errors=True)
        lines = text.splitlines() if report_prefixes else []
        reports = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith(report_prefixes)]
        return text[-3000:], reports


def start_servers(
    workdir: Path,
    specs: Sequence[Any],
    files: Mapping[str, bytes],
    nginx_bin: str,
    *,
    http_threads: int,
    nginx_workers: Sequence[str] = (),
    server_extra: Sequence[str] = (),
    nginx_timing: bool = False,
) -> Servers:
    """``start_triton`` (``http_threads`` HTTP threads, then the flags ``server_extra``) and nginx
    (``worker_processes auto``, default model ``specs[0]``) in front of it, plus one more nginx per ``nginx_workers``
    entry; ``nginx_timing``: the first nginx logs its times per request (``Servers.nginx_timing``)."""
    extra = [f"--http-thread-count={http_threads}", "--log-verbose=0", *server_extra]
    t = start_triton(workdir, specs, files, extra=extra)
    http, grpc = t.ports["http"], t.ports["grpc"]
    served = tuple(sp.name for sp in specs)
    try:
        nginx, nhttp, ngrpc = start_nginx(
            workdir / "nginx", nginx_bin, specs[0].name, http, grpc, "auto", served, timing=nginx_timing
        )
        fronts = {
            w: start_nginx(workdir / f"nginx-{w}", nginx_bin, specs[0].name, http, grpc, w, served)
            for w in nginx_workers
        }
    except BaseException:
        t.stop()
        raise
    timing = workdir / "nginx" / TIMING_LOG if nginx_timing else None
    return Servers(t, nginx, t.http, t.grpc, nhttp, ngrpc, workdir, fronts, timing)


# ---------------------------------------------------------------- Triton's statistics


def model_stats(http_url: str, model: str) -> dict:
    return get_json(f"{http_url}/v2/models/{model}/stats")["model_stats"][0]


def batch_sizes(before: dict, after: dict) -> dict:
    """{batch size: executions} Triton formed between two stats readings, with executions and inferences."""
    prev = {int(x["batch_size"]): int(x["compute_infer"]["count"]) for x in before.get("batch_stats", [])}
    sizes = {}
    for x in after.get("batch_stats", []):
        d = int(x["compute_infer"]["count"]) - prev.get(int(x["batch_size"]), 0)
        if d:
            sizes[int(x["batch_size"])] = d
    ex = int(after.get("execution_count", 0)) - int(before.get("execution_count", 0))
    inf = int(after.get("inference_count", 0)) - int(before.get("inference_count", 0))
    return {"sizes": dict(sorted(sizes.items())), "executions": ex, "inferences": inf}


def stats_delta(before: dict, after: dict) -> dict:
    """Per-request averages (µs) of Triton's phases over a run, executions and the average batch."""
    b, a = before["inference_stats"], after["inference_stats"]
    out: dict = {"requests": int(a["success"]["count"]) - int(b["success"]["count"])}
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        dn = int(a[key]["ns"]) - int(b[key]["ns"])
        dc = int(a[key]["count"]) - int(b[key]["count"])
        out[f"{key}_us"] = round(dn / dc / 1000, 1) if dc else None
    formed = batch_sizes(before, after)
    out["executions"] = formed["executions"]
    out["avg_batch"] = round(formed["inferences"] / formed["executions"], 2) if formed["executions"] else None
    out["batch_sizes"] = formed["sizes"]
    return out
