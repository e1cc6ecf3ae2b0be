//! SIDR_REQ, service ID resolution request (IBA 12.11.1 Table 119; `ibta_vol1_c12.h`
//! `CM_SIDR_REQ_*`): request ID @0, P_Key @4, service ID @8, private data @16 (216 bytes).
//! rdma_cm uses it to resolve UD services (RDMA_PS_UDP, RDMA_PS_IPOIB).

use core::fmt;

use super::CM_DATA_LEN;
use crate::wire::{be, Result};

/// Length of the SIDR_REQ private data.
pub const PRIVATE_DATA_LEN: usize = 216;

mod field {
    use crate::wire::Field;

    pub const REQUEST_ID: Field = 0..4;
    pub const PKEY: Field = 4..6;
    pub const SERVICE_ID: Field = 8..16;
    pub const PRIVATE_DATA: Field = 16..232;
}

fixed_len_view! {
    /// A read/write view of a SIDR_REQ (the MAD data area).
    pub struct Packet; len = CM_DATA_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn request_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::REQUEST_ID])
    }

    pub fn pkey(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::PKEY])
    }

    pub fn service_id(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::SERVICE_ID])
    }

    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_request_id(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::REQUEST_ID], value)
    }

    /// Sets the P_Key and clears the two reserved bytes after it.
    pub fn set_pkey(&mut self, value: u16) {
        let b = self.buffer.as_mut();
        be::set_u16(&mut b[field::PKEY], value);
        b[field::PKEY.end..field::SERVICE_ID.start].fill(0);
    }

    pub fn set_service_id(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::SERVICE_ID], value)
    }

    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// A decoded SIDR_REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub request_id: u32,
    pub pkey: u16,
    pub service_id: u64,
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            request_id: packet.request_id(),
            pkey: packet.pkey(),
            service_id: packet.service_id(),
            private_data: be::array(packet.private_data()),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_request_id(self.request_id);
        packet.set_pkey(self.pkey);
        packet.set_service_id(self.service_id);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SIDR_REQ id={:#010x} pkey={:#06x} sid={:#018x}",
            self.request_id, self.pkey, self.service_id
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
            pkey: 0xffff,
            service_id: 0x0000_0000_0111_1234,
            private_data: [0; PRIVATE_DATA_LEN],
        }
    }

    fn bytes() -> [u8; CM_DATA_LEN] {
        let mut b = [0u8; CM_DATA_LEN];
        b[..16].copy_from_slice(&[
            0xde, 0xad, 0xbe, 0xef, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0x01, 0x11, 0x12, 0x34,
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
        assert_eq!(Packet::new_checked(&bytes()[..16]), Err(Error));
    }

    #[test]
    fn bad_field() {
        let mut b = bytes();
        b[6] = 0xff; // reserved
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            repr()
        );
    }
}
