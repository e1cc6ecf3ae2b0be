#!/bin/bash
# Second boot of rtgt-power-cut, after the power cut: mount the disk (ext4 replays its journal),
# serve the same LUNs again for the host's check, then check the file system.
set -euo pipefail

modprobe -q virtio_blk || true
lab_retry 30 test -b /dev/vda || lab_fail "no /dev/vda"
lab_step "mount /dev/vda after the power cut"
mkdir -p /mnt/luns
mount /dev/vda /mnt/luns
dmesg | grep -E 'EXT4-fs \(vda\)' || true
ls -ls /mnt/luns

lab_step "rtgtd on the same configuration"
mkdir -p /run/rtgt
/lab/rtgtd --config /lab/rtgt.yaml --state-dir /run/rtgt >"$LAB_OUT/rtgtd-boot2.log" 2>&1 &
rtgtd_pid=$!
lab_retry 120 bash -c "exec 3<>/dev/tcp/$LAB_GUEST_IP/3260" 2>/dev/null || {
    cat "$LAB_OUT/rtgtd-boot2.log"
    lab_fail "rtgtd does not listen"
}
lab_signal rtgtd-ready-2
lab_step "the host checks the LUNs"
lab_wait host-done 600 || lab_fail "the host did not finish"
kill -TERM "$rtgtd_pid"
wait "$rtgtd_pid" || lab_fail "rtgtd exited with status $?"
umount /mnt/luns
lab_step "e2fsck after the power cut"
e2fsck -fn /dev/vda >"$LAB_OUT/e2fsck.txt" 2>&1 || { cat "$LAB_OUT/e2fsck.txt"; lab_fail "e2fsck found errors"; }
[[ $(lab_host_status) == 0 ]] || lab_fail "the host's check failed"
lab_step "rtgt-power-cut done"
