#!/bin/bash
# ibv_rc_pingpong / ibv_ud_pingpong (rdma-core) on rxe0 against rtgt-rdma on the host side:
# first as clients of rtgt's server, then as servers for rtgt's client, for each size. The
# hardware counters of rxe0 and the kernel log go to $LAB_OUT at the end.
set -euo pipefail
tool=ibv_${PP_MODE}_pingpong
pp=(-d rxe0 -g 1 -n "$PP_ITERS")
# ibv_ud_pingpong has no -m: UD messages follow the port MTU.
[[ $PP_MODE == rc ]] && pp+=(-m "$PP_MTU")

dump_state() {
    local f
    mkdir -p "$LAB_OUT/hw_counters"
    for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do
        [[ -r $f ]] && printf '%s %s\n' "${f##*/}" "$(cat "$f")"
    done >"$LAB_OUT/hw_counters.txt" 2>/dev/null || true
    dmesg >"$LAB_OUT/dmesg.txt" 2>/dev/null || true
}
trap dump_state EXIT

lab_step "creating rxe0 on eth0"
lab_rxe_add rxe0 eth0
ibv_devinfo -d rxe0 | grep -E 'state|active_mtu|link_layer'
cat /sys/class/infiniband/rxe0/ports/1/gids/1
"$tool" --help 2>&1 | head -30 >"$LAB_OUT/$tool-help.txt" || true

for size in $PP_SIZES; do
    lab_step "$tool client, $size bytes, against rtgt"
    lab_wait "host-server-$size" 300 || lab_fail "the host did not start rtgt-rdma ($size)"
    log=$LAB_OUT/client-$size.log
    ok=0
    for ((try = 0; try < 20; try++)); do
        if timeout 300 "$tool" "${pp[@]}" -s "$size" "$LAB_HOST_IP" >"$log" 2>&1; then
            ok=1
            break
        fi
        # Only a refused connection (rtgt not listening yet) is worth another try.
        grep -q "Couldn't connect" "$log" || break
        sleep 0.5
    done
    cat "$log"
    [[ $ok == 1 ]] || { dump_state; lab_fail "$tool client ($size bytes) failed"; }
    grep -q "^$((size * PP_ITERS * 2)) bytes in" "$log" || lab_fail "$tool client ($size bytes): no result line"
done

for size in $PP_SIZES; do
    lab_step "$tool server, $size bytes, for rtgt"
    log=$LAB_OUT/server-$size.log
    timeout 300 "$tool" "${pp[@]}" -s "$size" >"$log" 2>&1 &
    pid=$!
    lab_retry 10 bash -c "ss -ltn | grep -q ':18515 '" || true
    lab_signal "guest-server-$size"
    status=0
    wait "$pid" || status=$?
    cat "$log"
    ((status == 0)) || { dump_state; lab_fail "$tool server ($size bytes) failed with status $status"; }
    grep -q "^$((size * PP_ITERS * 2)) bytes in" "$log" || lab_fail "$tool server ($size bytes): no result line"
done

lab_wait host-done 600 || true
[[ $(lab_host_status) == 0 ]] || lab_fail "host side failed"
dump_state
cat "$LAB_OUT/hw_counters.txt"
lab_step "$LAB_SCENARIO done"
