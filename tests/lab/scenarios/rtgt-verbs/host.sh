# shellcheck shell=bash
# Host side of rtgt-verbs: hands rtgtd and its configuration to the guest, where it runs on
# rdma_rxe through rdma-core; once the guest's own initiators are done, the host's soft-RoCE
# initiators (rtgt-iscsi --iser, rtgt-srp) run their bench against it across the tap.

VERBS_IQN=iqn.2025-01.io.rtgt.lab:verbs
VERBS_WWN=6001405aabbccdd0011223344556677c

host_setup() {
    lab_rtgt_bin --share rtgt-iscsi rtgt-srp || return 1
    cat >"$LAB_SHARE/rtgt.yaml" <<YAML
backstores:
  - {name: disk, type: file, path: disk.img, size: 256MiB, block_size: 512,
     serial: rtgtverbs01, wwn: $VERBS_WWN}
targets:
  - name: $VERBS_IQN
    portal_groups:
      - tag: 1
        portals: ['$LAB_GUEST_IP:3260']
        allow_any_initiator: true
        luns: [{lun: 0, backstore: disk}]
rdma:
  provider: verbs
  addresses: [$LAB_GUEST_IP]
srp:
  - name: verbs
    listen: ['$LAB_GUEST_IP:5555']
    allow_any_initiator: true
    luns: [{lun: 0, backstore: disk}]
YAML
    cp "$LAB_SHARE/rtgt.yaml" "$LAB_RESULTS/rtgt.yaml"
    lab_guest_export TARGET_IQN="$VERBS_IQN" DISK_WWN="$VERBS_WWN" DISK_BYTES=$((256 << 20))
}

# bench NAME CMD...: one initiator's bench run, its report line kept in bench.txt.
bench() {
    local name=$1 out
    shift
    out=$(timeout 120 "$@" 2>>"$LAB_RESULTS/bench.err") || {
        echo "$name failed"
        tail -20 "$LAB_RESULTS/bench.err"
        return 1
    }
    printf '%s %s\n' "$name" "$(grep -o 'ios=.*' <<<"$out" | tail -1)" | tee -a "$LAB_RESULTS/bench.txt"
    grep -q "^$name ios=[1-9]" "$LAB_RESULTS/bench.txt" || {
        echo "$name: no I/O done"
        return 1
    }
}

host_run() {
    lab_wait target-ready 700 || return 1
    # shellcheck source=/dev/null
    source "$LAB_WORK/bin.env"
    local srp rc=0 url="iscsi://$LAB_GUEST_IP:3260/$VERBS_IQN/0"
    srp=$(lab_event target-ready)
    : >"$LAB_RESULTS/bench.txt"
    local iser=("$BIN/rtgt-iscsi" --iser "$LAB_HOST_IP" --eth-mtu "$LAB_MTU")
    local srpc=("$BIN/rtgt-srp" --local "$LAB_HOST_IP" --eth-mtu "$LAB_MTU" --lun 0)
    # Session reinstatement: a second login with the same ISID ends the first session (its
    # READs in flight fail, its QP is torn down on verbs) and the second one serves.
    timeout 60 "${iser[@]}" reinstate --url "$url" | tee "$LAB_RESULTS/reinstate.txt" || rc=1
    grep -q '^reinstated:' "$LAB_RESULTS/reinstate.txt" || {
        echo "no reinstatement"
        rc=1
    }
    bench iser-randwrite-4k "${iser[@]}" bench --url "$url" --rw randwrite --bs 4k --iodepth 16 --seconds 5 || rc=1
    bench iser-randread-4k "${iser[@]}" bench --url "$url" --rw randread --bs 4k --iodepth 16 --seconds 5 || rc=1
    bench iser-read-128k "${iser[@]}" bench --url "$url" --rw read --bs 128k --iodepth 4 --seconds 5 || rc=1
    bench srp-randwrite-4k "${srpc[@]}" bench --target "$srp" --mode direct --rw randwrite --bs 4k --iodepth 16 --seconds 5 || rc=1
    bench srp-randread-4k "${srpc[@]}" bench --target "$srp" --mode direct --rw randread --bs 4k --iodepth 16 --seconds 5 || rc=1
    bench srp-read-128k "${srpc[@]}" bench --target "$srp" --mode indirect --rw read --bs 128k --iodepth 4 --seconds 5 || rc=1
    bench srp-write-128k "${srpc[@]}" bench --target "$srp" --mode external --rw write --bs 128k --iodepth 4 --seconds 5 || rc=1
    # A login to a target port that does not exist: SRP_LOGIN_REJ in the CM's REJ
    # (rdma_reject with its private data).
    local bad out
    bad=$(sed 's/id_ext=[0-9a-f]*/id_ext=00000000deadbeef/' <<<"$srp")
    if out=$(timeout 60 "$BIN/rtgt-srp" --local "$LAB_HOST_IP" --eth-mtu "$LAB_MTU" login --target "$bad" 2>&1); then
        echo "login to a wrong target port succeeded"
        rc=1
    fi
    echo "$out" | tee "$LAB_RESULTS/srp-reject.txt"
    grep -q 'login rejected: SRP_LOGIN_REJ reason' "$LAB_RESULTS/srp-reject.txt" || {
        echo "no SRP_LOGIN_REJ for a wrong target port"
        rc=1
    }
    return "$rc"
}

host_check() {
    # Every bench row ran.
    [[ $(wc -l <"$LAB_RESULTS/bench.txt") == 7 ]] || {
        echo "bench rows missing"
        return 1
    }
}
