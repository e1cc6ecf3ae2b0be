#!/bin/bash
# rtgtd inside the guest on rxe0 through the verbs provider (rdma-core), the guest's kernel
# initiators against it over rxe (lab_rdma_loopback, which LIO passes in lio-verbs): iSER login,
# ext4 files, fio verify and resets under fio; the same files read back over SRP (ib_srp), fio
# verify and a LOGICAL UNIT RESET under fio; kill -9 of rtgtd under fio and a restart with ib_srp
# reconnecting and the verify passing; kill -9 under a logged-in iSER session and a restart,
# iscsid reconnecting with the data intact; then the host's soft-RoCE initiators
# bench against it (host_run) and rtgtd stops cleanly.
set -euo pipefail
ip=$LAB_GUEST_IP
node=(-m node -T "$TARGET_IQN" -p "$ip")
state=/tmp/rtgt-state
rtgtd_pid=""

modprobe -a iscsi_tcp sd_mod ext4
lab_step "creating rxe0 on eth0"
lab_rxe_add rxe0 eth0
modprobe -a ib_iser ib_srp

# start_rtgtd N: rtgtd on /lab/rtgt.yaml for the N-th time, its log appended to
# $LAB_OUT/rtgtd.log; returns once it serves iSER and SRP.
start_rtgtd() {
    lab_rtgtd_start /lab/rtgt.yaml "$state" "$LAB_OUT/rtgtd.log" "$1"
    rtgtd_pid=$LAB_RTGTD_PID
}

lab_step "rtgtd on rxe0 (provider verbs)"
start_rtgtd 1
grep -q 'RDMA through rdma-core (provider verbs)' "$LAB_OUT/rtgtd.log" || lab_fail "rtgtd not on verbs"
grep -q "address=$ip device=rxe0" "$LAB_OUT/rtgtd.log" || lab_fail "rtgtd: $ip not on rxe0"
lab_step "rtgtd opens no UDP 4791 (rdma_rxe owns it)"
ss -uanp | tee "$LAB_OUT/udp.txt"
if grep ':4791 ' "$LAB_OUT/udp.txt" | grep -q rtgtd; then
    lab_fail "rtgtd has a UDP 4791 socket"
fi
srp_target=$(grep -o "id_ext=[0-9a-f]*,ioc_guid=[0-9a-f]*,dest=$ip:5555" "$LAB_OUT/rtgtd.log" | tail -1)
[[ -n $srp_target ]] || lab_fail "no SRP add_target string in rtgtd's log"

lab_rdma_loopback "$ip" "$TARGET_IQN" "$srp_target" "$DISK_WWN" "$DISK_BYTES"
dev=$LAB_SRP_DEV

lab_step "SRP: kill -9 of rtgtd under fio, restart, ib_srp reconnects, verify passes"
port=$(echo /sys/class/srp_remote_ports/port-*)
echo 2 >"$port/reconnect_delay"
echo 90 >"$port/fast_io_fail_tmo"
echo 180 >"$port/dev_loss_tmo"
echo 10 >"/sys/class/block/${dev#/dev/}/device/timeout"
fio --name=srp-kill --filename="$dev" --rw=randwrite --bs=4k --iodepth=4 --offset=176m --size=16m \
    --verify=crc32c --verify_fatal=1 --ioengine=libaio --direct=1 --eta=never \
    --output="$LAB_OUT/fio-srp-kill.txt" &
fio_pid=$!
sleep 3
kill -9 "$rtgtd_pid"
wait "$rtgtd_pid" 2>/dev/null || true
start_rtgtd 2
wait "$fio_pid" || { cat "$LAB_OUT/fio-srp-kill.txt"; lab_fail "fio under kill -9 failed (SRP)"; }
grep -q 'err= 0' "$LAB_OUT/fio-srp-kill.txt" || lab_fail "fio under kill -9 reported errors (SRP)"
lab_files_verify "$dev" "over SRP after kill -9 and restart"
lab_srp_remove_all || lab_fail "SRP remote port not deleted"

lab_step "kill -9 of rtgtd under a logged-in iSER session, restart, iscsid reconnects"
iscsiadm "${node[@]}" --login
dev=$(lab_iscsi_disk "$ip" "$TARGET_IQN" 0 60) || lab_fail "no disk after the second login"
kill -9 "$rtgtd_pid"
wait "$rtgtd_pid" 2>/dev/null || true
sleep 2
start_rtgtd 3
lab_retry 90 bash -c "iscsiadm -m session -P 3 | grep -q 'iSCSI Session State: LOGGED_IN'" || {
    iscsiadm -m session -P 3 || true
    lab_fail "iSER session not back after the restart"
}
lab_files_verify "$dev" "after kill -9 and restart"
lab_fio_verify "$dev" after-restart randrw 64k 16 160m 8m
iscsiadm "${node[@]}" --logout

lab_step "host bench against rtgtd on verbs"
lab_signal target-ready "$srp_target"
lab_wait host-done 600 || lab_fail "the host's bench did not finish"
[[ $(lab_host_status) == 0 ]] || lab_fail "the host's bench failed"

lab_step "rtgtd stops cleanly"
kill -TERM "$rtgtd_pid"
lab_retry 30 bash -c "! kill -0 $rtgtd_pid 2>/dev/null" || lab_fail "rtgtd did not stop"
if grep -E 'panicked|ERROR' "$LAB_OUT/rtgtd.log"; then
    lab_fail "rtgtd logged errors"
fi
lab_step "rtgt-verbs done"
