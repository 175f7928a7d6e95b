# Sourced by the benchmarks that run this build next to the build at another commit
# (`--against REV`): that build is made in a temporary git worktree, into a target folder of its
# own (target/against: cargo does not tell two checkouts of one package apart, and would mix
# their artifacts in one folder).
#
#   against_worktree REV   makes the worktree at REV; its path is then in $against_tree
#   against_build ARGS...  `cargo build --release --quiet ARGS` there: the outputs land under
#                          target/against/release/
#   against_cleanup        removes the worktree (call it from the script's EXIT trap)
#   against_args NAME ROUNDS OUT ARGS...
#                          reads a benchmark's `[--against REV] [--rounds R] [OUT]` into
#                          $against, $rounds and $out (ROUNDS and OUT their defaults); -h prints
#                          the script's opening comment; another option is refused (exit 2)

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

against_args() {
    local name="$1"
    rounds="$2"
    out="$3"
    against=""
    shift 3
    while [ $# -gt 0 ]; do
        case "$1" in
            --against) against="$2"; shift 2 ;;
            --rounds) rounds="$2"; shift 2 ;;
            -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
            -*) echo "$name: unknown option $1" >&2; exit 2 ;;
            *) out="$1"; shift ;;
        esac
    done
}
