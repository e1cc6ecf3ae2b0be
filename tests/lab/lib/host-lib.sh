# shellcheck shell=bash
# Functions for a scenario's host.sh. The hooks run inside the scenario's network namespace, so every
# process they start (a target daemon, iscsi-test-cu...) sees only the tap device and loopback.
#
# Environment available to the hooks:
#   LAB_SCENARIO   scenario name            LAB_NETNS     network namespace of this run
#   LAB_HOST_IP    host address on the tap  LAB_GUEST_IP  guest address (eth0)
#   LAB_TAP        tap device name          LAB_MTU       MTU of tap and eth0
#   LAB_RESULTS    results directory of this scenario (kept when it fails)
#   LAB_WORK       scratch directory of this run (always removed; put backing files here)
#   LAB_SHARE      directory shared with the guest (/lab in the guest)
#   LAB_DIR        tests/lab of the checkout     RTGTD  path of rtgtd, when the caller set it
#   LAB_DISK       the guest's first disk file (/dev/vda; the next are disk1.img...) with LAB_DISK_MB

LAB_EVENTS=${LAB_EVENTS:-$LAB_SHARE/events}
LAB_PEER_END=guest-exited
# shellcheck source=events.sh
source "$LAB_DIR/lib/events.sh"

# lab_guest_export NAME=VALUE...: make variables visible to guest.sh (call from host_setup).
lab_guest_export() {
    local kv
    for kv in "$@"; do
        printf 'export %s=%q\n' "${kv%%=*}" "${kv#*=}" >>"$LAB_SHARE/env"
    done
}

# lab_skip REASON: called from host_setup, skips the scenario (before the guest boots), e.g.
#   [[ -x ${RTGTD:-} ]] || lab_skip "RTGTD is not set"
lab_skip() {
    printf '%s\n' "$*" >"$LAB_RESULTS/skip-reason"
    echo "lab: skip: $*"
    exit 77
}

# lab_rtgt_bin [--share] TOOL...: the rtgt tools a scenario's host side runs must be next to
# RTGTD (the scenario is skipped when RTGTD names no binary); writes BIN=<that directory> to
# $LAB_WORK/bin.env for host_run to source. --share also copies rtgtd into the guest's share
# (/lab/bin/rtgtd).
lab_rtgt_bin() {
    local share=0 dir b
    [[ ${1:-} == --share ]] && { share=1; shift; }
    [[ -x ${RTGTD:-} ]] || lab_skip "RTGTD does not name the rtgtd binary"
    dir=$(dirname "$RTGTD")
    for b in "$@"; do
        [[ -x $dir/$b ]] || {
            echo "no $b next to rtgtd"
            return 1
        }
    done
    echo "BIN=$dir" >"$LAB_WORK/bin.env"
    if ((share)); then
        mkdir -p "$LAB_SHARE/bin"
        cp "$RTGTD" "$LAB_SHARE/bin/rtgtd"
    fi
}

# lab_report TEXT: a line printed by run.sh under the scenario's PASS/FAIL line.
lab_report() {
    printf '%s\n' "$*" >>"$LAB_RESULTS/report"
    printf '%s\n' "$*"
}

# lab_start_daemon NAME CMD...: start CMD in the background inside the namespace, its stdout and
# stderr going to $LAB_RESULTS/NAME.log. Sets LAB_DAEMON_PID (the pid of CMD itself; also listed
# as "PID NAME" in $LAB_WORK/daemons). Its exit status is recorded for lab_daemon_status, which
# works from any hook (host_run runs in a subshell, where `wait PID` cannot). Stopped by
# lab_stop_daemons (run automatically after host_teardown).
# Example: lab_start_daemon rtgtd "$RTGTD" --config "$cfg"
lab_start_daemon() {
    local name=$1 st i
    shift
    st=$LAB_WORK/daemon.$name
    rm -f "$st.pid" "$st.status"
    (
        trap - EXIT
        "$@" >"$LAB_RESULTS/$name.log" 2>&1 </dev/null &
        echo $! >"$st.pid.tmp"
        mv "$st.pid.tmp" "$st.pid"
        rc=0
        wait $! || rc=$?
        echo "$rc" >"$st.status"
    ) 2>/dev/null &
    for ((i = 0; i < 500; i++)); do
        [[ -s $st.pid ]] && break
        sleep 0.01
    done
    LAB_DAEMON_PID=$(cat "$st.pid")
    printf '%s %s\n' "$LAB_DAEMON_PID" "$name" >>"$LAB_WORK/daemons"
    echo "lab: started $name (pid $LAB_DAEMON_PID): $*"
}

# lab_daemon_status NAME [TIMEOUT_S]: wait (default 30 s) until the daemon NAME has exited and
# print its exit status (128+N when killed by signal N). Returns 1 if it is still running.
lab_daemon_status() {
    local st=$LAB_WORK/daemon.$1 timeout=${2:-30} i
    for ((i = 0; i < timeout * 10; i++)); do
        if [[ -s $st.status ]]; then
            cat "$st.status"
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# lab_daemon_pid NAME: the pid of the daemon NAME started last by lab_start_daemon.
lab_daemon_pid() {
    awk -v n="$1" '$2 == n { p = $1 } END { print p }' "$LAB_WORK/daemons" 2>/dev/null
}

# lab_daemon_alive NAME: true while the daemon NAME started by lab_start_daemon runs.
lab_daemon_alive() {
    local pid
    pid=$(lab_daemon_pid "$1")
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}

# lab_kill_daemon NAME: SIGKILL the daemon NAME (a crash: it cleans nothing up).
lab_kill_daemon() {
    local pid
    pid=$(lab_daemon_pid "$1")
    [[ -n $pid ]] && kill -KILL "$pid"
}

# lab_stop_daemon NAME [GRACE_S]: SIGTERM the daemon, SIGKILL it after GRACE_S (default 5) seconds.
lab_stop_daemon() {
    local pid i grace=${2:-5}
    pid=$(lab_daemon_pid "$1")
    [[ -n $pid ]] || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < grace * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

lab_stop_daemons() {
    local pid name
    [[ -f $LAB_WORK/daemons ]] || return 0
    while read -r pid name; do
        lab_stop_daemon "$name"
    done < <(tac "$LAB_WORK/daemons")
}

# lab_wait_tcp HOST PORT [TIMEOUT_S]: wait until HOST:PORT accepts TCP connections.
lab_wait_tcp() {
    local host=$1 port=$2 timeout=${3:-30} start
    start=$(date +%s)
    until (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; do
        if (($(date +%s) - start >= timeout)); then
            echo "lab: $host:$port not listening after ${timeout}s" >&2
            return 1
        fi
        sleep 0.2
    done
}

# lab_rtgtd_add_target LOG DEST [TIMEOUT_S]: wait until the rtgtd log LOG (a file in
# $LAB_RESULTS) shows the SRP add_target string for DEST (IP:PORT) and print it.
lab_rtgtd_add_target() {
    local log=$LAB_RESULTS/$1 dest=$2 timeout=${3:-30} i s
    for ((i = 0; i < timeout * 10; i++)); do
        s=$(grep -o "id_ext=[0-9a-f]*,ioc_guid=[0-9a-f]*,dest=$dest" "$log" 2>/dev/null | tail -1)
        if [[ -n $s ]]; then
            printf '%s\n' "$s"
            return 0
        fi
        sleep 0.1
    done
    echo "lab: no SRP add_target string for $dest in $log" >&2
    return 1
}

# lab_power_cut: cut the guest's power: SIGKILL to QEMU, nothing written back, no shutdown. The
# runner takes the guest's end as expected and boots it again on the same disks (LAB_DISK_MB) when
# the scenario has guest-reboot.sh. Returns when QEMU is gone.
lab_power_cut() {
    local pid boot i
    pid=$(cat "$LAB_WORK/qemu.pid" 2>/dev/null) || { echo "lab: no QEMU to cut" >&2; return 1; }
    boot=$(cat "$LAB_SHARE/boot")
    kill -0 "$pid" 2>/dev/null || { echo "lab: QEMU (pid $pid) is not running" >&2; return 1; }
    echo "$boot" >"$LAB_WORK/power-cut"
    kill -KILL "$pid"
    # The runner reaps QEMU at once; wait until it has.
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "lab: power cut (QEMU pid $pid killed, boot $boot)"
}
