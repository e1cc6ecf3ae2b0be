#!/bin/bash
# First boot of rtgt-power-cut: ext4 on the two disks the host cuts the power of, rtgtd serving
# six file LUNs on them; then the host writes until it kills this guest. Unflushed data stays in the
# guest's memory (no periodic writeback, long ext4 commit interval), as it may on any server.
set -euo pipefail

modprobe -q virtio_blk || true
lab_retry 30 test -b /dev/vdb || lab_fail "no /dev/vda and /dev/vdb"
sysctl -qw vm.dirty_writeback_centisecs=0 vm.dirty_expire_centisecs=360000 \
    vm.dirty_background_ratio=70 vm.dirty_ratio=80
for d in sync:vda other:vdb; do
    lab_step "ext4 on /dev/${d#*:} for the ${d%:*} LUNs"
    mkfs.ext4 -q -F "/dev/${d#*:}"
    mkdir -p "/mnt/luns/${d%:*}"
    mount -o commit=300 "/dev/${d#*:}" "/mnt/luns/${d%:*}"
done

lab_step "rtgtd with six file LUNs on them"
mkdir -p /run/rtgt
/lab/rtgtd --config /lab/rtgt.yaml --state-dir /run/rtgt >"$LAB_OUT/rtgtd.log" 2>&1 &
lab_retry 120 bash -c "exec 3<>/dev/tcp/$LAB_GUEST_IP/3260" 2>/dev/null || {
    cat "$LAB_OUT/rtgtd.log"
    lab_fail "rtgtd does not listen"
}
# rtgtd created the backing files and made them durable (file, length and directory entry)
# before serving them: no sync here, the cut tests that too.
lab_signal rtgtd-ready
lab_step "the host writes; waiting for the power cut"
lab_wait host-done 900 || true
# Only reached when the host ended without cutting the power.
lab_fail "the host did not cut the power (host status $(lab_host_status))"
