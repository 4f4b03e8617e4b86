#!/usr/bin/env bash
# What bench/queue_gpu.sh needs beyond .gpucarry/whl: redis-py's and hiredis's wheels (.gpucarry/whl-redis; hiredis
# parses a 1.2 MB reply with ~7x less CPU than redis-py's Python parser) and Debian 12's
# redis-server with the shared libraries a bare machine may lack (.gpucarry/deb-redis). Run once on this machine.
set -euo pipefail
carry=${1:-.gpucarry}
mkdir -p "$carry/deb-redis" "$carry/whl-redis"
(cd "$carry/deb-redis" && apt-get download redis-server redis-tools libjemalloc2 liblzf1 libatomic1)
# Plain names (package.deb: no epoch's %3a, no ~), which any copy takes as they are.
for f in "$carry"/deb-redis/*_*.deb; do mv "$f" "$carry/deb-redis/$(dpkg-deb -f "$f" Package).deb"; done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  -d "$carry/whl-redis" "redis==8.1.0" "hiredis==3.5.0"
du -sh "$carry"/*
