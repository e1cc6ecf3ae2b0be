//! IPv6 header (RFC 8200), as RoCEv2 uses it: a 40-byte header followed directly by UDP (no
//! extension headers). The ICRC masks traffic class, flow label and hop limit.

use core::fmt;
use std::net::Ipv6Addr;

use super::{be, Error, Field, Result};

/// Length of the fixed header.
pub const HEADER_LEN: usize = 40;

mod field {
    use super::Field;

    pub const VER_TC_FLOW: Field = 0..4;
    pub const LENGTH: Field = 4..6;
    pub const NXT_HDR: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC_ADDR: Field = 8..24;
    pub const DST_ADDR: Field = 24..40;
}

/// A read/write view of an IPv6 packet.
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

    /// Checks the buffer holds the header and the payload length it claims.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN || HEADER_LEN + usize::from(self.payload_len()) > len {
            Err(Error)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn word0(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::VER_TC_FLOW])
    }

    pub fn version(&self) -> u8 {
        (self.word0() >> 28) as u8
    }

    pub fn traffic_class(&self) -> u8 {
        (self.word0() >> 20) as u8
    }

    pub fn flow_label(&self) -> u32 {
        self.word0() & 0xF_FFFF
    }

    pub fn payload_len(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::LENGTH])
    }

    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NXT_HDR]
    }

    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    pub fn src_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(be::array::<16>(&self.buffer.as_ref()[field::SRC_ADDR]))
    }

    pub fn dst_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(be::array::<16>(&self.buffer.as_ref()[field::DST_ADDR]))
    }

    pub fn header(&self) -> &[u8] {
        &self.buffer.as_ref()[..HEADER_LEN]
    }

    /// The payload, up to the payload length.
    pub fn payload(&self) -> &[u8] {
        let data = self.buffer.as_ref();
        let end = (HEADER_LEN + usize::from(self.payload_len())).min(data.len());
        &data[HEADER_LEN.min(end)..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 6, the traffic class and the flow label (20 bits).
    pub fn set_version_tc_flow(&mut self, traffic_class: u8, flow_label: u32) {
        let word = (6 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0xF_FFFF);
        be::set_u32(&mut self.buffer.as_mut()[field::VER_TC_FLOW], word)
    }

    pub fn set_payload_len(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::LENGTH], value)
    }

    pub fn set_next_header(&mut self, value: u8) {
        self.buffer.as_mut()[field::NXT_HDR] = value
    }

    pub fn set_hop_limit(&mut self, value: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = value
    }

    pub fn set_src_addr(&mut self, value: Ipv6Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&value.octets())
    }

    pub fn set_dst_addr(&mut self, value: Ipv6Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&value.octets())
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The decoded IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub src_addr: Ipv6Addr,
    pub dst_addr: Ipv6Addr,
    pub next_header: u8,
    pub payload_len: usize,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
}

impl Repr {
    /// Decodes the header; fails on a version other than 6.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        if packet.version() != 6 {
            return Err(Error);
        }
        Ok(Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            next_header: packet.next_header(),
            payload_len: usize::from(packet.payload_len()),
            hop_limit: packet.hop_limit(),
            traffic_class: packet.traffic_class(),
            flow_label: packet.flow_label(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header. Panics if `payload_len` does not fit 16 bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_version_tc_flow(self.traffic_class, self.flow_label);
        packet.set_payload_len(u16::try_from(self.payload_len).expect("IPv6 payload too long"));
        packet.set_next_header(self.next_header);
        packet.set_hop_limit(self.hop_limit);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IPv6 {} > {} nxt={} len={}",
            self.src_addr, self.dst_addr, self.next_header, self.payload_len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // fe80::1 > fe80::2, TC 0x20, flow label 0x12345, UDP, hop limit 64, 40 bytes of payload.
    static BYTES: [u8; 40] = [
        0x62, 0x01, 0x23, 0x45, 0x00, 0x28, 0x11, 0x40, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0x01, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02,
    ];

    fn repr() -> Repr {
        Repr {
            src_addr: "fe80::1".parse().unwrap(),
            dst_addr: "fe80::2".parse().unwrap(),
            next_header: 17,
            payload_len: 40,
            hop_limit: 64,
            traffic_class: 0x20,
            flow_label: 0x12345,
        }
    }

    #[test]
    fn parse() {
        let mut bytes = BYTES.to_vec();
        bytes.resize(80, 0);
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), repr());
        assert_eq!(p.payload().len(), 40);
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; 80];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(&buf[..40], &BYTES);
    }

    #[test]
    fn truncated() {
        let mut bytes = BYTES.to_vec();
        bytes.resize(79, 0);
        assert_eq!(Packet::new_checked(&bytes[..]), Err(Error));
        assert_eq!(Packet::new_checked(&bytes[..39]), Err(Error));
    }

    #[test]
    fn bad_field() {
        let mut bytes = BYTES.to_vec();
        bytes.resize(80, 0);
        bytes[0] = 0x42;
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(Repr::parse(&p), Err(Error));
    }
}
