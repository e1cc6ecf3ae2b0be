//! Atomic Extended Transport Header (IBA 9.3.4; `rxe_hdr.h` `struct rxe_atmeth`, packed),
//! 28 bytes: virtual address (u64), R_Key (u32), swap or add data (u64), compare data (u64).

use core::fmt;

use super::{be, Field, Result};

/// Length of the AtomicETH.
pub const HEADER_LEN: usize = 28;

mod field {
    use super::Field;

    pub const VA: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const SWAP_ADD: Field = 12..20;
    pub const COMPARE: Field = 20..28;
}

fixed_len_view! {
    /// A read/write view of an AtomicETH.
    pub struct Packet; len = HEADER_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn va(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::VA])
    }

    pub fn rkey(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::RKEY])
    }

    /// The swap value of COMPARE SWAP or the addend of FETCH ADD.
    pub fn swap_add(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::SWAP_ADD])
    }

    /// The compare value of COMPARE SWAP (unused by FETCH ADD).
    pub fn compare(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::COMPARE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_va(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::VA], value)
    }

    pub fn set_rkey(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::RKEY], value)
    }

    pub fn set_swap_add(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::SWAP_ADD], value)
    }

    pub fn set_compare(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::COMPARE], value)
    }
}

/// The decoded AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
}

impl Repr {
    /// Decodes the header. The 8-byte alignment of `va` that atomics require (IBA 9.4.5) is
    /// the responder's check (NAK invalid request), not a syntax error.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            va: packet.va(),
            rkey: packet.rkey(),
            swap_add: packet.swap_add(),
            compare: packet.compare(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_va(self.va);
        packet.set_rkey(self.rkey);
        packet.set_swap_add(self.swap_add);
        packet.set_compare(self.compare);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AtomicETH va={:#x} rkey={:#x} swap_add={:#x} compare={:#x}",
            self.va, self.rkey, self.swap_add, self.compare
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    static BYTES: [u8; 28] = [
        0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x08, // va
        0xca, 0xfe, 0x00, 0x01, // rkey
        0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, // swap/add
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // compare
    ];

    const REPR: Repr = Repr {
        va: 0x1000_0008,
        rkey: 0xcafe_0001,
        swap_add: 0x1122_3344_5566_7788,
        compare: 0x0102_0304_0506_0708,
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
        assert_eq!(Packet::new_checked(&BYTES[..27]), Err(Error));
    }

    #[test]
    fn bad_field() {
        // A misaligned VA still parses; alignment is the responder's check.
        let mut b = BYTES;
        b[7] = 0x03;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap().va, 0x1000_0003);
    }
}
