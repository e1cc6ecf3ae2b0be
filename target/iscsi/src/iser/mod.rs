//! iSER (RFC 7145): iSCSI over rtgt's RDMA stack. The iSCSI session, login and SCSI layers
//! are shared with the TCP driver; this module adds the wire formats ([`header`]), memory
//! registration of the buffer pool ([`mem`]), the target's connection driver ([`conn`]) and
//! the CM listener ([`server`]).

pub mod conn;
pub mod header;
pub mod mem;
pub mod server;

pub use conn::{serve, Endpoint, IserStats, Peer, Sizing};
pub use header::CmHeader;
pub use mem::PoolMrs;
pub use server::IserServer;
