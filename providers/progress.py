"""Progress lines for long steps (a reboot wait, an initramfs rebuild, a model load, a gate's load), on stderr.

Why stderr: a dynamic provider cannot write to the engine's log (`pulumi.log` from a dynamic provider is not shown,
pulumi#6065), but the engine reads each line a provider plugin writes to its stderr and shows it in `pulumi up` and
`pulumi preview`: pulumi/pulumi sdk/go/common/resource/plugin/plugin.go (read at 1b5949891b), `newPlugin` starts
`runtrace` on the plugin's stderr before anything else, and for the dynamic provider binaries
(`isDynamicPluginBinary`: pulumi-resource-pulumi-python / -nodejs) each non-blank line goes to `ctx.Diag.Infoerrf`
as a stream message without a URN, which the display attaches to the stack's row (pkg/backend/display/progress.go,
`processNormalEvent`). Other resource plugins' output is hidden (Debugf); ours is not. gpuhost's driver
(tools/driver) forwards the same lines to its display.

One line per tick, flushed, at most every `interval` seconds (5, or `GPUHOST_PROGRESS_INTERVAL_S` in the provider's
environment: a CI log may want fewer lines, a test more); nothing at all for a step done within the first interval; a
closing "done after" line only for a step that ticked. No thread or stream is kept on a provider (it
is pickled into state): the ticker lives for one `with` block.

Usage::

    with ticking("gpu-a-reboot", "gpu-a to come back from its reboot (a new boot id, units started)", 900):
        wait_for_new_boot(spec, old, 900)
    # stderr, every 5 s:  gpuhost: gpu-a-reboot: waiting for gpu-a to come back ...: 35 s of 900 s
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Optional

PREFIX = "gpuhost"
INTERVAL = 5.0
INTERVAL_ENV = "GPUHOST_PROGRESS_INTERVAL_S"
_WRITE_LOCK = threading.Lock()

# Commands that make a host change long, and how a progress line names them.
SLOW_COMMANDS = {
    "update-initramfs": "the initramfs rebuild (update-initramfs)",
    "dracut": "the initramfs rebuild (dracut)",
    "update-grub": "the boot loader config (update-grub)",
    "grub2-mkconfig": "the boot loader config (grub2-mkconfig)",
    "grubby": "the kernel entries' arguments (grubby)",
}


def progress_line(label: str, what: str, elapsed: float, bound: float) -> str:
    """One tick's line.

    >>> progress_line("gpu-a-reboot", "gpu-a to come back", 35.4, 900)
    'gpuhost: gpu-a-reboot: waiting for gpu-a to come back: 35 s of 900 s'
    """
    return f"{PREFIX}: {label}: waiting for {what}: {elapsed:.0f} s of {bound:.0f} s"


def done_line(label: str, what: str, elapsed: float) -> str:
    """The closing line of a step that ticked.

    >>> done_line("gpu-a-reboot", "gpu-a to come back", 41.2)
    'gpuhost: gpu-a-reboot: done waiting for gpu-a to come back after 41 s'
    """
    return f"{PREFIX}: {label}: done waiting for {what} after {elapsed:.0f} s"


def resource_label(owner_tag: Optional[str], fallback: str) -> str:
    """The resource's name from its `owner_tag` ("<stack>/<resource>").

    >>> resource_label("dev/gpu-a-reboot", "gpu-a")
    'gpu-a-reboot'
    """
    return (owner_tag or "").rpartition("/")[2] or fallback


def change_what(host: str, script: str) -> Optional[str]:
    """What a host change's progress line waits for: the slow commands its script runs (None: none, no ticking).

    >>> change_what("gpu-a", "set -e\\nupdate-initramfs -u -k all >/dev/null 2>&1")
    'gpu-a to finish the initramfs rebuild (update-initramfs), under the host lock'
    """
    words = {w.strip("'\"") for w in script.split()}
    slow = [name for cmd, name in SLOW_COMMANDS.items() if cmd in words]
    return f"{host} to finish {' and '.join(slow)}, under the host lock" if slow else None


class Ticker:
    """When a tick is due, and its line (pure: the clock is injected).

    >>> now = [0.0]
    >>> t = Ticker("svc-gate", "yolov8n to be ready", 300, clock=lambda: now[0])
    >>> now[0] = 4.9; t.due() is None
    True
    >>> now[0] = 5.0; t.due()
    'gpuhost: svc-gate: waiting for yolov8n to be ready: 5 s of 300 s'
    """

    def __init__(
        self,
        label: str,
        what: str,
        bound: float,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.label, self.what, self.bound, self.interval, self.clock = label, what, bound, interval, clock
        self.start = clock()
        self.next = self.start + interval
        self.ticks = 0

    def due(self) -> Optional[str]:
        now = self.clock()
        if now < self.next:
            return None
        # A late wake-up (a loaded runner) gives one line, not a burst of the ones missed.
        while self.next <= now:
            self.next += self.interval
        self.ticks += 1
        return progress_line(self.label, self.what, now - self.start, self.bound)

    def wait_s(self) -> float:
        return max(0.0, self.next - self.clock())

    def done(self) -> Optional[str]:
        return done_line(self.label, self.what, self.clock() - self.start) if self.ticks else None


def interval_s(environ: Optional[dict[str, str]] = None) -> tuple[float, Optional[str]]:
    """The tick from `GPUHOST_PROGRESS_INTERVAL_S` (default 5 s), and a line saying why a bad value is not used: a
    long step is already under way when it ticks (a reboot issued), so a typo must not fail it.

    >>> interval_s({"GPUHOST_PROGRESS_INTERVAL_S": "1"})
    (1.0, None)
    >>> interval_s({"GPUHOST_PROGRESS_INTERVAL_S": "soon"})[1]
    "gpuhost: GPUHOST_PROGRESS_INTERVAL_S='soon' is not a positive number of seconds: progress every 5 s"
    """
    raw = (os.environ if environ is None else environ).get(INTERVAL_ENV, "").strip()
    if not raw:
        return INTERVAL, None
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if 0 < value < float("inf"):
        return value, None
    return (
        INTERVAL,
        f"{PREFIX}: {INTERVAL_ENV}={raw!r} is not a positive number of seconds: progress every {INTERVAL:g} s",
    )


def write_stderr(line: str) -> None:
    """One whole line, flushed: the engine reads the plugin's stderr line by line, from every resource's thread."""
    with _WRITE_LOCK:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


@contextmanager
def ticking(
    label: str,
    what: str,
    bound: float,
    *,
    interval: Optional[float] = None,
    clock: Callable[[], float] = time.monotonic,
    write: Callable[[str], None] = write_stderr,
) -> Iterator[Ticker]:
    """Say every `interval` seconds (default: `interval_s()`), while the block runs, that `label` waits for `what`
    (elapsed of `bound`)."""
    if interval is None:
        interval, bad = interval_s()
        if bad:
            write(bad)
    t = Ticker(label, what, bound, interval, clock)
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(t.wait_s()):
            line = t.due()
            if line:
                write(line)

    th = threading.Thread(target=loop, name=f"progress {label}", daemon=True)
    th.start()
    ok = False
    try:
        yield t
        ok = True
    finally:
        stop.set()
        th.join()
        end = t.done() if ok else None
        if end:
            write(end)
