#!/usr/bin/env bash
# Throwaway one-node Ceph cluster on 127.0.0.1 for tests: one ceph-mon and one ceph-osd
# (memstore: the data lives in the OSD's memory), no mgr, no authentication (auth none).
#
# Usage:
#   tests/ceph/cluster.sh start DIR [POOL]         start a cluster in DIR (absent or empty) with
#                                                  a pool POOL (default rbd) of size 1 set up for
#                                                  rbd; print the path of DIR/ceph.conf
#   tests/ceph/cluster.sh stop DIR                 stop it (TERM, KILL after 5 s); idempotent
#   tests/ceph/cluster.sh pause DIR [osd|mon|all]  SIGSTOP the daemons (default both), so that
#                                                  clients see an unreachable cluster
#   tests/ceph/cluster.sh resume DIR [osd|mon|all] SIGCONT them
#
# Clients use `-c DIR/ceph.conf` (rbd -c ..., rados -c ..., rados_conf_read_file). Only the
# mon's port is fixed: a free one picked at start (messenger v1 only). The OSD binds free ports
# in Ceph's default range 6800-7300 and announces them through the mon, so several clusters
# can run side by side. Config, pid files, admin sockets, logs (DIR/log, clients' included),
# the mon store and the OSD's files stay in DIR; nothing goes to /etc/ceph, /var/lib/ceph or
# /var/log/ceph. Starting takes about 1 s. On failure `start` prints the tails of the logs to
# stderr, stops what it started and exits non-zero, keeping DIR for inspection.
set -euo pipefail

readonly OSD_ID=0
readonly MON_ID=a
readonly PG_NUM=8
readonly CLIENT_TIMEOUT=20 # seconds for any one command run while starting

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

usage() {
    sed -n '/^# Usage:/,/^#$/s/^# \{0,1\}//p' "$0" >&2
    exit 2
}

# A TCP port on 127.0.0.1 that is free now (the kernel picks it from the ephemeral range,
# which does not overlap the OSD's 6800-7300).
free_port() {
    /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# write_conf DIR FSID MON_PORT
write_conf() {
    local dir=$1 fsid=$2 port=$3
    cat >"$dir/ceph.conf" <<EOF
# Test cluster written by tests/ceph/cluster.sh; stop it with: tests/ceph/cluster.sh stop $dir
[global]
fsid = $fsid
mon host = v1:127.0.0.1:$port
public addr = 127.0.0.1
cluster addr = 127.0.0.1
# one protocol (v1), so the mon needs exactly one port
ms bind msgr2 = false
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none

# daemons and clients (client.admin.log, shared by all client processes) log to DIR/log
run dir = $dir/run
crash dir = $dir/crash
log file = $dir/log/\$name.log
pid file = $dir/run/\$name.pid
mon cluster log file = $dir/log/cluster.log
mon data = $dir/mon
osd data = $dir/osd
osd journal = $dir/osd/journal
debug rocksdb = 1/5

# single OSD: replicas of 1, placed on OSDs (not hosts)
osd crush chooseleaf type = 0
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = $PG_NUM
osd pool default pgp num = $PG_NUM
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
# tiny or nearly full test disks must not stop the mon
mon data avail warn = 1
mon data avail crit = 0
# commit map changes after 0.1 s instead of 1 s (start takes ~1.5 s instead of 8-12 s)
paxos propose interval = 0.1
# a client killed while holding an rbd exclusive lock blocks the next one for 5 s, not 30 s
osd client watch timeout = 5
# PG logs of 500 entries, not 10000: with the default the OSD grows by ~100 MiB for every
# 64 MiB of 4 KiB writes until it holds 8 x 10000 entries (~900 MiB after 384 MiB written)
osd min pg log entries = 100
osd max pg log entries = 500
osd pg log dups tracked = 500

[mon]
admin socket = \$run_dir/\$name.asok
# if the port was taken meanwhile, fail at once (the script picks another) instead of
# retrying twice 5 s apart
ms bind retry count = 1

[osd]
admin socket = \$run_dir/\$name.asok
osd objectstore = memstore
# 4 GiB of capacity, allocated in 4 KiB pages as written (64 KiB pages bloat the OSD)
memstore device bytes = 4294967296
memstore page set = true
memstore page size = 4096
osd max object name len = 256
osd max object namespace len = 64
# the script puts the OSD in the CRUSH map itself: with auth none the OSD may send these
# commands before it has the monmap and fail to start ('wrong fsid')
osd crush update on start = false
osd class update on start = false
EOF
}

# pid_of DIR NAME: the pid in DIR/run/NAME.pid if that process is alive and one of DIR's
# daemons (the pid file may be stale after a KILL); prints nothing otherwise.
pid_of() {
    local dir=$1 name=$2 pid state
    [[ -r $dir/run/$name.pid ]] || return 0
    pid=$(<"$dir/run/$name.pid")
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 0
    [[ $state != Z ]] || return 0 # exited, not yet reaped by init
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-c $dir/ceph.conf " || return 0
    echo "$pid"
}

# daemon_pids DIR [osd|mon|all]
daemon_pids() {
    local dir=$1 which=${2:-all}
    case $which in
    mon) pid_of "$dir" "mon.$MON_ID" ;;
    osd) pid_of "$dir" "osd.$OSD_ID" ;;
    all) pid_of "$dir" "osd.$OSD_ID"; pid_of "$dir" "mon.$MON_ID" ;;
    esac
}

# wait_gone DIR NAME: wait up to 5 s for daemon NAME to exit; fails if it is still there
wait_gone() {
    local i
    for ((i = 0; i < 100; i++)); do
        [[ -n $(pid_of "$1" "$2") ]] || return 0
        sleep 0.05
    done
    return 1
}

# The OSD first: on TERM it tells the mon it is going down and waits (up to 5 s) for an answer.
cmd_stop() {
    local dir name pid pids
    [[ -d $1 ]] || return 0
    dir=$(cd "$1" && pwd)
    # paused daemons act on TERM only once resumed (and the OSD waits for the mon)
    mapfile -t pids < <(daemon_pids "$dir")
    ((${#pids[@]} == 0)) || kill -CONT "${pids[@]}" 2>/dev/null || true
    for name in "osd.$OSD_ID" "mon.$MON_ID"; do
        pid=$(pid_of "$dir" "$name")
        if [[ -n $pid ]]; then
            kill -TERM "$pid" 2>/dev/null || true
            if ! wait_gone "$dir" "$name"; then
                kill -KILL "$pid" 2>/dev/null || true
                wait_gone "$dir" "$name" || die "could not stop $name (pid $pid)"
            fi
        fi
        rm -f "$dir/run/$name.pid" "$dir/run/$name.asok"
    done
}

cmd_signal() {
    local sig=$1 dir pids
    [[ -d $2 ]] || die "no directory $2"
    dir=$(cd "$2" && pwd)
    mapfile -t pids < <(daemon_pids "$dir" "${3:-all}")
    ((${#pids[@]})) || die "no running daemon in $dir"
    kill "-$sig" "${pids[@]}"
}

# Runs on exit from start: on failure show the logs and stop the daemons.
start_exit() {
    local rc=$? f
    trap - EXIT
    if ((rc != 0)); then
        echo "cluster.sh: starting the cluster in $START_DIR failed" >&2
        for f in "$START_DIR/log/setup.log" "$START_DIR/log/mon.$MON_ID.log" "$START_DIR/log/osd.$OSD_ID.log"; do
            [[ -s $f ]] || continue
            echo "---- tail of $f" >&2
            tail -n 25 "$f" >&2
        done
        cmd_stop "$START_DIR" || true
    fi
    exit "$rc"
}

# run CMD...: CMD with a time limit, its output appended to the setup log
run() {
    local rc=0
    echo "+ [$EPOCHREALTIME] $*" >>"$SETUP_LOG"
    timeout "$CLIENT_TIMEOUT" "$@" >>"$SETUP_LOG" 2>&1 || rc=$?
    ((rc != 124)) || echo "timed out after $CLIENT_TIMEOUT s" >>"$SETUP_LOG"
    return "$rc"
}

cmd_start() {
    local dir=$1 pool=${2:-rbd} conf fsid osd_uuid port attempt
    if [[ -e $dir ]]; then
        [[ -d $dir ]] || die "$dir is not a directory"
        [[ -z $(ls -A "$dir") ]] || die "$dir is not empty"
    fi
    mkdir -p "$dir"/{log,run,crash,mon,osd}
    dir=$(cd "$dir" && pwd)
    conf=$dir/ceph.conf
    START_DIR=$dir
    SETUP_LOG=$dir/log/setup.log
    trap start_exit EXIT
    trap 'exit 130' INT TERM

    fsid=$(uuidgen)
    osd_uuid=$(uuidgen)

    # The mon: a port that was free a moment ago may be taken by the time the mon binds it,
    # so try a few.
    for attempt in 1 2 3 4 5; do
        port=$(free_port)
        write_conf "$dir" "$fsid" "$port"
        rm -rf "$dir/mon" "$dir/monmap"
        mkdir "$dir/mon"
        run monmaptool --create --fsid "$fsid" --addv "$MON_ID" "[v1:127.0.0.1:$port]" "$dir/monmap"
        run ceph-mon -c "$conf" -i "$MON_ID" --mkfs --monmap "$dir/monmap"
        # daemonizes once it is listening; fails if the port is taken
        if run ceph-mon -c "$conf" -i "$MON_ID"; then
            break
        fi
        ((attempt < 5)) && grep -q 'Address already in use' "$dir/log/mon.$MON_ID.log" || return 1
    done

    # The OSD: register it, put it in the CRUSH map under the default root, make its store.
    run ceph -c "$conf" osd create "$osd_uuid" "$OSD_ID"
    run ceph -c "$conf" osd crush add "osd.$OSD_ID" 1 root=default
    run ceph-osd -c "$conf" -i "$OSD_ID" --mkfs --osd-uuid "$osd_uuid" --no-mon-config
    run ceph-osd -c "$conf" -i "$OSD_ID"

    # The pool (size and min_size 1 from the defaults above).
    run ceph -c "$conf" osd pool create "$pool" "$PG_NUM" "$PG_NUM" replicated
    # tags the pool for rbd (`osd pool application enable POOL rbd`) and readies it for
    # self-managed snapshots; needs no mgr
    run rbd -c "$conf" pool init "$pool"

    # Wait for the OSD to serve I/O: the write blocks until the pool's PGs are active.
    run rados -c "$conf" -p "$pool" put cluster-sh-probe /dev/null
    run rados -c "$conf" -p "$pool" rm cluster-sh-probe

    echo "$conf"
}

(($# >= 2 && $# <= 3)) || usage
case $1 in
start) cmd_start "$2" "${3:-rbd}" ;;
stop) (($# == 2)) || usage; cmd_stop "$2" ;;
pause | resume)
    [[ ${3:-all} =~ ^(osd|mon|all)$ ]] || usage
    if [[ $1 == pause ]]; then cmd_signal STOP "$2" "${3:-all}"; else cmd_signal CONT "$2" "${3:-all}"; fi
    ;;
*) usage ;;
esac
