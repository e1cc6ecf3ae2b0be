#!/bin/bash
# dm-multipath (ALUA) over two rtgtd gateways that export one Ceph RBD image as one LUN, over
# iSCSI/TCP. ext4 with files on the map, then fio randwrite verify (QD16) on a file in it
# while the gateway of the active/optimized group is killed with -9: the I/O moves to the other
# gateway, which the guest's SET TARGET PORT GROUPS makes active/optimized for both gateways
# (and which takes the image's exclusive lock over from the dead one); the killed gateway is
# started again and comes back with the shared states (the guest may then move the group with
# its requests through both paths; the writes and the lock follow whichever wins), until a
# failback through its own API moves the I/O back. No I/O error may reach fio, its verification must
# pass, fsck must find the file system clean and the files intact. Then persistent
# reservations: a key registered and a reservation made through one gateway are reported
# through the other, and a second initiator (its own iSCSI interface and name) on the second
# gateway preempts the first with PREEMPT AND ABORT, after which the first initiator's writes
# conflict through both gateways while its reads still work. Between the two, a failover
# through the API of rtgtd-b and a failback through that of rtgtd-a under fio (the gateways
# share the groups' states): the image's exclusive lock (rtgtd's metric) follows the writes
# to the active/optimized gateway and back.
set -euo pipefail
p1=$LAB_HOST_IP p2=$IP2
map=/dev/mapper/3$WWN

modprobe -a iscsi_tcp sd_mod scsi_dh_alua dm_multipath dm_round_robin
echo "InitiatorName=$GUEST_IQN" >/etc/iscsi/initiatorname.iscsi
lab_multipath_start

lab_step "login through both gateways"
lab_mpath_login "$p1" "$TARGET_IQN"
lab_mpath_login "$p2" "$TARGET_IQN"
d1=$(lab_iscsi_disk "$p1" "$TARGET_IQN" 0 60) || lab_fail "no disk through $p1"
d2=$(lab_iscsi_disk "$p2" "$TARGET_IQN" 0 60) || lab_fail "no disk through $p2"
d1=${d1#/dev/} d2=${d2#/dev/}
lab_mpath_ready "$map" "$d1" "$d2" "$LAB_OUT/multipath-start.txt"
[[ $(blockdev --getsize64 "$map") == $((256 << 20)) ]] || lab_fail "the map is not the image's 256 MiB"

lab_step "ext4 on the map, files, fio verify in it while rtgtd-a is killed with -9 and restarted"
lab_files_create "$map" 192M
mount "$map" /mnt/disk
lab_fio_start rbd-kill /mnt/disk/fio.dat 150 0 48m
lab_signal kill-a
lab_path_is "$d1" failed - - 90
# scsi_dh_alua activates the path through rtgtd-b with SET TARGET PORT GROUPS: group 2 is
# active/optimized for both gateways from now on.
lab_path_is "$d2" active ready 50 90
lab_writes_grow "$d2" "while rtgtd-a is down"
lab_signal restart-a
lab_wait a-restarted 120 || lab_fail "rtgtd-a did not restart"
# rtgtd-a returns with the shared states, not its configuration's. When its path returns,
# scsi_dh_alua may activate both paths, each asking for its own group with SET TARGET PORT
# GROUPS; the last request wins. Wait until they settle (one path optimized, the other not):
# the writes go through the optimized one (and the host checks that the lock is there).
prio() { lab_path "$1" | awk '{ print $3 }'; }
settled() {
    case "$(prio "$d1") $(prio "$d2")" in
    "50 10" | "10 50") return 0 ;;
    esac
    return 1
}
lab_retry 180 settled || lab_fail "the paths did not settle: $d1 '$(lab_path "$d1")', $d2 '$(lab_path "$d2")'"
lab_step "after rtgtd-a returned: $d1 '$(lab_path "$d1")', $d2 '$(lab_path "$d2")'"
ao=$d2
[[ $(prio "$d1") == 50 ]] && ao=$d1
lab_writes_grow "$ao" "after rtgtd-a returned"
lab_signal failback-a
lab_wait failed-back-a 120 || lab_fail "no failback through rtgtd-a's API"
lab_path_is "$d1" active ready 50 60
lab_path_is "$d2" active ready 10 60
lab_writes_grow "$d1" "after the failback"
lab_fio_end
umount /mnt/disk
fsck.ext4 -fn "$map" >"$LAB_OUT/fsck.txt" 2>&1 || { cat "$LAB_OUT/fsck.txt"; lab_fail "fsck found errors"; }
lab_files_verify "$map" "after the kill -9"
multipath -ll "$map" | tee "$LAB_OUT/multipath-after-kill.txt"

lab_step "failover through one gateway's API, failback through the other's, under fio; the lock follows"
mount "$map" /mnt/disk
lab_fio_start rbd-failover /mnt/disk/fio2.dat 75 0 32m
lab_signal lock-a
lab_wait lock-a-ok 60 || lab_fail "rtgtd-a does not hold the image's lock while it takes the writes"
lab_signal failover
lab_wait failed-over 120 || lab_fail "the gateways did not fail over"
lab_path_is "$d1" - ghost 1
lab_path_is "$d2" active ready 50
lab_writes_grow "$d2" "after the failover"
lab_signal lock-b
lab_wait lock-b-ok 60 || lab_fail "the lock did not follow the writes to rtgtd-b"
lab_signal failback
lab_wait failed-back 120 || lab_fail "the gateways did not fail back"
lab_path_is "$d1" active ready 50
lab_path_is "$d2" active ready 10
lab_writes_grow "$d1" "after the failback"
lab_signal lock-back
lab_wait lock-back-ok 60 || lab_fail "the lock did not come back to rtgtd-a"
lab_fio_end
umount /mnt/disk
multipath -ll "$map" | tee "$LAB_OUT/multipath-after-failback.txt"

# pr ARGS...: sg_persist, once more after a unit attention (a preempted nexus gets one).
pr() { sg_persist "$@" || sg_persist "$@"; }

# write_blocks DEV: one 4 KiB direct write at 200 MiB (behind the files).
write_blocks() { dd if=/dev/urandom of="$1" bs=4k count=1 seek=51200 oflag=direct status=none 2>/dev/null; }
read_blocks() { dd if="$1" of=/dev/null bs=4k count=1 skip=51200 iflag=direct status=none; }

lab_step "reservations: register and reserve through rtgtd-a, read through rtgtd-b"
pr --out --register --param-sark=0xabc1 "/dev/$d1" >/dev/null || lab_fail "PR register through $d1 failed"
pr --in --read-keys "/dev/$d2" | tee "$LAB_OUT/keys-b.txt"
grep -q 0xabc1 "$LAB_OUT/keys-b.txt" || lab_fail "a key registered through rtgtd-a is not reported by rtgtd-b"
pr --out --register --param-sark=0xabc1 "/dev/$d2" >/dev/null || lab_fail "PR register through $d2 failed"
# Write Exclusive, Registrants Only: both of this initiator's nexuses write.
pr --out --reserve --param-rk=0xabc1 --prout-type=5 "/dev/$d1" >/dev/null || lab_fail "PR reserve through $d1 failed"
pr --in --read-reservation "/dev/$d2" | tee "$LAB_OUT/reservation-b.txt"
grep -q 'Key=0xabc1' "$LAB_OUT/reservation-b.txt" || lab_fail "rtgtd-b does not report the reservation"
grep -qi 'registrants only' "$LAB_OUT/reservation-b.txt" || lab_fail "rtgtd-b reports the wrong reservation type"
write_blocks "/dev/$d1" || lab_fail "a registrant's write through rtgtd-a failed"
write_blocks "/dev/$d2" || lab_fail "a registrant's write through rtgtd-b failed"

lab_step "a second initiator on rtgtd-b preempts the first"
iscsiadm -m iface -I guest2 --op new >/dev/null
iscsiadm -m iface -I guest2 --op update -n iface.initiatorname -v "$GUEST2_IQN" >/dev/null
iscsiadm -m discovery -t sendtargets -p "$p2" -I guest2 >>"$LAB_OUT/discovery.txt"
iscsiadm -m node -T "$TARGET_IQN" -p "$p2" -I guest2 --login
# The second initiator's disk: the one under its session.
guest2_disk() {
    local s d
    for s in /sys/class/iscsi_session/session*; do
        [[ $(cat "$s/initiatorname" 2>/dev/null) == "$GUEST2_IQN" ]] || continue
        d=$(compgen -G "$s/device/target*/*:*/block/*") || return 1
        echo "${d##*/}"
        return 0
    done
    return 1
}
lab_retry 60 guest2_disk >/dev/null || lab_fail "no disk for the second initiator"
e=$(guest2_disk)
udevadm settle --timeout=30 || true
pr --in --read-keys "/dev/$e" | tee "$LAB_OUT/keys-guest2.txt"
grep -q 0xabc1 "$LAB_OUT/keys-guest2.txt" || lab_fail "the second initiator does not see the first one's key"
if write_blocks "/dev/$e"; then lab_fail "an unregistered initiator wrote under Write Exclusive, Registrants Only"; fi
read_blocks "/dev/$e" || lab_fail "an unregistered initiator cannot read under Write Exclusive, Registrants Only"
pr --out --register --param-sark=0xbbb2 "/dev/$e" >/dev/null || lab_fail "PR register of the second initiator failed"
pr --out --preempt-abort --param-rk=0xbbb2 --param-sark=0xabc1 --prout-type=5 "/dev/$e" >/dev/null ||
    lab_fail "PREEMPT AND ABORT failed"
for d in "$d1" "$d2"; do
    if write_blocks "/dev/$d"; then lab_fail "the preempted initiator still writes through $d"; fi
    read_blocks "/dev/$d" || lab_fail "the preempted initiator cannot read through $d"
done
pr --in --read-keys "/dev/$d1" | tee "$LAB_OUT/keys-after-preempt.txt"
grep -q 0xbbb2 "$LAB_OUT/keys-after-preempt.txt" || lab_fail "rtgtd-a does not report the new key"
if grep -q 0xabc1 "$LAB_OUT/keys-after-preempt.txt"; then lab_fail "the preempted key is still registered"; fi
pr --in --read-reservation "/dev/$d1" | tee "$LAB_OUT/reservation-after-preempt.txt"
grep -q 'Key=0xbbb2' "$LAB_OUT/reservation-after-preempt.txt" || lab_fail "rtgtd-a does not report the new holder"
write_blocks "/dev/$e" || lab_fail "the new holder cannot write"
pr --out --clear --param-rk=0xbbb2 "/dev/$e" >/dev/null || lab_fail "PR clear failed"
write_blocks "/dev/$d1" || lab_fail "a write through rtgtd-a fails after the reservation was cleared"

lab_step "logout"
iscsiadm -m node -T "$TARGET_IQN" -p "$p2" -I guest2 --logout
udevadm settle --timeout=30 || true
lab_retry 30 multipath -F || lab_fail "cannot flush the map"
iscsiadm -m node -u
