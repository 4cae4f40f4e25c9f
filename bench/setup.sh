#!/usr/bin/env bash
# Install the peers the benchmarks compare gpuswarm with, into this machine / environment.
# Never project dependencies: only the benchmark needs them. Idempotent: installed ones are kept.
#
#   bash bench/setup.sh            # GNU parallel (apt) + simple_gpu_scheduler (pip) + gpuswarm
#   bash bench/setup.sh --ray      # ... and Ray (large; optional peer for throughput/idle/CPU)
#
# A peer that cannot be installed is reported and skipped; bench/run.py then reports it as
# "skipped (not installed)".
set -uo pipefail
cd "$(dirname "$0")/.."

WITH_RAY=0
for arg in "$@"; do
    case "$arg" in
        --ray) WITH_RAY=1 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "setup.sh: unknown option $arg (use --ray)" >&2; exit 2 ;;
    esac
done

PY="${PYTHON:-python}"
say() { printf 'bench/setup.sh: %s\n' "$*"; }

# gpuswarm itself (the code under test), editable so the benchmark measures the working tree
if ! "$PY" -c 'import gpuswarm' 2>/dev/null; then
    say "installing gpuswarm (editable)"
    "$PY" -m pip install -q -e . || say "could not install gpuswarm"
fi

# GNU parallel: Debian's package, when apt-get is there and we are root
if command -v parallel >/dev/null && parallel --version 2>/dev/null | grep -q 'GNU parallel'; then
    say "GNU parallel present: $(parallel --version | head -1)"
elif command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    say "installing GNU parallel (apt-get)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq parallel; } \
        >/dev/null || say "apt-get install parallel failed: GNU parallel will be skipped"
else
    say "GNU parallel missing and no root apt-get: it will be skipped (install 'parallel')"
fi
# GNU parallel asks once for a citation notice; acknowledge it so runs are not interrupted
if command -v parallel >/dev/null; then
    mkdir -p "$HOME/.parallel" && touch "$HOME/.parallel/will-cite"
fi

# simple_gpu_scheduler (PyPI): a non-durable per-GPU queue
if "$PY" -m pip show -q simple_gpu_scheduler >/dev/null 2>&1; then
    say "simple_gpu_scheduler present"
else
    say "installing simple_gpu_scheduler (pip)"
    "$PY" -m pip install -q simple_gpu_scheduler || say "pip install simple_gpu_scheduler failed"
fi

# Ray (optional): num_gpus=1 tasks on declared fake GPUs
if [ "$WITH_RAY" = 1 ]; then
    if "$PY" -c 'import ray' 2>/dev/null; then
        say "ray present: $("$PY" -c 'import ray; print(ray.__version__)')"
    else
        say "installing ray (pip)"
        "$PY" -m pip install -q 'ray>=2' || say "pip install ray failed: Ray will be skipped"
    fi
fi

"$PY" -c 'import psutil, rich' 2>/dev/null || "$PY" -m pip install -q psutil rich
say "done"
