//! IPv4 header (RFC 791), as far as RoCEv2 needs it: rxe sends 20-byte headers without options,
//! DF set, a varying identification and protocol UDP (`rxe_net.c` `prepare4`). The ICRC covers
//! the identification and flags, so [`Repr`] keeps them.

use core::fmt;
use std::net::Ipv4Addr;

use super::{be, Bits, Error, Field, Result};

/// Length of a header without options.
pub const HEADER_LEN: usize = 20;
/// The IP protocol number of UDP.
pub const PROTOCOL_UDP: u8 = 17;

mod field {
    use super::{Bits, Field};

    pub const VERSION: Bits = Bits::new(0, 0xF0);
    pub const IHL: Bits = Bits::new(0, 0x0F);
    pub const TOS: usize = 1;
    pub const LENGTH: Field = 2..4;
    pub const IDENT: Field = 4..6;
    pub const FLG_OFF: Field = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Field = 10..12;
    pub const SRC_ADDR: Field = 12..16;
    pub const DST_ADDR: Field = 16..20;
}

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const FRAG_OFFSET: u16 = 0x1FFF;

/// The Internet checksum (RFC 1071) of `data`, as it goes into the header field.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(0, data))
}

/// Adds `data` to a one's-complement accumulator (odd length padded with zero).
pub(crate) fn sum(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
        acc = (acc & 0xFFFF) + (acc >> 16);
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

pub(crate) fn fold(mut acc: u32) -> u16 {
    while acc > 0xFFFF {
        acc = (acc & 0xFFFF) + (acc >> 16);
    }
    acc as u16
}

/// A read/write view of an IPv4 packet.
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

    /// Checks the buffer holds the header and the total length the header claims (a longer
    /// buffer, e.g. with Ethernet padding, is fine: [`Packet::payload`] stops at total length).
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error);
        }
        let header_len = self.header_len();
        let total_len = usize::from(self.total_len());
        if header_len < HEADER_LEN || header_len > total_len || total_len > len {
            return Err(Error);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn version(&self) -> u8 {
        field::VERSION.get(self.buffer.as_ref())
    }

    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        usize::from(field::IHL.get(self.buffer.as_ref())) * 4
    }

    /// The type-of-service byte (DSCP << 2 | ECN); masked out of the ICRC.
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[field::TOS]
    }

    pub fn total_len(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::LENGTH])
    }

    pub fn ident(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::IDENT])
    }

    fn flg_off(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::FLG_OFF])
    }

    pub fn dont_frag(&self) -> bool {
        self.flg_off() & FLAG_DF != 0
    }

    pub fn more_frags(&self) -> bool {
        self.flg_off() & FLAG_MF != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (self.flg_off() & FRAG_OFFSET) << 3
    }

    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    pub fn checksum(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::CHECKSUM])
    }

    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(be::array::<4>(&self.buffer.as_ref()[field::SRC_ADDR]))
    }

    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(be::array::<4>(&self.buffer.as_ref()[field::DST_ADDR]))
    }

    /// Whether the header checksum is correct.
    pub fn verify_checksum(&self) -> bool {
        let data = self.buffer.as_ref();
        let end = self.header_len().min(data.len());
        fold(sum(0, &data[..end])) == 0xFFFF
    }

    /// The header bytes.
    pub fn header(&self) -> &[u8] {
        let data = self.buffer.as_ref();
        &data[..self.header_len().min(data.len())]
    }

    /// The payload, up to the total length.
    pub fn payload(&self) -> &[u8] {
        let data = self.buffer.as_ref();
        let end = usize::from(self.total_len()).min(data.len());
        let start = self.header_len().min(end);
        &data[start..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 4 and the header length in bytes (a multiple of 4).
    pub fn set_version_and_header_len(&mut self, header_len: usize) {
        let data = self.buffer.as_mut();
        field::VERSION.set(data, 4);
        field::IHL.set(data, (header_len / 4) as u8);
    }

    pub fn set_tos(&mut self, value: u8) {
        self.buffer.as_mut()[field::TOS] = value
    }

    pub fn set_total_len(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::LENGTH], value)
    }

    pub fn set_ident(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::IDENT], value)
    }

    /// Sets the flags and fragment offset word: DF as given, MF clear, offset 0.
    pub fn set_dont_frag(&mut self, value: bool) {
        let word = if value { FLAG_DF } else { 0 };
        be::set_u16(&mut self.buffer.as_mut()[field::FLG_OFF], word)
    }

    pub fn set_ttl(&mut self, value: u8) {
        self.buffer.as_mut()[field::TTL] = value
    }

    pub fn set_protocol(&mut self, value: u8) {
        self.buffer.as_mut()[field::PROTOCOL] = value
    }

    pub fn set_checksum(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::CHECKSUM], value)
    }

    pub fn set_src_addr(&mut self, value: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&value.octets())
    }

    pub fn set_dst_addr(&mut self, value: Ipv4Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&value.octets())
    }

    /// Computes and stores the header checksum.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let len = self.header_len();
        let value = checksum(&self.buffer.as_ref()[..len]);
        self.set_checksum(value);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        let end = usize::from(self.total_len());
        &mut self.buffer.as_mut()[start..end]
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The decoded IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub src_addr: Ipv4Addr,
    pub dst_addr: Ipv4Addr,
    pub protocol: u8,
    /// Bytes after the header.
    pub payload_len: usize,
    pub ttl: u8,
    pub tos: u8,
    pub ident: u16,
    pub dont_frag: bool,
}

impl Repr {
    /// The header of a UDP datagram as Linux sends RoCEv2 from an unconnected socket with
    /// `IP_PMTUDISC_DO` (docs/WIRE.md §8): TTL 64, DF, ID 0, TOS 0; the payload length is
    /// filled in when the datagram is emitted.
    pub fn udp(src_addr: Ipv4Addr, dst_addr: Ipv4Addr) -> Repr {
        Repr {
            src_addr,
            dst_addr,
            protocol: PROTOCOL_UDP,
            payload_len: 0,
            ttl: 64,
            tos: 0,
            ident: 0,
            dont_frag: true,
        }
    }

    /// Decodes the header. Fails on a version other than 4, options (rxe's ICRC covers a fixed
    /// 20-byte header, `rxe_icrc.c`), fragments and a wrong checksum.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        if packet.version() != 4
            || packet.header_len() != HEADER_LEN
            || packet.more_frags()
            || packet.frag_offset() != 0
            || !packet.verify_checksum()
        {
            return Err(Error);
        }
        Ok(Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.protocol(),
            payload_len: packet.payload().len(),
            ttl: packet.ttl(),
            tos: packet.tos(),
            ident: packet.ident(),
            dont_frag: packet.dont_frag(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes a 20-byte header with its checksum. Panics if `payload_len` does not fit the
    /// 16-bit total length.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        let total = u16::try_from(HEADER_LEN + self.payload_len).expect("IPv4 payload too long");
        packet.set_version_and_header_len(HEADER_LEN);
        packet.set_tos(self.tos);
        packet.set_total_len(total);
        packet.set_ident(self.ident);
        packet.set_dont_frag(self.dont_frag);
        packet.set_ttl(self.ttl);
        packet.set_protocol(self.protocol);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        packet.fill_checksum();
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IPv4 {} > {} proto={} id={:#06x}{} len={}",
            self.src_addr,
            self.dst_addr,
            self.protocol,
            self.ident,
            if self.dont_frag { " DF" } else { "" },
            self.payload_len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The IPv4 header of the docs/WIRE.md §2 test vector (40-byte UDP payload).
    static BYTES: [u8; 20] = [
        0x45, 0x00, 0x00, 0x3c, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0xa5, 0x29, 0xc0, 0xa8, 0x01,
        0x01, 0xc0, 0xa8, 0x01, 0x02,
    ];

    fn repr() -> Repr {
        Repr {
            src_addr: Ipv4Addr::new(192, 168, 1, 1),
            dst_addr: Ipv4Addr::new(192, 168, 1, 2),
            protocol: PROTOCOL_UDP,
            payload_len: 40,
            ttl: 64,
            tos: 0,
            ident: 0x1234,
            dont_frag: true,
        }
    }

    fn packet_bytes() -> Vec<u8> {
        let mut v = BYTES.to_vec();
        v.resize(60, 0);
        v
    }

    #[test]
    fn parse() {
        let bytes = packet_bytes();
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(Repr::parse(&p).unwrap(), repr());
        assert_eq!(p.payload().len(), 40);
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; 60];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(&buf[..20], &BYTES);
    }

    #[test]
    fn truncated() {
        let bytes = packet_bytes();
        assert_eq!(Packet::new_checked(&bytes[..19]), Err(Error));
        // Shorter than the total length.
        assert_eq!(Packet::new_checked(&bytes[..59]), Err(Error));
        // Longer is fine (Ethernet padding).
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0; 6]);
        assert_eq!(
            Packet::new_checked(&longer[..]).unwrap().payload().len(),
            40
        );
    }

    #[test]
    fn bad_field() {
        let mut bytes = packet_bytes();
        bytes[11] ^= 1; // checksum
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(Error)
        );
        let mut bytes = packet_bytes();
        bytes[0] = 0x46; // options
        let mut p = Packet::new_unchecked(&mut bytes[..]);
        p.fill_checksum();
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(Error)
        );
        let mut bytes = packet_bytes();
        bytes[0] = 0x44; // IHL 4 (16 bytes)
        assert_eq!(Packet::new_checked(&bytes[..]), Err(Error));
    }
}
