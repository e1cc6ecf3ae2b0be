#!/bin/bash
# Linux ib_srp against rtgtd: add_target with the string rtgtd logged, the disk's size and WWN,
# ext4 with checksummed files across a remount, fio verify on the raw device, then the remote
# port deleted and added again with the data still there.
set -euo pipefail

modprobe -a sd_mod ext4
lab_step "rxe0 on eth0"
lab_rxe_add rxe0 eth0
lab_step "add_target $SRP_TARGET"
lab_srp_add_target "$SRP_TARGET" || lab_fail "add_target failed"
dev=$(lab_wwn_disk "$DISK_WWN" 60) || lab_fail "no disk with WWN $DISK_WWN"
name=${dev#/dev/}
bytes=$(($(cat "/sys/class/block/$name/size") * 512))
lab_step "disk $dev: $bytes bytes"
((bytes == DISK_BYTES)) || lab_fail "disk size $bytes, expected $DISK_BYTES"
cat /sys/class/srp_remote_ports/port-*/port_id >"$LAB_OUT/port_id.txt" || true

lab_step "mkfs.ext4 and files"
# The file system keeps to the first 64 MiB; fio verifies the space behind it.
lab_files_create "$dev" 64M
lab_step "remount and verify sha256"
lab_files_verify "$dev" "after remount"

lab_step "fio verify: randwrite and randrw; bs 512/4k/64k/1m; iodepth 1/16/64"
for rw in randwrite randrw; do
    for bs in 512 4k 64k 1m; do
        for qd in 1 16 64; do
            case $bs in
                512) size=256k ;;
                4k) size=1m ;;
                64k) size=4m ;;
                1m) size=16m ;;
            esac
            lab_fio_verify "$dev" "$rw-$bs-qd$qd" "$rw" "$bs" "$qd" 96m "$size"
        done
    done
done

lab_step "delete the remote port"
lab_srp_remove_all || lab_fail "remote port not deleted"
lab_retry 30 bash -c "! test -e /sys/class/block/$name" || lab_fail "disk still present after delete"

lab_step "add_target again"
lab_srp_add_target "$SRP_TARGET" || lab_fail "second add_target failed"
dev=$(lab_wwn_disk "$DISK_WWN" 60) || lab_fail "no disk after the second add_target"
lab_files_verify "$dev" "after add_target again"
lab_fio_verify "$dev" again randrw 64k 16 96m 8m
lab_srp_remove_all || lab_fail "remote port not deleted at the end"
lab_step "rtgt-srp done"
