# shellcheck shell=bash
# Host side of rtgt-srp-live: rtgtd starts without SRP target ports; the API creates one (its
# RDMA/CM listener starts at once), adds LUN 1 while the guest writes through ib_srp, lists the
# SRP session and ends it (SRP_T_LOGOUT, then a disconnect).

DISK_WWN=6001405aabbccdd0011223344556677a
EXTRA_WWN=6001405aabbccdd0011223344556677b

api() { # METHOD PATH [JSON]
    local args=(-sS -f -X "$1" --unix-socket "$LAB_WORK/state/rtgtd.sock")
    [[ -n ${3:-} ]] && args+=(-H 'content-type: application/json' -d "$3")
    curl "${args[@]}" "http://rtgtd$2"
}

host_setup() {
    [[ -x ${RTGTD:-} ]] || lab_skip "RTGTD does not name the rtgtd binary"
    if ! command -v curl >/dev/null; then
        [[ -z ${CI:-} || ${CI:-} == false || ${CI:-} == 0 ]] || { echo "curl is required in CI"; return 1; }
        lab_skip "curl is not installed"
    fi
    mkdir -p "$LAB_WORK/state"
    cat >"$LAB_WORK/rtgt.yaml" <<YAML
backstores:
  - {name: disk, type: file, path: disk.img, size: 128MiB, wwn: $DISK_WWN}
  - {name: extra, type: file, path: extra.img, size: 32MiB, wwn: $EXTRA_WWN}
api: {listen: []}
YAML
    lab_start_daemon rtgtd "$RTGTD" --config "$LAB_WORK/rtgt.yaml" --state-dir "$LAB_WORK/state"
    local i
    for ((i = 0; i < 300; i++)); do
        api GET /api/v1/health >/dev/null 2>&1 && break
        sleep 0.1
    done
    api POST /api/v1/srp/ports \
        '{"name": "live", "listen": ["0.0.0.0:5555"], "allow_any_initiator": true, "luns": [{"lun": 0, "backstore": "disk"}]}' \
        >"$LAB_RESULTS/srp-port.json" || return 1
    local add
    add=$(lab_rtgtd_add_target rtgtd.log "$LAB_HOST_IP:5555" 30) || return 1
    lab_report "add_target: $add"
    lab_guest_export SRP_TARGET="$add" DISK_WWN="$DISK_WWN" EXTRA_WWN="$EXTRA_WWN" \
        EXTRA_BYTES=$((32 << 20))
}

host_run() {
    lab_wait reconfigure 300 || return 1
    api GET /api/v1/sessions >"$LAB_RESULTS/sessions-before.json" || return 1
    api GET /metrics >"$LAB_RESULTS/metrics.txt" || return 1
    api POST /api/v1/srp/ports/live/luns '{"lun": 1, "backstore": "extra"}' || return 1
    lab_signal reconfigured
    lab_wait logout 300 || return 1
    local id i
    id=$(grep -o '"id":"srp-[0-9]*"' "$LAB_RESULTS/sessions-before.json" | head -1 | cut -d'"' -f4)
    [[ -n $id ]] || { echo "no SRP session listed"; return 1; }
    api DELETE "/api/v1/sessions/$id" || return 1
    for ((i = 0; i < 300; i++)); do
        api GET /api/v1/sessions >"$LAB_RESULTS/sessions-after.json" || return 1
        grep -q "\"$id\"" "$LAB_RESULTS/sessions-after.json" || break
        sleep 0.1
    done
    lab_signal loggedout
}

host_check() {
    lab_daemon_alive rtgtd || { echo "rtgtd died"; return 1; }
    grep -q '"transport":"srp"' "$LAB_RESULTS/sessions-before.json" || { echo "no SRP session listed"; return 1; }
    local id
    id=$(grep -o '"id":"srp-[0-9]*"' "$LAB_RESULTS/sessions-before.json" | head -1 | cut -d'"' -f4)
    if grep -q "\"$id\"" "$LAB_RESULTS/sessions-after.json"; then
        echo "the SRP session outlived its DELETE"
        return 1
    fi
    grep -q 'rtgt_session_commands_total{.*transport="srp"' "$LAB_RESULTS/metrics.txt" ||
        { echo "no SRP session series in /metrics"; return 1; }
    if grep -E 'panicked|ERROR' "$LAB_RESULTS"/rtgtd*.log; then
        echo "rtgtd logged errors"
        return 1
    fi
}
