//! SIDR_REP, service ID resolution response (IBA 12.11.2 Table 120; `ibta_vol1_c12.h`
//! `CM_SIDR_REP_*`).
//!
//! ```text
//! 0-3 request ID | 4 status | 5 additional information length
//! 6-7 ECE vendor ID [23:8] | 8-10 QPN | 11 vendor ID [7:0] | 12-19 service ID
//! 20-23 Q_Key | 24-95 additional information | 96-231 private data
//! ```

use core::fmt;

use super::{SidrStatus, CM_DATA_LEN};
use crate::wire::{be, Result, U24_MASK};

/// Length of the additional information.
pub const INFO_LEN: usize = 72;
/// Length of the SIDR_REP private data.
pub const PRIVATE_DATA_LEN: usize = 136;

mod field {
    use crate::wire::Field;

    pub const REQUEST_ID: Field = 0..4;
    pub const STATUS: usize = 4;
    pub const INFO_LENGTH: usize = 5;
    pub const VENDOR_ID_H: Field = 6..8;
    pub const QPN: Field = 8..11;
    pub const VENDOR_ID_L: usize = 11;
    pub const SERVICE_ID: Field = 12..20;
    pub const QKEY: Field = 20..24;
    pub const INFO: Field = 24..96;
    pub const PRIVATE_DATA: Field = 96..232;
}

fixed_len_view! {
    /// A read/write view of a SIDR_REP (the MAD data area).
    pub struct Packet; len = CM_DATA_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn request_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::REQUEST_ID])
    }

    pub fn status(&self) -> SidrStatus {
        SidrStatus::from(self.buffer.as_ref()[field::STATUS])
    }

    pub fn info_length(&self) -> u8 {
        self.buffer.as_ref()[field::INFO_LENGTH]
    }

    /// ECE vendor ID (24 bits).
    pub fn vendor_id(&self) -> u32 {
        let b = self.buffer.as_ref();
        (u32::from(be::u16(&b[field::VENDOR_ID_H])) << 8) | u32::from(b[field::VENDOR_ID_L])
    }

    pub fn qpn(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::QPN])
    }

    pub fn service_id(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::SERVICE_ID])
    }

    pub fn qkey(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::QKEY])
    }

    pub fn info(&self) -> &[u8] {
        &self.buffer.as_ref()[field::INFO]
    }

    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_request_id(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::REQUEST_ID], value)
    }

    pub fn set_status(&mut self, value: SidrStatus) {
        self.buffer.as_mut()[field::STATUS] = value.into()
    }

    pub fn set_info_length(&mut self, value: u8) {
        self.buffer.as_mut()[field::INFO_LENGTH] = value
    }

    pub fn set_vendor_id(&mut self, value: u32) {
        let b = self.buffer.as_mut();
        be::set_u16(&mut b[field::VENDOR_ID_H], (value >> 8) as u16);
        b[field::VENDOR_ID_L] = value as u8;
    }

    pub fn set_qpn(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::QPN], value)
    }

    pub fn set_service_id(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::SERVICE_ID], value)
    }

    pub fn set_qkey(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::QKEY], value)
    }

    pub fn info_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::INFO]
    }

    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// A decoded SIDR_REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub request_id: u32,
    pub status: SidrStatus,
    pub info_length: u8,
    pub vendor_id: u32,
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    pub info: [u8; INFO_LEN],
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            request_id: packet.request_id(),
            status: packet.status(),
            info_length: packet.info_length(),
            vendor_id: packet.vendor_id(),
            qpn: packet.qpn(),
            service_id: packet.service_id(),
            qkey: packet.qkey(),
            info: be::array(packet.info()),
            private_data: be::array(packet.private_data()),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_request_id(self.request_id);
        packet.set_status(self.status);
        packet.set_info_length(self.info_length);
        packet.set_vendor_id(self.vendor_id & U24_MASK);
        packet.set_qpn(self.qpn & U24_MASK);
        packet.set_service_id(self.service_id);
        packet.set_qkey(self.qkey);
        packet.info_mut().copy_from_slice(&self.info);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SIDR_REP id={:#010x} {:?} qpn={:#x} qkey={:#x} sid={:#018x}",
            self.request_id, self.status, self.qpn, self.qkey, self.service_id
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    fn repr() -> Repr {
        Repr {
            request_id: 0xdead_beef,
            status: SidrStatus::Success,
            info_length: 0,
            vendor_id: 0x12_3456,
            qpn: 0x42,
            service_id: 0x0000_0000_0111_1234,
            qkey: 0x1234_5678,
            info: [0; INFO_LEN],
            private_data: [0; PRIVATE_DATA_LEN],
        }
    }

    fn bytes() -> [u8; CM_DATA_LEN] {
        let mut b = [0u8; CM_DATA_LEN];
        b[..24].copy_from_slice(&[
            0xde, 0xad, 0xbe, 0xef, 0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x42, 0x56, 0, 0, 0, 0,
            0x01, 0x11, 0x12, 0x34, 0x12, 0x34, 0x56, 0x78,
        ]);
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
        assert_eq!(Packet::new_checked(&bytes()[..96]), Err(Error));
    }

    #[test]
    fn bad_field() {
        let mut b = bytes();
        b[4] = 9;
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.status, SidrStatus::Unknown(9));
    }
}
