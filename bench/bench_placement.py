"""Benchmark: plan 1,000 hosts × 8 VMs (target: under a second in all). Not a test.

Every host is distinct (its own reserve, devices and requests), so nothing is cached across hosts; the time
covers building the solver's scratch state from the `Host` and placing all eight VMs.

Run: .venv/bin/python bench/bench_placement.py [hosts]
"""

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plans.placement import Host, VmRequest, place  # noqa: E402


def make(i: int, rng: random.Random) -> tuple[Host, list[VmRequest]]:
    cores = rng.choice([28, 32, 40])
    gpus = {f"0000:{0x17 + 0x20 * g:02x}:00.0": g % 2 for g in range(8)}
    host = Host.uniform(
        sockets=2,
        cores_per_socket=cores,
        threads_per_core=2,
        memory_mib=65536,
        hugepages_1g=240,
        devices=gpus,
        reserved_cpus=[0, 2 * cores, cores, 3 * cores],
    )
    reqs = [
        VmRequest(
            name=f"h{i}-vm{v}",
            vcpus=rng.choice([2, 4, 6]),
            memory_mib=rng.choice([8, 16, 24]) * 1024,
            gpus=(addr,),
            iothreads=rng.choice([0, 1, 2]),
            thread_policy=rng.choice(["prefer", "prefer", "require", "isolate"]),
            emulator_threads=rng.choice(["isolate", "share"]),
        )
        for v, addr in enumerate(sorted(gpus))
    ]
    return host, reqs


def main(n_hosts: int = 1000) -> None:
    rng = random.Random(5)
    cases = [make(i, rng) for i in range(n_hosts)]
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        placed = sum(len(place(h, r).vms) for h, r in cases)
        best = min(best, time.perf_counter() - t0)
    print(
        f"{n_hosts} hosts x 8 VMs: {placed} VMs placed, best of 3: {best:.3f} s "
        f"({best / placed * 1e6:.0f} us/VM), target < 1 s: {'ok' if best < 1 else 'MISSED'}"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
