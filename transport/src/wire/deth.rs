//! Datagram Extended Transport Header (IBA 9.3.2; `rxe_hdr.h` `struct rxe_deth`), 8 bytes:
//! Q_Key (u32), reserved byte, source QP (24 bits). Carried by every UD packet, including the
//! MADs to and from the GSI QP1, whose Q_Key is [`GSI_QKEY`].

use core::fmt;

use super::{be, Field, Result, U24_MASK};

/// Length of the DETH.
pub const HEADER_LEN: usize = 8;
/// The well-known Q_Key of QP1 (IBA 13.5.3; rxe checks it on QP1, `rxe_recv.c`).
pub const GSI_QKEY: u32 = 0x8001_0000;

mod field {
    use super::Field;

    pub const QKEY: Field = 0..4;
    pub const RESERVED: usize = 4;
    pub const SRC_QP: Field = 5..8;
}

fixed_len_view! {
    /// A read/write view of a DETH.
    pub struct Packet; len = HEADER_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn qkey(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::QKEY])
    }

    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[field::RESERVED]
    }

    /// Source QP number (24 bits).
    pub fn src_qp(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::SRC_QP])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_qkey(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::QKEY], value)
    }

    pub fn set_reserved(&mut self, value: u8) {
        self.buffer.as_mut()[field::RESERVED] = value
    }

    pub fn set_src_qp(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::SRC_QP], value)
    }
}

/// The decoded DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub qkey: u32,
    pub src_qp: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            qkey: packet.qkey(),
            src_qp: packet.src_qp(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_qkey(self.qkey);
        packet.set_reserved(0);
        packet.set_src_qp(self.src_qp & U24_MASK);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DETH qkey={:#x} src_qp={:#x}", self.qkey, self.src_qp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    // From the capture: a CM MAD to QP1.
    static BYTES: [u8; 8] = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];

    const REPR: Repr = Repr {
        qkey: GSI_QKEY,
        src_qp: 1,
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
        assert_eq!(Packet::new_checked(&BYTES[..7]), Err(Error));
    }

    #[test]
    fn bad_field() {
        // The reserved byte is ignored on receive.
        let mut b = BYTES;
        b[4] = 0xff;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.reserved(), 0xff);
        assert_eq!(Repr::parse(&p).unwrap(), REPR);
    }
}
