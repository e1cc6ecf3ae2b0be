#!/bin/bash
# dm-multipath over two iSCSI paths to one LUN with ALUA (scsi_dh_alua, prio alua,
# group_by_prio): the map's path groups and priorities, then fio randwrite verify (QD16) while
# (a) the API sets the active/optimized group to standby and back, (b) one path's link goes
# down and comes back (the guest sends that path's frames to a MAC address nobody has), (c) with two rtgtd over one file, the one serving
# the active/optimized group is killed with -9 and restarted (a key registered through one
# is reported by the other and survives the restart; over SRP the I/O waits for the restart,
# see round). No I/O error may reach fio, its
# verification must pass, and each path must return to service. All of it over iSCSI/TCP,
# then over iSER (ib_iser on rdma_rxe against rtgtd's soft-RoCE) and SRP (ib_srp, two SRP
# target ports in the same groups), both without (b): after frames dropped this way the
# kernel's iSER initiator over rdma_rxe never reconnects (iscsi_iser_task_init fails with
# ENODEV and no new connection is attempted), and ib_srp over rdma_rxe does not notice within
# 90 s (no error reaches it, so its path is not failed).
set -euo pipefail
p1=$LAB_HOST_IP p2=$IP2
map=/dev/mapper/3$WWN

modprobe -a iscsi_tcp sd_mod scsi_dh_alua dm_multipath dm_round_robin
lab_rxe_add rxe0 eth0
modprobe ib_iser
echo "InitiatorName=$GUEST_IQN" >/etc/iscsi/initiatorname.iscsi
lab_multipath_start

# srp_path ADD_TARGET: log in to an SRP target port with ib_srp and print the name of its
# disk; its remote port fails a dead path's I/O after 5 s and reconnects every 2 s.
srp_path() {
    local host port dev
    lab_srp_add_target "$1" || return 1
    for port in /sys/class/srp_remote_ports/port-*; do
        host=${port##*/port-}
        host=${host%%:*}
        # id_ext reads 0x and the 16 hex digits of the add_target string.
        grep -q "$(sed 's/id_ext=\([0-9a-f]*\).*/\1/' <<<"$1")" \
            "/sys/class/scsi_host/host$host/id_ext" 2>/dev/null || continue
        echo 2 >"$port/reconnect_delay"
        echo 5 >"$port/fast_io_fail_tmo"
        lab_retry 60 compgen -G "/sys/class/scsi_host/host$host/device/target$host:*/$host:*/block/*" >/dev/null ||
            return 1
        dev=$(compgen -G "/sys/class/scsi_host/host$host/device/target$host:*/$host:*/block/*")
        echo "${dev##*/}"
        return 0
    done
    return 1
}

# both_paths: log in to both portals; sets d1, d2 (the path of each portal) once multipath
# has both in the map, each in its own path group (active/optimized 50, non-optimized 10).
both_paths() {
    if [[ $transport == srp ]]; then
        d1=$(srp_path "$SRP1") || lab_fail "no disk through SRP port p1"
        d2=$(srp_path "$SRP2") || lab_fail "no disk through SRP port p2"
    else
        lab_mpath_login "$p1" "$TARGET_IQN" "$transport"
        lab_mpath_login "$p2" "$TARGET_IQN" "$transport"
        d1=$(lab_iscsi_disk "$p1" "$TARGET_IQN" 0 60) || lab_fail "no disk through $p1"
        d2=$(lab_iscsi_disk "$p2" "$TARGET_IQN" 0 60) || lab_fail "no disk through $p2"
        d1=${d1#/dev/} d2=${d2#/dev/}
    fi
    lab_mpath_ready "$map" "$d1" "$d2" "$LAB_OUT/multipath-$transport-$1.txt"
    if [[ $transport == iser ]]; then
        iscsiadm -m session -P 1 | grep -c 'Iface Transport: iser' | grep -qx 2 ||
            lab_fail "the sessions are not on iser"
    fi
}

# logout_all: the map and every session gone.
logout_all() {
    # udev may still be probing the map after the last writer closed it.
    udevadm settle --timeout=30 || true
    lab_retry 30 multipath -F || lab_fail "cannot flush the map"
    if [[ $transport == srp ]]; then
        lab_srp_remove_all
    else
        iscsiadm -m node -u
        iscsiadm -m node -o delete
    fi
}

# link_fault: fio while the link of the path through $p1 goes down (the guest sends its frames
# to a MAC address nobody has) and comes back.
link_fault() {
    lab_fio_start "$transport-link" "$map" 50 64m

    ip neigh replace "$p1" lladdr 02:00:00:00:00:01 dev eth0 nud permanent
    lab_path_is "$d1" failed - - 90
    lab_writes_grow "$d2" "with $p1 down"
    ip neigh del "$p1" dev eth0
    lab_path_is "$d1" active ready 50 120
    lab_fio_end
}

# round: (a), (b) and (c) over $transport.
round() {
    lab_step "$transport: two portals of one rtgtd"
    both_paths one

    lab_step "$transport (a) fio while the API sets group 1 standby and back"
    lab_fio_start "$transport-failover" "$map" 50 0
    lab_signal failover-$transport
    lab_wait failed-over-$transport 120 || lab_fail "the host did not fail over"
    lab_path_is "$d1" - ghost 1
    lab_path_is "$d2" active ready 10
    lab_writes_grow "$d2" "after the failover"
    multipath -ll "$map" | tee "$LAB_OUT/multipath-$transport-standby.txt"
    lab_signal failback-$transport
    lab_wait failed-back-$transport 120 || lab_fail "the host did not fail back"
    lab_path_is "$d1" active ready 50
    lab_writes_grow "$d1" "after the failback"
    lab_fio_end

    if [[ $transport == tcp ]]; then
        lab_step "$transport (b) fio while the link of the path through $p1 goes down and comes back"
        link_fault
    fi

    lab_step "$transport (c) two rtgtd over one file: kill -9 of the one with the active/optimized group"
    logout_all
    lab_signal two-gateways-$transport
    lab_wait gateways-up-$transport 180 || lab_fail "the two rtgtd did not start"
    both_paths two
    # Persistent reservations are one state across the gateways.
    sg_persist --out --register --param-sark=0xabc1 "/dev/$d1" >/dev/null ||
        lab_fail "PR register through $d1 failed"
    sg_persist --in --read-keys "/dev/$d2" | tee "$LAB_OUT/keys-$transport.txt"
    grep -q 0xabc1 "$LAB_OUT/keys-$transport.txt" || lab_fail "a key registered through rtgtd-a is not reported by rtgtd-b"
    # ib_srp notices a dead target port by its RC retries only, some 40 s after the kill, and
    # then keeps the path's commands in the SCSI error handler (an abort each, 5 s apiece)
    # rather than failing them to dm-multipath: with SRP the I/O waits for the restart
    # instead of moving to the other path, and must come through intact.
    local runtime=50
    [[ $transport == srp ]] && runtime=110
    lab_fio_start "$transport-kill" "$map" "$runtime" 128m
    w=$(lab_writes "$d2")
    lab_signal kill-a-$transport
    lab_path_is "$d1" failed - - 90
    lab_wait a-restarted-$transport 120 || lab_fail "rtgtd-a did not restart"
    lab_path_is "$d1" active ready 50 180
    lab_fio_end
    if [[ $transport != srp ]]; then
        (($(lab_writes "$d2") > w)) || lab_fail "no writes through $d2 while rtgtd-a was down"
    fi
    sg_persist --in --read-keys "/dev/$d1" | grep -q 0xabc1 || lab_fail "the key is gone after rtgtd-a restarted"
    sg_persist --out --register --param-rk=0xabc1 --param-sark=0 "/dev/$d1" >/dev/null ||
        lab_fail "PR unregister through $d1 failed"
    multipath -ll "$map" | tee "$LAB_OUT/multipath-$transport-end.txt"

    lab_step "whole-range verify through the map"
    lab_fio_verify "$map" "final-$transport" write 1m 4 0 192m
    logout_all
}

for transport in tcp iser srp; do
    if [[ $transport != tcp ]]; then
        lab_signal "one-gateway-$transport"
        lab_wait "one-gateway-up-$transport" 120 || lab_fail "rtgtd did not start again"
    fi
    round
done
