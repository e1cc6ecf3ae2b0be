#!/bin/bash
# The kernel's nvme-tcp and nvme-cli against rtgtd: discovery on port 8009, a host NQN not
# on the subsystem's list refused, connect with two I/O queues and a 5 s keep alive, the
# namespace's size and identifiers, ext4 with checksummed files across a remount, fio verify
# (one job, then one per CPU and so per I/O queue), kill -9 and restart of rtgtd under fio
# with the kernel's reconnect, the link cut until rtgtd's keep alive timer ends the
# controller, reconnect and verify, disconnect.
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
lab_retry 30 bash -c "! test -e /sys/block/$ns" || lab_fail "namespace still present after disconnect"
lab_step "rtgt-nvme-tcp done"
