#!/usr/bin/env bash
# Peak memory and time of the commands that read, merge and rewrite results files at the
# documented limits (50,000 trials x 60 epochs: 3,000,000 progress rows), next to a plain copy
# of the same files.
#
#   bench/results-memory.sh [--trials N] [--epochs E] [--rounds R] [--against REV] [--out DIR]
#
# Measured, each with /usr/bin/time (wall seconds, peak resident memory), in this order:
#   copy          cp of progress.csv and trials.csv, then sync: the plain copy
#   report        `gpumux report DIR --out OUT`: one pass, every row read, checked and written
#   merge         `gpumux merge A B --out OUT`: two shards of half the trials each
#   resume-dry    `gpumux sweep JOB --out DIR --resume --dry-run`: what a resume reads
#   resume-widen  `gpumux sweep JOB --out DIR --resume` of one trial whose epoch line brings a
#                 key the header lacks: the resume's read, then progress.csv rewritten wider
#   rewrite       the widening rewrite alone: one progress row with a new key appended by the
#                 writer (examples/widen_progress.rs; this build only)
# With --against REV, the same commands run with the gpumux built at REV (a git worktree),
# interleaved with this build's, on the same files. Each round (5 by default) measures every
# step once after its own copy; the summary gives each step's best time over the best copy, and
# the median over the rounds of its time over that round's copy (the copy varies from round to
# round with the machine).
# Writes measurements.csv, summary.md and command.txt under --out (results/results-memory-cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/against.sh
trials=50000
epochs=60
against=""
rounds=5
out=results/results-memory-cpu
while [ $# -gt 0 ]; do
  case "$1" in
    --trials) trials="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --against) against="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (apt-get install time)" >&2; exit 2; }
cargo build --release --quiet --bin gpumux --example results_at_scale --example widen_progress
builds=("current=$PWD/target/release/gpumux")
if [ -n "$against" ]; then
  against_worktree "$against"
  against_build --bin gpumux
  builds+=("$against=$PWD/target/against/release/gpumux")
fi
work=$(mktemp -d)
trap 'rm -rf "$work"; against_cleanup' EXIT
gen=target/release/examples/results_at_scale
half=$((trials / 2))
"$gen" "$work/one" "$trials" "$epochs" >/dev/null
"$gen" "$work/a" "$half" "$epochs" a >/dev/null
"$gen" "$work/b" "$((trials - half))" "$epochs" b >/dev/null
mb=$(du -m "$work/one/progress.csv" | cut -f1)
# The widening trial: one epoch line with a key progress.csv has no column for.
cat >"$work/wide.sh" <<'EOF'
#!/bin/sh
echo "{\"epoch\": 1, \"test_acc\": 0.5, \"grad_norm\": $1}"
echo "{\"test_acc\": 0.5}"
EOF
chmod +x "$work/wide.sh"
cat >"$work/wide.yaml" <<EOF
name: wide
command: "$work/wide.sh {x}"
metric: {name: test_acc, goal: maximize}
method: random
run_cap: 1
parameters:
  x: {min: 0.0, max: 1.0}
EOF
mkdir -p "$out"
csv="$out/measurements.csv"
echo "build,step,seconds,user_s,sys_s,peak_mib,exit" >"$csv"
# measure BUILD STEP COMMAND...: one row of measurements.csv.
measure() {
  local build="$1" step="$2"; shift 2
  local t="$work/time.txt" code=0
  # What earlier steps wrote is on disk first, so that no step's fsync waits on their writeback.
  sync
  /usr/bin/time -o "$t" -f "%e %U %S %M" "$@" >"$work/last.log" 2>&1 || code=$?
  read -r secs user sys kib <"$t" || { secs=NaN; user=NaN; sys=NaN; kib=0; }
  local mib=$((kib / 1024))
  echo "$build,$step,$secs,$user,$sys,$mib,$code" >>"$csv"
  printf '%-10s %-13s %7s s (cpu %s + %s) %6s MiB exit %s\n' "$build" "$step" "$secs" "$user" "$sys" "$mib" "$code"
}
for round in $(seq "$rounds"); do
  rm -rf "$work/r" "$work/m" "$work/w" "$work/w2" "$work/copy.csv" "$work/copy-t.csv"
  measure - copy sh -c "cp --reflink=never '$work/one/progress.csv' '$work/copy.csv' && cp --reflink=never '$work/one/trials.csv' '$work/copy-t.csv' && sync -f '$work/copy.csv'"
  # The rewrite alone right after the copy, on the same footing.
  cp -r "$work/one" "$work/w2"
  measure current rewrite target/release/examples/widen_progress "$work/w2"
  head -1 "$work/w2/progress.csv" | grep -q grad_norm || echo "  (the rewrite left no wider header: see $work/last.log)"
  for b in "${builds[@]}"; do
    name="${b%%=*}" exe="${b#*=}"
    rm -rf "$work/r" "$work/m" "$work/w"
    measure "$name" report "$exe" report "$work/one" --out "$work/r"
    measure "$name" merge "$exe" merge "$work/a" "$work/b" --out "$work/m"
    cp -r "$work/one" "$work/w"
    measure "$name" resume-dry "$exe" sweep "$work/wide.yaml" --out "$work/w" --resume --dry-run
    measure "$name" resume-widen "$exe" sweep "$work/wide.yaml" --out "$work/w" --resume
    head -1 "$work/w/progress.csv" | grep -q grad_norm || echo "  (the widened header is missing: see $work/last.log)"
  done
done
commit=$(git rev-parse --short HEAD)
{
  echo "bench/results-memory.sh --trials $trials --epochs $epochs --rounds $rounds${against:+ --against $against}"
  echo "commit $commit$(git diff --quiet HEAD -- src || echo ' (with uncommitted changes in src/)')"
  echo "$("${builds[0]#*=}" --version)"
  echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -sr); no GPU used"
  echo "files: progress.csv $mb MiB ($((trials * epochs)) rows), $trials trials; merge: two shards of half each"
  date -u +%Y-%m-%dT%H:%MZ
} >"$out/command.txt"
python3 - "$csv" "$out/summary.md" "$mb" "$rounds" <<'EOF'
import csv, statistics, sys
from collections import defaultdict
rows = list(csv.DictReader(open(sys.argv[1])))
best = defaultdict(lambda: (float("inf"), 0))
ratios = defaultdict(list)
copy_now = None
for r in rows:
    key = (r["build"], r["step"])
    s, m = float(r["seconds"]), int(r["peak_mib"])
    prev = best[key]
    best[key] = (min(prev[0], s), max(prev[1], m))
    if r["step"] == "copy":
        copy_now = s
    elif copy_now:
        ratios[key].append(s / copy_now)
copy = best[("-", "copy")][0]
n = sys.argv[4]
out = [f"| build | step | seconds (best of {n}) | best × best copy | median × its round's copy | peak MiB (max of {n}) | under 200 MiB |",
       "|---|---|---|---|---|---|---|"]
for (build, step), (s, m) in best.items():
    if step == "copy":
        out.append(f"| - | plain copy ({sys.argv[3]} MiB + trials.csv, synced) | {s:.2f} | 1 | 1 | {m} | - |")
        continue
    # A copy too short to time (small files) gives no ratio.
    each = ratios[(build, step)]
    med = f"{statistics.median(each):.2f}" if each else "-"
    times = f"{s / copy:.1f}" if copy > 0 else "-"
    out.append(f"| {build} | {step} | {s:.2f} | {times} | {med} | {m} | {'yes' if m < 200 else 'NO'} |")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
EOF
