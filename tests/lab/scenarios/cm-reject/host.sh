# shellcheck shell=bash
# Host side of cm-reject: `rtgt-rdma rping -s -P` listens on port 7174 only; the guest's
# connects to another port must be answered with REJ "invalid service ID" at once.
# shellcheck source=SCRIPTDIR/../../lib/cm-host.sh
source "$LAB_DIR/lib/cm-host.sh"

CM_ATTEMPTS=${CM_ATTEMPTS:-3}

host_setup() {
    cm_setup
    lab_guest_export CM_ATTEMPTS="$CM_ATTEMPTS"
}

host_run() {
    cm_start_server rtgt-server -P -V --timeout 280 || return 1
    lab_signal host-server
    lab_wait guest-done 240 || return 1
    local rej served
    rej=$(cm_stat_at_least rtgt-server rej_sent "$CM_ATTEMPTS") || {
        echo "rtgt sent $rej REJs for $CM_ATTEMPTS connects to a closed port"
        return 1
    }
    served=$(cm_stat_at_least rtgt-server served 2) || {
        echo "rtgt served $served connections around the rejects"
        return 1
    }
    cat "$LAB_SHARE/rtgt-server.stats"
    lab_report "$CM_ATTEMPTS connects to a closed port rejected ($rej REJ), $(lab_event guest-done)"
}

host_check() {
    cm_check_logs
}
