#!/usr/bin/env bash
# NVMe over Fabrics against the SCSI fabrics of the same transport, same rtgtd, same
# backstores, same run: NVMe/TCP against iSCSI/TCP and NVMe/RDMA against iSER, with rtgt's own
# hosts (`rtgt-nvme bench` over --queues I/O queues over TCP, and over one I/O queue with
# `--rdma`, one queue pair as iSER's one session has; `rtgt-iscsi bench` on one session, over
# TCP and with `--iser`) against a null and a
# tmpfs-backed backstore, each both a SCSI LUN and an NVMe namespace: 4 KiB random read and
# write at iodepth 32 and 128 KiB sequential read and write at iodepth 8, each row run
# --rounds times with the fabrics taking turns, medians. Per row and fabric: IOPS, MB/s,
# rtgtd's CPU time per I/O; the ratios of NVMe to SCSI; the mean and p99 latency the host saw
# and the whole machine's CPU time per I/O (host, rtgtd and kernel).
#
# Usage: tests/bench/nvme.sh [--seconds N] [--rounds N] [--size MiB] [--queues N] [--poll MICROS]
#                            [--disable-sqflow] [--cpus TARGET,INITIATOR] [--tcp-only]
#                            [--only REGEX]
# --only: the rows whose name ("null randwrite 4k QD32", "tmpfs read 128k QD8", ...) matches.
# --disable-sqflow: the NVMe/TCP host disables SQ flow control, so rtgtd ends successful reads
# with C2HData's SUCCESS flag instead of a response capsule (Linux's nvme-tcp does not ask
# for it by default). --poll: microseconds the RDMA hosts poll their device before sleeping
# (default 1000, as tests/bench/fabrics.sh). Runs in a network namespace of its own (needs
# root; --tcp-only does not): rtgtd on 127.0.0.1 (iSCSI 23260, NVMe/TCP and NVMe/RDMA 24420,
# soft-RoCE UDP 4791, Ethernet MTU 9000), the RDMA hosts' devices on 127.0.0.2. Builds rtgtd,
# rtgt-iscsi and rtgt-nvme (release).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=10 rounds=3 size_mib=1024 queues=2 sqflow=() cpus="" poll=1000 rdma=1 only=""
args=("$@")
while (($#)); do
    case $1 in
    --seconds) secs=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --size) size_mib=$2; shift ;;
    --queues) queues=$2; shift ;;
    --poll) poll=$2; shift ;;
    --disable-sqflow) sqflow=(--disable-sqflow) ;;
    --cpus) cpus=$2; shift ;;
    --tcp-only) rdma="" ;;
    --only) only=$2; shift ;;
    *) echo "usage: $0 [--seconds N] [--rounds N] [--size MiB] [--queues N] [--poll MICROS] [--disable-sqflow] [--cpus TARGET,INITIATOR] [--tcp-only] [--only REGEX]" >&2; exit 2 ;;
    esac
    shift
done
# shellcheck source=tests/bench/lib.sh
source tests/bench/lib.sh
if [[ -z ${RTGT_BENCH_NETNS:-} ]]; then
    cargo build --release -q --bin rtgtd --bin rtgt-iscsi --bin rtgt-nvme
    ((rdma == 0)) || in_own_netns "$0" "${args[@]}"
fi
bin=${CARGO_TARGET_DIR:-build}/release
on_target=() on_initiator=()
if [[ -n $cpus ]]; then
    on_target=(taskset -c "${cpus%,*}") on_initiator=(taskset -c "${cpus#*,}")
fi
work=$(mktemp -d /dev/shm/rtgt-nvme-bench.XXXXXX)
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
iqn=iqn.2025-01.io.rtgt:bench-nvme nqn=nqn.2025-01.io.rtgt:bench-nvme
port=23260 nvme_port=24420
if ((rdma)); then
    rdma_yaml="rdma: {addresses: [127.0.0.1], eth_mtu: 9000}"
    rdma_port="{id: 2, transport: rdma, listen: '127.0.0.1:$nvme_port'}"
else
    rdma_yaml="rdma: {enabled: false}" rdma_port=""
fi
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
nvme:
  subsystems:
    - nqn: $nqn
      allow_any_host: true
      namespaces:
        - {nsid: 1, backstore: null, share_with_scsi: true}
        - {nsid: 2, backstore: tmpfs, share_with_scsi: true}
  ports: [{id: 1, transport: tcp, listen: '127.0.0.1:$nvme_port'}${rdma_port:+, $rdma_port}]
$rdma_yaml
api: {listen: []}
policy: {backstore_roots: ['$work']}
YAML
RUST_LOG=warn "${on_target[@]}" "$bin/rtgtd" --config "$work/rtgt.yaml" --state-dir "$work/state" >"$work/rtgtd.log" 2>&1 &
pids+=($!)
rtgtd_pid=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$nvme_port) 2>/dev/null && break; sleep 0.1; done

# median FILE COLUMN -> the median of a column of rows
median() { sort -n -k"$2","$2" "$1" | awk -v c="$2" '{ v[NR] = $c } END { print v[int((NR + 1) / 2)] }'; }
# medians FILE -> the row of the medians of each column
medians() {
    local c out=()
    for c in 1 2 3 4 5 6; do out+=("$(median "$1" "$c")"); done
    echo "${out[*]}"
}
rdma_opts=(--eth-mtu 9000 --busy-poll "$poll")
# run FABRIC LUN RW BS QD -> one measured run of FABRIC (tcp, nvme, iser, nvme-rdma)
run() {
    local fab=$1 l=$2 rw=$3 bs=$4 qd=$5 cmd
    case $fab in
    tcp | iser)
        cmd=("$bin/rtgt-iscsi")
        [[ $fab == iser ]] && cmd+=(--iser 127.0.0.2 "${rdma_opts[@]}")
        cmd+=(bench --url "iscsi://127.0.0.1:$port/$iqn/$l")
        ;;
    nvme | nvme-rdma)
        cmd=("$bin/rtgt-nvme" --addr "127.0.0.1:$nvme_port" --nqn "$nqn" --nsid "$((l + 1))")
        if [[ $fab == nvme ]]; then
            cmd+=(--queues "$queues" "${sqflow[@]}")
        else
            cmd+=(--queues 1 --rdma 127.0.0.2 "${rdma_opts[@]}")
        fi
        cmd+=(bench)
        ;;
    esac
    measure "${cmd[@]}" --rw "$rw" --bs "$bs" --iodepth "$qd" --seconds "$secs"
}
fabrics=(tcp nvme)
((rdma)) && fabrics+=(iser nvme-rdma)
echo "rtgtd: a null and a tmpfs backstore, LUNs 0 and 1 over iSCSI/TCP${rdma:+ and iSER}, namespaces 1 and 2 over NVMe/TCP${rdma:+ and NVMe/RDMA}"
echo "NVMe/TCP: $queues I/O queue(s)${sqflow:+, SQ flow control disabled}${rdma:+; NVMe/RDMA: 1 I/O queue}; ${secs} s a run, medians of $rounds rounds"
cell() { printf '%s IOPS %s MB/s %s us' "${1:-0}" "${2:-0}" "${3:-0}"; }
hdr() { printf '%-22s %30s %30s %7s %7s\n' workload "$1" "$2" IOPS CPU/IO; }
line() { printf '%-22s %30s %30s %7s %7s\n' "$1" "$(cell "$2" "$3" "$4")" "$(cell "$5" "$6" "$7")" "$(ratio "$5" "$2")" "$(ratio "$7" "$4")"; }
tcp_rows=() rdma_rows=() lat_rows=() machine_rows=()
for l in 0:null 1:tmpfs; do
    for w in "randread 4k 32" "randwrite 4k 32" "read 128k 8" "write 128k 8"; do
        read -r rw bs qd <<<"$w"
        name="${l#*:} $rw $bs QD$qd"
        [[ -z $only || $name =~ $only ]] || continue
        for f in "${fabrics[@]}"; do : >"$work/$f"; done
        for ((r = 0; r < rounds; r++)); do
            for f in "${fabrics[@]}"; do run "$f" "${l%%:*}" "$rw" "$bs" "$qd" >>"$work/$f" || true; done
        done
        declare -A m=()
        for f in "${fabrics[@]}"; do m[$f]=$(medians "$work/$f"); done
        read -r ti tm tc ta tp tx <<<"${m[tcp]}"
        read -r ni nm nc na np nx <<<"${m[nvme]}"
        tcp_rows+=("$(line "$name" "$ti" "$tm" "$tc" "$ni" "$nm" "$nc")")
        lat=$(printf '%-22s %7s/%-7s %7s/%-7s' "$name" "$ta" "$na" "$tp" "$np")
        mach=$(printf '%-22s %9s %9s %7s' "$name" "$tx" "$nx" "$(ratio "$nx" "$tx")")
        if ((rdma)); then
            read -r ii im ic ia ip ix <<<"${m[iser]}"
            read -r ri rm rc ra rp rx <<<"${m[nvme-rdma]}"
            rdma_rows+=("$(line "$name" "$ii" "$im" "$ic" "$ri" "$rm" "$rc")")
            lat+=$(printf ' %7s/%-7s %7s/%-7s' "$ia" "$ra" "$ip" "$rp")
            mach+=$(printf ' %9s %9s %7s' "$ix" "$rx" "$(ratio "$rx" "$ix")")
        fi
        lat_rows+=("$lat") machine_rows+=("$mach")
    done
done
echo
echo "NVMe/TCP against iSCSI/TCP (ratios: NVMe/TCP over iSCSI/TCP; CPU/IO is rtgtd's)"
hdr "iSCSI/TCP" "NVMe/TCP"
printf '%s\n' "${tcp_rows[@]}"
if ((rdma)); then
    echo
    echo "NVMe/RDMA against iSER (ratios: NVMe/RDMA over iSER; CPU/IO is rtgtd's)"
    hdr "iSER" "NVMe/RDMA"
    printf '%s\n' "${rdma_rows[@]}"
fi
echo
echo "latency seen by the host in us, SCSI/NVMe: mean, p99 over TCP${rdma:+; then over RDMA}"
printf '%s\n' "${lat_rows[@]}"
echo
echo "the whole machine's CPU per I/O in us (host, rtgtd and kernel share these CPUs): SCSI, NVMe, NVMe/SCSI over TCP${rdma:+; then over RDMA}"
printf '%s\n' "${machine_rows[@]}"
if grep -E 'panicked|ERROR' "$work/rtgtd.log"; then
    echo "bench: rtgtd logged errors" >&2
    exit 1
fi
