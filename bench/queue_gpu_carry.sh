#!/usr/bin/env bash
# What bench/queue_gpu.sh needs beyond .gpucarry/whl: redis-py's wheel (.gpucarry/whl-redis) and Debian 12's
# redis-server with the shared libraries a bare machine may lack (.gpucarry/deb-redis). Run once on this machine.
set -euo pipefail
carry=${1:-.gpucarry}
mkdir -p "$carry/deb-redis" "$carry/whl-redis"
(cd "$carry/deb-redis" && apt-get download redis-server redis-tools libjemalloc2 liblzf1 libatomic1)
# Plain names (no %3a epoch): the device copies only files with ordinary names.
for f in "$carry"/deb-redis/*%3a*.deb; do [ -e "$f" ] && mv "$f" "${f/\%3a/-}"; done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  -d "$carry/whl-redis" "redis==8.1.0"
du -sh "$carry"/*
