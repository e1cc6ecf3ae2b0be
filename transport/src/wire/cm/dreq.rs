//! DREQ, request for communication release (IBA 12.6.10 Table 112; `ibta_vol1_c12.h`
//! `CM_DREQ_*`): local comm ID @0, remote comm ID @4, remote QPN/EECN @8 (24 bits), private
//! data @12 (220 bytes). The Linux CM ignores a DREQ whose remote QPN is not its QP's.

use core::fmt;

use super::CM_DATA_LEN;
use crate::wire::{be, Result, U24_MASK};

/// Length of the DREQ private data.
pub const PRIVATE_DATA_LEN: usize = 220;

mod field {
    use crate::wire::Field;

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const REMOTE_QPN: Field = 8..11;
    pub const PRIVATE_DATA: Field = 12..232;
}

fixed_len_view! {
    /// A read/write view of a DREQ (the MAD data area).
    pub struct Packet; len = CM_DATA_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn local_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
    }

    pub fn remote_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::REMOTE_COMM_ID])
    }

    /// The receiver's QPN (or EECN).
    pub fn remote_qpn(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::REMOTE_QPN])
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

    /// Sets the remote QPN and clears the reserved byte after it.
    pub fn set_remote_qpn(&mut self, value: u32) {
        let b = self.buffer.as_mut();
        be::set_u24(&mut b[field::REMOTE_QPN], value);
        b[field::REMOTE_QPN.end] = 0;
    }

    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// A decoded DREQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub remote_qpn: u32,
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            remote_qpn: packet.remote_qpn(),
            private_data: be::array(packet.private_data()),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet.set_remote_qpn(self.remote_qpn & U24_MASK);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DREQ comm={:#010x} remote={:#010x} qpn={:#x}",
            self.local_comm_id, self.remote_comm_id, self.remote_qpn
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    // The lab capture's iSER DREQ (frame 698), sent by the target.
    fn bytes() -> [u8; CM_DATA_LEN] {
        let mut b = [0u8; CM_DATA_LEN];
        b[..12].copy_from_slice(&[
            0x88, 0xd8, 0x05, 0x19, 0xf2, 0x03, 0x25, 0xf4, 0x00, 0x00, 0x11, 0x00,
        ]);
        b
    }

    #[test]
    fn parse() {
        let b = bytes();
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.local_comm_id, 0x88d8_0519);
        assert_eq!(r.remote_comm_id, 0xf203_25f4);
        assert_eq!(r.remote_qpn, 0x11);
    }

    #[test]
    fn emit() {
        let b = bytes();
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        let mut buf = [0xa5u8; CM_DATA_LEN];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, b);
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&bytes()[..12]), Err(Error));
    }

    #[test]
    fn bad_field() {
        // The reserved byte after the QPN is ignored.
        let mut b = bytes();
        b[11] = 0xff;
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.remote_qpn, 0x11);
    }
}
