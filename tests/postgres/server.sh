#!/usr/bin/env bash
# A throwaway PostgreSQL server on 127.0.0.1 for the study tests, in a temporary folder:
#
#   eval "$(tests/postgres/server.sh start)"   # installs PostgreSQL from Debian when missing
#                                              # (as root), starts a server, and prints
#                                              # `export GPUMUX_TEST_POSTGRES=postgresql://...`
#   tests/postgres/server.sh stop              # stops it by its PID, and removes its folder
#
# The tests that use it (`cargo test`'s study tests, `tests/slurm/run.sh`'s study case) make a
# database of their own on it. The server trusts local connections only: it is for tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
state=$PWD/target/postgres-test.env
say() { echo "postgres-test: $*" >&2; }

case "${1:-}" in
start)
    if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
        [ "$(id -u)" = 0 ] || { say "PostgreSQL is not installed, and installing it needs root"; exit 1; }
        say "installing postgresql from Debian"
        # Only the programs: no cluster of the package's own, nothing started by it.
        if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
            mkdir -p /etc/postgresql-common
            echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf
        fi
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/tmp/postgres-apt.log 2>&1; then
            apt-get update -qq >/dev/null 2>&1
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/tmp/postgres-apt.log 2>&1 ||
                { say "apt-get install postgresql failed: $(tail -n 3 /tmp/postgres-apt.log)"; exit 1; }
        fi
    fi
    # A server this script started before and did not stop is stopped first.
    [ -e "$state" ] && "$0" stop
    bin=$(dirname "$(command -v initdb 2>/dev/null || ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)")
    dir=$(mktemp -d /tmp/gpumux-postgres.XXXXXX)
    chmod 755 "$dir"
    # The server refuses to run as root: as the `postgres` user then.
    as=()
    if [ "$(id -u)" = 0 ]; then
        id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
        chown postgres "$dir"
        as=(runuser -u postgres --)
    fi
    ${as[@]+"${as[@]}"} "$bin/initdb" -D "$dir/data" -A trust -U gpumux >"$dir/initdb.log" 2>&1 ||
        { say "initdb failed: $(tail -n 3 "$dir/initdb.log")"; rm -rf "$dir"; exit 1; }
    for _ in 1 2 3 4 5; do
        port=$((20000 + RANDOM % 20000))
        if ${as[@]+"${as[@]}"} "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
            -o "-k $dir -h 127.0.0.1 -p $port -c max_connections=300 -c fsync=on" start >/dev/null 2>&1; then
            pid=$(head -n 1 "$dir/data/postmaster.pid")
            echo "dir=$dir pid=$pid bin=$bin" >"$state"
            say "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (pid $pid, folder $dir)"
            echo "export GPUMUX_TEST_POSTGRES=postgresql://gpumux@127.0.0.1:$port/postgres"
            exit 0
        fi
    done
    say "the server does not start: $(tail -n 3 "$dir/server.log" 2>/dev/null)"
    rm -rf "$dir"
    exit 1
    ;;
stop)
    [ -e "$state" ] || exit 0
    read -r dirv pidv _ <"$state"
    dir=${dirv#dir=} pid=${pidv#pid=}
    # A fast shutdown (SIGINT), then SIGKILL if it is still there 20 s later.
    kill -INT "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    kill -KILL "$pid" 2>/dev/null || true
    rm -rf "$dir" "$state"
    say "stopped (pid $pid)"
    ;;
*)
    echo "usage: tests/postgres/server.sh start|stop" >&2
    exit 2
    ;;
esac
