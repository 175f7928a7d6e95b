#!/usr/bin/env bash
# The ratios table on one device: two slices of unequal speed (green partitions of 80 and 48 SMs
# on an H100), each global batch split evenly, then by the ratios a probe measured (auto):
# samples/s per slice and in total.
# Usage: bench/parallel-ratios.sh [OUT_DIR]   (BACKEND=cpu|cuda|auto, SPLIT=green|logical,
#        EPOCHS=N, BATCH=global batch, JOB=jobs/parallel-ratios.yaml). On the CPU use SPLIT=logical: there are no SMs to
#        split, so both slices run at the same speed and auto finds ratios near 1:1.
set -euo pipefail
cd "$(dirname "$0")/.."
backend="${BACKEND:-auto}"
split="${SPLIT:-green}"
job="${JOB:-jobs/parallel-ratios.yaml}"
out="${1:-results/parallel-ratios-${backend}}"
epochs_flag=()
[ -n "${EPOCHS:-}" ] && epochs_flag+=(--epochs "$EPOCHS")
[ -n "${BATCH:-}" ] && epochs_flag+=(--batch-size "$BATCH")
bin="${GPUMUX:-target/release/gpumux}"
[ -n "${GPUMUX:-}" ] || cargo build --release --quiet
mkdir -p "$out"
runs=()
for r in even auto; do
    d="$out/$r"
    cmd=("$bin" parallel "$job" --ratios "$r" --split "$split" --backend "$backend" "${epochs_flag[@]}" --out "$d")
    echo "== ${cmd[*]}" | tee "$out/$r.txt"
    "${cmd[@]}" 2>&1 | tee -a "$out/$r.txt"
    runs+=("$d")
done
python3 bench/parallel-tables.py "$out" "${runs[@]}"
