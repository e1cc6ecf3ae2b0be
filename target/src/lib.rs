//! rtgt's SCSI target.
//!
//! Dependency direction: [`scsi`] (no fabric knowledge) ← [`core`] (targets, portal groups,
//! LUN maps, ACLs, sessions) ← fabrics ([`iscsi`], [`iser`], [`srp`]) ← the `rtgtd` daemon.

pub mod build;
pub mod control;
pub mod core;
pub mod daemon;
pub mod iscsi;
pub mod iser;
pub mod rdma;
pub mod scsi;
pub mod sdnotify;
pub mod srp;

#[cfg(test)]
mod tmf_tests;
