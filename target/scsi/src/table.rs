//! The command table: one entry per supported operation code / service action. Dispatch,
//! CDB reserved-bit validation, REPORT SUPPORTED OPERATION CODES (SPC-4 6.35) and the
//! reservation conflict checks (SPC-4 5.13, SBC-4 4.17) all read this table, so they cannot
//! disagree.
//!
//! The CDB usage data of an entry is the bit map REPORT SUPPORTED OPERATION CODES returns: a
//! bit is one when the device server evaluates it. The dispatcher rejects any CDB bit that is
//! set where the map has a zero with INVALID FIELD IN CDB, which covers reserved fields,
//! unsupported protection fields, NACA and LINK in the control byte.

use super::sense::Sense;

/// Handler selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    TestUnitReady,
    RequestSense,
    Read,
    Write,
    Inquiry,
    ModeSelect,
    Reserve,
    Release,
    ModeSense,
    StartStopUnit,
    PreventAllow,
    ReadCapacity10,
    WriteAndVerify,
    Verify,
    PreFetch,
    SynchronizeCache,
    ReadDefectData,
    WriteSame,
    Unmap,
    PrIn,
    PrOut,
    ExtendedCopy,
    ReceiveCopyResults,
    OrWrite,
    CompareAndWrite,
    WriteAtomic,
    ReadCapacity16,
    GetLbaStatus,
    ReportSupportedOpcodes,
    ReportSupportedTmf,
    ReportTargetPortGroups,
    SetTargetPortGroups,
    ReportLuns,
    Sanitize,
}

impl Op {
    /// Processed while a sanitize operation is in progress (SBC-4 4.11); every other command
    /// gets NOT READY, SANITIZE IN PROGRESS.
    pub fn allowed_during_sanitize(self) -> bool {
        matches!(
            self,
            Op::Inquiry
                | Op::RequestSense
                | Op::ReportLuns
                | Op::ReportSupportedOpcodes
                | Op::ReportSupportedTmf
        )
    }
}

/// Data transfer direction of the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    None,
    In,
    Out,
}

/// How a command fares under a persistent reservation held by another I_T nexus
/// (SPC-4 Table 61, SBC-4 Table 14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrClass {
    /// Allowed under every reservation type.
    Allowed,
    /// Reads the medium: allowed for Write Exclusive types, conflicts for Exclusive Access.
    Read,
    /// Modifies the medium or LU state: conflicts for every type.
    Write,
    /// START STOP UNIT: allowed only with START=1 and POWER CONDITION=0.
    StartStop,
    /// PREVENT ALLOW MEDIUM REMOVAL: allowed only with PREVENT=0.
    PreventAllow,
    /// RESERVE/RELEASE(6/10): conflict whenever persistent reservations are in use.
    Spc2,
}

/// Which devices support the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    Always,
    /// Only thin-provisioned logical units (LBPME=1).
    Thin,
    /// Only logical units with a target port group that allows explicit changes.
    ExplicitAlua,
}

#[derive(Debug)]
pub struct CmdDesc {
    pub opcode: u8,
    pub sa: Option<u8>,
    pub name: &'static str,
    pub op: Op,
    /// CDB usage data; its length is the CDB length.
    pub usage: &'static [u8],
    pub dir: Dir,
    pub pr: PrClass,
    /// Allowed from other I_T nexuses while an SPC-2 reservation is held (SPC-2 5.5.1).
    pub spc2_ok: bool,
    /// Needs the medium: refused with NOT READY while stopped or sanitizing.
    pub media: bool,
    pub support: Support,
    /// Recommended command timeout in seconds (REPORT SUPPORTED OPERATION CODES, RCTD).
    pub timeout: u32,
}

impl CmdDesc {
    pub fn cdb_len(&self) -> usize {
        self.usage.len()
    }
}

const fn d(
    opcode: u8,
    sa: Option<u8>,
    name: &'static str,
    op: Op,
    usage: &'static [u8],
    dir: Dir,
    pr: PrClass,
) -> CmdDesc {
    CmdDesc {
        opcode,
        sa,
        name,
        op,
        usage,
        dir,
        pr,
        spc2_ok: false,
        media: false,
        support: Support::Always,
        timeout: 30,
    }
}

const fn media(mut c: CmdDesc) -> CmdDesc {
    c.media = true;
    c
}

const fn spc2_ok(mut c: CmdDesc) -> CmdDesc {
    c.spc2_ok = true;
    c
}

const fn thin(mut c: CmdDesc) -> CmdDesc {
    c.support = Support::Thin;
    c
}

const fn explicit_alua(mut c: CmdDesc) -> CmdDesc {
    c.support = Support::ExplicitAlua;
    c
}

const fn slow(mut c: CmdDesc, timeout: u32) -> CmdDesc {
    c.timeout = timeout;
    c
}

use Dir::{In, Out};
use PrClass::{Allowed, Read, Write};

/// LBA (4 bytes) of 10/12-byte CDBs and (8 bytes) of 16-byte CDBs.
const L4: u8 = 0xff;

#[rustfmt::skip]
pub static TABLE: &[CmdDesc] = &[
    d(0x00, None, "TEST UNIT READY", Op::TestUnitReady, &[0x00, 0, 0, 0, 0, 0], Dir::None, Allowed),
    spc2_ok(d(0x03, None, "REQUEST SENSE", Op::RequestSense, &[0x03, 0x01, 0, 0, 0xff, 0], In, Allowed)),
    media(d(0x08, None, "READ(6)", Op::Read, &[0x08, 0x1f, 0xff, 0xff, 0xff, 0], In, Read)),
    media(d(0x0a, None, "WRITE(6)", Op::Write, &[0x0a, 0x1f, 0xff, 0xff, 0xff, 0], Out, Write)),
    spc2_ok(d(0x12, None, "INQUIRY", Op::Inquiry, &[0x12, 0x01, 0xff, 0xff, 0xff, 0], In, Allowed)),
    d(0x15, None, "MODE SELECT(6)", Op::ModeSelect, &[0x15, 0x11, 0, 0, 0xff, 0], Out, Write),
    spc2_ok(d(0x16, None, "RESERVE(6)", Op::Reserve, &[0x16, 0, 0, 0, 0, 0], Dir::None, PrClass::Spc2)),
    spc2_ok(d(0x17, None, "RELEASE(6)", Op::Release, &[0x17, 0, 0, 0, 0, 0], Dir::None, PrClass::Spc2)),
    d(0x1a, None, "MODE SENSE(6)", Op::ModeSense, &[0x1a, 0x08, 0xff, 0xff, 0xff, 0], In, Read),
    d(0x1b, None, "START STOP UNIT", Op::StartStopUnit, &[0x1b, 0x01, 0, 0x0f, 0xf7, 0], Dir::None, PrClass::StartStop),
    d(0x1e, None, "PREVENT ALLOW MEDIUM REMOVAL", Op::PreventAllow, &[0x1e, 0, 0, 0, 0x03, 0], Dir::None, PrClass::PreventAllow),
    media(d(0x25, None, "READ CAPACITY(10)", Op::ReadCapacity10, &[0x25, 0, L4, L4, L4, L4, 0, 0, 0x01, 0], In, Allowed)),
    media(d(0x28, None, "READ(10)", Op::Read, &[0x28, 0x1a, L4, L4, L4, L4, 0x1f, 0xff, 0xff, 0], In, Read)),
    media(d(0x2a, None, "WRITE(10)", Op::Write, &[0x2a, 0x1a, L4, L4, L4, L4, 0x1f, 0xff, 0xff, 0], Out, Write)),
    media(d(0x2e, None, "WRITE AND VERIFY(10)", Op::WriteAndVerify, &[0x2e, 0x16, L4, L4, L4, L4, 0x1f, 0xff, 0xff, 0], Out, Write)),
    media(d(0x2f, None, "VERIFY(10)", Op::Verify, &[0x2f, 0x16, L4, L4, L4, L4, 0x1f, 0xff, 0xff, 0], Out, Read)),
    media(d(0x34, None, "PRE-FETCH(10)", Op::PreFetch, &[0x34, 0x02, L4, L4, L4, L4, 0x1f, 0xff, 0xff, 0], Dir::None, Read)),
    media(d(0x35, None, "SYNCHRONIZE CACHE(10)", Op::SynchronizeCache, &[0x35, 0x06, L4, L4, L4, L4, 0x1f, 0xff, 0xff, 0], Dir::None, Write)),
    media(d(0x37, None, "READ DEFECT DATA(10)", Op::ReadDefectData, &[0x37, 0, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0], In, Read)),
    slow(media(d(0x41, None, "WRITE SAME(10)", Op::WriteSame, &[0x41, 0x18, L4, L4, L4, L4, 0x1f, 0xff, 0xff, 0], Out, Write)), 300),
    slow(thin(media(d(0x42, None, "UNMAP", Op::Unmap, &[0x42, 0x01, 0, 0, 0, 0, 0x1f, 0xff, 0xff, 0], Out, Write))), 300),
    slow(media(d(0x48, Some(0x01), "SANITIZE OVERWRITE", Op::Sanitize, &[0x48, 0xa1, 0, 0, 0, 0, 0, 0xff, 0xff, 0], Out, Write)), 3600),
    slow(thin(media(d(0x48, Some(0x02), "SANITIZE BLOCK ERASE", Op::Sanitize, &[0x48, 0xa2, 0, 0, 0, 0, 0, 0xff, 0xff, 0], Out, Write))), 3600),
    slow(media(d(0x48, Some(0x03), "SANITIZE CRYPTOGRAPHIC ERASE", Op::Sanitize, &[0x48, 0xa3, 0, 0, 0, 0, 0, 0xff, 0xff, 0], Out, Write)), 3600),
    d(0x48, Some(0x1f), "SANITIZE EXIT FAILURE MODE", Op::Sanitize, &[0x48, 0xbf, 0, 0, 0, 0, 0, 0xff, 0xff, 0], Out, Write),
    d(0x55, None, "MODE SELECT(10)", Op::ModeSelect, &[0x55, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, 0], Out, Write),
    spc2_ok(d(0x56, None, "RESERVE(10)", Op::Reserve, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0], Dir::None, PrClass::Spc2)),
    spc2_ok(d(0x57, None, "RELEASE(10)", Op::Release, &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0], Dir::None, PrClass::Spc2)),
    d(0x5a, None, "MODE SENSE(10)", Op::ModeSense, &[0x5a, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0], In, Read),
    d(0x5e, Some(0x00), "PERSISTENT RESERVE IN READ KEYS", Op::PrIn, &[0x5e, 0x00, 0, 0, 0, 0, 0, 0xff, 0xff, 0], In, Allowed),
    d(0x5e, Some(0x01), "PERSISTENT RESERVE IN READ RESERVATION", Op::PrIn, &[0x5e, 0x01, 0, 0, 0, 0, 0, 0xff, 0xff, 0], In, Allowed),
    d(0x5e, Some(0x02), "PERSISTENT RESERVE IN REPORT CAPABILITIES", Op::PrIn, &[0x5e, 0x02, 0, 0, 0, 0, 0, 0xff, 0xff, 0], In, Allowed),
    d(0x5e, Some(0x03), "PERSISTENT RESERVE IN READ FULL STATUS", Op::PrIn, &[0x5e, 0x03, 0, 0, 0, 0, 0, 0xff, 0xff, 0], In, Allowed),
    d(0x5f, Some(0x00), "PERSISTENT RESERVE OUT REGISTER", Op::PrOut, &[0x5f, 0x00, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0], Out, Allowed),
    d(0x5f, Some(0x01), "PERSISTENT RESERVE OUT RESERVE", Op::PrOut, &[0x5f, 0x01, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0], Out, Allowed),
    d(0x5f, Some(0x02), "PERSISTENT RESERVE OUT RELEASE", Op::PrOut, &[0x5f, 0x02, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0], Out, Allowed),
    d(0x5f, Some(0x03), "PERSISTENT RESERVE OUT CLEAR", Op::PrOut, &[0x5f, 0x03, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0], Out, Allowed),
    d(0x5f, Some(0x04), "PERSISTENT RESERVE OUT PREEMPT", Op::PrOut, &[0x5f, 0x04, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0], Out, Allowed),
    d(0x5f, Some(0x05), "PERSISTENT RESERVE OUT PREEMPT AND ABORT", Op::PrOut, &[0x5f, 0x05, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0], Out, Allowed),
    d(0x5f, Some(0x06), "PERSISTENT RESERVE OUT REGISTER AND IGNORE EXISTING KEY", Op::PrOut, &[0x5f, 0x06, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0], Out, Allowed),
    d(0x5f, Some(0x07), "PERSISTENT RESERVE OUT REGISTER AND MOVE", Op::PrOut, &[0x5f, 0x07, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0], Out, Allowed),
    slow(media(d(0x83, Some(0x00), "EXTENDED COPY(LID1)", Op::ExtendedCopy, &[0x83, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0], Out, Write)), 300),
    d(0x84, Some(0x00), "RECEIVE COPY STATUS(LID1)", Op::ReceiveCopyResults, &[0x84, 0x00, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0], In, Read),
    d(0x84, Some(0x01), "RECEIVE COPY DATA(LID1)", Op::ReceiveCopyResults, &[0x84, 0x01, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0], In, Read),
    d(0x84, Some(0x03), "RECEIVE COPY OPERATING PARAMETERS", Op::ReceiveCopyResults, &[0x84, 0x03, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0], In, Read),
    media(d(0x88, None, "READ(16)", Op::Read, &[0x88, 0x1a, L4, L4, L4, L4, L4, L4, L4, L4, 0xff, 0xff, 0xff, 0xff, 0x1f, 0], In, Read)),
    media(d(0x89, None, "COMPARE AND WRITE", Op::CompareAndWrite, &[0x89, 0x1a, L4, L4, L4, L4, L4, L4, L4, L4, 0, 0, 0, 0xff, 0x1f, 0], Out, Write)),
    media(d(0x8a, None, "WRITE(16)", Op::Write, &[0x8a, 0x1a, L4, L4, L4, L4, L4, L4, L4, L4, 0xff, 0xff, 0xff, 0xff, 0x1f, 0], Out, Write)),
    media(d(0x8b, None, "ORWRITE(16)", Op::OrWrite, &[0x8b, 0x1a, L4, L4, L4, L4, L4, L4, L4, L4, 0xff, 0xff, 0xff, 0xff, 0x1f, 0], Out, Write)),
    media(d(0x8e, None, "WRITE AND VERIFY(16)", Op::WriteAndVerify, &[0x8e, 0x16, L4, L4, L4, L4, L4, L4, L4, L4, 0xff, 0xff, 0xff, 0xff, 0x1f, 0], Out, Write)),
    media(d(0x8f, None, "VERIFY(16)", Op::Verify, &[0x8f, 0x16, L4, L4, L4, L4, L4, L4, L4, L4, 0xff, 0xff, 0xff, 0xff, 0x1f, 0], Out, Read)),
    media(d(0x90, None, "PRE-FETCH(16)", Op::PreFetch, &[0x90, 0x02, L4, L4, L4, L4, L4, L4, L4, L4, 0xff, 0xff, 0xff, 0xff, 0x1f, 0], Dir::None, Read)),
    media(d(0x91, None, "SYNCHRONIZE CACHE(16)", Op::SynchronizeCache, &[0x91, 0x06, L4, L4, L4, L4, L4, L4, L4, L4, 0xff, 0xff, 0xff, 0xff, 0x1f, 0], Dir::None, Write)),
    slow(media(d(0x93, None, "WRITE SAME(16)", Op::WriteSame, &[0x93, 0x19, L4, L4, L4, L4, L4, L4, L4, L4, 0xff, 0xff, 0xff, 0xff, 0x1f, 0], Out, Write)), 300),
    media(d(0x9c, None, "WRITE ATOMIC(16)", Op::WriteAtomic, &[0x9c, 0x18, L4, L4, L4, L4, L4, L4, L4, L4, 0, 0, 0xff, 0xff, 0x1f, 0], Out, Write)),
    media(d(0x9e, Some(0x10), "READ CAPACITY(16)", Op::ReadCapacity16, &[0x9e, 0x10, L4, L4, L4, L4, L4, L4, L4, L4, 0xff, 0xff, 0xff, 0xff, 0x01, 0], In, Allowed)),
    media(d(0x9e, Some(0x12), "GET LBA STATUS", Op::GetLbaStatus, &[0x9e, 0x12, L4, L4, L4, L4, L4, L4, L4, L4, 0xff, 0xff, 0xff, 0xff, 0, 0], In, Read)),
    spc2_ok(d(0xa0, None, "REPORT LUNS", Op::ReportLuns, &[0xa0, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0], In, Allowed)),
    d(0xa3, Some(0x0a), "REPORT TARGET PORT GROUPS", Op::ReportTargetPortGroups, &[0xa3, 0xea, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0], In, Allowed),
    d(0xa3, Some(0x0c), "REPORT SUPPORTED OPERATION CODES", Op::ReportSupportedOpcodes, &[0xa3, 0x0c, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0], In, Allowed),
    d(0xa3, Some(0x0d), "REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS", Op::ReportSupportedTmf, &[0xa3, 0x0d, 0x80, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0], In, Allowed),
    explicit_alua(d(0xa4, Some(0x0a), "SET TARGET PORT GROUPS", Op::SetTargetPortGroups, &[0xa4, 0x0a, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0], Out, Write)),
    media(d(0xa8, None, "READ(12)", Op::Read, &[0xa8, 0x1a, L4, L4, L4, L4, 0xff, 0xff, 0xff, 0xff, 0x1f, 0], In, Read)),
    media(d(0xaa, None, "WRITE(12)", Op::Write, &[0xaa, 0x1a, L4, L4, L4, L4, 0xff, 0xff, 0xff, 0xff, 0x1f, 0], Out, Write)),
    media(d(0xae, None, "WRITE AND VERIFY(12)", Op::WriteAndVerify, &[0xae, 0x16, L4, L4, L4, L4, 0xff, 0xff, 0xff, 0xff, 0x1f, 0], Out, Write)),
    media(d(0xaf, None, "VERIFY(12)", Op::Verify, &[0xaf, 0x16, L4, L4, L4, L4, 0xff, 0xff, 0xff, 0xff, 0x1f, 0], Out, Read)),
    media(d(0xb7, None, "READ DEFECT DATA(12)", Op::ReadDefectData, &[0xb7, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0], In, Read)),
];

/// PARAMETER LIST LENGTH of the commands whose data-out is a parameter list: the transfer
/// length residuals are computed from.
pub fn param_list_len(desc: &CmdDesc, cdb: &[u8]) -> Option<u32> {
    use super::cdb::field;
    let field = match (desc.op, desc.opcode) {
        (Op::ModeSelect, 0x15) => field::ALLOC6,
        (Op::ModeSelect, _) | (Op::Unmap, _) | (Op::Sanitize, _) => field::PARAM_LEN10,
        (Op::PrOut, _) => field::PR_PARAM_LEN,
        (Op::SetTargetPortGroups, _) => field::ALLOC12,
        (Op::ExtendedCopy, _) => field::XCOPY_PARAM_LEN,
        _ => return None,
    };
    Some(super::cdb::be(cdb.get(field)?) as u32)
}

/// Operation codes whose CDB carries a service action in byte 1 bits 4:0.
pub fn has_service_action(opcode: u8) -> bool {
    TABLE.iter().any(|c| c.opcode == opcode && c.sa.is_some())
}

/// Result of looking an opcode up.
#[derive(Debug)]
pub enum Lookup {
    Found(&'static CmdDesc),
    UnknownOpcode,
    /// The opcode exists but not with this service action.
    UnknownServiceAction,
}

/// Finds the entry for a CDB's opcode (and service action). `supported` filters entries the
/// logical unit does not implement (e.g. UNMAP on a fully provisioned LU).
pub fn lookup(cdb: &[u8], supported: impl Fn(&CmdDesc) -> bool) -> Lookup {
    let Some(&opcode) = cdb.first() else {
        return Lookup::UnknownOpcode;
    };
    if has_service_action(opcode) {
        let sa = cdb.get(1).copied().unwrap_or(0) & 0x1f;
        match TABLE
            .iter()
            .find(|c| c.opcode == opcode && c.sa == Some(sa) && supported(c))
        {
            Some(c) => Lookup::Found(c),
            None => Lookup::UnknownServiceAction,
        }
    } else {
        match TABLE.iter().find(|c| c.opcode == opcode && supported(c)) {
            Some(c) => Lookup::Found(c),
            None => Lookup::UnknownOpcode,
        }
    }
}

/// Rejects any CDB bit the usage map does not cover (reserved bits, unsupported fields,
/// NACA/LINK), pointing at the highest offending bit.
pub fn check_usage(desc: &CmdDesc, cdb: &[u8]) -> Result<(), Sense> {
    for (i, (&b, &u)) in cdb.iter().zip(desc.usage.iter()).enumerate() {
        let extra = b & !u;
        if extra != 0 {
            let bit = 7 - extra.leading_zeros() as u8;
            return Err(Sense::invalid_cdb(i, Some(bit)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for c in TABLE {
            assert_eq!(c.usage[0], c.opcode, "{}", c.name);
            let group_len = match c.opcode >> 5 {
                0 => 6,
                1 | 2 => 10,
                4 => 16,
                5 => 12,
                _ => 0,
            };
            assert_eq!(c.cdb_len(), group_len, "{}", c.name);
            if let Some(sa) = c.sa {
                assert_eq!(c.usage[1] & 0x1f, sa, "{}", c.name);
            }
            // Control byte: NACA and LINK are not supported.
            assert_eq!(c.usage[c.cdb_len() - 1], 0, "{}", c.name);
            // No duplicate entries.
            assert_eq!(
                TABLE
                    .iter()
                    .filter(|o| o.opcode == c.opcode && o.sa == c.sa)
                    .count(),
                1,
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn lookup_by_service_action() {
        let all = |_: &CmdDesc| true;
        assert!(
            matches!(lookup(&[0x9e, 0x10], all), Lookup::Found(c) if c.op == Op::ReadCapacity16)
        );
        assert!(matches!(
            lookup(&[0x9e, 0x11], all),
            Lookup::UnknownServiceAction
        ));
        assert!(matches!(lookup(&[0x7f, 0], all), Lookup::UnknownOpcode));
        assert!(matches!(lookup(&[], all), Lookup::UnknownOpcode));
        assert!(matches!(
            lookup(&[0x42], |c: &CmdDesc| c.support == Support::Always),
            Lookup::UnknownOpcode
        ));
    }

    #[test]
    fn bad_field_reserved_bit() {
        let read10 = TABLE.iter().find(|c| c.opcode == 0x28).unwrap();
        let mut cdb = [0u8; 10];
        cdb[0] = 0x28;
        cdb[1] = 0x20; // RDPROTECT=1
        assert_eq!(
            check_usage(read10, &cdb),
            Err(Sense::invalid_cdb(1, Some(5)))
        );
        cdb[1] = 0x18;
        assert_eq!(check_usage(read10, &cdb), Ok(()));
        cdb[9] = 0x04; // NACA
        assert_eq!(
            check_usage(read10, &cdb),
            Err(Sense::invalid_cdb(9, Some(2)))
        );
    }
}
