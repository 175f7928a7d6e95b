#!/usr/bin/env bash
# The cost of one `method: bayes` proposal after n trials (examples/proposal_cost.rs: the TPE's
# fit and draw with 8 trials in flight, on a nine-parameter space), for n = 100 ... 35,000.
# With --against REV, the same example is built at REV too (in a temporary worktree; its history
# type adapted to that build's) and the two are run interleaved, round after round, on this
# machine, so that a drift in its load falls on both alike.
# Output in OUT: proposal_cost.csv (every round's rows, by build), summary.md (the median over
# the rounds of each build's median proposal time per n), command.txt (commits, machine, load).
#
# Usage: bench/proposal-cost.sh [--against REV] [--rounds R] [OUT]
#   (default OUT results/proposal-cost-cpu, R 3)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/against.sh
against_args proposal-cost 3 results/proposal-cost-cpu "$@"
mkdir -p "$out"
bins="$(mktemp -d)"
cleanup() {
    against_cleanup
    rm -rf "$bins"
}
trap cleanup EXIT

cargo build --release --quiet --bin gpumux --example proposal_cost
cp target/release/examples/proposal_cost "$bins/this"
builds="this"
if [ -n "$against" ]; then
    against_worktree "$against"
    cp examples/proposal_cost.rs "$against_tree/examples/proposal_cost.rs"
    # What differs in older builds: their history was a plain list of observations, and an
    # observation was built from its two fields.
    tpe_src="$(cat "$against_tree"/src/space/tpe.rs "$against_tree"/src/space/tpe/mod.rs 2>/dev/null || true)"
    if ! grep -q "pub struct History" <<<"$tpe_src"; then
        sed -i 's|^type Hist = gpumux::space::tpe::History;|type Hist = Vec<gpumux::space::tpe::Observation>;|' \
            "$against_tree/examples/proposal_cost.rs"
    fi
    if ! grep -q "pub fn new(point" <<<"$tpe_src"; then
        sed -i 's|Observation::new(point, loss)|Observation { point, loss }|' \
            "$against_tree/examples/proposal_cost.rs"
    fi
    against_build --example proposal_cost
    cp target/against/release/examples/proposal_cost "$bins/against"
    builds="this against"
fi

{
    echo "# bench/proposal-cost.sh${against:+ --against $against} --rounds $rounds $out"
    echo "# this build: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src examples || echo ' (with uncommitted changes)'), $(target/release/gpumux --version 2>/dev/null || echo 'gpumux ?')"
    [ -z "$against" ] || echo "# against: $(git rev-parse --short "$against")"
    echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "# load at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/command.txt"

csv="$out/proposal_cost.csv"
echo "build,round,n,proposals,median_ms,p90_ms,max_ms,insert_us" >"$csv"
for r in $(seq 1 "$rounds"); do
    for b in $builds; do
        echo "proposal-cost: round $r/$rounds, $b" >&2
        "$bins/$b" | tail -n +2 | sed "s/^/$b,$r,/" >>"$csv"
    done
done

python3 - "$csv" "$out/summary.md" "$rounds" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
builds = sorted({r["build"] for r in rows}, key=lambda b: b != "this")
ns = sorted({int(r["n"]) for r in rows})
med = lambda b, n, k: statistics.median(float(r[k]) for r in rows if r["build"] == b and int(r["n"]) == n)
with open(sys.argv[2], "w") as f:
    f.write(f"# One bayes proposal after n trials (median over {sys.argv[3]} rounds of each round's median of 50)\n\n")
    f.write("| n | " + " | ".join(f"{b}: ms (max)" for b in builds) + (" | against / this |" if len(builds) == 2 else " |") + "\n")
    f.write("|---|" + "---|" * (len(builds) + (len(builds) == 2)) + "\n")
    for n in ns:
        cells = [f"{med(b, n, 'median_ms'):.3f} ({med(b, n, 'max_ms'):.3f})" for b in builds]
        if len(builds) == 2:
            cells.append(f"{med('against', n, 'median_ms') / med('this', n, 'median_ms'):.1f}×")
        f.write(f"| {n} | " + " | ".join(cells) + " |\n")
print(open(sys.argv[2]).read())
PY
