# Sourced by the benchmarks that run this build next to the build at another commit
# (`--against REV`): that build is made in a temporary git worktree, into a target folder of its
# own (target/against: cargo does not tell two checkouts of one package apart, and would mix
# their artifacts in one folder).
#
#   against_worktree REV   makes the worktree at REV; its path is then in $against_tree
#   against_build ARGS...  `cargo build --release --quiet ARGS` there: the outputs land under
#                          target/against/release/
#   against_cleanup        removes the worktree (call it from the script's EXIT trap)

against_tree=""

against_worktree() {
    against_tree="$(mktemp -d)/against"
    git worktree add --quiet --detach "$against_tree" "$1"
}

against_build() {
    local target="$PWD/target/against"
    (cd "$against_tree" && cargo build --release --quiet --target-dir "$target" "$@")
}

against_cleanup() {
    if [ -n "$against_tree" ]; then
        git worktree remove --force "$against_tree" >/dev/null 2>&1 || true
    fi
}
