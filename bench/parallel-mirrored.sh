#!/usr/bin/env bash
# The mirrored table on one device: one model on 1 slice against 2 and 4 mirrored slices, with the
# global batch = 64 per replica × replicas (as MirroredStrategy scales it): time per epoch, total
# time and test accuracy. Then the same global batch (256) on 1, 2 and 4 slices, which must reach
# the same accuracy (mirrored training is single-slice training on the global batch).
# Usage: bench/parallel-mirrored.sh [OUT_DIR]   (BACKEND=cpu|cuda|auto, SPLIT=logical|green|shared,
#        EPOCHS=N, JOB=jobs/parallel-mirrored.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
backend="${BACKEND:-auto}"
split="${SPLIT:-logical}"
job="${JOB:-jobs/parallel-mirrored.yaml}"
out="${1:-results/parallel-mirrored-${backend}}"
epochs_flag=()
[ -n "${EPOCHS:-}" ] && epochs_flag=(--epochs "$EPOCHS")
bin="${GPUMUX:-target/release/gpumux}"
[ -n "${GPUMUX:-}" ] || cargo build --release --quiet
mkdir -p "$out"
scaled=() same=()
for k in 1 2 4; do
    d="$out/scaled-$k"
    cmd=("$bin" parallel "$job" --slices "$k" --batch-size $((64 * k)) --split "$split" --backend "$backend" "${epochs_flag[@]}" --out "$d")
    echo "== ${cmd[*]}" | tee "$out/scaled-$k.txt"
    "${cmd[@]}" 2>&1 | tee -a "$out/scaled-$k.txt"
    scaled+=("$d")
done
for k in 1 2 4; do
    d="$out/global256-$k"
    cmd=("$bin" parallel "$job" --slices "$k" --batch-size 256 --split "$split" --backend "$backend" "${epochs_flag[@]}" --out "$d")
    echo "== ${cmd[*]}" | tee "$out/global256-$k.txt"
    "${cmd[@]}" 2>&1 | tee -a "$out/global256-$k.txt"
    same+=("$d")
done
mkdir -p "$out/scaled" "$out/global256"
python3 bench/parallel-tables.py "$out/scaled" "${scaled[@]}"
python3 bench/parallel-tables.py "$out/global256" "${same[@]}"
