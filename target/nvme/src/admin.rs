//! The admin command set a fabrics controller serves (NVMe Base 2.0, section 5): opcodes, the
//! fields of Identify, Get Log Page and Get/Set Features, and the data structures they
//! return: Identify Controller, Identify Namespace, the namespace identification descriptors
//! and the discovery log page (NVMe over Fabrics 1.1, 5.3).

use crate::{le16, le32, le64, put16, put32, put64};

/// Admin opcodes.
pub mod opcode {
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// Identify CNS values.
pub mod cns {
    pub const NAMESPACE: u8 = 0x00;
    pub const CONTROLLER: u8 = 0x01;
    pub const ACTIVE_NAMESPACES: u8 = 0x02;
    pub const NAMESPACE_DESCRIPTORS: u8 = 0x03;
    pub const CS_CONTROLLER: u8 = 0x06;
    pub const NAMESPACE_CS_INDEPENDENT: u8 = 0x08;
}

/// Feature identifiers.
pub mod feature {
    pub const ARBITRATION: u8 = 0x01;
    pub const POWER_MANAGEMENT: u8 = 0x02;
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    pub const WRITE_ATOMICITY: u8 = 0x0a;
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0b;
    pub const TIMESTAMP: u8 = 0x0e;
    pub const KEEP_ALIVE_TIMER: u8 = 0x0f;
    pub const HOST_BEHAVIOR: u8 = 0x16;
    pub const HOST_ID: u8 = 0x81;
    pub const RESERVATION_MASK: u8 = 0x82;
    pub const RESERVATION_PERSISTENCE: u8 = 0x83;
}

/// Log page identifiers.
pub mod log {
    pub const ERROR: u8 = 0x01;
    pub const SMART: u8 = 0x02;
    pub const FIRMWARE_SLOT: u8 = 0x03;
    pub const CHANGED_NAMESPACES: u8 = 0x04;
    pub const COMMANDS_SUPPORTED: u8 = 0x05;
    pub const ANA: u8 = 0x0c;
    pub const DISCOVERY: u8 = 0x70;
    pub const RESERVATION: u8 = 0x80;
}

/// Asynchronous event types and the notices a fabrics controller sends.
pub mod event {
    pub const NOTICE: u8 = 2;
    pub const NAMESPACE_CHANGED: u8 = 0x00;
    pub const ANA_CHANGE: u8 = 0x03;
    pub const DISCOVERY_CHANGED: u8 = 0xf0;
}

/// Length of every Identify data structure.
pub const IDENTIFY_LEN: usize = 4096;

/// The fields of an Identify command (CDW10, CDW11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identify {
    pub cns: u8,
    pub cntid: u16,
    /// Command set identifier.
    pub csi: u8,
}

impl Identify {
    pub fn from_cdw(cdw10: u32, cdw11: u32) -> Identify {
        Identify {
            cns: cdw10 as u8,
            cntid: (cdw10 >> 16) as u16,
            csi: (cdw11 >> 24) as u8,
        }
    }
}

/// The fields of a Get Log Page command (CDW10 to CDW13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetLogPage {
    pub lid: u8,
    /// Log specific field.
    pub lsp: u8,
    /// Retain asynchronous event.
    pub rae: bool,
    /// Bytes to return.
    pub len: u64,
    /// Byte offset into the page.
    pub offset: u64,
}

impl GetLogPage {
    pub fn from_cdw(cdw10: u32, cdw11: u32, cdw12: u32, cdw13: u32) -> GetLogPage {
        // NUMD (dwords, zero based): NUMDL in CDW10 31:16, NUMDU in CDW11 15:0.
        let numd = u64::from(cdw10 >> 16) | u64::from(cdw11 & 0xffff) << 16;
        GetLogPage {
            lid: cdw10 as u8,
            lsp: ((cdw10 >> 8) & 0x7f) as u8,
            rae: cdw10 & 1 << 15 != 0,
            len: (numd + 1) * 4,
            offset: u64::from(cdw12) | u64::from(cdw13) << 32,
        }
    }

    /// CDW10 and CDW11 for `len` bytes (a multiple of 4, at least 4) of page `lid`.
    pub fn cdw(lid: u8, len: u32) -> (u32, u32) {
        let numd = len / 4 - 1;
        (u32::from(lid) | (numd & 0xffff) << 16, numd >> 16)
    }
}

/// What Identify Controller says of a fabrics controller; the rest of the 4096 bytes is
/// zero.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdController {
    pub vid: u16,
    pub ssvid: u16,
    /// Serial number, model and firmware revision: ASCII, space padded.
    pub serial: String,
    pub model: String,
    pub firmware: String,
    /// IEEE OUI, as the three bytes are stored.
    pub ieee: [u8; 3],
    /// Multi-path I/O and namespace sharing (bit 0: more than one port; bit 1: more than one
    /// controller; bit 3: ANA reporting).
    pub cmic: u8,
    /// Maximum data transfer size, as a power of two of the minimum page size (0: none).
    pub mdts: u8,
    pub cntlid: u16,
    /// Version (major << 16 | minor << 8).
    pub ver: u32,
    /// Optional asynchronous events supported.
    pub oaes: u32,
    pub ctratt: u32,
    /// 1: I/O controller, 2: discovery controller.
    pub cntrltype: u8,
    /// Abort command limit, zero based.
    pub acl: u8,
    /// Asynchronous event request limit, zero based.
    pub aerl: u8,
    /// Log page attributes.
    pub lpa: u8,
    /// Error log page entries, zero based.
    pub elpe: u8,
    /// Keep alive support: granularity in 100 ms units.
    pub kas: u16,
    /// ANA transition time (seconds), capabilities, largest group ID, number of groups.
    pub anatt: u8,
    pub anacap: u8,
    pub anagrpmax: u32,
    pub nanagrpid: u32,
    /// Most commands outstanding per queue.
    pub maxcmd: u16,
    /// Number of namespaces (the largest namespace ID).
    pub nn: u32,
    /// Optional NVM commands supported.
    pub oncs: u16,
    /// Fused operations supported (bit 0: compare and write).
    pub fuses: u16,
    /// Volatile write cache present (bit 0).
    pub vwc: u8,
    /// Atomic write unit, normal and power fail, zero based in blocks.
    pub awun: u16,
    pub awupf: u16,
    /// SGL support.
    pub sgls: u32,
    /// Maximum number of allowed namespaces (Linux's multipath wants it, 1..=NN, with ANA).
    pub mnan: u32,
    pub subnqn: String,
    /// I/O command capsule size and response capsule size, in 16-byte units.
    pub ioccsz: u32,
    pub iorcsz: u32,
    /// In-capsule data offset, in 16-byte units.
    pub icdoff: u16,
    /// Fabrics controller attributes (bit 0: dynamic controller model).
    pub fcatt: u8,
    /// Most SGL data block descriptors in a capsule.
    pub msdbd: u8,
}

fn put_text(b: &mut [u8], at: usize, len: usize, s: &str) {
    let field = &mut b[at..at + len];
    field.fill(b' ');
    let s = &s.as_bytes()[..s.len().min(len)];
    field[..s.len()].copy_from_slice(s);
}

/// A space (or NUL) padded ASCII field; other bytes read as `?`.
fn text(b: &[u8], at: usize, len: usize) -> String {
    let field = &b[at..at + len];
    let end = field
        .iter()
        .rposition(|&c| c != b' ' && c != 0)
        .map_or(0, |p| p + 1);
    ascii(&field[..end])
}

fn ascii(b: &[u8]) -> String {
    b.iter()
        .map(|&c| {
            if c.is_ascii_graphic() || c == b' ' {
                char::from(c)
            } else {
                '?'
            }
        })
        .collect()
}

fn put_nqn(b: &mut [u8], at: usize, s: &str) {
    let s = &s.as_bytes()[..s.len().min(crate::fabrics::NQN_MAX)];
    b[at..at + s.len()].copy_from_slice(s);
}

/// A NUL-terminated name of at most [`crate::fabrics::NQN_MAX`] bytes.
fn nqn(b: &[u8], at: usize) -> String {
    let field = &b[at..at + crate::fabrics::NQN_MAX];
    let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    ascii(&field[..end])
}

impl IdController {
    /// The 4096 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        put16(&mut b, 0, self.vid);
        put16(&mut b, 2, self.ssvid);
        put_text(&mut b, 4, 20, &self.serial);
        put_text(&mut b, 24, 40, &self.model);
        put_text(&mut b, 64, 8, &self.firmware);
        b[73..76].copy_from_slice(&self.ieee);
        b[76] = self.cmic;
        b[77] = self.mdts;
        put16(&mut b, 78, self.cntlid);
        put32(&mut b, 80, self.ver);
        put32(&mut b, 92, self.oaes);
        put32(&mut b, 96, self.ctratt);
        b[111] = self.cntrltype;
        b[258] = self.acl;
        b[259] = self.aerl;
        b[261] = self.lpa;
        b[262] = self.elpe;
        put16(&mut b, 320, self.kas);
        b[342] = self.anatt;
        b[343] = self.anacap;
        put32(&mut b, 344, self.anagrpmax);
        put32(&mut b, 348, self.nanagrpid);
        // SQES and CQES: required and largest entry sizes, powers of two (64 and 16 bytes).
        b[512] = 0x66;
        b[513] = 0x44;
        put16(&mut b, 514, self.maxcmd);
        put32(&mut b, 516, self.nn);
        put16(&mut b, 520, self.oncs);
        put16(&mut b, 522, self.fuses);
        b[525] = self.vwc;
        put16(&mut b, 526, self.awun);
        put16(&mut b, 528, self.awupf);
        put32(&mut b, 536, self.sgls);
        put32(&mut b, 540, self.mnan);
        put_nqn(&mut b, 768, &self.subnqn);
        put32(&mut b, 1792, self.ioccsz);
        put32(&mut b, 1796, self.iorcsz);
        put16(&mut b, 1800, self.icdoff);
        b[1802] = self.fcatt;
        b[1803] = self.msdbd;
        b
    }

    /// Reads what [`IdController::to_bytes`] writes; `None` when shorter than 4096 bytes.
    pub fn parse(b: &[u8]) -> Option<IdController> {
        if b.len() < IDENTIFY_LEN {
            return None;
        }
        Some(IdController {
            vid: le16(b, 0),
            ssvid: le16(b, 2),
            serial: text(b, 4, 20),
            model: text(b, 24, 40),
            firmware: text(b, 64, 8),
            ieee: [b[73], b[74], b[75]],
            cmic: b[76],
            mdts: b[77],
            cntlid: le16(b, 78),
            ver: le32(b, 80),
            oaes: le32(b, 92),
            ctratt: le32(b, 96),
            cntrltype: b[111],
            acl: b[258],
            aerl: b[259],
            lpa: b[261],
            elpe: b[262],
            kas: le16(b, 320),
            anatt: b[342],
            anacap: b[343],
            anagrpmax: le32(b, 344),
            nanagrpid: le32(b, 348),
            maxcmd: le16(b, 514),
            nn: le32(b, 516),
            oncs: le16(b, 520),
            fuses: le16(b, 522),
            vwc: b[525],
            awun: le16(b, 526),
            awupf: le16(b, 528),
            sgls: le32(b, 536),
            mnan: le32(b, 540),
            subnqn: nqn(b, 768),
            ioccsz: le32(b, 1792),
            iorcsz: le32(b, 1796),
            icdoff: le16(b, 1800),
            fcatt: b[1802],
            msdbd: b[1803],
        })
    }
}

/// What Identify Namespace says of a namespace with one LBA format and no metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdNamespace {
    /// Size, capacity and utilization in logical blocks.
    pub nsze: u64,
    pub ncap: u64,
    pub nuse: u64,
    /// Namespace features (bit 0: thin provisioning; bit 4: the optimal I/O fields).
    pub nsfeat: u8,
    /// Multi-path I/O and sharing capabilities (bit 0: may be attached to two controllers).
    pub nmic: u8,
    /// Reservation capabilities.
    pub rescap: u8,
    /// Deallocate logical block features (bits 2:0 = 001b: deallocated blocks read zeroes).
    pub dlfeat: u8,
    /// Preferred write granularity and alignment, deallocate granularity and alignment,
    /// optimal write size, all zero based in blocks.
    pub npwg: u16,
    pub npwa: u16,
    pub npdg: u16,
    pub npda: u16,
    pub nows: u16,
    pub anagrpid: u32,
    /// Namespace attributes (bit 0: write protected).
    pub nsattr: u8,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    /// Logical block size as a power of two (9: 512 bytes).
    pub lbads: u8,
}

impl IdNamespace {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        put64(&mut b, 0, self.nsze);
        put64(&mut b, 8, self.ncap);
        put64(&mut b, 16, self.nuse);
        b[24] = self.nsfeat;
        // NLBAF 0 (one format, zero based), FLBAS 0 (format 0).
        b[30] = self.nmic;
        b[31] = self.rescap;
        b[33] = self.dlfeat;
        put16(&mut b, 64, self.npwg);
        put16(&mut b, 66, self.npwa);
        put16(&mut b, 68, self.npdg);
        put16(&mut b, 70, self.npda);
        put16(&mut b, 72, self.nows);
        put32(&mut b, 92, self.anagrpid);
        b[99] = self.nsattr;
        b[104..120].copy_from_slice(&self.nguid);
        b[120..128].copy_from_slice(&self.eui64);
        // LBA format 0: no metadata, LBADS, best relative performance.
        b[130] = self.lbads;
        b
    }

    pub fn parse(b: &[u8]) -> Option<IdNamespace> {
        if b.len() < IDENTIFY_LEN {
            return None;
        }
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&b[104..120]);
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&b[120..128]);
        // The format in use (FLBAS bits 3:0 and 6:5).
        let f = usize::from((b[26] & 0x0f) | ((b[26] & 0x60) >> 1));
        Some(IdNamespace {
            nsze: le64(b, 0),
            ncap: le64(b, 8),
            nuse: le64(b, 16),
            nsfeat: b[24],
            nmic: b[30],
            rescap: b[31],
            dlfeat: b[33],
            npwg: le16(b, 64),
            npwa: le16(b, 66),
            npdg: le16(b, 68),
            npda: le16(b, 70),
            nows: le16(b, 72),
            anagrpid: le32(b, 92),
            nsattr: b[99],
            nguid,
            eui64,
            lbads: b[128 + 4 * f + 2],
        })
    }
}

/// Namespace identification descriptor types.
pub mod nidt {
    pub const EUI64: u8 = 0x01;
    pub const NGUID: u8 = 0x02;
    pub const UUID: u8 = 0x03;
    pub const CSI: u8 = 0x04;
}

/// The namespace identification descriptor list (CNS 03h): each `(type, value)`, in a
/// 4096-byte page.
pub fn ns_descriptors(ids: &[(u8, &[u8])]) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    let mut at = 0;
    for (ty, v) in ids {
        if at + 4 + v.len() > IDENTIFY_LEN {
            break;
        }
        b[at] = *ty;
        b[at + 1] = v.len() as u8;
        b[at + 4..at + 4 + v.len()].copy_from_slice(v);
        at += 4 + v.len();
    }
    b
}

/// The descriptors of a list (until a zero type, or a descriptor that does not fit).
pub fn parse_ns_descriptors(b: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= b.len() && b[at] != 0 {
        let len = usize::from(b[at + 1]);
        let Some(v) = b.get(at + 4..at + 4 + len) else {
            break;
        };
        out.push((b[at], v.to_vec()));
        at += 4 + len;
    }
    out
}

/// Transport types and address families of a discovery log entry.
pub mod trtype {
    pub const RDMA: u8 = 1;
    pub const TCP: u8 = 3;
    pub const ADRFAM_IPV4: u8 = 1;
    pub const ADRFAM_IPV6: u8 = 2;
    /// Subsystem types.
    pub const SUBTYPE_DISCOVERY_REFERRAL: u8 = 1;
    pub const SUBTYPE_NVME: u8 = 2;
    pub const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;
    /// Transport requirements: secure channel not required.
    pub const TREQ_NOT_REQUIRED: u8 = 2;
}

/// Length of the discovery log page header and of each entry.
pub const DISCOVERY_ENTRY_LEN: usize = 1024;

/// One entry of the discovery log page: a subsystem reachable through a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    pub treq: u8,
    pub portid: u16,
    /// 0xffff: dynamic controllers.
    pub cntlid: u16,
    /// Admin queue size the host may ask for.
    pub asqsz: u16,
    pub eflags: u16,
    pub trsvcid: String,
    pub subnqn: String,
    pub traddr: String,
    /// Transport specific address subtype (RDMA: QP type, provider type, CM service).
    pub tsas: [u8; 3],
}

impl DiscoveryEntry {
    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..DISCOVERY_ENTRY_LEN];
        b.fill(0);
        b[0] = self.trtype;
        b[1] = self.adrfam;
        b[2] = self.subtype;
        b[3] = self.treq;
        put16(b, 4, self.portid);
        put16(b, 6, self.cntlid);
        put16(b, 8, self.asqsz);
        put16(b, 10, self.eflags);
        put_text(b, 32, 32, &self.trsvcid);
        put_nqn(b, 256, &self.subnqn);
        put_text(b, 512, 256, &self.traddr);
        b[768..771].copy_from_slice(&self.tsas);
    }

    pub fn parse(b: &[u8]) -> Option<DiscoveryEntry> {
        if b.len() < DISCOVERY_ENTRY_LEN {
            return None;
        }
        Some(DiscoveryEntry {
            trtype: b[0],
            adrfam: b[1],
            subtype: b[2],
            treq: b[3],
            portid: le16(b, 4),
            cntlid: le16(b, 6),
            asqsz: le16(b, 8),
            eflags: le16(b, 10),
            trsvcid: text(b, 32, 32),
            subnqn: nqn(b, 256),
            traddr: text(b, 512, 256),
            tsas: [b[768], b[769], b[770]],
        })
    }
}

/// The whole discovery log page: header (generation counter, number of records) and entries.
pub fn discovery_log(genctr: u64, entries: &[DiscoveryEntry]) -> Vec<u8> {
    let mut b = vec![0u8; DISCOVERY_ENTRY_LEN * (1 + entries.len())];
    put64(&mut b, 0, genctr);
    put64(&mut b, 8, entries.len() as u64);
    for (i, e) in entries.iter().enumerate() {
        e.emit(&mut b[DISCOVERY_ENTRY_LEN * (i + 1)..]);
    }
    b
}

/// Asymmetric namespace access states (NVMe Base 2.0, 8.1.3), as the ANA log reports them.
pub mod ana {
    pub const OPTIMIZED: u8 = 0x01;
    pub const NON_OPTIMIZED: u8 = 0x02;
    pub const INACCESSIBLE: u8 = 0x03;
    pub const PERSISTENT_LOSS: u8 = 0x04;
    pub const CHANGE: u8 = 0x0f;
    /// Get Log Page LSP bit of the ANA log: return groups only (no namespace lists).
    pub const RGO: u8 = 0x01;
    /// ANACAP: every state reported, and a namespace's group never changes while it is
    /// attached.
    pub const ANACAP: u8 = 0x1f | 0x40;
}

/// One ANA group descriptor of the ANA log page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnaGroup {
    pub grpid: u32,
    pub chgcnt: u64,
    pub state: u8,
    /// The namespaces in the group (left out of the page with [`ana::RGO`]).
    pub nsids: Vec<u32>,
}

/// Length of the ANA log page header and of a group descriptor without its namespaces.
const ANA_HEADER_LEN: usize = 16;
const ANA_GROUP_LEN: usize = 32;

/// The ANA log page (NVMe Base 2.0, 5.16.1.12): change count, groups; with `groups_only`
/// (LSP RGO) every group's namespace list is left out.
pub fn ana_log(chgcnt: u64, groups: &[AnaGroup], groups_only: bool) -> Vec<u8> {
    let mut b = vec![0u8; ANA_HEADER_LEN];
    put64(&mut b, 0, chgcnt);
    put16(&mut b, 8, groups.len() as u16);
    for g in groups {
        let nsids: &[u32] = if groups_only { &[] } else { &g.nsids };
        let at = b.len();
        b.resize(at + ANA_GROUP_LEN + 4 * nsids.len(), 0);
        put32(&mut b, at, g.grpid);
        put32(&mut b, at + 4, nsids.len() as u32);
        put64(&mut b, at + 8, g.chgcnt);
        b[at + 16] = g.state & 0x0f;
        for (i, n) in nsids.iter().enumerate() {
            put32(&mut b, at + ANA_GROUP_LEN + 4 * i, *n);
        }
    }
    b
}

/// The change count and groups of an ANA log page (as many whole groups as `b` holds).
pub fn parse_ana_log(b: &[u8]) -> Option<(u64, Vec<AnaGroup>)> {
    if b.len() < ANA_HEADER_LEN {
        return None;
    }
    let mut groups = Vec::new();
    let mut at = ANA_HEADER_LEN;
    for _ in 0..le16(b, 8) {
        let head = b.get(at..at + ANA_GROUP_LEN)?;
        let n = le32(head, 4) as usize;
        let list = b.get(at + ANA_GROUP_LEN..at + ANA_GROUP_LEN + 4 * n)?;
        groups.push(AnaGroup {
            grpid: le32(head, 0),
            chgcnt: le64(head, 8),
            state: head[16] & 0x0f,
            nsids: list.chunks_exact(4).map(|c| le32(c, 0)).collect(),
        });
        at += ANA_GROUP_LEN + 4 * n;
    }
    Some((le64(b, 0), groups))
}

/// The generation counter and entries of a discovery log page (as many whole entries as
/// `b` holds, up to the number of records).
pub fn parse_discovery_log(b: &[u8]) -> Option<(u64, Vec<DiscoveryEntry>)> {
    if b.len() < 16 {
        return None;
    }
    let numrec = le64(b, 8);
    let entries = b
        .chunks_exact(DISCOVERY_ENTRY_LEN)
        .skip(1)
        .take(usize::try_from(numrec).unwrap_or(usize::MAX))
        .filter_map(DiscoveryEntry::parse)
        .collect();
    Some((le64(b, 0), entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identify_controller_fields_where_linux_reads_them() {
        let c = IdController {
            vid: 0,
            ssvid: 0,
            serial: "rtgt0123456789".into(),
            model: "rtgt".into(),
            firmware: "0.1.0".into(),
            ieee: [0, 0, 0],
            cmic: 0x0b,
            mdts: 5,
            cntlid: 7,
            ver: 0x0002_0000,
            oaes: 1 << 8 | 1 << 11,
            ctratt: 1,
            cntrltype: 1,
            acl: 3,
            aerl: 3,
            lpa: 0x06,
            elpe: 0,
            kas: 5,
            anatt: 10,
            anacap: 0x47,
            anagrpmax: 32,
            nanagrpid: 32,
            maxcmd: 128,
            nn: 1024,
            oncs: 0x0d,
            fuses: 0,
            vwc: 1,
            awun: 0,
            awupf: 0,
            sgls: 0x0010_0005,
            mnan: 1024,
            subnqn: "nqn.2025-01.io.rtgt:default".into(),
            ioccsz: 4 + 512,
            iorcsz: 1,
            icdoff: 0,
            fcatt: 0,
            msdbd: 1,
        };
        let b = c.to_bytes();
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[4..18], b"rtgt0123456789");
        assert_eq!(&b[18..24], b"      ", "space padded");
        assert_eq!((b[77], b[78], b[111]), (5, 7, 1));
        assert_eq!(&b[320..322], &[5, 0]);
        assert_eq!((b[512], b[513], b[516]), (0x66, 0x44, 0x00));
        assert_eq!(&b[516..520], &1024u32.to_le_bytes());
        // ANATT, ANACAP, ANAGRPMAX, NANAGRPID; MNAN.
        assert_eq!((b[342], b[343]), (10, 0x47));
        assert_eq!(&b[344..352], &[32, 0, 0, 0, 32, 0, 0, 0]);
        assert_eq!(&b[540..544], &1024u32.to_le_bytes());
        assert_eq!(&b[768..795], b"nqn.2025-01.io.rtgt:default");
        assert_eq!(&b[1792..1796], &516u32.to_le_bytes());
        assert_eq!(IdController::parse(&b), Some(c));
        assert_eq!(IdController::parse(&b[..4095]), None);
    }

    #[test]
    fn identify_namespace_and_descriptors() {
        let n = IdNamespace {
            nsze: 1 << 21,
            ncap: 1 << 21,
            nuse: 1 << 20,
            nsfeat: 0x11,
            nmic: 1,
            rescap: 0,
            dlfeat: 0x09,
            npwg: 7,
            npwa: 7,
            npdg: 7,
            npda: 7,
            nows: 255,
            anagrpid: 1,
            nsattr: 0,
            nguid: [0x60; 16],
            eui64: [1, 2, 3, 4, 5, 6, 7, 8],
            lbads: 12,
        };
        let b = n.to_bytes();
        assert_eq!((b[25], b[26], b[130]), (0, 0, 12));
        assert_eq!(&b[92..96], &[1, 0, 0, 0]);
        assert_eq!(IdNamespace::parse(&b), Some(n));
        let uuid = [0xabu8; 16];
        let list = ns_descriptors(&[(nidt::NGUID, &[0x60; 16]), (nidt::UUID, &uuid)]);
        assert_eq!(&list[..4], &[2, 16, 0, 0]);
        assert_eq!(&list[20..24], &[3, 16, 0, 0]);
        assert_eq!(
            parse_ns_descriptors(&list),
            vec![(2, vec![0x60; 16]), (3, uuid.to_vec())]
        );
        // A descriptor running past the end ends the list.
        let mut cut = list.clone();
        cut.truncate(30);
        assert_eq!(parse_ns_descriptors(&cut).len(), 1);
    }

    #[test]
    fn discovery_log_pages_and_command_fields() {
        let e = |port: u16, tr: u8| DiscoveryEntry {
            trtype: tr,
            adrfam: trtype::ADRFAM_IPV4,
            subtype: trtype::SUBTYPE_NVME,
            treq: trtype::TREQ_NOT_REQUIRED,
            portid: port,
            cntlid: 0xffff,
            asqsz: 32,
            eflags: 0,
            trsvcid: "4420".into(),
            subnqn: "nqn.2025-01.io.rtgt:default".into(),
            traddr: "192.168.1.10".into(),
            tsas: if tr == trtype::RDMA {
                [1, 1, 1]
            } else {
                [0; 3]
            },
        };
        let entries = vec![e(1, trtype::TCP), e(2, trtype::RDMA)];
        let page = discovery_log(5, &entries);
        assert_eq!(page.len(), 3 * 1024);
        assert_eq!(&page[1024 + 32..1024 + 36], b"4420");
        assert_eq!(&page[2048 + 768..2048 + 771], &[1, 1, 1]);
        assert_eq!(parse_discovery_log(&page), Some((5, entries.clone())));
        // Linux reads the header first, then the whole page.
        assert_eq!(parse_discovery_log(&page[..1024]), Some((5, vec![])));
        assert_eq!(parse_discovery_log(&page[..15]), None);

        let (c10, c11) = GetLogPage::cdw(log::DISCOVERY, 3 * 1024);
        let g = GetLogPage::from_cdw(c10 | 1 << 15, c11, 1024, 0);
        assert_eq!((g.lid, g.len, g.offset, g.rae), (0x70, 3072, 1024, true));
        let big = GetLogPage::from_cdw(0xffff_0002, 0x0000_ffff, 0, 1);
        assert_eq!((big.len, big.offset), (1 << 34, 1 << 32));
        assert_eq!(
            Identify::from_cdw(0x0007_0001, 2 << 24),
            Identify {
                cns: 1,
                cntid: 7,
                csi: 2
            }
        );
    }
}
