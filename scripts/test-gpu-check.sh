#!/usr/bin/env bash
# Tests the GPU check's scripts on a machine with no GPU (CI runs it after the tests):
#   1. scripts/build-gpu-check.sh stops with cargo's error and a non-zero exit when the test
#      build fails (a stand-in cargo fails it), and leaves no .carry/ behind;
#   2. scripts/build-gpu-check.sh fills .carry/;
#   3. scripts/gpu-check.sh --rehearse exits 0 with every line marked REHEARSAL, a summary with
#      each step's seconds and a SKIP for time, and summary.txt, device.txt and gpu-check.tgz
#      in $OUT; then the other phases rehearsed (bench, results, tests) exit 0;
#   4. scripts/gpu-check.sh, with no GPU here, exits 4 within 30 s saying there is no usable GPU;
#   5. bench/gpu-speed.sh --rehearse exits 0 within 90 s with ratios.csv's header and its seven
#      rows (the PyTorch peers skipped, and said so), and without a GPU bench/gpu-speed.sh
#      exits 4; a bad argument exits 2.
#
#   scripts/test-gpu-check.sh [--no-build]   (--no-build: use .carry/ as it is; skips 1 and 2)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=1
case "${1:-}" in
--no-build) build=0 ;;
"") ;;
*)
    echo "usage: scripts/test-gpu-check.sh [--no-build]" >&2
    exit 2
    ;;
esac
tmp=$(mktemp -d /tmp/test-gpu-check.XXXXXX)
failed=0
ok() { echo "test-gpu-check: ok: $*"; }
fail() {
    echo "test-gpu-check: FAIL: $*" >&2
    failed=$((failed + 1))
}

if [ "$build" = 1 ]; then
    # 1. A failing `cargo test --no-run` in the pipe into python: a stand-in cargo passes
    # `cargo build` to the real one and fails the test build the way rustc does.
    real_cargo=$(command -v cargo) || {
        echo "test-gpu-check: cargo is not installed" >&2
        exit 2
    }
    mkdir -p "$tmp/fake-bin"
    cat >"$tmp/fake-bin/cargo" <<SH
#!/bin/sh
if [ "\$1" = test ]; then
    echo "error[E0425]: cannot find value 'broken' in this scope (stand-in cargo)" >&2
    exit 101
fi
exec "$real_cargo" "\$@"
SH
    chmod +x "$tmp/fake-bin/cargo"
    PATH="$tmp/fake-bin:$PATH" scripts/build-gpu-check.sh >"$tmp/build-fail.log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        fail "build-gpu-check.sh exited 0 although cargo test --no-run failed"
    elif ! grep -q "error\[E0425\]: cannot find value 'broken'" "$tmp/build-fail.log"; then
        fail "build-gpu-check.sh hid the compiler's error (log: $tmp/build-fail.log)"
    elif [ -e .carry ]; then
        fail "build-gpu-check.sh left .carry/ behind after a failed build"
    else
        ok "a failed test build stops build-gpu-check.sh (exit $rc) with the compiler's error"
    fi

    # 2. The real build.
    if ! scripts/build-gpu-check.sh; then
        echo "test-gpu-check: FAIL: scripts/build-gpu-check.sh failed" >&2
        exit 1
    fi
    carried=$(cd .carry/tests && ls | tr '\n' ' ')
    if [ "$carried" != "gpu lib " ]; then
        fail "build-gpu-check.sh carried tests other than gpu and lib without --all: $carried"
    else
        ok "build-gpu-check.sh filled .carry/ (gpumux, tests/gpu, tests/lib: $(du -sh .carry | cut -f1))"
    fi
fi
if [ ! -x .carry/gpumux ]; then
    echo "test-gpu-check: .carry/gpumux is missing; run scripts/build-gpu-check.sh" >&2
    exit 2
fi

# 3. The rehearsal of the default phase, then of the others.
rehearse() { # rehearse NAME [PHASE...]
    local name=$1
    shift
    local t0 rc
    t0=$(date +%s)
    GPU_CHECK_DIR="$tmp/$name-dir" OUT="$tmp/$name-out" scripts/gpu-check.sh --rehearse "$@" >"$tmp/$name.log" 2>&1
    rc=$?
    echo "test-gpu-check: scripts/gpu-check.sh --rehearse $*: exit $rc in $(($(date +%s) - t0)) s"
    sed -n '/gpu-check summary/,$p' "$tmp/$name.log"
    [ "$rc" -eq 0 ] || fail "the rehearsal (${*:-check}) exited $rc (log: $tmp/$name.log)"
    grep -vq '^REHEARSAL ' "$tmp/$name.log" && fail "lines of the rehearsal (${*:-check}) not marked REHEARSAL: $(grep -v '^REHEARSAL ' "$tmp/$name.log" | head -n 3)"
    local f
    for f in summary.txt device.txt gpu-check.tgz; do
        [ -s "$tmp/$name-out/$f" ] || fail "the rehearsal (${*:-check}) did not write \$OUT/$f"
    done
    for f in summary.txt device.txt; do
        [ -s "$tmp/$name-out/$f" ] && grep -vq '^REHEARSAL ' "$tmp/$name-out/$f" &&
            fail "lines of \$OUT/$f not marked REHEARSAL (${*:-check})"
    done
    tar -tzf "$tmp/$name-out/gpu-check.tgz" >"$tmp/$name-tgz.txt" 2>&1
    grep -q '/summary.txt$' "$tmp/$name-tgz.txt" ||
        fail "gpu-check.tgz of the rehearsal (${*:-check}) is unreadable or lacks summary.txt"
    grep -q ' FAIL' "$tmp/$name-out/summary.txt" && fail "a step of the rehearsal (${*:-check}) failed"
    grep -qE 'SKIP\(time\) +-$' "$tmp/$name-out/summary.txt" ||
        fail "the rehearsal (${*:-check}) shows no step skipped for time"
    # Every step that ran has its seconds.
    grep -qE ' PASS +[0-9]+\.[0-9]$' "$tmp/$name-out/summary.txt" ||
        fail "the rehearsal's summary (${*:-check}) has no step with its seconds"
    if grep -qE ' PASS +[^0-9 ]' "$tmp/$name-out/summary.txt"; then
        fail "a step that ran has no seconds in the summary (${*:-check})"
    fi
}
before=$failed
rehearse check
[ "$failed" = "$before" ] && ok "the rehearsal of the default phase"
before=$failed
rehearse others speed bench results tests
[ "$failed" = "$before" ] && ok "the rehearsal of the speed, bench, results and tests phases"

# 4. The real check where no GPU can be used: exit 4 within 30 s, one line that says so.
if .carry/gpumux devices 2>/dev/null | grep -q '^backend: cuda'; then
    echo "test-gpu-check: a GPU is usable here: the no-GPU case does not apply"
else
    t0=$(date +%s)
    GPU_CHECK_DIR="$tmp/real-dir" OUT="$tmp/real-out" scripts/gpu-check.sh >"$tmp/real.log" 2>&1
    rc=$?
    took=$(($(date +%s) - t0))
    echo "test-gpu-check: scripts/gpu-check.sh without a GPU: exit $rc in $took s:"
    cat "$tmp/real.log"
    if [ "$rc" -ne 4 ]; then
        fail "expected exit 4 (no usable GPU), got $rc"
    elif [ "$took" -gt 30 ]; then
        fail "it took $took s to find that there is no GPU"
    elif ! grep -q '^gpu-check: no usable GPU: ' "$tmp/real.log"; then
        fail "it did not say that there is no usable GPU"
    elif [ ! -s "$tmp/real-out/summary.txt" ] || [ ! -s "$tmp/real-out/gpu-check.tgz" ]; then
        fail "it did not copy summary.txt and gpu-check.tgz to \$OUT"
    else
        ok "without a GPU the check stops at once, exit 4, saying so"
    fi
fi

# 5. The speed table's flow, rehearsed on the CPU backend with the binary carried for the GPU.
t0=$(date +%s)
GPUMUX=.carry/gpumux bench/gpu-speed.sh --rehearse --out "$tmp/gpu-speed" >"$tmp/gpu-speed.log" 2>&1
rc=$?
took=$(($(date +%s) - t0))
echo "test-gpu-check: bench/gpu-speed.sh --rehearse: exit $rc in $took s"
sed -n '/^measure /,$p' "$tmp/gpu-speed.log"
expected="measure,gpumux,peer,ratio,goal
mlp_best_n_vs_alone
fused_vs_best_nonfused
fused_vs_torch_func
shared_vs_torch_procs
mlp_alone_vs_torch
resnet50_fp32_vs_torch
resnet50_tf32_vs_torch"
before=$failed
if [ "$rc" -ne 0 ]; then
    fail "bench/gpu-speed.sh --rehearse exited $rc (log: $tmp/gpu-speed.log)"
elif [ "$took" -gt 90 ]; then
    fail "bench/gpu-speed.sh --rehearse took $took s (more than 90)"
elif [ "$(head -n 1 "$tmp/gpu-speed/ratios.csv" 2>/dev/null; cut -d, -f1 "$tmp/gpu-speed/ratios.csv" 2>/dev/null | tail -n +2)" != "$expected" ]; then
    fail "ratios.csv lacks its header or its seven rows, in order: $(cat "$tmp/gpu-speed/ratios.csv" 2>&1)"
else
    # gpumux's side of every row is measured; the PyTorch peers' are empty, and summary.md says why.
    awk -F, 'NR > 1 && $2 == "" { bad = 1 } NR > 1 && $1 !~ /^(mlp_best_n_vs_alone|fused_vs_best_nonfused)$/ && ($3 != "" || $4 != "") { bad = 1 } END { exit bad }' \
        "$tmp/gpu-speed/ratios.csv" || fail "ratios.csv of the rehearsal: a gpumux figure missing, or a skipped peer with a figure: $(cat "$tmp/gpu-speed/ratios.csv")"
    if ! grep -q 'REHEARSAL' "$tmp/gpu-speed/summary.md" || ! grep -q 'peers were skipped' "$tmp/gpu-speed/summary.md"; then
        fail "summary.md of the rehearsal does not say it is a rehearsal with the peers skipped"
    fi
    for f in command.txt raw/steps.csv; do
        [ -s "$tmp/gpu-speed/$f" ] || fail "the rehearsal of bench/gpu-speed.sh wrote no $f"
    done
fi
if ! .carry/gpumux devices 2>/dev/null | grep -q '^backend: cuda'; then
    GPUMUX=.carry/gpumux timeout 60 bench/gpu-speed.sh --out "$tmp/gpu-speed-real" >"$tmp/gpu-speed-real.log" 2>&1
    rc=$?
    if [ "$rc" -ne 4 ] || ! grep -q '^gpu-speed: no usable GPU' "$tmp/gpu-speed-real.log"; then
        fail "bench/gpu-speed.sh without a GPU: exit $rc, not 4 with a line saying so: $(head -n 3 "$tmp/gpu-speed-real.log")"
    fi
fi
GPUMUX=.carry/gpumux bench/gpu-speed.sh --rehearse --budget 0 >"$tmp/gpu-speed-bad.log" 2>&1
rc=$?
[ "$rc" -eq 2 ] || fail "bench/gpu-speed.sh --budget 0: exit $rc, not 2"
[ "$failed" = "$before" ] && ok "bench/gpu-speed.sh: the rehearsal's seven rows, exit 4 without a GPU, exit 2 on a bad argument"

if [ "$failed" = 0 ]; then
    rm -rf "$tmp"
    echo "test-gpu-check: all passed"
else
    echo "test-gpu-check: FAILED; logs in $tmp" >&2
fi
exit "$failed"
