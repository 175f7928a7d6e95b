#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU (an H100 or H200), no Rust toolchain and no
# network, runs the GPU tests, the parity checks against the CPU backend and short benchmarks from
# binaries built beforehand (scripts/build-gpu-check.sh, which fills .carry/), then prints a table
# with each step's result and seconds.
#
#   scripts/gpu-check.sh [--rehearse] [PHASE ...]      (default: check)
#
# It starts with `gpumux devices --backend cuda`: where no GPU can be used it stops within seconds
# with one line that says why, exit 4. Every step forces the CUDA backend (flags, BACKEND=cuda for
# the bench scripts, `backend: cuda` in the jobs it writes) and runs with GPUMUX_REQUIRE_GPU=1 and
# GPUMUX_REQUIRE_CUDNN=1, so nothing passes on the CPU, and fib and parallel results are checked
# for failed trials and for the backend they ran on.
#
# Phases, in the order given; `check` is ordered by what each step tells per second:
#   check    (a) the device line and the libcuda, NVRTC, cuBLAS and cuDNN files bound, by absolute
#            path, with the slice plans for 34 green slices and for unequal (5:3) ones; (b) every
#            GPU test, one at a time (each op against its CPU twin, ResNet parity, caps,
#            green-partition disjointness, mirrored slices = one slice, graphs on and off); none
#            may be ignored; (c) a short MLP fib (N=1,2,5, 1 epoch, --verbose) in
#            each split mode: shared, logical, process, green; (d) the comparisons: one MLP
#            training against PyTorch eager (graphs on and off), ResNet-50 224px images/s
#            against PyTorch, even against auto ratios on unequal green partitions
#            (5:3 as the device's SM groups allow; auto must be faster), and two GPUs (or a clean stop with one); (e) SIGTERM
#            during ResNet-50 on 13 green slices: exit 3 within 20 s (scripts/stop-latency.sh)
#   speed    bench/gpu-speed.sh: every ratio of the GPU speed table against its peers (PyTorch
#            eager, N PyTorch processes, a torch.func ensemble) on this GPU, interleaved, warm
#            against warm, into GPU_CHECK_DIR/gpu-speed (ratios.csv, summary.md, command.txt)
#   tests    the library and CLI test binaries on this machine (those carried: the library's
#            alone unless scripts/build-gpu-check.sh --all carried the others)
#   bench    the mirrored (data-parallel) table, a batch scan, a ResNet-50 fib (N=1,2,5,13), and
#            bench/fused-refill.sh (256 MLP trials, 34 at a time, pruned against unpruned)
#   results  the full fib experiments for results/: MLP and CNN on MNIST-10k, N=1..34, every
#            split mode (long: give it a call of its own)
#
# --rehearse runs the same flow on the CPU backend with tiny sizes (N=1,2, 1 or 2 epochs, reduced
# models): seconds for `check`, under two minutes for every phase on 2 cores. Every line it
# prints, and every line of summary.txt and device.txt, starts with REHEARSAL. The GPU tests are
# listed as ignored (no GPUMUX_REQUIRE_GPU), green runs as logical, the PyTorch steps run on
# --device cpu when torch imports (else SKIP(no torch)), and a last step that needs more than the
# budget has left shows the SKIP for time. It exits 0 unless a step failed.
# scripts/test-gpu-check.sh runs it, and the check without a GPU, as CI does.
#
# Environment:
#   GPU_CHECK_BUDGET  seconds the whole run may take (default 420, so that a first call of 10
#                     minutes holds the start-up, the check and the copy; 180 when rehearsing).
#                     A step that would start with less than the time it needs left is skipped
#                     (SKIP(time)); a running step is stopped at its own time limit or when the
#                     budget runs out (FAIL(timeout)), so the summary is always written.
#   GPU_CHECK_DIR     where logs and results go (default /tmp/gpumux-gpu-check, or
#                     /tmp/gpumux-gpu-check-rehearsal).
#   OUT               when set, the summary, the device lines and all of GPU_CHECK_DIR packed as
#                     gpu-check.tgz are copied there (three files), also when there is no GPU.
#   GPUMUX_CARRY      the folder of prebuilt binaries (default .carry).
# SIGTERM or SIGINT stops the running step (FAIL(interrupted)) and skips the rest; the summary and
# the copy to OUT are still made.
# Exit: 0 all passed; 1 a step failed (or the first failed before it described the GPU: the run
# stops there); 2 usage, or no binaries (or binaries too old for this script) in .carry; 3 nothing
# failed, but steps were skipped for time; 4 no usable GPU.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD

usage() {
    sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

rehearse=0
phases=()
for a in "$@"; do
    case $a in
    --rehearse) rehearse=1 ;;
    -h | --help)
        usage
        exit 0
        ;;
    check | speed | tests | bench | results) phases+=("$a") ;;
    *)
        echo "gpu-check: unknown argument '$a' (--rehearse; phases: check, speed, tests, bench, results)" >&2
        exit 2
        ;;
    esac
done
[ ${#phases[@]} -eq 0 ] && phases=(check)

if [ "$rehearse" = 1 ]; then
    backend=cpu
    gsplit=logical # the CPU has no SMs to partition: green steps run as logical
    budget=${GPU_CHECK_BUDGET:-180}
    out=${GPU_CHECK_DIR:-/tmp/gpumux-gpu-check-rehearsal}
    tag="REHEARSAL "
    unset GPUMUX_REQUIRE_GPU GPUMUX_REQUIRE_CUDNN
else
    backend=cuda
    gsplit=green
    budget=${GPU_CHECK_BUDGET:-420}
    out=${GPU_CHECK_DIR:-/tmp/gpumux-gpu-check}
    tag=""
    # A GPU test that finds no GPU, or no cuDNN (the PyTorch environment there has cuDNN 9),
    # fails instead of skipping.
    export GPUMUX_REQUIRE_GPU=1
    export GPUMUX_REQUIRE_CUDNN=1
fi
start=$(date +%s)

# Marks every line of a file that the rehearsal writes (summary.txt, device.txt).
mark() {
    if [ "$rehearse" = 1 ]; then sed 's/^/REHEARSAL /'; else cat; fi
}

declare -a names results secs notes
record() { # record NAME RESULT SECONDS
    names+=("$1")
    results+=("$2")
    secs+=("$3")
}
skip() { # skip NAME REASON: a step not run
    record "$1" "SKIP($2)" "-"
    echo "== $1: SKIP ($2)"
}
# demote REASON [DETAIL]: the last step ran and exited 0, but its output shows that it did not
# do its job: FAIL(REASON), and DETAIL among the summary's notes.
demote() {
    local i=$((${#results[@]} - 1))
    if [ -n "$1" ] && [ "${results[$i]}" = PASS ]; then
        results[i]="FAIL($1)"
        echo "== ${names[$i]}: FAIL ($1${2:+: $2})"
        [ -n "${2:-}" ] && note "${names[$i]}: $2"
    fi
    return 0
}
# The backend that gpumux's first `backend:` line in LOG names must be the one asked for.
ran_on() { # ran_on LOG
    local line
    line=$(grep -m 1 -E '^backend: ' "$out/$1" 2>/dev/null)
    [[ $line == "backend: $backend"* ]] && return
    if [ -z "$line" ]; then
        demote "no backend line" "gpumux named no backend"
    else
        demote "ran on $(awk '{ print $2 }' <<<"$line")" "$line"
    fi
}
# checked VERIFY-ARGS...: demotes the last step with what `verify` finds wrong in its results
# (or notes what it finds worth saying).
checked() {
    local r
    r=$(verify "$@")
    if [ -z "${r%%|*}" ] && [ -n "${r#*|}" ] && [[ ${results[-1]} == PASS ]]; then
        note "${names[-1]}: ${r#*|}"
    fi
    demote "${r%%|*}" "${r#*|}"
}
note() {
    notes+=("$1")
}

# SIGTERM or SIGINT stops the running step; the steps left are skipped, and the summary and the
# copy to $OUT are still made.
stop=0
child=""
trap 'stop=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT
quiet=0 # set for one call (quiet=1 step ...): no header or tail of the log on the terminal
# step NAME LOG NEED/LIMIT COMMAND...: runs COMMAND with its output in LOG. With fewer than NEED
# seconds of the budget left it is not started (SKIP(time)); it is stopped after LIMIT seconds,
# or when the budget runs out (FAIL(timeout)), so that one step that hangs leaves the others
# their time.
step() {
    local name=$1 log=$2 need=${3%/*} limit=${3#*/}
    shift 3
    if [ "$stop" = 1 ]; then
        skip "$name" interrupted
        return
    fi
    local left=$((budget - ($(date +%s) - start)))
    if [ "$left" -lt "$need" ]; then
        skip "$name" time
        echo "   it needs ${need} s; ${left} s of the ${budget} s budget are left"
        return
    fi
    [ "$limit" -lt "$left" ] && left=$limit
    local t0 t1 rc
    t0=$(date +%s.%N)
    echo "== $name: $*" >"$out/$log"
    [ "$quiet" = 1 ] || cat "$out/$log"
    # In the background, so that a signal's trap runs at once (it stops the step).
    timeout --kill-after=10 "$left" "$@" >>"$out/$log" 2>&1 </dev/null &
    child=$!
    wait "$child"
    rc=$?
    while kill -0 "$child" 2>/dev/null; do
        wait "$child"
        rc=$?
    done
    child=""
    t1=$(date +%s.%N)
    [ "$quiet" = 1 ] || tail -n +2 "$out/$log" | tail -n 15
    local result=PASS
    [ $rc -ne 0 ] && result="FAIL($rc)"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && result="FAIL(timeout)"
    record "$name" "$result" \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')"
    [ "$stop" = 1 ] && results[${#results[@]} - 1]="FAIL(interrupted)"
    return 0
}

# What a test binary's last `test result:` line (and the GPU harness's count line) says. With
# no test passed the step fails, and with `all` also when a test was ignored: the GPU harness
# lists its tests as ignored where no GPU (or no cuDNN) can be used, unless GPUMUX_REQUIRE_GPU=1
# (GPUMUX_REQUIRE_CUDNN=1) makes them fail instead. Rehearsing, none of this is judged.
tests_ran() { # tests_ran LOG [all]
    local line count
    [[ ${results[-1]} == SKIP* ]] && return
    count=$(grep -m 1 -E '^GPU tests: ' "$out/$1")
    [ -n "$count" ] && note "$count"
    line=$(grep -E '^test result:' "$out/$1" | tail -n 1)
    note "${names[-1]}: ${line:-no test result line}"
    [ "$rehearse" = 1 ] && return
    if ! grep -qE ' [1-9][0-9]* passed' <<<"$line"; then
        demote "no test passed"
    elif [ "${2:-}" = all ] && grep -qE ' [1-9][0-9]* ignored' <<<"$line"; then
        demote "tests ignored"
    fi
}

# Checks the CSVs a run wrote; prints "REASON|DETAIL" when they are wrong, or nothing.
#   verify fib DIR NS SPLITS BACKEND [caps] | verify ratios TABLE BACKEND JUDGE
#   verify tables BACKEND TABLE...          (caps: trials that fail their slice's cap are expected)
verify() {
    python3 - "$@" <<'PY' 2>&1
import csv, sys
def why(kind, path, *args):
    if kind == "fib":
        ns = sorted(int(n) for n in args[0].split(","))
        splits, backend = args[1].split(","), args[2]
        allowed = len(args) > 3 and args[3] == "caps"
        rows = list(csv.DictReader(open(f"{path}/runs.csv")))
        for r in rows:
            if r["backend"] != backend:
                return f"ran on {r['backend']}|runs.csv says backend {r['backend']}"
        for s in splits:
            got = sorted(int(r["n"]) for r in rows if r["split"] == s)
            if got != ns:
                return f"missing rounds|{s}: rounds for N={got}, not {ns}"
        bad = [f"{r['split']} N={r['n']}: {r['failed']} of {r['n']}" for r in rows
               if int(r["failed"]) or int(r["ok"]) != int(r["n"])]
        if bad and allowed:
            trials = list(csv.DictReader(open(f"{path}/trials.csv")))
            other = [t for t in trials if t["state"] != "COMPLETE" and "cap" not in t["error"]]
            if other:
                return f"failed trials|{len(other)} failed trials not for their cap, e.g. {other[0]['error'][:100]}"
            return "|trials over their slice's cap (expected at large N): " + ", ".join(bad)
        if bad:
            return "failed trials|failed trials in " + ", ".join(bad)
    elif kind == "tables":
        for table in args:
            for r in csv.DictReader(open(table)):
                if r["backend"] != path:
                    return f"ran on {r['backend']}|{table} says backend {r['backend']}"
    else:
        backend, judge = args[0], args[1] == "1"
        rows = {r["ratios"]: r for r in csv.DictReader(open(path))}
        for r in rows.values():
            if r["backend"] != backend:
                return f"ran on {r['backend']}|table.csv says backend {r['backend']}"
        e, a = float(rows["even"]["samples_per_s"]), float(rows["auto"]["samples_per_s"])
        if judge and not a > e:
            return f"auto not faster|even {e:.0f} samples/s, auto {a:.0f} samples/s"
    return ""
try:
    print(why(*sys.argv[1:]))
except Exception as err:
    print(f"no results|results unreadable: {err!r}")
PY
}

main() {
    local carry bin
    carry=${GPUMUX_CARRY:-.carry}
    carry=$(cd "$carry" 2>/dev/null && pwd) || {
        echo "gpu-check: ${GPUMUX_CARRY:-.carry} is missing; run scripts/build-gpu-check.sh first" >&2
        return 2
    }
    bin="$carry/gpumux"
    if [ ! -x "$bin" ]; then
        echo "gpu-check: $bin is missing; run scripts/build-gpu-check.sh first" >&2
        return 2
    fi
    # An earlier check's folder (it has the marker) is replaced; any other folder must be empty.
    if [ -e "$out/.gpu-check" ]; then
        rm -rf "$out"
    elif [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
        echo "gpu-check: $out is not empty and not an earlier check's folder; set GPU_CHECK_DIR" >&2
        return 2
    fi
    mkdir -p "$out" && touch "$out/.gpu-check"

    # The test binaries were built elsewhere: they find the tree, the binary and the data from here.
    export GPUMUX_ROOT="$root"
    export CARGO_BIN_EXE_gpumux="$bin"
    export RUST_BACKTRACE=1
    export PYTHONUNBUFFERED=1

    # (a) The device, the files of the CUDA libraries bound, and whether a GPU can be used at all.
    quiet=1 step "device, bound libraries, slice plan" devices.log 0/60 \
        "$bin" devices --backend "$backend" --n 34 --split "$gsplit"
    local rc=${results[-1]}
    device=$(grep -E '^CUDA device 0:' "$out/devices.log" | head -n 1)
    [ -n "$device" ] || device=$(grep -E '^host:' "$out/devices.log" | head -n 1)
    local why
    why=$(grep -E '^error' "$out/devices.log" | tail -n 1)
    why=${why#error: }
    if [ "$rc" = "FAIL(4)" ] || [ "$rc" = "FAIL(timeout)" ]; then
        stopped=4
        [ "$rc" = "FAIL(4)" ] || why="gpumux devices --backend $backend did not answer within 60 s"
        note "no usable GPU: ${why:-gpumux devices --backend $backend exited 4}"
    elif [ "$rc" = "FAIL(2)" ] && grep -q "unexpected argument '--backend'" "$out/devices.log"; then
        stopped=2
        note "$bin does not take \`devices --backend\`: it is older than this script; run scripts/build-gpu-check.sh"
    elif [ "$rehearse" = 0 ] && ! grep -qE '^CUDA device 0:' "$out/devices.log"; then
        # It failed some other way (a panic, say) before the GPU was described: the steps after
        # it would only fail the same way.
        stopped=1
        note "gpumux devices --backend $backend ended $rc before describing the GPU: ${why:-see devices.log}"
    fi
    if [ -n "$stopped" ]; then
        {
            echo "date: $(date -u +%FT%TZ)"
            echo "phases: ${phases[*]}: stopped at the first step"
            echo "${notes[-1]}"
        } | mark >"$out/device.txt"
        summary >/dev/null
        pack >/dev/null
        echo "gpu-check: ${notes[-1]} (exit $stopped)" >&2
        return "$stopped"
    fi
    if [ "$rehearse" = 1 ]; then
        ran_on devices.log
    else
        local lib missing=()
        for lib in driver nvrtc cublas cudnn; do
            grep -qE "^library $lib: /" "$out/devices.log" || missing+=("$lib")
        done
        [ ${#missing[@]} -gt 0 ] && demote "unbound: ${missing[*]}" "no library file bound for ${missing[*]}"
        ran_on devices.log
    fi

    torch=$(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "cudnn", torch.backends.cudnn.version())' 2>/dev/null)
    torchvision=$(python3 -c 'import torchvision; print("torchvision", torchvision.__version__)' 2>/dev/null)
    {
        echo "date: $(date -u +%FT%TZ)"
        echo "phases: ${phases[*]}${tag:+ (rehearsal on the CPU backend)}"
        grep -vE '^(==|slice|  )' "$out/devices.log"
        if command -v nvidia-smi >/dev/null 2>&1; then
            nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
            nvidia-smi -q 2>/dev/null | grep -iE "MIG Mode|Compute Mode|Persistence" | head -5
        fi
        echo "${torch:-torch: not importable}"
        echo "${torchvision:-torchvision: not importable}"
    } | mark | tee "$out/device.txt"

    local p
    for p in "${phases[@]}"; do
        case $p in
        check) phase_check ;;
        speed) phase_speed ;;
        tests) phase_tests ;;
        bench) phase_bench ;;
        results) phase_results ;;
        esac
    done
    if [ "$rehearse" = 1 ]; then
        # The SKIP for time, shown deterministically: a step that needs more than is left.
        step "a step that needs more than the budget has left" over-budget.log $((budget + 1))/1 true
    fi
    comparisons
    summary
    pack
    return "$(exit_code)"
}

# 4 (2) when no GPU could be used (the binary is too old); else 1 when a step failed; else 3
# when a step was skipped (0 when rehearsing: skips are expected).
stopped=""
exit_code() {
    [ -n "$stopped" ] && echo "$stopped" && return
    local r code=0
    for r in "${results[@]}"; do
        [[ $r == SKIP* ]] && [ "$rehearse" = 0 ] && code=3
    done
    for r in "${results[@]}"; do
        [[ $r == FAIL* ]] && code=1
    done
    echo "$code"
}

# A PyTorch step: run on the GPU (the CPU when rehearsing); without torch (or torchvision, for
# ResNet-50) a FAIL, or a SKIP when rehearsing.
torch_step() { # torch_step NAME LOG NEED/LIMIT SCRIPT ARGS...
    local lacks=""
    [ -z "$torch" ] && lacks=torch
    [ -z "$lacks" ] && [ -z "$torchvision" ] && [[ $4 == *resnet* ]] && lacks=torchvision
    if [ -n "$lacks" ]; then
        if [ "$rehearse" = 1 ]; then skip "$1" "no $lacks"; else record "$1" "FAIL(no $lacks)" "-"; fi
        return
    fi
    local name=$1 log=$2 times=$3
    shift 3
    step "$name" "$log" "$times" python3 "$@" --device "$backend"
}

phase_check() {
    local n=1,2,5 epochs=5 s
    [ "$rehearse" = 1 ] && n=1,2 epochs=2
    # (a) The slice plan of unequal green partitions, in a second.
    step "devices: unequal $gsplit slices (ratios 5:3)" devices-ratios.log 5/60 \
        "$bin" devices --backend "$backend" --ratios 5,3 --split "$gsplit"
    ran_on devices-ratios.log
    # (b) Every GPU test, one at a time.
    step "GPU tests: ops vs CPU, ResNet, caps, green, mirrored, graphs" gpu-tests.log 30/240 \
        "$carry/tests/gpu" --test-threads=1 --nocapture
    tests_ran gpu-tests.log all
    # (c) A short fib in each split mode; --verbose logs each process-mode worker's start-up
    # time and memory.
    for s in shared logical process green; do
        local run=$s as=""
        [ "$s" = green ] && run=$gsplit
        [ "$run" != "$s" ] && as=" (as $run: no SMs to split)"
        step "fib: MLP, N=$n, 1 epoch, $s$as" "fib-$s.log" 15/90 \
            "$bin" --verbose fib jobs/mnist-fib.yaml --backend "$backend" --n "$n" --splits "$run" \
            --epochs 1 --out "$out/fib-$s"
        checked fib "$out/fib-$s" "$n" "$run" "$backend"
    done
    # (d) The comparisons.
    step "gpumux: one MLP training (N=1, $epochs epochs, batch 128)" gpumux-train.log 15/90 \
        "$bin" train --backend "$backend" --epochs "$epochs" --batch-size 128 --lr 0.001
    ran_on gpumux-train.log
    step "gpumux: the same training with graphs off" gpumux-train-nographs.log 15/90 \
        "$bin" train --backend "$backend" --epochs "$epochs" --batch-size 128 --lr 0.001 --no-graphs
    ran_on gpumux-train-nographs.log
    local repeats=3
    [ "$rehearse" = 1 ] && repeats=1
    torch_step "PyTorch eager: the same training" torch-train.log 30/120 \
        bench/torch_mnist.py --model mlp --hidden 128 --epochs "$epochs" --batch-size 128 --lr 0.001 --repeats "$repeats"
    # ResNet-50 throughput at N=1: 224×224, 285 classes, batch 32, FP32 on both sides. Epoch 2 of
    # gpumux (60 steps, after the warm-up and capture of epoch 1) against PyTorch's timed steps.
    # Rehearsing: a 1/16-width ResNet-50 on 32×32 images, two steps an epoch.
    if [ "$rehearse" = 1 ]; then
        rn_samples=64 rn_name="1/16 width, 32px, batch 32"
        cat >"$out/resnet50-throughput.yaml" <<YAML
model: {kind: resnet50, stem: cifar, width: 0.0625}
data: {source: synthetic, shape: [3, 32, 32], classes: 10, train_samples: $rn_samples, test_samples: 32}
train: {epochs: 2, batch_size: 32, optimizer: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.0001}
seed: 1
backend: $backend
YAML
        rn_torch=(--stem cifar --classes 10 --input 32 --batch-size 8 --warmup 1 --steps 2 --repeats 1)
    else
        rn_samples=1920 rn_name="224px, batch 32, FP32"
        cat >"$out/resnet50-throughput.yaml" <<YAML
model: {kind: resnet50, stem: imagenet}
data: {source: synthetic, shape: [3, 224, 224], classes: 285, train_samples: $rn_samples, test_samples: 32}
train: {epochs: 2, batch_size: 32, optimizer: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.0001}
seed: 1
backend: $backend
YAML
        rn_torch=(--stem imagenet --classes 285 --input 224 --batch-size 32 --steps 30 --repeats 3)
    fi
    step "gpumux: ResNet-50 $rn_name (N=1)" resnet50-gpumux.log 60/150 \
        "$bin" train "$out/resnet50-throughput.yaml" --backend "$backend"
    ran_on resnet50-gpumux.log
    torch_step "PyTorch eager: ResNet-50 $rn_name" resnet50-torch.log 45/120 \
        bench/torch_resnet50.py "${rn_torch[@]}" --precision fp32
    local ratios=() judge=1
    if [ "$rehearse" = 1 ]; then
        judge=0 # no SMs to split: both slices run at one speed
        cat >"$out/parallel-ratios.yaml" <<YAML
name: parallel-ratios-rehearsal
model: {kind: mlp, hidden: [64]}
data: {source: synthetic, train_samples: 2048, test_samples: 256}
train: {epochs: 1, batch_size: 256, optimizer: adam, lr: 0.001}
seed: 0
ratios: [5, 3]
parallel: {ratios: auto}
backend: $backend
YAML
        ratios=(JOB="$out/parallel-ratios.yaml")
    fi
    step "ratios: even vs auto, $gsplit slices 5:3 (the log names their SMs)" parallel-ratios.log 30/120 \
        env GPUMUX="$bin" BACKEND="$backend" SPLIT="$gsplit" "${ratios[@]}" bench/parallel-ratios.sh "$out/parallel-ratios"
    checked ratios "$out/parallel-ratios/table.csv" "$backend" "$judge"
    step "slices on two GPUs (or a clean stop with one)" parallel-two-gpus.log 20/90 \
        env GPUMUX="$bin" BACKEND="$backend" bench/parallel-two-gpus.sh "$out/parallel-two-gpus"
    # (e) SIGTERM in the middle of slow steps (ResNet-50 on 13 green slices of 8 SMs) stops the
    # run within 20 s: the host queues at most a few steps ahead of each trial's stream.
    # The signal comes after fib's untimed warm-up round (2 steps and one test batch of each trial).
    local stop=(40 20 jobs/resnet50-fib.yaml --n 13)
    [ "$rehearse" = 1 ] && stop=(3 10 jobs/cnn-fib.yaml --n 2)
    step "SIGTERM during slow steps: exit 3 within ${stop[1]} s" stop-latency.log 75/100 \
        scripts/stop-latency.sh "$bin" "$out/stop-latency" "${stop[@]}" --backend "$backend" --splits "$gsplit"
}

phase_tests() {
    # Every test binary built (the library's first), but the GPU tests, which `check` runs.
    local f t
    for f in "$carry/tests/lib" "$carry"/tests/*; do
        t=$(basename "$f")
        [ "$t" = gpu ] && continue
        [ "$t" = lib ] && [ "$f" != "$carry/tests/lib" ] && continue
        step "test binary: $t" "tests-$t.log" 20/300 "$f" --test-threads=4
        tests_ran "tests-$t.log"
    done
}

phase_speed() {
    local args=(--budget 300)
    [ "$rehearse" = 1 ] && args=(--rehearse --budget 90)
    step "gpu-speed: the speed table against PyTorch, N processes and torch.func" gpu-speed.log 60/330 \
        env GPUMUX="$bin" bench/gpu-speed.sh "${args[@]}" --out "$out/gpu-speed"
}

phase_bench() {
    local n=1,2,5,13 splits=shared,logical,green mirrored=() job=jobs/resnet50-fib.yaml scan=()
    if [ "$rehearse" = 1 ]; then
        n=1,2 splits=shared,logical
        cat >"$out/parallel-mirrored.yaml" <<YAML
name: parallel-mirrored-rehearsal
model: {kind: mlp, hidden: [64]}
data: {source: synthetic, train_samples: 2048, test_samples: 256}
train: {epochs: 1, batch_size: 128, optimizer: adam, lr: 0.001}
seed: 3
memory: {fraction: 0.9}
backend: $backend
YAML
        mirrored=(JOB="$out/parallel-mirrored.yaml")
        cat >"$out/resnet50-fib.yaml" <<YAML
name: resnet50-fib-rehearsal
model: {kind: resnet50, stem: cifar, width: 0.0625}
data: {source: synthetic, shape: [3, 32, 32], classes: 10, train_samples: 128, test_samples: 64}
train: {epochs: 1, batch_size: 32, optimizer: sgd, lr: 0.1, momentum: 0.9}
seed: 42
memory: {fraction: 0.9}
backend: $backend
YAML
        job="$out/resnet50-fib.yaml"
        scan=(--max-batch 64 --seconds 0.1)
    fi
    step "mirrored: 1 vs 2 vs 4 $gsplit slices" parallel-mirrored.log 60/300 \
        env GPUMUX="$bin" BACKEND="$backend" SPLIT="$gsplit" "${mirrored[@]}" bench/parallel-mirrored.sh "$out/parallel-mirrored"
    checked tables "$backend" "$out/parallel-mirrored/scaled/table.csv" "$out/parallel-mirrored/global256/table.csv"
    step "batch-scan: the CNN on one 1 GiB logical slice" batch-scan.log 30/120 \
        "$bin" batch-scan jobs/parallel-mirrored.yaml --backend "$backend" --split logical --mib-per-slice 1024 \
        --out "$out/batch-scan" "${scan[@]}"
    ran_on batch-scan.log
    step "fib: ResNet-50 on CIFAR-shaped data, N=$n" fib-resnet.log 60/600 \
        "$bin" fib "$job" --backend "$backend" --n "$n" --splits "$splits" --out "$out/fib-resnet"
    checked fib "$out/fib-resnet" "$n" "$splits" "$backend" caps
    # Fused pruning with refill: a fused bayes+hyperband sweep against the same sweep unpruned.
    local refill=(SEEDS=1 RUN_CAP=256 CONCURRENCY=34)
    [ "$rehearse" = 1 ] && refill=(SEEDS=1 RUN_CAP=12 CONCURRENCY=4)
    step "fused refill: bayes+hyperband against unpruned, fused" fused-refill.log 60/240 \
        env GPUMUX="$bin" BACKEND="$backend" "${refill[@]}" bench/fused-refill.sh "$out/fused-refill"
}

phase_results() {
    local n=1,2,3,5,8,13,21,34 splits=shared,process,logical,green,fused epochs=() m
    if [ "$rehearse" = 1 ]; then
        n=1,2 splits=shared,process,fused epochs=(--epochs 1)
    fi
    for m in mnist cnn; do
        local model=MLP
        # The rehearsal's CNN on the CPU is its slowest step: fused is rehearsed on the MLP.
        [ "$m" = cnn ] && model=CNN && [ "$rehearse" = 1 ] && splits=shared,process
        step "fib: $model on MNIST-10k, N=$n, splits $splits" "results-$m.log" 120/3600 \
            "$bin" fib "jobs/$m-fib.yaml" --backend "$backend" --n "$n" --splits "$splits" "${epochs[@]}" \
            --out "$out/$m-fib-$backend"
        checked fib "$out/$m-fib-$backend" "$n" "$splits" "$backend"
    done
}

# The side-by-side figures, from the logs of the steps that ran.
comparisons() {
    local ready
    ready=$(grep -h 'worker ready:' "$out/fib-process.log" 2>/dev/null)
    if [ -n "$ready" ]; then
        note "process mode: $(wc -l <<<"$ready") workers ready, $(grep -o '[0-9.]* s after its start' <<<"$ready" |
            sort -n | tail -n 1) at most; the first: $(head -n 1 <<<"$ready" | sed 's/.*; //')"
    fi
    if [ -f "$out/gpumux-train.log" ]; then
        local g t ng
        g=$(grep '^done:' "$out/gpumux-train.log" | sed 's/.*, \([0-9.]*\) s, .*/\1/')
        t=$(grep -E '^torch,' "$out/torch-train.log" 2>/dev/null | awk -F, '{print $8}' | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}')
        ng=$(grep '^done:' "$out/gpumux-train-nographs.log" 2>/dev/null | sed 's/.*, \([0-9.]*\) s, .*/\1/')
        note "one MLP training: gpumux ${g:-?} s (graphs off ${ng:-?} s), PyTorch eager median ${t:-?} s"
    fi
    if [ -f "$out/resnet50-gpumux.log" ]; then
        note "$(python3 - "$out/resnet50-gpumux.log" "$out/resnet50-torch.log" "$rn_samples" "$rehearse" <<'PY'
import json, re, sys
try:
    t = [float(m.group(1)) for m in re.finditer(r"^epoch\s+\d+ .* ([0-9.]+) s$", open(sys.argv[1]).read(), re.M)]
    g = int(sys.argv[3]) / (t[1] - t[0])
    line = f"ResNet-50 (epoch 2): gpumux {g:.0f} images/s"
    try:
        last = [l for l in open(sys.argv[2]) if l.startswith("{")][-1]
        p = json.loads(last)["images_per_s"]
        print(f"{line}, PyTorch eager {p:.0f} images/s ({g / p:.2f}x)"
              + (" (not comparable: PyTorch's is full width)" if sys.argv[4] == "1" else ""))
    except (OSError, IndexError) as err:
        print(f"{line}, PyTorch eager not measured")
except Exception as err:
    print(f"ResNet-50 throughput: not measured ({err!r})")
PY
)"
    fi
    if [ -f "$out/parallel-ratios/table.csv" ]; then
        note "$(python3 - "$out/parallel-ratios/table.csv" "$rehearse" <<'PY'
import csv, sys
try:
    rows = {r["ratios"]: float(r["samples_per_s"]) for r in csv.DictReader(open(sys.argv[1]))}
    e, a = rows["even"], rows["auto"]
    print(f"ratios: even {e:.0f} samples/s, auto ratios {a:.0f} samples/s ({a / e:.2f}x)"
          + (" (not judged: the CPU has no SMs to split)" if sys.argv[2] == "1" else ""))
except Exception as err:
    print(f"ratios table: unreadable ({err!r})")
PY
)"
    fi
}

summary() {
    local i spent=$(($(date +%s) - start))
    {
        echo "gpu-check summary${tag:+ (REHEARSAL on the CPU backend: no GPU was used)}"
        echo "device: ${device:-unknown}"
        grep -E '^library ' "$out/devices.log" 2>/dev/null
        echo "phases: ${phases[*]}; $spent s of a $budget s budget; logs in $out"
        printf "%-64s %-22s %7s\n" "step" "result" "seconds"
        for i in "${!names[@]}"; do
            printf "%-64s %-22s %7s\n" "${names[$i]}" "${results[$i]}" "${secs[$i]}"
        done
        for i in "${!notes[@]}"; do
            echo "${notes[$i]}"
        done
        local pass fail skip
        pass=$(printf '%s\n' "${results[@]}" | grep -c '^PASS')
        fail=$(printf '%s\n' "${results[@]}" | grep -c '^FAIL')
        skip=$(printf '%s\n' "${results[@]}" | grep -c '^SKIP')
        echo "$pass passed, $fail failed, $skip skipped: exit $(exit_code)"
    } | mark >"$out/summary.txt"
    echo
    cat "$out/summary.txt"
}

pack() {
    [ -n "${OUT:-}" ] || return 0
    mkdir -p "$OUT"
    cp "$out/summary.txt" "$OUT/"
    [ -f "$out/device.txt" ] && cp "$out/device.txt" "$OUT/"
    tar -czf "$OUT/gpu-check.tgz" -C "$(dirname "$out")" "$(basename "$out")"
    echo "packed into $OUT: summary.txt, device.txt, gpu-check.tgz"
}

if [ "$rehearse" = 1 ]; then
    # Every line printed is marked; the summary's lines are marked already.
    exec 3>&1 4>&2
    exec > >(sed -u '/^REHEARSAL /!s/^/REHEARSAL /' >&3) 2>&1
    marker=$!
fi
main
code=$?
if [ "$rehearse" = 1 ]; then
    exec 1>&3 2>&4 3>&- 4>&-
    wait "$marker"
fi
exit "$code"
