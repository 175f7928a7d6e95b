#!/usr/bin/env bash
# gpumux against its peers on one GPU, in one go: every ratio of the speed table, each side run on
# the same GPU, interleaved (gpumux then peer, then peer then gpumux, ...), warm against warm,
# medians over the repeats that the time allows.
#
#   bench/gpu-speed.sh [--out DIR] [--budget SECONDS]
#   bench/gpu-speed.sh --rehearse [--with-peers] [--out DIR] [--budget SECONDS]
#
# The measures (the rows of ratios.csv, in this order; ratio > 1 means gpumux is better):
#   mlp_best_n_vs_alone     the MLP of jobs/mnist-fib.yaml: time per training alone (N=1, warm)
#                           over the best time per training for N in 1..34, splits shared and
#                           logical (gpumux against itself)                               goal >= 15
#   fused_vs_best_nonfused  that best non-fused time per training over fused's at N=34   goal >= 3
#   fused_vs_torch_func     fused N=34's samples/s over a torch.func ensemble of 34 MLPs
#                           (bench/torch_ensemble.py, each member its trial's lr)          goal >= 1.5
#   shared_vs_torch_procs   N PyTorch processes at once (bench/torch_procs.py: each warmed up,
#                           then started together; makespan / N) over shared's time per training
#                           at the same N (the best shared N of the first fib run)         goal >= 5
#   mlp_alone_vs_torch      one PyTorch training (bench/torch_mnist.py, warm) over gpumux's warm
#                           N=1 time per training                                         goal >= 10
#   resnet50_fp32_vs_torch  ResNet-50, 224 px, batch 32: gpumux's images/s (epoch 2 of `gpumux
#   resnet50_tf32_vs_torch  train`) over bench/torch_resnet50.py's, FP32 and TF32       goal >= 1.0
#
# Each step has its own time limit (timeout) and the whole run a budget (--budget; default 330 s
# on a GPU, so that it ends within 6 minutes, and 90 s rehearsing): a step that would start with less than it needs left is skipped,
# SKIP(time); a step that fails or times out leaves its measure's numbers empty, with a note, and
# the others go on. The first pass measures every row once, most telling first; the second runs
# each pair in the other order (peer first); a third repeats the MLP measures only.
#
# Output (--out DIR; default results/gpu-speed-<gpu>/, e.g. results/gpu-speed-h100/):
#   ratios.csv   measure,gpumux,peer,ratio,goal: one row per measure above (units in summary.md)
#   summary.md   the table with units, which side is which, PASS/FAIL against each goal, whether
#                each pair is warm against warm, and the raw runs each figure came from
#   command.txt  the commit, gpumux --version, the GPU (model, UUID), driver and CUDA versions,
#                PyTorch's version and the GPU UUID PyTorch saw, every exact command, the date
#   raw/         every step's log and results (steps.csv lists them)
# An existing DIR is refused unless it is empty or an earlier run's (its command.txt says so),
# which is replaced.
#
# --rehearse runs the same flow on the CPU backend (--backend cpu), sized down (N up to 3,
# 1 epoch, a 1/16-width ResNet-50 on 32 px images), with the PyTorch peers skipped, as
# summary.md and ratios.csv say (empty peer and ratio), into a new folder under /tmp unless
# --out is given; it takes seconds on 2 cores and shows that every step of the GPU flow runs.
# --with-peers (rehearsal only) runs the peers too, on the CPU with one thread each (PyTorch in
# $PYTHON; their ratios are then not comparable, and summary.md says so; default budget 240 s).
#
# Environment: GPUMUX (the binary; default .carry/gpumux if it exists, else
# target/release/gpumux), PYTHON (the Python with PyTorch; default python3), GPUMUX_COMMIT (the
# commit, where the tree has no git; else a COMMIT file at the root is read).
# Exit: 0 the flow ran and every measure has its numbers (the goals are results, not errors);
# 1 a step failed or a measure has no numbers; 2 bad arguments, no gpumux binary, or an --out
# that is not ours; 3 interrupted (SIGINT or SIGTERM: the running step is stopped, the summary
# still written); 4 no usable GPU (without --rehearse).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
invoked="bench/gpu-speed.sh${*:+ $*}"

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}
bad() {
    echo "gpu-speed: $*" >&2
    echo "usage: bench/gpu-speed.sh [--rehearse [--with-peers]] [--out DIR] [--budget SECONDS] (--help for more)" >&2
    exit 2
}

rehearse=0 with_peers=0 out="" budget=""
while [ $# -gt 0 ]; do
    case $1 in
    --rehearse) rehearse=1 ;;
    --with-peers) with_peers=1 ;;
    --out)
        if [ $# -lt 2 ] || [ -z "$2" ]; then bad "--out needs a folder"; fi
        out=$2
        shift
        ;;
    --out=*)
        out=${1#--out=}
        [ -n "$out" ] || bad "--out needs a folder"
        ;;
    --budget)
        [ $# -ge 2 ] || bad "--budget needs a number of seconds"
        budget=$2
        shift
        ;;
    --budget=*) budget=${1#--budget=} ;;
    -h | --help)
        usage
        exit 0
        ;;
    *) bad "unknown argument '$1'" ;;
    esac
    shift
done
if [ -n "$budget" ] && ! [[ $budget =~ ^[1-9][0-9]*$ ]]; then
    bad "--budget must be a whole number of seconds above 0, not '$budget'"
fi
if [ "$with_peers" = 1 ] && [ "$rehearse" = 0 ]; then
    bad "--with-peers is for --rehearse (on a GPU the peers always run)"
fi

# The gpumux binary: $GPUMUX, else the one carried to a GPU machine, else the release build.
if [ -n "${GPUMUX:-}" ]; then
    bin=$GPUMUX
elif [ -e .carry/gpumux ]; then
    bin=.carry/gpumux
else
    bin=target/release/gpumux
fi
found=$(command -v -- "$bin" 2>/dev/null) || found=""
if [ -z "$found" ] || [ ! -x "$found" ] || [ -d "$found" ]; then
    echo "gpu-speed: no gpumux binary at '$bin': build one (cargo build --release, or scripts/build-gpu-check.sh for .carry/) or set GPUMUX" >&2
    exit 2
fi
[[ $found == /* ]] || found="$root/$found"
bin=$found
py=${PYTHON:-python3}

if [ "$rehearse" = 1 ]; then
    backend=cpu
    if [ "$with_peers" = 1 ]; then budget=${budget:-240}; else budget=${budget:-90}; fi
else
    backend=cuda
    budget=${budget:-330}
fi
start=$(date +%s)
started_at=$(date -u +%FT%TZ)

# The device, before anything is written: without a GPU, stop at once.
devices=$(timeout 60 "$bin" devices --backend "$backend" 2>&1) && rc=0 || rc=$?
if [ "$rc" != 0 ]; then
    why=$(grep -E '^error' <<<"$devices" | tail -n 1)
    why=${why#error: }
    [ "$rc" = 124 ] && why="gpumux devices --backend $backend did not answer within 60 s"
    if [ "$rehearse" = 0 ]; then
        echo "gpu-speed: no usable GPU: ${why:-gpumux devices --backend cuda exited $rc} (bench/gpu-speed.sh --rehearse runs the same flow on the CPU backend)" >&2
        exit 4
    fi
    echo "gpu-speed: gpumux devices --backend cpu exited $rc: ${why:-$devices}" >&2
    exit 1
fi
smi=""
if [ "$rehearse" = 0 ] && command -v nvidia-smi >/dev/null 2>&1; then
    smi=$(timeout 30 nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1) || smi=""
fi
if [ "$rehearse" = 1 ]; then
    gpu=cpu
else
    # The GPU's short name: "NVIDIA H100 80GB HBM3" -> h100, "NVIDIA H200" -> h200.
    model=${smi%%,*}
    [ -n "$model" ] || model=$(sed -n 's/^backend: cuda — \(.*\) ([0-9]* SMs.*/\1/p' <<<"$devices" | head -n 1)
    gpu=$(tr '[:upper:]' '[:lower:]' <<<"$model" | sed -e 's/^nvidia //' -e 's/[ _-].*//' -e 's/[^a-z0-9]//g')
    gpu=${gpu:-gpu}
fi

# The output folder: new, empty, or an earlier run's (replaced).
if [ -z "$out" ]; then
    if [ "$rehearse" = 1 ]; then
        out=$(mktemp -d /tmp/gpu-speed-rehearsal.XXXXXX)
    else
        out="results/gpu-speed-$gpu"
    fi
fi
if [ -e "$out" ] && [ ! -d "$out" ]; then
    bad "--out $out is not a folder"
fi
if [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
    if head -n 1 "$out/command.txt" 2>/dev/null | grep -q '^# bench/gpu-speed.sh'; then
        rm -rf "${out:?}"/*
    else
        echo "gpu-speed: $out is not empty and not an earlier gpu-speed run's folder (no command.txt of ours): choose another --out" >&2
        exit 2
    fi
fi
mkdir -p "$out/raw"
out=$(cd "$out" && pwd)
# Inside the tree, named from its root (the steps run there), so that the commands read the same
# on any machine.
case $out in "$root"/*) out=${out#"$root"/} ;; esac
raw="$out/raw"
printf '%s\n' "$devices" >"$raw/devices.log"
echo "# bench/gpu-speed.sh: running since $started_at" >"$out/command.txt"

# ---------------------------------------------------------------------------------------------
# Steps: each with its log, its time limit and its row in raw/steps.csv.

echo "id,pass,key,side,result,seconds,log,output,command" >"$raw/steps.csv"
stop=0
child=""
# shellcheck disable=SC2317 # (run by the trap)
on_signal() {
    stop=1
    if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null || true; fi
}
trap on_signal TERM INT

# A command as a shell would read it back: words quoted only where they need it.
shell_words() {
    local w line="" q="'"
    for w in "$@"; do
        if [[ $w =~ ^[A-Za-z0-9_./,:=+@%-]+$ ]]; then
            line+=" $w"
        else
            line+=" $q${w//$q/$q\\$q$q}$q"
        fi
    done
    printf '%s' "${line# }"
}
csvq() { # one CSV field, quoted
    local s=${1//\"/\"\"}
    printf '"%s"' "$s"
}
record() { # record ID PASS KEY SIDE RESULT SECONDS LOG OUTPUT COMMAND
    printf '%s,%s,%s,%s,%s,%s,%s,%s,%s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$(csvq "$7")" "$(csvq "$8")" "$(csvq "$9")" >>"$raw/steps.csv"
}
# step PASS KEY SIDE NEED LIMIT OUTPUT COMMAND...: runs COMMAND, its output in raw/p<PASS>-<KEY>.log.
# Not started with fewer than NEED seconds of the budget left (SKIP(time)); stopped after LIMIT
# seconds or when the budget runs out (FAIL(timeout)).
step() {
    local pass=$1 key=$2 side=$3 need=$4 limit=$5 output=$6
    shift 6
    local id="p$pass-$key"
    local log="$raw/$id.log"
    local cmd
    cmd=$(shell_words "$@")
    if [ "$stop" = 1 ]; then
        record "$id" "$pass" "$key" "$side" "SKIP(interrupted)" "" "" "$output" "$cmd"
        return 0
    fi
    local left=$((budget - ($(date +%s) - start)))
    if [ "$left" -lt "$need" ]; then
        record "$id" "$pass" "$key" "$side" "SKIP(time)" "" "" "$output" "$cmd"
        printf '%-34s SKIP(time): needs %s s, %s s of the %s s budget left\n' "$id" "$need" "$left" "$budget"
        return 0
    fi
    [ "$limit" -lt "$left" ] && left=$limit
    local t0 t1 rc=0 result=ok
    t0=$(date +%s.%N)
    echo "== $id: $cmd" >"$log"
    # In the background, so that a signal's trap runs at once (it stops the step).
    timeout --kill-after=10 "$left" "$@" >>"$log" 2>&1 </dev/null &
    child=$!
    wait "$child" || rc=$?
    while kill -0 "$child" 2>/dev/null; do
        rc=0
        wait "$child" || rc=$?
    done
    child=""
    t1=$(date +%s.%N)
    [ "$rc" != 0 ] && result="FAIL($rc)"
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then result="FAIL(timeout)"; fi
    [ "$stop" = 1 ] && result="FAIL(interrupted)"
    local secs
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    record "$id" "$pass" "$key" "$side" "$result" "$secs" "$log" "$output" "$cmd"
    printf '%-34s %-18s %6s s\n' "$id" "$result" "$secs"
    return 0
}
# A peer step: run, or skipped (rehearsing without --with-peers).
peer() { # peer PASS KEY NEED LIMIT OUTPUT COMMAND...
    if [ "$rehearse" = 1 ] && [ "$with_peers" = 0 ]; then
        record "p$1-$2" "$1" "$2" peer "SKIP(rehearsal: peer skipped)" "" "" "$5" "$(shell_words "${@:6}")"
        printf '%-34s SKIP(rehearsal: peer skipped)\n' "p$1-$2"
        return 0
    fi
    local pass=$1 key=$2
    shift 2
    step "$pass" "$key" peer "$@"
}

# What the first fib run found, for the peers that need it (python3: the standard library only).
# trials DIR SPLIT N: the learning rates of that round's trials (comma-separated, in trial order),
# then its batch size and epochs, on one line separated by spaces.
trials() {
    python3 - "$@" <<'PY' 2>/dev/null || true
import csv, sys
folder, split, n = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [r for r in csv.DictReader(open(f"{folder}/trials.csv")) if r["split"] == split and r["n"] == n]
rows.sort(key=lambda r: r["trial_id"])
if rows:
    print(",".join(repr(float(r["params_lr"])) for r in rows), rows[0]["params_batch_size"], rows[0]["epochs"])
PY
}
# best_n DIR SPLIT: the N with the lowest time per training among the rounds with no failed trial.
best_n() {
    python3 - "$@" <<'PY' 2>/dev/null || true
import csv, sys
rows = [r for r in csv.DictReader(open(f"{sys.argv[1]}/runs.csv"))
        if r["split"] == sys.argv[2] and r["failed"] == "0" and r["ok"] == r["n"]]
if rows:
    print(min(rows, key=lambda r: float(r["time_per_training_s"]))["n"])
PY
}

# ---------------------------------------------------------------------------------------------
# The sizes: the GPU's, or the rehearsal's.

if [ "$rehearse" = 1 ]; then
    mlp_n=1,2,3 fused_n=3 epochs=(--epochs 1) torch_repeats=1 ens_repeats=1 nstar=2
    rn_samples=64
    rn_model="{kind: resnet50, stem: cifar, width: 0.0625}"
    rn_data="{source: synthetic, shape: [3, 32, 32], classes: 10, train_samples: $rn_samples, test_samples: 32}"
    rn_torch=(--stem cifar --classes 10 --input 32 --batch-size 8 --warmup 1 --steps 2 --repeats 1)
    tdev=(--device cpu --threads 1)
    # need/limit seconds of each kind of step
    t_fib=(2 40) t_fused=(2 30) t_alone=(2 60) t_procs=(2 60) t_ens=(2 60) t_rn=(2 30) t_rnt=(2 60)
else
    mlp_n=1,2,3,5,8,13,21,34 fused_n=34 epochs=() torch_repeats=3 ens_repeats=2 nstar=8
    rn_samples=1920
    rn_model="{kind: resnet50, stem: imagenet}"
    rn_data="{source: synthetic, shape: [3, 224, 224], classes: 285, train_samples: $rn_samples, test_samples: 32}"
    rn_torch=(--stem imagenet --classes 285 --input 224 --batch-size 32 --steps 30 --repeats 3)
    tdev=(--device cuda)
    t_fib=(20 90) t_fused=(15 60) t_alone=(15 60) t_procs=(30 90) t_ens=(15 60) t_rn=(30 90) t_rnt=(25 90)
fi
# ResNet-50 at N=1 as results/resnet50-h200/ ran it: two epochs, images/s of the second (after
# the first's warm-up and graph capture); the same SGD settings on the PyTorch side.
for prec in fp32 tf32; do
    tf32=false
    [ "$prec" = tf32 ] && tf32=true
    cat >"$raw/resnet50-$prec.yaml" <<YAML
model: $rn_model
data: $rn_data
train: {epochs: 2, batch_size: 32, optimizer: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.0001}
engine: {tf32: $tf32}
seed: 1
backend: $backend
YAML
done
rn_torch+=(--lr 0.1 --momentum 0.9 --weight-decay 0.0001 --seed 1)

# The PyTorch side's settings come from gpumux's own trials: those of the first fib run.
lr_alone=0.001 lrs_nstar="" lrs_fused="" batch=64 ep=5
[ "$rehearse" = 1 ] && ep=1
learn_mlp() { # learn_mlp DIR: the learning rate of N=1's trial, N* and its trials' learning rates
    local t
    t=$(trials "$1" shared 1)
    if [ -n "$t" ]; then
        read -r lr_alone batch ep <<<"$t"
    fi
    t=$(best_n "$1" shared)
    [ -n "$t" ] && nstar=$t
    t=$(trials "$1" shared "$nstar")
    lrs_nstar=${t%% *}
    return 0
}
learn_fused() { # learn_fused DIR: the fused round's learning rates
    local t
    t=$(trials "$1" fused "$fused_n")
    lrs_fused=${t%% *}
    return 0
}

mlp_gpumux() { # mlp_gpumux PASS
    step "$1" fib-mlp gpumux "${t_fib[@]}" "$raw/p$1-fib-mlp" \
        "$bin" fib jobs/mnist-fib.yaml --backend "$backend" --n "$mlp_n" --splits shared,logical \
        "${epochs[@]}" --out "$raw/p$1-fib-mlp"
    [ "$1" = 1 ] && learn_mlp "$raw/p1-fib-mlp"
    return 0
}
mlp_peers() { # mlp_peers PASS
    peer "$1" torch-alone "${t_alone[@]}" "$raw/p$1-torch-alone.csv" \
        "$py" bench/torch_mnist.py "${tdev[@]}" --model mlp --hidden 128 --epochs "$ep" --batch-size "$batch" \
        --lr "$lr_alone" --repeats "$torch_repeats" --out "$raw/p$1-torch-alone.csv"
    local lrs=()
    [ -n "$lrs_nstar" ] && lrs=(--lrs "$lrs_nstar")
    peer "$1" torch-procs "${t_procs[@]}" "$raw/p$1-torch-procs.csv" \
        "$py" bench/torch_procs.py --n "$nstar" "${lrs[@]}" --python "$py" --timeout "$((t_procs[1] - 5))" \
        --log-dir "$raw/p$1-torch-procs" --out "$raw/p$1-torch-procs.csv" -- \
        "${tdev[@]}" --model mlp --hidden 128 --epochs "$ep" --batch-size "$batch"
}
fused_gpumux() { # fused_gpumux PASS
    step "$1" fib-fused gpumux "${t_fused[@]}" "$raw/p$1-fib-fused" \
        "$bin" fib jobs/mnist-fib.yaml --backend "$backend" --n "$fused_n" --splits fused \
        "${epochs[@]}" --out "$raw/p$1-fib-fused"
    [ -z "$lrs_fused" ] && learn_fused "$raw/p$1-fib-fused"
    return 0
}
fused_peer() { # fused_peer PASS
    local lrs=()
    [ -n "$lrs_fused" ] && lrs=(--lrs "$lrs_fused")
    peer "$1" torch-ensemble "${t_ens[@]}" "$raw/p$1-torch-ensemble.csv" \
        "$py" bench/torch_ensemble.py "${tdev[@]}" --n "$fused_n" "${lrs[@]}" --hidden 128 --epochs "$ep" \
        --batch-size "$batch" --repeats "$ens_repeats" --out "$raw/p$1-torch-ensemble.csv"
}
resnet_gpumux() { # resnet_gpumux PASS PRECISION
    step "$1" "resnet50-$2-gpumux" gpumux "${t_rn[@]}" "$raw/p$1-resnet50-$2-gpumux.log" \
        "$bin" train "$raw/resnet50-$2.yaml" --backend "$backend"
}
resnet_peer() { # resnet_peer PASS PRECISION
    peer "$1" "resnet50-$2-torch" "${t_rnt[@]}" "$raw/p$1-resnet50-$2-torch.log" \
        "$py" bench/torch_resnet50.py "${tdev[@]}" "${rn_torch[@]}" --precision "$2"
}

# ---------------------------------------------------------------------------------------------
# The passes: odd ones run gpumux first, even ones the peer first; ResNet-50 in the first two.

export PYTHONUNBUFFERED=1
echo "gpu-speed: $(grep -m 1 -E '^backend: ' <<<"$devices" || head -n 1 <<<"$devices")"
echo "gpu-speed: budget $budget s; results in $out"
for pass in 1 2 3; do
    if [ $((pass % 2)) = 1 ]; then
        mlp_gpumux "$pass"
        mlp_peers "$pass"
        fused_gpumux "$pass"
        fused_peer "$pass"
    else
        mlp_peers "$pass"
        mlp_gpumux "$pass"
        fused_peer "$pass"
        fused_gpumux "$pass"
    fi
    [ "$pass" = 3 ] && continue
    for prec in fp32 tf32; do
        if [ "$pass" = 1 ]; then
            resnet_gpumux "$pass" "$prec"
            resnet_peer "$pass" "$prec"
        else
            resnet_peer "$pass" "$prec"
            resnet_gpumux "$pass" "$prec"
        fi
    done
done
trap - TERM INT

# ---------------------------------------------------------------------------------------------
# command.txt: what ran, where, and from which commit.

commit=$(git -C "$root" rev-parse HEAD 2>/dev/null) || commit=""
if [ -n "$commit" ]; then
    [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ] && commit="$commit (with uncommitted changes)"
elif [ -n "${GPUMUX_COMMIT:-}" ]; then
    commit="$GPUMUX_COMMIT (from GPUMUX_COMMIT)"
elif [ -s COMMIT ]; then
    commit="$(head -n 1 COMMIT) (from the COMMIT file)"
else
    commit="unknown (no git, no GPUMUX_COMMIT, no COMMIT file)"
fi
cuda_driver=""
if [ "$rehearse" = 0 ] && command -v nvidia-smi >/dev/null 2>&1; then
    cuda_driver=$(timeout 30 nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1) || cuda_driver=""
fi
torch_info="not asked (rehearsal without --with-peers)"
if [ "$rehearse" = 0 ] || [ "$with_peers" = 1 ]; then
    torch_info=$(timeout 60 "$py" - <<'PY' 2>&1 | tail -n 1
import torch
line = f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    line += f"; device 0: {p.name}, uuid {getattr(p, 'uuid', 'unknown')}"
else:
    line += "; no CUDA device"
print(line)
PY
    ) || true
fi
{
    echo "# bench/gpu-speed.sh: gpumux against its peers"
    [ "$rehearse" = 1 ] && echo "# REHEARSAL on the CPU backend (--rehearse): no GPU was used; not a measurement"
    echo "invoked: $invoked"
    echo "date: $started_at to $(date -u +%FT%TZ)"
    echo "commit: $commit"
    echo "gpumux: $bin ($("$bin" --version 2>&1 | head -n 1))"
    echo "python: $py ($("$py" --version 2>&1 | head -n 1))"
    if [ -n "$smi" ]; then
        echo "nvidia-smi: $smi (name, uuid, driver, memory)"
        echo "CUDA (driver): ${cuda_driver:-unknown}"
    else
        echo "nvidia-smi: not available"
    fi
    echo "pytorch: ${torch_info:-not importable}"
    echo "gpumux devices --backend $backend:"
    sed 's/^/    /' "$raw/devices.log"
    echo "budget: $budget s; took $(($(date +%s) - start)) s"
    echo "commands (from the repository root; logs in raw/):"
    python3 - "$raw/steps.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(f"  {r['id']} [{r['result']}{', ' + r['seconds'] + ' s' if r['seconds'] else ''}]: {r['command']}")
PY
} >"$out/command.txt"

# ---------------------------------------------------------------------------------------------
# The table.

report=(python3 bench/gpu_speed_report.py "$out" --backend "$backend" --budget "$budget"
    --took "$(($(date +%s) - start))")
[ "$rehearse" = 1 ] && report+=(--rehearse)
[ "$with_peers" = 1 ] && report+=(--with-peers)
[ -n "$smi" ] && report+=(--smi "$smi")
report+=(--torch "$torch_info" --commit "$commit")
code=0
"${report[@]}" || code=$?
[ "$stop" = 1 ] && code=3
echo "gpu-speed: exit $code; $out/summary.md"
exit "$code"
