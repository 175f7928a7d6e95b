#!/usr/bin/env bash
# Early termination and model-based search, measured over several seeds:
#  (a) the MNIST MLP sweep of jobs/sweep-hyperband.yaml (random, RUN_CAP trials of 9 epochs) with
#      and without `early_terminate: hyperband`: wall time, trial-epochs trained, best test_acc.
#      The two alternate (with, without, without, with, ...) so that a drift in the machine's
#      load falls on both alike.
#  (b) `method: random` against `method: bayes` on a cheap synthetic objective (bench/branin.py,
#      the Branin function, minimised over x1 in [-5, 10], x2 in [0, 15]), one trial at a time,
#      BRANIN_TRIALS trials: the best value after each trial; and Optuna's TPE on the same
#      objective and seeds when PYTHON has optuna.
# Output in OUT: summary.md (the tables), hyperband.csv, branin.csv (every trial's value and the
# best so far), command.txt (the commands, the machine, its load), and each sweep's folder.
#
# Usage: bench/smart-sweeps.sh [OUT]     (default results/smart-sweeps-cpu)
#   GPUMUX=path/to/gpumux   (default: target/release/gpumux, built here)
#   SEEDS="1 2 3 4 5"  RUN_CAP=24  BRANIN_TRIALS=100
#   PYTHON=python3 with optuna for (b)'s comparison (skipped when it has none)
#   PARTS="hyperband branin"   which parts to run
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${GPUMUX:-target/release/gpumux}"
[ -n "${GPUMUX:-}" ] || cargo build --release --quiet
bin="$(realpath "$bin")"
out="${1:-results/smart-sweeps-cpu}"
seeds="${SEEDS:-1 2 3 4 5}"
run_cap="${RUN_CAP:-24}"
branin_trials="${BRANIN_TRIALS:-100}"
py="${PYTHON:-python3}"
parts="${PARTS:-hyperband branin}"
mkdir -p "$out/jobs"
{
    echo "# bench/smart-sweeps.sh $*  (SEEDS=\"$seeds\" RUN_CAP=$run_cap BRANIN_TRIALS=$branin_trials)"
    echo "# $("$bin" --version), $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "# device: $("$bin" devices 2>/dev/null | tail -1)"
    echo "# load at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/command.txt"

# sweep JOB DIR: runs one sweep into DIR (replacing it), prints its wall seconds.
sweep() {
    rm -rf "$2"
    echo "$bin sweep $1 --out $2" >>"$out/command.txt"
    local t0 t1
    t0=$(date +%s.%N)
    "$bin" sweep "$1" --out "$2" >"$2.log" 2>&1 || { echo "smart-sweeps: $1 failed, see $2.log" >&2; exit 1; }
    t1=$(date +%s.%N)
    python3 -c "print(f'{$t1 - $t0:.2f}')"
}

# (a) hyperband on the MNIST MLP.
echo "seed,early_terminate,wall_s,trials,complete,pruned,trial_epochs,best_test_acc" >"$out/hyperband.csv"
k=0
[[ " $parts " == *" hyperband "* ]] || seeds_a=""
for seed in ${seeds_a-$seeds}; do
    with="$out/jobs/hb-with-$seed.yaml" without="$out/jobs/hb-without-$seed.yaml"
    sed -e "s/^seed: .*/seed: $seed/" -e "s/^run_cap: .*/run_cap: $run_cap/" \
        -e "s/^name: .*/name: hb-with-$seed/" jobs/sweep-hyperband.yaml >"$with"
    grep -v '^early_terminate:' "$with" | sed "s/^name: .*/name: hb-without-$seed/" >"$without"
    order="with without"
    [ $((k % 2)) = 1 ] && order="without with"
    k=$((k + 1))
    for kind in $order; do
        job="$out/jobs/hb-$kind-$seed.yaml" dir="$out/hb-$kind-$seed"
        echo "smart-sweeps: hyperband $kind, seed $seed" >&2
        wall=$(sweep "$job" "$dir")
        python3 - "$dir/trials.csv" "$seed" "$kind" "$wall" >>"$out/hyperband.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
done = [r for r in rows if r["state"] in ("COMPLETE", "PRUNED")]
best = max((float(r["test_acc"]) for r in rows if r["state"] == "COMPLETE" and r["test_acc"]), default=float("nan"))
epochs = sum(int(r["epochs"] or 0) for r in done)
print(f"{sys.argv[2]},{sys.argv[3]},{sys.argv[4]},{len(rows)},"
      f"{sum(r['state'] == 'COMPLETE' for r in rows)},{sum(r['state'] == 'PRUNED' for r in rows)},{epochs},{best}")
PY
    done
done

# (b) random against bayes on Branin, one trial at a time.
echo "method,seed,trial,value,best" >"$out/branin.csv"
[[ " $parts " == *" branin "* ]] || seeds_b=""
for seed in ${seeds_b-$seeds}; do
    for method in random bayes; do
        job="$out/jobs/branin-$method-$seed.yaml" dir="$out/branin-$method-$seed"
        cat >"$job" <<YAML
name: branin-$method-$seed
command: "python3 bench/branin.py --x1 {x1} --x2 {x2}"
metric: {name: branin, goal: minimize}
seed: $seed
method: $method
run_cap: $branin_trials
concurrency: 1
parameters:
  x1: {min: -5.0, max: 10.0}
  x2: {min: 0.0, max: 15.0}
YAML
        echo "smart-sweeps: branin $method, seed $seed" >&2
        sweep "$job" "$dir" >/dev/null
        # One at a time, the rows of trials.csv are in the order the trials were proposed.
        python3 - "$dir/trials.csv" "$method" "$seed" >>"$out/branin.csv" <<'PY'
import csv, sys
best = float("inf")
for i, r in enumerate(csv.DictReader(open(sys.argv[1])), 1):
    v = float(r["metric"]) if r["metric"] else float("inf")
    best = min(best, v)
    print(f"{sys.argv[2]},{sys.argv[3]},{i},{v},{best}")
PY
    done
done
if [ -n "${seeds_b-$seeds}" ] && "$py" -c 'import optuna' 2>/dev/null; then
    echo "smart-sweeps: Optuna TPE ($("$py" -c 'import optuna; print(optuna.__version__)'))" >&2
    echo "$py bench/optuna_search.py --objective branin --seeds $seeds --trials $branin_trials" >>"$out/command.txt"
    # Its rows (method,objective,seed,trial,state,value,params) as branin.csv's, with the best so far.
    # shellcheck disable=SC2086
    "$py" bench/optuna_search.py --objective branin --seeds $seeds --trials "$branin_trials" | python3 -c '
import csv, sys
best = {}
for r in csv.reader(sys.stdin):
    v = float(r[5]) if r[5] else float("inf")
    best[r[2]] = min(best.get(r[2], float("inf")), v)
    print(f"optuna,{r[2]},{r[3]},{v},{best[r[2]]}")' >>"$out/branin.csv"
else
    echo "smart-sweeps: $py has no optuna: the Optuna comparison is skipped" >&2
fi
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/command.txt"

python3 - "$out" "$branin_trials" <<'PY'
import csv, statistics, sys
from pathlib import Path
out, n = Path(sys.argv[1]), int(sys.argv[2])
med = statistics.median
lines = ["# Early termination and model-based search", ""]
hb = list(csv.DictReader(open(out / "hyperband.csv")))
lines += ["## (a) MNIST MLP sweep, random, with and without `early_terminate: hyperband` (eta 3, min_iter 1)", "",
          "| early_terminate | seeds | wall s (median) | trial-epochs (median) | PRUNED (median) | best test_acc (median, min–max) |",
          "|---|---:|---:|---:|---:|---|"]
for kind in ("without", "with"):
    rs = [r for r in hb if r["early_terminate"] == kind]
    if not rs:
        continue
    acc = [float(r["best_test_acc"]) for r in rs]
    lines.append(f"| {kind} | {len(rs)} | {med(float(r['wall_s']) for r in rs):.1f} | {med(int(r['trial_epochs']) for r in rs):.0f} | "
                 f"{med(int(r['pruned']) for r in rs):.0f} | {med(acc):.4f} ({min(acc):.4f}–{max(acc):.4f}) |")
w = {r["seed"]: r for r in hb if r["early_terminate"] == "with"}
wo = {r["seed"]: r for r in hb if r["early_terminate"] == "without"}
pairs = [(w[s], wo[s]) for s in w if s in wo]
if pairs:
    ep = med(int(b["trial_epochs"]) / max(1, int(a["trial_epochs"])) for a, b in pairs)
    wall = med(float(b["wall_s"]) / max(1e-9, float(a["wall_s"])) for a, b in pairs)
    dacc = med(float(b["best_test_acc"]) - float(a["best_test_acc"]) for a, b in pairs)
    lines += ["", f"Per seed, without/with: {ep:.2f}× the trial-epochs, {wall:.2f}× the wall time; "
              f"best test_acc without − with: {dacc:+.4f} (median)."]
br = list(csv.DictReader(open(out / "branin.csv")))
ks = sorted({k for k in (5, 10, 20, n // 2, n) if 0 < k <= n})
curves = {}
for r in br:
    curves.setdefault(r["method"], {}).setdefault(r["seed"], []).append(float(r["best"]))
lines += ["", f"## (b) Branin (minimum 0.3979), best value after k trials: median (min–max) over seeds", "",
          "| method | seeds | " + " | ".join(f"k={k}" for k in ks) + " |",
          "|---|---:|" + "---|" * len(ks)]
for m in ("random", "bayes", "optuna"):
    if m not in curves:
        continue
    cells = []
    for k in ks:
        v = [c[k - 1] for c in curves[m].values() if len(c) >= k]
        cells.append(f"{med(v):.3f} ({min(v):.3f}–{max(v):.3f})" if v else "–")
    lines.append(f"| {m} | {len(curves[m])} | " + " | ".join(cells) + " |")
if "random" in curves and "bayes" in curves:
    need = []
    for seed, r in curves["random"].items():
        b = curves["bayes"].get(seed)
        if b:
            target = r[-1]
            need.append(next((i + 1 for i, v in enumerate(b) if v <= target), None))
    reached = [x for x in need if x is not None]
    lines += ["", f"Trials bayes needed to reach random's best after {n} trials, per seed: "
              + ", ".join(str(x) if x else f">{n}" for x in need)
              + (f" (median {med(reached):.0f} of {n})" if reached else "")]
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
