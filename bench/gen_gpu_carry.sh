#!/usr/bin/env bash
# What bench/gen_gpu.sh needs on a GPU machine that cannot download, in one folder, .gpucarry/gen (run once here):
# the wheels of .gpucarry/whl (pytriton's tritonserver, tritonclient, ...), redis-py/hiredis and Debian's
# redis-server (bench/queue_gpu_carry.sh), and diffusers (.gpucarry/whl-gen; its other needs, huggingface_hub,
# safetensors, regex, Pillow, are in the GPU image). The device carries 64 MiB with the working tree: pytriton's
# wheel (55 MB deflated) goes rewritten uncompressed and xz'd (36 MB), its files unchanged; gen_gpu.sh unpacks it.
set -euo pipefail
carry=${1:-.gpucarry}
[ -d "$carry/whl-redis" ] && [ -d "$carry/deb-redis" ] || bash bench/queue_gpu_carry.sh "$carry"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$carry/whl-gen" "diffusers==0.42.1"
out="$carry/gen"
rm -rf "$out"
mkdir -p "$out"
for f in "$carry"/whl/*.whl "$carry"/whl-redis/*.whl "$carry"/whl-gen/*.whl; do
  case "$f" in *nvidia_pytriton*) ;; *) cp "$f" "$out/" ;; esac
done
cp "$carry"/deb-redis/*.deb "$out/"
python3 - "$carry"/whl/nvidia_pytriton-*.whl "$out" <<'PY'
import lzma, os, sys, zipfile
src, out = sys.argv[1], sys.argv[2]
stored = os.path.join(out, os.path.basename(src))
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(stored, "w", zipfile.ZIP_STORED) as zo:
    for info in zi.infolist():
        copy = zipfile.ZipInfo(info.filename, info.date_time)
        copy.external_attr = info.external_attr
        zo.writestr(copy, zi.read(info))
with open(stored, "rb") as f, lzma.open(stored + ".xz", "wb", preset=6) as g:
    while chunk := f.read(1 << 20):
        g.write(chunk)
os.remove(stored)
PY
du -sh "$out"
