# shellcheck shell=bash
# Host side of fabrics-bench: rtgtd serving one null LUN over iSCSI/TCP, iSER and SRP, and
# as an NVMe/TCP and NVMe/RDMA namespace, on the tap address; while the guest runs each fio job, rtgtd's CPU time is taken from /proc, and at
# the end the guest's figures and the CPU time make one table with the ratios to TCP. Then
# rtgtd stops and `rtgt-rdma perftest` serves the guest's ib_read_bw and ib_write_bw, the
# guest's rxe alone, for the ratios of the 4 KiB rows (IOPS against messages a second) and
# the 128 KiB rows (MB/s) to what that rxe moves at all.

RTGT_IQN=iqn.2025-01.io.rtgt.lab:bench
NVME_NQN=nqn.2025-01.io.rtgt.lab:bench
BENCH_WWN=6001405aabbccdd0011223344556677b
# Seconds per fio job (5 fabrics x 4 jobs).
BENCH_SECONDS=${LAB_BENCH_SECONDS:-10}
BENCH_JOBS=20
# The rxe ceiling: message sizes of ib_read_bw / ib_write_bw and iterations at 128 KiB
# (ten times as many at 4 KiB).
CEILING_SIZES="4096 131072"
CEILING_ITERS=${LAB_CEILING_ITERS:-400}

rtgtd_pid() { awk '$2 == "rtgtd" { p = $1 } END { print p }' "$LAB_WORK/daemons"; }
# CPU time rtgtd has used so far, in clock ticks (user + system, all threads).
rtgtd_ticks() { awk '{ print $14 + $15 }' "/proc/$(rtgtd_pid)/stat"; }

host_setup() {
    [[ -x ${RTGTD:-} ]] || lab_skip "RTGTD does not name the rtgtd binary"
    RTGT_RDMA=${RTGT_RDMA:-$(dirname "$RTGTD")/rtgt-rdma}
    [[ -x $RTGT_RDMA ]] || {
        echo "no rtgt-rdma next to rtgtd (set RTGT_RDMA) for the rxe ceiling"
        return 1
    }
    echo "RTGT_RDMA=$RTGT_RDMA" >"$LAB_WORK/rtgt-rdma.env"
    cat >"$LAB_WORK/rtgt.yaml" <<YAML
backstores:
  - {name: null, type: null, size: 1GiB, block_size: 512, wwn: $BENCH_WWN}
targets:
  - name: $RTGT_IQN
    portal_groups:
      - tag: 1
        portals: ['$LAB_HOST_IP:3260']
        allow_any_initiator: true
        luns: [{lun: 0, backstore: null}]
rdma:
  addresses: [$LAB_HOST_IP]
  eth_mtu: $LAB_MTU
srp:
  - name: bench
    listen: ['$LAB_HOST_IP:5555']
    allow_any_initiator: true
    luns: [{lun: 0, backstore: null}]
nvme:
  subsystems:
    - nqn: $NVME_NQN
      allow_any_host: true
      namespaces: [{nsid: 1, backstore: null, share_with_scsi: true}]
  ports:
    - {id: 1, transport: tcp, listen: '$LAB_HOST_IP:4420'}
    - {id: 2, transport: rdma, listen: '$LAB_HOST_IP:4420'}
YAML
    cp "$LAB_WORK/rtgt.yaml" "$LAB_RESULTS/rtgt.yaml"
    lab_start_daemon rtgtd "$RTGTD" --config "$LAB_WORK/rtgt.yaml" --state-dir "$LAB_WORK/state"
    lab_wait_tcp "$LAB_HOST_IP" 3260 30
    grep -q 'iSER portal listening' "$LAB_RESULTS/rtgtd.log" || {
        cat "$LAB_RESULTS/rtgtd.log"
        echo "rtgtd serves no iSER"
        return 1
    }
    local add
    add=$(lab_rtgtd_add_target rtgtd.log "$LAB_HOST_IP:5555" 30) || return 1
    lab_guest_export TARGET_IQN="$RTGT_IQN" NVME_NQN="$NVME_NQN" SRP_TARGET="$add" DISK_WWN="$BENCH_WWN" \
        BENCH_SECONDS="$BENCH_SECONDS" CEILING_SIZES="$CEILING_SIZES" CEILING_ITERS="$CEILING_ITERS"
}

host_run() {
    local n t0
    : >"$LAB_WORK/cpu.txt"
    for ((n = 1; n <= BENCH_JOBS; n++)); do
        lab_wait "start-$n" 600 || return 1
        t0=$(rtgtd_ticks)
        lab_wait "end-$n" 600 || return 1
        echo "$n $(($(rtgtd_ticks) - t0))" >>"$LAB_WORK/cpu.txt"
    done
    # The rxe ceiling needs UDP 4791 of the host address: rtgtd, alive through every job,
    # makes way for rtgt-rdma perftest.
    lab_wait ceiling 600 || return 1
    lab_daemon_alive rtgtd || { echo "rtgtd died"; return 1; }
    lab_stop_daemon rtgtd 10
    # shellcheck source=/dev/null
    source "$LAB_WORK/rtgt-rdma.env"
    local t size status
    for size in $CEILING_SIZES; do
        for t in read write; do
            lab_start_daemon "perftest-$t-$size" "$RTGT_RDMA" perftest --test "$t" \
                --local "$LAB_HOST_IP" -s "$size" -m 4096 --eth-mtu "$LAB_MTU" --timeout 240
            lab_signal "host-ready-$t-$size"
            status=$(lab_daemon_status "perftest-$t-$size" 260) || {
                echo "rtgt-rdma perftest ($t, $size) did not finish"
                return 1
            }
            ((status == 0)) || {
                echo "rtgt-rdma perftest ($t, $size) failed with status $status"
                return 1
            }
        done
    done
}

host_check() {
    if grep -E 'panicked|ERROR' "$LAB_RESULTS"/rtgtd*.log "$LAB_RESULTS"/perftest-*.log; then
        echo "rtgtd logged errors"
        return 1
    fi
    local figures=$LAB_SHARE/out/bench.txt
    [[ $(wc -l <"$figures" 2>/dev/null) == "$BENCH_JOBS" ]] || {
        echo "the guest reported $(wc -l <"$figures" 2>/dev/null || echo no) of $BENCH_JOBS runs"
        return 1
    }
    cp "$LAB_WORK/cpu.txt" "$LAB_RESULTS/cpu.txt"
    # Rows: job, fabric, workload, IOPS, MB/s, mean and p99 latency (us), bytes moved, the
    # guest's busy CPU share (%) and busy CPU time per I/O (us); joined with rtgtd's CPU
    # ticks over the job.
    lab_report "fio in the guest (TCG, rxe0, MTU $LAB_MTU), ${BENCH_SECONDS} s per job; rtgtd CPU s per GB moved; the guest's CPUs busy and its CPU time per I/O"
    awk -v hz="$(getconf CLK_TCK)" '
        NR == FNR { cpu[$1] = $2; next }
        {
            key = $3; fab[FNR] = $2; wl[FNR] = key
            iops[FNR] = $4; mbs[FNR] = $5; mean[FNR] = $6; p99[FNR] = $7
            cpg[FNR] = ($8 > 0) ? cpu[$1] / hz / ($8 / 1e9) : 0
            gbusy[FNR] = $9; gus[FNR] = $10
            if ($2 == "tcp") { tiops[key] = $4; tcpg[key] = cpg[FNR]; tgus[key] = $10 }
            if ($2 == "iser") { iiops[key] = $4; icpg[key] = cpg[FNR] }
            n = FNR
        }
        END {
            printf "%-9s %-18s %10s %9s %10s %10s %9s %8s %8s %7s %9s %8s\n", "fabric", "workload",
                "IOPS", "MB/s", "mean us", "p99 us", "CPU s/GB", "IOPS/TCP", "CPU/TCP", "guest%",
                "guest us", "gus/TCP"
            for (i = 1; i <= n; i++) {
                k = wl[i]
                printf "%-9s %-18s %10.0f %9.1f %10.0f %10.0f %9.2f %7.2fx %7.2fx %7.0f %9.1f %7.2fx\n",
                    fab[i], k, iops[i], mbs[i], mean[i], p99[i], cpg[i],
                    (tiops[k] > 0 ? iops[i] / tiops[k] : 0), (tcpg[k] > 0 ? cpg[i] / tcpg[k] : 0),
                    gbusy[i], gus[i], (tgus[k] > 0 ? gus[i] / tgus[k] : 0)
            }
            # NVMe/RDMA against iSER, its SCSI counterpart on the same rxe.
            for (i = 1; i <= n; i++) {
                k = wl[i]
                if (fab[i] == "nvme-rdma" && iiops[k] > 0 && icpg[k] > 0)
                    printf "nvme-rdma/iser %-18s IOPS %5.2fx, CPU per GB %5.2fx\n", k,
                        iops[i] / iiops[k], cpg[i] / icpg[k]
            }
        }' "$LAB_WORK/cpu.txt" "$figures" | while IFS= read -r line; do lab_report "$line"; done
    # The 4 KiB and 128 KiB rows against the guest's rxe alone: reads move data to the guest
    # (as ib_read_bw does), writes from it (as ib_write_bw does); IOPS against messages a
    # second at 4 KiB, MB/s at 128 KiB.
    local ceiling=$LAB_SHARE/out/ceiling.txt
    [[ $(wc -l <"$ceiling" 2>/dev/null) == 4 ]] || {
        echo "the guest reported $(wc -l <"$ceiling" 2>/dev/null || echo no) of 4 rxe ceilings"
        return 1
    }
    awk 'NR == FNR { mbs[$1 " " $2] = $3; rate[$1 " " $2] = $4; next }
        {
            split($3, w, "-"); d = (w[1] ~ /read/) ? "read" : "write"
            if (w[2] == "4k") iops[$2 " " d] = $4
            if (w[2] == "128k") bw[$2 " " d] = $5
        }
        END {
            printf "guest rxe alone (ib_*_bw): 4 KiB x32 receives %.0f/s, sends %.0f/s; 128 KiB receives %.1f MB/s, sends %.1f MB/s\n",
                rate["read 4096"], rate["write 4096"], mbs["read 131072"], mbs["write 131072"]
            nf = split("tcp nvme iser nvme-rdma srp", fabs, " "); split("read write", dirs, " ")
            for (i = 1; i <= nf; i++) for (j = 1; j <= 2; j++) {
                f = fabs[i] " " dirs[j]; c = rate[dirs[j] " 4096"]
                if ((f in iops) && c > 0)
                    printf "  %-9s 4 KiB   %-5s %6.0f IOPS = %4.2fx of the rxe alone\n", fabs[i], dirs[j], iops[f], iops[f] / c
            }
            for (i = 1; i <= nf; i++) for (j = 1; j <= 2; j++) {
                f = fabs[i] " " dirs[j]; c = mbs[dirs[j] " 131072"]
                if ((f in bw) && c > 0)
                    printf "  %-9s 128 KiB %-5s %6.1f MB/s = %4.2fx of the rxe alone\n", fabs[i], dirs[j], bw[f], bw[f] / c
            }
        }' "$ceiling" "$figures" | while IFS= read -r line; do lab_report "$line"; done
}
