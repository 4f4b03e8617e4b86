#!/usr/bin/env bash
# gpuhost's two entry points (see README):
#   ./gpuhost.sh up     set up, boot the emulated GPU server, and `pulumi up` the dev stack against it
#   ./gpuhost.sh test   set up, lint, and run the whole test suite (what CI runs; arguments: one pytest run)
#   ./gpuhost.sh lint   ruff (lint + format check) and mypy only
set -euo pipefail
cd "$(dirname "$0")"

APT_PACKAGES=(
  python3-venv openssh-server openssh-client
  qemu-system-x86 qemu-utils ovmf debootstrap grub-efi-amd64-bin grub-pc-bin mtools dosfstools e2fsprogs fdisk
  libvirt-daemon-system libvirt-clients libvirt-dev pkg-config libxml2-utils
  nginx prometheus prometheus-node-exporter cpio zstd busybox-static ansible-core wrk numactl curl redis-server
  libturbojpeg0
)

setup() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
  # Debian starts these on install; the tests run their own instances on loopback ports.
  for s in nginx prometheus prometheus-node-exporter redis-server; do systemctl stop "$s" >/dev/null 2>&1 || service "$s" stop >/dev/null 2>&1 || true; done
  mkdir -p /run/sshd
  if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
  if pins_installed .venv requirements.txt; then
    echo "== .venv already has every pin of requirements.txt"
  else
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -r requirements.txt
  fi
  ultralytics_venv
}

# Whether the venv $1 has exactly the name==version pins of $2 (checked from the installed metadata, not assumed
# from an earlier run): a set-up already done is skipped, a changed pin or a broken venv installs again.
pins_installed() {
  "$1/bin/python" - "$2" <<'PY' 2>/dev/null
import re, sys
from importlib import metadata
want = {}
for line in open(sys.argv[1]):
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)==([^\s;#]+)", line)
    if m:
        want[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
have = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in metadata.distributions()}
bad = [f"{n}=={v} (have {have.get(n)})" for n, v in want.items() if have.get(n) != v and have.get(n, "").split("+")[0] != v]
sys.exit(1 if bad or not want else 0)
PY
}

# Ultralytics for the tests that compare the product with it: its own venv, made when it does not answer with the
# pinned release (a fresh one takes about a minute; never the product's requirements).
ultralytics_venv() {
  local want
  want=$(sed -n 's/^ultralytics==//p' requirements-ultralytics.txt)
  if [ "$(.venv-ultralytics/bin/python -c 'import ultralytics, onnxslim; print(ultralytics.__version__)' 2>/dev/null)" = "$want" ]; then
    return
  fi
  echo "== making .venv-ultralytics (Ultralytics $want, for the tests)"
  rm -rf .venv-ultralytics
  python3 -m venv .venv-ultralytics
  .venv-ultralytics/bin/pip install -q -r requirements-ultralytics.txt
}

lint() {
  echo "== ruff check, ruff format --check, mypy"
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  .venv/bin/mypy
}

usage() {
  cat <<'TXT'
usage: ./gpuhost.sh COMMAND [ARGS]

  test [PYTEST ARGS]  set up (Debian packages, .venv, .venv-ultralytics: each skipped when already there), lint,
                      then the whole suite as CI runs it (four pytest sessions in two chains, an emulated GPU server
                      booted under QEMU for the testhost ones); with arguments, one pytest run of exactly those:
                        ./gpuhost.sh test tests/test_nginx.py -k allowlist
                      GPUHOST_TEST_SERIAL=1: the whole suite in one session.
  up                  set up, boot the emulated GPU server and deploy the dev stack to it (tools/dev_up.py)
  lint                ruff check, ruff format --check, mypy
  setup               install what the tests need (Debian packages, .venv from requirements.txt, .venv-ultralytics)
  help                this text (also: ./gpuhost.sh COMMAND --help)
TXT
}

for a in "$@"; do
  case "$a" in
    -h | --help) [ "${1:-}" = test ] && [ "$#" -gt 1 ] && [ "$2" != "$a" ] || { usage; exit 0; } ;;
  esac
done

case "${1:-}" in
  help | -h | --help)
    usage
    ;;
  test)
    shift
    setup
    lint
    if [ $# -gt 0 ] || [ "${GPUHOST_TEST_SERIAL:-}" = 1 ]; then
      exec .venv/bin/python -m pytest -ra "$@"
    fi
    # An emulated server runs single-threaded TCG (one core), so at most two run at once on a 2-core machine. Four
    # pytest sessions in two chains of about equal length (output prefixed with the session's name):
    #   [rollout]  the two-host rollout (two servers) ... then [emulated]: the emulated-server tests (one server)
    #   [rest]     every test without an emulated server ... then, once [rollout] is done, [devstack]: the dev stack end
    #              to end and the tests marked second_session (tests/test_testhost.py: one server at a time)
    #   ... and after [emulated], [models]: five files of [rest] (the two model files, the plan diff, the Ultralytics
    #   export and the JPEG diagnosis: about 7 minutes under a fresh run's load), which keeps the chains even
    # The rollout's two servers overlap only [rest], which boots none. GPUHOST_TEST_SERIAL=1: one session.
    run_part() {  # name, pytest arguments
      local name=$1 t0=$SECONDS
      shift
      set +e
      .venv/bin/python -m pytest -ra --durations=25 --basetemp="/tmp/gpuhost-pytest-$name" "$@" 2>&1 |
        tee "/tmp/gpuhost-pytest-$name.log" | sed -u "s/^/[$name] /"
      local rc=${PIPESTATUS[0]}
      echo "== [$name] exit $rc after $((SECONDS - t0)) s (load: $(cut -d' ' -f1-3 /proc/loadavg))"
      echo "$rc" > "/tmp/gpuhost-pytest-$name.rc"
    }
    parts=(rollout emulated models rest devstack)
    models=(tests/test_yolov8n_triton.py tests/test_yolov8n_frames_ultralytics.py tests/test_plan_diff.py
      tests/test_yolov8n_ultralytics.py tests/test_jpeg_diag.py)
    for p in "${parts[@]}"; do rm -f "/tmp/gpuhost-pytest-$p.rc"; done
    {
      run_part rollout -m devstack tests/test_rollout_testhost.py
      run_part emulated -m "testhost and not devstack and not second_session"
      run_part models -m "not testhost" "${models[@]}"
    } &
    first=$!
    {
      run_part rest -m "not testhost" "${models[@]/#/--ignore=}"
      while [ ! -e /tmp/gpuhost-pytest-rollout.rc ]; do sleep 5; done
      run_part devstack -m "devstack or second_session" --ignore=tests/test_rollout_testhost.py
    } &
    second=$!
    wait "$first" "$second"
    rcs=$(for p in "${parts[@]}"; do cat "/tmp/gpuhost-pytest-$p.rc"; done | tr '\n' ' ')
    echo "== exit status of ${parts[*]}: $rcs"
    # A failed session's lines are far up in the interleaved output: say them again last, where a tail shows them.
    for p in "${parts[@]}"; do
      [ "$(cat "/tmp/gpuhost-pytest-$p.rc")" = 0 ] && continue
      echo "== [$p] failed; its errors (E lines) and short summary again:"
      grep -E '^E ' "/tmp/gpuhost-pytest-$p.log" | cut -c1-300 | head -40
      sed -n '/short test summary info/,$p' "/tmp/gpuhost-pytest-$p.log" | grep -vE '^(SKIPPED|XFAIL)' | cut -c1-300 | head -30
    done
    [ "$rcs" = "0 0 0 0 0 " ]
    ;;
  lint)
    lint
    ;;
  up)
    setup
    exec .venv/bin/python -m tools.dev_up
    ;;
  setup)
    setup
    ;;
  *)
    usage >&2
    exit 2
    ;;
esac
