"""Just enough of the Prometheus text format for the queue workers: counters, histograms, a sample parser.

Usage::

    jobs = Counter("gpuhost_gateway_jobs_total", "Jobs finished", ("backend", "outcome"))
    jobs.inc("mig-a", "ok")
    lat = Histogram("gpuhost_gateway_job_latency_seconds", "Submit to result", ("backend",))
    lat.observe(0.42, "mig-a")
    text = render([("gpuhost_gateway_queue_depth", "Jobs in the stream", {}, 12)], [jobs], [lat],
                  common={"consumer": "gw-1"})
    list(parse_samples(text))   # [("gpuhost_gateway_queue_depth", {"consumer": "gw-1"}, 12.0), ...]
"""

from __future__ import annotations

import bisect
import re
import threading
from typing import Iterable, Iterator

# Seconds; spans a 5 ms stand-in call to seed 001's 2.5 s SDXL target and beyond.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 5.0, 10.0, 30.0)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(d: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in d.items()) + "}" if d else ""


def _num(x: float) -> str:
    return repr(float(x)) if x != int(x) else str(int(x))


class Counter:
    def __init__(self, name: str, help_: str, labels: tuple[str, ...]):
        self.name, self.help, self.labels = name, help_, labels
        self._v: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def inc(self, *values: str, by: float = 1.0) -> None:
        with self._lock:
            self._v[values] = self._v.get(values, 0.0) + by

    def value(self, *values: str) -> float:
        return self._v.get(values, 0.0)

    def lines(self, common: dict[str, str]) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        with self._lock:
            for k, v in sorted(self._v.items()):
                out.append(f"{self.name}{_labels({**common, **dict(zip(self.labels, k))})} {_num(v)}")
        return out


class Histogram:
    def __init__(self, name: str, help_: str, labels: tuple[str, ...], buckets: tuple[float, ...] = BUCKETS):
        self.name, self.help, self.labels, self.buckets = name, help_, labels, buckets
        self._v: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}
        self._lock = threading.Lock()

    def observe(self, x: float, *values: str) -> None:
        with self._lock:
            counts, sc = self._v.setdefault(values, ([0] * (len(self.buckets) + 1), [0.0, 0.0]))
            counts[bisect.bisect_left(self.buckets, x)] += 1
            sc[0] += x
            sc[1] += 1

    def lines(self, common: dict[str, str]) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        with self._lock:
            for k, (counts, (total, n)) in sorted(self._v.items()):
                base = {**common, **dict(zip(self.labels, k))}
                running = 0
                for le, c in zip(self.buckets, counts):
                    running += c
                    out.append(f"{self.name}_bucket{_labels({**base, 'le': _num(le)})} {running}")
                out.append(f"{self.name}_bucket{_labels({**base, 'le': '+Inf'})} {int(n)}")
                out.append(f"{self.name}_sum{_labels(base)} {_num(total)}")
                out.append(f"{self.name}_count{_labels(base)} {int(n)}")
        return out


def render(
    gauges: Iterable[tuple[str, str, dict[str, str], float]],
    counters: Iterable[Counter],
    histograms: Iterable[Histogram],
    *,
    common: dict[str, str],
) -> str:
    out: list[str] = []
    seen: set[str] = set()
    # A metric family's samples must be contiguous in the text format.
    for name, help_, labels, value in sorted(gauges, key=lambda g: g[0]):
        if name not in seen:
            out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
            seen.add(name)
        out.append(f"{name}{_labels({**common, **labels})} {_num(value)}")
    for c in counters:
        out += c.lines(common)
    for h in histograms:
        out += h.lines(common)
    return "\n".join(out) + "\n"


def parse_samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line; comments and malformed lines are skipped."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        yield m.group(1), {k: v for k, v in _LABEL.findall(m.group(3) or "")}, value
