#!/usr/bin/env bash
# One study against shards and against one process, as search quality and as pruning, and the
# study store's throughput. A benchmark: its figures are never a pass/fail test (tests/study.rs
# checks the mechanisms).
#
#  regret      a bayes sweep on bench/objectives.py's hartmann6, TRIALS trials in all, run three
#              ways for each of SEEDS seeds: one process, WORKERS at a time (--concurrency);
#              WORKERS processes of one study (--study sqlite:..., one at a time each); and
#              WORKERS independent shards (--shard i/WORKERS, one at a time each, all at once).
#              The regret of a run is its best value less the function's minimum.
#  pruning     a random sweep of examples/fake_train.py (PRUNE_TRIALS trials of 9 epochs) with
#              early_terminate hyperband (eta 3), run the same three ways for each of
#              PRUNE_SEEDS seeds: PRUNED trials and trial-epochs trained.
#  throughput  1, STORE_WORKERS and 64 processes of one study, each taking trials and recording
#              their ends until STORE_TRIALS are done, with nothing to run (examples/
#              study_store.rs): trial results recorded per second, in SQLite and, with
#              STUDY_POSTGRES=postgresql://... (a database whose study tables may be dropped), in
#              PostgreSQL; and a real `gpumux sweep` of a command that prints its result at once
#              (echo), STORE_WORKERS workers of one SQLite study against one process alone at
#              the same concurrency in all.
#
# Output in OUT: command.txt, regret.csv, pruning.csv, throughput.csv, summary.md.
#
# Usage: bench/study.sh [OUT]     (default results/study-cpu)
#   SEEDS=20 TRIALS=60 WORKERS=4 PRUNE_SEEDS=10 PRUNE_TRIALS=60 STORE_WORKERS=8
#   STORE_TRIALS=20000 PARTS="regret pruning throughput" GPUMUX=target/release/gpumux
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/study-cpu}"
seeds="${SEEDS:-20}" trials="${TRIALS:-60}" workers="${WORKERS:-4}"
prune_seeds="${PRUNE_SEEDS:-10}" prune_trials="${PRUNE_TRIALS:-60}"
store_workers="${STORE_WORKERS:-8}" store_trials="${STORE_TRIALS:-20000}"
parts="${PARTS:-regret pruning throughput}"
[ -n "${GPUMUX:-}" ] || cargo build --release --quiet --bin gpumux
[[ " $parts " != *" throughput "* ]] || cargo build --release --quiet --example study_store
bin="$(realpath "${GPUMUX:-target/release/gpumux}")"
work="${KEEP:-$(mktemp -d)}"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
mkdir -p "$out" "$work"
{
    echo "# bench/study.sh $out  (SEEDS=$seeds TRIALS=$trials WORKERS=$workers PRUNE_SEEDS=$prune_seeds PRUNE_TRIALS=$prune_trials STORE_WORKERS=$store_workers STORE_TRIALS=$store_trials PARTS=\"$parts\")"
    echo "# build: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src examples bench || echo ' (with uncommitted changes)'), $("$bin" --version)"
    echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ); store on $(df -T "$work" | awk 'NR==2 {print $2}')"
} >>"$out/command.txt"

# Runs the sweep $1 three ways into $2/{one,study,shards}, one after another.
three_ways() {
    local job=$1 dir=$2 i
    rm -rf "$dir" && mkdir -p "$dir/study" "$dir/shards"
    "$bin" sweep "$job" --out "$dir/one" --concurrency "$workers" >"$dir/one.log" 2>&1
    for i in $(seq 1 "$workers"); do
        "$bin" sweep "$job" --out "$dir/study/w$i" --study "sqlite:$dir/study.db" --concurrency 1 >"$dir/study/w$i.log" 2>&1 &
    done
    wait
    "$bin" export --study "sqlite:$dir/study.db" --out "$dir/study/all" >"$dir/study/export.log" 2>&1
    for i in $(seq 1 "$workers"); do
        "$bin" sweep "$job" --out "$dir/shards/s$i" --shard "$i/$workers" --concurrency 1 >"$dir/shards/s$i.log" 2>&1 &
    done
    wait
    "$bin" merge "$dir"/shards/s*/ --out "$dir/shards/all" --goal minimize >"$dir/shards/merge.log" 2>&1
}

if [[ " $parts " == *" regret "* ]]; then
    echo "seed,way,trials,best,regret" >"$out/regret.csv"
    args="--x1 {x1} --x2 {x2} --x3 {x3} --x4 {x4} --x5 {x5} --x6 {x6}"
    space=$(python3 -c "import sys, json; sys.path.insert(0, 'bench'); from objectives import OBJECTIVES; print(json.dumps(OBJECTIVES['hartmann6']['space']))")
    for seed in $(seq 1 "$seeds"); do
        job="$work/h6-$seed.yaml"
        printf 'name: h6-%s\ncommand: "python3 bench/objectives.py hartmann6 %s"\nmetric: {name: value, goal: minimize}\nseed: %s\nmethod: bayes\nrun_cap: %s\nparameters: %s\n' \
            "$seed" "$args" "$seed" "$trials" "$space" >"$job"
        three_ways "$job" "$work/h6-$seed"
        for way in one study/all shards/all; do
            python3 - "$work/h6-$seed/$way/trials.csv" "$seed" "${way%/all}" >>"$out/regret.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["state"] == "COMPLETE" and r["metric"]]
best = min(float(r["metric"]) for r in rows)
print(f"{sys.argv[2]},{sys.argv[3]},{len(rows)},{best:.6f},{best + 3.32237:.6f}")
PY
        done
        echo "study-bench: regret seed $seed done" >&2
    done
fi

if [[ " $parts " == *" pruning "* ]]; then
    echo "seed,way,trials,pruned,trial_epochs" >"$out/pruning.csv"
    for seed in $(seq 1 "$prune_seeds"); do
        job="$work/hb-$seed.yaml"
        printf 'name: hb-%s\ncommand: "python3 examples/fake_train.py --lr {lr} --batch-size {batch_size} --epochs 9 --sleep 0"\nmetric: {name: test_acc, goal: maximize}\nseed: %s\nmethod: random\nrun_cap: %s\nearly_terminate: {type: hyperband, min_iter: 1, eta: 3}\nparameters:\n  lr: {min: 0.0001, max: 0.1, distribution: log_uniform_values}\n  batch_size: {values: [32, 64, 128]}\n' \
            "$seed" "$seed" "$prune_trials" >"$job"
        three_ways "$job" "$work/hb-$seed"
        for way in one study/all shards/all; do
            python3 - "$work/hb-$seed/$way/trials.csv" "$seed" "${way%/all}" >>"$out/pruning.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
pruned = sum(r["state"] == "PRUNED" for r in rows)
print(f"{sys.argv[2]},{sys.argv[3]},{len(rows)},{pruned},{sum(int(r['epochs']) for r in rows)}")
PY
        done
        echo "study-bench: pruning seed $seed done" >&2
    done
fi

if [[ " $parts " == *" throughput "* ]]; then
    echo "what,workers,trials,seconds,results_per_s" >"$out/throughput.csv"
    for n in 1 "$store_workers" 64; do
        rm -f "$work/store.db"*
        target/release/examples/study_store "sqlite:$work/store.db" "$n" "$store_trials" >>"$out/throughput.csv"
        echo "target/release/examples/study_store sqlite:$work/store.db $n $store_trials" >>"$out/command.txt"
        if [ -n "${STUDY_POSTGRES:-}" ]; then
            # The database is emptied of a study's tables first.
            psql -q "$STUDY_POSTGRES" -c "DROP TABLE IF EXISTS meta, trials, epochs, rungs" >/dev/null
            target/release/examples/study_store "$STUDY_POSTGRES" "$n" "$store_trials" >>"$out/throughput.csv"
            echo "target/release/examples/study_store $STUDY_POSTGRES $n $store_trials  # $(psql -At "$STUDY_POSTGRES" -c 'SELECT version()' | cut -d, -f1), on this machine" >>"$out/command.txt"
        fi
    done
    job="$work/echo.yaml"
    cat >"$job" <<'YAML'
name: echo
command: "echo '{{\"test_acc\": {lr}}}'"
metric: {name: test_acc, goal: maximize}
seed: 1
method: random
run_cap: 2000
parameters:
  lr: {min: 0.0001, max: 0.1, distribution: log_uniform_values}
YAML
    for round in 1 2 3; do
        rm -rf "$work/echo" && mkdir -p "$work/echo"
        t0=$(date +%s.%N)
        "$bin" sweep "$job" --out "$work/echo/one" --concurrency "$store_workers" >/dev/null 2>&1
        t1=$(date +%s.%N)
        for i in $(seq 1 "$store_workers"); do
            "$bin" sweep "$job" --out "$work/echo/w$i" --study "sqlite:$work/echo/s.db" --concurrency 1 >/dev/null 2>&1 &
        done
        wait
        t2=$(date +%s.%N)
        python3 -c "
a, b, c = $t0, $t1, $t2
print(f'sweep: one process $store_workers at a time (round $round),1,2000,{b - a:.2f},{2000 / (b - a):.0f}')
print(f'sweep: $store_workers workers of one study 1 at a time each (round $round),$store_workers,2000,{c - b:.2f},{2000 / (c - b):.0f}')" >>"$out/throughput.csv"
    done
fi

python3 - "$out" "$workers" <<'PY'
import csv, os, statistics, sys
out, workers = sys.argv[1], sys.argv[2]
lines = ["# One study against shards and one process", "", "Made by `bench/study.sh` (see command.txt)."]
path = os.path.join(out, "regret.csv")
if os.path.exists(path):
    rows = list(csv.DictReader(open(path)))
    by = {}
    for r in rows:
        by.setdefault(r["way"], {})[r["seed"]] = float(r["regret"])
    seeds = sorted(by.get("one", {}), key=int)
    lines += ["", f"## Regret on Hartmann-6 (bayes, {rows[0]['trials'] if rows else '?'} trials in all, {len(seeds)} seeds)", "",
              "| way | median regret | IQR | trials |", "|---|---|---|---|"]
    names = {"one": f"one process, {workers} at a time", "study": f"{workers} workers of one study", "shards": f"{workers} shards, merged"}
    for way in ["one", "study", "shards"]:
        v = sorted(by.get(way, {}).values())
        if not v:
            continue
        q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
        n = {r["trials"] for r in rows if r["way"] == way}
        lines.append(f"| {names[way]} | {statistics.median(v):.4f} | {q[0]:.4f}–{q[2]:.4f} | {'/'.join(sorted(n))} |")
    def wins(a, b):
        w = sum(by[a][s] < by[b][s] for s in seeds)
        l = sum(by[a][s] > by[b][s] for s in seeds)
        # two-sided sign test
        n, k = w + l, min(w, l)
        from math import comb
        p = min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0
        return f"{w}–{l} (sign test p = {p:.3f})"
    if seeds and "study" in by and "shards" in by:
        lines += ["", f"Seed by seed, lower regret: study against shards {wins('study', 'shards')}; study against one process {wins('study', 'one')}."]
path = os.path.join(out, "pruning.csv")
if os.path.exists(path):
    rows = list(csv.DictReader(open(path)))
    lines += ["", "## Hyperband across workers (fake_train, 9 epochs, eta 3)", "",
              "| way | PRUNED (median of seeds) | trial-epochs (median) |", "|---|---|---|"]
    for way, name in [("one", "one process"), ("study", "workers of one study"), ("shards", "shards, merged")]:
        v = [r for r in rows if r["way"] == way]
        if v:
            lines.append(f"| {name} | {statistics.median(int(r['pruned']) for r in v):.0f} | {statistics.median(int(r['trial_epochs']) for r in v):.0f} |")
path = os.path.join(out, "throughput.csv")
if os.path.exists(path):
    lines += ["", "## Throughput", "", "| what | workers | trials | seconds | results/s |", "|---|---|---|---|---|"]
    for r in csv.DictReader(open(path)):
        lines.append(f"| {r['what']} | {r['workers']} | {r['trials']} | {r['seconds']} | {r['results_per_s']} |")
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
