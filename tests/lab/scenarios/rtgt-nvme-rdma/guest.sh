#!/bin/bash
# The kernel's nvme-rdma (over rdma_rxe) and nvme-cli against rtgtd: discovery over TCP port
# 8009 and over RDMA on the port, a host NQN not on the subsystem's list refused, connect with
# two I/O queues and a 5 s keep alive, the namespace's size and identifiers, ext4 with
# checksummed files across a remount, fio verify (one job, then one per CPU and so per I/O
# queue), kill -9 and restart of rtgtd under fio with the kernel's reconnect, disconnect.
set -euo pipefail
addr=$LAB_HOST_IP

modprobe -a ext4
lab_step "creating rxe0 on eth0"
lab_rxe_add rxe0 eth0
modprobe nvme-rdma
mkdir -p /etc/nvme
echo "$GUEST_HOSTNQN" >/etc/nvme/hostnqn
echo "$GUEST_HOSTID" >/etc/nvme/hostid

lab_step "nvme discover over TCP (port 8009): the RDMA port is listed"
nvme discover -t tcp -a "$addr" | tee "$LAB_OUT/discover-tcp.txt"
grep -q "subnqn: *$SUBNQN" "$LAB_OUT/discover-tcp.txt" || lab_fail "subsystem not discovered"
grep -q "trtype: *rdma" "$LAB_OUT/discover-tcp.txt" || lab_fail "no RDMA port in the discovery log"
grep -q "rdma_cms: *rdma-cm" "$LAB_OUT/discover-tcp.txt" || lab_fail "the RDMA port does not name RDMA/CM"

lab_step "nvme discover over RDMA (port 4420)"
nvme discover -t rdma -a "$addr" -s 4420 | tee "$LAB_OUT/discover-rdma.txt"
grep -q "subnqn: *$SUBNQN" "$LAB_OUT/discover-rdma.txt" || lab_fail "subsystem not discovered over RDMA"
grep -q "traddr: *$addr" "$LAB_OUT/discover-rdma.txt" || lab_fail "address not in the discovery log"

lab_step "a host not on the list is refused"
if nvme connect -t rdma -a "$addr" -s 4420 -n "$SUBNQN" \
    --hostnqn=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000bb \
    --hostid=00000000-0000-0000-0000-0000000000bb >"$LAB_OUT/refused.txt" 2>&1; then
    lab_fail "a host not on the list connected"
fi
cat "$LAB_OUT/refused.txt"

lab_step "connect over RDMA: two I/O queues, keep alive 5 s"
nvme connect -t rdma -a "$addr" -s 4420 -n "$SUBNQN" --nr-io-queues=2 --keep-alive-tmo=5 \
    --reconnect-delay=1 --ctrl-loss-tmo=600 | tee "$LAB_OUT/connect.txt"
lab_retry 30 lab_nvme_ns "$SUBNQN" >/dev/null || lab_fail "no namespace block device"
ns=$(lab_nvme_ns "$SUBNQN")
dev=/dev/$ns
nvme list -v | tee "$LAB_OUT/list.txt"
grep -q rdma "$LAB_OUT/list.txt" || lab_fail "the controller is not on rdma"
bytes=$(($(cat "/sys/block/$ns/size") * 512))
lab_step "namespace $dev: $bytes bytes, nguid $(cat "/sys/block/$ns/nguid")"
((bytes == DISK_BYTES)) || lab_fail "namespace size $bytes, expected $DISK_BYTES"
[[ $(cat "/sys/block/$ns/nguid") == "$DISK_NGUID" ]] || lab_fail "NGUID is not the backstore's wwn"
dmesg | grep -E 'nvme.*mapped [0-9]+/' | tail -1 | tee "$LAB_OUT/queues.txt"
grep -q 'mapped 2/' "$LAB_OUT/queues.txt" || lab_fail "the kernel did not map two I/O queues"

lab_nvme_data "$dev"

lab_nvme_crash "$dev"

lab_step "disconnect"
nvme disconnect -n "$SUBNQN" | tee "$LAB_OUT/disconnect.txt"
lab_retry 30 bash -c "! test -e /sys/block/$ns" || lab_fail "namespace still present after disconnect"
lab_step "rtgt-nvme-rdma done"
