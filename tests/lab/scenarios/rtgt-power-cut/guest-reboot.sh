#!/bin/bash
# Second boot of rtgt-power-cut, after the power cut: mount the disks (ext4 replays the journals),
# serve the same LUNs again for the host's check, then check the file systems.
set -euo pipefail

modprobe -q virtio_blk || true
lab_retry 30 test -b /dev/vdb || lab_fail "no /dev/vda and /dev/vdb"
for d in sync:vda other:vdb; do
    lab_step "mount /dev/${d#*:} after the power cut"
    mkdir -p "/mnt/luns/${d%:*}"
    mount "/dev/${d#*:}" "/mnt/luns/${d%:*}"
done
dmesg | grep -E 'EXT4-fs \(vd' || true
ls -ls /mnt/luns/*

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
for d in sync:vda other:vdb; do
    umount "/mnt/luns/${d%:*}"
    lab_step "e2fsck /dev/${d#*:} after the power cut"
    e2fsck -fn "/dev/${d#*:}" >"$LAB_OUT/e2fsck-${d#*:}.txt" 2>&1 || {
        cat "$LAB_OUT/e2fsck-${d#*:}.txt"
        lab_fail "e2fsck found errors on /dev/${d#*:}"
    }
done
[[ $(lab_host_status) == 0 ]] || lab_fail "the host's check failed"
lab_step "rtgt-power-cut done"
