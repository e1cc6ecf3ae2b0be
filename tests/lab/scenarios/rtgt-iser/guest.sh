#!/bin/bash
# open-iscsi's iser transport (ib_iser over rdma_rxe) against rtgtd: SendTargets over TCP, the
# node switched to iser, a wrong CHAP secret refused, CHAP login, disk size and WWN, ext4 with
# checksummed files across a remount, fio verify on the raw device, logout and re-login with
# the data intact.
set -euo pipefail
portal=$LAB_HOST_IP
node=(-m node -T "$TARGET_IQN" -p "$portal")

modprobe -a iscsi_tcp sd_mod ext4
lab_step "creating rxe0 on eth0"
lab_rxe_add rxe0 eth0
modprobe ib_iser
echo "InitiatorName=$GUEST_IQN" >/etc/iscsi/initiatorname.iscsi
lab_step "starting iscsid"
iscsid
lab_step "discovery (TCP)"
iscsiadm -m discovery -t sendtargets -p "$portal" | tee "$LAB_OUT/discovery.txt"
grep -q "$portal:3260,1 $TARGET_IQN" "$LAB_OUT/discovery.txt" || lab_fail "target not discovered"
lab_iser_node "$portal" "$TARGET_IQN"
iscsiadm "${node[@]}" | grep -q 'iface.transport_name = iser' || lab_fail "node not on iser"

set_node() { iscsiadm "${node[@]}" --op update -n "$1" -v "$2"; }
set_node node.session.auth.authmethod CHAP
set_node node.session.auth.username "$CHAP_USER"

lab_step "iSER login with a wrong CHAP secret is refused"
set_node node.session.auth.password "not-the-secret-0"
if iscsiadm "${node[@]}" --login >"$LAB_OUT/badlogin.txt" 2>&1; then
    lab_fail "login with a wrong CHAP secret succeeded"
fi
cat "$LAB_OUT/badlogin.txt"
set_node node.session.auth.password "$CHAP_SECRET"

lab_step "iSER login (CHAP)"
lab_iser_login "$portal" "$TARGET_IQN" "$DISK_BYTES"
dev=$LAB_DEV
name=${dev#/dev/}
wwid=$(cat "/sys/class/block/$name/device/wwid")
lab_step "wwid $wwid"
[[ $wwid == "naa.$DISK_WWN" ]] || lab_fail "wwid $wwid, expected naa.$DISK_WWN"

lab_step "mkfs.ext4 and files"
lab_files_create "$dev"
lab_step "remount and verify sha256"
lab_files_verify "$dev" "after remount"

lab_step "fio verify: randwrite and randrw, bs 512/4k/64k/1m, iodepth 1/16/64"
for rw in randwrite randrw; do
    for bs in 512 4k 64k 1m; do
        for qd in 1 16 64; do
            # Small enough for a TCG guest: about 60 s for the 24 jobs.
            case $bs in
            512) size=256 ;;
            4k) size=1024 ;;
            64k) size=8192 ;;
            *) size=16384 ;;
            esac
            ((qd == 1 && size < 16384)) && size=$((size / 2))
            size=${size}k
            lab_fio_verify "$dev" "$rw-$bs-qd$qd" "$rw" "$bs" "$qd" 256m "$size"
        done
    done
done

lab_step "logout"
iscsiadm "${node[@]}" --logout
lab_retry 30 bash -c "! test -e /sys/class/block/$name" || lab_fail "disk still present after logout"

lab_step "iSER re-login: data still there"
iscsiadm "${node[@]}" --login
dev=$(lab_iscsi_disk "$portal" "$TARGET_IQN" 0 60) || lab_fail "no disk after re-login"
lab_files_verify "$dev" "after re-login"
lab_fio_verify "$dev" "after-relogin" randrw 64k 16 300m 16m
iscsiadm "${node[@]}" --logout
lab_step "rtgt-iser done"
