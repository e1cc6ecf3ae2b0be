//! The 44-byte path description inside a REQ: primary path at CM offset 52, alternate path at
//! 96 (IBA 12.6.5 Table 106; `include/rdma/ibta_vol1_c12.h` `CM_REQ_PRIMARY_*`). Offsets here are
//! relative to the start of the path.
//!
//! ```text
//! 0-1 local port LID | 2-3 remote port LID | 4-19 local GID | 20-35 remote GID
//! 36-39 flow label [31:12], reserved [11:6], packet rate [5:0]
//! 40 traffic class | 41 hop limit | 42 SL [7:4], subnet local [3]
//! 43 local ACK timeout [7:3] (bit [2] of the alternate path's byte is SAP supported)
//! ```
//!
//! A Linux RoCE REQ carries LIDs 0xFFFF, GIDs `::ffff:a.b.c.d` for IPv4, hop limit 64 and no
//! alternate path (local LID 0; `cm.c` `cm_req_has_alt_path`).

use core::fmt;

use crate::wire::{be, Result};

/// Length of a path description.
pub const PATH_LEN: usize = 44;

mod field {
    use crate::wire::{Bits, Field};

    pub const LOCAL_LID: Field = 0..2;
    pub const REMOTE_LID: Field = 2..4;
    pub const LOCAL_GID: Field = 4..20;
    pub const REMOTE_GID: Field = 20..36;
    pub const FLOW_WORD: Field = 36..40;
    pub const PACKET_RATE: Bits = Bits::new(39, 0x3F);
    pub const TRAFFIC_CLASS: usize = 40;
    pub const HOP_LIMIT: usize = 41;
    pub const SL: Bits = Bits::new(42, 0xF0);
    pub const SUBNET_LOCAL: Bits = Bits::new(42, 0x08);
    pub const LOCAL_ACK_TIMEOUT: Bits = Bits::new(43, 0xF8);
}

fixed_len_view! {
    /// A read/write view of a REQ path description.
    pub struct Packet; len = PATH_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn local_lid(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::LOCAL_LID])
    }

    pub fn remote_lid(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::REMOTE_LID])
    }

    pub fn local_gid(&self) -> [u8; 16] {
        be::array(&self.buffer.as_ref()[field::LOCAL_GID])
    }

    pub fn remote_gid(&self) -> [u8; 16] {
        be::array(&self.buffer.as_ref()[field::REMOTE_GID])
    }

    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::FLOW_WORD]) >> 12
    }

    pub fn packet_rate(&self) -> u8 {
        field::PACKET_RATE.get(self.buffer.as_ref())
    }

    pub fn traffic_class(&self) -> u8 {
        self.buffer.as_ref()[field::TRAFFIC_CLASS]
    }

    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    /// Service level (4 bits).
    pub fn sl(&self) -> u8 {
        field::SL.get(self.buffer.as_ref())
    }

    pub fn subnet_local(&self) -> bool {
        field::SUBNET_LOCAL.get_bool(self.buffer.as_ref())
    }

    /// Local ACK timeout (5 bits; 4.096 µs × 2^value).
    pub fn local_ack_timeout(&self) -> u8 {
        field::LOCAL_ACK_TIMEOUT.get(self.buffer.as_ref())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_local_lid(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::LOCAL_LID], value)
    }

    pub fn set_remote_lid(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::REMOTE_LID], value)
    }

    pub fn set_local_gid(&mut self, value: [u8; 16]) {
        self.buffer.as_mut()[field::LOCAL_GID].copy_from_slice(&value)
    }

    pub fn set_remote_gid(&mut self, value: [u8; 16]) {
        self.buffer.as_mut()[field::REMOTE_GID].copy_from_slice(&value)
    }

    /// Sets the flow label (20 bits) and packet rate (6 bits); the reserved bits in between
    /// become zero.
    pub fn set_flow_label_and_rate(&mut self, flow_label: u32, packet_rate: u8) {
        let word = ((flow_label & 0xF_FFFF) << 12) | u32::from(packet_rate & 0x3F);
        be::set_u32(&mut self.buffer.as_mut()[field::FLOW_WORD], word)
    }

    pub fn set_traffic_class(&mut self, value: u8) {
        self.buffer.as_mut()[field::TRAFFIC_CLASS] = value
    }

    pub fn set_hop_limit(&mut self, value: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = value
    }

    /// Sets SL and subnet local; the reserved bits of the byte become zero.
    pub fn set_sl_and_subnet_local(&mut self, sl: u8, subnet_local: bool) {
        let b = self.buffer.as_mut();
        b[field::SL.byte] = 0;
        field::SL.set(b, sl);
        field::SUBNET_LOCAL.set_bool(b, subnet_local);
    }

    /// Sets the local ACK timeout; the other bits of the byte are kept (SAP supported lives
    /// there in the alternate path).
    pub fn set_local_ack_timeout(&mut self, value: u8) {
        field::LOCAL_ACK_TIMEOUT.set(self.buffer.as_mut(), value)
    }
}

/// A decoded path description.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    pub local_lid: u16,
    pub remote_lid: u16,
    pub local_gid: [u8; 16],
    pub remote_gid: [u8; 16],
    pub flow_label: u32,
    pub packet_rate: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub sl: u8,
    pub subnet_local: bool,
    pub local_ack_timeout: u8,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            local_lid: packet.local_lid(),
            remote_lid: packet.remote_lid(),
            local_gid: packet.local_gid(),
            remote_gid: packet.remote_gid(),
            flow_label: packet.flow_label(),
            packet_rate: packet.packet_rate(),
            traffic_class: packet.traffic_class(),
            hop_limit: packet.hop_limit(),
            sl: packet.sl(),
            subnet_local: packet.subnet_local(),
            local_ack_timeout: packet.local_ack_timeout(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        PATH_LEN
    }

    /// Writes the path; the low three bits of byte 43 are left alone.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_lid(self.local_lid);
        packet.set_remote_lid(self.remote_lid);
        packet.set_local_gid(self.local_gid);
        packet.set_remote_gid(self.remote_gid);
        packet.set_flow_label_and_rate(self.flow_label, self.packet_rate);
        packet.set_traffic_class(self.traffic_class);
        packet.set_hop_limit(self.hop_limit);
        packet.set_sl_and_subnet_local(self.sl, self.subnet_local);
        packet.set_local_ack_timeout(self.local_ack_timeout);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "path lid {:#x}>{:#x} gid {}>{} fl={:#x} tc={} hl={} sl={} ack_to={}",
            self.local_lid,
            self.remote_lid,
            std::net::Ipv6Addr::from(self.local_gid),
            std::net::Ipv6Addr::from(self.remote_gid),
            self.flow_label,
            self.traffic_class,
            self.hop_limit,
            self.sl,
            self.local_ack_timeout
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    // The primary path of the iSER REQ in the lab capture (frame 15).
    static BYTES: [u8; 44] = [
        0xff, 0xff, 0xff, 0xff, // LIDs
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xc0, 0xa8, 0x4d, 0x03, // local GID
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xc0, 0xa8, 0x4d, 0x02, // remote GID
        0x07, 0x7e, 0x60, 0x00, // flow label 0x077e6, rate 0
        0x00, 0x40, 0x00, 0x98, // TC 0, hop limit 64, SL 0, ACK timeout 19
    ];

    fn repr() -> Repr {
        Repr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: std::net::Ipv4Addr::new(192, 168, 77, 3)
                .to_ipv6_mapped()
                .octets(),
            remote_gid: std::net::Ipv4Addr::new(192, 168, 77, 2)
                .to_ipv6_mapped()
                .octets(),
            flow_label: 0x077e6,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 19,
        }
    }

    #[test]
    fn parse() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), repr());
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; 44];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        buf[43] &= 0xf8; // bits the path leaves to its container
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn emit_all_fields() {
        let r = Repr {
            local_lid: 0x1234,
            remote_lid: 0x5678,
            local_gid: [1; 16],
            remote_gid: [2; 16],
            flow_label: 0xf_ffff,
            packet_rate: 0x3f,
            traffic_class: 0xb8,
            hop_limit: 1,
            sl: 0xf,
            subnet_local: true,
            local_ack_timeout: 0x1f,
        };
        let mut buf = [0xa5u8; 44];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(
            &buf[36..44],
            &[0xff, 0xff, 0xf0, 0x3f, 0xb8, 0x01, 0xf8, 0xfd]
        );
        assert_eq!(
            Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap(),
            r
        );
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&BYTES[..43]), Err(Error));
    }

    #[test]
    fn bad_field() {
        // Reserved bits are ignored on receive.
        let mut b = BYTES;
        b[38] |= 0x0f;
        b[39] |= 0xc0;
        b[42] |= 0x07;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            repr()
        );
    }
}
