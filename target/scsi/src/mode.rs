//! Mode parameters (SPC-4 7.5, SBC-4 6.5): the read-write error recovery, caching, control and
//! informational exceptions control pages, block descriptors, and MODE SELECT validation.
//!
//! Changeable fields: WCE (caching page, backed by the write path's FUA decision), D_SENSE
//! (sense format) and SWP (software write protect) in the control page. Saved parameters are
//! not supported.

use super::cdb::{be, put_be16, put_be32, put_be64};
use super::sense::{asc, Sense};

/// The mutable mode state of a logical unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeState {
    pub wce: bool,
    pub d_sense: bool,
    pub swp: bool,
    /// TASK ABORTED STATUS (control mode page): tasks aborted by another I_T nexus end in
    /// TASK ABORTED status.
    pub tas: bool,
}

/// PAGE CONTROL field of MODE SENSE (SPC-4 6.11.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageControl {
    Current,
    Changeable,
    Default,
    Saved,
}

impl PageControl {
    pub fn from_bits(b: u8) -> PageControl {
        match b & 3 {
            0 => PageControl::Current,
            1 => PageControl::Changeable,
            2 => PageControl::Default,
            _ => PageControl::Saved,
        }
    }
}

pub mod page {
    pub const RW_ERROR_RECOVERY: u8 = 0x01;
    pub const CACHING: u8 = 0x08;
    pub const CONTROL: u8 = 0x0a;
    pub const INFO_EXCEPTIONS: u8 = 0x1c;
    pub const ALL: u8 = 0x3f;
}

/// Supported pages in ascending order with their total length (header included).
const PAGES: &[(u8, usize)] = &[
    (page::RW_ERROR_RECOVERY, 12),
    (page::CACHING, 20),
    (page::CONTROL, 12),
    (page::INFO_EXCEPTIONS, 12),
];

fn page_len(code: u8) -> Option<usize> {
    PAGES.iter().find(|p| p.0 == code).map(|p| p.1)
}

/// Bytes of one page for the given page control. `defaults` is the state at power on.
pub fn page_bytes(code: u8, pc: PageControl, cur: &ModeState, defaults: &ModeState) -> Vec<u8> {
    let len = page_len(code).unwrap_or(2);
    let mut b = vec![0u8; len];
    b[0] = code;
    b[1] = (len - 2) as u8;
    let st = match pc {
        PageControl::Default => defaults,
        _ => cur,
    };
    let changeable = pc == PageControl::Changeable;
    match code {
        page::CACHING if changeable || st.wce => b[2] |= 0x04,
        page::CONTROL => {
            if changeable {
                b[2] = 0x04;
                b[4] = 0x08;
                b[5] = 0x40;
            } else {
                // GLTSD=1 (no implicit log saving), QAM=1 (unrestricted reordering),
                // busy timeout unlimited.
                b[2] = 0x02 | if st.d_sense { 0x04 } else { 0 };
                b[3] = 0x10;
                b[4] = if st.swp { 0x08 } else { 0 };
                b[5] = if st.tas { 0x40 } else { 0 };
                b[8] = 0xff;
                b[9] = 0xff;
            }
        }
        // DEXCPT=1: informational exception reporting disabled.
        page::INFO_EXCEPTIONS if !changeable => b[2] = 0x08,
        _ => {}
    }
    b
}

/// MODE SENSE(6)/(10) request (SPC-4 6.11, 6.12).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SenseReq {
    pub ten: bool,
    pub dbd: bool,
    pub llbaa: bool,
    pub pc: PageControl,
    pub page: u8,
    pub subpage: u8,
}

impl SenseReq {
    pub fn parse(cdb: &[u8]) -> SenseReq {
        let ten = cdb[0] == 0x5a;
        SenseReq {
            ten,
            dbd: cdb[1] & 0x08 != 0,
            llbaa: ten && cdb[1] & 0x10 != 0,
            pc: PageControl::from_bits(cdb[2] >> 6),
            page: cdb[2] & 0x3f,
            subpage: cdb[3],
        }
    }
}

/// Device facts a mode sense reply needs.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    pub num_blocks: u64,
    pub block_size: u32,
    pub write_protected: bool,
}

/// Builds the full MODE SENSE parameter data (before allocation-length truncation).
pub fn mode_sense(
    req: &SenseReq,
    cur: &ModeState,
    defaults: &ModeState,
    geo: &Geometry,
) -> Result<Vec<u8>, Sense> {
    if req.pc == PageControl::Saved {
        return Err(Sense::illegal(asc::SAVING_PARAMS_NOT_SUPPORTED));
    }
    let mut pages = Vec::new();
    if req.page == page::ALL {
        if req.subpage != 0x00 && req.subpage != 0xff {
            return Err(Sense::invalid_cdb(3, None));
        }
        for &(code, _) in PAGES {
            pages.extend(page_bytes(code, req.pc, cur, defaults));
        }
    } else {
        if page_len(req.page).is_none() {
            return Err(Sense::invalid_cdb(2, Some(5)));
        }
        if req.subpage != 0x00 && req.subpage != 0xff {
            return Err(Sense::invalid_cdb(3, None));
        }
        pages.extend(page_bytes(req.page, req.pc, cur, defaults));
    }

    let long = req.ten && req.llbaa;
    let bd_len = match (req.dbd, long) {
        (true, _) => 0,
        (false, true) => 16,
        (false, false) => 8,
    };
    let hdr = if req.ten { 8 } else { 4 };
    let mut b = vec![0u8; hdr + bd_len];
    // Device-specific parameter (SBC-4 6.5.1): WP and DPOFUA.
    let dsp = 0x10 | if geo.write_protected { 0x80 } else { 0 };
    let total = hdr + bd_len + pages.len();
    if req.ten {
        put_be16(&mut b[0..2], (total - 2) as u16);
        b[3] = dsp;
        b[4] = u8::from(long);
        put_be16(&mut b[6..8], bd_len as u16);
    } else {
        b[0] = (total - 1).min(255) as u8;
        b[2] = dsp;
        b[3] = bd_len as u8;
    }
    if bd_len > 0 && req.pc != PageControl::Changeable {
        let d = &mut b[hdr..];
        if long {
            put_be64(&mut d[0..8], geo.num_blocks);
            put_be32(&mut d[12..16], geo.block_size);
        } else {
            put_be32(
                &mut d[0..4],
                u32::try_from(geo.num_blocks).unwrap_or(u32::MAX),
            );
            d[5..8].copy_from_slice(&geo.block_size.to_be_bytes()[1..4]);
        }
    }
    b.extend(pages);
    Ok(b)
}

/// MODE SELECT(6)/(10) (SPC-4 6.9, 6.10): validates the parameter list against the
/// changeable masks and returns the new state. Nothing is applied on error.
pub fn mode_select(
    ten: bool,
    data: &[u8],
    cur: &ModeState,
    defaults: &ModeState,
    block_size: u32,
) -> Result<ModeState, Sense> {
    let hdr = if ten { 8 } else { 4 };
    if data.is_empty() {
        return Ok(*cur);
    }
    if data.len() < hdr {
        return Err(Sense::param_list_length());
    }
    let (bd_len, bd_len_at, long) = if ten {
        (be(&data[6..8]) as usize, 6, data[4] & 0x01 != 0)
    } else {
        (usize::from(data[3]), 3, false)
    };
    match (bd_len, long) {
        (0, _) | (8, false) | (16, true) => {}
        _ => return Err(Sense::invalid_param(bd_len_at, None)),
    }
    if hdr + bd_len > data.len() {
        return Err(Sense::param_list_length());
    }
    if bd_len > 0 {
        let d = &data[hdr..hdr + bd_len];
        let (bl, at) = if long {
            (be(&d[12..16]) as u32, hdr + 12)
        } else {
            (be(&d[5..8]) as u32, hdr + 5)
        };
        if bl != block_size {
            return Err(Sense::invalid_param(at, None));
        }
    }
    let mut new = *cur;
    let mut off = hdr + bd_len;
    while off < data.len() {
        if off + 2 > data.len() {
            return Err(Sense::param_list_length());
        }
        let code_byte = data[off];
        if code_byte & 0x80 != 0 {
            return Err(Sense::invalid_param(off, Some(7)));
        }
        if code_byte & 0x40 != 0 {
            return Err(Sense::invalid_param(off, Some(6)));
        }
        let code = code_byte & 0x3f;
        let Some(len) = page_len(code) else {
            return Err(Sense::invalid_param(off, Some(5)));
        };
        let plen = usize::from(data[off + 1]) + 2;
        if plen != len {
            return Err(Sense::invalid_param(off + 1, None));
        }
        if off + plen > data.len() {
            return Err(Sense::param_list_length());
        }
        let given = &data[off..off + plen];
        let current = page_bytes(code, PageControl::Current, cur, defaults);
        let mask = page_bytes(code, PageControl::Changeable, cur, defaults);
        for i in 2..plen {
            let diff = (given[i] ^ current[i]) & !mask[i];
            if diff != 0 {
                let bit = 7 - diff.leading_zeros() as u8;
                return Err(Sense::invalid_param(off + i, Some(bit)));
            }
        }
        match code {
            page::CACHING => new.wce = given[2] & 0x04 != 0,
            page::CONTROL => {
                new.d_sense = given[2] & 0x04 != 0;
                new.swp = given[4] & 0x08 != 0;
                new.tas = given[5] & 0x40 != 0;
            }
            _ => {}
        }
        off += plen;
    }
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ST: ModeState = ModeState {
        wce: true,
        d_sense: false,
        swp: false,
        tas: false,
    };
    const GEO: Geometry = Geometry {
        num_blocks: 0x1_0000_0000,
        block_size: 512,
        write_protected: false,
    };

    fn req(cdb: &[u8]) -> SenseReq {
        let mut b = [0xa5u8; 16];
        b[..cdb.len()].copy_from_slice(cdb);
        SenseReq::parse(&b)
    }

    #[test]
    fn emit_all_pages_6() {
        let b = mode_sense(&req(&[0x1a, 0, 0x3f, 0, 255, 0]), &ST, &ST, &GEO).unwrap();
        assert_eq!(b.len(), 4 + 8 + 12 + 20 + 12 + 12);
        assert_eq!(usize::from(b[0]) + 1, b.len());
        assert_eq!(b[2], 0x10);
        assert_eq!(b[3], 8);
        assert_eq!(&b[4..8], &[0xff; 4]);
        assert_eq!(&b[9..12], &[0, 2, 0]);
        let caching = &b[12 + 12..12 + 12 + 20];
        assert_eq!(&caching[..3], &[0x08, 0x12, 0x04]);
    }

    #[test]
    fn emit_long_lba_10() {
        let b = mode_sense(
            &req(&[0x5a, 0x10, 0x0a, 0, 0, 0, 0, 0, 255, 0]),
            &ST,
            &ST,
            &GEO,
        )
        .unwrap();
        assert_eq!(be(&b[0..2]) as usize + 2, b.len());
        assert_eq!(b[4], 1);
        assert_eq!(be(&b[6..8]), 16);
        assert_eq!(be(&b[8..16]), 0x1_0000_0000);
        assert_eq!(be(&b[20..24]), 512);
        assert_eq!(&b[24..26], &[0x0a, 0x0a]);
    }

    #[test]
    fn changeable_and_saved() {
        let b = mode_sense(&req(&[0x1a, 0x08, 0x4a, 0, 255, 0]), &ST, &ST, &GEO).unwrap();
        // D_SENSE, SWP and TAS are changeable.
        assert_eq!(
            &b[4..],
            &[0x0a, 0x0a, 0x04, 0, 0x08, 0x40, 0, 0, 0, 0, 0, 0]
        );
        let e = mode_sense(&req(&[0x1a, 0, 0xc8, 0, 255, 0]), &ST, &ST, &GEO).unwrap_err();
        assert_eq!((e.asc, e.ascq), (0x39, 0));
    }

    #[test]
    fn bad_field_page_and_subpage() {
        assert_eq!(
            mode_sense(&req(&[0x1a, 0, 0x05, 0, 255, 0]), &ST, &ST, &GEO),
            Err(Sense::invalid_cdb(2, Some(5)))
        );
        assert_eq!(
            mode_sense(&req(&[0x1a, 0, 0x0a, 0x01, 255, 0]), &ST, &ST, &GEO),
            Err(Sense::invalid_cdb(3, None))
        );
    }

    fn control_select(b2: u8, b4: u8) -> Vec<u8> {
        let mut d = vec![0, 0, 0, 0];
        let mut p = page_bytes(page::CONTROL, PageControl::Current, &ST, &ST);
        p[2] = b2;
        p[4] = b4;
        d.extend(p);
        d
    }

    #[test]
    fn parse_select_swp_and_dsense() {
        let new = mode_select(false, &control_select(0x06, 0x08), &ST, &ST, 512).unwrap();
        assert!(new.swp && new.d_sense && new.wce && !new.tas);
        let mut d = control_select(0x02, 0);
        d[9] = 0x40;
        let new = mode_select(false, &d, &ST, &ST, 512).unwrap();
        assert!(new.tas && !new.swp);
    }

    #[test]
    fn bad_field_select_unchangeable() {
        // TST=1 is not changeable.
        let e = mode_select(false, &control_select(0x22, 0), &ST, &ST, 512).unwrap_err();
        assert_eq!(e, Sense::invalid_param(6, Some(5)));
        // PS bit set.
        let mut d = control_select(0x02, 0);
        d[4] |= 0x80;
        assert_eq!(
            mode_select(false, &d, &ST, &ST, 512),
            Err(Sense::invalid_param(4, Some(7)))
        );
        // Unknown page.
        let d = vec![0, 0, 0, 0, 0x05, 0x02, 0, 0];
        assert_eq!(
            mode_select(false, &d, &ST, &ST, 512),
            Err(Sense::invalid_param(4, Some(5)))
        );
        // Wrong page length.
        let d = vec![0, 0, 0, 0, 0x08, 0x02, 0, 0];
        assert_eq!(
            mode_select(false, &d, &ST, &ST, 512),
            Err(Sense::invalid_param(5, None))
        );
    }

    #[test]
    fn truncated_select() {
        let d = control_select(0x02, 0);
        assert_eq!(
            mode_select(false, &d[..10], &ST, &ST, 512),
            Err(Sense::param_list_length())
        );
        assert_eq!(
            mode_select(false, &d[..2], &ST, &ST, 512),
            Err(Sense::param_list_length())
        );
        assert_eq!(mode_select(false, &[], &ST, &ST, 512), Ok(ST));
    }

    #[test]
    fn select_caching_with_block_descriptor() {
        let mut d = vec![0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 2, 0];
        let mut p = page_bytes(page::CACHING, PageControl::Current, &ST, &ST);
        p[2] = 0;
        d.extend(p);
        let new = mode_select(false, &d, &ST, &ST, 512).unwrap();
        assert!(!new.wce);
        d[10] = 0x10;
        assert_eq!(
            mode_select(false, &d, &ST, &ST, 512),
            Err(Sense::invalid_param(9, None))
        );
    }
}
