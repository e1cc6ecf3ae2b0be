//! The targets of rtgt-iscsi, rtgt-srp and rtgt-nvme driven through the initiators of this
//! crate, in one process: iSCSI over TCP ([`iscsi`]), iSER ([`iser`]) and SRP ([`srp`]) on
//! soft-RoCE loopback, NVMe/TCP ([`nvme`]) on TCP loopback, NVMe/RDMA ([`nvme_rdma`]) on
//! soft-RoCE loopback, and one table of task management cases run against the SCSI fabrics
//! ([`tmf`]).

mod iscsi;
mod iser;
mod nvme;
mod nvme_rdma;
mod srp;
mod tmf;

/// Where a test's backing files go: a disk file system (O_DIRECT writes) and, when there is
/// one, tmpfs (buffered transfers inline, reads sent from the file's pages).
fn file_dirs() -> Vec<(tempfile::TempDir, &'static str)> {
    let mut v = vec![(tempfile::tempdir().unwrap(), "disk")];
    if std::path::Path::new("/dev/shm").is_dir() {
        if let Ok(d) = tempfile::tempdir_in("/dev/shm") {
            v.push((d, "tmpfs"));
        }
    }
    v
}
