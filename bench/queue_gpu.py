"""Seed 001's queue gateway in front of the real detector: direct calls vs the gateway, and its faults (issue 27).

Setup (all real, on one machine): two Tritons on the one GPU, each serving ``yolov8n`` (the ``yolov8n_torch``
python-backend model with the test detector's weights, the GPU's preset: instances, max batch, Triton window), named
triton-a (weight 3) and triton-b (weight 2); Redis (Debian's redis-server); ``--workers`` processes of
``python -m serving.worker`` (the gateway's workers, ``--slots`` each); the load from ``--procs`` processes of
``--threads`` threads each, started once and reused, so the load generator is not the bottleneck.

Inputs (``--input``): each request carries one distinct frame ``i mod --images``, the same bytes on both paths.
``jpeg`` (the GPU default, as users send frames; the detector's ``input: jpeg`` mode decodes them with nvJPEG):
structured camera frames of 1280x720, 1920x1080 and 640x480 in turn as UINT8 [1, bytes] (~107 KB, ~230 KB,
~40 KB: the queue's key-of-its-own path and its inline path both carry traffic), each checked against the served
pipeline run eagerly on the device; ``raw`` (the ``--cpu`` default): letterboxed UINT8 [1, 640, 640, 3], 1.2 MB.

Paths compared:
  * direct:  the load process calls a Triton over gRPC (the request as the worker builds it: serving.triton_wire, one
    copy of the frame; tritonclient's channel and InferResult), the backend by smooth
    weighted round robin 3:2 over the job numbers (``direct_order``: consecutive arrivals alternate);
  * gateway: ``JobQueue.submit`` (the submit script's XADD with the depth check; a frame of 64 KiB or more SET
    beside it in the same round trip) and ``JobQueue.result`` (BLMOVE, the TTL script and a large result's GET in
    one round trip),
    what ``serving.front`` does per request after parsing its HTTP body; the workers XREADGROUP, pick a backend
    (``serving.scheduler``), call it over gRPC and store the result once.
The front's HTTP/JSON parsing is not in the path: KServe v2 JSON of a frame is several times its bytes in text,
which no Python front parses at 1,000 jobs/s; the queue is the gateway's part that is measured here.

Runs: open loop at each ``--rates`` with each ``--arrivals`` (``even``: evenly spaced; ``poisson``: exponential
gaps from ``--seed``, as many independent cameras sum to; issued on time whatever the server does; latency from the
scheduled arrival, so queueing shows), direct then gateway on the same arrival times: whether the gateway's cost at
Triton comes from it turning evenly spaced arrivals into jittered ones shows as a smaller gap under Poisson traffic,
which both paths get alike. Then closed loop at each ``--concurrency`` (jobs/s, latency and the served split per
concurrency; saturation is the best jobs/s each path reaches over them, where the throughput goal is read; the
default 24 slots a worker let the gateway hold as many calls at Triton as the largest closed loop's clients do).
Then the faults at the first rate and arrivals, each counted (sent, accepted, answered once and right, wrong, lost,
answered twice): a worker SIGKILLed (its pending entries reclaimed after ``claim_idle_ms``), Redis SIGKILLed and
restarted with AOF on (clients resubmit with the same job key until accepted), a backend SIGKILLed (its in-flight
calls fail and the worker sends the job to the other backend at once). Every answer is compared with its own
frame's reference (``bench.window_gpu.check``). Writes OUT/queue_gpu.json and OUT/queue_gpu.md. On the H200 with
the defaults, about 5.5-6 minutes: 10 runs of 15 s (2 arrivals x 2 paths, 3 concurrencies x 2 paths), 3 fault runs of
10 s, the warm-up, the Tritons' start and the references.

    python3 -m bench.queue_gpu --out OUT                         # on the GPU machine (bash bench/queue_gpu.sh OUT)
    bash bench/queue_gpu.sh OUT --arrivals poisson --concurrency 64 --faults none --skip front   # one question
    .venv/bin/python -m bench.queue_gpu --cpu --out /tmp/q       # the whole thing on CPU at a few jobs/s
    .venv/bin/python -m bench.queue_gpu --cpu --input jpeg --out /tmp/qj
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.queue import WeightedRoundRobin  # noqa: E402
from bench.report import latency, md_table  # noqa: E402
from bench.servers import stats_delta  # noqa: E402
from facts.cpulist import CpuListError, parse_cpulist  # noqa: E402
from serving.adaptive_window import percentile as pct  # noqa: E402

MODEL = "yolov8n"
WEIGHTS = {"triton-a": 3, "triton-b": 2}
GRPC_OPTS = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]


ARRIVALS = ("even", "poisson")


def arrivals(kind: str, rate: float, duration: float, seed: int) -> list[float]:
    """An open-loop run's arrival times (s from its start) at ``rate`` jobs/s over ``duration`` s: ``even`` (evenly
    spaced) or ``poisson`` (exponential gaps at that mean rate from ``seed``, as many independent cameras sum to).
    The parent draws the list once per run and both paths get the same one."""
    from bench.window_gpu import Phase, schedule

    return [t for t, _ in schedule([Phase("run", duration, rate)], poisson=kind == "poisson", seed=seed)]


def parse_list(flag: str, text: str, kind: Any, allowed: Optional[tuple] = None, multiple_of: int = 1) -> list:
    """A comma-separated flag (``--rates``, ``--concurrency``, ``--arrivals``), refused with the fix."""
    try:
        out = [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    bad = not out or any((allowed and x not in allowed) or (not allowed and x <= 0) for x in out)
    bad = bad or any(x % multiple_of for x in out if kind is int)
    if bad:
        what = f"one or more of {', '.join(allowed)}" if allowed else "positive numbers"
        what += f", each a multiple of --procs {multiple_of}" if multiple_of > 1 else ""
        raise SystemExit(f"{flag} {text!r}: comma-separated {what}")
    return out


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S ") + msg, flush=True)


# ---------------------------------------------------------------- servers


@dataclasses.dataclass
class Backend:
    name: str
    weight: int
    proc: subprocess.Popen
    http: str
    grpc: str
    workdir: Path


def model_spec(gpu: bool, gpu_name: str, input: str) -> Any:
    """The detector as a service deploys it, taking ``input`` (jpeg: encoded frames, conf ``CONF[input]``)."""
    from bench.window_gpu import WEIGHTS_FILE
    from bench.yolo_check import with_parameters
    from plans.presets import apply_preset
    from plans.triton_repo import yolov8n_torch

    if gpu:
        spec = apply_preset(yolov8n_torch(name=MODEL, gpu=True, weights=WEIGHTS_FILE, input=input), gpu_name)
    else:  # no GPU, no preset: the H200's window and batch on one CPU instance (the proof run only)
        spec = yolov8n_torch(
            name=MODEL, gpu=False, instances=1, window_us=200, max_batch_size=8, weights=WEIGHTS_FILE, input=input
        )
    # Square, set: the references (bench.gpu_frames.references) letterbox 640×640; a state_dict's default is rect.
    square = {"letterbox": "square"} if input == "jpeg" else {}
    return with_parameters(spec, conf=str(CONF[input]), **square)


# The detector's score threshold per input: the test detector, calibrated on 640x640 images, is less sure of
# letterboxed camera frames (bench/gpu_frames.py: at 0.25 a full-HD frame has no box, at 0.1 tens).
CONF = {"raw": 0.25, "jpeg": 0.1}


def make_payloads(
    input: str, n: int, gpu: bool, model: Any, weights: bytes
) -> tuple[list[np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    """``n`` distinct requests' ``images`` (with their batch dimension) and each one's reference answer.

    jpeg: structured camera frames (``gate.sample_frames``) of the gate's sizes in turn (1280x720 ~107 KB,
    1920x1080 ~230 KB, 640x480 ~40 KB: both of the queue's input paths, a key of its own and inline), as
    UINT8 [1, bytes]; the reference is the served pipeline run eagerly on the device (decode, letterbox, the model,
    NMS, boxes back to the frame: ``bench.gpu_frames.references``), frames with fewer than 3 boxes skipped.
    raw: synthetic images letterboxed by the client, UINT8 [1, 640, 640, 3] (1.2 MB; ``bench.window_gpu``)."""
    from bench.window_gpu import pick_images

    if input == "raw":
        images, picked = pick_images(model, n, gpu)
        return [np.ascontiguousarray(x[None]) for x in images], picked
    from bench.gpu_frames import CONF as FRAMES_CONF
    from bench.gpu_frames import references
    from gate.sample_frames import GATE_SIZES, jpeg

    arrays: list[np.ndarray] = []
    refs: list[tuple[np.ndarray, np.ndarray]] = []
    seed = 100
    while len(arrays) < n:
        if seed > 100 + 20 * n:
            raise RuntimeError(f"fewer than {n} of {20 * n} frames give 3 detections")
        batch: list[dict[str, Any]] = []
        for k in range(n - len(arrays)):
            w, h = GATE_SIZES[(len(arrays) + k) % len(GATE_SIZES)]
            batch.append({"w": w, "h": h, "jpeg": jpeg(w, h, seed=seed + k)})
        seed += len(batch)
        references(batch, gpu, weights)  # at bench.gpu_frames' CONF, the served model's conf here
        assert FRAMES_CONF == CONF["jpeg"], (FRAMES_CONF, CONF)
        for f in batch:
            if f["count"] >= 3:
                arrays.append(np.frombuffer(f["jpeg"], dtype=np.uint8)[None])
                refs.append((np.asarray(f["det"], dtype=np.float32), np.asarray([f["count"]], dtype=np.int32)))
    return arrays[:n], refs[:n]


def save_frames(path: Path, arrays: list[np.ndarray], refs: list) -> None:
    parts = {f"img{i}": x for i, x in enumerate(arrays)}
    parts.update({f"det{i}": r[0] for i, r in enumerate(refs)})
    parts.update({f"num{i}": r[1] for i, r in enumerate(refs)})
    np.savez(path, **parts)


def load_frames(path: str) -> tuple[list[np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    with np.load(path) as z:
        n = sum(1 for k in z.files if k.startswith("img"))
        return [np.ascontiguousarray(z[f"img{i}"]) for i in range(n)], [(z[f"det{i}"], z[f"num{i}"]) for i in range(n)]


def backend_specs(spec: Any, by_weight: bool) -> dict[str, Any]:
    """Each backend's model: the same ``spec`` for both (equal capacity), or, ``by_weight``, instances in proportion
    to the backend's weight (the largest weight keeps the spec's count; at least 1), so that capacity follows weight
    as it does where weights stand for GPU slices of different sizes."""
    top, count = max(WEIGHTS.values()), spec.instance_group[0].count
    out = {}
    for name, w in WEIGHTS.items():
        n = max(1, round(count * w / top)) if by_weight else count
        group = spec.instance_group[0].model_copy(update={"count": n})
        out[name] = spec.model_copy(update={"instance_group": [group, *spec.instance_group[1:]]})
    return out


def start_backends(
    base: Path, specs: dict[str, Any], weights: bytes, gpu: bool, files: Optional[Any] = None
) -> dict[str, Backend]:
    """Both Tritons, started side by side (each captures its CUDA graphs on load). ``files(spec)``: the repository's
    files of another model (default: the detector's, with ``weights``)."""
    from bench import servers
    from bench.window_gpu import start_triton

    out: dict[str, Backend] = {}
    errors: list[BaseException] = []

    def one(name: str) -> None:
        try:
            wd = base / name
            wd.mkdir(parents=True, exist_ok=True)
            if files is None:
                proc, http, grpc = start_triton(wd, [specs[name]], weights, gpu)
            else:
                t = servers.start_triton(wd, [specs[name]], files(specs[name]), ready_timeout=600)
                proc, http, grpc = t.process, t.http, t.grpc
            out[name] = Backend(name, WEIGHTS[name], proc, http, grpc, wd)
        except BaseException as e:  # noqa: BLE001 - raised below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(n,)) for n in WEIGHTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for b in out.values():
            kill_group(b.proc)
        raise errors[0]
    return out


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """The process and what it started (Triton's python backend stubs), by its session's process group."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


PIN_ROLES = ("load", "gateway", "triton", "redis")


def parse_pin(text: str, cpu_count: int) -> dict[str, set[int]]:
    """``--pin-cpus`` ("load:0-5,gateway:6-9,triton:10-15"; "" none) → {role: CPUs}. The roles: the load processes
    (the clients: on their own machines in a deployment), the gateway (Redis and the workers) and the Tritons (with
    their python-backend stubs); ``redis``, optional, gives Redis CPUs of its own, apart from the workers' (every job
    crosses Redis's one thread three times, and the scheduler may run a worker thread Redis woke on Redis's CPU). Refused
    with the fix: an unknown role, a CPU this machine lacks, a role twice."""
    out: dict[str, set[int]] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        role, sep, span = item.partition(":")
        try:  # the kernel's CPU-list syntax, '+' for its ',' (the roles are comma-separated)
            cpus = set(parse_cpulist(span.replace("+", ","), limit=cpu_count))
        except CpuListError:
            cpus = set()
        if not sep or role not in PIN_ROLES or role in out or not cpus:
            raise SystemExit(
                f"--pin-cpus: {item!r} is not ROLE:FIRST-LAST (roles {', '.join(PIN_ROLES)}, each once; CPUs "
                f"0-{cpu_count - 1}; several ranges joined by '+'), e.g. load:0-5,gateway:6-9,triton:10-15"
            )
        out[role] = cpus
    return out


def process_tree(pids: list[int]) -> list[int]:
    """``pids`` and every living descendant of theirs."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], list(pids)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds so far of ``pids`` and their living descendants (all their threads)."""
    total = 0
    for p in process_tree(pids):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
    return total / os.sysconf("SC_CLK_TCK")


def pin_tree(pid: int, cpus: Optional[set[int]]) -> int:
    """Every thread of ``pid`` and of its descendants onto ``cpus`` (threads and children made later inherit it);
    the number of threads moved. Nothing for ``None``."""
    if not cpus:
        return 0
    moved = 0
    for p in process_tree([pid]):
        for task in Path(f"/proc/{p}/task").glob("[0-9]*"):
            try:
                os.sched_setaffinity(int(task.name), cpus)
                moved += 1
            except OSError:  # gone meanwhile, or not ours
                pass
    return moved


class Redis:
    """redis-server on a loopback port with its data in ``workdir``; AOF on (appendfsync everysec) when asked."""

    def __init__(self, binary: str, workdir: Path, io_threads: int, cpus: Optional[set[int]] = None):
        from testbed.servers import free_port

        self.binary, self.workdir, self.io_threads, self.cpus = binary, workdir, io_threads, cpus
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        workdir.mkdir(parents=True, exist_ok=True)

    def start(self, aof: bool) -> float:
        from testbed.servers.redis import wait_ping

        t0 = time.monotonic()
        cmd = [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--dir", str(self.workdir)]
        cmd += ["--appendonly", "yes" if aof else "no", "--appendfsync", "everysec", "--daemonize", "no"]
        cmd += ["--logfile", str(self.workdir / "redis.log"), "--maxmemory", "0"]
        # At 1.2 MB a job the AOF grows ~1.2 GB/s: rewritten every GB, so a restart replays at most a few GB.
        cmd += ["--auto-aof-rewrite-min-size", "1gb"]
        if self.io_threads > 1:
            cmd += ["--io-threads", str(self.io_threads), "--io-threads-do-reads", "yes"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        wait_ping(self.port, self.proc, 120)
        pin_tree(self.proc.pid, self.cpus)  # its I/O threads exist once it answers
        return time.monotonic() - t0

    def kill(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc, signal.SIGTERM)


def gateway_config(redis_port: int, backends: dict[str, Backend], a: argparse.Namespace) -> dict:
    return {
        "redis": {"host": "127.0.0.1", "port": redis_port},
        "queue": {"max_depth": a.max_depth},
        "backends": [{"name": b.name, "weight": b.weight, "grpc": b.grpc, "http": b.http} for b in backends.values()],
        "slots": a.slots,
        **({"block_ms": a.block_ms} if a.block_ms is not None else {}),
        "claim_idle_ms": a.claim_idle_ms,
        "models": [MODEL],
        "call_timeout_s": 30.0,
        "job_timeout_s": 60.0,
    }


# ---------------------------------------------------------------- the load processes


class Detector:
    """The detector's workload in a load process: job ``j``'s inputs (frame ``j mod n``) and the check of its answer
    against that frame's reference. A load process takes another workload from ``setup["workload"]``: a module
    whose ``Workload(setup)`` has the same two methods (``bench.gen_gpu``: prompts in, PNGs out)."""

    def __init__(self, setup: dict):
        self.arrays, self.refs = load_frames(setup["frames"])
        self.conf = setup["conf"]

    def inputs(self, j: int) -> dict[str, np.ndarray]:
        return {"images": self.arrays[j % len(self.arrays)]}

    def check(self, j: int, out: dict[str, np.ndarray]) -> Optional[str]:
        from bench.window_gpu import check

        det, num = out["detections"].reshape(-1, 6), out["num_detections"].reshape(-1)
        return check(det, num, self.refs[j % len(self.refs)], conf=self.conf)


def workload(setup: dict) -> Any:
    if setup.get("workload"):
        import importlib

        return importlib.import_module(setup["workload"]).Workload(setup)
    return Detector(setup)


def load_main(conn: Any, setup: dict, k: int) -> None:
    """One load process: waits for a run's spec, runs it with its threads, sends back its rows."""
    if setup.get("cpus"):
        os.sched_setaffinity(0, setup["cpus"])  # before any thread: they inherit it
    wl = workload(setup)
    import redis  # noqa: F401 - imported before the first run, not inside its clock
    import tritonclient.grpc  # noqa: F401

    from bench.window_gpu import check  # noqa: F401

    conn.send("ready")
    while True:
        spec = conn.recv()
        if spec is None:
            return
        try:
            conn.send(run_spec(spec, setup, k, wl))
        except Exception as e:  # noqa: BLE001 - the parent reports it
            conn.send({"crash": f"{type(e).__name__}: {e}"})


def direct_order(weights: dict[str, int]) -> list[str]:
    """Direct call ``j`` goes to ``order[j % len(order)]``: smooth weighted round robin over the job numbers (3:2
    gives a, b, a, b, a), so consecutive arrivals alternate between the Tritons whichever load process sends them, as
    the gateway's picks do. A round robin of each process's own (before 2026-12-04) advanced once per call in every
    process alike: the n-th jobs of all ``--procs`` processes, ``procs`` consecutive arrivals, went to one Triton,
    and the Tritons took turns in runs of 8 ms at 1,000 jobs/s, which a time-shared GPU serves faster than
    interleaved arrivals (bench/results/queue_gpu_direct_order_*.md)."""
    rr = WeightedRoundRobin(dict(weights))
    return [rr.next() for _ in range(sum(weights.values()))]


class SpecLoad:
    """One load process's share of one run: its threads take job numbers ``k``, ``k + procs``, ... and send each
    straight to a Triton (``direct``) or through the queue (``queued``), open loop at the scheduled times or closed
    loop until the duration ends; every answer is checked after the timed part."""

    def __init__(self, spec: dict, setup: dict, k: int, wl: Any):
        import redis
        import tritonclient.grpc as grpcclient

        from serving import triton_wire
        from serving.queue import JobQueue, QueueConfig

        self.spec, self.setup, self.wl = spec, setup, wl
        self.procs, self.duration = spec["procs"], spec["duration"]
        self.start, self.open_loop = spec["start"], spec["mode"] == "open"
        self.give_up = self.start + self.duration + spec["drain_s"]
        self.r = redis.Redis(port=setup["redis_port"], socket_timeout=10, socket_connect_timeout=2)
        self.q = JobQueue(self.r, QueueConfig(max_depth=setup["max_depth"], shed_wait_ms=spec.get("shed_wait_ms", 0.0)))
        self.clients = {
            n: grpcclient.InferenceServerClient(u, channel_args=GRPC_OPTS) for n, u in setup["grpc"].items()
        }
        self.calls = {n: triton_wire.model_infer(c._channel) for n, c in self.clients.items()}
        self.order = direct_order(WEIGHTS)
        self.lock = threading.Lock()
        self.nxt = k  # the next job number any of this process's threads takes (under ``lock``)
        self.rows: list[list] = []
        self.answers: list[tuple[int, dict[str, np.ndarray]]] = []
        self.counters = {"submit_retries": 0, "refused": 0, "result_retries": 0}
        # The gateway's parts of the current job, ms: submit, to dispatch, service, stored.
        self.parts = threading.local()
        self.call = self.direct if spec["path"] == "direct" else self.queued
        self.times = spec.get("arrivals_s") or []

    def direct(self, j: int, inputs: dict[str, np.ndarray]) -> tuple[str, Any, str, int, bool]:
        from serving import triton_wire
        from serving.bytes_rows import wire_inputs

        name = self.order[j % len(self.order)]
        t0 = time.time()
        # The request as the worker builds it (serving.triton_wire: one copy of the frame), over the same gRPC.
        request = triton_wire.tensors_request(self.spec["model"], wire_inputs(inputs))
        out = triton_wire.outputs(self.calls[name](request, timeout=self.setup.get("call_timeout_s", 30)))
        self.parts.times = (0.0, 0.0, (time.time() - t0) * 1000, 0.0)
        return "ok", out, name, 1, False

    def _count(self, counter: str) -> None:
        with self.lock:
            self.counters[counter] += 1

    def queued(self, j: int, inputs: dict[str, np.ndarray]) -> tuple[str, Any, str, int, bool]:
        import redis

        from serving.queue import QueueFull, QueueShed, ResultTimeout

        key = f"{self.spec['key_prefix']}-{j}"
        t0 = time.time()
        while True:  # accepted once submit returns; a retry with the same key is never queued twice
            if time.time() > self.give_up:
                return "unaccepted", None, "", 0, False
            try:
                self.q.submit(self.spec["model"], inputs, key=key)
                submitted = time.time()
                break
            except QueueShed:  # answered at once (the front's 503): not retried, counted apart
                self.parts.times = ((time.time() - t0) * 1000, 0.0, 0.0, 0.0)
                return "shed", None, "", 0, False
            except QueueFull:
                self._count("refused")
                time.sleep(0.01)
            except redis.RedisError:
                self._count("submit_retries")
                time.sleep(0.05)
        while True:
            left = self.give_up - time.time()
            if left <= 0:
                return "lost", None, "", 0, False
            try:
                res = self.q.result(key, timeout_s=min(5.0, max(1.0, left)))
                break
            except ResultTimeout:
                continue
            except redis.RedisError:
                self._count("result_retries")
                time.sleep(0.05)
        self.parts.times = ((submitted - t0) * 1000, res.queue_ms, res.service_ms, res.latency_ms)
        if res.status != "ok":
            return "error:" + res.error[:200], None, res.backend, res.attempts, res.reclaimed
        return "ok", res.outputs, res.backend, res.attempts, res.reclaimed

    def _next_job(self) -> Optional[tuple[int, float]]:
        """The next job number and its scheduled time (open loop: waited for), or None when this thread is done."""
        with self.lock:
            j = self.nxt
            self.nxt += self.procs
        if self.open_loop:
            if j >= len(self.times):
                return None
            t_sched = self.start + self.times[j]
            wait = t_sched - time.time()
            if wait > 0:
                time.sleep(wait)
        else:
            t_sched = time.time()
            if t_sched >= self.start + self.duration:
                return None
        return j, t_sched

    def thread_main(self) -> None:
        while (job := self._next_job()) is not None:
            j, t_sched = job
            t_issue = time.time()
            self.parts.times = (0.0, 0.0, 0.0, 0.0)
            try:
                status, out, backend, attempts, reclaimed = self.call(j, self.wl.inputs(j))
            except Exception as e:  # noqa: BLE001 - a failed call is counted, the loop goes on
                status, out, backend, attempts, reclaimed = f"error:{type(e).__name__}: {e}"[:200], None, "", 0, False
            t_end = time.time()
            with self.lock:
                self.rows.append(
                    [
                        j,
                        t_sched - self.start,
                        (t_end - t_sched) * 1000,
                        (t_issue - t_sched) * 1000,
                        status,
                        backend,
                        attempts,
                        reclaimed,
                        t_end - self.start,
                        (t_end - t_issue) * 1000,
                        *self.parts.times,
                    ]
                )
                if out is not None:
                    self.answers.append((len(self.rows) - 1, out))

    def run(self) -> dict:
        pool = [threading.Thread(target=self.thread_main, daemon=True) for _ in range(self.spec["threads"])]
        time.sleep(max(0.0, self.start - time.time()))
        for t in pool:
            t.start()
        for t in pool:
            t.join(self.duration + self.spec["drain_s"] + 60)
        rows, first_wrong = self.rows, ""
        for idx, out in self.answers:  # after the timed part: checking costs no load time
            problem = self.wl.check(rows[idx][0], out)
            if problem:
                rows[idx][4] = "wrong"
                first_wrong = first_wrong or f"job {rows[idx][0]}: {problem}"
        for c in self.clients.values():
            c.close()
        self.r.close()
        return {"rows": rows, "first_wrong": first_wrong, **self.counters}


def run_spec(spec: dict, setup: dict, k: int, wl: Any) -> dict:
    return SpecLoad(spec, setup, k, wl).run()


class LoadPool:
    """``procs`` spawned load processes (no CUDA, no gRPC channel across a fork), reused for every run."""

    def __init__(self, procs: int, setup: dict):
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        for k in range(procs):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=load_main, args=(child, setup, k), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)
        for c in self.conns:
            if not c.poll(300) or c.recv() != "ready":
                raise RuntimeError("a load process did not start")

    def run(self, spec: dict) -> list[dict]:
        for c in self.conns:
            c.send({**spec, "procs": len(self.conns)})
        wait = spec["duration"] + spec["drain_s"] + 180
        out = [c.recv() if c.poll(wait) else {"crash": f"no answer within {wait:g} s"} for c in self.conns]
        crashed = [o["crash"] for o in out if "crash" in o]
        if crashed:
            raise RuntimeError(f"load process failed: {crashed[0]}")
        return out

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


class WorkerSampler:
    """Every worker's /metrics every ``period_s`` during a run: how often each backend was unhealthy (a failed call
    or probe drains it, and it ramps back over ``ramp_s``), its effective weight, and the calls by outcome."""

    def __init__(self, ports: dict[str, int], period_s: float = 0.5):
        self.ports, self.period_s = ports, period_s
        self.stop = threading.Event()
        self.samples: list[dict[tuple[str, str], float]] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def scrape(self) -> dict[tuple[str, str], float]:
        import urllib.request

        from serving.metrics import parse_samples

        got: dict[tuple[str, str], float] = {}
        for port in self.ports.values():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1.0) as resp:
                    text = resp.read().decode()
            except OSError:
                continue
            for name, labels, value in parse_samples(text):
                b = labels.get("backend", "")
                if name in ("gpuhost_gateway_backend_healthy", "gpuhost_gateway_backend_effective_weight"):
                    got[(name, b)] = min(got.get((name, b), value), value)  # the least healthy worker's view
                elif name == "gpuhost_gateway_backend_in_flight":
                    got[("in_flight", b)] = got.get(("in_flight", b), 0.0) + value
                elif name == "gpuhost_gateway_backend_calls_total":
                    k = (f"calls:{labels.get('outcome', '')}", b)
                    got[k] = got.get(k, 0.0) + value
        return got

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.samples.append(self.scrape())
            self.stop.wait(self.period_s)

    def __enter__(self) -> "WorkerSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(10)
        self.samples.append(self.scrape())

    def summary(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        first, last = (self.samples[0], self.samples[-1]) if self.samples else ({}, {})
        for b in WEIGHTS:
            health = [
                x[("gpuhost_gateway_backend_healthy", b)]
                for x in self.samples
                if ("gpuhost_gateway_backend_healthy", b) in x
            ]
            weight = [
                x[("gpuhost_gateway_backend_effective_weight", b)]
                for x in self.samples
                if ("gpuhost_gateway_backend_effective_weight", b) in x
            ]
            calls = {
                k[0].split(":", 1)[1]: round(v - first.get(k, 0.0))
                for k, v in last.items()
                if k[0].startswith("calls:") and k[1] == b
            }
            out[b] = {
                "samples": len(health),
                "unhealthy_samples": sum(1 for h in health if h < 1),
                "min_effective_weight": round(min(weight), 3) if weight else None,
                "mean_effective_weight": round(sum(weight) / len(weight), 3) if weight else None,
                "calls": {k: v for k, v in calls.items() if v},
            }
        return out


# ---------------------------------------------------------------- one run and its numbers


def summarise(path: str, mode: str, spec: dict, parts: list[dict]) -> dict:
    rows = [r for p in parts for r in p["rows"]]
    ok = [r for r in rows if r[4] == "ok"]
    lat = sorted(r[2] for r in ok)
    end = max((r[8] for r in rows), default=spec["duration"])
    seconds = end if mode == "closed" else max(spec["duration"], end)
    by_status: dict[str, int] = {}
    for r in rows:
        s = r[4] if not r[4].startswith("error") else "error"
        by_status[s] = by_status.get(s, 0) + 1
    split: dict[str, int] = {}
    for r in ok:
        split[r[5]] = split.get(r[5], 0) + 1
    out = {
        "path": path,
        "mode": mode,
        "rate": spec.get("rate"),
        "arrivals": spec.get("arrivals"),
        # Poisson arrivals are as many as the seed draws: the rate a path must keep up with is this one.
        "offered_per_s": round(len(spec["arrivals_s"]) / spec["duration"], 1) if mode == "open" else None,
        "concurrency": spec.get("concurrency"),
        "duration_s": spec["duration"],
        "sent": len(rows),
        "answered_right": len(ok),
        "wrong": by_status.get("wrong", 0),
        "errors": by_status.get("error", 0),
        "lost": by_status.get("lost", 0),
        "unaccepted": by_status.get("unaccepted", 0),
        "shed": by_status.get("shed", 0),
        "jobs_per_s": round(len(ok) / seconds, 1) if seconds > 0 else 0.0,
        **latency(lat),
        "max_ms": round(lat[-1], 2) if lat else None,
        "max_issue_lag_ms": round(max((r[3] for r in rows), default=0.0), 2),
        "split": split,
        "retried_elsewhere": sum(1 for r in ok if r[6] > 1),
        "reclaimed": sum(1 for r in ok if r[7]),
        "submit_retries": sum(p["submit_retries"] for p in parts),
        "refused_full": sum(p["refused"] for p in parts),
        "result_retries": sum(p["result_retries"] for p in parts),
        "first_wrong": next((p["first_wrong"] for p in parts if p["first_wrong"]), ""),
        "first_error": next((r[4] for r in rows if r[4].startswith("error")), ""),
    }

    def med(values: list[float]) -> float:
        return round(pct(sorted(values), 50), 3)

    if path == "gateway":
        out["parts_ms_p50"] = {
            "client_total": med([x[9] for x in ok]),
            "client's submit call (EVALSHA, a large input's SET in the same round trip)": med([x[10] for x in ok]),
            "submit to dispatch (XREADGROUP, a large input's MGET, decode, pick)": med([x[11] for x in ok]),
            "Triton call from the worker (gRPC)": med([x[12] for x in ok]),
            "stored to caller (encode, complete script, the result wait's round trip, decode)": med(
                [x[9] - x[13] for x in ok]
            ),
        }
    else:
        out["parts_ms_p50"] = {"client_total": med([x[9] for x in ok]), "Triton call (gRPC)": med([x[12] for x in ok])}
    out["_rows"] = rows
    return out


def queue_accounting(r: Any, q: Any, prefix: str, res: dict) -> dict:
    """What Redis says after a gateway run: results stored (served + failed), completions dropped as duplicates,
    results left unread, entries still in the stream or pending. A result stays after it is read (its TTL drops to
    the queue's ``read_ttl_s``: that is how a result is known read); a second result under one key is a second
    answer, and an unread one of a job the client gave up on (its deadline passed) is a late answer."""
    st = q.stats()
    stored = sum(v for k, v in st.items() if k.startswith("served:")) + st.get("failed", 0)
    status = {f"{prefix}-{row[0]}": row[4] for row in res["_rows"]}
    left = late = twice = 0
    for key in r.scan_iter(match=f"{q.cfg.prefix}:result:{prefix}-*", count=1000):
        n = int(r.llen(key))
        unread = int(r.ttl(key)) > q.cfg.read_ttl_s
        left += unread
        twice += max(0, n - 1)
        if unread and status.get((key.decode() if isinstance(key, bytes) else key).rsplit(":", 1)[1]) == "lost":
            late += 1
    answered = res["answered_right"] + res["wrong"] + res["errors"]
    return {
        "results_stored": stored,
        "served": {k.split(":", 1)[1]: v for k, v in st.items() if k.startswith("served:")},
        "duplicate_completions_dropped": st.get("duplicates", 0),
        "results_unread": left,
        "answered_after_client_gave_up": late,
        "answered_twice": max(0, stored - answered - late) if left == 0 else twice,
        "stream_depth_after": q.depth(),
        "pending_after": q.group_info()["pending"],
    }


def front_run(cfg: dict, base: Path, arrays: list[np.ndarray], refs: list, conf: float, n: int) -> dict:
    """``n`` requests, one at a time, through the whole gateway: ``serving.front`` (KServe v2 JSON over HTTP), Redis,
    the workers, a Triton; each answer against its own frame's reference. JSON of one raw image is ~4 MB of text (a
    JPEG frame's ~0.4 MB): this shows the chain works with the real detector and what the JSON costs, not the rate
    (the queue runs do)."""
    import http.client
    import urllib.request

    from bench.window_gpu import check
    from testbed.servers import free_port

    path = base / "front.json"
    path.write_text(json.dumps(cfg))
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), env.get("PYTHONPATH", "")) if x)
    cmd = [sys.executable, "-m", "serving.front", "--config", str(path), "--port", str(port), "--timeout", "60"]
    with open(base / "front.log", "ab") as flog:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=flog, stderr=subprocess.STDOUT, start_new_session=True)
    out: dict[str, Any] = {"requests": n, "right": 0, "wrong": 0, "failed": 0, "first_problem": ""}
    lat: list[float] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status == 200:
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("serving.front did not become ready") from None
                time.sleep(0.2)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for i in range(n):
            img = arrays[i % len(arrays)]
            data = {"name": "images", "datatype": "UINT8", "shape": list(img.shape), "data": img.ravel().tolist()}
            body = json.dumps({"id": f"front-{i}", "inputs": [data]}).encode()
            t0 = time.perf_counter()
            conn.request("POST", f"/v2/models/{MODEL}/infer", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            doc = json.loads(resp.read())
            lat.append((time.perf_counter() - t0) * 1000)
            if resp.status != 200:
                out["failed"] += 1
                out["first_problem"] = out["first_problem"] or f"HTTP {resp.status}: {str(doc)[:300]}"
                continue
            got = {o["name"]: np.asarray(o["data"], dtype=np.float32) for o in doc["outputs"]}
            det, num = got["detections"].reshape(-1, 6), got["num_detections"].reshape(-1)
            problem = check(det, num, refs[i % len(refs)], conf=conf)
            out["right" if problem is None else "wrong"] += 1
            if problem:
                out["first_problem"] = out["first_problem"] or f"request {i}: {problem}"
        conn.close()
    finally:
        kill_group(proc, signal.SIGTERM)
    lat.sort()
    out["body_bytes"] = len(body) if n else 0
    out["p50_ms"], out["max_ms"] = round(pct(lat, 50), 1), round(lat[-1], 1) if lat else None
    return out


# ---------------------------------------------------------------- main


def arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--cpu", action="store_true", help="no GPU: KIND_CPU, FP32, a few jobs/s (the proof run)")
    p.add_argument("--rates", default=None, help="open-loop rates, jobs/s (default 1000; --cpu 3)")
    p.add_argument(
        "--arrivals",
        default="even,poisson",
        help="open-loop arrival processes, each run at every rate on both paths: even (evenly spaced) and/or poisson "
        "(exponential gaps from --seed, the same times on both paths); the fault runs take the first",
    )
    p.add_argument("--seed", type=int, default=27, help="the Poisson arrivals' seed")
    p.add_argument(
        "--concurrency",
        default=None,
        help="closed-loop clients, each a multiple of --procs (default 32,64,128; --cpu 2,4): saturation is the best "
        "jobs/s each path reaches over them",
    )
    p.add_argument("--duration", type=float, default=None, help="seconds per run (default 15; --cpu 8)")
    p.add_argument("--images", type=int, default=None, help="distinct frames (default 64; --cpu 4)")
    p.add_argument(
        "--input",
        choices=("jpeg", "raw"),
        default=None,
        help="what a request carries: jpeg (an encoded camera frame of the gate's sizes, as users send; default on "
        "a GPU) or raw (a letterboxed 640x640x3 uint8 image, 1.2 MB; default with --cpu)",
    )
    p.add_argument("--procs", type=int, default=None, help="load processes (default 8; --cpu 2)")
    p.add_argument("--threads", type=int, default=None, help="threads per load process (default 24; --cpu 4)")
    p.add_argument("--workers", type=int, default=None, help="gateway worker processes (default 6; --cpu 2)")
    p.add_argument(
        "--slots",
        type=int,
        default=None,
        help="jobs in flight per worker (default 24, so 6 workers' 144 cover the largest closed loop's 128 clients "
        "as direct calls do; --cpu 4)",
    )
    by_weight = "each backend's instances in proportion to its weight (triton-b 2 of the preset's 3; default: equal)"
    p.add_argument("--instances-by-weight", action="store_true", help=by_weight)
    p.add_argument(
        "--block-ms",
        type=int,
        default=None,
        help="how long a worker's idle slot waits in XREADGROUP before it asks again (default: the worker's)",
    )
    p.add_argument("--claim-idle-ms", type=int, default=2000, help="a pending entry idle this long is reclaimed")
    p.add_argument("--max-depth", type=int, default=4000, help="queue depth at which submits are refused")
    p.add_argument("--fault-rate", type=float, default=None, help="jobs/s of the fault runs (default: the first rate)")
    p.add_argument("--fault-duration", type=float, default=None, help="seconds per fault run (default 10; --cpu 8)")
    p.add_argument("--faults", default="worker,redis,backend", help="fault runs, in order (or 'none')")
    p.add_argument("--skip", default="", help="runs to leave out: rate, saturation, front")
    p.add_argument("--front-requests", type=int, default=8, help="requests through serving.front (KServe JSON)")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    p.add_argument("--redis-io-threads", type=int, default=None, help="Redis I/O threads (default 4; --cpu 1)")
    p.add_argument("--gpu-model", default="", help="preset key (default: from nvidia-smi)")
    p.add_argument(
        "--pin-cpus",
        default="",
        help="CPUs per role, e.g. load:0-5,gateway:6-9,triton:10-15 (default: none; the same for both paths); "
        "redis:N gives Redis CPUs apart from the workers' (default: the gateway's)",
    )
    return p


CPU_DEFAULTS = {
    "rates": "3",
    "concurrency": "2,4",
    "duration": 8.0,
    "images": 4,
    "procs": 2,
    "threads": 4,
    "workers": 2,
    "slots": 4,
    "redis_io_threads": 1,
    "fault_duration": 8.0,
    "input": "raw",
}
GPU_DEFAULTS = {
    "rates": "1000",
    "concurrency": "32,64,128",
    "duration": 15.0,
    "images": 64,
    "procs": 8,
    "threads": 24,
    "workers": 6,
    "slots": 24,
    "redis_io_threads": 4,
    "fault_duration": 10.0,
    "input": "jpeg",
}


def settle(a: argparse.Namespace) -> tuple[list[float], list[str], list[int], list[str]]:
    """The defaults of ``--cpu`` or the GPU filled in, the lists parsed and checked: (rates, arrival kinds,
    concurrencies, faults)."""
    for k, v in (CPU_DEFAULTS if a.cpu else GPU_DEFAULTS).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    rates = parse_list("--rates", a.rates, float)
    kinds = parse_list("--arrivals", a.arrivals, str, ARRIVALS)
    concurrency = parse_list("--concurrency", a.concurrency, int, multiple_of=a.procs)
    faults = [] if a.faults == "none" else a.faults.split(",")
    if any(f not in ("worker", "redis", "backend") for f in faults):
        raise SystemExit("--faults: worker, redis, backend (comma-separated) or none")
    return rates, kinds, concurrency, faults


def prepare_frames(a: argparse.Namespace, gpu: bool, base: Path) -> tuple[bytes, list, list, list[int]]:
    """The test weights, ``--images`` frames and their references (saved for the load processes): (weights, the
    frames, their references, their sizes in bytes)."""
    from bench.window_gpu import detector_weights

    log(f"test weights, {a.images} {a.input} frames and their references")
    t_refs = time.monotonic()
    model, weights = detector_weights()
    arrays, refs = make_payloads(a.input, a.images, gpu, model, weights)
    del model
    save_frames(base / "frames.npz", arrays, refs)
    frame_bytes = [x.nbytes for x in arrays]
    log(f"{len(arrays)} frames, {min(frame_bytes)}-{max(frame_bytes)} bytes, in {time.monotonic() - t_refs:.1f} s")
    return weights, arrays, refs, frame_bytes


def start_workers(
    a: argparse.Namespace, cfg: dict, rs: Redis, base: Path, workers: dict, pin: dict
) -> tuple[Any, Any, dict[str, int], Callable[[str], dict]]:
    """The gateway's workers (into ``workers`` as each starts), each with a metrics port, waited for until each
    is a consumer: (the Redis client, the JobQueue, the metrics ports, a consumer's config)."""
    import redis as redispy

    from serving.queue import JobQueue, QueueConfig
    from testbed.servers import free_port
    from testbed.servers.gateway import spawn_worker

    metrics_ports = {f"w{i}": free_port() for i in range(a.workers)}

    def worker_cfg(consumer: str) -> dict:
        return {**cfg, "metrics_port": metrics_ports[consumer]}

    r = redispy.Redis(port=rs.port, socket_timeout=10)
    q = JobQueue(r, QueueConfig(max_depth=a.max_depth))
    q.ensure_group()
    for i in range(a.workers):
        workers[f"w{i}"] = spawn_worker(worker_cfg(f"w{i}"), f"w{i}", base)
    wait_consumers(r, q, a.workers)
    for w in workers.values():
        pin_tree(w.pid, pin.get("gateway"))
    return r, q, metrics_ports, worker_cfg


def run_all(
    bench: Bench,
    a: argparse.Namespace,
    rates: list[float],
    kinds: list[str],
    concurrency: list[int],
    faults: list[str],
    front: Callable[[], dict],
    rs: Redis,
    result: dict,
) -> None:
    """Warm-up, then the open-loop rates, the closed-loop saturation, the front and the faults, into ``result``
    as each ends (what was measured stays when a later run fails)."""
    go = bench.run
    log("warm-up")
    for path in ("direct", "gateway"):
        go(path, "open", rate=rates[0] / 4, duration=3.0)
    if "rate" not in a.skip:
        for rate in rates:
            for kind in kinds:  # the same arrival times on both paths, one right after the other
                for path in ("direct", "gateway"):
                    result["runs"].append(strip(go(path, "open", rate=rate, kind=kind)))
    if "saturation" not in a.skip:
        for conc in concurrency:
            for path in ("direct", "gateway"):
                result["runs"].append(strip(go(path, "closed", conc=conc)))
        result["saturation"] = saturation(result["runs"])
    if "front" not in a.skip:
        result["front"] = front()
        log(f"front: {json.dumps(result['front'])}")
    for f in faults:
        result["faults"].append(bench.fault_run(f, rs, rate=a.fault_rate or rates[0], kind=kinds[0]))


def stop_and_collect(pool: Optional[LoadPool], workers: dict, backends: dict, rs: Redis, base: Path, out: Path) -> None:
    """Everything started stopped; the workers', Tritons' and Redis's logs copied to ``out``."""
    if pool is not None:
        pool.close()
    for w in workers.values():
        kill_group(w, signal.SIGTERM)
    for b in backends.values():
        kill_group(b.proc, signal.SIGTERM)
    rs.stop()
    for f in base.glob("w*.log"):
        shutil.copy2(f, out / f.name)
    for b in backends.values():
        (out / f"triton-{b.name}.log").write_bytes((b.workdir / "triton.log").read_bytes()[-1_000_000:])
    if (base / "redis" / "redis.log").exists():
        shutil.copy2(base / "redis" / "redis.log", out / "redis.log")


def run_meta(
    a: argparse.Namespace,
    argv: Optional[list[str]],
    machine: str,
    spec: Any,
    specs: dict,
    pin: dict,
    frame_bytes: list[int],
    t_main: float,
) -> dict:
    """What ran, where and how (the JSON's ``meta``; the markdown's header)."""
    import redis as redispy

    from serving.queue import QueueConfig

    return {
        "machine": machine,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "command": "python3 -m bench.queue_gpu " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": {
            "instances": spec.instance_group[0].count,
            "instances_by_backend": {n: sp.instance_group[0].count for n, sp in specs.items()},
            "max_batch": spec.max_batch_size,
            "triton_window_us": spec.dynamic_batching.max_queue_delay_microseconds if spec.dynamic_batching else None,
        },
        "weights": WEIGHTS,
        "redis_parser": "hiredis" if redispy.utils.HIREDIS_AVAILABLE else "redis-py's Python parser",
        "pinned": {k: f"{min(v)}-{max(v)}" if len(v) == max(v) - min(v) + 1 else sorted(v) for k, v in pin.items()},
        "setup": {
            k: getattr(a, k)
            for k in (
                "procs",
                "threads",
                "workers",
                "slots",
                "arrivals",
                "seed",
                "concurrency",
                "claim_idle_ms",
                "block_ms",
                "max_depth",
                "images",
                "input",
                "duration",
                "redis_io_threads",
            )
        },
        "frame_bytes": {
            "min": min(frame_bytes),
            "median": int(np.median(frame_bytes)),
            "max": max(frame_bytes),
            "inline": sum(1 for b in frame_bytes if b < QueueConfig().inline_max_bytes),
        },
        "wall_s": round(time.monotonic() - t_main, 1),
    }


def exit_code(result: dict) -> int:
    """1 when the run stopped early or any answer was wrong, failed, lost or given twice; else 0."""
    bad = 1 if "error" in result else 0
    bad += result["front"]["wrong"] + result["front"]["failed"] if result.get("front") else 0
    bad += sum(x["wrong"] + x["errors"] + x["lost"] for x in result["runs"])
    bad += sum(f["run"]["wrong"] + f["run"]["lost"] + f["run"]["redis"]["answered_twice"] for f in result["faults"])
    return 1 if bad else 0


def main(argv: Optional[list[str]] = None) -> int:
    a = arg_parser().parse_args(argv)
    pin = parse_pin(a.pin_cpus, os.cpu_count() or 1)
    gpu = not a.cpu
    rates, kinds, concurrency, faults = settle(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_main = time.monotonic()
    import redis  # noqa: F401 - missing, it fails here and not after the servers' start

    from bench.window_gpu import machine_line

    gpu_name, machine = machine_line(gpu)
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuhost-queue-gpu-{os.getpid()}"
    base.mkdir(parents=True, exist_ok=True)
    weights, arrays, refs, frame_bytes = prepare_frames(a, gpu, base)
    spec = model_spec(gpu, a.gpu_model or gpu_name, a.input)
    specs = backend_specs(spec, a.instances_by_weight)
    rs = Redis(a.redis_server, base / "redis", a.redis_io_threads, pin.get("redis") or pin.get("gateway"))
    rs.start(aof=False)
    backends: dict[str, Backend] = {}
    workers: dict[str, subprocess.Popen] = {}
    pool: Optional[LoadPool] = None
    result: dict[str, Any] = {"runs": [], "faults": []}
    try:
        backends = start_backends(base, specs, weights, gpu)
        for b in backends.values():
            pin_tree(b.proc.pid, pin.get("triton"))  # the server and its python-backend stubs
        log(f"Tritons ready after {time.monotonic() - t_main:.1f} s: {[(b.name, b.grpc) for b in backends.values()]}")
        cfg = gateway_config(rs.port, backends, a)
        r, q, metrics_ports, worker_cfg = start_workers(a, cfg, rs, base, workers, pin)
        setup = {
            "frames": str(base / "frames.npz"),
            "conf": CONF[a.input],
            "redis_port": rs.port,
            "grpc": {b.name: b.grpc for b in backends.values()},
            "max_depth": a.max_depth,
            "cpus": pin.get("load"),
        }
        pool = LoadPool(a.procs, setup)
        bench = Bench(pool, r, q, backends, workers, metrics_ports, worker_cfg, base, MODEL, a, pin)
        front = partial(front_run, cfg, base, arrays, refs, CONF[a.input], a.front_requests)
        run_all(bench, a, rates, kinds, concurrency, faults, front, rs, result)
    except Exception:  # noqa: BLE001 - what was measured is still written, with the error
        import traceback

        result["error"] = traceback.format_exc()
        log("FAILED:\n" + result["error"])
    finally:
        stop_and_collect(pool, workers, backends, rs, base, out)
    result["meta"] = run_meta(a, argv, machine, spec, specs, pin, frame_bytes, t_main)
    (out / "queue_gpu.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    (out / "queue_gpu.md").write_text(md)
    print(md)
    return exit_code(result)


VICTIM_WORKER = "w0"
VICTIM_BACKEND = "triton-b"


@dataclasses.dataclass
class Bench:
    """What every run of one benchmark shares (the load processes, Redis, the backends, the workers), and one run:
    ``run`` (a path, open or closed loop, a fault beside it), ``fault_run`` (a fault run, the victim put back after).
    ``a`` holds the command's settings: procs, threads, duration, seed, fault_duration, claim_idle_ms."""

    pool: LoadPool
    r: Any
    q: Any
    backends: dict[str, Backend]
    workers: dict[str, subprocess.Popen]
    metrics_ports: dict[str, int]
    worker_cfg: Any  # consumer -> its config
    base: Path
    model: str
    a: argparse.Namespace
    pin: dict[str, set[int]]
    seq: int = 0

    def run(
        self,
        path: str,
        mode: str,
        *,
        rate: float = 0.0,
        kind: str = "even",
        conc: int = 0,
        duration: Optional[float] = None,
        fault: Optional[Any] = None,
        shed_wait_ms: float = 0.0,
    ) -> dict:
        """One run; ``shed_wait_ms``: the gateway path's submits shed past that queue time (``QueueShed``)."""
        a, r, q = self.a, self.r, self.q
        duration = a.duration if duration is None else duration
        self.seq += 1
        prefix = f"r{self.seq}"
        threads = a.threads if mode == "open" else max(1, conc // a.procs)
        s = {
            "path": path,
            "mode": mode,
            "rate": rate,
            "arrivals": kind if mode == "open" else None,
            "arrivals_s": arrivals(kind, rate, duration, a.seed) if mode == "open" else [],
            "concurrency": threads * a.procs if mode == "closed" else None,
            "threads": threads,
            "duration": duration,
            "start": time.time() + 1.0,
            "model": self.model,
            "drain_s": max(30.0, duration * 2),
            "key_prefix": prefix,
            "shed_wait_ms": shed_wait_ms,
        }
        r.delete(q.cfg.stats_key)
        r.config_resetstat()
        t_before = triton_stats(self.backends, self.model)
        timer = None
        if fault is not None:
            timer = threading.Thread(target=fault, args=(s["start"],), daemon=True)
            timer.start()
        sampler = WorkerSampler(self.metrics_ports if path == "gateway" else {})
        cpu0, t0 = self.role_cpu(), time.monotonic()
        with sampler:
            parts = self.pool.run(s)
        cpu1, wall = self.role_cpu(), time.monotonic() - t0
        if timer is not None:
            timer.join(120)
        res = summarise(path, mode, s, parts)
        t_after = triton_stats(self.backends, self.model)
        res["triton"] = {n: stats_delta(t_before[n], x) for n, x in t_after.items() if n in t_before}
        if fault is None:  # a killed process's CPU time goes with it
            res["cpus_busy"] = {k: round((cpu1[k] - cpu0[k]) / wall, 2) for k in cpu1}
        if shed_wait_ms:
            res["shed_wait_ms"] = shed_wait_ms
        if path == "gateway":
            wait_drained(q, max(60.0, duration * 2))
            res["redis"] = queue_accounting(r, q, prefix, res)
            res["backends_seen_by_workers"] = sampler.summary()
            res["redis"]["per_job"] = {
                c.removeprefix("cmdstat_"): {
                    "calls": round(v["calls"] / max(1, res["sent"]), 3),
                    "usec": round(v["usec"] / max(1, res["sent"]), 1),
                }
                for c, v in r.info("commandstats").items()
                if c.removeprefix("cmdstat_") not in ("config", "info", "scan", "llen", "ttl", "hgetall", "del")
            }
        shown = {k: v for k, v in res.items() if k != "_rows"}
        log(f"{path} {mode} {f'{rate:g}/s {kind}' if mode == 'open' else conc}: {json.dumps(shown)}")
        return res

    def role_cpu(self) -> dict[str, float]:
        """CPU seconds so far by role (``PIN_ROLES``): the load processes; Redis and the workers (the workers alone
        where Redis has CPUs of its own, and Redis apart); the Tritons."""
        redis_pid = int(self.r.info("server")["process_id"])
        apart = "redis" in self.pin
        out = {
            "load": cpu_seconds([p.pid for p in self.pool.procs if p.pid]),
            "gateway": cpu_seconds([*([] if apart else [redis_pid]), *(w.pid for w in self.workers.values())]),
            "triton": cpu_seconds([b.proc.pid for b in self.backends.values()]),
        }
        if apart:
            out["redis"] = cpu_seconds([redis_pid])
        return out

    def fault_run(self, f: str, rs: "Redis", *, rate: float, kind: str) -> dict:
        """The gateway at ``rate`` with fault ``f`` (worker, redis, backend) a third into the run; the killed worker
        is started again after it, Redis's AOF turned off again. The fault's event and the run."""
        a, r, q = self.a, self.r, self.q
        from testbed.servers.gateway import spawn_worker

        ev: dict[str, Any] = {"fault": f}
        if f == "redis":
            r.config_set("appendonly", "yes")
            wait_aof(r)
        act = Fault(f, ev, a.fault_duration / 3, q, self.workers, self.backends, rs, WorkerSampler(self.metrics_ports))
        res = self.run("gateway", "open", rate=rate, kind=kind, duration=a.fault_duration, fault=act.run)
        if f == "worker":
            ev["pending_of_killed_after"] = len(q.pending_of(VICTIM_WORKER))
            ev["claim_idle_ms"] = a.claim_idle_ms
            self.workers[VICTIM_WORKER] = spawn_worker(self.worker_cfg(VICTIM_WORKER), VICTIM_WORKER, self.base)
            pin_tree(self.workers[VICTIM_WORKER].pid, self.pin.get("gateway"))
        elif f == "redis":
            ev["aof_bytes"] = sum(x.stat().st_size for x in (self.base / "redis").rglob("*.aof"))
            r.config_set("appendonly", "no")
            shutil.rmtree(self.base / "redis" / "appendonlydir", ignore_errors=True)
        rows = res.pop("_rows")
        at = ev.get("at_s", 0.0)
        moved = [x for x in rows if x[4] == "ok" and (x[6] > 1 or x[7])]
        ev["jobs_moved"] = len(moved)
        ev["moved_max_latency_ms"] = round(max((x[2] for x in moved), default=0.0), 1)
        ev["moved_done_by_s_after_fault"] = round(max((x[8] - at for x in moved), default=0.0), 3)
        ev["in_flight_at_fault"] = sum(1 for x in rows if x[1] < at < x[8])
        ev["after_fault_p99_ms"] = round(pct(sorted(x[2] for x in rows if x[4] == "ok" and x[1] >= at), 99), 1)
        ev["run"] = res
        log(f"fault {f}: {json.dumps({k: v for k, v in ev.items() if k != 'run'})}")
        return ev


@dataclasses.dataclass
class Fault:
    """One fault, ``after_s`` into a run: a worker, Redis (restarted with AOF) or a backend SIGKILLed."""

    kind: str
    ev: dict
    after_s: float
    q: Any
    workers: dict[str, subprocess.Popen]
    backends: dict[str, Backend]
    rs: Redis
    sampler: WorkerSampler

    def run(self, start: float) -> None:
        time.sleep(max(0.0, start + self.after_s - time.time()))
        ev = self.ev
        if self.kind == "worker":
            deadline = time.monotonic() + 3.0  # killed while it holds jobs, so there is something to reclaim
            while not self.q.pending_of(VICTIM_WORKER) and time.monotonic() < deadline:
                time.sleep(0.005)
            ev["pending_at_kill"] = len(self.q.pending_of(VICTIM_WORKER))
            ev["at_s"] = time.time() - start
            kill_group(self.workers[VICTIM_WORKER])
            ev["killed"] = VICTIM_WORKER
        elif self.kind == "redis":
            ev["at_s"] = time.time() - start
            self.rs.kill()
            ev["down_s"] = round(self.rs.start(aof=True), 3)
            ev["restarted_at_s"] = time.time() - start
        else:
            deadline = time.monotonic() + 3.0  # killed while it runs jobs, so some must go elsewhere
            while time.monotonic() < deadline:
                ev["in_flight_on_it_at_kill"] = self.sampler.scrape().get(("in_flight", VICTIM_BACKEND), 0.0)
                if ev["in_flight_on_it_at_kill"] > 0:
                    break
            ev["at_s"] = time.time() - start
            kill_group(self.backends[VICTIM_BACKEND].proc)
            ev["killed"] = VICTIM_BACKEND


def triton_stats(backends: dict[str, Backend], model: str = MODEL) -> dict[str, dict]:
    """Each running backend's model statistics (cumulative: queue, compute, batches), read before and after a run so
    the report can say whether a path's calls waited longer inside Triton or outside it."""
    from bench.servers import model_stats

    out = {}
    for b in backends.values():
        try:
            out[b.name] = model_stats(b.http, model)
        except (OSError, ValueError, KeyError):  # killed by a fault run
            pass
    return out


def strip(res: dict) -> dict:
    res.pop("_rows", None)
    return res


def wait_consumers(r: Any, q: Any, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while int(r.xinfo_groups(q.cfg.stream)[0]["consumers"]) < n:
        if time.monotonic() > deadline:
            raise TimeoutError("gateway workers did not join the group")
        time.sleep(0.1)


def wait_drained(q: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if q.depth() == 0:
                return
        except Exception:  # noqa: BLE001 - Redis restarting
            pass
        time.sleep(0.1)


def wait_aof(r: Any, timeout: float = 60) -> None:
    """Until the AOF turned on by CONFIG SET has been written (its rewrite done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = r.info("persistence")
        if int(info.get("aof_enabled", 0)) == 1 and not int(info.get("aof_rewrite_in_progress", 0)):
            if not int(info.get("aof_rewrite_scheduled", 0)):
                return
        time.sleep(0.1)
    raise TimeoutError("AOF not enabled")


# ---------------------------------------------------------------- report


def _header(result: dict) -> list[str]:
    """A stopped run's error, the machine, the command, both Tritons, the gateway and the load; then the head of the
    runs' table."""
    m = result["meta"]
    s = m["setup"]
    fb = m.get("frame_bytes", {"min": 0, "max": 0, "median": 0, "inline": 0})
    # Recorded runs from before the slots read for themselves name the reader's entries per XREADGROUP.
    per = m["model"].get("instances_by_backend") or {}
    by_weight = (
        " — instances by weight: " + ", ".join(f"{n} {c}" for n, c in per.items()) if len(set(per.values())) > 1 else ""
    )
    reads = f"{s['read_count']} entries per XREADGROUP" if "read_count" in s else "each slot its own XREADGROUP COUNT 1"
    lines = (
        [f"**The run stopped early:** `{result['error'].strip().splitlines()[-1]}`", ""] if "error" in result else []
    )
    return lines + [
        f"Machine: {m['machine']}; commit {m['commit']}; {m['when']}.",
        "",
        f"Command: `{m['command']}`. Two Tritons on the one GPU, each `{MODEL}` (yolov8n_torch, test weights; "
        f"{m['model']['instances']} instances, max batch {m['model']['max_batch']}, window "
        f"{m['model']['triton_window_us']} µs){by_weight}, weights triton-a 3 : triton-b 2. Gateway: Redis + {s['workers']} "
        f"workers x {s['slots']} slots ({reads}, reclaim after "
        f"{s['claim_idle_ms']} ms idle; {m.get('redis_parser', '?')}). "
        + (f"CPUs pinned by role: {m['pinned']}. " if m.get("pinned") else "")
        + f"Load: {s['procs']} processes; {s['images']} distinct "
        + (
            f"JPEG camera frames (1280x720, 1920x1080, 640x480 in turn; {fb['min']:,}-{fb['max']:,} bytes, median "
            f"{fb['median']:,}; {fb['inline']} of them under the queue's 64 KiB inline bound, the rest in a key of "
            "their own), the same bytes sent on both paths"
            if s.get("input", "raw") == "jpeg"
            else "raw images (UINT8 640x640x3, 1,228,800 bytes)"
        )
        + f", each answer checked against its own frame's reference; {s['duration']:g} s per run; open loop: "
        "latency from the scheduled arrival; overhead = gateway minus direct at the same load.",
        "",
        "| path | load | arrivals | jobs/s | p50 ms | p95 ms | p99 ms | sent | right | wrong | errors | lost | "
        "split a:b |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]


def _run_rows(runs: list[dict]) -> list[str]:
    lines = []
    for x in runs:
        a, b = x["split"].get("triton-a", 0), x["split"].get("triton-b", 0)
        cells = [x["path"], load_label(x), arrivals_of(x)]
        cells += [x[k] for k in ("jobs_per_s", "p50_ms", "p95_ms", "p99_ms", "sent", "answered_right", "wrong")]
        cells += [x["errors"], x["lost"], f"{a}:{b}" + (f" ({a / b:.2f})" if b else "")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def _time_lines(result: dict) -> list[str]:
    """Per run: where the time goes, Redis's commands per job, Triton's phases, the CPUs busy by role, the
    backends as the workers saw them."""
    given = result["meta"].get("pinned") or {}
    lines = ["", "Where the time goes (medians of the answered jobs, ms; client total from the call's issue):", ""]
    for x in result["runs"]:
        load = load_label(x) + (f", {arrivals_of(x)} arrivals" if x["mode"] == "open" else "")
        lines.append(f"- {x['path']} {load}: " + ", ".join(f"{k} {v}" for k, v in x["parts_ms_p50"].items()))
        if "redis" in x:
            per = x["redis"]["per_job"]
            lines.append(
                "  Redis commands per job (calls, main-thread µs): "
                + ", ".join(f"{c} {v['calls']} ({v['usec']} µs)" for c, v in sorted(per.items()))
            )
        if x.get("triton"):
            lines.append("  Inside Triton (per request, µs): " + triton_line(x["triton"]))
        if x.get("cpus_busy"):
            lines.append(
                "  CPUs busy by role (CPU seconds ÷ the run's wall seconds, drain included): "
                + ", ".join(f"{k} {v}" + (f" of {given[k]}" if k in given else "") for k, v in x["cpus_busy"].items())
            )
        if x.get("backends_seen_by_workers"):
            lines.append(
                "  Backends as the workers saw them (0.5 s samples): " + json.dumps(x["backends_seen_by_workers"])
            )
    return lines


def _front_lines(fr: dict) -> list[str]:
    """The requests through the whole gateway (serving.front)."""
    return [
        "",
        f"Through the whole gateway (serving.front, KServe v2 JSON over HTTP, {fr.get('body_bytes', 0):,} bytes a "
        f"request; one at a time): {fr['requests']} requests, {fr['right']} right, {fr['wrong']} wrong, "
        f"{fr['failed']} failed; p50 {fr['p50_ms']} ms, max {fr['max_ms']} ms (mostly JSON)."
        + (f" First problem: {fr['first_problem']}" if fr["first_problem"] else ""),
    ]


def _fault_lines(faults: list[dict]) -> list[str]:
    """One row per injected fault, then each fault's details."""
    lines = [
        "",
        "| fault | at s | sent | accepted | answered once, right | wrong | lost (no answer by the client's deadline) "
        "| of those answered late | answered twice | completions dropped as duplicates | in flight at the fault | "
        "jobs moved | moved done by (s after fault) | p99 ms after fault |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in faults:
        x = f["run"]
        red = x["redis"]
        lines.append(
            f"| {fault_label(f)} | {f.get('at_s', 0):.1f} | {x['sent']} | {x['sent'] - x['unaccepted']} | "
            f"{x['answered_right']} | {x['wrong']} | {x['lost']} | {red.get('answered_after_client_gave_up', 0)} | "
            f"{red['answered_twice']} | "
            f"{red['duplicate_completions_dropped']} | {f['in_flight_at_fault']} | {f['jobs_moved']} | {f['moved_done_by_s_after_fault']} | "
            f"{f['after_fault_p99_ms']} |"
        )
    lines.append("")
    for f in faults:
        x = f["run"]
        extra = {k: v for k, v in f.items() if k not in ("run", "fault")}
        lines.append(
            f"- {fault_label(f)}: {json.dumps(extra)}; submit retries {x['submit_retries']}, result retries "
            f"{x['result_retries']}, stream depth after {x['redis']['stream_depth_after']}, pending after "
            f"{x['redis']['pending_after']}."
        )
    return lines


def markdown(result: dict) -> str:
    lines = _header(result)
    lines += _run_rows(result["runs"])
    lines.append("")
    lines += overhead_table(result["runs"])
    lines += _time_lines(result)
    if result.get("front"):
        lines += _front_lines(result["front"])
    if result["faults"]:
        lines += _fault_lines(result["faults"])
    return "\n".join(lines) + "\n"


def load_label(x: dict) -> str:
    return f"open {x['rate']:g}/s" if x["mode"] == "open" else f"closed {x['concurrency']}"


def arrivals_of(x: dict) -> str:
    """An open-loop run's arrival process (runs recorded before there was a choice were evenly spaced)."""
    return x.get("arrivals") or "even" if x["mode"] == "open" else "-"


def saturation(runs: list[dict]) -> dict:
    """The best jobs/s each path reached closed loop over the concurrencies run, and the gateway's ÷ direct's."""
    best: dict[str, dict] = {}
    for x in runs:
        if x["mode"] == "closed" and x["jobs_per_s"] > best.get(x["path"], {"jobs_per_s": -1.0})["jobs_per_s"]:
            best[x["path"]] = x
    out: dict[str, Any] = {
        p: {k: x[k] for k in ("jobs_per_s", "concurrency", "p50_ms", "p95_ms")} for p, x in best.items()
    }
    if "direct" in best and "gateway" in best and best["direct"]["jobs_per_s"]:
        out["gateway_share"] = round(best["gateway"]["jobs_per_s"] / best["direct"]["jobs_per_s"], 4)
    return out


def overhead_table(runs: list[dict]) -> list[str]:
    """The gateway's overhead at each load both paths ran: gateway minus direct at p50 and p95, jobs/s ratio, split;
    then saturation, the best jobs/s of each path over the closed-loop concurrencies (where the throughput goal is
    read). An open-loop load counts as sustained by a path that answered >= 97 % of the offered rate (the arrivals
    drawn over the run's duration)."""
    by = {
        (x["path"], x["mode"], arrivals_of(x), x["rate"] if x["mode"] == "open" else x["concurrency"]): x for x in runs
    }
    rows = []
    for (path, mode, kind, load), g in by.items():
        dr = by.get(("direct", mode, kind, load))
        if path != "gateway" or dr is None:
            continue
        a, b = g["split"].get("triton-a", 0), g["split"].get("triton-b", 0)
        share = a / (a + b) if a + b else 0.0
        if mode == "open":
            offered = g.get("offered_per_s") or load
            held = [p for p, x in (("direct", dr), ("gateway", g)) if x["jobs_per_s"] >= 0.97 * offered]
            sustained = "yes" if len(held) == 2 else f"no: only {held[0]}" if held else "no"
        else:
            sustained = "closed loop, same clients"
        cells = [load_label(g), kind, f"{dr['p50_ms']} / {dr['p95_ms']}", f"{g['p50_ms']} / {g['p95_ms']}"]
        cells += [f"{g['p50_ms'] - dr['p50_ms']:+.2f}", f"{g['p95_ms'] - dr['p95_ms']:+.2f}"]
        cells += [f"{g['jobs_per_s'] / dr['jobs_per_s']:.1%}" if dr["jobs_per_s"] else "-", f"{share:.1%}", sustained]
        gi, di = triton_mean_ms(g), triton_mean_ms(dr)
        rows.append(cells + [f"{gi - di:+.2f}" if gi is not None and di is not None else "-"])
    sat = saturation(runs)
    if "gateway_share" in sat and sum(1 for x in runs if x["mode"] == "closed" and x["path"] == "direct") > 1:
        d, g = sat["direct"], sat["gateway"]
        cells = ["saturation: best closed", "-", f"{d['jobs_per_s']} jobs/s at {d['concurrency']}"]
        cells += [f"{g['jobs_per_s']} jobs/s at {g['concurrency']}", "-", "-", f"{sat['gateway_share']:.1%}", "-"]
        rows.append(cells + ["each path's best", "-"])
    head = ["load", "arrivals", "direct p50 / p95 ms", "gateway p50 / p95 ms", "overhead p50 ms", "overhead p95 ms"]
    head += ["gateway jobs/s ÷ direct", "triton-a's share", "load sustained by both"]
    head += ["of it inside Triton (mean request, gateway − direct, ms)"]
    return [
        "Overhead = gateway minus direct at the same load and the same arrival times (goals: ≤ 1 ms at p50, ≤ 2 ms at "
        "p95, ≥ 95 % of the direct jobs/s at saturation, triton-a's share 54–66 %):",
        "",
        *md_table(head, rows, align="--rrrrrr-r"),
    ]


def triton_mean_ms(run: dict) -> Optional[float]:
    """A run's mean request time inside Triton (receipt to response), over both backends; None unmeasured."""
    per = [t for t in run.get("triton", {}).values() if t.get("requests") and t.get("success_us") is not None]
    n = sum(t["requests"] for t in per)
    return sum(t["success_us"] * t["requests"] for t in per) / n / 1000 if n else None


def triton_line(per: dict[str, dict]) -> str:
    """Triton's own per-request phases over a run, each backend: request (success), queue, compute input/infer/output;
    the batches it formed."""
    parts = []
    for name, t in sorted(per.items()):
        if not t.get("requests"):
            continue
        parts.append(
            f"{name} {t['requests']} requests: request {t['success_us']}, queue {t['queue_us']}, compute input "
            f"{t['compute_input_us']} / infer {t['compute_infer_us']} / output {t['compute_output_us']}; average "
            f"batch {t['avg_batch']}"
        )
    return "; ".join(parts) or "-"


def fault_label(f: dict) -> str:
    return {
        "worker": "worker SIGKILLed",
        "redis": "Redis SIGKILLed, restarted (AOF)",
        "backend": "backend triton-b SIGKILLed",
    }[f["fault"]]


if __name__ == "__main__":
    raise SystemExit(main())
