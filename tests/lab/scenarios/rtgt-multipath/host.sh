# shellcheck shell=bash
# Host side of rtgt-multipath: one LUN on a shared file, reached through two addresses of
# the host in two target port groups, group 1 active/optimized, group 2 active/non-optimized
# (on each address an iSCSI portal group, with iSER, and an SRP target port). First one
# rtgtd serves both and the API fails group 1 over to standby and back; then two rtgtd, one
# per address, export the same file with the same identity (each lists the other's ports as
# remote ports of its group) and one reservation file, and one of them is killed with -9 and
# started again. Over iSCSI/TCP, then iSER, then SRP.

RTGT_IQN=iqn.2025-01.io.rtgt.lab:mpath
GUEST_IQN=iqn.2025-01.io.rtgt.lab:guest
WWN=6001405aabbccdd0011223344556677a
IP2=${LAB_HOST_IP%.*}.3
SRP_IOC_GUID=0002c90300005a01

# srp_id_ext N: the identifier extension of SRP target port pN.
srp_id_ext() { printf '0002c9030000%04x' "$1"; }

# rtgt_config FILE TPGS REMOTE1 REMOTE2: the configuration of one rtgtd serving the portal
# groups and SRP target ports TPGS ("1", "2" or "1 2": portal group N and SRP port pN on the
# Nth address, in ALUA group N), with the remote ports of groups 1 and 2.
rtgt_config() {
    local file=$1 tpgs=$2 r1=$3 r2=$4 t ip addrs=()
    {
        cat <<YAML
backstores:
  - {name: disk, type: file, path: $LAB_WORK/shared/disk.img, size: 256MiB,
     serial: rtgtmpath01, wwn: $WWN, shared: {pr_file: $LAB_WORK/shared/disk.pr}}
targets:
  - name: $RTGT_IQN
    portal_groups:
YAML
        for t in $tpgs; do
            ip=$LAB_HOST_IP
            ((t == 2)) && ip=$IP2
            addrs+=("$ip")
            cat <<YAML
      - tag: $t
        portals: ['$ip:3260']
        alua_group: $t
        luns: [{lun: 0, backstore: disk}]
        acls: [{initiator: $GUEST_IQN}]
YAML
        done
        echo "srp:"
        for t in $tpgs; do
            ip=$LAB_HOST_IP
            ((t == 2)) && ip=$IP2
            cat <<YAML
  - {name: p$t, listen: ['$ip:5555'], id_ext: '$(srp_id_ext "$t")', ioc_guid: '$SRP_IOC_GUID',
     relative_port: $((10 + t)), alua_group: $t, allow_any_initiator: true,
     luns: [{lun: 0, backstore: disk}]}
YAML
        done
        cat <<YAML
alua:
  transition_secs: 10
  groups:
    - {id: 1, remote_ports: [$r1]}
    - {id: 2, state: active_non_optimized, remote_ports: [$r2]}
rdma: {addresses: [$(
            IFS=,
            echo "${addrs[*]}"
        )], eth_mtu: $LAB_MTU}
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
    rtgt_config "$LAB_WORK/a.yaml" "1" "" "2, 12"
    rtgt_config "$LAB_WORK/b.yaml" "2" "1, 11" ""
    cp "$LAB_WORK"/{one,a,b}.yaml "$LAB_RESULTS/"
    start_rtgtd rtgtd-one-tcp one "$LAB_HOST_IP" || return 1
    grep -q 'iSER portal listening' "$LAB_RESULTS/rtgtd-one-tcp.log" || {
        echo "rtgtd serves no iSER"
        return 1
    }
    lab_guest_export TARGET_IQN="$RTGT_IQN" GUEST_IQN="$GUEST_IQN" IP2="$IP2" WWN="$WWN" \
        SRP1="id_ext=$(srp_id_ext 1),ioc_guid=$SRP_IOC_GUID,dest=$LAB_HOST_IP:5555" \
        SRP2="id_ext=$(srp_id_ext 2),ioc_guid=$SRP_IOC_GUID,dest=$IP2:5555"
}

# round TRANSPORT: (a) and (c) of the guest's round over TRANSPORT; rtgtd-one-TRANSPORT
# serves at the start, rtgtd-a2-TRANSPORT and rtgtd-b-TRANSPORT at the end.
round() {
    local t=$1
    # (a) Failover through the API while the guest writes: group 1 to standby, then back.
    lab_wait "failover-$t" 600 || return 1
    rtgtctl one alua set 1 standby || return 1
    rtgtctl one alua show | tee "$LAB_RESULTS/alua-standby-$t.txt"
    lab_signal "failed-over-$t"
    lab_wait "failback-$t" 600 || return 1
    rtgtctl one alua set 1 active_optimized || return 1
    rtgtctl one alua show | tee "$LAB_RESULTS/alua-back-$t.txt"
    lab_signal "failed-back-$t"

    # (c) Two rtgtd, one per portal group, over the same file.
    lab_wait "two-gateways-$t" 600 || return 1
    lab_stop_daemon "rtgtd-one-$t" 30 || return 1
    start_rtgtd "rtgtd-a-$t" a "$LAB_HOST_IP" || return 1
    start_rtgtd "rtgtd-b-$t" b "$IP2" || return 1
    rtgtctl a alua show | tee "$LAB_RESULTS/alua-a-$t.txt"
    rtgtctl b alua show | tee "$LAB_RESULTS/alua-b-$t.txt"
    lab_signal "gateways-up-$t"
    lab_wait "kill-a-$t" 600 || return 1
    lab_kill_daemon "rtgtd-a-$t" || return 1
    lab_report "$t: rtgtd-a (group 1, active/optimized) killed with -9 under fio"
    sleep 15
    start_rtgtd "rtgtd-a2-$t" a "$LAB_HOST_IP" || return 1
    lab_signal "a-restarted-$t"
}

host_run() {
    # shellcheck source=/dev/null
    source "$LAB_WORK/bin.env"
    local t prev=""
    for t in tcp iser srp; do
        if [[ -n $prev ]]; then
            lab_wait "one-gateway-$t" 600 || return 1
            lab_stop_daemon "rtgtd-a2-$prev" 30 || return 1
            lab_stop_daemon "rtgtd-b-$prev" 30 || return 1
            start_rtgtd "rtgtd-one-$t" one "$LAB_HOST_IP" || return 1
            lab_signal "one-gateway-up-$t"
        fi
        round "$t" || return 1
        prev=$t
    done
}

host_check() {
    lab_daemon_alive rtgtd-a2-srp || { echo "rtgtd-a died"; return 1; }
    lab_daemon_alive rtgtd-b-srp || { echo "rtgtd-b died"; return 1; }
    grep -q 'standby' "$LAB_RESULTS/alua-standby-tcp.txt" || { echo "group 1 not standby"; return 1; }
    if grep -E 'panicked|ERROR' "$LAB_RESULTS"/rtgtd*.log; then
        echo "rtgtd logged errors"
        return 1
    fi
}
