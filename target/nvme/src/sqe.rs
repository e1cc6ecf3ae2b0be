//! Submission and completion queue entries (NVMe Base 2.0, 4.2 and 4.6) and SGL descriptors
//! (4.3.2): the same on every transport, carried in a command capsule and a response capsule.

use crate::{le16, le32, le64, put16, put32, put64};

/// Length of a submission queue entry.
pub const SQE_LEN: usize = 64;
/// Length of a completion queue entry.
pub const CQE_LEN: usize = 16;
/// Length of an SGL descriptor.
pub const SGL_LEN: usize = 16;

/// Opcode of the fabrics commands (Connect, Property Get/Set, Disconnect).
pub const FABRICS_OPCODE: u8 = 0x7f;

/// PSDT in the flags byte: SGLs (the only choice on fabrics), 01b = SGL with metadata in one
/// buffer.
pub const PSDT_SGL: u8 = 0x40;

/// A submission queue entry. `dptr` is the raw SGL descriptor ([`Sgl::parse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sqe {
    pub opcode: u8,
    /// FUSE (bits 1:0) and PSDT (bits 7:6).
    pub flags: u8,
    pub cid: u16,
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    pub mptr: u64,
    pub dptr: [u8; SGL_LEN],
    /// Command dwords 10 to 15.
    pub cdw: [u32; 6],
}

impl Sqe {
    /// Parses the first 64 bytes of `b`; `None` when shorter.
    pub fn parse(b: &[u8]) -> Option<Sqe> {
        if b.len() < SQE_LEN {
            return None;
        }
        let mut dptr = [0u8; SGL_LEN];
        dptr.copy_from_slice(&b[24..40]);
        let mut cdw = [0u32; 6];
        for (i, d) in cdw.iter_mut().enumerate() {
            *d = le32(b, 40 + 4 * i);
        }
        Some(Sqe {
            opcode: b[0],
            flags: b[1],
            cid: le16(b, 2),
            nsid: le32(b, 4),
            cdw2: le32(b, 8),
            cdw3: le32(b, 12),
            mptr: le64(b, 16),
            dptr,
            cdw,
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..SQE_LEN];
        b[0] = self.opcode;
        b[1] = self.flags;
        put16(b, 2, self.cid);
        put32(b, 4, self.nsid);
        put32(b, 8, self.cdw2);
        put32(b, 12, self.cdw3);
        put64(b, 16, self.mptr);
        b[24..40].copy_from_slice(&self.dptr);
        for (i, d) in self.cdw.iter().enumerate() {
            put32(b, 40 + 4 * i, *d);
        }
    }

    pub fn to_bytes(&self) -> [u8; SQE_LEN] {
        let mut b = [0u8; SQE_LEN];
        self.emit(&mut b);
        b
    }

    /// The fused operation (FUSE, bits 1:0 of the flags).
    pub fn fuse(&self) -> u8 {
        self.flags & 0x03
    }

    /// PSDT (bits 7:6 of the flags): 0 means PRPs, which no fabric allows.
    pub fn psdt(&self) -> u8 {
        self.flags >> 6
    }

    /// The data pointer as an SGL descriptor.
    pub fn sgl(&self) -> Sgl {
        Sgl::parse(&self.dptr)
    }

    /// For a fabrics command: FCTYPE (byte 4).
    pub fn fctype(&self) -> u8 {
        self.nsid as u8
    }
}

/// SGL descriptor types (the high nibble of byte 15) and subtypes (the low nibble).
pub mod sgl_id {
    pub const DATA_BLOCK: u8 = 0x0;
    pub const KEYED_DATA_BLOCK: u8 = 0x4;
    pub const TRANSPORT_DATA_BLOCK: u8 = 0x5;
    pub const SUB_ADDRESS: u8 = 0x0;
    pub const SUB_OFFSET: u8 = 0x1;
    /// Keyed data block: invalidate the key once the transfer is done.
    pub const SUB_INVALIDATE: u8 = 0xf;
    /// Transport data block of NVMe/TCP: the data moves in H2CData and C2HData PDUs.
    pub const SUB_TRANSPORT: u8 = 0xa;
}

/// One SGL descriptor: where a command's data is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sgl {
    /// Data block; with `offset`, an offset into the capsule's in-capsule data (the form
    /// both transports use for it), else an address.
    DataBlock { addr: u64, len: u32, offset: bool },
    /// Keyed data block (NVMe/RDMA): a remote address, a 24-bit length and the key to reach
    /// it with RDMA READ or WRITE; `invalidate` asks for SEND with Invalidate.
    Keyed {
        addr: u64,
        len: u32,
        key: u32,
        invalidate: bool,
    },
    /// Transport data block (NVMe/TCP): the data moves in data PDUs.
    Transport { len: u32 },
    /// A type or subtype no transport here takes: byte 15 as it came.
    Other { id: u8 },
}

impl Sgl {
    pub fn parse(b: &[u8; SGL_LEN]) -> Sgl {
        let id = b[15];
        let (ty, sub) = (id >> 4, id & 0x0f);
        match (ty, sub) {
            (sgl_id::DATA_BLOCK, sgl_id::SUB_ADDRESS | sgl_id::SUB_OFFSET) => Sgl::DataBlock {
                addr: le64(b, 0),
                len: le32(b, 8),
                offset: sub == sgl_id::SUB_OFFSET,
            },
            (sgl_id::KEYED_DATA_BLOCK, sgl_id::SUB_ADDRESS | sgl_id::SUB_INVALIDATE) => {
                Sgl::Keyed {
                    addr: le64(b, 0),
                    len: u32::from_le_bytes([b[8], b[9], b[10], 0]),
                    key: le32(b, 11),
                    invalidate: sub == sgl_id::SUB_INVALIDATE,
                }
            }
            (sgl_id::TRANSPORT_DATA_BLOCK, sgl_id::SUB_TRANSPORT) => {
                Sgl::Transport { len: le32(b, 8) }
            }
            _ => Sgl::Other { id },
        }
    }

    /// The descriptor's bytes. A keyed length above 2^24 - 1 is cut to 24 bits.
    pub fn to_bytes(&self) -> [u8; SGL_LEN] {
        let mut b = [0u8; SGL_LEN];
        match *self {
            Sgl::DataBlock { addr, len, offset } => {
                put64(&mut b, 0, addr);
                put32(&mut b, 8, len);
                b[15] = (sgl_id::DATA_BLOCK << 4) | (u8::from(offset) * sgl_id::SUB_OFFSET);
            }
            Sgl::Keyed {
                addr,
                len,
                key,
                invalidate,
            } => {
                put64(&mut b, 0, addr);
                b[8..11].copy_from_slice(&len.to_le_bytes()[..3]);
                put32(&mut b, 11, key);
                let sub = if invalidate {
                    sgl_id::SUB_INVALIDATE
                } else {
                    sgl_id::SUB_ADDRESS
                };
                b[15] = sgl_id::KEYED_DATA_BLOCK << 4 | sub;
            }
            Sgl::Transport { len } => {
                put32(&mut b, 8, len);
                b[15] = sgl_id::TRANSPORT_DATA_BLOCK << 4 | sgl_id::SUB_TRANSPORT;
            }
            Sgl::Other { id } => b[15] = id,
        }
        b
    }

    /// The key a keyed SGL asks the completion to invalidate (SEND with Invalidate).
    pub fn invalidate_key(&self) -> Option<u32> {
        match *self {
            Sgl::Keyed {
                key,
                invalidate: true,
                ..
            } => Some(key),
            _ => None,
        }
    }

    /// The length of the data it describes (`None` for an unknown descriptor).
    pub fn data_len(&self) -> Option<u32> {
        match *self {
            Sgl::DataBlock { len, .. } | Sgl::Keyed { len, .. } | Sgl::Transport { len } => {
                Some(len)
            }
            Sgl::Other { .. } => None,
        }
    }
}

/// Status code types (NVMe Base 2.0, Figure 93).
pub mod sct {
    pub const GENERIC: u8 = 0x0;
    pub const COMMAND_SPECIFIC: u8 = 0x1;
    pub const MEDIA: u8 = 0x2;
    pub const PATH: u8 = 0x3;
}

/// Status codes, by type.
pub mod sc {
    /// Generic command status.
    pub const INVALID_OPCODE: u8 = 0x01;
    pub const INVALID_FIELD: u8 = 0x02;
    pub const COMMAND_ID_CONFLICT: u8 = 0x03;
    pub const DATA_TRANSFER_ERROR: u8 = 0x04;
    pub const INTERNAL_ERROR: u8 = 0x06;
    pub const ABORT_REQUESTED: u8 = 0x07;
    pub const ABORTED_SQ_DELETION: u8 = 0x08;
    pub const INVALID_NAMESPACE: u8 = 0x0b;
    pub const COMMAND_SEQUENCE_ERROR: u8 = 0x0c;
    pub const SGL_INVALID_DATA_LENGTH: u8 = 0x0f;
    pub const SGL_INVALID_TYPE: u8 = 0x11;
    pub const SGL_INVALID_OFFSET: u8 = 0x16;
    pub const HOST_ID_INCONSISTENT: u8 = 0x18;
    pub const KEEP_ALIVE_EXPIRED: u8 = 0x19;
    pub const KEEP_ALIVE_INVALID: u8 = 0x1a;
    pub const ABORTED_PREEMPT: u8 = 0x1b;
    pub const NAMESPACE_WRITE_PROTECTED: u8 = 0x20;
    pub const TRANSIENT_TRANSPORT_ERROR: u8 = 0x22;
    pub const LBA_OUT_OF_RANGE: u8 = 0x80;
    pub const CAPACITY_EXCEEDED: u8 = 0x81;
    pub const NAMESPACE_NOT_READY: u8 = 0x82;
    pub const RESERVATION_CONFLICT: u8 = 0x83;
    /// Command specific status.
    pub const INVALID_QUEUE_IDENTIFIER: u8 = 0x01;
    pub const INVALID_QUEUE_SIZE: u8 = 0x02;
    pub const ABORT_LIMIT_EXCEEDED: u8 = 0x03;
    pub const ASYNC_EVENT_LIMIT_EXCEEDED: u8 = 0x05;
    pub const INVALID_LOG_PAGE: u8 = 0x09;
    pub const FEATURE_NOT_SAVEABLE: u8 = 0x0d;
    pub const FEATURE_NOT_CHANGEABLE: u8 = 0x0e;
    /// Media and data integrity errors.
    pub const WRITE_FAULT: u8 = 0x80;
    pub const UNRECOVERED_READ_ERROR: u8 = 0x81;
    pub const COMPARE_FAILURE: u8 = 0x85;
    pub const ACCESS_DENIED: u8 = 0x86;
    /// Path related status.
    pub const INTERNAL_PATH_ERROR: u8 = 0x00;
    pub const ANA_PERSISTENT_LOSS: u8 = 0x01;
    pub const ANA_INACCESSIBLE: u8 = 0x02;
    pub const ANA_TRANSITION: u8 = 0x03;
}

/// A completion's status field (without the phase tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Status {
    /// Status code type.
    pub sct: u8,
    /// Status code.
    pub sc: u8,
    /// Command retry delay (index into the controller's CRDT).
    pub crd: u8,
    pub more: bool,
    /// Do not retry.
    pub dnr: bool,
}

impl Status {
    pub const SUCCESS: Status = Status {
        sct: 0,
        sc: 0,
        crd: 0,
        more: false,
        dnr: false,
    };

    /// A status of type `sct`, code `sc`, with DNR set.
    pub const fn error(sct: u8, sc: u8) -> Status {
        Status {
            sct,
            sc,
            crd: 0,
            more: false,
            dnr: true,
        }
    }

    pub fn is_success(&self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// The 16-bit field with the phase tag `phase` in bit 0.
    pub fn to_field(self, phase: bool) -> u16 {
        u16::from(phase)
            | u16::from(self.sc) << 1
            | u16::from(self.sct & 0x7) << 9
            | u16::from(self.crd & 0x3) << 12
            | u16::from(self.more) << 14
            | u16::from(self.dnr) << 15
    }

    /// The status and the phase tag of a 16-bit field.
    pub fn from_field(f: u16) -> (Status, bool) {
        (
            Status {
                sc: (f >> 1) as u8,
                sct: ((f >> 9) & 0x7) as u8,
                crd: ((f >> 12) & 0x3) as u8,
                more: f & 1 << 14 != 0,
                dnr: f & 1 << 15 != 0,
            },
            f & 1 != 0,
        )
    }
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    /// Command specific dword 0 (Connect: the controller ID; Property Get: the value).
    pub dw0: u32,
    pub dw1: u32,
    pub sq_head: u16,
    pub sq_id: u16,
    pub cid: u16,
    pub status: Status,
    pub phase: bool,
}

impl Cqe {
    pub fn parse(b: &[u8]) -> Option<Cqe> {
        if b.len() < CQE_LEN {
            return None;
        }
        let (status, phase) = Status::from_field(le16(b, 14));
        Some(Cqe {
            dw0: le32(b, 0),
            dw1: le32(b, 4),
            sq_head: le16(b, 8),
            sq_id: le16(b, 10),
            cid: le16(b, 12),
            status,
            phase,
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..CQE_LEN];
        put32(b, 0, self.dw0);
        put32(b, 4, self.dw1);
        put16(b, 8, self.sq_head);
        put16(b, 10, self.sq_id);
        put16(b, 12, self.cid);
        put16(b, 14, self.status.to_field(self.phase));
    }

    pub fn to_bytes(&self) -> [u8; CQE_LEN] {
        let mut b = [0u8; CQE_LEN];
        self.emit(&mut b);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Linux nvme-tcp READ of 8 blocks at LBA 0x1234 on namespace 1 (cid 0x0021, transport
    /// data block of 4096 bytes), as the host sends it.
    const READ_SQE: [u8; 64] = [
        0x02, 0x40, 0x21, 0x00, 0x01, 0x00, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, //
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
        0x00, 0x10, 0x00, 0x00, 0, 0, 0, 0x5a, 0x34, 0x12, 0, 0, 0, 0, 0, 0, //
        0x07, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    #[test]
    fn submission_entries_and_their_sgls() {
        let s = Sqe::parse(&READ_SQE).unwrap();
        assert_eq!((s.opcode, s.cid, s.nsid, s.psdt()), (0x02, 0x21, 1, 1));
        assert_eq!(s.sgl(), Sgl::Transport { len: 4096 });
        assert_eq!((s.cdw[0], s.cdw[1], s.cdw[2]), (0x1234, 0, 7));
        assert_eq!(s.to_bytes(), READ_SQE);
        assert_eq!(Sqe::parse(&READ_SQE[..63]), None);
        for sgl in [
            Sgl::DataBlock {
                addr: 0,
                len: 8192,
                offset: true,
            },
            Sgl::DataBlock {
                addr: 0x1000,
                len: 512,
                offset: false,
            },
            Sgl::Keyed {
                addr: 0x7f00_1234_5000,
                len: 0x10_0000,
                key: 0xdead_beef,
                invalidate: true,
            },
            Sgl::Keyed {
                addr: 1,
                len: 0xff_ffff,
                key: 7,
                invalidate: false,
            },
            Sgl::Transport { len: 1 << 20 },
            Sgl::Other { id: 0x23 },
        ] {
            assert_eq!(Sgl::parse(&sgl.to_bytes()), sgl, "{sgl:?}");
        }
        // A keyed length is 24 bits; the key starts at byte 11.
        let k = Sgl::Keyed {
            addr: 0,
            len: 0x12_3456,
            key: 0xaabb_ccdd,
            invalidate: false,
        }
        .to_bytes();
        assert_eq!(&k[8..16], &[0x56, 0x34, 0x12, 0xdd, 0xcc, 0xbb, 0xaa, 0x40]);
        assert_eq!(Sgl::Other { id: 0x23 }.data_len(), None);
        assert_eq!(Sgl::Transport { len: 9 }.data_len(), Some(9));
    }

    #[test]
    fn completion_entries_and_status_fields() {
        let c = Cqe {
            dw0: 0x0001,
            dw1: 0,
            sq_head: 5,
            sq_id: 0,
            cid: 0x21,
            status: Status::error(sct::COMMAND_SPECIFIC, 0x82),
            phase: true,
        };
        let b = c.to_bytes();
        // SC 0x82 in bits 8:1, SCT 1 in bits 11:9, DNR in bit 15, phase in bit 0.
        assert_eq!(
            u16::from_le_bytes([b[14], b[15]]),
            0x8000 | 0x200 | 0x82 << 1 | 1
        );
        assert_eq!(Cqe::parse(&b), Some(c));
        assert_eq!(Cqe::parse(&b[..15]), None);
        for f in [0u16, 1, 0xffff, 0x4000, 0x3000, 0x0e00] {
            let (s, p) = Status::from_field(f);
            assert_eq!(s.to_field(p), f);
        }
        assert!(Status::SUCCESS.is_success());
    }
}
