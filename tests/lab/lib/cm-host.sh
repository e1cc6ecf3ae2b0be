# shellcheck shell=bash
# Host-side helpers of the connection manager scenarios (cm-*): `rtgt-rdma rping` on the host
# address of the tap, against rdma-core's rping on rxe0 in the guest.

# cm_setup: find rtgt-rdma (RTGT_RDMA, or next to RTGTD) or skip the scenario.
cm_setup() {
    RTGT_RDMA=${RTGT_RDMA:-}
    if [[ -z $RTGT_RDMA && -n ${RTGTD:-} ]]; then
        RTGT_RDMA=$(dirname "$RTGTD")/rtgt-rdma
    fi
    [[ -x $RTGT_RDMA ]] || lab_skip "no rtgt-rdma binary (set RTGT_RDMA, or RTGTD to a sibling build)"
    echo "RTGT_RDMA=$RTGT_RDMA" >"$LAB_WORK/rtgt-rdma.env"
}

# cm_start_server NAME ARGS...: start `rtgt-rdma rping -s` on the host address (receiving through
# AF_PACKET so rxe's ICRCs are checked), its live QP count and CM counters in the shared file
# /lab/NAME.stats of the guest; returns once it listens.
cm_start_server() {
    local name=$1 i
    shift
    # shellcheck source=/dev/null
    source "$LAB_WORK/rtgt-rdma.env"
    rm -f "$LAB_SHARE/$name.stats"
    lab_start_daemon "$name" "$RTGT_RDMA" rping -s -a "$LAB_HOST_IP" --eth-mtu "$LAB_MTU" \
        --packet-rx "$LAB_TAP" --stats-file "$LAB_SHARE/$name.stats" "$@"
    for ((i = 0; i < 300; i++)); do
        [[ -s $LAB_SHARE/$name.stats ]] && return 0
        lab_daemon_alive "$name" || break
        sleep 0.1
    done
    echo "$name did not start:"
    cat "$LAB_RESULTS/$name.log"
    return 1
}

# cm_stat NAME KEY: a value of the server's stats file.
cm_stat() {
    awk -v k="$2" '$1 == k { print $2 }' "$LAB_SHARE/$1.stats" 2>/dev/null
}

# cm_stat_at_least NAME KEY MIN: waits (up to 5 s: the server rewrites its stats file five
# times a second, so a count may lag the guest's report) until KEY reaches MIN; prints the
# last value read and fails if it never did.
cm_stat_at_least() {
    local v i
    for ((i = 0; i < 50; i++)); do
        v=$(cm_stat "$1" "$2")
        ((${v:-0} >= $3)) && break
        sleep 0.1
    done
    echo "${v:-0}"
    ((${v:-0} >= $3))
}

# cm_check_logs: no panic in any rtgt-rdma log.
cm_check_logs() {
    if grep -l 'panicked' "$LAB_RESULTS"/rtgt-*.log 2>/dev/null; then
        echo "rtgt-rdma panicked"
        return 1
    fi
}
