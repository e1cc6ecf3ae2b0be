# shellcheck shell=bash
# Host side of lio-verbs: once the guest's own run against LIO is done, rtgt-iscsi --iser (the
# host's soft-RoCE device) checks session reinstatement against LIO, as rtgt-verbs does
# against rtgtd.

LIO_IQN=iqn.2025-01.io.rtgt.lab:lio-verbs
# LIO's NAA designator: 6001405 and the first 25 hex digits of the unit serial.
LIO_SERIAL=aabbccdd001122334455667788
LIO_WWN=6001405aabbccdd00112233445566778

host_setup() {
    lab_rtgt_bin rtgt-iscsi || return 1
    lab_guest_export TARGET_IQN="$LIO_IQN" DISK_SERIAL="$LIO_SERIAL" DISK_WWN="$LIO_WWN" \
        DISK_BYTES=$((256 << 20))
}

host_run() {
    lab_wait target-ready 500 || return 1
    # shellcheck source=/dev/null
    source "$LAB_WORK/bin.env"
    timeout 60 "$BIN/rtgt-iscsi" --iser "$LAB_HOST_IP" --eth-mtu "$LAB_MTU" \
        reinstate --url "iscsi://$LAB_GUEST_IP:3260/$LIO_IQN/0" | tee "$LAB_RESULTS/reinstate.txt"
    grep -q '^reinstated:' "$LAB_RESULTS/reinstate.txt"
}
