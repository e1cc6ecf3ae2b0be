# shellcheck shell=bash
# Host side of tgt-iscsi-tcp: Debian's tgtd in the namespace, one target with a 256 MiB LUN 1.

TGT_IQN=iqn.2024-01.org.rtgt.lab:tgt-disk

tgt() { tgtadm -C "$TGT_PORT" "$@"; }

host_setup() {
    truncate -s 256M "$LAB_WORK/disk.img"
    # A private management port (socket /var/run/tgtd/socket.N, N <= 32767) so that another tgtd
    # on the machine is not disturbed.
    TGT_PORT=$((10000 + RANDOM % 20000))
    while [[ -e /var/run/tgtd/socket.$TGT_PORT.lock ]]; do TGT_PORT=$((10000 + RANDOM % 20000)); done
    lab_start_daemon tgtd tgtd -f -C "$TGT_PORT"
    local i
    for ((i = 0; i < 100; i++)); do
        tgt --mode system --op show >/dev/null 2>&1 && break
        lab_daemon_alive tgtd || { cat "$LAB_RESULTS/tgtd.log"; return 1; }
        sleep 0.1
    done
    tgt --lld iscsi --mode target --op new --tid 1 --targetname "$TGT_IQN"
    tgt --lld iscsi --mode logicalunit --op new --tid 1 --lun 1 --backing-store "$LAB_WORK/disk.img"
    tgt --lld iscsi --mode target --op bind --tid 1 --initiator-address ALL
    tgt --lld iscsi --mode target --op show >"$LAB_RESULTS/tgt-config.txt"
    lab_wait_tcp "$LAB_HOST_IP" 3260 10
    lab_guest_export TARGET_IQN="$TGT_IQN"
}

host_teardown() {
    # tgtd does not stop on SIGTERM while it has targets.
    lab_stop_daemon tgtd 0
    [[ -z ${TGT_PORT:-} ]] || rm -f "/var/run/tgtd/socket.$TGT_PORT" "/var/run/tgtd/socket.$TGT_PORT.lock"
}

host_check() {
    # tgtd must have survived the whole run.
    lab_daemon_alive tgtd || { echo "tgtd died"; return 1; }
}
