//! UDP header (RFC 768). rxe sends RoCEv2 with checksum 0 on IPv4 and IPv6 alike
//! (`rxe_net.c` `prepare_udp_hdr`); the ICRC masks the checksum field.

use core::fmt;
use std::net::IpAddr;

use super::{be, ipv4, Error, Field, Result};

/// Length of the UDP header.
pub const HEADER_LEN: usize = 8;

mod field {
    use super::Field;

    pub const SRC_PORT: Field = 0..2;
    pub const DST_PORT: Field = 2..4;
    pub const LENGTH: Field = 4..6;
    pub const CHECKSUM: Field = 6..8;
}

/// A read/write view of a UDP datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks the buffer holds the header and the length the header claims.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error);
        }
        let claimed = usize::from(self.len());
        if claimed < HEADER_LEN || claimed > len {
            return Err(Error);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn src_port(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::SRC_PORT])
    }

    pub fn dst_port(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::DST_PORT])
    }

    /// The length field: header plus payload.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::LENGTH])
    }

    pub fn checksum(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::CHECKSUM])
    }

    pub fn header(&self) -> &[u8] {
        &self.buffer.as_ref()[..HEADER_LEN]
    }

    /// The payload, up to the length field.
    pub fn payload(&self) -> &[u8] {
        let data = self.buffer.as_ref();
        let end = usize::from(self.len()).clamp(HEADER_LEN.min(data.len()), data.len());
        &data[HEADER_LEN.min(end)..end]
    }

    /// Whether the checksum is zero (absent) or correct for the given addresses.
    pub fn verify_checksum(&self, src: IpAddr, dst: IpAddr) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        let data = self.buffer.as_ref();
        let end = usize::from(self.len()).min(data.len());
        fold_with_pseudo_header(src, dst, &data[..end]) == 0xFFFF
    }
}

fn fold_with_pseudo_header(src: IpAddr, dst: IpAddr, datagram: &[u8]) -> u16 {
    let mut acc = 0;
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            acc = ipv4::sum(acc, &s.octets());
            acc = ipv4::sum(acc, &d.octets());
        }
        _ => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
                IpAddr::V6(a) => a.octets(),
            };
            acc = ipv4::sum(acc, &v6(src));
            acc = ipv4::sum(acc, &v6(dst));
        }
    }
    acc += u32::from(super::ipv4::PROTOCOL_UDP);
    acc += datagram.len() as u32;
    ipv4::fold(ipv4::sum(acc, datagram))
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_src_port(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::SRC_PORT], value)
    }

    pub fn set_dst_port(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::DST_PORT], value)
    }

    pub fn set_len(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::LENGTH], value)
    }

    pub fn set_checksum(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::CHECKSUM], value)
    }

    /// Computes and stores the checksum over the datagram (header, payload) and the pseudo
    /// header; call after the payload, including a RoCE packet's ICRC, is in place.
    pub fn fill_checksum(&mut self, src: IpAddr, dst: IpAddr) {
        self.set_checksum(0);
        let end = usize::from(self.len());
        let sum = !fold_with_pseudo_header(src, dst, &self.buffer.as_ref()[..end]);
        self.set_checksum(if sum == 0 { 0xFFFF } else { sum });
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The decoded UDP header. The checksum is not kept: rxe sends 0 and the ICRC protects the
/// RoCE payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub src_port: u16,
    pub dst_port: u16,
    pub payload_len: usize,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            payload_len: usize::from(packet.len()) - HEADER_LEN,
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header with checksum 0 (as rxe does). Panics if the length does not fit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_len(u16::try_from(HEADER_LEN + self.payload_len).expect("UDP payload too long"));
        packet.set_checksum(0);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "UDP {} > {} len={}",
            self.src_port, self.dst_port, self.payload_len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 8] = [0xc1, 0x23, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00];

    const REPR: Repr = Repr {
        src_port: 0xc123,
        dst_port: 4791,
        payload_len: 32,
    };

    #[test]
    fn parse() {
        let mut bytes = BYTES.to_vec();
        bytes.resize(40, 0);
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), REPR);
        assert_eq!(p.payload().len(), 32);
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; 40];
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(&buf[..8], &BYTES);
    }

    #[test]
    fn checksum() {
        let src: IpAddr = "192.168.1.1".parse().unwrap();
        let dst: IpAddr = "192.168.1.2".parse().unwrap();
        let mut buf = [0x5au8; 40];
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.fill_checksum(src, dst);
        assert_ne!(p.checksum(), 0);
        assert!(p.verify_checksum(src, dst));
        assert!(!p.verify_checksum(src, "192.168.1.3".parse().unwrap()));
        let v6: IpAddr = "fe80::1".parse().unwrap();
        p.fill_checksum(v6, dst);
        assert!(p.verify_checksum(v6, dst));
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&BYTES[..7]), Err(Error));
        // Length field 40 but only 39 bytes.
        let mut bytes = BYTES.to_vec();
        bytes.resize(39, 0);
        assert_eq!(Packet::new_checked(&bytes[..]), Err(Error));
    }

    #[test]
    fn bad_field() {
        let mut bytes = BYTES;
        bytes[5] = 7; // length below the header
        assert_eq!(Packet::new_checked(&bytes[..]), Err(Error));
    }
}
