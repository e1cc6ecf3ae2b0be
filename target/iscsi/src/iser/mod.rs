//! iSER (RFC 7145): iSCSI over rtgt's RDMA stack. The iSCSI session, login and SCSI layers
//! are shared with the TCP driver; this module adds the wire formats ([`header`]), the
//! target's connection driver over the shared RDMA channel layer ([`conn`]) and the CM
//! listener ([`server`]).

pub mod conn;
pub mod header;
pub mod server;

pub use conn::PoolMrs;
pub use conn::{serve, Endpoint, IserStats, Peer, Sizing};
pub use header::CmHeader;
pub use server::IserServer;
