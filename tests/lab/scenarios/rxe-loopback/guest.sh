#!/bin/bash
# Soft-RoCE loopback inside the guest: rxe0 on eth0, rping and perftest to the guest's own IPv4
# address (GID index 1 = ::ffff:IPv4, RoCE v2).
set -euo pipefail
ip=$LAB_GUEST_IP

lab_step "creating rxe0 on eth0"
lab_rxe_add rxe0 eth0
rdma link show
ibv_devinfo -d rxe0 | grep -E 'state|active_mtu|link_layer'
for i in 0 1; do
    printf 'gid %d: %s (%s)\n' "$i" "$(cat /sys/class/infiniband/rxe0/ports/1/gids/$i)" \
        "$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$i)"
done
IFS=. read -r o1 o2 o3 o4 <<<"$ip"
grep -qi "ffff:$(printf '%02x%02x:%02x%02x' "$o1" "$o2" "$o3" "$o4")" /sys/class/infiniband/rxe0/ports/1/gids/1 ||
    lab_fail "GID 1 of rxe0 is not the IPv4-mapped address of eth0"

lab_step "rxe0 through rdma-core as rtgt loads it (rtgt-rdma devices)"
/lab/bin/rtgt-rdma devices | tee "$LAB_OUT/rtgt-devices.txt"
mtu=$(ibv_devinfo -d rxe0 | awk '/active_mtu/ { print $2 }')
grep -q '^rxe0: ' "$LAB_OUT/rtgt-devices.txt" || lab_fail "rtgt-rdma devices: no rxe0"
grep -qx "  port 1: active, RoCE, MTU $mtu" "$LAB_OUT/rtgt-devices.txt" ||
    lab_fail "rtgt-rdma devices: port 1 of rxe0 not active RoCE with MTU $mtu"
grep -qE "^ +gid +1 RoCE v2 +$ip +eth0\$" "$LAB_OUT/rtgt-devices.txt" ||
    lab_fail "rtgt-rdma devices: GID 1 is not RoCE v2 $ip on eth0"
lab_step "rdma-core's data path as rtgt drives it (rtgt-rdma verbs-check)"
timeout 120 /lab/bin/rtgt-rdma verbs-check -d rxe0 --seconds 2 --cm-port 7471 |
    tee "$LAB_OUT/rtgt-verbs-check.txt" || lab_fail "rtgt-rdma verbs-check failed"
for line in "CM connection to $ip:7471: private data both ways, SENDs both ways" \
    "CM request rejected with its private data" "CM disconnect seen by both ends"; do
    grep -qxF "$line" "$LAB_OUT/rtgt-verbs-check.txt" || lab_fail "verbs-check: no '$line'"
done
grep -q "^SEND of 65536 bytes: received intact" "$LAB_OUT/rtgt-verbs-check.txt" ||
    lab_fail "verbs-check: no intact SEND"
grep -q "^RDMA WRITE and RDMA READ of 65536 bytes: intact" "$LAB_OUT/rtgt-verbs-check.txt" ||
    lab_fail "verbs-check: no intact RDMA WRITE and READ"

# server_client NAME SERVER_CMD... -- CLIENT_CMD...: start the server, then the client (retried
# while the server is not listening yet); both must succeed.
server_client() {
    local name=$1 srv=() cli=() pid
    shift
    while [[ $1 != -- ]]; do srv+=("$1"); shift; done
    shift
    cli=("$@")
    lab_step "$name"
    timeout 120 "${srv[@]}" >"$LAB_OUT/$name-server.log" 2>&1 &
    pid=$!
    sleep 1
    local ok=0 try
    for ((try = 0; try < 5; try++)); do
        if timeout 120 "${cli[@]}" >"$LAB_OUT/$name-client.log" 2>&1; then
            ok=1
            break
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 1
    done
    cat "$LAB_OUT/$name-client.log"
    if [[ $ok == 0 ]]; then
        kill "$pid" 2>/dev/null || true
        cat "$LAB_OUT/$name-server.log"
        lab_fail "$name: client failed"
    fi
    wait "$pid" || {
        cat "$LAB_OUT/$name-server.log"
        lab_fail "$name: server failed"
    }
}

server_client rping rping -s -a "$ip" -v -C 10 -- rping -c -a "$ip" -v -C 10
grep -c 'ping data' "$LAB_OUT/rping-client.log" | grep -qx 10 || lab_fail "rping: expected 10 pings"

perf=(-d rxe0 -x 1 -F -n 200 -s 65536 --report_gbits)
for t in ib_send_bw ib_write_bw ib_read_bw; do
    server_client "$t" "$t" "${perf[@]}" -- "$t" "${perf[@]}" "$ip"
done
lab_step "rxe loopback done"
