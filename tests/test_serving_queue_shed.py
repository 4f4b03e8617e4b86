"""Seed 001's shedding and BYTES inputs in the queue itself (serving.queue), against a real redis-server: a submit
is refused (QueueShed, the front's 503) when a new job would wait past ``shed_wait_ms``, judged by Redis from the
oldest waiting job's age and from the jobs waiting times the measured time between dispatches; nothing refused is
queued; off (0) nothing is ever shed. A prompt queued as a NumPy ``S`` array comes back to the worker byte for byte
and goes to Triton as UINT8 rows."""

from __future__ import annotations

import time

import numpy as np
import pytest

from serving.bytes_rows import from_rows, wire_inputs
from serving.queue import QueueShed
from testbed.servers import redis as redis_server

redis = pytest.importorskip("redis")

redis_srv = redis_server.redis_fixture()


queue = redis_server.job_queue_fixture()


def job(i: int) -> dict[str, np.ndarray]:
    return {"x": np.full((1, 4), i, np.float32)}


def test_jobs_waiting_times_the_dispatch_interval_sheds_before_the_oldest_is_that_old(queue):
    """One job dispatched in a ~1.2 s window: Redis measures ~1.2 s between dispatches; new jobs are accepted while
    (jobs waiting) x 1.2 s stays under 6 s and the first one past it is refused with a wait longer than the oldest
    waiting job's age (which alone would have let it in). A stall of this process stretches the measured interval:
    6 s lets the first new job in (2 waiting) unless the window grows past 3 s."""
    q = queue(shed_wait_ms=6000)
    for i in range(3):
        q.submit("m", job(i))
    assert len(q.read("w", count=1, block_ms=10)) == 1  # the group's entries-read is known from its first read
    q.submit("m", job(3))  # Redis's first sample: entries read now
    assert len(q.read("w", count=1, block_ms=10)) == 1  # one dispatch in the window
    oldest_waiting = time.time()  # job 2 waits from about now on (it was queued just before)
    time.sleep(1.2)
    accepted = 0
    with pytest.raises(QueueShed) as e:
        for i in range(4, 20):
            q.submit("m", job(i))
            accepted += 1
    age_ms = (time.time() - oldest_waiting) * 1000
    assert 1 <= accepted < 10, accepted
    assert e.value.wait_ms > 6000 and e.value.limit_ms == 6000
    assert e.value.wait_ms > age_ms, age_ms  # more than the oldest job's age: the jobs waiting x interval decided
    assert q.depth() == 4 + accepted and q.stats()["shed"] == 1


def test_the_oldest_waiting_job_s_age_sheds_and_nothing_refused_is_queued(queue):
    q = queue(shed_wait_ms=1500)  # not less: a stalled test between the first two submits would shed the second
    q.submit("m", job(0))
    assert q.submit("m", job(1))  # the queue is young: accepted
    time.sleep(1.8)
    with pytest.raises(QueueShed, match=r"a new job would wait about \d+ ms for a worker, over the 1500 ms allowed"):
        q.submit("m", job(2), key="refused")
    assert q.depth() == 2 and q.stats() == {"accepted": 2, "shed": 1}
    assert q.r.get(q.cfg.key("job", "refused")) is None


def test_without_shed_wait_ms_nothing_is_shed(queue):
    q = queue()
    q.submit("m", job(0))
    time.sleep(0.2)
    for i in range(1, 20):
        q.submit("m", job(i))
    assert q.depth() == 20 and "shed" not in q.stats()


def test_a_prompt_crosses_the_queue_byte_for_byte_and_goes_out_as_rows(queue):
    q = queue()
    prompts = ["a lighthouse at dawn".encode(), "霧の中の竹林".encode(), b"x"]
    key = q.submit("gen", {"prompt": np.array([[p] for p in prompts], dtype="S"), "seed": np.array([[1], [2], [3]])})
    (got,) = q.read("w", count=1, block_ms=10)
    assert got.key == key and [bytes(v) for v in got.inputs["prompt"].ravel()] == prompts
    rows = wire_inputs(got.inputs)
    assert rows["prompt"].dtype == np.uint8 and rows["prompt"].shape == (3, max(map(len, prompts)))
    assert from_rows(rows["prompt"]) == prompts
    assert rows["seed"] is got.inputs["seed"]
