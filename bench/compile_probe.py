"""Would an inductor-compiled detector shorten the lone frame? (issue 39: c=1 p95 ≤ 4 ms; the model's CUDA graph is
~1.0 ms at batch 1 whatever the input size, launch-bound.) GPU time of one CUDA-graph replay of the fused YOLOv8n
(FP16, channels_last, random weights: the cost does not depend on them) eager against ``torch.compile`` (inductor,
``default`` then ``max-autotune-no-cudagraphs``) captured the same way, per batch and input shape, with the largest
difference of the raw outputs. Each line goes to OUT/compile_probe.txt as soon as it is measured (inductor's autotune
log is long: keep stderr apart), so a run cut short keeps what it measured.

Usage (on the GPU machine; torch with inductor and Triton, no Triton server)::

    python3 -m bench.compile_probe OUTDIR 2>/dev/null    # run as a module: bench/queue.py shadows the stdlib's
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(1, 384, 640), (1, 640, 640), (8, 384, 640), (8, 640, 640)]
MODES = ("default", "max-autotune-no-cudagraphs")


def graph_ms(fn, x, n: int = 50):
    """Median GPU ms of one replay of ``fn(x)`` captured as a CUDA graph (CUDA events), and its output."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(x)
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[n // 2], out


def main(out_dir: str, budget_s: float = 330.0) -> None:
    import torch

    sys.path.insert(0, str(ROOT))
    from serving.models import yolov8n as yolo

    start = time.monotonic()
    report = Path(out_dir) / "compile_probe.txt"
    report.parent.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        with report.open("a") as f:
            f.write(line + "\n")
        print(line, flush=True)

    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    model = yolo.fuse(yolo.YOLOv8n().eval()).to(dev, torch.float16)
    model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    say(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    with torch.inference_mode():
        refs = {}
        for b, h, w in SHAPES:
            x = torch.rand(b, 3, h, w, device=dev, dtype=torch.float16).to(memory_format=torch.channels_last)
            ms, ref = graph_ms(model, x)
            refs[(b, h, w)] = (x, ref)
            say(f"b={b} {h}x{w}: eager graph {ms:.3f} ms")
        for mode in MODES:  # the cheaper mode over every shape first: a run cut short keeps it
            for (b, h, w), (x, ref) in refs.items():
                if time.monotonic() - start > budget_s:
                    say("time budget reached")
                    return
                t0 = time.monotonic()
                compiled = torch.compile(model, mode=mode, dynamic=False)
                try:
                    compiled(x)
                    torch.cuda.synchronize()
                    took = time.monotonic() - t0
                    cms, out = graph_ms(compiled, x)
                    diff = (ref.float() - out.float()).abs().max().item()
                    say(f"b={b} {h}x{w} {mode}: graph {cms:.3f} ms (compile {took:.0f} s, max difference {diff:.3g})")
                except Exception as e:  # noqa: BLE001  (a probe: say why and go on)
                    say(f"b={b} {h}x{w} {mode}: failed: {type(e).__name__}: {str(e)[:300]}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "compile_probe_out")
