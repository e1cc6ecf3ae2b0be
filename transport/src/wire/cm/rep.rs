//! REP, reply to request for communication (IBA 12.6.8 Table 110; `ibta_vol1_c12.h`
//! `CM_REP_*`; docs/WIRE.md §4).
//!
//! ```text
//! 0-3 local comm ID | 4-7 remote comm ID | 8-11 local Q_Key
//! 12-14 local QPN | 15 ECE vendor ID [23:16] | 16-18 local EECN | 19 vendor ID [15:8]
//! 20-22 starting PSN | 23 vendor ID [7:0] | 24 responder resources | 25 initiator depth
//! 26 target ACK delay [7:3], failover accepted [2:1], E2E flow control [0]
//! 27 RNR retry count [7:5], SRQ [4] | 28-35 local CA GUID | 36-231 private data
//! ```
//!
//! The starting PSN is the first PSN the passive side expects to receive; the active side
//! starts its send queue there (`cm.c` `cm_rep_handler`).

use core::fmt;

use super::CM_DATA_LEN;
use crate::wire::{be, Result, U24_MASK};

/// Length of the REP private data.
pub const PRIVATE_DATA_LEN: usize = 196;

mod field {
    use crate::wire::{Bits, Field};

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const LOCAL_QKEY: Field = 8..12;
    pub const LOCAL_QPN: Field = 12..15;
    pub const VENDOR_ID_H: usize = 15;
    pub const LOCAL_EECN: Field = 16..19;
    pub const VENDOR_ID_M: usize = 19;
    pub const STARTING_PSN: Field = 20..23;
    pub const VENDOR_ID_L: usize = 23;
    pub const RESPONDER_RESOURCES: usize = 24;
    pub const INITIATOR_DEPTH: usize = 25;
    pub const TARGET_ACK_DELAY: Bits = Bits::new(26, 0xF8);
    pub const FAILOVER_ACCEPTED: Bits = Bits::new(26, 0x06);
    pub const E2E_FLOW_CONTROL: Bits = Bits::new(26, 0x01);
    pub const RNR_RETRY_COUNT: Bits = Bits::new(27, 0xE0);
    pub const SRQ: Bits = Bits::new(27, 0x10);
    pub const LOCAL_CA_GUID: Field = 28..36;
    pub const PRIVATE_DATA: Field = 36..232;
}

const _: () = assert!(field::PRIVATE_DATA.end - field::PRIVATE_DATA.start == PRIVATE_DATA_LEN);

fixed_len_view! {
    /// A read/write view of a REP (the MAD data area).
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

    pub fn local_qkey(&self) -> u32 {
        be::u32(&self.b()[field::LOCAL_QKEY])
    }

    pub fn local_qpn(&self) -> u32 {
        be::u24(&self.b()[field::LOCAL_QPN])
    }

    /// ECE vendor ID (24 bits, spread over bytes 15, 19 and 23).
    pub fn vendor_id(&self) -> u32 {
        let b = self.b();
        u32::from_be_bytes([
            0,
            b[field::VENDOR_ID_H],
            b[field::VENDOR_ID_M],
            b[field::VENDOR_ID_L],
        ])
    }

    pub fn local_eecn(&self) -> u32 {
        be::u24(&self.b()[field::LOCAL_EECN])
    }

    pub fn starting_psn(&self) -> u32 {
        be::u24(&self.b()[field::STARTING_PSN])
    }

    pub fn responder_resources(&self) -> u8 {
        self.b()[field::RESPONDER_RESOURCES]
    }

    pub fn initiator_depth(&self) -> u8 {
        self.b()[field::INITIATOR_DEPTH]
    }

    pub fn target_ack_delay(&self) -> u8 {
        field::TARGET_ACK_DELAY.get(self.b())
    }

    /// Failover accepted (0 accepted, 1 rejected, 2 unsupported).
    pub fn failover_accepted(&self) -> u8 {
        field::FAILOVER_ACCEPTED.get(self.b())
    }

    pub fn e2e_flow_control(&self) -> bool {
        field::E2E_FLOW_CONTROL.get_bool(self.b())
    }

    pub fn rnr_retry_count(&self) -> u8 {
        field::RNR_RETRY_COUNT.get(self.b())
    }

    pub fn srq(&self) -> bool {
        field::SRQ.get_bool(self.b())
    }

    pub fn local_ca_guid(&self) -> u64 {
        be::u64(&self.b()[field::LOCAL_CA_GUID])
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

    pub fn set_local_qkey(&mut self, value: u32) {
        be::set_u32(&mut self.b_mut()[field::LOCAL_QKEY], value)
    }

    pub fn set_local_qpn(&mut self, value: u32) {
        be::set_u24(&mut self.b_mut()[field::LOCAL_QPN], value)
    }

    pub fn set_vendor_id(&mut self, value: u32) {
        let [_, h, m, l] = value.to_be_bytes();
        let b = self.b_mut();
        b[field::VENDOR_ID_H] = h;
        b[field::VENDOR_ID_M] = m;
        b[field::VENDOR_ID_L] = l;
    }

    pub fn set_local_eecn(&mut self, value: u32) {
        be::set_u24(&mut self.b_mut()[field::LOCAL_EECN], value)
    }

    pub fn set_starting_psn(&mut self, value: u32) {
        be::set_u24(&mut self.b_mut()[field::STARTING_PSN], value)
    }

    pub fn set_responder_resources(&mut self, value: u8) {
        self.b_mut()[field::RESPONDER_RESOURCES] = value
    }

    pub fn set_initiator_depth(&mut self, value: u8) {
        self.b_mut()[field::INITIATOR_DEPTH] = value
    }

    pub fn set_target_ack_delay(&mut self, value: u8) {
        field::TARGET_ACK_DELAY.set(self.b_mut(), value)
    }

    pub fn set_failover_accepted(&mut self, value: u8) {
        field::FAILOVER_ACCEPTED.set(self.b_mut(), value)
    }

    pub fn set_e2e_flow_control(&mut self, value: bool) {
        field::E2E_FLOW_CONTROL.set_bool(self.b_mut(), value)
    }

    pub fn set_rnr_retry_count(&mut self, value: u8) {
        field::RNR_RETRY_COUNT.set(self.b_mut(), value)
    }

    pub fn set_srq(&mut self, value: bool) {
        field::SRQ.set_bool(self.b_mut(), value)
    }

    pub fn set_local_ca_guid(&mut self, value: u64) {
        be::set_u64(&mut self.b_mut()[field::LOCAL_CA_GUID], value)
    }

    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.b_mut()[field::PRIVATE_DATA]
    }
}

/// A decoded REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub vendor_id: u32,
    pub local_eecn: u32,
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub target_ack_delay: u8,
    pub failover_accepted: u8,
    pub e2e_flow_control: bool,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            local_qkey: packet.local_qkey(),
            local_qpn: packet.local_qpn(),
            vendor_id: packet.vendor_id(),
            local_eecn: packet.local_eecn(),
            starting_psn: packet.starting_psn(),
            responder_resources: packet.responder_resources(),
            initiator_depth: packet.initiator_depth(),
            target_ack_delay: packet.target_ack_delay(),
            failover_accepted: packet.failover_accepted(),
            e2e_flow_control: packet.e2e_flow_control(),
            rnr_retry_count: packet.rnr_retry_count(),
            srq: packet.srq(),
            local_ca_guid: packet.local_ca_guid(),
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
        packet.set_local_qkey(self.local_qkey);
        packet.set_local_qpn(self.local_qpn & U24_MASK);
        packet.set_vendor_id(self.vendor_id);
        packet.set_local_eecn(self.local_eecn & U24_MASK);
        packet.set_starting_psn(self.starting_psn & U24_MASK);
        packet.set_responder_resources(self.responder_resources);
        packet.set_initiator_depth(self.initiator_depth);
        packet.set_target_ack_delay(self.target_ack_delay);
        packet.set_failover_accepted(self.failover_accepted);
        packet.set_e2e_flow_control(self.e2e_flow_control);
        packet.set_rnr_retry_count(self.rnr_retry_count);
        packet.set_srq(self.srq);
        packet.set_local_ca_guid(self.local_ca_guid);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "REP comm={:#010x} remote={:#010x} qpn={:#x} psn={:#x} rr={} id={} rnr={}",
            self.local_comm_id,
            self.remote_comm_id,
            self.local_qpn,
            self.starting_psn,
            self.responder_resources,
            self.initiator_depth,
            self.rnr_retry_count
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    /// The CM payload of the iSER REP in the lab capture (frame 16), less private data.
    fn bytes() -> [u8; CM_DATA_LEN] {
        let mut b = [0u8; CM_DATA_LEN];
        b[..36].copy_from_slice(&[
            0x88, 0xd8, 0x05, 0x19, 0xf2, 0x03, 0x25, 0xf4, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x19, 0x00, 0x00, 0x00, 0x00, 0x00, 0x70, 0x45, 0xa0, 0x00, 0x00, 0x80, 0x78, 0xe0,
            0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x02,
        ]);
        b[36] = 0x80;
        b
    }

    #[test]
    fn parse() {
        let b = bytes();
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.local_comm_id, 0x88d8_0519);
        assert_eq!(r.remote_comm_id, 0xf203_25f4);
        assert_eq!(r.local_qpn, 0x19);
        assert_eq!(r.starting_psn, 0x70_45a0);
        assert_eq!((r.responder_resources, r.initiator_depth), (0, 128));
        assert_eq!(r.target_ack_delay, 15);
        assert_eq!((r.failover_accepted, r.e2e_flow_control), (0, false));
        assert_eq!((r.rnr_retry_count, r.srq), (7, false));
        assert_eq!(r.local_ca_guid, 0x5054_00ff_fe12_3402);
        assert_eq!(r.vendor_id, 0);
        assert_eq!(r.private_data[0], 0x80);
    }

    #[test]
    fn emit() {
        let b = bytes();
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        let mut buf = [0xa5u8; CM_DATA_LEN];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, b);
        let mut r2 = r;
        r2.vendor_id = 0xab_cdef;
        r2.failover_accepted = 2;
        r2.e2e_flow_control = true;
        r2.srq = true;
        r2.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!((buf[15], buf[19], buf[23]), (0xab, 0xcd, 0xef));
        assert_eq!((buf[26], buf[27]), (0x7d, 0xf0));
        assert_eq!(
            Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap(),
            r2
        );
    }

    #[test]
    fn truncated() {
        let b = bytes();
        assert_eq!(Packet::new_checked(&b[..231]), Err(Error));
    }

    #[test]
    fn bad_field() {
        // Reserved bits of byte 27 are ignored.
        let mut b = bytes();
        b[27] |= 0x0f;
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!((r.rnr_retry_count, r.srq), (7, false));
    }
}
