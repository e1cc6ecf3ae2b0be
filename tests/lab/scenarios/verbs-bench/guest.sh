#!/bin/bash
# rtgtd in the guest on the soft provider (before rdma_rxe is loaded: its UDP 4791 is free),
# then on verbs over rxe0; around each bench row of the host, the CPU time rtgtd and the whole
# guest used, in clock ticks, into $LAB_OUT/cpu-PHASE.txt (row, rtgtd, guest).
set -euo pipefail
pid=""

# guest_ticks: busy CPU time of the whole guest (user, nice, system, irq, softirq).
guest_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
# rtgtd_ticks: rtgtd's CPU time, user and system together, and user alone.
rtgtd_ticks() { awk '{ print $14 + $15, $14 }' "/proc/$pid/stat"; }

phase() {
    local p=$1 n t0 u0 t1 u1 g0 srp
    lab_step "rtgtd on the $p provider"
    lab_rtgtd_start "/lab/rtgt-$p.yaml" "/tmp/state-$p" "$LAB_OUT/rtgtd-$p.log"
    pid=$LAB_RTGTD_PID
    srp=$(grep -o "id_ext=[0-9a-f]*,ioc_guid=[0-9a-f]*,dest=$LAB_GUEST_IP:5555" "$LAB_OUT/rtgtd-$p.log" | tail -1)
    : >"$LAB_OUT/cpu-$p.txt"
    lab_signal "ready-$p" "$srp"
    for ((n = 1; n <= ROWS; n++)); do
        lab_wait "start-$p-$n" 300 || lab_fail "no row $n of the $p phase"
        read -r t0 u0 < <(rtgtd_ticks)
        g0=$(guest_ticks)
        lab_wait "end-$p-$n" 300 || lab_fail "row $n of the $p phase did not end"
        read -r t1 u1 < <(rtgtd_ticks)
        echo "$n $((t1 - t0)) $(($(guest_ticks) - g0)) $((u1 - u0))" >>"$LAB_OUT/cpu-$p.txt"
    done
    lab_wait "done-$p" 60 || lab_fail "the $p phase did not end"
    kill -TERM "$pid"
    lab_retry 30 bash -c "! kill -0 $pid 2>/dev/null" || lab_fail "rtgtd ($p) did not stop"
    if grep -E 'panicked|ERROR' "$LAB_OUT/rtgtd-$p.log"; then
        lab_fail "rtgtd ($p) logged errors"
    fi
}

lsmod | grep -q '^rdma_rxe' && lab_fail "rdma_rxe is loaded before the soft phase"
phase soft
lab_step "creating rxe0 on eth0"
lab_rxe_add rxe0 eth0
phase verbs
lab_wait host-done 60 || true
lab_step "verbs-bench done"
