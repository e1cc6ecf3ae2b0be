# shellcheck shell=bash
# Host side of rtgt-rbd: a one-node Ceph cluster (tests/ceph/cluster.sh) with one RBD image,
# exported by two rtgtd as one LUN with one identity: rtgtd-a on the first address in ALUA
# group 1 (active/optimized), rtgtd-b on the second in group 2 (active/non-optimized), each
# listing the other's port as a remote port; both groups allow SET TARGET PORT GROUPS.
# Reservations and the groups' states live in the cluster, so a change through one gateway's
# API (or a host's SET TARGET PORT GROUPS) reaches both. When the guest
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
    - {id: $group, state: $state, explicit: true}
    - {id: $other, state: $ostate, explicit: true, remote_ports: [$other]}
rdma: {enabled: false}
api: {listen: []}
policy: {backstore_roots: ['$CEPH_DIR']}
YAML
}

rtgtctl() { # INSTANCE ARGS...
    local inst=$1
    shift
    "$BIN/rtgtctl" --socket "$LAB_WORK/$inst/rtgtd.sock" "$@"
}

# lock_held INSTANCE: 1 when that rtgtd holds the image's exclusive lock, 0 when not.
lock_held() {
    rtgtctl "$1" metrics | awk '/^rtgt_lun_write_lock_held\{backstore="lun"\}/ { print $2 }'
}

# lock_at HOLDER OTHER: wait (30 s) until HOLDER holds the lock and OTHER does not.
lock_at() {
    local i
    for ((i = 0; i < 60; i++)); do
        [[ $(lock_held "$1") == 1 && $(lock_held "$2") == 0 ]] && {
            lab_report "exclusive lock held by $1, not by $2"
            return 0
        }
        sleep 0.5
    done
    echo "lock: $1 $(lock_held "$1"), $2 $(lock_held "$2")"
    return 1
}

# groups INSTANCE "ID STATE"...: set the groups' states in this order through the API of one
# gateway; the other takes them in from the state they share in the cluster. Both must then
# report the same states (each reports both groups: its own and the other's).
groups() {
    local inst=$1 change i
    shift
    for change in "$@"; do
        # shellcheck disable=SC2086  # "ID STATE"
        rtgtctl "$inst" alua set $change || return 1
    done
    for ((i = 0; i < 20; i++)); do
        [[ $(states a) == "$(states b)" ]] && break
        sleep 0.5
    done
    states a | tee -a "$LAB_RESULTS/alua.txt"
    states b | tee -a "$LAB_RESULTS/alua.txt"
    [[ $(states a) == "$(states b)" ]] || {
        echo "the gateways report different states after a change through $inst"
        return 1
    }
    lab_report "states set through rtgtd-$inst alone, taken in by both: $*"
}

# states INSTANCE: the groups' states that gateway reports, in group order.
states() { rtgtctl "$1" alua show | sort; }

start_rtgtd() { # NAME INSTANCE IP
    mkdir -p "$LAB_WORK/$2"
    lab_start_daemon "$1" "$RTGTD" --config "$LAB_WORK/$2.yaml" --state-dir "$LAB_WORK/$2"
    lab_wait_tcp "$3" 3260 30
}

host_setup() {
    lab_rtgt_bin rtgtctl || return 1
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
    # shellcheck source=/dev/null
    source "$LAB_WORK/bin.env"
    lab_wait kill-a 600 || return 1
    lab_kill_daemon rtgtd-a || return 1
    lab_report "rtgtd-a (group 1, active/optimized) killed with -9 under fio"
    lab_wait restart-a 180 || return 1
    start_rtgtd rtgtd-a2 a "$LAB_HOST_IP" || return 1
    # The guest's SET TARGET PORT GROUPS through rtgtd-b made group 2 active/optimized in the
    # state the gateways share: rtgtd-a takes that over its configuration.
    lab_report "rtgtd-a restarted; its groups: $(states a | tr -s ' \n' ' ')"
    lab_signal a-restarted
    lab_wait failback-a 240 || return 1
    # The guest may have moved the group again with requests through both paths: the lock is
    # with whichever gateway the states settled on, where the writes go.
    local ao
    ao=$(states a | awk '$3 == "active_optimized" { print $2 }')
    lab_report "groups settled with group $ao active/optimized: $(states b | tr -s ' \n' ' ')"
    if [[ $ao == 1 ]]; then lock_at a b || return 1; else lock_at b a || return 1; fi
    groups a "1 active_optimized" || return 1
    lab_signal failed-back-a

    # Failover through rtgtd-b's API and failback through rtgtd-a's: the lock follows the
    # writes.
    lab_wait lock-a 600 || return 1
    lock_at a b || return 1
    lab_signal lock-a-ok
    lab_wait failover 120 || return 1
    # The active/optimized group goes first: never two of them.
    groups b "1 standby" "2 active_optimized" || return 1
    lab_signal failed-over
    lab_wait lock-b 120 || return 1
    lock_at b a || return 1
    lab_signal lock-b-ok
    lab_wait failback 120 || return 1
    groups a "2 active_non_optimized" "1 active_optimized" || return 1
    lab_signal failed-back
    lab_wait lock-back 120 || return 1
    lock_at a b || return 1
    lab_signal lock-back-ok
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
