#!/usr/bin/env bash
# A real sweep through a real framework on the CPU: installs JAX (pinned, into target/, once),
# runs jobs/sweep-jax.yaml (examples/jax_train.py, 4 trials, 2 at a time, then 1 at a time) with
# gpumux, and checks
# the exit code, trials.csv, progress.csv, each trial's thread share and seed, and best.yaml
# (tests/frameworks/check_sweep.py). Needs python3 with pip; no GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."

jax_version=0.4.38
site="$PWD/target/frameworks/jax-$jax_version"
if [ ! -e "$site/.installed" ]; then
    echo "jax-sweep: installing jax[cpu]==$jax_version into $site"
    rm -rf "$site"
    python3 -m pip install --quiet --disable-pip-version-check --target "$site" "jax[cpu]==$jax_version"
    touch "$site/.installed"
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

cargo build --locked --quiet
gpumux="$PWD/target/debug/gpumux"
out="$(mktemp -d "${TMPDIR:-/tmp}/gpumux-jax-sweep.XXXXXX")"
trap 'rm -rf "$out"' EXIT

# The thread variables must come from gpumux, not from the environment it runs in.
unset OMP_NUM_THREADS MKL_NUM_THREADS OPENBLAS_NUM_THREADS VECLIB_MAXIMUM_THREADS \
    NUMEXPR_NUM_THREADS TF_NUM_INTRAOP_THREADS TF_NUM_INTEROP_THREADS PJRT_NPROC XLA_FLAGS
cores="$(nproc)"
share=$((cores / 2))
[ "$share" -ge 1 ] || share=1

# Runs the sweep with CONCURRENCY trials at a time into $out/NAME and checks that each trial had
# THREADS threads: sweep NAME CONCURRENCY THREADS
sweep() {
    local name=$1 concurrency=$2 threads=$3 started=$SECONDS rc=0
    "$gpumux" sweep jobs/sweep-jax.yaml --concurrency "$concurrency" --out "$out/$name" || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "jax-sweep: gpumux sweep --concurrency $concurrency exited with $rc, expected 0" >&2
        cat "$out/$name/trials.csv" >&2 || true
        exit 1
    fi
    python3 tests/frameworks/check_sweep.py "$out/$name" --trials 4 --epochs 3 --threads "$threads" \
        --params batch_size,epochs,lr
    echo "jax-sweep: ok, $concurrency at a time ($cores cores, $threads threads a trial, $((SECONDS - started)) s)"
}

# As the job says, 2 at a time; then one at a time: each trial gets every core, so XLA's
# environment is the one of a trial that has more than one thread (a word gpumux once added to
# XLA_FLAGS made JAX abort there).
sweep sweep 2 "$share"
sweep alone 1 "$cores"
