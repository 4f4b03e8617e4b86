"""Client micro-batching without a server: the pure grouping rules on tables, then the asyncio driver against an
in-process batch function (a stand-in for Triton so that error and cancellation timing can be forced; the real
Triton runs in test_microbatch_triton.py)."""

import asyncio
import threading

import numpy as np
import pytest

from serving.microbatch import (
    BatchPolicy,
    BatchShapeError,
    Grouper,
    LatencyStats,
    MicroBatcher,
    RequestRecord,
    signature,
    split,
    stack,
)


@pytest.fixture(autouse=True)
def _leave_an_event_loop():
    """asyncio.run() leaves the main thread without a current loop; Pulumi's mocks in later modules need one."""
    yield
    asyncio.set_event_loop(asyncio.new_event_loop())


def test_policy_keeps_seed_bounds():
    assert BatchPolicy() == BatchPolicy(window_us=600, max_batch=8)
    assert BatchPolicy(window_us=1500).window_us == 1500  # the adaptive window's ceiling (seed 004's clamp)
    with pytest.raises(ValueError, match="window_us: 1501 µs is outside 0..1500"):
        BatchPolicy(window_us=1501)
    with pytest.raises(ValueError, match="max_batch"):
        BatchPolicy(max_batch=0)


@pytest.mark.parametrize(
    "arrivals, policy, expected_full, expected_due",
    [
        # (item, key, t) ... ; batches closed by add (full) and by due(t=1.0)
        ([("a", "k", 0.0), ("b", "k", 0.0001), ("c", "k", 0.0002)], BatchPolicy(600, 2), [["a", "b"]], [["c"]]),
        ([("a", "k", 0.0), ("b", "x", 0.0001), ("c", "k", 0.0002)], BatchPolicy(600, 2), [["a", "c"]], [["b"]]),
        (
            [(str(i), "k", i * 1e-5) for i in range(17)],
            BatchPolicy(600, 8),
            [[str(i) for i in range(8)], [str(i) for i in range(8, 16)]],
            [["16"]],
        ),
        ([("a", "k", 0.0)], BatchPolicy(0, 8), [], [["a"]]),
    ],
)
def test_grouper_closes_batches_when_full_or_when_window_ends(arrivals, policy, expected_full, expected_due):
    g: Grouper[str] = Grouper(policy)
    full = [b for item, key, t in arrivals if (b := g.add(item, key, t)) is not None]
    assert full == expected_full
    assert g.due(now=1.0) == expected_due
    assert g.pending() == 0 and g.deadline() is None


def test_grouper_window_counts_from_first_item_and_remove_takes_an_item_back():
    g: Grouper[str] = Grouper(BatchPolicy(window_us=600, max_batch=8))
    g.add("a", "k", 10.0)
    g.add("b", "k", 10.0005)
    g.add("z", "other", 10.0003)
    assert g.deadline() == pytest.approx(10.0006)
    assert g.due(10.00059) == []
    assert g.remove("a", "k") and not g.remove("a", "k")
    assert g.due(10.0006) == [["b"]]  # the window of "k" opened with "a" at 10.0
    assert g.due(10.0009) == [["z"]]
    assert not g.remove("b", "k")


def test_stack_split_and_signature():
    items = [{"x": np.full(3, i, np.float32)} for i in range(4)]
    assert len({signature(i) for i in items}) == 1
    assert signature({"x": np.zeros(3, np.float32)}) != signature({"x": np.zeros(4, np.float32)})
    assert signature({"x": np.zeros(3, np.float32)}) != signature({"x": np.zeros(3, np.float64)})
    batch = stack(items)
    assert batch["x"].shape == (4, 3)
    rows = split({"y": batch["x"] * 2}, 4)
    assert [float(r["y"][0]) for r in rows] == [0.0, 2.0, 4.0, 6.0]
    with pytest.raises(BatchShapeError, match="expected 5 rows"):
        split({"y": batch["x"]}, 5)


def test_latency_stats_percentiles_and_batch_sizes():
    s = LatencyStats()
    for i in range(1, 101):
        s.add(
            RequestRecord(
                submitted=float(i), wait_s=0.0, latency_s=i / 1000, batch_size=8 if i <= 80 else 4, ok=i != 100
            )
        )
    assert s.p95_ms() == pytest.approx(95.0)
    assert s.p95_ms(since=91.0) == pytest.approx(99.0)
    assert s.batch_sizes() == {4: 20, 8: 80}


class FakeTriton:
    """Records each batch; doubles the input; fails any batch holding a NaN; can be held to force timing."""

    def __init__(self):
        self.batches: list[np.ndarray] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, items):
        x = stack(items)["x"]
        self.batches.append(x.copy())
        await self.gate.wait()
        if np.isnan(x).any():
            raise RuntimeError("model rejected a NaN")
        return {"y": x * 2}


def run(coro):
    return asyncio.run(coro)


def test_burst_is_grouped_by_eight_and_results_go_back_to_their_callers(measured):
    async def main():
        fake = FakeTriton()
        async with MicroBatcher(fake, BatchPolicy(window_us=600, max_batch=8)) as mb:
            outs = await asyncio.gather(*(mb.submit({"x": np.full(2, i, np.float32)}) for i in range(20)))
        return fake, mb, outs

    fake, mb, outs = run(main())
    assert [len(b) for b in fake.batches] == [8, 8, 4]
    assert [float(o["y"][0]) for o in outs] == [2.0 * i for i in range(20)]
    assert mb.stats.batch_sizes() == {4: 4, 8: 16}
    # The last 4 waited for the window (the one that opened their batch at least the whole window: the batch leaves
    # once its deadline is due); the full batches left at once. How long past the window they waited is the waker
    # thread's hand-off, which a busy machine stretches: measured, not bounded.
    waits = [r.wait_s for r in mb.stats.records]
    assert max(waits) >= 0.0006
    measured(f"window 600 us, the open batch of 4 left after {max(waits) * 1e3:.3f} ms")


def test_items_joining_an_open_batch_do_not_wake_the_waker_thread():
    """The waker thread is woken when the earliest deadline moves (a batch opens, a batch leaves), not per item:
    each wake-up is a thread that must win the GIL from the busy loop."""

    async def main():
        fake = FakeTriton()
        async with MicroBatcher(fake, BatchPolicy(window_us=1500, max_batch=16)) as mb:
            tasks = [asyncio.ensure_future(mb.submit({"x": np.full(2, i, np.float32)})) for i in range(12)]
            # One pass of the loop runs the 12 submits (their tasks were scheduled before this one) and then this
            # coroutine, before any timer or the waker thread's callback can run: the 12 items are in one open batch
            # here, whatever the machine's speed, and what woke the thread so far is what joining it cost.
            await asyncio.sleep(0)
            joined = mb._waker.notified if mb._waker else -1
            sent_yet = len(fake.batches)
            outs = await asyncio.gather(*tasks)
            notified = mb._waker.notified if mb._waker else -1
        return fake, outs, joined, sent_yet, notified

    fake, outs, joined, sent_yet, notified = run(main())
    assert [len(b) for b in fake.batches] == [12]
    assert [float(o["y"][0]) for o in outs] == [2.0 * i for i in range(12)]
    assert sent_yet == 0 and joined == 1  # the batch opened once; the 11 items joining it woke nothing
    # Then the batch left: on the thread's own wake-up (nothing more to notify), or on the loop's timer (which the
    # thread is told of), whichever came first.
    assert notified >= 1


def test_the_window_closes_on_the_loops_own_timer_when_the_waker_thread_cannot_run(monkeypatch):
    """A waker thread that never fires (as one that cannot get the GIL from a busy loop for a while): the loop's
    own timer closes the window; on the thread alone the caller waited for ever."""
    import serving.microbatch as microbatch

    class StuckWaker:
        def __init__(self, *args):
            self.notified = 0

        def set(self, deadline):
            pass

        def close(self):
            pass

    monkeypatch.setattr(microbatch, "_Waker", StuckWaker)

    async def main():
        fake = FakeTriton()
        async with MicroBatcher(fake, BatchPolicy(window_us=1500, max_batch=8)) as mb:
            first = await asyncio.wait_for(mb.submit({"x": np.ones(2, np.float32)}), 5)
            second = await asyncio.wait_for(mb.submit({"x": np.full(2, 3, np.float32)}), 5)
        return first, second, mb

    first, second, mb = run(main())
    assert first["y"].tolist() == [2.0, 2.0] and second["y"].tolist() == [6.0, 6.0]
    assert all(r.wait_s >= 0.0015 for r in mb.stats.records)  # the window was kept, not cut short


def test_an_error_reaches_only_the_callers_of_the_failed_batch():
    async def main():
        fake = FakeTriton()
        async with MicroBatcher(fake, BatchPolicy(window_us=600, max_batch=4)) as mb:
            values = [0, 1, 2, 3, 4, np.nan, 6, 7, 8]  # the NaN sits in the second batch
            results = await asyncio.gather(
                *(mb.submit({"x": np.full(1, v, np.float32)}) for v in values), return_exceptions=True
            )
        return results

    results = run(main())
    failed = [i for i, r in enumerate(results) if isinstance(r, Exception)]
    assert failed == [4, 5, 6, 7]
    assert all("NaN" in str(results[i]) for i in failed)
    assert [float(results[i]["y"][0]) for i in (0, 1, 2, 3, 8)] == [0.0, 2.0, 4.0, 6.0, 16.0]


def test_items_that_cannot_be_stacked_go_in_their_own_batch():
    async def main():
        fake = FakeTriton()
        async with MicroBatcher(fake, BatchPolicy(window_us=600, max_batch=8)) as mb:
            items = [{"x": np.ones(2, np.float32)}, {"x": np.ones(3, np.float32)}, {"x": np.ones(2, np.float32)}]
            outs = await asyncio.gather(*(mb.submit(i) for i in items))
        return fake, outs

    fake, outs = run(main())
    assert sorted(b.shape for b in fake.batches) == [(1, 3), (2, 2)]
    assert [o["y"].shape for o in outs] == [(2,), (3,), (2,)]


def test_a_caller_cancelled_in_the_window_leaves_the_batch_and_the_others_are_served():
    async def main():
        fake = FakeTriton()
        async with MicroBatcher(fake, BatchPolicy(window_us=1000, max_batch=8)) as mb:
            tasks = [asyncio.create_task(mb.submit({"x": np.full(1, i, np.float32)})) for i in range(3)]
            await asyncio.sleep(0)  # all three are pending in the window
            tasks[1].cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
        return fake, done

    fake, done = run(main())
    assert [b[:, 0].tolist() for b in fake.batches] == [[0.0, 2.0]]  # item 1 was never sent
    assert isinstance(done[1], asyncio.CancelledError)
    assert float(done[0]["y"][0]) == 0.0 and float(done[2]["y"][0]) == 4.0


def test_a_caller_cancelled_after_sending_does_not_disturb_its_batch():
    async def main():
        fake = FakeTriton()
        fake.gate.clear()
        async with MicroBatcher(fake, BatchPolicy(window_us=100, max_batch=8)) as mb:
            tasks = [asyncio.create_task(mb.submit({"x": np.full(1, i, np.float32)})) for i in range(3)]
            while not fake.batches:
                await asyncio.sleep(0.001)
            tasks[0].cancel()
            await asyncio.sleep(0)
            fake.gate.set()
            done = await asyncio.gather(*tasks, return_exceptions=True)
        return fake, mb, done

    fake, mb, done = run(main())
    assert len(fake.batches) == 1 and len(fake.batches[0]) == 3
    assert isinstance(done[0], asyncio.CancelledError)
    assert [float(d["y"][0]) for d in done[1:]] == [2.0, 4.0]
    assert len(mb.stats.records) == 3


def test_grouper_window_change_applies_to_open_batches():
    g: Grouper[str] = Grouper(BatchPolicy(window_us=1000, max_batch=8))
    g.add("a", key="k", now=0.0)
    assert g.deadline() == pytest.approx(0.001)
    g.set_window(200)
    assert g.deadline() == pytest.approx(0.0002) and g.policy.window_us == 200
    assert g.due(now=0.0002) == [["a"]]
    g.set_window(1500)
    g.add("b", key="k", now=1.0)
    assert g.due(now=1.0014) == [] and g.due(now=1.0015) == [["b"]]


def test_window_moves_at_runtime_from_another_thread_without_losing_a_caller():
    async def main():
        fake = FakeTriton()
        async with MicroBatcher(fake, BatchPolicy(window_us=1500, max_batch=8)) as mb:
            first = [asyncio.create_task(mb.submit({"x": np.full(1, i, np.float32)})) for i in range(2)]
            await asyncio.sleep(0)  # both pending in the open window
            t = threading.Thread(target=mb.set_window, args=(200,))  # as a controller thread would
            t.start()
            t.join()
            done = await asyncio.gather(*first)
            assert mb.window_us == 200 and mb.policy == BatchPolicy(window_us=200, max_batch=8)
            with pytest.raises(ValueError, match="window_us: 5000 µs is outside"):
                mb.set_window(5000)
            assert mb.window_us == 200
            mb.set_window(300)  # from the loop itself: applied at once
            assert mb._grouper.window_s == pytest.approx(0.0003)
            second = await asyncio.gather(*(mb.submit({"x": np.full(1, 10 + i, np.float32)}) for i in range(3)))
        return fake, done, second

    fake, done, second = run(main())
    assert [b[:, 0].tolist() for b in fake.batches] == [[0.0, 1.0], [10.0, 11.0, 12.0]]
    assert [float(d["y"][0]) for d in done] == [0.0, 2.0]
    assert [float(d["y"][0]) for d in second] == [20.0, 22.0, 24.0]
