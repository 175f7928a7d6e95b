#!/usr/bin/env bash
# Builds everything the GPU check needs into .carry/ (git-ignored), so that a GPU machine with no
# Rust toolchain and no network can run scripts/gpu-check.sh from the working tree.
#   scripts/build-gpu-check.sh [--all] && (copy the tree with .carry/ to the GPU machine) && scripts/gpu-check.sh
# .carry/ holds gpumux, the GPU tests and the library's tests (about 25 MiB); --all adds every
# other test binary for the `tests` phase (about 50 MiB in all), for machines that take more.
# A build that fails stops here with the compiler's errors and a non-zero exit; .carry/ is then
# left empty, so that the check cannot run stale binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
for a in "$@"; do
    case $a in
    --all) all=1 ;;
    *)
        echo "build-gpu-check: unknown argument '$a' (--all)" >&2
        exit 2
        ;;
    esac
done
out=.carry
rm -rf "$out"
mkdir -p "$out/tests"

# Cargo prints each artifact's path as a JSON line on stdout; with json-render-diagnostics the
# compiler's warnings and errors go to stderr as text, as in a plain build.
copy_artifacts() { # copy_artifacts bin|tests
    python3 -c '
import json, os, shutil, sys
out, what = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    kind = m["target"]["kind"][0]
    test = m.get("profile", {}).get("test", False)
    if what == "bin" and kind == "bin" and not test:
        dst = os.path.join(out, m["target"]["name"])
    elif what == "tests" and test and kind != "bin":  # the CLI has no unit tests of its own
        dst = os.path.join(out, "tests", "lib" if kind == "lib" else m["target"]["name"])
    else:
        continue
    shutil.copy2(m["executable"], dst)
    print("built:", dst)
' "$out" "$1"
}

build() { # build bin|tests CARGO-ARGS...
    local what=$1
    shift
    echo "build-gpu-check: cargo $*"
    set +e
    cargo "$@" --message-format=json-render-diagnostics | copy_artifacts "$what"
    local st=("${PIPESTATUS[@]}")
    set -e
    if [ "${st[0]}" -ne 0 ] || [ "${st[1]}" -ne 0 ]; then
        echo "build-gpu-check: FAILED: cargo $* exited ${st[0]} (copying its artifacts: ${st[1]}); the errors are above" >&2
        rm -rf "$out"
        exit 1
    fi
}

build bin build --release --locked
build tests test --release --locked --no-run

for f in "$out/gpumux" "$out/tests/gpu" "$out/tests/lib"; do
    if [ ! -x "$f" ]; then
        echo "build-gpu-check: FAILED: $f was not built" >&2
        rm -rf "$out"
        exit 1
    fi
done
if [ "$all" = 0 ]; then
    for f in "$out"/tests/*; do
        case $(basename "$f") in
        gpu | lib) ;;
        *) rm -f "$f" ;;
        esac
    done
fi
# Debug info is most of their size; symbol names stay for backtraces. What travels is limited.
for f in "$out/gpumux" "$out"/tests/*; do
    strip --strip-debug "$f"
done
du -sh "$out"
