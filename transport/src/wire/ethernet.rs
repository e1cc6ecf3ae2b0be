//! Ethernet II framing (IEEE 802.3), enough to send and receive RoCEv2 through a packet socket.
//! VLAN tags are not handled: a tagged frame shows up with [`EtherType::Unknown`]`(0x8100)`.

use core::fmt;

use super::{be, Error, Field, Rest, Result};

/// Length of the Ethernet header.
pub const HEADER_LEN: usize = 14;

mod field {
    use super::{Field, Rest};

    pub const DESTINATION: Field = 0..6;
    pub const SOURCE: Field = 6..12;
    pub const ETHERTYPE: Field = 12..14;
    pub const PAYLOAD: Rest = 14..;
}

enum_with_unknown! {
    /// The EtherType of the payload.
    pub enum EtherType(u16) {
        Ipv4 = 0x0800,
        Arp = 0x0806,
        Ipv6 = 0x86DD,
    }
}

/// A read/write view of an Ethernet frame (without FCS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    pub const fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Frame<T>> {
        let frame = Self::new_unchecked(buffer);
        frame.check_len()?;
        Ok(frame)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn dst_addr(&self) -> [u8; 6] {
        be::array(&self.buffer.as_ref()[field::DESTINATION])
    }

    pub fn src_addr(&self) -> [u8; 6] {
        be::array(&self.buffer.as_ref()[field::SOURCE])
    }

    pub fn ethertype(&self) -> EtherType {
        EtherType::from(be::u16(&self.buffer.as_ref()[field::ETHERTYPE]))
    }

    /// Everything after the header (including any padding to the 60-byte minimum).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PAYLOAD]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    pub fn set_dst_addr(&mut self, value: [u8; 6]) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&value)
    }

    pub fn set_src_addr(&mut self, value: [u8; 6]) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&value)
    }

    pub fn set_ethertype(&mut self, value: EtherType) {
        be::set_u16(&mut self.buffer.as_mut()[field::ETHERTYPE], value.into())
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD]
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Frame<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The decoded Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub src_addr: [u8; 6],
    pub dst_addr: [u8; 6],
    pub ethertype: EtherType,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(frame: &Frame<&T>) -> Result<Repr> {
        frame.check_len()?;
        Ok(Repr {
            src_addr: frame.src_addr(),
            dst_addr: frame.dst_addr(),
            ethertype: frame.ethertype(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut Frame<T>) {
        frame.set_src_addr(self.src_addr);
        frame.set_dst_addr(self.dst_addr);
        frame.set_ethertype(self.ethertype);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mac = |a: [u8; 6]| {
            format!(
                "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                a[0], a[1], a[2], a[3], a[4], a[5]
            )
        };
        write!(
            f,
            "Ethernet {} > {} {:?}",
            mac(self.src_addr),
            mac(self.dst_addr),
            self.ethertype
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The first 14 bytes of a frame in the lab capture.
    static BYTES: [u8; 14] = [
        0x52, 0x54, 0x00, 0x12, 0x34, 0x02, 0x52, 0x54, 0x00, 0x12, 0x34, 0x03, 0x08, 0x00,
    ];

    const REPR: Repr = Repr {
        dst_addr: [0x52, 0x54, 0x00, 0x12, 0x34, 0x02],
        src_addr: [0x52, 0x54, 0x00, 0x12, 0x34, 0x03],
        ethertype: EtherType::Ipv4,
    };

    #[test]
    fn parse() {
        let f = Frame::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&f).unwrap(), REPR);
        assert!(f.payload().is_empty());
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; 14];
        REPR.emit(&mut Frame::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn truncated() {
        assert_eq!(Frame::new_checked(&BYTES[..13]), Err(Error));
    }

    #[test]
    fn bad_field() {
        let mut b = BYTES;
        b[12] = 0x81;
        let f = Frame::new_checked(&b[..]).unwrap();
        assert_eq!(f.ethertype(), EtherType::Unknown(0x8100));
    }
}
