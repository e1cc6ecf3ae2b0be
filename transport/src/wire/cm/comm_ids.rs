//! The layout RTU ([`super::rtu`]) and DREP ([`super::drep`]) share: local comm ID @0,
//! remote comm ID @4, private data @8 (224 bytes).

use core::fmt;

use super::CM_DATA_LEN;
use crate::wire::{be, Result};

/// Length of the private data.
pub const PRIVATE_DATA_LEN: usize = 224;

mod field {
    use crate::wire::Field;

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const PRIVATE_DATA: Field = 8..232;
}

fixed_len_view! {
    /// A read/write view of an RTU or a DREP (the MAD data area).
    pub struct Packet; len = CM_DATA_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn local_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
    }

    pub fn remote_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::REMOTE_COMM_ID])
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

    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// A decoded RTU or DREP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            private_data: be::array(packet.private_data()),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "comm={:#010x} remote={:#010x}",
            self.local_comm_id, self.remote_comm_id
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    // The lab capture's iSER RTU (frame 17); its DREP (frame 699) has the same bytes.
    fn bytes() -> [u8; CM_DATA_LEN] {
        let mut b = [0u8; CM_DATA_LEN];
        b[..8].copy_from_slice(&[0xf2, 0x03, 0x25, 0xf4, 0x88, 0xd8, 0x05, 0x19]);
        b
    }

    #[test]
    fn parse() {
        let b = bytes();
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(
            (r.local_comm_id, r.remote_comm_id),
            (0xf203_25f4, 0x88d8_0519)
        );
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
        assert_eq!(Packet::new_checked(&bytes()[..100]), Err(Error));
    }

    #[test]
    fn bad_field() {
        // No field can be malformed; private data is opaque.
        let b = [0xffu8; CM_DATA_LEN];
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.private_data, [0xff; PRIVATE_DATA_LEN]);
    }
}
