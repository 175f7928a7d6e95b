#!/usr/bin/env bash
# The CPU training loop of `gpumux train` against PyTorch eager (bench/torch_mnist.py) on the CPU:
# one thread each, each pinned to the same core, the same model, initialisation, optimiser, batch,
# data and epochs. The two alternate (g t, t g, g t, ...) for REPS repetitions of each case, so a
# drift in the machine's load falls on both alike; the medians and the ratio gpumux/PyTorch of
# samples/s (above 1: gpumux is faster) go to summary.md.
#
# Usage: bench/cpu-vs-torch.sh [OUT]     (default results/cpu-vs-torch)
#   PYTHON=path/to/python   an interpreter with torch (default: python3)
#   GPUMUX=path/to/gpumux   (default: target/release/gpumux, built here)
#   MLP_EPOCHS="5 20"       the MLP 784-128-10 cases, one per epoch count ("" for none)
#   CNN_EPOCHS="2"          the CNN of jobs/cnn-fib.yaml, one case per epoch count ("" for none)
#   BATCH=64 LR=0.001 SEED=0 REPS=3 CORE=1
# Output in OUT: runs.csv (every run), summary.md (the medians and ratios), command.txt (the
# command, the machine, its load at the start and the end, the versions), logs/ (each run's output).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/cpu-vs-torch}"
py="${PYTHON:-python3}"
bin="${GPUMUX:-target/release/gpumux}"
[ -n "${GPUMUX:-}" ] || cargo build --release --quiet
bin="$(realpath "$bin")"
mlp_epochs="${MLP_EPOCHS-5 20}"
cnn_epochs="${CNN_EPOCHS-2}"
batch="${BATCH:-64}" lr="${LR:-0.001}" seed="${SEED:-0}" reps="${REPS:-3}" core="${CORE:-1}"

# One thread each, whatever the caller's environment says.
for v in MKL_NUM_THREADS OPENBLAS_NUM_THREADS VECLIB_MAXIMUM_THREADS NUMEXPR_NUM_THREADS; do
    export "$v=1"
done
export OMP_NUM_THREADS=1
pin=(taskset -c "$core")
"${pin[@]}" true || { echo "cpu-vs-torch: cannot pin to core $core (taskset)" >&2; exit 2; }
torch_version="$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null)" || {
    echo "cpu-vs-torch: $py has no torch (set PYTHON)" >&2
    exit 3
}

mkdir -p "$out/logs"
machine() {
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
    echo "cores: $(getconf _NPROCESSORS_ONLN), pinned to core $core, one thread each"
    echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- . ":(exclude)$out" 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "gpumux: $bin"
    echo "python: $py ($("$py" --version 2>&1)), torch $torch_version"
}
{
    echo "PYTHON=$py MLP_EPOCHS=\"$mlp_epochs\" CNN_EPOCHS=\"$cnn_epochs\" BATCH=$batch LR=$lr SEED=$seed REPS=$reps CORE=$core bench/cpu-vs-torch.sh $out"
    machine
    echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/command.txt"
echo "case,model,epochs,batch_size,rep,impl,train_s,samples_per_s,test_acc" > "$out/runs.csv"

# gpumux: one `gpumux train`; its `done:` line has the seconds and samples/s of the trial.
run_gpumux() { # model epochs log
    local extra=()
    [ "$1" = mlp ] && extra=(--hidden 128)
    "${pin[@]}" "$bin" train --backend cpu --model "$1" "${extra[@]}" --data mnist-10k --epochs "$2" \
        --batch-size "$batch" --lr "$lr" --optimizer adam --dropout 0 --seed "$seed" > "$3" 2>&1
    sed -n 's/^done: test acc \([0-9.]*\), final loss [^,]*, \([0-9.]*\) s, \([0-9.]*\) samples\/s.*/\2,\3,\1/p' "$3" | tail -1
}
# PyTorch: one timed training after its untimed warm-up epoch (bench/torch_mnist.py).
run_torch() { # model epochs log
    "${pin[@]}" "$py" bench/torch_mnist.py --device cpu --threads 1 --model "$1" --epochs "$2" \
        --batch-size "$batch" --lr "$lr" --optimizer adam --seed "$seed" --repeats 1 > "$3" 2>&1
    grep '^torch,' "$3" | tail -1 | cut -d, -f8-10
}

cases=()
for e in $mlp_epochs; do cases+=("mlp:$e"); done
for e in $cnn_epochs; do cases+=("cnn:$e"); done
[ "${#cases[@]}" -gt 0 ] || { echo "cpu-vs-torch: no cases (MLP_EPOCHS and CNN_EPOCHS empty)" >&2; exit 2; }
for c in "${cases[@]}"; do
    model="${c%%:*}" epochs="${c##*:}" name="${c/:/-}"
    for rep in $(seq 1 "$reps"); do
        order=(gpumux torch)
        [ $((rep % 2)) -eq 0 ] && order=(torch gpumux)
        for impl in "${order[@]}"; do
            log="$out/logs/$name-$rep-$impl.log"
            row="$(run_"$impl" "$model" "$epochs" "$log")" || true
            if [ -z "$row" ]; then
                echo "cpu-vs-torch: $impl failed on $name (rep $rep); see $log" >&2
                exit 1
            fi
            echo "$name,$model,$epochs,$batch,$rep,$impl,$row" >> "$out/runs.csv"
            echo "$name rep $rep $impl: $row (train_s,samples_per_s,test_acc)" >&2
        done
    done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/command.txt"

"$py" - "$out" <<'EOF'
import csv, statistics, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(f"{out}/runs.csv")))
cmd = open(f"{out}/command.txt").read().splitlines()
lines = [
    "# gpumux CPU training loop against PyTorch eager, one thread each",
    "",
    f"`{cmd[0]}`",
    "",
    "Medians over the repetitions; samples/s is training samples (full batches × epochs) per second",
    "of the whole training with its per-epoch evaluations. ratio = gpumux / PyTorch samples/s (above 1:",
    "gpumux is faster).",
    "",
    "| case | reps | gpumux samples/s | PyTorch samples/s | ratio | gpumux s | PyTorch s | gpumux acc | PyTorch acc |",
    "|---|---|---|---|---|---|---|---|---|",
]
for case in dict.fromkeys(r["case"] for r in rows):
    m = {}
    for impl in ("gpumux", "torch"):
        rs = [r for r in rows if r["case"] == case and r["impl"] == impl]
        m[impl] = {k: statistics.median(float(r[k]) for r in rs) for k in ("train_s", "samples_per_s", "test_acc")}
        m[impl]["n"] = len(rs)
    g, t = m["gpumux"], m["torch"]
    lines.append(
        f"| {case} | {g['n']} | {g['samples_per_s']:.0f} | {t['samples_per_s']:.0f} | "
        f"{g['samples_per_s'] / t['samples_per_s']:.2f} | {g['train_s']:.2f} | {t['train_s']:.2f} | "
        f"{g['test_acc']:.4f} | {t['test_acc']:.4f} |"
    )
lines += ["", "Machine:", ""] + [f"- {l}" for l in cmd[1:]]
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
