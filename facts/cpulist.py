"""CPU lists as the kernel writes them ("0-3,8,10-11") and the hex masks irqbalance/smp_affinity take.

Usage::

    parse_cpulist("0-3,8")          # [0, 1, 2, 3, 8]
    format_cpulist([0, 1, 2, 3, 8]) # "0-3,8"
    cpumask([0, 1, 2, 3, 32])       # "1,0000000f"  (comma-grouped 32-bit words, as /proc/irq/*/smp_affinity)
"""

from __future__ import annotations

import re
from typing import Iterable

# Linux's largest NR_CPUS (CONFIG_NR_CPUS_RANGE_END): no machine numbers a CPU at or above it.
MAX_CPUS = 8192
_NUM = re.compile(r"[0-9]{1,12}")


class CpuListError(ValueError):
    pass


def _cpu(s: str, part: str, text: str, limit: int) -> int:
    # ASCII digits only (str.isdigit() takes '٣' and int() reads it as 3); bounded before any range is expanded.
    if not _NUM.fullmatch(s):
        raise CpuListError(f"bad CPU number {part!r} in CPU list {text!r}")
    n = int(s)
    if n >= limit:
        raise CpuListError(f"CPU {n} in CPU list {text!r} is beyond the largest CPU number {limit - 1}")
    return n


def parse_cpulist(text: str, limit: int = MAX_CPUS) -> list[int]:
    """CPU numbers of `text`; every number (range ends included) below `limit`, checked before a range expands."""
    text = (text or "").strip()
    if not text:
        return []
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise CpuListError(f"empty element in CPU list {text!r}")
        if "-" in part:
            a, _, b = part.partition("-")
            if not (_NUM.fullmatch(a) and _NUM.fullmatch(b)):
                raise CpuListError(f"bad range {part!r} in CPU list {text!r}")
            lo, hi = _cpu(a, part, text, limit), _cpu(b, part, text, limit)
            if lo > hi:
                raise CpuListError(f"range {part!r} runs backwards in CPU list {text!r} (write {hi}-{lo})")
            out.update(range(lo, hi + 1))
        else:
            out.add(_cpu(part, part, text, limit))
    return sorted(out)


def format_cpulist(cpus: Iterable[int]) -> str:
    s = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(parts)


def cpumask(cpus: Iterable[int]) -> str:
    """Kernel-style hex mask: 32-bit words, most significant first, comma separated, leading zero words dropped."""
    bits = 0
    for c in cpus:
        bits |= 1 << c
    words = []
    while True:
        words.append(bits & 0xFFFFFFFF)
        bits >>= 32
        if not bits:
            break
    words.reverse()
    return ",".join([f"{words[0]:x}"] + [f"{w:08x}" for w in words[1:]])


def parse_cpumask(text: str) -> list[int]:
    bits = int(text.replace(",", "").strip() or "0", 16)
    return [i for i in range(bits.bit_length()) if bits >> i & 1]
