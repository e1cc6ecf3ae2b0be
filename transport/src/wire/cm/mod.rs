//! IB communication management messages (IBA 12.6, 12.8, 12.11; Linux
//! `include/rdma/ibta_vol1_c12.h`, `drivers/infiniband/core/cm_msgs.h`; docs/WIRE.md §4).
//!
//! CM messages are MADs of class 0x07, class version 2, method Send, carried as UD SEND ONLY
//! packets between QP1s with Q_Key 0x80010000. Each message module has a view over the 232-byte
//! MAD data area (all offsets are "CM offsets": MAD offset − 24) and a `Repr`; bit positions
//! follow IBTA's MSB-first numbering. [`Mad`] ties the MAD header and a [`CmMessage`] together.

use core::fmt;

use super::mad::{self, MgmtClass};
use super::{Error, Result};

pub mod apr;
pub mod comm_ids;
pub mod drep;
pub mod dreq;
pub mod lap;
pub mod mra;
pub mod path;
pub mod rej;
pub mod rep;
pub mod req;
pub mod rtu;
pub mod sidr_rep;
pub mod sidr_req;

/// Length of the CM payload: the MAD data area.
pub const CM_DATA_LEN: usize = mad::DATA_LEN;
/// The CM class version Linux speaks (`IB_CM_CLASS_VERSION`).
pub const CLASS_VERSION: u8 = 2;

enum_with_unknown! {
    /// CM attribute IDs (IBA 12.6 Table 104; `include/rdma/ib_cm.h` `CM_*_ATTR_ID`).
    pub enum AttributeId(u16) {
        ClassPortInfo = 0x0001,
        Req = 0x0010,
        Mra = 0x0011,
        Rej = 0x0012,
        Rep = 0x0013,
        Rtu = 0x0014,
        Dreq = 0x0015,
        Drep = 0x0016,
        SidrReq = 0x0017,
        SidrRep = 0x0018,
        Lap = 0x0019,
        Apr = 0x001A,
    }
}

/// The REQ transport service type, two bits (IBA 12.6.5; 3 is XRC when the extended transport
/// type says so).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportServiceType {
    Rc = 0,
    Uc = 1,
    Rd = 2,
    Xrc = 3,
}

impl TransportServiceType {
    /// Decodes the two-bit field (higher bits are ignored).
    pub const fn from_bits(bits: u8) -> Self {
        match bits & 3 {
            0 => TransportServiceType::Rc,
            1 => TransportServiceType::Uc,
            2 => TransportServiceType::Rd,
            _ => TransportServiceType::Xrc,
        }
    }

    pub const fn bits(self) -> u8 {
        self as u8
    }
}

/// Which message an MRA acknowledges or a REJ rejects (two bits; IBA 12.6.6, 12.6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageRef {
    Req = 0,
    Rep = 1,
    /// LAP for an MRA, "other" for a REJ.
    Other = 2,
    Reserved = 3,
}

impl MessageRef {
    /// Decodes the two-bit field (higher bits are ignored).
    pub const fn from_bits(bits: u8) -> Self {
        match bits & 3 {
            0 => MessageRef::Req,
            1 => MessageRef::Rep,
            2 => MessageRef::Other,
            _ => MessageRef::Reserved,
        }
    }

    pub const fn bits(self) -> u8 {
        self as u8
    }
}

enum_with_unknown! {
    /// Path MTU codes (IBA 9.4 / 14.2.5; `enum ib_mtu`).
    pub enum Mtu(u8) {
        Mtu256 = 1,
        Mtu512 = 2,
        Mtu1024 = 3,
        Mtu2048 = 4,
        Mtu4096 = 5,
    }
}

impl Mtu {
    /// The MTU in bytes, `None` for an unassigned code.
    pub const fn bytes(self) -> Option<usize> {
        match self {
            Mtu::Mtu256 => Some(256),
            Mtu::Mtu512 => Some(512),
            Mtu::Mtu1024 => Some(1024),
            Mtu::Mtu2048 => Some(2048),
            Mtu::Mtu4096 => Some(4096),
            Mtu::Unknown(_) => None,
        }
    }

    /// The largest IB MTU that fits `bytes`, `None` below 256.
    pub const fn from_bytes(bytes: usize) -> Option<Mtu> {
        Some(match bytes {
            4096.. => Mtu::Mtu4096,
            2048.. => Mtu::Mtu2048,
            1024.. => Mtu::Mtu1024,
            512.. => Mtu::Mtu512,
            256.. => Mtu::Mtu256,
            _ => return None,
        })
    }
}

enum_with_unknown! {
    /// REJ reasons (IBA 12.6.7.2 Table 109; `include/rdma/ib_cm.h` `enum ib_cm_rej_reason`).
    pub enum RejReason(u16) {
        NoQp = 1,
        NoEec = 2,
        NoResources = 3,
        Timeout = 4,
        Unsupported = 5,
        InvalidCommId = 6,
        InvalidCommInstance = 7,
        InvalidServiceId = 8,
        InvalidTransportType = 9,
        StaleConn = 10,
        RdcNotExist = 11,
        InvalidGid = 12,
        InvalidLid = 13,
        InvalidSl = 14,
        InvalidTrafficClass = 15,
        InvalidHopLimit = 16,
        InvalidPacketRate = 17,
        InvalidAltGid = 18,
        InvalidAltLid = 19,
        InvalidAltSl = 20,
        InvalidAltTrafficClass = 21,
        InvalidAltHopLimit = 22,
        InvalidAltPacketRate = 23,
        PortCmRedirect = 24,
        PortRedirect = 25,
        InvalidMtu = 26,
        InsufficientRespResources = 27,
        /// What `rdma_reject` always sends; the private data carries the consumer's reason.
        ConsumerDefined = 28,
        InvalidRnrRetry = 29,
        DuplicateLocalCommId = 30,
        InvalidClassVersion = 31,
        InvalidFlowLabel = 32,
        InvalidAltFlowLabel = 33,
        VendorOptionNotSupported = 35,
    }
}

enum_with_unknown! {
    /// APR status (IBA 12.8.2 Table 117; `enum ib_cm_apr_status`).
    pub enum AprStatus(u8) {
        Success = 0,
        InvalidCommId = 1,
        Unsupported = 2,
        Reject = 3,
        Redirect = 4,
        IsCurrent = 5,
        InvalidQpnEecn = 6,
        InvalidLid = 7,
        InvalidGid = 8,
        InvalidFlowLabel = 9,
        InvalidTrafficClass = 10,
        InvalidHopLimit = 11,
        InvalidPacketRate = 12,
        InvalidSl = 13,
    }
}

enum_with_unknown! {
    /// SIDR_REP status (IBA 12.11.2 Table 121; `enum ib_cm_sidr_status`).
    pub enum SidrStatus(u8) {
        Success = 0,
        Unsupported = 1,
        Reject = 2,
        NoQp = 3,
        Redirect = 4,
        UnsupportedVersion = 5,
    }
}

/// One decoded CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage {
    Req(req::Repr),
    Mra(mra::Repr),
    Rej(rej::Repr),
    Rep(rep::Repr),
    Rtu(rtu::Repr),
    Dreq(dreq::Repr),
    Drep(drep::Repr),
    SidrReq(sidr_req::Repr),
    SidrRep(sidr_rep::Repr),
    Lap(lap::Repr),
    Apr(apr::Repr),
}

impl CmMessage {
    /// The attribute ID that names this message in the MAD header.
    pub fn attr_id(&self) -> AttributeId {
        match self {
            CmMessage::Req(_) => AttributeId::Req,
            CmMessage::Mra(_) => AttributeId::Mra,
            CmMessage::Rej(_) => AttributeId::Rej,
            CmMessage::Rep(_) => AttributeId::Rep,
            CmMessage::Rtu(_) => AttributeId::Rtu,
            CmMessage::Dreq(_) => AttributeId::Dreq,
            CmMessage::Drep(_) => AttributeId::Drep,
            CmMessage::SidrReq(_) => AttributeId::SidrReq,
            CmMessage::SidrRep(_) => AttributeId::SidrRep,
            CmMessage::Lap(_) => AttributeId::Lap,
            CmMessage::Apr(_) => AttributeId::Apr,
        }
    }

    /// Decodes the CM payload (the MAD data area, at least 232 bytes) of the message `attr`.
    pub fn parse(attr: AttributeId, data: &[u8]) -> Result<CmMessage> {
        Ok(match attr {
            AttributeId::Req => CmMessage::Req(req::Repr::parse(&req::Packet::new_checked(data)?)?),
            AttributeId::Mra => CmMessage::Mra(mra::Repr::parse(&mra::Packet::new_checked(data)?)?),
            AttributeId::Rej => CmMessage::Rej(rej::Repr::parse(&rej::Packet::new_checked(data)?)?),
            AttributeId::Rep => CmMessage::Rep(rep::Repr::parse(&rep::Packet::new_checked(data)?)?),
            AttributeId::Rtu => CmMessage::Rtu(rtu::Repr::parse(&rtu::Packet::new_checked(data)?)?),
            AttributeId::Dreq => {
                CmMessage::Dreq(dreq::Repr::parse(&dreq::Packet::new_checked(data)?)?)
            }
            AttributeId::Drep => {
                CmMessage::Drep(drep::Repr::parse(&drep::Packet::new_checked(data)?)?)
            }
            AttributeId::SidrReq => CmMessage::SidrReq(sidr_req::Repr::parse(
                &sidr_req::Packet::new_checked(data)?,
            )?),
            AttributeId::SidrRep => CmMessage::SidrRep(sidr_rep::Repr::parse(
                &sidr_rep::Packet::new_checked(data)?,
            )?),
            AttributeId::Lap => CmMessage::Lap(lap::Repr::parse(&lap::Packet::new_checked(data)?)?),
            AttributeId::Apr => CmMessage::Apr(apr::Repr::parse(&apr::Packet::new_checked(data)?)?),
            AttributeId::ClassPortInfo | AttributeId::Unknown(_) => return Err(Error),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the CM payload into `data` (at least 232 bytes; panics otherwise).
    pub fn emit(&self, data: &mut [u8]) {
        match self {
            CmMessage::Req(r) => r.emit(&mut req::Packet::new_unchecked(data)),
            CmMessage::Mra(r) => r.emit(&mut mra::Packet::new_unchecked(data)),
            CmMessage::Rej(r) => r.emit(&mut rej::Packet::new_unchecked(data)),
            CmMessage::Rep(r) => r.emit(&mut rep::Packet::new_unchecked(data)),
            CmMessage::Rtu(r) => r.emit(&mut rtu::Packet::new_unchecked(data)),
            CmMessage::Dreq(r) => r.emit(&mut dreq::Packet::new_unchecked(data)),
            CmMessage::Drep(r) => r.emit(&mut drep::Packet::new_unchecked(data)),
            CmMessage::SidrReq(r) => r.emit(&mut sidr_req::Packet::new_unchecked(data)),
            CmMessage::SidrRep(r) => r.emit(&mut sidr_rep::Packet::new_unchecked(data)),
            CmMessage::Lap(r) => r.emit(&mut lap::Packet::new_unchecked(data)),
            CmMessage::Apr(r) => r.emit(&mut apr::Packet::new_unchecked(data)),
        }
    }
}

impl fmt::Display for CmMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmMessage::Req(r) => r.fmt(f),
            CmMessage::Mra(r) => r.fmt(f),
            CmMessage::Rej(r) => r.fmt(f),
            CmMessage::Rep(r) => r.fmt(f),
            CmMessage::Rtu(r) => write!(f, "RTU {r}"),
            CmMessage::Dreq(r) => r.fmt(f),
            CmMessage::Drep(r) => write!(f, "DREP {r}"),
            CmMessage::SidrReq(r) => r.fmt(f),
            CmMessage::SidrRep(r) => r.fmt(f),
            CmMessage::Lap(r) => r.fmt(f),
            CmMessage::Apr(r) => r.fmt(f),
        }
    }
}

/// A whole CM MAD: the common header and the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mad {
    /// The MAD header; on emit its attribute ID is taken from the message.
    pub header: mad::Repr,
    pub message: CmMessage,
}

impl Mad {
    /// A CM MAD as Linux formats it (`cm.c` `cm_format_mad_hdr`): base version 1, class CM,
    /// class version 2, method Send, status 0, attribute modifier 0.
    pub fn new(tid: u64, message: CmMessage) -> Mad {
        Mad {
            header: mad::Repr {
                base_version: mad::BASE_VERSION,
                mgmt_class: MgmtClass::Cm,
                class_version: CLASS_VERSION,
                method: mad::Method::Send,
                status: 0,
                class_specific: 0,
                tid,
                attr_id: message.attr_id().into(),
                attr_mod: 0,
            },
            message,
        }
    }

    /// Decodes a whole MAD (at least 256 bytes: the UD payload of a GSI packet). Fails on a
    /// class other than CM and on attributes that are not CM messages. The class version and
    /// method are not judged here.
    pub fn parse(bytes: &[u8]) -> Result<Mad> {
        let packet = mad::Packet::new_checked(bytes)?;
        let header = mad::Repr::parse(&packet)?;
        if header.mgmt_class != MgmtClass::Cm {
            return Err(Error);
        }
        let message = CmMessage::parse(AttributeId::from(header.attr_id), packet.data())?;
        Ok(Mad { header, message })
    }

    /// Length of a whole MAD.
    pub const fn buffer_len(&self) -> usize {
        mad::MAD_LEN
    }

    /// Writes the 256-byte MAD (panics if `bytes` is shorter).
    pub fn emit(&self, bytes: &mut [u8]) {
        let mut header = self.header;
        header.attr_id = self.message.attr_id().into();
        let mut packet = mad::Packet::new_unchecked(&mut bytes[..mad::MAD_LEN]);
        header.emit(&mut packet);
        self.message.emit(packet.data_mut());
    }
}

impl fmt::Display for Mad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} tid={:#018x}", self.message, self.header.tid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req_mad() -> [u8; mad::MAD_LEN] {
        let mut b = [0u8; mad::MAD_LEN];
        b[..24].copy_from_slice(&[
            0x01, 0x07, 0x02, 0x03, 0, 0, 0, 0, 0, 0, 0, 0x02, 0xf4, 0x25, 0x03, 0xf2, 0x00, 0x10,
            0, 0, 0, 0, 0, 0,
        ]);
        b[24..].copy_from_slice(&req::tests::capture_bytes());
        b
    }

    #[test]
    fn parse() {
        let b = req_mad();
        let m = Mad::parse(&b).unwrap();
        assert_eq!(m.header.tid, 0x2_f425_03f2);
        match m.message {
            CmMessage::Req(r) => assert_eq!(r.local_comm_id, 0xf203_25f4),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn emit() {
        let b = req_mad();
        let m = Mad::parse(&b).unwrap();
        let mut out = [0xa5u8; mad::MAD_LEN];
        m.emit(&mut out);
        assert_eq!(out, b);
        let built = Mad::new(0x2_f425_03f2, m.message);
        built.emit(&mut out);
        assert_eq!(out, b);
    }

    #[test]
    fn truncated() {
        let b = req_mad();
        assert_eq!(Mad::parse(&b[..255]), Err(Error));
        assert_eq!(Mad::parse(&b[..20]), Err(Error));
    }

    #[test]
    fn bad_field() {
        let mut b = req_mad();
        b[1] = 0x03; // SA class
        assert_eq!(Mad::parse(&b), Err(Error));
        let mut b = req_mad();
        b[17] = 0x01; // ClassPortInfo
        assert_eq!(Mad::parse(&b), Err(Error));
        b[17] = 0x42;
        assert_eq!(Mad::parse(&b), Err(Error));
    }

    #[test]
    fn mtu() {
        assert_eq!(Mtu::from_bytes(1500 - 96), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_bytes(9000), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::from_bytes(255), None);
        assert_eq!(Mtu::Mtu2048.bytes(), Some(2048));
    }

    #[test]
    fn every_message_round_trips() {
        // Parse an arbitrary pattern as each message, emit it and parse again.
        let mut data = [0u8; CM_DATA_LEN];
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37).wrapping_add(11);
        }
        for attr in 0x10..=0x1a {
            let attr = AttributeId::from(attr);
            let msg = CmMessage::parse(attr, &data).unwrap();
            assert_eq!(msg.attr_id(), attr);
            let mut out = [0xa5u8; CM_DATA_LEN];
            msg.emit(&mut out);
            assert_eq!(CmMessage::parse(attr, &out).unwrap(), msg, "{attr:?}");
        }
    }
}
