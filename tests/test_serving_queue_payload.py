"""Large job inputs beside the stream entry (serving.queue: ``gen:in:<key>``), against a real redis-server.

An image (640x640x3 UINT8, 1.2 MB) goes in its own key, SET in the same round trip as the submit script, so Redis
never copies it through Lua; a worker gets a read's inputs with one MGET (a slot reads one entry). Each
test sends distinct arrays and compares every job's inputs with its own.
"""

from __future__ import annotations

import numpy as np
import pytest

from serving.queue import QueueFull, Result, ResultTimeout
from testbed.servers import redis as redis_server

redis = pytest.importorskip("redis")

redis_srv = redis_server.redis_fixture()


queue = redis_server.job_queue_fixture()


def image(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, (1, 640, 640, 3), dtype=np.uint8)


def done(job, backend: str = "a") -> Result:
    return Result(job.key, "ok", backend, "w", 1.0, 0.5, 0.4, outputs={"n": np.array([job.inputs["images"].sum()])})


def test_large_inputs_travel_beside_the_entry_and_go_with_the_job(queue):
    q = queue(max_depth=10)
    r = q.r
    keys = [q.submit("m", {"images": image(i), "small": np.array([i], np.int32)}) for i in range(3)]
    entries = r.xrange(q.cfg.stream)
    assert len(entries) == 3
    for (_, fields), key in zip(entries, keys):
        assert fields[b"payload"] == f"gen:in:{key}".encode()
        assert not [f for f in fields if f.startswith(b"in:")]  # no tensor bytes in the stream
        assert r.strlen(f"gen:in:{key}") == 640 * 640 * 3 + 4
    jobs = q.read("w1", count=8, block_ms=100)
    assert [j.key for j in jobs] == keys
    for i, job in enumerate(jobs):
        assert np.array_equal(job.inputs["images"], image(i))
        assert job.inputs["small"].tolist() == [i]
        assert q.complete(job, done(job))
        assert r.exists(f"gen:in:{job.key}") == 0
    assert q.depth() == 0
    for i, key in enumerate(keys):
        assert q.result(key, timeout_s=2).outputs["n"].tolist() == [int(image(i).sum())]


def test_a_large_result_goes_in_its_own_key_and_every_reader_gets_it(queue):
    """An image-sized result (a PNG row) is SET in gen:out:<key> beside the complete script, which stores only a
    reference: Redis copies none of its bytes through Lua. Two readers get it whole; a second completion (a reclaimed
    job run twice) keeps the first one's bytes; once read, its key expires with the result."""
    q = queue()
    r = q.r
    png = np.random.default_rng(3).integers(1, 256, (1, 300_000), dtype=np.uint8)
    key = q.submit("g", {"prompt": np.array([[b"a fox"]], dtype="S")})
    (job,) = q.read("w", count=1, block_ms=100)
    first = Result(job.key, "ok", "a", "w", 1.0, 0.5, 0.4, outputs={"image": png})
    r.script_flush()  # as after a Redis restart: the script is loaded again, the result stored once
    assert q.complete(job, first)
    assert not q.complete(job, Result(job.key, "ok", "b", "w2", 1.0, 0.5, 0.4, outputs={"image": png[:, ::-1]}))
    (element,) = r.lrange(q.cfg.key("result", key), 0, -1)
    assert len(element) < 100 and r.strlen(q.cfg.key("out", key)) > 300_000
    for _ in range(2):
        got = q.result(key, timeout_s=2)
        assert got.backend == "a" and np.array_equal(got.outputs["image"], png)
    assert 0 < r.ttl(q.cfg.key("out", key)) <= q.cfg.read_ttl_s
    assert q.stats()["duplicates"] == 1


def test_small_inputs_stay_in_the_entry(queue):
    q = queue()
    r = q.r
    q.submit("m", {"x": np.arange(4, dtype=np.float32)})
    [(_, fields)] = r.xrange(q.cfg.stream)
    assert b"in:x" in fields and b"payload" not in fields
    assert not r.keys("gen:in:*")


def test_encoded_frames_of_every_length_take_the_path_their_length_decides(queue):
    """JPEG frames are UINT8 [1, bytes] of any length: one byte under the inline bound rides in the entry, the bound
    and over go in a key of their own; each job's bytes come back exactly, in one read of mixed paths."""
    q = queue()
    r = q.r
    bound = q.cfg.inline_max_bytes
    lengths = [1, bound - 1, bound, bound + 1, 3 * bound + 7]
    frames = [np.random.default_rng(n).integers(0, 256, (1, n), dtype=np.uint8) for n in lengths]
    keys = [q.submit("det", {"images": f}) for f in frames]
    entries = [fields for _, fields in r.xrange(q.cfg.stream)]
    assert [b"payload" in f for f in entries] == [False, False, True, True, True]
    jobs = q.read("w1", count=8, block_ms=100)
    assert [j.key for j in jobs] == keys
    for job, f in zip(jobs, frames):
        assert job.inputs["images"].shape == f.shape and np.array_equal(job.inputs["images"], f)
        q.complete(job, done(job))
    assert q.depth() == 0 and not r.keys("gen:in:*")


def test_a_refused_job_leaves_no_inputs_and_a_resubmit_is_not_queued_twice(queue):
    q = queue(max_depth=1)
    r = q.r
    first = q.submit("m", {"images": image(1)}, key="k1")
    assert q.submit("m", {"images": image(1)}, key="k1") == first
    assert q.depth() == 1
    with pytest.raises(QueueFull):
        q.submit("m", {"images": image(2)}, key="k2")
    assert r.exists("gen:in:k2") == 0 and r.exists("gen:in:k1") == 1


def test_a_retry_keeps_the_accepted_inputs_and_leaves_none_behind_once_done(queue):
    q = queue()
    r = q.r
    q.submit("m", {"images": image(4)}, key="k4")
    q.submit("m", {"images": image(5)}, key="k4")  # a retry under the same key (its bytes must not replace them)
    [job] = q.read("w", count=1, block_ms=100)
    assert np.array_equal(job.inputs["images"], image(4))
    assert q.complete(job, done(job)) and r.exists("gen:in:k4") == 0
    q.submit("m", {"images": image(4)}, key="k4")  # a late retry of the finished job: not queued, no inputs kept
    assert q.depth() == 0 and r.exists("gen:in:k4") == 0
    assert q.result("k4", timeout_s=2).outputs["n"].tolist() == [int(image(4).sum())]


def test_a_reclaimed_job_brings_its_inputs_and_a_restarted_redis_loses_no_script(queue):
    q = queue()
    r = q.r
    q.submit("m", {"images": image(7)}, key="k7")
    [held] = q.read("dead", count=1, block_ms=100)
    r.script_flush()  # as after a restart: the submit script is loaded again on NOSCRIPT
    q.submit("m", {"images": image(8)}, key="k8")
    [again] = q.autoclaim("alive", min_idle_ms=0, count=1)
    assert again.key == "k7" and again.reclaimed
    assert np.array_equal(again.inputs["images"], image(7)) and np.array_equal(held.inputs["images"], image(7))
    [other] = q.read("alive", count=1, block_ms=100)
    assert other.key == "k8" and np.array_equal(other.inputs["images"], image(8))


def test_inputs_that_expired_give_a_job_without_inputs(queue):
    q = queue()
    r = q.r
    q.submit("m", {"images": image(3)}, key="k3")
    r.delete("gen:in:k3")
    [job] = q.read("w", count=1, block_ms=100)
    assert job.key == "k3" and job.inputs == {}


def test_a_worker_stores_its_result_in_a_redis_restarted_while_the_job_ran_stand_in_backend(tmp_path):
    """Redis goes down while a job runs (a stand-in backend: the test is about Redis, not Triton) and comes back on
    its port 0.5 s later: the worker's complete script is sent again by the client's retries (redis-py's default:
    10 tries, jittered backoff growing to 1 s, ~5 s in all) and stores the result once in the restarted Redis; the
    job needs no reclaim and no second run (there is no reclaimer here)."""
    import threading
    import time

    from serving.scheduler import Signals
    from serving.worker import Worker, WorkerConfig
    from testbed.servers.redis import start_redis

    first = start_redis(tmp_path / "a")
    back: list = []
    ran = []
    timers: list = []

    class Backend:
        def __init__(self, cfg, timeout_s):
            pass

        def infer(self, job):
            first.stop()  # down while the job runs; up again on the same port half a second later
            t = threading.Timer(0.5, lambda: back.append(start_redis(tmp_path / "b", port=first.port)))
            t.start()
            timers.append(t)
            ran.append(job.key)
            return {"n": np.array([int(job.inputs["images"].sum())])}

    cfg = WorkerConfig.from_dict(
        {"redis": {"port": first.port}, "backends": [{"name": "a", "weight": 1, "grpc": "-", "http": "-"}]}
    )
    w = Worker(cfg, "w1", backend_factory=Backend)
    w.sched.observe("a", Signals(ready=True), time.monotonic())  # no prober here: the stand-in is ready
    try:
        q = w.queue
        q.ensure_group()
        key = q.submit("m", {"images": image(5)})
        [job] = q.read("w1", count=1, block_ms=100)
        t0 = time.monotonic()
        w._process(job)
        assert time.monotonic() - t0 >= 0.5 and ran == [key]
        timers[0].join(30)  # start_redis returns once it has answered a PING: the worker's retry may be first
        assert back
        res = q.result(key, timeout_s=5)  # in the restarted (empty: no persistence here) Redis
        assert res.status == "ok" and res.outputs["n"].tolist() == [int(image(5).sum())]
        assert q.stats() == {"served:a": 1}
    finally:
        for h in back:
            h.stop()
        first.stop()


@pytest.fixture
def round_trips(monkeypatch):
    """The requests redis-py writes before it reads the replies (a command, or a whole pipeline): round trips."""
    import redis.connection

    sent: list[bytes] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self, command, check_health=True):
        sent.append(command)
        return send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    return sent


@pytest.mark.parametrize("size", ["small", "large"])
def test_a_submit_and_a_result_wait_are_one_round_trip_each(queue, round_trips, size):
    """The caller's part of a job's latency: its submit (a large input's SET pipelined before the script) and its
    wait for the result (BLMOVE, the TTL script and the large result's GET pipelined) one round trip each; the
    worker's read one (two with a large input's MGET) and its complete one. The result read is the job's own."""
    q = queue()
    inputs = {"images": image(1) if size == "large" else np.arange(4, dtype=np.uint8)}
    outputs = {"image": image(2)} if size == "large" else {"n": np.array([5])}
    for _ in range(2):  # the first job loads the scripts (EVALSHA, SCRIPT LOAD, again): the second is counted
        before = len(round_trips)
        key = q.submit("m", inputs)
        submit = len(round_trips) - before
        (job,) = q.read("w", count=1, block_ms=100)
        read = len(round_trips) - before - submit
        assert q.complete(job, Result(job.key, "ok", "a", "w", 1.0, 0.5, 0.4, outputs=outputs))
        complete = len(round_trips) - before - submit - read
        got = q.result(key, timeout_s=2)
        wait = len(round_trips) - before - submit - read - complete
    assert (submit, wait) == (1, 1)
    assert (read, complete) == (2 if size == "large" else 1, 1)
    assert np.array_equal(job.inputs["images"], inputs["images"])
    assert all(np.array_equal(got.outputs[n], a) for n, a in outputs.items())
    assert 0 < q.r.ttl(q.cfg.key("job", key)) <= q.cfg.read_ttl_s


def test_a_wait_that_times_out_leaves_the_queued_jobs_ttl(queue):
    """The TTL script runs after every BLMOVE, also one that found no result: a job still queued keeps its job key's
    hour (a retry within it is not queued twice); once the result is read it drops to ``read_ttl_s``."""
    q = queue(read_ttl_s=300)
    key = q.submit("m", {"x": np.arange(4, dtype=np.float32)})
    with pytest.raises(ResultTimeout):
        q.result(key, timeout_s=0.05)
    assert q.r.ttl(q.cfg.key("job", key)) > 300
    q.r.script_flush()  # as after a Redis restart: the wait loads the script again
    (job,) = q.read("w", count=1, block_ms=100)
    assert q.complete(job, Result(job.key, "ok", "a", "w", 1.0, 0.5, 0.4))
    assert q.result(key, timeout_s=2).status == "ok"
    assert 0 < q.r.ttl(q.cfg.key("job", key)) <= 300
    assert q.submit("m", {"x": np.arange(4, dtype=np.float32)}, key=key) == key and q.depth() == 0
