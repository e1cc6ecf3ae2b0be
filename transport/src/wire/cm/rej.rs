//! REJ, reject (IBA 12.6.7 Table 108; `ibta_vol1_c12.h` `CM_REJ_*`): local comm ID @0, remote
//! comm ID @4, message rejected @8 \[7:6\], reject info length @9 \[7:1\], reason @10 (u16),
//! additional reject information @12 (72 bytes), private data @84 (148 bytes).
//!
//! When Linux rejects a REQ it sends local comm ID 0 and message rejected = REQ (`cm.c`
//! `cm_format_rej`); `rdma_reject` always uses reason 28 (consumer defined).

use core::fmt;

use super::{MessageRef, RejReason, CM_DATA_LEN};
use crate::wire::{be, Result};

/// Length of the additional reject information.
pub const ARI_LEN: usize = 72;
/// Length of the REJ private data.
pub const PRIVATE_DATA_LEN: usize = 148;

mod field {
    use crate::wire::{Bits, Field};

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const MESSAGE_REJECTED: Bits = Bits::new(8, 0xC0);
    pub const REJ_INFO_LEN: Bits = Bits::new(9, 0xFE);
    pub const REASON: Field = 10..12;
    pub const ARI: Field = 12..84;
    pub const PRIVATE_DATA: Field = 84..232;
}

fixed_len_view! {
    /// A read/write view of a REJ (the MAD data area).
    pub struct Packet; len = CM_DATA_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn local_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
    }

    pub fn remote_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::REMOTE_COMM_ID])
    }

    pub fn message_rejected(&self) -> MessageRef {
        MessageRef::from_bits(field::MESSAGE_REJECTED.get(self.buffer.as_ref()))
    }

    /// Number of valid bytes in the ARI (7 bits).
    pub fn rej_info_len(&self) -> u8 {
        field::REJ_INFO_LEN.get(self.buffer.as_ref())
    }

    pub fn reason(&self) -> RejReason {
        RejReason::from(be::u16(&self.buffer.as_ref()[field::REASON]))
    }

    /// Additional reject information (72 bytes, of which `rej_info_len` are meaningful).
    pub fn ari(&self) -> &[u8] {
        &self.buffer.as_ref()[field::ARI]
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

    /// Sets the message rejected; the reserved bits of the byte become zero.
    pub fn set_message_rejected(&mut self, value: MessageRef) {
        let b = self.buffer.as_mut();
        b[field::MESSAGE_REJECTED.byte] = 0;
        field::MESSAGE_REJECTED.set(b, value.bits())
    }

    /// Sets the reject info length; the reserved bit of the byte becomes zero.
    pub fn set_rej_info_len(&mut self, value: u8) {
        let b = self.buffer.as_mut();
        b[field::REJ_INFO_LEN.byte] = 0;
        field::REJ_INFO_LEN.set(b, value)
    }

    pub fn set_reason(&mut self, value: RejReason) {
        be::set_u16(&mut self.buffer.as_mut()[field::REASON], value.into())
    }

    pub fn ari_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::ARI]
    }

    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// A decoded REJ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub message_rejected: MessageRef,
    pub rej_info_len: u8,
    pub reason: RejReason,
    pub ari: [u8; ARI_LEN],
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            message_rejected: packet.message_rejected(),
            rej_info_len: packet.rej_info_len(),
            reason: packet.reason(),
            ari: be::array(packet.ari()),
            private_data: be::array(packet.private_data()),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet.set_message_rejected(self.message_rejected);
        packet.set_rej_info_len(self.rej_info_len);
        packet.set_reason(self.reason);
        packet.ari_mut().copy_from_slice(&self.ari);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "REJ comm={:#010x} remote={:#010x} {:?} reason={:?}",
            self.local_comm_id, self.remote_comm_id, self.message_rejected, self.reason
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    /// A REJ of a REQ as `rdma_reject` sends it, carrying an SRP LOGIN_REJ opcode byte.
    fn repr() -> Repr {
        let mut private_data = [0; PRIVATE_DATA_LEN];
        private_data[0] = 0xc2;
        Repr {
            local_comm_id: 0,
            remote_comm_id: 0xf303_25f4,
            message_rejected: MessageRef::Req,
            rej_info_len: 0,
            reason: RejReason::ConsumerDefined,
            ari: [0; ARI_LEN],
            private_data,
        }
    }

    fn bytes() -> [u8; CM_DATA_LEN] {
        let mut b = [0u8; CM_DATA_LEN];
        b[..12].copy_from_slice(&[0, 0, 0, 0, 0xf3, 0x03, 0x25, 0xf4, 0x00, 0x00, 0x00, 28]);
        b[84] = 0xc2;
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
        let mut r = repr();
        r.message_rejected = MessageRef::Other;
        r.rej_info_len = 0x7f;
        r.reason = RejReason::InvalidMtu;
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(&buf[8..12], &[0x80, 0xfe, 0x00, 26]);
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&bytes()[..200]), Err(Error));
    }

    #[test]
    fn bad_field() {
        let mut b = bytes();
        b[10] = 0x12;
        b[11] = 0x34;
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.reason, RejReason::Unknown(0x1234));
    }
}
