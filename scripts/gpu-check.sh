#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, no Rust toolchain and no network, runs the GPU
# tests, the parity checks against the CPU backend and short benchmarks from binaries built
# beforehand (scripts/build-gpu-check.sh, which fills .carry/), then prints a short table.
#
#   scripts/gpu-check.sh [PHASE ...]      (default: check)
#
# Phases, in the order given:
#   check    every GPU test (each op against its CPU twin, ResNet parity, caps, green-partition
#            disjointness, graphs on and off), a short fib in every split mode, one MLP training
#            against PyTorch eager, ResNet-50 224px images/s against PyTorch, and the GPU
#            data-parallel checks (mirrored slices = one slice; even against auto ratios on
#            green partitions of 80 and 48 SMs, with a PASS/FAIL line)
#   tests    the library and CLI tests on this machine (fib, train, malformed jobs)
#   bench    seed 003's mirrored table, a batch scan, and a ResNet-50 fib (N=1,2,5,13)
#   results  the full fib experiments for results/: MLP and CNN on MNIST-10k, N=1..34, every
#            split mode (long: give it a call of its own)
#
# Environment:
#   GPU_CHECK_BUDGET  seconds the whole run may take (default 540). A step gets at most what is
#                     left (it is stopped at that point, FAIL(124)); steps that would start with
#                     less than 20 s left are skipped (SKIP) so that the summary is always written.
#   GPU_CHECK_DIR     where logs and results go (default /tmp/gpumux-gpu-check).
#   OUT               when set, the summary, the device line and all of GPU_CHECK_DIR packed as
#                     gpu-check.tgz are copied there (three files).
# Exit: 0 all passed, 1 a step failed, 2 usage, 3 nothing failed but steps were skipped for time.
#   GPUMUX_CARRY      the folder of prebuilt binaries (default .carry).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
carry=${GPUMUX_CARRY:-.carry}
carry=$(cd "$carry" 2>/dev/null && pwd) || {
    echo "gpu-check: ${GPUMUX_CARRY:-.carry} is missing; run scripts/build-gpu-check.sh first" >&2
    exit 2
}
bin="$carry/gpumux"
if [ ! -x "$bin" ]; then
    echo "gpu-check: $bin is missing; run scripts/build-gpu-check.sh first" >&2
    exit 2
fi
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(check)
for p in "${phases[@]}"; do
    case $p in
    check | tests | bench | results) ;;
    *)
        echo "gpu-check: unknown phase '$p' (check, tests, bench, results)" >&2
        exit 2
        ;;
    esac
done
out=${GPU_CHECK_DIR:-/tmp/gpumux-gpu-check}
# An earlier check's folder (it has the marker) is replaced; any other folder must be empty.
if [ -e "$out/.gpu-check" ]; then
    rm -rf "$out"
elif [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
    echo "gpu-check: $out is not empty and not an earlier check's folder; set GPU_CHECK_DIR" >&2
    exit 2
fi
mkdir -p "$out" && touch "$out/.gpu-check"
budget=${GPU_CHECK_BUDGET:-540}
start=$(date +%s)

# The test binaries were built elsewhere: they find the tree, the binary and the data from here.
export GPUMUX_ROOT="$root"
export CARGO_BIN_EXE_gpumux="$bin"
export GPUMUX_REQUIRE_GPU=1
# The PyTorch environment there has cuDNN 9: the cuDNN convolution tests must run, not skip.
export GPUMUX_REQUIRE_CUDNN=1
export RUST_BACKTRACE=1
export PYTHONUNBUFFERED=1

declare -a names results secs
step() { # step NAME LOGFILE COMMAND...
    local name=$1 log=$2
    shift 2
    local left=$((budget - ($(date +%s) - start)))
    if [ "$left" -lt 20 ]; then
        names+=("$name")
        results+=("SKIP")
        secs+=("-")
        echo "== $name: skipped, ${left} s of the budget left"
        return
    fi
    local t0
    t0=$(date +%s.%N)
    echo "== $name: $*" | tee "$out/$log"
    timeout --kill-after=10 "$left" "$@" >>"$out/$log" 2>&1
    local rc=$?
    local t1
    t1=$(date +%s.%N)
    tail -n 15 "$out/$log"
    names+=("$name")
    results+=("$([ $rc -eq 0 ] && echo PASS || echo "FAIL($rc)")")
    secs+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')")
}

{
    echo "date: $(date -u +%FT%TZ)"
    echo "phases: ${phases[*]}"
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    nvidia-smi -q 2>/dev/null | grep -iE "MIG Mode|Compute Mode|Persistence" | head -5
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1
} | tee "$out/device.txt"

# ResNet-50 throughput at N=1: 224×224, 285 classes, batch 32, FP32 on both sides. Epoch 2 of
# gpumux (60 steps, after the warm-up and capture of epoch 1) against PyTorch's timed steps.
cat >"$out/resnet50-throughput.yaml" <<'YAML'
model: {kind: resnet50, stem: imagenet}
data: {source: synthetic, shape: [3, 224, 224], classes: 285, train_samples: 1920, test_samples: 32}
train: {epochs: 2, batch_size: 32, optimizer: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.0001}
seed: 1
backend: cuda
YAML

phase_check() {
    step "devices and slice plan" devices.log "$bin" devices --n 34 --split green
    step "GPU tests (ops vs CPU, ResNet parity, caps, graphs)" gpu-tests.log \
        "$carry/tests/gpu" --test-threads=1 --nocapture
    step "fib: MLP, N=1,2,5, all split modes, 1 epoch" fib.log \
        "$bin" fib jobs/mnist-fib.yaml --n 1,2,5 --splits shared,process,logical,green --epochs 1 --out "$out/fib"
    step "gpumux: one MLP training (N=1, 5 epochs, batch 128)" gpumux-train.log \
        "$bin" train --backend cuda --epochs 5 --batch-size 128 --lr 0.001
    step "gpumux: the same training with graphs off" gpumux-train-nographs.log \
        "$bin" train --backend cuda --epochs 5 --batch-size 128 --lr 0.001 --no-graphs
    step "PyTorch eager: the same training" torch-train.log \
        python3 bench/torch_mnist.py --device cuda --model mlp --hidden 128 --epochs 5 --batch-size 128 --lr 0.001 --repeats 3
    step "gpumux: ResNet-50 224px batch 32 FP32 (N=1)" resnet50-gpumux.log \
        "$bin" train "$out/resnet50-throughput.yaml"
    step "PyTorch eager: ResNet-50 224px batch 32 FP32" resnet50-torch.log \
        python3 bench/torch_resnet50.py --device cuda --stem imagenet --classes 285 --input 224 --batch-size 32 --precision fp32 --steps 30 --repeats 3
    step "devices: unequal green partitions (ratios 5:3)" devices-ratios.log \
        "$bin" devices --ratios 5,3 --split green
    step "CLI tests: parallel, batch-scan, GPU mirrored = one slice" cli-parallel.log \
        "$carry/tests/parallel" --test-threads=1 --nocapture
    step "seed 000: even vs auto ratios on green 80+48 SMs" parallel-ratios.log \
        env GPUMUX="$bin" BACKEND=cuda SPLIT=green bench/parallel-ratios.sh "$out/parallel-ratios"
    step "slices on two GPUs (or a clean stop with one)" parallel-two-gpus.log \
        env GPUMUX="$bin" bench/parallel-two-gpus.sh "$out/parallel-two-gpus"
}

phase_tests() {
    step "library tests on this machine" lib-tests.log "$carry/tests/lib" --test-threads=4
    step "CLI tests: fib, isolation, caps" cli-fib.log "$carry/tests/fib" --test-threads=4
    step "CLI tests: accuracy of single trainings" cli-train.log "$carry/tests/train" --test-threads=2
    step "CLI tests: malformed jobs" cli-bad-jobs.log "$carry/tests/bad_jobs" --test-threads=2
}

phase_bench() {
    step "seed 003: 1 vs 2 vs 4 mirrored green slices" parallel-mirrored.log \
        env GPUMUX="$bin" BACKEND=cuda SPLIT=green bench/parallel-mirrored.sh "$out/parallel-mirrored"
    step "batch-scan: the CNN on one 1 GiB logical slice" batch-scan.log \
        "$bin" batch-scan jobs/parallel-mirrored.yaml --backend cuda --split logical --mib-per-slice 1024 --out "$out/batch-scan"
    step "fib: ResNet-50 on CIFAR-shaped data, N=1,2,5,13" fib-resnet.log \
        "$bin" fib jobs/resnet50-fib.yaml --n 1,2,5,13 --splits shared,logical,green --out "$out/fib-resnet"
}

phase_results() {
    step "fib: MLP on MNIST-10k, N=1..34, every split mode" results-mlp.log \
        "$bin" fib jobs/mnist-fib.yaml --splits shared,process,logical,green --out "$out/mnist-fib-gpu"
    step "fib: CNN on MNIST-10k, N=1..34, every split mode" results-cnn.log \
        "$bin" fib jobs/cnn-fib.yaml --splits shared,process,logical,green --out "$out/cnn-fib-gpu"
}

for p in "${phases[@]}"; do
    "phase_$p"
done

echo
{
    echo "gpu-check summary ($out, phases: ${phases[*]}, $(($(date +%s) - start)) s of a ${budget} s budget)"
    printf "%-58s %-9s %8s\n" "step" "result" "seconds"
    for i in "${!names[@]}"; do
        printf "%-58s %-9s %8s\n" "${names[$i]}" "${results[$i]}" "${secs[$i]}"
    done
} | tee "$out/summary.txt"
if [ -f "$out/gpumux-train.log" ]; then
    g=$(grep '^done:' "$out/gpumux-train.log" | sed 's/.*, \([0-9.]*\) s, .*/\1/')
    t=$(grep -E '^torch,' "$out/torch-train.log" 2>/dev/null | awk -F, '{print $8}' | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}')
    ng=$(grep '^done:' "$out/gpumux-train-nographs.log" 2>/dev/null | sed 's/.*, \([0-9.]*\) s, .*/\1/')
    echo "one MLP training: gpumux ${g:-?} s (graphs off ${ng:-?} s), PyTorch eager median ${t:-?} s" | tee -a "$out/summary.txt"
fi
if [ -f "$out/resnet50-gpumux.log" ]; then
    python3 - "$out/resnet50-gpumux.log" "$out/resnet50-torch.log" <<'PY' | tee -a "$out/summary.txt"
import json, re, sys
try:
    t = [float(m.group(1)) for m in re.finditer(r"^epoch\s+\d+ .* ([0-9.]+) s$", open(sys.argv[1]).read(), re.M)]
    g = 1920 / (t[1] - t[0])
    last = [l for l in open(sys.argv[2]) if l.startswith("{")][-1]
    p = json.loads(last)["images_per_s"]
    print(f"ResNet-50 224px batch 32 FP32: gpumux {g:.0f} images/s, PyTorch eager {p:.0f} images/s ({g / p:.2f}x)")
except Exception as err:
    print(f"ResNet-50 throughput: not measured ({err!r})")
PY
fi
if [ -f "$out/parallel-ratios.log" ]; then
    python3 - "$out/parallel-ratios/table.csv" <<'PY' | tee -a "$out/summary.txt"
import csv, sys
try:
    rows = {r["ratios"]: float(r["samples_per_s"]) for r in csv.DictReader(open(sys.argv[1]))}
    e, a = rows["even"], rows["auto"]
    print(f"seed 000 on green 80+48 SMs: even {e:.0f} samples/s, auto ratios {a:.0f} samples/s ({a / e:.2f}x)"
          + ("" if a > e else "  FAIL: auto is not faster"))
except Exception as err:
    print(f"seed 000 table: FAIL ({err!r})")
PY
fi
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    cp "$out/summary.txt" "$out/device.txt" "$OUT/"
    tar -czf "$OUT/gpu-check.tgz" -C "$(dirname "$out")" "$(basename "$out")"
    echo "packed into $OUT: summary.txt, device.txt, gpu-check.tgz"
fi
grep -qE "FAIL" "$out/summary.txt" && exit 1
# Steps skipped for lack of time were not checked.
grep -qE " SKIP " "$out/summary.txt" && exit 3
exit 0
