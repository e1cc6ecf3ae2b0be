//! SRP, the SCSI RDMA Protocol (SRP r16a; Linux `include/scsi/srp.h`, ib_srp, ib_srpt), on
//! rtgt's soft-RoCE stack.
//!
//! * [`iu`]: the information units and the RDMA/CM form of the login request;
//! * [`login`]: login validation, LOGIN_RSP and LOGIN_REJ;
//! * [`port`]: a target port's runtime: logins, sessions (I_T nexuses) and their channels;
//! * [`channel`]: one RDMA channel: receive ring, commands, data movement, task management;
//! * [`service`]: target ports from the configuration, RDMA/CM listeners, `add_target` strings.
//!
//! The SRP initiator that drives this target is in the `rtgt-tools` crate.

pub mod channel;
pub mod iu;
pub mod login;
pub mod nexus;
pub mod port;
pub mod service;

pub use channel::{Channel, CloseReason};
pub use login::{ChannelParams, Limits};
pub use port::{Login, SrpPort};
