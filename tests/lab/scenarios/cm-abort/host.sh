# shellcheck shell=bash
# Host side of cm-abort: a persistent `rtgt-rdma rping -s -P`, whose live QP count and CM
# counters the guest reads from /lab/rtgt-server.stats while it kills its client.
# shellcheck source=SCRIPTDIR/../../lib/cm-host.sh
source "$LAB_DIR/lib/cm-host.sh"

host_setup() {
    cm_setup
}

host_run() {
    cm_start_server rtgt-server -P -V --timeout 280 || return 1
    lab_signal host-server
    lab_wait guest-done 240 || return 1
    cat "$LAB_SHARE/rtgt-server.stats"
    lab_daemon_alive rtgt-server || {
        echo "rtgt-rdma rping exited"
        return 1
    }
    lab_report "$(lab_event guest-done)"
}

host_check() {
    cm_check_logs
}
