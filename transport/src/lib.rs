//! rtgt's software RoCEv2 RDMA stack: wire codecs, verbs, RC transport, connection manager.
//!
//! * [`wire`] holds the packet formats: the RoCEv2 transport headers and their opcode table,
//!   the invariant CRC, the IP/UDP framing around them, and the MAD/CM/rdma_cm messages the
//!   connection manager exchanges over QP1.
//! * [`verbs`] is the soft HCA's resource model: device, PD, MR, CQ, QP, SRQ, AH.
//! * [`rc`] is the transport engine: requester, responder and completer of RC QPs (and the UD
//!   send/receive path), driven by packets in, packets out and a clock.
//! * [`netdev`] moves whole IP datagrams: an in-memory loopback, a fault injector and UDP
//!   sockets on port 4791.
//! * [`cm`] is the connection manager: the IB CM over QP1 with rdma_cm addressing (listen,
//!   accept, reject, connect, disconnect).
//! * [`poll`] decides when a loop polls before it sleeps (adaptive busy polling).
//! * [`rdmacore`] loads rdma-core (libibverbs, librdmacm) at run time, for RDMA devices the
//!   kernel drives (RDMA NICs, rdma_rxe) instead of the soft engine; it shares the buffer type
//!   ([`verbs::Region`]) and connection parameters ([`cm::ConnParams`]) of the soft stack.
//! * [`hca`] puts them together: a device on the host's addresses, its driver task and its
//!   CM, on a [`shard`] (an engine thread of its own) or on the caller's runtime.
//!
//! Modules depend on each other one way: [`verbs`] builds on [`wire`]; [`rc`] on both (and
//! defines the device methods that run it); [`netdev`] on those three; [`cm`] on [`rc`],
//! [`verbs`] and [`wire`]; [`hca`] on the others ([`shard`] and [`poll`] on none, [`rdmacore`] on [`verbs`] and [`cm`]). Within a module, no submodule depends on a
//! sibling that depends on it.

pub mod cm;
pub mod hca;
pub mod netdev;
pub mod poll;
pub mod rc;
pub mod rdmacore;
pub(crate) mod ring;
pub mod shard;
pub mod sim;
pub(crate) mod sockaddr;
#[cfg(test)]
mod test_support;
pub mod verbs;
pub mod wire;
