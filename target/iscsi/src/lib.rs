//! iSCSI (RFC 7143): the target, with its TCP and iSER connection drivers.
//!
//! Layers, bottom up:
//! - [`pdu`], [`text`]: wire formats (BHS/AHS views and `Repr`s, key=value text);
//! - [`params`], [`chap`], [`login`], [`discovery`]: negotiation, authentication, the login
//!   state machine and SendTargets — none of them touch a socket;
//! - [`session`]: CmdSN window, task table, task management, the session table;
//! - [`conn`]: full feature phase of one connection, written against the
//!   [`conn::ConnDriver`] trait, which TCP ([`conn_tcp`]) and iSER ([`iser`]) share;
//! - [`server`]: accept loop, session creation and reinstatement, daemon controls;
//! - [`iser`]: iSCSI over rtgt's RDMA stack (RFC 7145).
//!
//! The SCSI engine and target core below come from `rtgt_scsi`; the in-repo initiators that
//! drive this target are in the `rtgt-tools` crate.

pub mod chap;
pub mod conn;
pub mod conn_tcp;
pub mod discovery;
pub mod iser;
pub mod login;
pub mod params;
pub mod pdu;
pub mod server;
pub mod session;
pub mod shared;
pub mod text;

pub use params::{SessionParams, SessionType, TransportKind};
pub use server::IscsiServer;
pub use session::SessionInfo;

/// A malformed field in bytes from the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireError;

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("malformed iSCSI wire data")
    }
}

impl std::error::Error for WireError {}

/// Errors of the iSCSI target and of initiators built on its codecs.
#[derive(Debug, thiserror::Error)]
pub enum IscsiError {
    #[error("connection I/O")]
    Io(#[from] std::io::Error),
    #[error("connection closed")]
    Closed,
    #[error("timed out")]
    Timeout,
    #[error("header digest mismatch")]
    HeaderDigest,
    #[error("data segment of {len} bytes exceeds MaxRecvDataSegmentLength {max}")]
    SegmentTooLong { len: u32, max: u32 },
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    #[error("malformed PDU")]
    Malformed(#[source] WireError),
    #[error("task aborted")]
    Aborted,
    #[error("login failed with status 0x{0:04x}")]
    LoginFailed(u16),
    #[error("negotiation failed: {0}")]
    Negotiation(String),
    #[error("authentication failed: {0}")]
    Authentication(&'static str),
    #[error("PDU rejected by the target, reason 0x{0:02x}")]
    Rejected(u8),
    #[error("task management function failed with response {0}")]
    TaskManagement(u8),
    #[error("invalid address or URL: {0}")]
    Address(String),
}

impl From<rtgt_rdma_channel::LinkError> for IscsiError {
    fn from(e: rtgt_rdma_channel::LinkError) -> IscsiError {
        match e {
            rtgt_rdma_channel::LinkError::Closed => IscsiError::Closed,
            rtgt_rdma_channel::LinkError::TooLarge => {
                IscsiError::Protocol("PDU larger than a send slot")
            }
            rtgt_rdma_channel::LinkError::Registration => {
                IscsiError::Protocol("buffer registration")
            }
        }
    }
}

impl From<WireError> for IscsiError {
    fn from(e: WireError) -> Self {
        IscsiError::Malformed(e)
    }
}
