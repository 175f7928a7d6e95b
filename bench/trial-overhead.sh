#!/usr/bin/env bash
# gpumux's own cost per trial: a sweep of TRIALS trials of a command that does nothing (a shell
# script that prints its result line), CONCURRENCY at a time, against the same command started
# TRIALS times one after another by a bare loop (Python's subprocess.run). Per round, the
# overhead is (sweep wall − bare wall) / TRIALS: process start and pipes, supervision, the rows
# appended and fsynced, the sweep's own start and end amortised over its trials.
# With --against REV, the build at REV (in a temporary worktree) runs too, interleaved.
# Output in OUT: overhead.csv (every round), summary.md, command.txt.
#
# Usage: bench/trial-overhead.sh [--against REV] [--rounds R] [OUT]
#   (default OUT results/trial-overhead-cpu, R 5)   TRIALS=200 CONCURRENCY=1
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/against.sh
against_args trial-overhead 5 results/trial-overhead-cpu "$@"
trials="${TRIALS:-200}"
concurrency="${CONCURRENCY:-1}"
mkdir -p "$out"
out="$(realpath "$out")"
work="$(mktemp -d "$out/.work.XXXXXX")"   # on the results' disk: fsyncs cost what they cost there
cleanup() {
    against_cleanup
    rm -rf "$work"
}
trap cleanup EXIT

cargo build --release --quiet --bin gpumux
cp target/release/gpumux "$work/this"
builds="this"
if [ -n "$against" ]; then
    against_worktree "$against"
    against_build --bin gpumux
    cp target/against/release/gpumux "$work/against"
    builds="this against"
fi

printf '#!/bin/sh\nprintf "{\\"test_acc\\": %%s}\\n" "$1"\n' >"$work/noop.sh"
chmod +x "$work/noop.sh"
cat >"$work/job.yaml" <<EOF
name: overhead
command: "$work/noop.sh {x}"
metric: {name: test_acc, goal: maximize}
method: random
run_cap: $trials
concurrency: $concurrency
parameters:
  x: {min: 0.0, max: 1.0}
EOF

{
    echo "# bench/trial-overhead.sh${against:+ --against $against} --rounds $rounds $out  (TRIALS=$trials CONCURRENCY=$concurrency)"
    echo "# this build: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (with uncommitted changes)'), $("$work/this" --version)"
    [ -z "$against" ] || echo "# against: $(git rev-parse --short "$against"), $("$work/against" --version)"
    echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ); results' disk: $(df -T "$out" | tail -1 | awk '{print $2}')"
    echo "# load at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/command.txt"

bare() {
    python3 - "$work/noop.sh" "$trials" <<'PY'
import subprocess, sys, time
t = time.perf_counter()
for i in range(int(sys.argv[2])):
    subprocess.run([sys.argv[1], "0.5"], stdout=subprocess.DEVNULL, check=True)
print(f"{time.perf_counter() - t:.4f}")
PY
}
sweep() {
    rm -rf "$work/out"
    local t0 t1
    t0=$(date +%s.%N)
    "$work/$1" sweep "$work/job.yaml" --out "$work/out" >/dev/null 2>&1
    t1=$(date +%s.%N)
    python3 -c "print(f'{$t1 - $t0:.4f}')"
}

csv="$out/overhead.csv"
echo "round,build,trials,concurrency,bare_s,sweep_s,overhead_ms_per_trial" >"$csv"
for r in $(seq 1 "$rounds"); do
    for b in $builds; do
        echo "trial-overhead: round $r/$rounds, $b" >&2
        base=$(bare)
        s=$(sweep "$b")
        python3 -c "print(f'$r,$b,$trials,$concurrency,$base,$s,{($s - $base) / $trials * 1e3:.2f}')" >>"$csv"
    done
done

python3 - "$csv" "$out/summary.md" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
with open(sys.argv[2], "w") as f:
    f.write(f"# gpumux's own cost per trial ({rows[0]['trials']} trials of a command that does nothing, {rows[0]['concurrency']} at a time)\n\n")
    f.write("| build | overhead per trial, ms: median (min, max) over rounds | sweep wall, s (median) | bare loop wall, s (median) |\n|---|---|---|---|\n")
    for b in sorted({r["build"] for r in rows}, key=lambda b: b != "this"):
        xs = [r for r in rows if r["build"] == b]
        o = [float(r["overhead_ms_per_trial"]) for r in xs]
        f.write(f"| {b} | {statistics.median(o):.2f} ({min(o):.2f}, {max(o):.2f}) | "
                f"{statistics.median(float(r['sweep_s']) for r in xs):.2f} | {statistics.median(float(r['bare_s']) for r in xs):.2f} |\n")
print(open(sys.argv[2]).read())
PY
