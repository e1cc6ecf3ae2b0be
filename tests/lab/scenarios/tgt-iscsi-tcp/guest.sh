#!/bin/bash
# open-iscsi against the host's tgtd: discovery, login, ext4 with checksummed files across a
# remount, fio verify on the raw device, logout.
set -euo pipefail
portal=$LAB_HOST_IP

modprobe -a iscsi_tcp sd_mod ext4
lab_step "starting iscsid"
iscsid
lab_step "discovery"
iscsiadm -m discovery -t sendtargets -p "$portal" | tee "$LAB_OUT/discovery.txt"
grep -q "$TARGET_IQN" "$LAB_OUT/discovery.txt" || lab_fail "target not discovered"
lab_step "login"
iscsiadm -m node -T "$TARGET_IQN" -p "$portal" --login
dev=$(lab_iscsi_disk "$portal" "$TARGET_IQN" 1 60) || lab_fail "no disk for LUN 1"
lab_step "disk $dev: $(cat "/sys/class/block/${dev#/dev/}/size") sectors"

lab_step "mkfs.ext4 and files"
mkfs.ext4 -q -F "$dev"
mkdir -p /mnt/disk
mount "$dev" /mnt/disk
for i in 1 2 3 4 5 6 7 8; do
    head -c $((i * 1024 * 1024 + i * 513)) /dev/urandom >"/mnt/disk/file$i"
done
mkdir /mnt/disk/small
for i in $(seq 1 50); do head -c $((i * 97)) /dev/urandom >"/mnt/disk/small/s$i"; done
(cd /mnt/disk && find . -type f -print0 | sort -z | xargs -0 sha256sum) >/tmp/sums
umount /mnt/disk
echo 3 >/proc/sys/vm/drop_caches
lab_step "remount and verify sha256"
mount "$dev" /mnt/disk
(cd /mnt/disk && sha256sum --quiet -c /tmp/sums) || lab_fail "checksums differ after remount"
umount /mnt/disk

lab_step "fio verify on $dev"
fio --name=verify --filename="$dev" --rw=randwrite --bs=4k --iodepth=16 --size=64m \
    --verify=crc32c --ioengine=libaio --direct=1 --eta=never --output="$LAB_OUT/fio.txt"
grep -E 'err=|WRITE:|READ:' "$LAB_OUT/fio.txt"
grep -q 'err= 0' "$LAB_OUT/fio.txt" || lab_fail "fio reported errors"

lab_step "logout"
iscsiadm -m node -T "$TARGET_IQN" -p "$portal" --logout
lab_retry 30 bash -c "! test -e /sys/class/block/${dev#/dev/}" || lab_fail "disk still present after logout"
lab_step "tgt-iscsi-tcp done"
