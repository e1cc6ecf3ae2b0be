# shellcheck shell=bash
# Host side of rxe-loopback: hands rtgt-rdma to the guest, whose `rtgt-rdma devices` reads
# rxe0 through rdma-core as the `verbs` provider will.
# shellcheck source=SCRIPTDIR/../../lib/cm-host.sh
source "$LAB_DIR/lib/cm-host.sh"

host_setup() {
    cm_setup
    mkdir -p "$LAB_SHARE/bin"
    cp "$RTGT_RDMA" "$LAB_SHARE/bin/rtgt-rdma"
}
