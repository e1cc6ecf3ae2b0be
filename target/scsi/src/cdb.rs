//! CDB codecs (SPC-4 4.2, SBC-4 5): a zero-copy view over the CDB bytes with named byte
//! ranges per command family, and parsers into typed requests.
//!
//! Panic contract: [`Cdb::new_checked`] verifies the length against the command's CDB length;
//! after that no accessor on fields inside that length panics. The dispatcher pads every
//! CDB to [`MAX_CDB_LEN`] bytes, so the parsers below index freely within it.

use std::ops::Range;

use super::sense::Sense;

pub type Field = Range<usize>;

/// Longest CDB the engine decodes (16-byte CDBs; 32-byte variable-length CDBs are refused).
pub const MAX_CDB_LEN: usize = 16;

/// The CDB is shorter than its operation code requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated;

/// A CDB view.
#[derive(Debug, Clone, Copy)]
pub struct Cdb<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Cdb<T> {
    pub fn new_unchecked(buffer: T) -> Cdb<T> {
        Cdb { buffer }
    }

    /// Checks that the buffer holds at least `len` bytes (the opcode's CDB length).
    pub fn new_checked(buffer: T, len: usize) -> Result<Cdb<T>, Truncated> {
        if buffer.as_ref().len() < len {
            return Err(Truncated);
        }
        Ok(Cdb { buffer })
    }

    pub fn opcode(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    pub fn byte(&self, i: usize) -> u8 {
        self.buffer.as_ref()[i]
    }

    pub fn bit(&self, i: usize, mask: u8) -> bool {
        self.byte(i) & mask != 0
    }

    /// Big-endian unsigned integer in `field` (at most 8 bytes).
    pub fn be(&self, field: Field) -> u64 {
        be(&self.buffer.as_ref()[field])
    }

    pub fn bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// Big-endian integer of up to 8 bytes.
pub fn be(b: &[u8]) -> u64 {
    b.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
}

pub fn put_be16(b: &mut [u8], v: u16) {
    b[..2].copy_from_slice(&v.to_be_bytes());
}

pub fn put_be32(b: &mut [u8], v: u32) {
    b[..4].copy_from_slice(&v.to_be_bytes());
}

pub fn put_be64(b: &mut [u8], v: u64) {
    b[..8].copy_from_slice(&v.to_be_bytes());
}

/// Byte ranges of the LBA-addressed CDBs (SBC-4 5.x).
pub mod field {
    use super::Field;

    /// Flags byte (RDPROTECT/WRPROTECT, DPO, FUA, BYTCHK, IMMED, ...).
    pub const FLAGS: usize = 1;

    pub mod rw6 {
        use super::Field;
        pub const LBA: Field = 1..4;
        pub const LEN: Field = 4..5;
    }
    pub mod rw10 {
        use super::Field;
        pub const LBA: Field = 2..6;
        pub const LEN: Field = 7..9;
    }
    pub mod rw12 {
        use super::Field;
        pub const LBA: Field = 2..6;
        pub const LEN: Field = 6..10;
    }
    pub mod rw16 {
        use super::Field;
        pub const LBA: Field = 2..10;
        pub const LEN: Field = 10..14;
    }
    /// COMPARE AND WRITE (SBC-4 5.3).
    pub mod caw {
        use super::Field;
        pub const LBA: Field = 2..10;
        pub const LEN: Field = 13..14;
    }
    /// WRITE ATOMIC(16) (SBC-4 5.48).
    pub mod atomic16 {
        use super::Field;
        pub const LBA: Field = 2..10;
        pub const BOUNDARY: Field = 10..12;
        pub const LEN: Field = 12..14;
    }

    /// Allocation / parameter list length positions of the SPC commands.
    pub const INQUIRY_ALLOC: Field = 3..5;
    pub const ALLOC6: Field = 4..5;
    pub const ALLOC10: Field = 7..9;
    pub const ALLOC12: Field = 6..10;
    pub const ALLOC16: Field = 10..14;
    pub const PR_PARAM_LEN: Field = 5..9;
    /// MODE SELECT(10), UNMAP, SANITIZE.
    pub const PARAM_LEN10: Field = 7..9;
    pub const XCOPY_PARAM_LEN: Field = 10..14;
}

/// Where a command keeps its LBA and transfer length.
#[derive(Debug, Clone)]
pub struct LbaLayout {
    pub lba: Field,
    pub len: Field,
    /// READ(6)/WRITE(6): LBA is 21 bits and a length of 0 means 256 blocks.
    pub six: bool,
}

impl LbaLayout {
    pub const RW6: LbaLayout = LbaLayout {
        lba: field::rw6::LBA,
        len: field::rw6::LEN,
        six: true,
    };
    pub const RW10: LbaLayout = LbaLayout {
        lba: field::rw10::LBA,
        len: field::rw10::LEN,
        six: false,
    };
    pub const RW12: LbaLayout = LbaLayout {
        lba: field::rw12::LBA,
        len: field::rw12::LEN,
        six: false,
    };
    pub const RW16: LbaLayout = LbaLayout {
        lba: field::rw16::LBA,
        len: field::rw16::LEN,
        six: false,
    };
    pub const CAW: LbaLayout = LbaLayout {
        lba: field::caw::LBA,
        len: field::caw::LEN,
        six: false,
    };
    pub const ATOMIC16: LbaLayout = LbaLayout {
        lba: field::atomic16::LBA,
        len: field::atomic16::LEN,
        six: false,
    };

    /// Layout for a READ/WRITE/VERIFY-style opcode by CDB group.
    pub fn for_len(cdb_len: usize) -> LbaLayout {
        match cdb_len {
            6 => LbaLayout::RW6,
            10 => LbaLayout::RW10,
            12 => LbaLayout::RW12,
            _ => LbaLayout::RW16,
        }
    }
}

/// The common part of every LBA-addressed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbaReq {
    pub lba: u64,
    pub blocks: u32,
    /// Flags byte (byte 1), 0 for 6-byte CDBs.
    pub flags: u8,
    /// Where the transfer length lives, for sense field pointers.
    pub len_field: Field,
}

impl LbaReq {
    pub fn parse<T: AsRef<[u8]>>(cdb: &Cdb<T>, layout: &LbaLayout) -> LbaReq {
        if layout.six {
            let lba = cdb.be(layout.lba.clone()) & 0x1f_ffff;
            let len = cdb.be(layout.len.clone()) as u32;
            LbaReq {
                lba,
                blocks: if len == 0 { 256 } else { len },
                flags: 0,
                len_field: layout.len.clone(),
            }
        } else {
            LbaReq {
                lba: cdb.be(layout.lba.clone()),
                blocks: cdb.be(layout.len.clone()) as u32,
                flags: cdb.byte(field::FLAGS),
                len_field: layout.len.clone(),
            }
        }
    }

    pub fn dpo(&self) -> bool {
        self.flags & 0x10 != 0
    }

    pub fn fua(&self) -> bool {
        self.flags & 0x08 != 0
    }

    /// BYTCHK of VERIFY / WRITE AND VERIFY (SBC-4 5.33, 5.44).
    pub fn bytchk(&self) -> u8 {
        (self.flags >> 1) & 0x03
    }

    /// IMMED of PRE-FETCH / SYNCHRONIZE CACHE.
    pub fn immed(&self) -> bool {
        self.flags & 0x02 != 0
    }

    /// Checks LBA + length against the capacity (SBC-4 4.5): LBA OUT OF RANGE.
    pub fn check_range(&self, num_blocks: u64) -> Result<(), Sense> {
        match self.lba.checked_add(u64::from(self.blocks)) {
            Some(end) if end <= num_blocks => Ok(()),
            _ => Err(Sense::lba_out_of_range()),
        }
    }

    /// Sense pointing at the transfer length field.
    pub fn bad_len(&self) -> Sense {
        Sense::invalid_cdb(self.len_field.start, None)
    }
}

/// WRITE SAME(10/16) (SBC-4 5.50, 5.51).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteSameReq {
    pub req: LbaReq,
    pub anchor: bool,
    pub unmap: bool,
    pub ndob: bool,
}

impl WriteSameReq {
    pub fn parse<T: AsRef<[u8]>>(cdb: &Cdb<T>, sixteen: bool) -> WriteSameReq {
        let req = LbaReq::parse(
            cdb,
            if sixteen {
                &LbaLayout::RW16
            } else {
                &LbaLayout::RW10
            },
        );
        let f = req.flags;
        WriteSameReq {
            anchor: f & 0x10 != 0,
            unmap: f & 0x08 != 0,
            ndob: sixteen && f & 0x01 != 0,
            req,
        }
    }
}

/// Allocation length helpers.
pub fn alloc_len<T: AsRef<[u8]>>(cdb: &Cdb<T>, f: Field) -> u32 {
    cdb.be(f) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_read10() {
        let mut b = [0xa5u8; 16];
        b[..10].copy_from_slice(&[0x28, 0x18, 0, 0, 0x12, 0x34, 0, 0x01, 0x00, 0]);
        let cdb = Cdb::new_checked(&b[..], 10).unwrap();
        let r = LbaReq::parse(&cdb, &LbaLayout::RW10);
        assert_eq!(r.lba, 0x1234);
        assert_eq!(r.blocks, 256);
        assert!(r.dpo() && r.fua());
        assert_eq!(r.len_field, 7..9);
    }

    #[test]
    fn parse_read6_zero_is_256() {
        let b = [0x08u8, 0xff, 0xff, 0xff, 0, 0];
        let cdb = Cdb::new_checked(&b[..], 6).unwrap();
        let r = LbaReq::parse(&cdb, &LbaLayout::RW6);
        assert_eq!(r.lba, 0x1f_ffff);
        assert_eq!(r.blocks, 256);
        assert_eq!(r.flags, 0);
    }

    #[test]
    fn parse_rw16_and_range() {
        let mut b = [0u8; 16];
        b[0] = 0x88;
        b[2..10].copy_from_slice(&u64::MAX.to_be_bytes());
        b[13] = 1;
        let cdb = Cdb::new_checked(&b[..], 16).unwrap();
        let r = LbaReq::parse(&cdb, &LbaLayout::RW16);
        assert_eq!(r.blocks, 1);
        assert!(r.check_range(100).is_err());
        let r = LbaReq {
            lba: 99,
            blocks: 1,
            flags: 0,
            len_field: 10..14,
        };
        assert!(r.check_range(100).is_ok());
        let r = LbaReq { blocks: 2, ..r };
        assert_eq!(r.check_range(100), Err(Sense::lba_out_of_range()));
        let r = LbaReq {
            lba: 100,
            blocks: 0,
            ..r
        };
        assert!(r.check_range(100).is_ok());
        let r = LbaReq { lba: 101, ..r };
        assert!(r.check_range(100).is_err());
    }

    #[test]
    fn truncated() {
        assert!(Cdb::new_checked(&[0x28u8, 0, 0][..], 10).is_err());
    }

    #[test]
    fn parse_write_same16() {
        let mut b = [0u8; 16];
        b[0] = 0x93;
        b[1] = 0x19;
        b[13] = 8;
        let cdb = Cdb::new_checked(&b[..], 16).unwrap();
        let w = WriteSameReq::parse(&cdb, true);
        assert!(w.anchor && w.unmap && w.ndob);
        assert_eq!(w.req.blocks, 8);
        let mut b10 = [0u8; 16];
        b10[0] = 0x41;
        b10[1] = 0x01;
        let cdb = Cdb::new_checked(&b10[..], 10).unwrap();
        assert!(!WriteSameReq::parse(&cdb, false).ndob);
    }

    #[test]
    fn be_helpers() {
        let mut b = [0u8; 8];
        put_be64(&mut b, 0x0102_0304_0506_0708);
        assert_eq!(be(&b), 0x0102_0304_0506_0708);
        put_be32(&mut b, 0xdead_beef);
        assert_eq!(be(&b[..4]), 0xdead_beef);
        put_be16(&mut b, 0x1234);
        assert_eq!(be(&b[..2]), 0x1234);
    }
}
