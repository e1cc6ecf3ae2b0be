# shellcheck shell=bash
# Host side of nvmet-captures: the names the guest uses, then tshark's census of what it
# captured, which must hold every PDU type and RDMA operation the codec tests follow
# (target/nvme/tests/captures.rs runs on the copies in target/nvme/tests/fixtures/).

host_setup() {
    lab_guest_export SUBNQN=nqn.2024-01.org.rtgt.lab:nvmet-capture \
        GUEST_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:5f1c6a3e-2b7d-4c1a-9e0f-3a6b8d9c0e21 \
        GUEST_HOSTID=5f1c6a3e-2b7d-4c1a-9e0f-3a6b8d9c0e21
}

# census FILE FIELD VALUE...: every VALUE occurs in the census.
census() {
    local file=$1 field=$2 v
    shift 2
    for v in "$@"; do
        grep -qE "^ *[0-9]+ $v\$" "$file" || {
            echo "$(basename "$file"): no $field $v"
            return 1
        }
    done
}

host_check() {
    local out=$LAB_SHARE/out f
    for f in nvme-tcp nvme-rdma; do
        [[ -s $out/$f.pcap ]] || {
            echo "no $f.pcap from the guest"
            return 1
        }
        cp "$out/$f.pcap" "$LAB_RESULTS/"
    done
    # PDU types, one per line (a frame holding several PDUs lists each).
    tshark -r "$out/nvme-tcp.pcap" -Y nvme-tcp -T fields -e nvme-tcp.type | tr ',' '\n' |
        sort -n | uniq -c >"$LAB_RESULTS/nvme-tcp-census.txt"
    tshark -r "$out/nvme-rdma.pcap" -d udp.port==4791,infiniband -T fields \
        -e infiniband.bth.opcode | sort -n | uniq -c >"$LAB_RESULTS/nvme-rdma-census.txt"
    cat "$LAB_RESULTS/nvme-tcp-census.txt" "$LAB_RESULTS/nvme-rdma-census.txt"
    # ICReq, ICResp, CapsuleCmd, CapsuleResp, H2CData, C2HData, R2T.
    census "$LAB_RESULTS/nvme-tcp-census.txt" "PDU type" 0 1 4 5 6 7 9 || return 1
    # SEND only, SEND only with invalidate, RDMA WRITE first and only, RDMA READ request and
    # first response, ACK, UD SEND only (CM).
    census "$LAB_RESULTS/nvme-rdma-census.txt" opcode 4 23 6 10 12 13 17 100 || return 1
    lab_report "nvme-tcp.pcap $(stat -c %s "$out/nvme-tcp.pcap") bytes, nvme-rdma.pcap $(stat -c %s "$out/nvme-rdma.pcap") bytes"
}
