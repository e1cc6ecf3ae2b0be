#!/usr/bin/env bash
# Side-by-side iSCSI/TCP benchmark on 127.0.0.1: rtgtd and Debian's tgtd serve the same file in
# turn, in matching cache modes, and the script prints IOPS and the target's CPU time per I/O.
#
#   page-cache: rtgtd with `direct: false` against tgtd's default (buffered rdwr backing store)
#   direct:     rtgtd with `direct: true` against tgtd with `--bsoflags direct` (O_DIRECT)
#
# tgtd gets rtgtd's session limits (256 KiB data segments, 1 MiB bursts, InitialR2T=No) instead
# of its own defaults (8 KiB segments, InitialR2T=Yes), so both move data in PDUs of one size.
#
# Usage: tests/bench/run.sh [--seconds N] [--rounds N] [--size MiB] [--backing disk|tmpfs]
#                           [--dir DIR] [--mode page-cache|direct|both]
#                           [--cpus TARGET,INITIATOR | --no-pin] [--no-srp]
#
# The file (--size MiB, default 1024, filled with random data and written back, so fully
# allocated) lives by default on a disk file system: $TMPDIR (or /tmp), else build/ when that
# is a memory file system; --dir picks the directory, --backing tmpfs puts it in /dev/shm.
# Before every measurement the file's dirty pages are written back, and then in page-cache
# mode the whole file is read into the page cache, in direct mode dropped from it, so both
# targets start each measurement from the same state.
#
# Rows: 4 KiB random read at QD1 and QD32 and 128 KiB sequential read at QD8 with libiscsi's
# iscsi-perf; 4 KiB random write at QD1 and QD32 and 128 KiB sequential write at QD8 with rtgt's
# own initiator (`rtgt-iscsi bench`, the same tool and data for both targets); then 4 KiB random
# read at QD32 and 128 KiB sequential read at QD8 with rtgt-iscsi too, since iscsi-perf (one
# thread copying every Data-In) can be the limit before the target is. Every row is
# measured --rounds times (default 3), tgtd and rtgtd taking turns (the first of the pair
# alternating between rounds), and the medians are printed. Next to the IOPS the target's CPU
# time per I/O: user plus system time of the target process, all its threads (io_uring
# workers included), from /proc/PID/stat over the measurement, divided by the I/Os done; the
# percentage after it is how busy that made the target's CPU.
#
# By default (two or more CPUs) tgtd, rtgtd and the iperf3 server run on CPU 1 and every
# initiator on CPU 0. Then the ceilings (fio with io_uring on the file in each mode, iperf3
# over loopback) and, unless --no-srp, the same rtgtd LUN over SRP (soft-RoCE on 127.0.0.1)
# and over iSCSI/TCP through rtgt's own initiators, on the same file in page-cache mode (direct
# mode when only that was asked).
# Needs: tgt, libiscsi-bin, fio, iperf3 (Debian packages) and a release build of rtgtd,
# rtgt-iscsi and rtgt-srp (built here, into $CARGO_TARGET_DIR or build/).
set -euo pipefail
cd "$(dirname "$0")/../.."
usage() {
    echo "usage: $0 [--seconds N] [--rounds N] [--size MiB] [--backing disk|tmpfs] [--dir DIR]" \
        "[--mode page-cache|direct|both] [--cpus TARGET,INITIATOR | --no-pin] [--no-srp]" >&2
    exit 2
}
secs=10 rounds=3 size_mib=1024 cpus=1,0 backing=disk dir="" mode=both srp=1
(($(nproc) >= 2)) || cpus=""
while (($#)); do
    case $1 in
    --seconds) secs=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --size) size_mib=$2; shift ;;
    --backing) backing=$2; shift ;;
    --dir) dir=$2; shift ;;
    --mode) mode=$2; shift ;;
    --cpus) cpus=$2; shift ;;
    --no-pin) cpus="" ;;
    --no-srp) srp=0 ;;
    *) usage ;;
    esac
    shift
done
[[ $secs =~ ^[1-9][0-9]*$ && $rounds =~ ^[1-9][0-9]*$ && $size_mib =~ ^[1-9][0-9]*$ ]] || usage
case $mode in
both) modes=(page-cache direct) ;;
page-cache | direct) modes=("$mode") ;;
*) usage ;;
esac
[[ $backing == disk || $backing == tmpfs ]] || usage

missing=()
for tool in tgtd:tgt tgtadm:tgt iscsi-perf:libiscsi-bin fio:fio iperf3:iperf3 python3:python3 taskset:util-linux; do
    command -v "${tool%:*}" >/dev/null || missing+=("${tool%:*} (package ${tool#*:})")
done
if ((${#missing[@]})); then
    echo "bench: not installed: ${missing[*]}" >&2
    exit 2
fi

# Command prefixes that pin to the target's or the initiator's CPU (arrays, so that a
# background target's $! is the target itself).
on_target=() on_initiator=() pinning="not pinned"
if [[ -n $cpus ]]; then
    on_target=(taskset -c "${cpus%,*}") on_initiator=(taskset -c "${cpus#*,}")
    pinning="targets on CPU ${cpus%,*}, initiators on CPU ${cpus#*,}"
fi

memory_fs() { [[ $(stat -f -c %T "$1") == tmpfs || $(stat -f -c %T "$1") == ramfs ]]; }
if [[ -n $dir ]]; then
    [[ -d $dir ]] || { echo "bench: --dir $dir is not a directory" >&2; exit 2; }
    base=$dir
    if [[ $backing == disk ]] && memory_fs "$base"; then
        echo "bench: --dir $dir is on $(stat -f -c %T "$base"), not a disk file system (add --backing tmpfs)" >&2
        exit 2
    fi
elif [[ $backing == tmpfs ]]; then
    base=/dev/shm
else
    base=${TMPDIR:-/tmp}
    if memory_fs "$base"; then
        base=${CARGO_TARGET_DIR:-build}
        mkdir -p "$base"
    fi
    if memory_fs "$base"; then
        echo "bench: neither ${TMPDIR:-/tmp} nor $base is on a disk file system; pass --dir DIR" >&2
        exit 2
    fi
fi
if [[ $backing == tmpfs ]] && ! memory_fs "$base"; then
    echo "bench: $base is not tmpfs" >&2
    exit 2
fi
avail_kib=$(df -Pk "$base" | awk 'NR == 2 { print $4 }')
if ((avail_kib < size_mib * 1024 + 65536)); then
    echo "bench: $base has $((avail_kib / 1024)) MiB free, the file needs $size_mib MiB" >&2
    exit 2
fi

cargo build --release -q --bin rtgtd --bin rtgt-iscsi --bin rtgt-srp
bin=${CARGO_TARGET_DIR:-build}/release

work=$(mktemp -d "$base/rtgt-bench.XXXXXX")
work=$(cd "$work" && pwd -P)
pids=()
cleanup() {
    # tgtd ignores SIGTERM; neither target holds state worth a graceful stop here.
    local p
    for p in "${pids[@]}"; do { kill -9 "$p" && wait "$p"; } 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

lun=$work/lun.img
# Random data, written back before the first measurement: every block is allocated on disk
# (neither a hole nor an unwritten extent), so neither target reads zeroes for free.
dd if=/dev/urandom of="$lun" bs=1M count="$size_mib" conv=fsync status=none
allocated=$(($(stat -c '%b * %B' "$lun")))
((allocated >= size_mib * 1048576)) || { echo "bench: $lun is sparse ($allocated bytes allocated)" >&2; exit 1; }

fs=$(stat -f -c %T "$work")
if command -v findmnt >/dev/null; then
    # The last line is the mount on top when several are stacked.
    fs="$(findmnt -n -o FSTYPE,SOURCE --target "$work" | awk 'END { print $1 " (" $2 ")" }')"
fi
echo "bench: backing file $lun: $size_mib MiB on $fs, fully allocated"
echo "bench: modes ${modes[*]}; $pinning; ${secs} s per measurement, $rounds round(s), medians; $(nproc) CPUs," \
    "load $(cut -d' ' -f1-3 /proc/loadavg)"

# Free ports, so that a leftover daemon of an earlier run cannot answer in our place.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
iqn_tgt=iqn.2025-01.io.rtgt:bench-tgt iqn_rtgt=iqn.2025-01.io.rtgt:bench
tgt_pid="" rtgt_pid="" url_tgt="" url_rtgt="" starts=0

stop_targets() {
    local p
    for p in $tgt_pid $rtgt_pid; do
        kill -9 "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    tgt_pid="" rtgt_pid=""
}

# What rtgtd answers libiscsi's and rtgt-iscsi's login proposals with (its MaxRecvDataSegmentLength,
# MaxBurstLength and FirstBurstLength caps, InitialR2T=No): tgtd is set up to answer the same.
tgt_params=(MaxRecvDataSegmentLength=262144 MaxXmitDataSegmentLength=262144 MaxBurstLength=1048576
    FirstBurstLength=65536 InitialR2T=No ImmediateData=Yes)
# start_tgtd MODE: tgtd with one logical unit on the file, O_DIRECT in direct mode, and the
# session parameters above.
start_tgtd() {
    local port ctl=$(($$ % 3000 * 10 + starts)) flags=() want=""
    starts=$((starts + 1))
    port=$(free_port)
    "${on_target[@]}" tgtd -f -C "$ctl" --iscsi "portal=127.0.0.1:$port" >"$work/tgtd-$1.log" 2>&1 &
    tgt_pid=$!
    pids+=("$tgt_pid")
    for _ in $(seq 100); do tgtadm -C "$ctl" --op show --mode system >/dev/null 2>&1 && break; sleep 0.1; done
    [[ $1 == direct ]] && flags=(--bsoflags direct) want=direct
    tgtadm -C "$ctl" --lld iscsi --op new --mode target --tid 1 -T "$iqn_tgt"
    # The session limits rtgtd offers (tgtd's defaults are 8 KiB PDUs and InitialR2T=Yes).
    local kv
    for kv in "${tgt_params[@]}"; do
        tgtadm -C "$ctl" --lld iscsi --op update --mode target --tid 1 --name "${kv%=*}" --value "${kv#*=}"
    done
    tgtadm -C "$ctl" --lld iscsi --op show --mode target --tid 1 >"$work/tgtd-params"
    for kv in "${tgt_params[@]}"; do
        grep -qx "$kv" "$work/tgtd-params" || { echo "bench: tgtd did not take $kv" >&2; exit 1; }
    done
    tgtadm -C "$ctl" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$lun" "${flags[@]}"
    tgtadm -C "$ctl" --lld iscsi --op bind --mode target --tid 1 -I ALL
    local got
    got=$(tgtadm -C "$ctl" --lld iscsi --op show --mode target | sed -n 's/^ *Backing store flags: *//p' | tail -1)
    [[ $got == "$want" ]] || { echo "bench: tgtd's backing store flags are '$got', not '$want'" >&2; exit 1; }
    url_tgt=iscsi://127.0.0.1:$port/$iqn_tgt/1
}

# rtgt_config MODE PORT [srp SRP_PORT] -> the configuration; `direct:` follows the mode.
# An rtgtd from before backstore cache modes knows no `direct:` and always uses O_DIRECT:
# direct mode leaves the field out for it (direct_field=0).
direct_field=1
rtgt_config() {
    local direct=", direct: false"
    [[ $1 == direct ]] && direct=", direct: true"
    ((direct_field)) || direct=""
    cat <<YAML
backstores:
  - {name: bench, type: file, path: $lun, block_size: 512$direct}
targets:
  - name: $iqn_rtgt
    portal_groups:
      - tag: 1
        portals: ['127.0.0.1:$2']
        allow_any_initiator: true
        luns: [{lun: 1, backstore: bench}]
policy: {backstore_roots: ['$work']}
YAML
    if [[ ${3:-} == srp ]]; then
        cat <<YAML
rdma: {addresses: [127.0.0.1], eth_mtu: 4200}
srp:
  - name: bench
    listen: ['127.0.0.1:$4']
    allow_any_initiator: true
    luns: [{lun: 1, backstore: bench}]
YAML
    else
        echo "rdma: {enabled: false}"
    fi
}

# start_rtgtd MODE [srp SRP_PORT]
start_rtgtd() {
    local port log=$work/rtgtd-$1${2:+-$2}.log
    port=$(free_port)
    rtgt_config "$1" "$port" "${2:-}" "${3:-}" >"$work/rtgt-$1.yaml"
    # srp: the SRP login string is logged at info level.
    RUST_LOG=warn,rtgt_srp::service=info "${on_target[@]}" "$bin/rtgtd" --config "$work/rtgt-$1.yaml" \
        --state-dir "$work/state-$1" >"$log" 2>&1 &
    rtgt_pid=$!
    pids+=("$rtgt_pid")
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        if ! kill -0 "$rtgt_pid" 2>/dev/null; then
            if ((direct_field)) && grep -q 'unknown field .direct.' "$log"; then
                if [[ $1 == direct ]]; then
                    echo "bench: this rtgtd knows no backstore field \`direct\`: serving without it (O_DIRECT)" >&2
                    direct_field=0
                    start_rtgtd "$@"
                    return
                fi
                echo "bench: this rtgtd knows no backstore field \`direct\` (page-cache mode needs it)" >&2
                exit 1
            fi
            echo "bench: rtgtd did not start:" >&2
            cat "$log" >&2
            exit 1
        fi
        sleep 0.1
    done
    url_rtgt=iscsi://127.0.0.1:$port/$iqn_rtgt/1
}

# prepare MODE: write back the file's dirty pages, then read all of it into the page cache
# (page-cache) or drop it from there (direct).
prepare() {
    sync "$lun"
    if [[ $1 == page-cache ]]; then
        cat "$lun" >/dev/null
    else
        dd if="$lun" iflag=nocache count=0 status=none
    fi
}

# utime + stime of every thread of process PID, in clock ticks.
cpu_ticks() {
    local stat f
    read -r stat <"/proc/$1/stat"
    read -ra f <<<"${stat##*) }"
    echo $((f[11] + f[12]))
}
hz=$(getconf CLK_TCK)

# run_load KIND URL -> "IOPS IOS": one measurement with the initiator of the row.
run_load() {
    local r=() out
    case $1 in
    rr1 | rr32 | sr8)
        local qd blocks
        case $1 in rr1) qd=1 blocks=8 r=(-r) ;; rr32) qd=32 blocks=8 r=(-r) ;; sr8) qd=8 blocks=256 ;; esac
        out=$("${on_initiator[@]}" timeout $((secs + 30)) iscsi-perf -m "$qd" -b "$blocks" "${r[@]}" -t "$secs" "$2" 2>&1 |
            tr '\r' '\n' | sed -n 's/^iops average \([0-9]*\).*/\1/p' | tail -1)
        echo "${out:-0} $((${out:-0} * secs))"
        ;;
    *)
        local rw bs qd
        case $1 in
        rw1) rw=randwrite bs=4k qd=1 ;;
        rw32) rw=randwrite bs=4k qd=32 ;;
        sw8) rw=write bs=128k qd=8 ;;
        rr32i) rw=randread bs=4k qd=32 ;;
        sr8i) rw=read bs=128k qd=8 ;;
        esac
        out=$("${on_initiator[@]}" timeout $((secs + 30)) "$bin/rtgt-iscsi" bench --url "$2" --rw "$rw" --bs "$bs" \
            --iodepth "$qd" --seconds "$secs" 2>&1 | sed -n 's/.* ios=\([0-9]*\) IOPS=\([0-9]*\).*/\2 \1/p' | tail -1)
        echo "${out:-0 0}"
        ;;
    esac
}

# measure MODE KIND tgt|rtgt -> "IOPS CPU_US_PER_IO BUSY_PERCENT"
measure() {
    local pid=$tgt_pid url=$url_tgt t0 t1 c0 c1 iops ios
    [[ $3 == rtgt ]] && pid=$rtgt_pid url=$url_rtgt
    prepare "$1"
    t0=$EPOCHREALTIME c0=$(cpu_ticks "$pid")
    read -r iops ios < <(run_load "$2" "$url")
    c1=$(cpu_ticks "$pid") t1=$EPOCHREALTIME
    awk -v iops="$iops" -v ios="$ios" -v c="$((c1 - c0))" -v hz="$hz" -v t0="$t0" -v t1="$t1" 'BEGIN {
        el = t1 - t0
        printf "%d %.2f %.0f\n", iops, (ios > 0 ? c / hz * 1e6 / ios : 0), (el > 0 ? 100 * c / hz / el : 0) }'
}

median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] + 0 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "n/a" }'; }
mbs() { awk -v i="$1" -v bs="$2" 'BEGIN { printf "%.0f MB/s", i * bs / 1e6 }'; }

kinds=(rr1 rr32 rw1 rw32 sr8 sw8 rr32i sr8i)
declare -A name=(
    [rr1]="4K random read QD1 (iscsi-perf)" [rr32]="4K random read QD32 (iscsi-perf)"
    [sr8]="128K seq. read QD8 (iscsi-perf)" [rw1]="4K random write QD1 (rtgt-iscsi)"
    [rw32]="4K random write QD32 (rtgt-iscsi)" [sw8]="128K seq. write QD8 (rtgt-iscsi)"
    [rr32i]="4K random read QD32 (rtgt-iscsi)" [sr8i]="128K seq. read QD8 (rtgt-iscsi)"
)
declare -A unit=([rr1]=4096 [rr32]=4096 [rw1]=4096 [rw32]=4096 [sr8]=131072 [sw8]=131072 [rr32i]=4096 [sr8i]=131072)
declare -A iops cpu busy # "MODE KIND TARGET" -> values of the rounds

fmt='%-34s %10s %10s %7s   %13s %13s %7s\n'
for m in "${modes[@]}"; do
    start_tgtd "$m"
    start_rtgtd "$m"
    for ((i = 1; i <= rounds; i++)); do
        order=(tgt rtgt)
        ((i % 2)) || order=(rtgt tgt)
        for k in "${kinds[@]}"; do
            for t in "${order[@]}"; do
                read -r a b c < <(measure "$m" "$k" "$t")
                iops[$m $k $t]+="$a " cpu[$m $k $t]+="$b " busy[$m $k $t]+="$c "
            done
        done
    done
    stop_targets
    echo
    if [[ $m == page-cache ]]; then
        echo "== page cache: rtgtd direct: false vs tgtd default (buffered); file read into the page cache before each run"
    else
        echo "== O_DIRECT: rtgtd direct: true vs tgtd --bsoflags direct; file dropped from the page cache before each run"
    fi
    # µ takes two bytes: one more column for printf.
    printf '%-34s %10s %10s %7s   %14s %14s %7s\n' workload "tgtd IOPS" "rtgtd IOPS" rtgt/tgt "tgtd µs/IO" \
        "rtgtd µs/IO" rtgt/tgt
    for k in "${kinds[@]}"; do
        declare -A med=()
        for t in tgt rtgt; do
            # shellcheck disable=SC2086
            med[i$t]=$(median ${iops[$m $k $t]}) med[c$t]=$(median ${cpu[$m $k $t]}) med[b$t]=$(median ${busy[$m $k $t]})
        done
        # shellcheck disable=SC2059
        printf "$fmt" "${name[$k]}" "${med[itgt]}" "${med[irtgt]}" "$(ratio "${med[irtgt]}" "${med[itgt]}")" \
            "${med[ctgt]} (${med[btgt]}%)" "${med[crtgt]} (${med[brtgt]}%)" "$(ratio "${med[crtgt]}" "${med[ctgt]}")"
        if ((unit[$k] > 65536)); then
            # shellcheck disable=SC2059
            printf "$fmt" "" "$(mbs "${med[itgt]}" "${unit[$k]}")" "$(mbs "${med[irtgt]}" "${unit[$k]}")" "" "" "" ""
        fi
        unset med
    done
    echo "(medians of $rounds round(s); µs/IO: target CPU time (user + system, all threads) per I/O, in" \
        "parentheses how busy that kept the target's CPU)"
done

echo
echo "== ceilings"
for m in "${modes[@]}"; do
    direct=0
    [[ $m == direct ]] && direct=1
    for qd in 1 32; do
        # --invalidate=0: fio would otherwise drop the file from the page cache first.
        prepare "$m"
        fio_iops=$("${on_initiator[@]}" fio --name=ceiling --filename="$lun" --ioengine=io_uring --direct="$direct" \
            --invalidate=0 \
            --rw=randread --bs=4k --iodepth="$qd" --runtime="$secs" --time_based --output-format=terse \
            --terse-version=3 2>/dev/null | awk -F';' '{ print $8 }')
        echo "local io_uring (fio, $m, 4K random read QD$qd on the file): $fio_iops IOPS"
    done
done
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
tcp=()
for ((i = 1; i <= rounds; i++)); do tcp+=("$(iperf)"); done
echo "TCP loopback ceiling (iperf3, one stream): $(median "${tcp[@]}") MB/s"

((srp)) || exit 0
m=${modes[0]}
echo
echo "== SRP (soft-RoCE) vs iSCSI/TCP, one rtgtd, the same file in $m mode, rtgt's own initiators"
port_srp=$(free_port)
start_rtgtd "$m" srp "$port_srp"
srp_target=""
for _ in $(seq 50); do
    srp_target=$(grep -o "id_ext=[0-9a-f]*,ioc_guid=[0-9a-f]*,dest=127.0.0.1:$port_srp" "$work/rtgtd-$m-srp.log" | head -1 || true)
    [[ -n $srp_target ]] && break
    sleep 0.1
done
# ibench URL RW BS QD / sbench RW BS QD -> IOPS
ibench() {
    prepare "$m"
    "${on_initiator[@]}" timeout $((secs + 30)) "$bin/rtgt-iscsi" bench --url "$1" --rw "$2" --bs "$3" --iodepth "$4" \
        --seconds "$secs" 2>&1 | sed -n 's/.* IOPS=\([0-9]*\).*/\1/p' | tail -1
}
sbench() {
    [[ -n $srp_target ]] || return 0
    prepare "$m"
    "${on_initiator[@]}" timeout $((secs + 60)) "$bin/rtgt-srp" --lun 1 --eth-mtu 4200 bench --target "$srp_target" \
        --rw "$1" --bs "$2" --iodepth "$3" --seconds "$secs" 2>>"$work/rtgt-srp.log" | sed -n 's/.* IOPS=\([0-9]*\).*/\1/p' | tail -1
}
printf '%-26s %14s %14s %9s\n' workload iSCSI/TCP SRP SRP/iSCSI
srow() { # name iscsi srp unit-bytes
    printf '%-26s %14s %14s %9s\n' "$1" "$2 IOPS" "$3 IOPS" "$(ratio "$3" "$2")"
    [[ $4 -gt 65536 ]] && printf '%-26s %14s %14s\n' "" "$(mbs "$2" "$4")" "$(mbs "$3" "$4")"
    return 0
}
srow "4K random read QD32" "$(ibench "$url_rtgt" randread 4096 32)" "$(sbench randread 4096 32)" 4096
srow "4K random write QD32" "$(ibench "$url_rtgt" randwrite 4096 32)" "$(sbench randwrite 4096 32)" 4096
srow "128K sequential read QD8" "$(ibench "$url_rtgt" read 131072 8)" "$(sbench read 131072 8)" 131072
srow "128K sequential write QD8" "$(ibench "$url_rtgt" write 131072 8)" "$(sbench write 131072 8)" 131072
[[ -n $srp_target ]] || echo "(SRP not served: see rtgtd's log, $work/rtgtd-$m-srp.log)"
