#!/usr/bin/env bash
# How soon a fib run stops on SIGTERM: starts `GPUMUX fib ARGS... --out OUTDIR`, sends SIGTERM
# AFTER seconds later, and times the exit. Passes when gpumux exits 3 (interrupted) within LIMIT
# seconds of the signal and trials.csv holds INTERRUPTED rows; a run that ends before the signal,
# or one still running LIMIT + 30 s after it (then killed), fails.
#   scripts/stop-latency.sh GPUMUX OUTDIR AFTER LIMIT ARGS...
set -uo pipefail
if [ $# -lt 5 ]; then
    echo "usage: scripts/stop-latency.sh GPUMUX OUTDIR AFTER LIMIT ARGS..." >&2
    exit 2
fi
bin=$1 out=$2 after=$3 limit=$4
shift 4
rm -rf "$out"
"$bin" fib "$@" --out "$out" >"$out.log" 2>&1 &
pid=$!
sleep "$after"
if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid"
    echo "stop-latency: the run ended (exit $?) before the signal at ${after} s; give it more work"
    exit 1
fi
t0=$(date +%s.%N)
kill -TERM "$pid"
deadline=$(awk -v t="$t0" -v l="$limit" 'BEGIN { printf "%.3f", t + l + 30 }')
while kill -0 "$pid" 2>/dev/null; do
    if awk -v n="$(date +%s.%N)" -v d="$deadline" 'BEGIN { exit !(n > d) }'; then
        kill -KILL "$pid" 2>/dev/null
        echo "stop-latency: still running $((limit + 30)) s after SIGTERM; killed"
        exit 1
    fi
    sleep 0.1
done
wait "$pid"
rc=$?
t1=$(date +%s.%N)
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
rows=$(grep -c ',INTERRUPTED,' "$out/trials.csv" 2>/dev/null)
echo "stop-latency: exit $rc ${secs} s after SIGTERM (limit ${limit} s), ${rows:-0} INTERRUPTED rows; log: $out.log"
tail -n 3 "$out.log"
if grep -q 'stopped while warming up' "$out.log"; then
    echo "stop-latency: the signal came during fib's untimed warm-up, before any timed round; give it a larger AFTER"
    exit 1
fi
[ "$rc" -eq 3 ] && [ "${rows:-0}" -gt 0 ] &&
    awk -v s="$secs" -v l="$limit" 'BEGIN { exit !(s <= l) }'
