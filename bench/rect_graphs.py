"""The JPEG backend's CUDA graphs on a GPU, outside Triton: each graph's answer against the same model run eagerly.

Loads ``serving/yolov8n_model.py`` as Triton would (its files side by side in a version directory, the test detector
as the weights file, ``input: jpeg``, max batch 8) once per letterbox, and for batches of camera frames
(1280×720, 1920×1080, 640×480 — the ``frame_graphs`` sizes — and 1000×700, a size without graphs; lone, one size,
several sizes in one batch) compares ``_frames_forward`` (the graphs: lone-frame, per shape and batch size) with the
same frames letterboxed into the same input and run eagerly (FP16, the same batch), box rows matched as sets
(class + IoU ≥ 0.5, ``bench.yolo_check.set_problem``). Prints the instance's start lines (``gpuhost-graph-ms``:
the GPU time of each graph's replay per shape and batch size, the memory the graphs reserved), the initialize time
and each check; exit 1 when an answer differs. The python backend's ``triton_python_backend_utils`` does not exist
outside Triton: a stand-in module with nothing in it (initialize and ``_frames_forward`` use none of it).

Usage (on the GPU machine, after ``bench/gpu_device.sh``'s wheels are installed)::

    python3 -m bench.rect_graphs OUTDIR        # OUTDIR/rect_graphs.txt
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = [(1280, 720), (1920, 1080), (640, 480), (1000, 700)]
BATCHES = [
    [0],
    [3],
    [0, 0],
    [0, 1, 0, 1, 0],
    [0] * 8,
    [2] * 3,
    [0, 2, 1, 2],
    [3, 0, 3],
    [0, 1, 2, 3, 0, 1, 2, 3],
]


def load(letterbox: str, workdir: Path, weights: bytes):
    """The backend's TritonPythonModel, initialized on cuda:0 (else the CPU) with ``letterbox``."""
    import torch

    from bench.yolo_check import WEIGHTS_FILE
    from serving.models import yolov8n_files

    # The version directory a repository ships (``bench.yolo_check.repository``), model.py under its own module name.
    for rel, data in yolov8n_files(letterbox, 1, weights, WEIGHTS_FILE).items():
        (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (workdir / rel).write_bytes(data)
    version = workdir / letterbox / "1"
    (version / "model.py").rename(version / f"model_{letterbox}.py")
    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    sys.path.insert(0, str(version))
    module = importlib.import_module(f"model_{letterbox}")
    params = {"input": "jpeg", "weights": WEIGHTS_FILE, "conf": "0.1", "letterbox": letterbox}
    config = {
        "max_batch_size": 8,
        "input": [{"name": "images", "dims": [-1]}],
        "output": [{"name": "detections"}, {"name": "num_detections"}],
        "parameters": {k: {"string_value": v} for k, v in params.items()},
    }
    args = {
        "model_config": json.dumps(config),
        "model_instance_kind": "GPU" if torch.cuda.is_available() else "CPU",
        "model_instance_device_id": "0",
        "model_instance_name": f"det_{letterbox}_0",
        "model_name": f"det_{letterbox}",
    }
    m = module.TritonPythonModel()
    t0 = time.perf_counter()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        m.initialize(args)
    return m, time.perf_counter() - t0, printed.getvalue().strip()


def eager(m, images):
    """The same frames through the same steps without graphs: letterbox per shape into the same input, the model
    and NMS eagerly at that batch, boxes back; rows in the batch's order."""
    import torch

    from serving.models import frames as fr

    out = [None] * len(images)
    for shape, idx in fr.rect_groups(images, rect=m.rect).items():
        slot = m._slot(len(idx), shape)
        geo = torch.tensor(fr.letterbox_batch([images[i] for i in idx], slot, rect=m.rect), device=m.device)
        det, count = m._forward(slot)
        det = fr.unletterbox(det, geo)
        for j, i in enumerate(idx):
            out[i] = det[j, : int(count[j, 0])].float().cpu().numpy()
    return out


def _on(m):
    """The instance's stream on a GPU (a blocking copy to the host then waits for it); nothing on a CPU."""
    import torch

    return torch.cuda.stream(m.stream) if m.device.type == "cuda" else contextlib.nullcontext()


def check(m, images, what: str) -> list[str]:
    import numpy as np
    import torch

    from bench.yolo_check import set_problem

    with _on(m), torch.no_grad():
        det, count = m._frames_forward(images)
        got = [det[i, : int(count[i, 0])].float().cpu().numpy() for i in range(len(images))]
        ref = eager(m, images)
    lines = []
    for i, (g, r) in enumerate(zip(got, ref)):
        problem = set_problem(g, r, 0.1)
        worst = float(np.abs(g - r).max()) if g.shape == r.shape and len(g) else None
        lines.append(f"{what} frame {i}: {len(g)} boxes, eager {len(r)}, max diff {worst}, {problem or 'same'}")
    return lines


def main(argv=None) -> int:
    import torch

    from bench.yolo_check import weights_file
    from gate import sample_frames

    out = Path((argv or sys.argv[1:])[0])
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (a CPU instance: no graphs)"
    lines: list[str] = [f"torch {torch.__version__}, {gpu}"]
    bad = 0
    weights = weights_file()
    with tempfile.TemporaryDirectory() as tmp:
        for letterbox in ("square", "rect"):
            m, seconds, printed = load(letterbox, Path(tmp), weights)
            lines.append(f"{letterbox}: initialize {seconds:.1f} s, graphs {sorted(m.graphs)}\n{printed}")
            rows = [torch.frombuffer(bytearray(sample_frames.jpeg(w, h, seed=100 + k)), dtype=torch.uint8)
                    for k, (w, h) in enumerate(SIZES)]  # fmt: skip
            with _on(m):
                decoded = m.decoder.decode(rows)
            for batch in BATCHES:
                what = f"{letterbox} batch {[f'{SIZES[k][0]}x{SIZES[k][1]}' for k in batch]}"
                got = check(m, [decoded[k] for k in batch], what)
                bad += sum("same" not in x for x in got)
                lines += got
    lines.append(f"answers that differ: {bad}")
    text = "\n".join(lines)
    print(text, flush=True)
    (out / "rect_graphs.txt").write_text(text + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
