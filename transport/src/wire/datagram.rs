//! An IP datagram that carries a RoCEv2 packet: locating the IP header, UDP header and
//! transport packet in received bytes, and writing IP and UDP headers for a packet to send.
//!
//! Buffers start at the IP header (what an `AF_PACKET`/`SOCK_DGRAM` or raw IP socket delivers;
//! strip the Ethernet header with [`super::ethernet::Frame`] first when there is one).

use core::fmt;
use std::net::IpAddr;

use super::{ipv4, ipv6, roce, udp, Error, Result};

/// The IP header of a RoCEv2 datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRepr {
    V4(ipv4::Repr),
    V6(ipv6::Repr),
}

impl IpRepr {
    pub fn src_addr(&self) -> IpAddr {
        match self {
            IpRepr::V4(r) => r.src_addr.into(),
            IpRepr::V6(r) => r.src_addr.into(),
        }
    }

    pub fn dst_addr(&self) -> IpAddr {
        match self {
            IpRepr::V4(r) => r.dst_addr.into(),
            IpRepr::V6(r) => r.dst_addr.into(),
        }
    }

    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => ipv4::HEADER_LEN,
            IpRepr::V6(_) => ipv6::HEADER_LEN,
        }
    }

    /// Bytes after the IP header.
    pub const fn payload_len(&self) -> usize {
        match self {
            IpRepr::V4(r) => r.payload_len,
            IpRepr::V6(r) => r.payload_len,
        }
    }

    fn set_payload_len(&mut self, len: usize) {
        match self {
            IpRepr::V4(r) => r.payload_len = len,
            IpRepr::V6(r) => r.payload_len = len,
        }
    }
}

impl fmt::Display for IpRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpRepr::V4(r) => r.fmt(f),
            IpRepr::V6(r) => r.fmt(f),
        }
    }
}

/// The parts of a RoCEv2 datagram, borrowed from a buffer that starts at the IP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// The IP header: 20 bytes (IPv4) or 40 bytes (IPv6).
    pub ip_header: &'a [u8],
    /// The 8-byte UDP header.
    pub udp_header: &'a [u8],
    /// The UDP payload: BTH through ICRC; without the payload when that is in `placed`.
    pub roce: &'a [u8],
    /// The payload, when the link put it elsewhere (straight into the memory it was for):
    /// it then lies between the headers at the start of `roce` and the ICRC at its end, and
    /// the packet has no pad. Empty otherwise.
    pub placed: &'a [u8],
}

impl<'a> Datagram<'a> {
    /// Locates the headers. Requires IPv4 with a 20-byte header (rxe never sends options and
    /// its ICRC assumes none) or IPv6 with UDP as next header, protocol UDP, consistent IP and
    /// UDP lengths, and room for at least a BTH and an ICRC. Bytes after the IP packet
    /// (Ethernet padding) are ignored. Neither the UDP port nor the IPv4 header checksum is
    /// checked here ([`Datagram::ip_repr`] checks the checksum).
    pub fn split(packet: &'a [u8]) -> Result<Datagram<'a>> {
        let (ip_header, ip_payload) = match packet.first().map(|b| b >> 4) {
            Some(4) => {
                let p = ipv4::Packet::new_checked(packet)?;
                if p.header_len() != ipv4::HEADER_LEN
                    || p.protocol() != ipv4::PROTOCOL_UDP
                    || p.more_frags()
                    || p.frag_offset() != 0
                {
                    return Err(Error);
                }
                let end = usize::from(p.total_len());
                (&packet[..ipv4::HEADER_LEN], &packet[ipv4::HEADER_LEN..end])
            }
            Some(6) => {
                let p = ipv6::Packet::new_checked(packet)?;
                if p.next_header() != ipv4::PROTOCOL_UDP {
                    return Err(Error);
                }
                let end = ipv6::HEADER_LEN + usize::from(p.payload_len());
                (&packet[..ipv6::HEADER_LEN], &packet[ipv6::HEADER_LEN..end])
            }
            _ => return Err(Error),
        };
        let u = udp::Packet::new_checked(ip_payload)?;
        let udp_len = usize::from(u.len());
        if udp_len != ip_payload.len() || udp_len < udp::HEADER_LEN + roce::MIN_LEN {
            return Err(Error);
        }
        Ok(Datagram {
            ip_header,
            udp_header: &ip_payload[..udp::HEADER_LEN],
            roce: &ip_payload[udp::HEADER_LEN..udp_len],
            placed: &[],
        })
    }

    /// Locates the IP and UDP headers of a datagram held without its payload (one a link
    /// sends from memory in pieces): the header checks of [`Datagram::split`], none of the
    /// lengths; `roce` is empty.
    pub fn headers(packet: &'a [u8]) -> Result<Datagram<'a>> {
        let ip_len = match packet.first().map(|b| b >> 4) {
            Some(4) => {
                let p = ipv4::Packet::new_unchecked(packet);
                if packet.len() < ipv4::HEADER_LEN + udp::HEADER_LEN
                    || p.header_len() != ipv4::HEADER_LEN
                    || p.protocol() != ipv4::PROTOCOL_UDP
                {
                    return Err(Error);
                }
                ipv4::HEADER_LEN
            }
            Some(6) => {
                if packet.len() < ipv6::HEADER_LEN + udp::HEADER_LEN
                    || ipv6::Packet::new_unchecked(packet).next_header() != ipv4::PROTOCOL_UDP
                {
                    return Err(Error);
                }
                ipv6::HEADER_LEN
            }
            _ => return Err(Error),
        };
        Ok(Datagram {
            ip_header: &packet[..ip_len],
            udp_header: &packet[ip_len..ip_len + udp::HEADER_LEN],
            roce: &[],
            placed: &[],
        })
    }

    /// A datagram received in two pieces: `head`, its IP and UDP headers, and `rest`, the UDP
    /// payload (a link that rebuilds the headers of a datagram it received into a buffer of
    /// its own, without moving the payload). The checks of [`Datagram::split`], the lengths
    /// exact. With `rest` empty, `head` is the whole datagram.
    pub fn split_parts(head: &'a [u8], rest: &'a [u8]) -> Result<Datagram<'a>> {
        Datagram::split_placed(head, rest, &[])
    }

    /// [`Datagram::split_parts`] for a datagram whose payload the link placed elsewhere:
    /// `rest` holds the transport headers (BTH and extension headers) and the ICRC, `placed`
    /// the payload between them (a packet with a pad is never received this way). With
    /// `placed` empty, this is `split_parts`.
    pub fn split_placed(head: &'a [u8], rest: &'a [u8], placed: &'a [u8]) -> Result<Datagram<'a>> {
        if rest.is_empty() && placed.is_empty() {
            return Datagram::split(head);
        }
        let d = Datagram::headers(head)?;
        let hl = d.ip_header.len() + udp::HEADER_LEN;
        let roce_len = rest.len() + placed.len();
        let ip_payload = udp::HEADER_LEN + roce_len;
        let ip_ok = if d.ip_header.len() == ipv4::HEADER_LEN {
            let p = ipv4::Packet::new_unchecked(d.ip_header);
            usize::from(p.total_len()) == hl + roce_len && !p.more_frags() && p.frag_offset() == 0
        } else {
            usize::from(ipv6::Packet::new_unchecked(d.ip_header).payload_len()) == ip_payload
        };
        let udp_len = usize::from(udp::Packet::new_unchecked(d.udp_header).len());
        if head.len() != hl || !ip_ok || udp_len != ip_payload || rest.len() < roce::MIN_LEN {
            return Err(Error);
        }
        if !placed.is_empty() {
            // The headers and ICRC only: the payload is `placed`, and there is no pad.
            let pkt = roce::Packet::new_checked(rest)?;
            if pkt.pad_len() != 0 || pkt.header_len() + roce::ICRC_LEN != rest.len() {
                return Err(Error);
            }
        }
        Ok(Datagram {
            roce: rest,
            placed,
            ..d
        })
    }

    /// Decodes the IP header (checking the IPv4 header checksum).
    pub fn ip_repr(&self) -> Result<IpRepr> {
        if self.ip_header.len() == ipv4::HEADER_LEN {
            // `ip_header` holds the header only, so read it without the view's length checks
            // (`split` made them on the whole packet).
            let p = ipv4::Packet::new_unchecked(self.ip_header);
            if p.version() != 4 || !p.verify_checksum() {
                return Err(Error);
            }
            Ok(IpRepr::V4(ipv4::Repr {
                src_addr: p.src_addr(),
                dst_addr: p.dst_addr(),
                protocol: p.protocol(),
                payload_len: usize::from(p.total_len()).saturating_sub(ipv4::HEADER_LEN),
                ttl: p.ttl(),
                tos: p.tos(),
                ident: p.ident(),
                dont_frag: p.dont_frag(),
            }))
        } else {
            let p = ipv6::Packet::new_unchecked(self.ip_header);
            Ok(IpRepr::V6(ipv6::Repr {
                src_addr: p.src_addr(),
                dst_addr: p.dst_addr(),
                next_header: p.next_header(),
                payload_len: usize::from(p.payload_len()),
                hop_limit: p.hop_limit(),
                traffic_class: p.traffic_class(),
                flow_label: p.flow_label(),
            }))
        }
    }

    /// Decodes the UDP header.
    pub fn udp_repr(&self) -> udp::Repr {
        let p = udp::Packet::new_unchecked(self.udp_header);
        udp::Repr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            payload_len: self.roce.len() + self.placed.len(),
        }
    }

    /// The transport packet, validated.
    pub fn roce_packet(&self) -> Result<roce::Packet<&'a [u8]>> {
        roce::Packet::new_checked(self.roce)
    }

    /// The ICRC carried by the packet (the one it should carry is
    /// [`Datagram::computed_icrc`], from the ICRC module).
    pub fn wire_icrc(&self) -> u32 {
        let at = self.roce.len() - roce::ICRC_LEN;
        let b = &self.roce[at..];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

/// Writes the IP and UDP headers for a RoCEv2 packet of `roce_len` bytes (BTH through ICRC) at
/// the start of `buf` and returns their length; the packet goes right after them. The IP
/// payload length and UDP length are derived from `roce_len` (whatever `ip` says), the UDP
/// checksum is 0 as rxe sends it. Fails if `buf` cannot hold the whole datagram or the length
/// does not fit the headers.
pub fn emit_headers(
    ip: &IpRepr,
    src_port: u16,
    dst_port: u16,
    roce_len: usize,
    buf: &mut [u8],
) -> Result<usize> {
    let total = ip.header_len() + udp::HEADER_LEN + roce_len;
    if buf.len() < total {
        return Err(Error);
    }
    emit_header_bytes(ip, src_port, dst_port, roce_len, buf)
}

/// [`emit_headers`] for a datagram whose RoCEv2 packet lies elsewhere: `buf` needs room for
/// the IP and UDP headers only.
pub fn emit_header_bytes(
    ip: &IpRepr,
    src_port: u16,
    dst_port: u16,
    roce_len: usize,
    buf: &mut [u8],
) -> Result<usize> {
    let ip_payload = udp::HEADER_LEN + roce_len;
    let header_len = ip.header_len() + udp::HEADER_LEN;
    let limit = match ip {
        IpRepr::V4(_) => usize::from(u16::MAX) - ipv4::HEADER_LEN,
        IpRepr::V6(_) => usize::from(u16::MAX),
    };
    if ip_payload > limit || buf.len() < header_len {
        return Err(Error);
    }
    let udp_repr = udp::Repr {
        src_port,
        dst_port,
        payload_len: roce_len,
    };
    let mut ip = *ip;
    ip.set_payload_len(ip_payload);
    match ip {
        IpRepr::V4(r) => r.emit(&mut ipv4::Packet::new_unchecked(&mut buf[..header_len])),
        IpRepr::V6(r) => r.emit(&mut ipv6::Packet::new_unchecked(&mut buf[..header_len])),
    }
    udp_repr.emit(&mut udp::Packet::new_unchecked(
        &mut buf[ip.header_len()..header_len],
    ));
    Ok(header_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn v4() -> IpRepr {
        IpRepr::V4(ipv4::Repr {
            src_addr: Ipv4Addr::new(192, 168, 1, 1),
            dst_addr: Ipv4Addr::new(192, 168, 1, 2),
            protocol: ipv4::PROTOCOL_UDP,
            payload_len: 0,
            ttl: 64,
            tos: 0,
            ident: 0x1234,
            dont_frag: true,
        })
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; 60];
        let n = emit_headers(&v4(), 0xc123, roce::UDP_PORT, 32, &mut buf).unwrap();
        assert_eq!(n, 28);
        assert_eq!(
            &buf[..28],
            &[
                0x45, 0x00, 0x00, 0x3c, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0xa5, 0x29, 0xc0, 0xa8,
                0x01, 0x01, 0xc0, 0xa8, 0x01, 0x02, 0xc1, 0x23, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00
            ]
        );
        assert_eq!(emit_headers(&v4(), 1, 2, 33, &mut buf), Err(Error));
    }

    #[test]
    fn parse() {
        let mut buf = [0u8; 60];
        emit_headers(&v4(), 0xc123, roce::UDP_PORT, 32, &mut buf).unwrap();
        let d = Datagram::split(&buf).unwrap();
        assert_eq!(d.roce.len(), 32);
        let mut expected = v4();
        expected.set_payload_len(40);
        assert_eq!(d.ip_repr().unwrap(), expected);
        assert_eq!(d.udp_repr().src_port, 0xc123);
        // Ethernet padding after the IP packet is ignored.
        let mut padded = buf.to_vec();
        padded.extend_from_slice(&[0; 4]);
        assert_eq!(Datagram::split(&padded).unwrap(), d);
    }

    #[test]
    fn split_in_parts() {
        let mut buf = [0u8; 60];
        emit_headers(&v4(), 0xc123, roce::UDP_PORT, 32, &mut buf).unwrap();
        let (head, rest) = buf.split_at(28);
        assert_eq!(
            Datagram::split_parts(head, rest).unwrap(),
            Datagram::split(&buf).unwrap()
        );
        assert_eq!(
            Datagram::split_parts(&buf, &[]).unwrap(),
            Datagram::split(&buf).unwrap()
        );
        // Lengths that disagree with the payload's, a head longer than the headers.
        assert_eq!(Datagram::split_parts(head, &rest[1..]), Err(Error));
        assert_eq!(Datagram::split_parts(&buf[..29], &rest[1..]), Err(Error));
        // Headers written without the packet behind them.
        let mut h = [0u8; 28];
        assert_eq!(
            emit_header_bytes(&v4(), 0xc123, roce::UDP_PORT, 32, &mut h),
            Ok(28)
        );
        assert_eq!(&h, head);
        assert_eq!(emit_header_bytes(&v4(), 1, 2, 32, &mut h[..27]), Err(Error));
    }

    #[test]
    fn truncated() {
        let mut buf = [0u8; 60];
        emit_headers(&v4(), 0xc123, roce::UDP_PORT, 32, &mut buf).unwrap();
        assert_eq!(Datagram::split(&buf[..59]), Err(Error));
        let mut small = [0u8; 43];
        emit_headers(&v4(), 1, roce::UDP_PORT, 15, &mut small).unwrap();
        assert_eq!(Datagram::split(&small), Err(Error));
    }

    #[test]
    fn bad_field() {
        let mut buf = [0u8; 60];
        emit_headers(&v4(), 0xc123, roce::UDP_PORT, 32, &mut buf).unwrap();
        let mut b = buf;
        b[25] = 0x27; // UDP length shorter than the IP payload
        assert_eq!(Datagram::split(&b), Err(Error));
        let mut b = buf;
        b[0] = 0x46; // IPv4 options
        assert_eq!(Datagram::split(&b), Err(Error));
        let mut b = buf;
        b[6] = 0x20; // more fragments
        assert_eq!(Datagram::split(&b), Err(Error));
        let mut b = buf;
        b[11] ^= 1; // IP checksum: split accepts, ip_repr refuses
        assert_eq!(Datagram::split(&b).unwrap().ip_repr(), Err(Error));
    }
}
