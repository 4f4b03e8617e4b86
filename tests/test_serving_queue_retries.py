"""Retries get the result (issue 38 §3): every waiter of a job key gets its result, against a real redis-server.

A caller that timed out and retried with the same id used to lose the result to its abandoned first handler (the
result was a list popped once by BLPOP), then got 504 for the job key's hour. Here the worker is the test itself
(it reads the job and completes it when the test says), the front is the real ``serving.front`` over HTTP.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import numpy as np
import pytest

from serving.front import Front
from serving.queue import JobQueue, QueueConfig, Result, ResultTimeout
from testbed.servers import redis as redis_server

redis = pytest.importorskip("redis")

redis_srv = redis_server.redis_fixture()

BODY = {"id": "job-1", "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [[1, 2, 3, 4]]}]}


@pytest.fixture
def q(redis_srv):
    client = redis.Redis(port=redis_srv.port)
    client.flushall()
    queue = JobQueue(client, QueueConfig(read_ttl_s=300))
    queue.ensure_group()
    yield queue
    client.close()


def serve_one(q: JobQueue, after: threading.Event | None = None) -> str:
    """The worker's part for the one job in the stream: read it, wait for ``after``, store its echo."""
    jobs: list = []
    deadline = time.monotonic() + 20
    while not jobs and time.monotonic() < deadline:
        jobs = q.read("w", count=1, block_ms=100)
    assert len(jobs) == 1, "no job was queued"
    job = jobs[0]
    if after is not None:
        assert after.wait(20)
    res = Result(job.key, "ok", "b", "w", 1.0, 0.5, 0.5, outputs={"OUTPUT0": job.inputs["INPUT0"] * 2})
    assert q.complete(job, res)
    return job.key


@pytest.fixture
def front(q):
    srv = Front(q, timeout_s=8).server("127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    t.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(10)


def post(port: int, timeout: float = 30) -> tuple[int, dict]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v2/models/gen/infer", json.dumps(BODY), {"Content-Type": "application/json"})
        resp = c.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        c.close()


def test_two_identical_requests_in_flight_both_get_the_result(q, front):
    answers: list[tuple[int, dict]] = []
    callers = [threading.Thread(target=lambda: answers.append(post(front))) for _ in range(2)]
    for t in callers:
        t.start()
    go = threading.Event()
    worker = threading.Thread(target=serve_one, args=(q, go))
    worker.start()
    time.sleep(0.5)  # both handlers are waiting on the key by now
    go.set()
    for t in (*callers, worker):
        t.join(30)
    assert [a[0] for a in answers] == [200, 200], answers
    assert all(a[1]["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0] for a in answers)
    assert q.stats()["accepted"] == 1  # one job: the second request was its retry, not a second job


def test_a_retry_after_a_client_timeout_gets_the_result_its_abandoned_handler_also_read(q, front):
    """The client gives up after 0.5 s (its handler in the front still waits), retries; the result arrives while
    both handlers wait: the retry is answered 200, and so is a third retry after the result was read."""
    with pytest.raises(socket.timeout):
        post(front, timeout=0.5)
    retry: list[tuple[int, dict]] = []
    t = threading.Thread(target=lambda: retry.append(post(front)))
    t.start()
    time.sleep(0.3)
    key = serve_one(q)
    t.join(30)
    assert retry and retry[0][0] == 200, retry
    assert retry[0][1]["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]
    time.sleep(0.2)
    status, doc = post(front, timeout=5)
    assert status == 200 and doc["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0], doc
    assert q.stats()["accepted"] == 1 and q.depth() == 0
    # Read: still one stored result, its TTL and the job's dropped to read_ttl_s (not an hour of memory).
    assert q.r.llen(q.cfg.key("result", key)) == 1
    for kind in ("result", "job", "done"):
        assert 0 < q.r.ttl(q.cfg.key(kind, key)) <= 300, kind


def test_many_waiters_of_one_key_all_get_it_and_an_unread_result_keeps_its_ttl(q):
    key = q.submit("gen", {"INPUT0": np.arange(4, dtype=np.float32)})
    got: list[Result] = []
    waiters = [threading.Thread(target=lambda: got.append(q.result(key, timeout_s=20))) for _ in range(8)]
    for t in waiters:
        t.start()
    time.sleep(0.3)
    serve_one(q)
    for t in waiters:
        t.join(30)
    assert len(got) == 8 and all(r.outputs["OUTPUT0"].tolist() == [0, 2, 4, 6] for r in got)
    # A job nobody has read yet keeps the full result TTL.
    other = q.submit("gen", {"INPUT0": np.ones(4, dtype=np.float32)})
    serve_one(q)
    assert q.r.ttl(q.cfg.key("result", other)) > 300
    assert q.result(other, timeout_s=1).outputs["OUTPUT0"].tolist() == [2, 2, 2, 2]
    assert 0 < q.r.ttl(q.cfg.key("result", other)) <= 300


def test_a_retry_later_than_read_ttl_is_a_new_job_answered_again_not_a_504(redis_srv):
    client = redis.Redis(port=redis_srv.port)
    client.flushall()
    q = JobQueue(client, QueueConfig(read_ttl_s=1))
    q.ensure_group()
    try:
        x = {"INPUT0": np.arange(4, dtype=np.float32)}
        q.submit("gen", x, key="k")
        serve_one(q)
        assert q.result("k", timeout_s=5).outputs["OUTPUT0"].tolist() == [0, 2, 4, 6]
        time.sleep(2.2)
        assert not client.exists("gen:result:k", "gen:job:k", "gen:done:k")
        with pytest.raises(ResultTimeout):  # nothing stored under the key any more ...
            q.result("k", timeout_s=0.2)
        q.submit("gen", x, key="k")  # ... so its retry is queued again and answered
        serve_one(q)
        assert q.result("k", timeout_s=5).outputs["OUTPUT0"].tolist() == [0, 2, 4, 6]
        assert q.stats()["accepted"] == 2 and q.stats().get("duplicates", 0) == 0
    finally:
        client.close()
