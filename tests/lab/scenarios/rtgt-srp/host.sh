# shellcheck shell=bash
# Host side of rtgt-srp: rtgtd in the namespace with one SRP target port on every address,
# port 5555; the guest gets the add_target string rtgtd logged for the tap address.

SRP_WWN=6001405aabbccdd00112233445566779

host_setup() {
    [[ -x ${RTGTD:-} ]] || lab_skip "RTGTD does not name the rtgtd binary"
    cat >"$LAB_WORK/rtgt.yaml" <<YAML
backstores:
  - {name: disk, type: file, path: disk.img, size: 256MiB, block_size: 512,
     serial: rtgtsrp0001, wwn: $SRP_WWN}
srp:
  - name: lab
    listen: ['0.0.0.0:5555']
    allow_any_initiator: true
    luns: [{lun: 0, backstore: disk}]
YAML
    cp "$LAB_WORK/rtgt.yaml" "$LAB_RESULTS/rtgt.yaml"
    lab_start_daemon rtgtd "$RTGTD" --config "$LAB_WORK/rtgt.yaml" --state-dir "$LAB_WORK/state"
    local add
    add=$(lab_rtgtd_add_target rtgtd.log "$LAB_HOST_IP:5555" 30) || return 1
    lab_report "add_target: $add"
    lab_guest_export SRP_TARGET="$add" DISK_BYTES=$((256 << 20)) DISK_WWN="$SRP_WWN"
}

host_check() {
    lab_daemon_alive rtgtd || { echo "rtgtd died"; return 1; }
    if grep -E 'panicked|ERROR' "$LAB_RESULTS"/rtgtd*.log; then
        echo "rtgtd logged errors"
        return 1
    fi
}
