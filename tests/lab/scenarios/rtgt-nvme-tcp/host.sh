# shellcheck shell=bash
# Host side of rtgt-nvme-tcp: rtgtd with one NVMe subsystem (the guest's host NQN admitted)
# on port 4420 of two host addresses, port 1 in ALUA target port group 1 (active/optimized),
# port 2 in group 2 (active/non-optimized), and discovery on 8009; on the guest's request
# group 1 is set to standby through the API and back (an ANA failover of the kernel's native
# multipath); then rtgtd is killed with SIGKILL and restarted; then the tap taken down until
# rtgtd's keep alive timer closes the guest's controllers, and brought up again for the
# kernel to reconnect.

SUBNQN=nqn.2025-01.io.rtgt.lab:nvme
GUEST_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:5a1e0b2c-7d3f-4e21-9a6b-0c1d2e3f4a5b
GUEST_HOSTID=5a1e0b2c-7d3f-4e21-9a6b-0c1d2e3f4a5b
IP2=${LAB_HOST_IP%.*}.3

start_rtgtd() {
    lab_start_daemon "$1" "$RTGTD" --config "$LAB_WORK/rtgt.yaml" --state-dir "$LAB_WORK/state"
    lab_wait_tcp "$LAB_HOST_IP" 4420 30
}

host_setup() {
    lab_rtgt_bin rtgtctl || return 1
    ip addr add "$IP2/24" dev "$LAB_TAP"
    cat >"$LAB_WORK/rtgt.yaml" <<YAML
backstores:
  - {name: disk, type: file, path: disk.img, size: 512MiB, block_size: 512,
     wwn: 6001405aabbccdd00112233445566778}
nvme:
  subsystems:
    - nqn: $SUBNQN
      hosts: ['$GUEST_HOSTNQN']
      namespaces: [{nsid: 1, backstore: disk}]
  ports:
    - {id: 1, transport: tcp, listen: '$LAB_HOST_IP:4420', alua_group: 1}
    - {id: 2, transport: tcp, listen: '$IP2:4420', alua_group: 2}
  discovery_listen: ['$LAB_HOST_IP:8009']
alua:
  transition_secs: 10
  groups:
    - {id: 1}
    - {id: 2, state: active_non_optimized}
rdma: {enabled: false}
api: {listen: []}
YAML
    cp "$LAB_WORK/rtgt.yaml" "$LAB_RESULTS/rtgt.yaml"
    start_rtgtd rtgtd
    lab_guest_export SUBNQN="$SUBNQN" GUEST_HOSTNQN="$GUEST_HOSTNQN" GUEST_HOSTID="$GUEST_HOSTID" \
        DISK_BYTES=$((512 << 20)) DISK_NGUID=6001405a-abbc-cdd0-0112-233445566778 IP2="$IP2"
}

rtgtctl() { "$BIN/rtgtctl" --socket "$LAB_WORK/state/rtgtd.sock" "$@"; }

host_run() {
    # shellcheck source=/dev/null
    source "$LAB_WORK/bin.env"
    # ANA failover through the API: group 1 to standby, then back.
    lab_wait ana-failover 600 || return 1
    rtgtctl alua set 1 standby || return 1
    rtgtctl alua show | tee "$LAB_RESULTS/alua-standby.txt"
    lab_signal ana-failed-over
    lab_wait ana-failback 600 || return 1
    rtgtctl alua set 1 active_optimized || return 1
    lab_signal ana-failed-back

    # Crash under I/O: kill -9, start again on the same state.
    lab_wait restart-kill 600 || return 1
    lab_kill_daemon rtgtd
    sleep 1
    start_rtgtd rtgtd-2 || return 1
    lab_signal restarted-kill

    # The host vanishes: its link goes down until rtgtd's keep alive timer closes its
    # controller (the guest connected with a 5 s keep alive timeout).
    lab_wait cut-now 600 || return 1
    ip link set "$LAB_TAP" down
    local t0=$SECONDS
    until grep -q 'keep alive timeout expired' "$LAB_RESULTS/rtgtd-2.log"; do
        if ((SECONDS - t0 > 60)); then
            echo "rtgtd did not close the vanished host's controller within 60 s"
            ip link set "$LAB_TAP" up
            return 1
        fi
        sleep 0.5
    done
    lab_report "link down: rtgtd's keep alive timer closed the host's controller after $((SECONDS - t0)) s"
    ip link set "$LAB_TAP" up
    lab_signal link-back
}

host_check() {
    lab_daemon_alive rtgtd-2 || { echo "rtgtd died"; return 1; }
    if grep -E 'panicked|ERROR' "$LAB_RESULTS"/rtgtd*.log; then
        echo "rtgtd logged errors"
        return 1
    fi
}
