//! rtgt's tools: initiators for iSCSI over TCP and iSER ([`iscsi`], [`iser`]), SRP
//! ([`srp`]) and NVMe/TCP ([`nvme`]), which the tests and the `rtgt-iscsi`, `rtgt-srp`, `rtgt-nvme` command-line tools drive the
//! targets with, and the `rtgt-rdma` RDMA test tools. Nothing in rtgtd links this crate.

pub mod bench;
pub mod buffers;
pub mod cli;
pub mod iscsi;
pub mod iser;
pub mod nvme;
pub mod poll;
pub mod srp;
