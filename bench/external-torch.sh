#!/usr/bin/env bash
# The same N trials of examples/torch_train.py run three ways on one machine, in one run:
#   a  `gpumux sweep`, CONC at a time (each trial gets cores ÷ CONC threads),
#   b  one after another by hand (each with PyTorch's default threads: one per core),
#   c  all N started at once by hand, with no thread limits.
# The order is a b c, then c b a, and so on for REPS repetitions. Wall times go to runs.csv, the
# medians and the ratios b/a and c/a to summary.md, and the machine to command.txt, in OUT.
#
# Usage: bench/external-torch.sh [OUT]     (default results/external-torch-cpu)
#   PYTHON=path/to/python  an interpreter with torch (default: python3)
#   TRIALS=6 CONC=2 EPOCHS=3 BATCH=64 LR=0.001 REPS=2   the size of the comparison
#   GPUMUX=path/to/gpumux  (default: target/release/gpumux, built here)
#
# MODE=clients runs the three clients' sweeps instead (jobs/sweep-{torch,jax,keras}.yaml), each
# with its framework installed into a venv under target/bench-venvs/ (made when missing), checks
# them with tests/frameworks/check_sweep.py and writes their wall times to OUT/clients.csv
# (default OUT results/external-clients-cpu). FRAMEWORKS="torch keras jax" picks which.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${MODE:-torch}"
bin="${GPUMUX:-target/release/gpumux}"
[ -n "${GPUMUX:-}" ] || cargo build --release --quiet
bin="$(realpath "$bin")"
thread_vars=(OMP_NUM_THREADS MKL_NUM_THREADS OPENBLAS_NUM_THREADS VECLIB_MAXIMUM_THREADS
    NUMEXPR_NUM_THREADS TF_NUM_INTRAOP_THREADS TF_NUM_INTEROP_THREADS PJRT_NPROC XLA_FLAGS)
for v in "${thread_vars[@]}"; do unset "$v"; done
now() { date +%s.%N; }
machine() {
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
    echo "cores (nproc): $(nproc)"
    echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
    echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
}

if [ "$mode" = clients ]; then
    out="${1:-results/external-clients-cpu}"
    mkdir -p "$out"
    { echo "MODE=clients FRAMEWORKS=${FRAMEWORKS:-torch keras jax} bench/external-torch.sh $out"; machine; } > "$out/command.txt"
    echo "framework,version,wall_s,exit,check" > "$out/clients.csv"
    share=$(( $(nproc) / 2 )); [ "$share" -ge 1 ] || share=1
    for fw in ${FRAMEWORKS:-torch keras jax}; do
        case "$fw" in
            torch) pkg=torch; mod=torch ;;
            keras) pkg=tensorflow-cpu; mod=tensorflow ;;
            jax) pkg="jax[cpu]"; mod=jax ;;
            *) echo "external-torch: unknown framework $fw" >&2; exit 2 ;;
        esac
        venv="target/bench-venvs/$fw"
        if [ ! -x "$venv/bin/python3" ] || ! "$venv/bin/python3" -c "import $mod" 2>/dev/null; then
            python3 -m venv "$venv"
            "$venv/bin/pip" install --quiet "$pkg"
        fi
        version="$("$venv/bin/python3" -c "import $mod; print($mod.__version__)" 2>/dev/null)"
        rm -rf "$out/sweep-$fw"
        t0=$(now); rc=0
        PATH="$PWD/$venv/bin:$PATH" "$bin" sweep "jobs/sweep-$fw.yaml" --out "$out/sweep-$fw" > "$out/sweep-$fw.log" 2>&1 || rc=$?
        wall=$(echo "$(now) - $t0" | bc)
        ok=0
        python3 tests/frameworks/check_sweep.py "$out/sweep-$fw" --trials 4 --epochs 3 --threads "$share" \
            --params batch_size,epochs,lr >> "$out/sweep-$fw.log" 2>&1 || ok=$?
        echo "$fw,$version,$wall,$rc,$([ $ok -eq 0 ] && echo ok || echo FAIL)" | tee -a "$out/clients.csv"
    done
    exit 0
fi

[ "$mode" = torch ] || { echo "external-torch: MODE is torch or clients, not $mode" >&2; exit 2; }
out="${1:-results/external-torch-cpu}"
py="${PYTHON:-python3}"
trials="${TRIALS:-6}" conc="${CONC:-2}" epochs="${EPOCHS:-3}" batch="${BATCH:-64}" lr="${LR:-0.001}" reps="${REPS:-2}"
"$py" -c 'import torch' || { echo "external-torch: $py has no torch (set PYTHON)" >&2; exit 3; }
mkdir -p "$out"
work="$(mktemp -d "${TMPDIR:-/tmp}/external-torch.XXXXXX")"
trap 'rm -rf "$work"' EXIT
pydir="$(dirname "$(command -v "$py")")"

# The same trials in all three ways: trial i trains with seed i; only the seed differs.
train=(examples/torch_train.py --lr "$lr" --batch-size "$batch" --epochs "$epochs" --device cpu)
runs="[$(seq -s, 1 "$trials")]"
cat > "$work/job.yaml" <<EOF
name: external-torch-bench
command: "$py ${train[*]} --seed {run}"
metric: {name: test_acc, goal: maximize}
method: grid
concurrency: $conc
parameters:
  run: {values: $runs}
EOF

run_a() {
    rm -rf "$work/a"
    PATH="$pydir:$PATH" "$bin" sweep "$work/job.yaml" --out "$work/a" > "$work/a.log" 2>&1
}
run_b() {
    for i in $(seq 1 "$trials"); do "$py" "${train[@]}" --seed "$i" > "$work/b-$i.log" 2>&1; done
}
run_c() {
    local pids=() rc=0
    for i in $(seq 1 "$trials"); do "$py" "${train[@]}" --seed "$i" > "$work/c-$i.log" 2>&1 & pids+=($!); done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    return $rc
}

{
    echo "PYTHON=$py TRIALS=$trials CONC=$conc EPOCHS=$epochs BATCH=$batch LR=$lr REPS=$reps bench/external-torch.sh $out"
    machine
    echo "python: $("$py" --version 2>&1), torch $("$py" -c 'import torch; print(torch.__version__, "default threads", torch.get_num_threads())')"
    echo "a: gpumux sweep, $conc at a time, threads a trial: max(1, $(nproc) / $conc)"
    echo "b: one after another by hand, default threads; c: all $trials at once by hand, default threads"
} > "$out/command.txt"
echo "rep,mode,wall_s,exit" > "$out/runs.csv"
for r in $(seq 1 "$reps"); do
    order="a b c"; [ $((r % 2)) -eq 0 ] && order="c b a"
    for m in $order; do
        t0=$(now); rc=0
        "run_$m" || rc=$?
        wall=$(echo "$(now) - $t0" | bc)
        echo "$r,$m,$wall,$rc" | tee -a "$out/runs.csv"
        [ "$rc" -eq 0 ] || { echo "external-torch: way $m failed (exit $rc); logs in $work" >&2; trap - EXIT; exit 1; }
    done
done

python3 - "$out" <<'EOF'
import csv, statistics, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(f"{out}/runs.csv")))
med = {m: statistics.median(float(r["wall_s"]) for r in rows if r["mode"] == m) for m in "abc"}
names = {"a": "gpumux sweep (thread shares)", "b": "one after another by hand", "c": "all at once by hand, no thread limits"}
lines = [open(f"{out}/command.txt").readline().strip(), "",
         "| way | median wall (s) | runs (s) | ratio to a |", "|---|---|---|---|"]
for m in "abc":
    runs = ", ".join(f"{float(r['wall_s']):.1f}" for r in rows if r["mode"] == m)
    lines.append(f"| {m}: {names[m]} | {med[m]:.1f} | {runs} | {med[m] / med['a']:.2f} |")
lines += ["", f"b/a = {med['b'] / med['a']:.2f}, c/a = {med['c'] / med['a']:.2f} (above 1: gpumux is faster)"]
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
