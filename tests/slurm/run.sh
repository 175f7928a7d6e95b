#!/usr/bin/env bash
# Runs jobs/slurm/sweep.sbatch under a real Slurm: installs slurm-wlm and munge from Debian when
# they are missing, starts munged, slurmctld and slurmd for one node on 127.0.0.1 in a temporary
# folder, and checks, with the small CPU sweep in tests/slurm/sweep.yaml:
#   1. the array as docs/guide/slurm.md documents it (with its overrides for a node without GPUs): the
#      merge holds every trial exactly once, the same trials as one unsharded sweep, and a
#      resubmitted index finds its array's results root;
#   2. SIGTERM to one running task's batch shell: gpumux exits 3 after the grace, the task
#      requeues itself, its log keeps both attempts, and the merge is complete, no duplicates;
#   3. SIGKILL of a whole task, then a requeue: no COMPLETE row is lost;
#   4. two tasks finishing together: one merge, and merged/ is never seen half written;
#   5. a plain scancel of a task: it ends CANCELLED and does not requeue itself;
#   6. four tasks sharing one study (GPUMUX_STUDY, a bayes sweep with hyperband; in PostgreSQL
#      where GPUMUX_TEST_POSTGRES names a server, as in CI), one killed with SIGKILL and
#      requeued: the exported study holds every trial exactly once.
# It stops the daemons it started, by their PIDs, and skips (exit 0, saying why) only where Slurm
# cannot be installed or started here.
#
#   tests/slurm/run.sh [GPUMUX_BINARY]     (default target/release/gpumux, built if missing)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
repo=$PWD
started=$(date +%s)
say() { echo "slurm-test: $*"; }
skip() {
    say "SKIP: $*"
    exit 0
}
failed=0
ok() { say "ok: $*"; }
fail() {
    say "FAIL: $*" >&2
    failed=$((failed + 1))
}

gpumux=${1:-$repo/target/release/gpumux}
if [ ! -x "$gpumux" ]; then
    say "building $gpumux"
    cargo build --release --locked --quiet || exit 2
fi
gpumux=$(realpath "$gpumux")

# Slurm and munge, from Debian when missing.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    [ "$(id -u)" = 0 ] || skip "slurm-wlm and munge are not installed, and installing them needs root"
    command -v apt-get >/dev/null || skip "slurm-wlm and munge are not installed, and there is no apt-get"
    say "installing slurm-wlm and munge"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/tmp/slurm-apt.log 2>&1; then
        apt-get update -qq >/dev/null 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/tmp/slurm-apt.log 2>&1 ||
            skip "apt-get install slurm-wlm munge failed: $(tail -n 3 /tmp/slurm-apt.log)"
    fi
fi
[ "$(id -u)" = 0 ] || skip "slurmd runs jobs as their users, so it needs root, and this is uid $(id -u)"

# One node on 127.0.0.1, everything in a temporary folder.
T=$(mktemp -d /tmp/slurm-test.XXXXXX)
chmod 755 "$T"
mkdir -p "$T"/state "$T"/spool "$T"/log "$T"/munge
chmod 700 "$T/munge"
pids=()
cleanup() {
    local p
    if [ -n "${SLURM_CONF:-}" ]; then
        scancel --quiet --user="$(id -un)" 2>/dev/null
    fi
    for p in "${pids[@]}"; do
        kill -TERM "$p" 2>/dev/null
    done
    sleep 1
    for p in "${pids[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    [ "${KEEP:-0}" = 1 ] && say "kept $T" || rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

dd if=/dev/urandom bs=1 count=1024 of="$T/munge/munge.key" status=none
chmod 400 "$T/munge/munge.key"
munged --force --key-file="$T/munge/munge.key" --socket="$T/munge/munge.sock" \
    --pid-file="$T/munge/munged.pid" --log-file="$T/log/munged.log" \
    --seed-file="$T/munge/munge.seed" ||
    skip "munged does not start: $(tail -n 3 "$T/log/munged.log" 2>/dev/null)"
pids+=("$(cat "$T/munge/munged.pid")")

host=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/MemTotal/ {print int($2 / 1024) - 1024}' /proc/meminfo)
port=$((20000 + RANDOM % 20000))
cat >"$T/slurm.conf" <<CONF
ClusterName=gpumuxtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_interval=2
ReturnToService=2
JobRequeue=1
KillWait=8
MinJobAge=900
MpiDefault=none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$T/slurm.conf
slurmctld -D -f "$SLURM_CONF" >"$T/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$host" >"$T/log/slurmd.out" 2>&1 &
pids+=($!)
up=0
for _ in $(seq 60); do
    if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
        up=1
        break
    fi
    sleep 0.5
done
[ "$up" = 1 ] || skip "slurmctld and slurmd do not come up: $(tail -n 3 "$T/log/slurmctld.log" "$T/log/slurmd.log" 2>/dev/null)"
say "Slurm $(sinfo -V | cut -d' ' -f2) up on $host ($cpus CPUs) in $(($(date +%s) - started)) s"

# --- helpers --------------------------------------------------------------------------------
# The state of one array task: RUNNING, PENDING, COMPLETED, FAILED, ...
state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -n 1; }
# Waits (at most $2 s) until every task of array job $1 has ended for good: `scontrol show job`
# (which keeps ended tasks, MinJobAge) answers and names only plain end states. An empty squeue
# is not enough: a failed query prints nothing too.
job_ended() {
    local out
    out=$(scontrol show job -o "$1" 2>/dev/null) || return 1
    [ -n "$out" ] || return 1
    ! sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$out" |
        grep -qvxE 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|BOOT_FAIL|DEADLINE|OUT_OF_MEMORY|PREEMPTED'
}
# A requeued task waits about two minutes before it may start, so wait_job starts it at once,
# but only once it has been pending for this many seconds: Slurm revokes the requeued run's job
# credential, to the second, and a start within that second is refused ("Job credential
# revoked"), which ends the task FAILED before its next attempt runs.
REQUEUE_SETTLE=2
wait_job() {
    local end=$(($(date +%s) + $2)) now t
    local -A pending_since=()
    while [ "$(date +%s)" -lt "$end" ]; do
        job_ended "$1" && return 0
        now=$(date +%s)
        while read -r t; do
            [ -n "$t" ] || continue
            : "${pending_since[$t]:=$now}"
            if [ $((now - pending_since[$t])) -ge "$REQUEUE_SETTLE" ]; then
                scontrol update JobId="$t" StartTime=now >/dev/null 2>&1
            fi
        done < <(squeue -h -j "$1" -t PD -o %i 2>/dev/null)
        sleep 0.5
    done
    return 1
}
# Waits (at most $3 s) until file $1 has at least $2 lines.
wait_lines() {
    local end=$(($(date +%s) + $3))
    while [ "$(date +%s)" -lt "$end" ]; do
        [ "$(cat "$1" 2>/dev/null | wc -l)" -ge "$2" ] && return 0
        sleep 0.2
    done
    return 1
}
# `trial_id,state` of each row of a trials.csv, sorted.
rows() { python3 -c '
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(r["trial_id"] + "," + r["state"])' "$1" | sort; }
# Checks a merged folder: every trial of $2 (a file of trial ids) once, COMPLETE.
check_merged() {
    local merged=$1 want=$2 what=$3
    if [ ! -s "$merged/trials.csv" ]; then
        fail "$what: no $merged/trials.csv"
        return
    fi
    local got
    got=$(rows "$merged/trials.csv")
    if [ "$(cut -d, -f1 <<<"$got" | sort -u | wc -l)" -ne "$(wc -l <<<"$got")" ]; then
        fail "$what: a trial is listed twice in the merge: $(cut -d, -f1 <<<"$got" | sort | uniq -d | tr '\n' ' ')"
    elif [ "$(cut -d, -f1 <<<"$got")" != "$(sort "$want")" ]; then
        fail "$what: the merge's trials differ from the sweep's: got $(cut -d, -f1 <<<"$got" | tr '\n' ' ') want $(sort "$want" | tr '\n' ' ')"
    elif grep -qv ',COMPLETE$' <<<"$got"; then
        fail "$what: a merged trial is not COMPLETE: $(grep -v ',COMPLETE$' <<<"$got" | tr '\n' ' ')"
    else
        ok "$what: the merge holds each of the $(wc -l <"$want") trials once, COMPLETE"
    fi
}
# Trial ids of a job, from an unsharded sweep run outside Slurm (these jobs are quick).
trial_ids_of() { "$gpumux" sweep "$@" --dry-run 2>/dev/null | sed -n 's/^  *\([0-9a-f]\{16\}\) .*/\1/p' | sort -u; }
trial_ids() { trial_ids_of "$1"; }
submit() { sbatch --parsable "$@" | cut -d';' -f1; }

work=$T/work
mkdir -p "$work/logs"
cd "$work" || exit 2
export GPUMUX=$gpumux
sbatch_script=$repo/jobs/slurm/sweep.sbatch
# The overrides docs/guide/slurm.md gives for a node without GPUs and with few CPUs.
overrides=(--gres=none --cpus-per-task=1 --time=10)

# A quick job (8 trials of a fraction of a second) and a slow one (6 trials of a few seconds).
cp "$repo/tests/slurm/sweep.yaml" quick.yaml
sed -e 's/hidden: \[64\]/hidden: [512, 512]/' -e 's/epochs: 2/epochs: 6/' -e 's/run_cap: 8/run_cap: 6/' \
    -e 's/name: slurm-test/name: slurm-test-slow/' quick.yaml >slow.yaml
trial_ids quick.yaml >quick.ids
trial_ids slow.yaml >slow.ids
if [ "$(wc -l <quick.ids)" -ne 8 ] || [ "$(wc -l <slow.ids)" -ne 6 ]; then
    fail "the dry runs list $(wc -l <quick.ids) and $(wc -l <slow.ids) trials, not 8 and 6"
    exit 1
fi
# Trials go to shards by their id: the slow job's task to interrupt is the one whose shard (of
# 2) has the most trials, so that it is mid-shard when signalled.
shard_size() { trial_ids_of "$1" --shard "$2/2" | wc -l; }
if [ "$(shard_size slow.yaml 1)" -ge "$(shard_size slow.yaml 2)" ]; then victim=0; else victim=1; fi
vshard=shard-$((victim + 1))-of-2
say "the slow job's shards hold $(shard_size slow.yaml 1) and $(shard_size slow.yaml 2) trials: task $victim gets the signals"

# --- 1. the array as documented --------------------------------------------------------------
t0=$(date +%s)
job=$(submit --array=0-3 "${overrides[@]}" "$sbatch_script" quick.yaml)
root="out/quick-$(sha256sum quick.yaml | cut -c1-8)"
if wait_job "$job" 120; then
    check_merged "$root/merged" quick.ids "1. the documented array (4 tasks, $(($(date +%s) - t0)) s)"
else
    fail "1. the array did not finish within 120 s: $(squeue -h -j "$job")"
fi
bad=$(for t in 0 1 2 3; do s=$(state "${job}_$t"); [ "$s" = COMPLETED ] || echo "${job}_$t:$s"; done)
[ -z "$bad" ] && ok "1. every task ended COMPLETED" || fail "1. tasks not COMPLETED: $bad"
# A resubmitted index gets a new job id, and finds the same results root and shard.
job2=$(submit --array=2 "${overrides[@]}" "$sbatch_script" quick.yaml)
wait_job "$job2" 60
log2=logs/gpumux-sweep-${job2}_2.out
if grep -q "shard 3/4 of quick.yaml, results in $root/shard-3-of-4" "$log2" && [ ! -e "$root/shard-1-of-1" ]; then
    ok "1. a resubmitted index (--array=2) runs shard 3/4 in $root"
else
    fail "1. the resubmitted index did not find its shard: $(grep 'gpumux sweep:' "$log2" | head -n 3)"
fi
check_merged "$root/merged" quick.ids "1. after the resubmission"

# --- 2. SIGTERM to a running task's batch shell: grace, exit 3, self-requeue -----------------
t0=$(date +%s)
export GPUMUX_OUT=out/term GPUMUX_SIGNAL_LEAD=12 GPUMUX_GRACE_MARGIN=4
job=$(submit --array=0-1 "${overrides[@]}" "$sbatch_script" slow.yaml)
# Once task $victim's first trial has an epoch row, it is mid-trial: signal its batch shell.
if wait_lines out/term/$vshard/progress.csv 2 60; then
    sig_at=$(date +%s.%N)
    scancel --batch --signal=TERM "${job}_$victim"
    if wait_job "$job" 150; then
        check_merged out/term/merged slow.ids "2. SIGTERM, requeue, resume ($(($(date +%s) - t0)) s)"
    else
        fail "2. the array did not finish within 150 s after the SIGTERM: $(squeue -h -j "$job")"
    fi
    log=logs/gpumux-sweep-${job}_$victim.out
    attempts=$(grep -c '^=== gpumux sweep: .* attempt ' "$log")
    if grep -q 'attempt 1 (restarts 0)' "$log" && grep -q 'attempt 2 (restarts 1)' "$log" &&
        grep -q 'gpumux sweep: exit code 3 ' "$log" && grep -q 'requeueing' "$log" &&
        grep -q 'gpumux sweep: exit code 0 ' "$log"; then
        ok "2. task $victim's log keeps both attempts ($attempts headers): exit 3, requeued, then exit 0"
    else
        fail "2. task $victim's log lacks an attempt, the exit 3 or the requeue:"
        sed 's/^/    /' "$log" >&2
    fi
    # The trial running at the signal finished within the grace and is COMPLETE in the first
    # attempt's rows; the exit 3 came after it, within the grace.
    sig=$(sed -n 's/^gpumux sweep: SIGTERM at \([0-9:]*\).*/\1/p' "$log" | head -n 1)
    ended=$(sed -n 's/^gpumux sweep: exit code 3 at \([0-9:]*\).*/\1/p' "$log" | head -n 1)
    if [ -n "$sig" ] && [ -n "$ended" ]; then
        took=$(($(date -u -d "$ended" +%s) - $(date -u -d "$sig" +%s)))
        grace=$(sed -n 's/.*, grace \([0-9]*\)s,.*/\1/p' "$log" | head -n 1)
        [ "$took" -le $((grace + 2)) ] && ok "2. exit 3 came ${took} s after the SIGTERM, within the grace of ${grace} s" ||
            fail "2. exit 3 came ${took} s after the SIGTERM, beyond the grace of ${grace} s"
    fi
    restarts=$(scontrol show job "${job}_$victim" | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')
    [ "${restarts:-0}" -ge 1 ] && ok "2. Slurm counts $restarts restart(s) of task $victim" ||
        fail "2. task $victim was not requeued (Restarts=${restarts:-?})"
    say "2. SIGTERM at $(date -d "@${sig_at%.*}" -u +%H:%M:%S); task $victim's log:"
    grep -E '^===|gpumux sweep: (SIGTERM|exit|requeue)|interrupted|INTERRUPTED' "$log" | sed 's/^/    /'
else
    fail "2. task $victim wrote no progress row within 60 s"
fi
unset GPUMUX_SIGNAL_LEAD GPUMUX_GRACE_MARGIN

# --- 3. SIGKILL of a whole task, then a requeue ----------------------------------------------
t0=$(date +%s)
export GPUMUX_OUT=out/kill
job=$(submit --array=0-1 "${overrides[@]}" "$sbatch_script" slow.yaml)
if wait_lines out/kill/$vshard/trials.csv 2 90; then
    # What a node failure or the OOM killer does: every process of the task gets SIGKILL.
    # Here: gpumux (found by its output folder) and its parent, the batch shell.
    gp=$(pgrep -f -- "--out out/kill/$vshard " | head -n 1)
    if [ -z "$gp" ]; then
        fail "3. no gpumux process writes out/kill/$vshard"
    else
        kill -KILL "$(ps -o ppid= -p "$gp" | tr -d ' ')" "$gp"
    fi
    for _ in $(seq 100); do
        [ "$(state "${job}_$victim")" = RUNNING ] || break
        sleep 0.2
    done
    before=$(rows out/kill/$vshard/trials.csv | grep ',COMPLETE$' | cut -d, -f1)
    say "3. killed task $victim ($(state "${job}_$victim")) with $(wc -w <<<"$before") trial(s) COMPLETE; requeueing it"
    scontrol requeue "${job}_$victim"
    if wait_job "$job" 150; then
        check_merged out/kill/merged slow.ids "3. SIGKILL, requeue ($(($(date +%s) - t0)) s)"
        after=$(rows out/kill/merged/trials.csv | grep ',COMPLETE$' | cut -d, -f1)
        lost=$(comm -23 <(sort <<<"$before") <(sort <<<"$after"))
        [ -z "$lost" ] && ok "3. no COMPLETE row of the killed attempt is lost" ||
            fail "3. COMPLETE rows lost: $lost"
    else
        fail "3. the array did not finish within 150 s after the requeue: $(squeue -h -j "$job")"
    fi
else
    fail "3. task $victim completed no trial within 90 s"
fi

# --- 4. two tasks finishing together: one merge, never half written --------------------------
t0=$(date +%s)
export GPUMUX_OUT=out/together
sed -e 's/run_cap: 8/run_cap: 2/' -e 's/name: slurm-test/name: slurm-test-two/' quick.yaml >two.yaml
trial_ids two.yaml >two.ids
# Watch merged/ while the tasks run: whenever its trials.csv is there, it holds both trials.
# Once there, it stays.
(
    seen=0
    while [ ! -e watch.stop ]; do
        if [ -e out/together/merged/trials.csv ]; then
            seen=1
            n=$(($(wc -l <out/together/merged/trials.csv) - 1))
            [ "$n" -ne 2 ] && echo "merged/trials.csv seen with $n rows" >>watch.bad
        elif [ "$seen" = 1 ]; then
            echo "merged/trials.csv went missing after it was made" >>watch.bad
        fi
        sleep 0.02
    done
) &
watcher=$!
job=$(submit --array=0-1 "${overrides[@]}" "$sbatch_script" two.yaml)
wait_job "$job" 60 || fail "4. the array did not finish within 60 s"
sleep 0.5
touch watch.stop
wait "$watcher"
merges=$(cat logs/gpumux-sweep-"${job}"_*.out | grep -c 'merging into')
[ "$merges" -eq 1 ] && ok "4. two tasks at once: one merge" || fail "4. $merges merges, not one"
[ ! -e watch.bad ] && ok "4. merged/ was never seen half written" || fail "4. $(head -n 3 watch.bad)"
check_merged out/together/merged two.ids "4. two tasks at once ($(($(date +%s) - t0)) s)"
# --- 5. a plain scancel: the task stays cancelled -------------------------------------------
# Trials far longer than KillWait (8 s here): the script stops them before the kill. At 6
# epochs a trial takes under 2 s on a 2-core EPYC, so 100 epochs take about 25 s; at 20 epochs
# a trial once finished within the grace, COMPLETE rather than INTERRUPTED.
export GPUMUX_OUT=out/cancel
sed -e 's/epochs: 6/epochs: 100/' slow.yaml >long.yaml
job=$(submit --array=0-1 "${overrides[@]}" "$sbatch_script" long.yaml)
if wait_lines out/cancel/$vshard/progress.csv 2 60; then
    scancel "${job}_$victim"
    wait_job "$job" 90 || fail "5. the array did not end within 90 s of the scancel"
    log=logs/gpumux-sweep-${job}_$victim.out
    st=$(state "${job}_$victim")
    restarts=$(scontrol show job "${job}_$victim" | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')
    if [ "$st" = CANCELLED ] && [ "${restarts:-1}" = 0 ] && grep -q 'not requeueing' "$log"; then
        ok "5. a cancelled task stays CANCELLED, not requeued"
        if rows out/cancel/$vshard/trials.csv | grep -q ',INTERRUPTED$'; then
            ok "5. its running trial was recorded INTERRUPTED before Slurm's SIGKILL (KillWait 8 s)"
        else
            fail "5. no INTERRUPTED row after the cancel: $(rows out/cancel/$vshard/trials.csv | tr '\n' ' ')"
        fi
    else
        fail "5. after scancel the task is $st with Restarts=${restarts:-?}:"
        sed 's/^/    /' "$log" >&2
    fi
else
    fail "5. task $victim wrote no progress row within 60 s"
fi
unset GPUMUX_OUT

# --- 6. one study shared by four tasks: a SIGKILLed task requeued, every trial once ----------
# A bayes sweep with hyperband: each task takes what the study gives it; task 0 is killed
# mid-trial (gpumux and its batch shell, with SIGKILL) and requeued; its trial's lease (3 s)
# runs out and another worker runs it again; the last task exports the study to merged/.
# The study is in PostgreSQL where GPUMUX_TEST_POSTGRES names a server (CI starts one), in
# SQLite otherwise.
t0=$(date +%s)
study_url=sqlite:$work/study.db
if [ -n "${GPUMUX_TEST_POSTGRES:-}" ]; then
    psql -q "$GPUMUX_TEST_POSTGRES" -c "DROP DATABASE IF EXISTS gpumux_slurm_study" &&
        psql -q "$GPUMUX_TEST_POSTGRES" -c "CREATE DATABASE gpumux_slurm_study" &&
        study_url=${GPUMUX_TEST_POSTGRES%/*}/gpumux_slurm_study
fi
say "6. the study: $study_url"
export GPUMUX_OUT=out/study GPUMUX_STUDY=$study_url GPUMUX_STUDY_LEASE_S=3
sed -e 's/method: random/method: bayes/' -e 's/run_cap: 6/run_cap: 10/' \
    -e 's/name: slurm-test-slow/name: slurm-test-study/' slow.yaml >study.yaml
echo "early_terminate: {type: hyperband, min_iter: 2, eta: 2}" >>study.yaml
job=$(submit --array=0-3 "${overrides[@]}" "$sbatch_script" study.yaml)
if wait_lines out/study/worker-0/progress.csv 2 90; then
    gp=$(pgrep -f -- "--out out/study/worker-0 " | head -n 1)
    if [ -z "$gp" ]; then
        fail "6. no gpumux process writes out/study/worker-0"
    else
        kill -KILL "$(ps -o ppid= -p "$gp" | tr -d ' ')" "$gp"
    fi
    for _ in $(seq 100); do
        [ "$(state "${job}_0")" = RUNNING ] || break
        sleep 0.2
    done
    say "6. killed task 0 ($(state "${job}_0")); requeueing it"
    scontrol requeue "${job}_0"
    if wait_job "$job" 240; then
        got=$(rows out/study/merged/trials.csv 2>/dev/null)
        n=$(grep -c . <<<"$got")
        ids=$(cut -d, -f1 <<<"$got" | sort -u | grep -c .)
        if [ "$n" -eq 10 ] && [ "$ids" -eq 10 ] && ! grep -qvE ',(COMPLETE|PRUNED)$' <<<"$got"; then
            ok "6. the exported study holds each of its 10 trials once, COMPLETE or PRUNED ($(grep -c ',PRUNED$' <<<"$got") PRUNED; $(($(date +%s) - t0)) s)"
        else
            fail "6. the exported study holds $n rows of $ids trials: $(tr '\n' ' ' <<<"$got")"
        fi
        log=logs/gpumux-sweep-${job}_0.out
        if grep -q 'attempt 2 (restarts 1)' "$log" && grep -q 'worker 0 of study' "$log"; then
            ok "6. task 0 rejoined the study after its requeue"
        else
            fail "6. task 0's log shows no second attempt in the study:"
            sed 's/^/    /' "$log" >&2
        fi
        bad=$(for t in 0 1 2 3; do s=$(state "${job}_$t"); [ "$s" = COMPLETED ] || echo "${job}_$t:$s"; done)
        [ -z "$bad" ] && ok "6. every task ended COMPLETED" || fail "6. tasks not COMPLETED: $bad"
    else
        fail "6. the array did not finish within 240 s after the requeue: $(squeue -h -j "$job")"
    fi
else
    fail "6. task 0 wrote no progress row within 90 s"
fi
unset GPUMUX_OUT GPUMUX_STUDY GPUMUX_STUDY_LEASE_S

say "$(($(date +%s) - started)) s in all"
if [ "$failed" -ne 0 ]; then
    say "$failed check(s) failed; Slurm's logs: $T/log (kept)"
    KEEP=1
    exit 1
fi
say "all checks passed"
