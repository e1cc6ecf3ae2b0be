//! APR, alternate path response (IBA 12.8.2 Table 116; `ibta_vol1_c12.h` `CM_APR_*`): local
//! comm ID @0, remote comm ID @4, additional information length @8, AP status @9, additional
//! information @12 (72 bytes), private data @84 (148 bytes).

use core::fmt;

use super::{AprStatus, CM_DATA_LEN};
use crate::wire::{be, Result};

/// Length of the additional information.
pub const INFO_LEN: usize = 72;
/// Length of the APR private data.
pub const PRIVATE_DATA_LEN: usize = 148;

mod field {
    use crate::wire::Field;

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const INFO_LENGTH: usize = 8;
    pub const STATUS: usize = 9;
    pub const INFO: Field = 12..84;
    pub const PRIVATE_DATA: Field = 84..232;
}

fixed_len_view! {
    /// A read/write view of an APR (the MAD data area).
    pub struct Packet; len = CM_DATA_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn local_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
    }

    pub fn remote_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::REMOTE_COMM_ID])
    }

    pub fn info_length(&self) -> u8 {
        self.buffer.as_ref()[field::INFO_LENGTH]
    }

    pub fn status(&self) -> AprStatus {
        AprStatus::from(self.buffer.as_ref()[field::STATUS])
    }

    pub fn info(&self) -> &[u8] {
        &self.buffer.as_ref()[field::INFO]
    }

    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_local_comm_id(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::LOCAL_COMM_ID], value)
    }

    pub fn set_remote_comm_id(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::REMOTE_COMM_ID], value)
    }

    pub fn set_info_length(&mut self, value: u8) {
        self.buffer.as_mut()[field::INFO_LENGTH] = value
    }

    pub fn set_status(&mut self, value: AprStatus) {
        self.buffer.as_mut()[field::STATUS] = value.into()
    }

    pub fn info_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::INFO]
    }

    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// A decoded APR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub info_length: u8,
    pub status: AprStatus,
    pub info: [u8; INFO_LEN],
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            info_length: packet.info_length(),
            status: packet.status(),
            info: be::array(packet.info()),
            private_data: be::array(packet.private_data()),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet.set_info_length(self.info_length);
        packet.set_status(self.status);
        packet.buffer.as_mut()[10..12].fill(0);
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
            "APR comm={:#010x} remote={:#010x} {:?}",
            self.local_comm_id, self.remote_comm_id, self.status
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    fn repr() -> Repr {
        Repr {
            local_comm_id: 0xa,
            remote_comm_id: 0xb,
            info_length: 0,
            status: AprStatus::Unsupported,
            info: [0; INFO_LEN],
            private_data: [0; PRIVATE_DATA_LEN],
        }
    }

    fn bytes() -> [u8; CM_DATA_LEN] {
        let mut b = [0u8; CM_DATA_LEN];
        b[3] = 0xa;
        b[7] = 0xb;
        b[9] = 2;
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
        assert_eq!(Packet::new_checked(&bytes()[..84]), Err(Error));
    }

    #[test]
    fn bad_field() {
        let mut b = bytes();
        b[9] = 0xee;
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.status, AprStatus::Unknown(0xee));
    }
}
