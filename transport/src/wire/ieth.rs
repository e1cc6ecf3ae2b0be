//! Invalidate Extended Transport Header (IBA 9.3.6; `rxe_hdr.h` `struct rxe_ieth`), 4 bytes:
//! the R_Key the responder invalidates on SEND LAST/ONLY WITH INVALIDATE.

use core::fmt;

use super::{be, Field, Result};

/// Length of the IETH.
pub const HEADER_LEN: usize = 4;

mod field {
    use super::Field;

    pub const RKEY: Field = 0..4;
}

fixed_len_view! {
    /// A read/write view of an IETH.
    pub struct Packet; len = HEADER_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn rkey(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::RKEY])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_rkey(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::RKEY], value)
    }
}

/// The decoded IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub rkey: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            rkey: packet.rkey(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_rkey(self.rkey)
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IETH rkey={:#x}", self.rkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    static BYTES: [u8; 4] = [0x00, 0x00, 0x1b, 0x7c];

    #[test]
    fn parse() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), Repr { rkey: 0x1b7c });
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; HEADER_LEN];
        Repr { rkey: 0x1b7c }.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&BYTES[..2]), Err(Error));
    }

    #[test]
    fn bad_field() {
        // Every R_Key value is syntactically valid; the MR lookup judges it.
        let p = Packet::new_checked(&[0xffu8; 4][..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap().rkey, u32::MAX);
    }
}
