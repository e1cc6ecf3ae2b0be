# shellcheck shell=bash
# Host side of rdma-perftest: `rtgt-rdma perftest` (rtgt's software RoCEv2 stack on UDP 4791 of
# the host address) serves one run of each perftest client the guest starts on rxe0. A test
# named `*_lat` is the latency client of that name (`ib_write_lat`), the others `ib_*_bw`.

PT_TESTS=${PT_TESTS:-"write read send write_lat"}
PT_SIZE=${PT_SIZE:-65536}
PT_ITERS=${PT_ITERS:-200}
PT_LAT_SIZE=${PT_LAT_SIZE:-64}
PT_LAT_ITERS=${PT_LAT_ITERS:-1000}

host_setup() {
    RTGT_RDMA=${RTGT_RDMA:-}
    if [[ -z $RTGT_RDMA && -n ${RTGTD:-} ]]; then
        RTGT_RDMA=$(dirname "$RTGTD")/rtgt-rdma
    fi
    [[ -x $RTGT_RDMA ]] || lab_skip "no rtgt-rdma binary (set RTGT_RDMA, or RTGTD to a sibling build)"
    echo "RTGT_RDMA=$RTGT_RDMA" >"$LAB_WORK/rtgt-rdma.env"
    lab_guest_export PT_TESTS="$PT_TESTS" PT_SIZE="$PT_SIZE" PT_ITERS="$PT_ITERS" \
        PT_LAT_SIZE="$PT_LAT_SIZE" PT_LAT_ITERS="$PT_LAT_ITERS"
}

host_run() {
    # shellcheck source=/dev/null
    source "$LAB_WORK/rtgt-rdma.env"
    local t name status size
    for t in $PT_TESTS; do
        name=rtgt-perftest-$t
        size=$PT_SIZE
        [[ $t == *_lat ]] && size=$PT_LAT_SIZE
        lab_start_daemon "$name" "$RTGT_RDMA" perftest --test "$t" --local "$LAB_HOST_IP" \
            -s "$size" --timeout 300
        lab_signal "host-ready-$t"
        status=$(lab_daemon_status "$name" 320) || {
            echo "$name did not finish"
            return 1
        }
        cat "$LAB_RESULTS/$name.log"
        if ((status != 0)); then
            echo "$name failed with status $status"
            return 1
        fi
    done
}

host_check() {
    if grep -l 'panicked' "$LAB_RESULTS"/rtgt-*.log 2>/dev/null; then
        echo "rtgt-rdma panicked"
        return 1
    fi
    local f
    for f in "$LAB_SHARE"/out/ib_*_bw.log; do
        [[ -f $f ]] || continue
        lab_report "${f##*/}: $(awk '$1 == '"$PT_SIZE"' { print "BW average " $4 " Gb/s, " $5 " Mpps" }' "$f")"
    done
    for f in "$LAB_SHARE"/out/ib_*_lat.log; do
        [[ -f $f ]] || continue
        lab_report "${f##*/}: $(awk '$1 == '"$PT_LAT_SIZE"' { print "latency typical " $5 " us, average " $6 " us" }' "$f")"
    done
}
