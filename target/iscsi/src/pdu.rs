//! iSCSI PDU formats (RFC 7143 §11): the 48-byte Basic Header Segment, Additional Header
//! Segments and one `Repr` per opcode.
//!
//! [`Bhs`] is a zero-copy view over a header buffer. Panic contract: after
//! [`Bhs::check_len`] succeeds (or [`Bhs::new_checked`] returns `Ok`) no accessor panics;
//! untrusted bytes always go through `new_checked`. The `Repr`s hold the fields of one opcode;
//! `emit` writes every byte of the BHS (reserved bytes as zero) except TotalAHSLength, which
//! the framing layer sets.

use bytes::Bytes;

use super::WireError;

/// Length of the Basic Header Segment (RFC 7143 §11.2.1).
pub const BHS_LEN: usize = 48;
/// The reserved tag value (RFC 7143 §11.2.1.8, §11.9.4).
pub const RESERVED_TAG: u32 = 0xffff_ffff;

type Field = core::ops::Range<usize>;

/// Byte ranges of the BHS. Common fields first, then per opcode.
mod field {
    use super::Field;
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const B2: usize = 2;
    pub const B3: usize = 3;
    pub const TOTAL_AHS_LEN: usize = 4;
    pub const DATA_SEG_LEN: Field = 5..8;
    pub const LUN: Field = 8..16;
    pub const ISID: Field = 8..14;
    pub const TSIH: Field = 14..16;
    pub const ITT: Field = 16..20;
    /// TTT, EDTL, RTT, SNACK tag or CID (first two bytes), by opcode.
    pub const W20: Field = 20..24;
    pub const CID: Field = 20..22;
    /// CmdSN (initiator PDUs) or StatSN (target PDUs).
    pub const W24: Field = 24..28;
    /// ExpStatSN (initiator PDUs) or ExpCmdSN (target PDUs).
    pub const W28: Field = 28..32;
    pub const MAX_CMD_SN: Field = 32..36;
    pub const REF_CMD_SN: Field = 32..36;
    pub const CDB: Field = 32..48;
    pub const W36: Field = 36..40;
    pub const STATUS_CLASS: usize = 36;
    pub const STATUS_DETAIL: usize = 37;
    pub const ASYNC_EVENT: usize = 36;
    pub const ASYNC_VCODE: usize = 37;
    pub const PARAM1: Field = 38..40;
    pub const PARAM2: Field = 40..42;
    pub const PARAM3: Field = 42..44;
    pub const TIME2WAIT: Field = 40..42;
    pub const TIME2RETAIN: Field = 42..44;
    pub const W40: Field = 40..44;
    pub const W44: Field = 44..48;
}

/// Opcodes (RFC 7143 §11.2.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    NopOut,
    ScsiCommand,
    TaskMgmtRequest,
    LoginRequest,
    TextRequest,
    DataOut,
    LogoutRequest,
    Snack,
    NopIn,
    ScsiResponse,
    TaskMgmtResponse,
    LoginResponse,
    TextResponse,
    DataIn,
    LogoutResponse,
    R2t,
    AsyncMessage,
    Reject,
    Unknown(u8),
}

impl From<u8> for Opcode {
    fn from(v: u8) -> Opcode {
        match v & 0x3f {
            0x00 => Opcode::NopOut,
            0x01 => Opcode::ScsiCommand,
            0x02 => Opcode::TaskMgmtRequest,
            0x03 => Opcode::LoginRequest,
            0x04 => Opcode::TextRequest,
            0x05 => Opcode::DataOut,
            0x06 => Opcode::LogoutRequest,
            0x10 => Opcode::Snack,
            0x20 => Opcode::NopIn,
            0x21 => Opcode::ScsiResponse,
            0x22 => Opcode::TaskMgmtResponse,
            0x23 => Opcode::LoginResponse,
            0x24 => Opcode::TextResponse,
            0x25 => Opcode::DataIn,
            0x26 => Opcode::LogoutResponse,
            0x31 => Opcode::R2t,
            0x32 => Opcode::AsyncMessage,
            0x3f => Opcode::Reject,
            v => Opcode::Unknown(v),
        }
    }
}

impl From<Opcode> for u8 {
    fn from(o: Opcode) -> u8 {
        match o {
            Opcode::NopOut => 0x00,
            Opcode::ScsiCommand => 0x01,
            Opcode::TaskMgmtRequest => 0x02,
            Opcode::LoginRequest => 0x03,
            Opcode::TextRequest => 0x04,
            Opcode::DataOut => 0x05,
            Opcode::LogoutRequest => 0x06,
            Opcode::Snack => 0x10,
            Opcode::NopIn => 0x20,
            Opcode::ScsiResponse => 0x21,
            Opcode::TaskMgmtResponse => 0x22,
            Opcode::LoginResponse => 0x23,
            Opcode::TextResponse => 0x24,
            Opcode::DataIn => 0x25,
            Opcode::LogoutResponse => 0x26,
            Opcode::R2t => 0x31,
            Opcode::AsyncMessage => 0x32,
            Opcode::Reject => 0x3f,
            Opcode::Unknown(v) => v & 0x3f,
        }
    }
}

/// Flag bits of byte 1, by opcode (RFC 7143 §11).
pub mod flags {
    pub const FINAL: u8 = 0x80;
    /// SCSI Command: R / W.
    pub const READ: u8 = 0x40;
    pub const WRITE: u8 = 0x20;
    pub const ATTR_MASK: u8 = 0x07;
    /// Text / Login: C (continue); Login: T (transit) is `FINAL`.
    pub const CONTINUE: u8 = 0x40;
    pub const TRANSIT: u8 = 0x80;
    /// SCSI Response / Data-In residual bits.
    pub const BIDI_OVERFLOW: u8 = 0x10;
    pub const BIDI_UNDERFLOW: u8 = 0x08;
    pub const OVERFLOW: u8 = 0x04;
    pub const UNDERFLOW: u8 = 0x02;
    /// Data-In: A (acknowledge) and S (status).
    pub const ACK: u8 = 0x40;
    pub const STATUS: u8 = 0x01;
}

/// A read/write view of a BHS.
#[derive(Debug, Clone)]
pub struct Bhs<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bhs<T> {
    pub const fn new_unchecked(buffer: T) -> Bhs<T> {
        Bhs { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Bhs<T>, WireError> {
        let b = Bhs::new_unchecked(buffer);
        b.check_len()?;
        Ok(b)
    }

    pub fn check_len(&self) -> Result<(), WireError> {
        if self.buffer.as_ref().len() < BHS_LEN {
            Err(WireError)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self, i: usize) -> u8 {
        self.buffer.as_ref()[i]
    }

    fn be16(&self, f: Field) -> u16 {
        let d = self.buffer.as_ref();
        u16::from_be_bytes([d[f.start], d[f.start + 1]])
    }

    fn be32(&self, f: Field) -> u32 {
        let d = self.buffer.as_ref();
        u32::from_be_bytes([d[f.start], d[f.start + 1], d[f.start + 2], d[f.start + 3]])
    }

    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.b(field::OPCODE))
    }

    /// The I bit: immediate delivery (RFC 7143 §11.2.1.1).
    pub fn immediate(&self) -> bool {
        self.b(field::OPCODE) & 0x40 != 0
    }

    pub fn flags(&self) -> u8 {
        self.b(field::FLAGS)
    }

    pub fn final_bit(&self) -> bool {
        self.flags() & flags::FINAL != 0
    }

    /// TotalAHSLength in bytes (the field counts 4-byte words).
    pub fn total_ahs_len(&self) -> usize {
        self.b(field::TOTAL_AHS_LEN) as usize * 4
    }

    pub fn data_segment_len(&self) -> u32 {
        let d = self.buffer.as_ref();
        u32::from_be_bytes([0, d[5], d[6], d[7]])
    }

    pub fn lun(&self) -> [u8; 8] {
        let mut l = [0u8; 8];
        l.copy_from_slice(&self.buffer.as_ref()[field::LUN]);
        l
    }

    pub fn itt(&self) -> u32 {
        self.be32(field::ITT)
    }

    /// Target Transfer Tag of opcodes that carry one (bytes 20..24).
    pub fn ttt(&self) -> u32 {
        self.be32(field::W20)
    }

    /// CmdSN of an initiator PDU.
    pub fn cmd_sn(&self) -> u32 {
        self.be32(field::W24)
    }

    /// ExpStatSN of an initiator PDU.
    pub fn exp_stat_sn(&self) -> u32 {
        self.be32(field::W28)
    }

    /// StatSN of a target PDU.
    pub fn stat_sn(&self) -> u32 {
        self.be32(field::W24)
    }

    /// ExpCmdSN of a target PDU.
    pub fn exp_cmd_sn(&self) -> u32 {
        self.be32(field::W28)
    }

    /// MaxCmdSN of a target PDU.
    pub fn max_cmd_sn(&self) -> u32 {
        self.be32(field::MAX_CMD_SN)
    }

    /// DataSN / R2TSN (bytes 36..40).
    pub fn data_sn(&self) -> u32 {
        self.be32(field::W36)
    }

    pub fn buffer_offset(&self) -> u32 {
        self.be32(field::W40)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[..BHS_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bhs<T> {
    fn set_b(&mut self, i: usize, v: u8) {
        self.buffer.as_mut()[i] = v;
    }

    fn set_be16(&mut self, f: Field, v: u16) {
        self.buffer.as_mut()[f].copy_from_slice(&v.to_be_bytes());
    }

    fn set_be32(&mut self, f: Field, v: u32) {
        self.buffer.as_mut()[f].copy_from_slice(&v.to_be_bytes());
    }

    /// Zeroes the header and writes opcode, I bit and byte 1.
    fn start(&mut self, op: Opcode, immediate: bool, flags: u8) {
        self.buffer.as_mut()[..BHS_LEN].fill(0);
        let mut b0 = u8::from(op);
        if immediate {
            b0 |= 0x40;
        }
        self.set_b(field::OPCODE, b0);
        self.set_b(field::FLAGS, flags);
    }

    /// Sets TotalAHSLength from a length in bytes (a multiple of 4, at most 1020).
    pub fn set_total_ahs_len(&mut self, bytes: usize) {
        debug_assert!(bytes.is_multiple_of(4) && bytes <= 255 * 4);
        self.set_b(field::TOTAL_AHS_LEN, (bytes / 4) as u8);
    }

    pub fn set_data_segment_len(&mut self, len: u32) {
        let b = len.to_be_bytes();
        self.buffer.as_mut()[field::DATA_SEG_LEN].copy_from_slice(&b[1..]);
    }

    fn set_lun(&mut self, lun: [u8; 8]) {
        self.buffer.as_mut()[field::LUN].copy_from_slice(&lun);
    }

    fn set_itt(&mut self, v: u32) {
        self.set_be32(field::ITT, v);
    }

    /// Overwrites StatSN, ExpCmdSN and MaxCmdSN of a target PDU at transmit time.
    pub fn set_sequence(&mut self, stat_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) {
        self.set_be32(field::W24, stat_sn);
        self.set_be32(field::W28, exp_cmd_sn);
        self.set_be32(field::MAX_CMD_SN, max_cmd_sn);
    }

    /// Overwrites CmdSN and ExpStatSN of an initiator PDU at transmit time.
    pub fn set_cmd_sequence(&mut self, cmd_sn: u32, exp_stat_sn: u32) {
        self.set_be32(field::W24, cmd_sn);
        self.set_be32(field::W28, exp_stat_sn);
    }

    /// Overwrites ExpStatSN only (Data-Out, SNACK).
    pub fn set_exp_stat_sn(&mut self, exp_stat_sn: u32) {
        self.set_be32(field::W28, exp_stat_sn);
    }
}

/// SCSI Command (RFC 7143 §11.3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScsiCommand {
    pub immediate: bool,
    pub final_: bool,
    pub read: bool,
    pub write: bool,
    /// Task attribute (§11.3.1.3): 0 untagged, 1 simple, 2 ordered, 3 head of queue, 4 ACA.
    pub attr: u8,
    pub lun: [u8; 8],
    pub itt: u32,
    pub edtl: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub cdb: [u8; 16],
    pub data_len: u32,
}

/// SCSI Response (RFC 7143 §11.4).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScsiResponse {
    pub bidi_overflow: bool,
    pub bidi_underflow: bool,
    pub overflow: bool,
    pub underflow: bool,
    /// 0x00 command completed at target, 0x01 target failure.
    pub response: u8,
    pub status: u8,
    pub itt: u32,
    pub snack_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub exp_data_sn: u32,
    pub bidi_residual: u32,
    pub residual: u32,
    pub data_len: u32,
}

/// Task Management Function Request (RFC 7143 §11.5).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskMgmtRequest {
    pub immediate: bool,
    pub function: u8,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ref_task_tag: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub ref_cmd_sn: u32,
    pub exp_data_sn: u32,
}

/// Task Management Function Response (RFC 7143 §11.6).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskMgmtResponse {
    pub response: u8,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// SCSI Data-Out (RFC 7143 §11.7).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DataOut {
    pub final_: bool,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
    pub data_len: u32,
}

/// SCSI Data-In (RFC 7143 §11.7).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DataIn {
    pub final_: bool,
    pub ack: bool,
    pub overflow: bool,
    pub underflow: bool,
    /// S bit: status is present (phase collapse, §11.7.4).
    pub status_present: bool,
    pub status: u8,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
    pub residual: u32,
    pub data_len: u32,
}

/// Ready To Transfer (RFC 7143 §11.8).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct R2t {
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub r2t_sn: u32,
    pub buffer_offset: u32,
    pub desired_len: u32,
}

/// Asynchronous Message (RFC 7143 §11.9).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AsyncMessage {
    pub lun: [u8; 8],
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub event: u8,
    pub vcode: u8,
    pub param1: u16,
    pub param2: u16,
    pub param3: u16,
    pub data_len: u32,
}

/// Text Request (RFC 7143 §11.10).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TextRequest {
    pub immediate: bool,
    pub final_: bool,
    pub continue_: bool,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub data_len: u32,
}

/// Text Response (RFC 7143 §11.11).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TextResponse {
    pub final_: bool,
    pub continue_: bool,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_len: u32,
}

/// Login Request (RFC 7143 §11.12).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoginRequest {
    pub transit: bool,
    pub continue_: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub data_len: u32,
}

/// Login Response (RFC 7143 §11.13).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoginResponse {
    pub transit: bool,
    pub continue_: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub status_class: u8,
    pub status_detail: u8,
    pub data_len: u32,
}

/// Logout Request (RFC 7143 §11.14).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogoutRequest {
    pub immediate: bool,
    /// 0 close the session, 1 close the connection, 2 remove the connection for recovery.
    pub reason: u8,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// Logout Response (RFC 7143 §11.15).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogoutResponse {
    pub response: u8,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub time2wait: u16,
    pub time2retain: u16,
}

/// SNACK Request (RFC 7143 §11.16).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snack {
    pub kind: u8,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub beg_run: u32,
    pub run_length: u32,
}

/// Reject (RFC 7143 §11.17). The data segment carries the rejected header.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reject {
    pub reason: u8,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
    pub data_len: u32,
}

/// NOP-Out (RFC 7143 §11.18).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NopOut {
    pub immediate: bool,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub data_len: u32,
}

/// NOP-In (RFC 7143 §11.19).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NopIn {
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_len: u32,
}

/// Reject reason codes (RFC 7143 §11.17.1).
pub mod reject_reason {
    pub const DATA_DIGEST_ERROR: u8 = 0x02;
    pub const SNACK_REJECT: u8 = 0x03;
    pub const PROTOCOL_ERROR: u8 = 0x04;
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x05;
    pub const IMMEDIATE_COMMAND_REJECT: u8 = 0x06;
    pub const TASK_IN_PROGRESS: u8 = 0x07;
    pub const INVALID_DATA_ACK: u8 = 0x08;
    pub const INVALID_PDU_FIELD: u8 = 0x09;
    pub const LONG_OPERATION_REJECT: u8 = 0x0a;
    pub const WAITING_FOR_LOGOUT: u8 = 0x0c;
}

/// Task management functions (RFC 7143 §11.5.1) and responses (§11.6.1).
pub mod tmf {
    pub const ABORT_TASK: u8 = 1;
    pub const ABORT_TASK_SET: u8 = 2;
    pub const CLEAR_ACA: u8 = 3;
    pub const CLEAR_TASK_SET: u8 = 4;
    pub const LOGICAL_UNIT_RESET: u8 = 5;
    pub const TARGET_WARM_RESET: u8 = 6;
    pub const TARGET_COLD_RESET: u8 = 7;
    pub const TASK_REASSIGN: u8 = 8;
    // RFC 7144 §4.5 (SAM-4 and later functions).
    pub const QUERY_TASK: u8 = 9;
    pub const QUERY_TASK_SET: u8 = 10;
    pub const I_T_NEXUS_RESET: u8 = 11;
    pub const QUERY_ASYNC_EVENT: u8 = 12;

    pub const FUNCTION_COMPLETE: u8 = 0;
    pub const TASK_DOES_NOT_EXIST: u8 = 1;
    pub const LUN_DOES_NOT_EXIST: u8 = 2;
    pub const TASK_STILL_ALLEGIANT: u8 = 3;
    pub const REASSIGNMENT_NOT_SUPPORTED: u8 = 4;
    pub const NOT_SUPPORTED: u8 = 5;
    pub const AUTHORIZATION_FAILED: u8 = 6;
    /// RFC 7144 §4.6: a query function found what it asked about.
    pub const FUNCTION_SUCCEEDED: u8 = 7;
    pub const FUNCTION_REJECTED: u8 = 255;
}

fn csg_nsg(b1: u8) -> (u8, u8) {
    ((b1 >> 2) & 3, b1 & 3)
}

impl ScsiCommand {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<ScsiCommand, WireError> {
        let f = p.flags();
        let mut cdb = [0u8; 16];
        cdb.copy_from_slice(&p.as_bytes()[field::CDB]);
        Ok(ScsiCommand {
            immediate: p.immediate(),
            final_: f & flags::FINAL != 0,
            read: f & flags::READ != 0,
            write: f & flags::WRITE != 0,
            attr: f & flags::ATTR_MASK,
            lun: p.lun(),
            itt: p.itt(),
            edtl: p.be32(field::W20),
            cmd_sn: p.cmd_sn(),
            exp_stat_sn: p.exp_stat_sn(),
            cdb,
            data_len: p.data_segment_len(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        let mut f = self.attr & flags::ATTR_MASK;
        if self.final_ {
            f |= flags::FINAL;
        }
        if self.read {
            f |= flags::READ;
        }
        if self.write {
            f |= flags::WRITE;
        }
        p.start(Opcode::ScsiCommand, self.immediate, f);
        p.set_data_segment_len(self.data_len);
        p.set_lun(self.lun);
        p.set_itt(self.itt);
        p.set_be32(field::W20, self.edtl);
        p.set_be32(field::W24, self.cmd_sn);
        p.set_be32(field::W28, self.exp_stat_sn);
        p.buffer.as_mut()[field::CDB].copy_from_slice(&self.cdb);
    }
}

impl ScsiResponse {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<ScsiResponse, WireError> {
        let f = p.flags();
        Ok(ScsiResponse {
            bidi_overflow: f & flags::BIDI_OVERFLOW != 0,
            bidi_underflow: f & flags::BIDI_UNDERFLOW != 0,
            overflow: f & flags::OVERFLOW != 0,
            underflow: f & flags::UNDERFLOW != 0,
            response: p.b(field::B2),
            status: p.b(field::B3),
            itt: p.itt(),
            snack_tag: p.be32(field::W20),
            stat_sn: p.stat_sn(),
            exp_cmd_sn: p.exp_cmd_sn(),
            max_cmd_sn: p.max_cmd_sn(),
            exp_data_sn: p.be32(field::W36),
            bidi_residual: p.be32(field::W40),
            residual: p.be32(field::W44),
            data_len: p.data_segment_len(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        let mut f = flags::FINAL;
        for (set, bit) in [
            (self.bidi_overflow, flags::BIDI_OVERFLOW),
            (self.bidi_underflow, flags::BIDI_UNDERFLOW),
            (self.overflow, flags::OVERFLOW),
            (self.underflow, flags::UNDERFLOW),
        ] {
            if set {
                f |= bit;
            }
        }
        p.start(Opcode::ScsiResponse, false, f);
        p.set_b(field::B2, self.response);
        p.set_b(field::B3, self.status);
        p.set_data_segment_len(self.data_len);
        p.set_itt(self.itt);
        p.set_be32(field::W20, self.snack_tag);
        p.set_sequence(self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        p.set_be32(field::W36, self.exp_data_sn);
        p.set_be32(field::W40, self.bidi_residual);
        p.set_be32(field::W44, self.residual);
    }
}

impl TaskMgmtRequest {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<TaskMgmtRequest, WireError> {
        if !p.final_bit() {
            return Err(WireError);
        }
        Ok(TaskMgmtRequest {
            immediate: p.immediate(),
            function: p.flags() & 0x7f,
            lun: p.lun(),
            itt: p.itt(),
            ref_task_tag: p.be32(field::W20),
            cmd_sn: p.cmd_sn(),
            exp_stat_sn: p.exp_stat_sn(),
            ref_cmd_sn: p.be32(field::REF_CMD_SN),
            exp_data_sn: p.be32(field::W36),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        p.start(
            Opcode::TaskMgmtRequest,
            self.immediate,
            flags::FINAL | (self.function & 0x7f),
        );
        p.set_lun(self.lun);
        p.set_itt(self.itt);
        p.set_be32(field::W20, self.ref_task_tag);
        p.set_be32(field::W24, self.cmd_sn);
        p.set_be32(field::W28, self.exp_stat_sn);
        p.set_be32(field::REF_CMD_SN, self.ref_cmd_sn);
        p.set_be32(field::W36, self.exp_data_sn);
    }
}

impl TaskMgmtResponse {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<TaskMgmtResponse, WireError> {
        Ok(TaskMgmtResponse {
            response: p.b(field::B2),
            itt: p.itt(),
            stat_sn: p.stat_sn(),
            exp_cmd_sn: p.exp_cmd_sn(),
            max_cmd_sn: p.max_cmd_sn(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        p.start(Opcode::TaskMgmtResponse, false, flags::FINAL);
        p.set_b(field::B2, self.response);
        p.set_itt(self.itt);
        p.set_sequence(self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
    }
}

impl DataOut {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<DataOut, WireError> {
        Ok(DataOut {
            final_: p.final_bit(),
            lun: p.lun(),
            itt: p.itt(),
            ttt: p.ttt(),
            exp_stat_sn: p.exp_stat_sn(),
            data_sn: p.data_sn(),
            buffer_offset: p.buffer_offset(),
            data_len: p.data_segment_len(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        p.start(
            Opcode::DataOut,
            false,
            if self.final_ { flags::FINAL } else { 0 },
        );
        p.set_data_segment_len(self.data_len);
        p.set_lun(self.lun);
        p.set_itt(self.itt);
        p.set_be32(field::W20, self.ttt);
        p.set_be32(field::W28, self.exp_stat_sn);
        p.set_be32(field::W36, self.data_sn);
        p.set_be32(field::W40, self.buffer_offset);
    }
}

impl DataIn {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<DataIn, WireError> {
        let f = p.flags();
        let status_present = f & flags::STATUS != 0;
        // §11.7.1: S requires F.
        if status_present && f & flags::FINAL == 0 {
            return Err(WireError);
        }
        Ok(DataIn {
            final_: f & flags::FINAL != 0,
            ack: f & flags::ACK != 0,
            overflow: f & flags::OVERFLOW != 0,
            underflow: f & flags::UNDERFLOW != 0,
            status_present,
            // Byte 3 is reserved unless S is set.
            status: if status_present { p.b(field::B3) } else { 0 },
            lun: p.lun(),
            itt: p.itt(),
            ttt: p.ttt(),
            stat_sn: p.stat_sn(),
            exp_cmd_sn: p.exp_cmd_sn(),
            max_cmd_sn: p.max_cmd_sn(),
            data_sn: p.data_sn(),
            buffer_offset: p.buffer_offset(),
            residual: p.be32(field::W44),
            data_len: p.data_segment_len(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        let mut f = 0;
        for (set, bit) in [
            (self.final_, flags::FINAL),
            (self.ack, flags::ACK),
            (self.overflow, flags::OVERFLOW),
            (self.underflow, flags::UNDERFLOW),
            (self.status_present, flags::STATUS),
        ] {
            if set {
                f |= bit;
            }
        }
        p.start(Opcode::DataIn, false, f);
        if self.status_present {
            p.set_b(field::B3, self.status);
        }
        p.set_data_segment_len(self.data_len);
        p.set_lun(self.lun);
        p.set_itt(self.itt);
        p.set_be32(field::W20, self.ttt);
        p.set_sequence(self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        p.set_be32(field::W36, self.data_sn);
        p.set_be32(field::W40, self.buffer_offset);
        p.set_be32(field::W44, self.residual);
    }
}

impl R2t {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<R2t, WireError> {
        Ok(R2t {
            lun: p.lun(),
            itt: p.itt(),
            ttt: p.ttt(),
            stat_sn: p.stat_sn(),
            exp_cmd_sn: p.exp_cmd_sn(),
            max_cmd_sn: p.max_cmd_sn(),
            r2t_sn: p.data_sn(),
            buffer_offset: p.buffer_offset(),
            desired_len: p.be32(field::W44),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        p.start(Opcode::R2t, false, flags::FINAL);
        p.set_lun(self.lun);
        p.set_itt(self.itt);
        p.set_be32(field::W20, self.ttt);
        p.set_sequence(self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        p.set_be32(field::W36, self.r2t_sn);
        p.set_be32(field::W40, self.buffer_offset);
        p.set_be32(field::W44, self.desired_len);
    }
}

impl AsyncMessage {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<AsyncMessage, WireError> {
        Ok(AsyncMessage {
            lun: p.lun(),
            stat_sn: p.stat_sn(),
            exp_cmd_sn: p.exp_cmd_sn(),
            max_cmd_sn: p.max_cmd_sn(),
            event: p.b(field::ASYNC_EVENT),
            vcode: p.b(field::ASYNC_VCODE),
            param1: p.be16(field::PARAM1),
            param2: p.be16(field::PARAM2),
            param3: p.be16(field::PARAM3),
            data_len: p.data_segment_len(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        p.start(Opcode::AsyncMessage, false, flags::FINAL);
        p.set_data_segment_len(self.data_len);
        p.set_lun(self.lun);
        p.set_itt(RESERVED_TAG);
        p.set_sequence(self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        p.set_b(field::ASYNC_EVENT, self.event);
        p.set_b(field::ASYNC_VCODE, self.vcode);
        p.set_be16(field::PARAM1, self.param1);
        p.set_be16(field::PARAM2, self.param2);
        p.set_be16(field::PARAM3, self.param3);
    }
}

impl TextRequest {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<TextRequest, WireError> {
        let f = p.flags();
        // §11.10.2: F and C must not both be set.
        if f & flags::FINAL != 0 && f & flags::CONTINUE != 0 {
            return Err(WireError);
        }
        Ok(TextRequest {
            immediate: p.immediate(),
            final_: f & flags::FINAL != 0,
            continue_: f & flags::CONTINUE != 0,
            lun: p.lun(),
            itt: p.itt(),
            ttt: p.ttt(),
            cmd_sn: p.cmd_sn(),
            exp_stat_sn: p.exp_stat_sn(),
            data_len: p.data_segment_len(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        let mut f = 0;
        if self.final_ {
            f |= flags::FINAL;
        }
        if self.continue_ {
            f |= flags::CONTINUE;
        }
        p.start(Opcode::TextRequest, self.immediate, f);
        p.set_data_segment_len(self.data_len);
        p.set_lun(self.lun);
        p.set_itt(self.itt);
        p.set_be32(field::W20, self.ttt);
        p.set_be32(field::W24, self.cmd_sn);
        p.set_be32(field::W28, self.exp_stat_sn);
    }
}

impl TextResponse {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<TextResponse, WireError> {
        let f = p.flags();
        if f & flags::FINAL != 0 && f & flags::CONTINUE != 0 {
            return Err(WireError);
        }
        Ok(TextResponse {
            final_: f & flags::FINAL != 0,
            continue_: f & flags::CONTINUE != 0,
            lun: p.lun(),
            itt: p.itt(),
            ttt: p.ttt(),
            stat_sn: p.stat_sn(),
            exp_cmd_sn: p.exp_cmd_sn(),
            max_cmd_sn: p.max_cmd_sn(),
            data_len: p.data_segment_len(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        let mut f = 0;
        if self.final_ {
            f |= flags::FINAL;
        }
        if self.continue_ {
            f |= flags::CONTINUE;
        }
        p.start(Opcode::TextResponse, false, f);
        p.set_data_segment_len(self.data_len);
        p.set_lun(self.lun);
        p.set_itt(self.itt);
        p.set_be32(field::W20, self.ttt);
        p.set_sequence(self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
    }
}

impl LoginRequest {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<LoginRequest, WireError> {
        let f = p.flags();
        let (csg, nsg) = csg_nsg(f);
        let mut isid = [0u8; 6];
        isid.copy_from_slice(&p.as_bytes()[field::ISID]);
        Ok(LoginRequest {
            transit: f & flags::TRANSIT != 0,
            continue_: f & flags::CONTINUE != 0,
            csg,
            nsg,
            version_max: p.b(field::B2),
            version_min: p.b(field::B3),
            isid,
            tsih: p.be16(field::TSIH),
            itt: p.itt(),
            cid: p.be16(field::CID),
            cmd_sn: p.cmd_sn(),
            exp_stat_sn: p.exp_stat_sn(),
            data_len: p.data_segment_len(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        let mut f = ((self.csg & 3) << 2) | (self.nsg & 3);
        if self.transit {
            f |= flags::TRANSIT;
        }
        if self.continue_ {
            f |= flags::CONTINUE;
        }
        // §11.12: the I bit is always 1 in a Login Request.
        p.start(Opcode::LoginRequest, true, f);
        p.set_b(field::B2, self.version_max);
        p.set_b(field::B3, self.version_min);
        p.set_data_segment_len(self.data_len);
        p.buffer.as_mut()[field::ISID].copy_from_slice(&self.isid);
        p.set_be16(field::TSIH, self.tsih);
        p.set_itt(self.itt);
        p.set_be16(field::CID, self.cid);
        p.set_be32(field::W24, self.cmd_sn);
        p.set_be32(field::W28, self.exp_stat_sn);
    }
}

impl LoginResponse {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<LoginResponse, WireError> {
        let f = p.flags();
        let (csg, nsg) = csg_nsg(f);
        let mut isid = [0u8; 6];
        isid.copy_from_slice(&p.as_bytes()[field::ISID]);
        Ok(LoginResponse {
            transit: f & flags::TRANSIT != 0,
            continue_: f & flags::CONTINUE != 0,
            csg,
            nsg,
            version_max: p.b(field::B2),
            version_active: p.b(field::B3),
            isid,
            tsih: p.be16(field::TSIH),
            itt: p.itt(),
            stat_sn: p.stat_sn(),
            exp_cmd_sn: p.exp_cmd_sn(),
            max_cmd_sn: p.max_cmd_sn(),
            status_class: p.b(field::STATUS_CLASS),
            status_detail: p.b(field::STATUS_DETAIL),
            data_len: p.data_segment_len(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        let mut f = ((self.csg & 3) << 2) | (self.nsg & 3);
        if self.transit {
            f |= flags::TRANSIT;
        }
        if self.continue_ {
            f |= flags::CONTINUE;
        }
        p.start(Opcode::LoginResponse, false, f);
        p.set_b(field::B2, self.version_max);
        p.set_b(field::B3, self.version_active);
        p.set_data_segment_len(self.data_len);
        p.buffer.as_mut()[field::ISID].copy_from_slice(&self.isid);
        p.set_be16(field::TSIH, self.tsih);
        p.set_itt(self.itt);
        p.set_sequence(self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        p.set_b(field::STATUS_CLASS, self.status_class);
        p.set_b(field::STATUS_DETAIL, self.status_detail);
    }

    /// Status class and detail as one number, e.g. 0x0201.
    pub fn status(&self) -> u16 {
        u16::from_be_bytes([self.status_class, self.status_detail])
    }
}

impl LogoutRequest {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<LogoutRequest, WireError> {
        if !p.final_bit() {
            return Err(WireError);
        }
        Ok(LogoutRequest {
            immediate: p.immediate(),
            reason: p.flags() & 0x7f,
            itt: p.itt(),
            cid: p.be16(field::CID),
            cmd_sn: p.cmd_sn(),
            exp_stat_sn: p.exp_stat_sn(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        p.start(
            Opcode::LogoutRequest,
            self.immediate,
            flags::FINAL | (self.reason & 0x7f),
        );
        p.set_itt(self.itt);
        p.set_be16(field::CID, self.cid);
        p.set_be32(field::W24, self.cmd_sn);
        p.set_be32(field::W28, self.exp_stat_sn);
    }
}

impl LogoutResponse {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<LogoutResponse, WireError> {
        Ok(LogoutResponse {
            response: p.b(field::B2),
            itt: p.itt(),
            stat_sn: p.stat_sn(),
            exp_cmd_sn: p.exp_cmd_sn(),
            max_cmd_sn: p.max_cmd_sn(),
            time2wait: p.be16(field::TIME2WAIT),
            time2retain: p.be16(field::TIME2RETAIN),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        p.start(Opcode::LogoutResponse, false, flags::FINAL);
        p.set_b(field::B2, self.response);
        p.set_itt(self.itt);
        p.set_sequence(self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        p.set_be16(field::TIME2WAIT, self.time2wait);
        p.set_be16(field::TIME2RETAIN, self.time2retain);
    }
}

impl Snack {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<Snack, WireError> {
        Ok(Snack {
            kind: p.flags() & 0x0f,
            lun: p.lun(),
            itt: p.itt(),
            ttt: p.ttt(),
            exp_stat_sn: p.exp_stat_sn(),
            beg_run: p.be32(field::W40),
            run_length: p.be32(field::W44),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        p.start(Opcode::Snack, false, flags::FINAL | (self.kind & 0x0f));
        p.set_lun(self.lun);
        p.set_itt(self.itt);
        p.set_be32(field::W20, self.ttt);
        p.set_be32(field::W28, self.exp_stat_sn);
        p.set_be32(field::W40, self.beg_run);
        p.set_be32(field::W44, self.run_length);
    }
}

impl Reject {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<Reject, WireError> {
        Ok(Reject {
            reason: p.b(field::B2),
            stat_sn: p.stat_sn(),
            exp_cmd_sn: p.exp_cmd_sn(),
            max_cmd_sn: p.max_cmd_sn(),
            data_sn: p.data_sn(),
            data_len: p.data_segment_len(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        p.start(Opcode::Reject, false, flags::FINAL);
        p.set_b(field::B2, self.reason);
        p.set_data_segment_len(self.data_len);
        p.set_itt(RESERVED_TAG);
        p.set_sequence(self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        p.set_be32(field::W36, self.data_sn);
    }
}

impl NopOut {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<NopOut, WireError> {
        Ok(NopOut {
            immediate: p.immediate(),
            lun: p.lun(),
            itt: p.itt(),
            ttt: p.ttt(),
            cmd_sn: p.cmd_sn(),
            exp_stat_sn: p.exp_stat_sn(),
            data_len: p.data_segment_len(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        p.start(Opcode::NopOut, self.immediate, flags::FINAL);
        p.set_data_segment_len(self.data_len);
        p.set_lun(self.lun);
        p.set_itt(self.itt);
        p.set_be32(field::W20, self.ttt);
        p.set_be32(field::W24, self.cmd_sn);
        p.set_be32(field::W28, self.exp_stat_sn);
    }
}

impl NopIn {
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<NopIn, WireError> {
        Ok(NopIn {
            lun: p.lun(),
            itt: p.itt(),
            ttt: p.ttt(),
            stat_sn: p.stat_sn(),
            exp_cmd_sn: p.exp_cmd_sn(),
            max_cmd_sn: p.max_cmd_sn(),
            data_len: p.data_segment_len(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        p.start(Opcode::NopIn, false, flags::FINAL);
        p.set_data_segment_len(self.data_len);
        p.set_lun(self.lun);
        p.set_itt(self.itt);
        p.set_be32(field::W20, self.ttt);
        p.set_sequence(self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
    }
}

/// Any BHS, parsed by opcode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BhsRepr {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskMgmtRequest(TaskMgmtRequest),
    LoginRequest(LoginRequest),
    TextRequest(TextRequest),
    DataOut(DataOut),
    LogoutRequest(LogoutRequest),
    Snack(Snack),
    NopIn(NopIn),
    ScsiResponse(ScsiResponse),
    TaskMgmtResponse(TaskMgmtResponse),
    LoginResponse(LoginResponse),
    TextResponse(TextResponse),
    DataIn(DataIn),
    LogoutResponse(LogoutResponse),
    R2t(R2t),
    AsyncMessage(AsyncMessage),
    Reject(Reject),
}

impl BhsRepr {
    /// Parses a header; an unknown opcode is an error (the caller answers with Reject).
    pub fn parse<T: AsRef<[u8]>>(p: &Bhs<T>) -> Result<BhsRepr, WireError> {
        p.check_len()?;
        Ok(match p.opcode() {
            Opcode::NopOut => BhsRepr::NopOut(NopOut::parse(p)?),
            Opcode::ScsiCommand => BhsRepr::ScsiCommand(ScsiCommand::parse(p)?),
            Opcode::TaskMgmtRequest => BhsRepr::TaskMgmtRequest(TaskMgmtRequest::parse(p)?),
            Opcode::LoginRequest => BhsRepr::LoginRequest(LoginRequest::parse(p)?),
            Opcode::TextRequest => BhsRepr::TextRequest(TextRequest::parse(p)?),
            Opcode::DataOut => BhsRepr::DataOut(DataOut::parse(p)?),
            Opcode::LogoutRequest => BhsRepr::LogoutRequest(LogoutRequest::parse(p)?),
            Opcode::Snack => BhsRepr::Snack(Snack::parse(p)?),
            Opcode::NopIn => BhsRepr::NopIn(NopIn::parse(p)?),
            Opcode::ScsiResponse => BhsRepr::ScsiResponse(ScsiResponse::parse(p)?),
            Opcode::TaskMgmtResponse => BhsRepr::TaskMgmtResponse(TaskMgmtResponse::parse(p)?),
            Opcode::LoginResponse => BhsRepr::LoginResponse(LoginResponse::parse(p)?),
            Opcode::TextResponse => BhsRepr::TextResponse(TextResponse::parse(p)?),
            Opcode::DataIn => BhsRepr::DataIn(DataIn::parse(p)?),
            Opcode::LogoutResponse => BhsRepr::LogoutResponse(LogoutResponse::parse(p)?),
            Opcode::R2t => BhsRepr::R2t(R2t::parse(p)?),
            Opcode::AsyncMessage => BhsRepr::AsyncMessage(AsyncMessage::parse(p)?),
            Opcode::Reject => BhsRepr::Reject(Reject::parse(p)?),
            Opcode::Unknown(_) => return Err(WireError),
        })
    }

    /// Writes the header into a fresh 48-byte array.
    pub fn to_bytes(&self) -> [u8; BHS_LEN] {
        let mut b = [0u8; BHS_LEN];
        self.emit(&mut Bhs::new_unchecked(&mut b[..]));
        b
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bhs<T>) {
        match self {
            BhsRepr::NopOut(r) => r.emit(p),
            BhsRepr::ScsiCommand(r) => r.emit(p),
            BhsRepr::TaskMgmtRequest(r) => r.emit(p),
            BhsRepr::LoginRequest(r) => r.emit(p),
            BhsRepr::TextRequest(r) => r.emit(p),
            BhsRepr::DataOut(r) => r.emit(p),
            BhsRepr::LogoutRequest(r) => r.emit(p),
            BhsRepr::Snack(r) => r.emit(p),
            BhsRepr::NopIn(r) => r.emit(p),
            BhsRepr::ScsiResponse(r) => r.emit(p),
            BhsRepr::TaskMgmtResponse(r) => r.emit(p),
            BhsRepr::LoginResponse(r) => r.emit(p),
            BhsRepr::TextResponse(r) => r.emit(p),
            BhsRepr::DataIn(r) => r.emit(p),
            BhsRepr::LogoutResponse(r) => r.emit(p),
            BhsRepr::R2t(r) => r.emit(p),
            BhsRepr::AsyncMessage(r) => r.emit(p),
            BhsRepr::Reject(r) => r.emit(p),
        }
    }
}

/// AHS types (RFC 7143 §11.2.2.2).
pub mod ahs_type {
    pub const EXTENDED_CDB: u8 = 1;
    pub const BIDI_READ_LENGTH: u8 = 2;
}

/// One Additional Header Segment (RFC 7143 §11.2.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ahs {
    /// CDB bytes beyond the 16 in the BHS (§11.2.2.3).
    ExtendedCdb(Vec<u8>),
    /// Expected data-in length of a bidirectional command (§11.2.2.4).
    BidiReadLength(u32),
    Unknown {
        kind: u8,
        data: Vec<u8>,
    },
}

impl Ahs {
    /// Parses the whole AHS area (TotalAHSLength bytes) into its segments.
    pub fn parse_all(mut area: &[u8]) -> Result<Vec<Ahs>, WireError> {
        let mut out = Vec::new();
        while !area.is_empty() {
            if area.len() < 4 {
                return Err(WireError);
            }
            let len = u16::from_be_bytes([area[0], area[1]]) as usize;
            let kind = area[2];
            // AHSLength counts the bytes after the type byte (reserved/specific byte included).
            let body_end = 3 + len;
            let padded = (body_end + 3) & !3;
            if len == 0 || padded > area.len() {
                return Err(WireError);
            }
            let body = &area[3..body_end];
            out.push(match kind {
                ahs_type::EXTENDED_CDB => ExtendedCdbParse::parse(body)?,
                ahs_type::BIDI_READ_LENGTH => {
                    if len != 5 {
                        return Err(WireError);
                    }
                    Ahs::BidiReadLength(u32::from_be_bytes([body[1], body[2], body[3], body[4]]))
                }
                kind => Ahs::Unknown {
                    kind,
                    data: body.to_vec(),
                },
            });
            area = &area[padded..];
        }
        Ok(out)
    }

    /// Bytes this segment takes, padding included.
    pub fn buffer_len(&self) -> usize {
        let body = match self {
            Ahs::ExtendedCdb(c) => 1 + c.len(),
            Ahs::BidiReadLength(_) => 5,
            Ahs::Unknown { data, .. } => data.len(),
        };
        (3 + body + 3) & !3
    }

    /// Appends this segment, padded to 4 bytes.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let start = out.len();
        match self {
            Ahs::ExtendedCdb(c) => {
                out.extend_from_slice(&((c.len() + 1) as u16).to_be_bytes());
                out.push(ahs_type::EXTENDED_CDB);
                out.push(0);
                out.extend_from_slice(c);
            }
            Ahs::BidiReadLength(l) => {
                out.extend_from_slice(&5u16.to_be_bytes());
                out.push(ahs_type::BIDI_READ_LENGTH);
                out.push(0);
                out.extend_from_slice(&l.to_be_bytes());
            }
            Ahs::Unknown { kind, data } => {
                out.extend_from_slice(&(data.len() as u16).to_be_bytes());
                out.push(*kind);
                out.extend_from_slice(data);
            }
        }
        while !(out.len() - start).is_multiple_of(4) {
            out.push(0);
        }
    }
}

struct ExtendedCdbParse;

impl ExtendedCdbParse {
    fn parse(body: &[u8]) -> Result<Ahs, WireError> {
        // body[0] is reserved; the CDB continuation follows.
        if body.len() < 2 {
            return Err(WireError);
        }
        Ok(Ahs::ExtendedCdb(body[1..].to_vec()))
    }
}

/// Padding to the next 4-byte boundary (RFC 7143 §11.2.3).
pub const fn pad4(len: usize) -> usize {
    (4 - (len & 3)) & 3
}

/// CRC32C as iSCSI digests use it (RFC 7143 §13.1; the value goes on the wire little endian,
/// RFC 3385).
pub fn digest(parts: &[&[u8]]) -> u32 {
    let mut c = 0u32;
    for p in parts {
        c = crc32c::crc32c_append(c, p);
    }
    c
}

/// A PDU as a driver received it, digests already checked.
#[derive(Debug, Clone)]
pub struct RxPdu {
    pub bhs: [u8; BHS_LEN],
    pub ahs: Vec<u8>,
    pub data: Bytes,
    /// False when the data digest did not match (the header digest is fatal).
    pub data_digest_ok: bool,
    /// The message ended before the data segment its DataSegmentLength announced (an iSER
    /// SEND without it, RFC 7145 §7.3; docs/WIRE.md §6): `data` is empty and the PDU is
    /// rejected with reason Protocol Error, as one with a data digest error is discarded.
    pub data_short: bool,
}

impl RxPdu {
    pub fn header(&self) -> Bhs<&[u8]> {
        Bhs::new_unchecked(&self.bhs[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(r: BhsRepr) {
        let mut buf = [0xa5u8; BHS_LEN];
        r.emit(&mut Bhs::new_unchecked(&mut buf[..]));
        assert_eq!(buf[4], 0, "TotalAHSLength is written as zero");
        let back = BhsRepr::parse(&Bhs::new_checked(&buf[..]).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn truncated() {
        assert_eq!(Bhs::new_checked(&[0u8; 47][..]).unwrap_err(), WireError);
        assert!(Bhs::new_checked(&[0u8; 48][..]).is_ok());
    }

    #[test]
    fn unknown_opcode() {
        let mut b = [0u8; 48];
        b[0] = 0x1c;
        let p = Bhs::new_checked(&b[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::Unknown(0x1c));
        assert!(BhsRepr::parse(&p).is_err());
    }

    #[test]
    fn opcode_roundtrip() {
        for v in 0u8..0x40 {
            assert_eq!(u8::from(Opcode::from(v)), v);
        }
    }

    #[test]
    fn parse_scsi_command_bytes() {
        // READ(10) of 8 blocks at LBA 0x20, ITT 0x11223344, CmdSN 5, EDTL 4096, LUN 1.
        let mut b = [0u8; 48];
        b[0] = 0x01;
        b[1] = 0x80 | 0x40 | 0x01;
        b[9] = 1;
        b[16..20].copy_from_slice(&0x1122_3344u32.to_be_bytes());
        b[20..24].copy_from_slice(&4096u32.to_be_bytes());
        b[24..28].copy_from_slice(&5u32.to_be_bytes());
        b[28..32].copy_from_slice(&7u32.to_be_bytes());
        b[32] = 0x28;
        b[37] = 0x20;
        b[40] = 8;
        let c = ScsiCommand::parse(&Bhs::new_checked(&b[..]).unwrap()).unwrap();
        assert!(c.final_ && c.read && !c.write && !c.immediate);
        assert_eq!(c.attr, 1);
        assert_eq!(c.lun, [0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            (c.itt, c.edtl, c.cmd_sn, c.exp_stat_sn),
            (0x1122_3344, 4096, 5, 7)
        );
        assert_eq!(c.cdb[0], 0x28);
        let mut out = [0xa5u8; 48];
        c.emit(&mut Bhs::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
    }

    #[test]
    fn emit_every_opcode() {
        let lun = [0, 3, 0, 0, 0, 0, 0, 0];
        roundtrip(BhsRepr::NopOut(NopOut {
            immediate: true,
            lun,
            itt: 1,
            ttt: RESERVED_TAG,
            cmd_sn: 2,
            exp_stat_sn: 3,
            data_len: 8,
        }));
        roundtrip(BhsRepr::ScsiCommand(ScsiCommand {
            immediate: false,
            final_: true,
            read: false,
            write: true,
            attr: 2,
            lun,
            itt: 9,
            edtl: 65536,
            cmd_sn: 10,
            exp_stat_sn: 11,
            cdb: [0x2a; 16],
            data_len: 8192,
        }));
        roundtrip(BhsRepr::TaskMgmtRequest(TaskMgmtRequest {
            immediate: true,
            function: tmf::ABORT_TASK,
            lun,
            itt: 4,
            ref_task_tag: 9,
            cmd_sn: 12,
            exp_stat_sn: 13,
            ref_cmd_sn: 10,
            exp_data_sn: 0,
        }));
        roundtrip(BhsRepr::LoginRequest(LoginRequest {
            transit: true,
            continue_: false,
            csg: 1,
            nsg: 3,
            version_max: 0,
            version_min: 0,
            isid: [0x80, 1, 2, 3, 4, 5],
            tsih: 0,
            itt: 0,
            cid: 1,
            cmd_sn: 1,
            exp_stat_sn: 0,
            data_len: 100,
        }));
        roundtrip(BhsRepr::TextRequest(TextRequest {
            immediate: true,
            final_: false,
            continue_: true,
            lun,
            itt: 5,
            ttt: RESERVED_TAG,
            cmd_sn: 1,
            exp_stat_sn: 2,
            data_len: 16,
        }));
        roundtrip(BhsRepr::DataOut(DataOut {
            final_: true,
            lun,
            itt: 9,
            ttt: 0x77,
            exp_stat_sn: 4,
            data_sn: 3,
            buffer_offset: 8192,
            data_len: 4096,
        }));
        roundtrip(BhsRepr::LogoutRequest(LogoutRequest {
            immediate: true,
            reason: 0,
            itt: 6,
            cid: 1,
            cmd_sn: 7,
            exp_stat_sn: 8,
        }));
        roundtrip(BhsRepr::Snack(Snack {
            kind: 1,
            lun,
            itt: 1,
            ttt: 2,
            exp_stat_sn: 3,
            beg_run: 4,
            run_length: 5,
        }));
        roundtrip(BhsRepr::NopIn(NopIn {
            lun,
            itt: RESERVED_TAG,
            ttt: 5,
            stat_sn: 6,
            exp_cmd_sn: 7,
            max_cmd_sn: 8,
            data_len: 0,
        }));
        roundtrip(BhsRepr::ScsiResponse(ScsiResponse {
            bidi_overflow: false,
            bidi_underflow: true,
            overflow: false,
            underflow: true,
            response: 0,
            status: 2,
            itt: 9,
            snack_tag: 0,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 3,
            exp_data_sn: 4,
            bidi_residual: 5,
            residual: 6,
            data_len: 20,
        }));
        roundtrip(BhsRepr::TaskMgmtResponse(TaskMgmtResponse {
            response: tmf::TASK_DOES_NOT_EXIST,
            itt: 4,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 3,
        }));
        roundtrip(BhsRepr::LoginResponse(LoginResponse {
            transit: true,
            continue_: false,
            csg: 0,
            nsg: 1,
            version_max: 0,
            version_active: 0,
            isid: [0x80, 1, 2, 3, 4, 5],
            tsih: 7,
            itt: 0,
            stat_sn: 1,
            exp_cmd_sn: 1,
            max_cmd_sn: 32,
            status_class: 2,
            status_detail: 1,
            data_len: 40,
        }));
        roundtrip(BhsRepr::TextResponse(TextResponse {
            final_: true,
            continue_: false,
            lun,
            itt: 5,
            ttt: RESERVED_TAG,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 3,
            data_len: 200,
        }));
        roundtrip(BhsRepr::DataIn(DataIn {
            final_: true,
            ack: false,
            overflow: false,
            underflow: true,
            status_present: true,
            status: 0,
            lun,
            itt: 9,
            ttt: RESERVED_TAG,
            stat_sn: 3,
            exp_cmd_sn: 4,
            max_cmd_sn: 5,
            data_sn: 6,
            buffer_offset: 7,
            residual: 8,
            data_len: 512,
        }));
        roundtrip(BhsRepr::LogoutResponse(LogoutResponse {
            response: 0,
            itt: 6,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 3,
            time2wait: 2,
            time2retain: 20,
        }));
        roundtrip(BhsRepr::R2t(R2t {
            lun,
            itt: 9,
            ttt: 0x10,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 3,
            r2t_sn: 0,
            buffer_offset: 65536,
            desired_len: 262144,
        }));
        roundtrip(BhsRepr::AsyncMessage(AsyncMessage {
            lun,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 3,
            event: 1,
            vcode: 0,
            param1: 0,
            param2: 0,
            param3: 10,
            data_len: 0,
        }));
        roundtrip(BhsRepr::Reject(Reject {
            reason: reject_reason::PROTOCOL_ERROR,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 3,
            data_sn: 0,
            data_len: 48,
        }));
    }

    #[test]
    fn bad_field() {
        // Data-In with S but without F.
        let mut b = [0u8; 48];
        b[0] = 0x25;
        b[1] = flags::STATUS;
        assert!(BhsRepr::parse(&Bhs::new_checked(&b[..]).unwrap()).is_err());
        // Text Request with both F and C.
        let mut b = [0u8; 48];
        b[0] = 0x04;
        b[1] = 0xc0;
        assert!(BhsRepr::parse(&Bhs::new_checked(&b[..]).unwrap()).is_err());
        // Task management request without F.
        let mut b = [0u8; 48];
        b[0] = 0x02;
        b[1] = 0x01;
        assert!(BhsRepr::parse(&Bhs::new_checked(&b[..]).unwrap()).is_err());
    }

    #[test]
    fn data_segment_len_and_ahs() {
        let mut b = [0u8; 48];
        let mut p = Bhs::new_unchecked(&mut b[..]);
        p.set_data_segment_len(0x00ab_cdef);
        p.set_total_ahs_len(8);
        assert_eq!(p.data_segment_len(), 0x00ab_cdef);
        assert_eq!(p.total_ahs_len(), 8);
        assert_eq!(&b[4..8], &[2, 0xab, 0xcd, 0xef]);
    }

    #[test]
    fn ahs_parse_emit() {
        let segs = vec![
            Ahs::ExtendedCdb((0u8..16).collect()),
            Ahs::BidiReadLength(4096),
        ];
        let mut out = Vec::new();
        for s in &segs {
            s.emit(&mut out);
        }
        assert_eq!(out.len(), segs.iter().map(Ahs::buffer_len).sum::<usize>());
        assert_eq!(&out[..4], &[0, 17, 1, 0]);
        assert_eq!(out.len() % 4, 0);
        assert_eq!(Ahs::parse_all(&out).unwrap(), segs);
        // The bidi AHS exactly as RFC 7143 §11.2.2.4 lays it out.
        let bidi = [0, 5, 2, 0, 0, 0, 0x10, 0];
        assert_eq!(
            Ahs::parse_all(&bidi).unwrap(),
            vec![Ahs::BidiReadLength(4096)]
        );
    }

    #[test]
    fn ahs_truncated() {
        assert!(Ahs::parse_all(&[0, 5, 2]).is_err());
        assert!(Ahs::parse_all(&[0, 5, 2, 0, 0, 0, 0x10]).is_err());
        assert!(Ahs::parse_all(&[0, 5, 2, 0, 0, 0, 0x10, 0, 0, 0, 0, 0]).is_err());
        assert!(Ahs::parse_all(&[0, 0, 1, 0]).is_err());
        assert!(Ahs::parse_all(&[0, 4, 2, 0, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn crc32c_digest() {
        // RFC 3720 Appendix B.4 test vector: 32 bytes of zero.
        assert_eq!(digest(&[&[0u8; 32]]), 0x8a91_36aa);
        assert_eq!(digest(&[&[0u8; 16], &[0u8; 16]]), 0x8a91_36aa);
        assert_eq!(digest(&[&[0xffu8; 32]]), 0x62a8_ab43);
    }

    #[test]
    fn pad() {
        assert_eq!(
            (pad4(0), pad4(1), pad4(2), pad4(3), pad4(4)),
            (0, 3, 2, 1, 0)
        );
    }
}
