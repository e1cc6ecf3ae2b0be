#!/bin/bash
# CM_CYCLES rping clients in a row (5 pings of 4 KiB each, payload checked) against rtgt;
# afterwards rtgt's live QP count must be what it was before the first one.
set -euo pipefail
trap 'dmesg >"$LAB_OUT/dmesg.txt" 2>/dev/null || true' EXIT
stats=/lab/rtgt-server.stats
stat() { awk -v k="$1" '$1 == k { print $2 }' "$stats"; }

lab_step "creating rxe0 on eth0"
lab_rxe_add rxe0 eth0
lab_wait host-server 300 || lab_fail "the host did not start rtgt-rdma rping"
idle=$(stat live_qps)
echo "rtgt idle: $idle live QPs"

lab_step "$CM_CYCLES connect/transfer/disconnect cycles"
start=$(date +%s%N)
for ((i = 1; i <= CM_CYCLES; i++)); do
    lab_rping 60 "$LAB_OUT/rping-$i.log" -c -a "$LAB_HOST_IP" -C 5 -S 4096 -V ||
        { cat "$LAB_OUT/rping-$i.log"; lab_fail "cycle $i failed"; }
done
ms=$((($(date +%s%N) - start) / 1000000))
echo "$CM_CYCLES cycles in $ms ms"
lab_retry 30 bash -c "[[ \$(awk '\$1 == \"served\" { print \$2 }' $stats) == $CM_CYCLES ]]" ||
    lab_fail "rtgt served $(stat served) connections"
lab_retry 30 bash -c "[[ \$(awk '\$1 == \"live_qps\" { print \$2 }' $stats) == $idle ]]" ||
    lab_fail "live QPs $(stat live_qps), idle $idle"
[[ $(stat live_connections) == 0 ]] || lab_fail "$(stat live_connections) connections left"
lab_signal guest-done "live QPs $idle before and after, $((ms / CM_CYCLES)) ms per cycle"

lab_wait host-done 120 || true
[[ $(lab_host_status) == 0 ]] || lab_fail "host side failed"
lab_step "$LAB_SCENARIO done"
