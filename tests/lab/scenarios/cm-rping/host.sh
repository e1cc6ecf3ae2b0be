# shellcheck shell=bash
# Host side of cm-rping: rtgt's connection manager against the Linux one. First `rtgt-rdma
# rping -s` serves one guest rping client per size (it checks every buffer it reads against
# rping's pattern, the guest's -V checks the echo); then the guest runs rping -s and
# `rtgt-rdma rping -c` connects to it, once per size, checking the echo.
# shellcheck source=SCRIPTDIR/../../lib/cm-host.sh
source "$LAB_DIR/lib/cm-host.sh"

CM_SIZES=${CM_SIZES:-"64 4096 65535"}
CM_COUNT=${CM_COUNT:-200}

host_setup() {
    cm_setup
    lab_guest_export CM_SIZES="$CM_SIZES" CM_COUNT="$CM_COUNT"
}

host_run() {
    local n size name status
    n=$(wc -w <<<"$CM_SIZES")
    cm_start_server rtgt-server -P -V --connections "$n" --timeout 400 || return 1
    lab_signal host-server
    status=$(lab_daemon_status rtgt-server 420) || {
        echo "rtgt-server did not finish"
        return 1
    }
    cat "$LAB_RESULTS/rtgt-server.log"
    ((status == 0)) || {
        echo "rtgt-server failed with status $status"
        return 1
    }
    grep -q "^payload check: $((n * CM_COUNT)) pings intact" "$LAB_RESULTS/rtgt-server.log" || {
        echo "rtgt-server: not all $((n * CM_COUNT)) pings checked"
        return 1
    }
    lab_report "rtgt server: $n guest rping clients x $CM_COUNT pings ($CM_SIZES bytes), payload checked"
    for size in $CM_SIZES; do
        name=rtgt-client-$size
        lab_wait "guest-server-$size" 300 || return 1
        status=0
        timeout 300 "$RTGT_RDMA" rping -c -a "$LAB_GUEST_IP" -C "$CM_COUNT" -S "$size" -V \
            --eth-mtu "$LAB_MTU" --timeout 280 >"$LAB_RESULTS/$name.log" 2>&1 || status=$?
        cat "$LAB_RESULTS/$name.log"
        ((status == 0)) || {
            echo "$name failed with status $status"
            return 1
        }
        grep -q "^payload check: $CM_COUNT pings intact" "$LAB_RESULTS/$name.log" || {
            echo "$name: no payload check"
            return 1
        }
        lab_signal "host-client-$size"
        lab_report "rtgt client, guest rping server: $(grep -m1 '^[0-9]* pings of' "$LAB_RESULTS/$name.log"), echo checked"
    done
}

host_check() {
    cm_check_logs
}
