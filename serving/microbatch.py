"""Client micro-batching (seed 004): callers submit one item and await its own result; the client groups items
that arrive within a short window (about 600 µs, at most 1 ms) into one request of up to 8 rows, sends it over
Triton's gRPC API and splits the answer back, row by row, to the callers.

Three layers, the first one pure:

* ``Grouper``: which pending items close a batch and when (window measured from the first item of a batch, a
  batch never over ``max_batch``; items whose tensors cannot be stacked — other shape or dtype — never share a
  batch, so a malformed item fails only itself and the items like it);
* ``MicroBatcher``: the asyncio driver. Each batch is sent as its own task; a failed request fails exactly the
  callers of that batch; a caller that is cancelled before its batch leaves is taken out of the batch (its row is
  never sent), one cancelled after that is simply not answered; every request's latency is recorded (wait in
  the window, batch size, end-to-end time);
* ``TritonBatchInfer``: one batched request over Triton's gRPC API (``tritonclient.grpc.aio``'s channel), serialized
  with one copy of the rows (``serving.triton_wire``).

Usage::

    client = tritonclient.grpc.aio.InferenceServerClient("127.0.0.1:8001")
    async with MicroBatcher(TritonBatchInfer(client, "resnet"), BatchPolicy(window_us=600, max_batch=8)) as mb:
        out = await mb.submit({"input": image})          # image: one item, without the batch axis
        logits = out["logits"]                           # this caller's row only
        mb.stats.p95_ms(), mb.stats.batch_sizes()        # per-request latency and batch-size distribution
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import time
from typing import Any, Awaitable, Callable, Deque, Generic, Hashable, Mapping, Optional, Sequence, TypeVar

import numpy as np

from serving import triton_wire

# One percentile rule for the client and its window controller; the controller's module is standard library only
# (it also runs alone as the unit beside Triton), so the rule lives there.
from serving.adaptive_window import percentile

Tensors = Mapping[str, np.ndarray]
# A batch's items (equal signatures, in order) in, the batched outputs (one row per item) out.
BatchInfer = Callable[[Sequence[Tensors]], Awaitable[Mapping[str, np.ndarray]]]

# Seed 004: "客户端侧再做 ≤1ms 的微批窗口" (the client's window starts at or under 1 ms: 600 µs) and the adaptive
# window moves it inside [200, 1500] µs, so a window of up to 1.5 ms is accepted; batches of up to 8.
MAX_WINDOW_US = 1500
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class BatchPolicy:
    """How long a batch stays open (from its first item) and how many items it takes at most."""

    window_us: int = 600
    max_batch: int = 8

    def __post_init__(self):
        if not 0 <= self.window_us <= MAX_WINDOW_US:
            raise ValueError(
                f"window_us: {self.window_us} µs is outside 0..{MAX_WINDOW_US} µs (seed 004's clamp ends at 1.5 ms)"
            )
        if self.max_batch < 1:
            raise ValueError(f"max_batch: {self.max_batch} must be at least 1")


# ---------------------------------------------------------------- pure grouping


@dataclasses.dataclass
class _Open(Generic[T]):
    opened: float
    items: list[T]


class Grouper(Generic[T]):
    """Pure grouping: items in, closed batches out; the caller supplies the clock readings.

    Items carry a ``key`` (anything hashable: the stacking signature); only items with equal keys share a batch.
    A batch closes when it holds ``max_batch`` items (``add`` returns it) or when ``window_s`` has passed since its
    first item (``due(now)`` returns it).

    Example::

        g = Grouper(BatchPolicy(window_us=600, max_batch=2))
        g.add("a", key="f32[3]", now=0.0)          # None: batch open
        g.add("b", key="f32[3]", now=0.0001)       # ["a", "b"]: full
        g.add("c", key="f32[3]", now=0.001)
        g.deadline()                               # 0.0016
        g.due(now=0.0016)                          # [["c"]]
    """

    def __init__(self, policy: BatchPolicy):
        self.policy = policy
        self.window_s = policy.window_us / 1e6
        self._open: dict[Hashable, _Open[T]] = {}

    def set_window(self, window_us: int) -> None:
        """A new window for every batch, the open ones included (their deadline is their first item + the new
        window: a narrower window may make one due at once, ``due`` then returns it)."""
        self.policy = dataclasses.replace(self.policy, window_us=window_us)
        self.window_s = window_us / 1e6

    def add(self, item: T, key: Hashable, now: float) -> Optional[list[T]]:
        batch = self._open.get(key)
        if batch is None:
            batch = self._open[key] = _Open(now, [])
        batch.items.append(item)
        if len(batch.items) >= self.policy.max_batch:
            del self._open[key]
            return batch.items
        return None

    def remove(self, item: T, key: Hashable) -> bool:
        """Take a still-pending item back (its caller went away); True if it was pending."""
        batch = self._open.get(key)
        if batch is None or item not in batch.items:
            return False
        batch.items.remove(item)
        if not batch.items:
            del self._open[key]
        return True

    def deadline(self) -> Optional[float]:
        """When the oldest open batch's window ends (None: nothing pending)."""
        return min((b.opened + self.window_s for b in self._open.values()), default=None)

    def due(self, now: float) -> list[list[T]]:
        """Batches whose window has ended by ``now``, oldest first; they are closed."""
        ready = sorted(
            ((b.opened, k) for k, b in self._open.items() if b.opened + self.window_s <= now), key=lambda x: x[0]
        )
        return [self._open.pop(k).items for _, k in ready]

    def drain(self) -> list[list[T]]:
        """Close every open batch now (shutdown)."""
        out = [b.items for b in sorted(self._open.values(), key=lambda b: b.opened)]
        self._open.clear()
        return out

    def pending(self) -> int:
        return sum(len(b.items) for b in self._open.values())


def signature(item: Tensors) -> tuple:
    """The stacking key of one item: names, dtypes and shapes of its tensors."""
    return tuple(sorted((name, np.asarray(a).dtype.str, np.asarray(a).shape) for name, a in item.items()))


def stack(items: Sequence[Tensors]) -> dict[str, np.ndarray]:
    """One batched request body from items with equal signatures (batch axis first)."""
    return {name: np.stack([np.asarray(item[name]) for item in items]) for name in items[0]}


def split(outputs: Mapping[str, np.ndarray], n: int) -> list[dict[str, np.ndarray]]:
    """Row ``i`` of every output for caller ``i``; a response whose batch axis is not ``n`` long is an error."""
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != n:
            raise BatchShapeError(f"output {name!r} has shape {tuple(array.shape)}, expected {n} rows")
    return [{name: array[i] for name, array in outputs.items()} for i in range(n)]


class BatchShapeError(RuntimeError):
    pass


# ---------------------------------------------------------------- latency records


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    submitted: float  # clock reading at submit
    wait_s: float  # submit → its batch sent (time spent in the window)
    latency_s: float  # submit → result (or error) handed to the caller
    batch_size: int
    ok: bool


class LatencyStats:
    """The most recent ``keep`` request records; what an adaptive controller or a dashboard reads."""

    def __init__(self, keep: int = 100_000):
        self.records: Deque[RequestRecord] = collections.deque(maxlen=keep)

    def add(self, record: RequestRecord) -> None:
        self.records.append(record)

    def window(self, since: Optional[float] = None) -> list[RequestRecord]:
        return [r for r in self.records if since is None or r.submitted >= since]

    def p95_ms(self, since: Optional[float] = None) -> float:
        return percentile((r.latency_s * 1e3 for r in self.window(since) if r.ok), 95)

    def percentile_ms(self, q: float, since: Optional[float] = None, field: str = "latency_s") -> float:
        return percentile((getattr(r, field) * 1e3 for r in self.window(since) if r.ok), q)

    def batch_sizes(self, since: Optional[float] = None) -> dict[int, int]:
        """Requests per batch size (how effective the window is, seed 004's 'batch 实际大小分布')."""
        return dict(sorted(collections.Counter(r.batch_size for r in self.window(since)).items()))


# ---------------------------------------------------------------- asyncio driver


@dataclasses.dataclass(eq=False)
class _Pending:
    item: Tensors
    key: Hashable
    future: asyncio.Future
    submitted: float


class MicroBatcher:
    """Groups concurrent ``submit`` calls into batched requests (see the module docstring).

    Args:
      infer: coroutine taking a batch's items and returning the batched outputs (``TritonBatchInfer``; ``stack``
        makes one array per input of them).
      policy: window and batch limit.
      clock: monotonic clock in seconds (tests pass a fake).
    """

    def __init__(
        self,
        infer: BatchInfer,
        policy: BatchPolicy = BatchPolicy(),
        *,
        clock: Callable[[], float] = time.perf_counter,
        stats: Optional[LatencyStats] = None,
    ):
        self.infer = infer
        self.policy = policy
        self.clock = clock
        self.stats = stats or LatencyStats()
        self._grouper: Grouper[_Pending] = Grouper(policy)
        self._waker: Optional[_Waker] = None
        self._timer: Optional[asyncio.TimerHandle] = None  # the loop's own wake-up at the same deadline
        self._timer_at: Optional[float] = None
        self._tasks: set[asyncio.Task] = set()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self.batches_sent = 0

    @property
    def window_us(self) -> int:
        return self.policy.window_us

    def set_window(self, window_us: int) -> None:
        """Move the window now, in process: nothing is dropped, restarted or reloaded. Batches already sent are not
        touched; open batches close on the new window. Safe from the loop's thread or any other thread."""
        policy = dataclasses.replace(self.policy, window_us=int(window_us))  # validates 0..MAX_WINDOW_US
        loop = self._loop
        if loop is None or loop.is_closed():
            self.policy = policy
            self._grouper.set_window(policy.window_us)
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._apply_window(policy)
        else:
            loop.call_soon_threadsafe(self._apply_window, policy)

    def _apply_window(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self._grouper.set_window(policy.window_us)
        if self._waker is not None:
            self._on_timer()  # a narrower window may have made an open batch due; re-arm on the new deadline

    async def submit(self, item: Tensors) -> dict[str, np.ndarray]:
        """Send one item (tensors without the batch axis); returns this item's outputs."""
        loop = self._loop = asyncio.get_running_loop()
        p = _Pending(dict(item), signature(item), loop.create_future(), self.clock())
        full = self._grouper.add(p, p.key, p.submitted)
        if full is not None:
            self._dispatch(full)
        self._arm(loop)
        try:
            return await p.future
        except asyncio.CancelledError:
            # Not yet sent: its row leaves the batch. Already sent: the batch goes on for the others.
            if self._grouper.remove(p, p.key):
                self._arm(loop)
            raise

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Two wake-ups at the earliest open batch's deadline, whichever comes first closes it (the other finds
        nothing due): the waker thread, exact to ~0.1 ms while the loop sleeps in its poll (whose timeout is whole
        milliseconds); and the loop's own timer, which a busy loop runs on its next pass, while the thread would
        first have to win the GIL from it (up to the interpreter's 5 ms switch interval). Both move only when the
        deadline does: an item joining an open batch wakes nothing."""
        deadline = self._grouper.deadline()
        if self._waker is None:
            self._waker = _Waker(loop, self._on_timer, self.clock)
        self._waker.set(deadline)
        if deadline != self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = (
                None if deadline is None else loop.call_at(loop.time() + (deadline - self.clock()), self._on_loop_timer)
            )

    def _on_loop_timer(self) -> None:
        self._timer = self._timer_at = None  # spent: the next _arm sets it again, on the same deadline if need be
        self._on_timer()

    def _on_timer(self) -> None:
        for batch in self._grouper.due(self.clock()):
            self._dispatch(batch)
        if self._waker is not None and self._loop is not None:
            self._arm(self._loop)

    def _dispatch(self, batch: list[_Pending]) -> None:
        live = [p for p in batch if not p.future.done()]
        if not live:
            return
        task = asyncio.get_running_loop().create_task(self._send(live))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Pending]) -> None:
        sent = self.clock()
        self.batches_sent += 1
        try:
            rows = split(await self.infer([p.item for p in batch]), len(batch))
        except Exception as e:  # noqa: BLE001 — the batch's own callers get whatever the request raised
            self._finish(batch, sent, error=e)
            return
        self._finish(batch, sent, rows=rows)

    def _finish(
        self,
        batch: list[_Pending],
        sent: float,
        *,
        rows: Optional[list[dict]] = None,
        error: Optional[BaseException] = None,
    ) -> None:
        done = self.clock()
        for i, p in enumerate(batch):
            ok = error is None
            if not p.future.done():
                if ok:
                    p.future.set_result(rows[i])  # type: ignore[index]
                else:
                    p.future.set_exception(error)  # type: ignore[arg-type]
            self.stats.add(RequestRecord(p.submitted, sent - p.submitted, done - p.submitted, len(batch), ok))

    async def flush(self) -> None:
        """Send every open batch now and wait for all batches in flight."""
        for batch in self._grouper.drain():
            self._dispatch(batch)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def __aenter__(self) -> "MicroBatcher":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._waker is not None:
            self._waker.close()
            self._waker = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None
        await self.flush()


class _Waker:
    """Calls ``callback`` in the loop when the clock reaches the deadline, to within ~0.1 ms.

    asyncio's own timers wake through epoll, whose timeout is rounded up to whole milliseconds: a 600 µs window
    would close after 1 ms or more. A thread waiting on a condition (futex, microsecond timeout) and waking the
    loop through ``call_soon_threadsafe`` keeps the window what it says.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None], clock: Callable[[], float]):
        self.loop, self.callback, self.clock = loop, callback, clock
        self.cond = threading.Condition()
        self.deadline: Optional[float] = None
        self.closed = False
        self.notified = 0  # times the thread was woken to wait for another deadline
        threading.Thread(target=self._run, name="microbatch-waker", daemon=True).start()

    def set(self, deadline: Optional[float]) -> None:
        """Wait for ``deadline`` now (None: for nothing); the thread is woken only when it changes."""
        with self.cond:
            if deadline == self.deadline:
                return
            self.deadline = deadline
            self.notified += 1
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()

    def _run(self) -> None:
        with self.cond:
            while not self.closed:
                if self.deadline is None:
                    self.cond.wait()
                    continue
                remaining = self.deadline - self.clock()
                if remaining > 0:
                    self.cond.wait(remaining)
                    continue
                self.deadline = None
                try:
                    self.loop.call_soon_threadsafe(self.callback)
                except RuntimeError:  # the loop is closed
                    return


# ---------------------------------------------------------------- Triton over gRPC


class TritonBatchInfer:
    """One batched inference request over Triton's gRPC API, on the channel of a ``tritonclient.grpc.aio`` client,
    serialized with one copy of the rows (``serving.triton_wire.batch_request``), the answer read by tritonclient's
    ``InferResult``; errors arrive as tritonclient's ``InferenceServerException``, as from ``client.infer``.

    Args:
      client: a ``tritonclient.grpc.aio.InferenceServerClient``.
      model: model name; ``outputs``: output names (default: all, from the model's metadata on first use).
    """

    def __init__(self, client: Any, model: str, outputs: Optional[list[str]] = None, version: str = ""):
        self.client, self.model, self.outputs, self.version = client, model, outputs, version
        self._call = triton_wire.model_infer(client._channel)

    async def __call__(self, items: Sequence[Tensors]) -> dict[str, np.ndarray]:
        import grpc

        if self.outputs is None:
            meta = await self.client.get_model_metadata(self.model, self.version, as_json=True)
            self.outputs = [o["name"] for o in meta["outputs"]]
        request = triton_wire.batch_request(self.model, items, self.outputs, self.version)
        try:
            response = await self._call(request)
        except grpc.RpcError as e:
            raise triton_wire.server_error(e) from None
        return triton_wire.outputs(response, self.outputs)
