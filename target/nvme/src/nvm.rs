//! The NVM command set (NVMe NVM Command Set 1.0): I/O opcodes and the fields of the
//! commands a namespace serves.

use crate::le32;
use crate::le64;
use crate::sqe::Sqe;

/// I/O opcodes.
pub mod opcode {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const COMPARE: u8 = 0x05;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    pub const VERIFY: u8 = 0x0c;
    pub const RESERVATION_REGISTER: u8 = 0x0d;
    pub const RESERVATION_REPORT: u8 = 0x0e;
    pub const RESERVATION_ACQUIRE: u8 = 0x11;
    pub const RESERVATION_RELEASE: u8 = 0x15;
}

/// The block range and flags of Read, Write, Compare, Write Zeroes and Verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rw {
    pub slba: u64,
    /// Number of logical blocks (the field is zero based; this is not).
    pub blocks: u32,
    /// Force unit access.
    pub fua: bool,
    /// Limited retry.
    pub lr: bool,
    /// Write Zeroes: deallocate the blocks.
    pub deac: bool,
}

impl Rw {
    pub fn parse(sqe: &Sqe) -> Rw {
        let c12 = sqe.cdw[2];
        Rw {
            slba: u64::from(sqe.cdw[0]) | u64::from(sqe.cdw[1]) << 32,
            blocks: (c12 & 0xffff) + 1,
            fua: c12 & 1 << 30 != 0,
            lr: c12 & 1 << 31 != 0,
            deac: c12 & 1 << 25 != 0,
        }
    }

    /// CDW10 to CDW12. `blocks` must be 1 to 65536.
    pub fn cdw(&self) -> [u32; 3] {
        [
            self.slba as u32,
            (self.slba >> 32) as u32,
            (self.blocks - 1) & 0xffff
                | u32::from(self.deac) << 25
                | u32::from(self.fua) << 30
                | u32::from(self.lr) << 31,
        ]
    }
}

/// Dataset Management attribute: deallocate (CDW11 bit 2).
pub const DSM_DEALLOCATE: u32 = 1 << 2;
/// Length of one Dataset Management range.
pub const DSM_RANGE_LEN: usize = 16;

/// Dataset Management's range count (CDW10 bits 7:0, zero based) and attributes (CDW11).
pub fn dsm_fields(sqe: &Sqe) -> (usize, u32) {
    (usize::from(sqe.cdw[0] as u8) + 1, sqe.cdw[1])
}

/// One range of Dataset Management: context attributes, blocks, starting LBA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmRange {
    pub cattr: u32,
    pub blocks: u32,
    pub slba: u64,
}

/// The first `count` ranges of `data` (fewer when `data` is shorter).
pub fn dsm_ranges(data: &[u8], count: usize) -> Vec<DsmRange> {
    data.chunks_exact(DSM_RANGE_LEN)
        .take(count)
        .map(|r| DsmRange {
            cattr: le32(r, 0),
            blocks: le32(r, 4),
            slba: le64(r, 8),
        })
        .collect()
}

impl DsmRange {
    pub fn to_bytes(&self) -> [u8; DSM_RANGE_LEN] {
        let mut b = [0u8; DSM_RANGE_LEN];
        b[0..4].copy_from_slice(&self.cattr.to_le_bytes());
        b[4..8].copy_from_slice(&self.blocks.to_le_bytes());
        b[8..16].copy_from_slice(&self.slba.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqe::{Sgl, PSDT_SGL};

    fn sqe(opcode: u8, cdw: [u32; 6]) -> Sqe {
        Sqe {
            opcode,
            flags: PSDT_SGL,
            cid: 1,
            nsid: 1,
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            dptr: Sgl::Transport { len: 0 }.to_bytes(),
            cdw,
        }
    }

    #[test]
    fn read_write_fields() {
        // Linux: a FUA write of 8 blocks at LBA 2^33 + 5 (NLB 7, FUA in the control field).
        let w = Rw::parse(&sqe(opcode::WRITE, [5, 2, 7 | 1 << 30, 0, 0, 0]));
        assert_eq!(
            w,
            Rw {
                slba: (2 << 32) + 5,
                blocks: 8,
                fua: true,
                lr: false,
                deac: false
            }
        );
        let [a, b, c] = w.cdw();
        assert_eq!(Rw::parse(&sqe(opcode::WRITE, [a, b, c, 0, 0, 0])), w);
        let z = Rw::parse(&sqe(
            opcode::WRITE_ZEROES,
            [0, 0, 0xffff | 1 << 25, 0, 0, 0],
        ));
        assert_eq!((z.blocks, z.deac), (65536, true));
    }

    #[test]
    fn dataset_management_ranges() {
        let (n, attr) = dsm_fields(&sqe(opcode::DATASET_MANAGEMENT, [1, 4, 0, 0, 0, 0]));
        assert_eq!((n, attr & DSM_DEALLOCATE), (2, 4));
        let r = [
            DsmRange {
                cattr: 0,
                blocks: 2048,
                slba: 0,
            },
            DsmRange {
                cattr: 0,
                blocks: 8,
                slba: 1 << 40,
            },
        ];
        let mut data: Vec<u8> = r.iter().flat_map(|r| r.to_bytes()).collect();
        assert_eq!(dsm_ranges(&data, 2), r.to_vec());
        assert_eq!(dsm_ranges(&data, 1), r[..1].to_vec());
        data.truncate(20);
        assert_eq!(dsm_ranges(&data, 2), r[..1].to_vec());
    }
}
