//! rdma_cm on top of the IB CM (`drivers/infiniband/core/cma.c`, IBA Annex A11; docs/WIRE.md
//! §5): the 36-byte header at the start of REQ private data (`struct cma_hdr`), service IDs for
//! the IP port spaces, and the IP ↔ GID mapping RoCE uses in path records.
//!
//! ```text
//! 0 cma_version (0) | 1 IP version in the high nibble (4 or 6) | 2-3 source port
//! 4-19 source address | 20-35 destination address
//! ```
//!
//! IPv4 addresses sit in the last four bytes of their 16 (`union cma_ip_addr`: three zero words
//! and the address), not in the `::ffff:` mapped form. The consumer's data follows at 36, so a
//! REQ leaves it 92 − 36 = 56 bytes. The REP carries no cma_hdr.

use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{be, Bits, Error, Field, Result};

/// Length of the header.
pub const HEADER_LEN: usize = 36;
/// The only cma_hdr version.
pub const CMA_VERSION: u8 = 0x00;

mod field {
    use super::{Bits, Field};

    pub const VERSION: usize = 0;
    pub const IP_VERSION: Bits = Bits::new(1, 0xF0);
    pub const PORT: Field = 2..4;
    pub const SRC_ADDR: Field = 4..20;
    pub const DST_ADDR: Field = 20..36;
}

enum_with_unknown! {
    /// rdma_cm port spaces (`enum rdma_ucm_port_space`).
    pub enum PortSpace(u16) {
        Ipoib = 0x0002,
        /// Connected services: iSER, SRP over RDMA/CM, NVMe-oF.
        Tcp = 0x0106,
        Udp = 0x0111,
        Ib = 0x013F,
    }
}

/// The IB service ID of an rdma_cm port: (port space << 16) + port (`rdma_get_service_id`), e.g.
/// 0x0000000001060CBC for TCP port 3260.
pub fn service_id(space: PortSpace, port: u16) -> u64 {
    (u64::from(u16::from(space)) << 16) | u64::from(port)
}

/// Splits a service ID of an rdma_cm IP port space (`cma.c` `cma_get_service_id` inverse:
/// prefix 0x00000000_01xx xxxx); `None` for other service IDs.
pub fn parse_service_id(service_id: u64) -> Option<(PortSpace, u16)> {
    if service_id >> 32 != 0 {
        return None;
    }
    let space = PortSpace::from((service_id >> 16) as u16);
    match space {
        PortSpace::Unknown(_) => None,
        _ => Some((space, service_id as u16)),
    }
}

/// The RoCEv2 GID of an IP address (`rdma_ip2gid`): IPv4 as `::ffff:a.b.c.d`.
pub fn gid_from_ip(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The IP address of a RoCEv2 GID: `::ffff:a.b.c.d` is IPv4 (`rdma_gid2ip`).
pub fn ip_from_gid(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

fixed_len_view! {
    /// A read/write view of a cma_hdr (the start of REQ private data).
    pub struct Packet; len = HEADER_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// The IP version nibble: 4 or 6 in a valid header.
    pub fn ip_version(&self) -> u8 {
        field::IP_VERSION.get(self.buffer.as_ref())
    }

    /// The active side's source port.
    pub fn port(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::PORT])
    }

    fn addr(&self, range: Field) -> Option<IpAddr> {
        let bytes: [u8; 16] = be::array(&self.buffer.as_ref()[range]);
        match self.ip_version() {
            4 => Some(IpAddr::V4(Ipv4Addr::new(
                bytes[12], bytes[13], bytes[14], bytes[15],
            ))),
            6 => Some(IpAddr::V6(Ipv6Addr::from(bytes))),
            _ => None,
        }
    }

    /// The source address, `None` for an unknown IP version.
    pub fn src_addr(&self) -> Option<IpAddr> {
        self.addr(field::SRC_ADDR)
    }

    /// The destination address, `None` for an unknown IP version.
    pub fn dst_addr(&self) -> Option<IpAddr> {
        self.addr(field::DST_ADDR)
    }

    /// The consumer's private data after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

fn addr_bytes(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => {
            let mut b = [0u8; 16];
            b[12..].copy_from_slice(&a.octets());
            b
        }
        IpAddr::V6(a) => a.octets(),
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::VERSION] = value
    }

    /// Sets the IP version nibble; the low nibble (reserved) becomes zero.
    pub fn set_ip_version(&mut self, value: u8) {
        let b = self.buffer.as_mut();
        b[field::IP_VERSION.byte] = 0;
        field::IP_VERSION.set(b, value)
    }

    pub fn set_port(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::PORT], value)
    }

    pub fn set_src_addr(&mut self, value: IpAddr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&addr_bytes(value))
    }

    pub fn set_dst_addr(&mut self, value: IpAddr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&addr_bytes(value))
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// A decoded cma_hdr. Both addresses have the same family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub src_port: u16,
    pub src_addr: IpAddr,
    pub dst_addr: IpAddr,
}

impl Repr {
    /// Decodes the header; fails on a version other than 0 or an IP version other than 4 and
    /// 6 (`cma.c` `cma_check_req_qp_type` / `cma_save_net_info` refuse those too).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        if packet.version() != CMA_VERSION {
            return Err(Error);
        }
        Ok(Repr {
            src_port: packet.port(),
            src_addr: packet.src_addr().ok_or(Error)?,
            dst_addr: packet.dst_addr().ok_or(Error)?,
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header; the IP version follows `src_addr`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_version(CMA_VERSION);
        packet.set_ip_version(if self.src_addr.is_ipv4() { 4 } else { 6 });
        packet.set_port(self.src_port);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cma_hdr {}:{} > {}",
            self.src_addr, self.src_port, self.dst_addr
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The cma_hdr of the iSER REQ in the lab capture.
    static BYTES: [u8; 36] = [
        0x00, 0x40, 0x87, 0x96, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xc0, 0xa8, 0x4d, 0x03, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xc0, 0xa8, 0x4d, 0x02,
    ];

    fn repr() -> Repr {
        Repr {
            src_port: 0x8796,
            src_addr: "192.168.77.3".parse().unwrap(),
            dst_addr: "192.168.77.2".parse().unwrap(),
        }
    }

    #[test]
    fn parse() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), repr());
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; 36];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn emit_ipv6() {
        let r = Repr {
            src_port: 1,
            src_addr: "fe80::1".parse().unwrap(),
            dst_addr: "fe80::2".parse().unwrap(),
        };
        let mut buf = [0xa5u8; 40];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf[1], 0x60);
        assert_eq!(&buf[4..6], &[0xfe, 0x80]);
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), r);
        assert_eq!(p.payload(), &[0xa5; 4]);
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&BYTES[..35]), Err(Error));
    }

    #[test]
    fn bad_field() {
        let mut b = BYTES;
        b[1] = 0x50;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()),
            Err(Error)
        );
        let mut b = BYTES;
        b[0] = 1;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()),
            Err(Error)
        );
    }

    #[test]
    fn service_ids() {
        assert_eq!(service_id(PortSpace::Tcp, 3260), 0x0000_0000_0106_0cbc);
        assert_eq!(service_id(PortSpace::Tcp, 5555), 0x0000_0000_0106_15b3);
        assert_eq!(
            parse_service_id(0x0000_0000_0106_15b3),
            Some((PortSpace::Tcp, 5555))
        );
        assert_eq!(parse_service_id(0x1000_0000_0106_15b3), None);
        assert_eq!(parse_service_id(0x0000_0000_0999_0001), None);
    }

    #[test]
    fn gids() {
        let ip: IpAddr = "192.168.77.2".parse().unwrap();
        let gid = gid_from_ip(ip);
        assert_eq!(&gid[10..], &[0xff, 0xff, 0xc0, 0xa8, 0x4d, 0x02]);
        assert_eq!(ip_from_gid(gid), ip);
        let v6: IpAddr = "fe80::2".parse().unwrap();
        assert_eq!(ip_from_gid(gid_from_ip(v6)), v6);
    }
}
