# shellcheck shell=bash
# Host side of rtgt-power-cut: writes through rtgtd in the guest (one `rtgt-iscsi durability
# write` per LUN, logging every acknowledgement here on the host, which is not cut), cuts the
# guest's power while they write, and after the guest booted again checks every LUN with
# `rtgt-iscsi durability check`.

RTGT_IQN=iqn.2025-01.io.rtgt.lab:power-cut
# LUN number, backstore name, file system, direct, write_cache, writer options. The LUNs that
# test SYNCHRONIZE CACHE have a file system of their own (/dev/vda): a FUA write or an O_DSYNC
# write commits the whole file system's journal, which would make the allocations of direct
# writes durable without any flush. The FUA and write-through LUNs share /dev/vdb.
LUNS=(
    "0 cached-sync sync false true --sync-every 100 --fua-every 0"
    "1 direct-sync sync true true --sync-every 100 --fua-every 0"
    "2 cached-fua other false true --sync-every 0 --fua-every 25"
    "3 direct-fua other true true --sync-every 0 --fua-every 25"
    "4 cached-wt other false false --sync-every 0 --fua-every 0"
    "5 direct-wt other true false --sync-every 0 --fua-every 0"
)
LUN_SIZE_MB=32
# Before the cut: at least this long, and at least this many acknowledged flushes per LUN that
# sends them.
WRITE_SECONDS=${POWER_CUT_WRITE_SECONDS:-10}
MIN_FLUSHES=3

host_setup() {
    [[ -x ${RTGTD:-} ]] || lab_skip "RTGTD does not name the rtgtd binary"
    RTGT_ISCSI=${RTGT_ISCSI:-$(dirname "$RTGTD")/rtgt-iscsi}
    if [[ ! -x $RTGT_ISCSI ]]; then
        [[ -z ${CI:-} || ${CI:-} == false || ${CI:-} == 0 ]] || { echo "no rtgt-iscsi at $RTGT_ISCSI"; return 1; }
        lab_skip "no rtgt-iscsi next to RTGTD (set RTGT_ISCSI)"
    fi
    echo "RTGT_ISCSI=$RTGT_ISCSI" >"$LAB_WORK/rtgt-iscsi.env"
    # The guest runs the host's rtgtd (both Debian bookworm).
    cp "$RTGTD" "$LAB_SHARE/rtgtd"
    local l lun name fs direct wc backstores="" luns=""
    for l in "${LUNS[@]}"; do
        read -r lun name fs direct wc _ <<<"$l"
        backstores+="  - {name: $name, type: file, path: /mnt/luns/$fs/$name.img, size: ${LUN_SIZE_MB}MiB, direct: $direct, write_cache: $wc}"$'\n'
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

# unflushed_tail LOG: writes logged since the last acknowledged flush or FUA write.
unflushed_tail() {
    awk '/^F / || /^W .* 1$/ { n = 0; next } /^W / { n++ } END { print n + 0 }' "$1" 2>/dev/null || echo 0
}

host_run() {
    # shellcheck disable=SC1091
    source "$LAB_WORK/rtgt-iscsi.env"
    lab_wait rtgtd-ready 300 || return 1
    local l lun name fs direct wc opts start i ok rc=0
    for l in "${LUNS[@]}"; do
        read -r lun name fs direct wc opts <<<"$l"
        # shellcheck disable=SC2086  # opts: several options
        lab_start_daemon "writer-$name" "$RTGT_ISCSI" durability write --url "$(url "$lun")" \
            --log "$LAB_RESULTS/$name.durability" --iodepth 8 $opts
    done
    # Write until the LUNs that flush have had flushes acknowledged, then cut the power mid-run.
    start=$(date +%s)
    for ((i = 0; ; i++)); do
        ok=1
        for l in "${LUNS[@]}"; do
            read -r lun name fs direct wc opts <<<"$l"
            lab_daemon_alive "writer-$name" || { echo "the writer of $name ended before the cut"; return 1; }
            [[ $opts == *"--sync-every 0"* ]] && continue
            (($(flushes "$LAB_RESULTS/$name.durability") >= MIN_FLUSHES)) || ok=0
        done
        (($(date +%s) - start >= WRITE_SECONDS && ok)) && break
        if (($(date +%s) - start >= 180)); then
            echo "fewer than $MIN_FLUSHES flushes acknowledged after 180 s"
            return 1
        fi
        sleep 0.5
    done
    # Then plain writes only, until every log ends with writes no flush or FUA covers.
    for l in "${LUNS[@]}"; do
        read -r lun name fs direct wc opts <<<"$l"
        kill -USR1 "$(awk -v n="writer-$name" '$2 == n { p = $1 } END { print p }' "$LAB_WORK/daemons")"
    done
    start=$(date +%s)
    for l in "${LUNS[@]}"; do
        read -r lun name fs direct wc opts <<<"$l"
        until (($(unflushed_tail "$LAB_RESULTS/$name.durability") >= 40)); do
            (($(date +%s) - start < 120)) || { echo "$name: no plain writes after SIGUSR1"; return 1; }
            sleep 0.2
        done
    done
    lab_power_cut || return 1
    for l in "${LUNS[@]}"; do
        read -r lun name fs direct wc opts <<<"$l"
        lab_stop_daemon "writer-$name"
        [[ $(lab_daemon_status "writer-$name" 10) == 0 ]] || { echo "the writer of $name failed"; rc=1; }
        echo "$name: $(sed -n '$p' "$LAB_RESULTS/writer-$name.log")"
    done
    ((rc == 0)) || return 1

    # The guest boots again on the same disks, replays the ext4 journals and serves the LUNs.
    lab_wait rtgtd-ready-2 300 || return 1
    local pids=() min
    for l in "${LUNS[@]}"; do
        read -r lun name fs direct wc opts <<<"$l"
        # What makes the LUN's test not vacuous: flushes acknowledged and writes after the last
        # one, FUA writes acknowledged, or writes acknowledged at all (write-through).
        if [[ $opts != *"--sync-every 0"* ]]; then
            min=(--min-flushes "$MIN_FLUSHES" --min-after-flush 40 --min-required 100)
        elif [[ $opts != *"--fua-every 0"* ]]; then
            min=(--min-flushes 0 --min-required 5)
        else
            min=(--min-flushes 0 --min-required 100)
        fi
        "$RTGT_ISCSI" durability check --url "$(url "$lun")" --log "$LAB_RESULTS/$name.durability" \
            "${min[@]}" >"$LAB_RESULTS/check-$name.log" 2>&1 &
        pids+=($!)
    done
    i=0
    for l in "${LUNS[@]}"; do
        read -r lun name fs direct wc opts <<<"$l"
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
    return "$rc"
}
