# shellcheck shell=bash
# Handshake between the host side and the guest side of a lab scenario: events are files in the
# shared directory's events/ folder (the host's $LAB_SHARE/events is the guest's /lab/events).
# Used on both sides; needs LAB_EVENTS (the events directory). LAB_PEER_END names the event after
# which the other side will signal nothing more (the host waits on "guest-exited", the guest on
# "host-done"); a wait for another event gives up once it appears.

# lab_signal NAME [TEXT]: raise event NAME, optionally with a one-line payload.
lab_signal() {
    local name=$1
    shift
    printf '%s\n' "$*" >"$LAB_EVENTS/.$name.tmp"
    mv -f "$LAB_EVENTS/.$name.tmp" "$LAB_EVENTS/$name"
}

# lab_wait NAME [TIMEOUT_S]: wait for event NAME (default timeout 300 s). Returns 0 when it is
# raised, 1 on timeout or when the other side has ended without raising it.
lab_wait() {
    local name=$1 timeout=${2:-300} start now
    start=$(date +%s)
    while [[ ! -e $LAB_EVENTS/$name ]]; do
        if [[ -n ${LAB_PEER_END:-} && $name != "$LAB_PEER_END" && -e $LAB_EVENTS/$LAB_PEER_END ]]; then
            # The other side may have raised NAME between the check above and its end.
            [[ -e $LAB_EVENTS/$name ]] && return 0
            echo "lab: wait for '$name': the other side ended ($LAB_PEER_END)" >&2
            return 1
        fi
        now=$(date +%s)
        if ((now - start >= timeout)); then
            echo "lab: wait for '$name' timed out after ${timeout}s" >&2
            return 1
        fi
        sleep 0.2
    done
}

# lab_event NAME: print the payload of event NAME (empty if not raised).
lab_event() {
    cat "$LAB_EVENTS/$1" 2>/dev/null || true
}
