//! MRA, message receipt acknowledgement (IBA 12.6.6 Table 107; `ibta_vol1_c12.h` `CM_MRA_*`):
//! local comm ID @0, remote comm ID @4, message MRAed @8 \[7:6\], service timeout @9 \[7:3\],
//! private data @10 (222 bytes). Sent to ask the peer for more time than its CM response
//! timeout.

use core::fmt;

use super::{MessageRef, CM_DATA_LEN};
use crate::wire::{be, Result};

/// Length of the MRA private data.
pub const PRIVATE_DATA_LEN: usize = 222;

mod field {
    use crate::wire::{Bits, Field};

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const MESSAGE_MRAED: Bits = Bits::new(8, 0xC0);
    pub const SERVICE_TIMEOUT: Bits = Bits::new(9, 0xF8);
    pub const PRIVATE_DATA: Field = 10..232;
}

fixed_len_view! {
    /// A read/write view of an MRA (the MAD data area).
    pub struct Packet; len = CM_DATA_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn local_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
    }

    pub fn remote_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::REMOTE_COMM_ID])
    }

    /// Which message is acknowledged (REQ, REP or LAP).
    pub fn message_mraed(&self) -> MessageRef {
        MessageRef::from_bits(field::MESSAGE_MRAED.get(self.buffer.as_ref()))
    }

    /// Service timeout (5 bits; 4.096 µs × 2^value).
    pub fn service_timeout(&self) -> u8 {
        field::SERVICE_TIMEOUT.get(self.buffer.as_ref())
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

    /// Sets the message MRAed; the reserved bits of the byte become zero.
    pub fn set_message_mraed(&mut self, value: MessageRef) {
        let b = self.buffer.as_mut();
        b[field::MESSAGE_MRAED.byte] = 0;
        field::MESSAGE_MRAED.set(b, value.bits())
    }

    /// Sets the service timeout; the reserved bits of the byte become zero.
    pub fn set_service_timeout(&mut self, value: u8) {
        let b = self.buffer.as_mut();
        b[field::SERVICE_TIMEOUT.byte] = 0;
        field::SERVICE_TIMEOUT.set(b, value)
    }

    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// A decoded MRA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub message_mraed: MessageRef,
    pub service_timeout: u8,
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            message_mraed: packet.message_mraed(),
            service_timeout: packet.service_timeout(),
            private_data: be::array(packet.private_data()),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet.set_message_mraed(self.message_mraed);
        packet.set_service_timeout(self.service_timeout);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MRA comm={:#010x} remote={:#010x} {:?} timeout={}",
            self.local_comm_id, self.remote_comm_id, self.message_mraed, self.service_timeout
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    fn repr() -> Repr {
        Repr {
            local_comm_id: 0x1122_3344,
            remote_comm_id: 0x5566_7788,
            message_mraed: MessageRef::Rep,
            service_timeout: 21,
            private_data: [0; PRIVATE_DATA_LEN],
        }
    }

    fn bytes() -> [u8; CM_DATA_LEN] {
        let mut b = [0u8; CM_DATA_LEN];
        b[..10].copy_from_slice(&[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x40, 0xa8]);
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
        assert_eq!(Packet::new_checked(&bytes()[..9]), Err(Error));
    }

    #[test]
    fn bad_field() {
        let mut b = bytes();
        b[8] = 0xff; // message 3 (reserved) and reserved bits
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.message_mraed, MessageRef::Reserved);
    }
}
