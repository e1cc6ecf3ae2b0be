#!/bin/bash
# The kernel's own NVMe over Fabrics target (nvmet, configured through configfs) and the kernel's
# own hosts, both inside the guest, captured with tcpdump: the reference conversations the NVMe
# codecs are tested against (target/nvme/tests/fixtures/).
#
# NVMe/TCP runs over the loopback device; NVMe/RDMA over two rdma_rxe devices on the two ends of a
# veth pair. Each transport: discovery, connect with one I/O
# queue, Identify, Get Log Page, Get/Set Features, 4 KiB and 128 KiB writes and reads (in-capsule
# data, R2T and H2CData or RDMA READ, C2HData or RDMA WRITE), Flush, Write Zeroes, Dataset
# Management, disconnect; NVMe/TCP once more with header and data digests.
set -euo pipefail

CFS=/sys/kernel/config/nvmet
TCP_ADDR=127.0.0.1
RDMA_TARGET=192.168.213.1
RDMA_HOST=192.168.213.2

modprobe -a nvmet nvmet-tcp nvmet-rdma nvme-tcp nvme-rdma
mkdir -p /etc/nvme
echo "$GUEST_HOSTNQN" >/etc/nvme/hostnqn
echo "$GUEST_HOSTID" >/etc/nvme/hostid

lab_step "nvmet: subsystem $SUBNQN, namespace 1 on a 64 MiB file, host $GUEST_HOSTNQN allowed"
truncate -s 64M /tmp/ns1.img
mkdir "$CFS/hosts/$GUEST_HOSTNQN"
sub=$CFS/subsystems/$SUBNQN
mkdir "$sub"
echo 0 >"$sub/attr_allow_any_host"
ln -s "$CFS/hosts/$GUEST_HOSTNQN" "$sub/allowed_hosts/"
mkdir "$sub/namespaces/1"
echo -n /tmp/ns1.img >"$sub/namespaces/1/device_path"
# The guest's root is a tmpfs, which takes no O_DIRECT.
echo 1 >"$sub/namespaces/1/buffered_io"
echo 4c9a2c1e-5a4e-4f0b-9a52-0d0c8f6b7a11 >"$sub/namespaces/1/device_uuid"
echo 1 >"$sub/namespaces/1/enable"

# nvmet_port ID TRTYPE ADDR: a port of the subsystem.
nvmet_port() {
    local p=$CFS/ports/$1
    mkdir "$p"
    echo "$2" >"$p/addr_trtype"
    echo ipv4 >"$p/addr_adrfam"
    echo "$3" >"$p/addr_traddr"
    echo 4420 >"$p/addr_trsvcid"
    ln -s "$sub" "$p/subsystems/"
}

# capture_start NAME DEV FILTER / capture_stop: tcpdump on DEV into $LAB_OUT/NAME.pcap; no packet
# may be dropped.
capture_start() {
    cap_name=$1
    tcpdump -i "$2" -s 0 -B 65536 -U -w "$LAB_OUT/$1.pcap" "$3" >"$LAB_OUT/$1.tcpdump.log" 2>&1 &
    cap_pid=$!
    lab_retry 20 grep -q "listening on" "$LAB_OUT/$1.tcpdump.log"
}
capture_stop() {
    sleep 1
    kill -INT "$cap_pid"
    wait "$cap_pid" || true
    cat "$LAB_OUT/$cap_name.tcpdump.log"
    grep -qx "0 packets dropped by kernel" "$LAB_OUT/$cap_name.tcpdump.log" ||
        lab_fail "$cap_name: tcpdump dropped packets"
}

# conversation TRANSPORT ADDR [CONNECT OPTIONS...]: discovery, connect, admin commands and I/O of
# each kind, disconnect.
conversation() {
    local tr=$1 addr=$2 ns dev
    shift 2
    lab_step "$tr: discover"
    nvme discover -t "$tr" -a "$addr" -s 4420 "$@" | tee -a "$LAB_OUT/discover-$tr.txt"
    grep -q "subnqn: *$SUBNQN" "$LAB_OUT/discover-$tr.txt" || lab_fail "$tr: subsystem not discovered"
    lab_step "$tr: connect $*"
    nvme connect -t "$tr" -a "$addr" -s 4420 -n "$SUBNQN" --nr-io-queues=1 "$@"
    lab_retry 30 lab_nvme_ns "$SUBNQN" >/dev/null || lab_fail "$tr: no namespace block device"
    ns=$(lab_nvme_ns "$SUBNQN")
    dev=/dev/$ns
    nvme id-ctrl "$dev" >/dev/null
    nvme id-ns "$dev" >/dev/null
    nvme ns-descs "$dev" >/dev/null
    nvme smart-log "$dev" >/dev/null
    nvme error-log "$dev" -e 4 >/dev/null
    nvme get-feature "$dev" -f 7 >/dev/null
    nvme set-feature "$dev" -f 0xb -v 0x100 >/dev/null || true
    lab_step "$tr: I/O on $dev"
    head -c 131072 /dev/urandom >/tmp/pattern
    dd if=/tmp/pattern of="$dev" bs=4096 count=1 oflag=direct status=none
    dd if=/tmp/pattern of="$dev" bs=131072 count=1 seek=1 oflag=direct status=none
    dd if="$dev" of=/tmp/back4k bs=4096 count=1 iflag=direct status=none
    dd if="$dev" of=/tmp/back128k bs=131072 count=1 skip=1 iflag=direct status=none
    cmp <(head -c 4096 /tmp/pattern) /tmp/back4k || lab_fail "$tr: 4 KiB read back differs"
    cmp /tmp/pattern /tmp/back128k || lab_fail "$tr: 128 KiB read back differs"
    nvme flush "$dev" -n 1
    # Captured whatever nvmet's file backend answers.
    nvme write-zeroes "$dev" -n 1 -s 64 -c 7 || true
    nvme dsm "$dev" -n 1 -d -s 128 -b 8 || true
    lab_step "$tr: disconnect"
    nvme disconnect -n "$SUBNQN"
    lab_retry 30 bash -c "! test -e $dev" || lab_fail "$tr: namespace still present"
}

# No udev rules run on the new block devices (their probes would fill the captures with reads);
# the kernel still makes the device nodes.
udevadm control --stop-exec-queue

lab_step "NVMe/TCP over lo"
nvmet_port 1 tcp "$TCP_ADDR"
capture_start nvme-tcp lo "tcp port 4420"
conversation tcp "$TCP_ADDR"
conversation tcp "$TCP_ADDR" --hdr-digest --data-digest
capture_stop

lab_step "NVMe/RDMA over rdma_rxe on a veth pair ($RDMA_HOST on veth1 -> $RDMA_TARGET on veth0)"
# Both ends stay in this network namespace (rxe's UDP socket lives in the initial one), so the
# two addresses are local to each other: policy routing sends traffic between them out of the
# veth pair instead of through lo (the local table is consulted after the pair's own rules, and
# packets arriving on the pair are delivered locally), so every RoCEv2 packet crosses veth0.
ip link add veth0 type veth peer name veth1
ip addr add "$RDMA_TARGET/32" dev veth0
ip addr add "$RDMA_HOST/32" dev veth1
for d in all veth0 veth1; do
    sysctl -qw "net.ipv4.conf.$d.accept_local=1" "net.ipv4.conf.$d.rp_filter=0"
done
ip link set veth0 up
ip link set veth1 up
ip rule add pref 1000 lookup local
ip rule del pref 0
ip rule add pref 10 iif veth0 lookup local
ip rule add pref 10 iif veth1 lookup local
ip rule add pref 20 from "$RDMA_HOST" to "$RDMA_TARGET" lookup 100
ip rule add pref 20 from "$RDMA_TARGET" to "$RDMA_HOST" lookup 101
ip route add "$RDMA_TARGET" dev veth1 table 100
ip route add "$RDMA_HOST" dev veth0 table 101
ip neigh replace "$RDMA_TARGET" lladdr "$(cat /sys/class/net/veth0/address)" dev veth1 nud permanent
ip neigh replace "$RDMA_HOST" lladdr "$(cat /sys/class/net/veth1/address)" dev veth0 nud permanent
ip route get "$RDMA_TARGET" from "$RDMA_HOST" | grep -q "dev veth1" || lab_fail "no route through veth1"
lab_rxe_add rxe0 veth0
lab_rxe_add rxe1 veth1
rdma link show
nvmet_port 2 rdma "$RDMA_TARGET"
capture_start nvme-rdma veth0 "udp port 4791"
conversation rdma "$RDMA_TARGET" --host-traddr="$RDMA_HOST"
capture_stop

udevadm control --start-exec-queue
for f in nvme-tcp nvme-rdma; do
    [[ -s $LAB_OUT/$f.pcap ]] || lab_fail "no $f capture"
    lab_step "$f.pcap: $(stat -c %s "$LAB_OUT/$f.pcap") bytes"
done
dmesg | grep -iE 'nvme|rxe' | tail -n 60 >"$LAB_OUT/nvme-dmesg.txt" || true
lab_step "nvmet captures done"
