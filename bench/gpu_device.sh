#!/usr/bin/env bash
# Run bench.gpu on a GPU machine that cannot download: wheels and Debian's nginx are carried in .gpucarry/
# (see docs/benchmarks.md, "GPU serving"). Usage: bash bench/gpu_device.sh OUTDIR [bench.gpu args...]
set -uo pipefail
out=${1:?usage: gpu_device.sh OUTDIR [args]}; shift
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit,mig.mode.current \
    --format=csv
  command -v python3; python3 -V
  python3 -c 'import torch, numpy; print("torch", torch.__version__, torch.version.cuda, torch.cuda.is_available(), "numpy", numpy.__version__)'
  python3 -c 'import torchvision; print("torchvision", torchvision.__version__)' || echo "no torchvision: JPEG frames decode on the CPU"
  python3 -c 'import PIL; print("pillow", PIL.__version__)' || echo "no Pillow"
  python3 -m pip list 2>/dev/null | grep -i -E '^(tritonclient|nvidia-pytriton|grpcio|protobuf|pydantic|nvidia-ml-py|python-rapidjson) '
  command -v nginx || echo "no nginx on the machine"
} 2>&1 | tee "$out/probe.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpucarry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p /tmp/ngx /var/log/nginx
for f in .gpucarry/deb/*.deb; do dpkg -x "$f" /tmp/ngx; done
printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/ngx/usr/lib/x86_64-linux-gnu exec /tmp/ngx/usr/sbin/nginx "$@"\n' > /tmp/ngx/nginx
chmod +x /tmp/ngx/nginx
/tmp/ngx/nginx -V 2>&1 | head -1 | tee -a "$out/probe.txt"
ldd /tmp/site/pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub | grep -E 'python|not found' \
  | tee -a "$out/probe.txt"
# GPUHOST_BENCH picks the module: bench.gpu (default, the serving benchmark), bench.gpu_accuracy (every answer
# checked against its own image's reference) or bench.gpu_frames (JPEG frames against raw input, issue 26).
PYTHONUNBUFFERED=1 python3 -m "${GPUHOST_BENCH:-bench.gpu}" --nginx /tmp/ngx/nginx --out "$out" "$@" 2>&1 | tee "$out/log.txt"
