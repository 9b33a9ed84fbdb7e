#!/usr/bin/env bash
# Services the test suite needs: PostgreSQL (ledger tests), MariaDB (Slurm accounting) and the local Slurm
# cluster (tests/cluster/slurm_local.sh).
#
#   bash tests/cluster/services.sh up          start what is down, wait until each answers (quick when up)
#   bash tests/cluster/services.sh status      report each; exit 0 iff all answer
#   bash tests/cluster/services.sh down        stop the Slurm cluster (databases keep running: other work uses them)
#   bash tests/cluster/services.sh down --all  also stop PostgreSQL and MariaDB
#   bash tests/cluster/services.sh down --undo undo what `up` and `make services` did to this host: stop the
#        cluster, remove its /etc/hosts line, /etc/slurm links, state dir and accounting database, and
#        apt-remove the packages they installed (Slurm, munge, slurmdbd, chromium); the databases keep running
#
# With CI set, a service that cannot start is an error (exit 1): CI must fail, never skip. Without CI it is
# a warning and the tests that need it skip.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
T0=$(date +%s%N)
log() { printf '[services %6.1fs] %s\n' "$(( ($(date +%s%N) - T0) / 1000000 ))e-3" "$*"; }
FAILED=()

pg_ok() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
maria_ok() { mysqladmin -h 127.0.0.1 -P 3306 -u root --connect-timeout=2 ping >/dev/null 2>&1; }

wait_ok() {  # wait_ok SECONDS CHECK
    local end=$(( $(date +%s) + $1 ))
    until "$2"; do [ "$(date +%s)" -lt "$end" ] || return 1; sleep 0.3; done
}

start_postgres() {
    if pg_ok; then log "PostgreSQL answers"; return; fi
    local version
    version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$version" ]; then FAILED+=("PostgreSQL (not installed: no /etc/postgresql)"); return; fi
    pg_ctlcluster --skip-systemctl-redirect "$version" main start >/dev/null 2>&1 || true
    if wait_ok "${SERVICES_WAIT_S:-30}" pg_ok; then log "PostgreSQL $version started"
    else FAILED+=("PostgreSQL (pg_ctlcluster $version main start did not bring up 127.0.0.1:5432)"); fi
}

start_mariadb() {
    if maria_ok; then log "MariaDB answers"; return; fi
    if [ ! -x /usr/sbin/mariadbd ]; then FAILED+=("MariaDB (not installed: no /usr/sbin/mariadbd)"); return; fi
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd >/dev/null 2>&1 || true
    if wait_ok "${SERVICES_WAIT_S:-30}" maria_ok; then log "MariaDB started"
    else FAILED+=("MariaDB (mariadbd did not answer on 127.0.0.1:3306)"); fi
}

finish() {
    if [ ${#FAILED[@]} -eq 0 ]; then log "all services up"; return 0; fi
    local f
    for f in "${FAILED[@]}"; do echo "services: cannot start $f" >&2; done
    if [ -n "${CI:-}" ]; then
        echo "services: CI is set, so this is an error (tests that need these services must not skip)" >&2
        return 1
    fi
    echo "services: warning: tests that need the services above will be skipped" >&2
    return 0
}

case "${1:-}" in
    up)
        start_postgres
        start_mariadb
        if maria_ok; then
            bash "$HERE/slurm_local.sh" up || FAILED+=("the local Slurm cluster (tests/cluster/slurm_local.sh up)")
        else
            FAILED+=("the local Slurm cluster (needs MariaDB for accounting)")
        fi
        finish
        ;;
    status)
        rc=0
        if pg_ok; then echo "postgresql: answers"; else echo "postgresql: down"; rc=1; fi
        if maria_ok; then echo "mariadb: answers"; else echo "mariadb: down"; rc=1; fi
        bash "$HERE/slurm_local.sh" status || rc=1
        exit $rc
        ;;
    down)
        if [ "${2:-}" = "--undo" ]; then
            bash "$HERE/slurm_local.sh" down --uninstall; rc=$?
            list=${ORCH_INSTALLED_LIST:-/var/lib/orch-slurm-local/installed-packages}.chromium
            if [ -e "$list" ]; then
                DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq chromium >/dev/null && rm -f "$list"
                log "chromium removed"
            fi
            exit $rc
        fi
        bash "$HERE/slurm_local.sh" down
        if [ "${2:-}" = "--all" ]; then
            version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
            [ -n "$version" ] && pg_ctlcluster --skip-systemctl-redirect "$version" main stop >/dev/null 2>&1
            mysqladmin -h 127.0.0.1 -u root shutdown >/dev/null 2>&1
            log "PostgreSQL and MariaDB stopped"
        fi
        ;;
    *) echo "usage: $0 up|status|down [--all|--undo]" >&2; exit 2 ;;
esac
