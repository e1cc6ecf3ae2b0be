#!/bin/bash
# dm-multipath over two iSCSI paths to one LUN with ALUA (scsi_dh_alua, prio alua,
# group_by_prio): the map's path groups and priorities, then fio randwrite verify (QD16) while
# (a) the API sets the active/optimized group to standby and back, (b) one path's link goes
# down and comes back (a blackhole route), (c) with two rtgtd over one file, the one serving
# the active/optimized group is killed with -9 and restarted. No I/O error may reach fio, its
# verification must pass, and each path must return to service.
set -euo pipefail
p1=$LAB_HOST_IP p2=$IP2
map=/dev/mapper/3$WWN

modprobe -a iscsi_tcp sd_mod scsi_dh_alua dm_multipath dm_round_robin
echo "InitiatorName=$GUEST_IQN" >/etc/iscsi/initiatorname.iscsi
# What multipath-tools has for LIO-ORG, for rtgt's vendor string.
cat >/etc/multipath.conf <<'CONF'
defaults {
    user_friendly_names no
    find_multipaths no
    polling_interval 2
}
devices {
    device {
        vendor "RTGT"
        product ".*"
        path_grouping_policy group_by_prio
        prio alua
        hardware_handler "1 alua"
        path_checker tur
        failback immediate
        no_path_retry 12
    }
}
CONF
lab_step "starting iscsid and multipathd"
iscsid
multipathd
lab_retry 30 multipathd show daemon >/dev/null || lab_fail "multipathd does not answer"

# login PORTAL: discover PORTAL and log in to it, with timeouts that fail a dead path fast.
login() {
    local node=(-m node -T "$TARGET_IQN" -p "$1")
    iscsiadm -m discovery -t sendtargets -p "$1" >>"$LAB_OUT/discovery.txt"
    iscsiadm "${node[@]}" --op update -n node.session.timeo.replacement_timeout -v 5
    iscsiadm "${node[@]}" --op update -n 'node.conn[0].timeo.noop_out_interval' -v 2
    iscsiadm "${node[@]}" --op update -n 'node.conn[0].timeo.noop_out_timeout' -v 4
    iscsiadm "${node[@]}" --login
}

# path DEV: "dm-state checker-state priority" of path DEV in multipathd.
path() {
    multipathd show paths raw format "%d %t %T %p" | awk -v d="$1" '$1 == d { print $2, $3, $4 }'
}

path_matches() { [[ $(path "$1") =~ $2 ]]; }

# path_is DEV DM CHECKER PRIO [TIMEOUT]: wait until path DEV shows that state ("-": any).
path_is() {
    local dev=$1 re="^$2 $3 $4\$" t=${5:-90}
    re=${re//-/[^ ]+}
    if ! lab_retry "$t" path_matches "$dev" "$re"; then
        multipathd show paths || true
        lab_fail "path $dev is '$(path "$dev")', expected '$2 $3 $4'"
    fi
    lab_step "path $dev: $(path "$dev")"
}

# both_paths: log in to both portals; sets d1, d2 (the path of each portal) once multipath
# has both in the map, each in its own path group (active/optimized 50, non-optimized 10).
both_paths() {
    login "$p1"
    login "$p2"
    d1=$(lab_iscsi_disk "$p1" "$TARGET_IQN" 0 60) || lab_fail "no disk through $p1"
    d2=$(lab_iscsi_disk "$p2" "$TARGET_IQN" 0 60) || lab_fail "no disk through $p2"
    d1=${d1#/dev/} d2=${d2#/dev/}
    lab_retry 60 test -b "$map" || {
        multipath -ll || true
        lab_fail "no multipath map $map"
    }
    path_is "$d1" active ready 50
    path_is "$d2" active ready 10
    multipath -ll "$map" | tee "$LAB_OUT/multipath-$1.txt"
    grep -q "hwhandler='1 alua'" "$LAB_OUT/multipath-$1.txt" || lab_fail "no ALUA hardware handler"
    grep -q 'prio=50 status=active' "$LAB_OUT/multipath-$1.txt" || lab_fail "no active/optimized path group"
    grep -q 'prio=10 status=enabled' "$LAB_OUT/multipath-$1.txt" || lab_fail "no non-optimized path group"
    [[ $(cat "/sys/block/$d1/device/dh_state") == alua ]] || lab_fail "scsi_dh_alua is not attached"
}

# writes DEV: write requests completed through path DEV.
writes() { awk '{ print $5 }' "/sys/block/$1/stat"; }

# fio_start NAME SECONDS OFFSET: fio randwrite QD16 with crc32c verification of what it wrote
# (every 512 blocks) on the map, in the background.
fio_start() {
    fio --name="$1" --filename="$map" --rw=randwrite --bs=4k --iodepth=16 --offset="$3" \
        --size=32m --time_based --runtime="$2" --verify=crc32c --verify_backlog=512 \
        --verify_fatal=1 --ioengine=libaio --direct=1 --eta=never --output="$LAB_OUT/fio-$1.txt" &
    fio_pid=$!
    fio_name=$1
    sleep 5
}

fio_end() {
    wait "$fio_pid" || { cat "$LAB_OUT/fio-$fio_name.txt"; lab_fail "fio $fio_name failed"; }
    grep -q 'err= 0' "$LAB_OUT/fio-$fio_name.txt" || lab_fail "fio $fio_name reported errors"
    grep -E 'write: IOPS|verify' "$LAB_OUT/fio-$fio_name.txt" | head -3 || true
}

lab_step "two portals of one rtgtd"
both_paths one

lab_step "(a) fio while the API sets group 1 standby and back"
fio_start failover 80 0
lab_signal failover
lab_wait failed-over 120 || lab_fail "the host did not fail over"
path_is "$d1" - ghost 1
path_is "$d2" active ready 10
w=$(writes "$d2")
sleep 5
(($(writes "$d2") > w)) || lab_fail "no writes through $d2 after the failover"
multipath -ll "$map" | tee "$LAB_OUT/multipath-standby.txt"
lab_signal failback
lab_wait failed-back 120 || lab_fail "the host did not fail back"
path_is "$d1" active ready 50
w=$(writes "$d1")
sleep 5
(($(writes "$d1") > w)) || lab_fail "no writes through $d1 after the failback"
fio_end

lab_step "(b) fio while the link of the path through $p1 goes down and comes back"
fio_start link 80 64m
ip route add blackhole "$p1/32"
path_is "$d1" failed - - 90
w=$(writes "$d2")
sleep 5
(($(writes "$d2") > w)) || lab_fail "no writes through $d2 with $p1 down"
ip route del blackhole "$p1/32"
path_is "$d1" active ready 50 120
fio_end

lab_step "(c) two rtgtd over one file: kill -9 of the one with the active/optimized group"
multipath -F || lab_fail "cannot flush the map"
iscsiadm -m node -u
iscsiadm -m node -o delete
lab_signal two-gateways
lab_wait gateways-up 180 || lab_fail "the two rtgtd did not start"
both_paths two
fio_start kill 90 128m
lab_signal kill-a
path_is "$d1" failed - - 90
w=$(writes "$d2")
sleep 5
(($(writes "$d2") > w)) || lab_fail "no writes through $d2 with rtgtd-a down"
lab_wait a-restarted 120 || lab_fail "rtgtd-a did not restart"
path_is "$d1" active ready 50 120
fio_end
multipath -ll "$map" | tee "$LAB_OUT/multipath-end.txt"

lab_step "whole-range verify through the map"
lab_fio_verify "$map" final write 1m 4 0 192m
multipath -F
iscsiadm -m node -u
