"""Seed 001's request queue on Redis Streams: submit with backpressure, consumer groups, exactly-once results.

Keys (``prefix`` defaults to ``gen``, the stream to ``gen:queue`` as in the seed)::

    gen:queue            the stream; one entry per job, deleted once its result is stored
    gen:job:<key>        the stream id a job key was accepted under (a resubmitted key is not queued twice)
    gen:done:<key>       the backend that completed the job; SET NX, so only the first completion counts
    gen:result:<key>     a one-element list holding the result; every waiter reads it with BLMOVE from the list to
                         itself (a read that leaves it in place), so any number of waiters and retries of the key
                         get it; once read its TTL (and the job and done keys') drops to ``read_ttl_s``
    gen:in:<key>         a large job's input tensors (``inline_max_bytes`` or more), one string beside a small
                         stream entry that names it; deleted when the job completes
    gen:out:<key>        a large result (an image), one string the result list names; the result's TTLs
    gen:stats            counters: accepted, refused, shed, duplicates, served:<backend>, failed
    gen:drain            shedding's clock (``shed_wait_ms``): the group's entries read at a time, and the measured
                         ms between dispatches

Why an XLEN check and not ``XADD … MAXLEN``: MAXLEN trims the oldest entries, which are jobs nobody has served
yet (or that a worker holds pending); that is losing work silently. The submit script refuses instead, atomically
with the add, and the caller gets ``QueueFull`` (HTTP 429 at the gateway). Completed entries are XDEL'd, so XLEN is
the work waiting or running.

Why the result is not popped: a caller that timed out and retried with the same id had two handlers waiting on
the key, and the abandoned first one popped the result: the retry waited until its own timeout (504), and every
later retry for the job key's hour was a duplicate with nothing left to read. Rotating the one-element list
(``BLMOVE key key``) is a blocking read that wakes every waiter, with no window where the result is out of Redis.
Keeping a read result for an hour would keep every image in memory; ``read_ttl_s`` after the first read bounds it,
and a retry later than that is a new job (its job key expires with the result), answered again, never a 504.

Round trips: a caller's submit is one (the submit script, after a large input's SET in the same pipeline) and each
wait for its result is one: BLMOVE, then in the same pipeline the script that shortens the TTLs once the result is
there and a GET of the key a large result is kept in (nil for a small one). Redis runs a connection's commands in
order, so the two after BLMOVE wait for it; the GET is a plain command, not in the script, so an image's bytes are
not copied through Lua. The worker's are its XREADGROUP, a large input's MGET and the complete script.

These five go through ``_RoundTrips``, not redis-py's client: commands packed by hiredis, written in one send on a
redis-py connection of the queue's own, replies read in order. redis-py's command and pipeline layers (its
serializer's per-argument checks, the pool's checkout and observability hooks, response callbacks) were ~115 µs of
the caller's ~365 µs CPU a job and ~85 µs of a worker's ~390 µs (``bench.queue_floor``, one client); the connection
itself (AUTH, timeouts, reconnect, the client's retry policy) is still redis-py's.

Why large inputs are not in the stream entry: passed through the submit script, every byte is copied into a Lua
string and back (a 1.2 MB image cost Redis ~8x what a plain SET of the same bytes does, which Redis keeps without a
copy), and Redis's one thread is the gateway's ceiling. So the inputs go in a SET pipelined in the same round trip
before the script, the entry carries their key, and a worker fetches a read's inputs with one MGET.

Usage::

    q = JobQueue(redis.Redis(port=6379), QueueConfig(max_depth=200))
    q.ensure_group()
    key = q.submit("sdxl", {"INPUT0": np.ones((1, 4), np.float32)})    # raises QueueFull when 200 are queued
    res = q.result(key, timeout_s=10)                                   # Result: outputs, backend, latency_ms

    # worker side (serving.worker does this)
    for job in q.read("worker-1", count=1, block_ms=50): ...
    q.complete(job, result)          # stores the result once, XACK + XDEL
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import uuid
from typing import Any, Optional

import hiredis
import numpy as np
import redis

_SUBMIT = """
local prior = redis.call('GET', KEYS[2])
if prior then
  -- a retry of an accepted job: its inputs, SET NX again before this script, go if the job is already done
  if KEYS[5] and #redis.call('XRANGE', KEYS[1], prior, prior) == 0 then redis.call('DEL', KEYS[5]) end
  return {'dup', prior}
end
local depth = redis.call('XLEN', KEYS[1])
if depth >= tonumber(ARGV[1]) then
  redis.call('HINCRBY', KEYS[3], 'refused', 1)
  if KEYS[5] then redis.call('DEL', KEYS[5]) end
  return {'full', tostring(depth)}
end
local limit = tonumber(ARGV[3])
if limit > 0 and depth > 0 then
  -- the wait a new job would have: max(the oldest waiting job's age, jobs waiting x ms between dispatches)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local lag, read, last = 0, nil, '0-0'
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local m = {}
    for i = 1, #g, 2 do m[g[i]] = g[i + 1] end
    if m['name'] == ARGV[4] then lag, read, last = tonumber(m['lag']) or 0, tonumber(m['entries-read']), m['last-delivered-id'] end
  end
  local age = 0
  local head = redis.call('XRANGE', KEYS[1], '(' .. last, '+', 'COUNT', 1)
  if #head > 0 then age = now - tonumber(string.match(head[1][1], '^(%d+)')) end
  local per = tonumber(redis.call('HGET', KEYS[4], 'per')) or 0
  local since = tonumber(redis.call('HGET', KEYS[4], 't'))
  if read and (not since or now - since >= 1000) then
    if since then
      local done = read - tonumber(redis.call('HGET', KEYS[4], 'read'))
      if done > 0 then
        local sample = (now - since) / done
        if per > 0 then per = (per + sample) / 2 else per = sample end
      elseif lag > 0 then
        per = math.max(per, now - since)
      end
    end
    redis.call('HSET', KEYS[4], 't', now, 'read', read, 'per', tostring(per))
    redis.call('EXPIRE', KEYS[4], 3600)
  end
  local wait = math.max(age, lag * per)
  if wait > limit then
    redis.call('HINCRBY', KEYS[3], 'shed', 1)
    if KEYS[5] then redis.call('DEL', KEYS[5]) end
    return {'shed', tostring(math.floor(wait))}
  end
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 5))
redis.call('SET', KEYS[2], id, 'EX', ARGV[2])
redis.call('HINCRBY', KEYS[3], 'accepted', 1)
return {'ok', id}
"""

_COMPLETE = """
local first = redis.call('SET', KEYS[2], ARGV[4], 'NX', 'EX', ARGV[3])
if first then
  redis.call('RPUSH', KEYS[3], ARGV[5])
  redis.call('EXPIRE', KEYS[3], ARGV[3])
  redis.call('HINCRBY', KEYS[4], ARGV[6], 1)
else
  redis.call('HINCRBY', KEYS[4], 'duplicates', 1)
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if KEYS[5] then redis.call('DEL', KEYS[5]) end
if first then return 1 else return 0 end
"""


# After a result wait's BLMOVE, in the same round trip: the result's TTLs (and its job's, done's and large result's)
# shortened to read_ttl_s, only once the result exists: a wait that timed out must not shorten the job key's TTL of
# a job still queued (a retry after that would queue it twice).
_READ = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for _, k in ipairs(KEYS) do redis.call('EXPIRE', k, ARGV[1], 'LT') end
return 1
"""


class _RoundTrips:
    """Round trips on connections of the queue's own: ``trip((cmd, arg, ...), ...)`` writes every command in one
    send and returns their replies in order (RESP2, undecoded), an error reply as its exception in its place.

    Connections are redis-py's (made from the client's pool settings: host, password, timeouts, retry policy) in a
    free list, one per thread in a round trip at the moment. A round trip that fails on the connection (reset,
    timeout) is retried under the client's retry policy on a fresh connection, as redis-py's own commands are; every
    round trip here may run twice (the submit and complete scripts and the result wait are idempotent by job key,
    and a read whose reply was lost leaves its entry pending, reclaimed after ``claim_idle_ms``)."""

    def __init__(self, r: Any):
        pool = r.connection_pool
        # RESP2 and bytes whatever the client speaks (redis-py 8 defaults to RESP3): the replies are parsed here
        self._kwargs = {**pool.connection_kwargs, "protocol": 2, "decode_responses": False}
        self._class = pool.connection_class
        self._retry = self._kwargs.get("retry") or r.get_retry()
        self._idle: list[Any] = []  # list.pop and list.append are atomic: no lock
        self._pid = os.getpid()

    def __call__(self, *commands: tuple) -> list[Any]:
        if self._pid != os.getpid():  # a forked child: the parent's sockets are the parent's (redis-py's pool too)
            self._idle, self._pid = [], os.getpid()
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._class(**self._kwargs)
        try:
            return self._retry.call_with_retry(lambda: self._once(conn, commands), lambda _e: conn.disconnect())
        except BaseException:
            conn.disconnect()  # a reply may be half read: the next round trip starts on a new connection
            raise
        finally:
            self._idle.append(conn)

    @staticmethod
    def _once(conn: Any, commands: tuple) -> list[Any]:
        conn.send_packed_command([b"".join([hiredis.pack_command(c) for c in commands])], check_health=False)
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response(disable_decoding=True))
            except redis.ResponseError as e:  # the connection is in step: the next reply follows
                replies.append(e)
        return replies

    def close(self) -> None:
        while self._idle:
            self._idle.pop().disconnect()


class QueueFull(RuntimeError):
    """The queue holds ``max_depth`` jobs; the job was not queued. Retry later (HTTP 429)."""

    def __init__(self, stream: str, depth: int, max_depth: int):
        self.depth, self.max_depth = depth, max_depth
        super().__init__(
            f"{stream} is full: {depth} jobs waiting or running (max_depth {max_depth}); not queued, retry later"
        )


class QueueShed(RuntimeError):
    """A new job would wait ``wait_ms`` in the queue, over ``shed_wait_ms``: not queued (HTTP 503), so the caller
    hears at once rather than after its latency goal has passed."""

    def __init__(self, stream: str, wait_ms: int, limit_ms: float):
        self.wait_ms, self.limit_ms = wait_ms, limit_ms
        super().__init__(
            f"{stream}: a new job would wait about {wait_ms} ms for a worker, over the {limit_ms:g} ms allowed "
            "(shed_wait_ms); not queued, retry later"
        )


class ResultTimeout(TimeoutError):
    pass


@dataclasses.dataclass(frozen=True)
class QueueConfig:
    stream: str = "gen:queue"
    group: str = "workers"
    prefix: str = "gen"
    max_depth: int = 1000
    result_ttl_s: int = 3600
    # How long a result stays readable after its first read (retries and other waiters of the key; Redis memory).
    read_ttl_s: int = 300
    # Inputs of this many bytes or more go in their own key (gen:in:<key>), not through the submit script.
    inline_max_bytes: int = 64 * 1024
    # Shedding (0: off): a submit is refused (QueueShed, HTTP 503) when a new job would wait longer than this for a
    # worker: the oldest waiting job's age, or the jobs waiting times the time between dispatches (measured by Redis
    # over >= 1 s windows, in gen:drain), whichever is more. Set it to the latency goal less a job's service time;
    # it counts the wait in the stream, so give the workers as many slots as the backends run at once.
    shed_wait_ms: float = 0.0

    def key(self, kind: str, job_key: str) -> str:
        return f"{self.prefix}:{kind}:{job_key}"

    @property
    def stats_key(self) -> str:
        return f"{self.prefix}:stats"


# ------------------------------------------------------------------ tensors and results on the wire


def _pack_tensors(tensors: dict[str, np.ndarray]) -> tuple[list[dict], list[bytes]]:
    meta, blobs = [], []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        meta.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape)})
        blobs.append(a.tobytes())
    return meta, blobs


def _nbytes(meta: dict) -> int:
    # math.prod, not np.prod: 0.2 µs against 2.7 µs, twice a job in the worker and in the caller
    return math.prod(meta["shape"]) * np.dtype(meta["dtype"]).itemsize


def _unpack_tensors(meta: list[dict], blobs: list[Any]) -> dict[str, np.ndarray]:
    return {m["name"]: np.frombuffer(b, dtype=np.dtype(m["dtype"])).reshape(m["shape"]) for m, b in zip(meta, blobs)}


def _fields(kv: Optional[list]) -> dict[bytes, bytes]:
    return dict(zip(kv[::2], kv[1::2])) if kv else {}


@dataclasses.dataclass
class Job:
    id: str  # stream entry id
    key: str  # idempotency key, what the caller holds
    model: str
    inputs: dict[str, np.ndarray]
    enqueued_at: float  # epoch seconds at submit
    reclaimed: bool = False
    payload: str = ""  # the key holding the inputs of a large job ("" when they are in the entry)
    error: str = ""  # the entry did not decode: the job is answered with this error, no backend called


@dataclasses.dataclass
class Result:
    key: str
    status: str  # "ok" | "error"
    backend: str
    worker: str
    latency_ms: float  # submit → result stored: queueing + service
    queue_ms: float  # submit → first dispatch to a backend
    service_ms: float  # the successful Triton call
    attempts: int = 1  # calls made (a failed backend's call counts)
    reclaimed: bool = False
    error: str = ""
    outputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    received_ms: float = 0.0  # caller side: submit → result popped

    def encode(self) -> bytes:
        meta, blobs = _pack_tensors(self.outputs)
        # The fields one by one: asdict() would deep-copy every output array only to drop it.
        head = {f.name: getattr(self, f.name) for f in _RESULT_HEAD}
        head["outputs"] = meta
        h = json.dumps(head).encode()
        return len(h).to_bytes(4, "big") + h + b"".join(blobs)

    @classmethod
    def decode(cls, data: bytes) -> "Result":
        n = int.from_bytes(data[:4], "big")
        head = json.loads(data[4 : 4 + n])
        meta = head.pop("outputs")
        blobs, pos = [], 4 + n
        for m in meta:
            size = _nbytes(m)
            blobs.append(data[pos : pos + size])
            pos += size
        return cls(**head, outputs=_unpack_tensors(meta, blobs))


_RESULT_HEAD = tuple(f for f in dataclasses.fields(Result) if f.name not in ("outputs", "received_ms"))
# A result list's element that names the key holding a large result (``JobQueue.complete``): an encoded result never
# starts with a zero head length.
_REF = b"\0\0\0\0ref:"

# ------------------------------------------------------------------ the queue


class JobQueue:
    def __init__(self, r: redis.Redis, config: QueueConfig = QueueConfig()):
        # redis-py's return types are unions over RESP2/3 and sync/async; this module knows which it gets.
        self.r: Any = r
        self.cfg = config
        self._trip = _RoundTrips(r)
        self._submit = r.register_script(_SUBMIT)
        self._complete = r.register_script(_COMPLETE)
        self._read = r.register_script(_READ)

    def ensure_group(self) -> None:
        """Create the stream and consumer group (id 0: jobs queued before the group existed are served too)."""
        try:
            self.r.xgroup_create(self.cfg.stream, self.cfg.group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def join(self, consumer: str) -> None:
        """Register the consumer now (an XREADGROUP on an empty stream does not), so XINFO shows every worker."""
        self.r.xgroup_createconsumer(self.cfg.stream, self.cfg.group, consumer)

    # -------------------------------------------------------------- caller side

    def submit(self, model: str, inputs: dict[str, np.ndarray], *, key: Optional[str] = None) -> str:
        """Queue a job; returns its key. A key already accepted is not queued again (idempotent retries)."""
        key = key or uuid.uuid4().hex
        meta, blobs = _pack_tensors(inputs)
        fields: list[Any] = ["key", key, "model", model, "t", repr(time.time()), "inputs", json.dumps(meta)]
        c = self.cfg
        keys = [c.stream, c.key("job", key), c.stats_key, f"{c.prefix}:drain"]
        head: list[Any] = [c.max_depth, c.result_ttl_s, repr(float(c.shed_wait_ms)), c.group]
        if sum(len(b) for b in blobs) < c.inline_max_bytes:
            for m, b in zip(meta, blobs):
                fields += [f"in:{m['name']}", b]
            status, value = self._script(self._submit, keys, [*head, *fields])
        else:  # one round trip: the inputs' SET, then the script (in order on the server)
            payload = c.key("in", key)
            fields += ["payload", payload]
            keys.append(payload)
            args = [*head, *fields]
            # NX: a retry of a job still waiting keeps the inputs it was accepted with
            status, value = self._set_then_script(payload, b"".join(blobs), self._submit, keys, args)
        if status == b"full":
            raise QueueFull(c.stream, int(value), c.max_depth)
        if status == b"shed":
            raise QueueShed(c.stream, int(value), c.shed_wait_ms)
        return key

    def result(self, key: str, *, timeout_s: float = 30.0, submitted_at: Optional[float] = None) -> Result:
        """The job's result, waiting up to ``timeout_s``; it stays for every other waiter of ``key`` (read in place,
        see the module docstring), readable for ``read_ttl_s`` more."""
        # In slices of at most a second: one BLMOVE longer than the client's socket timeout (redis-py's default is
        # 5 s) fails client-side and is retried.
        rkey, out = self.cfg.key("result", key), self.cfg.key("out", key)
        keys = [rkey, self.cfg.key("job", key), self.cfg.key("done", key), out]
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            got, read, large = self._trip(  # one round trip (the module docstring)
                ("BLMOVE", rkey, rkey, "LEFT", "RIGHT", max(0.01, min(1.0, left))),
                ("EVALSHA", self._read.sha, len(keys), *keys, self.cfg.read_ttl_s),
                ("GET", out),
            )
            for reply in (got, large):
                if isinstance(reply, Exception):
                    raise reply
            self._script_reply(self._read, read, keys, [self.cfg.read_ttl_s])
            if got is not None:
                break
            if left <= 1.0:
                raise ResultTimeout(f"no result for job {key} within {timeout_s:g}s")
        data = got
        if got.startswith(_REF):
            # The reference names this job's out key (complete()); another name is read on its own
            data = large if got[len(_REF) :] == out.encode() else self.r.get(got[len(_REF) :])
        if data is None:  # the result's own key expired before its reference: as if no result came
            raise ResultTimeout(f"the result of job {key} expired before it was read")
        res = Result.decode(data)
        if submitted_at is not None:
            res.received_ms = (time.time() - submitted_at) * 1000
        return res

    def call(self, model: str, inputs: dict[str, np.ndarray], *, timeout_s: float = 30.0) -> Result:
        t = time.time()
        return self.result(self.submit(model, inputs), timeout_s=timeout_s, submitted_at=t)

    # -------------------------------------------------------------- worker side

    def _jobs(self, entries: list, reclaimed: bool = False) -> list[Job]:
        """Jobs of stream entries; the inputs of large ones fetched with one MGET. An entry whose inputs are gone
        (expired) is a job with no inputs: the backend refuses it and the caller gets that error."""
        entries = [(i, f) for i, f in entries if f]
        names = [f[b"payload"] for _, f in entries if b"payload" in f]
        payloads = dict(zip(names, self._one("MGET", *names))) if names else {}
        return [self._job(i, f, reclaimed, payloads.get(f.get(b"payload", b""))) for i, f in entries]

    def _job(
        self, entry_id: bytes, fields: dict[bytes, bytes], reclaimed: bool = False, payload: Optional[bytes] = None
    ) -> Job:
        try:
            return self._decode(entry_id, fields, reclaimed, payload)
        except (KeyError, ValueError, TypeError) as e:  # not written by submit(): answered as an error, acked
            text = {k.decode(errors="replace"): v for k, v in fields.items()}
            try:
                enqueued = float(text.get("t", b"0"))
            except ValueError:
                enqueued = 0.0
            return Job(
                id=entry_id.decode(),
                key=text.get("key", entry_id).decode(errors="replace"),
                model=text.get("model", b"").decode(errors="replace"),
                inputs={},
                enqueued_at=enqueued or time.time(),
                reclaimed=reclaimed,
                payload=text.get("payload", b"").decode(errors="replace"),
                error=f"stream entry {entry_id.decode()} does not decode ({type(e).__name__}: {e}); not run",
            )

    def _decode(self, entry_id: bytes, fields: dict[bytes, bytes], reclaimed: bool, payload: Optional[bytes]) -> Job:
        meta = json.loads(fields[b"inputs"])
        blobs: list[Any]
        if b"payload" in fields:
            sizes = [_nbytes(m) for m in meta]
            if payload is None or len(payload) != sum(sizes):
                meta, blobs = [], []
            else:
                view, pos = memoryview(payload), 0
                blobs = []
                for n in sizes:
                    blobs.append(view[pos : pos + n])
                    pos += n
        else:
            blobs = [fields[f"in:{m['name']}".encode()] for m in meta]
        return Job(
            id=entry_id.decode(),
            key=fields[b"key"].decode(),
            model=fields[b"model"].decode(),
            inputs=_unpack_tensors(meta, blobs),
            enqueued_at=float(fields[b"t"]),
            reclaimed=reclaimed,
            payload=fields[b"payload"].decode() if b"payload" in fields else "",
        )

    def read(self, consumer: str, *, count: int = 8, block_ms: int = 50) -> list[Job]:
        """New jobs for this consumer (seed 001: XREADGROUP … COUNT 8 BLOCK 50; a worker slot reads COUNT 1)."""
        c = self.cfg
        got = self._one(
            "XREADGROUP", "GROUP", c.group, consumer, "COUNT", count, "BLOCK", block_ms, "STREAMS", c.stream, ">"
        )
        # RESP2: [[stream, [[id, [field, value, ...]], ...]]]; an entry deleted while pending has no fields
        return self._jobs([(i, _fields(kv)) for _, entries in (got or []) for i, kv in entries])

    def autoclaim(self, consumer: str, *, min_idle_ms: int, count: int = 8) -> list[Job]:
        """Take over jobs another consumer has held longer than ``min_idle_ms`` (it died, or hung)."""
        jobs: list[Job] = []
        cursor = "0-0"
        while len(jobs) < count:
            got = self.r.xautoclaim(
                self.cfg.stream, self.cfg.group, consumer, min_idle_ms, cursor, count=count - len(jobs)
            )
            cursor, entries = got[0], got[1]
            jobs += self._jobs(entries, reclaimed=True)
            if cursor in (b"0-0", "0-0"):
                break
        return jobs

    def touch(self, consumer: str, ids: list[str]) -> None:
        """Reset the idle time of jobs this consumer still works on, so a slow job is not reclaimed."""
        if ids:
            self.r.xclaim(self.cfg.stream, self.cfg.group, consumer, 0, ids, justid=True)

    def complete(self, job: Job, result: Result) -> bool:
        """Store the result unless the job was already completed; XACK and XDEL either way. True when first.

        A result of ``inline_max_bytes`` or more (an image) goes in a key of its own (``gen:out:<key>``, SET NX in
        the same round trip, before the script): through the script its bytes were copied into Lua and out again,
        8 ms of Redis's one thread for a 2.4 MB PNG. The result list then holds a reference to it (``_REF``)."""
        c = self.cfg
        counter = f"served:{result.backend}" if result.status == "ok" else "failed"
        keys = [c.stream, c.key("done", job.key), c.key("result", job.key), c.stats_key]
        if job.payload:
            keys.append(job.payload)
        data = result.encode()
        if len(data) < c.inline_max_bytes:
            first = self._script(
                self._complete, keys, [c.group, job.id, c.result_ttl_s, result.backend or "-", data, counter]
            )
            return bool(first)
        out = c.key("out", job.key)
        args: list[Any] = [c.group, job.id, c.result_ttl_s, result.backend or "-", _REF + out.encode(), counter]
        # NX: a second completion keeps the first one's bytes
        return bool(self._set_then_script(out, data, self._complete, keys, args))

    def _set_then_script(self, key: str, data: bytes, script: Any, keys: list, args: list) -> Any:
        """One round trip: SET ``key`` NX with the result TTL, then ``script`` (in that order on the server)."""
        stored, reply = self._trip(
            ("SET", key, data, "EX", self.cfg.result_ttl_s, "NX"), ("EVALSHA", script.sha, len(keys), *keys, *args)
        )
        if isinstance(stored, Exception):
            raise stored
        return self._script_reply(script, reply, keys, args)

    def _script(self, script: Any, keys: list, args: list) -> Any:
        """A script's reply in one round trip (EVALSHA; loaded first where Redis lacks it)."""
        return self._script_reply(script, self._trip(("EVALSHA", script.sha, len(keys), *keys, *args))[0], keys, args)

    def _one(self, *command: Any) -> Any:
        reply = self._trip(command)[0]
        if isinstance(reply, Exception):
            raise reply
        return reply

    def close(self) -> None:
        """Close the queue's own connections (the client's are the caller's to close)."""
        self._trip.close()

    def _script_reply(self, script: Any, reply: Any, keys: list, args: list) -> Any:
        """A pipelined EVALSHA's reply; where a restarted Redis lost the script, load it and run it once (one round
        trip, the queue's own: its replies are RESP2 bytes whatever the client was made with)."""
        if isinstance(reply, redis.exceptions.NoScriptError):
            _, reply = self._trip(("SCRIPT", "LOAD", script.script), ("EVALSHA", script.sha, len(keys), *keys, *args))
        if isinstance(reply, Exception):
            raise reply
        return reply

    # -------------------------------------------------------------- state

    def depth(self) -> int:
        return int(self.r.xlen(self.cfg.stream))

    def group_info(self) -> dict[str, int]:
        """pending (delivered, not acknowledged) and lag (not yet delivered) of the consumer group."""
        for g in self.r.xinfo_groups(self.cfg.stream):
            name = g["name"].decode() if isinstance(g["name"], bytes) else g["name"]
            if name == self.cfg.group:
                return {"pending": int(g.get("pending") or 0), "lag": int(g.get("lag") or 0)}
        return {"pending": 0, "lag": 0}

    def pending_of(self, consumer: str) -> list[str]:
        rows = self.r.xpending_range(self.cfg.stream, self.cfg.group, "-", "+", 10_000, consumername=consumer)
        return [r["message_id"].decode() if isinstance(r["message_id"], bytes) else r["message_id"] for r in rows]

    def stats(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.r.hgetall(self.cfg.stats_key).items()}
