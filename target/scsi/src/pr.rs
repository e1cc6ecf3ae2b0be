//! Reservations: SPC-2 RESERVE/RELEASE and SPC-4 persistent reservations (SPC-4 5.13,
//! 6.15, 6.16), including the conflict table for every command class, TransportID decoding
//! (SPC-4 7.6.4) and APTPL persistence (atomic write: temporary file, fsync, rename).
//!
//! An I_T nexus is identified for reservations by its initiator port name and relative target
//! port, so registrations survive a session logging out and in again.

use std::fmt::Write as _;
use std::path::Path;

use super::cdb::{be, put_be16, put_be32, put_be64};
use super::sense::{asc, Sense};
use super::table::PrClass;
use super::ua::UnitAttention;
use super::{Fail, Nexus, ScsiError};

/// Persistent reservation types (SPC-4 Table 200).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrType {
    WriteExclusive = 1,
    ExclusiveAccess = 3,
    WriteExclusiveRegistrantsOnly = 5,
    ExclusiveAccessRegistrantsOnly = 6,
    WriteExclusiveAllRegistrants = 7,
    ExclusiveAccessAllRegistrants = 8,
}

impl PrType {
    pub fn from_u8(v: u8) -> Option<PrType> {
        Some(match v {
            1 => PrType::WriteExclusive,
            3 => PrType::ExclusiveAccess,
            5 => PrType::WriteExclusiveRegistrantsOnly,
            6 => PrType::ExclusiveAccessRegistrantsOnly,
            7 => PrType::WriteExclusiveAllRegistrants,
            8 => PrType::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveAllRegistrants | PrType::ExclusiveAccessAllRegistrants
        )
    }

    /// Registrants-only and all-registrants types grant access to every registrant.
    pub fn registrants_have_access(self) -> bool {
        !matches!(self, PrType::WriteExclusive | PrType::ExclusiveAccess)
    }

    fn exclusive_access(self) -> bool {
        matches!(
            self,
            PrType::ExclusiveAccess
                | PrType::ExclusiveAccessRegistrantsOnly
                | PrType::ExclusiveAccessAllRegistrants
        )
    }
}

/// One registered I_T nexus (or, with `all_tg_pt`, one initiator port on every target port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub key: u64,
    /// Initiator port name; for an iSCSI TransportID without ISID, the iSCSI name alone.
    pub initiator: String,
    pub transport_id: Vec<u8>,
    pub rel_port: u16,
    pub all_tg_pt: bool,
}

fn initiator_matches(reg: &str, port: &str) -> bool {
    if reg.eq_ignore_ascii_case(port) {
        return true;
    }
    // A name-only iSCSI TransportID covers every ISID of that initiator.
    port.len() > reg.len()
        && port.is_char_boundary(reg.len())
        && port[..reg.len()].eq_ignore_ascii_case(reg)
        && port[reg.len()..].to_ascii_lowercase().starts_with(",i,")
}

impl Registration {
    pub fn matches(&self, initiator: &str, rel_port: u16) -> bool {
        initiator_matches(&self.initiator, initiator)
            && (self.all_tg_pt || self.rel_port == rel_port)
    }

    fn same_identity(&self, o: &Registration) -> bool {
        self.initiator.eq_ignore_ascii_case(&o.initiator)
            && self.all_tg_pt == o.all_tg_pt
            && (self.all_tg_pt || self.rel_port == o.rel_port)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub ty: PrType,
    /// Index of the holding registration; `None` for all-registrants types.
    pub holder: Option<usize>,
}

/// The I_T nexus holding an SPC-2 reservation (RESERVE(6)/(10)), by its initiator port and
/// relative target port, so that gateways sharing the state know it too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spc2Holder {
    pub initiator_port: String,
    pub rel_port: u16,
}

impl Spc2Holder {
    pub fn of(n: &Nexus) -> Spc2Holder {
        Spc2Holder {
            initiator_port: n.initiator_port.clone(),
            rel_port: n.relative_port,
        }
    }

    pub fn is(&self, n: &Nexus) -> bool {
        self.rel_port == n.relative_port && self.initiator_port == n.initiator_port
    }
}

/// Reservation state of a logical unit: persistent reservations, and the SPC-2 reservation
/// (which is never persisted across a power loss).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrState {
    pub generation: u32,
    pub regs: Vec<Registration>,
    pub resv: Option<Reservation>,
    pub aptpl: bool,
    pub spc2: Option<Spc2Holder>,
    /// PREEMPT AND ABORTs so far (wrapping): gateways sharing the state abort the commands
    /// of the nexuses whose registrations a change removed when this moved. Never persisted.
    pub aborts: u32,
}

/// Registrations the engine keeps at most (INSUFFICIENT REGISTRATION RESOURCES beyond).
pub const MAX_REGISTRATIONS: usize = 256;

/// Who gets a unit attention after a PR OUT.
#[derive(Debug, Clone)]
pub struct UaTarget {
    pub reg: Registration,
    pub ua: UnitAttention,
}

impl PrState {
    pub fn reg_index(&self, n: &Nexus) -> Option<usize> {
        self.regs
            .iter()
            .position(|r| r.matches(&n.initiator_port, n.relative_port))
    }

    pub fn is_holder(&self, n: &Nexus) -> bool {
        match &self.resv {
            None => false,
            Some(r) if r.ty.all_registrants() => self.reg_index(n).is_some(),
            Some(r) => match (r.holder, self.reg_index(n)) {
                (Some(h), Some(i)) => h == i || self.regs[h].same_identity(&self.regs[i]),
                _ => false,
            },
        }
    }

    /// Whether a command of `class` from `n` conflicts with the persistent reservation
    /// (SPC-4 5.13.1 Table 61, SBC-4 Table 14).
    pub fn conflicts(&self, n: &Nexus, class: PrClass, cdb: &[u8]) -> bool {
        let Some(r) = &self.resv else {
            return false;
        };
        if self.is_holder(n) {
            return false;
        }
        let registered = self.reg_index(n).is_some();
        let access = r.ty.registrants_have_access() && registered;
        let write = || !access;
        match class {
            PrClass::Allowed | PrClass::Spc2 => false,
            PrClass::Read => r.ty.exclusive_access() && !access,
            PrClass::Write => write(),
            // START=1 with POWER CONDITION 0 is allowed (SBC-4 Table 14).
            PrClass::StartStop => !(cdb[4] & 0x01 != 0 && cdb[4] >> 4 == 0) && write(),
            // PREVENT=0 is allowed (SPC-4 Table 61).
            PrClass::PreventAllow => cdb[4] & 0x03 != 0 && write(),
        }
    }

    fn holder_key(&self) -> u64 {
        match &self.resv {
            Some(Reservation {
                holder: Some(h), ..
            }) => self.regs.get(*h).map_or(0, |r| r.key),
            _ => 0,
        }
    }

    /// Removes registration `i`, keeping the holder index valid. Returns whether the
    /// reservation was released because of it.
    fn remove_reg(&mut self, i: usize) -> bool {
        self.regs.remove(i);
        let mut released = false;
        if let Some(r) = &mut self.resv {
            match r.holder {
                Some(h) if h == i => {
                    released = true;
                }
                Some(h) if h > i => r.holder = Some(h - 1),
                _ => {}
            }
            if r.ty.all_registrants() && self.regs.is_empty() {
                released = true;
            }
        }
        if released {
            self.resv = None;
        }
        released
    }
}

/// PERSISTENT RESERVE IN (SPC-4 6.15): builds the full parameter data.
pub fn pr_in(st: &PrState, sa: u8, persist_capable: bool) -> Result<Vec<u8>, Sense> {
    let mut b = Vec::new();
    match sa {
        0x00 => {
            b.resize(8, 0);
            put_be32(&mut b[0..4], st.generation);
            put_be32(&mut b[4..8], (st.regs.len() * 8) as u32);
            for r in &st.regs {
                b.extend_from_slice(&r.key.to_be_bytes());
            }
        }
        0x01 => {
            b.resize(8, 0);
            put_be32(&mut b[0..4], st.generation);
            if let Some(r) = &st.resv {
                put_be32(&mut b[4..8], 16);
                let mut d = [0u8; 16];
                put_be64(&mut d[0..8], st.holder_key());
                d[13] = r.ty as u8;
                b.extend_from_slice(&d);
            }
        }
        0x02 => {
            b.resize(8, 0);
            put_be16(&mut b[0..2], 8);
            // SIP_C, ATP_C, PTPL_C.
            b[2] = 0x08 | 0x04 | u8::from(persist_capable);
            // TMV, ALLOW COMMANDS=001b, PTPL_A.
            b[3] = 0x80 | 0x10 | u8::from(st.aptpl);
            // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX; EX_AC_AR.
            b[4] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02;
            b[5] = 0x01;
        }
        0x03 => {
            b.resize(8, 0);
            put_be32(&mut b[0..4], st.generation);
            for (i, r) in st.regs.iter().enumerate() {
                let tid = transport_id_bytes(r);
                let mut d = vec![0u8; 24];
                put_be64(&mut d[0..8], r.key);
                let holder = match &st.resv {
                    Some(res) if res.ty.all_registrants() => Some(res.ty),
                    Some(res) if res.holder == Some(i) => Some(res.ty),
                    _ => None,
                };
                d[12] = (u8::from(r.all_tg_pt) << 1) | u8::from(holder.is_some());
                if let Some(ty) = holder {
                    d[13] = ty as u8;
                }
                if !r.all_tg_pt {
                    put_be16(&mut d[18..20], r.rel_port);
                }
                put_be32(&mut d[20..24], tid.len() as u32);
                d.extend_from_slice(&tid);
                b.extend_from_slice(&d);
            }
            let len = (b.len() - 8) as u32;
            put_be32(&mut b[4..8], len);
        }
        _ => return Err(Sense::invalid_cdb(1, Some(4))),
    }
    Ok(b)
}

/// Decodes a TransportID (SPC-4 7.6.4) into an initiator port name. Returns the name and the
/// TransportID length.
pub fn parse_transport_id(b: &[u8]) -> Option<(String, usize)> {
    let first = *b.first()?;
    let proto = first & 0x0f;
    let format = first >> 6;
    if proto == 5 {
        // iSCSI: NUL-terminated name, format 01b appends ",i,0x" and the ISID.
        if b.len() < 4 || format > 1 {
            return None;
        }
        let len = 4 + be(&b[2..4]) as usize;
        if len > b.len() || len < 5 {
            return None;
        }
        let s = &b[4..len];
        let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        let name = std::str::from_utf8(&s[..end]).ok()?;
        if name.is_empty() || (format == 1) != name.to_ascii_lowercase().contains(",i,0x") {
            return None;
        }
        Some((name.to_string(), len))
    } else {
        // Fixed 24-byte TransportIDs (FC, SBP, SRP, SAS): name the port by its identifier.
        if b.len() < 24 || format != 0 {
            return None;
        }
        let id: &[u8] = match proto {
            0 => &b[8..16],
            4 => &b[8..24],
            6 => &b[4..12],
            _ => &b[8..24],
        };
        let mut name = String::from("0x");
        for x in id {
            let _ = write!(name, "{x:02x}");
        }
        Some((name, 24))
    }
}

/// The TransportID reported for a registration: the one received, or an iSCSI TransportID
/// built from the port name.
fn transport_id_bytes(r: &Registration) -> Vec<u8> {
    if !r.transport_id.is_empty() {
        return r.transport_id.clone();
    }
    let name = r.initiator.as_bytes();
    let format: u8 = if r.initiator.to_ascii_lowercase().contains(",i,0x") {
        1
    } else {
        0
    };
    let mut len = name.len() + 1;
    len = len.max(20).next_multiple_of(4);
    let mut b = vec![0u8; 4 + len];
    b[0] = (format << 6) | 5;
    put_be16(&mut b[2..4], len as u16);
    b[4..4 + name.len()].copy_from_slice(name);
    b
}

/// Parsed PERSISTENT RESERVE OUT request (SPC-4 6.16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrOutReq {
    pub sa: u8,
    pub scope: u8,
    pub ty: u8,
    pub key: u64,
    pub sa_key: u64,
    pub spec_i_pt: bool,
    pub all_tg_pt: bool,
    pub aptpl: bool,
    /// SPEC_I_PT TransportIDs, or the REGISTER AND MOVE destination.
    pub tids: Vec<(String, Vec<u8>)>,
    /// REGISTER AND MOVE: UNREG and RELATIVE TARGET PORT IDENTIFIER.
    pub unreg: bool,
    pub move_rel_port: u16,
}

pub mod sa {
    pub const REGISTER: u8 = 0;
    pub const RESERVE: u8 = 1;
    pub const RELEASE: u8 = 2;
    pub const CLEAR: u8 = 3;
    pub const PREEMPT: u8 = 4;
    pub const PREEMPT_AND_ABORT: u8 = 5;
    pub const REGISTER_AND_IGNORE: u8 = 6;
    pub const REGISTER_AND_MOVE: u8 = 7;
}

impl PrOutReq {
    /// Parses CDB fields and the parameter list; `cdb_len` is the PARAMETER LIST LENGTH.
    pub fn parse(cdb: &[u8], data: &[u8]) -> Result<PrOutReq, Sense> {
        let sa = cdb[1] & 0x1f;
        let scope = cdb[2] >> 4;
        let ty = cdb[2] & 0x0f;
        let plen = be(&cdb[super::cdb::field::PR_PARAM_LEN]) as usize;
        let data = &data[..data.len().min(plen)];
        if data.len() < 24 {
            return Err(Sense::param_list_length());
        }
        let mut req = PrOutReq {
            sa,
            scope,
            ty,
            key: be(&data[0..8]),
            sa_key: be(&data[8..16]),
            spec_i_pt: false,
            all_tg_pt: false,
            aptpl: false,
            tids: Vec::new(),
            unreg: false,
            move_rel_port: 0,
        };
        if sa == sa::REGISTER_AND_MOVE {
            if data[16] != 0 {
                return Err(Sense::invalid_param(16, None));
            }
            if data[17] & 0xfc != 0 {
                return Err(Sense::invalid_param(17, None));
            }
            req.unreg = data[17] & 0x02 != 0;
            req.aptpl = data[17] & 0x01 != 0;
            req.move_rel_port = be(&data[18..20]) as u16;
            let tlen = be(&data[20..24]) as usize;
            if 24 + tlen != data.len() || plen != data.len() {
                return Err(Sense::param_list_length());
            }
            let (name, len) =
                parse_transport_id(&data[24..]).ok_or_else(|| Sense::invalid_param(24, None))?;
            if len != tlen {
                return Err(Sense::invalid_param(20, None));
            }
            req.tids.push((name, data[24..24 + len].to_vec()));
            return Ok(req);
        }
        let flags = data[20];
        if flags & 0xf2 != 0 {
            return Err(Sense::invalid_param(20, None));
        }
        req.spec_i_pt = flags & 0x08 != 0;
        req.all_tg_pt = flags & 0x04 != 0;
        req.aptpl = flags & 0x01 != 0;
        if req.spec_i_pt {
            if sa != sa::REGISTER && sa != sa::REGISTER_AND_IGNORE {
                return Err(Sense::invalid_param(20, Some(3)));
            }
            if data.len() < 28 {
                return Err(Sense::param_list_length());
            }
            let tlen = be(&data[24..28]) as usize;
            if 28 + tlen != data.len() || plen != data.len() {
                return Err(Sense::param_list_length());
            }
            let mut off = 28;
            while off < data.len() {
                let (name, len) = parse_transport_id(&data[off..])
                    .ok_or_else(|| Sense::invalid_param(off, None))?;
                req.tids.push((name, data[off..off + len].to_vec()));
                off += len;
            }
        } else if plen != 24 || data.len() != 24 {
            return Err(Sense::param_list_length());
        }
        Ok(req)
    }
}

/// Executes a PERSISTENT RESERVE OUT on a copy of the state. Returns the unit attentions
/// to establish; the caller commits the state.
pub fn pr_out(
    st: &mut PrState,
    n: &Nexus,
    req: &PrOutReq,
    persist_capable: bool,
) -> Result<Vec<UaTarget>, Fail> {
    let mut uas = Vec::new();
    if req.aptpl && !persist_capable {
        return Err(Sense::invalid_param(
            if req.sa == sa::REGISTER_AND_MOVE {
                17
            } else {
                20
            },
            Some(0),
        )
        .into());
    }
    let me = st.reg_index(n);
    let needs_type = matches!(
        req.sa,
        sa::RESERVE | sa::RELEASE | sa::PREEMPT | sa::PREEMPT_AND_ABORT | sa::REGISTER_AND_MOVE
    );
    let ty = if needs_type {
        if req.scope != 0 {
            return Err(Sense::invalid_cdb(2, Some(7)).into());
        }
        Some(PrType::from_u8(req.ty).ok_or_else(|| Sense::invalid_cdb(2, Some(3)))?)
    } else {
        None
    };
    // Every service action but REGISTER AND IGNORE checks the reservation key.
    let key_ok = |me: Option<usize>| match me {
        Some(i) => st.regs[i].key == req.key,
        None => false,
    };
    match req.sa {
        sa::REGISTER | sa::REGISTER_AND_IGNORE => {
            let ignore = req.sa == sa::REGISTER_AND_IGNORE;
            if ignore && req.spec_i_pt {
                return Err(Sense::invalid_param(20, Some(3)).into());
            }
            match me {
                None => {
                    if !ignore && req.key != 0 {
                        return Err(Fail::Conflict);
                    }
                    if req.sa_key == 0 {
                        return Ok(uas);
                    }
                    let mut new = vec![Registration {
                        key: req.sa_key,
                        initiator: n.initiator_port.clone(),
                        transport_id: n.transport_id.clone(),
                        rel_port: n.relative_port,
                        all_tg_pt: req.all_tg_pt,
                    }];
                    for (name, tid) in &req.tids {
                        let r = Registration {
                            key: req.sa_key,
                            initiator: name.clone(),
                            transport_id: tid.clone(),
                            rel_port: n.relative_port,
                            all_tg_pt: req.all_tg_pt,
                        };
                        if st
                            .regs
                            .iter()
                            .chain(new.iter())
                            .any(|o| o.same_identity(&r))
                        {
                            return Err(Sense::invalid_param(28, None).into());
                        }
                        new.push(r);
                    }
                    if st.regs.len() + new.len() > MAX_REGISTRATIONS {
                        return Err(Sense::illegal(asc::INSUFFICIENT_REGISTRATION_RESOURCES).into());
                    }
                    st.regs.extend(new);
                }
                Some(i) => {
                    if !ignore && st.regs[i].key != req.key {
                        return Err(Fail::Conflict);
                    }
                    if req.spec_i_pt {
                        return Err(Sense::invalid_param(20, Some(3)).into());
                    }
                    if req.sa_key == 0 {
                        let ty = st.resv.as_ref().map(|r| r.ty);
                        let released = st.remove_reg(i);
                        if released && ty.is_some_and(|t| t.registrants_have_access()) {
                            for r in &st.regs {
                                uas.push(UaTarget {
                                    reg: r.clone(),
                                    ua: UnitAttention::ReservationsReleased,
                                });
                            }
                        }
                    } else {
                        st.regs[i].key = req.sa_key;
                    }
                }
            }
            st.aptpl = req.aptpl;
            st.generation = st.generation.wrapping_add(1);
        }
        sa::RESERVE => {
            let ty = ty.unwrap_or(PrType::WriteExclusive);
            if !key_ok(me) {
                return Err(Fail::Conflict);
            }
            match &st.resv {
                Some(r) => {
                    if !st.is_holder(n) || r.ty != ty {
                        return Err(Fail::Conflict);
                    }
                }
                None => {
                    st.resv = Some(Reservation {
                        ty,
                        holder: if ty.all_registrants() { None } else { me },
                    });
                }
            }
        }
        sa::RELEASE => {
            let ty = ty.unwrap_or(PrType::WriteExclusive);
            if !key_ok(me) {
                return Err(Fail::Conflict);
            }
            let Some(r) = st.resv.clone() else {
                return Ok(uas);
            };
            if !st.is_holder(n) {
                return Ok(uas);
            }
            if r.ty != ty {
                return Err(Sense::illegal(asc::INVALID_RELEASE_OF_PR).into());
            }
            st.resv = None;
            if r.ty.registrants_have_access() {
                for (j, reg) in st.regs.iter().enumerate() {
                    if Some(j) != me {
                        uas.push(UaTarget {
                            reg: reg.clone(),
                            ua: UnitAttention::ReservationsReleased,
                        });
                    }
                }
            }
        }
        sa::CLEAR => {
            if !key_ok(me) {
                return Err(Fail::Conflict);
            }
            for (j, reg) in st.regs.iter().enumerate() {
                if Some(j) != me {
                    uas.push(UaTarget {
                        reg: reg.clone(),
                        ua: UnitAttention::ReservationsPreempted,
                    });
                }
            }
            st.regs.clear();
            st.resv = None;
            st.generation = st.generation.wrapping_add(1);
        }
        sa::PREEMPT | sa::PREEMPT_AND_ABORT => {
            let ty = ty.unwrap_or(PrType::WriteExclusive);
            let Some(me_i) = me.filter(|_| key_ok(me)) else {
                return Err(Fail::Conflict);
            };
            let old = st.clone();
            let me_reg = st.regs[me_i].clone();
            let resv = st.resv.clone();
            let all_reg = resv.as_ref().is_some_and(|r| r.ty.all_registrants());
            if req.sa_key == 0 && !all_reg {
                return Err(Sense::invalid_param(8, None).into());
            }
            let preempt_holder = match &resv {
                Some(r) if r.ty.all_registrants() => req.sa_key == 0,
                Some(_) => req.sa_key == st.holder_key(),
                None => false,
            };
            // Registrations to remove: those with SARK (or, for an all-registrants
            // reservation preempted with SARK 0, everybody else).
            let victims: Vec<usize> = st
                .regs
                .iter()
                .enumerate()
                .filter(|(j, r)| {
                    *j != me_i
                        && if req.sa_key == 0 {
                            true
                        } else {
                            r.key == req.sa_key
                        }
                })
                .map(|(j, _)| j)
                .collect();
            if victims.is_empty() && !preempt_holder {
                return Err(Fail::Conflict);
            }
            for &j in &victims {
                uas.push(UaTarget {
                    reg: st.regs[j].clone(),
                    ua: UnitAttention::RegistrationsPreempted,
                });
            }
            let keep: Vec<Registration> = st
                .regs
                .iter()
                .enumerate()
                .filter(|(j, _)| !victims.contains(j))
                .map(|(_, r)| r.clone())
                .collect();
            st.regs = keep;
            let me_new = st.regs.iter().position(|r| r.same_identity(&me_reg));
            if preempt_holder {
                st.resv = Some(Reservation {
                    ty,
                    holder: if ty.all_registrants() { None } else { me_new },
                });
                if resv.as_ref().is_some_and(|r| r.ty != ty) {
                    for (j, reg) in st.regs.iter().enumerate() {
                        if Some(j) != me_new {
                            uas.push(UaTarget {
                                reg: reg.clone(),
                                ua: UnitAttention::ReservationsReleased,
                            });
                        }
                    }
                }
            } else {
                fix_holder(st, &old);
            }
            st.generation = st.generation.wrapping_add(1);
            if req.sa == sa::PREEMPT_AND_ABORT {
                st.aborts = st.aborts.wrapping_add(1);
            }
        }
        sa::REGISTER_AND_MOVE => {
            let ty = ty.unwrap_or(PrType::WriteExclusive);
            let Some(me_i) = me.filter(|_| key_ok(me)) else {
                return Err(Fail::Conflict);
            };
            match &st.resv {
                Some(r) if !r.ty.all_registrants() && st.is_holder(n) => {}
                _ => return Err(Fail::Conflict),
            }
            if req.sa_key == 0 {
                return Err(Sense::invalid_param(8, None).into());
            }
            let (name, tid) = req.tids.first().cloned().unwrap_or_default();
            if initiator_matches(&name, &n.initiator_port) && req.move_rel_port == n.relative_port {
                return Err(Sense::invalid_param(24, None).into());
            }
            let dest = Registration {
                key: req.sa_key,
                initiator: name,
                transport_id: tid,
                rel_port: req.move_rel_port,
                all_tg_pt: false,
            };
            let di = match st.regs.iter().position(|r| r.same_identity(&dest)) {
                Some(di) => {
                    st.regs[di].key = req.sa_key;
                    di
                }
                None => {
                    if st.regs.len() >= MAX_REGISTRATIONS {
                        return Err(Sense::illegal(asc::INSUFFICIENT_REGISTRATION_RESOURCES).into());
                    }
                    st.regs.push(dest);
                    st.regs.len() - 1
                }
            };
            st.resv = Some(Reservation {
                ty,
                holder: Some(di),
            });
            if req.unreg {
                // The holder is now `di`, so this only renumbers it.
                st.remove_reg(me_i);
            }
            st.aptpl = req.aptpl;
            st.generation = st.generation.wrapping_add(1);
        }
        _ => return Err(Sense::invalid_cdb(1, Some(4)).into()),
    }
    Ok(uas)
}

/// Recomputes the holder index from the holder's identity after registrations were removed.
fn fix_holder(st: &mut PrState, old: &PrState) {
    let Some(r) = &mut st.resv else { return };
    let Some(h) = r.holder else { return };
    if let Some(old_r) = &old.resv {
        if let Some(oh) = old_r.holder {
            if let Some(old_reg) = old.regs.get(oh) {
                r.holder = st.regs.iter().position(|x| x.same_identity(old_reg));
                if r.holder.is_none() {
                    st.resv = None;
                }
                return;
            }
        }
    }
    if h >= st.regs.len() {
        st.resv = None;
    }
}

// ---- persistence ------------------------------------------------------------------------

const MAGIC: &str = "rtgt-pr 1";

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2 + 1);
    if b.is_empty() {
        s.push('-');
    }
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s == "-" {
        return Some(Vec::new());
    }
    if s.len() & 1 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Text encoding of the state (one record per line).
pub fn encode(st: &PrState) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{MAGIC}");
    let _ = writeln!(s, "generation {}", st.generation);
    let _ = writeln!(s, "aptpl {}", u8::from(st.aptpl));
    for r in &st.regs {
        let _ = writeln!(
            s,
            "reg {:016x} {} {} {} {}",
            r.key,
            r.rel_port,
            u8::from(r.all_tg_pt),
            hex(r.initiator.as_bytes()),
            hex(&r.transport_id)
        );
    }
    if st.aborts != 0 {
        let _ = writeln!(s, "aborts {}", st.aborts);
    }
    if let Some(h) = &st.spc2 {
        let _ = writeln!(
            s,
            "spc2 {} {}",
            h.rel_port,
            hex(h.initiator_port.as_bytes())
        );
    }
    if let Some(r) = &st.resv {
        match r.holder {
            Some(h) => {
                let _ = writeln!(s, "resv {} {}", r.ty as u8, h);
            }
            None => {
                let _ = writeln!(s, "resv {} -", r.ty as u8);
            }
        }
    }
    s
}

/// Parses [`encode`]'s output.
pub fn decode(text: &str) -> Result<PrState, String> {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err("bad header".into());
    }
    let mut st = PrState::default();
    for (no, line) in lines.enumerate() {
        let bad = || format!("line {}: {line:?}", no + 2);
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [] => {}
            ["generation", g] => st.generation = g.parse().map_err(|_| bad())?,
            ["aptpl", a] => st.aptpl = *a == "1",
            ["aborts", n] => st.aborts = n.parse().map_err(|_| bad())?,
            ["reg", key, port, all, init, tid] => {
                let initiator =
                    String::from_utf8(unhex(init).ok_or_else(bad)?).map_err(|_| bad())?;
                st.regs.push(Registration {
                    key: u64::from_str_radix(key, 16).map_err(|_| bad())?,
                    rel_port: port.parse().map_err(|_| bad())?,
                    all_tg_pt: *all == "1",
                    initiator,
                    transport_id: unhex(tid).ok_or_else(bad)?,
                });
            }
            ["spc2", port, init] => {
                st.spc2 = Some(Spc2Holder {
                    rel_port: port.parse().map_err(|_| bad())?,
                    initiator_port: String::from_utf8(unhex(init).ok_or_else(bad)?)
                        .map_err(|_| bad())?,
                });
            }
            ["resv", ty, holder] => {
                let ty = PrType::from_u8(ty.parse().map_err(|_| bad())?).ok_or_else(bad)?;
                let holder = if *holder == "-" {
                    None
                } else {
                    let h: usize = holder.parse().map_err(|_| bad())?;
                    if h >= st.regs.len() {
                        return Err(bad());
                    }
                    Some(h)
                };
                if holder.is_none() != ty.all_registrants() {
                    return Err(bad());
                }
                st.resv = Some(Reservation { ty, holder });
            }
            _ => return Err(bad()),
        }
    }
    Ok(st)
}

/// Writes the state atomically (temporary file, fsync, rename, directory fsync), or removes
/// the file when APTPL is off.
pub fn persist(path: &Path, st: &PrState) -> std::io::Result<()> {
    if !st.aptpl {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let persistent = PrState {
        spc2: None,
        aborts: 0,
        ..st.clone()
    };
    rtgt_backstore::write_atomically(path, encode(&persistent).as_bytes())
}

/// The unit attentions another process's change from `old` to `new` owes this process's
/// I_T nexuses: REGISTRATIONS PREEMPTED where a registration is gone, RESERVATIONS RELEASED
/// to the remaining registrants where the reservation went or changed.
pub fn changed_elsewhere(old: &PrState, new: &PrState) -> Vec<UaTarget> {
    let mut out: Vec<UaTarget> = old
        .regs
        .iter()
        .filter(|r| !new.regs.iter().any(|n| n.same_identity(r)))
        .map(|r| UaTarget {
            reg: r.clone(),
            ua: UnitAttention::RegistrationsPreempted,
        })
        .collect();
    let kind = |s: &PrState| {
        s.resv.as_ref().map(|r| {
            let holder = r.holder.and_then(|h| s.regs.get(h));
            (
                r.ty,
                holder.map(|h| (h.initiator.to_ascii_lowercase(), h.rel_port, h.all_tg_pt)),
            )
        })
    };
    if old.resv.is_some() && kind(old) != kind(new) {
        out.extend(new.regs.iter().map(|r| UaTarget {
            reg: r.clone(),
            ua: UnitAttention::ReservationsReleased,
        }));
    }
    out
}

/// Loads persisted state; a missing file is an empty state.
pub fn load(path: &Path) -> Result<PrState, ScsiError> {
    match std::fs::read_to_string(path) {
        Ok(text) => decode(&text).map_err(|reason| ScsiError::PrCorrupt {
            path: path.to_path_buf(),
            reason,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(PrState::default()),
        Err(source) => Err(ScsiError::PrLoad {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nexus(name: &str, port: u16) -> Nexus {
        Nexus {
            id: 1,
            initiator_port: name.into(),
            transport_id: Vec::new(),
            target_port: String::new(),
            relative_port: port,
            port_group: 1,
        }
    }

    fn iscsi_tid(name: &str, format: u8) -> Vec<u8> {
        let mut s = name.as_bytes().to_vec();
        s.push(0);
        while s.len() & 3 != 0 {
            s.push(0);
        }
        let mut b = vec![(format << 6) | 5, 0, 0, 0];
        b[2..4].copy_from_slice(&(s.len() as u16).to_be_bytes());
        b.extend(s);
        b
    }

    #[test]
    fn parse_transport_ids() {
        let t = iscsi_tid("iqn.a,i,0x123", 1);
        assert_eq!(
            parse_transport_id(&t),
            Some(("iqn.a,i,0x123".into(), t.len()))
        );
        let t = iscsi_tid("iqn.a", 0);
        assert_eq!(parse_transport_id(&t).unwrap().0, "iqn.a");
        let mut srp = vec![0xa5u8; 24];
        srp[0] = 0x04;
        let (name, len) = parse_transport_id(&srp).unwrap();
        assert_eq!(len, 24);
        assert_eq!(name, format!("0x{}", "a5".repeat(16)));
    }

    #[test]
    fn bad_field_transport_ids() {
        // Format 01b without an ISID, format 00b with one, truncated, unknown format.
        assert_eq!(parse_transport_id(&iscsi_tid("iqn.a", 1)), None);
        assert_eq!(parse_transport_id(&iscsi_tid("iqn.a,i,0x1", 0)), None);
        let t = iscsi_tid("iqn.a", 0);
        assert_eq!(parse_transport_id(&t[..t.len() - 1]), None);
        assert_eq!(parse_transport_id(&[0x85, 0, 0, 4, b'a', 0, 0, 0]), None);
        assert_eq!(parse_transport_id(&[0x04; 10]), None);
        assert_eq!(parse_transport_id(&[]), None);
    }

    #[test]
    fn name_only_registration_matches_every_isid() {
        let r = Registration {
            key: 1,
            initiator: "iqn.a".into(),
            transport_id: Vec::new(),
            rel_port: 2,
            all_tg_pt: false,
        };
        assert!(r.matches("iqn.a,i,0x1", 2));
        assert!(r.matches("IQN.A", 2));
        assert!(!r.matches("iqn.a,i,0x1", 3));
        assert!(!r.matches("iqn.ab,i,0x1", 2));
        let all = Registration {
            all_tg_pt: true,
            ..r
        };
        assert!(all.matches("iqn.a", 9));
    }

    fn basic(sa: u8, key: u64, sark: u64, flags: u8) -> ([u8; 10], Vec<u8>) {
        let mut p = vec![0xa5u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sark.to_be_bytes());
        p[20] = flags;
        p[21] = 0;
        ([0x5f, sa, 0x01, 0, 0, 0, 0, 0, 24, 0], p)
    }

    #[test]
    fn parse_prout() {
        let (cdb, p) = basic(sa::REGISTER, 1, 2, 0x05);
        let r = PrOutReq::parse(&cdb, &p).unwrap();
        assert_eq!((r.key, r.sa_key, r.ty, r.scope), (1, 2, 1, 0));
        assert!(r.all_tg_pt && r.aptpl && !r.spec_i_pt);
    }

    #[test]
    fn truncated_prout() {
        let (cdb, p) = basic(sa::REGISTER, 1, 2, 0);
        assert_eq!(
            PrOutReq::parse(&cdb, &p[..20]),
            Err(Sense::param_list_length())
        );
        let mut cdb2 = cdb;
        cdb2[8] = 28;
        let mut p2 = p.clone();
        p2.extend([0; 4]);
        assert_eq!(PrOutReq::parse(&cdb2, &p2), Err(Sense::param_list_length()));
    }

    #[test]
    fn bad_field_prout() {
        let (cdb, p) = basic(sa::RESERVE, 1, 0, 0x08);
        assert_eq!(
            PrOutReq::parse(&cdb, &p),
            Err(Sense::invalid_param(20, Some(3)))
        );
        let (cdb, p) = basic(sa::REGISTER, 1, 0, 0x10);
        assert_eq!(
            PrOutReq::parse(&cdb, &p),
            Err(Sense::invalid_param(20, None))
        );
    }

    #[test]
    fn encode_decode_roundtrip() {
        let st = PrState {
            generation: 7,
            regs: vec![
                Registration {
                    key: 0xdead,
                    initiator: "iqn.a b,i,0x1".into(),
                    transport_id: vec![1, 2, 3],
                    rel_port: 3,
                    all_tg_pt: false,
                },
                Registration {
                    key: 5,
                    initiator: "iqn.c".into(),
                    transport_id: Vec::new(),
                    rel_port: 0,
                    all_tg_pt: true,
                },
            ],
            resv: Some(Reservation {
                ty: PrType::ExclusiveAccess,
                holder: Some(1),
            }),
            aptpl: true,
            spc2: Some(Spc2Holder {
                initiator_port: "iqn.d,i,0x23d000000001".into(),
                rel_port: 2,
            }),
            aborts: 3,
        };
        assert_eq!(decode(&encode(&st)), Ok(st.clone()));
        // Neither the SPC-2 reservation nor the abort count is persisted across a power loss.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("st.pr");
        persist(&path, &st).unwrap();
        let back = decode(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            back,
            PrState {
                spc2: None,
                aborts: 0,
                ..st
            }
        );
    }

    #[test]
    fn bad_field_decode() {
        assert!(decode("nonsense").is_err());
        assert!(decode("rtgt-pr 1\nresv 3 0\n").is_err());
        assert!(decode("rtgt-pr 1\nreg 1 1 0 61 -\nresv 7 0\n").is_err());
        assert!(decode("rtgt-pr 1\nreg 1 1 0 6 -\n").is_err());
        assert!(decode("rtgt-pr 1\nreg 1 1 0 61 -\nresv 9 0\n").is_err());
    }

    #[test]
    fn emit_pr_in() {
        let mut st = PrState::default();
        let n = nexus("iqn.a,i,0x1", 1);
        let (cdb, p) = basic(sa::REGISTER, 0, 0x42, 0);
        pr_out(&mut st, &n, &PrOutReq::parse(&cdb, &p).unwrap(), false).unwrap();
        let keys = pr_in(&st, 0, false).unwrap();
        assert_eq!(keys, [0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0x42]);
        assert_eq!(pr_in(&st, 1, false).unwrap(), [0, 0, 0, 1, 0, 0, 0, 0]);
        let caps = pr_in(&st, 2, false).unwrap();
        assert_eq!(caps, [0, 8, 0x0c, 0x90, 0xea, 0x01, 0, 0]);
        let full = pr_in(&st, 3, false).unwrap();
        let tid = &full[32..];
        assert_eq!(tid[0], 0x45);
        assert!(tid[4..].starts_with(b"iqn.a,i,0x1\0"));
        assert_eq!(pr_in(&st, 4, false), Err(Sense::invalid_cdb(1, Some(4))));
    }

    #[test]
    fn conflict_classes() {
        let mut st = PrState::default();
        let holder = nexus("iqn.h,i,0x1", 1);
        let other = nexus("iqn.o,i,0x1", 1);
        let (cdb, p) = basic(sa::REGISTER, 0, 1, 0);
        pr_out(&mut st, &holder, &PrOutReq::parse(&cdb, &p).unwrap(), false).unwrap();
        let (mut cdb, p) = basic(sa::RESERVE, 1, 0, 0);
        cdb[2] = PrType::WriteExclusive as u8;
        pr_out(&mut st, &holder, &PrOutReq::parse(&cdb, &p).unwrap(), false).unwrap();
        let start = [0x1b, 0, 0, 0, 0x01, 0];
        let stop = [0x1b, 0, 0, 0, 0x00, 0];
        assert!(!st.conflicts(&other, PrClass::Read, &start));
        assert!(st.conflicts(&other, PrClass::Write, &start));
        assert!(!st.conflicts(&other, PrClass::StartStop, &start));
        assert!(st.conflicts(&other, PrClass::StartStop, &stop));
        assert!(!st.conflicts(&other, PrClass::PreventAllow, &[0x1e, 0, 0, 0, 0, 0]));
        assert!(st.conflicts(&other, PrClass::PreventAllow, &[0x1e, 0, 0, 0, 1, 0]));
        assert!(!st.conflicts(&holder, PrClass::Write, &stop));
        assert!(!st.conflicts(&other, PrClass::Allowed, &stop));
    }
}
