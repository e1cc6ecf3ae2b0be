//! rtgt's SCSI target.
//!
//! Dependency direction: [`scsi`] (no fabric knowledge) ← [`core`] (targets, portal groups,
//! LUN maps, ACLs, sessions) ← fabrics ([`iscsi`], [`srp`]) ← the `rtgtd` daemon.

pub mod core;
pub mod daemon;
pub mod iscsi;
pub mod scsi;
pub mod srp;
