#!/bin/bash
# rping -c (64 KiB pings, no count) against rtgt, killed with SIGKILL once pings flow: the
# kernel tears the connection down (DREQ) while rtgt has RDMA READs and WRITEs in flight.
# rtgt must end that connection, free its QP (live QP count back to the idle value) and serve
# the next client.
set -euo pipefail
trap 'dmesg >"$LAB_OUT/dmesg.txt" 2>/dev/null || true' EXIT
stats=/lab/rtgt-server.stats
stat() { awk -v k="$1" '$1 == k { print $2 }' "$stats"; }
# wait_stat KEY VALUE TIMEOUT_S: until the server's KEY equals VALUE.
wait_stat() {
    lab_retry "$3" bash -c "[[ \$(awk -v k=$1 '\$1 == k { print \$2 }' $stats) == $2 ]]"
}

lab_step "creating rxe0 on eth0"
lab_rxe_add rxe0 eth0
lab_wait host-server 300 || lab_fail "the host did not start rtgt-rdma rping"
idle=$(stat live_qps)
echo "rtgt idle: $idle live QPs"

for round in 1 2; do
    lab_step "rping killed mid-transfer ($round)"
    before=$(stat pings)
    rping -c -a "$LAB_HOST_IP" -C 0 -S 65535 -V >"$LAB_OUT/rping-killed-$round.log" 2>&1 &
    pid=$!
    lab_retry 60 bash -c "(( \$(awk '\$1 == \"pings\" { print \$2 }' $stats) >= $before + 20 ))" ||
        lab_fail "pings did not flow"
    [[ $(stat live_connections) == 1 ]] || lab_fail "rtgt has $(stat live_connections) connections"
    kill -KILL "$pid"
    wait "$pid" 2>/dev/null || true
    wait_stat live_connections 0 60 || lab_fail "rtgt kept the connection: $(cat $stats)"
    wait_stat live_qps "$idle" 60 || lab_fail "rtgt kept the QP: $(cat $stats)"
    echo "round $round: connection and QP released: $(tr '\n' ' ' <$stats)"
done

lab_step "a second client"
lab_rping 120 "$LAB_OUT/rping-after.log" -c -a "$LAB_HOST_IP" -C 20 -S 65535 -V ||
    { cat "$LAB_OUT/rping-after.log"; lab_fail "rping after the aborts failed"; }
wait_stat live_qps "$idle" 60 || lab_fail "rtgt kept the QP of the good client: $(cat $stats)"
lab_signal guest-done "2 clients killed mid-transfer, QPs released (live QPs back to $idle), a third served; $(stat pings) pings"

lab_wait host-done 120 || true
[[ $(lab_host_status) == 0 ]] || lab_fail "host side failed"
lab_step "$LAB_SCENARIO done"
