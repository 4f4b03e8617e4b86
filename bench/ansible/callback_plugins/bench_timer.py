"""bench_timer: records each task's wall time and result for bench/run.py (writes JSON to $BENCH_TIMER_OUT).

Enabled only by the benchmark (ANSIBLE_CALLBACKS_ENABLED=bench_timer); it prints nothing, so the operator's normal
output and recap are unchanged.
"""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: bench_timer
    type: aggregate
    short_description: per-task wall times and results as JSON for gpuhost's benchmark
    description: writes $BENCH_TIMER_OUT at the end of the play
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "bench_timer"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.t0 = time.monotonic()
        self.tasks: list[dict] = []

    def _start(self, task, handler=False):
        self.tasks.append(
            {
                "name": task.get_name(),
                "action": task.action,
                "handler": handler,
                "start": time.monotonic() - self.t0,
                "end": None,
                "status": None,
                "changed": False,
            }
        )

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._start(task)

    def v2_playbook_on_handler_task_start(self, task):
        self._start(task, handler=True)

    def _result(self, result, status):
        if not self.tasks:
            return
        t = self.tasks[-1]
        t["end"] = time.monotonic() - self.t0
        t["status"] = status
        t["changed"] = t["changed"] or bool(result._result.get("changed"))

    def v2_runner_on_ok(self, result):
        self._result(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._result(result, "failed")

    def v2_runner_on_skipped(self, result):
        self._result(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._result(result, "unreachable")

    def v2_playbook_on_stats(self, stats):
        hosts = sorted(stats.processed.keys())
        out = {
            "total_s": time.monotonic() - self.t0,
            "tasks": self.tasks,
            "stats": {h: stats.summarize(h) for h in hosts},
        }
        path = os.environ.get("BENCH_TIMER_OUT")
        if path:
            with open(path, "w") as f:
                json.dump(out, f, indent=1)
