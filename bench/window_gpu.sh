#!/usr/bin/env bash
# Seed 004 on the GPU (issue 27): bench/window_gpu.py's four configurations under one changing open-loop load, on a
# machine that cannot download (the wheels carried in .gpucarry/whl, as bench/gpu_device.sh does; no nginx needed).
# About 6 minutes on one H200 (Triton's start ~40 s, two 5 s capacity probes, 4 × 60 s of load, 8 client
# processes). Exit status: 0 a result, 1 a wrong answer or a failed request, 3 client-bound (no result).
# Usage: bash bench/window_gpu.sh OUTDIR [bench.window_gpu args...]
set -uo pipefail
out=${1:?usage: window_gpu.sh OUTDIR [args]}; shift
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -V
  python3 -c 'import torch, numpy; print("torch", torch.__version__, torch.version.cuda, torch.cuda.is_available(), "numpy", numpy.__version__)'
} 2>&1 | tee "$out/probe.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpucarry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
PYTHONUNBUFFERED=1 python3 -m bench.window_gpu --out "$out" "$@" 2>&1 | tee "$out/log.txt"
exit "${PIPESTATUS[0]}"
