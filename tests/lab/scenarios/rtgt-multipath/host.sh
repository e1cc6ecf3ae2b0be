# shellcheck shell=bash
# Host side of rtgt-multipath: one LUN on a shared file, reached through two portals (two
# addresses of the host) in two target port groups, group 1 active/optimized,
# group 2 active/non-optimized. First one rtgtd serves both portal groups and the API fails
# group 1 over to standby and back; then two rtgtd, one per portal group, export the same file
# with the same identity (each lists the other's port as a remote port of its group), and one
# of them is killed with -9 and started again.

RTGT_IQN=iqn.2025-01.io.rtgt.lab:mpath
GUEST_IQN=iqn.2025-01.io.rtgt.lab:guest
WWN=6001405aabbccdd0011223344556677a
IP2=${LAB_HOST_IP%.*}.3

# rtgt_config FILE TPGS REMOTE1 REMOTE2: the configuration of one rtgtd serving the portal
# groups TPGS ("1", "2" or "1 2"), with the remote ports of groups 1 and 2.
rtgt_config() {
    local file=$1 tpgs=$2 r1=$3 r2=$4 t ip
    {
        cat <<YAML
backstores:
  - {name: disk, type: file, path: $LAB_WORK/shared/disk.img, size: 256MiB,
     serial: rtgtmpath01, wwn: $WWN}
targets:
  - name: $RTGT_IQN
    portal_groups:
YAML
        for t in $tpgs; do
            ip=$LAB_HOST_IP
            ((t == 2)) && ip=$IP2
            cat <<YAML
      - tag: $t
        portals: ['$ip:3260']
        alua_group: $t
        luns: [{lun: 0, backstore: disk}]
        acls: [{initiator: $GUEST_IQN}]
YAML
        done
        cat <<YAML
alua:
  transition_secs: 10
  groups:
    - {id: 1, remote_ports: [$r1]}
    - {id: 2, state: active_non_optimized, remote_ports: [$r2]}
rdma: {enabled: false}
api: {listen: []}
policy: {backstore_roots: ['$LAB_WORK/shared']}
YAML
    } >"$file"
}

start_rtgtd() { # NAME INSTANCE IP
    lab_start_daemon "$1" "$RTGTD" --config "$LAB_WORK/$2.yaml" --state-dir "$LAB_WORK/$2"
    lab_wait_tcp "$3" 3260 30
}

rtgtctl() { # INSTANCE ARGS...
    local inst=$1
    shift
    "$BIN/rtgtctl" --socket "$LAB_WORK/$inst/rtgtd.sock" "$@"
}

host_setup() {
    lab_rtgt_bin rtgtctl || return 1
    ip addr add "$IP2/24" dev "$LAB_TAP"
    mkdir -p "$LAB_WORK/shared" "$LAB_WORK/one" "$LAB_WORK/a" "$LAB_WORK/b"
    rtgt_config "$LAB_WORK/one.yaml" "1 2" "" ""
    rtgt_config "$LAB_WORK/a.yaml" "1" "" 2
    rtgt_config "$LAB_WORK/b.yaml" "2" 1 ""
    cp "$LAB_WORK"/{one,a,b}.yaml "$LAB_RESULTS/"
    start_rtgtd rtgtd-one one "$LAB_HOST_IP" || return 1
    lab_guest_export TARGET_IQN="$RTGT_IQN" GUEST_IQN="$GUEST_IQN" IP2="$IP2" WWN="$WWN"
}

host_run() {
    # shellcheck source=/dev/null
    source "$LAB_WORK/bin.env"
    # (a) Failover through the API while the guest writes: group 1 to standby, then back.
    lab_wait failover 600 || return 1
    rtgtctl one alua set 1 standby || return 1
    rtgtctl one alua show | tee "$LAB_RESULTS/alua-standby.txt"
    lab_signal failed-over
    lab_wait failback 600 || return 1
    rtgtctl one alua set 1 active_optimized || return 1
    rtgtctl one alua show | tee "$LAB_RESULTS/alua-back.txt"
    lab_signal failed-back

    # (c) Two rtgtd, one per portal group, over the same file.
    lab_wait two-gateways 600 || return 1
    lab_stop_daemon rtgtd-one 30 || return 1
    start_rtgtd rtgtd-a a "$LAB_HOST_IP" || return 1
    start_rtgtd rtgtd-b b "$IP2" || return 1
    rtgtctl a alua show | tee "$LAB_RESULTS/alua-a.txt"
    rtgtctl b alua show | tee "$LAB_RESULTS/alua-b.txt"
    lab_signal gateways-up
    lab_wait kill-a 600 || return 1
    local pid
    pid=$(awk '$2 == "rtgtd-a" { p = $1 } END { print p }' "$LAB_WORK/daemons")
    kill -KILL "$pid"
    lab_report "rtgtd-a (group 1, active/optimized) killed with -9 under fio"
    sleep 15
    start_rtgtd rtgtd-a2 a "$LAB_HOST_IP" || return 1
    lab_signal a-restarted
}

host_check() {
    lab_daemon_alive rtgtd-a2 || { echo "rtgtd-a died"; return 1; }
    lab_daemon_alive rtgtd-b || { echo "rtgtd-b died"; return 1; }
    grep -q 'standby' "$LAB_RESULTS/alua-standby.txt" || { echo "group 1 not standby"; return 1; }
    if grep -E 'panicked|ERROR' "$LAB_RESULTS"/rtgtd*.log; then
        echo "rtgtd logged errors"
        return 1
    fi
}
