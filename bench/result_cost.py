"""What one image-sized result costs Redis's main thread in the queue (serving.queue), per job: a real redis-server,
``--jobs`` jobs completed with a ``--bytes`` UINT8 output (a 1024×1024 PNG of the random-weights generator is
2,450,417 bytes) and each result read back once, checked equal; Redis's own commandstats (µs per job of the commands
that carry the result: the scripts, SET, GET, BLMOVE, RPUSH). No GPU, no Triton.

    .venv/bin/python -m bench.result_cost --jobs 40
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=40)
    p.add_argument("--bytes", type=int, default=2_450_417)
    a = p.parse_args(argv)
    import redis

    from serving.queue import JobQueue, QueueConfig, Result
    from testbed.servers.redis import start_redis

    png = np.random.default_rng(0).integers(1, 256, (1, a.bytes), dtype=np.uint8)
    with start_redis(Path(tempfile.mkdtemp(prefix="gpuhost-result-cost-"))) as h:
        r = redis.Redis(port=h.port)
        q = JobQueue(r, QueueConfig())
        q.ensure_group()
        keys = [q.submit("g", {"seed": np.array([[i]])}) for i in range(a.jobs)]
        jobs = q.read("w", count=a.jobs, block_ms=100)
        r.config_resetstat()
        for j in jobs:
            q.complete(j, Result(j.key, "ok", "a", "w", 1.0, 0.0, 1.0, outputs={"image": png}))
        for k in keys:
            if not np.array_equal(q.result(k, timeout_s=10).outputs["image"], png):
                print(f"job {k}: the result read back differs", file=sys.stderr)
                return 1
        names = ("evalsha", "set", "get", "blmove", "rpush")
        per = {n: round(v["usec"] / a.jobs, 1) for c, v in r.info("commandstats").items() if (n := c[8:]) in names}
        r.close()
    top = round(sum(v for n, v in per.items() if n != "rpush"), 1)  # RPUSH runs inside the complete script
    print(json.dumps({"jobs": a.jobs, "result_bytes": a.bytes, "usec_per_job": per, "main_thread_usec": top}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
