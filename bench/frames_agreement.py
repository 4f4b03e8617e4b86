"""Served vs ``YOLO(...).predict`` per JPEG frame class (issue 39): the product's model answers each frame's JPEG
bytes over KServe v2 HTTP, Ultralytics answers the same file by its path, and per class the table gives their
agreement next to the noise floor of the same weights and the decoders' pixels against Pillow.

Two steps, since Ultralytics runs only here (``.venv-ultralytics``) and not on the GPU machine:

1. ``make DIR`` (here): ``frame_set``'s JPEG frames as files (``DIR/frames/``, ``DIR/manifest.json``) and Ultralytics'
   own answers (``tests/ultralytics_frames.py``): a YOLOv8n made and saved by Ultralytics (``DIR/yolov8n.pt``), then
   ``predict`` on each file's path, and on the frame as Ultralytics read it with every channel value ±1 level (the
   noise floor), on the CPU in FP32 (what the user validated with) in ``DIR/frames.json``.
2. ``serve DIR`` (the GPU machine, or ``--cpu``): one Triton with the product's model (``input: jpeg``) on that
   checkpoint, at ``precision`` fp32 and fp16 on a GPU (FP32 on a CPU), each frame's bytes sent alone as the gate
   sends them; per class: agreement (``bench.yolo_check.agreement``: class + IoU ≥ 0.5, greedy one to one, matched ÷
   max(served, reference)), the noise floor (the same metric, predict on the noisy frame against predict on the
   clean one), the product decoder's largest difference from Pillow's upright pixels (``frames.Decoder`` on the
   device, as an instance there decodes) and what Ultralytics read against Pillow. ``OUT/frames_agreement.json``
   and ``.md``.

Usage::

    .venv/bin/python -m bench.frames_agreement make DIR                       # here: frames, checkpoint, references
    .venv/bin/python -m bench.frames_agreement serve DIR --cpu --out OUT      # CPU Triton here
    python3 -m bench.frames_agreement serve DIR --out OUT                     # the GPU machine (wheels on PYTHONPATH)
    .venv/bin/python -m bench.frames_agreement render OUT/frames_agreement.json
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import http.client
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.report import git_commit, md_table  # noqa: E402
from bench.yolo_check import agreement, parse_response  # noqa: E402
from gate import sample_frames  # noqa: E402
from gate.loadgate import binary_request  # noqa: E402

CONF, IOU, MAX_DET = 0.25, 0.45, 100  # the served model's defaults (serving/yolov8n_model.py), given to predict too
WEIGHTS = "yolov8n.pt"  # Ultralytics' own checkpoint (YOLO.save), shipped unchanged as the model's weights file
# Table row → the ``sample_frames.frame_classes`` made of each of ``IMAGES``; "sizes" are ``SIZES``' plain frames.
CLASSES: dict[str, tuple[str, ...]] = {
    "plain": ("baseline-420",),
    "sizes": (),
    "EXIF-rotated": tuple(f"exif-{o}" for o in range(2, 9)),
    "progressive": ("progressive-420", "progressive-444"),
    "subsamplings": ("baseline-422", "baseline-444"),
    "grayscale": ("gray",),
    "CMYK": ("cmyk", "ycck"),
    "RGB-coded": ("rgb-coded",),
    "restart markers": ("restart-420", "restart-444"),
    "ICC": ("icc",),
    "EXIF thumbnail, SOF in a comment": ("exif-thumbnail", "comment-sof"),
}
IMAGES = ((1280, 720, 12), (640, 480, 12))  # (width, height, seed): a camera's and a VGA frame
SIZES = ((1920, 1080, 6), (1024, 768, 6), (720, 1280, 5), (328, 245, 5))
# BatchNorm calibration (``ultralytics_client.make_model``): letterboxed camera frames, none of them served.
CALIBRATION = ((1280, 720, 901), (640, 480, 902), (720, 1280, 903), (1920, 1080, 904), (328, 245, 905), (800, 600, 906))


@dataclasses.dataclass(frozen=True)
class Frame:
    name: str  # its file name
    cls: str  # its table row
    data: bytes


def frame_set() -> list[Frame]:
    """The frames of every class (46): each of ``CLASSES``' kinds made of each of ``IMAGES`` (Pillow, libjpeg-turbo's
    encoder, quality 90), and a plain 4:2:0 frame of each of ``SIZES``."""
    out = []
    for w, h, seed in IMAGES:
        made = sample_frames.frame_classes(w, h, seed)
        out += [
            Frame(f"{w}x{h}-{seed}-{kind}.jpg", cls, made[kind]) for cls, kinds in CLASSES.items() for kind in kinds
        ]
    out += [Frame(f"{w}x{h}-{seed}-baseline-420.jpg", "sizes", sample_frames.jpeg(w, h, seed)) for w, h, seed in SIZES]
    return sorted(out, key=lambda f: list(CLASSES).index(f.cls))


def _calibration(directory: Path) -> list[Path]:
    """``CALIBRATION``'s frames letterboxed to 640×640 as the served model does it, as PNG files (lossless)."""
    import torch
    from PIL import Image

    from serving.models import frames as fr

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for w, h, seed in CALIBRATION:
        slot = torch.zeros((640, 640, 3), dtype=torch.uint8)
        fr.letterbox(torch.from_numpy(sample_frames.pixels(w, h, seed).copy()).permute(2, 0, 1), slot)
        paths.append(directory / f"calib-{w}x{h}-{seed}.png")
        Image.fromarray(slot.numpy()).save(paths[-1])
    return paths


def ultralytics_python() -> Path:
    return Path(os.environ.get("GPUHOST_ULTRALYTICS_PYTHON", ROOT / ".venv-ultralytics" / "bin" / "python"))


def make(directory: Path, draws: int = 1, python: Optional[Path] = None) -> dict:
    """Frames, Ultralytics' checkpoint and its answers into ``directory`` (see the module docstring); returns
    ``frames.json``'s content. RuntimeError with Ultralytics' output when it fails."""
    directory.mkdir(parents=True, exist_ok=True)
    frames = frame_set()
    (directory / "frames").mkdir(exist_ok=True)
    for f in frames:
        (directory / "frames" / f.name).write_bytes(f.data)
    manifest = {"frames": [[f.name, f.cls] for f in frames], "commit": git_commit(), "draws": draws}
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1))
    calib = _calibration(directory / "calib")
    py = python or ultralytics_python()
    cmd = [str(py), str(ROOT / "tests" / "ultralytics_frames.py"), str(directory), str(CONF), str(IOU), str(draws)]
    cmd += [*map(str, calib), "--", *(str(directory / "frames" / f.name) for f in frames)]
    env = dict(os.environ, YOLO_CONFIG_DIR=str(directory / "config"), YOLO_OFFLINE="1")
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        raise RuntimeError(f"ultralytics_frames.py failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return json.loads((directory / "frames.json").read_text())


def load(directory: Path) -> tuple[list[Frame], dict]:
    """(the frames as ``make`` wrote them, Ultralytics' answers): what the GPU machine reads."""
    manifest = json.loads((directory / "manifest.json").read_text())
    frames = [Frame(n, c, (directory / "frames" / n).read_bytes()) for n, c in manifest["frames"]]
    return frames, json.loads((directory / "frames.json").read_text())


# ---------------------------------------------------------------- serving and comparing


def served_answers(url: str, model: str, frames: Sequence[Frame], timeout_s: float = 120) -> dict[str, np.ndarray]:
    """Each frame's bytes alone (UINT8 [1, bytes], binary KServe v2 over HTTP, as the gate sends them) → its
    detections [n, 6] in the upright frame's pixels. RuntimeError on an HTTP error."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=timeout_s)
    out = {}
    try:
        for f in frames:
            body, headers = binary_request(
                [("images", "UINT8", [1, len(f.data)], f.data)], ["detections", "num_detections"]
            )
            conn.request("POST", f"/v2/models/{model}/infer", body=body, headers=dict(headers))
            r = conn.getresponse()
            data = r.read()
            if r.status != 200:
                raise RuntimeError(f"{f.name}: HTTP {r.status}: {data[:300]!r}")
            got = parse_response(data, r.getheader("Inference-Header-Content-Length"))
            out[f.name] = got["detections"][0, : int(got["num_detections"].reshape(-1)[0])].astype(np.float32)
    finally:
        conn.close()
    return out


def pixel_diffs(frames: Sequence[Frame], decoder: Any) -> dict[str, int]:
    """Each frame's largest channel difference between ``decoder`` (a ``frames.Decoder``, as an instance on that
    device decodes) and Pillow's upright decode (``ImageOps.exif_transpose``, RGB); -1 where the sizes differ."""
    import io

    import torch
    from PIL import Image, ImageOps

    out = {}
    for f in frames:
        img = decoder.decode([torch.frombuffer(bytearray(f.data), dtype=torch.uint8)])[0]
        if not isinstance(img, torch.Tensor):
            raise RuntimeError(f"{f.name}: the product's decoder refused it: {img}")
        got = img.permute(1, 2, 0).cpu().numpy().astype(np.int16)
        ref = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(f.data))).convert("RGB"))
        out[f.name] = int(np.abs(got - ref).max()) if got.shape == ref.shape else -1
    return out


def _boxes(rows: list) -> np.ndarray:
    return np.asarray(rows, dtype=np.float32).reshape(-1, 6)


MODES = {"predict": "predict (rect)", "square": "predict rect=False"}  # frames.json's answers, as the table names them


def _sum(pairs) -> list[int]:
    return [int(x) for x in np.sum([list(p) for p in pairs], axis=0)] if pairs else [0, 0, 0]


def _ratio(s: Sequence[int]) -> float:
    return round(s[0] / max(s[1], s[2], 1), 4)


def compare(frames: Sequence[Frame], refs: dict, served: dict[str, dict[str, np.ndarray]], pixels: dict) -> list[dict]:
    """One row per class: frames, and for each of Ultralytics' two answers (``MODES``) its boxes and noise floor
    (matched, noisy, clean summed over the class's frames and draws; and each draw's agreement); per served model (``served``: label →
    answers) its (matched, served, reference) and agreement against each; the product decoder's and Ultralytics'
    largest difference from Pillow."""
    rows = []
    for cls in CLASSES:
        mine = [f for f in frames if f.cls == cls]
        answers = [refs["files"][f.name] for f in mine]
        row: dict[str, Any] = {
            "class": cls,
            "frames": len(mine),
            "kinds": sorted({f.name.split("-", 2)[2][:-4] for f in mine}),
            "pixels_vs_pillow": max(pixels[f.name] for f in mine),
            "ultralytics_read_vs_pillow": max(a["read_vs_pillow"] for a in answers),
            "reference": {},
            "served": {label: {} for label in served},
        }
        for mode in MODES:
            draws = [
                _sum([agreement(_boxes(a[f"{mode}_noisy"][d]), _boxes(a[mode])) for a in answers])
                for d in range(len(answers[0][f"{mode}_noisy"]))
            ]
            floor = _sum(draws)
            row["reference"][mode] = {
                "boxes": int(sum(len(a[mode]) for a in answers)),
                "floor": floor,
                "floor_agreement": _ratio(floor),
                "floor_per_draw": [_ratio(d) for d in draws],
            }
            for label, got in served.items():
                s = _sum([agreement(got[f.name], _boxes(a[mode])) for f, a in zip(mine, answers)])
                row["served"][label][mode] = {
                    "matched": s[0],
                    "served": s[1],
                    "reference": s[2],
                    "agreement": _ratio(s),
                }
        rows.append(row)
    return rows


def table(result: dict) -> str:
    """The per-class markdown table of a ``serve`` result."""
    labels = list(result["models"])
    head = ["class", "frames", "predict's boxes (rect / 640²)"]
    head += [f"{label}: served boxes, agreement vs predict rect / 640²" for label in labels]
    head += ["noise floor ±1 level (rect / 640²)", "decoder vs Pillow (levels)", "Ultralytics' read vs Pillow"]
    lines = []
    rows = result["rows"]
    for r in rows:
        ref = r["reference"]
        cells = [r["class"], r["frames"], f"{ref['predict']['boxes']} / {ref['square']['boxes']}"]
        for label in labels:
            a = r["served"][label]
            cells.append(
                f"{a['square']['served']}: {a['predict']['agreement']:.3f} / **{a['square']['agreement']:.3f}**"
            )
        cells.append(f"{ref['predict']['floor_agreement']:.3f} / **{ref['square']['floor_agreement']:.3f}**")
        cells += [r["pixels_vs_pillow"], r["ultralytics_read_vs_pillow"]]
        lines.append(cells)
    out = [
        f"Served vs `YOLO(...).predict` per JPEG frame class ({result['device']}; {result['started']}, commit "
        f"{result['commit']}; Ultralytics {result['versions']['ultralytics']}, predict on the CPU in FP32): "
        f'{result["frames"]} frames, each sent alone; conf {CONF}, IoU {IOU}, max_det {MAX_DET}. "rect": `predict` '
        "as called (its default `rect=True` letterboxes a checkpoint's frame to the smallest multiple of 32); "
        '"640²": `predict(..., rect=False)`, the 640×640 letterbox (a static ONNX export gets it; the served model '
        "with `letterbox: square`).",
        "",
        *md_table(head, lines, "lrr" + "r" * len(labels) + "rrr"),
        "",
    ]
    for label in labels:
        for mode, name in MODES.items():
            gaps = [(r["served"][label][mode]["agreement"] - r["reference"][mode]["floor_agreement"], r) for r in rows]
            low, at = min(gaps, key=lambda g: g[0])
            mean = sum(g for g, _ in gaps) / len(gaps)
            out.append(
                f"- {label} vs {name}: agreement − noise floor {mean:+.3f} on average over the classes, "
                f"{low:+.3f} at the lowest ({at['class']})."
            )
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- serve on a Triton (GPU, or --cpu)


def machine(gpu: bool) -> dict:
    out: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    out["load"] = open("/proc/loadavg").read().split()[:3]
    if gpu:
        q = "name,driver_version,memory.total"
        smi = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True
        )
        out["gpus"] = smi.stdout.strip().splitlines()
    import PIL
    import torch

    out["torch"], out["pillow"] = torch.__version__, PIL.__version__
    try:
        import torchvision

        out["torchvision"] = torchvision.__version__
    except Exception:  # noqa: BLE001 - none here: the product decodes with Pillow on the CPU
        out["torchvision"] = None
    return out


def serve(directory: Path, gpu: bool, commit: str = "") -> dict:
    """``make``'s frames through Triton (``fp32`` and ``fp16`` on a GPU, ``cpu`` FP32), compared per class."""
    import torch

    from bench.servers import log, start_triton
    from plans.triton_repo import repository_files, yolov8n_torch
    from serving.models import frames as fr
    from serving.models import yolov8n_files

    frames, refs = load(directory)
    weights = (directory / WEIGHTS).read_bytes()
    models = {"fp32": "det_fp32", "fp16": "det_fp16"} if gpu else {"CPU Triton": "det"}
    specs = []
    for label, name in models.items():
        spec = yolov8n_torch(name=name, gpu=gpu, input="jpeg", weights=WEIGHTS, instances=1, max_batch_size=8)
        params = {"precision": label} if gpu else {"torch_threads": "2"}
        specs.append(spec.model_copy(update={"parameters": {**spec.parameters, **params}}))
    code = {k: v for s in specs for k, v in yolov8n_files(s.name, 1, weights, WEIGHTS).items()}
    files = repository_files(specs, gpu_count=1 if gpu else 0, model_files=code)
    result: dict[str, Any] = {
        "machine": machine(gpu),
        "commit": commit or git_commit(),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "versions": refs["versions"],
        "frames": len(frames),
        "models": models,
    }
    # The model code shipped, by hash: the GPU machine has no .git, and frames.py changes under other work.
    shipped = yolov8n_files(specs[0].name, 1)
    result["model_files"] = {k.split("/")[-1]: hashlib.sha256(v).hexdigest()[:16] for k, v in shipped.items()}
    result["device"] = (result["machine"].get("gpus") or ["CPU"])[0].split(",")[0] if gpu else "CPU Triton"
    device = torch.device("cuda:0" if gpu else "cpu")
    t0 = time.monotonic()
    decoder = fr.Decoder(device)
    pixels = pixel_diffs(frames, decoder)
    result["decoder"] = {
        "name": decoder.name,
        "served": dict(decoder.served),
        "seconds": round(time.monotonic() - t0, 2),
    }
    workdir = Path(tempfile.mkdtemp(prefix="gpuhost-frames-agreement-"))
    triton = start_triton(workdir, specs, files, ready_timeout=600)
    served = {}
    try:
        for label, name in models.items():
            t0 = time.monotonic()
            served[label] = served_answers(triton.http, name, frames)
            log(f"{label}: {len(frames)} frames in {time.monotonic() - t0:.1f} s")
        with urllib.request.urlopen(f"{triton.metrics}/metrics", timeout=10) as r:
            text = r.read().decode()
        result["decoded_in_triton"] = [ln for ln in text.splitlines() if ln.startswith("gpuhost_frames_decoded_total{")]
    finally:
        triton.stop()
    result["triton_log"] = [ln for ln in triton.log().splitlines() if ln.startswith("gpuhost-frames {")][-4:]
    result["rows"] = compare(frames, refs, served, pixels)
    result["per_frame"] = {
        f.name: {
            "pixels_vs_pillow": pixels[f.name],
            **{mode: len(refs["files"][f.name][mode]) for mode in MODES},
            **{
                f"{label} vs {mode}": agreement(got[f.name], _boxes(refs["files"][f.name][mode]))
                for label, got in served.items()
                for mode in MODES
            },
        }
        for f in frames
    }
    return result


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--draws", type=int, default=1, help="noisy predictions per frame (the noise floor)")
    s = sub.add_parser("serve")
    s.add_argument("dir")
    s.add_argument("--out", required=True)
    s.add_argument("--cpu", action="store_true", help="KIND_CPU Triton here (FP32)")
    s.add_argument("--commit", default="", help="the tree's commit (the GPU machine has no .git)")
    r = sub.add_parser("render")
    r.add_argument("json")
    a = ap.parse_args(argv)
    if a.step == "make":
        doc = make(Path(a.dir), a.draws)
        print(json.dumps({"versions": doc["versions"], "seconds": doc["seconds"], "files": len(doc["files"])}))
        return 0
    if a.step == "render":
        print(table(json.loads(Path(a.json).read_text())))
        return 0
    result = serve(Path(a.dir), gpu=not a.cpu, commit=a.commit)
    result["command"] = "python -m bench.frames_agreement " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "frames_agreement.json").write_text(json.dumps(result, indent=1, default=str))
    md = table(result)
    (out / "frames_agreement.md").write_text(md)
    print(md, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
