#!/bin/bash
# LIO as the reference iSCSI target inside the guest, configured through configfs: a 256 MiB
# fileio backstore on tmpfs exported as LUN 0 of one target, TPG 1 with a portal on eth0 and
# explicit ACLs for the two initiator names of iscsi-test-cu. The host runs the conformance suite
# against it (host_run); the guest waits until the host is done.
set -euo pipefail

C=/sys/kernel/config/target
IQN=$LIO_TARGET_IQN
TPG=$C/iscsi/$IQN/tpgt_1

lab_step "loading LIO"
modprobe -a target_core_mod target_core_file iscsi_target_mod
mkdir -p /var/target/pr /var/target/alua
truncate -s 256M /dev/shm/lio-disk0.img

lab_step "configuring LIO through configfs"
mkdir -p "$C/core/fileio_0/disk0"
echo "fd_dev_name=/dev/shm/lio-disk0.img,fd_dev_size=$((256 * 1024 * 1024))" >"$C/core/fileio_0/disk0/control"
echo "rtgt-lab-disk0" >"$C/core/fileio_0/disk0/wwn/vpd_unit_serial"
echo 1 >"$C/core/fileio_0/disk0/enable"
# Thin provisioning (UNMAP, WRITE SAME with UNMAP) unless the host asks for a fully provisioned LU.
if [[ ${LIO_THIN:-1} == 1 ]]; then
    echo 1 >"$C/core/fileio_0/disk0/attrib/emulate_tpu"
    echo 1 >"$C/core/fileio_0/disk0/attrib/emulate_tpws"
fi
mkdir -p "$TPG/lun/lun_0"
ln -s "$C/core/fileio_0/disk0" "$TPG/lun/lun_0/disk0"
mkdir -p "$TPG/np/$LAB_GUEST_IP:3260"
for ini in $LIO_INITIATORS; do
    mkdir -p "$TPG/acls/$ini/lun_0"
    ln -s "$TPG/lun/lun_0" "$TPG/acls/$ini/lun_0/lun0"
done
echo 0 >"$TPG/attrib/authentication"
echo 1 >"$TPG/enable"
lab_retry 10 bash -c "grep -q ':0CBC ' /proc/net/tcp" || lab_fail "LIO is not listening on 3260"
lab_step "LIO ready: $IQN on $LAB_GUEST_IP:3260"
find "$C/iscsi" -maxdepth 6 | sed "s|$C/||" >"$LAB_OUT/lio-configfs.txt"

lab_signal guest-ready
lab_wait host-done 3600 || lab_fail "the host did not finish"
lab_step "host finished (status $(lab_host_status))"
dmesg | grep -iE 'iscsi|target|TARGET_CORE' | tail -n 50 >"$LAB_OUT/lio-dmesg.txt" || true
