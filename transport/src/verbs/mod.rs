//! The verbs layer (IBA 11): device, port and GID table, protection domains, memory regions,
//! completion queues, queue pairs (RC, UD, GSI), shared receive queues and address handles.
//!
//! Handles are cheap references into the device's tables; dropping a handle destroys the
//! resource. Posting validates like a NIC does and fails fast; the transport engine
//! ([`crate::rc`]) runs when the device is driven ([`Device::drive`], [`Device::poll`],
//! [`Device::receive`]). Those methods are defined where what they run lives, the engine and
//! the links ([`crate::netdev`]): both build on this layer, which depends on neither.

pub mod connect;
pub mod cq;
pub mod device;
pub mod event;
pub mod mem;
pub mod mr;
pub mod qp;
pub mod shards;
pub mod types;

pub use connect::RcPath;
pub use cq::{Cq, NotifyKind};
pub use device::{
    Device, DeviceConfig, Expected, Mr, Outgoing, Pd, Qp, QpInitAttr, RxSink, Srq, Stats, GSI_QKEY,
};
pub use event::EventQueue;
pub use mem::Region;
pub use mr::{KeyKind, MrError};
pub use shards::{ShardMember, ShardSet};
pub use types::*;

/// Errors of verbs calls (the errno a NIC's provider library would return is noted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    #[error("resource exhausted: {0}")]
    Exhausted(&'static str),
    #[error("QP state {0:?} does not allow this operation")]
    InvalidState(QpState),
    #[error("QP transition {from:?} -> {to:?} not allowed with these attributes")]
    InvalidTransition { from: QpState, to: QpState },
    #[error("work queue full")]
    QueueFull,
    #[error("too many scatter/gather elements")]
    TooManySge,
    #[error("invalid L_Key {0:#x}")]
    InvalidLkey(u32),
    #[error("inline data too large")]
    InlineTooLarge,
    #[error("opcode not valid for this QP type")]
    InvalidOpcode,
    #[error("message too long")]
    MessageTooLong,
}
