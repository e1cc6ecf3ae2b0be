//! FLUSH Extended Transport Header (IBA 1.5 memory placement extensions; newer `rxe_hdr.h`
//! `FETH_*`), 4 bytes; one 32-bit word whose bits \[5:4\] are the selectivity level and \[3:0\] the
//! placement type, the rest reserved.

use core::fmt;

use super::{be, Error, Field, Result};

/// Length of the FETH.
pub const HEADER_LEN: usize = 4;

const PLT_MASK: u32 = 0x0000_000F;
const SEL_MASK: u32 = 0x0000_0030;
const SEL_SHIFT: u32 = 4;

mod field {
    use super::Field;

    pub const WORD: Field = 0..4;
}

fixed_len_view! {
    /// A read/write view of a FETH.
    pub struct Packet; len = HEADER_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    fn word(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::WORD])
    }

    /// Selectivity level (0 = memory region range, 1 = whole memory region).
    pub fn selectivity_level(&self) -> u8 {
        ((self.word() & SEL_MASK) >> SEL_SHIFT) as u8
    }

    /// Placement type bits (1 = global visibility, 2 = persistence).
    pub fn placement_type(&self) -> u8 {
        (self.word() & PLT_MASK) as u8
    }

    /// The reserved bits \[31:6\].
    pub fn reserved(&self) -> u32 {
        self.word() & !(SEL_MASK | PLT_MASK)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes the whole word: reserved bits zero.
    pub fn set_fields(&mut self, selectivity_level: u8, placement_type: u8) {
        let word = ((u32::from(selectivity_level) << SEL_SHIFT) & SEL_MASK)
            | (u32::from(placement_type) & PLT_MASK);
        be::set_u32(&mut self.buffer.as_mut()[field::WORD], word)
    }
}

/// The decoded FETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub selectivity_level: u8,
    pub placement_type: u8,
}

impl Repr {
    /// Decodes the header; the reserved selectivity level 3 is an error.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        if packet.selectivity_level() > 1 {
            return Err(Error);
        }
        Ok(Repr {
            selectivity_level: packet.selectivity_level(),
            placement_type: packet.placement_type(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_fields(self.selectivity_level, self.placement_type)
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "FETH sel={} plt={:#x}",
            self.selectivity_level, self.placement_type
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 4] = [0x00, 0x00, 0x00, 0x12];

    const REPR: Repr = Repr {
        selectivity_level: 1,
        placement_type: 2,
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
        assert_eq!(Packet::new_checked(&BYTES[..3]), Err(Error));
    }

    #[test]
    fn bad_field() {
        let p = Packet::new_checked(&[0x00u8, 0, 0, 0x32][..]).unwrap();
        assert_eq!(p.selectivity_level(), 3);
        assert_eq!(Repr::parse(&p), Err(Error));
    }
}
