//! LUN addressing (SAM-5 4.7) and the LUN map of one I_T nexus: REPORT LUNS (SPC-4 6.33)
//! and the answers for logical units that are not mapped.

use rtgt_backstore::IoBuf;

use super::cdb::{be, field, put_be32};
use super::sense::{asc, Sense};
use super::spc;
use super::{Command, Ctx, Device, Done, LunMap, Nexus, Response, Status};

/// Largest LUN the flat space addressing method encodes.
pub const MAX_LUN: u64 = 16383;

/// Encodes a LUN: peripheral device addressing below 256, flat space addressing up to
/// 16383 (SAM-5 4.7.7). Larger values are clamped to 16383.
pub fn lun_to_bytes(lun: u64) -> [u8; 8] {
    let lun = lun.min(MAX_LUN);
    let mut b = [0u8; 8];
    if lun < 256 {
        b[1] = lun as u8;
    } else {
        b[0] = 0x40 | (lun >> 8) as u8;
        b[1] = lun as u8;
    }
    b
}

/// Decodes a single-level LUN in peripheral (bus 0) or flat space addressing. Any other
/// form (other bus, logical unit or extended addressing, multi-level) decodes to
/// `u64::MAX`, which is never mapped.
pub fn lun_from_bytes(b: &[u8; 8]) -> u64 {
    if b[2..].iter().any(|&x| x != 0) {
        return u64::MAX;
    }
    match b[0] >> 6 {
        0b00 if b[0] & 0x3f == 0 => u64::from(b[1]),
        0b01 => (u64::from(b[0] & 0x3f) << 8) | u64::from(b[1]),
        _ => u64::MAX,
    }
}

/// REPORT LUNS parameter data for `luns`.
fn report_luns_data(luns: impl Iterator<Item = u64>) -> Vec<u8> {
    let mut b = vec![0u8; 8];
    for l in luns {
        b.extend_from_slice(&lun_to_bytes(l));
    }
    let len = (b.len() - 8) as u32;
    put_be32(&mut b[0..4], len);
    b
}

/// SELECT REPORT values (SPC-4 Table 271, SPC-5): which LUNs a REPORT LUNS lists.
fn select_report(cdb: &[u8]) -> Result<bool, Sense> {
    match cdb[2] {
        // All logical units (there are no well-known or administrative ones).
        0x00 | 0x02 | 0x11 => Ok(true),
        0x01 | 0x10 | 0x12 => Ok(false),
        _ => Err(Sense::invalid_cdb(2, None)),
    }
}

/// REPORT LUNS addressed to a device directly (no LUN map): the device cannot know its
/// LUN, so it reports LUN 0.
pub fn report_luns_single(ctx: &mut Ctx<'_>) -> Done {
    let alloc = be(&ctx.cdb[field::ALLOC12]) as u32;
    let all = select_report(&ctx.cdb).unwrap_or(false);
    Done::data(&report_luns_data(all.then_some(0).into_iter()), alloc)
}

fn data_response(bytes: &[u8], alloc: u32, edtl: u32) -> Response {
    let n = bytes.len().min(alloc as usize);
    let m = n.min(edtl as usize);
    Response {
        status: Status::Good,
        sense: None,
        data_in: (m > 0).then(|| IoBuf::from_slice(&bytes[..m])),
        data_range: None,
        transfer_len: n as u32,
    }
}

impl LunMap {
    fn report_luns(&self, nexus: &Nexus, cmd: &Command) -> Response {
        if cmd.cdb.len() < 12 {
            return Response::check(&Sense::invalid_cdb(0, None));
        }
        let cdb = &cmd.cdb[..12];
        // Reserved bits and NACA/LINK.
        let usage = [0xa0u8, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0];
        for (i, (&b, &u)) in cdb.iter().zip(usage.iter()).enumerate() {
            if b & !u != 0 {
                return Response::check(&Sense::invalid_cdb(
                    i,
                    Some(7 - (b & !u).leading_zeros() as u8),
                ));
            }
        }
        let all = match select_report(cdb) {
            Ok(a) => a,
            Err(s) => return Response::check(&s),
        };
        for dev in self.luns.values() {
            dev.clear_reported_luns_ua(nexus);
        }
        let alloc = be(&cdb[field::ALLOC12]) as u32;
        let luns = self.luns.keys().copied().filter(|&l| all && l <= MAX_LUN);
        data_response(&report_luns_data(luns), alloc, cmd.expected_in_len)
    }

    /// Executes a command for `lun`: REPORT LUNS from the map, everything else on the
    /// mapped device, or the SPC-4 answers for a LUN that is not mapped (INQUIRY with
    /// peripheral qualifier 011b, REQUEST SENSE and CHECK CONDITION with LOGICAL UNIT NOT
    /// SUPPORTED).
    pub async fn execute(&self, nexus: &Nexus, lun: u64, cmd: Command) -> Response {
        self.execute_ranged(nexus, lun, cmd, false).await
    }

    /// Like [`LunMap::execute`], passing `range_ok` to [`Device::execute_ranged`].
    pub async fn execute_ranged(
        &self,
        nexus: &Nexus,
        lun: u64,
        cmd: Command,
        range_ok: bool,
    ) -> Response {
        if cmd.cdb.first() == Some(&0xa0) {
            return self.report_luns(nexus, &cmd);
        }
        if let Some(dev) = self.luns.get(&lun) {
            return dev.execute_ranged(nexus, cmd, range_ok).await;
        }
        unmapped(self.luns.values().next().map(|d| d.as_ref()), &cmd)
    }
}

/// Answers for a LUN without a logical unit (SPC-4 6.6.2, 6.39, SAM-5 5.11).
fn unmapped(any: Option<&Device>, cmd: &Command) -> Response {
    let not_supported = Sense::illegal(asc::LU_NOT_SUPPORTED);
    match cmd.cdb.first() {
        Some(0x12) if cmd.cdb.len() >= 6 => {
            let evpd = cmd.cdb[1] & 0x01 != 0;
            let alloc = be(&cmd.cdb[3..5]) as u32;
            if cmd.cdb[1] & 0xfe != 0 || (!evpd && cmd.cdb[2] != 0) {
                return Response::check(&Sense::invalid_cdb(if evpd { 2 } else { 1 }, None));
            }
            if evpd {
                if cmd.cdb[2] != 0 {
                    return Response::check(&Sense::invalid_cdb(2, None));
                }
                // Supported VPD pages: only this one.
                return data_response(&[0x7f, 0, 0, 1, 0], alloc, cmd.expected_in_len);
            }
            let data = match any {
                Some(d) => spc::standard_inquiry(d, 0x7f),
                None => {
                    let mut b = vec![0u8; 36];
                    b[0] = 0x7f;
                    b[2] = 0x06;
                    b[3] = 0x12;
                    b[4] = 31;
                    b[8..36].copy_from_slice(b"RTGT    NO LOGICAL UNIT     ");
                    b
                }
            };
            data_response(&data, alloc, cmd.expected_in_len)
        }
        Some(0x03) if cmd.cdb.len() >= 6 => {
            let desc = cmd.cdb[1] & 0x01 != 0;
            let alloc = u32::from(cmd.cdb[4]);
            data_response(&not_supported.emit(desc), alloc, cmd.expected_in_len)
        }
        _ => Response::check(&not_supported),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sense::key;

    #[test]
    fn emit_luns() {
        assert_eq!(lun_to_bytes(0), [0; 8]);
        assert_eq!(lun_to_bytes(5), [0, 5, 0, 0, 0, 0, 0, 0]);
        assert_eq!(lun_to_bytes(256), [0x41, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(lun_to_bytes(16383), [0x7f, 0xff, 0, 0, 0, 0, 0, 0]);
        assert_eq!(lun_to_bytes(1 << 40), lun_to_bytes(16383));
    }

    #[test]
    fn parse_luns() {
        for l in [0u64, 1, 255, 256, 1000, 16383] {
            assert_eq!(lun_from_bytes(&lun_to_bytes(l)), l);
        }
        assert_eq!(lun_from_bytes(&[0x00, 0x07, 0, 0, 0, 0, 0, 0]), 7);
        assert_eq!(lun_from_bytes(&[0x40, 0x07, 0, 0, 0, 0, 0, 0]), 7);
    }

    #[test]
    fn bad_field_luns() {
        // Bus 1, logical unit / extended addressing, second level.
        assert_eq!(lun_from_bytes(&[0x01, 0, 0, 0, 0, 0, 0, 0]), u64::MAX);
        assert_eq!(lun_from_bytes(&[0x80, 0, 0, 0, 0, 0, 0, 0]), u64::MAX);
        assert_eq!(lun_from_bytes(&[0xc0, 0, 0, 0, 0, 0, 0, 0]), u64::MAX);
        assert_eq!(lun_from_bytes(&[0, 1, 0, 2, 0, 0, 0, 0]), u64::MAX);
    }

    #[test]
    fn report_data() {
        let b = report_luns_data([0u64, 300].into_iter());
        assert_eq!(&b[0..8], &[0, 0, 0, 16, 0, 0, 0, 0]);
        assert_eq!(&b[16..18], &[0x41, 0x2c]);
        assert_eq!(
            select_report(&[0xa0, 0, 0x03]),
            Err(Sense::invalid_cdb(2, None))
        );
    }

    #[test]
    fn unmapped_answers() {
        let mk = |cdb: Vec<u8>| Command {
            cdb: cdb.into(),
            data_out: None,
            expected_in_len: 255,
            attr: Default::default(),
            tag: 0,
        };
        let r = unmapped(None, &mk(vec![0x12, 0, 0, 0, 255, 0]));
        let d = r.data_in.unwrap();
        assert_eq!(d[0], 0x7f);
        let r = unmapped(None, &mk(vec![0x00, 0, 0, 0, 0, 0]));
        assert_eq!(r.status, Status::CheckCondition);
        assert_eq!(
            Sense::parse(&r.sense.unwrap()),
            Some((key::ILLEGAL_REQUEST, 0x25, 0))
        );
        let r = unmapped(None, &mk(vec![0x03, 0, 0, 0, 18, 0]));
        assert_eq!(r.status, Status::Good);
        assert_eq!(
            Sense::parse(&r.data_in.unwrap()),
            Some((key::ILLEGAL_REQUEST, 0x25, 0))
        );
    }
}
