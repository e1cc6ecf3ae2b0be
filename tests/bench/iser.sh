#!/usr/bin/env bash
# iSER next to iSCSI/TCP, same rtgtd, same run: rtgt's own initiator (`rtgt-iscsi bench`, TCP and
# `--iser`) against a null LUN and a tmpfs-backed file LUN, 4 KiB random read and write at
# iodepth 32 and 128 KiB sequential read and write at iodepth 8, with rtgtd's CPU time per I/O
# for each; then the soft-RoCE ceiling of
# this machine (`rtgt-rdma bench`: RDMA WRITE/READ bandwidth of two rtgt devices over UDP
# loopback, no iSCSI) for the iSER figures to be read against.
#
# Usage: tests/bench/iser.sh [--seconds N] [--size MiB] [--cpus TARGET,INITIATOR | --no-pin]
# Not pinned by default: over iSER both ends run a soft-RoCE engine in their own process, while
# over TCP half of the work is the kernel's; pinning each side to one CPU charges that difference
# to iSER (`--cpus 1,0` pins anyway, as run.sh does).
# Runs in a network namespace of its own (needs root), so UDP 4791 is free even where the
# rdma_rxe module holds it: rtgtd's device on 127.0.0.1, the initiator's on 127.0.0.2, an
# Ethernet MTU of 9000 (RDMA path MTU 4096). Builds rtgtd, rtgt-iscsi and rtgt-rdma (release).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=10 size_mib=1024 cpus=""
args=("$@")
while (($#)); do
    case $1 in
    --seconds) secs=$2; shift ;;
    --size) size_mib=$2; shift ;;
    --cpus) cpus=$2; shift ;;
    --no-pin) cpus="" ;;
    *) echo "usage: $0 [--seconds N] [--size MiB] [--cpus TARGET,INITIATOR | --no-pin]" >&2; exit 2 ;;
    esac
    shift
done
if [[ -z ${RTGT_BENCH_NETNS:-} ]]; then
    ((EUID == 0)) || { echo "bench: needs root (a network namespace of its own)" >&2; exit 2; }
    cargo build --release -q --bin rtgtd --bin rtgt-iscsi --bin rtgt-rdma
    ns=rtgt-bench-$$
    ip netns add "$ns"
    trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
    ip -n "$ns" link set lo up
    ip -n "$ns" link set lo mtu 9000
    rc=0
    RTGT_BENCH_NETNS=$ns ip netns exec "$ns" "$0" "${args[@]}" || rc=$?
    exit "$rc"
fi

on_target=() on_initiator=()
if [[ -n $cpus ]]; then
    on_target=(taskset -c "${cpus%,*}") on_initiator=(taskset -c "${cpus#*,}")
    echo "bench: rtgtd on CPU ${cpus%,*}, initiator on CPU ${cpus#*,}"
fi
bin=${CARGO_TARGET_DIR:-build}/release
work=$(mktemp -d /dev/shm/rtgt-iser-bench.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
lun=$work/lun.img
truncate -s "${size_mib}M" "$lun"
dd if=/dev/urandom of="$lun" bs=1M count="$size_mib" conv=notrunc status=none
iqn=iqn.2025-01.io.rtgt:bench-iser
port=3260
cat >"$work/rtgt.yaml" <<YAML
backstores:
  - {name: null, type: null, size: ${size_mib}MiB, block_size: 512}
  - {name: tmpfs, type: file, path: $lun, block_size: 512}
targets:
  - name: $iqn
    portal_groups:
      - tag: 1
        portals: ['127.0.0.1:$port']
        allow_any_initiator: true
        luns: [{lun: 0, backstore: null}, {lun: 1, backstore: tmpfs}]
rdma:
  addresses: [127.0.0.1]
  eth_mtu: 9000
policy: {backstore_roots: ['$work']}
YAML
RUST_LOG=warn "${on_target[@]}" "$bin/rtgtd" --config "$work/rtgt.yaml" --state-dir "$work/state" >"$work/rtgtd.log" 2>&1 &
pids+=($!)
rtgtd_pid=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done

# CPU time rtgtd has used so far, in clock ticks (user + system).
hz=$(getconf CLK_TCK)
target_ticks() { awk '{ print $14 + $15 }' "/proc/$rtgtd_pid/stat"; }
# ibench LUN RW BS QD [--iser ...] -> "IOPS MB/s TARGET_CPU_US_PER_IO"
ibench() {
    local lun=$1 rw=$2 bs=$3 qd=$4 t0 t1 out
    shift 4
    t0=$(target_ticks)
    out=$("${on_initiator[@]}" "$bin/rtgt-iscsi" "$@" bench --url "iscsi://127.0.0.1:$port/$iqn/$lun" \
        --rw "$rw" --bs "$bs" --iodepth "$qd" --seconds "$secs" 2>"$work/ibench.err" |
        sed -n 's/.*ios=\([0-9]*\) IOPS=\([0-9]*\) MB\/s=\([0-9.]*\).*/\1 \2 \3/p' | tail -1)
    t1=$(target_ticks)
    # The target's CPU over the whole run (login and logout included) per I/O done.
    read -r ios iops mbs <<<"$out"
    awk -v t="$((t1 - t0))" -v hz="$hz" -v n="${ios:-0}" -v i="${iops:-0}" -v m="${mbs:-0}" \
        'BEGIN { printf "%s %s %.1f\n", i, m, (n > 0 ? t * 1e6 / hz / n : 0) }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "n/a" }'; }

echo "target CPU: rtgtd's user + system time over the run, in us per I/O"
printf '%-26s %30s %30s %8s %8s\n' workload "iSCSI/TCP" "iSER" iSER/TCP "CPU/IO"
for l in 0:null 1:tmpfs; do
    for w in "randread 4k 32" "randwrite 4k 32" "read 128k 8" "write 128k 8"; do
        read -r rw bs qd <<<"$w"
        read -r ti tm tc <<<"$(ibench "${l%%:*}" "$rw" "$bs" "$qd")" || true
        read -r ii im ic <<<"$(ibench "${l%%:*}" "$rw" "$bs" "$qd" --iser 127.0.0.2 --eth-mtu 9000)" || true
        printf '%-26s %30s %30s %8s %8s\n' "${l#*:} $rw $bs QD$qd" \
            "${ti:-0} IOPS ${tm:-0} MB/s ${tc:-0} us" "${ii:-0} IOPS ${im:-0} MB/s ${ic:-0} us" \
            "$(ratio "${ii:-0}" "${ti:-0}")" "$(ratio "${ic:-0}" "${tc:-0}")"
    done
done
if grep -E 'panicked|ERROR' "$work/rtgtd.log"; then
    echo "bench: rtgtd logged errors" >&2
fi
echo
echo "soft-RoCE ceiling on this machine (rtgt-rdma bench, two devices over UDP loopback, MTU 4096):"
"$bin/rtgt-rdma" bench --seconds 2 2>&1 | sed 's/^/  /'
