#!/usr/bin/env bash
# NVMe/TCP against iSCSI/TCP, same rtgtd, same backstores, same run: rtgt's own hosts
# (`rtgt-nvme bench` over --queues I/O queues, `rtgt-iscsi bench` on one session) against a
# null and a tmpfs-backed backstore, each both a SCSI LUN and an NVMe namespace: 4 KiB random
# read and write at iodepth 32 and 128 KiB sequential read and write at iodepth 8, each row
# run --rounds times with the two fabrics taking turns, medians. Per row: IOPS, MB/s, rtgtd's
# CPU time per I/O, the mean and p99 latency the host saw, the whole machine's CPU time per
# I/O (host, rtgtd and kernel), and the ratios of NVMe/TCP to iSCSI/TCP.
#
# Usage: tests/bench/nvme.sh [--seconds N] [--rounds N] [--size MiB] [--queues N]
#                            [--disable-sqflow] [--cpus TARGET,INITIATOR]
# --disable-sqflow: the NVMe host disables SQ flow control, so rtgtd ends successful reads
# with C2HData's SUCCESS flag instead of a response capsule (Linux's nvme-tcp does not ask
# for it by default). Builds rtgtd, rtgt-iscsi and rtgt-nvme (release); listens on 127.0.0.1
# ports 23260 (iSCSI) and 24420 (NVMe/TCP).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=10 rounds=3 size_mib=1024 queues=2 sqflow=() cpus=""
while (($#)); do
    case $1 in
    --seconds) secs=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --size) size_mib=$2; shift ;;
    --queues) queues=$2; shift ;;
    --disable-sqflow) sqflow=(--disable-sqflow) ;;
    --cpus) cpus=$2; shift ;;
    *) echo "usage: $0 [--seconds N] [--rounds N] [--size MiB] [--queues N] [--disable-sqflow] [--cpus TARGET,INITIATOR]" >&2; exit 2 ;;
    esac
    shift
done
cargo build --release -q --bin rtgtd --bin rtgt-iscsi --bin rtgt-nvme
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
  ports: [{id: 1, transport: tcp, listen: '127.0.0.1:$nvme_port'}]
rdma: {enabled: false}
api: {listen: []}
policy: {backstore_roots: ['$work']}
YAML
RUST_LOG=warn "${on_target[@]}" "$bin/rtgtd" --config "$work/rtgt.yaml" --state-dir "$work/state" >"$work/rtgtd.log" 2>&1 &
pids+=($!)
rtgtd_pid=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$nvme_port) 2>/dev/null && break; sleep 0.1; done
# shellcheck source=tests/bench/lib.sh
source tests/bench/lib.sh

# median FILE COLUMN -> the median of a column of rows
median() { sort -n -k"$2","$2" "$1" | awk -v c="$2" '{ v[NR] = $c } END { print v[int((NR + 1) / 2)] }'; }
# medians FILE -> the row of the medians of each column
medians() {
    local c out=()
    for c in 1 2 3 4 5 6; do out+=("$(median "$1" "$c")"); done
    echo "${out[*]}"
}
echo "rtgtd: a null and a tmpfs backstore, LUNs 0 and 1 over iSCSI/TCP, namespaces 1 and 2 over NVMe/TCP"
echo "NVMe/TCP: $queues I/O queue(s)${sqflow:+, SQ flow control disabled}; ${secs} s a run, medians of $rounds rounds"
printf '%-22s %30s %30s %9s %9s %11s %11s\n' workload "iSCSI/TCP" "NVMe/TCP" "IOPS" "CPU/IO" "mean us" "p99 us"
cell() { printf '%s IOPS %s MB/s %s us' "$1" "$2" "$3"; }
machine_rows=()
for l in 0:null 1:tmpfs; do
    for w in "randread 4k 32" "randwrite 4k 32" "read 128k 8" "write 128k 8"; do
        read -r rw bs qd <<<"$w"
        : >"$work/tcp" && : >"$work/nvme"
        for ((r = 0; r < rounds; r++)); do
            measure "$bin/rtgt-iscsi" bench --url "iscsi://127.0.0.1:$port/$iqn/${l%%:*}" \
                --rw "$rw" --bs "$bs" --iodepth "$qd" --seconds "$secs" >>"$work/tcp" || true
            measure "$bin/rtgt-nvme" --addr "127.0.0.1:$nvme_port" --nqn "$nqn" \
                --nsid "$((${l%%:*} + 1))" --queues "$queues" "${sqflow[@]}" bench \
                --rw "$rw" --bs "$bs" --iodepth "$qd" --seconds "$secs" >>"$work/nvme" || true
        done
        read -r ti tm tc ta tp tx <<<"$(medians "$work/tcp")"
        read -r ni nm nc na np nx <<<"$(medians "$work/nvme")"
        printf '%-22s %30s %30s %9s %9s %5s/%-5s %5s/%-5s\n' "${l#*:} $rw $bs QD$qd" \
            "$(cell "$ti" "$tm" "$tc")" "$(cell "$ni" "$nm" "$nc")" \
            "$(ratio "$ni" "$ti")" "$(ratio "$nc" "$tc")" "$ta" "$na" "$tp" "$np"
        machine_rows+=("$(printf '%-22s %10s %10s %9s' "${l#*:} $rw $bs QD$qd" "$tx" "$nx" "$(ratio "$nx" "$tx")")")
    done
done
echo "(IOPS and CPU/IO: NVMe/TCP over iSCSI/TCP; latencies: iSCSI/NVMe)"
echo
echo "the whole machine's CPU per I/O in us (host, rtgtd and kernel share these CPUs)"
printf '%-22s %10s %10s %9s\n' workload "iSCSI/TCP" "NVMe/TCP" "NVMe/TCP"
printf '%s\n' "${machine_rows[@]}"
if grep -E 'panicked|ERROR' "$work/rtgtd.log"; then
    echo "bench: rtgtd logged errors" >&2
    exit 1
fi
