#!/usr/bin/env bash
# Side-by-side iSCSI/TCP benchmark on 127.0.0.1: rtgtd and Debian's tgtd serve the same
# tmpfs-backed file in turn; libiscsi's iscsi-perf drives reads, rtgt's own initiator drives
# writes; fio (io_uring) on the file and iperf3 over loopback give the ceilings. Then the same
# rtgtd LUN over SRP (soft-RoCE on 127.0.0.1, the initiator on 127.0.0.2) and over iSCSI/TCP,
# both through rtgt's own initiators.
#
# Usage: tests/bench/run.sh [--seconds N] [--rounds N] [--size MiB] [--cpus TARGET,INITIATOR | --no-pin]
# By default (two or more CPUs) every target-side process (tgtd, rtgtd, the iperf3 server) runs
# on CPU 1 and every initiator-side one on CPU 0, the same for both targets, so that where the
# scheduler happens to place them does not decide the comparison. The read rows and the iperf3
# ceiling are measured --rounds times (default 3), tgtd and rtgtd taking turns, the 128 KiB reads
# next to iperf3, and each figure is the median of its rounds.
# Needs: tgt, libiscsi-bin, fio, iperf3 (Debian packages) and a release build of rtgtd and
# rtgt-iscsi (built here, into $CARGO_TARGET_DIR or build/).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=10 rounds=3 size_mib=1024 cpus=1,0
(($(nproc) >= 2)) || cpus=""
while (($#)); do
    case $1 in
    --seconds) secs=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --size) size_mib=$2; shift ;;
    --cpus) cpus=$2; shift ;;
    --no-pin) cpus="" ;;
    *) echo "usage: $0 [--seconds N] [--rounds N] [--size MiB] [--cpus TARGET,INITIATOR | --no-pin]" >&2; exit 2 ;;
    esac
    shift
done
# Command prefixes that pin to the target's or the initiator's CPU (arrays, so that a
# background target's $! is the target itself).
on_target=() on_initiator=()
if [[ -n $cpus ]]; then
    on_target=(taskset -c "${cpus%,*}") on_initiator=(taskset -c "${cpus#*,}")
    echo "bench: targets on CPU ${cpus%,*}, initiators on CPU ${cpus#*,}"
else
    echo "bench: not pinned"
fi
for tool in tgtd tgtadm iscsi-perf fio iperf3; do
    command -v "$tool" >/dev/null || { echo "bench: $tool is not installed" >&2; exit 2; }
done
cargo build --release -q --bin rtgtd --bin rtgt-iscsi --bin rtgt-srp
bin=${CARGO_TARGET_DIR:-build}/release

work=$(mktemp -d /dev/shm/rtgt-bench.XXXXXX)
pids=()
cleanup() {
    # tgtd ignores SIGTERM; it holds no state worth a graceful stop here.
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
lun=$work/lun.img
truncate -s "${size_mib}M" "$lun"
# Fill the file so reads are of real data on both targets.
dd if=/dev/urandom of="$lun" bs=1M count="$size_mib" conv=notrunc status=none

# Free ports, so that a leftover daemon of an earlier run cannot answer in our place.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port_tgt=$(free_port) port_rtgt=$(free_port) port_srp=$(free_port) ctl=$$
iqn_tgt=iqn.2025-01.io.rtgt:bench-tgt iqn_rtgt=iqn.2025-01.io.rtgt:bench

"${on_target[@]}" tgtd -f -C "$ctl" --iscsi "portal=127.0.0.1:$port_tgt" >"$work/tgtd.log" 2>&1 &
pids+=($!)
sleep 1
tgtadm -C "$ctl" --lld iscsi --op new --mode target --tid 1 -T "$iqn_tgt"
tgtadm -C "$ctl" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$lun"
tgtadm -C "$ctl" --lld iscsi --op bind --mode target --tid 1 -I ALL

cat >"$work/rtgt.yaml" <<YAML
backstores:
  - {name: bench, type: file, path: $lun, block_size: 512}
targets:
  - name: $iqn_rtgt
    portal_groups:
      - tag: 1
        portals: ['127.0.0.1:$port_rtgt']
        allow_any_initiator: true
        luns: [{lun: 1, backstore: bench}]
rdma: {addresses: [127.0.0.1], eth_mtu: 4200}
srp:
  - name: bench
    listen: ['127.0.0.1:$port_srp']
    allow_any_initiator: true
    luns: [{lun: 1, backstore: bench}]
policy: {backstore_roots: ['$work']}
YAML
RUST_LOG=warn,rtgt_target::srp::service=info "${on_target[@]}" "$bin/rtgtd" --config "$work/rtgt.yaml" --state-dir "$work/state" >"$work/rtgtd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port_rtgt) 2>/dev/null && break; sleep 0.1; done

url_tgt=iscsi://127.0.0.1:$port_tgt/$iqn_tgt/1
url_rtgt=iscsi://127.0.0.1:$port_rtgt/$iqn_rtgt/1

# iscsi-perf URL QD BLOCKS RANDOM(0|1) -> IOPS average
perf() {
    local r=()
    (($4)) && r=(-r)
    "${on_initiator[@]}" timeout $((secs + 20)) iscsi-perf -m "$2" -b "$3" "${r[@]}" -t "$secs" "$1" 2>&1 | tr '\r' '\n' |
        sed -n 's/^iops average \([0-9]*\).*/\1/p' | tail -1
}
# rtgt-iscsi bench URL RW BS QD -> IOPS
ibench() {
    "${on_initiator[@]}" "$bin/rtgt-iscsi" bench --url "$1" --rw "$2" --bs "$3" --iodepth "$4" --seconds "$secs" 2>&1 |
        sed -n 's/.* IOPS=\([0-9]*\).*/\1/p' | tail -1
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "n/a" }'; }
mbs() { awk -v i="$1" -v bs="$2" 'BEGIN { printf "%.0f MB/s", i * bs / 1e6 }'; }

printf '%-34s %14s %14s %8s\n' workload tgtd rtgtd rtgt/tgt
row() { # name tgt rtgt unit-bytes
    local t=$2 r=$3
    printf '%-34s %14s %14s %8s\n' "$1" "$t IOPS" "$r IOPS" "$(ratio "$r" "$t")"
    [[ $4 -gt 65536 ]] && printf '%-34s %14s %14s\n' "" "$(mbs "$t" "$4")" "$(mbs "$r" "$4")"
    return 0
}
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] + 0 }'; }
# iperf3 over loopback, one stream, the server on the target side -> MB/s
iperf() {
    local port
    port=$(free_port)
    "${on_target[@]}" iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
    sleep 0.5
    "${on_initiator[@]}" iperf3 -c 127.0.0.1 -p "$port" -t "$secs" -J 2>/dev/null |
        python3 -c 'import json,sys; print(int(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]) // 8 // 1000000)'
    wait $! 2>/dev/null || true
}
q32_t=() q32_r=() q1_t=() q1_r=() seq_t=() seq_r=() tcp=()
for ((i = 1; i <= rounds; i++)); do
    q32_t+=("$(perf "$url_tgt" 32 8 1)") q32_r+=("$(perf "$url_rtgt" 32 8 1)")
    q1_t+=("$(perf "$url_tgt" 1 8 1)") q1_r+=("$(perf "$url_rtgt" 1 8 1)")
    seq_t+=("$(perf "$url_tgt" 8 256 0)") seq_r+=("$(perf "$url_rtgt" 8 256 0)") tcp+=("$(iperf)")
done
row "4K random read QD32 (iscsi-perf)" "$(median "${q32_t[@]}")" "$(median "${q32_r[@]}")" 4096
row "4K random read QD1 (iscsi-perf)" "$(median "${q1_t[@]}")" "$(median "${q1_r[@]}")" 4096
seq_r=$(median "${seq_r[@]}")
row "128K sequential read QD8 (iscsi-perf)" "$(median "${seq_t[@]}")" "$seq_r" 131072
row "4K random write QD32 (rtgt-iscsi)" "$(ibench "$url_tgt" randwrite 4096 32)" "$(ibench "$url_rtgt" randwrite 4096 32)" 4096
row "128K sequential write QD8 (rtgt-iscsi)" "$(ibench "$url_tgt" write 131072 8)" "$(ibench "$url_rtgt" write 131072 8)" 131072
((rounds > 1)) && echo "(reads: median of $rounds rounds)"

echo
fio_iops=$("${on_initiator[@]}" fio --name=ceiling --filename="$lun" --ioengine=io_uring --rw=randread --bs=4k --iodepth=32 \
    --runtime="$secs" --time_based --output-format=terse --terse-version=3 2>/dev/null | awk -F';' '{print $8}')
echo "local io_uring (fio, 4K random read QD32 on the file): $fio_iops IOPS;" \
    "rtgtd reaches $(ratio "$(median "${q32_r[@]}")" "$fio_iops") of it"
tcp_mbs=$(median "${tcp[@]}")
seq_mbs=$((seq_r * 131072 / 1000000))
echo "TCP loopback ceiling (iperf3, one stream): $tcp_mbs MB/s; rtgtd 128K read: $seq_mbs MB/s" \
    "($(ratio "$seq_mbs" "$tcp_mbs") of the ceiling)"
echo
echo "SRP (soft-RoCE) vs iSCSI/TCP, the same rtgtd LUN, rtgt's own initiators:"
srp_target=$(grep -o "id_ext=[0-9a-f]*,ioc_guid=[0-9a-f]*,dest=127.0.0.1:$port_srp" "$work/rtgtd.log" | head -1 || true)
# rtgt-srp bench RW BS QD -> IOPS
sbench() {
    [[ -n $srp_target ]] || return 0
    timeout $((secs + 60)) "$bin/rtgt-srp" --lun 1 --eth-mtu 4200 bench --target "$srp_target" --rw "$1" --bs "$2" \
        --iodepth "$3" --seconds "$secs" 2>>"$work/rtgt-srp.log" | sed -n 's/.* IOPS=\([0-9]*\).*/\1/p' | tail -1
}
printf '%-34s %14s %14s %8s\n' workload iSCSI/TCP SRP SRP/iSCSI
srow() { # name iscsi srp unit-bytes
    printf '%-34s %14s %14s %8s\n' "$1" "$2 IOPS" "$3 IOPS" "$(ratio "$3" "$2")"
    [[ $4 -gt 65536 ]] && printf '%-34s %14s %14s\n' "" "$(mbs "$2" "$4")" "$(mbs "$3" "$4")"
    return 0
}
srow "4K random read QD32" "$(ibench "$url_rtgt" randread 4096 32)" "$(sbench randread 4096 32)" 4096
srow "4K random write QD32" "$(ibench "$url_rtgt" randwrite 4096 32)" "$(sbench randwrite 4096 32)" 4096
srow "128K sequential read QD8" "$(ibench "$url_rtgt" read 131072 8)" "$(sbench read 131072 8)" 131072
srow "128K sequential write QD8" "$(ibench "$url_rtgt" write 131072 8)" "$(sbench write 131072 8)" 131072
[[ -n $srp_target ]] || echo "(SRP not served: see $work/rtgtd.log)"
