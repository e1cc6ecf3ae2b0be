//! NVMe over Fabrics codecs: the 64-byte submission queue entry and the 16-byte completion
//! queue entry with status codes ([`sqe`]), SGL descriptors, the fabrics commands and the
//! Connect data ([`fabrics`]), the admin command set's fields and data structures
//! (Identify, log pages, the discovery log: [`admin`]), the NVM command set's ([`nvm`]), the
//! NVMe/TCP PDUs ([`tcp`]) and the NVMe/RDMA connection private data ([`rdma`]). On them, the
//! target: subsystems, namespaces over backstores, ports and Connect ([`subsys`]), and the
//! controllers that execute admin and NVM commands ([`ctrl`]).
//!
//! Every structure has a plain representation with `parse` and `emit`. Parsers take untrusted
//! bytes, never panic and check every length before reading; `emit` panics only when handed a
//! buffer shorter than the structure. Multi-byte fields are little-endian, as NVMe's are.

pub mod admin;
pub mod ctrl;
pub mod fabrics;
pub mod nvm;
pub mod queue;
pub mod rdma;
pub mod rdma_queue;
pub mod sqe;
pub mod subsys;
pub mod tcp;
pub mod tcp_queue;

pub(crate) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    u64::from(le32(b, at)) | u64::from(le32(b, at + 4)) << 32
}

pub(crate) fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests;
