"""An open-loop load generator for Triton over gRPC, spread over several client processes (issue 27).

One fixed-rate arrival schedule (the parent's, the same for every configuration) is dealt out at random to
``procs`` client processes; each process is a client of its own, as real clients are: its own gRPC connection, and
where the configuration micro-batches its own ``serving.microbatch.MicroBatcher`` and, for the adaptive window, its
own controller (``serving.adaptive_window.in_process``). A process issues each of its arrivals at its scheduled
time whatever the server does (open loop: queueing shows), holds at most ``max_outstanding`` requests (an arrival
beyond that is shed and counted) and records for every request:

* ``sched``: when it was due (seconds from the common start), ``sent``: when the process issued it (its issue lag is
  ``sent - sched``), ``done``: when its answer (or error) came back;
* ``status``: ``RIGHT`` (the answer is its own item's: ``check(outputs, reference)`` is None), ``WRONG``, ``FAILED``
  (an error or a timeout) or ``SHED``.

Latency counts from the scheduled time (``done - sched``): a client that issues late is not let off (no coordinated
omission). The processes start on one monotonic instant (CLOCK_MONOTONIC is the machine's, not the process's) after
every one of them has connected and checked its warm-up answers; their records are gathered to the parent.

``probe`` is the closed-loop counterpart: ``concurrency`` requests in flight per process for ``seconds``; the right
answers per second are the configuration's capacity, from which a schedule can be sized.

Usage::

    spec = ClientSpec(grpc_url="127.0.0.1:8001", model="yolov8n", input_name="images",
                      outputs=("detections", "num_detections"), payload=write_payload(dir, images, refs),
                      check=my_check, batching=True, adaptive=True, policy=WindowPolicy(target_p95_ms=25))
    plan = [(0.010, 0), (0.013, 0), ...]                  # (due s, phase) in time order
    run = run_open_loop(spec, plan, procs=8)             # records of every request, decisions, client CPU
    phase_rows(run.records, phases, target_ms=25)        # per phase: offered, served right/s, p50/p95/p99, lag
    capacity = probe(spec, procs=8, concurrency=4, seconds=5.0)["right_per_s"]

``check`` must be a module-level function (it travels to the processes by name), as must ``spec.payload`` be a
file (``write_payload``): the items and their references are read once per process, not pickled per call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import math
import multiprocessing
import pickle
import queue
import random
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence

import numpy as np

from serving.adaptive_window import WindowPolicy, in_process, percentile
from serving.microbatch import BatchPolicy, MicroBatcher, TritonBatchInfer

RIGHT, WRONG, FAILED, SHED = 0, 1, 2, 3
STATUS = {RIGHT: "right", WRONG: "wrong", FAILED: "failed", SHED: "shed"}
RECORD = np.dtype(
    [("idx", "i8"), ("proc", "i2"), ("phase", "i2"), ("sched", "f8"), ("sent", "f8"), ("done", "f8"), ("status", "i1")]
)
Check = Callable[[Mapping[str, np.ndarray], Any], Optional[str]]


@dataclasses.dataclass(frozen=True)
class ClientSpec:
    """What each client process does; picklable (it crosses to spawned processes).

    Args:
      grpc_url, model: Triton's gRPC endpoint and the model; ``input_name``: the one input (an item without the
        batch axis); ``outputs``: the outputs asked for.
      payload: a ``write_payload`` file: the items (request ``i`` sends item ``i mod N``) and their references.
      check: ``check(outputs of one item, its reference) -> None | what is wrong``, a module-level function.
      batching: through a ``MicroBatcher`` (window ``window_us``, batches of ``max_batch``), else one request per
        item; adaptive: and the window moved by an in-process controller with ``policy``.
      max_outstanding: requests in flight per process beyond which an arrival is shed.
      timeout_s: a request not answered by then fails.
      warmup: items sent (and checked) once per process before the start.
    """

    grpc_url: str
    model: str
    input_name: str
    outputs: tuple[str, ...]
    payload: str
    check: Check
    batching: bool = False
    adaptive: bool = False
    window_us: int = 600
    max_batch: int = 8
    policy: WindowPolicy = WindowPolicy()
    max_outstanding: int = 64
    timeout_s: float = 30.0
    warmup: int = 8


def write_payload(directory: Path, items: np.ndarray, refs: Sequence[Any]) -> str:
    """Items [N, ...] and one reference per item into ``directory/openloop-payload.pkl``; its path."""
    if len(items) != len(refs) or len(items) == 0:
        raise ValueError(f"{len(items)} items and {len(refs)} references: want one reference per item, at least one")
    path = Path(directory) / "openloop-payload.pkl"
    path.write_bytes(pickle.dumps((np.asarray(items), list(refs)), protocol=pickle.HIGHEST_PROTOCOL))
    return str(path)


def same_arrays(outputs: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]) -> Optional[str]:
    """A ``check`` for echo-like models: every referenced output equal to its reference."""
    for name, want in ref.items():
        got = np.asarray(outputs[name])
        if got.shape != np.shape(want) or not np.array_equal(got, want):
            return f"{name} differs from its reference"
    return None


def deal(plan: Sequence[tuple[float, int]], procs: int, seed: int = 27) -> list[list[tuple[int, float, int]]]:
    """Each arrival ``(due s, phase)`` to one process at random (the same deal for the same plan and seed); each
    process's share is ``(request index, due s, phase)`` in time order. Random, not round robin: a share of a
    Poisson process dealt at random is a Poisson process."""
    rng = random.Random(seed)
    shares: list[list[tuple[int, float, int]]] = [[] for _ in range(procs)]
    for i, (at, ph) in enumerate(plan):
        shares[rng.randrange(procs)].append((i, at, ph))
    return shares


# ---------------------------------------------------------------- in each client process


async def drive(
    share: Sequence[tuple[int, float, int]],
    infer: Callable[[int], Awaitable[Mapping[str, np.ndarray]]],
    check: Callable[[int, Mapping[str, np.ndarray]], Optional[str]],
    start: float,
    max_outstanding: int,
    *,
    proc: int = 0,
    clock: Callable[[], float] = time.monotonic,
    problems: Optional[list[str]] = None,
) -> np.ndarray:
    """Issue ``share`` open loop from ``start`` (a ``clock`` reading); one ``RECORD`` per arrival, times relative to
    ``start``. ``infer(i)`` answers request ``i``; ``check(i, outputs)`` says what is wrong with it (None: right).

    Arrivals already due are issued back to back (a client running late catches up at once); an arrival finding
    ``max_outstanding`` requests in flight is shed. Answers are kept and checked once the last one is in: a check
    (~1 ms for a detector's box sets) run inside the loop would delay the next arrivals and sit in the latency."""
    rec = np.zeros(len(share), dtype=RECORD)
    rec["proc"] = proc
    rec["sent"] = rec["done"] = math.nan
    outstanding = 0

    answers: list[tuple[int, int, Mapping[str, np.ndarray]]] = []

    async def one(row: int, i: int) -> None:
        nonlocal outstanding
        rec["sent"][row] = clock() - start  # when it really starts: a busy loop runs a new task late
        try:
            answers.append((row, i, await infer(i)))
        except Exception as e:  # noqa: BLE001 — counted; the first few kept
            rec["status"][row] = FAILED
            if problems is not None and len(problems) < 10:
                problems.append(f"request {i}: {type(e).__name__}: {str(e)[:200]}")
        finally:
            rec["done"][row] = clock() - start
            outstanding -= 1

    tasks = []
    for row, (i, at, ph) in enumerate(share):
        rec["idx"][row], rec["phase"][row], rec["sched"][row] = i, ph, at
        delay = start + at - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        if outstanding >= max_outstanding:
            rec["status"][row] = SHED
            continue
        outstanding += 1
        tasks.append(asyncio.ensure_future(one(row, i)))
    if tasks:
        await asyncio.gather(*tasks)
    for row, i, out in answers:  # every answer checked, after the clock and off the issuing loop
        rec["status"][row] = _verdict(check, i, out, problems)
    return rec


def _verdict(
    check: Callable[[int, Mapping[str, np.ndarray]], Optional[str]],
    i: int,
    out: Mapping[str, np.ndarray],
    problems: Optional[list[str]],
) -> int:
    """RIGHT, WRONG (``check`` names a difference) or FAILED (``check`` itself raised: the answer is unreadable)."""
    try:
        problem = check(i, out)
    except Exception as e:  # noqa: BLE001 — counted; the first few kept
        problem, status = f"{type(e).__name__}: {str(e)[:200]}", FAILED
    else:
        status = RIGHT if problem is None else WRONG
    if problem is not None and problems is not None and len(problems) < 10:
        problems.append(f"request {i}: {problem}")
    return status


async def closed_loop(
    infer: Callable[[int], Awaitable[Mapping[str, np.ndarray]]],
    check: Callable[[int, Mapping[str, np.ndarray]], Optional[str]],
    start: float,
    seconds: float,
    concurrency: int,
    *,
    first: int = 0,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """``concurrency`` loops, each sending its next request when the last is answered, from ``start`` until
    ``start + seconds``; answers that come back in that span are counted."""
    counts = {"right": 0, "wrong": 0, "failed": 0}
    answered: list[tuple[int, Mapping[str, np.ndarray], float]] = []
    await asyncio.sleep(max(0.0, start - clock()))

    async def loop(k: int) -> None:
        i = first + k
        while clock() < start + seconds:
            t0 = clock()
            try:
                out = await infer(i)
            except Exception:  # noqa: BLE001 — counted
                out = None
            if clock() <= start + seconds:
                if out is None:
                    counts["failed"] += 1
                else:
                    answered.append((i, out, clock() - t0))
            i += concurrency

    await asyncio.gather(*(loop(k) for k in range(concurrency)))
    latencies: list[float] = []
    for i, out, seconds_taken in answered:  # checked after the clock, as in ``drive``
        status = _verdict(check, i, out, None)
        counts[STATUS[status]] += 1
        if status == RIGHT:
            latencies.append(seconds_taken)
    return {**counts, "latencies": latencies}


async def _client(spec: ClientSpec, proc: int, job: dict, ready: Any, go: Any, start_value: Any) -> dict[str, Any]:
    import tritonclient.grpc.aio as grpcaio

    items, refs = pickle.loads(Path(spec.payload).read_bytes())
    n = len(items)
    client = grpcaio.InferenceServerClient(spec.grpc_url)
    # One request builder on both paths (the micro-batcher's: one copy of the rows into the request), so that (b)
    # and (c) differ by the batching alone.
    request = TritonBatchInfer(client, spec.model, outputs=list(spec.outputs))
    mb = MicroBatcher(request, BatchPolicy(spec.window_us, spec.max_batch))

    async def infer(i: int) -> Mapping[str, np.ndarray]:
        item = {spec.input_name: items[i % n]}
        try:
            if spec.batching:
                return await asyncio.wait_for(mb.submit(item), spec.timeout_s)
            out = await asyncio.wait_for(request([item]), spec.timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no answer within {spec.timeout_s:g} s") from None
        return {o: out[o][0] for o in spec.outputs}

    def check(i: int, out: Mapping[str, np.ndarray]) -> Optional[str]:
        return spec.check(out, refs[i % n])

    loop = asyncio.get_running_loop()
    problems: list[str] = []
    decisions: list[dict] = []
    result: dict[str, Any] = {"proc": proc, "problems": problems, "decisions": decisions}
    try:
        async with mb:
            for k in range(min(spec.warmup, n)):
                problem = check(proc + k, await infer(proc + k))
                if problem:
                    raise RuntimeError(f"process {proc}: warm-up answer {proc + k} is not its own: {problem}")
            mb.stats.records.clear()
            # The load generator's own pauses are not the server's latency: what exists now is frozen out of the
            # collector and automatic collection is off for the timed run (answers pile up until they are checked).
            gc.collect()
            gc.freeze()
            gc.disable()
            ready.put(("ready", proc, None))
            if not await loop.run_in_executor(None, go.wait, 600.0):
                raise RuntimeError(f"process {proc}: no start within 600 s")
            start = float(start_value.value)
            cpu0 = time.process_time()
            if job["mode"] == "probe":
                result.update(await closed_loop(infer, check, start, job["seconds"], job["concurrency"], first=proc))
            else:
                controller = in_process({spec.model: mb}, spec.policy)
                controller.on_decision = lambda d: decisions.append(
                    {
                        "t_s": time.monotonic() - start,
                        "action": d.action,
                        "from_us": d.previous_us,
                        "to_us": d.window_us,
                        "p95_ms": None if math.isnan(d.p95_ms) else d.p95_ms,
                        "requests": d.requests,
                    }
                )
                control = None
                if spec.adaptive:
                    await asyncio.sleep(max(0.0, start - time.monotonic()))
                    control = asyncio.ensure_future(controller.run_async())
                rec = await drive(job["share"], infer, check, start, spec.max_outstanding, proc=proc, problems=problems)
                if control is not None:
                    control.cancel()
                result["records"] = rec
            result["cpu_s"] = time.process_time() - cpu0
            gc.enable()
            result["wall_s"] = time.monotonic() - start
            result["batch_sizes"] = mb.stats.batch_sizes() if spec.batching else None
    finally:
        await client.close()
    return result


def _child(spec: ClientSpec, proc: int, job: dict, ready: Any, go: Any, start_value: Any) -> None:
    try:
        ready.put(("done", proc, asyncio.run(_client(spec, proc, job, ready, go, start_value))))
    except BaseException as e:  # noqa: BLE001 — the parent reports it
        ready.put(("error", proc, f"{type(e).__name__}: {e}"))


# ---------------------------------------------------------------- in the parent


@dataclasses.dataclass
class OpenLoopRun:
    records: np.ndarray  # RECORD, one per arrival of the plan, by request index
    decisions: list[list[dict]]  # per process, the adaptive window's decisions (t_s from the start)
    batch_sizes: Optional[dict[int, int]]
    cpu_share: list[float]  # per process, CPU seconds / wall seconds of its run (near 1: the client is the limit)
    problems: list[str]
    elapsed_s: float
    share: float = 1.0  # of the plan's arrivals (run_open_loop_together: this configuration's processes')


def _run(specs: Sequence[ClientSpec], jobs: list[dict], settle_s: float, limit_s: float) -> list[dict]:
    """One spawned process per job (job ``k`` runs ``specs[k]``); all start on one instant once every one is
    connected and warmed up."""
    ctx = multiprocessing.get_context("spawn")  # not fork: the parent may hold CUDA and gRPC state
    ready, go, start_value = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    procs = [
        ctx.Process(target=_child, args=(spec, k, job, ready, go, start_value), daemon=True)
        for k, (spec, job) in enumerate(zip(specs, jobs))
    ]
    for p in procs:
        p.start()
    results: dict[int, dict] = {}
    try:
        waiting = set(range(len(jobs)))
        deadline = time.monotonic() + 300.0
        started = False
        while len(results) < len(jobs):
            if not started and not waiting:
                start_value.value = time.monotonic() + settle_s
                go.set()
                started, deadline = True, time.monotonic() + settle_s + limit_s
            message = _next(ready)
            if message is None:
                dead = [k for k, p in enumerate(procs) if not p.is_alive() and k not in results]
                if dead:
                    message = _next(ready)  # its last message may still be in the pipe
                    if message is None:
                        raise RuntimeError(f"client process {dead[0]} exited ({procs[dead[0]].exitcode}) silently")
                elif time.monotonic() > deadline:
                    raise TimeoutError(f"client processes {sorted(set(range(len(jobs))) - set(results))} not done")
                else:
                    continue
            kind, k, value = message
            if kind == "error":
                raise RuntimeError(f"client process {k}: {value}")
            if kind == "ready":
                waiting.discard(k)
            else:
                results[k] = value
    finally:
        for p in procs:
            p.join(10 if len(results) == len(jobs) else 0)
            if p.is_alive():
                p.kill()
    return [results[k] for k in range(len(jobs))]


def _next(ready: Any) -> Optional[tuple[str, int, Any]]:
    try:
        return ready.get(timeout=1.0)
    except queue.Empty:
        return None


def run_open_loop(
    spec: ClientSpec, plan: Sequence[tuple[float, int]], procs: int, *, seed: int = 27, settle_s: float = 0.5
) -> OpenLoopRun:
    """``plan`` (``(due s, phase)``, in time order) issued open loop by ``procs`` client processes."""
    return run_open_loop_together({"": spec}, plan, procs, seed=seed, settle_s=settle_s)[""]


def run_open_loop_together(
    specs: Mapping[str, ClientSpec],
    plan: Sequence[tuple[float, int]],
    procs: int,
    *,
    seed: int = 27,
    settle_s: float = 0.5,
) -> dict[str, OpenLoopRun]:
    """``plan`` issued open loop by ``procs`` client processes at once, process ``k`` a client of the ``k mod
    len(specs)``-th spec: two client configurations against one server at the same time (each its share of the
    processes and of the arrivals, dealt at random), so that what differs between them is the client alone, not
    the server's state from one run to the next. Each configuration's run holds its own processes' records."""
    names = list(specs)
    if procs < len(names):
        raise ValueError(f"{procs} client processes for {len(names)} configurations: at least one each")
    mine = [names[k % len(names)] for k in range(procs)]
    shares = deal(plan, procs, seed)
    span = (plan[-1][0] if plan else 0.0) + max(s.timeout_s for s in specs.values()) + 60.0
    t0 = time.monotonic()
    out = _run([specs[n] for n in mine], [{"mode": "open", "share": s} for s in shares], settle_s, span)
    elapsed = time.monotonic() - t0
    every = np.sort(np.concatenate([r["records"]["idx"] for r in out]))
    if not np.array_equal(every, np.arange(len(plan))):
        raise RuntimeError("the processes' records are not one per arrival of the plan")
    runs = {}
    for name in names:
        own = [r for r, n in zip(out, mine) if n == name]
        records = np.concatenate([r["records"] for r in own])
        records.sort(order="idx")
        sizes: dict[int, int] = {}
        for r in own:
            for size, count in (r["batch_sizes"] or {}).items():
                sizes[size] = sizes.get(size, 0) + count
        runs[name] = OpenLoopRun(
            records=records,
            decisions=[r["decisions"] for r in own],
            batch_sizes=dict(sorted(sizes.items())) if specs[name].batching else None,
            cpu_share=[round(r["cpu_s"] / max(r["wall_s"], 1e-9), 3) for r in own],
            problems=[p for r in own for p in r["problems"]][:10],
            elapsed_s=elapsed,
            share=len(records) / max(1, len(plan)),
        )
    return runs


def probe(spec: ClientSpec, procs: int, concurrency: int, seconds: float, settle_s: float = 0.5) -> dict[str, Any]:
    """Closed loop: ``concurrency`` in flight per process for ``seconds``; right answers per second and their
    latency."""
    out = _run(
        [spec] * procs,
        [{"mode": "probe", "seconds": seconds, "concurrency": concurrency}] * procs,
        settle_s,
        seconds + 120,
    )
    lat = [x * 1e3 for r in out for x in r["latencies"]]
    return {
        "procs": procs,
        "concurrency": concurrency,
        "seconds": seconds,
        "right": sum(r["right"] for r in out),
        "wrong": sum(r["wrong"] for r in out),
        "failed": sum(r["failed"] for r in out),
        "right_per_s": round(sum(r["right"] for r in out) / seconds, 1),
        "p50_ms": round(percentile(lat, 50), 2) if lat else None,
        "p95_ms": round(percentile(lat, 95), 2) if lat else None,
        "cpu_share": [round(r["cpu_s"] / max(r["wall_s"], 1e-9), 3) for r in out],
    }


# ---------------------------------------------------------------- summaries (pure)


def _ms(values: np.ndarray, q: float) -> Optional[float]:
    v = percentile(list(values * 1e3), q)
    return None if math.isnan(v) else round(v, 2)


def latency_ms(records: np.ndarray) -> np.ndarray:
    """Each right answer's latency from its scheduled time (ms)."""
    right = records[records["status"] == RIGHT]
    return (right["done"] - right["sched"]) * 1e3


def lag(records: np.ndarray) -> dict[str, Optional[float]]:
    """How late the client issued what it sent (``sent - sched``), ms: p50, p99, max."""
    sent = records[~np.isnan(records["sent"])]
    late = sent["sent"] - sent["sched"]
    return {
        "p50_ms": _ms(late, 50),
        "p99_ms": _ms(late, 99),
        "max_ms": round(float(late.max()) * 1e3, 2) if len(late) else None,
    }


def counts(records: np.ndarray) -> dict[str, int]:
    return {name: int((records["status"] == code).sum()) for code, name in STATUS.items()}


def phase_rows(records: np.ndarray, phases: Sequence[Any], target_ms: float) -> list[dict[str, Any]]:
    """Per phase (``name``, ``seconds``, ``rate``): offered, served right per second, shed/wrong/failed, p50/p95/p99
    latency from the scheduled time, issue lag, and whether p95 is within the target."""
    rows = []
    for k, ph in enumerate(phases):
        mine = records[records["phase"] == k]
        lat = latency_ms(mine) / 1e3
        c = counts(mine)
        p95 = _ms(lat, 95)
        rows.append(
            {
                "phase": ph.name,
                "seconds": ph.seconds,
                "rate": ph.rate,
                "offered": len(mine),
                "served_right": c["right"],
                "served_per_s": round(c["right"] / ph.seconds, 1),
                "wrong_answers": c["wrong"],
                "failed": c["failed"],
                "shed": c["shed"],
                "p50_ms": _ms(lat, 50),
                "p95_ms": p95,
                "p99_ms": _ms(lat, 99),
                "lag_p99_ms": lag(mine)["p99_ms"],
                "p95_under_target": None if p95 is None else bool(p95 <= target_ms),
                # p95 of the even- and the odd-numbered requests: how far p95 moves by chance (the noise)
                "p95_halves_ms": [_ms(latency_ms(mine[mine["idx"] % 2 == h]) / 1e3, 95) for h in (0, 1)],
            }
        )
    return rows


def window_at(decisions: list[list[dict]], t: float, start_us: int) -> list[int]:
    """Each process's window at ``t`` s (its last decision by then)."""
    out = []
    for ds in decisions:
        w = start_us
        for d in ds:
            if d["t_s"] <= t:
                w = d["to_us"]
        out.append(w)
    return out


def timeline(
    records: np.ndarray, total_s: float, bucket_s: float, decisions: Optional[list[list[dict]]], start_us: int
) -> list[dict[str, Any]]:
    """Per bucket of scheduled time: right answers, their p95 from the scheduled time, shed, and (with
    ``decisions``) the processes' windows at the bucket's end (mean, min, max)."""
    out = []
    b = 0.0
    while b < total_s - 1e-9:
        mine = records[(records["sched"] >= b) & (records["sched"] < b + bucket_s)]
        row: dict[str, Any] = {
            "t_s": round(b, 1),
            "submitted_right": int((mine["status"] == RIGHT).sum()),
            "shed": int((mine["status"] == SHED).sum()),
            "p95_ms": _ms(latency_ms(mine) / 1e3, 95),
        }
        if decisions is not None:
            w = window_at(decisions, b + bucket_s, start_us)
            row["window_us"] = round(sum(w) / len(w))
            row["window_range_us"] = [min(w), max(w)]
        out.append(row)
        b += bucket_s
    return out


def decision_rounds(decisions: list[list[dict]], period_s: float) -> list[dict[str, Any]]:
    """The processes' decisions grouped by period: per round the actions taken (counted), the windows after it
    (min–max), and the p95s they were based on (min–max)."""
    rounds: dict[int, list[dict]] = {}
    for ds in decisions:
        for d in ds:
            rounds.setdefault(int(round(d["t_s"] / period_s)), []).append(d)
    out = []
    for k in sorted(rounds):
        ds = rounds[k]
        actions: dict[str, int] = {}
        for d in ds:
            actions[d["action"]] = actions.get(d["action"], 0) + 1
        p95 = [d["p95_ms"] for d in ds if d["p95_ms"] is not None]
        out.append(
            {
                "t_s": round(k * period_s, 1),
                "actions": dict(sorted(actions.items())),
                "window_us": [min(d["to_us"] for d in ds), max(d["to_us"] for d in ds)],
                "p95_ms": [round(min(p95), 2), round(max(p95), 2)] if p95 else None,
                "requests": sum(d["requests"] for d in ds),
            }
        )
    return out


def client_bound(
    records: np.ndarray, cpu_share: Sequence[float], max_lag_p99_ms: float, max_lag_ms: float, max_cpu: float = 0.9
) -> list[str]:
    """Why a run measured its own client rather than the server (empty: it did not): the processes issued late
    (issue lag past its bounds) or one was busy nearly all the time."""
    out = []
    late = lag(records)
    if late["p99_ms"] is not None and late["p99_ms"] > max_lag_p99_ms:
        out.append(f"issue lag p99 {late['p99_ms']} ms > {max_lag_p99_ms:g} ms")
    if late["max_ms"] is not None and late["max_ms"] > max_lag_ms:
        out.append(f"issue lag max {late['max_ms']} ms > {max_lag_ms:g} ms")
    if cpu_share and max(cpu_share) > max_cpu:
        out.append(f"a client process was busy {max(cpu_share):.0%} of the run (> {max_cpu:.0%})")
    return out
