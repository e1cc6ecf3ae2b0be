#!/usr/bin/env bash
# Ceph RBD side by side, same image, same run: librbd itself (`rbd bench`), rtgtd exporting
# the image over iSCSI/TCP through an `rbd` backstore (one gateway), rtgtd with a `file`
# backstore on a file of the same size (for comparison), and two rtgtd gateways of the same
# image at once (same wwn and serial, one `rtgt-iscsi bench` per gateway), on a throwaway
# one-node cluster (tests/ceph/cluster.sh: one mon, one memstore OSD, pool `rbd`) on 127.0.0.1.
# Rows: 4 KiB random read and write at QD32, 128 KiB sequential read and write at QD8. Each
# cell has the IOPS, MB/s and the CPU time per I/O of the process running librbd (the `rbd
# bench` client; rtgtd, both rtgtd for two gateways): user plus system time of all its
# threads, from /proc/PID/stat (rtgtd) or the shell's `time` (rbd bench), over the run,
# divided by the I/Os done. The ratios: rtgt rbd to librbd (the gateway's cost in IOPS, and in
# CPU per I/O: what serving iSCSI adds to librbd's own) and two gateways to one. A second table
# has the OSD's and the whole machine's CPU time per I/O (on one machine the OSD, rtgtd and the
# initiator share the CPUs: the machine's CPU per I/O bounds the IOPS).
#
# rbd bench counts I/Os (--io-total), it has no time limit: a first short run of each row
# (doubling its I/O count until it lasts 0.5 s) gives a rate, every measured run then asks for
# rate x --seconds I/Os, and each run's rate is the next one's estimate; the I/O phases' real
# lengths (ops / ops/sec of the summary line) are printed. MB/s of rbd bench are its ops/sec
# times the I/O size (its bytes/sec, rounded to 2-3 digits, is checked against it). rbd bench
# runs with `--rbd_cache=false`, as rtgtd runs librbd (without its cache: a completed write is
# on the OSD).
#
# Writes with two gateways: the image's exclusive lock (librbd's cooperative lock) moves to
# whichever gateway writes, so writes through both at once make it move back and forth. The
# "2 gateways" column has the row's workload through both at once (aggregate IOPS, ratio to one
# gateway); for the write rows a third table also has the two gateways' shares, and writes
# through one gateway while the other reads (the same size and depth): the hosts of a
# multipath setup that writes through the active/optimized gateway only.
#
# The image is filled first (rbd bench, sequential 4 MiB writes), so no read is of an
# unallocated object; the file (in /tmp, random data, rtgtd's default page-cache mode) is
# written back before each file measurement and read into the page cache before each read.
# All three rtgtd (two gateways, the file target) run throughout; every round measures every row
# in every column (the column order reversed in even rounds), and the medians of --rounds
# rounds are printed. Nothing is pinned to a CPU: the OSD needs CPU too.
#
# Usage: tests/bench/rbd.sh [--seconds N] [--size MiB] [--rounds R] [--keep]
# --seconds: per measurement (default 10); --size: the image and the file (default 1024, at
# most 2048: the memstore OSD holds 4 GiB); --rounds: default 3; --keep: keep the work
# directory (logs, configurations) in /tmp. Needs root, Ceph (ceph-mon, ceph-osd, rbd, rados;
# Debian: ceph, librbd1) and python3; builds rtgtd and rtgt-iscsi (release).
set -euo pipefail
cd "$(dirname "$0")/../.."
usage() {
    echo "usage: $0 [--seconds N] [--size MiB] [--rounds R] [--keep]" >&2
    exit 2
}
secs=10 size_mib=1024 rounds=3 keep=0
while (($#)); do
    case $1 in
    --seconds) secs=$2; shift ;;
    --size) size_mib=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --keep) keep=1 ;;
    *) usage ;;
    esac
    shift
done
[[ $secs =~ ^[1-9][0-9]*$ && $rounds =~ ^[1-9][0-9]*$ && $size_mib =~ ^[1-9][0-9]*$ ]] || usage
if ((size_mib > 2048)); then
    echo "bench: --size $size_mib: at most 2048 MiB (the memstore OSD holds 4 GiB)" >&2
    exit 2
fi
((EUID == 0)) || { echo "bench: needs root" >&2; exit 2; }
missing=()
for tool in ceph-mon ceph-osd rbd rados monmaptool python3 uuidgen; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
    echo "bench: not installed: ${missing[*]}" >&2
    exit 2
fi

cargo build --release -q --bin rtgtd --bin rtgt-iscsi
bin=${CARGO_TARGET_DIR:-build}/release

work=$(mktemp -d /tmp/rtgt-rbd-bench.XXXXXX)
pids=()
cleanup() {
    local rc=$? p i alive f
    if ((rc != 0)); then
        for f in "$work"/rtgtd-*.log "$work/rbd.err" "$work/bench.err"; do
            [[ -s $f ]] || continue
            echo "---- tail of $f" >&2
            tail -n 10 "$f" >&2
        done
    fi
    # Initiators still running (interrupted), then the targets: TERM, KILL after 5 s.
    for p in $(jobs -p) "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for ((i = 0; i < 50; i++)); do
        alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    tests/ceph/cluster.sh stop "$work/ceph" >/dev/null 2>&1 || true
    if ((keep)); then
        echo "bench: kept $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The cluster and the image, filled.
conf=$(tests/ceph/cluster.sh start "$work/ceph")
image=bench
rbd -c "$conf" create --size "${size_mib}M" "rbd/$image"
rbd -c "$conf" --rbd_cache=false bench --io-type write --io-pattern seq --io-size 4M --io-threads 16 \
    --io-total "${size_mib}M" "rbd/$image" >"$work/fill.log" 2>&1
used=$(rbd -c "$conf" du --format json "rbd/$image" 2>/dev/null |
    python3 -c 'import json, sys; print(sum(i["used_size"] for i in json.load(sys.stdin)["images"]) >> 20)' || echo "?")
lun=$work/lun.img
dd if=/dev/urandom of="$lun" bs=1M count="$size_mib" conv=fsync status=none
osd_pid=$(<"$work/ceph/run/osd.0.pid")
echo "bench: image rbd/$image of $size_mib MiB ($used MiB used after the fill) on a one-node memstore" \
    "cluster; file $lun of $size_mib MiB; ${secs} s per measurement, $rounds round(s), medians;" \
    "$(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

# Free ports, so that a leftover daemon of an earlier run cannot answer in our place.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
iqn_rbd=iqn.2025-01.io.rtgt:bench-rbd iqn_file=iqn.2025-01.io.rtgt:bench-file
# rtgt_config NAME TAG PORT: a gateway of the image (NAME gw1, gw2) or the file target (file).
# No API listener on TCP (the default, 127.0.0.1:8080, would be taken by the first rtgtd); the
# unix socket is in each one's state directory.
rtgt_config() {
    if [[ $1 == file ]]; then
        cat <<YAML
backstores:
  - {name: d0, type: file, path: $lun, block_size: 512}
targets:
  - name: $iqn_file
YAML
    else
        cat <<YAML
backstores:
  - name: d0
    type: rbd
    wwn: 6001405aabbccdd0011223344556677f
    serial: rbdbench01
    rbd: {image: $image, ceph_conf: $conf}
targets:
  - name: $iqn_rbd
YAML
    fi
    cat <<YAML
    portal_groups:
      - {tag: $2, portals: ['127.0.0.1:$3'], allow_any_initiator: true, luns: [{lun: 0, backstore: d0}], params: {NopInInterval: 0}}
policy: {backstore_roots: ['$work']}
rdma: {enabled: false}
api: {listen: []}
YAML
}
declare -A pid url
# start_rtgtd NAME TAG: starts it and waits until it listens
start_rtgtd() {
    local port log=$work/rtgtd-$1.log iqn=$iqn_rbd
    [[ $1 == file ]] && iqn=$iqn_file
    port=$(free_port)
    rtgt_config "$1" "$2" "$port" >"$work/rtgt-$1.yaml"
    RUST_LOG=warn "$bin/rtgtd" --config "$work/rtgt-$1.yaml" --state-dir "$work/state-$1" >"$log" 2>&1 &
    pid[$1]=$!
    pids+=("$!")
    for _ in $(seq 300); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        if ! kill -0 "${pid[$1]}" 2>/dev/null; then
            echo "bench: rtgtd ($1) did not start:" >&2
            cat "$log" >&2
            exit 1
        fi
        sleep 0.1
    done
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "bench: rtgtd ($1) does not listen on $port" >&2; exit 1; }
    url[$1]=iscsi://127.0.0.1:$port/$iqn/0
}
start_rtgtd gw1 1
start_rtgtd gw2 2
start_rtgtd file 1

# CPU time of process PID so far (utime + stime of all its threads), in clock ticks.
cpu_ticks() {
    local stat f
    read -r stat <"/proc/$1/stat"
    read -ra f <<<"${stat##*) }"
    echo $((f[11] + f[12]))
}
# CPU time every CPU of the machine has spent busy so far (user, nice, system, irq, softirq,
# steal), in clock ticks.
machine_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
hz=$(getconf CLK_TCK)
# snap -> "GW1 GW2 FILE OSD MACHINE" ticks
snap() { echo "$(cpu_ticks "${pid[gw1]}") $(cpu_ticks "${pid[gw2]}") $(cpu_ticks "${pid[file]}") $(cpu_ticks "$osd_pid") $(machine_ticks)"; }
# An initiator's report line -> "IOS IOPS MB/s MEAN_US"
parse() { sed -n 's/.* ios=\([0-9]*\) IOPS=\([0-9]*\) MB\/s=\([0-9.]*\) avg_lat=\([0-9]*\)us.*/\1 \2 \3 \4/p' | tail -1; }
bytes() { case $1 in 4k) echo 4096 ;; 128k) echo 131072 ;; esac; }

# Results: acc[COLUMN|ROW|METRIC] = the values of the rounds.
declare -A acc
add() { acc[$1|$2|$3]+="$4 "; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] + 0; else print "" }'; }
med() {
    # shellcheck disable=SC2086
    median ${acc[$1|$2|$3]:-}
}
# per_io TICKS IOS -> microseconds of CPU per I/O
per_io() { awk -v t="$1" -v n="$2" -v hz="$hz" 'BEGIN { printf "%.1f", (n > 0 ? t * 1e6 / hz / n : 0) }'; }
prepare_file() { sync "$lun"; [[ $1 == randwrite || $1 == write ]] || cat "$lun" >/dev/null; }

# rbd_bench RW BS QD OPS -> "OPS OPS_PER_SEC BYTES_PER_SEC CPU_SECONDS" of one `rbd bench` run
rbd_bench() {
    local type=read pattern=rand out
    [[ $1 == randwrite || $1 == write ]] && type="write"
    [[ $1 == read || $1 == write ]] && pattern=seq
    out=$( {
        TIMEFORMAT='cpu %3U %3S'
        time timeout $((secs * 4 + 60)) rbd -c "$conf" --rbd_cache=false bench --io-type "$type" \
            --io-pattern "$pattern" --io-size "$(bytes "$2")" --io-threads "$3" \
            --io-total "$(($4 * $(bytes "$2")))" "rbd/$image" 2>>"$work/rbd.err" || true
    } 2>&1)
    # elapsed: 5   ops: 100000   ops/sec: 19876.3   bytes/sec: 78 MiB/s
    awk '/^elapsed:/ { ops = $4; rate = $6; v = $8; u = $9
            m = (u ~ /^Ki/ ? 1024 : u ~ /^Mi/ ? 1048576 : u ~ /^Gi/ ? 1073741824 : u ~ /^Ti/ ? 1099511627776 : 1)
            bps = v * m }
         /^cpu / { cpu = $2 + $3 }
         END { if (ops > 0) printf "%d %s %.0f %s\n", ops, rate, bps, cpu }' <<<"$out"
}
declare -A rate durations
# m_librbd ROW RW BS QD: one measurement of librbd (rate[ROW] calibrated on the first call)
m_librbd() {
    local row=$1 rw=$2 bs=$3 qd=$4 n ops r bps cpu s0 s1 a b
    if [[ -z ${rate[$row]:-} ]]; then
        n=$((qd * 64))
        while :; do
            read -r ops r bps cpu <<<"$(rbd_bench "$rw" "$bs" "$qd" "$n")"
            [[ -n ${ops:-} ]] || { echo "bench: rbd bench failed ($row):" >&2; tail -5 "$work/rbd.err" >&2; exit 1; }
            awk -v o="$ops" -v r="$r" 'BEGIN { exit !(o / r >= 0.5) }' && break
            ((n < 1 << 26)) || break
            n=$((n * 2))
        done
        rate[$row]=$r
    fi
    n=$(awk -v r="${rate[$row]}" -v s="$secs" -v q="$qd" 'BEGIN { n = int(r * s); print (n < q ? q : n) }')
    s0=$(snap)
    read -r ops r bps cpu <<<"$(rbd_bench "$rw" "$bs" "$qd" "$n")"
    s1=$(snap)
    [[ -n ${ops:-} ]] || { add librbd "$row" iops 0; return; }
    rate[$row]=$r
    read -ra a <<<"$s0"
    read -ra b <<<"$s1"
    durations[$row]+="$(awk -v o="$ops" -v r="$r" 'BEGIN { printf "%.1f", o / r }') "
    add librbd "$row" iops "$(printf '%.0f' "$r")"
    add librbd "$row" mbs "$(awk -v r="$r" -v bs="$(bytes "$bs")" 'BEGIN { printf "%.1f", r * bs / 1e6 }')"
    add librbd "$row" cpu "$(awk -v c="$cpu" -v n="$ops" 'BEGIN { printf "%.1f", c * 1e6 / n }')"
    add librbd "$row" osd "$(per_io $((b[3] - a[3])) "$ops")"
    add librbd "$row" mach "$(per_io $((b[4] - a[4])) "$ops")"
    # rbd bench's bytes/sec is rounded: more than 5% off ops/sec x size is a parsing error.
    awk -v r="$r" -v bs="$(bytes "$bs")" -v b="$bps" 'BEGIN { exit !(b < 0.95 * r * bs || b > 1.05 * r * bs) }' &&
        echo "bench: rbd bench ($row): bytes/sec $bps does not match ops/sec $r x $(bytes "$bs")" >&2
    return 0
}
# ibench NAME RW BS QD -> "IOS IOPS MB/s MEAN_US" of rtgt-iscsi bench against rtgtd NAME
ibench() {
    timeout $((secs + 60)) "$bin/rtgt-iscsi" bench --url "${url[$1]}" --rw "$2" --bs "$3" --iodepth "$4" \
        --seconds "$secs" 2>>"$work/bench.err" | parse || true
}
# m_one COLUMN ROW RW BS QD: one measurement through one rtgtd (COLUMN gw1 or file)
m_one() {
    local col=$1 row=$2 rw=$3 bs=$4 qd=$5 s0 s1 a b ios iops mbs lat i=0
    [[ $col == file ]] && i=2 && prepare_file "$rw"
    s0=$(snap)
    read -r ios iops mbs lat <<<"$(ibench "$col" "$rw" "$bs" "$qd")"
    s1=$(snap)
    read -ra a <<<"$s0"
    read -ra b <<<"$s1"
    add "$col" "$row" iops "${iops:-0}"
    add "$col" "$row" mbs "${mbs:-0}"
    add "$col" "$row" lat "${lat:-0}"
    add "$col" "$row" cpu "$(per_io $((b[i] - a[i])) "${ios:-0}")"
    add "$col" "$row" osd "$(per_io $((b[3] - a[3])) "${ios:-0}")"
    add "$col" "$row" mach "$(per_io $((b[4] - a[4])) "${ios:-0}")"
}
# m_two COLUMN ROW RW BS QD RW2: gw1 runs RW, gw2 RW2 (same size and depth), at once
m_two() {
    local col=$1 row=$2 rw=$3 bs=$4 qd=$5 rw2=$6 s0 s1 a b p1 p2 i1 o1 m1 l1 i2 o2 m2 l2
    s0=$(snap)
    ibench gw1 "$rw" "$bs" "$qd" >"$work/two.1" &
    p1=$!
    ibench gw2 "$rw2" "$bs" "$qd" >"$work/two.2" &
    p2=$!
    wait "$p1" "$p2" || true
    s1=$(snap)
    read -ra a <<<"$s0"
    read -ra b <<<"$s1"
    read -r i1 o1 m1 l1 <"$work/two.1" || true
    read -r i2 o2 m2 l2 <"$work/two.2" || true
    i1=${i1:-0} o1=${o1:-0} m1=${m1:-0} l1=${l1:-0} i2=${i2:-0} o2=${o2:-0} m2=${m2:-0} l2=${l2:-0}
    add "$col" "$row" iops $((o1 + o2))
    add "$col" "$row" mbs "$(awk -v a="$m1" -v b="$m2" 'BEGIN { printf "%.1f", a + b }')"
    add "$col" "$row" iops1 "$o1"
    add "$col" "$row" iops2 "$o2"
    add "$col" "$row" lat1 "$l1"
    add "$col" "$row" lat2 "$l2"
    add "$col" "$row" cpu "$(per_io $((b[0] - a[0] + b[1] - a[1])) $((i1 + i2)))"
    add "$col" "$row" osd "$(per_io $((b[3] - a[3])) $((i1 + i2)))"
    add "$col" "$row" mach "$(per_io $((b[4] - a[4])) $((i1 + i2)))"
}

rows=("randread 4k 32" "randwrite 4k 32" "read 128k 8" "write 128k 8")
row_name() { echo "$2 $1 QD$3"; }
for ((round = 1; round <= rounds; round++)); do
    cols=(librbd gw1 file two)
    ((round % 2)) || cols=(two file gw1 librbd)
    for w in "${rows[@]}"; do
        read -r rw bs qd <<<"$w"
        row=$(row_name "$rw" "$bs" "$qd")
        for c in "${cols[@]}"; do
            case $c in
            librbd) m_librbd "$row" "$rw" "$bs" "$qd" ;;
            gw1 | file) m_one "$c" "$row" "$rw" "$bs" "$qd" ;;
            two) m_two two "$row" "$rw" "$bs" "$qd" "$rw" ;;
            esac
        done
        # Writes through gw1 while gw2 reads.
        case $rw in
        randwrite) m_two mixed "$row" "$rw" "$bs" "$qd" randread ;;
        write) m_two mixed "$row" "$rw" "$bs" "$qd" read ;;
        esac
    done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "n/a" }'; }
# cell COLUMN ROW -> "IOPS MB/s CPU" (medians), or "failed" thrice
cell() {
    local i
    i=$(med "$1" "$2" iops)
    if [[ -z $i || $i == 0 ]]; then
        echo "failed - -"
        return
    fi
    echo "$i $(med "$1" "$2" mbs) $(med "$1" "$2" cpu)"
}
echo
echo "IOPS, MB/s and us/IO: CPU time per I/O (user + system, all threads) of the process running librbd"
echo "(rbd bench; rtgtd; both rtgtd for two gateways); medians of $rounds round(s) of $secs s. Ratios: rtgt"
echo "rbd to librbd (IOPS, us/IO), two gateways (aggregate of two initiators) to one (IOPS)"
printf '%-18s | %-22s | %-38s | %-22s | %-30s\n' "" "librbd (rbd bench)" "rtgt rbd, 1 gateway      / librbd" \
    "rtgt file" "rtgt rbd, 2 gateways   / 1 gw"
printf '%-18s | %7s %7s %6s | %7s %7s %6s %7s %7s | %7s %7s %6s | %7s %7s %6s %6s\n' workload \
    IOPS MB/s us/IO IOPS MB/s us/IO IOPS us/IO IOPS MB/s us/IO IOPS MB/s us/IO IOPS
for w in "${rows[@]}"; do
    read -r rw bs qd <<<"$w"
    row=$(row_name "$rw" "$bs" "$qd")
    read -r li lm lc <<<"$(cell librbd "$row")"
    read -r gi gm gc <<<"$(cell gw1 "$row")"
    read -r xi xm xc <<<"$(cell file "$row")"
    read -r ti tm tc <<<"$(cell two "$row")"
    printf '%-18s | %7s %7s %6s | %7s %7s %6s %7s %7s | %7s %7s %6s | %7s %7s %6s %6s\n' "$row" \
        "$li" "$lm" "$lc" "$gi" "$gm" "$gc" "$(ratio "$gi" "$li")" "$(ratio "$gc" "$lc")" \
        "$xi" "$xm" "$xc" "$ti" "$tm" "$tc" "$(ratio "$ti" "$gi")"
done
echo
echo "CPU time per I/O in us: the OSD's, and the whole machine's (user, nice, system, irq, softirq, steal"
echo "of all CPUs: initiator, target, OSD and kernel; $(nproc) CPUs bound the IOPS at $(nproc)e6 / this)"
printf '%-18s | %-26s | %-35s\n' "" "OSD us/IO" "machine us/IO"
printf '%-18s | %8s %8s %8s | %8s %8s %8s %8s\n' workload librbd "rbd 1gw" "rbd 2gw" librbd "rbd 1gw" file "rbd 2gw"
for w in "${rows[@]}"; do
    read -r rw bs qd <<<"$w"
    row=$(row_name "$rw" "$bs" "$qd")
    printf '%-18s | %8s %8s %8s | %8s %8s %8s %8s\n' "$row" "$(med librbd "$row" osd)" "$(med gw1 "$row" osd)" \
        "$(med two "$row" osd)" "$(med librbd "$row" mach)" "$(med gw1 "$row" mach)" \
        "$(med file "$row" mach)" "$(med two "$row" mach)"
done
echo
echo "Writes with two gateways (IOPS, mean latency in us): one gateway alone (the column above), both"
echo "writing at once (the exclusive lock moves between them), gateway 1 writing while gateway 2 reads"
echo "(same size and depth; 'alone': that read through one gateway, from the read row above)"
printf '%-18s | %-14s | %-29s | %-38s\n' "" "1 gw writes" "both write" "gw1 writes, gw2 reads"
printf '%-18s | %7s %6s | %7s %7s %6s %6s | %7s %6s %7s %6s %7s\n' workload IOPS lat "gw1" "gw2" "lat1" "lat2" \
    write lat read lat alone
for w in "${rows[@]}"; do
    read -r rw bs qd <<<"$w"
    [[ $rw == randwrite || $rw == write ]] || continue
    row=$(row_name "$rw" "$bs" "$qd")
    rrow=$(row_name "$([[ $rw == write ]] && echo read || echo randread)" "$bs" "$qd")
    printf '%-18s | %7s %6s | %7s %7s %6s %6s | %7s %6s %7s %6s %7s\n' "$row" "$(med gw1 "$row" iops)" \
        "$(med gw1 "$row" lat)" "$(med two "$row" iops1)" "$(med two "$row" iops2)" "$(med two "$row" lat1)" \
        "$(med two "$row" lat2)" "$(med mixed "$row" iops1)" "$(med mixed "$row" lat1)" \
        "$(med mixed "$row" iops2)" "$(med mixed "$row" lat2)" "$(med gw1 "$rrow" iops)"
done
echo
echo "rbd bench I/O phases lasted (s, per row over the rounds):"
for w in "${rows[@]}"; do
    read -r rw bs qd <<<"$w"
    row=$(row_name "$rw" "$bs" "$qd")
    echo "  $row: ${durations[$row]:-none}"
done
if [[ -s $work/bench.err ]]; then
    echo "bench: the initiator reported errors:" >&2
    sort "$work/bench.err" | uniq -c | sort -rn | head -10 >&2
fi
for n in gw1 gw2 file; do
    if grep -E 'panicked|ERROR' "$work/rtgtd-$n.log" | head -5; then
        echo "bench: rtgtd ($n) logged errors (above)" >&2
    fi
done
