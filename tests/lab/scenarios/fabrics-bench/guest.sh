#!/bin/bash
# fio over iSCSI/TCP, then NVMe/TCP (the same backstore as namespace 1), then iSER, then
# NVMe/RDMA (nvme-rdma on rxe0), then SRP (ib_srp) against one rtgtd null LUN: four jobs each
# (4 KiB random read and write at QD32, 128 KiB sequential read and write at QD8), timed, raw
# device, libaio with O_DIRECT; each job is framed by events so that the host can take rtgtd's
# CPU time over it, and the guest takes its own. The figures go to $LAB_OUT/bench.txt, one
# line per job. Then, rtgtd stopped, the guest's rxe alone: ib_read_bw and ib_write_bw (4 KiB
# messages 32 deep, then 128 KiB ones) against `rtgt-rdma perftest` on the host, the ceiling
# of what the guest's rxe receives and sends with no SCSI on top; their figures go to
# $LAB_OUT/ceiling.txt (test, size, MB/s, messages a second).
set -euo pipefail
portal=$LAB_HOST_IP
node=(-m node -T "$TARGET_IQN" -p "$portal")
job=0

# fio_figures JSON: IOPS, MB/s, mean and p99 completion latency (us) and bytes of the one
# direction the job moved, from fio's JSON output.
fio_figures() {
    awk '
        /"read" : \{/ { s = "r" } /"write" : \{/ { s = "w" } /"trim" : \{|"sync" : \{/ { s = "" }
        function v(line) { gsub(/[",]/, "", line); n = split(line, f, ":"); return f[n] + 0 }
        s != "" && /"io_bytes" :/ && !(s in io) { io[s] = v($0) }
        s != "" && /"bw_bytes" :/ && !(s in bw) { bw[s] = v($0) }
        s != "" && /"iops" :/ && !(s in iops) { iops[s] = v($0) }
        s != "" && /"lat_ns" :/ { lat[s] = 1 }
        s != "" && lat[s] == 1 && /"mean" :/ { mean[s] = v($0); lat[s] = 2 }
        s != "" && /"99.000000" :/ && !(s in p99) { p99[s] = v($0) }
        END {
            d = (io["w"] > io["r"]) ? "w" : "r"
            printf "%.0f %.1f %.0f %.0f %.0f\n", iops[d], bw[d] / 1e6, mean[d] / 1e3, p99[d] / 1e3, io[d]
        }' "$1"
}

# guest_ticks: the guest's busy and total clock ticks over all its CPUs so far (busy: all but
# idle and iowait).
guest_ticks() { awk '$1 == "cpu" { t = 0; for (i = 2; i <= 9; i++) t += $i; print t - $5 - $6, t }' /proc/stat; }

# bench FABRIC DEV: the four jobs on DEV.
bench() {
    local fabric=$1 dev=$2 w rw bs qd out cpu0 cpu1 figures guest
    for w in "randread 4k 32" "randwrite 4k 32" "read 128k 8" "write 128k 8"; do
        read -r rw bs qd <<<"$w"
        job=$((job + 1))
        out=$LAB_OUT/fio-$job-$fabric-$rw-$bs.json
        lab_step "$fabric: $rw $bs QD$qd"
        lab_signal "start-$job"
        cpu0=$(guest_ticks)
        fio --name=bench --filename="$dev" --rw="$rw" --bs="$bs" --iodepth="$qd" --size=1g \
            --ioengine=libaio --direct=1 --time_based --runtime="$BENCH_SECONDS" --ramp_time=1 \
            --output-format=json --output="$out" || lab_fail "fio $fabric $rw $bs failed"
        cpu1=$(guest_ticks)
        lab_signal "end-$job"
        grep -q '"error" : 0' "$out" || lab_fail "fio $fabric $rw $bs reported errors"
        figures=$(fio_figures "$out")
        # The guest's CPU: busy share of its CPUs over the job, and busy CPU time per I/O.
        guest=$(awk -v a="$cpu0" -v b="$cpu1" -v n="$(nproc)" -v iops="${figures%% *}" 'BEGIN {
            split(a, x, " "); split(b, y, " "); busy = (y[1] - x[1]) / (y[2] - x[2])
            printf "%.0f %.1f", busy * 100, (iops > 0) ? busy * n * 1e6 / iops : 0 }')
        echo "$job $fabric $rw-$bs-qd$qd $figures $guest" | tee -a "$LAB_OUT/bench.txt"
    done
}

modprobe -a iscsi_tcp sd_mod
lab_step "rxe0 on eth0"
lab_rxe_add rxe0 eth0
modprobe ib_iser
echo "InitiatorName=iqn.2025-01.io.rtgt.lab:guest" >/etc/iscsi/initiatorname.iscsi
iscsid
iscsiadm -m discovery -t sendtargets -p "$portal" >"$LAB_OUT/discovery.txt"

lab_step "iSCSI/TCP"
iscsiadm "${node[@]}" --login
dev=$(lab_iscsi_disk "$portal" "$TARGET_IQN" 0 60) || lab_fail "no disk over TCP"
bench tcp "$dev"
iscsiadm "${node[@]}" --logout

lab_step "NVMe/TCP"
modprobe nvme-tcp
mkdir -p /etc/nvme
echo "nqn.2014-08.org.nvmexpress:uuid:0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9" >/etc/nvme/hostnqn
nvme connect -t tcp -a "$portal" -s 4420 -n "$NVME_NQN" >"$LAB_OUT/nvme-connect.txt"
lab_retry 30 lab_nvme_ns "$NVME_NQN" >/dev/null || lab_fail "no NVMe namespace"
dmesg | grep -E 'nvme.*mapped [0-9]+/' | tail -1 || true
bench nvme "/dev/$(lab_nvme_ns "$NVME_NQN")"
nvme disconnect -n "$NVME_NQN" >/dev/null

lab_step "iSER"
lab_iser_node "$portal" "$TARGET_IQN"
iscsiadm "${node[@]}" --login
iscsiadm -m session -P 1 | grep -q 'Iface Transport: iser' || lab_fail "session is not on iser"
dev=$(lab_iscsi_disk "$portal" "$TARGET_IQN" 0 60) || lab_fail "no disk over iSER"
bench iser "$dev"
iscsiadm "${node[@]}" --logout

lab_step "NVMe/RDMA"
modprobe nvme-rdma
nvme connect -t rdma -a "$portal" -s 4420 -n "$NVME_NQN" >"$LAB_OUT/nvme-rdma-connect.txt"
lab_retry 30 lab_nvme_ns "$NVME_NQN" >/dev/null || lab_fail "no NVMe/RDMA namespace"
bench nvme-rdma "/dev/$(lab_nvme_ns "$NVME_NQN")"
nvme disconnect -n "$NVME_NQN" >/dev/null

lab_step "SRP"
lab_srp_add_target "$SRP_TARGET" || lab_fail "add_target failed"
dev=$(lab_wwn_disk "$DISK_WWN" 60) || lab_fail "no SRP disk with WWN $DISK_WWN"
bench srp "$dev"
lab_srp_remove_all || lab_fail "remote port not deleted"

lab_step "rxe0 alone: ib_read_bw and ib_write_bw, ${CEILING_SIZES// /, } bytes"
lab_signal ceiling
for size in $CEILING_SIZES; do
    # As many messages as the fio jobs move in a few seconds here: 4 KiB ones by the
    # thousand, 128 KiB ones by the hundred.
    iters=$((size <= 4096 ? CEILING_ITERS * 10 : CEILING_ITERS))
    for t in read write; do
        lab_wait "host-ready-$t-$size" 120 || lab_fail "the host did not start rtgt-rdma perftest ($t, $size)"
        log=$LAB_OUT/ib_${t}_bw-$size.log
        lab_perftest "$log" "ib_${t}_bw" -d rxe0 -x 1 -F -n "$iters" -s "$size" -t 32 \
            --report_gbits "$portal" || lab_fail "ib_${t}_bw -s $size failed"
        figures=$(awk -v s="$size" '$1 == s { printf "%.1f %.0f", $4 * 1000 / 8, $5 * 1e6; found = 1 }
            END { exit !found }' "$log") || lab_fail "ib_${t}_bw: no result line for $size bytes"
        echo "$t $size $figures" | tee -a "$LAB_OUT/ceiling.txt"
    done
done
lab_step "fabrics-bench done"
