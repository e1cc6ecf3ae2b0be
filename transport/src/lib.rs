//! rtgt's software RoCEv2 RDMA stack: wire codecs, verbs, RC transport, connection manager.
//!
//! [`wire`] holds the packet formats: the RoCEv2 transport headers and their opcode table, the
//! invariant CRC, the IP/UDP framing around them, and the MAD/CM/rdma_cm messages the
//! connection manager exchanges over QP1.

pub mod wire;
