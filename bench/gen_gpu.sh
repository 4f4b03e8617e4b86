#!/usr/bin/env bash
# Seed 001's own workload on the GPU (issue 42 §1): bench/gen_gpu.py on a machine that cannot download. Carried:
# .gpucarry/gen (bench/gen_gpu_carry.sh: pytriton's tritonserver xz'd, tritonclient, redis-py, hiredis, Debian's
# redis-server, diffusers). diffusers goes into the image's own Python: Triton's python-backend stub ignores
# PYTHONPATH and finds packages through the interpreter on PATH. About 7 minutes on one H200 with the defaults.
# Usage: bash bench/gen_gpu.sh OUTDIR [bench.gen_gpu args...]
set -uo pipefail
out=${1:?usage: gen_gpu.sh OUTDIR [args]}; shift
carry=${GPUHOST_CARRY:-.gpucarry}/gen
mkdir -p "$out" /tmp/whl
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -V; nproc
  python3 -c 'import torch, numpy; print("torch", torch.__version__, torch.version.cuda, torch.cuda.is_available(), "numpy", numpy.__version__)'
} 2>&1 | tee "$out/probe.txt"
python3 - "$carry" <<'PY' || exit 1
import glob, lzma, os, shutil, sys
for src in glob.glob(os.path.join(sys.argv[1], "*.whl.xz")):
    with lzma.open(src) as f, open(os.path.join("/tmp/whl", os.path.basename(src)[:-3]), "wb") as g:
        shutil.copyfileobj(f, g, 1 << 20)
PY
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/whl/*.whl \
  $(ls "$carry"/*.whl | grep -v diffusers) || exit 1
python3 -m pip install -q --no-index --no-deps --no-cache-dir "$carry"/diffusers-*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p /tmp/redis
for f in "$carry"/*.deb; do dpkg -x "$f" /tmp/redis; done
printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/redis/usr/lib/x86_64-linux-gnu exec /tmp/redis/usr/bin/redis-server "$@"\n' \
  > /tmp/redis/redis-server
chmod +x /tmp/redis/redis-server
{
  /tmp/redis/redis-server --version
  python3 -c 'import diffusers, huggingface_hub, redis, redis.utils; print("diffusers", diffusers.__version__, "hub", huggingface_hub.__version__, "redis-py", redis.__version__, "hiredis", redis.utils.HIREDIS_AVAILABLE)'
} 2>&1 | tee -a "$out/probe.txt"
PYTHONUNBUFFERED=1 python3 -m bench.gen_gpu --redis-server /tmp/redis/redis-server --out "$out" "$@" 2>&1 \
  | tee "$out/log.txt"
exit "${PIPESTATUS[0]}"
