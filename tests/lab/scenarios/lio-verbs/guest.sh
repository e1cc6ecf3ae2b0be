#!/bin/bash
# LIO as the reference RDMA target inside the guest: one fileio LUN on tmpfs exported through
# ib_isert (iSCSI portal on eth0 with iSER enabled) and ib_srpt (RDMA/CM port 5555, the port
# named by rxe0's node GUID), then the same in-guest loopback run as rtgtd on the verbs
# provider passes in rtgt-verbs (lab_rdma_loopback), then the host's reinstatement check.
set -euo pipefail
ip=$LAB_GUEST_IP
# shellcheck source=../../lib/lio.sh
source "$LAB_SHARE/lib/lio.sh"

modprobe -a iscsi_tcp sd_mod ext4
lab_step "creating rxe0 on eth0"
lab_rxe_add rxe0 eth0
modprobe -a ib_iser ib_srp iscsi_target_mod ib_isert ib_srpt

lab_step "LIO: fileio LUN, iSCSI with iSER, SRP"
disk=$(lab_lio_fileio disk0 "$DISK_BYTES" "$DISK_SERIAL")
tpg=$LIO_C/iscsi/$TARGET_IQN/tpgt_1
# Any initiator: ACLs generated at login, writable.
lab_lio_lun "$tpg" "$disk"
mkdir -p "$tpg/np/$ip:3260"
echo 1 >"$tpg/np/$ip:3260/iser"
for a in authentication=0 generate_node_acls=1 demo_mode_write_protect=0 cache_dynamic_acls=1; do
    echo "${a#*=}" >"$tpg/attrib/${a%=*}"
done
echo 1 >"$tpg/enable"

guid=$(cat /sys/class/infiniband/rxe0/node_guid)
# The fabric's configfs tree appears with its directory.
mkdir -p "$LIO_C/srpt"
echo 5555 >"$LIO_C/srpt/discovery_auth/rdma_cm_port"
# ib_srpt has no generated ACLs: the initiators' port GUID (this guest's, over loopback) and
# addresses (the RDMA/CM source of a login).
lab_lio_lun "$LIO_C/srpt/$guid/tpgt_1" "$disk" "$guid" "$ip" "$LAB_HOST_IP"
echo 1 >"$LIO_C/srpt/$guid/tpgt_1/enable"
find "$LIO_C/iscsi" "$LIO_C/srpt" -maxdepth 6 | sed "s|$LIO_C/||" >"$LAB_OUT/lio-configfs.txt"
id=${guid//:/}
srp_target="id_ext=$id,ioc_guid=$id,dest=$ip:5555"

lab_rdma_loopback "$ip" "$TARGET_IQN" "$srp_target" "$DISK_WWN" "$DISK_BYTES"
lab_srp_remove_all || lab_fail "SRP remote port not deleted"

lab_step "host: reinstatement over iSER"
lab_signal target-ready
lab_wait host-done 300 || lab_fail "the host did not finish"
[[ $(lab_host_status) == 0 ]] || lab_fail "the host's check failed"
dmesg | grep -iE 'isert|srpt|iscsi|target' | tail -n 80 >"$LAB_OUT/lio-dmesg.txt" || true
lab_step "lio-verbs done"
