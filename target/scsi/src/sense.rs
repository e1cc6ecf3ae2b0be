//! Sense data (SPC-4 4.5): the error half of every command.
//!
//! Handlers describe a failure as a [`Sense`]; [`Sense::emit`] turns it into fixed-format
//! (response code 70h, SPC-4 4.5.3) or descriptor-format (72h, SPC-4 4.5.2) bytes, the latter
//! when the control mode page has D_SENSE set.

/// Sense keys (SPC-4 Table 28).
pub mod key {
    pub const NO_SENSE: u8 = 0x0;
    pub const NOT_READY: u8 = 0x2;
    pub const MEDIUM_ERROR: u8 = 0x3;
    pub const HARDWARE_ERROR: u8 = 0x4;
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    pub const UNIT_ATTENTION: u8 = 0x6;
    pub const DATA_PROTECT: u8 = 0x7;
    pub const COPY_ABORTED: u8 = 0xA;
    pub const ABORTED_COMMAND: u8 = 0xB;
    pub const MISCOMPARE: u8 = 0xE;
}

/// Additional sense code and qualifier pairs used by the engine (SPC-4 Annex D).
pub mod asc {
    pub type Code = (u8, u8);
    pub const NO_ADDITIONAL: Code = (0x00, 0x00);
    /// LOGICAL UNIT NOT READY, CAUSE NOT REPORTABLE.
    pub const NOT_READY_CAUSE_NOT_REPORTABLE: Code = (0x04, 0x00);
    pub const NOT_READY_INIT_REQUIRED: Code = (0x04, 0x02);
    /// LOGICAL UNIT NOT ACCESSIBLE, ASYMMETRIC ACCESS STATE TRANSITION.
    pub const ALUA_TRANSITION: Code = (0x04, 0x0A);
    /// LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE.
    pub const ALUA_STANDBY: Code = (0x04, 0x0B);
    /// LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE.
    pub const ALUA_UNAVAILABLE: Code = (0x04, 0x0C);
    /// LOGICAL UNIT NOT READY, OFFLINE.
    pub const LU_OFFLINE: Code = (0x04, 0x12);
    pub const SANITIZE_IN_PROGRESS: Code = (0x04, 0x1B);
    pub const NOT_READY_TO_READY_CHANGE: Code = (0x28, 0x00);
    pub const SANITIZE_COMMAND_FAILED: Code = (0x31, 0x03);
    pub const MEDIUM_NOT_PRESENT: Code = (0x3A, 0x00);
    pub const UNREACHABLE_COPY_TARGET: Code = (0x08, 0x04);
    pub const WRITE_ERROR: Code = (0x0C, 0x00);
    pub const COPY_TARGET_NOT_REACHABLE: Code = (0x0D, 0x02);
    pub const UNRECOVERED_READ_ERROR: Code = (0x11, 0x00);
    pub const PARAMETER_LIST_LENGTH_ERROR: Code = (0x1A, 0x00);
    pub const MISCOMPARE_DURING_VERIFY: Code = (0x1D, 0x00);
    pub const INVALID_OPCODE: Code = (0x20, 0x00);
    pub const LBA_OUT_OF_RANGE: Code = (0x21, 0x00);
    pub const INVALID_FIELD_IN_CDB: Code = (0x24, 0x00);
    pub const LU_NOT_SUPPORTED: Code = (0x25, 0x00);
    pub const INVALID_FIELD_IN_PARAM_LIST: Code = (0x26, 0x00);
    pub const INVALID_RELEASE_OF_PR: Code = (0x26, 0x04);
    pub const TOO_MANY_TARGET_DESCRIPTORS: Code = (0x26, 0x06);
    pub const UNSUPPORTED_TARGET_DESCRIPTOR: Code = (0x26, 0x07);
    pub const TOO_MANY_SEGMENT_DESCRIPTORS: Code = (0x26, 0x08);
    pub const UNSUPPORTED_SEGMENT_DESCRIPTOR: Code = (0x26, 0x09);
    pub const WRITE_PROTECTED: Code = (0x27, 0x00);
    pub const SOFTWARE_WRITE_PROTECTED: Code = (0x27, 0x02);
    pub const POWER_ON_RESET: Code = (0x29, 0x00);
    pub const BUS_DEVICE_RESET: Code = (0x29, 0x03);
    pub const IT_NEXUS_LOSS: Code = (0x29, 0x07);
    pub const COMMANDS_CLEARED: Code = (0x2F, 0x00);
    pub const INVALID_MESSAGE: Code = (0x49, 0x00);
    pub const MODE_PARAMETERS_CHANGED: Code = (0x2A, 0x01);
    pub const RESERVATIONS_PREEMPTED: Code = (0x2A, 0x03);
    pub const RESERVATIONS_RELEASED: Code = (0x2A, 0x04);
    pub const REGISTRATIONS_PREEMPTED: Code = (0x2A, 0x05);
    pub const CAPACITY_DATA_CHANGED: Code = (0x2A, 0x09);
    pub const ASYMMETRIC_ACCESS_STATE_CHANGED: Code = (0x2A, 0x06);
    pub const SAVING_PARAMS_NOT_SUPPORTED: Code = (0x39, 0x00);
    pub const REPORTED_LUNS_CHANGED: Code = (0x3F, 0x0E);
    pub const INQUIRY_DATA_CHANGED: Code = (0x3F, 0x03);
    pub const INTERNAL_TARGET_FAILURE: Code = (0x44, 0x00);
    pub const MEDIUM_REMOVAL_PREVENTED: Code = (0x53, 0x02);
    pub const INSUFFICIENT_REGISTRATION_RESOURCES: Code = (0x55, 0x04);
}

/// Length of fixed-format sense data as emitted (SPC-4 4.5.3).
pub const FIXED_LEN: usize = 18;

/// Sense-key specific information (SPC-4 4.5.2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySpecific {
    /// Field pointer for ILLEGAL REQUEST: byte (and optionally bit) of the CDB (`cdb = true`)
    /// or of the parameter list in error.
    Field {
        cdb: bool,
        byte: u16,
        bit: Option<u8>,
    },
    /// Segment pointer for COPY ABORTED (SPC-4 4.5.2.4.5): byte offset of the segment
    /// descriptor in the parameter list.
    Segment { byte: u16 },
    /// Progress indication (SPC-4 4.5.2.4.4) for NOT READY / NO SENSE: the fraction of the
    /// operation completed, in units of 1/65536.
    Progress(u16),
}

impl KeySpecific {
    fn bytes(self) -> [u8; 3] {
        match self {
            KeySpecific::Field { cdb, byte, bit } => {
                let mut b0 = 0x80;
                if cdb {
                    b0 |= 0x40;
                }
                if let Some(bit) = bit {
                    b0 |= 0x08 | (bit & 0x07);
                }
                let [hi, lo] = byte.to_be_bytes();
                [b0, hi, lo]
            }
            KeySpecific::Segment { byte } => {
                // SD = 1: the pointer is to a segment descriptor.
                let [hi, lo] = byte.to_be_bytes();
                [0x80 | 0x20, hi, lo]
            }
            KeySpecific::Progress(p) => {
                let [hi, lo] = p.to_be_bytes();
                [0x80, hi, lo]
            }
        }
    }
}

/// One sense condition, before it is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
    /// INFORMATION field (VALID bit set when present).
    pub info: Option<u64>,
    /// COMMAND-SPECIFIC INFORMATION field.
    pub cmd_info: Option<u64>,
    pub key_specific: Option<KeySpecific>,
}

impl Sense {
    pub const fn new(key: u8, code: asc::Code) -> Sense {
        Sense {
            key,
            asc: code.0,
            ascq: code.1,
            info: None,
            cmd_info: None,
            key_specific: None,
        }
    }

    pub const fn illegal(code: asc::Code) -> Sense {
        Sense::new(key::ILLEGAL_REQUEST, code)
    }

    /// INVALID FIELD IN CDB pointing at `byte` (and `bit`, when the field does not start
    /// at bit 7 of the byte or a single bit is meant).
    pub fn invalid_cdb(byte: usize, bit: Option<u8>) -> Sense {
        Sense {
            key_specific: Some(KeySpecific::Field {
                cdb: true,
                byte: byte as u16,
                bit,
            }),
            ..Sense::illegal(asc::INVALID_FIELD_IN_CDB)
        }
    }

    /// INVALID FIELD IN PARAMETER LIST pointing at `byte` (`bit`) of the parameter list.
    pub fn invalid_param(byte: usize, bit: Option<u8>) -> Sense {
        Sense {
            key_specific: Some(KeySpecific::Field {
                cdb: false,
                byte: byte.min(u16::MAX as usize) as u16,
                bit,
            }),
            ..Sense::illegal(asc::INVALID_FIELD_IN_PARAM_LIST)
        }
    }

    pub const fn invalid_opcode() -> Sense {
        Sense::illegal(asc::INVALID_OPCODE)
    }

    pub const fn lba_out_of_range() -> Sense {
        Sense::illegal(asc::LBA_OUT_OF_RANGE)
    }

    pub const fn param_list_length() -> Sense {
        Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR)
    }

    pub const fn write_protected() -> Sense {
        Sense::new(key::DATA_PROTECT, asc::WRITE_PROTECTED)
    }

    /// MISCOMPARE DURING VERIFY OPERATION with the byte offset of the first difference in
    /// the INFORMATION field (SBC-4 5.3, 5.34).
    pub const fn miscompare(offset: u64) -> Sense {
        Sense {
            info: Some(offset),
            ..Sense::new(key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY)
        }
    }

    pub const fn unit_attention(code: asc::Code) -> Sense {
        Sense::new(key::UNIT_ATTENTION, code)
    }

    pub const fn internal_failure() -> Sense {
        Sense::new(key::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE)
    }

    pub fn with_info(mut self, info: u64) -> Sense {
        self.info = Some(info);
        self
    }

    pub fn with_key_specific(mut self, ks: KeySpecific) -> Sense {
        self.key_specific = Some(ks);
        self
    }

    /// Encoded length in the chosen format.
    pub fn buffer_len(&self, descriptor: bool) -> usize {
        if !descriptor {
            return FIXED_LEN;
        }
        let mut n = 8;
        if self.info.is_some() {
            n += 12;
        }
        if self.cmd_info.is_some() {
            n += 12;
        }
        if self.key_specific.is_some() {
            n += 8;
        }
        n
    }

    /// Encodes the sense data; `descriptor` selects descriptor format (D_SENSE).
    pub fn emit(&self, descriptor: bool) -> Vec<u8> {
        let mut b = vec![0u8; self.buffer_len(descriptor)];
        if descriptor {
            b[0] = 0x72;
            b[1] = self.key & 0x0f;
            b[2] = self.asc;
            b[3] = self.ascq;
            b[7] = (b.len() - 8) as u8;
            let mut p = 8;
            if let Some(info) = self.info {
                b[p] = 0x00;
                b[p + 1] = 0x0a;
                b[p + 2] = 0x80;
                b[p + 4..p + 12].copy_from_slice(&info.to_be_bytes());
                p += 12;
            }
            if let Some(ci) = self.cmd_info {
                b[p] = 0x01;
                b[p + 1] = 0x0a;
                b[p + 4..p + 12].copy_from_slice(&ci.to_be_bytes());
                p += 12;
            }
            if let Some(ks) = self.key_specific {
                b[p] = 0x02;
                b[p + 1] = 0x06;
                b[p + 4..p + 7].copy_from_slice(&ks.bytes());
            }
        } else {
            b[0] = 0x70;
            b[2] = self.key & 0x0f;
            if let Some(info) = self.info {
                // The 4-byte INFORMATION field is valid only if the value fits.
                if let Ok(v) = u32::try_from(info) {
                    b[0] |= 0x80;
                    b[3..7].copy_from_slice(&v.to_be_bytes());
                }
            }
            b[7] = (FIXED_LEN - 8) as u8;
            if let Some(ci) = self.cmd_info {
                b[8..12].copy_from_slice(&(ci as u32).to_be_bytes());
            }
            b[12] = self.asc;
            b[13] = self.ascq;
            if let Some(ks) = self.key_specific {
                b[15..18].copy_from_slice(&ks.bytes());
            }
        }
        b
    }

    /// Parses the key/ASC/ASCQ of fixed or descriptor sense data (used by tests and by
    /// EXTENDED COPY to report copy target failures).
    pub fn parse(b: &[u8]) -> Option<(u8, u8, u8)> {
        match b.first()? & 0x7f {
            0x70 | 0x71 if b.len() >= 14 => Some((b[2] & 0x0f, b[12], b[13])),
            0x72 | 0x73 if b.len() >= 4 => Some((b[1] & 0x0f, b[2], b[3])),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emit_fixed_invalid_cdb() {
        let s = Sense::invalid_cdb(1, Some(4));
        let b = s.emit(false);
        assert_eq!(
            b,
            [
                0x70,
                0,
                0x05,
                0,
                0,
                0,
                0,
                10,
                0,
                0,
                0,
                0,
                0x24,
                0x00,
                0,
                0xc8 | 4,
                0,
                1
            ]
        );
    }

    #[test]
    fn emit_fixed_miscompare_info() {
        let b = Sense::miscompare(0x1234).emit(false);
        assert_eq!(b[0], 0xf0);
        assert_eq!(&b[3..7], &[0, 0, 0x12, 0x34]);
        assert_eq!(b[2], key::MISCOMPARE);
        assert_eq!((b[12], b[13]), (0x1d, 0x00));
    }

    #[test]
    fn emit_fixed_info_too_large_clears_valid() {
        let b = Sense::miscompare(1 << 40).emit(false);
        assert_eq!(b[0], 0x70);
        assert_eq!(&b[3..7], &[0, 0, 0, 0]);
    }

    #[test]
    fn emit_descriptor() {
        let s = Sense::invalid_param(300, None).with_info(7);
        let b = s.emit(true);
        assert_eq!(b.len(), 8 + 12 + 8);
        assert_eq!(&b[..8], &[0x72, 0x05, 0x26, 0x00, 0, 0, 0, 20]);
        assert_eq!(&b[8..12], &[0x00, 0x0a, 0x80, 0]);
        assert_eq!(&b[12..20], &7u64.to_be_bytes());
        assert_eq!(&b[20..28], &[0x02, 0x06, 0, 0, 0x80, 0x01, 0x2c, 0]);
        assert_eq!(Sense::parse(&b), Some((5, 0x26, 0)));
    }

    #[test]
    fn parse_truncated() {
        assert_eq!(Sense::parse(&[]), None);
        assert_eq!(Sense::parse(&[0x70, 0, 5]), None);
        assert_eq!(Sense::parse(&[0x12; 20]), None);
    }

    #[test]
    fn segment_pointer() {
        let b = Sense::new(key::COPY_ABORTED, asc::NO_ADDITIONAL)
            .with_key_specific(KeySpecific::Segment { byte: 48 })
            .emit(false);
        assert_eq!(&b[15..18], &[0xa0, 0, 48]);
    }

    #[test]
    fn progress_indication() {
        let s = Sense::new(key::NOT_READY, asc::SANITIZE_IN_PROGRESS)
            .with_key_specific(KeySpecific::Progress(0x8000));
        assert_eq!(&s.emit(false)[15..18], &[0x80, 0x80, 0x00]);
        let d = s.emit(true);
        assert_eq!(&d[8..16], &[0x02, 0x06, 0, 0, 0x80, 0x80, 0x00, 0]);
    }
}
