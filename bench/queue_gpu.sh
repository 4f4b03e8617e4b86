#!/usr/bin/env bash
# Seed 001's queue gateway on the GPU (issue 27): bench/queue_gpu.py on a machine that cannot download. Carried:
# the wheels in .gpucarry/whl (pytriton's tritonserver, tritonclient, ...), redis-py and hiredis in .gpucarry/whl-redis and
# Debian's redis-server with the libraries it needs in .gpucarry/deb-redis (bench/queue_gpu_carry.sh fetches those
# two). About 6 minutes on one H200; requests carry JPEG camera frames (--input raw: 1.2 MB images).
# Usage: bash bench/queue_gpu.sh OUTDIR [bench.queue_gpu args...]
set -uo pipefail
out=${1:?usage: queue_gpu.sh OUTDIR [args]}; shift
carry=${GPUHOST_CARRY:-.gpucarry}
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -V; nproc
  python3 -c 'import torch, numpy; print("torch", torch.__version__, torch.version.cuda, torch.cuda.is_available(), "numpy", numpy.__version__)'
  python3 -c 'import grpc; print("grpcio", grpc.__version__)'
  python3 -c 'import torchvision; print("torchvision", torchvision.__version__)' || echo "no torchvision: no nvJPEG"
} 2>&1 | tee "$out/probe.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  "$carry"/whl/*.whl "$carry"/whl-redis/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p /tmp/redis
for f in "$carry"/deb-redis/*.deb; do dpkg -x "$f" /tmp/redis; done
printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/redis/usr/lib/x86_64-linux-gnu exec /tmp/redis/usr/bin/redis-server "$@"\n' \
  > /tmp/redis/redis-server
chmod +x /tmp/redis/redis-server
/tmp/redis/redis-server --version 2>&1 | tee -a "$out/probe.txt"
LD_LIBRARY_PATH=/tmp/redis/usr/lib/x86_64-linux-gnu ldd /tmp/redis/usr/bin/redis-check-rdb | grep -E 'not found' \
  | tee -a "$out/probe.txt"
python3 -c 'import redis, redis.utils; print("redis-py", redis.__version__, "hiredis", redis.utils.HIREDIS_AVAILABLE)' \
  2>&1 | tee -a "$out/probe.txt"
PYTHONUNBUFFERED=1 python3 -m bench.queue_gpu --redis-server /tmp/redis/redis-server --out "$out" "$@" 2>&1 \
  | tee "$out/log.txt"
exit "${PIPESTATUS[0]}"
