#!/bin/bash
# open-iscsi against rtgtd: discovery, CHAP login, size and WWN, ext4 with checksummed files
# across a remount, fio verify on the raw device, the path's target port group reported,
# set to standby (READ refused with the standby sense) and back with sg_stpg, logout, mutual CHAP re-login with the data
# still there, and rtgtd restarted twice (SIGTERM, kill -9) under the logged-in session.
set -euo pipefail
portal=$LAB_HOST_IP
node=(-m node -T "$TARGET_IQN" -p "$portal")

modprobe -a iscsi_tcp sd_mod ext4
echo "InitiatorName=$GUEST_IQN" >/etc/iscsi/initiatorname.iscsi
lab_step "starting iscsid"
iscsid
lab_step "discovery"
iscsiadm -m discovery -t sendtargets -p "$portal" | tee "$LAB_OUT/discovery.txt"
grep -q "$portal:3260,1 $TARGET_IQN" "$LAB_OUT/discovery.txt" || lab_fail "target not discovered"

set_auth() { iscsiadm "${node[@]}" --op update -n "$1" -v "$2"; }
set_auth node.session.auth.authmethod CHAP
set_auth node.session.auth.username "$CHAP_USER"
set_auth node.session.auth.password "$CHAP_SECRET"
# Quick recovery when the target restarts.
set_auth node.session.timeo.replacement_timeout 120
set_auth node.conn[0].timeo.noop_out_interval 5
set_auth node.conn[0].timeo.noop_out_timeout 10

lab_step "login with a wrong CHAP secret is refused"
set_auth node.session.auth.password "not-the-secret-0"
if iscsiadm "${node[@]}" --login >"$LAB_OUT/badlogin.txt" 2>&1; then
    lab_fail "login with a wrong CHAP secret succeeded"
fi
grep -qi 'authorization failure\|authentication failure\|24' "$LAB_OUT/badlogin.txt" ||
    { cat "$LAB_OUT/badlogin.txt"; lab_fail "unexpected error for a wrong secret"; }
set_auth node.session.auth.password "$CHAP_SECRET"

lab_step "login (CHAP)"
iscsiadm "${node[@]}" --login
dev=$(lab_iscsi_disk "$portal" "$TARGET_IQN" 0 60) || lab_fail "no disk for LUN 0"
name=${dev#/dev/}
bytes=$(($(cat "/sys/class/block/$name/size") * 512))
lab_step "disk $dev: $bytes bytes"
((bytes == DISK_BYTES)) || lab_fail "disk size $bytes, expected $DISK_BYTES"
wwid=$(cat "/sys/class/block/$name/device/wwid")
lab_step "wwid $wwid"
[[ $wwid == "naa.$DISK_WWN" ]] || lab_fail "wwid $wwid, expected naa.$DISK_WWN"

lab_step "mkfs.ext4 and files"
# The file system keeps to the first 200 MiB; fio verifies the space behind it.
lab_files_create "$dev"
lab_step "remount and verify sha256"
lab_files_verify "$dev" "after remount"

lab_step "fio verify: randwrite and randrw, bs 4k/64k/1m, iodepth 1/32"
for rw in randwrite randrw; do
    for bs in 4k 64k 1m; do
        for qd in 1 32; do
            size=8m
            [[ $bs == 1m ]] && size=32m
            lab_fio_verify "$dev" "$rw-$bs-qd$qd" "$rw" "$bs" "$qd" 256m "$size"
        done
    done
done

lab_step "fio verify on LUN 1 (tmpfs: reads sent from the file's pages), bs 64k/1m, iodepth 1/32"
dev1=$(lab_iscsi_disk "$portal" "$TARGET_IQN" 1 60) || lab_fail "no disk for LUN 1"
for rw in randrw write; do
    for bs in 64k 1m; do
        for qd in 1 32; do
            lab_fio_verify "$dev1" "lun1-$rw-$bs-qd$qd" "$rw" "$bs" "$qd" 0 32m
        done
    done
done

lab_step "ALUA: REPORT TARGET PORT GROUPS, SET TARGET PORT GROUPS to standby and back"
echo "device handler: $(cat "/sys/class/block/$name/device/dh_state" 2>/dev/null || echo none)"
read10=(28 00 00 00 00 00 00 00 01 00)
sg_rtpg --decode "$dev" | tee "$LAB_OUT/rtpg.txt"
grep -q 'target port group id : 0x1' "$LAB_OUT/rtpg.txt" || lab_fail "RTPG: no group 1"
grep -qi 'access state : 0x00' "$LAB_OUT/rtpg.txt" || lab_fail "RTPG: group 1 not active/optimized"
sg_stpg --standby "$dev" || lab_fail "SET TARGET PORT GROUPS (standby) failed"
if sg_raw -r 512 "$dev" "${read10[@]}" >"$LAB_OUT/standby-read.txt" 2>&1; then
    lab_fail "a READ on a standby path succeeded"
fi
cat "$LAB_OUT/standby-read.txt"
grep -qi 'standby' "$LAB_OUT/standby-read.txt" || lab_fail "no standby sense for a READ"
sg_stpg --optimized "$dev" || lab_fail "SET TARGET PORT GROUPS (active/optimized) failed"
sg_raw -r 512 "$dev" "${read10[@]}" >/dev/null 2>&1 || lab_fail "READ after returning to active/optimized"
sg_rtpg --decode "$dev" | tee "$LAB_OUT/rtpg-after.txt"
grep -qi 'access state : 0x00' "$LAB_OUT/rtpg-after.txt" || lab_fail "RTPG: not back to active/optimized"
grep -qi 'status code : 0x01' "$LAB_OUT/rtpg-after.txt" || lab_fail "RTPG: no 'altered by SET TARGET PORT GROUPS'"
lab_files_verify "$dev" "after standby and back"

lab_step "logout"
iscsiadm "${node[@]}" --logout
lab_retry 30 bash -c "! test -e /sys/class/block/$name" || lab_fail "disk still present after logout"

lab_step "login with mutual CHAP"
set_auth node.session.auth.username_in "$MUTUAL_USER"
set_auth node.session.auth.password_in "$MUTUAL_SECRET"
iscsiadm "${node[@]}" --login
dev=$(lab_iscsi_disk "$portal" "$TARGET_IQN" 0 60) || lab_fail "no disk after mutual CHAP login"
lab_files_verify "$dev" "after re-login"

lab_step "rtgtd stopped with SIGTERM and restarted"
lab_signal restart-term
lab_wait restarted-term 120 || lab_fail "host did not restart rtgtd"
lab_fio_verify "$dev" after-term randwrite 4k 16 300m 16m
lab_files_verify "$dev" "after SIGTERM restart"

lab_step "rtgtd killed with SIGKILL and restarted"
lab_signal restart-kill
lab_wait restarted-kill 120 || lab_fail "host did not restart rtgtd"
lab_fio_verify "$dev" after-kill randrw 64k 16 320m 16m
lab_files_verify "$dev" "after kill -9 restart"

lab_step "logout"
iscsiadm "${node[@]}" --logout
lab_step "rtgt-iscsi-tcp done"
