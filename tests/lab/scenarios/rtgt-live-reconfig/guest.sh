#!/bin/bash
# open-iscsi against rtgtd reconfigured live: two sessions (two initiator names through two
# ifaces), fio verify running on LUN 0 while the host adds LUN 1, removes the second
# initiator's ACL and grows LUN 0; the writes never fail, only the second session ends, a
# rescan shows LUN 1 and the new size, and all of it is still there after rtgtd restarts.
set -euo pipefail
portal=$LAB_HOST_IP
node=(-m node -T "$TARGET_IQN" -p "$portal")

modprobe -a iscsi_tcp sd_mod
echo "InitiatorName=$GUEST_IQN" >/etc/iscsi/initiatorname.iscsi
lab_step "starting iscsid"
iscsid
iscsiadm -m discovery -t sendtargets -p "$portal" >"$LAB_OUT/discovery.txt"
iscsiadm "${node[@]}" --op update -n node.session.timeo.replacement_timeout -v 120
iscsiadm "${node[@]}" --op update -n 'node.conn[0].timeo.noop_out_interval' -v 5
iscsiadm "${node[@]}" --op update -n 'node.conn[0].timeo.noop_out_timeout' -v 10

lab_step "login as $GUEST_IQN"
iscsiadm "${node[@]}" --login
dev=$(lab_iscsi_disk "$portal" "$TARGET_IQN" 0 60) || lab_fail "no disk for LUN 0"
name=${dev#/dev/}
(($(cat "/sys/class/block/$name/size") * 512 == DISK_BYTES)) || lab_fail "LUN 0 has the wrong size"

lab_step "second session as $OTHER_IQN (iface other)"
iscsiadm -m iface -I other --op new >/dev/null
iscsiadm -m iface -I other --op update -n iface.initiatorname -v "$OTHER_IQN" >/dev/null
iscsiadm -m discovery -t sendtargets -p "$portal" -I other >/dev/null
iscsiadm -m node -T "$TARGET_IQN" -p "$portal" -I other --login
lab_iscsi_disk "$portal" "$TARGET_IQN" 7 60 >/dev/null || lab_fail "no disk for the second session"
(($(iscsiadm -m session | wc -l) == 2)) || lab_fail "expected two sessions"

lab_step "fio verify on LUN 0 while the host reconfigures"
# Rounds of write-then-verify in the first 200 MiB until the host is done, then one more.
: >"$LAB_OUT/fio-rounds.txt"
(
    round=0
    while :; do
        round=$((round + 1))
        out="$LAB_OUT/fio-$round.txt"
        fio --name="round$round" --filename="$dev" --rw=randwrite --bs=16k --iodepth=16 \
            --offset=$(((round % 8) * 16))m --size=24m --verify=crc32c --verify_fatal=1 \
            --ioengine=libaio --direct=1 --eta=never --output="$out" || { echo "FAIL $round" >>"$LAB_OUT/fio-rounds.txt"; exit 1; }
        grep -q 'err= 0' "$out" || { echo "FAIL $round" >>"$LAB_OUT/fio-rounds.txt"; exit 1; }
        echo "ok $round" >>"$LAB_OUT/fio-rounds.txt"
        if [[ -e /tmp/stop ]]; then
            exit 0
        fi
    done
) &
fio_pid=$!
lab_retry 120 grep -q '^ok 1' "$LAB_OUT/fio-rounds.txt" || lab_fail "fio did not start"
lab_signal reconfigure
lab_wait reconfigured 300 || lab_fail "the host did not reconfigure"
touch /tmp/stop
wait "$fio_pid" || { cat "$LAB_OUT/fio-rounds.txt"; lab_fail "I/O failed during the live changes"; }
lab_step "fio rounds: $(grep -c '^ok' "$LAB_OUT/fio-rounds.txt"), none failed"

lab_step "the second initiator can no longer log in"
# The target ended its session; iscsid may still hold it in recovery: log it out here.
iscsiadm -m node -T "$TARGET_IQN" -p "$portal" -I other --logout >/dev/null 2>&1 || true
if iscsiadm -m node -T "$TARGET_IQN" -p "$portal" -I other --login >"$LAB_OUT/other-login.txt" 2>&1; then
    lab_fail "the initiator whose ACL was removed logged in again"
fi
iscsiadm -m node -T "$TARGET_IQN" -p "$portal" -I other --op delete >/dev/null 2>&1 || true
iscsiadm -m iface -I other --op delete >/dev/null 2>&1 || true
iscsiadm -m session -P 1 | grep -q "$GUEST_IQN" || lab_fail "the first session is gone"

lab_step "rescan: LUN 1 and the new size of LUN 0"
dmesg >"$LAB_OUT/dmesg-before-rescan.txt"
iscsiadm -m session -R
dev1=$(lab_iscsi_disk "$portal" "$TARGET_IQN" 1 60) || lab_fail "LUN 1 did not appear"
(($(cat "/sys/class/block/${dev1#/dev/}/size") * 512 == EXTRA_BYTES)) || lab_fail "LUN 1 has the wrong size"
echo 1 >"/sys/class/block/$name/device/rescan"
lab_retry 30 bash -c "(( \$(cat /sys/class/block/$name/size) * 512 == $GROWN_BYTES ))" ||
    lab_fail "LUN 0 is $(($(cat "/sys/class/block/$name/size") * 512)) bytes, expected $GROWN_BYTES"
fio --name=grown --filename="$dev" --rw=write --bs=64k --offset=400m --size=16m --verify=crc32c \
    --verify_fatal=1 --ioengine=libaio --direct=1 --eta=never --output="$LAB_OUT/fio-grown.txt" ||
    lab_fail "I/O beyond the old end failed"

lab_step "rtgtd restarts on the saved configuration"
lab_signal restart
lab_wait restarted 300 || lab_fail "the host did not restart rtgtd"
fio --name=after --filename="$dev" --rw=randwrite --bs=16k --iodepth=8 --offset=400m --size=16m \
    --verify=crc32c --verify_fatal=1 --ioengine=libaio --direct=1 --eta=never \
    --output="$LAB_OUT/fio-after.txt" || lab_fail "I/O after the restart failed"
(($(cat "/sys/class/block/$name/size") * 512 == GROWN_BYTES)) || lab_fail "LUN 0 size lost"
test -b "$dev1" || lab_fail "LUN 1 lost"
iscsiadm "${node[@]}" --logout
lab_step "rtgt-live-reconfig done"
