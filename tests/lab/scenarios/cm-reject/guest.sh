#!/bin/bash
# rping to port 7999 of the host, where nobody listens: rdma_cm must report REJECTED with
# status 8 (invalid service ID) long before a CM timeout (4.3 s per REQ, 15 retries). Good
# rpings to 7174 before and after show the device serving throughout.
set -euo pipefail
trap 'dmesg >"$LAB_OUT/dmesg.txt" 2>/dev/null || true' EXIT

lab_step "creating rxe0 on eth0"
lab_rxe_add rxe0 eth0
lab_wait host-server 300 || lab_fail "the host did not start rtgt-rdma rping"

# A first connect to the open port resolves the host's address (ARP, route), which takes
# seconds under TCG and is not what is measured here.
lab_step "rping to the open port"
lab_rping 120 "$LAB_OUT/rping-open-1.log" -c -a "$LAB_HOST_IP" -C 10 -S 1024 -V ||
    { cat "$LAB_OUT/rping-open-1.log"; lab_fail "rping to the open port failed"; }

worst=0
for ((i = 1; i <= CM_ATTEMPTS; i++)); do
    lab_step "rping to a closed port ($i)"
    log=$LAB_OUT/rping-closed-$i.log
    start=$(date +%s%N)
    status=0
    timeout 120 rping -c -a "$LAB_HOST_IP" -p 7999 -C 1 >"$log" 2>&1 || status=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    cat "$log"
    echo "rping to a closed port: status $status after $ms ms"
    ((status != 0)) || lab_fail "rping to a closed port succeeded"
    grep -q 'RDMA_CM_EVENT_REJECTED, error 8' "$log" || lab_fail "no REJECTED event with status 8"
    # Well under one CM response timeout (4.3 s), let alone the 15 retries.
    ((ms < 2000)) || lab_fail "the reject took $ms ms"
    ((ms > worst)) && worst=$ms
done

lab_step "rping to the open port again"
lab_rping 120 "$LAB_OUT/rping-open-2.log" -c -a "$LAB_HOST_IP" -C 10 -S 1024 -V ||
    { cat "$LAB_OUT/rping-open-2.log"; lab_fail "rping to the open port failed"; }
lab_signal guest-done "slowest reject $worst ms"

lab_wait host-done 120 || true
[[ $(lab_host_status) == 0 ]] || lab_fail "host side failed"
lab_step "$LAB_SCENARIO done"
