//! SRP information units (SRP r16a §6; Linux `include/scsi/srp.h`) and the RDMA/CM form of
//! the login request (`struct srp_login_req_rdma`, 56 bytes of REQ private data).
//!
//! Every IU has a plain `Repr` with `parse(&[u8])`, `buffer_len()` and `emit(&mut [u8])`.
//! Parsers take untrusted bytes, never panic and check every length before reading; `emit`
//! panics only when handed a buffer shorter than `buffer_len()`. Multi-byte fields are
//! big-endian; tags are opaque 8-byte values that are echoed as they came.

use std::ops::Range;

type Field = Range<usize>;

/// Opcodes (SRP r16a Table 6).
pub mod opcode {
    pub const LOGIN_REQ: u8 = 0x00;
    pub const TSK_MGMT: u8 = 0x01;
    pub const CMD: u8 = 0x02;
    pub const I_LOGOUT: u8 = 0x03;
    pub const LOGIN_RSP: u8 = 0xc0;
    pub const RSP: u8 = 0xc1;
    pub const LOGIN_REJ: u8 = 0xc2;
    pub const T_LOGOUT: u8 = 0x80;
    pub const CRED_REQ: u8 = 0x81;
    pub const AER_REQ: u8 = 0x82;
    pub const CRED_RSP: u8 = 0x41;
    pub const AER_RSP: u8 = 0x42;
}

/// Buffer formats of LOGIN_REQ / LOGIN_RSP (`SRP_BUF_FORMAT_*`).
pub mod buf_fmt {
    pub const DIRECT: u16 = 1 << 1;
    pub const INDIRECT: u16 = 1 << 2;
}

/// LOGIN_REQ flags.
pub mod req_flags {
    /// Multichannel action: 0 = terminate this initiator's other channels.
    pub const MULTICHAN_MASK: u8 = 0x03;
    pub const MULTICHAN_SINGLE: u8 = 0;
    pub const MULTICHAN_MULTI: u8 = 1;
    /// Immediate data requested (SRP-2 / Linux `SRP_IMMED_REQUESTED`).
    pub const IMMED_REQUESTED: u8 = 0x80;
}

/// LOGIN_RSP flags.
pub mod rsp_flags {
    pub const NO_CHAN: u8 = 0;
    /// Existing channels of the initiator were terminated.
    pub const TERMINATED: u8 = 1;
    /// Existing channels were maintained.
    pub const MAINTAINED: u8 = 2;
    pub const IMMED_SUPP: u8 = 0x80;
}

/// LOGIN_REJ reasons (SRP r16a Table 11).
pub mod rej_reason {
    pub const UNABLE_ESTABLISH_CHANNEL: u32 = 0x0001_0000;
    pub const INSUFFICIENT_RESOURCES: u32 = 0x0001_0001;
    pub const IT_IU_LENGTH_TOO_LARGE: u32 = 0x0001_0002;
    pub const UNABLE_ASSOCIATE_CHANNEL: u32 = 0x0001_0003;
    pub const UNSUPPORTED_DESCRIPTOR_FMT: u32 = 0x0001_0004;
    pub const MULTI_CHANNEL_UNSUPPORTED: u32 = 0x0001_0005;
    pub const CHANNEL_LIMIT_REACHED: u32 = 0x0001_0006;
}

/// SRP_RSP flags.
pub mod rsp_flag {
    pub const RSPVALID: u8 = 0x01;
    pub const SNSVALID: u8 = 0x02;
    pub const DOOVER: u8 = 0x04;
    pub const DOUNDER: u8 = 0x08;
    pub const DIOVER: u8 = 0x10;
    pub const DIUNDER: u8 = 0x20;
}

/// Task management functions (SRP r16a Table 21).
pub mod tmf {
    pub const ABORT_TASK: u8 = 0x01;
    pub const ABORT_TASK_SET: u8 = 0x02;
    pub const CLEAR_TASK_SET: u8 = 0x04;
    pub const LUN_RESET: u8 = 0x08;
    pub const CLEAR_ACA: u8 = 0x40;
}

/// Task management response codes, in byte 3 of SRP_RSP response data.
pub mod tmf_status {
    pub const COMPLETE: u8 = 0x00;
    pub const INVALID_FIELDS: u8 = 0x02;
    pub const NOT_SUPPORTED: u8 = 0x04;
    pub const FAILED: u8 = 0x05;
}

/// T_LOGOUT reasons (SRP r16a Table 14).
pub mod logout_reason {
    pub const NO_REASON: u32 = 0;
    pub const INACTIVE: u32 = 1;
    pub const INVALID_IU_TYPE: u32 = 2;
    pub const UNEXPECTED_RSP: u32 = 3;
    pub const MULTICHANNEL_ACTION: u32 = 4;
    pub const UNSUPPORTED_FORMAT: u32 = 6;
    pub const INVALID_IU: u32 = 7;
}

/// Data buffer descriptor formats of SRP_CMD (the nibbles of DATA BUFFER DESCRIPTOR FORMAT).
pub mod desc_fmt {
    pub const NONE: u8 = 0;
    pub const DIRECT: u8 = 1;
    pub const INDIRECT: u8 = 2;
    /// Immediate data (Linux `SRP_DATA_DESC_IMM`).
    pub const IMMEDIATE: u8 = 3;
}

/// Why bytes are not an IU of the expected kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IuError {
    /// Shorter than the IU (or than what its own fields announce).
    Truncated,
    /// The first byte is not this IU's opcode.
    Opcode(u8),
    /// A descriptor field is invalid (format, counts, lengths).
    Descriptor,
}

impl std::fmt::Display for IuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IuError::Truncated => f.write_str("information unit truncated"),
            IuError::Opcode(o) => write!(f, "unexpected opcode {o:#04x}"),
            IuError::Descriptor => f.write_str("invalid data buffer descriptor"),
        }
    }
}

impl std::error::Error for IuError {}

pub type Result<T> = std::result::Result<T, IuError>;

fn get<const N: usize>(b: &[u8], f: Field) -> Result<[u8; N]> {
    b.get(f)
        .and_then(|s| s.try_into().ok())
        .ok_or(IuError::Truncated)
}
fn be16(b: &[u8], f: Field) -> Result<u16> {
    get::<2>(b, f).map(u16::from_be_bytes)
}
fn be32(b: &[u8], f: Field) -> Result<u32> {
    get::<4>(b, f).map(u32::from_be_bytes)
}
fn be64(b: &[u8], f: Field) -> Result<u64> {
    get::<8>(b, f).map(u64::from_be_bytes)
}
fn byte(b: &[u8], i: usize) -> Result<u8> {
    b.get(i).copied().ok_or(IuError::Truncated)
}
fn check_opcode(b: &[u8], want: u8, len: usize) -> Result<()> {
    let op = byte(b, 0)?;
    if op != want {
        return Err(IuError::Opcode(op));
    }
    if b.len() < len {
        return Err(IuError::Truncated);
    }
    Ok(())
}

/// The opcode of an IU, if it has one byte.
pub fn iu_opcode(b: &[u8]) -> Option<u8> {
    b.first().copied()
}

/// The tag of an IU (bytes 8..16), as echoed in answers; 0 when the IU is too short.
pub fn iu_tag(b: &[u8]) -> u64 {
    be64(b, 8..16).unwrap_or(0)
}

/// SRP_LOGIN_REQ, in either of its encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginReq {
    pub tag: u64,
    pub req_it_iu_len: u32,
    pub req_buf_fmt: u16,
    pub req_flags: u8,
    pub imm_data_offset: u16,
    pub initiator_port_id: [u8; 16],
    pub target_port_id: [u8; 16],
}

mod login_req {
    use super::Field;
    pub const TAG: Field = 8..16;
    pub const REQ_IT_IU_LEN: Field = 16..20;
    pub const REQ_BUF_FMT: Field = 24..26;
    pub const REQ_FLAGS: usize = 26;
    pub const IMM_DATA_OFFSET: Field = 28..30;
    pub const INITIATOR_PORT_ID: Field = 32..48;
    pub const TARGET_PORT_ID: Field = 48..64;
    pub const LEN: usize = 64;
}

mod login_req_rdma {
    use super::Field;
    pub const TAG: Field = 0..8;
    pub const REQ_BUF_FMT: Field = 8..10;
    pub const REQ_FLAGS: usize = 10;
    pub const OPCODE: usize = 11;
    pub const REQ_IT_IU_LEN: Field = 12..16;
    pub const INITIATOR_PORT_ID: Field = 16..32;
    pub const TARGET_PORT_ID: Field = 32..48;
    pub const IMM_DATA_OFFSET: Field = 48..50;
    pub const LEN: usize = 56;
}

impl LoginReq {
    /// Length of the IB form (an IU of its own).
    pub const LEN: usize = login_req::LEN;
    /// Length of the RDMA/CM form (in REQ private data, after the 36-byte cma header).
    pub const RDMA_LEN: usize = login_req_rdma::LEN;

    /// Parses the 64-byte IU.
    pub fn parse(b: &[u8]) -> Result<LoginReq> {
        use login_req as f;
        check_opcode(b, opcode::LOGIN_REQ, f::LEN)?;
        Ok(LoginReq {
            tag: be64(b, f::TAG)?,
            req_it_iu_len: be32(b, f::REQ_IT_IU_LEN)?,
            req_buf_fmt: be16(b, f::REQ_BUF_FMT)?,
            req_flags: byte(b, f::REQ_FLAGS)?,
            imm_data_offset: be16(b, f::IMM_DATA_OFFSET)?,
            initiator_port_id: get(b, f::INITIATOR_PORT_ID)?,
            target_port_id: get(b, f::TARGET_PORT_ID)?,
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        use login_req as f;
        b[..f::LEN].fill(0);
        b[0] = opcode::LOGIN_REQ;
        b[f::TAG].copy_from_slice(&self.tag.to_be_bytes());
        b[f::REQ_IT_IU_LEN].copy_from_slice(&self.req_it_iu_len.to_be_bytes());
        b[f::REQ_BUF_FMT].copy_from_slice(&self.req_buf_fmt.to_be_bytes());
        b[f::REQ_FLAGS] = self.req_flags;
        b[f::IMM_DATA_OFFSET].copy_from_slice(&self.imm_data_offset.to_be_bytes());
        b[f::INITIATOR_PORT_ID].copy_from_slice(&self.initiator_port_id);
        b[f::TARGET_PORT_ID].copy_from_slice(&self.target_port_id);
    }

    /// Parses the RDMA/CM form (`struct srp_login_req_rdma`, Linux ib_srp with `dest=`).
    pub fn parse_rdma(b: &[u8]) -> Result<LoginReq> {
        use login_req_rdma as f;
        if b.len() < f::LEN {
            return Err(IuError::Truncated);
        }
        if b[f::OPCODE] != opcode::LOGIN_REQ {
            return Err(IuError::Opcode(b[f::OPCODE]));
        }
        Ok(LoginReq {
            tag: be64(b, f::TAG)?,
            req_it_iu_len: be32(b, f::REQ_IT_IU_LEN)?,
            req_buf_fmt: be16(b, f::REQ_BUF_FMT)?,
            req_flags: b[f::REQ_FLAGS],
            imm_data_offset: be16(b, f::IMM_DATA_OFFSET)?,
            initiator_port_id: get(b, f::INITIATOR_PORT_ID)?,
            target_port_id: get(b, f::TARGET_PORT_ID)?,
        })
    }

    pub fn emit_rdma(&self, b: &mut [u8]) {
        use login_req_rdma as f;
        b[..f::LEN].fill(0);
        b[f::TAG].copy_from_slice(&self.tag.to_be_bytes());
        b[f::REQ_BUF_FMT].copy_from_slice(&self.req_buf_fmt.to_be_bytes());
        b[f::REQ_FLAGS] = self.req_flags;
        b[f::OPCODE] = opcode::LOGIN_REQ;
        b[f::REQ_IT_IU_LEN].copy_from_slice(&self.req_it_iu_len.to_be_bytes());
        b[f::INITIATOR_PORT_ID].copy_from_slice(&self.initiator_port_id);
        b[f::TARGET_PORT_ID].copy_from_slice(&self.target_port_id);
        b[f::IMM_DATA_OFFSET].copy_from_slice(&self.imm_data_offset.to_be_bytes());
    }

    pub fn to_rdma_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; Self::RDMA_LEN];
        self.emit_rdma(&mut b);
        b
    }
}

/// SRP_LOGIN_RSP (52 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginRsp {
    pub req_lim_delta: u32,
    pub tag: u64,
    pub max_it_iu_len: u32,
    pub max_ti_iu_len: u32,
    pub buf_fmt: u16,
    pub rsp_flags: u8,
}

mod login_rsp {
    use super::Field;
    pub const REQ_LIM_DELTA: Field = 4..8;
    pub const TAG: Field = 8..16;
    pub const MAX_IT_IU_LEN: Field = 16..20;
    pub const MAX_TI_IU_LEN: Field = 20..24;
    pub const BUF_FMT: Field = 24..26;
    pub const RSP_FLAGS: usize = 26;
    pub const LEN: usize = 52;
}

impl LoginRsp {
    pub const LEN: usize = login_rsp::LEN;

    pub fn parse(b: &[u8]) -> Result<LoginRsp> {
        use login_rsp as f;
        check_opcode(b, opcode::LOGIN_RSP, f::LEN)?;
        Ok(LoginRsp {
            req_lim_delta: be32(b, f::REQ_LIM_DELTA)?,
            tag: be64(b, f::TAG)?,
            max_it_iu_len: be32(b, f::MAX_IT_IU_LEN)?,
            max_ti_iu_len: be32(b, f::MAX_TI_IU_LEN)?,
            buf_fmt: be16(b, f::BUF_FMT)?,
            rsp_flags: byte(b, f::RSP_FLAGS)?,
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        use login_rsp as f;
        b[..f::LEN].fill(0);
        b[0] = opcode::LOGIN_RSP;
        b[f::REQ_LIM_DELTA].copy_from_slice(&self.req_lim_delta.to_be_bytes());
        b[f::TAG].copy_from_slice(&self.tag.to_be_bytes());
        b[f::MAX_IT_IU_LEN].copy_from_slice(&self.max_it_iu_len.to_be_bytes());
        b[f::MAX_TI_IU_LEN].copy_from_slice(&self.max_ti_iu_len.to_be_bytes());
        b[f::BUF_FMT].copy_from_slice(&self.buf_fmt.to_be_bytes());
        b[f::RSP_FLAGS] = self.rsp_flags;
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; Self::LEN];
        self.emit(&mut b);
        b
    }
}

/// SRP_LOGIN_REJ (32 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginRej {
    pub reason: u32,
    pub tag: u64,
    pub buf_fmt: u16,
}

mod login_rej {
    use super::Field;
    pub const REASON: Field = 4..8;
    pub const TAG: Field = 8..16;
    pub const BUF_FMT: Field = 24..26;
    pub const LEN: usize = 32;
}

impl LoginRej {
    pub const LEN: usize = login_rej::LEN;

    pub fn parse(b: &[u8]) -> Result<LoginRej> {
        use login_rej as f;
        check_opcode(b, opcode::LOGIN_REJ, f::LEN)?;
        Ok(LoginRej {
            reason: be32(b, f::REASON)?,
            tag: be64(b, f::TAG)?,
            buf_fmt: be16(b, f::BUF_FMT)?,
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        use login_rej as f;
        b[..f::LEN].fill(0);
        b[0] = opcode::LOGIN_REJ;
        b[f::REASON].copy_from_slice(&self.reason.to_be_bytes());
        b[f::TAG].copy_from_slice(&self.tag.to_be_bytes());
        b[f::BUF_FMT].copy_from_slice(&self.buf_fmt.to_be_bytes());
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; Self::LEN];
        self.emit(&mut b);
        b
    }
}

/// The 16-byte IUs that carry an opcode, a tag and sometimes a 32-bit word at byte 4:
/// SRP_I_LOGOUT, SRP_T_LOGOUT (reason), SRP_CRED_REQ (request limit delta), SRP_CRED_RSP,
/// SRP_AER_RSP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShortIu {
    pub opcode: u8,
    pub sol_not: u8,
    /// T_LOGOUT reason or CRED_REQ request limit delta; 0 for the others.
    pub word: u32,
    pub tag: u64,
}

impl ShortIu {
    pub const LEN: usize = 16;

    /// Parses one of the short IUs; `want` is its opcode.
    pub fn parse(b: &[u8], want: u8) -> Result<ShortIu> {
        if !matches!(
            want,
            opcode::I_LOGOUT
                | opcode::T_LOGOUT
                | opcode::CRED_REQ
                | opcode::CRED_RSP
                | opcode::AER_RSP
        ) {
            return Err(IuError::Opcode(want));
        }
        check_opcode(b, want, Self::LEN)?;
        Ok(ShortIu {
            opcode: want,
            sol_not: b[1],
            word: be32(b, 4..8)?,
            tag: be64(b, 8..16)?,
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        b[..Self::LEN].fill(0);
        b[0] = self.opcode;
        b[1] = self.sol_not;
        b[4..8].copy_from_slice(&self.word.to_be_bytes());
        b[8..16].copy_from_slice(&self.tag.to_be_bytes());
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; Self::LEN];
        self.emit(&mut b);
        b
    }
}

/// SRP_TSK_MGMT (48 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TskMgmt {
    pub sol_not: u8,
    pub tag: u64,
    pub lun: [u8; 8],
    pub function: u8,
    /// Tag of the task to abort (ABORT TASK).
    pub task_tag: u64,
}

mod tsk_mgmt {
    use super::Field;
    pub const TAG: Field = 8..16;
    pub const LUN: Field = 20..28;
    pub const FUNCTION: usize = 30;
    pub const TASK_TAG: Field = 32..40;
    pub const LEN: usize = 48;
}

impl TskMgmt {
    pub const LEN: usize = tsk_mgmt::LEN;

    pub fn parse(b: &[u8]) -> Result<TskMgmt> {
        use tsk_mgmt as f;
        check_opcode(b, opcode::TSK_MGMT, f::LEN)?;
        Ok(TskMgmt {
            sol_not: b[1],
            tag: be64(b, f::TAG)?,
            lun: get(b, f::LUN)?,
            function: b[f::FUNCTION],
            task_tag: be64(b, f::TASK_TAG)?,
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        use tsk_mgmt as f;
        b[..f::LEN].fill(0);
        b[0] = opcode::TSK_MGMT;
        b[1] = self.sol_not;
        b[f::TAG].copy_from_slice(&self.tag.to_be_bytes());
        b[f::LUN].copy_from_slice(&self.lun);
        b[f::FUNCTION] = self.function;
        b[f::TASK_TAG].copy_from_slice(&self.task_tag.to_be_bytes());
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; Self::LEN];
        self.emit(&mut b);
        b
    }
}

/// A direct data buffer descriptor (`struct srp_direct_buf`): a remote buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirectBuf {
    pub va: u64,
    pub key: u32,
    pub len: u32,
}

impl DirectBuf {
    pub const LEN: usize = 16;

    pub fn parse(b: &[u8]) -> Result<DirectBuf> {
        Ok(DirectBuf {
            va: be64(b, 0..8)?,
            key: be32(b, 8..12)?,
            len: be32(b, 12..16)?,
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.key.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
    }

    /// Parses a descriptor table (a whole number of 16-byte descriptors).
    pub fn parse_table(b: &[u8]) -> Result<Vec<DirectBuf>> {
        if !b.len().is_multiple_of(Self::LEN) {
            return Err(IuError::Descriptor);
        }
        b.chunks_exact(Self::LEN).map(DirectBuf::parse).collect()
    }
}

/// The data buffer description of one direction of an SRP_CMD.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DataDesc {
    #[default]
    None,
    Direct(DirectBuf),
    /// An indirect descriptor: the table descriptor (the whole table in initiator memory),
    /// the total data length, and the descriptors carried in the IU itself. When the table
    /// holds more descriptors than the IU carries, it must be fetched by RDMA READ.
    Indirect {
        table: DirectBuf,
        total_len: u32,
        inline: Vec<DirectBuf>,
    },
    /// Immediate data of `len` bytes inside the IU, at the channel's immediate data offset.
    Immediate {
        len: u32,
    },
}

impl DataDesc {
    /// Bytes the descriptor announces.
    pub fn len(&self) -> u32 {
        match self {
            DataDesc::None => 0,
            DataDesc::Direct(d) => d.len,
            DataDesc::Indirect { total_len, .. } => *total_len,
            DataDesc::Immediate { len } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn format(&self) -> u8 {
        match self {
            DataDesc::None => desc_fmt::NONE,
            DataDesc::Direct(_) => desc_fmt::DIRECT,
            DataDesc::Indirect { .. } => desc_fmt::INDIRECT,
            DataDesc::Immediate { .. } => desc_fmt::IMMEDIATE,
        }
    }

    fn count(&self) -> u8 {
        match self {
            DataDesc::Indirect { inline, .. } => inline.len() as u8,
            _ => 0,
        }
    }

    fn wire_len(&self) -> usize {
        match self {
            DataDesc::None => 0,
            DataDesc::Direct(_) => DirectBuf::LEN,
            DataDesc::Indirect { inline, .. } => DirectBuf::LEN + 4 + inline.len() * DirectBuf::LEN,
            DataDesc::Immediate { .. } => 4,
        }
    }

    /// Parses a descriptor of format `fmt` with `count` inline entries at the start of `b`;
    /// returns it and its length.
    fn parse(b: &[u8], fmt: u8, count: u8) -> Result<(DataDesc, usize)> {
        match fmt {
            desc_fmt::NONE => Ok((DataDesc::None, 0)),
            desc_fmt::DIRECT => Ok((DataDesc::Direct(DirectBuf::parse(b)?), DirectBuf::LEN)),
            desc_fmt::INDIRECT => {
                let table = DirectBuf::parse(b)?;
                let total_len = be32(b, 16..20)?;
                if !(table.len as usize).is_multiple_of(DirectBuf::LEN)
                    || (table.len as usize / DirectBuf::LEN) < usize::from(count)
                {
                    return Err(IuError::Descriptor);
                }
                let n = usize::from(count) * DirectBuf::LEN;
                let list = b.get(20..20 + n).ok_or(IuError::Truncated)?;
                let inline = DirectBuf::parse_table(list)?;
                Ok((
                    DataDesc::Indirect {
                        table,
                        total_len,
                        inline,
                    },
                    20 + n,
                ))
            }
            desc_fmt::IMMEDIATE => Ok((
                DataDesc::Immediate {
                    len: be32(b, 0..4)?,
                },
                4,
            )),
            _ => Err(IuError::Descriptor),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        match self {
            DataDesc::None => {}
            DataDesc::Direct(d) => d.emit(b),
            DataDesc::Indirect {
                table,
                total_len,
                inline,
            } => {
                table.emit(&mut b[0..16]);
                b[16..20].copy_from_slice(&total_len.to_be_bytes());
                for (i, d) in inline.iter().enumerate() {
                    d.emit(&mut b[20 + i * 16..36 + i * 16]);
                }
            }
            DataDesc::Immediate { len } => b[0..4].copy_from_slice(&len.to_be_bytes()),
        }
    }
}

/// SRP_CMD (48 bytes, additional CDB bytes and data buffer descriptors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd {
    pub sol_not: u8,
    pub tag: u64,
    pub lun: [u8; 8],
    /// TASK ATTRIBUTE: 0 simple, 1 head of queue, 2 ordered, 4 ACA.
    pub task_attr: u8,
    /// The CDB: 16 bytes plus the additional CDB bytes.
    pub cdb: rtgt_scsi::CdbBytes,
    pub data_out: DataDesc,
    pub data_in: DataDesc,
}

mod cmd {
    use super::Field;
    pub const BUF_FMT: usize = 5;
    pub const DATA_OUT_DESC_CNT: usize = 6;
    pub const DATA_IN_DESC_CNT: usize = 7;
    pub const TAG: Field = 8..16;
    pub const LUN: Field = 20..28;
    pub const TASK_ATTR: usize = 29;
    pub const ADD_CDB_LEN: usize = 31;
    pub const CDB: Field = 32..48;
    pub const LEN: usize = 48;
}

/// Offset of immediate data as Linux ib_srp places it (`SRP_IMM_DATA_OFFSET`): after the
/// fixed SRP_CMD, a direct descriptor's worth of room and the 4-byte immediate length.
pub const IMM_DATA_OFFSET: usize = 68;

impl Cmd {
    /// Length of the fixed part.
    pub const LEN: usize = cmd::LEN;

    /// Parses an SRP_CMD. Immediate data (if any) is not part of the representation: it
    /// lies at the channel's immediate data offset ([`Cmd::immediate_data`]).
    pub fn parse(b: &[u8]) -> Result<Cmd> {
        check_opcode(b, opcode::CMD, cmd::LEN)?;
        let fmt = b[cmd::BUF_FMT];
        let add = usize::from(b[cmd::ADD_CDB_LEN] & !3);
        let mut cdb = rtgt_scsi::CdbBytes::from_slice(&b[cmd::CDB]);
        cdb.extend_from_slice(b.get(cmd::LEN..cmd::LEN + add).ok_or(IuError::Truncated)?);
        let mut at = cmd::LEN + add;
        let (out_fmt, in_fmt) = (fmt >> 4, fmt & 0xf);
        let (data_out, n) = DataDesc::parse(
            b.get(at..).ok_or(IuError::Truncated)?,
            out_fmt,
            b[cmd::DATA_OUT_DESC_CNT],
        )?;
        at += n;
        if in_fmt == desc_fmt::IMMEDIATE {
            // Immediate data only carries data-out.
            return Err(IuError::Descriptor);
        }
        let (data_in, _) = DataDesc::parse(
            b.get(at..).ok_or(IuError::Truncated)?,
            in_fmt,
            b[cmd::DATA_IN_DESC_CNT],
        )?;
        Ok(Cmd {
            sol_not: b[1],
            tag: be64(b, cmd::TAG)?,
            lun: get(b, cmd::LUN)?,
            task_attr: b[cmd::TASK_ATTR] & 0x07,
            cdb,
            data_out,
            data_in,
        })
    }

    /// Bytes of additional CDB (a multiple of 4).
    fn add_cdb_len(&self) -> usize {
        self.cdb.len().saturating_sub(16).div_ceil(4) * 4
    }

    /// Length of the IU without immediate data.
    pub fn buffer_len(&self) -> usize {
        cmd::LEN + self.add_cdb_len() + self.data_out.wire_len() + self.data_in.wire_len()
    }

    pub fn emit(&self, b: &mut [u8]) {
        let len = self.buffer_len();
        b[..len].fill(0);
        b[0] = opcode::CMD;
        b[1] = self.sol_not;
        b[cmd::BUF_FMT] = (self.data_out.format() << 4) | self.data_in.format();
        b[cmd::DATA_OUT_DESC_CNT] = self.data_out.count();
        b[cmd::DATA_IN_DESC_CNT] = self.data_in.count();
        b[cmd::TAG].copy_from_slice(&self.tag.to_be_bytes());
        b[cmd::LUN].copy_from_slice(&self.lun);
        b[cmd::TASK_ATTR] = self.task_attr;
        let add = self.add_cdb_len();
        b[cmd::ADD_CDB_LEN] = add as u8;
        let n = self.cdb.len().min(16);
        b[32..32 + n].copy_from_slice(&self.cdb[..n]);
        if self.cdb.len() > 16 {
            b[48..48 + self.cdb.len() - 16].copy_from_slice(&self.cdb[16..]);
        }
        let at = cmd::LEN + add;
        self.data_out.emit(&mut b[at..]);
        let at = at + self.data_out.wire_len();
        self.data_in.emit(&mut b[at..]);
    }

    /// The immediate data of a command whose IU is `iu`, at `offset`; `None` when the IU is
    /// too short for the announced length or the offset overlaps the descriptors.
    pub fn immediate_data<'a>(&self, iu: &'a [u8], offset: usize) -> Option<&'a [u8]> {
        let DataDesc::Immediate { len } = self.data_out else {
            return None;
        };
        if offset < cmd::LEN + self.add_cdb_len() + 4 {
            return None;
        }
        iu.get(offset..offset.checked_add(len as usize)?)
    }
}

/// SRP_RSP (36 bytes, then response data, then sense data).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rsp {
    pub sol_not: u8,
    pub req_lim_delta: u32,
    pub tag: u64,
    pub flags: u8,
    pub status: u8,
    pub data_out_res_cnt: u32,
    pub data_in_res_cnt: u32,
    pub resp_data: Vec<u8>,
    pub sense: Vec<u8>,
}

mod rsp {
    use super::Field;
    pub const REQ_LIM_DELTA: Field = 4..8;
    pub const TAG: Field = 8..16;
    pub const FLAGS: usize = 18;
    pub const STATUS: usize = 19;
    pub const DATA_OUT_RES_CNT: Field = 20..24;
    pub const DATA_IN_RES_CNT: Field = 24..28;
    pub const SENSE_LEN: Field = 28..32;
    pub const RESP_LEN: Field = 32..36;
    pub const LEN: usize = 36;
}

impl Rsp {
    pub const LEN: usize = rsp::LEN;

    /// Parses an SRP_RSP; response and sense data are taken when their valid flags are set.
    pub fn parse(b: &[u8]) -> Result<Rsp> {
        check_opcode(b, opcode::RSP, rsp::LEN)?;
        let flags = b[rsp::FLAGS];
        let resp_len = be32(b, rsp::RESP_LEN)? as usize;
        let sense_len = be32(b, rsp::SENSE_LEN)? as usize;
        let resp_len = if flags & rsp_flag::RSPVALID != 0 {
            resp_len
        } else {
            0
        };
        let sense_len = if flags & rsp_flag::SNSVALID != 0 {
            sense_len
        } else {
            0
        };
        let end = rsp::LEN
            .checked_add(resp_len)
            .and_then(|e| e.checked_add(sense_len))
            .ok_or(IuError::Truncated)?;
        if b.len() < end {
            return Err(IuError::Truncated);
        }
        Ok(Rsp {
            sol_not: b[1],
            req_lim_delta: be32(b, rsp::REQ_LIM_DELTA)?,
            tag: be64(b, rsp::TAG)?,
            flags,
            status: b[rsp::STATUS],
            data_out_res_cnt: be32(b, rsp::DATA_OUT_RES_CNT)?,
            data_in_res_cnt: be32(b, rsp::DATA_IN_RES_CNT)?,
            resp_data: b[rsp::LEN..rsp::LEN + resp_len].to_vec(),
            sense: b[rsp::LEN + resp_len..end].to_vec(),
        })
    }

    pub fn buffer_len(&self) -> usize {
        rsp::LEN + self.resp_data.len() + self.sense.len()
    }

    /// Emits the IU; RSPVALID and SNSVALID follow from the data present.
    pub fn emit(&self, b: &mut [u8]) {
        let len = self.buffer_len();
        b[..len].fill(0);
        b[0] = opcode::RSP;
        b[1] = self.sol_not;
        b[rsp::REQ_LIM_DELTA].copy_from_slice(&self.req_lim_delta.to_be_bytes());
        b[rsp::TAG].copy_from_slice(&self.tag.to_be_bytes());
        let mut flags = self.flags & !(rsp_flag::RSPVALID | rsp_flag::SNSVALID);
        if !self.resp_data.is_empty() {
            flags |= rsp_flag::RSPVALID;
        }
        if !self.sense.is_empty() {
            flags |= rsp_flag::SNSVALID;
        }
        b[rsp::FLAGS] = flags;
        b[rsp::STATUS] = self.status;
        b[rsp::DATA_OUT_RES_CNT].copy_from_slice(&self.data_out_res_cnt.to_be_bytes());
        b[rsp::DATA_IN_RES_CNT].copy_from_slice(&self.data_in_res_cnt.to_be_bytes());
        b[rsp::SENSE_LEN].copy_from_slice(&(self.sense.len() as u32).to_be_bytes());
        b[rsp::RESP_LEN].copy_from_slice(&(self.resp_data.len() as u32).to_be_bytes());
        let r = rsp::LEN + self.resp_data.len();
        b[rsp::LEN..r].copy_from_slice(&self.resp_data);
        b[r..len].copy_from_slice(&self.sense);
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.buffer_len()];
        self.emit(&mut b);
        b
    }

    /// The task management status (byte 3 of the response data), as Linux ib_srp reads it.
    pub fn tmf_status(&self) -> Option<u8> {
        (self.resp_data.len() >= 4).then(|| self.resp_data[3])
    }
}

/// SRP_AER_REQ (36 bytes and sense data).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AerReq {
    pub sol_not: u8,
    pub req_lim_delta: u32,
    pub tag: u64,
    pub lun: [u8; 8],
    pub sense: Vec<u8>,
}

impl AerReq {
    pub const LEN: usize = 36;

    pub fn parse(b: &[u8]) -> Result<AerReq> {
        check_opcode(b, opcode::AER_REQ, Self::LEN)?;
        let sense_len = be32(b, 28..32)? as usize;
        let end = Self::LEN.checked_add(sense_len).ok_or(IuError::Truncated)?;
        Ok(AerReq {
            sol_not: b[1],
            req_lim_delta: be32(b, 4..8)?,
            tag: be64(b, 8..16)?,
            lun: get(b, 20..28)?,
            sense: b.get(Self::LEN..end).ok_or(IuError::Truncated)?.to_vec(),
        })
    }

    pub fn buffer_len(&self) -> usize {
        Self::LEN + self.sense.len()
    }

    pub fn emit(&self, b: &mut [u8]) {
        let len = self.buffer_len();
        b[..len].fill(0);
        b[0] = opcode::AER_REQ;
        b[1] = self.sol_not;
        b[4..8].copy_from_slice(&self.req_lim_delta.to_be_bytes());
        b[8..16].copy_from_slice(&self.tag.to_be_bytes());
        b[20..28].copy_from_slice(&self.lun);
        b[28..32].copy_from_slice(&(self.sense.len() as u32).to_be_bytes());
        b[Self::LEN..len].copy_from_slice(&self.sense);
    }
}

/// Any IU an initiator sends on an established channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitiatorIu {
    Cmd(Cmd),
    TskMgmt(TskMgmt),
    ILogout(ShortIu),
    CredRsp(ShortIu),
    AerRsp(ShortIu),
}

impl InitiatorIu {
    pub fn parse(b: &[u8]) -> Result<InitiatorIu> {
        let op = byte(b, 0)?;
        Ok(match op {
            opcode::CMD => InitiatorIu::Cmd(Cmd::parse(b)?),
            opcode::TSK_MGMT => InitiatorIu::TskMgmt(TskMgmt::parse(b)?),
            opcode::I_LOGOUT => InitiatorIu::ILogout(ShortIu::parse(b, op)?),
            opcode::CRED_RSP => InitiatorIu::CredRsp(ShortIu::parse(b, op)?),
            opcode::AER_RSP => InitiatorIu::AerRsp(ShortIu::parse(b, op)?),
            other => return Err(IuError::Opcode(other)),
        })
    }
}

/// Any IU a target sends on an established channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetIu {
    Rsp(Rsp),
    TLogout(ShortIu),
    CredReq(ShortIu),
    AerReq(AerReq),
}

impl TargetIu {
    pub fn parse(b: &[u8]) -> Result<TargetIu> {
        let op = byte(b, 0)?;
        Ok(match op {
            opcode::RSP => TargetIu::Rsp(Rsp::parse(b)?),
            opcode::T_LOGOUT => TargetIu::TLogout(ShortIu::parse(b, op)?),
            opcode::CRED_REQ => TargetIu::CredReq(ShortIu::parse(b, op)?),
            opcode::AER_REQ => TargetIu::AerReq(AerReq::parse(b)?),
            other => return Err(IuError::Opcode(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The login_req_rdma private data Linux ib_srp sent to ib_srpt in the lab capture
    /// (REQ frame 700 of `transport/tests/fixtures/lio-iser-srp.pcap`, after the 36-byte cma
    /// header).
    const LINUX_LOGIN_RDMA: &str =
        "000000000000000000068000000020440000000000000000505400fffe123403\
                                    505400fffe123402505400fffe1234020044000000000000";
    /// ib_srpt's LOGIN_RSP from REP frame 704 of the same capture (first 52 bytes).
    const LINUX_LOGIN_RSP: &str =
        "c000000000000080000000000000000000002054000020440006810000000000\
                                   0000000000000000000000000000000000000000";

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn parse_linux_login_rdma() {
        let b = hex(LINUX_LOGIN_RDMA);
        let r = LoginReq::parse_rdma(&b).unwrap();
        assert_eq!(r.tag, 0);
        assert_eq!(r.req_it_iu_len, 8260);
        assert_eq!(r.req_buf_fmt, buf_fmt::DIRECT | buf_fmt::INDIRECT);
        assert_eq!(r.req_flags, req_flags::IMMED_REQUESTED);
        assert_eq!(r.imm_data_offset, 68);
        assert_eq!(&r.initiator_port_id[8..], &hex("505400fffe123403")[..]);
        assert_eq!(&r.target_port_id[..8], &hex("505400fffe123402")[..]);
        assert_eq!(r.to_rdma_bytes(), b);
        let mut ib = vec![0xa5; LoginReq::LEN];
        r.emit(&mut ib);
        assert_eq!(LoginReq::parse(&ib).unwrap(), r);
    }

    #[test]
    fn parse_linux_login_rsp() {
        let b = hex(LINUX_LOGIN_RSP);
        let r = LoginRsp::parse(&b).unwrap();
        assert_eq!(r.req_lim_delta, 128);
        assert_eq!(r.max_it_iu_len, 8276);
        assert_eq!(r.max_ti_iu_len, 8260);
        assert_eq!(r.buf_fmt, 6);
        assert_eq!(r.rsp_flags, rsp_flags::TERMINATED | rsp_flags::IMMED_SUPP);
        let mut out = vec![0xa5; LoginRsp::LEN];
        r.emit(&mut out);
        assert_eq!(out, b);
    }

    #[test]
    fn truncated() {
        let b = hex(LINUX_LOGIN_RDMA);
        assert_eq!(LoginReq::parse_rdma(&b[..55]), Err(IuError::Truncated));
        assert_eq!(LoginRsp::parse(&[0xc0; 51]), Err(IuError::Truncated));
        assert_eq!(Cmd::parse(&[2; 47]), Err(IuError::Truncated));
        assert_eq!(InitiatorIu::parse(&[]), Err(IuError::Truncated));
    }

    #[test]
    fn bad_field() {
        let mut b = hex(LINUX_LOGIN_RDMA);
        b[11] = 0x02;
        assert_eq!(LoginReq::parse_rdma(&b), Err(IuError::Opcode(2)));
        assert_eq!(InitiatorIu::parse(&[0x77; 64]), Err(IuError::Opcode(0x77)));
        // An indirect descriptor whose table is shorter than its inline count.
        let mut c = Cmd {
            sol_not: 0,
            tag: 1,
            lun: [0; 8],
            task_attr: 0,
            cdb: [0x28; 16][..].into(),
            data_out: DataDesc::None,
            data_in: DataDesc::Indirect {
                table: DirectBuf {
                    va: 0,
                    key: 1,
                    len: 32,
                },
                total_len: 8192,
                inline: vec![DirectBuf::default(); 2],
            },
        };
        let mut b = vec![0u8; c.buffer_len()];
        c.emit(&mut b);
        assert_eq!(Cmd::parse(&b).unwrap(), c);
        b[48 + 12..48 + 16].copy_from_slice(&16u32.to_be_bytes());
        assert_eq!(Cmd::parse(&b), Err(IuError::Descriptor));
        // Immediate data for data-in is not a thing.
        c.data_in = DataDesc::None;
        c.data_out = DataDesc::Immediate { len: 4 };
        let mut b = vec![0u8; c.buffer_len()];
        c.emit(&mut b);
        b[5] = 0x03;
        assert_eq!(Cmd::parse(&b), Err(IuError::Descriptor));
        // Unknown descriptor format.
        b[5] = 0x50;
        assert_eq!(Cmd::parse(&b), Err(IuError::Descriptor));
    }

    #[test]
    fn cmd_round_trip_every_format() {
        let d = |va| DirectBuf {
            va,
            key: 0x1234,
            len: 4096,
        };
        for (out, inn) in [
            (DataDesc::None, DataDesc::Direct(d(0x1000))),
            (DataDesc::Direct(d(0x2000)), DataDesc::None),
            (
                DataDesc::None,
                DataDesc::Indirect {
                    table: DirectBuf {
                        va: 0x9000,
                        key: 7,
                        len: 48,
                    },
                    total_len: 12288,
                    inline: vec![d(1), d(2), d(3)],
                },
            ),
            (DataDesc::Immediate { len: 512 }, DataDesc::None),
            (
                DataDesc::Direct(d(5)),
                DataDesc::Indirect {
                    table: DirectBuf {
                        va: 0x9000,
                        key: 7,
                        len: 64,
                    },
                    total_len: 16384,
                    inline: vec![d(1)],
                },
            ),
        ] {
            let c = Cmd {
                sol_not: 0,
                tag: 0xdead_beef_0000_0001,
                lun: [0, 1, 0, 0, 0, 0, 0, 0],
                task_attr: 2,
                cdb: (0..32).collect(),
                data_out: out,
                data_in: inn,
            };
            let mut b = vec![0xa5u8; c.buffer_len() + 600];
            c.emit(&mut b);
            let p = Cmd::parse(&b).unwrap();
            assert_eq!(p, c);
        }
    }

    #[test]
    fn immediate_data_at_offset() {
        let c = Cmd {
            sol_not: 0,
            tag: 9,
            lun: [0; 8],
            task_attr: 0,
            cdb: [0x2a; 10][..].into(),
            data_out: DataDesc::Immediate { len: 8 },
            data_in: DataDesc::None,
        };
        let mut b = vec![0u8; IMM_DATA_OFFSET + 8];
        c.emit(&mut b);
        b[IMM_DATA_OFFSET..].copy_from_slice(b"abcdefgh");
        let p = Cmd::parse(&b).unwrap();
        assert_eq!(p.cdb.len(), 16);
        assert_eq!(
            p.immediate_data(&b, IMM_DATA_OFFSET),
            Some(&b"abcdefgh"[..])
        );
        assert_eq!(
            p.immediate_data(&b[..IMM_DATA_OFFSET + 7], IMM_DATA_OFFSET),
            None
        );
        assert_eq!(p.immediate_data(&b, 48), None, "overlaps the descriptor");
    }

    #[test]
    fn rsp_round_trip() {
        let r = Rsp {
            sol_not: 0,
            req_lim_delta: 1,
            tag: 77,
            flags: rsp_flag::DIUNDER,
            status: 2,
            data_out_res_cnt: 0,
            data_in_res_cnt: 512,
            resp_data: vec![0, 0, 0, tmf_status::FAILED],
            sense: vec![0x70, 0, 5, 0, 0, 0, 0, 10],
        };
        let b = r.to_bytes();
        assert_eq!(
            b[18],
            rsp_flag::DIUNDER | rsp_flag::RSPVALID | rsp_flag::SNSVALID
        );
        let p = Rsp::parse(&b).unwrap();
        assert_eq!(p.tmf_status(), Some(tmf_status::FAILED));
        assert_eq!(p.sense, r.sense);
        assert_eq!(Rsp::parse(&b[..b.len() - 1]), Err(IuError::Truncated));
    }

    #[test]
    fn short_ius_and_rej() {
        let t = ShortIu {
            opcode: opcode::T_LOGOUT,
            sol_not: 1,
            word: logout_reason::NO_REASON,
            tag: 5,
        };
        assert_eq!(TargetIu::parse(&t.to_bytes()), Ok(TargetIu::TLogout(t)));
        let l = ShortIu {
            opcode: opcode::I_LOGOUT,
            sol_not: 0,
            word: 0,
            tag: 6,
        };
        assert_eq!(
            InitiatorIu::parse(&l.to_bytes()),
            Ok(InitiatorIu::ILogout(l))
        );
        let rej = LoginRej {
            reason: rej_reason::UNABLE_ASSOCIATE_CHANNEL,
            tag: 3,
            buf_fmt: 6,
        };
        let b = rej.to_bytes();
        assert_eq!(&b[4..8], &[0, 1, 0, 3]);
        assert_eq!(LoginRej::parse(&b), Ok(rej));
        let a = AerReq {
            sol_not: 0,
            req_lim_delta: 0,
            tag: 1,
            lun: [0; 8],
            sense: vec![0x70; 18],
        };
        let mut b = vec![0; a.buffer_len()];
        a.emit(&mut b);
        assert_eq!(TargetIu::parse(&b), Ok(TargetIu::AerReq(a)));
    }
}
