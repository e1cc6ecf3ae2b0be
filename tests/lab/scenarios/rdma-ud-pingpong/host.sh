# shellcheck shell=bash
# Host side of rdma-rc-pingpong / rdma-ud-pingpong: rtgt-rdma (rtgt's software RoCEv2 stack on
# UDP 4791 of the host address) against rdma-core's ibv_{rc,ud}_pingpong on rxe0 in the guest.
# First rtgt serves and the guest connects, one run per size; then the guest serves and rtgt
# connects. rtgt checks the payload of every message it gets back (the rdma-core tools send
# back the buffer they received into).

PP_MODE=${LAB_SCENARIO#rdma-}
PP_MODE=${PP_MODE%-pingpong}
PP_ITERS=${PP_ITERS:-100}
# Path MTU: what rxe0 offers on eth0 (4096 from an Ethernet MTU of 4200 up, as `--mtu 9000`).
if ((LAB_MTU >= 4200)); then
    PP_MTU=${PP_MTU:-4096}
else
    PP_MTU=${PP_MTU:-1024}
fi
if [[ $PP_MODE == ud ]]; then
    # A UD message is at most one MTU.
    PP_SIZES=${PP_SIZES:-"256 $PP_MTU"}
else
    PP_SIZES=${PP_SIZES:-"4096 65536 1048576"}
fi

host_setup() {
    RTGT_RDMA=${RTGT_RDMA:-}
    if [[ -z $RTGT_RDMA && -n ${RTGTD:-} ]]; then
        RTGT_RDMA=$(dirname "$RTGTD")/rtgt-rdma
    fi
    [[ -x $RTGT_RDMA ]] || lab_skip "no rtgt-rdma binary (set RTGT_RDMA, or RTGTD to a sibling build)"
    echo "RTGT_RDMA=$RTGT_RDMA" >"$LAB_WORK/rtgt-rdma.env"
    lab_guest_export PP_MODE="$PP_MODE" PP_SIZES="$PP_SIZES" PP_ITERS="$PP_ITERS" PP_MTU="$PP_MTU"
}

# pp_time NAME: seconds reported by a pingpong log ("N bytes in X seconds ...").
pp_time() {
    sed -n 's/^[0-9]* bytes in \([0-9.]*\) seconds.*/\1/p' "$LAB_RESULTS/$1.log" | head -1
}

host_run() {
    # shellcheck source=/dev/null
    source "$LAB_WORK/rtgt-rdma.env"
    local size name status
    for size in $PP_SIZES; do
        name=rtgt-server-$size
        # The server receives through AF_PACKET on the tap, so rxe's ICRCs are verified.
        lab_start_daemon "$name" "$RTGT_RDMA" "$PP_MODE-pingpong" --server --local "$LAB_HOST_IP" \
            -s "$size" -n "$PP_ITERS" -m "$PP_MTU" --eth-mtu "$LAB_MTU" --packet-rx "$LAB_TAP" \
            --timeout 300
        lab_signal "host-server-$size"
        status=$(lab_daemon_status "$name" 320) || {
            echo "$name did not finish"
            return 1
        }
        cat "$LAB_RESULTS/$name.log"
        if ((status != 0)); then
            echo "$name failed with status $status"
            return 1
        fi
        grep -q "^payload check: $PP_ITERS messages intact" "$LAB_RESULTS/$name.log" || {
            echo "$name: no payload check"
            return 1
        }
        grep -q "bad ICRC 0)" "$LAB_RESULTS/$name.log" || {
            echo "$name: received packets with a bad ICRC"
            return 1
        }
        lab_report "rtgt server, guest client, $size bytes x $PP_ITERS, MTU $PP_MTU: $(pp_time "$name") s"
    done
    for size in $PP_SIZES; do
        name=rtgt-client-$size
        lab_wait "guest-server-$size" 300 || return 1
        status=0
        timeout 320 "$RTGT_RDMA" "$PP_MODE-pingpong" -s "$size" -n "$PP_ITERS" -m "$PP_MTU" \
            --eth-mtu "$LAB_MTU" --timeout 300 "$LAB_GUEST_IP" >"$LAB_RESULTS/$name.log" 2>&1 || status=$?
        cat "$LAB_RESULTS/$name.log"
        if ((status != 0)); then
            echo "$name failed with status $status"
            return 1
        fi
        grep -q "^payload check: $PP_ITERS messages intact" "$LAB_RESULTS/$name.log" || {
            echo "$name: no payload check"
            return 1
        }
        lab_report "guest server, rtgt client, $size bytes x $PP_ITERS, MTU $PP_MTU: $(pp_time "$name") s"
    done
}

host_check() {
    if grep -l 'panicked' "$LAB_RESULTS"/rtgt-*.log 2>/dev/null; then
        echo "rtgt-rdma panicked"
        return 1
    fi
}
