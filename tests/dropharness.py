"""The drop itself, for the dropped-connection cases on the emulated server (tests/test_*state*_testhost.py).

A test hook on the host (the `date` of a locked change's epilogue, or a libvirt qemu hook) touches
/run/gpuhost-drop-now and sleeps while the provider's first apply waits for its result; `drop_first_apply` runs that
apply in a thread, waits for the marker, lets the test look at the changed host, kills every SSH session of the
test's user, ends the hook's sleep (so the epilogue finishes on the host as after a real drop, and no lock is held
through the re-run), and hands back what the test saw and the apply's error.

Usage::

    changed, errors = drop_first_apply(testhost, r, inputs, observe=lambda: snapshot(...), wait_s=240)
"""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

from testbed.provider_server import ProviderError

T = TypeVar("T")
MARKERS = "/run/gpuhost-drop-armed /run/gpuhost-drop-now"


def drop_first_apply(
    testhost,
    resource,
    inputs: dict,
    *,
    observe: Callable[[], T],
    wait_s: float,
    hold: str = "sleep 90",
    reached: str = "the change never reached its epilogue",
    join_s: float = 180,
) -> tuple[T, list[BaseException]]:
    """Arm the hook, run `resource.up(inputs)` in a thread, wait (≤ `wait_s`) for the hook's marker, call `observe`
    (the changed host), drop every SSH session, end the hook's `hold` command; returns (what `observe` returned,
    the first apply's errors). The first apply must have failed with a ProviderError and left no state."""
    testhost.ssh("rm -f /run/gpuhost-drop-now; touch /run/gpuhost-drop-armed")
    errors: list[BaseException] = []

    def first_apply():
        try:
            resource.up(inputs)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            errors.append(e)

    t = threading.Thread(target=first_apply)
    t.start()
    deadline = time.monotonic() + wait_s
    while testhost.ssh("test -e /run/gpuhost-drop-now", check=False).rc != 0:
        assert time.monotonic() < deadline and t.is_alive(), f"{reached}: {errors}"
        time.sleep(0.3)
    seen = observe()
    # The drop: every SSH session dies. Then the hook's wait ends, so the host finishes what it was doing (as it
    # would after a real drop) and releases the lock instead of holding it for the re-run's whole wait.
    testhost.ssh(
        f'nohup sh -c \'sleep 0.2; pkill -KILL -f "^sshd: gpuadmin"; sleep 1; pkill -KILL -f "^{hold}$"\' '
        ">/dev/null 2>&1 &",
        check=False,
    )
    t.join(join_s)
    assert not t.is_alive(), "the dropped apply hangs"
    testhost.wait_ssh(120)
    # the hold, should the kill have missed it, lets go of the host lock now
    testhost.ssh(f"pkill -f '^{hold}$' || true; rm -f {MARKERS}")
    assert errors and isinstance(errors[0], ProviderError), errors
    assert resource.id is None  # no state: the re-run is a create
    return seen, errors


def assert_no_records(testhost, owner: str) -> None:
    """The resource's records on the host (pristine/) are gone with it, and no directory of the store is left
    empty (forgetting the last record under one removes it)."""
    left = testhost.ssh(
        f"grep -rl '{owner}' /var/lib/gpuhost/pristine 2>/dev/null; find /var/lib/gpuhost -type d -empty 2>/dev/null; true"
    ).stdout
    assert left.strip() == "", left


def undo(testhost, resource, server) -> None:
    """After a case, passed or failed: a resource still in state is destroyed (a failed assertion must not leave
    the shared host changed for the next tests), the `date` hook and the markers go, the provider server stops."""
    try:
        if resource.id is not None:
            resource.destroy()
    finally:
        testhost.ssh(f"rm -f /usr/local/sbin/date {MARKERS}", check=False)
        server.__exit__(None, None, None)
