//! Wire formats of the RoCEv2 stack: zero-copy views and plain representations.
//!
//! Every header has two levels, after smoltcp's `wire` module:
//!
//! * a view `Packet<T: AsRef<[u8]>>` whose getters read fixed byte ranges of the buffer (setters
//!   need `T: AsMut<[u8]>`), built with `new_unchecked`, `new_checked` or checked later with
//!   `check_len`;
//! * a `Repr` struct with `parse`, `buffer_len` and `emit` that holds the decoded fields.
//!
//! # Panic contract
//!
//! Once `check_len` (or `new_checked`) has succeeded, no accessor of a view panics, whatever the
//! bytes are. A view made with `new_unchecked` over a buffer that is too short panics on access;
//! untrusted bytes must therefore always go through `new_checked`. `Repr::emit` panics if the
//! buffer is shorter than `Repr::buffer_len`. Reserved fields are written as zero and ignored on
//! receive (IBA 9.2), except where a module says otherwise.
//!
//! # Contents
//!
//! * RoCEv2 transport (IBA 9.2, IBA Annex A17; Linux `rxe_hdr.h`, `include/rdma/ib_pack.h`):
//!   [`opcode`], [`bth`], [`reth`], [`aeth`], [`deth`], [`immdt`], [`ieth`], [`atomic_eth`],
//!   [`atomic_ack_eth`], [`feth`], and [`roce`] for a whole packet (BTH through ICRC).
//! * Framing: [`ethernet`], [`ipv4`], [`ipv6`], [`udp`], [`datagram`] (IP + UDP around a RoCE
//!   packet) and [`icrc`] (the invariant CRC exactly as `rxe_icrc.c` computes it).
//! * Management: [`mad`] (the common MAD header), [`cm`] (IB CM messages, IBA 12.6) and [`cma`]
//!   (the rdma_cm private-data header and service IDs).

#[macro_use]
mod macros;

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod cma;
pub mod datagram;
pub mod deth;
pub mod ethernet;
pub mod feth;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod ipv4;
pub mod ipv6;
pub mod mad;
pub mod opcode;
pub mod reth;
pub mod roce;
pub mod udp;

use core::fmt;

pub use aeth::{NakCode, Packet as AethPacket, Repr as AethRepr, Syndrome};
pub use atomic_ack_eth::{Packet as AtomicAckEthPacket, Repr as AtomicAckEthRepr};
pub use atomic_eth::{Packet as AtomicEthPacket, Repr as AtomicEthRepr};
pub use bth::{Packet as BthPacket, Repr as BthRepr};
pub use cma::{Packet as CmaHdrPacket, PortSpace, Repr as CmaHdrRepr};
pub use datagram::{Datagram, IpRepr};
pub use deth::{Packet as DethPacket, Repr as DethRepr};
pub use ethernet::{EtherType, Frame as EthernetFrame, Repr as EthernetRepr};
pub use feth::{Packet as FethPacket, Repr as FethRepr};
pub use ieth::{Packet as IethPacket, Repr as IethRepr};
pub use immdt::{Packet as ImmDtPacket, Repr as ImmDtRepr};
pub use ipv4::{Packet as Ipv4Packet, Repr as Ipv4Repr};
pub use ipv6::{Packet as Ipv6Packet, Repr as Ipv6Repr};
pub use mad::{Method as MadMethod, MgmtClass, Packet as MadPacket, Repr as MadRepr};
pub use opcode::{ExtHeaders, OpFlags, Opcode, OpcodeInfo, Operation, Position, Transport};
pub use reth::{Packet as RethPacket, Repr as RethRepr};
pub use roce::{Packet as RocePacket, Repr as RoceRepr};
pub use udp::{Packet as UdpPacket, Repr as UdpRepr};

/// The error of every parser in this module: the bytes are truncated or malformed.
///
/// Deliberately carries no detail (as in smoltcp): callers drop the packet, and the protocol
/// engines map their own checks to NAK codes or CM REJ reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Error;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("truncated or malformed packet")
    }
}

impl std::error::Error for Error {}

/// The result type of the wire parsers.
pub type Result<T> = core::result::Result<T, Error>;

/// A byte range inside a header.
pub(crate) type Field = core::ops::Range<usize>;
/// The bytes from an offset to the end of the buffer.
pub(crate) type Rest = core::ops::RangeFrom<usize>;

/// A bit field inside one byte; `mask` is the field's bits in place (IBTA bit positions count
/// from the MSB, so "\[7:3\]" of a byte is the mask 0xF8).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bits {
    pub byte: usize,
    pub mask: u8,
}

impl Bits {
    pub const fn new(byte: usize, mask: u8) -> Self {
        Bits { byte, mask }
    }

    #[inline]
    pub fn get(self, data: &[u8]) -> u8 {
        (data[self.byte] & self.mask) >> self.mask.trailing_zeros()
    }

    #[inline]
    pub fn get_bool(self, data: &[u8]) -> bool {
        data[self.byte] & self.mask != 0
    }

    /// Writes `value` (excess high bits are dropped) and keeps the other bits of the byte.
    #[inline]
    pub fn set(self, data: &mut [u8], value: u8) {
        let shifted = (value << self.mask.trailing_zeros()) & self.mask;
        data[self.byte] = (data[self.byte] & !self.mask) | shifted;
    }

    #[inline]
    pub fn set_bool(self, data: &mut [u8], value: bool) {
        self.set(data, value as u8);
    }
}

/// Big-endian integer access for byte slices of the exact width.
pub(crate) mod be {
    #[inline]
    pub fn u16(b: &[u8]) -> u16 {
        u16::from_be_bytes([b[0], b[1]])
    }

    #[inline]
    pub fn u24(b: &[u8]) -> u32 {
        u32::from_be_bytes([0, b[0], b[1], b[2]])
    }

    #[inline]
    pub fn u32(b: &[u8]) -> u32 {
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    #[inline]
    pub fn u64(b: &[u8]) -> u64 {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[..8]);
        u64::from_be_bytes(v)
    }

    #[inline]
    pub fn set_u16(b: &mut [u8], v: u16) {
        b[..2].copy_from_slice(&v.to_be_bytes());
    }

    /// Writes the low 24 bits of `v`.
    #[inline]
    pub fn set_u24(b: &mut [u8], v: u32) {
        b[..3].copy_from_slice(&v.to_be_bytes()[1..]);
    }

    #[inline]
    pub fn set_u32(b: &mut [u8], v: u32) {
        b[..4].copy_from_slice(&v.to_be_bytes());
    }

    #[inline]
    pub fn set_u64(b: &mut [u8], v: u64) {
        b[..8].copy_from_slice(&v.to_be_bytes());
    }

    /// Copies a fixed-size array out of a slice of the same length.
    #[inline]
    pub fn array<const N: usize>(b: &[u8]) -> [u8; N] {
        let mut v = [0u8; N];
        v.copy_from_slice(&b[..N]);
        v
    }
}

/// Mask of a 24-bit field (QPNs, PSNs, MSNs, EECNs).
pub const U24_MASK: u32 = 0x00FF_FFFF;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_get_set() {
        let mut b = [0xa5u8];
        let f = Bits::new(0, 0xF8);
        assert_eq!(f.get(&b), 0x14);
        f.set(&mut b, 0x13);
        assert_eq!(b[0], 0x9d);
        f.set(&mut b, 0xff);
        assert_eq!(b[0], 0xfd);
        let lo = Bits::new(0, 0x06);
        lo.set(&mut b, 1);
        assert_eq!(b[0], 0xfb);
        assert_eq!(lo.get(&b), 1);
    }

    #[test]
    fn be_helpers() {
        let mut b = [0xa5u8; 8];
        be::set_u24(&mut b, 0xFF12_3456);
        assert_eq!(&b[..4], &[0x12, 0x34, 0x56, 0xa5]);
        assert_eq!(be::u24(&b), 0x12_3456);
        be::set_u64(&mut b, 0x0102_0304_0506_0708);
        assert_eq!(be::u64(&b), 0x0102_0304_0506_0708);
    }
}
