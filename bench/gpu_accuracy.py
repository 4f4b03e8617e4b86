"""Every answer is its own image's, on the GPU: the YOLOv8n fast path served FP16 through Triton and nginx.

The test detector's weights (``serving/models/yolov8n_synthetic.py``, made on the CPU, seed 0) are shipped as the
model's weights file; the repository holds two models with the GPU's preset (instances, max batch, window; CUDA
graphs, FP16): ``yolov8n_raw`` (``output0`` [84, 8400]) and ``yolov8n_nms`` (detections on the GPU). ``--n``
distinct synthetic images go through nginx, each once, ``--concurrency`` in flight (``bench/yolo_check.py``'s
client: binary tensors, keep-alive), and every answer is compared with

* its own reference: the same weights file loaded by ``yolov8n_weights``, fused, eager FP16 batch 1 on the same
  GPU (``Preprocess`` from uint8 as the backend does); the served answer came from a CUDA graph of the batch size
  Triton formed (padded), so FP16 rounding differs: the report gives the maximum own difference (all anchors, and
  anchors whose score passes conf) against the minimum difference to any other image's reference, and how many
  images have their own reference as the nearest;
* the eager FP32 reference (FP16 vs FP32, informative);
* NMS detections as sets (class + IoU ≥ 0.5) against eager FP16 and FP32 batch-1 NMS.

The batch sizes Triton formed come from its statistics. Writes ``accuracy.json`` and ``accuracy.md`` to ``--out``.

Usage::

    python -m bench.gpu_accuracy --nginx /tmp/ngx/nginx --out /tmp/acc            # H200: N=256, c=16
    python -m bench.gpu_accuracy --cpu --n 16 --concurrency 4 --out /tmp/acc       # CPU pipeline check (FP32)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu import machine, on_preset, preset_key  # noqa: E402
from bench.report import md_table  # noqa: E402
from bench.servers import batch_sizes, log, model_stats, start_servers  # noqa: E402
from bench.yolo_check import (  # noqa: E402
    WEIGHTS_FILE,
    detection_report,
    h200_on_cpu,
    raw_report,
    references,
    repository,
    send_all,
    weights_file,
)
from plans.triton_repo import yolov8n_torch  # noqa: E402

NMS = dict(max_det=100, candidates=256, conf=0.25, iou=0.45)
RAW_HEAD = [
    "model",
    "batch sizes Triton formed (size: executions)",
    "compared with",
    "own max diff (boxes px / boxes above conf px / scores)",
    "min diff to another image's (max / mean abs)",
    "nearest reference is own",
]
NMS_HEAD = [
    "model",
    "batch sizes",
    "compared with",
    "served / reference detections",
    "matched (max box px, score)",
    "unmatched near conf / other",
    "identical sets",
]


def run(args) -> dict:
    import numpy as np
    import torch

    from serving.models.yolov8n_synthetic import synthetic_images

    gpu = not args.cpu
    device = "cuda:0" if gpu else "cpu"
    nginx_bin = args.nginx or shutil.which("nginx") or "/usr/sbin/nginx"
    info = machine(nginx_bin)
    gpu_name = preset_key(info, args.gpu_model)
    t0 = time.monotonic()
    weights = weights_file(args.seed)
    images = synthetic_images(args.n, seed=args.image_seed)
    log(f"weights ({len(weights)} B) and {args.n} images in {time.monotonic() - t0:.1f} s")

    def spec(name, output):
        if not gpu:  # CPU check: the H200 preset's batching on KIND_CPU instances
            return h200_on_cpu(name, output)
        return on_preset(yolov8n_torch(name=name, output=output, gpu=gpu, weights=WEIGHTS_FILE), gpu_name)

    specs = [spec("yolov8n_raw", "raw"), spec("yolov8n_nms", "nms")]
    files = repository(specs, weights, gpu)
    out: dict = {
        "machine": info,
        "args": vars(args),
        "gpu_model": gpu_name,
        "weights": f"test detector (serving/models/yolov8n_synthetic.py, seed {args.seed}), {WEIGHTS_FILE}",
        "images": f"{args.n} distinct synthetic images (seed {args.image_seed})",
        "config": {
            s.name: {
                "instances": s.instance_group[0].count,
                "kind": s.instance_group[0].kind,
                "max_batch": s.max_batch_size,
                "window_us": s.dynamic_batching.max_queue_delay_microseconds if s.dynamic_batching else None,
                "parameters": dict(s.parameters),
            }
            for s in specs
        },
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    prec = "fp16" if gpu else "fp32"
    ref, ref_sets = references(weights, images, device, prec, **NMS)
    ref32, ref32_sets = references(weights, images, device, "fp32", **NMS) if gpu else (ref, ref_sets)
    if gpu:
        torch.cuda.empty_cache()
    log("references done")
    workdir = Path(tempfile.mkdtemp(prefix="gpuhost-accuracy-"))
    s = start_servers(workdir, specs, files, nginx_bin, http_threads=args.http_threads)
    try:
        for name, outputs in (("yolov8n_raw", ["output0"]), ("yolov8n_nms", ["detections", "num_detections"])):
            before = model_stats(s.http, name)
            t1 = time.monotonic()
            answers = send_all(s.nginx_http, name, images, outputs, args.concurrency)
            wall = time.monotonic() - t1
            formed = batch_sizes(before, model_stats(s.http, name))
            row: dict = {"requests": len(answers), "concurrency": args.concurrency, "wall_s": round(wall, 2)}
            row["batches"] = formed
            if name == "yolov8n_raw":
                got = torch.from_numpy(np.stack([a["output0"][0] for a in answers]).astype(np.float32)).to(device)
                row[f"vs_eager_{prec}_batch1"] = raw_report(got, ref)
                if gpu:
                    row["vs_eager_fp32_batch1"] = raw_report(got, ref32)
                    row["eager_fp16_vs_eager_fp32"] = raw_report(ref, ref32)
            else:
                got_sets = [a["detections"][0, : int(a["num_detections"][0, 0])] for a in answers]
                row["stale_rows"] = sum(
                    int(a["detections"][0, int(a["num_detections"][0, 0]) :].any()) for a in answers
                )
                row[f"vs_eager_{prec}_batch1"] = detection_report(got_sets, ref_sets, conf=NMS["conf"])
                row["vs_next_images_reference"] = detection_report(got_sets, ref_sets[1:] + ref_sets[:1])
                if gpu:
                    row["vs_eager_fp32_batch1"] = detection_report(got_sets, ref32_sets, conf=NMS["conf"])
            out[name] = row
            log(f"{name}: {json.dumps(row)}")
    finally:
        out["triton_log_tail"], _ = s.finish()
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return out


def report(r: dict) -> str:
    prec = "fp16" if not r["args"]["cpu"] else "fp32"
    raw, nms = r["yolov8n_raw"], r["yolov8n_nms"]
    raw_rows, nms_rows = [], []
    for key in dict.fromkeys((f"vs_eager_{prec}_batch1", "vs_eager_fp32_batch1", "eager_fp16_vs_eager_fp32")):
        if (x := raw.get(key)) is not None:
            eager = key.startswith("eager")
            raw_rows.append(
                [
                    "yolov8n_raw",
                    raw["batches"]["sizes"] if not eager else "–",
                    "eager FP16 vs eager FP32" if eager else key.replace("vs_", "").replace("_", " "),
                    f"{x['own_max_box_px']:.3g} / {x['own_max_box_px_above_conf']:.3g} / {x['own_max_score']:.3g}",
                    f"{x['other_min']:.3g} / {x['other_min_mean_abs']:.3g}",
                    f"{x['nearest_reference_is_own']}/{x['images']}",
                ]
            )
    for key in dict.fromkeys((f"vs_eager_{prec}_batch1", "vs_eager_fp32_batch1", "vs_next_images_reference")):
        if (x := nms.get(key)) is not None:
            nms_rows.append(
                [
                    "yolov8n_nms",
                    nms["batches"]["sizes"],
                    key.replace("vs_", "").replace("_", " "),
                    f"{x['served_detections']} / {x['reference_detections']}",
                    f"{x['matched']} ({x['matched_max_box_px']:.3g}, {x['matched_max_score']:.3g})",
                    f"{x['unmatched_near_threshold']} / {x['unmatched']}",
                    f"{x['images_identical_sets']}/{x['images']}",
                ]
            )
    lines = [
        f"Every answer is its own image's: {r['images']}, each sent once through nginx at concurrency "
        f"{raw['concurrency']}; weights: {r['weights']}; {r['gpu_model'] or 'CPU'}; {r['started']}.",
        "",
        *md_table(RAW_HEAD, raw_rows),
        "",
        *md_table(NMS_HEAD, nms_rows),
    ]
    lines.append("")
    lines.append(f"Rows past num_detections not zero: {nms['stale_rows']}. Own-reference check: "
                 f"{'PASS' if verdict(r) else 'FAIL'} ({verdict_text(r)}).")  # fmt: skip
    return "\n".join(lines) + "\n"


def verdict_text(r: dict) -> str:
    prec = "fp16" if not r["args"]["cpu"] else "fp32"
    a = r["yolov8n_raw"][f"vs_eager_{prec}_batch1"]
    return (
        f"every image's nearest reference is its own: {a['nearest_reference_is_own']}/{a['images']}; own max "
        f"mean-abs diff {a['own_max_mean_abs']:.3g} < other min mean-abs diff {a['other_min_mean_abs']:.3g}; "
        f"no stale rows"
    )


def verdict(r: dict) -> bool:
    prec = "fp16" if not r["args"]["cpu"] else "fp32"
    a = r["yolov8n_raw"][f"vs_eager_{prec}_batch1"]
    return (
        a["nearest_reference_is_own"] == a["images"]
        and a["own_max_mean_abs"] < a["other_min_mean_abs"]
        and r["yolov8n_nms"]["stale_rows"] == 0
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--cpu", action="store_true", help="KIND_CPU instances, FP32 (a pipeline check without a GPU)")
    ap.add_argument("--nginx", default="")
    ap.add_argument("--gpu-model", default="")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--image-seed", type=int, default=2)
    ap.add_argument("--http-threads", type=int, default=16)
    args = ap.parse_args(argv)
    r = run(args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "accuracy.json").write_text(json.dumps(r, indent=1, default=str))
    md = report(r)
    (Path(args.out) / "accuracy.md").write_text(md)
    print(md, flush=True)
    return 0 if verdict(r) else 1


if __name__ == "__main__":
    sys.exit(main())
