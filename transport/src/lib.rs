//! rtgt's software RoCEv2 RDMA stack: wire codecs, verbs, RC transport, connection manager.
