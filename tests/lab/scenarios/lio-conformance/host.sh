# shellcheck shell=bash
# Host side of lio-conformance: libiscsi's iscsi-test-cu against LIO in the guest, suite by suite.

LIO_IQN=iqn.2024-01.org.rtgt.lab:lio-disk
INI1=iqn.2024-01.org.rtgt.lab:conformance
INI2=iqn.2024-01.org.rtgt.lab:conformance-2

host_setup() {
    lab_guest_export LIO_TARGET_IQN="$LIO_IQN" LIO_INITIATORS="$INI1 $INI2" LIO_THIN="${LIO_THIN:-1}"
}

host_run() {
    lab_wait guest-ready 300 || return 1
    lab_wait_tcp "$LAB_GUEST_IP" 3260 30 || return 1
    "$LAB_DIR/lib/iscsi-conformance.sh" --label lio-conformance \
        --initiator "$INI1" --initiator2 "$INI2" \
        --timeout "${LIO_SUITE_TIMEOUT:-120}" --results "$LAB_RESULTS/conformance" \
        ${LIO_SUITES:+--suites "$LIO_SUITES"} \
        "iscsi://$LAB_GUEST_IP/$LIO_IQN/0" | tee "$LAB_WORK/conformance.out"
    local line
    line=$(grep -E '^lio-conformance: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$LAB_WORK/conformance.out") ||
        return 1
    lab_report "kernel target reference score, $line"
}
