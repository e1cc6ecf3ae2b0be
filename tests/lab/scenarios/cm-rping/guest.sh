#!/bin/bash
# rdma-core's rping on rxe0 (rdma_cm, RDMA_PS_TCP port 7174): as client of `rtgt-rdma rping -s`
# on the host for each size (-V: the echo must equal what was sent), then as server for
# `rtgt-rdma rping -c`. The kernel log goes to $LAB_OUT at the end.
set -euo pipefail
trap 'dmesg >"$LAB_OUT/dmesg.txt" 2>/dev/null || true' EXIT

lab_step "creating rxe0 on eth0"
lab_rxe_add rxe0 eth0
lab_wait host-server 300 || lab_fail "the host did not start rtgt-rdma rping"

for size in $CM_SIZES; do
    lab_step "rping client, $CM_COUNT x $size bytes, against rtgt"
    log=$LAB_OUT/rping-client-$size.log
    verbose=()
    # The data of small pings is printed (-v) too.
    ((size <= 64)) && verbose=(-v)
    start=$(date +%s%N)
    lab_rping 300 "$log" -c -a "$LAB_HOST_IP" -C "$CM_COUNT" -S "$size" -V "${verbose[@]}" ||
        { tail -20 "$log"; lab_fail "rping client ($size bytes) failed"; }
    end=$(date +%s%N)
    tail -3 "$log"
    if ((size <= 64)); then
        # (rping's stderr may land inside its buffered stdout lines: count the prefixes)
        [[ $(grep -o 'ping data: ' "$log" | wc -l) == "$CM_COUNT" ]] ||
            lab_fail "rping client ($size bytes): not $CM_COUNT pings printed"
    fi
    grep -q 'data mismatch' "$log" && lab_fail "rping client ($size bytes): data mismatch"
    echo "rping client $size bytes: $(((end - start) / 1000000)) ms"
done

for size in $CM_SIZES; do
    lab_step "rping server, $size bytes, for rtgt"
    log=$LAB_OUT/rping-server-$size.log
    timeout 300 rping -s -a "$LAB_GUEST_IP" -S 65535 -V >"$log" 2>&1 &
    pid=$!
    lab_retry 10 bash -c "rdma resource show cm_id 2>/dev/null | grep -q LISTEN" || sleep 1
    lab_signal "guest-server-$size"
    status=0
    wait "$pid" || status=$?
    tail -5 "$log"
    ((status == 0)) || lab_fail "rping server ($size bytes) failed with status $status"
    lab_wait "host-client-$size" 60 || lab_fail "rtgt client ($size bytes) failed"
done

lab_wait host-done 600 || true
[[ $(lab_host_status) == 0 ]] || lab_fail "host side failed"
lab_step "$LAB_SCENARIO done"
