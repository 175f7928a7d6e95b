#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, no Rust toolchain and no network, runs every GPU
# test, the parity checks against the CPU backend, a short `fib` round in every split mode, the
# data-parallel checks (mirrored = one slice on the GPU, seed 000's even-vs-auto table on unequal
# green partitions, seed 003's table, a batch scan), and one training side by side with PyTorch;
# then prints a short table. Builds nothing: run
# scripts/build-gpu-check.sh beforehand and bring .carry/ along.
#   scripts/gpu-check.sh [OUT_DIR]        (default: $OUT if set, else /tmp/gpumux-gpu-check)
set -uo pipefail
cd "$(dirname "$0")/.."
carry=${GPUMUX_CARRY:-.carry}
out=${1:-${OUT:-/tmp/gpumux-gpu-check}}
mkdir -p "$out"
bin="$carry/gpumux"
export CARGO_BIN_EXE_gpumux="$PWD/$bin"
export GPUMUX_REQUIRE_GPU=1
# The PyTorch environment there has cuDNN 9: the cuDNN convolution tests must run, not skip.
export GPUMUX_REQUIRE_CUDNN=1
export RUST_BACKTRACE=1
if [ ! -x "$bin" ]; then
    echo "gpu-check: $bin is missing; run scripts/build-gpu-check.sh first" >&2
    exit 2
fi

declare -a names results secs
step() { # step NAME LOGFILE COMMAND...
    local name=$1 log=$2; shift 2
    local t0=$(date +%s.%N)
    echo "== $name: $*" >"$out/$log"
    "$@" >>"$out/$log" 2>&1
    local rc=$?
    local t1=$(date +%s.%N)
    tail -n 25 "$out/$log"
    names+=("$name"); results+=("$([ $rc -eq 0 ] && echo PASS || echo "FAIL($rc)")")
    secs+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')")
}

{
    echo "date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    nvidia-smi -q 2>/dev/null | grep -iE "MIG Mode|Compute Mode|Persistence" | head -5
} | tee "$out/device.txt"

step "devices and slice plan" devices.log "$bin" devices --n 34 --split green
step "GPU tests (ops vs CPU, ResNet parity, caps, graphs)" gpu-tests.log "$carry/tests/gpu" --test-threads=1 --nocapture
step "library tests on this machine" lib-tests.log "$carry/tests/lib" --test-threads=2
step "CLI tests: fib, isolation, caps" cli-fib.log "$carry/tests/fib" --test-threads=2
step "CLI tests: accuracy of single trainings" cli-train.log "$carry/tests/train" --test-threads=1
step "CLI tests: malformed jobs" cli-bad-jobs.log "$carry/tests/bad_jobs" --test-threads=2
step "fib: MLP, N=1,2,5,13, all split modes" fib.log \
    "$bin" fib jobs/mnist-fib.yaml --n 1,2,5,13 --splits shared,process,logical,green --epochs 2 --out "$out/fib"
step "gpumux: one MLP training (N=1, 5 epochs, batch 128)" gpumux-train.log \
    "$bin" train --backend cuda --epochs 5 --batch-size 128 --lr 0.001
step "gpumux: the same training with graphs off" gpumux-train-nographs.log \
    "$bin" train --backend cuda --epochs 5 --batch-size 128 --lr 0.001 --no-graphs
step "devices: unequal green partitions (ratios 5:3)" devices-ratios.log "$bin" devices --ratios 5,3 --split green
step "CLI tests: parallel, batch-scan, GPU mirrored = one slice" cli-parallel.log "$carry/tests/parallel" --test-threads=1 --nocapture
step "seed 000: even vs auto ratios on green 80+48 SMs" parallel-ratios.log \
    env GPUMUX="$bin" BACKEND=cuda SPLIT=green bench/parallel-ratios.sh "$out/parallel-ratios"
step "seed 003: 1 vs 2 vs 4 mirrored green slices" parallel-mirrored.log \
    env GPUMUX="$bin" BACKEND=cuda SPLIT=green bench/parallel-mirrored.sh "$out/parallel-mirrored"
step "batch-scan: the CNN on one 1 GiB logical slice" batch-scan.log \
    "$bin" batch-scan jobs/parallel-mirrored.yaml --backend cuda --split logical --mib-per-slice 1024 --out "$out/batch-scan"
step "PyTorch eager: the same training" torch-train.log \
    python3 bench/torch_mnist.py --device cuda --model mlp --hidden 128 --epochs 5 --batch-size 128 --lr 0.001 --repeats 3
# ResNet-50 throughput at N=1: 224×224, 285 classes, batch 32, FP32 on both sides. Epoch 2 of
# gpumux (60 steps, after the warm-up and capture of epoch 1) against PyTorch's timed steps.
cat >"$out/resnet50-throughput.yaml" <<'YAML'
model: {kind: resnet50, stem: imagenet}
data: {source: synthetic, shape: [3, 224, 224], classes: 285, train_samples: 1920, test_samples: 32}
train: {epochs: 2, batch_size: 32, optimizer: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.0001}
seed: 1
backend: cuda
YAML
step "gpumux: ResNet-50 224px batch 32 FP32 (N=1)" resnet50-gpumux.log \
    "$bin" train "$out/resnet50-throughput.yaml"
step "PyTorch eager: ResNet-50 224px batch 32 FP32" resnet50-torch.log \
    python3 bench/torch_resnet50.py --device cuda --stem imagenet --classes 285 --input 224 --batch-size 32 --precision fp32 --steps 30 --repeats 3
step "fib: ResNet-50 on CIFAR-shaped data, N=1,2,5,13" fib-resnet.log \
    "$bin" fib jobs/resnet50-fib.yaml --n 1,2,5,13 --splits shared,logical,green --out "$out/fib-resnet"

echo
echo "gpu-check summary ($out)"
printf "%-55s %-9s %8s\n" "step" "result" "seconds"
for i in "${!names[@]}"; do
    printf "%-55s %-9s %8s\n" "${names[$i]}" "${results[$i]}" "${secs[$i]}"
done | tee "$out/summary.txt"
g=$(grep '^done:' "$out/gpumux-train.log" | sed 's/.*, \([0-9.]*\) s, .*/\1/')
t=$(grep -E '^torch,' "$out/torch-train.log" | awk -F, '{print $8}' | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}')
ng=$(grep '^done:' "$out/gpumux-train-nographs.log" | sed 's/.*, \([0-9.]*\) s, .*/\1/')
echo "one MLP training: gpumux ${g:-?} s (graphs off ${ng:-?} s), PyTorch eager median ${t:-?} s" | tee -a "$out/summary.txt"
python3 - "$out/resnet50-gpumux.log" "$out/resnet50-torch.log" <<'PY' | tee -a "$out/summary.txt"
import json, re, sys
try:
    t = [float(m.group(1)) for m in re.finditer(r"^epoch\s+\d+ .* ([0-9.]+) s$", open(sys.argv[1]).read(), re.M)]
    g = 1920 / (t[1] - t[0])
    last = [l for l in open(sys.argv[2]) if l.startswith("{")][-1]
    p = json.loads(last)["images_per_s"]
    print(f"ResNet-50 224px batch 32 FP32: gpumux {g:.0f} images/s, PyTorch eager {p:.0f} images/s ({g / p:.2f}x)")
except Exception as err:
    print(f"ResNet-50 throughput: not measured ({err})")
PY
python3 - "$out/parallel-ratios/table.csv" <<'PY' | tee -a "$out/summary.txt"
import csv, sys
try:
    rows = {r["ratios"]: float(r["samples_per_s"]) for r in csv.DictReader(open(sys.argv[1]))}
    e, a = rows["even"], rows["auto"]
    print(f"seed 000 on green 80+48 SMs: even {e:.0f} samples/s, auto ratios {a:.0f} samples/s ({a / e:.2f}x)"
          + ("" if a > e else "  FAIL: auto is not faster"))
except Exception as err:
    print(f"seed 000 table: FAIL ({err})")
PY
grep -q FAIL "$out/summary.txt" && exit 1
exit 0
