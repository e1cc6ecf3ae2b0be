#!/bin/bash
# Linux ib_srp against an SRP target port rtgtd's API created: fio verify on LUN 0 while the
# host adds LUN 1, which a rescan then shows; the host then ends the session through the API.
set -euo pipefail

modprobe -a sd_mod
lab_step "rxe0 on eth0"
lab_rxe_add rxe0 eth0
lab_step "add_target $SRP_TARGET"
lab_srp_add_target "$SRP_TARGET" || lab_fail "add_target failed"
dev=$(lab_wwn_disk "$DISK_WWN" 60) || lab_fail "no disk with WWN $DISK_WWN"

lab_step "fio verify on LUN 0 while the host adds LUN 1"
: >"$LAB_OUT/fio-rounds.txt"
(
    round=0
    while :; do
        round=$((round + 1))
        out="$LAB_OUT/fio-$round.txt"
        fio --name="round$round" --filename="$dev" --rw=randwrite --bs=16k --iodepth=16 \
            --offset=$(((round % 4) * 16))m --size=8m --verify=crc32c --verify_fatal=1 \
            --ioengine=libaio --direct=1 --eta=never --output="$out" || { echo "FAIL $round" >>"$LAB_OUT/fio-rounds.txt"; exit 1; }
        grep -q 'err= 0' "$out" || { echo "FAIL $round" >>"$LAB_OUT/fio-rounds.txt"; exit 1; }
        echo "ok $round" >>"$LAB_OUT/fio-rounds.txt"
        [[ -e /tmp/stop ]] && exit 0
    done
) &
fio_pid=$!
lab_retry 120 grep -q '^ok 1' "$LAB_OUT/fio-rounds.txt" || lab_fail "fio did not start"
lab_signal reconfigure
lab_wait reconfigured 300 || lab_fail "the host did not reconfigure"
touch /tmp/stop
wait "$fio_pid" || { cat "$LAB_OUT/fio-rounds.txt"; lab_fail "I/O failed while LUN 1 was added"; }
lab_step "fio rounds: $(grep -c '^ok' "$LAB_OUT/fio-rounds.txt"), none failed"

lab_step "rescan: LUN 1"
for scan in /sys/class/scsi_host/host*/scan; do echo "- - -" >"$scan"; done
dev1=$(lab_wwn_disk "$EXTRA_WWN" 60) || lab_fail "LUN 1 did not appear"
(($(cat "/sys/class/block/${dev1#/dev/}/size") * 512 == EXTRA_BYTES)) || lab_fail "LUN 1 has the wrong size"
fio --name=lun1 --filename="$dev1" --rw=randwrite --bs=64k --iodepth=8 --size=8m --verify=crc32c \
    --verify_fatal=1 --ioengine=libaio --direct=1 --eta=never --output="$LAB_OUT/fio-lun1.txt" ||
    lab_fail "I/O on LUN 1 failed"
dmesg >"$LAB_OUT/dmesg-before-logout.txt"

lab_step "the host ends the session"
lab_signal logout
lab_wait loggedout 300 || lab_fail "the host did not end the session"
dmesg >"$LAB_OUT/dmesg.txt"
lab_srp_remove_all || lab_fail "remote port not deleted"
lab_step "rtgt-srp-live done"
