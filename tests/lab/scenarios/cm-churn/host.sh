# shellcheck shell=bash
# Host side of cm-churn: a persistent `rtgt-rdma rping -s -P -V`; the guest connects, pings and
# disconnects CM_CYCLES times and then checks that rtgt is back to its idle QP count.
# shellcheck source=SCRIPTDIR/../../lib/cm-host.sh
source "$LAB_DIR/lib/cm-host.sh"

CM_CYCLES=${CM_CYCLES:-50}

host_setup() {
    cm_setup
    lab_guest_export CM_CYCLES="$CM_CYCLES"
}

host_run() {
    cm_start_server rtgt-server -P -V --timeout 380 || return 1
    lab_signal host-server
    lab_wait guest-done 360 || return 1
    local served failed bad
    served=$(cm_stat_at_least rtgt-server served "$CM_CYCLES") || true
    cat "$LAB_SHARE/rtgt-server.stats"
    failed=$(cm_stat rtgt-server failed)
    bad=$(cm_stat rtgt-server bad_payload)
    ((served == CM_CYCLES && failed == 0 && bad == 0)) || {
        echo "rtgt served $served of $CM_CYCLES connections ($failed failed, $bad bad payloads)"
        return 1
    }
    lab_report "$CM_CYCLES connect/ping/disconnect cycles: $(lab_event guest-done)"
}

host_check() {
    cm_check_logs
}
