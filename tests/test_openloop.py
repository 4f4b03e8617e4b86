"""bench/openloop.py: the open-loop load generator over several client processes.

The accounting (latency from the scheduled time, issue lag, shedding, a wrong answer counted as wrong) is checked
first on ``drive`` alone with a frozen clock and an in-process stand-in for the server, where every number is known;
then the real thing: spawned client processes against a real Triton (pytriton wheel, CPU, the echo model), single
requests and micro-batched with the adaptive window, and the closed-loop probe.
"""

import asyncio
import math

import numpy as np
import pytest

from bench import openloop
from bench.openloop import FAILED, RIGHT, SHED, WRONG, ClientSpec, drive, same_arrays
from bench.window_gpu import Phase
from serving.adaptive_window import WindowPolicy
from testbed.servers.triton import triton_fixture, write_sleep_model


@pytest.fixture(autouse=True)
def _leave_an_event_loop():
    """asyncio.run() leaves the main thread without a current loop; Pulumi's mocks in later modules need one."""
    yield
    asyncio.set_event_loop(asyncio.new_event_loop())


def test_drive_accounting_with_a_frozen_clock_and_a_stand_in_server():
    """The clock stays at 10 s past the start: every arrival is late by 10 s minus its due time, all are issued at
    once, so with 3 in flight at most the first 3 are sent and the rest shed; request 1's answer is wrong, request 2
    fails. Latency and lag count from the scheduled time."""
    share = [(i, 0.5 * i, 0 if i < 4 else 1) for i in range(8)]

    async def infer(i):
        await asyncio.sleep(0)
        if i == 2:
            raise ConnectionError("refused")
        return {"OUTPUT0": np.array([i], np.float32)}

    def check(i, out):
        return "not its own" if i == 1 else None

    problems: list[str] = []
    rec = asyncio.run(drive(share, infer, check, 100.0, 3, proc=5, clock=lambda: 110.0, problems=problems))
    assert list(rec["idx"]) == list(range(8)) and set(rec["proc"]) == {5}
    assert list(rec["status"]) == [RIGHT, WRONG, FAILED] + [SHED] * 5
    assert list(rec["sched"]) == [0.5 * i for i in range(8)]
    assert list(rec["sent"][:3]) == [10.0] * 3 and all(math.isnan(x) for x in rec["sent"][3:])
    assert list(rec["done"][:3]) == [10.0] * 3
    assert sorted(problems) == ["request 1: not its own", "request 2: ConnectionError: refused"]
    # Only the right answer has a latency: 10 s from its due time 0, not 0 s from when it was sent.
    assert list(openloop.latency_ms(rec)) == [10_000.0]
    assert openloop.lag(rec) == {"p50_ms": 9500.0, "p99_ms": 10_000.0, "max_ms": 10_000.0}
    assert openloop.counts(rec) == {"right": 1, "wrong": 1, "failed": 1, "shed": 5}
    rows = openloop.phase_rows(rec, [Phase("idle", 2.0, 2.0), Phase("burst", 2.0, 2.0)], target_ms=50)
    assert [(r["offered"], r["served_right"], r["wrong_answers"], r["failed"], r["shed"]) for r in rows] == [
        (4, 1, 1, 1, 1),
        (4, 0, 0, 0, 4),
    ]
    assert rows[0]["p95_ms"] == 10_000.0 and rows[0]["p95_under_target"] is False and rows[1]["p95_ms"] is None
    assert openloop.client_bound(rec, [0.1], max_lag_p99_ms=10, max_lag_ms=100) == [
        "issue lag p99 10000.0 ms > 10 ms",
        "issue lag max 10000.0 ms > 100 ms",
    ]
    assert openloop.client_bound(rec[:1], [0.95], 1e6, 1e6) == ["a client process was busy 95% of the run (> 90%)"]


def test_drive_checks_answers_after_the_clock_and_off_the_issuing_loop():
    """A slow check (it moves the clock 1 s per answer) is neither in an answer's latency nor in the next arrival's
    issue lag; a wrong answer is still counted wrong and a check that raises counts as failed."""
    now = [100.0]
    share = [(i, 0.1 * i, 0) for i in range(4)]

    async def infer(i):  # answers at once (no await: the clock does not move)
        return {"OUTPUT0": np.array([i], np.float32)}

    def check(i, out):
        now[0] += 1.0
        if i == 3:
            raise ValueError("unreadable")
        return None if int(out["OUTPUT0"][0]) == i and i != 2 else "not its own"

    async def issue():
        real_sleep = asyncio.sleep

        async def sleep(delay):  # as a real sleep: the loop runs what is ready, then the time has passed
            await real_sleep(0)
            now[0] += delay

        asyncio.sleep = sleep  # type: ignore[assignment]
        try:
            return await drive(share, infer, check, 100.0, 8, clock=lambda: now[0], problems=problems)
        finally:
            asyncio.sleep = real_sleep

    problems: list[str] = []
    rec = asyncio.run(issue())
    assert list(rec["status"]) == [RIGHT, RIGHT, WRONG, FAILED]
    assert np.allclose(openloop.latency_ms(rec), [0.0, 0.0]) and abs(openloop.lag(rec)["max_ms"] or 0.0) < 1e-6
    assert sorted(problems) == ["request 2: not its own", "request 3: ValueError: unreadable"]


def test_deal_gives_every_arrival_to_one_process_in_time_order():
    plan = [(0.001 * i, 0) for i in range(1000)]
    shares = openloop.deal(plan, 4, seed=1)
    assert sorted(i for s in shares for i, _, _ in s) == list(range(1000))
    assert all([t for _, t, _ in s] == sorted(t for _, t, _ in s) for s in shares)
    assert all(180 < len(s) < 320 for s in shares)
    assert shares == openloop.deal(plan, 4, seed=1)


def test_window_timeline_and_decision_rounds_over_processes():
    decisions = [
        [{"t_s": 2.0, "action": "widen", "from_us": 600, "to_us": 650, "p95_ms": 3.0, "requests": 40}],
        [
            {"t_s": 2.01, "action": "narrow", "from_us": 600, "to_us": 550, "p95_ms": 60.0, "requests": 30},
            {"t_s": 4.0, "action": "hold", "from_us": 550, "to_us": 550, "p95_ms": None, "requests": 2},
        ],
    ]
    assert openloop.window_at(decisions, 1.0, 600) == [600, 600]
    assert openloop.window_at(decisions, 3.0, 600) == [650, 550]
    assert openloop.decision_rounds(decisions, 2.0) == [
        {
            "t_s": 2.0,
            "actions": {"narrow": 1, "widen": 1},
            "window_us": [550, 650],
            "p95_ms": [3.0, 60.0],
            "requests": 70,
        },
        {"t_s": 4.0, "actions": {"hold": 1}, "window_us": [550, 550], "p95_ms": None, "requests": 2},
    ]


# ---------------------------------------------------------------- real Triton, spawned client processes

triton = triton_fixture(lambda repo: write_sleep_model(repo, "echo", dynamic_batching=False, dims=(4,)))
N_ITEMS = 6


def _spec(triton, tmp_path, wrong_item=None, **kw):
    items = np.stack([np.arange(4, dtype=np.float32) + 10 * k for k in range(N_ITEMS)])
    refs = [{"OUTPUT0": items[k] + (1.0 if k == wrong_item else 0.0)} for k in range(N_ITEMS)]
    return ClientSpec(
        grpc_url=triton.grpc_url,
        model="echo",
        input_name="INPUT0",
        outputs=("OUTPUT0",),
        payload=openloop.write_payload(tmp_path, items, refs),
        check=same_arrays,
        warmup=2,
        **kw,
    )


def test_open_loop_over_two_processes_against_triton(triton, tmp_path):
    """Single requests from 2 processes: one record per arrival, each answer checked against its own item's
    reference: the item whose reference was altered is counted wrong on every request, the others right."""
    spec = _spec(triton, tmp_path, wrong_item=3)
    plan = [(0.02 * i, 0 if i < 20 else 1) for i in range(36)]
    run = openloop.run_open_loop(spec, plan, procs=2)
    rec = run.records
    assert list(rec["idx"]) == list(range(36)) and set(rec["proc"]) == {0, 1}
    assert list(rec["sched"]) == [at for at, _ in plan] and list(rec["phase"]) == [ph for _, ph in plan]
    wrong = [i for i in range(36) if i % N_ITEMS == 3]
    assert [int(i) for i in rec["idx"][rec["status"] == WRONG]] == wrong
    assert (rec["status"] == RIGHT).sum() == 36 - len(wrong)
    assert np.all(rec["sent"] >= rec["sched"]) and np.all(rec["done"] >= rec["sent"])
    assert len(run.problems) == min(10, len(wrong)) and "OUTPUT0 differs" in run.problems[0]
    assert run.batch_sizes is None and len(run.cpu_share) == 2 and run.decisions == [[], []]


def test_micro_batched_with_the_adaptive_window_and_the_probe(triton, tmp_path):
    """(d)'s client: each process its own micro-batcher and controller; the controllers decide (their records
    come back); every answer right. Then the closed-loop probe: right answers only, counted per second."""
    policy = WindowPolicy(target_p95_ms=10_000, period_s=0.3, min_requests=1)
    spec = _spec(triton, tmp_path, batching=True, adaptive=True, policy=policy)
    plan = [(0.01 * i, 0) for i in range(150)]
    run = openloop.run_open_loop(spec, plan, procs=2)
    assert openloop.counts(run.records) == {"right": 150, "wrong": 0, "failed": 0, "shed": 0}
    assert run.batch_sizes is not None and sum(run.batch_sizes.values()) == 150
    assert all(ds and {d["action"] for d in ds} <= {"widen", "hold"} for ds in run.decisions)
    assert all(d["to_us"] >= 600 for ds in run.decisions for d in ds)  # far under the target: never narrowed
    got = openloop.probe(_spec(triton, tmp_path), procs=2, concurrency=2, seconds=1.0)
    assert got["wrong"] == 0 and got["failed"] == 0 and got["right"] > 0
    assert got["right_per_s"] == got["right"] / 1.0 and got["p95_ms"] >= got["p50_ms"] > 0


def test_two_configurations_at_once_each_on_alternate_processes(triton, tmp_path):
    """(c) and (d) as the window bench runs them: one plan, 4 processes, alternate ones a client of each spec; each
    configuration's run holds only its own processes' records, together one per arrival, every answer right."""
    plain = _spec(triton, tmp_path)
    batched = _spec(triton, tmp_path, batching=True)
    plan = [(0.01 * i, 0) for i in range(120)]
    runs = openloop.run_open_loop_together({"c": plain, "d": batched}, plan, procs=4)
    c, d = runs["c"].records, runs["d"].records
    assert set(c["proc"]) == {0, 2} and set(d["proc"]) == {1, 3}
    assert sorted([*c["idx"], *d["idx"]]) == list(range(120))
    assert openloop.counts(c)["right"] == len(c) and openloop.counts(d)["right"] == len(d)
    assert runs["c"].share + runs["d"].share == 1.0 and 0.25 < runs["c"].share < 0.75
    assert runs["c"].batch_sizes is None and sum((runs["d"].batch_sizes or {}).values()) == len(d)
    with pytest.raises(ValueError, match="1 client processes for 2 configurations"):
        openloop.run_open_loop_together({"c": plain, "d": batched}, plan, procs=1)
