"""A queue worker: pulls jobs from the Redis Stream, runs each on the backend the scheduler picks, stores the result.

One process is one consumer of the group. Threads: ``slots`` job threads, each a loop on a Redis connection of its
own (XREADGROUP … COUNT 1 BLOCK ``block_ms`` under the process's one consumer name, the job's inputs, the call, the
complete script, again: a slot reads only when it is free, so jobs it cannot start stay in the stream for other
workers, and no job waits for a hand-off between threads), the prober (``/v2/health/ready`` and the model's ready
endpoint every ``probe_interval_s``; Triton's queue time and DCGM's XID from their metrics endpoints every
``metrics_interval_s``), the reclaimer (XAUTOCLAIM of jobs idle longer than ``claim_idle_ms``: a dead worker's
pending jobs) with a heartbeat that keeps this worker's own slow jobs from looking idle, and an optional Prometheus
endpoint.

A failed call (backend down, unavailable, deadline) drains that backend in the scheduler and the job goes to
another at once; a job error Triton answers (bad input) is delivered to the caller as an error result, and so is a
request the model failed on (INTERNAL) once a second backend failed on it too: no drain either way. Results go
through ``JobQueue.complete``: stored once per job key, however often a job ran.

Run::

    python -m serving.worker --config /etc/gpuhost/gateway/worker.json --consumer gw-1

Config (JSON)::

    {"redis": {"host": "127.0.0.1", "port": 6379},
     "queue": {"stream": "gen:queue", "group": "workers", "max_depth": 1000},
     "backends": [{"name": "mig-a", "weight": 3, "grpc": "10.0.0.11:8001", "http": "http://10.0.0.11:8000",
                   "metrics": "http://10.0.0.11:8002/metrics", "dcgm": "http://10.0.0.11:9400/metrics"}, ...],
     "slots": 8, "claim_idle_ms": 5000, "metrics_port": 9460, "policy": {"ramp_s": 10, "queue_ms_shift": 20}}
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import http.server
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Optional

import numpy as np
import redis

from serving import triton_wire
from serving.bytes_rows import is_bytes, queue_outputs, wire_inputs
from serving.metrics import Counter, Histogram, parse_samples, render
from serving.queue import Job, JobQueue, QueueConfig, Result
from serving.scheduler import Policy, Scheduler, Signals

log = logging.getLogger("gpuhost.worker")

# Call outcomes that mean "this backend cannot serve now" rather than "this job is bad".
BACKEND_DOWN = {
    "StatusCode.UNAVAILABLE",
    "StatusCode.DEADLINE_EXCEEDED",
    "StatusCode.CANCELLED",
    "StatusCode.UNKNOWN",
    "StatusCode.RESOURCE_EXHAUSTED",
}
# A live Triton's answer that running this request failed (the model raised on it: a frame it cannot handle). The
# job's own failure unless another backend serves it: tried on one more backend (a python stub that has just crashed
# answers the same way once), never a drain; the caller gets Triton's reason. One poison job once made 113 attempts
# and drained both backends 59 seconds of 60 when this counted as "backend down".
JOB_INTERNAL = "StatusCode.INTERNAL"


@dataclasses.dataclass(frozen=True)
class BackendConfig:
    name: str
    weight: float
    grpc: str  # host:port of Triton's gRPC endpoint
    http: str  # http://host:port, for the health probes
    metrics: Optional[str] = None  # Triton's /metrics (queue time)
    dcgm: Optional[str] = None  # dcgm-exporter's /metrics of the backend's GPU (XID)


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    backends: tuple[BackendConfig, ...]
    redis_host: str = "127.0.0.1"
    redis_port: int = 6379
    # A file holding Redis's password (``requirepass <password>``), relative to systemd's $CREDENTIALS_DIRECTORY.
    redis_password_file: Optional[str] = None
    queue: QueueConfig = QueueConfig()
    slots: int = 8
    # How long an idle slot's XREADGROUP waits before it asks again. Each empty answer wakes a slot thread (the GIL,
    # a read on Redis's thread): at 50 ms, 144 idle slots asked 2,880 times a second. It also bounds how long a stop
    # and a reclaimed job wait for an idle slot. bench.queue_floor, 2 workers x 72 slots: worker CPU per job
    # 444-497 us at 50 ms, 377-407 at 500, 368-381 at 1,000. On the H200 at 1,000 jobs/s: latency the same within
    # the runs' spread, Redis's XREADGROUPs 3.3-3.6 -> 1.1 a job, idle gateway CPUs 0.23 -> 0.10 (docs/benchmarks.md).
    block_ms: int = 500
    claim_idle_ms: int = 5000
    probe_interval_s: float = 0.25
    metrics_interval_s: float = 1.0
    call_timeout_s: float = 30.0
    job_timeout_s: float = 60.0
    metrics_port: Optional[int] = None
    models: tuple[str, ...] = ()  # probed for readiness from the start; models seen in jobs are added
    metrics_address: str = "127.0.0.1"
    policy: Policy = Policy()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "WorkerConfig":
        d = dict(d)
        r = d.pop("redis", {})
        d["models"] = tuple(d.get("models", ()))
        d.pop("front", None)  # the HTTP front's (serving.front)
        return cls(
            backends=tuple(BackendConfig(**b) for b in d.pop("backends")),
            redis_host=r.get("host", "127.0.0.1"),
            redis_port=int(r.get("port", 6379)),
            redis_password_file=r.get("password_file"),
            queue=QueueConfig(**d.pop("queue", {})),
            policy=Policy(**d.pop("policy", {})),
            **d,
        )


def redis_password(redis_cfg: dict) -> Optional[str]:
    """Redis's password from the config's ``password_file`` (a ``requirepass <password>`` line, the file Redis
    includes too), a relative path read from systemd's credentials directory (``LoadCredential=``: the unit's
    dynamic user cannot read the root-only file itself); None without one."""
    path = redis_cfg.get("password_file")
    if not path:
        return None
    if not os.path.isabs(path):
        path = os.path.join(os.environ.get("CREDENTIALS_DIRECTORY", "."), path)
    with open(path) as f:
        text = f.read().strip()
    return text.removeprefix("requirepass").strip() or None


class BackendDown(RuntimeError):
    pass


class JobFailed(RuntimeError):
    def __init__(self, message: str, status: str = ""):
        super().__init__(message)
        self.status = status


class TritonBackend:
    """Triton over gRPC (binary tensors; the request serialized with one copy of the job's bytes,
    ``serving.triton_wire``); thread-safe, one channel per backend. A BYTES input (a prompt: a NumPy ``S`` array in
    the queue) goes as the model declares it, read from its metadata once per model, as a client would: BYTES where
    the config says ``TYPE_STRING`` (hk-prod's ``sdxl``), else UINT8 rows, one value a row (the project's python
    backends, ``serving/bytes_rows.py``); a BYTES output comes back into the queue as rows."""

    def __init__(self, cfg: BackendConfig, timeout_s: float):
        import tritonclient.grpc as grpcclient

        self.cfg, self.timeout_s = cfg, timeout_s
        # Reconnect quickly after a restart: gRPC's default backoff grows to minutes.
        self.client = grpcclient.InferenceServerClient(
            cfg.grpc,
            channel_args=[
                ("grpc.initial_reconnect_backoff_ms", 200),
                ("grpc.min_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 1000),
                ("grpc.max_send_message_length", 2**31 - 1),
                ("grpc.max_receive_message_length", 2**31 - 1),
            ],
        )
        self._call = triton_wire.model_infer(self.client._channel)
        self._bytes_inputs: dict[str, frozenset[str]] = {}  # model -> the inputs its metadata declares BYTES

    def _failed(self, status: str, err: Any) -> Exception:
        if status in BACKEND_DOWN:
            return BackendDown(f"{self.cfg.name}: {err}")
        return JobFailed(f"{self.cfg.name}: {err}", status)

    def bytes_inputs(self, model: str) -> frozenset[str]:
        """The inputs ``model`` declares BYTES on this backend (its metadata, read once; again after a failed call:
        the model may have been reloaded with another config). Its failures as ``infer``'s."""
        from tritonclient.utils import InferenceServerException

        known = self._bytes_inputs.get(model)
        if known is None:
            try:
                meta = self.client.get_model_metadata(model, as_json=True, client_timeout=self.timeout_s)
            except InferenceServerException as e:
                raise self._failed(str(e.status()), e) from None
            known = frozenset(i["name"] for i in meta.get("inputs", ()) if i.get("datatype") == "BYTES")
            self._bytes_inputs[model] = known
        return known

    def infer(self, job: Job) -> dict[str, np.ndarray]:
        import grpc

        has_bytes = any(is_bytes(a) for a in job.inputs.values())
        as_bytes = self.bytes_inputs(job.model) if has_bytes else frozenset()
        try:
            request = triton_wire.tensors_request(job.model, wire_inputs(job.inputs, as_bytes))
            response = self._call(request, timeout=self.timeout_s)
        except grpc.RpcError as e:
            self._bytes_inputs.pop(job.model, None)
            raise self._failed(str(e.code()), triton_wire.server_error(e)) from None
        try:
            return queue_outputs(triton_wire.outputs(response))
        except ValueError as e:  # a BYTES output of several values a row: not carried (serving/bytes_rows.py)
            raise JobFailed(f"{self.cfg.name}: {e}", "StatusCode.INVALID_ARGUMENT") from None


def _get(url: str, timeout: float = 1.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (urllib.error.URLError, OSError, socket.timeout):
        return 0, b""


def queue_ms_from(
    prev: Optional[tuple[float, float]], text: str, models: set[str]
) -> tuple[Optional[float], tuple[float, float]]:
    """Average queue time per request since ``prev`` from Triton's /metrics text, over the given models."""
    queue_us = success = 0.0
    for name, labels, value in parse_samples(text):
        if labels.get("model") not in models:
            continue
        if name == "nv_inference_queue_duration_us":
            queue_us += value
        elif name == "nv_inference_request_success":
            success += value
    now = (queue_us, success)
    if prev is None or success <= prev[1]:
        return None, now
    return (queue_us - prev[0]) / (success - prev[1]) / 1000.0, now


def xid_from(text: str) -> int:
    """The largest XID DCGM reports on this backend's GPUs (0: none)."""
    return int(max((v for n, _, v in parse_samples(text) if n == "DCGM_FI_DEV_XID_ERRORS"), default=0))


class Worker:
    def __init__(
        self,
        cfg: WorkerConfig,
        consumer: str,
        *,
        models: Optional[set[str]] = None,
        backend_factory: Callable[[BackendConfig, float], Any] = TritonBackend,
    ):
        self.cfg, self.consumer = cfg, consumer
        self.r = self._redis()
        self.queue = JobQueue(self.r, cfg.queue)
        self.sched = Scheduler({b.name: b.weight for b in cfg.backends}, cfg.policy)
        self.backends = {b.name: backend_factory(b, cfg.call_timeout_s) for b in cfg.backends}
        self.models = set(models or cfg.models)  # models whose queue time counts; learned from jobs when empty
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._holding: dict[str, float] = {}  # jobs this process holds (running, or reclaimed and waiting): id → since
        self._claimed: collections.deque[Job] = collections.deque()  # reclaimed jobs for the next free slot
        self.jobs = Counter("gpuhost_gateway_jobs_total", "Jobs finished by this worker", ("backend", "outcome"))
        self.calls = Counter("gpuhost_gateway_backend_calls_total", "Calls to backends", ("backend", "outcome"))
        self.latency = Histogram(
            "gpuhost_gateway_job_latency_seconds", "Submit to result stored, queueing included", ("backend",)
        )
        self.queue_time = Histogram("gpuhost_gateway_job_queue_seconds", "Submit to first dispatch", ("backend",))
        self.reclaimed = Counter("gpuhost_gateway_jobs_reclaimed_total", "Jobs taken over from an idle consumer", ())
        self.duplicates = Counter(
            "gpuhost_gateway_duplicate_completions_total",
            "Completions dropped because the job key was already done",
            (),
        )

    def _redis(self, **kw: Any) -> redis.Redis:
        return redis.Redis(
            host=self.cfg.redis_host,
            port=self.cfg.redis_port,
            password=redis_password({"password_file": self.cfg.redis_password_file}),
            socket_timeout=10,
            **kw,
        )

    # ------------------------------------------------------------------ jobs

    def _process(self, job: Job, queue: Optional[JobQueue] = None) -> None:
        """Run a job this process holds (in ``_holding``) and store its result through ``queue`` (a slot's own)."""
        try:
            res = self._run(job)
            first = (queue or self.queue).complete(job, res)
            self.jobs.inc(res.backend or "-", res.status)
            if not first:
                self.duplicates.inc()
            else:
                self.latency.observe(res.latency_ms / 1000, res.backend or "-")
                self.queue_time.observe(res.queue_ms / 1000, res.backend or "-")
        except Exception:  # the job stays pending and is reclaimed after claim_idle_ms
            log.exception("job %s: not completed", job.key)
        finally:
            with self._lock:
                self._holding.pop(job.id, None)

    def _run(self, job: Job) -> Result:
        if job.error:  # an entry that does not decode: its caller (if any) gets the error, nothing is called
            return self._result(job, "error", "", time.time(), 0.0, 0, job.error)
        self.models.add(job.model)
        tried: set[str] = set()
        attempts = 0
        first_dispatch: Optional[float] = None
        last_error = ""
        internal = 0  # INTERNAL answers this job got (see JOB_INTERNAL)
        deadline = time.monotonic() + self.cfg.job_timeout_s
        while not self.stop.is_set():
            now = time.monotonic()
            name = self.sched.pick(now, exclude=tried)
            if name is None and tried:
                tried.clear()
                name = self.sched.pick(now)
            if name is None:
                if now > deadline:
                    break
                time.sleep(0.02)
                continue
            first_dispatch = first_dispatch or time.time()
            attempts += 1
            self.sched.started(name)
            t0 = time.perf_counter()
            try:
                outputs = self.backends[name].infer(job)
            except BackendDown as e:
                self.sched.failed(name, time.monotonic())
                self.calls.inc(name, "backend_down")
                tried.add(name)
                last_error = str(e)
                continue
            except JobFailed as e:
                if e.status == "StatusCode.NOT_FOUND" and job.model in self.cfg.models:
                    # A model this gateway serves is not loaded there (unloaded, reloading): the backend's fault.
                    self.sched.failed(name, time.monotonic())
                    self.calls.inc(name, "model_not_ready")
                    tried.add(name)
                    last_error = str(e)
                    continue
                if e.status == JOB_INTERNAL and internal == 0 and len(self.backends) > 1:
                    internal += 1
                    self.calls.inc(name, "job_internal")
                    tried.add(name)  # the other backend next; this one is not drained
                    last_error = str(e)
                    continue
                self.calls.inc(name, "job_error")
                return self._result(job, "error", name, first_dispatch, 0.0, attempts, str(e))
            finally:
                self.sched.finished(name)
            self.calls.inc(name, "ok")
            return self._result(
                job, "ok", name, first_dispatch, (time.perf_counter() - t0) * 1000, attempts, outputs=outputs
            )
        if self.stop.is_set():
            raise RuntimeError("worker stopping; job left pending for another worker")
        return self._result(
            job,
            "error",
            "",
            first_dispatch or time.time(),
            0.0,
            attempts,
            f"no backend could serve the job within {self.cfg.job_timeout_s:g}s"
            + (f" (last: {last_error})" if last_error else ""),
        )

    def _result(
        self,
        job: Job,
        status: str,
        backend: str,
        dispatched: float,
        service_ms: float,
        attempts: int,
        error: str = "",
        outputs: Optional[dict] = None,
    ) -> Result:
        now = time.time()
        return Result(
            key=job.key,
            status=status,
            backend=backend,
            worker=self.consumer,
            latency_ms=(now - job.enqueued_at) * 1000,
            queue_ms=(dispatched - job.enqueued_at) * 1000,
            service_ms=service_ms,
            attempts=attempts,
            reclaimed=job.reclaimed,
            error=error,
            outputs=outputs or {},
        )

    def _hold(self, job: Job) -> None:
        with self._lock:
            self._holding[job.id] = time.monotonic()
        if job.reclaimed:
            self.reclaimed.inc()

    # ------------------------------------------------------------------ loops

    def _slot(self) -> None:
        """One job at a time, on a connection of its own: a reclaimed job waiting for a slot, else the next entry
        (XREADGROUP COUNT 1 BLOCK ``block_ms``) and its inputs, run and completed. Stops between jobs."""
        r = self._redis()  # the slot's round trips are on the queue's own connection (one: one thread)
        queue = JobQueue(r, self.cfg.queue)
        try:
            while not self.stop.is_set():
                try:
                    job = self._claimed.popleft()
                except IndexError:
                    try:
                        jobs = queue.read(self.consumer, count=1, block_ms=self.cfg.block_ms)
                    except Exception:  # Redis away, or an entry that does not decode: the slot lives on
                        log.exception("read")
                        self.stop.wait(0.5)
                        continue
                    if not jobs:
                        continue
                    job = jobs[0]
                    self._hold(job)
                self._process(job, queue)
        finally:
            queue.close()
            r.close()

    def _reclaimer(self) -> None:
        idle = self.cfg.claim_idle_ms / 1000
        while not self.stop.wait(max(0.1, idle / 4)):
            try:
                with self._lock:
                    mine = list(self._holding)
                self.queue.touch(self.consumer, mine)
                free = self.cfg.slots - len(mine)  # the claimed jobs not yet started are held too
                if free > 0:
                    for job in self.queue.autoclaim(self.consumer, min_idle_ms=self.cfg.claim_idle_ms, count=free):
                        self._hold(job)
                        self._claimed.append(job)
            except redis.RedisError:
                log.exception("reclaim")

    def _probe_once(self, b: BackendConfig, prev: dict[str, Any], with_metrics: bool) -> None:
        ready = _get(b.http + "/v2/health/ready")[0] == 200
        for m in sorted(self.models):
            ready = ready and _get(f"{b.http}/v2/models/{m}/ready")[0] == 200
        queue_ms = None
        xid = prev.get("xid", 0)
        if with_metrics and ready and b.metrics and self.models:
            status, body = _get(b.metrics)
            if status == 200:
                queue_ms, prev["counters"] = queue_ms_from(
                    prev.get("counters"), body.decode(errors="replace"), self.models
                )
        if with_metrics and b.dcgm:
            status, body = _get(b.dcgm)
            if status == 200:
                xid = prev["xid"] = xid_from(body.decode(errors="replace"))
        self.sched.observe(b.name, Signals(ready=ready, queue_ms=queue_ms, xid=xid), time.monotonic())

    def _prober(self) -> None:
        state: dict[str, dict] = {b.name: {} for b in self.cfg.backends}
        last_metrics = 0.0
        while True:
            now = time.monotonic()
            with_metrics = now - last_metrics >= self.cfg.metrics_interval_s
            if with_metrics:
                last_metrics = now
            for b in self.cfg.backends:
                self._probe_once(b, state[b.name], with_metrics)
            if self.stop.wait(self.cfg.probe_interval_s):
                return

    # ------------------------------------------------------------------ metrics

    def metrics_text(self) -> str:
        now = time.monotonic()
        labels = {"consumer": self.consumer, "stream": self.cfg.queue.stream}
        gauges: list[tuple[str, str, dict[str, str], float]] = []
        try:
            info = self.queue.group_info()
            gauges += [
                ("gpuhost_gateway_queue_depth", "Jobs in the stream (waiting or running)", {}, self.queue.depth()),
                ("gpuhost_gateway_queue_pending", "Jobs delivered, not yet acknowledged", {}, info["pending"]),
                ("gpuhost_gateway_queue_lag", "Jobs not yet delivered to any worker", {}, info["lag"]),
                (
                    "gpuhost_gateway_queue_max_depth",
                    "Depth at which new jobs are refused",
                    {},
                    self.cfg.queue.max_depth,
                ),
            ]
            for k, v in self.queue.stats().items():
                if k == "refused":
                    gauges.append(
                        ("gpuhost_gateway_jobs_refused", "Submits refused by a full queue (all workers)", {}, v)
                    )
                elif k == "shed":
                    gauges.append(
                        ("gpuhost_gateway_jobs_shed", "Submits refused for their queue time (all workers)", {}, v)
                    )
            up = 1.0
        except redis.RedisError:
            up = 0.0
        gauges.append(("gpuhost_gateway_redis_up", "Redis answered this scrape", {}, up))
        for name, s in self.sched.snapshot(now).items():
            b = {"backend": name}
            gauges += [
                ("gpuhost_gateway_backend_healthy", "Health probe and calls succeed", b, float(s["healthy"])),
                ("gpuhost_gateway_backend_weight", "Configured weight", b, s["weight"]),
                (
                    "gpuhost_gateway_backend_effective_weight",
                    "Weight after health, queue time and ramp",
                    b,
                    s["effective_weight"],
                ),
                (
                    "gpuhost_gateway_backend_in_flight",
                    "Jobs running on the backend from this worker",
                    b,
                    s["in_flight"],
                ),
            ]
            if s["queue_ms"] is not None:
                gauges.append(
                    ("gpuhost_gateway_backend_queue_ms", "Triton's average queue time per request", b, s["queue_ms"])
                )
        return render(
            gauges,
            [self.jobs, self.calls, self.reclaimed, self.duplicates],
            [self.latency, self.queue_time],
            common=labels,
        )

    def _serve_metrics(self) -> Optional[http.server.ThreadingHTTPServer]:
        if self.cfg.metrics_port is None:
            return None
        worker = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = worker.metrics_text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        srv = http.server.ThreadingHTTPServer((self.cfg.metrics_address, self.cfg.metrics_port), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True, name="metrics").start()
        return srv

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> None:
        """Run until ``stop`` is set; jobs in flight finish (or stay pending for another worker)."""
        self.queue.ensure_group()
        for b in self.cfg.backends:  # a first probe before any job, so the scheduler starts with real health
            self._probe_once(b, {}, False)
        self.queue.join(self.consumer)
        srv = self._serve_metrics()
        slots = [threading.Thread(target=self._slot, daemon=True, name=f"slot-{i}") for i in range(self.cfg.slots)]
        threads = [threading.Thread(target=t, daemon=True, name=t.__name__) for t in (self._prober, self._reclaimer)]
        for t in slots + threads:
            t.start()
        try:
            while not self.stop.wait(0.5):
                pass
        finally:
            self.stop.set()
            for t in slots:  # each finishes its job (or leaves it pending: ``_run`` gives up when stopping)
                t.join()
            for t in threads:
                t.join(5)
            if srv:
                srv.shutdown()


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--consumer", default=f"{socket.gethostname()}-{os.getpid()}")
    ap.add_argument("--metrics-port", type=int)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open(a.config) as f:
        cfg = WorkerConfig.from_dict(json.load(f))
    if a.metrics_port is not None:
        cfg = dataclasses.replace(cfg, metrics_port=a.metrics_port)
    w = Worker(cfg, a.consumer)
    signal.signal(signal.SIGTERM, lambda *_: w.stop.set())
    signal.signal(signal.SIGINT, lambda *_: w.stop.set())
    log.info("worker %s: %d backends, %d slots, stream %s", a.consumer, len(cfg.backends), cfg.slots, cfg.queue.stream)
    w.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
