# shellcheck shell=bash
# Host side of verbs-bench: the bench rows against the guest's rtgtd, first on the soft
# provider, then on verbs; the guest measures its CPU time around each row (events
# start-PHASE-N / end-PHASE-N) and host_check puts the two phases side by side.

BENCH_IQN=iqn.2025-01.io.rtgt.lab:vbench
BENCH_SECONDS=${LAB_BENCH_SECONDS:-5}
# name | initiator | arguments
ROWS=(
    "iser-randread-4k-qd16|iser|--rw randread --bs 4k --iodepth 16"
    "iser-randwrite-4k-qd16|iser|--rw randwrite --bs 4k --iodepth 16"
    "iser-read-128k-qd4|iser|--rw read --bs 128k --iodepth 4"
    "srp-randread-4k-qd16|srp|--mode direct --rw randread --bs 4k --iodepth 16"
    "srp-randwrite-4k-qd16|srp|--mode direct --rw randwrite --bs 4k --iodepth 16"
    "srp-read-128k-qd4|srp|--mode direct --rw read --bs 128k --iodepth 4"
)

host_setup() {
    local p
    lab_rtgt_bin --share rtgt-iscsi rtgt-srp || return 1
    for p in soft verbs; do
        cat >"$LAB_SHARE/rtgt-$p.yaml" <<YAML
backstores:
  - {name: null, type: null, size: 1GiB, block_size: 512}
targets:
  - name: $BENCH_IQN
    portal_groups:
      - tag: 1
        portals: ['$LAB_GUEST_IP:3260']
        allow_any_initiator: true
        luns: [{lun: 0, backstore: null}]
rdma:
  provider: $p
  addresses: [$LAB_GUEST_IP]
  eth_mtu: $LAB_MTU
srp:
  - name: vbench
    listen: ['$LAB_GUEST_IP:5555']
    allow_any_initiator: true
    luns: [{lun: 0, backstore: null}]
YAML
        cp "$LAB_SHARE/rtgt-$p.yaml" "$LAB_RESULTS/rtgt-$p.yaml"
    done
    lab_guest_export ROWS=${#ROWS[@]}
}

host_run() {
    # shellcheck source=/dev/null
    source "$LAB_WORK/bin.env"
    local phase srp n row name kind args out url="iscsi://$LAB_GUEST_IP:3260/$BENCH_IQN/0"
    for phase in soft verbs; do
        lab_wait "ready-$phase" 600 || return 1
        srp=$(lab_event "ready-$phase")
        : >"$LAB_RESULTS/bench-$phase.txt"
        n=0
        for row in "${ROWS[@]}"; do
            n=$((n + 1))
            IFS='|' read -r name kind args <<<"$row"
            lab_signal "start-$phase-$n"
            # shellcheck disable=SC2086
            case $kind in
            iser) out=$(timeout 120 "$BIN/rtgt-iscsi" --iser "$LAB_HOST_IP" --eth-mtu "$LAB_MTU" \
                bench --url "$url" $args --seconds "$BENCH_SECONDS" 2>>"$LAB_RESULTS/bench.err") || true ;;
            srp) out=$(timeout 120 "$BIN/rtgt-srp" --local "$LAB_HOST_IP" --eth-mtu "$LAB_MTU" --lun 0 \
                bench --target "$srp" $args --seconds "$BENCH_SECONDS" 2>>"$LAB_RESULTS/bench.err") || true ;;
            esac
            lab_signal "end-$phase-$n"
            printf '%s %s\n' "$name" "$(grep -o 'ios=.*' <<<"$out" | tail -1)" >>"$LAB_RESULTS/bench-$phase.txt"
        done
        lab_signal "done-$phase"
    done
}

host_check() {
    local phase f
    for phase in soft verbs; do
        f=$LAB_SHARE/out/cpu-$phase.txt
        [[ -s $f ]] || { echo "no CPU figures of the $phase phase"; return 1; }
        [[ $(grep -c 'ios=[1-9]' "$LAB_RESULTS/bench-$phase.txt") == "${#ROWS[@]}" ]] || {
            echo "$phase: a bench row did no I/O"
            cat "$LAB_RESULTS/bench-$phase.txt"
            return 1
        }
    done
    # One table: per row, IOPS, MB/s, rtgtd's and the whole guest's CPU per I/O on each
    # provider, and verbs/soft ratios.
    awk -v hz="$(getconf CLK_TCK)" '
        FNR == 1 { file++ }
        function field(s, k,   m) { return match(s, k "=[0-9.]+") ? substr(s, RSTART + length(k) + 1, RLENGTH - length(k) - 1) : 0 }
        file == 1 || file == 2 { p = (file == 1 ? "s" : "v"); name[FNR] = $1; ios[p, FNR] = field($0, "ios")
            iops[p, FNR] = field($0, "IOPS"); mbs[p, FNR] = field($0, "MB/s"); rows = FNR; next }
        { p = (file == 3 ? "s" : "v"); own[p, $1] = $2; all[p, $1] = $3; usr[p, $1] = $4 }
        END {
            printf "%-24s %-24s %-17s %-32s %-32s %s\n", "row (soft -> verbs)", "IOPS", "MB/s",
                "rtgtd CPU per I/O", "guest CPU per I/O", "rtgtd user-mode CPU per I/O"
            for (r = 1; r <= rows; r++) {
                so = ios["s", r] > 0 ? own["s", r] * 1e6 / hz / ios["s", r] : 0
                vo = ios["v", r] > 0 ? own["v", r] * 1e6 / hz / ios["v", r] : 0
                sa = ios["s", r] > 0 ? all["s", r] * 1e6 / hz / ios["s", r] : 0
                va = ios["v", r] > 0 ? all["v", r] * 1e6 / hz / ios["v", r] : 0
                su = ios["s", r] > 0 ? usr["s", r] * 1e6 / hz / ios["s", r] : 0
                vu = ios["v", r] > 0 ? usr["v", r] * 1e6 / hz / ios["v", r] : 0
                printf "%-24s %6d %6d %5.2fx    %7.1f %7.1f   %7.1f %7.1f us %5.2fx     %7.1f %7.1f us %5.2fx     %7.1f %7.1f us %5.2fx\n",
                    name[r], iops["s", r], iops["v", r], (iops["s", r] > 0 ? iops["v", r] / iops["s", r] : 0),
                    mbs["s", r], mbs["v", r], so, vo, (so > 0 ? vo / so : 0), sa, va, (sa > 0 ? va / sa : 0),
                    su, vu, (su > 0 ? vu / su : 0)
            }
        }' "$LAB_RESULTS/bench-soft.txt" "$LAB_RESULTS/bench-verbs.txt" \
        "$LAB_SHARE/out/cpu-soft.txt" "$LAB_SHARE/out/cpu-verbs.txt" | tee "$LAB_RESULTS/verbs-bench.txt"
}
