#!/bin/bash
# ib_srp against rtgtd restarted under fio: the remote port reconnects (reconnect_delay) before
# fast_io_fail_tmo, so no I/O fails and fio's verify passes; then a login with a wrong target
# port ID is rejected with SRP_LOGIN_REJ (the add_target write fails at once).
set -euo pipefail

modprobe -a sd_mod
lab_rxe_add rxe0 eth0
lab_step "add_target $SRP_TARGET"
lab_srp_add_target "$SRP_TARGET" || lab_fail "add_target failed"
dev=$(lab_wwn_disk "$DISK_WWN" 60) || lab_fail "no disk with WWN $DISK_WWN"
port=$(echo /sys/class/srp_remote_ports/port-*)
echo 2 >"$port/reconnect_delay"
echo 90 >"$port/fast_io_fail_tmo"
echo 180 >"$port/dev_loss_tmo"
lab_step "remote port $port: reconnect_delay 2, fast_io_fail_tmo 90, dev_loss_tmo 180"
# After kill -9 the initiator's QP retries forever (rxe treats retry count 7 as infinite), so
# recovery is the SCSI error handler's: command timeout, SRP aborts (5 s each), device and host
# reset, which reconnects. A short command timeout and few commands in flight keep it brief.
echo 10 >"/sys/class/block/${dev#/dev/}/device/timeout"

fio_under_restart() { # NAME SIGNAL-EVENT DONE-EVENT OFFSET IODEPTH
    fio --name="$1" --filename="$dev" --rw=randwrite --bs=4k --iodepth="$5" --offset="$4" --size=24m \
        --verify=crc32c --verify_fatal=1 --ioengine=libaio --direct=1 --eta=never \
        --output="$LAB_OUT/fio-$1.txt" &
    local fio_pid=$!
    sleep 3
    lab_step "$1: asking the host to restart rtgtd"
    lab_signal "$2"
    lab_wait "$3" 120 || lab_fail "host did not restart rtgtd"
    wait "$fio_pid" || { cat "$LAB_OUT/fio-$1.txt"; lab_fail "fio $1 failed"; }
    grep -q 'err= 0' "$LAB_OUT/fio-$1.txt" || lab_fail "fio $1 reported errors"
    lab_step "$1: verify passed"
}
fio_under_restart sigterm restart-term restarted-term 0 16
fio_under_restart sigkill restart-kill restarted-kill 32m 4
cat "$port/state" >"$LAB_OUT/port-state.txt"
lab_srp_remove_all || lab_fail "remote port not deleted"

lab_step "login with a wrong target port ID"
bad=$(echo "$SRP_TARGET" | sed -E 's/id_ext=([0-9a-f]{15})([0-9a-f])/id_ext=\1f/')
[[ $bad == "$SRP_TARGET" ]] && bad=$(echo "$SRP_TARGET" | sed -E 's/id_ext=([0-9a-f]{15})f/id_ext=\10/')
start=$(date +%s)
if timeout 60 bash -c "echo '$bad' >/sys/class/infiniband_srp/srp-rxe0-1/add_target" 2>"$LAB_OUT/badlogin.txt"; then
    lab_fail "add_target with a wrong id_ext succeeded"
fi
lab_step "rejected after $(($(date +%s) - start)) s: $(cat "$LAB_OUT/badlogin.txt")"
dmesg | grep -i 'srp' | tail -20 >"$LAB_OUT/dmesg-srp.txt"
grep -qi 'reject' "$LAB_OUT/dmesg-srp.txt" || lab_fail "ib_srp did not report a rejected login"
lab_step "rtgt-srp-faults done"
