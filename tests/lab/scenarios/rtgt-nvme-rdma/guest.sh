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
ns=
find_ns() {
    local b
    for b in /sys/block/nvme*n1; do
        # The multipath head (nvmeXn1), not a path's hidden device (nvmeXcYn1).
        [[ ${b##*/} =~ ^nvme[0-9]+n1$ ]] || continue
        [[ -e $b/device/subsysnqn && $(cat "$b/device/subsysnqn") == "$SUBNQN" ]] || continue
        ns=${b##*/}
        return 0
    done
    return 1
}
lab_retry 30 find_ns || lab_fail "no namespace block device"
find_ns
dev=/dev/$ns
nvme list -v | tee "$LAB_OUT/list.txt"
grep -q rdma "$LAB_OUT/list.txt" || lab_fail "the controller is not on rdma"
bytes=$(($(cat "/sys/block/$ns/size") * 512))
lab_step "namespace $dev: $bytes bytes, nguid $(cat "/sys/block/$ns/nguid")"
((bytes == DISK_BYTES)) || lab_fail "namespace size $bytes, expected $DISK_BYTES"
[[ $(cat "/sys/block/$ns/nguid") == "$DISK_NGUID" ]] || lab_fail "NGUID is not the backstore's wwn"
dmesg | grep -E 'nvme.*mapped [0-9]+/' | tail -1 | tee "$LAB_OUT/queues.txt"
grep -q 'mapped 2/' "$LAB_OUT/queues.txt" || lab_fail "the kernel did not map two I/O queues"

lab_step "mkfs.ext4 and files"
lab_files_create "$dev"
lab_step "remount and verify sha256"
lab_files_verify "$dev" "after remount"

lab_step "fio verify: randwrite and randrw, bs 4k/64k/1m (in-capsule and RDMA READ writes)"
for rw in randwrite randrw; do
    lab_fio_verify "$dev" "$rw-4k-qd32" "$rw" 4k 32 256m 8m
    lab_fio_verify "$dev" "$rw-64k-qd1" "$rw" 64k 1 256m 8m
    lab_fio_verify "$dev" "$rw-1m-qd32" "$rw" 1m 32 256m 32m
done

lab_step "fio verify: one job per CPU (each on its I/O queue)"
fio --name=queues --filename="$dev" --rw=randwrite --bs=16k --iodepth=16 --numjobs=2 \
    --offset=256m --offset_increment=64m --size=32m --cpus_allowed=0-1 \
    --cpus_allowed_policy=split --verify=crc32c --verify_fatal=1 --ioengine=libaio --direct=1 \
    --group_reporting --eta=never --output="$LAB_OUT/fio-queues.txt" ||
    { cat "$LAB_OUT/fio-queues.txt"; lab_fail "fio on two queues failed"; }
grep -q 'err= 0' "$LAB_OUT/fio-queues.txt" || lab_fail "fio on two queues reported errors"

lab_step "rtgtd killed with SIGKILL under fio and restarted: the kernel reconnects"
lab_fio_start kill9 "$dev" 40 320m 16m
lab_signal restart-kill
lab_wait restarted-kill 120 || lab_fail "host did not restart rtgtd"
lab_fio_end
dmesg | grep -iE 'nvme.*(reconnect|Successfully)' | tail -3 || true
lab_files_verify "$dev" "after kill -9 restart"

lab_step "disconnect"
nvme disconnect -n "$SUBNQN" | tee "$LAB_OUT/disconnect.txt"
lab_retry 30 bash -c "! test -e /sys/block/$ns" || lab_fail "namespace still present after disconnect"
lab_step "rtgt-nvme-rdma done"
