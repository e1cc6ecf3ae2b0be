//! REQ, request for communication (IBA 12.6.5 Table 106; `include/rdma/ibta_vol1_c12.h`
//! `CM_REQ_*`; docs/WIRE.md §4). Offsets are within the CM payload, after the MAD header.
//!
//! ```text
//! 0-3 local comm ID | 5-7 ECE vendor ID | 8-15 service ID | 16-23 local CA GUID
//! 28-31 local Q_Key | 32-34 local QPN | 35 responder resources
//! 36-38 local EECN | 39 initiator depth | 40-42 remote EECN
//! 43 remote CM response timeout [7:3], transport service type [2:1], E2E flow control [0]
//! 44-46 starting PSN | 47 local CM response timeout [7:3], retry count [2:0]
//! 48-49 P_Key | 50 path MTU [7:4], RDC exists [3], RNR retry count [2:0]
//! 51 max CM retries [7:4], SRQ [3], extended transport type [2:0]
//! 52-95 primary path | 96-139 alternate path (139 [2] SAP supported) | 140-231 private data
//! ```
//!
//! The starting PSN is the first PSN the active side expects to receive: the passive side
//! starts its send queue there (`cm.c` `cm_req_handler` sets `sq_psn` from it), as the lab
//! capture shows.

use core::fmt;

use super::path::{self, PATH_LEN};
use super::{Mtu, TransportServiceType, CM_DATA_LEN};
use crate::wire::{be, Result, U24_MASK};

/// Length of the REQ private data.
pub const PRIVATE_DATA_LEN: usize = 92;

mod field {
    use crate::wire::{Bits, Field};

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const VENDOR_ID: Field = 5..8;
    pub const SERVICE_ID: Field = 8..16;
    pub const LOCAL_CA_GUID: Field = 16..24;
    pub const LOCAL_QKEY: Field = 28..32;
    pub const LOCAL_QPN: Field = 32..35;
    pub const RESPONDER_RESOURCES: usize = 35;
    pub const LOCAL_EECN: Field = 36..39;
    pub const INITIATOR_DEPTH: usize = 39;
    pub const REMOTE_EECN: Field = 40..43;
    pub const REMOTE_CM_RESPONSE_TIMEOUT: Bits = Bits::new(43, 0xF8);
    pub const TRANSPORT_SERVICE_TYPE: Bits = Bits::new(43, 0x06);
    pub const E2E_FLOW_CONTROL: Bits = Bits::new(43, 0x01);
    pub const STARTING_PSN: Field = 44..47;
    pub const LOCAL_CM_RESPONSE_TIMEOUT: Bits = Bits::new(47, 0xF8);
    pub const RETRY_COUNT: Bits = Bits::new(47, 0x07);
    pub const PKEY: Field = 48..50;
    pub const PATH_MTU: Bits = Bits::new(50, 0xF0);
    pub const RDC_EXISTS: Bits = Bits::new(50, 0x08);
    pub const RNR_RETRY_COUNT: Bits = Bits::new(50, 0x07);
    pub const MAX_CM_RETRIES: Bits = Bits::new(51, 0xF0);
    pub const SRQ: Bits = Bits::new(51, 0x08);
    pub const EXTENDED_TRANSPORT_TYPE: Bits = Bits::new(51, 0x07);
    pub const PRIMARY_PATH: Field = 52..96;
    pub const ALTERNATE_PATH: Field = 96..140;
    pub const SAP_SUPPORTED: Bits = Bits::new(139, 0x04);
    pub const PRIVATE_DATA: Field = 140..232;
}

fixed_len_view! {
    /// A read/write view of a REQ (the MAD data area).
    pub struct Packet; len = CM_DATA_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn local_comm_id(&self) -> u32 {
        be::u32(&self.b()[field::LOCAL_COMM_ID])
    }

    /// ECE vendor ID (24 bits; 0 when unused).
    pub fn vendor_id(&self) -> u32 {
        be::u24(&self.b()[field::VENDOR_ID])
    }

    pub fn service_id(&self) -> u64 {
        be::u64(&self.b()[field::SERVICE_ID])
    }

    pub fn local_ca_guid(&self) -> u64 {
        be::u64(&self.b()[field::LOCAL_CA_GUID])
    }

    pub fn local_qkey(&self) -> u32 {
        be::u32(&self.b()[field::LOCAL_QKEY])
    }

    pub fn local_qpn(&self) -> u32 {
        be::u24(&self.b()[field::LOCAL_QPN])
    }

    pub fn responder_resources(&self) -> u8 {
        self.b()[field::RESPONDER_RESOURCES]
    }

    pub fn local_eecn(&self) -> u32 {
        be::u24(&self.b()[field::LOCAL_EECN])
    }

    pub fn initiator_depth(&self) -> u8 {
        self.b()[field::INITIATOR_DEPTH]
    }

    pub fn remote_eecn(&self) -> u32 {
        be::u24(&self.b()[field::REMOTE_EECN])
    }

    pub fn remote_cm_response_timeout(&self) -> u8 {
        field::REMOTE_CM_RESPONSE_TIMEOUT.get(self.b())
    }

    pub fn transport_service_type(&self) -> TransportServiceType {
        TransportServiceType::from_bits(field::TRANSPORT_SERVICE_TYPE.get(self.b()))
    }

    pub fn e2e_flow_control(&self) -> bool {
        field::E2E_FLOW_CONTROL.get_bool(self.b())
    }

    pub fn starting_psn(&self) -> u32 {
        be::u24(&self.b()[field::STARTING_PSN])
    }

    pub fn local_cm_response_timeout(&self) -> u8 {
        field::LOCAL_CM_RESPONSE_TIMEOUT.get(self.b())
    }

    pub fn retry_count(&self) -> u8 {
        field::RETRY_COUNT.get(self.b())
    }

    pub fn pkey(&self) -> u16 {
        be::u16(&self.b()[field::PKEY])
    }

    pub fn path_mtu(&self) -> Mtu {
        Mtu::from(field::PATH_MTU.get(self.b()))
    }

    pub fn rdc_exists(&self) -> bool {
        field::RDC_EXISTS.get_bool(self.b())
    }

    pub fn rnr_retry_count(&self) -> u8 {
        field::RNR_RETRY_COUNT.get(self.b())
    }

    pub fn max_cm_retries(&self) -> u8 {
        field::MAX_CM_RETRIES.get(self.b())
    }

    pub fn srq(&self) -> bool {
        field::SRQ.get_bool(self.b())
    }

    pub fn extended_transport_type(&self) -> u8 {
        field::EXTENDED_TRANSPORT_TYPE.get(self.b())
    }

    pub fn primary_path(&self) -> path::Packet<&[u8]> {
        path::Packet::new_unchecked(&self.b()[field::PRIMARY_PATH])
    }

    pub fn alternate_path(&self) -> path::Packet<&[u8]> {
        path::Packet::new_unchecked(&self.b()[field::ALTERNATE_PATH])
    }

    /// Whether an alternate path is present: its local LID is non-zero (`cm.c`
    /// `cm_req_has_alt_path`).
    pub fn has_alternate_path(&self) -> bool {
        self.alternate_path().local_lid() != 0
    }

    pub fn sap_supported(&self) -> bool {
        field::SAP_SUPPORTED.get_bool(self.b())
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

    pub fn set_vendor_id(&mut self, value: u32) {
        be::set_u24(&mut self.b_mut()[field::VENDOR_ID], value)
    }

    pub fn set_service_id(&mut self, value: u64) {
        be::set_u64(&mut self.b_mut()[field::SERVICE_ID], value)
    }

    pub fn set_local_ca_guid(&mut self, value: u64) {
        be::set_u64(&mut self.b_mut()[field::LOCAL_CA_GUID], value)
    }

    pub fn set_local_qkey(&mut self, value: u32) {
        be::set_u32(&mut self.b_mut()[field::LOCAL_QKEY], value)
    }

    pub fn set_local_qpn(&mut self, value: u32) {
        be::set_u24(&mut self.b_mut()[field::LOCAL_QPN], value)
    }

    pub fn set_responder_resources(&mut self, value: u8) {
        self.b_mut()[field::RESPONDER_RESOURCES] = value
    }

    pub fn set_local_eecn(&mut self, value: u32) {
        be::set_u24(&mut self.b_mut()[field::LOCAL_EECN], value)
    }

    pub fn set_initiator_depth(&mut self, value: u8) {
        self.b_mut()[field::INITIATOR_DEPTH] = value
    }

    pub fn set_remote_eecn(&mut self, value: u32) {
        be::set_u24(&mut self.b_mut()[field::REMOTE_EECN], value)
    }

    pub fn set_remote_cm_response_timeout(&mut self, value: u8) {
        field::REMOTE_CM_RESPONSE_TIMEOUT.set(self.b_mut(), value)
    }

    pub fn set_transport_service_type(&mut self, value: TransportServiceType) {
        field::TRANSPORT_SERVICE_TYPE.set(self.b_mut(), value.bits())
    }

    pub fn set_e2e_flow_control(&mut self, value: bool) {
        field::E2E_FLOW_CONTROL.set_bool(self.b_mut(), value)
    }

    pub fn set_starting_psn(&mut self, value: u32) {
        be::set_u24(&mut self.b_mut()[field::STARTING_PSN], value)
    }

    pub fn set_local_cm_response_timeout(&mut self, value: u8) {
        field::LOCAL_CM_RESPONSE_TIMEOUT.set(self.b_mut(), value)
    }

    pub fn set_retry_count(&mut self, value: u8) {
        field::RETRY_COUNT.set(self.b_mut(), value)
    }

    pub fn set_pkey(&mut self, value: u16) {
        be::set_u16(&mut self.b_mut()[field::PKEY], value)
    }

    pub fn set_path_mtu(&mut self, value: Mtu) {
        field::PATH_MTU.set(self.b_mut(), value.into())
    }

    pub fn set_rdc_exists(&mut self, value: bool) {
        field::RDC_EXISTS.set_bool(self.b_mut(), value)
    }

    pub fn set_rnr_retry_count(&mut self, value: u8) {
        field::RNR_RETRY_COUNT.set(self.b_mut(), value)
    }

    pub fn set_max_cm_retries(&mut self, value: u8) {
        field::MAX_CM_RETRIES.set(self.b_mut(), value)
    }

    pub fn set_srq(&mut self, value: bool) {
        field::SRQ.set_bool(self.b_mut(), value)
    }

    pub fn set_extended_transport_type(&mut self, value: u8) {
        field::EXTENDED_TRANSPORT_TYPE.set(self.b_mut(), value)
    }

    pub fn primary_path_mut(&mut self) -> path::Packet<&mut [u8]> {
        path::Packet::new_unchecked(&mut self.b_mut()[field::PRIMARY_PATH])
    }

    pub fn alternate_path_mut(&mut self) -> path::Packet<&mut [u8]> {
        path::Packet::new_unchecked(&mut self.b_mut()[field::ALTERNATE_PATH])
    }

    pub fn set_sap_supported(&mut self, value: bool) {
        field::SAP_SUPPORTED.set_bool(self.b_mut(), value)
    }

    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.b_mut()[field::PRIVATE_DATA]
    }
}

/// A decoded REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub local_comm_id: u32,
    pub vendor_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub responder_resources: u8,
    pub local_eecn: u32,
    pub initiator_depth: u8,
    pub remote_eecn: u32,
    pub remote_cm_response_timeout: u8,
    pub transport_service_type: TransportServiceType,
    pub e2e_flow_control: bool,
    pub starting_psn: u32,
    pub local_cm_response_timeout: u8,
    pub retry_count: u8,
    pub pkey: u16,
    pub path_mtu: Mtu,
    pub rdc_exists: bool,
    pub rnr_retry_count: u8,
    pub max_cm_retries: u8,
    pub srq: bool,
    pub extended_transport_type: u8,
    pub primary_path: path::Repr,
    /// All zero when absent (local LID 0).
    pub alternate_path: path::Repr,
    pub sap_supported: bool,
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            vendor_id: packet.vendor_id(),
            service_id: packet.service_id(),
            local_ca_guid: packet.local_ca_guid(),
            local_qkey: packet.local_qkey(),
            local_qpn: packet.local_qpn(),
            responder_resources: packet.responder_resources(),
            local_eecn: packet.local_eecn(),
            initiator_depth: packet.initiator_depth(),
            remote_eecn: packet.remote_eecn(),
            remote_cm_response_timeout: packet.remote_cm_response_timeout(),
            transport_service_type: packet.transport_service_type(),
            e2e_flow_control: packet.e2e_flow_control(),
            starting_psn: packet.starting_psn(),
            local_cm_response_timeout: packet.local_cm_response_timeout(),
            retry_count: packet.retry_count(),
            pkey: packet.pkey(),
            path_mtu: packet.path_mtu(),
            rdc_exists: packet.rdc_exists(),
            rnr_retry_count: packet.rnr_retry_count(),
            max_cm_retries: packet.max_cm_retries(),
            srq: packet.srq(),
            extended_transport_type: packet.extended_transport_type(),
            primary_path: path::Repr::parse(&packet.primary_path())?,
            alternate_path: path::Repr::parse(&packet.alternate_path())?,
            sap_supported: packet.sap_supported(),
            private_data: be::array(packet.private_data()),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the whole CM payload, reserved fields zero. Wide values are truncated to their
    /// field widths.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.b_mut()[..CM_DATA_LEN].fill(0);
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_vendor_id(self.vendor_id & U24_MASK);
        packet.set_service_id(self.service_id);
        packet.set_local_ca_guid(self.local_ca_guid);
        packet.set_local_qkey(self.local_qkey);
        packet.set_local_qpn(self.local_qpn & U24_MASK);
        packet.set_responder_resources(self.responder_resources);
        packet.set_local_eecn(self.local_eecn & U24_MASK);
        packet.set_initiator_depth(self.initiator_depth);
        packet.set_remote_eecn(self.remote_eecn & U24_MASK);
        packet.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        packet.set_transport_service_type(self.transport_service_type);
        packet.set_e2e_flow_control(self.e2e_flow_control);
        packet.set_starting_psn(self.starting_psn & U24_MASK);
        packet.set_local_cm_response_timeout(self.local_cm_response_timeout);
        packet.set_retry_count(self.retry_count);
        packet.set_pkey(self.pkey);
        packet.set_path_mtu(self.path_mtu);
        packet.set_rdc_exists(self.rdc_exists);
        packet.set_rnr_retry_count(self.rnr_retry_count);
        packet.set_max_cm_retries(self.max_cm_retries);
        packet.set_srq(self.srq);
        packet.set_extended_transport_type(self.extended_transport_type);
        self.primary_path.emit(&mut packet.primary_path_mut());
        self.alternate_path.emit(&mut packet.alternate_path_mut());
        packet.set_sap_supported(self.sap_supported);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "REQ comm={:#010x} sid={:#018x} qpn={:#x} psn={:#x} mtu={:?} rr={} id={} {}",
            self.local_comm_id,
            self.service_id,
            self.local_qpn,
            self.starting_psn,
            self.path_mtu,
            self.responder_resources,
            self.initiator_depth,
            self.primary_path
        )
    }
}

const _: () = assert!(field::ALTERNATE_PATH.end - field::ALTERNATE_PATH.start == PATH_LEN);
const _: () = assert!(field::PRIVATE_DATA.end - field::PRIVATE_DATA.start == PRIVATE_DATA_LEN);

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::wire::Error;

    /// The CM payload of the iSER REQ in the lab capture (frame 15).
    pub(crate) fn capture_bytes() -> [u8; CM_DATA_LEN] {
        let mut b = [0u8; CM_DATA_LEN];
        let head: [u8; 52] = [
            0xf2, 0x03, 0x25, 0xf4, 0x00, 0x00, 0x00, 0x00, // comm ID, ECE
            0x00, 0x00, 0x00, 0x00, 0x01, 0x06, 0x0c, 0xbc, // service ID
            0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x03, // CA GUID
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // rsvd, Q_Key
            0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x00, 0x01, // QPN, RR, EECN, ID
            0x00, 0x00, 0x00, 0xa0, 0x8b, 0x15, 0xd4, 0xa7, // rEECN, timeouts, PSN, retry
            0xff, 0xff, 0x36, 0xf0, // P_Key, MTU/RNR, max retries
        ];
        b[..52].copy_from_slice(&head);
        b[52..96].copy_from_slice(&[
            0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xc0, 0xa8, 0x4d,
            0x03, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xc0, 0xa8, 0x4d, 0x02, 0x07, 0x7e,
            0x60, 0x00, 0x00, 0x40, 0x00, 0x98,
        ]);
        // cma_hdr: version 0, IPv4, port 0x8796, addresses, then the iSER CM header 0x80.
        b[140..144].copy_from_slice(&[0x00, 0x40, 0x87, 0x96]);
        b[156..160].copy_from_slice(&[0xc0, 0xa8, 0x4d, 0x03]);
        b[172..176].copy_from_slice(&[0xc0, 0xa8, 0x4d, 0x02]);
        b[176] = 0x80;
        b
    }

    #[test]
    fn parse() {
        let bytes = capture_bytes();
        let p = Packet::new_checked(&bytes[..]).unwrap();
        let r = Repr::parse(&p).unwrap();
        assert_eq!(r.local_comm_id, 0xf203_25f4);
        assert_eq!(r.service_id, 0x0000_0000_0106_0cbc);
        assert_eq!(r.local_ca_guid, 0x5054_00ff_fe12_3403);
        assert_eq!(r.local_qpn, 0x11);
        assert_eq!((r.responder_resources, r.initiator_depth), (128, 1));
        assert_eq!(r.remote_cm_response_timeout, 20);
        assert_eq!(r.transport_service_type, TransportServiceType::Rc);
        assert!(!r.e2e_flow_control);
        assert_eq!(r.starting_psn, 0x8b_15d4);
        assert_eq!((r.local_cm_response_timeout, r.retry_count), (20, 7));
        assert_eq!(r.pkey, 0xffff);
        assert_eq!(r.path_mtu, Mtu::Mtu1024);
        assert_eq!((r.rdc_exists, r.rnr_retry_count), (false, 6));
        assert_eq!(
            (r.max_cm_retries, r.srq, r.extended_transport_type),
            (15, false, 0)
        );
        assert_eq!(r.primary_path.flow_label, 0x077e6);
        assert_eq!(r.primary_path.local_ack_timeout, 19);
        assert!(!p.has_alternate_path());
        assert_eq!(r.private_data[36], 0x80);
    }

    #[test]
    fn emit() {
        let bytes = capture_bytes();
        let r = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        let mut buf = [0xa5u8; CM_DATA_LEN];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
    }

    #[test]
    fn emit_bit_fields() {
        let bytes = capture_bytes();
        let mut r = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        r.remote_cm_response_timeout = 0x1f;
        r.transport_service_type = TransportServiceType::Uc;
        r.e2e_flow_control = true;
        r.local_cm_response_timeout = 0x01;
        r.retry_count = 0x02;
        r.path_mtu = Mtu::Mtu4096;
        r.rdc_exists = true;
        r.rnr_retry_count = 0x01;
        r.max_cm_retries = 0x0a;
        r.srq = true;
        r.extended_transport_type = 0x05;
        r.vendor_id = 0x12_3456;
        r.sap_supported = true;
        let mut buf = [0xa5u8; CM_DATA_LEN];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(&buf[4..8], &[0x00, 0x12, 0x34, 0x56]);
        assert_eq!(buf[43], 0xfb);
        assert_eq!(buf[47], 0x0a);
        assert_eq!(buf[50], 0x59);
        assert_eq!(buf[51], 0xad);
        assert_eq!(buf[139], 0x04);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap(),
            r
        );
    }

    #[test]
    fn truncated() {
        let bytes = capture_bytes();
        assert_eq!(Packet::new_checked(&bytes[..CM_DATA_LEN - 1]), Err(Error));
    }

    #[test]
    fn bad_field() {
        // An unassigned MTU code survives parsing for the CM to reject (REJ 26).
        let mut bytes = capture_bytes();
        bytes[50] = 0x96;
        let r = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(r.path_mtu, Mtu::Unknown(9));
        assert_eq!(r.path_mtu.bytes(), None);
    }
}
