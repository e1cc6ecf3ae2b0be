#!/bin/bash
# ib_iser against rtgtd under faults: fio writes with crc32c verification while rtgtd is killed
# with SIGKILL and restarted, and while the host cuts the link until rtgtd has freed the
# connection; the session recovers both times and everything fio wrote verifies.
set -euo pipefail
portal=$LAB_HOST_IP
node=(-m node -T "$TARGET_IQN" -p "$portal")

modprobe -a iscsi_tcp sd_mod
lab_step "creating rxe0 on eth0"
lab_rxe_add rxe0 eth0
modprobe ib_iser
echo "InitiatorName=$GUEST_IQN" >/etc/iscsi/initiatorname.iscsi
iscsid
iscsiadm -m discovery -t sendtargets -p "$portal" >"$LAB_OUT/discovery.txt"
lab_iser_node "$portal" "$TARGET_IQN"
set_node() { iscsiadm "${node[@]}" --op update -n "$1" -v "$2"; }
# Recover rather than fail I/O while the target is away.
set_node node.session.timeo.replacement_timeout 180
set_node node.conn[0].timeo.noop_out_interval 5
set_node node.conn[0].timeo.noop_out_timeout 10
lab_step "iSER login"
iscsiadm "${node[@]}" --login
dev=$(lab_iscsi_disk "$portal" "$TARGET_IQN" 0 60) || lab_fail "no disk for LUN 0"

# fio_under NAME OFFSET EVENT: write 24 MiB with verification while the host does EVENT's fault.
fio_under() {
    local name=$1 off=$2 ev=$3 pid
    fio --name="$name" --filename="$dev" --rw=randwrite --bs=16k --iodepth=16 --offset="$off" \
        --size=24m --verify=crc32c --verify_fatal=1 --ioengine=libaio --direct=1 --eta=never \
        --output="$LAB_OUT/fio-$name.txt" &
    pid=$!
    sleep 3
    lab_signal "$ev"
    wait "$pid" || { cat "$LAB_OUT/fio-$name.txt"; lab_fail "fio $name failed"; }
    grep -q 'err= 0' "$LAB_OUT/fio-$name.txt" || lab_fail "fio $name reported errors"
}

lab_step "fio while rtgtd is killed (SIGKILL) and restarted"
fio_under killed 0 kill-now
lab_wait restarted 10 || lab_fail "host did not restart rtgtd"

lab_step "fio while the link is cut until rtgtd frees the connection"
fio_under cut 64m cut-now
lab_wait link-back 10 || lab_fail "host did not bring the link back"

lab_step "verify both regions again after recovery"
for r in killed:0 cut:64m; do
    fio --name="re-${r%%:*}" --filename="$dev" --rw=randwrite --bs=16k --iodepth=16 \
        --offset="${r#*:}" --size=24m --verify=crc32c --verify_only --ioengine=libaio --direct=1 \
        --eta=never --output="$LAB_OUT/fio-re-${r%%:*}.txt" || lab_fail "re-verify ${r%%:*} failed"
    grep -q 'err= 0' "$LAB_OUT/fio-re-${r%%:*}.txt" || lab_fail "re-verify ${r%%:*} reported errors"
done
lab_step "logout"
iscsiadm "${node[@]}" --logout
lab_step "rtgt-iser-faults done"
