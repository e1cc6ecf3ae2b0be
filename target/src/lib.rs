//! rtgt's SCSI target.
//!
//! Dependency direction: `rtgt_scsi` (the SCSI engine, with no fabric knowledge, and its
//! target core: targets, portal groups, LUN maps, ACLs) ← fabrics ([`iscsi`], [`iser`],
//! [`srp`]) ← the `rtgtd` daemon.

pub mod build;
pub mod control;
pub mod daemon;
pub mod iscsi;
pub mod iser;
pub mod sdnotify;
pub mod srp;

#[cfg(test)]
mod tmf_tests;
