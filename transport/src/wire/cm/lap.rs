//! LAP, load alternate path (IBA 12.8.1 Table 115; `ibta_vol1_c12.h` `CM_LAP_*`). The Linux
//! CM no longer acts on LAP (path migration is unsupported on RoCE); the codec exists so the
//! connection manager can recognise and answer it.
//!
//! ```text
//! 0-3 local comm ID | 4-7 remote comm ID | 12-14 remote QPN/EECN
//! 15 remote CM response timeout [7:3] | 20-21 alternate local LID | 22-23 alternate remote LID
//! 24-39 alternate local GID | 40-55 alternate remote GID | 56-59 flow label [31:12]
//! 59 traffic class | 60 hop limit | 61 packet rate [5:0] | 62 SL [7:4], subnet local [3]
//! 63 local ACK timeout [7:3] | 64-231 private data
//! ```

use core::fmt;

use super::path;
use super::CM_DATA_LEN;
use crate::wire::{be, Result, U24_MASK};

/// Length of the LAP private data.
pub const PRIVATE_DATA_LEN: usize = 168;

mod field {
    use crate::wire::{Bits, Field};

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const REMOTE_QPN: Field = 12..15;
    pub const REMOTE_CM_RESPONSE_TIMEOUT: Bits = Bits::new(15, 0xF8);
    pub const LOCAL_LID: Field = 20..22;
    pub const REMOTE_LID: Field = 22..24;
    pub const LOCAL_GID: Field = 24..40;
    pub const REMOTE_GID: Field = 40..56;
    pub const FLOW_LABEL: Field = 56..59;
    pub const TRAFFIC_CLASS: usize = 59;
    pub const HOP_LIMIT: usize = 60;
    pub const PACKET_RATE: Bits = Bits::new(61, 0x3F);
    pub const SL: Bits = Bits::new(62, 0xF0);
    pub const SUBNET_LOCAL: Bits = Bits::new(62, 0x08);
    pub const LOCAL_ACK_TIMEOUT: Bits = Bits::new(63, 0xF8);
    pub const PRIVATE_DATA: Field = 64..232;
}

fixed_len_view! {
    /// A read/write view of a LAP (the MAD data area).
    pub struct Packet; len = CM_DATA_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn local_comm_id(&self) -> u32 {
        be::u32(&self.b()[field::LOCAL_COMM_ID])
    }

    pub fn remote_comm_id(&self) -> u32 {
        be::u32(&self.b()[field::REMOTE_COMM_ID])
    }

    pub fn remote_qpn(&self) -> u32 {
        be::u24(&self.b()[field::REMOTE_QPN])
    }

    pub fn remote_cm_response_timeout(&self) -> u8 {
        field::REMOTE_CM_RESPONSE_TIMEOUT.get(self.b())
    }

    /// The alternate path, decoded from the LAP layout.
    pub fn alternate_path(&self) -> path::Repr {
        let b = self.b();
        path::Repr {
            local_lid: be::u16(&b[field::LOCAL_LID]),
            remote_lid: be::u16(&b[field::REMOTE_LID]),
            local_gid: be::array(&b[field::LOCAL_GID]),
            remote_gid: be::array(&b[field::REMOTE_GID]),
            flow_label: be::u24(&b[field::FLOW_LABEL]) >> 4,
            packet_rate: field::PACKET_RATE.get(b),
            traffic_class: b[field::TRAFFIC_CLASS],
            hop_limit: b[field::HOP_LIMIT],
            sl: field::SL.get(b),
            subnet_local: field::SUBNET_LOCAL.get_bool(b),
            local_ack_timeout: field::LOCAL_ACK_TIMEOUT.get(b),
        }
    }

    pub fn private_data(&self) -> &[u8] {
        &self.b()[field::PRIVATE_DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn b_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    pub fn set_local_comm_id(&mut self, value: u32) {
        be::set_u32(&mut self.b_mut()[field::LOCAL_COMM_ID], value)
    }

    pub fn set_remote_comm_id(&mut self, value: u32) {
        be::set_u32(&mut self.b_mut()[field::REMOTE_COMM_ID], value)
    }

    pub fn set_remote_qpn(&mut self, value: u32) {
        be::set_u24(&mut self.b_mut()[field::REMOTE_QPN], value)
    }

    pub fn set_remote_cm_response_timeout(&mut self, value: u8) {
        field::REMOTE_CM_RESPONSE_TIMEOUT.set(self.b_mut(), value)
    }

    /// Writes the alternate path fields (bytes 20..64); reserved bits become zero.
    pub fn set_alternate_path(&mut self, p: &path::Repr) {
        let b = self.b_mut();
        b[20..64].fill(0);
        be::set_u16(&mut b[field::LOCAL_LID], p.local_lid);
        be::set_u16(&mut b[field::REMOTE_LID], p.remote_lid);
        b[field::LOCAL_GID].copy_from_slice(&p.local_gid);
        b[field::REMOTE_GID].copy_from_slice(&p.remote_gid);
        be::set_u24(&mut b[field::FLOW_LABEL], (p.flow_label & 0xF_FFFF) << 4);
        b[field::TRAFFIC_CLASS] = p.traffic_class;
        b[field::HOP_LIMIT] = p.hop_limit;
        field::PACKET_RATE.set(b, p.packet_rate);
        field::SL.set(b, p.sl);
        field::SUBNET_LOCAL.set_bool(b, p.subnet_local);
        field::LOCAL_ACK_TIMEOUT.set(b, p.local_ack_timeout);
    }

    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.b_mut()[field::PRIVATE_DATA]
    }
}

/// A decoded LAP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub remote_qpn: u32,
    pub remote_cm_response_timeout: u8,
    pub alternate_path: path::Repr,
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            remote_qpn: packet.remote_qpn(),
            remote_cm_response_timeout: packet.remote_cm_response_timeout(),
            alternate_path: packet.alternate_path(),
            private_data: be::array(packet.private_data()),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the whole CM payload, reserved fields zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.b_mut()[..CM_DATA_LEN].fill(0);
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet.set_remote_qpn(self.remote_qpn & U24_MASK);
        packet.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        packet.set_alternate_path(&self.alternate_path);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "LAP comm={:#010x} remote={:#010x} qpn={:#x} {}",
            self.local_comm_id, self.remote_comm_id, self.remote_qpn, self.alternate_path
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    fn repr() -> Repr {
        Repr {
            local_comm_id: 1,
            remote_comm_id: 2,
            remote_qpn: 0x12_3456,
            remote_cm_response_timeout: 20,
            alternate_path: path::Repr {
                local_lid: 0x11,
                remote_lid: 0x22,
                local_gid: [3; 16],
                remote_gid: [4; 16],
                flow_label: 0xa_bcde,
                packet_rate: 0x2a,
                traffic_class: 0x55,
                hop_limit: 0x66,
                sl: 7,
                subnet_local: true,
                local_ack_timeout: 0x13,
            },
            private_data: [9; PRIVATE_DATA_LEN],
        }
    }

    fn bytes() -> [u8; CM_DATA_LEN] {
        let mut b = [0u8; CM_DATA_LEN];
        b[..4].copy_from_slice(&[0, 0, 0, 1]);
        b[4..8].copy_from_slice(&[0, 0, 0, 2]);
        b[12..16].copy_from_slice(&[0x12, 0x34, 0x56, 0xa0]);
        b[20..24].copy_from_slice(&[0, 0x11, 0, 0x22]);
        b[24..40].fill(3);
        b[40..56].fill(4);
        b[56..64].copy_from_slice(&[0xab, 0xcd, 0xe0, 0x55, 0x66, 0x2a, 0x78, 0x98]);
        b[64..].fill(9);
        b
    }

    #[test]
    fn parse() {
        let b = bytes();
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            repr()
        );
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; CM_DATA_LEN];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes());
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&bytes()[..64]), Err(Error));
    }

    #[test]
    fn bad_field() {
        // Reserved bits (low nibble of byte 58, top bits of 61) are ignored.
        let mut b = bytes();
        b[58] |= 0x0f;
        b[61] |= 0xc0;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            repr()
        );
    }
}
