# shellcheck shell=bash
# Host side of rtgt-iser: rtgtd in the namespace serving one CHAP-protected target on the tap
# address over TCP and, through its soft-RoCE device (UDP 4791 on the same address), iSER.

RTGT_IQN=iqn.2025-01.io.rtgt.lab:iser
GUEST_IQN=iqn.2025-01.io.rtgt.lab:guest
CHAP_USER=labhost
CHAP_SECRET=lab-host-secret-1

host_setup() {
    [[ -x ${RTGTD:-} ]] || lab_skip "RTGTD does not name the rtgtd binary"
    cat >"$LAB_WORK/rtgt.yaml" <<YAML
backstores:
  - {name: disk, type: file, path: disk.img, size: 512MiB, block_size: 512,
     serial: rtgtiser001, wwn: 6001405aabbccdd0011223344556677a}
targets:
  - name: $RTGT_IQN
    portal_groups:
      - tag: 1
        portals: ['$LAB_HOST_IP:3260']
        auth:
          chap: {user: $CHAP_USER, secret: $CHAP_SECRET}
        luns: [{lun: 0, backstore: disk}]
        acls:
          - initiator: $GUEST_IQN
rdma:
  addresses: [$LAB_HOST_IP]
  eth_mtu: $LAB_MTU
YAML
    cp "$LAB_WORK/rtgt.yaml" "$LAB_RESULTS/rtgt.yaml"
    lab_start_daemon rtgtd "$RTGTD" --config "$LAB_WORK/rtgt.yaml" --state-dir "$LAB_WORK/state"
    lab_wait_tcp "$LAB_HOST_IP" 3260 30
    grep -q 'iSER portal listening' "$LAB_RESULTS/rtgtd.log" || {
        cat "$LAB_RESULTS/rtgtd.log"
        lab_skip "rtgtd serves no iSER (RDMA device unavailable)"
    }
    lab_guest_export TARGET_IQN="$RTGT_IQN" GUEST_IQN="$GUEST_IQN" \
        CHAP_USER="$CHAP_USER" CHAP_SECRET="$CHAP_SECRET" \
        DISK_BYTES=$((512 << 20)) DISK_WWN=6001405aabbccdd0011223344556677a
}

host_check() {
    lab_daemon_alive rtgtd || { echo "rtgtd died"; return 1; }
    if grep -E 'panicked|ERROR' "$LAB_RESULTS"/rtgtd*.log; then
        echo "rtgtd logged errors"
        return 1
    fi
    # Every iSER connection of the run ended and left nothing behind.
    local pid
    pid=$(awk '$2 == "rtgtd" { p = $1 } END { print p }' "$LAB_WORK/daemons")
    kill -USR1 "$pid"
    sleep 1
    grep 'RDMA state' "$LAB_RESULTS/rtgtd.log" | tail -1 | tee "$LAB_RESULTS/rdma-state.txt"
    grep -q 'iser_connections=0 .*rdma_qps=0 sessions=0' "$LAB_RESULTS/rdma-state.txt" || {
        echo "rtgtd kept iSER connections, QPs or sessions"
        return 1
    }
}
