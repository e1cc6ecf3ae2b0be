//! ACK Extended Transport Header (IBA 9.3.8; `rxe_hdr.h` `struct rxe_aeth`), 4 bytes:
//! syndrome (u8) and MSN (24 bits).
//!
//! The syndrome (IBA 9.7.5.2, Table 43; `rxe_hdr.h` `enum aeth_syndrome`): bit 7 reserved,
//! bits \[6:5\] the type (00 ACK, 01 RNR NAK, 11 NAK, 10 reserved), bits \[4:0\] the value: the
//! credit count of an ACK, the timer of an RNR NAK, or the NAK code.

use core::fmt;

use super::{be, Error, Field, Result, U24_MASK};

/// Length of the AETH.
pub const HEADER_LEN: usize = 4;

mod field {
    use super::Field;

    pub const SYNDROME: usize = 0;
    pub const MSN: Field = 1..4;
}

enum_with_unknown! {
    /// NAK codes (IBA 9.7.5.2.4 Table 44; syndromes 0x60..0x64).
    pub enum NakCode(u8) {
        /// PSN sequence error (0x60): the requester retransmits from the NAK's PSN.
        PsnSequenceError = 0,
        /// Invalid request (0x61).
        InvalidRequest = 1,
        /// Remote access error (0x62): R_Key or bounds.
        RemoteAccessError = 2,
        /// Remote operational error (0x63).
        RemoteOperationalError = 3,
        /// Invalid RD request (0x64); RD only.
        InvalidRdRequest = 4,
    }
}

/// A decoded AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with the encoded credit count (see [`credit_count`]);
    /// [`CREDITS_UNLIMITED`] (0x1F) means "no credit information", which rxe always sends.
    Ack { credits: u8 },
    /// Receiver not ready; the timer is the encoded minimum wait (see [`rnr_timer_micros`]).
    RnrNak { timer: u8 },
    /// Negative acknowledgement.
    Nak(NakCode),
}

/// The ACK credit code for "unlimited / invalid" (rxe's `AETH_ACK_UNLIMITED`).
pub const CREDITS_UNLIMITED: u8 = 0x1F;

const TYPE_MASK: u8 = 0x60;
const VALUE_MASK: u8 = 0x1F;
const TYPE_ACK: u8 = 0x00;
const TYPE_RNR_NAK: u8 = 0x20;
const TYPE_NAK: u8 = 0x60;

impl Syndrome {
    /// The ACK rxe sends: syndrome 0x1F.
    pub const ACK_UNLIMITED: Syndrome = Syndrome::Ack {
        credits: CREDITS_UNLIMITED,
    };

    /// Decodes a syndrome byte; the reserved bit 7 and the reserved type 10 are errors.
    pub fn from_byte(byte: u8) -> Result<Syndrome> {
        if byte & 0x80 != 0 {
            return Err(Error);
        }
        let value = byte & VALUE_MASK;
        match byte & TYPE_MASK {
            TYPE_ACK => Ok(Syndrome::Ack { credits: value }),
            TYPE_RNR_NAK => Ok(Syndrome::RnrNak { timer: value }),
            TYPE_NAK => Ok(Syndrome::Nak(NakCode::from(value))),
            _ => Err(Error),
        }
    }

    /// Encodes the syndrome; values are truncated to five bits.
    pub fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => TYPE_ACK | (credits & VALUE_MASK),
            Syndrome::RnrNak { timer } => TYPE_RNR_NAK | (timer & VALUE_MASK),
            Syndrome::Nak(code) => TYPE_NAK | (u8::from(code) & VALUE_MASK),
        }
    }

    pub fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

/// The number of receive WQEs an encoded ACK credit count stands for (IBA 9.7.7.2.5 Table 45),
/// or `None` for 0x1F (invalid: no credit information).
pub const fn credit_count(encoded: u8) -> Option<u32> {
    const TABLE: [u32; 31] = [
        0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
        2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
    ];
    let i = (encoded & VALUE_MASK) as usize;
    if i < TABLE.len() {
        Some(TABLE[i])
    } else {
        None
    }
}

/// The minimum RNR wait in microseconds for an encoded RNR NAK timer (IBA 9.7.5.2.8 Table 46;
/// `rxe_comp.c` `rnrnak_usec`): 0 is 655.36 ms, 1 is 10 µs, ... 31 is 491.52 ms.
pub const fn rnr_timer_micros(timer: u8) -> u32 {
    const TABLE: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122_880, 163_840, 245_760,
        327_680, 491_520,
    ];
    TABLE[(timer & VALUE_MASK) as usize]
}

fixed_len_view! {
    /// A read/write view of an AETH.
    pub struct Packet; len = HEADER_LEN
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The raw syndrome byte.
    pub fn syndrome_byte(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }

    /// The decoded syndrome.
    pub fn syndrome(&self) -> Result<Syndrome> {
        Syndrome::from_byte(self.syndrome_byte())
    }

    /// Message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::MSN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_syndrome_byte(&mut self, value: u8) {
        self.buffer.as_mut()[field::SYNDROME] = value
    }

    pub fn set_syndrome(&mut self, value: Syndrome) {
        self.set_syndrome_byte(value.to_byte())
    }

    pub fn set_msn(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::MSN], value)
    }
}

/// The decoded AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub syndrome: Syndrome,
    pub msn: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            syndrome: packet.syndrome()?,
            msn: packet.msn(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_syndrome(self.syndrome);
        packet.set_msn(self.msn & U24_MASK);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AETH {:?} msn={:#x}", self.syndrome, self.msn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // An rxe ACK from the capture: syndrome 0x1F, MSN 2.
    static BYTES: [u8; 4] = [0x1f, 0x00, 0x00, 0x02];

    #[test]
    fn parse() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(
            Repr::parse(&p).unwrap(),
            Repr {
                syndrome: Syndrome::ACK_UNLIMITED,
                msn: 2
            }
        );
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; HEADER_LEN];
        let r = Repr {
            syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
            msn: 0x12_3456,
        };
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, [0x62, 0x12, 0x34, 0x56]);
    }

    #[test]
    fn syndromes() {
        let cases = [
            (0x00, Syndrome::Ack { credits: 0 }),
            (0x1f, Syndrome::ACK_UNLIMITED),
            (0x20, Syndrome::RnrNak { timer: 0 }),
            (0x3f, Syndrome::RnrNak { timer: 31 }),
            (0x60, Syndrome::Nak(NakCode::PsnSequenceError)),
            (0x61, Syndrome::Nak(NakCode::InvalidRequest)),
            (0x62, Syndrome::Nak(NakCode::RemoteAccessError)),
            (0x63, Syndrome::Nak(NakCode::RemoteOperationalError)),
            (0x64, Syndrome::Nak(NakCode::InvalidRdRequest)),
            (0x7f, Syndrome::Nak(NakCode::Unknown(0x1f))),
        ];
        for (byte, s) in cases {
            assert_eq!(Syndrome::from_byte(byte), Ok(s), "{byte:#x}");
            assert_eq!(s.to_byte(), byte);
        }
    }

    #[test]
    fn tables() {
        assert_eq!(credit_count(0), Some(0));
        assert_eq!(credit_count(5), Some(6));
        assert_eq!(credit_count(30), Some(32768));
        assert_eq!(credit_count(CREDITS_UNLIMITED), None);
        assert_eq!(rnr_timer_micros(0), 655_360);
        assert_eq!(rnr_timer_micros(1), 10);
        assert_eq!(rnr_timer_micros(14), 1280);
        assert_eq!(rnr_timer_micros(31), 491_520);
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&BYTES[..3]), Err(Error));
    }

    #[test]
    fn bad_field() {
        for byte in [0x40u8, 0x5f, 0x80, 0x9f, 0xe0] {
            let b = [byte, 0, 0, 1];
            let p = Packet::new_checked(&b[..]).unwrap();
            assert_eq!(Repr::parse(&p), Err(Error), "{byte:#x}");
        }
    }
}
