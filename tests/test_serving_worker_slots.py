"""serving.worker's slots, each reading its own jobs (XREADGROUP COUNT 1 on a connection of its own), against a real
redis-server, with a stand-in backend in the worker process (the tests are about the queue side, not Triton): a
worker holds no more jobs than it has slots, stopping lets the jobs in flight finish and leaves the rest in the
stream, and a job another consumer left pending is reclaimed and run by a free slot. Each job's answer is computed
from its own input and compared with it."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from serving.queue import JobQueue, QueueConfig
from serving.scheduler import Signals
from serving.worker import Worker, WorkerConfig
from testbed.servers import redis as redis_server

redis = pytest.importorskip("redis")

redis_srv = redis_server.redis_fixture()


class Gated:
    """A stand-in backend: each call waits for ``gate``, then answers the sum of the job's input."""

    gate = threading.Event()
    running: list[str] = []

    def __init__(self, cfg, timeout_s):
        pass

    def infer(self, job):
        Gated.running.append(job.key)
        assert Gated.gate.wait(30)
        return {"sum": np.array([int(job.inputs["x"].sum())])}


def frame(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, (1, 100_000 if i % 2 else 1000), dtype=np.uint8)


def worker(port: int, slots: int, **extra) -> Worker:
    cfg = WorkerConfig.from_dict(
        {"redis": {"port": port}, "backends": [{"name": "a", "weight": 1, "grpc": "-", "http": "-"}], "slots": slots}
        | extra
    )
    w = Worker(cfg, "w1", backend_factory=Gated)
    w._probe_once = lambda *a: w.sched.observe("a", Signals(ready=True), time.monotonic())  # type: ignore[method-assign]
    return w


def wait_for(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def q(redis_srv):
    client = redis.Redis(port=redis_srv.port)
    client.flushall()
    Gated.gate.clear()
    Gated.running.clear()
    yield JobQueue(client, QueueConfig())
    Gated.gate.set()
    client.close()


def test_slots_bound_what_a_worker_holds_and_stopping_finishes_them_and_leaves_the_rest(q, redis_srv):
    q.ensure_group()
    keys = [q.submit("m", {"x": frame(i)}) for i in range(5)]
    w = worker(redis_srv.port, slots=2)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        wait_for(lambda: len(Gated.running) == 2)
        time.sleep(0.3)  # a third slot would have read by now
        assert len(Gated.running) == 2 and len(w._holding) == 2
        assert q.group_info() == {"pending": 2, "lag": 3}  # the rest stay in the stream for other workers
        w.stop.set()
        Gated.gate.set()
        t.join(20)
        assert not t.is_alive() and w._holding == {}
    finally:
        w.stop.set()
        Gated.gate.set()
        t.join(20)
    done = {k: q.result(k, timeout_s=5) for k in Gated.running}
    for i, k in enumerate(keys):
        if k in done:
            assert done[k].status == "ok" and done[k].outputs["sum"].tolist() == [int(frame(i).sum())]
    assert q.depth() == 3 and q.group_info() == {"pending": 0, "lag": 3}
    assert set(q.r.keys("gen:result:*")) == {f"gen:result:{k}".encode() for k in done}  # nothing else answered


def test_a_job_left_pending_by_another_consumer_is_reclaimed_by_a_free_slot(q, redis_srv):
    q.ensure_group()
    keys = [q.submit("m", {"x": frame(i)}) for i in range(2)]
    [gone] = q.read("dead", count=1, block_ms=100)  # a consumer that read and died
    assert gone.key == keys[0]
    Gated.gate.set()
    # 2 s, not less: the worker's own job between its read and its hold (MGET, decode) must not look idle on a
    # stalled machine, or the worker reclaims it from itself
    w = worker(redis_srv.port, slots=2, claim_idle_ms=2000)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        res = [q.result(k, timeout_s=20) for k in keys]
    finally:
        w.stop.set()
        t.join(20)
    assert [r.outputs["sum"].tolist() for r in res] == [[int(frame(i).sum())] for i in range(2)]
    assert [r.reclaimed for r in res] == [True, False] and w.reclaimed.value() == 1
    assert q.pending_of("dead") == [] and q.depth() == 0 and w._holding == {} and not w._claimed


def test_an_entry_that_does_not_decode_is_answered_with_an_error_and_costs_no_slot(q, redis_srv):
    """A stream entry written by something other than JobQueue.submit (no ``inputs`` field): its key gets an error
    result that says so, no backend is called, the entry leaves the stream; the worker's only slot goes on and
    answers the next job, right."""
    q.ensure_group()
    q.r.xadd(q.cfg.stream, {"key": "bad", "model": "m", "t": repr(time.time())})
    key = q.submit("m", {"x": frame(3)})
    Gated.gate.set()
    w = worker(redis_srv.port, slots=1)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        bad = q.result("bad", timeout_s=20)
        assert bad.status == "error" and "does not decode" in bad.error and "KeyError" in bad.error
        res = q.result(key, timeout_s=20)
        assert res.status == "ok" and int(res.outputs["sum"][0]) == int(frame(3).sum())
        assert Gated.running == [key]  # the bad entry reached no backend
        wait_for(lambda: q.depth() == 0 and q.group_info()["pending"] == 0)
    finally:
        w.stop.set()
        t.join(30)
    assert not t.is_alive()
