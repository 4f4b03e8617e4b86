"""nvJPEG's planes with libjpeg's upsampling and colour conversion on the GPU (issue 39): how far and how fast.

On a GPU machine: which libnvjpeg ``serving/models/jpeg_planes.py`` loads and whether nvJPEG's hardware decoder is
used; for each frame class at odd and even sizes (``sample_frames.frame_classes``) the decoder ``frames.route``
picks with ``exact`` and its largest difference from Pillow, beside nvJPEG's own RGB; then the time one instance
takes to decode a batch of 1280×720 4:2:0 frames (the gate's frames, quality 90) each way, one thread, the GPU
synchronised after each batch: nvJPEG's planes + libjpeg's upsampling (``exact`` now), nvJPEG's RGB (``nvjpeg``),
libjpeg on the host (``exact`` before the planes, 4 threads), and the planes path's two halves apart.

Usage (the GPU machine's python3, from the repository root)::

    python3 -m bench.jpeg_planes --out OUT      # OUT/jpeg_planes.json and OUT/jpeg_planes.md
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import git_commit  # noqa: E402
from gate import sample_frames  # noqa: E402

SIZES = [(327, 245), (1280, 720), (1281, 719)]


def _diff(img, data: bytes, orientation: int) -> int:
    import numpy as np
    from PIL import Image, ImageOps

    ref = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")).astype(np.int16)
    got = img.permute(1, 2, 0).cpu().numpy().astype(np.int16)
    return int(np.abs(got - ref).max()) if got.shape == ref.shape else -1


def pixels(torch, fr) -> list[dict]:
    """Per class and size: exact's route, the decoder that answered, its max |diff| from Pillow, nvJPEG RGB's."""
    exact = fr.Decoder(torch.device("cuda"), "gpu")
    rows: list[dict[str, Any]] = []
    for w, h in SIZES:
        by_class = sample_frames.frame_classes(w, h)
        names = list(by_class)
        before = dict(exact.served)
        got = exact.decode([torch.frombuffer(bytearray(by_class[n]), dtype=torch.uint8) for n in names])
        for name, img in zip(names, got):
            data = by_class[name]
            head = fr.read_header(data)
            try:
                nv = fr.orient(exact._gpu([torch.frombuffer(bytearray(data), dtype=torch.uint8)])[0], head.orientation)
                nv_diff = _diff(nv, data, head.orientation)
            except RuntimeError:
                nv_diff = None  # nvJPEG refuses it (CMYK / YCCK)
            rows.append(
                {
                    "size": f"{w}x{h}",
                    "class": name,
                    "route": "/".join(fr.route(head)),
                    "diff": _diff(img, data, head.orientation) if isinstance(img, torch.Tensor) else str(img),
                    "nvjpeg_rgb_diff": nv_diff,
                }
            )
        rows.append({"size": f"{w}x{h}", "served": {k: v - before.get(k, 0) for k, v in exact.served.items()}})
    return rows


def variants(torch, fr, jp) -> list[dict]:
    """nvJPEG's planes each way it can give them (hardware or default backend, ``yuv`` or ``unchanged``) on the
    classes ``exact`` routes to them: frames decoded, max |diff| from Pillow, nvjpegGetImageInfo's plane sizes."""
    out: list[dict[str, Any]] = []
    for kw in ({}, {"output": "unchanged"}, {"hardware": False}):
        try:
            nv = jp.NvjpegPlanes(torch.device("cuda"), **kw)
        except (OSError, RuntimeError) as e:
            out.append({"variant": kw, "error": f"{type(e).__name__}: {e}"})
            continue
        for w, h in SIZES:
            by_class = sample_frames.frame_classes(w, h)
            names = [n for n, d in by_class.items() if fr.route(fr.read_header(d))[0] == "planes"]
            heads = [fr.read_header(by_class[n]) for n in names]
            rows = [torch.frombuffer(bytearray(by_class[n]), dtype=torch.uint8) for n in names]
            got = nv.decode(rows, [(hd.width, hd.height, hd.sampling) for hd in heads])
            diffs = {
                n: _diff(fr.orient(img, hd.orientation), by_class[n], hd.orientation)
                for n, img, hd in zip(names, got, heads)
                if img is not None
            }
            out.append(
                {
                    "variant": kw,
                    "hardware": nv.hardware,
                    "size": f"{w}x{h}",
                    "decoded": f"{len(diffs)}/{len(names)}",
                    "max_diff": max(diffs.values(), default=None),
                    "refused": [n for n, img in zip(names, got) if img is None],
                    "last_error": nv.last_error,
                    "info_420": nv.info(rows[names.index("baseline-420")]),
                    "info_422": nv.info(rows[names.index("baseline-422")]),
                }
            )
            print(json.dumps(out[-1]), flush=True)
    return out


def _time(torch, fn, repeats: int) -> dict:
    fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t0) * 1000)
    ms.sort()
    return {"median_ms": round(statistics.median(ms), 3), "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 3)}


def timing(torch, fr, jp, repeats: int) -> list[dict]:
    """ms per batch of 1, 4 and 8 distinct 1280×720 4:2:0 frames, each decoder; frames/s = batch / median."""
    dev = torch.device("cuda")
    data = [sample_frames.jpeg(1280, 720, seed=100 + k) for k in range(8)]
    rows_all = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in data]
    exact = fr.Decoder(dev, "gpu", cpu_threads=4)
    nvjpeg = fr.Decoder(dev, "gpu", jpeg_decoder="nvjpeg")
    host = fr.Decoder(dev, "gpu", cpu_threads=4)
    host._planes = None  # exact before the planes: 4:2:0 to libjpeg on the host, 4 threads
    sampling = fr.read_header(data[0]).sampling
    out = []
    for n in (1, 4, 8):
        rows = rows_all[:n]
        sizes = [(1280, 720, sampling)] * n
        y = torch.empty((n, 720, 1280), dtype=torch.uint8, device=dev)
        c = torch.full((n, 2, 360, 640), 128, dtype=torch.uint8, device=dev)
        planes = exact._planes
        assert planes is not None
        cases = {
            "exact (nvJPEG planes + libjpeg upsampling)": partial(exact.decode, rows),
            "nvjpeg (nvJPEG RGB)": partial(nvjpeg.decode, rows),
            "exact before (libjpeg on host, 4 threads)": partial(host.decode, rows),
            "planes: nvjpegDecodeBatched + planes_to_rgb": partial(planes.decode, rows, sizes),
            "planes_to_rgb alone (torch)": partial(jp.planes_to_rgb, y, c, (2, 2)),
        }
        if planes.kernel == "triton":
            cases["fused_planes_to_rgb alone (Triton)"] = partial(jp.fused_planes_to_rgb, y, c, (2, 2))
        for name, fn in cases.items():
            t = _time(torch, fn, repeats)
            out.append({"batch": n, "decoder": name, **t, "frames_per_s": round(n * 1000 / t["median_ms"], 1)})
    return out


def steps(torch, fr, jp, repeats: int) -> list[dict]:
    """Host ms of each call of the planes path for a batch of 1 and 8 distinct 1280×720 4:2:0 frames, median of
    ``repeats``: the header checks nvJPEG makes per frame (``accepts``), ``nvjpegDecodeBatchedInitialize``,
    ``nvjpegDecodeBatched`` until it returns and then until the stream is done (whether the call waits for the
    hardware decoder), the same decode without a new Initialize before it (the state kept from the last batch of the
    same size), the fused kernel's launch, and ``Decoder.decode`` as a whole (what an execute's decode phase runs)."""
    import ctypes

    dev = torch.device("cuda")
    data = [sample_frames.jpeg(1280, 720, seed=100 + k) for k in range(8)]
    rows_all = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in data]
    exact = fr.Decoder(dev, "gpu")
    nv = exact._planes
    assert nv is not None
    sampling = fr.read_header(data[0]).sampling
    lib = nv._lib
    out = []
    for n in (1, 8):
        rows = rows_all[:n]
        y = torch.empty((n, 720, 1280), dtype=torch.uint8, device=dev)
        c = torch.empty((n, 2, 360, 640), dtype=torch.uint8, device=dev)
        imgs = (jp._Image * n)()
        for j in range(n):
            imgs[j].channel[0], imgs[j].pitch[0] = y[j].data_ptr(), 1280
            imgs[j].channel[1], imgs[j].pitch[1] = c[j, 0].data_ptr(), 640
            imgs[j].channel[2], imgs[j].pitch[2] = c[j, 1].data_ptr(), 640
        ptrs = (ctypes.c_void_p * n)(*[r.data_ptr() for r in rows])
        lens = (ctypes.c_size_t * n)(*[r.numel() for r in rows])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        times: dict[str, list[float]] = {}

        def lap(name: str, t0: float, times: dict = times) -> float:
            t = time.perf_counter()
            times.setdefault(name, []).append((t - t0) * 1000)
            return t

        for k in range(repeats + 3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for r in rows:
                nv.accepts(r, 1280, 720, sampling)
            t = lap("accepts (per batch)", t)
            lib.nvjpegDecodeBatchedInitialize(nv.handle, nv.state, n, 1, nv.output)
            t = lap("nvjpegDecodeBatchedInitialize", t)
            lib.nvjpegDecodeBatched(nv.handle, nv.state, ptrs, lens, imgs, stream)
            t = lap("nvjpegDecodeBatched (returns)", t)
            torch.cuda.synchronize()
            t = lap("then until the stream is done", t)
            lib.nvjpegDecodeBatched(nv.handle, nv.state, ptrs, lens, imgs, stream)
            t = lap("nvjpegDecodeBatched again, no Initialize (returns)", t)
            torch.cuda.synchronize()
            t = lap("then until the stream is done (no Initialize)", t)
            jp.fused_planes_to_rgb(y, c, (2, 2))
            t = lap("fused kernel (launch)", t)
            torch.cuda.synchronize()
            t = lap("fused kernel (then done)", t)
            exact.decode(rows)
            t = lap("Decoder.decode (returns)", t)
            torch.cuda.synchronize()
            lap("Decoder.decode (then done)", t)
            if k < 3:
                times.clear()
        for name, ms in times.items():
            ms.sort()
            out.append({"batch": n, "step": name, "median_ms": round(statistics.median(ms), 3),
                        "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 3)})  # fmt: skip
            print(json.dumps(out[-1]), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--commit", default="", help="the tree's commit where it is not a git checkout")
    ap.add_argument("--only", default="pixels,variants,timing,steps", help="parts to run (comma-separated)")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    import torch

    from serving.models import frames as fr
    from serving.models import jpeg_planes as jp

    probe = fr.Decoder(torch.device("cuda"), "gpu")
    nv = probe._planes
    head: dict[str, Any] = {
        "commit": args.commit or git_commit(),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "decoder": probe.name,
        "planes_error": probe.planes_error,
        "libnvjpeg": nv.library if nv else None,
        "nvjpeg_version": nv.version if nv else None,
        "hardware_backend": nv.hardware if nv else None,
        "kernel": nv.kernel if nv else None,
        "kernel_error": nv.kernel_error if nv else None,
    }
    print(json.dumps(head), flush=True)
    result: dict[str, Any] = {
        **head,
        "variants": variants(torch, fr, jp) if "variants" in only else [],
        "pixels": pixels(torch, fr) if "pixels" in only else [],
        "timing": timing(torch, fr, jp, args.repeats) if nv and "timing" in only else [],
        "steps": steps(torch, fr, jp, args.repeats) if nv and "steps" in only else [],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "jpeg_planes.json").write_text(json.dumps(result, indent=1))
    lines = [
        json.dumps(head),
        "",
        "| size | class | route (exact) | max diff | nvJPEG RGB max diff |",
        "|---|---|---|---|---|",
    ]
    for r in result["pixels"]:
        if "served" in r:
            lines.append(f"| {r['size']} | served by | {r['served']} | | |")
        else:
            lines.append(f"| {r['size']} | {r['class']} | {r['route']} | {r['diff']} | {r['nvjpeg_rgb_diff']} |")
    lines += ["", *(json.dumps(v) for v in result["variants"])]
    lines += ["", "| batch | decoder | median ms | p95 ms | frames/s |", "|---|---|---|---|---|"]
    for t in result["timing"]:
        lines.append(f"| {t['batch']} | {t['decoder']} | {t['median_ms']} | {t['p95_ms']} | {t['frames_per_s']} |")
    if result["steps"]:
        lines += ["", "Host ms per call of the planes path (median / p95):", "", "| batch | step | median | p95 |"]
        lines += ["|---|---|---|---|"] + [
            f"| {t['batch']} | {t['step']} | {t['median_ms']} | {t['p95_ms']} |" for t in result["steps"]
        ]
    (out / "jpeg_planes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    bad = [r for r in result["pixels"] if "diff" in r and r["diff"] not in (0, 1) and "Error" not in str(r["diff"])]
    return 1 if bad or probe.planes_error else 0


if __name__ == "__main__":
    sys.exit(main())
