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

started=$SECONDS
rc=0
"$gpumux" sweep jobs/sweep-jax.yaml --out "$out/sweep" || rc=$?
if [ "$rc" -ne 0 ]; then
    echo "jax-sweep: gpumux sweep exited with $rc, expected 0" >&2
    cat "$out/sweep/trials.csv" >&2 || true
    exit 1
fi
python3 tests/frameworks/check_sweep.py "$out/sweep" --trials 4 --epochs 3 --threads "$share" \
    --params batch_size,epochs,lr
echo "jax-sweep: ok ($cores cores, $share threads a trial, $((SECONDS - started)) s)"

# One trial at a time: each gets every core, so XLA's environment is the one of a trial that has
# more than one thread (a word gpumux once added to XLA_FLAGS made JAX abort there).
started=$SECONDS
rc=0
"$gpumux" sweep jobs/sweep-jax.yaml --concurrency 1 --out "$out/alone" || rc=$?
if [ "$rc" -ne 0 ]; then
    echo "jax-sweep: gpumux sweep --concurrency 1 exited with $rc, expected 0" >&2
    cat "$out/alone/trials.csv" >&2 || true
    exit 1
fi
python3 tests/frameworks/check_sweep.py "$out/alone" --trials 4 --epochs 3 --threads "$cores" \
    --params batch_size,epochs,lr
echo "jax-sweep: ok one at a time ($cores threads a trial, $((SECONDS - started)) s)"
