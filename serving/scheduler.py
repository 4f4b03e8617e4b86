"""Seed 001's scheduler, pure: which backend gets the next job (weights, load, health, queue time, no herding).

No I/O here: the worker feeds it what it measured (health probes, Triton queue time, DCGM, failed calls) with the
time it measured it, and asks for a backend. Every rule is a function of that state, so tests drive time by hand.

Rules (seed 001 §7.2 and its 要点):
  * Load per weight: the job goes to the backend with the lowest ``in_flight / effective_weight``; with mig-a
    weight 3 and vm-b weight 2 the in-flight jobs settle at 3:2, and so does the served rate when both backends
    cost the same per batch. Ties (and near ties, below) go by smooth weighted round robin, so that at low load,
    where both are often idle, the jobs still split 3:2 (a score of ``(in_flight + 1) / weight`` would send every
    job that finds both idle to the heavier one: 63.7 % instead of 60 % at 1,000 jobs/s on the H200).
  * Health: a failed call (connection refused, unavailable, deadline) drains that backend at once; it stays drained
    until a probe after ``retry_after_s`` says ready again. A probe that says not ready, or a DCGM XID error on its
    GPU, drains it too.
  * Queue time: Triton's own average queue time per request (``nv_inference_queue_duration_us`` over
    ``nv_inference_request_success``) above ``queue_ms_shift`` moves weight away linearly; at ``queue_ms_drain`` the
    backend is drained (seed 001 §8: over 20 ms → shift weight).
  * No herding: a backend that comes back starts at ``ramp_floor`` of its weight and reaches full weight over
    ``ramp_s`` seconds, so it is not the "emptiest" target for every worker at once; and among backends whose score
    is within ``jitter`` of the best, the pick is by smooth weighted round robin over them, its credits started at
    random for each scheduler so that workers do not pick in step.
  * When every backend is drained by queue time alone (overload, not failure), the ready ones still serve at their
    configured weights: shifting weight needs somewhere to shift it to.

Usage::

    s = Scheduler({"mig-a": 3, "vm-b": 2})
    name = s.pick(now)                      # None when no backend can take work
    s.started(name); ...; s.finished(name)
    s.failed("vm-b", now)                   # the call failed: drained at once
    s.observe("vm-b", Signals(ready=True, queue_ms=4.0), now + 1.5)   # back, ramping up over ramp_s
"""

from __future__ import annotations

import dataclasses
import random
import threading
from typing import Iterable, Mapping, Optional


@dataclasses.dataclass(frozen=True)
class Policy:
    """The numbers of the rules above."""

    ramp_s: float = 10.0  # a backend back from a drain reaches its full weight over this many seconds,
    ramp_floor: float = 0.1  # starting from this share of it
    retry_after_s: float = 1.0  # a backend whose call failed stays drained at least this long
    queue_ms_shift: float = 20.0  # Triton's queue time (ms) above which weight moves away, linearly,
    queue_ms_drain: float = 100.0  # down to none at this queue time (drained)
    jitter: float = 0.1  # backends scoring within this fraction of the best share the pick, by weight

    def __post_init__(self) -> None:
        if not (0 < self.ramp_floor <= 1):
            raise ValueError(f"ramp_floor must be in (0, 1]: {self.ramp_floor}")
        if self.ramp_s < 0 or self.retry_after_s < 0 or self.jitter < 0:
            raise ValueError("ramp_s, retry_after_s and jitter must not be negative")
        if not (0 < self.queue_ms_shift < self.queue_ms_drain):
            raise ValueError(
                f"want 0 < queue_ms_shift < queue_ms_drain, got {self.queue_ms_shift}, {self.queue_ms_drain}"
            )


@dataclasses.dataclass(frozen=True)
class Signals:
    """One probe of a backend: readiness (server and model), Triton's queue time, DCGM's last XID."""

    ready: bool
    queue_ms: Optional[float] = None
    xid: int = 0


@dataclasses.dataclass
class _State:
    weight: float
    in_flight: int = 0
    ready: bool = True
    xid: int = 0
    queue_ms: Optional[float] = None
    failed_at: Optional[float] = None
    # When the backend last came back from a drain; None: never drained, no ramp.
    back_at: Optional[float] = None
    drained: bool = False


class Scheduler:
    """Thread-safe; ``now`` is any monotonic clock in seconds, supplied by the caller."""

    def __init__(self, weights: Mapping[str, float], policy: Policy = Policy(), *, rng: Optional[random.Random] = None):
        if not weights:
            raise ValueError("at least one backend")
        bad = {n: w for n, w in weights.items() if not w > 0}
        if bad:
            raise ValueError(f"weights must be positive: {bad}")
        self.policy = policy
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._b = {n: _State(weight=float(w)) for n, w in weights.items()}
        total = sum(float(w) for w in weights.values())
        # Smooth weighted round robin among near ties; a random start per scheduler (one per worker process).
        self._credit = {n: self._rng.random() * total for n in weights}

    @property
    def names(self) -> list[str]:
        return list(self._b)

    # ------------------------------------------------------------------ inputs

    def observe(self, name: str, signals: Signals, now: float) -> None:
        with self._lock:
            b = self._b[name]
            ready = signals.ready
            if ready and b.failed_at is not None:
                if now - b.failed_at < self.policy.retry_after_s:
                    ready = False
                else:
                    b.failed_at = None
            b.ready, b.xid = ready, signals.xid
            if signals.queue_ms is not None:
                b.queue_ms = signals.queue_ms
            self._update_drained(b, now)

    def failed(self, name: str, now: float) -> None:
        with self._lock:
            b = self._b[name]
            b.failed_at, b.ready = now, False
            self._update_drained(b, now)

    def started(self, name: str) -> None:
        with self._lock:
            self._b[name].in_flight += 1

    def finished(self, name: str) -> None:
        with self._lock:
            b = self._b[name]
            b.in_flight = max(0, b.in_flight - 1)

    # ------------------------------------------------------------------ rules

    def _queue_factor(self, b: _State) -> float:
        p = self.policy
        if b.queue_ms is None or b.queue_ms <= p.queue_ms_shift:
            return 1.0
        return max(0.0, (p.queue_ms_drain - b.queue_ms) / (p.queue_ms_drain - p.queue_ms_shift))

    def _healthy(self, b: _State) -> bool:
        return b.ready and b.xid == 0 and b.failed_at is None

    def _update_drained(self, b: _State, now: float) -> None:
        drained = not self._healthy(b) or self._queue_factor(b) == 0.0
        if b.drained and not drained:
            b.back_at = now
        b.drained = drained

    def _ramp(self, b: _State, now: float) -> float:
        p = self.policy
        if b.back_at is None or p.ramp_s == 0:
            return 1.0
        progress = (now - b.back_at) / p.ramp_s
        if progress >= 1:
            return 1.0
        return p.ramp_floor + (1 - p.ramp_floor) * max(0.0, progress)

    def _effective(self, b: _State, now: float) -> float:
        if b.drained:
            return 0.0
        return b.weight * self._queue_factor(b) * self._ramp(b, now)

    def effective_weight(self, name: str, now: float) -> float:
        with self._lock:
            return self._effective(self._b[name], now)

    def pick(self, now: float, exclude: Iterable[str] = ()) -> Optional[str]:
        """The backend for the next job, or None when none can take it (all failed or not ready)."""
        skip = set(exclude)
        with self._lock:
            weights = {n: self._effective(b, now) for n, b in self._b.items() if n not in skip}
            weights = {n: w for n, w in weights.items() if w > 0}
            if not weights:
                weights = {n: b.weight for n, b in self._b.items() if n not in skip and self._healthy(b)}
            if not weights:
                return None
            scores = {n: self._b[n].in_flight / w for n, w in weights.items()}
            best = min(scores.values())
            near = [n for n in weights if scores[n] <= best * (1 + self.policy.jitter) + 1e-12]
            if len(near) == 1:
                return near[0]
            for n in near:
                self._credit[n] += weights[n]
            pick = max(near, key=lambda n: self._credit[n])
            self._credit[pick] -= sum(weights[n] for n in near)
            return pick

    def snapshot(self, now: float) -> dict[str, dict]:
        with self._lock:
            return {
                n: {
                    "weight": b.weight,
                    "effective_weight": self._effective(b, now),
                    "in_flight": b.in_flight,
                    "healthy": self._healthy(b),
                    "drained": b.drained,
                    "queue_ms": b.queue_ms,
                    "xid": b.xid,
                }
                for n, b in self._b.items()
            }
