#!/usr/bin/env bash
# Early termination on simulated learning curves that cross (examples/pruning_curves.rs): an
# asynchronous sweep of TRIALS trials of EPOCHS epochs, CONCURRENCY at a time, judged by the
# sweep's own pruner (eta 3, rungs 1, 3, 9), with one bracket and with Hyperband's four, over
# SEEDS seeds: the trial-epochs trained against the sweep unpruned, and whether the unpruned
# sweep's best trial was kept to its last epoch.
# Output in OUT: curves.csv (a row per seed and bracket count), summary.md, command.txt.
#
# Usage: bench/pruning-curves.sh [OUT]   (default results/pruning-curves-cpu)
#   TRIALS=300 EPOCHS=27 CONCURRENCY=8 SEEDS=10
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/pruning-curves-cpu}"
trials="${TRIALS:-300}" epochs="${EPOCHS:-27}" concurrency="${CONCURRENCY:-8}" seeds="${SEEDS:-10}"
mkdir -p "$out"
cargo build --release --quiet --bin gpumux --example pruning_curves
{
    echo "# bench/pruning-curves.sh $out  (TRIALS=$trials EPOCHS=$epochs CONCURRENCY=$concurrency SEEDS=$seeds)"
    echo "# build: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src examples || echo ' (with uncommitted changes)'), $(target/release/gpumux --version)"
    echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(date -u +%Y-%m-%dT%H:%MZ) (a simulation: its figures do not depend on the machine)"
} >"$out/command.txt"
target/release/examples/pruning_curves "$trials" "$epochs" "$concurrency" "$seeds" >"$out/curves.csv"
python3 - "$out/curves.csv" "$out/summary.md" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
with open(sys.argv[2], "w") as f:
    f.write("# Early termination on learning curves that cross (simulated; eta 3, rungs 1, 3, 9)\n\n")
    f.write("| brackets | trial-epochs / unpruned: median (max) | unpruned best kept to the end | best kept trial's rank (0: the best), median |\n|---|---|---|---|\n")
    for b in sorted({r["brackets"] for r in rows}, key=int):
        xs = [r for r in rows if r["brackets"] == b]
        ratios = [float(r["trial_epochs_ratio"]) for r in xs]
        kept = sum(int(r["best_kept"]) for r in xs)
        rank = statistics.median(int(r["best_rank_of_kept"]) for r in xs)
        f.write(f"| {b} | {statistics.median(ratios):.2f}× ({max(ratios):.2f}×) | {kept} of {len(xs)} seeds | {rank:g} |\n")
print(open(sys.argv[2]).read())
PY
