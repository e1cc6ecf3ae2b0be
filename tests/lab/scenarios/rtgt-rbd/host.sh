# shellcheck shell=bash
# Host side of rtgt-rbd: a one-node Ceph cluster (tests/ceph/cluster.sh) with one RBD image,
# exported by two rtgtd as one LUN with one identity: rtgtd-a on the first address in ALUA
# group 1 (active/optimized), rtgtd-b on the second in group 2 (active/non-optimized), each
# listing the other's port as a remote port. Reservations live in the cluster. When the guest
# asks, rtgtd-a is killed with -9 and, once the guest's I/O runs through rtgtd-b, started again.

RTGT_IQN=iqn.2025-01.io.rtgt.lab:rbd
GUEST_IQN=iqn.2025-01.io.rtgt.lab:guest
GUEST2_IQN=iqn.2025-01.io.rtgt.lab:guest2
WWN=6001405aabbccdd0011223344556688b
IP2=${LAB_HOST_IP%.*}.3
CEPH_DIR=$LAB_WORK/ceph
CLUSTER=$LAB_DIR/../ceph/cluster.sh

# rtgt_config FILE GROUP IP: rtgtd serving the image through portal group GROUP on IP, in ALUA
# group GROUP; the other group (3 - GROUP) is the other gateway's.
rtgt_config() {
    local group=$2 other=$((3 - $2)) state=active_optimized ostate=active_non_optimized
    ((group == 2)) && { state=active_non_optimized ostate=active_optimized; }
    cat >"$1" <<YAML
backstores:
  - name: lun
    type: rbd
    serial: rtgtrbd00001
    wwn: $WWN
    rbd: {pool: rbd, image: lab, ceph_conf: $CEPH_DIR/ceph.conf, op_timeout_secs: 10}
targets:
  - name: $RTGT_IQN
    portal_groups:
      - tag: $group
        portals: ['$3:3260']
        alua_group: $group
        luns: [{lun: 0, backstore: lun}]
        acls: [{initiator: $GUEST_IQN}, {initiator: $GUEST2_IQN}]
alua:
  groups:
    - {id: $group, state: $state}
    - {id: $other, state: $ostate, remote_ports: [$other]}
rdma: {enabled: false}
api: {listen: []}
policy: {backstore_roots: ['$CEPH_DIR']}
YAML
}

start_rtgtd() { # NAME INSTANCE IP
    mkdir -p "$LAB_WORK/$2"
    lab_start_daemon "$1" "$RTGTD" --config "$LAB_WORK/$2.yaml" --state-dir "$LAB_WORK/$2"
    lab_wait_tcp "$3" 3260 30
}

host_setup() {
    [[ -x ${RTGTD:-} ]] || lab_skip "RTGTD does not name the rtgtd binary"
    ip addr add "$IP2/24" dev "$LAB_TAP"
    "$CLUSTER" start "$CEPH_DIR" || return 1
    rbd -c "$CEPH_DIR/ceph.conf" create --size 256M rbd/lab || return 1
    rtgt_config "$LAB_WORK/a.yaml" 1 "$LAB_HOST_IP"
    rtgt_config "$LAB_WORK/b.yaml" 2 "$IP2"
    cp "$LAB_WORK"/{a,b}.yaml "$LAB_RESULTS/"
    start_rtgtd rtgtd-a a "$LAB_HOST_IP" || return 1
    start_rtgtd rtgtd-b b "$IP2" || return 1
    lab_guest_export TARGET_IQN="$RTGT_IQN" GUEST_IQN="$GUEST_IQN" GUEST2_IQN="$GUEST2_IQN" \
        IP2="$IP2" WWN="$WWN"
}

host_run() {
    lab_wait kill-a 600 || return 1
    lab_kill_daemon rtgtd-a || return 1
    lab_report "rtgtd-a (group 1, active/optimized) killed with -9 under fio"
    lab_wait restart-a 180 || return 1
    start_rtgtd rtgtd-a2 a "$LAB_HOST_IP" || return 1
    lab_signal a-restarted
}

host_check() {
    local ok=0
    lab_daemon_alive rtgtd-a2 || { echo "rtgtd-a died after its restart"; ok=1; }
    lab_daemon_alive rtgtd-b || { echo "rtgtd-b died"; ok=1; }
    rbd -c "$CEPH_DIR/ceph.conf" status rbd/lab >"$LAB_RESULTS/rbd-status.txt" 2>&1 || true
    cp -r "$CEPH_DIR/log" "$LAB_RESULTS/ceph-log" 2>/dev/null || true
    "$CLUSTER" stop "$CEPH_DIR" || true
    if grep -E 'panicked|ERROR' "$LAB_RESULTS"/rtgtd*.log; then
        echo "rtgtd logged errors"
        ok=1
    fi
    return "$ok"
}
