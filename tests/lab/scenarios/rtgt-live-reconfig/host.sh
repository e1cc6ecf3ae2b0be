# shellcheck shell=bash
# Host side of rtgt-live-reconfig: rtgtd with LUN 0 and ACLs for two initiator names of the
# guest; on the guest's request, while it writes, the API adds LUN 1, removes the second
# initiator's ACL and grows LUN 0. At the end rtgtd restarts and must serve the changed
# configuration.

RTGT_IQN=iqn.2025-01.io.rtgt.lab:live
GUEST_IQN=iqn.2025-01.io.rtgt.lab:guest
OTHER_IQN=iqn.2025-01.io.rtgt.lab:other

api() { # METHOD PATH [JSON]
    local args=(-sS -f -X "$1" --unix-socket "$LAB_WORK/state/rtgtd.sock")
    [[ -n ${3:-} ]] && args+=(-H 'content-type: application/json' -d "$3")
    curl "${args[@]}" "http://rtgtd$2"
}

start_rtgtd() {
    lab_start_daemon "$1" "$RTGTD" --config "$LAB_WORK/rtgt.yaml" --state-dir "$LAB_WORK/state"
    lab_wait_tcp "$LAB_HOST_IP" 3260 30
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
  - {name: disk, type: file, path: disk.img, size: 256MiB}
  - {name: extra, type: file, path: extra.img, size: 64MiB}
targets:
  - name: $RTGT_IQN
    portal_groups:
      - tag: 1
        portals: ['$LAB_HOST_IP:3260']
        luns: [{lun: 0, backstore: disk}]
        acls:
          - initiator: $GUEST_IQN
          - initiator: $OTHER_IQN
            mapped_luns: [{lun: 7, tpg_lun: 0}]
api: {listen: []}
YAML
    cp "$LAB_WORK/rtgt.yaml" "$LAB_RESULTS/rtgt-initial.yaml"
    start_rtgtd rtgtd
    lab_guest_export TARGET_IQN="$RTGT_IQN" GUEST_IQN="$GUEST_IQN" OTHER_IQN="$OTHER_IQN" \
        DISK_BYTES=$((256 << 20)) GROWN_BYTES=$((512 << 20)) EXTRA_BYTES=$((64 << 20))
}

host_run() {
    lab_wait reconfigure 300 || return 1
    local tpg="/api/v1/targets/$RTGT_IQN/tpgs/1"
    api GET /api/v1/sessions >"$LAB_RESULTS/sessions-before.json" || return 1
    api POST "$tpg/luns" '{"lun": 1, "backstore": "extra"}' || return 1
    api DELETE "$tpg/acls/$OTHER_IQN" || return 1
    api PUT /api/v1/backstores/disk '{"name": "disk", "type": "file", "path": "disk.img", "size": "512MiB"}' ||
        return 1
    lab_signal reconfigured
    # The target ends the second initiator's session (and only that one).
    local i
    for ((i = 0; i < 300; i++)); do
        api GET /api/v1/sessions >"$LAB_RESULTS/sessions-after.json" || return 1
        grep -q "$OTHER_IQN" "$LAB_RESULTS/sessions-after.json" || break
        sleep 0.1
    done
    grep -q "$GUEST_IQN" "$LAB_RESULTS/sessions-after.json" || { echo "the guest's session ended"; return 1; }

    # Restart on the saved configuration.
    lab_wait restart 300 || return 1
    lab_stop_daemon rtgtd 30
    cp "$LAB_WORK/rtgt.yaml" "$LAB_RESULTS/rtgt-saved.yaml"
    start_rtgtd rtgtd-2 || return 1
    lab_signal restarted
}

host_check() {
    lab_daemon_alive rtgtd-2 || { echo "rtgtd died"; return 1; }
    grep -q 'backstore: extra' "$LAB_RESULTS/rtgt-saved.yaml" || { echo "LUN 1 not saved"; return 1; }
    grep -q 'size: 512MiB' "$LAB_RESULTS/rtgt-saved.yaml" || { echo "new size not saved"; return 1; }
    if grep -q "$OTHER_IQN" "$LAB_RESULTS/sessions-after.json"; then
        echo "the other initiator's session outlived its ACL"
        return 1
    fi
    grep -q "$OTHER_IQN" "$LAB_RESULTS/sessions-before.json" || { echo "no second session"; return 1; }
    api GET /metrics >"$LAB_RESULTS/metrics.txt" || return 1
    if grep -E 'panicked|ERROR' "$LAB_RESULTS"/rtgtd*.log; then
        echo "rtgtd logged errors"
        return 1
    fi
}
