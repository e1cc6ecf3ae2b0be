# shellcheck shell=bash
# Host side of rtgt-srp-faults: rtgtd with one SRP target port, restarted on the guest's
# request while fio runs (SIGTERM, then kill -9).

SRP_WWN=6001405aabbccdd0011223344556677a

start_rtgtd() {
    lab_start_daemon "$1" "$RTGTD" --config "$LAB_WORK/rtgt.yaml" --state-dir "$LAB_WORK/state"
    lab_rtgtd_add_target "$1.log" "$LAB_HOST_IP:5555" 30 >/dev/null
}

host_setup() {
    [[ -x ${RTGTD:-} ]] || lab_skip "RTGTD does not name the rtgtd binary"
    cat >"$LAB_WORK/rtgt.yaml" <<YAML
backstores:
  - {name: disk, type: file, path: disk.img, size: 128MiB, block_size: 512, wwn: $SRP_WWN}
srp:
  - name: lab
    listen: ['$LAB_HOST_IP:5555']
    allow_any_initiator: true
    luns: [{lun: 0, backstore: disk}]
YAML
    cp "$LAB_WORK/rtgt.yaml" "$LAB_RESULTS/rtgt.yaml"
    local add
    start_rtgtd rtgtd || return 1
    add=$(lab_rtgtd_add_target rtgtd.log "$LAB_HOST_IP:5555" 30) || return 1
    lab_guest_export SRP_TARGET="$add" DISK_WWN="$SRP_WWN"
}

restart() { # SIGNAL OLD NEW
    local pid status
    pid=$(awk -v n="$2" '$2 == n { p = $1 } END { print p }' "$LAB_WORK/daemons")
    kill "-$1" "$pid"
    if [[ $1 == TERM ]]; then
        status=$(lab_daemon_status "$2" 30) || {
            echo "rtgtd did not stop within 30 s of SIGTERM"
            return 1
        }
        lab_report "rtgtd exit status after SIGTERM: $status"
        ((status == 0)) || return 1
    else
        lab_daemon_status "$2" 10 >/dev/null || return 1
    fi
    start_rtgtd "$3"
}

host_run() {
    lab_wait restart-term 300 || return 1
    restart TERM rtgtd rtgtd-2 || return 1
    lab_signal restarted-term
    lab_wait restart-kill 300 || return 1
    restart KILL rtgtd-2 rtgtd-3 || return 1
    lab_signal restarted-kill
}

host_check() {
    lab_daemon_alive rtgtd-3 || { echo "rtgtd died"; return 1; }
    if grep -E 'panicked|ERROR' "$LAB_RESULTS"/rtgtd*.log; then
        echo "rtgtd logged errors"
        return 1
    fi
    grep -q 'SRP login rejected' "$LAB_RESULTS"/rtgtd-3.log || {
        echo "rtgtd did not log the rejected login"
        return 1
    }
}
