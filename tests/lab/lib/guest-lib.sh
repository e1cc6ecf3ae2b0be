# shellcheck shell=bash
# Functions for a scenario's guest.sh (loaded through BASH_ENV inside the lab guest).
# Environment: LAB_SCENARIO, LAB_HOST_IP, LAB_GUEST_IP, LAB_MTU, LAB_SHARE (/lab), LAB_OUT (/lab/out:
# files put there are kept with the results of a failed run), plus whatever the host exported.

LAB_SHARE=${LAB_SHARE:-/lab}
LAB_EVENTS=${LAB_EVENTS:-$LAB_SHARE/events}
LAB_OUT=${LAB_OUT:-$LAB_SHARE/out}
LAB_PEER_END=host-done
# shellcheck source=events.sh
source "$LAB_SHARE/lib/events.sh"

# lab_step TEXT: print a timestamped progress line (shows on the serial console).
lab_step() { printf '[%6ss] %s\n' "$(cut -d' ' -f1 /proc/uptime)" "$*"; }

# lab_fail TEXT: print an error and exit non-zero.
lab_fail() {
    printf 'lab: FAIL: %s\n' "$*" >&2
    exit 1
}

# lab_retry TIMEOUT_S CMD...: run CMD every 0.5 s until it succeeds or TIMEOUT_S elapse.
lab_retry() {
    local timeout=$1 start
    shift
    start=$(date +%s)
    until "$@"; do
        (($(date +%s) - start >= timeout)) && return 1
        sleep 0.5
    done
}

# lab_host_status: the exit status of the host's concurrent step (host_run), once host-done is raised.
lab_host_status() { lab_event host-done; }

# lab_iscsi_disk PORTAL_IP TARGET_IQN LUN [TIMEOUT_S]: wait for the disk of a logged-in iSCSI
# session (through udev's /dev/disk/by-path) and print its /dev/sdX path.
lab_iscsi_disk() {
    local ip=$1 iqn=$2 lun=$3 timeout=${4:-60} link
    link=/dev/disk/by-path/ip-$ip:3260-iscsi-$iqn-lun-$lun
    lab_retry "$timeout" test -b "$link" || {
        ls -l /dev/disk/by-path/ >&2 2>/dev/null || true
        return 1
    }
    udevadm settle --timeout=30 >/dev/null 2>&1 || true
    readlink -f "$link"
}

# lab_rxe_add [NAME] [NETDEV]: create a Soft-RoCE device (default rxe0 on eth0) and wait until its
# port is ACTIVE.
lab_rxe_add() {
    local name=${1:-rxe0} dev=${2:-eth0}
    modprobe rdma_rxe
    modprobe ib_uverbs
    modprobe rdma_ucm
    rdma link add "$name" type rxe netdev "$dev"
    lab_retry 30 bash -c "rdma link show $name/1 | grep -q ACTIVE"
}

# lab_files_create DEV [FS_SIZE]: ext4 on the first FS_SIZE (default 200M) of DEV, files of
# several sizes with their sha256 in /tmp/lab-sums (for lab_files_verify). The space behind the
# file system stays free for raw-device tests.
lab_files_create() {
    local dev=$1 i
    mkfs.ext4 -q -F "$dev" "${2:-200M}"
    mkdir -p /mnt/disk
    mount "$dev" /mnt/disk
    for i in 1 2 3 4 5 6; do
        head -c $((i * 1024 * 1024 + i * 513)) /dev/urandom >"/mnt/disk/file$i"
    done
    mkdir /mnt/disk/small
    for i in $(seq 1 40); do head -c $((i * 97)) /dev/urandom >"/mnt/disk/small/s$i"; done
    (cd /mnt/disk && find . -type f -print0 | sort -z | xargs -0 sha256sum) >/tmp/lab-sums
    umount /mnt/disk
    echo 3 >/proc/sys/vm/drop_caches
}

# lab_files_verify DEV WHEN: mount DEV and check the files of lab_files_create.
lab_files_verify() {
    mkdir -p /mnt/disk
    mount "$1" /mnt/disk || lab_fail "mount failed ($2)"
    (cd /mnt/disk && sha256sum --quiet -c /tmp/lab-sums) || lab_fail "checksums differ ($2)"
    umount /mnt/disk
}

# lab_fio_verify DEV NAME RW BS IODEPTH OFFSET SIZE: fio with crc32c verification on the raw
# device (libaio, O_DIRECT); fails the scenario on any error.
lab_fio_verify() {
    local dev=$1 name=$2
    fio --name="$name" --filename="$dev" --rw="$3" --bs="$4" --iodepth="$5" --offset="$6" \
        --size="$7" --verify=crc32c --verify_fatal=1 --ioengine=libaio --direct=1 --eta=never \
        --output="$LAB_OUT/fio-$name.txt" || { cat "$LAB_OUT/fio-$name.txt"; lab_fail "fio $name failed"; }
    grep -q 'err= 0' "$LAB_OUT/fio-$name.txt" || lab_fail "fio $name reported errors"
}

# lab_iser_node PORTAL IQN: switch a discovered node record to the iser transport.
lab_iser_node() {
    iscsiadm -m node -T "$2" -p "$1" --op update -n iface.transport_name -v iser
}

# lab_iser_login PORTAL IQN BYTES: log in to the iser node record of IQN at PORTAL, check that
# the session runs on iser and that LUN 0's disk has BYTES; the disk's path in LAB_DEV.
lab_iser_login() {
    local name bytes
    iscsiadm -m node -T "$2" -p "$1" --login
    iscsiadm -m session -P 1 | tee "$LAB_OUT/session.txt"
    grep -q 'Iface Transport: iser' "$LAB_OUT/session.txt" || lab_fail "session is not on iser"
    LAB_DEV=$(lab_iscsi_disk "$1" "$2" 0 60) || lab_fail "no disk for LUN 0"
    name=${LAB_DEV#/dev/}
    bytes=$(($(cat "/sys/class/block/$name/size") * 512))
    lab_step "disk $LAB_DEV: $bytes bytes"
    ((bytes == $3)) || lab_fail "disk size $bytes, expected $3"
}

# lab_srp_add_target OPTIONS [SRP_DEVICE]: log in to an SRP target through ib_srp
# (`id_ext=...,ioc_guid=...,dest=IP:PORT[,...]` as written to add_target; default device
# srp-rxe0-1). Returns the status of the write: ib_srp logs in before it returns. A target
# whose remote port was just deleted stays in ib_srp's list until its removal work has
# disconnected it, and add_target answers EEXIST meanwhile: that is waited out (30 s).
lab_srp_add_target() {
    local opts=$1 dev=${2:-srp-rxe0-1} i err=/tmp/lab-add-target.err
    modprobe ib_srp
    for ((i = 0; i < 150; i++)); do
        echo "$opts" 2>"$err" >"/sys/class/infiniband_srp/$dev/add_target" && return 0
        grep -q 'File exists' "$err" || break
        sleep 0.2
    done
    cat "$err" >&2
    return 1
}

# lab_srp_remove_all: delete every SRP remote port (logs the initiator out of its targets).
lab_srp_remove_all() {
    local p
    for p in /sys/class/srp_remote_ports/port-*; do
        [[ -e $p/delete ]] && echo 1 >"$p/delete"
    done
    lab_retry 30 bash -c '! compgen -G "/sys/class/srp_remote_ports/port-*" >/dev/null'
}

# lab_wwn_disk WWN [TIMEOUT_S]: wait for the disk with NAA designator WWN (32 hex digits, as in
# the target's configuration) and print its /dev/sdX path.
lab_wwn_disk() {
    local wwn=$1 timeout=${2:-60} link
    link=/dev/disk/by-id/wwn-0x$wwn
    lab_retry "$timeout" test -b "$link" || {
        ls -l /dev/disk/by-id/ >&2 2>/dev/null || true
        return 1
    }
    udevadm settle --timeout=30 >/dev/null 2>&1 || true
    readlink -f "$link"
}

# lab_rping TIMEOUT_S LOG ARGS...: rdma-core's rping with ARGS, its output in LOG. rping's
# client exits 255 now and then after a complete run: its CM event thread is still reading the
# event channel that the main thread destroys at exit ("rdma_get_cm_event: Bad file
# descriptor" after the DISCONNECT event). That exit counts as success when nothing else in
# the log is wrong; any other failure (a data mismatch with -V included) does not.
lab_rping() {
    local timeout=$1 log=$2 status=0
    shift 2
    timeout "$timeout" rping "$@" >"$log" 2>&1 || status=$?
    ((status == 0)) && return 0
    if ((status == 255)) && [[ $(tail -n1 "$log") == "rdma_get_cm_event: Bad file descriptor" ]] &&
        grep -q 'DISCONNECT EVENT' "$log" &&
        ! grep -v 'rdma_get_cm_event: Bad file descriptor' "$log" | grep -qiE 'mismatch|error|fail|wait for'; then
        echo "lab: rping exit race after a complete run (status 255), counted as success" >>"$log"
        return 0
    fi
    return "$status"
}

# lab_perftest LOG CMD...: run a perftest client (CMD) into LOG, retrying while its server on
# the host is not yet listening; prints LOG; fails if the client failed.
lab_perftest() {
    local log=$1 try
    shift
    for ((try = 0; try < 20; try++)); do
        if timeout 300 "$@" >"$log" 2>&1; then
            cat "$log"
            return 0
        fi
        grep -q "Couldn't connect\|Unable to open file descriptor" "$log" || break
        sleep 0.5
    done
    cat "$log"
    return 1
}

# lab_resets_under_fio DEV NAME OFFSET SG_RESET_OPTION...: fio randwrite with crc32c verify on
# DEV while sg_reset issues each reset in turn (-d: LOGICAL UNIT RESET, -t: the target reset of
# the transport); every reset must succeed and no I/O error may reach fio (the initiator retries
# what a reset aborted).
lab_resets_under_fio() {
    local dev=$1 name=$2 offset=$3 pid r
    shift 3
    fio --name="$name" --filename="$dev" --rw=randwrite --bs=4k --iodepth=16 --offset="$offset" \
        --size=32m --verify=crc32c --verify_fatal=1 --ioengine=libaio --direct=1 --eta=never \
        --output="$LAB_OUT/fio-$name.txt" &
    pid=$!
    sleep 2
    for r in "$@"; do
        lab_step "$name: sg_reset $r $dev"
        sg_reset "$r" "$dev" || lab_fail "sg_reset $r failed ($name)"
        sleep 1
    done
    wait "$pid" || { cat "$LAB_OUT/fio-$name.txt"; lab_fail "fio $name failed"; }
    grep -q 'err= 0' "$LAB_OUT/fio-$name.txt" || lab_fail "fio $name reported errors"
}

# lab_rtgtd_start CONFIG STATE_DIR LOG [N]: rtgtd from the share on CONFIG, its log appended
# to LOG; returns, its pid in LAB_RTGTD_PID, once LOG shows the iSER portal and SRP listening
# N times (default 1; a restart appends to the same log and waits for the next).
lab_rtgtd_start() {
    local cfg=$1 state=$2 log=$3 n=${4:-1}
    mkdir -p "$state"
    RUST_LOG=info /lab/bin/rtgtd --config "$cfg" --state-dir "$state" >>"$log" 2>&1 &
    LAB_RTGTD_PID=$!
    lab_retry 60 bash -c "(( \$(grep -c 'iSER portal listening' $log) >= $n ))" || {
        cat "$log"
        lab_fail "rtgtd does not serve iSER"
    }
    lab_retry 30 bash -c "(( \$(grep -c 'SRP listening' $log) >= $n ))" ||
        lab_fail "rtgtd does not serve SRP"
}

# lab_rdma_loopback IP IQN SRP_TARGET WWN BYTES: the in-guest loopback run over rxe0 that an
# RDMA target inside the guest (rtgtd on the verbs provider, or the kernel's LIO) must pass:
# iSER discovery (TCP) and login, a disk of BYTES, ext4 files and fio verify, LOGICAL UNIT
# RESET and the target reset under fio, logout; then ib_srp logs in with SRP_TARGET (the
# add_target string), the disk with NAA designator WWN holds the files written over iSER, fio
# verify, LOGICAL UNIT RESET under fio. Leaves the SRP disk logged in: its path in LAB_SRP_DEV.
lab_rdma_loopback() {
    local ip=$1 iqn=$2 srp=$3 wwn=$4 want=$5 dev name bs
    local node=(-m node -T "$iqn" -p "$ip")
    lab_step "iSER: discovery and login over rxe0"
    echo "InitiatorName=iqn.2025-01.io.rtgt.lab:verbs-guest" >/etc/iscsi/initiatorname.iscsi
    pgrep -x iscsid >/dev/null || iscsid
    iscsiadm -m discovery -t sendtargets -p "$ip" | tee "$LAB_OUT/discovery.txt"
    grep -q "$ip:3260,1 $iqn" "$LAB_OUT/discovery.txt" || lab_fail "target not discovered"
    lab_iser_node "$ip" "$iqn"
    # Reconnect quickly after a target restart.
    iscsiadm "${node[@]}" --op update -n node.session.timeo.replacement_timeout -v 60
    lab_iser_login "$ip" "$iqn" "$want"
    dev=$LAB_DEV
    name=${dev#/dev/}
    lab_step "iSER: ext4 and files, fio verify"
    lab_files_create "$dev" 64M
    lab_files_verify "$dev" "over iSER"
    for bs in 4k 64k 1m; do
        lab_fio_verify "$dev" "iser-randwrite-$bs" randwrite "$bs" 16 96m 8m
    done
    lab_fio_verify "$dev" iser-randrw-4k-qd64 randrw 4k 64 112m 4m
    lab_resets_under_fio "$dev" iser-resets 120m -d -t
    iscsiadm "${node[@]}" --logout
    lab_retry 30 bash -c "! test -e /sys/class/block/$name" || lab_fail "disk still present after logout"

    lab_step "SRP: add_target $srp"
    lab_srp_add_target "$srp" || lab_fail "add_target failed"
    dev=$(lab_wwn_disk "$wwn" 60) || lab_fail "no SRP disk with WWN $wwn"
    lab_step "SRP: the files written over iSER, fio verify"
    lab_files_verify "$dev" "over SRP, written over iSER"
    for bs in 4k 64k 1m; do
        lab_fio_verify "$dev" "srp-randwrite-$bs" randwrite "$bs" 16 128m 8m
    done
    lab_fio_verify "$dev" srp-randrw-4k-qd64 randrw 4k 64 144m 4m
    lab_resets_under_fio "$dev" srp-resets 152m -d
    LAB_SRP_DEV=$dev
}

# --- dm-multipath over rtgtd gateways ---------------------------------------------------------

# lab_multipath_start: multipath.conf with ALUA for rtgtd's vendor string (what multipath-tools
# has for LIO-ORG), then iscsid and multipathd; waits until multipathd answers.
lab_multipath_start() {
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
    pgrep -x iscsid >/dev/null || iscsid
    multipathd
    lab_retry 30 multipathd show daemon >/dev/null || lab_fail "multipathd does not answer"
}

# lab_mpath_login PORTAL IQN [iser]: discover PORTAL and log in to IQN there (over iSER when
# asked), with timeouts that fail a dead path fast (NOP-Out every 2 s, 5 s to replace a session).
lab_mpath_login() {
    local node=(-m node -T "$2" -p "$1")
    iscsiadm -m discovery -t sendtargets -p "$1" >>"$LAB_OUT/discovery.txt"
    [[ ${3:-} == iser ]] && lab_iser_node "$1" "$2"
    iscsiadm "${node[@]}" --op update -n node.session.timeo.replacement_timeout -v 5
    iscsiadm "${node[@]}" --op update -n 'node.conn[0].timeo.noop_out_interval' -v 2
    iscsiadm "${node[@]}" --op update -n 'node.conn[0].timeo.noop_out_timeout' -v 4
    iscsiadm "${node[@]}" --login
}

# lab_path DEV: "dm-state checker-state priority" of path DEV in multipathd.
lab_path() {
    multipathd show paths raw format "%d %t %T %p" | awk -v d="$1" '$1 == d { print $2, $3, $4 }'
}

lab_path_matches() { [[ $(lab_path "$1") =~ $2 ]]; }

# lab_path_is DEV DM CHECKER PRIO [TIMEOUT]: wait until path DEV shows that state ("-": any).
lab_path_is() {
    local dev=$1 re="^$2 $3 $4\$" t=${5:-90}
    re=${re//-/[^ ]+}
    if ! lab_retry "$t" lab_path_matches "$dev" "$re"; then
        multipathd show paths || true
        lab_fail "path $dev is '$(lab_path "$dev")', expected '$2 $3 $4'"
    fi
    lab_step "path $dev: $(lab_path "$dev")"
}

# lab_mpath_ready MAP AO ANO OUT: wait until MAP exists with path AO active/optimized (priority
# 50) and ANO active/non-optimized (10), each in its own path group, handled by scsi_dh_alua;
# `multipath -ll MAP` goes to OUT.
lab_mpath_ready() {
    local map=$1 out=$4
    lab_retry 60 test -b "$map" || {
        multipath -ll || true
        lab_fail "no multipath map $map"
    }
    lab_path_is "$2" active ready 50
    lab_path_is "$3" active ready 10
    multipath -ll "$map" | tee "$out"
    grep -q "hwhandler='1 alua'" "$out" || lab_fail "no ALUA hardware handler"
    grep -q 'prio=50 status=active' "$out" || lab_fail "no active/optimized path group"
    grep -q 'prio=10 status=enabled' "$out" || lab_fail "no non-optimized path group"
    [[ $(cat "/sys/block/$2/device/dh_state") == alua ]] || lab_fail "scsi_dh_alua is not attached"
}

# lab_writes DEV: write requests completed through block device DEV.
lab_writes() { awk '{ print $5 }' "/sys/block/$1/stat"; }

# lab_writes_grow DEV WHAT: fail unless writes complete through DEV within 5 s.
lab_writes_grow() {
    local w
    w=$(lab_writes "$1")
    sleep 5
    (($(lab_writes "$1") > w)) || lab_fail "no writes through $1 $2"
}

# lab_fio_start NAME FILE SECONDS OFFSET [SIZE]: fio randwrite QD16 with crc32c verification
# of what it wrote (every 512 blocks) on FILE (a device or a file, SIZE default 32m), time
# based, in the background; lab_fio_end waits for it.
lab_fio_start() {
    fio --name="$1" --filename="$2" --rw=randwrite --bs=4k --iodepth=16 --offset="$4" \
        --size="${5:-32m}" --time_based --runtime="$3" --verify=crc32c --verify_backlog=512 \
        --verify_fatal=1 --ioengine=libaio --direct=1 --eta=never --output="$LAB_OUT/fio-$1.txt" &
    LAB_FIO_PID=$!
    LAB_FIO_NAME=$1
    sleep 5
}

lab_fio_end() {
    wait "$LAB_FIO_PID" || { cat "$LAB_OUT/fio-$LAB_FIO_NAME.txt"; lab_fail "fio $LAB_FIO_NAME failed"; }
    grep -q 'err= 0' "$LAB_OUT/fio-$LAB_FIO_NAME.txt" || lab_fail "fio $LAB_FIO_NAME reported errors"
    grep -E 'write: IOPS|verify' "$LAB_OUT/fio-$LAB_FIO_NAME.txt" | head -3 || true
}

# lab_nvme_ns NQN: the block device name (nvmeXn1: the multipath head, not a path's hidden
# nvmeXcYn1) of namespace 1 of subsystem NQN.
lab_nvme_ns() {
    local b
    for b in /sys/block/nvme*n1; do
        [[ ${b##*/} =~ ^nvme[0-9]+n1$ ]] || continue
        [[ -e $b/device/subsysnqn && $(cat "$b/device/subsysnqn") == "$1" ]] || continue
        echo "${b##*/}"
        return 0
    done
    return 1
}

# lab_nvme_data DEV: ext4 with checksummed files across a remount, fio verify (randwrite and
# randrw at 4k QD32, 64k QD1 and 1m QD32), then one job per CPU (each on its I/O queue).
lab_nvme_data() {
    local dev=$1 rw
    lab_step "mkfs.ext4 and files"
    lab_files_create "$dev"
    lab_step "remount and verify sha256"
    lab_files_verify "$dev" "after remount"
    lab_step "fio verify: randwrite and randrw, bs 4k/64k/1m"
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
}

# lab_nvme_crash DEV: fio on DEV while the host kills rtgtd with SIGKILL and starts it again
# (events restart-kill, restarted-kill); the kernel reconnects, fio and the files verify.
lab_nvme_crash() {
    lab_step "rtgtd killed with SIGKILL under fio and restarted: the kernel reconnects"
    lab_fio_start kill9 "$1" 40 320m 16m
    lab_signal restart-kill
    lab_wait restarted-kill 120 || lab_fail "host did not restart rtgtd"
    lab_fio_end
    dmesg | grep -iE 'nvme.*(reconnect|Successfully)' | tail -3 || true
    lab_files_verify "$1" "after kill -9 restart"
}
