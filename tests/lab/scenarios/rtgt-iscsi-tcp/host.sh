# shellcheck shell=bash
# Host side of rtgt-iscsi-tcp: rtgtd in the namespace with one CHAP-protected target; restarted
# on the guest's request (SIGTERM, then kill -9) while the guest is logged in.

RTGT_IQN=iqn.2025-01.io.rtgt.lab:disk
GUEST_IQN=iqn.2025-01.io.rtgt.lab:guest
CHAP_USER=labhost
CHAP_SECRET=lab-host-secret-1
MUTUAL_USER=labtarget
MUTUAL_SECRET=lab-target-secret-2

start_rtgtd() {
    lab_start_daemon "$1" "$RTGTD" --config "$LAB_WORK/rtgt.yaml" --state-dir "$LAB_WORK/state"
    lab_wait_tcp "$LAB_HOST_IP" 3260 30
}

host_setup() {
    [[ -x ${RTGTD:-} ]] || lab_skip "RTGTD does not name the rtgtd binary"
    # LUN 1 lives on tmpfs, where large reads go out straight from the file's pages.
    SHM_DIR=$(mktemp -d /dev/shm/rtgt-lab.XXXXXX)
    echo "$SHM_DIR" >"$LAB_WORK/shm-dir"
    cat >"$LAB_WORK/rtgt.yaml" <<YAML
backstores:
  - {name: disk, type: file, path: disk.img, size: 512MiB, block_size: 512,
     serial: rtgtlab0001, wwn: 6001405aabbccdd00112233445566778}
  - {name: ram, type: file, path: $SHM_DIR/lun1.img, size: 128MiB, block_size: 512}
targets:
  - name: $RTGT_IQN
    portal_groups:
      - tag: 1
        portals: ['$LAB_HOST_IP:3260']
        auth:
          chap: {user: $CHAP_USER, secret: $CHAP_SECRET}
          mutual_chap: {user: $MUTUAL_USER, secret: $MUTUAL_SECRET}
        luns: [{lun: 0, backstore: disk}, {lun: 1, backstore: ram}]
        acls:
          - initiator: $GUEST_IQN
policy: {backstore_roots: ['$SHM_DIR']}
YAML
    cp "$LAB_WORK/rtgt.yaml" "$LAB_RESULTS/rtgt.yaml"
    start_rtgtd rtgtd
    lab_guest_export TARGET_IQN="$RTGT_IQN" GUEST_IQN="$GUEST_IQN" \
        CHAP_USER="$CHAP_USER" CHAP_SECRET="$CHAP_SECRET" \
        MUTUAL_USER="$MUTUAL_USER" MUTUAL_SECRET="$MUTUAL_SECRET" \
        DISK_BYTES=$((512 << 20)) DISK_WWN=6001405aabbccdd00112233445566778
}

host_run() {
    # Graceful restart: SIGTERM must end rtgtd with status 0 while a session is logged in.
    lab_wait restart-term 600 || return 1
    local pid status
    pid=$(awk '$2 == "rtgtd" { p = $1 } END { print p }' "$LAB_WORK/daemons")
    kill -TERM "$pid"
    status=$(lab_daemon_status rtgtd 30) || {
        echo "rtgtd did not stop within 30 s of SIGTERM"
        return 1
    }
    lab_report "rtgtd exit status after SIGTERM: $status"
    ((status == 0)) || return 1
    start_rtgtd rtgtd-2 || return 1
    lab_signal restarted-term

    # Crash: kill -9 and start again on the same state.
    lab_wait restart-kill 600 || return 1
    pid=$(awk '$2 == "rtgtd-2" { p = $1 } END { print p }' "$LAB_WORK/daemons")
    kill -KILL "$pid"
    sleep 1
    start_rtgtd rtgtd-3 || return 1
    lab_signal restarted-kill
}

host_check() {
    lab_daemon_alive rtgtd-3 || { echo "rtgtd died"; return 1; }
    if grep -E 'panicked|ERROR' "$LAB_RESULTS"/rtgtd*.log; then
        echo "rtgtd logged errors"
        return 1
    fi
}

host_teardown() {
    [[ -f $LAB_WORK/shm-dir ]] && rm -rf "$(cat "$LAB_WORK/shm-dir")"
    return 0
}
