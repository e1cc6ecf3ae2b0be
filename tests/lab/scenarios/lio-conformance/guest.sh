#!/bin/bash
# LIO as the reference iSCSI target inside the guest, configured through configfs: a 256 MiB
# fileio backstore on tmpfs exported as LUN 0 of one target, TPG 1 with a portal on eth0 and
# explicit ACLs for the two initiator names of iscsi-test-cu. The host runs the conformance suite
# against it (host_run); the guest waits until the host is done.
set -euo pipefail

IQN=$LIO_TARGET_IQN
TPG=/sys/kernel/config/target/iscsi/$IQN/tpgt_1

lab_step "loading LIO"
modprobe -a target_core_mod target_core_file iscsi_target_mod
# shellcheck source=../../lib/lio.sh
source "$LAB_SHARE/lib/lio.sh"

lab_step "configuring LIO through configfs"
# Thin provisioning (UNMAP, WRITE SAME with UNMAP) unless the host asks for a fully provisioned LU.
disk=$(lab_lio_fileio disk0 $((256 * 1024 * 1024)) rtgt-lab-disk0 "${LIO_THIN:-1}")
# shellcheck disable=SC2086
lab_lio_lun "$TPG" "$disk" $LIO_INITIATORS
mkdir -p "$TPG/np/$LAB_GUEST_IP:3260"
echo 0 >"$TPG/attrib/authentication"
echo 1 >"$TPG/enable"
lab_retry 10 bash -c "grep -q ':0CBC ' /proc/net/tcp" || lab_fail "LIO is not listening on 3260"
lab_step "LIO ready: $IQN on $LAB_GUEST_IP:3260"
find /sys/kernel/config/target/iscsi -maxdepth 6 | sed "s|/sys/kernel/config/target/||" >"$LAB_OUT/lio-configfs.txt"

lab_signal guest-ready
lab_wait host-done 3600 || lab_fail "the host did not finish"
lab_step "host finished (status $(lab_host_status))"
dmesg | grep -iE 'iscsi|target|TARGET_CORE' | tail -n 50 >"$LAB_OUT/lio-dmesg.txt" || true
