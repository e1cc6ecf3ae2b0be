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
