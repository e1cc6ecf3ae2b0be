//! RDMA Extended Transport Header (IBA 9.3.3; `rxe_hdr.h` `struct rxe_reth`), 16 bytes:
//! virtual address (u64), R_Key (u32), DMA length (u32).
//!
//! Carried by RDMA WRITE FIRST/ONLY, RDMA READ REQUEST (the length is the whole read), FLUSH
//! and ATOMIC WRITE.

use core::fmt;

use super::{be, Field, Result};

/// Length of the RETH.
pub const HEADER_LEN: usize = 16;

mod field {
    use super::Field;

    pub const VA: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const DMA_LEN: Field = 12..16;
}

fixed_len_view! {
    /// A read/write view of a RETH.
    pub struct Packet; len = HEADER_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn va(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::VA])
    }

    pub fn rkey(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::RKEY])
    }

    pub fn dma_len(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::DMA_LEN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_va(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::VA], value)
    }

    pub fn set_rkey(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::RKEY], value)
    }

    pub fn set_dma_len(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::DMA_LEN], value)
    }
}

/// The decoded RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            va: packet.va(),
            rkey: packet.rkey(),
            dma_len: packet.dma_len(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_va(self.va);
        packet.set_rkey(self.rkey);
        packet.set_dma_len(self.dma_len);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RETH va={:#x} rkey={:#x} len={}",
            self.va, self.rkey, self.dma_len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    static BYTES: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x9a, 0x00, 0x00, 0x12, 0x34, 0x00, 0x01, 0x00,
        0x00,
    ];

    const REPR: Repr = Repr {
        va: 0x7f12_3456_789a,
        rkey: 0x1234,
        dma_len: 0x1_0000,
    };

    #[test]
    fn parse() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), REPR);
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; HEADER_LEN];
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&BYTES[..15]), Err(Error));
    }

    #[test]
    fn bad_field() {
        // Every bit pattern is a valid RETH; a zero length is legal (zero-byte WRITE/READ).
        let p = Packet::new_checked(&[0xffu8; 16][..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap().dma_len, u32::MAX);
    }
}
