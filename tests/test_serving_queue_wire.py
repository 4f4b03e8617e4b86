"""The queue's own round trips (``serving.queue._RoundTrips``) against a real redis-server: what redis-py's client
did for the hot path and the queue now does itself.

A connection whose server went away is replaced under the client's retry policy; an error reply leaves the
connection in step with the replies after it; a round trip cut short (a timeout mid-wait) never leaves its late
reply to be read as the next round trip's; the queue speaks RESP2 bytes whatever the client was set up with.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from serving.queue import JobQueue, QueueConfig, QueueFull, Result
from testbed.servers import redis as redis_server

redis = pytest.importorskip("redis")
from redis.backoff import NoBackoff  # noqa: E402
from redis.retry import Retry  # noqa: E402

redis_srv = redis_server.redis_fixture()


def one_job(q: JobQueue, i: int, size: int) -> None:
    """A job through the whole path (submit, read, complete, result wait), its answer checked against its input."""
    x = np.random.default_rng(i).integers(0, 256, (1, size), dtype=np.uint8)
    key = q.submit("m", {"images": x})
    (job,) = q.read("w", count=1, block_ms=1000)
    assert job.key == key and np.array_equal(job.inputs["images"], x)
    q.complete(job, Result(key, "ok", "a", "w", 1.0, 0.5, 0.4, outputs={"sum": np.array([int(x.sum())])}))
    res = q.result(key, timeout_s=5)
    assert res.status == "ok" and int(res.outputs["sum"][0]) == int(x.sum())


def test_a_restarted_redis_is_met_by_fresh_connections_and_the_scripts_loaded_again(tmp_path):
    with redis_server.start_redis(tmp_path / "first") as h:
        port = h.port
        q = JobQueue(redis.Redis(port=port, socket_timeout=5), QueueConfig())
        q.ensure_group()
        one_job(q, 0, 100)  # inline input
        one_job(q, 1, 100_000)  # input in a key of its own (SET + script in one round trip)
        assert q._trip._idle, "the round trips' connection is kept for the next one"
    # The same port, a new server: the kept connection's socket is dead, the group and the scripts are gone.
    with redis_server.start_redis(tmp_path / "second", port=port):
        q.ensure_group()
        one_job(q, 2, 100)
        one_job(q, 3, 100_000)
    q.close()
    assert not q._trip._idle


def test_an_error_reply_keeps_the_connection_in_step(redis_srv):
    q = JobQueue(redis.Redis(port=redis_srv.port), QueueConfig())
    stored, bad, got = q._trip(("SET", "k", "text"), ("INCR", "k"), ("GET", "k"))
    assert stored == b"OK" and got == b"text"
    assert isinstance(bad, redis.ResponseError) and "not an integer" in str(bad)
    assert q._trip(("PING",)) == [b"PONG"]
    assert len(q._trip._idle) == 1  # the same connection, still usable
    q.close()


def test_a_round_trip_cut_short_leaves_no_late_reply_behind(redis_srv):
    """A wait longer than the socket timeout fails; the server's late answer to it must not become the next round
    trip's reply (the connection is dropped, not reused), and the blocked pop it made is gone with it."""
    r = redis.Redis(port=redis_srv.port, socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
    q = JobQueue(r, QueueConfig())
    with pytest.raises(redis.TimeoutError):
        q._trip(("BLPOP", "late", 30))
    # The dropped socket's pop leaves the server when it reads the close; a push sent before that (a busy machine's
    # Redis may see both in one wake-up, in either order) would be taken by the pop. A kept connection would hold the
    # pop for its 30 s: wait for the server to let it go, well inside that.
    deadline = time.monotonic() + 10
    while r.info("clients")["blocked_clients"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert r.info("clients")["blocked_clients"] == 0, "the timed-out connection still holds its pop on the server"
    r.rpush("late", "x")  # a pop still blocked on the server would take it
    assert q._trip(("PING",)) == [b"PONG"]
    assert r.lrange("late", 0, -1) == [b"x"]
    q.close()


def test_the_queue_reads_resp2_bytes_whatever_the_client_speaks(redis_srv):
    """redis-py 8 defaults to RESP3; a client set up with decode_responses too: the queue's replies are its own."""
    r = redis.Redis(port=redis_srv.port, protocol=3, decode_responses=True)
    q = JobQueue(r, QueueConfig(max_depth=1))
    q.ensure_group()
    one_job(q, 4, 100)
    one_job(q, 5, 100_000)
    q.submit("m", {"x": np.zeros(4, np.float32)})  # the one job the queue holds
    r.script_flush()  # the scripts are loaded again by the queue, and their replies read as the queue reads them
    with pytest.raises(QueueFull):
        q.submit("m", {"x": np.ones(4, np.float32)})
    q.close()


def test_a_forked_child_opens_its_own_connection_and_leaves_the_parents_alone(redis_srv):
    """A queue used before a fork: the child must not write on the parent's socket (their replies would cross)."""
    q = JobQueue(redis.Redis(port=redis_srv.port), QueueConfig())
    (parent_id,) = q._trip(("CLIENT", "ID"))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the connection id its round trip ran on
        try:
            (child_id,) = q._trip(("CLIENT", "ID"))
            os.write(write, str(child_id).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child_id = int(os.read(read, 64) or 0)
    os.close(read)
    assert child_id and child_id != parent_id
    assert q._trip(("CLIENT", "ID")) == [parent_id]  # the parent's connection, open and in step
    q.close()
