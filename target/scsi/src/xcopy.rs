//! EXTENDED COPY (LID1) and RECEIVE COPY RESULTS (SPC-4 6.4, 6.37): block-to-block copies
//! between logical units of this process, named by identification descriptor CSCD
//! descriptors (type E4h) that carry the NAA designator of VPD page 83h. A
//! [`DeviceRegistry`] resolves those designators.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::cdb::{be, field, put_be16, put_be32};
use super::range_lock::Mode;
use super::sense::{asc, key, KeySpecific, Sense};
use super::{CmdResult, Ctx, Device, Done};

/// Operating parameters (RECEIVE COPY OPERATING PARAMETERS).
pub const MAX_CSCD_DESCRIPTORS: usize = 8;
pub const MAX_SEGMENT_DESCRIPTORS: usize = 8;
pub const MAX_DESCRIPTOR_LIST_LEN: usize = 1024;
pub const MAX_SEGMENT_BYTES: u64 = 256 << 20;
const HEADER_LEN: usize = 16;
const CSCD_LEN: usize = 32;
const B2B_DESC_LEN: usize = 0x18;
const CHUNK_BYTES: u64 = 1 << 20;
/// Held copy results kept per logical unit.
const MAX_HELD: usize = 64;

/// The logical units EXTENDED COPY can reach, by NAA designator. The daemon shares one
/// registry between all devices (see [`super::DeviceConfig::registry`]).
#[derive(Default)]
pub struct DeviceRegistry {
    devices: Mutex<Vec<Weak<Device>>>,
}

impl std::fmt::Debug for DeviceRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRegistry").finish_non_exhaustive()
    }
}

impl DeviceRegistry {
    pub fn new() -> Arc<DeviceRegistry> {
        Arc::new(DeviceRegistry::default())
    }

    pub fn register(&self, dev: &Arc<Device>) {
        let mut v = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(dev));
    }

    pub fn unregister(&self, dev: &Device) {
        let mut v = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), dev));
    }

    /// The device whose NAA designator is `naa`.
    pub fn find(&self, naa: &[u8]) -> Option<Arc<Device>> {
        let v = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        v.iter()
            .filter_map(Weak::upgrade)
            .find(|d| d.naa.as_slice() == naa)
    }
}

/// Result of a copy held for RECEIVE COPY RESULTS (LIST ID USAGE 00b).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyRecord {
    pub ok: bool,
    pub segments: u16,
    pub bytes: u64,
}

/// Held results keyed by I_T nexus and list identifier.
#[derive(Debug, Default)]
pub struct HeldResults {
    map: HashMap<(u64, u8), (u64, CopyRecord)>,
    seq: u64,
}

impl HeldResults {
    fn insert(&mut self, nexus: u64, list_id: u8, rec: CopyRecord) {
        self.seq += 1;
        if self.map.len() >= MAX_HELD && !self.map.contains_key(&(nexus, list_id)) {
            if let Some(oldest) = self.map.iter().min_by_key(|(_, v)| v.0).map(|(k, _)| *k) {
                self.map.remove(&oldest);
            }
        }
        self.map.insert((nexus, list_id), (self.seq, rec));
    }

    fn get(&self, nexus: u64, list_id: u8) -> Option<CopyRecord> {
        self.map.get(&(nexus, list_id)).map(|v| v.1)
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }

    pub fn forget_nexus(&mut self, nexus: u64) {
        self.map.retain(|k, _| k.0 != nexus);
    }
}

/// A copy source or destination (identification descriptor CSCD descriptor, SPC-4 6.4.5.6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cscd {
    pub code_set: u8,
    pub association: u8,
    pub designator_type: u8,
    pub designator: Vec<u8>,
}

/// A block device to block device segment descriptor (SPC-4 6.4.6.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub src: u16,
    pub dst: u16,
    pub dc: bool,
    pub blocks: u16,
    pub src_lba: u64,
    pub dst_lba: u64,
    /// Offset in the parameter list, for the sense segment pointer.
    pub offset: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyList {
    pub list_id: u8,
    /// LIST ID USAGE 00b: hold the results for RECEIVE COPY RESULTS.
    pub hold: bool,
    pub cscds: Vec<Cscd>,
    pub segments: Vec<Segment>,
}

/// Parses an EXTENDED COPY(LID1) parameter list (SPC-4 6.4.3). `Ok(None)` for an empty
/// list, which is not an error.
pub fn parse(data: &[u8]) -> Result<Option<CopyList>, Sense> {
    if data.is_empty() {
        return Ok(None);
    }
    if data.len() < HEADER_LEN {
        return Err(Sense::param_list_length());
    }
    let list_id = data[0];
    let usage = (data[1] >> 3) & 0x03;
    if usage == 0x01 || (usage == 0x03 && list_id != 0) {
        return Err(Sense::invalid_param(1, Some(4)));
    }
    let tdl = be(&data[2..4]) as usize;
    let sdl = be(&data[8..12]) as usize;
    let inline = be(&data[12..16]) as usize;
    if inline != 0 {
        return Err(Sense::invalid_param(12, None));
    }
    if tdl + sdl > MAX_DESCRIPTOR_LIST_LEN {
        return Err(Sense::param_list_length());
    }
    if HEADER_LEN + tdl + sdl > data.len() {
        return Err(Sense::param_list_length());
    }
    if tdl & (CSCD_LEN - 1) != 0 {
        return Err(Sense::invalid_param(2, None));
    }
    if tdl / CSCD_LEN > MAX_CSCD_DESCRIPTORS {
        return Err(Sense::illegal(asc::TOO_MANY_TARGET_DESCRIPTORS));
    }
    // Segment descriptors: count first, then decode.
    let seg_start = HEADER_LEN + tdl;
    let seg_end = seg_start + sdl;
    let mut offs = Vec::new();
    let mut off = seg_start;
    while off < seg_end {
        if off + 4 > seg_end {
            return Err(Sense::param_list_length());
        }
        let len = 4 + be(&data[off + 2..off + 4]) as usize;
        if off + len > seg_end {
            return Err(Sense::param_list_length());
        }
        offs.push(off);
        if offs.len() > MAX_SEGMENT_DESCRIPTORS {
            return Err(Sense::illegal(asc::TOO_MANY_SEGMENT_DESCRIPTORS));
        }
        off += len;
    }
    let mut cscds = Vec::new();
    for i in 0..tdl / CSCD_LEN {
        let o = HEADER_LEN + i * CSCD_LEN;
        let d = &data[o..o + CSCD_LEN];
        if d[0] != 0xe4 {
            return Err(Sense::illegal(asc::UNSUPPORTED_TARGET_DESCRIPTOR));
        }
        // LU ID TYPE and NUL are ignored (SPC-4); only block devices can be copied.
        if d[1] & 0x1f != 0 {
            return Err(Sense::invalid_param(o + 1, Some(4)));
        }
        let len = usize::from(d[7]);
        if len > 16 {
            return Err(Sense::invalid_param(o + 7, None));
        }
        cscds.push(Cscd {
            code_set: d[4] & 0x0f,
            association: (d[5] >> 4) & 0x03,
            designator_type: d[5] & 0x0f,
            designator: d[8..8 + len].to_vec(),
        });
    }
    let mut segments = Vec::new();
    for o in offs {
        let d = &data[o..];
        if d[0] != 0x02 {
            return Err(Sense::illegal(asc::UNSUPPORTED_SEGMENT_DESCRIPTOR));
        }
        if be(&d[2..4]) as usize != B2B_DESC_LEN {
            return Err(Sense::invalid_param(o + 2, None));
        }
        segments.push(Segment {
            dc: d[1] & 0x02 != 0,
            src: be(&d[4..6]) as u16,
            dst: be(&d[6..8]) as u16,
            blocks: be(&d[10..12]) as u16,
            src_lba: be(&d[12..20]),
            dst_lba: be(&d[20..28]),
            offset: o,
        });
    }
    Ok(Some(CopyList {
        list_id,
        hold: usage == 0,
        cscds,
        segments,
    }))
}

fn copy_aborted(code: asc::Code, seg: &Segment, index: usize) -> Sense {
    Sense {
        cmd_info: Some(index as u64),
        ..Sense::new(key::COPY_ABORTED, code)
    }
    .with_key_specific(KeySpecific::Segment {
        byte: seg.offset.min(u16::MAX as usize) as u16,
    })
}

/// A resolved copy target: the logical unit that received the command or another one.
enum DevRef<'a> {
    Local(&'a Device),
    Remote(Arc<Device>),
}

impl std::ops::Deref for DevRef<'_> {
    type Target = Device;
    fn deref(&self) -> &Device {
        match self {
            DevRef::Local(d) => d,
            DevRef::Remote(d) => d,
        }
    }
}

fn resolve<'a>(dev: &'a Device, c: &Cscd) -> Option<DevRef<'a>> {
    // Binary NAA designator of a logical unit.
    if c.code_set != 1 || c.association != 0 || c.designator_type != 3 {
        return None;
    }
    if c.designator.as_slice() == dev.naa.as_slice() {
        return Some(DevRef::Local(dev));
    }
    dev.config
        .registry
        .as_ref()?
        .find(&c.designator)
        .map(DevRef::Remote)
}

/// Copies one segment in chunks; overlapping ranges on one device copy backwards.
async fn copy_segment(
    src: &Device,
    dst: &Device,
    seg: &Segment,
    index: usize,
) -> Result<u64, Sense> {
    let sbs = u64::from(src.block_size);
    let dbs = u64::from(dst.block_size);
    let bytes = u64::from(seg.blocks) * if seg.dc { dbs } else { sbs };
    if bytes % sbs != 0 || bytes % dbs != 0 || bytes > MAX_SEGMENT_BYTES {
        return Err(copy_aborted(asc::NO_ADDITIONAL, seg, index));
    }
    let in_range = |dev: &Device, lba: u64, bs: u64| {
        lba.checked_add(bytes / bs)
            .is_some_and(|end| end <= dev.num_blocks())
    };
    if !in_range(src, seg.src_lba, sbs) || !in_range(dst, seg.dst_lba, dbs) {
        return Err(copy_aborted(asc::NO_ADDITIONAL, seg, index));
    }
    dst.check_writable()?;
    if bytes == 0 {
        return Ok(0);
    }
    let chunk = CHUNK_BYTES - CHUNK_BYTES % (sbs * dbs / gcd(sbs, dbs));
    let (src_start, dst_start) = (seg.src_lba * sbs, seg.dst_lba * dbs);
    let backwards =
        std::ptr::eq(src, dst) && dst_start > src_start && dst_start < src_start + bytes;
    let mut pieces = Vec::new();
    let mut done = 0;
    while done < bytes {
        let n = chunk.min(bytes - done);
        pieces.push((done, n));
        done += n;
    }
    if backwards {
        pieces.reverse();
    }
    for (off, n) in pieces {
        let s_lba = (src_start + off) / sbs;
        let d_lba = (dst_start + off) / dbs;
        let buf = {
            let _g = src.range_lock.lock(s_lba, n / sbs, Mode::Shared).await;
            src.read_second(s_lba, n as usize)
                .await
                .map_err(|s| copy_aborted((s.asc, s.ascq), seg, index))?
        };
        let fua = dst.write_fua(false);
        let _g = dst.range_lock.lock(d_lba, n / dbs, Mode::Shared).await;
        dst.write_buf(d_lba, buf, fua)
            .await
            .map_err(|s| copy_aborted((s.asc, s.ascq), seg, index))?;
    }
    Ok(bytes)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// EXTENDED COPY(LID1).
pub async fn extended_copy(ctx: &mut Ctx<'_>) -> CmdResult {
    let plen = ctx.cdb().be(field::XCOPY_PARAM_LEN) as usize;
    let data = ctx.data_out();
    let data = &data[..data.len().min(plen)];
    let Some(list) = parse(data)? else {
        return Ok(Done::good());
    };
    let mut rec = CopyRecord {
        ok: false,
        segments: 0,
        bytes: 0,
    };
    let mut result = Ok(());
    for (i, seg) in list.segments.iter().enumerate() {
        let ends = (
            list.cscds
                .get(usize::from(seg.src))
                .and_then(|c| resolve(ctx.dev, c)),
            list.cscds
                .get(usize::from(seg.dst))
                .and_then(|c| resolve(ctx.dev, c)),
        );
        let (Some(src), Some(dst)) = ends else {
            result = Err(copy_aborted(asc::COPY_TARGET_NOT_REACHABLE, seg, i));
            break;
        };
        match copy_segment(&src, &dst, seg, i).await {
            Ok(n) => {
                rec.segments += 1;
                rec.bytes += n;
            }
            Err(s) => {
                result = Err(s);
                break;
            }
        }
    }
    rec.ok = result.is_ok();
    if list.hold {
        ctx.dev
            .lock()
            .copies
            .insert(ctx.nexus.id, list.list_id, rec);
    }
    result?;
    Ok(Done::good())
}

/// Operating parameters (SPC-4 6.37.4).
fn operating_parameters() -> Vec<u8> {
    const CODES: [u8; 2] = [0x02, 0xe4];
    let mut b = vec![0u8; 44];
    b.extend_from_slice(&CODES);
    let avail = (b.len() - 4) as u32;
    put_be32(&mut b[0..4], avail);
    b[4] = 0x01; // SNLID: list identifiers are supported
    put_be16(&mut b[8..10], MAX_CSCD_DESCRIPTORS as u16);
    put_be16(&mut b[10..12], MAX_SEGMENT_DESCRIPTORS as u16);
    put_be32(&mut b[12..16], MAX_DESCRIPTOR_LIST_LEN as u32);
    put_be32(&mut b[16..20], MAX_SEGMENT_BYTES as u32);
    put_be16(&mut b[34..36], 1);
    b[36] = 1;
    b[43] = CODES.len() as u8;
    b
}

/// RECEIVE COPY RESULTS: COPY STATUS, RECEIVE DATA and OPERATING PARAMETERS.
pub fn receive_copy_results(ctx: &mut Ctx<'_>) -> CmdResult {
    let cdb = ctx.cdb();
    let sa = cdb.byte(1) & 0x1f;
    let list_id = cdb.byte(2);
    let alloc = cdb.be(field::ALLOC16) as u32;
    let held = ctx.dev.lock().copies.get(ctx.nexus.id, list_id);
    let b = match sa {
        0x00 => {
            let rec = held.ok_or_else(|| Sense::invalid_cdb(2, None))?;
            let mut b = vec![0u8; 12];
            put_be32(&mut b[0..4], 8);
            b[4] = if rec.ok { 0x00 } else { 0x01 };
            put_be16(&mut b[5..7], rec.segments);
            b[7] = 0x01; // kibibytes
            put_be32(
                &mut b[8..12],
                u32::try_from(rec.bytes / 1024).unwrap_or(u32::MAX),
            );
            b
        }
        0x01 => {
            held.ok_or_else(|| Sense::invalid_cdb(2, None))?;
            vec![0u8; 4]
        }
        _ => operating_parameters(),
    };
    Ok(Done::data(&b, alloc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(tds: usize, segs: &[(u8, u16)], naa: &[u8; 16]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        b[0] = 1;
        for _ in 0..tds {
            let mut d = [0u8; 32];
            d[0] = 0xe4;
            d[4] = 0x01;
            d[5] = 0x03;
            d[7] = 16;
            d[8..24].copy_from_slice(naa);
            d[30] = 2;
            b.extend_from_slice(&d);
        }
        for &(ty, len) in segs {
            let mut d = vec![0u8; 4 + usize::from(len)];
            d[0] = ty;
            d[2..4].copy_from_slice(&len.to_be_bytes());
            if ty == 2 {
                d[11] = 4;
                d[27] = 8;
            }
            b.extend(d);
        }
        let tdl = (tds * 32) as u16;
        b[2..4].copy_from_slice(&tdl.to_be_bytes());
        let sdl = (b.len() - HEADER_LEN - tds * 32) as u32;
        b[8..12].copy_from_slice(&sdl.to_be_bytes());
        b
    }

    const NAA: [u8; 16] = [0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

    #[test]
    fn parse_one_segment() {
        let l = parse(&list(1, &[(2, 0x18)], &NAA)).unwrap().unwrap();
        assert!(l.hold);
        assert_eq!(l.cscds[0].designator, NAA);
        assert_eq!(l.segments[0].blocks, 4);
        assert_eq!(l.segments[0].dst_lba, 8);
        assert_eq!(l.segments[0].offset, 48);
        assert_eq!(parse(&[]).unwrap(), None);
    }

    #[test]
    fn truncated() {
        let b = list(1, &[(2, 0x18)], &NAA);
        assert_eq!(parse(&b[..15]), Err(Sense::param_list_length()));
        assert_eq!(parse(&b[..47]), Err(Sense::param_list_length()));
        assert_eq!(parse(&b[..b.len() - 1]), Err(Sense::param_list_length()));
    }

    #[test]
    fn bad_field_limits_and_types() {
        let b = list(MAX_CSCD_DESCRIPTORS + 1, &[(2, 0x18)], &NAA);
        assert_eq!(
            parse(&b),
            Err(Sense::illegal(asc::TOO_MANY_TARGET_DESCRIPTORS))
        );
        let segs = vec![(2u8, 0x18u16); MAX_SEGMENT_DESCRIPTORS + 1];
        let b = list(1, &segs, &NAA);
        assert_eq!(
            parse(&b),
            Err(Sense::illegal(asc::TOO_MANY_SEGMENT_DESCRIPTORS))
        );
        let mut b = list(1, &[(2, 0x18)], &NAA);
        b[16] = 0xe0;
        assert_eq!(
            parse(&b),
            Err(Sense::illegal(asc::UNSUPPORTED_TARGET_DESCRIPTOR))
        );
        let b = list(1, &[(3, 0x10)], &NAA);
        assert_eq!(
            parse(&b),
            Err(Sense::illegal(asc::UNSUPPORTED_SEGMENT_DESCRIPTOR))
        );
        let segs = vec![(2u8, 0x18u16); 40];
        let b = list(1, &segs, &NAA);
        assert_eq!(parse(&b), Err(Sense::param_list_length()));
        let mut b = list(1, &[(2, 0x18)], &NAA);
        b[12..16].copy_from_slice(&4u32.to_be_bytes());
        assert_eq!(parse(&b), Err(Sense::invalid_param(12, None)));
    }

    #[test]
    fn emit_operating_parameters() {
        let b = operating_parameters();
        assert_eq!(be(&b[0..4]) as usize, b.len() - 4);
        assert_eq!(be(&b[8..10]) as usize, MAX_CSCD_DESCRIPTORS);
        assert_eq!(&b[43..], &[2, 0x02, 0xe4]);
    }

    #[test]
    fn held_results_bounded() {
        let mut h = HeldResults::default();
        let rec = CopyRecord {
            ok: true,
            segments: 1,
            bytes: 1,
        };
        for i in 0..200u64 {
            h.insert(i, 1, rec);
        }
        assert_eq!(h.map.len(), MAX_HELD);
        assert!(h.get(199, 1).is_some());
        assert!(h.get(0, 1).is_none());
        h.forget_nexus(199);
        assert!(h.get(199, 1).is_none());
    }
}
