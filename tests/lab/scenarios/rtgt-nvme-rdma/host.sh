# shellcheck shell=bash
# Host side of rtgt-nvme-rdma: rtgtd with one NVMe subsystem (the guest's host NQN admitted)
# on RDMA/CM port 4420 of its soft-RoCE device (UDP 4791 on the tap address) and discovery
# on TCP port 8009; killed with SIGKILL and restarted on the guest's request.

SUBNQN=nqn.2025-01.io.rtgt.lab:nvme-rdma
GUEST_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6b2f1c3d-8e4a-4f32-8b7c-1d2e3f4a5b6c
GUEST_HOSTID=6b2f1c3d-8e4a-4f32-8b7c-1d2e3f4a5b6c

start_rtgtd() {
    lab_start_daemon "$1" "$RTGTD" --config "$LAB_WORK/rtgt.yaml" --state-dir "$LAB_WORK/state"
    lab_wait_tcp "$LAB_HOST_IP" 8009 30 || return 1
    local t0=$SECONDS
    until grep -q 'NVMe/RDMA port listening' "$LAB_RESULTS/$1.log"; do
        ((SECONDS - t0 < 30)) || { echo "rtgtd serves no NVMe/RDMA port"; return 1; }
        sleep 0.2
    done
}

host_setup() {
    [[ -x ${RTGTD:-} ]] || lab_skip "RTGTD does not name the rtgtd binary"
    cat >"$LAB_WORK/rtgt.yaml" <<YAML
backstores:
  - {name: disk, type: file, path: disk.img, size: 512MiB, block_size: 512,
     wwn: 6001405aabbccdd0011223344556677b}
nvme:
  subsystems:
    - nqn: $SUBNQN
      hosts: ['$GUEST_HOSTNQN']
      namespaces: [{nsid: 1, backstore: disk}]
  ports:
    - {id: 1, transport: rdma, listen: '$LAB_HOST_IP:4420'}
  discovery_listen: ['$LAB_HOST_IP:8009']
rdma:
  addresses: [$LAB_HOST_IP]
  eth_mtu: $LAB_MTU
YAML
    cp "$LAB_WORK/rtgt.yaml" "$LAB_RESULTS/rtgt.yaml"
    start_rtgtd rtgtd
    lab_guest_export SUBNQN="$SUBNQN" GUEST_HOSTNQN="$GUEST_HOSTNQN" GUEST_HOSTID="$GUEST_HOSTID" \
        DISK_BYTES=$((512 << 20)) DISK_NGUID=6001405a-abbc-cdd0-0112-23344556677b
}

host_run() {
    # Crash under I/O: kill -9, start again on the same state.
    lab_wait restart-kill 600 || return 1
    lab_kill_daemon rtgtd
    sleep 1
    start_rtgtd rtgtd-2 || return 1
    lab_signal restarted-kill
}

host_check() {
    lab_daemon_alive rtgtd-2 || { echo "rtgtd died"; return 1; }
    if grep -E 'panicked|ERROR' "$LAB_RESULTS"/rtgtd*.log; then
        echo "rtgtd logged errors"
        return 1
    fi
    grep -c 'NVMe/RDMA queue connected' "$LAB_RESULTS"/rtgtd*.log || true
    # The guest disconnected: no queue pair is left.
    local pid
    pid=$(awk '$2 == "rtgtd-2" { p = $1 } END { print p }' "$LAB_WORK/daemons")
    kill -USR1 "$pid"
    sleep 1
    grep 'RDMA state' "$LAB_RESULTS/rtgtd-2.log" | tail -1 | tee "$LAB_RESULTS/rdma-state.txt"
    grep -q 'rdma_qps=0 ' "$LAB_RESULTS/rdma-state.txt" || {
        echo "rtgtd kept NVMe/RDMA queue pairs"
        return 1
    }
}
