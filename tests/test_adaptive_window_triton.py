"""The adaptive-window controller on a real Triton (pytriton wheel, CPU) under a load that changes.

Triton runs as the deployed one does: ``--model-control-mode=explicit --load-model=*`` and latency summaries on.
The controller reads p95 from Triton's ``nv_inference_request_summary_us`` and moves the window through the
model-control API. Short period and a narrow clamp keep the test quick: light load (one caller) first, the window
widens to the ceiling; then heavy load (48 callers against a model costing a + b·batch), it narrows to the floor.
"""

import asyncio
import json
import re
import threading
import time
import urllib.request

import numpy as np
import tritonclient.grpc.aio as grpcaio

from serving.adaptive_window import Controller, Triton, TritonP95, WindowPolicy, serve_metrics, served_window
from tests.servers.triton import free_port, triton_fixture, write_sleep_model

POLICY = WindowPolicy(
    target_p95_ms=15.0, step_us=50, period_s=3.0, min_us=250, max_us=350, hysteresis=0.1, min_requests=20
)


def standin(repo):
    model = write_sleep_model(
        repo, "standin", sleep_ms=3.0, max_batch_size=8, max_queue_delay_microseconds=300, dims=(4,)
    )
    cfg = model / "config.pbtxt"
    cfg.write_text(cfg.read_text() + 'parameters { key: "sleep_per_request_ms" value { string_value: "0.5" } }\n')


triton = triton_fixture(
    standin, extra_args=("--model-control-mode=explicit", "--load-model=*", "--metrics-config=summary_latencies=true")
)


class Load:
    """Closed-loop callers in a thread; ``callers`` can change while it runs."""

    def __init__(self, grpc_url: str, callers: int):
        self.grpc_url, self.callers = grpc_url, callers
        self.sent = self.errors = self.mismatches = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _worker(self, client, i):
        x = np.full((1, 4), i, np.float32)
        while not self.stop.is_set():
            if i >= self.callers:
                await asyncio.sleep(0.01)
                continue
            t = grpcaio.InferInput("INPUT0", [1, 4], "FP32")
            t.set_data_from_numpy(x)
            try:
                out = (await client.infer("standin", [t])).as_numpy("OUTPUT0")
                self.mismatches += int(not np.array_equal(out, x))
            except Exception:  # noqa: BLE001 — counted; the test asserts there are none
                self.errors += 1
            self.sent += 1
            if self.callers == 1:
                await asyncio.sleep(0.002)

    async def _main(self):
        client = grpcaio.InferenceServerClient(self.grpc_url)
        try:
            await asyncio.gather(*(self._worker(client, i) for i in range(48)))
        finally:
            await client.close()


def failures(triton):
    text = urllib.request.urlopen(triton.metrics_url + "/metrics").read().decode()
    m = re.search(r'^nv_inference_request_failure\{model="standin",version="1"\} (\S+)$', text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def test_window_follows_the_load_by_one_step_per_period_inside_the_clamp(triton):
    api = Triton(triton.http_url, triton.metrics_url)
    served_after = []  # (decision's window, what GET /v2/models/standin/config serves right after)

    def check(d):
        served_after.append((d.window_us, served_window(api.config(d.model))))

    controller = Controller(POLICY, ["standin"], TritonP95(api), api, on_decision=check)
    port = free_port()
    server = serve_metrics(controller, "127.0.0.1", port)
    failed_before = failures(triton)
    load = Load(triton.grpc_url, callers=1)
    load.thread.start()
    stop = threading.Event()
    runner = threading.Thread(target=controller.run, args=(stop,), daemon=True)
    t0 = time.time()
    runner.start()
    try:

        def wait_for(pred, timeout):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if pred():
                    return True
                time.sleep(0.05)
            return False

        at_ceiling = wait_for(lambda: any(d.action == "hold" and d.window_us == 350 for d in controller.decisions), 40)
        light = list(controller.decisions)
        load.callers = 48
        at_floor = wait_for(
            lambda: any(d.action == "hold" and d.window_us == 250 for d in controller.decisions[len(light) :]), 60
        )
        exported = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    finally:
        stop.set()
        runner.join(timeout=30)
        load.stop.set()
        load.thread.join(timeout=10)
        server.shutdown()
    heavy = controller.decisions[len(light) :]
    stamps = [d.at for d in controller.decisions]
    for d in controller.decisions:
        print(f"{d.action:6} {d.previous_us} -> {d.window_us} µs  p95 {d.p95_ms:.2f} ms  {d.requests} requests")
    print("decision times (s):", [round(s - t0, 1) for s in stamps], f"load: {load.sent} requests")
    assert at_ceiling and at_floor, [(d.action, d.window_us, round(d.p95_ms, 2)) for d in controller.decisions]

    # Every decision stays in the clamp and moves by exactly one step or not at all.
    assert all(POLICY.min_us <= d.window_us <= POLICY.max_us for d in controller.decisions)
    assert all(abs(d.window_us - d.previous_us) in (0, POLICY.step_us) for d in controller.decisions)
    assert [d.window_us for d in light if d.changed] == [350]
    assert [d.window_us for d in heavy if d.changed] == [300, 250]
    assert all(d.p95_ms < POLICY.target_p95_ms for d in light) and all(
        d.p95_ms > POLICY.target_p95_ms for d in heavy if d.changed
    )
    # One decision per period.
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert all(POLICY.period_s * 0.9 <= g <= POLICY.period_s * 1.5 for g in gaps), gaps
    # Triton serves what the controller decided, right after each decision, and at the end.
    assert served_after and all(want == got for want, got in served_after), served_after
    assert served_window(json.load(urllib.request.urlopen(triton.http_url + "/v2/models/standin/config"))) == 250
    # Reloading with a config override drops nothing.
    assert load.errors == 0 and load.mismatches == 0 and failures(triton) == failed_before
    # The decisions, as Prometheus reads them from the controller's /metrics.
    assert 'gpuhost_adaptive_window_us{model="standin"} 250' in exported
    assert 'gpuhost_adaptive_window_decisions_total{model="standin",action="widen"} 1' in exported
    assert 'gpuhost_adaptive_window_decisions_total{model="standin",action="narrow"} 2' in exported
