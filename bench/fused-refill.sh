#!/usr/bin/env bash
# Fused pruning with refill: a `split: fused` sweep of RUN_CAP MLP trials on MNIST-10k (9 epochs,
# Adam, batch 64; lr, weight decay and dropout searched) run three ways, interleaved per seed:
#   pruned    method: bayes, early_terminate: hyperband (eta 3): a trial stopped at a rung frees its
#             slot in its fused group, and the next proposal takes it at the group's next epoch;
#   bayes     method: bayes, no early termination (each trial's end frees its slot alike);
#   random    method: random, no early termination (the fused groups of the round, as before).
# For each: the wall time, the trial-epochs trained, the best COMPLETE test_acc, and the time at
# which the sweep's best COMPLETE trial first reached the best of the unpruned bayes sweep of the
# same seed (from each trial's end time in the sweep's log), and came within 0.005 of it.
# Output in OUT: runs.csv (one line per sweep), summary.md, command.txt, and each sweep's folder
# and log.
#
# Usage: bench/fused-refill.sh [OUT]     (default results/fused-refill-<backend>)
#   GPUMUX=path/to/gpumux   (default: target/release/gpumux, built here)
#   SEEDS="1 2 3"  RUN_CAP=512  CONCURRENCY=8  BACKEND=auto
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${GPUMUX:-target/release/gpumux}"
[ -n "${GPUMUX:-}" ] || cargo build --release --quiet
bin="$(realpath "$bin")"
seeds="${SEEDS:-1 2 3}"
run_cap="${RUN_CAP:-512}"
concurrency="${CONCURRENCY:-8}"
backend="${BACKEND:-auto}"
kind="$("$bin" devices 2>/dev/null | grep -q '^backend: cuda' && echo gpu || echo cpu)"
[ "$backend" = cpu ] && kind=cpu
out="${1:-results/fused-refill-$kind}"
mkdir -p "$out/jobs"
{
    echo "# bench/fused-refill.sh $*  (SEEDS=\"$seeds\" RUN_CAP=$run_cap CONCURRENCY=$concurrency BACKEND=$backend)"
    echo "# $("$bin" --version), $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "# device: $("$bin" devices 2>/dev/null | tail -1)"
    echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; load at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/command.txt"

# job NAME SEED METHOD PRUNE: writes the job file, prints its path.
job() {
    local path="$out/jobs/$1.yaml"
    {
        echo "name: $1"
        echo "model: {kind: mlp, hidden: [128]}"
        echo "data: {source: mnist-10k}"
        echo "train: {epochs: 9, batch_size: 64, optimizer: adam}"
        echo "seed: $2"
        echo "method: $3"
        echo "run_cap: $run_cap"
        echo "metric: {name: test_acc, goal: maximize}"
        [ "$4" = yes ] && echo "early_terminate: {type: hyperband, min_iter: 1, eta: 3}"
        echo "concurrency: $concurrency"
        echo "split: fused"
        echo "backend: $backend"
        echo "parameters:"
        echo "  lr: {min: 0.00001, max: 0.1, distribution: log_uniform_values}"
        echo "  weight_decay: {min: 0.000001, max: 0.01, distribution: log_uniform_values}"
        echo "  dropout: {min: 0.05, max: 0.6}"
    } >"$path"
    echo "$path"
}

echo "seed,sweep,start_unix,wall_s,trials,complete,pruned,trial_epochs,best_test_acc,log" >"$out/runs.csv"
k=0
for seed in $seeds; do
    orders=("pruned bayes random" "bayes random pruned" "random pruned bayes")
    for sweep in ${orders[$((k % 3))]}; do
        case $sweep in
            pruned) file=$(job "refill-pruned-$seed" "$seed" bayes yes) ;;
            bayes) file=$(job "refill-bayes-$seed" "$seed" bayes no) ;;
            random) file=$(job "refill-random-$seed" "$seed" random no) ;;
        esac
        dir="$out/$sweep-$seed"
        rm -rf "$dir"
        echo "$bin sweep $file --out $dir" >>"$out/command.txt"
        echo "fused-refill: $sweep, seed $seed" >&2
        t0=$(date +%s.%N)
        "$bin" sweep "$file" --out "$dir" >"$dir.log" 2>&1 || { echo "fused-refill: $file failed, see $dir.log" >&2; exit 1; }
        t1=$(date +%s.%N)
        python3 - "$dir" "$seed" "$sweep" "$t0" "$t1" >>"$out/runs.csv" <<'PY'
import csv, sys
d, seed, sweep, t0, t1 = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
rows = list(csv.DictReader(open(f"{d}/trials.csv")))
done = [r for r in rows if r["state"] in ("COMPLETE", "PRUNED")]
best = max((float(r["test_acc"]) for r in rows if r["state"] == "COMPLETE" and r["test_acc"]), default=float("nan"))
epochs = sum(int(r["epochs"] or 0) for r in done)
print(f"{seed},{sweep},{t0:.3f},{t1 - t0:.2f},{len(rows)},{sum(r['state'] == 'COMPLETE' for r in rows)},"
      f"{sum(r['state'] == 'PRUNED' for r in rows)},{epochs},{best},{d}.log")
PY
        echo "# load after $sweep $seed: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/command.txt"
    done
    k=$((k + 1))
done
python3 bench/fused_refill_report.py "$out" >"$out/summary.md"
cat "$out/summary.md"
