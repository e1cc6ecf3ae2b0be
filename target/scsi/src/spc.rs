//! SPC-4 commands: INQUIRY and VPD pages (6.6, 7.8), REQUEST SENSE (6.39), MODE SENSE /
//! MODE SELECT (6.9-6.12), REPORT SUPPORTED OPERATION CODES (6.35), REPORT SUPPORTED TASK
//! MANAGEMENT FUNCTIONS (6.36), RESERVE/RELEASE (SPC-2 7.21, 7.16), PERSISTENT RESERVE IN/OUT
//! (6.15, 6.16), and the SBC-4 START STOP UNIT (5.27) / PREVENT ALLOW MEDIUM REMOVAL (5.13).

use super::cdb::{field, put_be16, put_be32, put_be64};
use super::mode::{self, Geometry, SenseReq};
use super::pr;
use super::sense::{asc, key, Sense};
use super::table::{self, CmdDesc, TABLE};
use super::ua::UnitAttention;
use super::{CmdResult, Ctx, Device, Done, Fail, Nexus};

/// Version descriptors claimed in standard INQUIRY data: SAM-5, SPC-4, SBC-3.
const VERSION_DESCRIPTORS: [u16; 3] = [0x00a0, 0x0460, 0x04c0];

/// Length of the standard INQUIRY data.
pub const STD_INQUIRY_LEN: usize = 74;

/// Supported VPD pages, ascending.
const VPD_PAGES: [u8; 7] = [0x00, 0x80, 0x83, 0x86, 0xb0, 0xb1, 0xb2];

fn pad_ascii(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    let n = s.len().min(dst.len());
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Standard INQUIRY data (SPC-4 6.6.2). `peripheral` is byte 0 (0x00 for a connected
/// direct-access device, 0x7f for an unmapped LUN).
pub fn standard_inquiry(dev: &Device, peripheral: u8) -> Vec<u8> {
    let mut b = vec![0u8; STD_INQUIRY_LEN];
    b[0] = peripheral;
    if dev.config.removable {
        b[1] = 0x80; // RMB
    }
    b[2] = 0x06; // SPC-4
    b[3] = 0x12; // HISUP, RESPONSE DATA FORMAT 2
    b[4] = (STD_INQUIRY_LEN - 5) as u8;
    b[5] = 0x08 | dev.tpgs(); // 3PC: EXTENDED COPY; TPGS
    b[7] = 0x02; // CMDQUE
    pad_ascii(&mut b[8..16], &dev.config.vendor);
    pad_ascii(&mut b[16..32], &dev.config.product);
    pad_ascii(&mut b[32..36], &dev.config.revision);
    for (i, v) in VERSION_DESCRIPTORS.iter().enumerate() {
        put_be16(&mut b[58 + 2 * i..], *v);
    }
    b
}

fn serial(dev: &Device) -> String {
    if dev.config.serial.is_empty() {
        let mut s = String::new();
        for x in &dev.naa[8..] {
            s.push_str(&format!("{x:02x}"));
        }
        s
    } else {
        dev.config.serial.clone()
    }
}

fn vpd_header(page: u8, body: Vec<u8>) -> Vec<u8> {
    let mut b = vec![0u8, page, 0, 0];
    put_be16(&mut b[2..4], body.len() as u16);
    b.extend(body);
    b
}

/// Device Identification VPD page designators (SPC-4 7.8.6).
fn device_identification(dev: &Device, nexus: &Nexus) -> Vec<u8> {
    let mut d = Vec::new();
    // NAA IEEE Registered Extended, logical unit.
    d.extend_from_slice(&[0x01, 0x03, 0x00, 16]);
    d.extend_from_slice(&dev.naa);
    // T10 vendor ID based, logical unit.
    let mut t10 = vec![b' '; 8];
    pad_ascii(&mut t10, &dev.config.vendor);
    t10.extend_from_slice(serial(dev).as_bytes());
    t10.truncate(252);
    d.extend_from_slice(&[0x02, 0x01, 0x00, t10.len() as u8]);
    d.extend(t10);
    // Relative target port and target port group, target port association.
    d.extend_from_slice(&[0x01, 0x14, 0x00, 4, 0, 0]);
    d.extend_from_slice(&nexus.relative_port.to_be_bytes());
    d.extend_from_slice(&[0x01, 0x15, 0x00, 4, 0, 0]);
    d.extend_from_slice(&nexus.port_group.to_be_bytes());
    // SCSI name string of the target port (null-terminated, padded to 4 bytes).
    if !nexus.target_port.is_empty() && nexus.target_port.len() < 250 {
        let mut name = nexus.target_port.as_bytes().to_vec();
        name.push(0);
        while name.len() & 3 != 0 {
            name.push(0);
        }
        d.extend_from_slice(&[0x03, 0x18, 0x00, name.len() as u8]);
        d.extend(name);
    }
    d
}

/// Block Limits VPD page body (SBC-4 6.6.4). The granularities are the physical block;
/// WSNZ=0 (WRITE SAME with zero blocks writes to the end of the medium).
fn block_limits(dev: &Device) -> Vec<u8> {
    let mut b = vec![0u8; 0x3c];
    let max = dev.max_transfer_blocks();
    let lbppb = dev.lbppb();
    b[1] = sbc::dev_max_caw(dev) as u8;
    put_be16(&mut b[2..], u16::try_from(lbppb).unwrap_or(u16::MAX));
    put_be32(&mut b[4..], max);
    put_be32(&mut b[8..], ((1 << 20) / dev.block_size).max(lbppb));
    if dev.thin() {
        put_be32(&mut b[16..], sbc::MAX_UNMAP_BLOCKS);
        put_be32(&mut b[20..], sbc::MAX_UNMAP_DESCRIPTORS);
        put_be32(&mut b[24..], lbppb);
        // UGAVALID, UNMAP GRANULARITY ALIGNMENT = LOWEST ALIGNED LOGICAL BLOCK ADDRESS (0).
        b[28] = 0x80;
    }
    put_be64(&mut b[32..], u64::from(sbc::MAX_WRITE_SAME_BLOCKS));
    put_be32(&mut b[40..], max);
    b
}

use super::sbc;

fn vpd_page(dev: &Device, nexus: &Nexus, page: u8) -> Result<Vec<u8>, Sense> {
    let body = match page {
        0x00 => VPD_PAGES.to_vec(),
        0x80 => serial(dev).into_bytes(),
        0x83 => device_identification(dev, nexus),
        0x86 => {
            let mut b = vec![0u8; 0x3c];
            b[1] = 0x10 | 0x08 | 0x04; // HEADSUP, ORDSUP, SIMPSUP
            b[2] = 0x01; // V_SUP: volatile cache
            b[3] = 0x01; // LUICLR
            b
        }
        0xb0 => block_limits(dev),
        0xb1 => {
            let mut b = vec![0u8; 0x3c];
            put_be16(&mut b[0..], 1); // non-rotating medium
            b[3] = 0x50; // WABEREQ=01b, WACEREQ=01b: reads after erase succeed
            b
        }
        0xb2 => {
            let mut b = vec![0u8; 4];
            if dev.thin() {
                b[1] = 0x80 | 0x40 | 0x20 | 0x04; // LBPU, LBPWS, LBPWS10, LBPRZ=001b
                b[2] = 0x02; // thin provisioned
            }
            b
        }
        _ => return Err(Sense::invalid_cdb(2, None)),
    };
    Ok(vpd_header(page, body))
}

/// INQUIRY (SPC-4 6.6).
pub fn inquiry(ctx: &mut Ctx<'_>) -> CmdResult {
    let cdb = ctx.cdb();
    let evpd = cdb.bit(1, 0x01);
    let page = cdb.byte(2);
    let alloc = cdb.be(field::INQUIRY_ALLOC) as u32;
    if !evpd && page != 0 {
        return Err(Sense::invalid_cdb(2, None).into());
    }
    let b = if evpd {
        vpd_page(ctx.dev, ctx.nexus, page)?
    } else {
        standard_inquiry(ctx.dev, 0x00)
    };
    Ok(Done::data(&b, alloc))
}

/// REQUEST SENSE (SPC-4 6.39): a pending unit attention is returned (and cleared), else the
/// readiness of the logical unit.
pub fn request_sense(ctx: &mut Ctx<'_>) -> CmdResult {
    let cdb = ctx.cdb();
    let desc = cdb.bit(1, 0x01);
    let alloc = cdb.be(field::ALLOC6) as u32;
    let mut st = ctx.dev.lock();
    let ua = st.nexuses.get_mut(&ctx.nexus.id).and_then(|n| n.ua.pop());
    let s = match ua {
        Some(ua) => ua.sense(),
        None => st
            .readiness()
            .unwrap_or(Sense::new(key::NO_SENSE, asc::NO_ADDITIONAL)),
    };
    drop(st);
    Ok(Done::data(&s.emit(desc), alloc))
}

/// MODE SENSE(6)/(10).
pub fn mode_sense(ctx: &mut Ctx<'_>) -> CmdResult {
    let req = SenseReq::parse(&ctx.cdb);
    let alloc = if req.ten {
        ctx.cdb().be(field::ALLOC10) as u32
    } else {
        ctx.cdb().be(field::ALLOC6) as u32
    };
    let (cur, defaults, wp) = {
        let st = ctx.dev.lock();
        (st.mode, st.defaults, ctx.dev.write_protected(&st))
    };
    let geo = Geometry {
        num_blocks: ctx.dev.num_blocks(),
        block_size: ctx.dev.block_size,
        write_protected: wp,
    };
    let b = mode::mode_sense(&req, &cur, &defaults, &geo)?;
    Ok(Done::data(&b, alloc))
}

/// MODE SELECT(6)/(10): changes WCE, D_SENSE or SWP; other I_T nexuses get MODE
/// PARAMETERS CHANGED.
pub fn mode_select(ctx: &mut Ctx<'_>) -> CmdResult {
    let ten = ctx.cdb[0] == 0x55;
    let cdb = ctx.cdb();
    let pf = cdb.bit(1, 0x10);
    if cdb.bit(1, 0x01) {
        // SP: saving pages is not supported.
        return Err(Sense::invalid_cdb(1, Some(0)).into());
    }
    let plen = if ten {
        cdb.be(field::PARAM_LEN10) as usize
    } else {
        cdb.be(field::ALLOC6) as usize
    };
    let data = ctx.data_out();
    let data = &data[..data.len().min(plen)];
    let hdr = if ten { 8 } else { 4 };
    if !pf && data.len() > hdr {
        return Err(Sense::invalid_cdb(1, Some(4)).into());
    }
    let mut st = ctx.dev.lock();
    let new = mode::mode_select(ten, data, &st.mode, &st.defaults, ctx.dev.block_size)?;
    if new != st.mode {
        st.mode = new;
        st.post_all(UnitAttention::ModeParametersChanged, Some(ctx.nexus.id));
    }
    Ok(Done::good())
}

/// RESERVE(6)/(10) (SPC-2 7.21): logical unit reservation of the issuing I_T nexus, kept with
/// the other gateways where the reservation state is shared.
pub async fn reserve(ctx: &mut Ctx<'_>) -> CmdResult {
    let nexus = ctx.nexus;
    change_reservations(ctx.dev, nexus, |st| {
        if st.resv.is_some() || !st.regs.is_empty() {
            return Err(Fail::Conflict);
        }
        match &st.spc2 {
            Some(h) if !h.is(nexus) => Err(Fail::Conflict),
            _ => {
                st.spc2 = Some(pr::Spc2Holder::of(nexus));
                Ok(Vec::new())
            }
        }
    })
    .await
    .map(|_| Done::good())
}

/// RELEASE(6)/(10) (SPC-2 7.16): a release by a non-holder is a no-op.
pub async fn release(ctx: &mut Ctx<'_>) -> CmdResult {
    let nexus = ctx.nexus;
    change_reservations(ctx.dev, nexus, |st| {
        if st.resv.is_some() || !st.regs.is_empty() {
            return Err(Fail::Conflict);
        }
        if st.spc2.as_ref().is_some_and(|h| h.is(nexus)) {
            st.spc2 = None;
        }
        Ok(Vec::new())
    })
    .await
    .map(|_| Done::good())
}

/// START STOP UNIT (SBC-4 5.27).
///
/// The logical unit has no power conditions: a POWER CONDITION other than START_VALID is
/// accepted without effect, and LOEJ and START are then ignored (as tgt does, reserved
/// values included). On a removable medium LOEJ ejects (START=0) or loads (START=1) it,
/// refused with MEDIUM REMOVAL PREVENTED while an I_T nexus prevents removal, and START
/// alone has no effect (the virtual medium has no motor to stop); on a fixed medium LOEJ
/// is ignored and START=0 enters the stopped power condition until START=1.
pub async fn start_stop_unit(ctx: &mut Ctx<'_>) -> CmdResult {
    let b4 = ctx.cdb[4];
    let pc = b4 >> 4;
    let no_flush = b4 & 0x04 != 0;
    let loej = b4 & 0x02 != 0;
    let start = b4 & 0x01 != 0;
    if pc != 0 {
        return Ok(Done::good());
    }
    let dev = ctx.dev;
    if dev.config.removable {
        if !loej {
            return Ok(Done::good());
        }
        if start {
            let mut st = dev.lock();
            if st.removal_prevented() {
                return Err(Sense::illegal(asc::MEDIUM_REMOVAL_PREVENTED).into());
            }
            if !st.loaded {
                st.loaded = true;
                st.post_all(UnitAttention::MediumChanged, Some(ctx.nexus.id));
            }
        } else {
            if dev.lock().removal_prevented() {
                return Err(Sense::illegal(asc::MEDIUM_REMOVAL_PREVENTED).into());
            }
            if !no_flush {
                dev.backstore
                    .flush()
                    .await
                    .map_err(|e| sbc::io_error(&e, true))?;
            }
            let mut st = dev.lock();
            if st.removal_prevented() {
                return Err(Sense::illegal(asc::MEDIUM_REMOVAL_PREVENTED).into());
            }
            st.loaded = false;
        }
        return Ok(Done::good());
    }
    if start {
        ctx.dev.lock().stopped = false;
    } else {
        if !no_flush {
            ctx.dev
                .backstore
                .flush()
                .await
                .map_err(|e| sbc::io_error(&e, false))?;
        }
        ctx.dev.lock().stopped = true;
    }
    Ok(Done::good())
}

/// PREVENT ALLOW MEDIUM REMOVAL (SBC-4 5.13): recorded per I_T nexus; a removable medium
/// stays in while any I_T nexus prevents its removal. I_T nexus loss and logical unit
/// reset end the prevention of the nexuses they affect.
pub fn prevent_allow(ctx: &mut Ctx<'_>) -> CmdResult {
    let prevent = ctx.cdb[4] & 0x03;
    if prevent > 1 {
        return Err(Sense::invalid_cdb(4, Some(1)).into());
    }
    if let Some(n) = ctx.dev.lock().nexuses.get_mut(&ctx.nexus.id) {
        n.prevent = prevent == 1;
    }
    Ok(Done::good())
}

/// PERSISTENT RESERVE IN.
pub fn pr_in(ctx: &mut Ctx<'_>) -> CmdResult {
    let sa = ctx.cdb[1] & 0x1f;
    let alloc = ctx.cdb().be(field::ALLOC10) as u32;
    let capable = ctx.dev.config.pr_file.is_some() || ctx.dev.config.pr_shared.is_some();
    let b = pr::pr_in(&ctx.dev.lock().pr, sa, capable)?;
    Ok(Done::data(&b, alloc))
}

/// PERSISTENT RESERVE OUT.
pub async fn pr_out(ctx: &mut Ctx<'_>) -> CmdResult {
    let req = pr::PrOutReq::parse(&ctx.cdb, ctx.data_out())?;
    let capable = ctx.dev.config.pr_file.is_some() || ctx.dev.config.pr_shared.is_some();
    let uas = change_reservations(ctx.dev, ctx.nexus, |st| {
        pr::pr_out(st, ctx.nexus, &req, capable)
    })
    .await?;
    // The preempted nexuses' commands end before this one does (on other gateways, they
    // did before the shared state's update returned).
    if req.sa == pr::sa::PREEMPT_AND_ABORT {
        let victims = ctx.dev.lock().preempted(&uas, ctx.nexus.id);
        if let Some(dev) = ctx.dev.me.upgrade() {
            crate::task::abort_preempted(&dev, Some(ctx.nexus.id), &victims).await;
        }
    }
    Ok(Done::good())
}

/// Applies `change` to a copy of the reservation state, then commits it with the unit
/// attentions it returns. Locally the copy is persisted first when APTPL requires. A state
/// shared with other processes is changed there first, atomically from its current contents
/// (what they changed meanwhile is taken in, with the unit attentions it owes), and always
/// kept whatever APTPL says.
pub(crate) async fn change_reservations(
    dev: &Device,
    nexus: &Nexus,
    mut change: impl FnMut(&mut pr::PrState) -> Result<Vec<pr::UaTarget>, Fail> + Send,
) -> Result<Vec<pr::UaTarget>, Fail> {
    if let Some(store) = &dev.config.pr_shared {
        let (base, new, uas) = dev
            .update_shared(store.as_ref(), |doc| change(&mut doc.pr))
            .await?;
        let mut st = dev.lock();
        dev.take_in_shared(&mut st, &base, &new, None);
        st.post_reg(&uas, nexus.id);
        return Ok(uas);
    }
    let mut st = dev.lock();
    let mut new = st.pr.clone();
    let uas = change(&mut new)?;
    if new != st.pr {
        // A small synchronous write under the state lock keeps the file in the same order
        // as the state changes; reservation changes are rare.
        if let Some(path) = &dev.config.pr_file {
            if new.aptpl || st.pr.aptpl {
                pr::persist(path, &new).map_err(|e| {
                    tracing::error!(device = %dev.config.name, path = %path.display(), error = %e,
                        "persisting reservation state failed");
                    Sense::internal_failure()
                })?;
            }
        }
        st.pr = new;
    }
    st.post_reg(&uas, nexus.id);
    Ok(uas)
}

fn timeout_descriptor(c: &CmdDesc) -> [u8; 12] {
    let mut t = [0u8; 12];
    put_be16(&mut t[0..2], 0x0a);
    put_be32(&mut t[8..12], c.timeout);
    t
}

/// One-command parameter data (SPC-4 6.35.3).
fn one_command(dev: &Device, opcode: u8, sa: Option<u16>, rctd: bool) -> Vec<u8> {
    let found = TABLE
        .iter()
        .find(|c| c.opcode == opcode && c.sa.map(u16::from) == sa && dev.supports(c));
    match found {
        Some(c) => {
            let mut b = vec![0u8, 0x03, 0, 0];
            if rctd {
                b[1] |= 0x80;
            }
            put_be16(&mut b[2..4], c.cdb_len() as u16);
            b.extend_from_slice(c.usage);
            if rctd {
                b.extend_from_slice(&timeout_descriptor(c));
            }
            b
        }
        None => vec![0, 0x01, 0, 0],
    }
}

/// REPORT SUPPORTED OPERATION CODES (SPC-4 6.35), generated from the command table.
pub fn report_supported_opcodes(ctx: &mut Ctx<'_>) -> CmdResult {
    let cdb = ctx.cdb();
    let rctd = cdb.bit(2, 0x80);
    let options = cdb.byte(2) & 0x07;
    let opcode = cdb.byte(3);
    let sa = cdb.be(4..6) as u16;
    let alloc = cdb.be(field::ALLOC12) as u32;
    let dev = ctx.dev;
    let b = match options {
        0 => {
            let mut b = vec![0u8; 4];
            for c in TABLE.iter().filter(|c| dev.supports(c)) {
                let mut d = [0u8; 8];
                d[0] = c.opcode;
                if let Some(sa) = c.sa {
                    put_be16(&mut d[2..4], u16::from(sa));
                    d[5] |= 0x01;
                }
                if rctd {
                    d[5] |= 0x02;
                }
                put_be16(&mut d[6..8], c.cdb_len() as u16);
                b.extend_from_slice(&d);
                if rctd {
                    b.extend_from_slice(&timeout_descriptor(c));
                }
            }
            let len = (b.len() - 4) as u32;
            put_be32(&mut b[0..4], len);
            b
        }
        1 => {
            if table::has_service_action(opcode) {
                return Err(Sense::invalid_cdb(3, None).into());
            }
            one_command(dev, opcode, None, rctd)
        }
        2 => {
            if !table::has_service_action(opcode) {
                return Err(Sense::invalid_cdb(2, Some(2)).into());
            }
            one_command(dev, opcode, Some(sa), rctd)
        }
        3 => {
            if table::has_service_action(opcode) {
                one_command(dev, opcode, Some(sa), rctd)
            } else {
                one_command(dev, opcode, None, rctd)
            }
        }
        _ => return Err(Sense::invalid_cdb(2, Some(2)).into()),
    };
    Ok(Done::data(&b, alloc))
}

/// REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS (SPC-4 6.36): ABORT TASK, ABORT TASK SET,
/// CLEAR TASK SET, LOGICAL UNIT RESET and I_T NEXUS / TARGET RESET, as the target core
/// implements them.
pub fn report_supported_tmf(ctx: &mut Ctx<'_>) -> CmdResult {
    let repd = ctx.cdb[2] & 0x80 != 0;
    let alloc = ctx.cdb().be(field::ALLOC12) as u32;
    if alloc < 4 {
        return Err(Sense::invalid_cdb(6, None).into());
    }
    let mut b = vec![0u8; if repd { 16 } else { 4 }];
    b[0] = 0x80 | 0x40 | 0x10 | 0x08 | 0x02;
    if repd {
        b[3] = 0x0c;
    }
    Ok(Done::data(&b, alloc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pad() {
        let mut b = [0xa5u8; 8];
        pad_ascii(&mut b, "RTGT");
        assert_eq!(&b, b"RTGT    ");
        pad_ascii(&mut b, "TOO-LONG-VENDOR");
        assert_eq!(&b, b"TOO-LONG");
    }

    #[test]
    fn vpd_header_len() {
        assert_eq!(
            vpd_header(0x80, vec![1, 2, 3]),
            vec![0, 0x80, 0, 3, 1, 2, 3]
        );
    }

    #[test]
    fn timeout_descriptor_layout() {
        let c = TABLE.iter().find(|c| c.opcode == 0x28).unwrap();
        let t = timeout_descriptor(c);
        assert_eq!(&t[..4], &[0, 0x0a, 0, 0]);
        assert_eq!(u32::from_be_bytes(t[8..12].try_into().unwrap()), c.timeout);
    }
}
