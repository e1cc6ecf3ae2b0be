//! The common MAD header (IBA 13.4.2; `include/rdma/ib_mad.h` `struct ib_mad_hdr`), 24 bytes,
//! at the start of every 256-byte management datagram carried as a UD SEND to QP1.
//!
//! ```text
//! 0 BaseVersion | 1 MgmtClass | 2 ClassVersion | 3 R (0x80) + Method
//! 4-5 Status | 6-7 ClassSpecific | 8-15 TransactionID
//! 16-17 AttributeID | 18-19 reserved | 20-23 AttributeModifier
//! ```

use core::fmt;

use super::{be, Field, Rest, Result};

/// Length of the common MAD header.
pub const HEADER_LEN: usize = 24;
/// Length of a whole MAD (`IB_MGMT_MAD_SIZE`); GSI always sends all of it.
pub const MAD_LEN: usize = 256;
/// Length of the data area after the header.
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;
/// The MAD base version.
pub const BASE_VERSION: u8 = 1;
/// The QP number of the General Services Interface.
pub const GSI_QPN: u32 = 1;

mod field {
    use super::{Field, Rest};

    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: Field = 4..6;
    pub const CLASS_SPECIFIC: Field = 6..8;
    pub const TID: Field = 8..16;
    pub const ATTR_ID: Field = 16..18;
    pub const RESERVED: Field = 18..20;
    pub const ATTR_MOD: Field = 20..24;
    pub const DATA: Rest = 24..;
}

enum_with_unknown! {
    /// Management classes (IBA 13.4.4 Table 115; `ib_mad.h` `IB_MGMT_CLASS_*`).
    pub enum MgmtClass(u8) {
        SubnLidRouted = 0x01,
        SubnAdm = 0x03,
        Perf = 0x04,
        BoardMgmt = 0x05,
        DeviceMgmt = 0x06,
        /// Communication management (IBA 12).
        Cm = 0x07,
        Snmp = 0x08,
        SubnDirectedRoute = 0x81,
    }
}

enum_with_unknown! {
    /// The method byte including the response bit R (IBA 13.4.5 Table 116).
    pub enum Method(u8) {
        Get = 0x01,
        Set = 0x02,
        /// The method of every CM message.
        Send = 0x03,
        Trap = 0x05,
        Report = 0x06,
        TrapRepress = 0x07,
        GetTable = 0x12,
        GetTraceTable = 0x13,
        GetMulti = 0x14,
        Delete = 0x15,
        GetResp = 0x81,
        ReportResp = 0x86,
        GetTableResp = 0x92,
        GetMultiResp = 0x94,
        DeleteResp = 0x95,
    }
}

impl Method {
    /// The response bit (0x80).
    pub fn is_response(self) -> bool {
        u8::from(self) & 0x80 != 0
    }
}

fixed_len_view! {
    /// A read/write view of a MAD: header and data.
    pub struct Packet; len = HEADER_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }

    pub fn mgmt_class(&self) -> MgmtClass {
        MgmtClass::from(self.buffer.as_ref()[field::MGMT_CLASS])
    }

    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }

    pub fn method(&self) -> Method {
        Method::from(self.buffer.as_ref()[field::METHOD])
    }

    pub fn status(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::STATUS])
    }

    pub fn class_specific(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::CLASS_SPECIFIC])
    }

    /// Transaction ID.
    pub fn tid(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::TID])
    }

    pub fn attr_id(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::ATTR_ID])
    }

    pub fn reserved(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::RESERVED])
    }

    pub fn attr_mod(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::ATTR_MOD])
    }

    /// The class-specific data after the header (232 bytes in a whole MAD).
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_base_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::BASE_VERSION] = value
    }

    pub fn set_mgmt_class(&mut self, value: MgmtClass) {
        self.buffer.as_mut()[field::MGMT_CLASS] = value.into()
    }

    pub fn set_class_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::CLASS_VERSION] = value
    }

    pub fn set_method(&mut self, value: Method) {
        self.buffer.as_mut()[field::METHOD] = value.into()
    }

    pub fn set_status(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::STATUS], value)
    }

    pub fn set_class_specific(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::CLASS_SPECIFIC], value)
    }

    pub fn set_tid(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::TID], value)
    }

    pub fn set_attr_id(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::ATTR_ID], value)
    }

    pub fn set_reserved(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::RESERVED], value)
    }

    pub fn set_attr_mod(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::ATTR_MOD], value)
    }

    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::DATA]
    }
}

/// The decoded MAD header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub base_version: u8,
    pub mgmt_class: MgmtClass,
    pub class_version: u8,
    pub method: Method,
    pub status: u16,
    pub class_specific: u16,
    pub tid: u64,
    pub attr_id: u16,
    /// Zero for the CM, except that newer kernels carry ECE options here in REQ and REP.
    pub attr_mod: u32,
}

impl Repr {
    /// Decodes the header. Any class and version decode; the receiver judges them (the CM
    /// answers an unsupported class version with REJ reason 31).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            base_version: packet.base_version(),
            mgmt_class: packet.mgmt_class(),
            class_version: packet.class_version(),
            method: packet.method(),
            status: packet.status(),
            class_specific: packet.class_specific(),
            tid: packet.tid(),
            attr_id: packet.attr_id(),
            attr_mod: packet.attr_mod(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_base_version(self.base_version);
        packet.set_mgmt_class(self.mgmt_class);
        packet.set_class_version(self.class_version);
        packet.set_method(self.method);
        packet.set_status(self.status);
        packet.set_class_specific(self.class_specific);
        packet.set_tid(self.tid);
        packet.set_attr_id(self.attr_id);
        packet.set_reserved(0);
        packet.set_attr_mod(self.attr_mod);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MAD {:?} v{} {:?} attr={:#06x} tid={:#018x} status={:#x}",
            self.mgmt_class, self.class_version, self.method, self.attr_id, self.tid, self.status
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    // The MAD header of the CM REQ in the lab capture (frame 15).
    static BYTES: [u8; 24] = [
        0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xf4, 0x25, 0x03,
        0xf2, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    const REPR: Repr = Repr {
        base_version: 1,
        mgmt_class: MgmtClass::Cm,
        class_version: 2,
        method: Method::Send,
        status: 0,
        class_specific: 0,
        tid: 0x0000_0002_f425_03f2,
        attr_id: 0x0010,
        attr_mod: 0,
    };

    #[test]
    fn parse() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), REPR);
        assert!(p.data().is_empty());
        assert!(!p.method().is_response());
        assert!(Method::GetResp.is_response());
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; 24];
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&BYTES[..23]), Err(Error));
    }

    #[test]
    fn bad_field() {
        let mut b = BYTES;
        b[1] = 0x42;
        b[3] = 0x7e;
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.mgmt_class, MgmtClass::Unknown(0x42));
        assert_eq!(r.method, Method::Unknown(0x7e));
    }
}
