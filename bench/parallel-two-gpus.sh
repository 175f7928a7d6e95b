#!/usr/bin/env bash
# Slices on two GPUs: jobs/parallel-two-gpus.yaml (two devices of unequal speed, ratios auto) with
# `gpumux parallel`, then a two-round fib of the same slices. With fewer than two visible GPUs it
# checks instead that gpumux stops before training, exit 4, naming device 1. The GPUs are counted
# by `gpumux devices --backend cuda` (nvidia-smi is not needed). With BACKEND=cpu (a rehearsal of
# the GPU check) it checks that the CPU backend refuses device 1, exit 2.
# Usage: bench/parallel-two-gpus.sh [OUT_DIR]   (GPUMUX=path to the binary, BACKEND=cuda|cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/parallel-two-gpus}"
bin="${GPUMUX:-target/release/gpumux}"
[ -n "${GPUMUX:-}" ] || cargo build --release --quiet
backend="${BACKEND:-cuda}"
mkdir -p "$out"
gpus=0
if [ "$backend" != cpu ]; then
    gpus=$("$bin" devices --backend cuda 2>/dev/null | grep -c '^CUDA device ' || true)
fi
echo "visible GPUs: $gpus (backend $backend)"
if [ "${gpus:-0}" -lt 2 ]; then
    want=4 says="cannot open CUDA device 1"
    [ "$backend" = cpu ] && want=2 says="names device 1, but the CPU backend has device 0 only"
    set +e
    "$bin" parallel jobs/parallel-two-gpus.yaml --backend "$backend" --out "$out/parallel" >"$out/one-gpu.txt" 2>&1
    rc=$?
    set -e
    cat "$out/one-gpu.txt"
    if [ "$rc" -eq "$want" ] && grep -q "$says" "$out/one-gpu.txt"; then
        echo "fewer than two GPUs: gpumux stopped as it should (exit $rc); the two-GPU run is not validated here"
        exit 0
    fi
    echo "fewer than two GPUs: expected exit $want with '$says', got exit $rc"
    exit 1
fi
"$bin" parallel jobs/parallel-two-gpus.yaml --backend "$backend" --out "$out/parallel" 2>&1 | tee "$out/parallel.txt"
grep -q "replicas identical: yes" "$out/parallel.txt"
"$bin" fib jobs/parallel-two-gpus.yaml --backend "$backend" --n 2,4 --splits logical --epochs 1 --out "$out/fib" 2>&1 | tee "$out/fib.txt"
grep -q "d0:" "$out/fib/runs.csv"
grep -q "d1:" "$out/fib/runs.csv"
echo "two GPUs: parallel and fib ran with slices on devices 0 and 1"
