#!/usr/bin/env bash
# iSCSI/TCP, iSER and SRP side by side, same rtgtd, same LUNs, same run: rtgt's own initiators
# (`rtgt-iscsi bench` over TCP and with `--iser`, `rtgt-srp bench`) against a null LUN and a
# tmpfs-backed file LUN, 4 KiB random read and write at iodepth 32 and 128 KiB sequential read
# and write at iodepth 8, with rtgtd's CPU time per I/O for each and the ratios of both RDMA
# fabrics to TCP, the mean and p99 latency each initiator saw, and the whole machine's CPU time
# per I/O (initiator, target and kernel: on a machine both ends share, the bound on IOPS); two initiators at once (4 KiB random read, QD32 each: rtgtd's engine threads,
# one per CPU, each take one connection); then the soft-RoCE ceiling of this machine (`rtgt-rdma bench`: RDMA
# WRITE/READ bandwidth of two rtgt devices over UDP loopback, no SCSI) for the RDMA figures to
# be read against.
#
# SRP writes of 4 KiB carry their data in the SRP_CMD (`--mode immediate`), as Linux's ib_srp
# does for writes up to 8 KiB; larger writes are fetched by RDMA READ.
#
# The RDMA initiators poll their device for --poll microseconds (default 1000) after a datagram
# moved before they sleep, as RDMA consumers poll their completion queues; the TCP initiator
# sleeps at once (its receive work is the kernel's: polling gave it -11% to +15% here, and a
# polling initiator takes CPU from the kernel and from rtgtd). `--poll 0` runs all three
# without polling.
#
# Usage: tests/bench/fabrics.sh [--seconds N] [--size MiB] [--poll MICROS]
#                               [--cpus TARGET,INITIATOR | --no-pin] [--rows REGEX]
# --rows runs only the workloads whose name (as printed, e.g. "tmpfs write 128k QD8") matches
# the extended regular expression, and skips the soft-RoCE ceiling unless it matches "ceiling".
# Not pinned by default: over RDMA both ends run a soft-RoCE engine in their own process, while
# over TCP half of the work is the kernel's; pinning each side to one CPU charges that difference
# to the RDMA fabrics (`--cpus 1,0` pins anyway, as run.sh does).
# Runs in a network namespace of its own (needs root), so UDP 4791 is free even where the
# rdma_rxe module holds it: rtgtd's device on 127.0.0.1, the initiator's on 127.0.0.2, an
# Ethernet MTU of 9000 (RDMA path MTU 4096). Builds rtgtd, rtgt-iscsi and rtgt-rdma (release).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=10 size_mib=1024 cpus="" poll=1000 rows=""
args=("$@")
while (($#)); do
    case $1 in
    --seconds) secs=$2; shift ;;
    --size) size_mib=$2; shift ;;
    --cpus) cpus=$2; shift ;;
    --no-pin) cpus="" ;;
    --poll) poll=$2; shift ;;
    --rows) rows=$2; shift ;;
    *) echo "usage: $0 [--seconds N] [--size MiB] [--poll MICROS] [--cpus TARGET,INITIATOR | --no-pin] [--rows REGEX]" >&2; exit 2 ;;
    esac
    shift
done
# shellcheck source=tests/bench/lib.sh
source tests/bench/lib.sh
if [[ -z ${RTGT_BENCH_NETNS:-} ]]; then
    cargo build --release -q --bin rtgtd --bin rtgt-iscsi --bin rtgt-srp --bin rtgt-rdma
    in_own_netns "$0" "${args[@]}"
fi

on_target=() on_initiator=()
if [[ -n $cpus ]]; then
    on_target=(taskset -c "${cpus%,*}") on_initiator=(taskset -c "${cpus#*,}")
    echo "bench: rtgtd on CPU ${cpus%,*}, initiator on CPU ${cpus#*,}"
fi
bin=${CARGO_TARGET_DIR:-build}/release
work=$(mktemp -d /dev/shm/rtgt-fabrics-bench.XXXXXX)
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
iqn=iqn.2025-01.io.rtgt:bench-fabrics
port=3260 srp_port=3261
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
srp:
  - name: bench
    listen: ['127.0.0.1:$srp_port']
    allow_any_initiator: true
    luns: [{lun: 0, backstore: null}, {lun: 1, backstore: tmpfs}]
policy: {backstore_roots: ['$work']}
YAML
RUST_LOG=warn,rtgt_srp::service=info "${on_target[@]}" "$bin/rtgtd" --config "$work/rtgt.yaml" --state-dir "$work/state" >"$work/rtgtd.log" 2>&1 &
pids+=($!)
rtgtd_pid=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
# The SRP target port as rtgt-srp names it (logged by rtgtd at info level).
srp_target=""
for _ in $(seq 50); do
    srp_target=$(grep -o "id_ext=[0-9a-f]*,ioc_guid=[0-9a-f]*,dest=127.0.0.1:$srp_port" "$work/rtgtd.log" | head -1 || true)
    [[ -n $srp_target ]] && break
    sleep 0.1
done
[[ -n $srp_target ]] || { echo "bench: rtgtd serves no SRP target port:" >&2; cat "$work/rtgtd.log" >&2; exit 1; }

# ibench LUN RW BS QD [--iser ...] / sbench LUN RW BS QD -> as measure
ibench() {
    local lun=$1 rw=$2 bs=$3 qd=$4
    shift 4
    measure "$bin/rtgt-iscsi" "$@" bench --url "iscsi://127.0.0.1:$port/$iqn/$lun" \
        --rw "$rw" --bs "$bs" --iodepth "$qd" --seconds "$secs"
}
sbench() {
    local mode=direct
    [[ $2 == randwrite && $3 == 4k ]] && mode=immediate
    measure "$bin/rtgt-srp" --lun "$1" --eth-mtu 9000 --busy-poll "$poll" bench --target "$srp_target" --mode "$mode" \
        --rw "$2" --bs "$3" --iodepth "$4" --seconds "$secs"
}
# pair FABRIC LUN -> "IOPS MB/s TARGET_CPU_US_PER_IO" of two initiators at once (from 127.0.0.2
# and 127.0.0.3), 4 KiB random reads at QD32 each: rtgtd's engine threads each take one.
pair() {
    local fab=$1 lun=$2 t0 t1 m0 m1 i cmd pp=()
    t0=$(target_ticks) m0=$(machine_ticks)
    for i in 2 3; do
        case $fab in
        tcp) cmd=("$bin/rtgt-iscsi") ;;
        iser) cmd=("$bin/rtgt-iscsi" --iser "127.0.0.$i" --eth-mtu 9000 --busy-poll "$poll") ;;
        srp) cmd=("$bin/rtgt-srp" --local "127.0.0.$i" --initiator-id "$(printf '0x%032x' "$((0x72730 + i))")" --lun "$lun" --eth-mtu 9000 --busy-poll "$poll") ;;
        esac
        if [[ $fab == srp ]]; then
            cmd+=(bench --target "$srp_target" --mode direct)
        else
            cmd+=(bench --url "iscsi://127.0.0.1:$port/$iqn/$lun")
        fi
        "${on_initiator[@]}" "${cmd[@]}" --rw randread --bs 4k --iodepth 32 --seconds "$secs" \
            >"$work/pair.$i" 2>>"$work/bench.err" &
        pp+=($!)
    done
    wait "${pp[@]}" || true
    t1=$(target_ticks) m1=$(machine_ticks)
    # Sums; the latencies are the worse initiator's.
    cat "$work/pair.2" "$work/pair.3" | parse |
        awk -v t="$((t1 - t0))" -v mt="$((m1 - m0))" -v hz="$hz" '{ n += $1; i += $2; m += $3
                if ($4 > a) a = $4; if ($5 > p) p = $5 }
            END { printf "%d %.1f %.1f %d %d %.1f\n", i, m, (n > 0 ? t * 1e6 / hz / n : 0), a, p,
                  (n > 0 ? mt * 1e6 / hz / n : 0) }'
}

echo "IOPS, MB/s and target CPU (rtgtd's user + system time over the run, in us per I/O);"
echo "the ratios are IOPS and CPU per I/O of iSER and SRP to iSCSI/TCP"
printf '%-26s %27s %27s %27s %11s %11s\n' workload "iSCSI/TCP" "iSER" "SRP" "iSER/TCP" "SRP/TCP"
cell() { printf '%s IOPS %s MB/s %s us' "${1:-0}" "${2:-0}" "${3:-0}"; }
lat_rows=() cpu_rows=()
# row NAME "TCP" "ISER" "SRP": each "IOPS MB/s CPU MEAN P99 MACHINE_CPU"; prints the row, keeps
# the latencies and the machine's CPU per I/O.
row() {
    local ti tm tc ta tp tx ii im ic ia ip ix si sm sc sa sp sx
    read -r ti tm tc ta tp tx <<<"$2"
    read -r ii im ic ia ip ix <<<"$3"
    read -r si sm sc sa sp sx <<<"$4"
    printf '%-26s %27s %27s %27s %5s %5s %5s %5s\n' "$1" \
        "$(cell "$ti" "$tm" "$tc")" "$(cell "$ii" "$im" "$ic")" "$(cell "$si" "$sm" "$sc")" \
        "$(ratio "${ii:-0}" "${ti:-0}")" "$(ratio "${ic:-0}" "${tc:-0}")" \
        "$(ratio "${si:-0}" "${ti:-0}")" "$(ratio "${sc:-0}" "${tc:-0}")"
    lat_rows+=("$(printf '%-26s %10s %10s %10s %10s %10s %10s' "$1" "${ta:-0}" "${tp:-0}" \
        "${ia:-0}" "${ip:-0}" "${sa:-0}" "${sp:-0}")")
    cpu_rows+=("$(printf '%-26s %10s %10s %10s %10s %10s' "$1" "${tx:-0}" "${ix:-0}" "${sx:-0}" \
        "$(ratio "${ix:-0}" "${tx:-0}")" "$(ratio "${sx:-0}" "${tx:-0}")")")
}
# wanted NAME: whether --rows selects the workload NAME
wanted() { [[ -z $rows || $1 =~ $rows ]]; }
for l in 0:null 1:tmpfs; do
    for w in "randread 4k 32" "randwrite 4k 32" "read 128k 8" "write 128k 8"; do
        read -r rw bs qd <<<"$w"
        wanted "${l#*:} $rw $bs QD$qd" || continue
        row "${l#*:} $rw $bs QD$qd" "$(ibench "${l%%:*}" "$rw" "$bs" "$qd" || true)" \
            "$(ibench "${l%%:*}" "$rw" "$bs" "$qd" --iser 127.0.0.2 --eth-mtu 9000 --busy-poll "$poll" || true)" \
            "$(sbench "${l%%:*}" "$rw" "$bs" "$qd" || true)"
    done
done
for l in 0:null 1:tmpfs; do
    wanted "${l#*:} randread 4k QD32 x2" || continue
    row "${l#*:} randread 4k QD32 x2" "$(pair tcp "${l%%:*}" || true)" \
        "$(pair iser "${l%%:*}" || true)" "$(pair srp "${l%%:*}" || true)"
done
echo
echo "latency seen by the initiator, mean and 99th percentile in us (x2: the worse of the two)"
printf '%-26s %10s %10s %10s %10s %10s %10s\n' workload "TCP mean" "TCP p99" "iSER mean" \
    "iSER p99" "SRP mean" "SRP p99"
printf '%s\n' "${lat_rows[@]}"
echo
echo "the whole machine's CPU per I/O in us (initiator, target and kernel; both ends share these CPUs,"
echo "so IOPS over the machine's CPUs is bounded by its inverse), with the ratios to iSCSI/TCP"
printf '%-26s %10s %10s %10s %10s %10s\n' workload TCP iSER SRP iSER/TCP SRP/TCP
printf '%s\n' "${cpu_rows[@]}"
if grep -E 'panicked|ERROR' "$work/rtgtd.log"; then
    echo "bench: rtgtd logged errors" >&2
fi
wanted ceiling || exit 0
echo
echo "soft-RoCE ceiling on this machine (rtgt-rdma bench, two devices over UDP loopback, MTU 4096):"
"$bin/rtgt-rdma" bench --seconds 2 --busy-poll "$poll" 2>&1 | sed 's/^/  /'
