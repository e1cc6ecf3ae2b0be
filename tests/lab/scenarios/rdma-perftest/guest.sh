#!/bin/bash
# perftest clients (ib_write_bw, ib_read_bw, ib_send_bw, ib_write_lat; RC, GID index 1) on rxe0 against
# `rtgt-rdma perftest` on the host side. The hardware counters of rxe0 and the kernel log go to
# $LAB_OUT at the end.
set -euo pipefail
bw=(-d rxe0 -x 1 -F -n "$PT_ITERS" -s "$PT_SIZE" --report_gbits)
lat=(-d rxe0 -x 1 -F -n "$PT_LAT_ITERS" -s "$PT_LAT_SIZE")

dump_state() {
    local f
    for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do
        [[ -r $f ]] && printf '%s %s\n' "${f##*/}" "$(cat "$f")"
    done >"$LAB_OUT/hw_counters.txt" 2>/dev/null || true
    dmesg >"$LAB_OUT/dmesg.txt" 2>/dev/null || true
}
trap dump_state EXIT

lab_step "creating rxe0 on eth0"
lab_rxe_add rxe0 eth0
ibv_devinfo -d rxe0 | grep -E 'state|active_mtu|link_layer'

for t in $PT_TESTS; do
    if [[ $t == *_lat ]]; then
        tool=ib_$t perf=("${lat[@]}") size=$PT_LAT_SIZE iters=$PT_LAT_ITERS
    else
        tool=ib_${t}_bw perf=("${bw[@]}") size=$PT_SIZE iters=$PT_ITERS
    fi
    lab_step "$tool against rtgt"
    lab_wait "host-ready-$t" 300 || lab_fail "the host did not start rtgt-rdma perftest ($t)"
    log=$LAB_OUT/$tool.log
    lab_perftest "$log" "$tool" "${perf[@]}" "$LAB_HOST_IP" || { dump_state; lab_fail "$tool failed"; }
    awk -v s="$size" '$1 == s && $2 == '"$iters"' { found = 1 } END { exit !found }' "$log" ||
        lab_fail "$tool: no result line for $size bytes x $iters"
done

lab_wait host-done 300 || true
[[ $(lab_host_status) == 0 ]] || lab_fail "host side failed"
dump_state
cat "$LAB_OUT/hw_counters.txt"
lab_step "rdma-perftest done"
