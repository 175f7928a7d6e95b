#!/usr/bin/env bash
# Search quality: gpumux's `method: bayes` (and `random`, as a floor) against Optuna's default
# sampler on the same objectives, seeds and budgets, and gpumux's early termination against
# Optuna's HyperbandPruner on the same learning curves. A benchmark: its figures are never a
# pass/fail test (the tests check the mechanisms).
#
#  objectives  bench/objectives.py's branin, hartmann6, mixed (a log learning rate, a categorical
#              and an integer) and mixed-fail (mixed, every rmsprop trial fails): each a real
#              `gpumux sweep` of TRIALS trials one at a time (the command runs the objective), and
#              an Optuna study of as many, for each of SEEDS; and mnist, a sweep of the built-in
#              MLP on MNIST-10k (MNIST_EPOCHS epochs a trial, trained in-process; Optuna's study
#              runs `gpumux train` per trial), its value the test error.
#  curves      examples/search_curves.rs: learning curves that cross (slow starters that end
#              best), pruned by gpumux's pruner (1 bracket, and Hyperband's) and by Optuna's
#              HyperbandPruner on the very same curves and schedule; and a bayes sweep with
#              hyperband over a training-like space (CURVE_TRIALS trials).
#
# Optuna is installed into VENV (a local virtual environment, from PyPI) when it is not there.
# Output in OUT: trials.csv (every trial of every run), curves.csv, summary.md, command.txt; the
# sweeps' own folders and the curves are made in a temporary folder, removed at the end
# (KEEP=DIR keeps them there instead).
#
# Usage: bench/search-quality.sh [OUT]     (default results/search-quality)
#   SEEDS=20 TRIALS=60 CURVE_SEEDS=10 CURVE_TRIALS=300 PARTS="objectives curves"
#   OBJECTIVES="branin hartmann6 mixed mixed-fail mnist"  MNIST_EPOCHS=3  VENV=.venv-bench
#   GPUMUX=target/release/gpumux
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/search-quality}"
seeds="${SEEDS:-20}" trials="${TRIALS:-60}"
curve_seeds="${CURVE_SEEDS:-10}" curve_trials="${CURVE_TRIALS:-300}"
parts="${PARTS:-objectives curves}"
objectives="${OBJECTIVES:-branin hartmann6 mixed mixed-fail mnist}"
export MNIST_EPOCHS="${MNIST_EPOCHS:-3}"
venv="${VENV:-.venv-bench}"
[ -n "${GPUMUX:-}" ] || cargo build --release --quiet --bin gpumux
[[ " $parts " != *" curves "* ]] || cargo build --release --quiet --example search_curves
bin="$(realpath "${GPUMUX:-target/release/gpumux}")"
if ! "$venv/bin/python" -c 'import optuna' 2>/dev/null; then
    echo "search-quality: installing optuna into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet optuna
fi
py="$venv/bin/python"
export GPUMUX="$bin"
work="${KEEP:-$(mktemp -d)}"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
mkdir -p "$out" "$work/jobs" "$work/runs" "$work/curves"
{
    echo "# bench/search-quality.sh $out  (SEEDS=$seeds TRIALS=$trials CURVE_SEEDS=$curve_seeds CURVE_TRIALS=$curve_trials PARTS=\"$parts\")"
    echo "# build: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src examples bench || echo ' (with uncommitted changes)'), $("$bin" --version)"
    echo "# peer: optuna $("$py" -c 'import optuna; print(optuna.__version__)') (TPESampler(seed=SEED), its defaults; HyperbandPruner(min_resource=1, reduction_factor=3))"
    echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(date -u +%Y-%m-%dT%H:%MZ) (search quality does not depend on the machine)"
} >"$out/command.txt"

if [[ " $parts " == *" objectives "* ]]; then
    echo "method,objective,seed,trial,state,value,params" >"$out/trials.csv"
    for objective in $objectives; do
        space=$(python3 -c "import sys, json; sys.path.insert(0, 'bench'); from objectives import OBJECTIVES; print(json.dumps(OBJECTIVES['$objective']['space']))")
        args=$(python3 -c "import json; print(' '.join(f'--{k} {{{k}}}' for k in json.loads('''$space''')))")
        for seed in $(seq 1 "$seeds"); do
            for method in bayes random; do
                job="$work/jobs/$objective-$method-$seed.yaml" dir="$work/runs/$objective-$method-$seed"
                if [ "$objective" = mnist ]; then
                    printf 'name: %s\nmodel: {kind: mlp, hidden: [128]}\ndata: {source: mnist-10k}\ntrain: {epochs: %s}\nbackend: cpu\nsplit: shared\nmetric: {name: test_acc, goal: maximize}\nseed: %s\nmethod: %s\nrun_cap: %s\nconcurrency: 1\nparameters: %s\n' \
                        "$objective-$method-$seed" "$MNIST_EPOCHS" "$seed" "$method" "$trials" "$space" >"$job"
                else
                    printf 'name: %s\ncommand: "python3 bench/objectives.py %s %s"\nmetric: {name: value, goal: minimize}\nseed: %s\nmethod: %s\nrun_cap: %s\nconcurrency: 1\nparameters: %s\n' \
                        "$objective-$method-$seed" "$objective" "$args" "$seed" "$method" "$trials" "$space" >"$job"
                fi
                rm -rf "$dir"
                # Exit 1 (some trials failed) is what mixed-fail is for.
                "$bin" sweep "$job" --out "$dir" >"$dir.log" 2>&1 || [ $? = 1 ] || { echo "search-quality: $job failed, see $dir.log" >&2; exit 1; }
                # One at a time, the rows of trials.csv are in the order the trials ran.
                python3 - "$dir/trials.csv" "$method" "$objective" "$seed" >>"$out/trials.csv" <<'PY'
import csv, json, sys
sys.path.insert(0, "bench")
from objectives import OBJECTIVES
space = OBJECTIVES[sys.argv[3]]["space"]
for i, r in enumerate(csv.DictReader(open(sys.argv[1])), 1):
    # The objective's own parameters (not the built-in hyperparameters every row also carries).
    params = {k: v for k, v in json.loads(r["params"]).items() if k in space}
    params = json.dumps(params, sort_keys=True).replace('"', '""')
    value = r["metric"]
    if sys.argv[3] == "mnist" and value:
        value = repr(1.0 - float(value))  # the test error, as the peer's study minimises it
    print(f'{sys.argv[2]},{sys.argv[3]},{sys.argv[4]},{i},{r["state"]},{value},"{params}"')
PY
            done
        done
        echo "search-quality: $objective: gpumux done, Optuna next" >&2
        echo "$py bench/optuna_search.py --objective $objective --seeds 1..$seeds --trials $trials" >>"$out/command.txt"
        # shellcheck disable=SC2046
        "$py" bench/optuna_search.py --objective "$objective" --seeds $(seq 1 "$seeds") --trials "$trials" >>"$out/trials.csv"
    done
fi
if [[ " $parts " == *" curves "* ]]; then
    echo "target/release/examples/search_curves $curve_trials 27 8 $curve_seeds CURVES; $py bench/optuna_pruning.py CURVES 8" >>"$out/command.txt"
    target/release/examples/search_curves "$curve_trials" 27 8 "$curve_seeds" "$work/curves" >"$out/curves.csv"
    "$py" bench/optuna_pruning.py "$work/curves" 8 >>"$out/curves.csv"
fi
python3 bench/search_quality_report.py "$out"
