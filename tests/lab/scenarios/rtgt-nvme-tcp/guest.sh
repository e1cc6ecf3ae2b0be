#!/bin/bash
# The kernel's nvme-tcp and nvme-cli against rtgtd: discovery on port 8009, a host NQN not
# on the subsystem's list refused, connect with two I/O queues and a 5 s keep alive, the
# namespace's size and identifiers, ext4 with checksummed files across a remount, fio verify
# (one job, then one per CPU and so per I/O queue), a second path through the port in the
# other ALUA group (the kernel's native multipath with ANA: optimized and non-optimized
# paths, then an ANA failover and failback through rtgtd's API under fio), kill -9 and
# restart of rtgtd under fio with the kernel's reconnect of both paths, the link cut until
# rtgtd's keep alive timer ends the controllers, reconnect and verify, disconnect.
set -euo pipefail
addr=$LAB_HOST_IP

modprobe -a nvme-tcp ext4
mkdir -p /etc/nvme
echo "$GUEST_HOSTNQN" >/etc/nvme/hostnqn
echo "$GUEST_HOSTID" >/etc/nvme/hostid

lab_step "nvme discover (port 8009)"
nvme discover -t tcp -a "$addr" | tee "$LAB_OUT/discover.txt"
grep -q "subnqn: *$SUBNQN" "$LAB_OUT/discover.txt" || lab_fail "subsystem not discovered"
grep -q "trsvcid: *4420" "$LAB_OUT/discover.txt" || lab_fail "port 4420 not in the discovery log"
grep -q "traddr: *$addr" "$LAB_OUT/discover.txt" || lab_fail "address not in the discovery log"

lab_step "a host not on the list is refused"
if nvme connect -t tcp -a "$addr" -s 4420 -n "$SUBNQN" \
    --hostnqn=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000ba \
    --hostid=00000000-0000-0000-0000-0000000000ba >"$LAB_OUT/refused.txt" 2>&1; then
    lab_fail "a host not on the list connected"
fi
cat "$LAB_OUT/refused.txt"

lab_step "connect: two I/O queues, keep alive 5 s"
nvme connect -t tcp -a "$addr" -s 4420 -n "$SUBNQN" --nr-io-queues=2 --keep-alive-tmo=5 \
    --reconnect-delay=1 --ctrl-loss-tmo=600 | tee "$LAB_OUT/connect.txt"
lab_retry 30 lab_nvme_ns "$SUBNQN" >/dev/null || lab_fail "no namespace block device"
ns=$(lab_nvme_ns "$SUBNQN")
dev=/dev/$ns
nvme list | tee "$LAB_OUT/list.txt"
bytes=$(($(cat "/sys/block/$ns/size") * 512))
lab_step "namespace $dev: $bytes bytes, nguid $(cat "/sys/block/$ns/nguid"), wwid $(cat "/sys/block/$ns/wwid")"
((bytes == DISK_BYTES)) || lab_fail "namespace size $bytes, expected $DISK_BYTES"
[[ $(cat "/sys/block/$ns/nguid") == "$DISK_NGUID" ]] || lab_fail "NGUID is not the backstore's wwn"
uuid=$(cat "/sys/block/$ns/uuid")
[[ $uuid =~ ^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$ ]] ||
    lab_fail "namespace UUID $uuid"
dmesg | grep -E 'nvme.*mapped [0-9]+/' | tail -1 | tee "$LAB_OUT/queues.txt"
grep -q 'mapped 2/' "$LAB_OUT/queues.txt" || lab_fail "the kernel did not map two I/O queues"

lab_nvme_data "$dev"

# nvme_path ADDR: the hidden path device (nvmeXcYn1) of namespace 1 through ADDR.
nvme_path() {
    local b
    for b in /sys/block/nvme*c*n1; do
        [[ $(cat "$b/device/subsysnqn") == "$SUBNQN" ]] || continue
        grep -q "traddr=$1," "$b/device/address" || continue
        echo "${b##*/}"
        return 0
    done
    return 1
}

# ana_is PATH STATE: the kernel's ANA state of PATH is STATE.
ana_is() { [[ $(cat "/sys/block/$1/ana_state") == "$2" ]]; }

lab_step "ANA: a second path through $IP2 (port 2, ALUA group 2: non-optimized)"
[[ $(cat /sys/module/nvme_core/parameters/multipath) == Y ]] || lab_fail "the kernel's NVMe multipath is off"
nvme connect -t tcp -a "$IP2" -s 4420 -n "$SUBNQN" --nr-io-queues=2 --keep-alive-tmo=5 \
    --reconnect-delay=1 --ctrl-loss-tmo=600 | tee "$LAB_OUT/connect-2.txt"
lab_retry 30 nvme_path "$IP2" >/dev/null || lab_fail "no second path"
path1=$(nvme_path "$addr") path2=$(nvme_path "$IP2")
[[ $(lab_nvme_ns "$SUBNQN") == "$ns" ]] || lab_fail "the second path is not under $dev"
lab_retry 30 ana_is "$path1" optimized || lab_fail "$path1: $(cat "/sys/block/$path1/ana_state")"
lab_retry 30 ana_is "$path2" non-optimized || lab_fail "$path2: $(cat "/sys/block/$path2/ana_state")"
[[ $(cat "/sys/block/$path1/ana_grpid") == 1 ]] || lab_fail "ANA group of namespace 1"
nvme list-subsys "$dev" | tee "$LAB_OUT/list-subsys.txt"

lab_step "ANA failover and failback through rtgtd's API under fio"
lab_fio_start ana "$dev" 40 416m 16m
lab_signal ana-failover
lab_wait ana-failed-over 120 || lab_fail "the host did not fail over"
lab_retry 30 ana_is "$path1" inaccessible || lab_fail "$path1 after the failover: $(cat "/sys/block/$path1/ana_state")"
ana_is "$path2" non-optimized || lab_fail "$path2 after the failover: $(cat "/sys/block/$path2/ana_state")"
nvme list-subsys "$dev" | tee "$LAB_OUT/list-subsys-failover.txt"
sleep 5
lab_signal ana-failback
lab_wait ana-failed-back 120 || lab_fail "the host did not fail back"
lab_retry 30 ana_is "$path1" optimized || lab_fail "$path1 after the failback: $(cat "/sys/block/$path1/ana_state")"
lab_fio_end

lab_nvme_crash "$dev"

lab_step "link cut until rtgtd's keep alive timer closes the controller, then back"
lab_signal cut-now
lab_wait link-back 120 || lab_fail "the host did not bring the link back"
lab_retry 90 dd if="$dev" of=/dev/null bs=4k count=1 iflag=direct status=none ||
    lab_fail "no I/O after the link came back"
lab_fio_verify "$dev" after-cut randrw 64k 16 384m 16m
lab_files_verify "$dev" "after the keep alive expiry and reconnect"

lab_step "disconnect"
nvme disconnect -n "$SUBNQN" | tee "$LAB_OUT/disconnect.txt"
grep -q "2 controller" "$LAB_OUT/disconnect.txt" || lab_fail "both paths' controllers were not disconnected"
lab_retry 30 bash -c "! test -e /sys/block/$ns" || lab_fail "namespace still present after disconnect"
lab_step "rtgt-nvme-tcp done"
