//! rtgtd, rtgt's daemon: it builds the targets of the configuration ([`build`]) on the
//! fabrics of `rtgt_iscsi` (iSCSI over TCP and iSER) and `rtgt_srp`, the NVMe over Fabrics
//! subsystems of `rtgt_nvme` ([`nvme`]), serves the admin API
//! and applies its changes ([`control`]), and runs until told to stop ([`daemon`],
//! [`sdnotify`]).
//!
//! Dependency direction: `rtgt_scsi` (SCSI engine, task layer, target core) ← the fabrics
//! `rtgt_iscsi` and `rtgt_srp`, and `rtgt_nvme` (on the backstores) ← this crate, which also links `rtgt_api` (configuration,
//! admin API, metrics).

pub mod build;
pub mod control;
pub mod daemon;
pub mod nvme;
pub mod sdnotify;
