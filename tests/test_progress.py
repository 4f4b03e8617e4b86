"""Progress lines of long steps (providers/progress.py): the lines and the ticking, pure on an injected clock; then a
gate's model-load wait, in the provider process the driver starts, showing its line in the driver's display."""

from __future__ import annotations

import http.server
import threading
import time

import pytest
from pulumi.dynamic.dynamic import serialize_provider

from providers.progress import (
    INTERVAL_ENV,
    Ticker,
    change_what,
    done_line,
    interval_s,
    progress_line,
    resource_label,
    ticking,
)
from providers.triton_gate import AcceptanceGateProvider
from tools.driver.config import StackConfig
from tools.driver.provider import DynamicProvider
from tools.driver.values import ROOT


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_says_who_waits_for_what_the_elapsed_time_and_the_bound():
    line = progress_line("gpu-a-reboot", "gpu-a to come back from its reboot", 35.4, 900)
    assert line == "gpuhost: gpu-a-reboot: waiting for gpu-a to come back from its reboot: 35 s of 900 s"
    assert (
        done_line("svc-gate", "yolov8n to be ready", 41.6)
        == "gpuhost: svc-gate: done waiting for yolov8n to be ready after 42 s"
    )


def test_the_label_is_the_resource_name_from_the_owner_tag():
    assert resource_label("dev/gpu-a-vfio", "gpu-a") == "gpu-a-vfio"
    assert resource_label(None, "gate-yolov8n") == "gate-yolov8n"


def test_a_change_ticks_only_for_the_slow_commands_it_runs():
    script = "set -e\nupdate-grub >/dev/null 2>&1 || exit 1\nupdate-initramfs -u -k all >/dev/null 2>&1"
    assert change_what("gpu-a", script) == (
        "gpu-a to finish the initramfs rebuild (update-initramfs) and the boot loader config (update-grub), "
        "under the host lock"
    )
    assert change_what("gpu-a", "set -e\nsysctl -w vm.swappiness=10") is None
    # a path that merely names the tool is not the tool running
    assert change_what("gpu-a", "cat /etc/default/update-grub.conf") is None


def test_a_tick_is_due_every_interval_and_a_late_wake_up_gives_one_line_not_a_burst():
    clock = Clock()
    t = Ticker("gpu-a-reboot", "gpu-a to come back", 900, interval=5, clock=clock)
    clock.now += 4.9
    assert t.due() is None and t.wait_s() == pytest.approx(0.1)
    clock.now += 0.1
    assert t.due() == "gpuhost: gpu-a-reboot: waiting for gpu-a to come back: 5 s of 900 s"
    clock.now += 2
    assert t.due() is None
    clock.now += 16  # 23 s: the ticks at 10, 15 and 20 s were missed
    assert t.due() == "gpuhost: gpu-a-reboot: waiting for gpu-a to come back: 23 s of 900 s"
    assert t.due() is None and t.wait_s() == pytest.approx(2)
    assert t.done() == "gpuhost: gpu-a-reboot: done waiting for gpu-a to come back after 23 s"


def test_a_step_done_within_the_first_interval_says_nothing():
    lines: list[str] = []
    with ticking("gpu-a-vfio", "gpu-a to finish", 900, interval=60, write=lines.append):
        pass
    assert lines == [] and Ticker("x", "y", 1, clock=Clock()).done() is None


def test_a_ticking_step_writes_its_lines_then_done_and_a_failed_one_no_done():
    lines: list[str] = []
    first = threading.Event()

    def write(line: str) -> None:
        lines.append(line)
        first.set()

    with ticking("svc-gate", "yolov8n to be ready", 300, interval=0.01, write=write):
        assert first.wait(30)
    assert lines[0].startswith("gpuhost: svc-gate: waiting for yolov8n to be ready: ")
    assert lines[0].endswith(" s of 300 s")
    assert lines[-1].startswith("gpuhost: svc-gate: done waiting for yolov8n to be ready after ")

    lines.clear()
    first.clear()
    with pytest.raises(RuntimeError):
        with ticking("svc-gate", "yolov8n to be ready", 300, interval=0.01, write=write):
            assert first.wait(30)
            raise RuntimeError("not ready")
    assert lines and not any("done" in ln for ln in lines)


def test_the_tick_comes_from_the_environment_and_a_bad_value_is_said_and_not_used(monkeypatch):
    assert interval_s({}) == (5.0, None)
    assert interval_s({INTERVAL_ENV: " 0.5 "}) == (0.5, None)
    for bad in ("0", "-1", "soon", "inf", "nan"):
        value, why = interval_s({INTERVAL_ENV: bad})
        assert value == 5.0 and why == (
            f"gpuhost: {INTERVAL_ENV}={bad!r} is not a positive number of seconds: progress every 5 s"
        )

    lines: list[str] = []
    first = threading.Event()

    def write(line: str) -> None:
        lines.append(line)
        first.set()

    monkeypatch.setenv(INTERVAL_ENV, "0.01")
    with ticking("gpu-a-reboot", "gpu-a to come back", 900, write=write) as t:
        assert t.interval == 0.01
        assert first.wait(30)
    assert lines[0].startswith("gpuhost: gpu-a-reboot: waiting for gpu-a to come back: ")
    monkeypatch.setenv(INTERVAL_ENV, "soon")
    lines.clear()
    with ticking("gpu-a-reboot", "gpu-a to come back", 900, write=lines.append) as t:
        assert t.interval == 5.0
    assert lines == [interval_s({INTERVAL_ENV: "soon"})[1]]


class SlowTriton(http.server.BaseHTTPRequestHandler):
    """Not ready until LOAD_S after the first readiness probe (a model loading), then 200 for everything."""

    LOAD_S = 12.0  # the first line is due at 5 s: 7 s of margin for a busy machine
    first: list[float] = []

    def _answer(self) -> None:
        if not self.first:
            self.first.append(time.monotonic())
        ready = time.monotonic() - self.first[0] >= self.LOAD_S
        self.send_response(200 if ready or not self.path.endswith("/ready") else 503)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def slow_triton():
    SlowTriton.first = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowTriton)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_a_gate_waiting_for_its_model_shows_progress_in_the_driver_s_display(slow_triton):
    """The gate's provider in `python -m pulumi.dynamic`, started by the driver as the engine starts it: the line the
    health gate writes while the model loads reaches the driver's display callback as it arrives."""
    seen: list[str] = []
    prov = DynamicProvider(ROOT, "gpuhost", StackConfig({}), seen.append).start()
    try:
        inputs = {
            "__provider": serialize_provider(AcceptanceGateProvider()),
            "owner_tag": "dev/svc-m-gate",
            "url": slow_triton,
            "models": ["m"],
            "model": "m",
            "body": "{}",
            "ready_timeout_s": 60,
            "check_outputs": False,
            "tool": "python",
            "concurrency": 1,
            "duration_s": 0.3,
            "max_requests": 20,
            "warmup_requests": 1,
        }
        _id, outs = prov.create("urn:pulumi:dev::gpuhost::gpuhost:serving:AcceptanceGate::svc-m-gate", inputs)
    finally:
        prov.stop()
    assert outs["result"]["requests"] > 0
    wait = (
        f"gpuhost: svc-m-gate: waiting for m to be ready at {slow_triton} (/v2/health/ready and each model's ready): "
    )
    assert any(ln.startswith(wait) and ln.endswith(" s of 60 s") for ln in seen), seen
    assert any(ln.startswith("gpuhost: svc-m-gate: done waiting for m to be ready at ") for ln in seen), seen
