//! Immediate Data header (IBA 9.3.5; `rxe_hdr.h` `struct rxe_immdt`), 4 bytes.
//!
//! The value is opaque to the transport; the kernel carries it as a `__be32` from the sender's
//! work request to the receiver's completion. [`Repr::imm`] is the big-endian reading of the four
//! bytes, so `imm.to_be_bytes()` are the wire bytes.

use core::fmt;

use super::{be, Field, Result};

/// Length of the ImmDt header.
pub const HEADER_LEN: usize = 4;

mod field {
    use super::Field;

    pub const IMM: Field = 0..4;
}

fixed_len_view! {
    /// A read/write view of an ImmDt header.
    pub struct Packet; len = HEADER_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn imm(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::IMM])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_imm(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::IMM], value)
    }
}

/// The decoded ImmDt header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub imm: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr { imm: packet.imm() })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_imm(self.imm)
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ImmDt {:#010x}", self.imm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    static BYTES: [u8; 4] = [0xde, 0xad, 0xbe, 0xef];

    #[test]
    fn parse() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), Repr { imm: 0xdead_beef });
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; HEADER_LEN];
        Repr { imm: 0xdead_beef }.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&BYTES[..3]), Err(Error));
    }

    #[test]
    fn bad_field() {
        // Opaque: every value is valid.
        let p = Packet::new_checked(&[0u8; 4][..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap().imm, 0);
    }
}
