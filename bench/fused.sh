#!/usr/bin/env bash
# Time per training of `split: fused` against `shared` and `logical`, at N = 1, 2, 3, 5, 8, 13,
# 21, 34, for the MLP of jobs/mnist-fib.yaml and the CNN of jobs/cnn-fib.yaml, on whatever
# backend the jobs pick (the GPU where one works, else the CPU). Each repetition is one `gpumux
# fib` run, which takes every N under the three split modes in turn, so the modes interleave;
# the medians over REPS repetitions and the ratios fused/shared and fused/logical (below 1:
# fused is faster) go to summary.md.
#
# Usage: bench/fused.sh [OUT]     (default results/fused-<backend>)
#   GPUMUX=path/to/gpumux   (default: target/release/gpumux, built here)
#   MODELS="mlp cnn"        which jobs to run
#   N=1,2,3,5,8,13,21,34    the N list
#   MLP_EPOCHS=2 CNN_EPOCHS=1 REPS=3
#   CNN_TRAIN=2000          the CNN trains on this many MNIST-10k samples (and tests on a quarter)
# Output in OUT: <model>/rep<k>/ (each fib run's own files: runs.csv, trials.csv, plots),
# summary.md, command.txt (the commands, the machine, its load at the start and the end).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${GPUMUX:-target/release/gpumux}"
[ -n "${GPUMUX:-}" ] || cargo build --release --quiet
bin="$(realpath "$bin")"
models="${MODELS-mlp cnn}"
ns="${N:-1,2,3,5,8,13,21,34}"
reps="${REPS:-3}"
backend="$("$bin" devices 2>/dev/null | grep -q '^backend: cuda' && echo gpu || echo cpu)"
out="${1:-results/fused-$backend}"
mkdir -p "$out"
# The CNN job on fewer samples, so that 34 CNN trainings under three modes take minutes on a CPU.
cnn_train="${CNN_TRAIN:-2000}"
python3 - "$out/cnn-fib.yaml" "$cnn_train" <<'PY'
import sys
text = open("jobs/cnn-fib.yaml").read()
n = int(sys.argv[2])
limits = f"  train_limit: {n}\n  test_limit: {max(1, n // 4)}\n"
text = text.replace("  source: mnist-10k\n", "  source: mnist-10k\n" + limits, 1)
open(sys.argv[1], "w").write(text)
PY
job_of() { case "$1" in mlp) echo jobs/mnist-fib.yaml ;; cnn) echo "$out/cnn-fib.yaml" ;; *) return 1 ;; esac; }
epochs_of() { case "$1" in mlp) echo "${MLP_EPOCHS:-2}" ;; cnn) echo "${CNN_EPOCHS:-1}" ;; esac; }

{
    echo "# bench/fused.sh $*  (MODELS=\"$models\" N=$ns REPS=$reps)"
    echo "# $("$bin" --version), $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "# device: $("$bin" devices 2>/dev/null | head -3 | tr '\n' ' ')"
    echo "# load at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/command.txt"

for rep in $(seq 1 "$reps"); do
    for m in $models; do
        job="$(job_of "$m")" || { echo "fused: unknown model $m" >&2; exit 2; }
        dir="$out/$m/rep$rep"
        rm -rf "$dir"
        mkdir -p "$out/$m"
        cmd=("$bin" fib "$job" --splits shared,logical,fused --n "$ns" --epochs "$(epochs_of "$m")" --out "$dir")
        echo "${cmd[*]}" >>"$out/command.txt"
        echo "fused: $m, repetition $rep of $reps" >&2
        "${cmd[@]}" >"$dir.log" 2>&1 || { echo "fused: $m rep $rep failed, see $dir.log" >&2; exit 1; }
    done
done
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/command.txt"

python3 - "$out" $models <<'EOF'
import csv, statistics, sys
from pathlib import Path
out, models = Path(sys.argv[1]), sys.argv[2:]
lines = ["# Time per training: fused against shared and logical", ""]
for m in models:
    t = {}
    for runs in sorted((out / m).glob("rep*/runs.csv")):
        for r in csv.DictReader(open(runs)):
            if r["ok"] and int(r["ok"]) > 0 and int(r["failed"] or 0) == 0:
                t.setdefault((r["split"], int(r["n"])), []).append(float(r["time_per_training_s"]))
    ns = sorted({n for _, n in t})
    med = {k: statistics.median(v) for k, v in t.items()}
    lines += [f"## {m}", "",
              "| N | shared s | logical s | fused s | fused/shared | fused/logical | reps |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    for n in ns:
        s, l, f = (med.get((k, n)) for k in ("shared", "logical", "fused"))
        ratio = lambda a, b: f"{a / b:.2f}" if a and b else "–"
        cell = lambda v: f"{v:.4f}" if v else "–"
        reps = min(len(t.get((k, n), [])) for k in ("shared", "logical", "fused"))
        lines.append(f"| {n} | {cell(s)} | {cell(l)} | {cell(f)} | {ratio(f, s)} | {ratio(f, l)} | {reps} |")
    lines.append("")
(out / "summary.md").write_text("\n".join(lines))
print("\n".join(lines))
EOF
