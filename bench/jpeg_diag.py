"""Which of the served detector's JPEG answers differ from their frame's eager reference, and under what conditions
(issue 27: on the H200 about one JPEG job in five came back with boxes unlike its frame's reference, on the direct
path as on the gateway's, and every request through serving.front one at a time).

One Triton with the detector twice, as ``bench.queue_gpu`` deploys it (the GPU preset, ``input: jpeg``): ``lone``
with the lone-frame graphs (``frame_graphs`` default) and ``nog`` without (``frame_graphs=none``). Every frame is
sent alone, one request at a time, ``--repeat`` times to each, then all frames from 8 threads at once (Triton
batches them). Each answer is checked against its own frame's reference (``bench.gpu_frames.references``, eager,
the same weights); for a wrong answer, whether it is another frame's answer. Prints one JSON summary (also
OUT/jpeg_diag.json); exits 1 when any answer was wrong.

    python3 -m bench.jpeg_diag --out OUT          # on the GPU machine (PYTHONPATH with the carried wheels)
    .venv/bin/python -m bench.jpeg_diag --cpu --frames 6 --repeat 1 --out /tmp/jd   # smoke test here
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.queue_gpu import CONF, make_payloads, model_spec  # noqa: E402
from bench.window_gpu import detector_weights, machine_line, start_triton  # noqa: E402
from bench.yolo_check import set_problem, with_parameters  # noqa: E402


def frame_size(jpeg: bytes) -> str:
    from serving.models.frames import jpeg_size

    w, h = jpeg_size(jpeg)
    return f"{w}x{h}"


@dataclasses.dataclass
class Frames:
    """The requests' JPEG frames, each one's reference answer and size, and the check of an answer against them."""

    arrays: list[np.ndarray]
    refs: list[tuple[np.ndarray, np.ndarray]]
    conf: float
    sizes: list[str] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.sizes = [frame_size(x.tobytes()) for x in self.arrays]

    def call(self, client: Any, name: str, i: int) -> tuple[np.ndarray, np.ndarray]:
        import tritonclient.grpc as grpcclient

        t = grpcclient.InferInput("images", list(self.arrays[i].shape), "UINT8")
        t.set_data_from_numpy(self.arrays[i])
        r = client.infer(name, [t], client_timeout=60)
        return r.as_numpy("detections").reshape(-1, 6), r.as_numpy("num_detections").reshape(-1)

    def problem(self, i: int, det: np.ndarray, num: np.ndarray) -> Optional[str]:
        n = int(num[0])
        ref = self.refs[i]
        return set_problem(det[:n], np.asarray(ref[0], np.float32)[: int(ref[1][0])], self.conf)

    def whose(self, det: np.ndarray, num: np.ndarray) -> list[int]:
        """The frames whose reference this answer matches."""
        return [j for j in range(len(self.arrays)) if self.problem(j, det, num) is None]


def one_at_a_time(client: Any, name: str, frames: Frames, repeat: int) -> dict[str, Any]:
    """Every frame alone, ``repeat`` times: requests and wrong answers per frame size, the first four wrong ones."""
    wrong: dict[str, list] = {}
    total: dict[str, int] = {}
    examples: list[dict[str, Any]] = []
    for rep in range(repeat):
        for i, size in enumerate(frames.sizes):
            det, num = frames.call(client, name, i)
            total[size] = total.get(size, 0) + 1
            if frames.problem(i, det, num):
                wrong.setdefault(size, []).append(i)
                if len(examples) < 4:
                    examples.append(
                        {
                            "frame": i,
                            "rep": rep,
                            "got": int(num[0]),
                            "ref": int(frames.refs[i][1][0]),
                            "matches_frames": frames.whose(det, num),
                            "got_first": det[:2].round(1).tolist(),
                            "ref_first": np.asarray(frames.refs[i][0])[:2].round(1).tolist(),
                        }
                    )
    return {"total": total, "wrong": wrong, "examples": examples}


def eight_at_once(grpc_url: str, name: str, frames: Frames, repeat: int) -> dict[str, Any]:
    """Every frame ``repeat`` times from 8 threads at once (Triton batches them): requests and the wrong ones."""
    import tritonclient.grpc as grpcclient

    def one(i: int) -> tuple[int, bool]:
        c = grpcclient.InferenceServerClient(grpc_url)  # one per call: the threads share none
        try:
            det, num = frames.call(c, name, i)
        finally:
            c.close()
        return i, frames.problem(i, det, num) is not None

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, [i for _ in range(repeat) for i in range(len(frames.arrays))]))
    return {"total": len(got), "wrong_frames": sorted(i for i, w in got if w)}


def run_modes(grpc_url: str, specs: dict[str, Any], frames: Frames, repeat: int) -> dict[str, dict]:
    """Both models, one at a time and then 8 at once, printed as they finish."""
    import tritonclient.grpc as grpcclient

    runs: dict[str, dict] = {}
    client = grpcclient.InferenceServerClient(grpc_url)
    for mode, spec in specs.items():
        runs[f"{mode} one at a time"] = one_at_a_time(client, spec.name, frames, repeat)
        print(mode, json.dumps(runs[f"{mode} one at a time"])[:3000], flush=True)
        runs[f"{mode} 8 at once"] = eight_at_once(grpc_url, spec.name, frames, repeat)
        print(
            mode,
            "8 at once",
            runs[f"{mode} 8 at once"]["total"],
            "wrong",
            runs[f"{mode} 8 at once"]["wrong_frames"],
            flush=True,
        )
    return runs


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--frames", type=int, default=48)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    gpu = not a.cpu
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import tritonclient.grpc  # noqa: F401 - missing, it fails here and not after Triton's start

    gpu_name, machine = machine_line(gpu)
    model, weights = detector_weights()
    arrays, refs = make_payloads("jpeg", a.frames, gpu, model, weights)
    base = model_spec(gpu, gpu_name, "jpeg")
    specs = {
        "lone": base.model_copy(update={"name": "det_lone"}),
        "nog": with_parameters(base.model_copy(update={"name": "det_nog"}), frame_graphs="none"),
    }
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuhost-jpeg-diag-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    proc, _http, grpc_url = start_triton(workdir, list(specs.values()), weights, gpu)
    frames = Frames(arrays, refs, CONF["jpeg"])
    result: dict[str, Any] = {"machine": machine, "frames": len(arrays), "sizes": frames.sizes, "runs": {}}
    try:
        result["runs"] = run_modes(grpc_url, specs, frames, a.repeat)
    finally:
        proc.terminate()
        proc.wait(30)
    log = (workdir / "triton.log").read_text(errors="replace")
    result["log_tail"] = [ln for ln in log.splitlines() if "gpuhost" in ln or "rror" in ln][-20:]
    (out / "jpeg_diag.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "sizes"}, indent=1)[:6000])
    runs = result["runs"].values()
    return 1 if any(r.get("wrong") or r.get("wrong_frames") for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
