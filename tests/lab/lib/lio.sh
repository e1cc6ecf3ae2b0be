# shellcheck shell=bash
# LIO (the kernel's target) through configfs, for the lab guests that run it as the reference.

LIO_C=/sys/kernel/config/target

# lab_lio_fileio NAME BYTES SERIAL [THIN]: a fileio backstore of BYTES on tmpfs
# (core/fileio_0/NAME), with unit serial SERIAL (LIO derives the NAA designator from it:
# 6001405 and its first 25 hex digits); THIN=1 emulates thin provisioning (UNMAP, WRITE SAME
# with UNMAP). Prints the backstore's configfs path.
lab_lio_fileio() {
    local name=$1 bytes=$2 serial=$3 thin=${4:-0} b
    modprobe -a target_core_mod target_core_file
    mkdir -p /var/target/pr /var/target/alua
    b=$LIO_C/core/fileio_0/$name
    truncate -s "$bytes" "/dev/shm/lio-$name.img"
    mkdir -p "$b"
    echo "fd_dev_name=/dev/shm/lio-$name.img,fd_dev_size=$bytes" >"$b/control"
    echo "$serial" >"$b/wwn/vpd_unit_serial"
    echo 1 >"$b/enable"
    if [[ $thin == 1 ]]; then
        echo 1 >"$b/attrib/emulate_tpu"
        echo 1 >"$b/attrib/emulate_tpws"
    fi
    echo "$b"
}

# lab_lio_lun TPG BACKSTORE ACL...: LUN 0 of TPG (a configfs TPG directory) on BACKSTORE, mapped
# as LUN 0 for each initiator ACL named.
lab_lio_lun() {
    local tpg=$1 bs=$2 acl
    shift 2
    mkdir -p "$tpg/lun/lun_0"
    ln -s "$bs" "$tpg/lun/lun_0/$(basename "$bs")"
    for acl in "$@"; do
        mkdir -p "$tpg/acls/$acl/lun_0"
        ln -s "$tpg/lun/lun_0" "$tpg/acls/$acl/lun_0/lun0"
    done
}
