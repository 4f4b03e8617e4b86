"""The adaptive window in process: gpuhost's micro-batcher against a real Triton (pytriton wheel, CPU), its window
moved at runtime by the controller under a load that changes, with nothing dropped and no model reload.

Triton runs as the deployed one does (``--model-control-mode=explicit --load-model=*``, latency summaries on), so a
reload would be possible: the test shows none happens (Triton's log of model loads and its served config are
unchanged). The stand-in model costs a + b·batch and echoes its input: every caller's answer is compared with its
own input. Light load (one caller) first: p95 far under the target, the window widens to the ceiling; then heavy
load (48 callers), p95 over the target, it narrows to the floor. Short period and a narrow clamp keep it quick.
"""

import asyncio
import dataclasses
import json
import re
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio

from serving.adaptive_window import WindowPolicy, decide, in_process, serve_metrics
from serving.microbatch import BatchPolicy, MicroBatcher, TritonBatchInfer
from testbed.servers.triton import free_port, triton_fixture, write_sleep_model

# The seed's rule alone (widen_min_per_batch=1): the light phase's one caller never batches, and this test is about
# the window moving both ways in process; the batching condition is tested on its own in test_adaptive_window.py.
POLICY = WindowPolicy(
    target_p95_ms=40.0, step_us=100, period_s=2.0, min_us=400, max_us=600, min_requests=20, widen_min_per_batch=1
)


def standin(repo):
    model = write_sleep_model(
        repo, "standin", sleep_ms=3.0, max_batch_size=8, max_queue_delay_microseconds=300, dims=(4,)
    )
    cfg = model / "config.pbtxt"
    cfg.write_text(cfg.read_text() + 'parameters { key: "sleep_per_request_ms" value { string_value: "1.0" } }\n')


triton = triton_fixture(
    standin, extra_args=("--model-control-mode=explicit", "--load-model=*", "--metrics-config=summary_latencies=true")
)


@pytest.fixture(autouse=True)
def _leave_an_event_loop():
    """asyncio.run() leaves the thread without a current loop; Pulumi's mocks in later modules need one."""
    yield
    asyncio.set_event_loop(asyncio.new_event_loop())


class Client:
    """A client process's event loop in a thread: callers → MicroBatcher → Triton, and the controller in the same
    loop. ``callers`` can change while it runs."""

    def __init__(self, grpc_url: str, callers: int, policy: WindowPolicy):
        self.grpc_url, self.callers, self.policy = grpc_url, callers, policy
        self.sent = self.errors = self.mismatches = 0
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _caller(self, i):
        rng = np.random.default_rng(i)
        while not self.stop.is_set():
            if i >= self.callers:
                await asyncio.sleep(0.01)
                continue
            x = rng.random(4, dtype=np.float32) + i  # distinct per request
            try:
                out = (await self.mb.submit({"INPUT0": x}))["OUTPUT0"]
                self.mismatches += int(not np.array_equal(out, x))
            except Exception:  # noqa: BLE001 — counted; the test asserts there are none
                self.errors += 1
            self.sent += 1
            if self.callers == 1:
                await asyncio.sleep(0.002)

    async def _main(self):
        client = grpcaio.InferenceServerClient(self.grpc_url)
        try:
            infer = TritonBatchInfer(client, "standin", outputs=["OUTPUT0"])
            async with MicroBatcher(infer, BatchPolicy(window_us=500, max_batch=8)) as self.mb:
                self.controller = in_process({"standin": self.mb}, self.policy)
                control = asyncio.ensure_future(self.controller.run_async())
                self.ready.set()
                await asyncio.gather(*(self._caller(i) for i in range(96)))
                control.cancel()
        finally:
            await client.close()


def triton_state(triton):
    """(model loads in Triton's log, the window Triton serves, Triton's failure counter)."""
    loads = len(re.findall(r"successfully loaded 'standin'", triton.log(), re.IGNORECASE))
    config = json.load(urllib.request.urlopen(triton.http_url + "/v2/models/standin/config", timeout=5))
    text = urllib.request.urlopen(triton.metrics_url + "/metrics", timeout=5).read().decode()
    m = re.search(r'^nv_inference_request_failure\{model="standin",version="1"\} (\S+)$', text, re.MULTILINE)
    return loads, config["dynamic_batching"]["max_queue_delay_microseconds"], float(m.group(1)) if m else 0.0


def wait_for(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_window_moves_in_process_under_load_with_nothing_dropped_and_no_reload(triton):
    before = triton_state(triton)
    assert before[0] >= 1  # the pattern does match Triton's load line
    client = Client(triton.grpc_url, callers=1, policy=POLICY)
    client.thread.start()
    assert client.ready.wait(30)
    controller, mb = client.controller, client.mb
    port = free_port()
    server = serve_metrics(controller, "127.0.0.1", port)
    windows_seen = set()

    def held_at(window_us, since):
        windows_seen.add(mb.window_us)  # what the micro-batcher itself runs on, sampled
        return any(d.action == "hold" and d.window_us == window_us for d in controller.decisions[since:])

    try:
        at_ceiling = wait_for(lambda: held_at(600, 0), 40)
        light = list(controller.decisions)
        client.callers = 96
        at_floor = wait_for(lambda: held_at(400, len(light)), 60)
        while True:  # a /metrics read with no decision taken during it, to compare counts exactly
            n = len(controller.decisions)
            exported = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            if len(controller.decisions) == n:
                break
        exported_decisions = controller.decisions[:n]
    finally:
        client.stop.set()
        client.thread.join(timeout=30)
        server.shutdown()
    after = triton_state(triton)
    heavy = controller.decisions[len(light) :]
    for d in controller.decisions:
        print(f"{d.action:6} {d.previous_us} -> {d.window_us} µs  p95 {d.p95_ms:.2f} ms  {d.requests} requests")
    print(f"load: {client.sent} requests, batch sizes {mb.stats.batch_sizes()}")
    assert at_ceiling and at_floor, [(d.action, d.window_us, round(d.p95_ms, 2)) for d in controller.decisions]

    # The rule: in the clamp, one step or none per period; widen under the band, narrow over the target.
    assert all(POLICY.min_us <= d.window_us <= POLICY.max_us for d in controller.decisions)
    assert all(abs(d.window_us - d.previous_us) in (0, POLICY.step_us) for d in controller.decisions)
    # Each decision is the seed's rule applied to the p95 the client measured in that period (the light phase's
    # p95 moves with the shared machine's load, so the path to the ceiling is not fixed; the rule is).
    assert all(
        d == dataclasses.replace(decide(POLICY, "standin", d.previous_us, d.p95_ms, d.requests, d.per_batch), at=d.at)
        for d in controller.decisions
    )
    assert light[-1].window_us == 600 and [d.window_us for d in heavy if d.changed] == [500, 400]
    assert all(d.p95_ms > POLICY.target_p95_ms for d in heavy if d.changed)
    # The micro-batcher itself ran on each window the controller set, and ends on the floor.
    assert {500, 600, 400} <= windows_seen and mb.window_us == 400 and mb.policy.window_us == 400
    # Nothing dropped or failed, every answer its caller's own, no model reload, Triton's own window untouched.
    assert client.sent > 200 and client.errors == 0 and client.mismatches == 0
    assert all(r.ok for r in mb.stats.records)
    assert after == before, (before, after)
    # The decisions as Prometheus reads them from the client's /metrics.
    assert 'gpuhost_adaptive_window_us{model="standin"} 400' in exported
    assert 'gpuhost_adaptive_window_target_p95_ms{model="standin"} 40' in exported
    counts = {a: sum(d.action == a for d in exported_decisions) for a in ("widen", "narrow", "hold")}
    for action, n in counts.items():
        assert f'gpuhost_adaptive_window_decisions_total{{model="standin",action="{action}"}} {n}' in exported
    assert re.search(r'^gpuhost_adaptive_window_p95_ms\{model="standin"\} [0-9.]+$', exported, re.MULTILINE)
