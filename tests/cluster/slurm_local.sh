#!/usr/bin/env bash
# A real 4-node Slurm cluster (n1..n4, 8 fake GPUs each, accounting via slurmdbd) on this one host.
#
#   bash tests/cluster/slurm_local.sh up       install packages if missing, write configs, start daemons, wait
#   bash tests/cluster/slurm_local.sh status   exit 0 iff every daemon runs, 4 nodes are usable and sacct answers
#   bash tests/cluster/slurm_local.sh down     cancel jobs, stop daemons, remove /etc/hosts and /etc/slurm links
#   bash tests/cluster/slurm_local.sh down --purge   also delete the state dir and the accounting database
#   bash tests/cluster/slurm_local.sh down --uninstall   --purge, and apt-remove the packages `up` installed
#
# Why each piece (Slurm docs: slurm.conf(5), slurmdbd.conf(5), gres.conf(5)): no systemd and no cgroups here, so daemons are
# started by hand with linuxproc/task-none; one slurmd per logical node (this Debian build has
# MULTIPLE_SLURMD); slurmdbd because without accounting sacct fails and submitit can never see a job
# cancelled from outside; FirstJobId from the clock so a fresh cluster never reuses old job ids.
# State lives in $ORCH_SLURM_DIR (default /tmp/orch-slurm); clients find the config through links in
# /etc/slurm, so plain `sbatch`/`sacct`/`scancel` (as submitit calls them) work without SLURM_CONF.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${ORCH_SLURM_DIR:-/tmp/orch-slurm}
ETC=/etc/slurm
NODES=(n1 n2 n3 n4)
HOSTS_TAG="# orch-slurm-local"
PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd)
# The packages `up` installed itself (one a line), so `down --uninstall` removes those and nothing else.
INSTALLED=${ORCH_INSTALLED_LIST:-/var/lib/orch-slurm-local/installed-packages}
# Test-only storage account on the local MariaDB (root, no password, 127.0.0.1 only).
DB_USER=orch_slurm
DB_PASS=orch_slurm_local
# A node set down/drained less than this long ago belongs to a running fault-injection test: leave it.
FAULT_GRACE_S=${ORCH_SLURM_FAULT_GRACE_S:-300}
export SLURM_CONF=$DIR/etc/slurm.conf

T0=$(date +%s%N)
log() { printf '[slurm_local %6.1fs] %s\n' "$(( ($(date +%s%N) - T0) / 1000000 ))e-3" "$*"; }
die() { echo "slurm_local: error: $*" >&2; exit 1; }

pid_alive() {  # pid_alive PIDFILE: its pid runs and is still the daemon the file is named after
    # After a crash or a reboot a pidfile outlives its daemon and the kernel hands the pid to another
    # process: kill -0 alone would then skip starting that slurmd (its node stays unk* until `up` gives
    # up) and `down` would SIGTERM a stranger. slurmd-n1.pid must be `slurmd -N n1`; slurmctld.pid slurmctld.
    local pid name cmd
    pid=$(cat "$1" 2>/dev/null) && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    name=$(basename "$1" .pid)
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    case "$name" in
        slurmd-*) [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmd ] && [[ " $cmd" == *" -N ${name#slurmd-} "* ]] ;;
        *) [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] ;;
    esac
}

wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
    local limit=$1 what=$2; shift 2
    local end=$(( $(date +%s) + limit ))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$end" ] || return 1
        sleep 0.3
    done
    log "$what"
}

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    apt-get update -qq || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
    mkdir -p "$(dirname "$INSTALLED")" && printf '%s\n' "${missing[@]}" >>"$INSTALLED"
    log "packages installed"
}

first_job_id() {
    # Keep the id of an existing state dir; on a clean start derive it from the clock (4 ids per second,
    # wraps after ~170 days) so job ids (and submitit folders keyed by them) are never reused soon.
    if [ -f "$DIR/state/job_state" ] && [ -f "$DIR/etc/slurm.conf" ]; then
        sed -n 's/^FirstJobId=//p' "$DIR/etc/slurm.conf"
    else
        echo $(( ($(date +%s) * 4) % 60000000 + 1000 ))
    fi
}

render() {  # render TEMPLATE DEST MODE
    local tmp
    tmp=$(mktemp "$2.XXXX")
    sed -e "s|@DIR@|$DIR|g" -e "s|@HOST@|$HOST|g" -e "s|@CPUS@|$CPUS|g" -e "s|@MEM_MB@|$MEM_MB|g" \
        -e "s|@FIRST_JOB_ID@|$FIRST_ID|g" -e "s|@DB_USER@|$DB_USER|g" -e "s|@DB_PASS@|$DB_PASS|g" "$1" >"$tmp"
    chmod "$3" "$tmp"
    if cmp -s "$tmp" "$2"; then rm -f "$tmp"; else mv -f "$tmp" "$2"; fi
}

write_configs() {
    HOST=$(hostname -s)
    # One task per fake GPU needs 8 CPUs per node; the host has fewer, config_overrides accepts that.
    CPUS=$(nproc); [ "$CPUS" -ge 8 ] || CPUS=8
    MEM_MB=$(( $(awk '/^MemTotal/ {print int($2 / 1024)}' /proc/meminfo) * 3 / 4 / ${#NODES[@]} ))
    FIRST_ID=$(first_job_id)
    mkdir -p "$DIR"/{etc,state,run,log,dev} "${NODES[@]/#/$DIR/spool/}"
    local i
    for i in 0 1 2 3 4 5 6 7; do
        [ -c "$DIR/dev/nvidia$i" ] || mknod "$DIR/dev/nvidia$i" c 1 3
    done
    render "$HERE/slurm.conf.in" "$DIR/etc/slurm.conf" 644
    render "$HERE/gres.conf.in" "$DIR/etc/gres.conf" 644
    render "$HERE/slurmdbd.conf.in" "$DIR/etc/slurmdbd.conf" 600
    mkdir -p "$ETC"
    for f in slurm.conf gres.conf slurmdbd.conf; do ln -sfn "$DIR/etc/$f" "$ETC/$f"; done
    log "configs in $DIR/etc (linked from $ETC), FirstJobId=$FIRST_ID, CPUs=$CPUS, RealMemory=$MEM_MB"
}

hosts_add() {
    grep -q "$HOSTS_TAG" /etc/hosts || echo "127.0.0.1 ${NODES[*]} $HOSTS_TAG" >>/etc/hosts
}

hosts_remove() {
    # Rewrite in place (not sed -i): /etc/hosts may be a bind mount that cannot be replaced.
    if grep -q "$HOSTS_TAG" /etc/hosts; then
        local kept
        kept=$(grep -v "$HOSTS_TAG" /etc/hosts)
        printf '%s\n' "$kept" >/etc/hosts
    fi
}

munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    munge_ok && return 0
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    start-stop-daemon --start --oknodo --chuid munge --exec /usr/sbin/munged -- >/dev/null 2>&1 9>&- \
        || die "munged did not start (see /var/log/munge/munged.log)"
    touch "$DIR/run/munged.ours"
    wait_for 10 "munged up" munge_ok || die "munged does not answer"
}

mysql_root() { mysql -h 127.0.0.1 -P 3306 -u root --batch --skip-column-names "$@"; }

setup_database() {
    mysql_root -e "SELECT 1" >/dev/null 2>&1 \
        || die "MariaDB does not answer on 127.0.0.1:3306 (start it: bash tests/cluster/services.sh up)"
    mysql_root <<SQL || die "could not create slurm_acct_db / its user in MariaDB"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO '$DB_USER'@'localhost';
GRANT ALL ON slurm_acct_db.* TO '$DB_USER'@'127.0.0.1';
SQL
}

start_daemon() {  # start_daemon PIDFILE NAME CMD...
    local pidfile=$1 name=$2; shift 2
    pid_alive "$pidfile" && return 0
    # 9>&-: daemons must not inherit the flock descriptor, or they would hold the lock forever.
    "$@" </dev/null >>"$DIR/log/start.log" 2>&1 9>&- || {
        tail -n 20 "$DIR/log/$name.log" >&2 2>/dev/null || true
        die "$name did not start (run '$* -D' in the foreground to see why)"
    }
}

cluster_registered() { sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx orch; }
dbd_answers() { sacctmgr -n -P list cluster format=cluster; }

node_rows() { sinfo -h -N -o '%N %t %H' 2>/dev/null | sort -u; }  # name, state, reason timestamp

fresh_fault() {  # fresh_fault STATE REASON_TIME: set down/drained on purpose less than FAULT_GRACE_S ago
    case "$1" in down|drain|drng|fail|failg) ;; *) return 1 ;; esac
    local t
    t=$(date -d "$2" +%s 2>/dev/null) || return 1
    [ $(( $(date +%s) - t )) -lt "$FAULT_GRACE_S" ]
}

nodes_usable() {
    # Every node answers and is idle/mixed/allocated/completing/planned, or was set down moments ago
    # (a fault-injection test is using it; another test session must not resume it under its feet).
    local rows n st ts good=0
    rows=$(node_rows) || return 1
    while read -r n st ts; do
        case "$st" in
            idle|mix|alloc|comp|plnd|resv) good=$((good + 1)) ;;
            *) fresh_fault "$st" "$ts" && good=$((good + 1)) ;;
        esac
    done <<<"$rows"
    [ "$good" -eq ${#NODES[@]} ]
}

sacct_answers() { sacct -n -X -j 1 -o JobID >/dev/null 2>&1; }

resume_nodes() {
    # Nodes left down/drained (a crashed test, an old state dir) for longer than FAULT_GRACE_S.
    local n st ts bad=()
    while read -r n st ts; do
        case "$st" in
            down*|drain*|drng*|fail*) fresh_fault "$st" "$ts" || bad+=("$n") ;;
        esac
    done <<<"$(node_rows)"
    if [ ${#bad[@]} -gt 0 ]; then
        log "resuming nodes left down/drained: ${bad[*]}"
        scontrol update nodename="$(IFS=,; echo "${bad[*]}")" state=resume >/dev/null 2>&1 || true
    fi
}

all_daemons_alive() {
    pid_alive "$DIR/run/slurmdbd.pid" && pid_alive "$DIR/run/slurmctld.pid" || return 1
    local n
    for n in "${NODES[@]}"; do pid_alive "$DIR/run/slurmd-$n.pid" || return 1; done
}

cmd_up() {
    [ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts daemons)"
    if [ -f "$DIR/etc/slurm.conf" ] && all_daemons_alive && nodes_usable && sacct_answers; then
        hosts_add
        log "already up: $(sinfo -h -o '%D nodes %t' | paste -sd' ' -)"
        return 0
    fi
    install_packages
    write_configs
    hosts_add
    start_munge
    setup_database
    start_daemon "$DIR/run/slurmdbd.pid" slurmdbd slurmdbd
    wait_for 30 "slurmdbd up" dbd_answers || die "slurmdbd does not answer (see $DIR/log/slurmdbd.log)"
    if ! cluster_registered; then
        sacctmgr -i add cluster orch >/dev/null || die "sacctmgr add cluster failed"
        log "cluster 'orch' registered in accounting"
    fi
    start_daemon "$DIR/run/slurmctld.pid" slurmctld slurmctld
    wait_for 30 "slurmctld up" scontrol ping || die "slurmctld does not answer (see $DIR/log/slurmctld.log)"
    local n
    for n in "${NODES[@]}"; do
        start_daemon "$DIR/run/slurmd-$n.pid" "slurmd-$n" slurmd -N "$n"
    done
    wait_for 20 "slurmd n1..n4 started" all_daemons_alive || die "a slurmd exited (see $DIR/log/slurmd-n*.log)"
    resume_nodes
    wait_for 60 "4 nodes usable" nodes_usable \
        || die "nodes not usable: $(sinfo -h -N -o '%N %t %E' | sort -u | paste -sd';' -) (see $DIR/log/slurmd-<node>.log)"
    log "nodes: $(sinfo -h -N -o '%N=%t(%G)' | sort -u | paste -sd' ' -)"
    wait_for 30 "sacct answers" sacct_answers || die "sacct does not answer (see $DIR/log/slurmdbd.log)"
    log "cluster up"
}

any_alive() { local p; for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }

stop_pidfiles() {  # stop_pidfiles PIDFILE...: SIGTERM to all at once, wait up to 10 s, then SIGKILL
    local f pids=() i
    for f in "$@"; do
        pid_alive "$f" && pids+=("$(cat "$f")")
        rm -f "$f"
    done
    [ ${#pids[@]} -gt 0 ] || return 0
    kill "${pids[@]}" 2>/dev/null || true
    for i in $(seq 1 50); do any_alive "${pids[@]}" || break; sleep 0.2; done
    for i in "${pids[@]}"; do kill -0 "$i" 2>/dev/null && kill -9 "$i" 2>/dev/null; done
    return 0
}

cmd_down() {
    local purge=${1:-}
    if pid_alive "$DIR/run/slurmctld.pid"; then
        local ids
        ids=$(squeue -h -o '%i' 2>/dev/null | paste -sd' ' -) || true
        if [ -n "$ids" ]; then
            log "cancelling jobs: $ids"
            # shellcheck disable=SC2086
            scancel $ids 2>/dev/null || true
            wait_for 20 "jobs gone" bash -c '[ -z "$(squeue -h -o %i)" ]' || true
        fi
    fi
    local n
    local slurmds=()
    for n in "${NODES[@]}"; do slurmds+=("$DIR/run/slurmd-$n.pid"); done
    stop_pidfiles "${slurmds[@]}"
    log "slurmd n1..n4 stopped"
    stop_pidfiles "$DIR/run/slurmctld.pid" "$DIR/run/slurmdbd.pid"
    log "slurmctld and slurmdbd stopped"
    if [ -f "$DIR/run/munged.ours" ]; then
        munged --stop >/dev/null 2>&1 || true
        rm -f "$DIR/run/munged.ours"
    fi
    hosts_remove
    for f in slurm.conf gres.conf slurmdbd.conf; do
        [ -L "$ETC/$f" ] && rm -f "$ETC/$f"
    done
    rmdir "$ETC" 2>/dev/null || true  # only when empty: a real Slurm install keeps its own files there
    if [ "$purge" = "--purge" ] || [ "$purge" = "--uninstall" ]; then
        rm -rf "$DIR"
        mysql_root -e "DROP DATABASE IF EXISTS slurm_acct_db; DROP USER IF EXISTS '$DB_USER'@'localhost'; \
            DROP USER IF EXISTS '$DB_USER'@'127.0.0.1'" 2>/dev/null || true
        log "state dir, accounting database and its user removed"
    fi
    if [ "$purge" = "--uninstall" ] && [ -s "$INSTALLED" ]; then
        local pkgs
        pkgs=$(sort -u "$INSTALLED" | paste -sd' ' -)
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq $pkgs >/dev/null || die "apt-get remove $pkgs failed"
        rm -f "$INSTALLED"
        log "removed the packages up had installed: $pkgs"
    fi
    log "cluster down"
}

cmd_status() {
    local ok=0 name
    for name in slurmdbd slurmctld "${NODES[@]/#/slurmd-}"; do
        if pid_alive "$DIR/run/$name.pid"; then echo "$name: running (pid $(cat "$DIR/run/$name.pid"))"
        else echo "$name: stopped"; ok=1; fi
    done
    if nodes_usable; then echo "nodes: $(sinfo -h -N -o '%N=%t' | sort -u | paste -sd' ' -)"
    else echo "nodes: not usable"; ok=1; fi
    if sacct_answers; then echo "sacct: answers"; else echo "sacct: does not answer"; ok=1; fi
    return $ok
}

case "${1:-}" in
    up) exec 9>/tmp/orch-slurm.lock; flock -w 300 9 || die "lock busy"; cmd_up ;;
    down) exec 9>/tmp/orch-slurm.lock; flock -w 300 9 || die "lock busy"; cmd_down "${2:-}" ;;
    status) cmd_status ;;
    *) echo "usage: $0 up|down [--purge|--uninstall]|status" >&2; exit 2 ;;
esac
