#!/usr/bin/env bash
# Accuracy benchmark on the full Fashion-MNIST (60k train, 10k test): the MLP 256-128-100 and the
# CNN against the published references (0.883 and 0.916 in the dataset's README).
# Needs the data: apt-get install dataset-fashion-mnist (or FASHION_DIR=/path/to/idx/files).
# Usage: bench/fashion-accuracy.sh [OUT_DIR]   (default results/fashion-accuracy-<backend>)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${FASHION_DIR:-/usr/share/datasets/fashion-mnist}"
backend="${BACKEND:-auto}"
out="${1:-results/fashion-accuracy-${backend}}"
mlp_epochs="${MLP_EPOCHS:-15}"
cnn_epochs="${CNN_EPOCHS:-3}"
mkdir -p "$out"
cargo build --release --quiet
bin=target/release/gpumux
run() {
    local name=$1; shift
    echo "== $name: $*" | tee "$out/$name.txt"
    "$bin" train --data fashion-mnist --data-path "$dir" --backend "$backend" --seed 1 "$@" 2>&1 | tee -a "$out/$name.txt"
}
run mlp --model mlp --hidden 256,128,100 --epochs "$mlp_epochs" --batch-size 128 --optimizer adam --lr 0.001
run cnn --model cnn --epochs "$cnn_epochs" --batch-size 128 --optimizer adam --lr 0.001 --dropout 0.25
acc() { grep '^done:' "$out/$1.txt" | sed 's/.*test acc \([0-9.]*\).*/\1/'; }
mlp=$(acc mlp); cnn=$(acc cnn)
{
    echo "model,test_acc,bar,reference"
    echo "mlp-256-128-100,$mlp,0.87,0.883"
    echo "cnn-32-64-128,$cnn,0.90,0.916"
} | tee "$out/summary.csv"
awk -v m="$mlp" -v c="$cnn" 'BEGIN { ok = (m >= 0.87 && c >= 0.90); print (ok ? "PASS" : "FAIL") ": mlp " m " (bar 0.87), cnn " c " (bar 0.90)"; exit !ok }'
