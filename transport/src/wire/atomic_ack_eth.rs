//! Atomic Acknowledge Extended Transport Header (IBA 9.5.3; `rxe_hdr.h` `struct rxe_atmack`),
//! 8 bytes: the original value at the target address.

use core::fmt;

use super::{be, Field, Result};

/// Length of the AtomicAckETH.
pub const HEADER_LEN: usize = 8;

mod field {
    use super::Field;

    pub const ORIG: Field = 0..8;
}

fixed_len_view! {
    /// A read/write view of an AtomicAckETH.
    pub struct Packet; len = HEADER_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn orig(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::ORIG])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_orig(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::ORIG], value)
    }
}

/// The decoded AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub orig: u64,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            orig: packet.orig(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_orig(self.orig)
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AtomicAckETH orig={:#x}", self.orig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    static BYTES: [u8; 8] = [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef];

    #[test]
    fn parse() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(
            Repr::parse(&p).unwrap(),
            Repr {
                orig: 0x0123_4567_89ab_cdef
            }
        );
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; HEADER_LEN];
        Repr {
            orig: 0x0123_4567_89ab_cdef,
        }
        .emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&BYTES[..7]), Err(Error));
    }

    #[test]
    fn bad_field() {
        // Every value is valid.
        let p = Packet::new_checked(&[0xffu8; 8][..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap().orig, u64::MAX);
    }
}
