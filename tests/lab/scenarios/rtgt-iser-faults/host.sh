# shellcheck shell=bash
# Host side of rtgt-iser-faults: rtgtd (file backstore, short NOP-In timers) killed with SIGKILL
# and restarted while the guest writes over iSER; then the tap taken down while the guest
# writes, until rtgtd reports that the vanished initiator's connection, QP and session are gone
# (SIGUSR1 state line), and brought up again for the initiator to recover.

RTGT_IQN=iqn.2025-01.io.rtgt.lab:iser-faults
GUEST_IQN=iqn.2025-01.io.rtgt.lab:guest

start_rtgtd() {
    lab_start_daemon "$1" "$RTGTD" --config "$LAB_WORK/rtgt.yaml" --state-dir "$LAB_WORK/state"
    lab_wait_tcp "$LAB_HOST_IP" 3260 30
}

# rtgtd_pid NAME: the pid of the daemon started as NAME.
rtgtd_pid() { awk -v n="$1" '$2 == n { p = $1 } END { print p }' "$LAB_WORK/daemons"; }

# rdma_state NAME: ask rtgtd NAME for its RDMA state line and print it.
rdma_state() {
    kill -USR1 "$(rtgtd_pid "$1")"
    sleep 0.5
    grep 'RDMA state' "$LAB_RESULTS/$1.log" | tail -1
}

host_setup() {
    [[ -x ${RTGTD:-} ]] || lab_skip "RTGTD does not name the rtgtd binary"
    cat >"$LAB_WORK/rtgt.yaml" <<YAML
backstores:
  - {name: disk, type: file, path: disk.img, size: 256MiB, block_size: 512}
targets:
  - name: $RTGT_IQN
    portal_groups:
      - tag: 1
        portals: ['$LAB_HOST_IP:3260']
        luns: [{lun: 0, backstore: disk}]
        acls:
          - initiator: $GUEST_IQN
        params: {NopInInterval: 3, NopInTimeout: 5}
rdma:
  addresses: [$LAB_HOST_IP]
  eth_mtu: $LAB_MTU
YAML
    cp "$LAB_WORK/rtgt.yaml" "$LAB_RESULTS/rtgt.yaml"
    start_rtgtd rtgtd
    grep -q 'iSER portal listening' "$LAB_RESULTS/rtgtd.log" || {
        cat "$LAB_RESULTS/rtgtd.log"
        lab_skip "rtgtd serves no iSER (RDMA device unavailable)"
    }
    lab_guest_export TARGET_IQN="$RTGT_IQN" GUEST_IQN="$GUEST_IQN"
}

host_run() {
    # Crash under I/O: kill -9, start again on the same state.
    lab_wait kill-now 300 || return 1
    kill -KILL "$(rtgtd_pid rtgtd)"
    sleep 1
    start_rtgtd rtgtd-2 || return 1
    lab_signal restarted

    # The initiator vanishes under I/O: its link goes down.
    lab_wait cut-now 300 || return 1
    ip link set "$LAB_TAP" down
    local state t0=$SECONDS
    while :; do
        state=$(rdma_state rtgtd-2)
        grep -q 'iser_connections=0 .*rdma_qps=0 sessions=0' <<<"$state" && break
        if ((SECONDS - t0 > 90)); then
            echo "rtgtd did not free the vanished initiator's resources: $state"
            ip link set "$LAB_TAP" up
            return 1
        fi
        sleep 1
    done
    lab_report "initiator cut off: rtgtd freed its connection, QP and session in $((SECONDS - t0)) s ($state)"
    ip link set "$LAB_TAP" up
    lab_signal link-back
}

host_check() {
    lab_daemon_alive rtgtd-2 || { echo "rtgtd died"; return 1; }
    if grep -E 'panicked|ERROR' "$LAB_RESULTS"/rtgtd*.log; then
        echo "rtgtd logged errors"
        return 1
    fi
    local state
    state=$(rdma_state rtgtd-2)
    echo "$state" | tee "$LAB_RESULTS/rdma-state.txt"
    grep -q 'iser_connections=0 .*rdma_qps=0 sessions=0' <<<"$state" || {
        echo "rtgtd kept iSER connections, QPs or sessions after the logout"
        return 1
    }
}
