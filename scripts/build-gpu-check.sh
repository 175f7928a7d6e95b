#!/usr/bin/env bash
# Builds everything the GPU check needs into .carry/ (git-ignored), so that a GPU machine with no
# Rust toolchain and no network can run scripts/gpu-check.sh from the working tree.
#   scripts/build-gpu-check.sh && (copy the tree with .carry/ to the GPU machine) && scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=.carry
rm -rf "$out"
mkdir -p "$out/tests"
cargo build --release --locked
cp target/release/gpumux "$out/gpumux"
# Test binaries: cargo prints their paths as JSON artifacts.
cargo test --release --locked --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, shutil, sys, os
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        name = m["target"]["name"]
        kind = m["target"]["kind"][0]
        if kind == "bin":
            continue  # the CLI has no unit tests of its own
        dst = os.path.join(sys.argv[1], "tests", "lib" if kind == "lib" else name)
        shutil.copy2(m["executable"], dst)
        print("test binary:", dst)
' "$out"
# Debug info is most of their size; symbol names stay for backtraces. What travels is limited.
for f in "$out/gpumux" "$out"/tests/*; do
    strip --strip-debug "$f"
done
du -sh "$out"
