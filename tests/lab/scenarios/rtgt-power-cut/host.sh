# shellcheck shell=bash
# Host side of rtgt-power-cut: writes through rtgtd in the guest (one `rtgt-iscsi durability
# write` per LUN, logging every acknowledgement here on the host, which is not cut), cuts the
# guest's power while they write, and after the guest booted again checks every LUN with
# `rtgt-iscsi durability check`.

RTGT_IQN=iqn.2025-01.io.rtgt.lab:power-cut
# LUN number, backstore name, direct, write_cache.
LUNS=(
    "0 cached-wc false true"
    "1 direct-wc true true"
    "2 cached-wt false false"
    "3 direct-wt true false"
)
LUN_SIZE_MB=64
# Before the cut: at least this long, and at least this many acknowledged flushes per LUN.
WRITE_SECONDS=${POWER_CUT_WRITE_SECONDS:-10}
MIN_FLUSHES=3

host_setup() {
    [[ -x ${RTGTD:-} ]] || lab_skip "RTGTD does not name the rtgtd binary"
    RTGT_ISCSI=${RTGT_ISCSI:-$(dirname "$RTGTD")/rtgt-iscsi}
    [[ -x $RTGT_ISCSI ]] || lab_skip "no rtgt-iscsi next to RTGTD (set RTGT_ISCSI)"
    echo "RTGT_ISCSI=$RTGT_ISCSI" >"$LAB_WORK/rtgt-iscsi.env"
    # The guest runs the host's rtgtd (both Debian bookworm).
    cp "$RTGTD" "$LAB_SHARE/rtgtd"
    local lun name direct wc backstores="" luns=""
    for l in "${LUNS[@]}"; do
        read -r lun name direct wc <<<"$l"
        backstores+="  - {name: $name, type: file, path: /mnt/luns/$name.img, size: ${LUN_SIZE_MB}MiB, write_cache: $wc}"$'\n'
        luns+="          - {lun: $lun, backstore: $name}"$'\n'
    done
    cat >"$LAB_SHARE/rtgt.yaml" <<YAML
backstores:
$backstores
targets:
  - name: $RTGT_IQN
    portal_groups:
      - tag: 1
        portals: ['$LAB_GUEST_IP:3260']
        allow_any_initiator: true
        luns:
$luns
api: {listen: []}
policy: {backstore_roots: [/mnt/luns]}
YAML
    cp "$LAB_SHARE/rtgt.yaml" "$LAB_RESULTS/rtgt.yaml"
}

url() { echo "iscsi://$LAB_GUEST_IP/$RTGT_IQN/$1"; }

# flushes LOG: acknowledged SYNCHRONIZE CACHE in a writer's log so far.
flushes() {
    local n
    n=$(grep -c '^F ' "$1" 2>/dev/null)
    echo "${n:-0}"
}

host_run() {
    # shellcheck disable=SC1091
    source "$LAB_WORK/rtgt-iscsi.env"
    lab_wait rtgtd-ready 300 || return 1
    local l lun name direct wc start i ok rc=0
    for l in "${LUNS[@]}"; do
        read -r lun name direct wc <<<"$l"
        lab_start_daemon "writer-$name" "$RTGT_ISCSI" durability write --url "$(url "$lun")" \
            --log "$LAB_RESULTS/$name.durability" --iodepth 8 --sync-every 200 --fua-every 50
    done
    # Write until every LUN has had flushes acknowledged, then cut the power mid-run.
    start=$(date +%s)
    for ((i = 0; ; i++)); do
        ok=1
        for l in "${LUNS[@]}"; do
            read -r lun name direct wc <<<"$l"
            lab_daemon_alive "writer-$name" || { echo "the writer of $name ended before the cut"; return 1; }
            (($(flushes "$LAB_RESULTS/$name.durability") >= MIN_FLUSHES)) || ok=0
        done
        (($(date +%s) - start >= WRITE_SECONDS && ok)) && break
        if (($(date +%s) - start >= 180)); then
            echo "fewer than $MIN_FLUSHES flushes acknowledged after 180 s"
            return 1
        fi
        sleep 0.5
    done
    lab_power_cut || return 1
    for l in "${LUNS[@]}"; do
        read -r lun name direct wc <<<"$l"
        lab_stop_daemon "writer-$name"
        [[ $(lab_daemon_status "writer-$name" 10) == 0 ]] || { echo "the writer of $name failed"; rc=1; }
        sed -n '$p' "$LAB_RESULTS/writer-$name.log"
    done
    ((rc == 0)) || return 1

    # The guest boots again on the same disk, replays the ext4 journal and serves the LUNs.
    lab_wait rtgtd-ready-2 300 || return 1
    local pids=()
    for l in "${LUNS[@]}"; do
        read -r lun name direct wc <<<"$l"
        local min_after=1
        [[ $wc == true ]] && min_after=20
        "$RTGT_ISCSI" durability check --url "$(url "$lun")" --log "$LAB_RESULTS/$name.durability" \
            --min-flushes "$MIN_FLUSHES" --min-after-flush "$min_after" >"$LAB_RESULTS/check-$name.log" 2>&1 &
        pids+=($!)
    done
    i=0
    for l in "${LUNS[@]}"; do
        read -r lun name direct wc <<<"$l"
        local st=0 want_wce=1
        wait "${pids[i]}" || st=$?
        i=$((i + 1))
        [[ $wc == true ]] || want_wce=0
        if ! head -1 "$LAB_RESULTS/$name.durability" | grep -q " wce=$want_wce\$"; then
            echo "LUN $lun ($name): the writer saw a write cache setting other than write_cache: $wc"
            st=1
        fi
        lab_report "LUN $lun $name (direct: $direct, write_cache: $wc): $([[ $st == 0 ]] && echo ok || echo FAILED)"
        while read -r line; do
            lab_report "    ${line#durability check: }"
        done <"$LAB_RESULTS/check-$name.log"
        ((st == 0)) || rc=1
    done
    lab_signal checked
    return "$rc"
}
