//! NVMe/TCP PDUs (NVMe/TCP Transport 1.0, section 3.6): an 8-byte common header, a
//! PDU-specific header, an optional header digest, padding up to the data offset, data, and
//! an optional data digest. Digests are CRC32C; which ones a connection carries is settled by
//! ICReq/ICResp ([`Digests`]).
//!
//! [`parse`] takes one whole PDU (the common header's PLEN bytes) and checks it as a
//! controller must: a header that is wrong in any field is a fatal error answered with a
//! termination request naming the field ([`PduError::Fatal`]); a data digest that does not
//! match fails only the command ([`PduError::DataDigest`]).

use crate::sqe::{Cqe, Sqe, CQE_LEN, SQE_LEN};
use crate::{le16, le32, put16, put32};

/// PDU types.
pub mod pdu_type {
    pub const IC_REQ: u8 = 0x00;
    pub const IC_RESP: u8 = 0x01;
    pub const H2C_TERM_REQ: u8 = 0x02;
    pub const C2H_TERM_REQ: u8 = 0x03;
    pub const CAPSULE_CMD: u8 = 0x04;
    pub const CAPSULE_RESP: u8 = 0x05;
    pub const H2C_DATA: u8 = 0x06;
    pub const C2H_DATA: u8 = 0x07;
    pub const R2T: u8 = 0x09;
}

/// Common header flags.
pub mod flags {
    pub const HDGST: u8 = 0x01;
    pub const DDGST: u8 = 0x02;
    /// Data PDUs: the last one of the command's data (H2C: of the R2T's).
    pub const DATA_LAST: u8 = 0x04;
    /// C2HData: the command succeeded, no response capsule follows.
    pub const DATA_SUCCESS: u8 = 0x08;
}

/// Fatal error statuses of a termination request.
pub mod fes {
    pub const INVALID_PDU_HEADER: u16 = 0x01;
    pub const PDU_SEQUENCE_ERROR: u16 = 0x02;
    pub const HEADER_DIGEST_ERROR: u16 = 0x03;
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    pub const DATA_LIMIT_EXCEEDED: u16 = 0x05;
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

/// Length of the common header.
pub const CH_LEN: usize = 8;
/// Length of a digest.
pub const DIGEST_LEN: usize = 4;
/// Length of ICReq and ICResp.
pub const IC_LEN: usize = 128;
/// Header length of termination requests, responses, data PDUs and R2T.
pub const SHORT_HLEN: usize = 24;
/// Header length of a command capsule.
pub const CMD_HLEN: usize = CH_LEN + SQE_LEN;
/// Largest termination request: its header and the offending PDU header (up to 128 bytes).
pub const TERM_REQ_MAX: usize = SHORT_HLEN + 128;

/// The common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    pub ty: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

impl CommonHeader {
    pub fn parse(b: &[u8]) -> Option<CommonHeader> {
        (b.len() >= CH_LEN).then(|| CommonHeader {
            ty: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: le32(b, 4),
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.ty;
        b[1] = self.flags;
        b[2] = self.hlen;
        b[3] = self.pdo;
        put32(b, 4, self.plen);
    }
}

/// The layout [`Header::encode_head`] writes.
struct Sizes {
    hlen: usize,
    /// Header digest bytes.
    hd: usize,
    /// Data digest bytes.
    dd: usize,
    /// Where the data starts (0: no data).
    start: usize,
    pdo: usize,
    plen: usize,
    /// Bytes before the data (the whole PDU when there is no data).
    head: usize,
}

/// The digests a connection carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// A PDU's header, what follows the common header up to the data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Header {
    IcReq {
        pfv: u16,
        /// Host PDU data alignment: data offsets the host wants, in dwords minus one.
        hpda: u8,
        digests: Digests,
        /// Most R2Ts the host takes outstanding per command, minus one.
        maxr2t: u32,
    },
    IcResp {
        pfv: u16,
        /// Controller PDU data alignment.
        cpda: u8,
        digests: Digests,
        /// Most data the host may send in one H2CData PDU.
        maxh2cdata: u32,
    },
    /// H2CTermReq (`c2h` false) or C2HTermReq; its data is the offending PDU's header.
    TermReq {
        c2h: bool,
        fes: u16,
        fei: u32,
    },
    Cmd(Sqe),
    Resp(Cqe),
    /// H2CData (`c2h` false) or C2HData.
    Data {
        c2h: bool,
        cccid: u16,
        ttag: u16,
        offset: u32,
        length: u32,
        last: bool,
        /// C2HData only: the command succeeded and no response follows.
        success: bool,
    },
    R2t {
        cccid: u16,
        ttag: u16,
        offset: u32,
        length: u32,
    },
}

/// Why a PDU cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PduError {
    /// A termination request is owed: fatal error status, and the byte offset of the field
    /// in error (for an invalid header).
    Fatal { fes: u16, fei: u32 },
    /// The data digest did not match: the command (whose PDU this header starts) fails, the
    /// connection stays.
    DataDigest(Box<Header>),
}

fn invalid(at: usize) -> PduError {
    PduError::Fatal {
        fes: fes::INVALID_PDU_HEADER,
        fei: at as u32,
    }
}

impl Header {
    fn ty(&self) -> u8 {
        match self {
            Header::IcReq { .. } => pdu_type::IC_REQ,
            Header::IcResp { .. } => pdu_type::IC_RESP,
            Header::TermReq { c2h: false, .. } => pdu_type::H2C_TERM_REQ,
            Header::TermReq { c2h: true, .. } => pdu_type::C2H_TERM_REQ,
            Header::Cmd(_) => pdu_type::CAPSULE_CMD,
            Header::Resp(_) => pdu_type::CAPSULE_RESP,
            Header::Data { c2h: false, .. } => pdu_type::H2C_DATA,
            Header::Data { c2h: true, .. } => pdu_type::C2H_DATA,
            Header::R2t { .. } => pdu_type::R2T,
        }
    }

    fn hlen(ty: u8) -> Option<usize> {
        Some(match ty {
            pdu_type::IC_REQ | pdu_type::IC_RESP => IC_LEN,
            pdu_type::CAPSULE_CMD => CMD_HLEN,
            pdu_type::H2C_TERM_REQ
            | pdu_type::C2H_TERM_REQ
            | pdu_type::CAPSULE_RESP
            | pdu_type::H2C_DATA
            | pdu_type::C2H_DATA
            | pdu_type::R2T => SHORT_HLEN,
            _ => return None,
        })
    }

    /// Whether the connection's digests apply (not to connection setup and termination).
    fn digested(ty: u8) -> bool {
        !matches!(
            ty,
            pdu_type::IC_REQ | pdu_type::IC_RESP | pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ
        )
    }

    /// Whether data may follow the header.
    fn carries_data(ty: u8) -> bool {
        matches!(
            ty,
            pdu_type::CAPSULE_CMD
                | pdu_type::H2C_DATA
                | pdu_type::C2H_DATA
                | pdu_type::H2C_TERM_REQ
                | pdu_type::C2H_TERM_REQ
        )
    }

    /// The whole PDU: this header, `data`, digests as `digests` says, the data at offset
    /// `align` (bytes, a multiple of 4; 0: right after the header and its digest).
    pub fn to_pdu(&self, digests: Digests, data: &[u8], align: usize) -> Vec<u8> {
        let (mut b, trailer) = self.encode(digests, data, align);
        b.extend_from_slice(data);
        if let Some(t) = trailer {
            b.extend_from_slice(&t);
        }
        b
    }

    /// The PDU in the pieces a sender writes one after the other, so that the data is never
    /// copied: everything before the data (common header, header, header digest, padding),
    /// then `data` itself, then the data digest if there is one.
    pub fn encode(
        &self,
        digests: Digests,
        data: &[u8],
        align: usize,
    ) -> (Vec<u8>, Option<[u8; 4]>) {
        let mut b = vec![0u8; self.sizes(digests, data.len(), align).head];
        self.encode_head(digests, data.len(), align, &mut b);
        (b, self.data_digest(digests, data))
    }

    /// Writes everything before the data of a PDU carrying `data_len` bytes into `b` (which
    /// must be long enough) and returns its length; [`Header::data_digest`] gives the data
    /// digest when there is one.
    pub fn encode_head(
        &self,
        digests: Digests,
        data_len: usize,
        align: usize,
        b: &mut [u8],
    ) -> usize {
        let z = self.sizes(digests, data_len, align);
        let b = &mut b[..z.head];
        b.fill(0);
        let mut fl = 0;
        if z.hd != 0 {
            fl |= flags::HDGST;
        }
        if z.dd != 0 {
            fl |= flags::DDGST;
        }
        self.emit_specific(&mut b[..z.hlen], &mut fl);
        CommonHeader {
            ty: self.ty(),
            flags: fl,
            hlen: z.hlen as u8,
            pdo: z.pdo as u8,
            plen: z.plen as u32,
        }
        .emit(b);
        if z.hd != 0 {
            let c = crc32c::crc32c(&b[..z.hlen]);
            put32(b, z.hlen, c);
        }
        z.head
    }

    /// The data digest following `data` on a connection carrying `digests`, if any.
    pub fn data_digest(&self, digests: Digests, data: &[u8]) -> Option<[u8; 4]> {
        let z = self.sizes(digests, data.len(), 0);
        (z.start != 0 && z.dd != 0).then(|| crc32c::crc32c(data).to_le_bytes())
    }

    /// Where the pieces of a PDU carrying `data_len` bytes go.
    fn sizes(&self, digests: Digests, data_len: usize, align: usize) -> Sizes {
        let ty = self.ty();
        let hlen = Self::hlen(ty).expect("a known type");
        let digested = Self::digested(ty);
        let hd = if digested && digests.header {
            DIGEST_LEN
        } else {
            0
        };
        let dd = if digested && digests.data && data_len > 0 {
            DIGEST_LEN
        } else {
            0
        };
        // Where the data starts: a termination request's right after its header (PDO 0).
        let start = if data_len == 0 || !Self::carries_data(ty) {
            0
        } else if !digested {
            hlen
        } else {
            (hlen + hd).max(align).next_multiple_of(4)
        };
        let pdo = if digested { start } else { 0 };
        let plen = if start == 0 {
            hlen + hd
        } else {
            start + data_len + dd
        };
        Sizes {
            hlen,
            hd,
            dd,
            start,
            pdo,
            plen,
            head: if start == 0 { plen } else { start },
        }
    }

    fn emit_specific(&self, b: &mut [u8], fl: &mut u8) {
        let digest_bits = |d: &Digests| u8::from(d.header) | u8::from(d.data) << 1;
        match self {
            Header::IcReq {
                pfv,
                hpda,
                digests,
                maxr2t,
            } => {
                put16(b, 8, *pfv);
                b[10] = *hpda;
                b[11] = digest_bits(digests);
                put32(b, 12, *maxr2t);
            }
            Header::IcResp {
                pfv,
                cpda,
                digests,
                maxh2cdata,
            } => {
                put16(b, 8, *pfv);
                b[10] = *cpda;
                b[11] = digest_bits(digests);
                put32(b, 12, *maxh2cdata);
            }
            Header::TermReq { fes, fei, .. } => {
                put16(b, 8, *fes);
                put32(b, 10, *fei);
            }
            Header::Cmd(sqe) => sqe.emit(&mut b[CH_LEN..]),
            Header::Resp(cqe) => cqe.emit(&mut b[CH_LEN..]),
            Header::Data {
                cccid,
                ttag,
                offset,
                length,
                last,
                success,
                ..
            } => {
                put16(b, 8, *cccid);
                put16(b, 10, *ttag);
                put32(b, 12, *offset);
                put32(b, 16, *length);
                if *last {
                    *fl |= flags::DATA_LAST;
                }
                if *success {
                    *fl |= flags::DATA_SUCCESS;
                }
            }
            Header::R2t {
                cccid,
                ttag,
                offset,
                length,
            } => {
                put16(b, 8, *cccid);
                put16(b, 10, *ttag);
                put32(b, 12, *offset);
                put32(b, 16, *length);
            }
        }
    }
}

/// How many bytes of the stream the PDU that starts with `ch` takes (PLEN), checked against
/// the type's header length so that a reader never waits for, or buffers, more than a PDU
/// of that type can hold: `max_data` bounds the data of a command capsule or a data PDU.
pub fn pdu_len(ch: &CommonHeader, max_data: usize) -> Result<usize, PduError> {
    let hlen = Header::hlen(ch.ty).ok_or(invalid(0))?;
    if usize::from(ch.hlen) != hlen {
        return Err(invalid(2));
    }
    let plen = ch.plen as usize;
    let most = match ch.ty {
        pdu_type::IC_REQ | pdu_type::IC_RESP => IC_LEN,
        pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ => TERM_REQ_MAX,
        pdu_type::CAPSULE_RESP | pdu_type::R2T => hlen + DIGEST_LEN,
        // Header, digest, padding (PDO is one byte) and data, digest.
        _ => 256 + max_data + DIGEST_LEN,
    };
    if plen < hlen || plen > most {
        return Err(invalid(4));
    }
    Ok(plen)
}

/// Where the data of a PDU is, after its head ([`head_len`] bytes: common header, header and
/// header digest): `pad` bytes up to the data offset, `data` bytes of data, `ddgst` bytes of
/// data digest. A PDU without data has all three 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub pad: usize,
    pub data: usize,
    pub ddgst: usize,
}

impl Layout {
    /// Bytes of the PDU after its head: padding, data, data digest.
    pub fn rest(&self) -> usize {
        self.pad + self.data + self.ddgst
    }
}

/// The bytes of the PDU that starts with `ch` up to its data on a connection carrying
/// `digests`: the common header, the PDU-specific header, the header digest. `ch` must have
/// passed [`pdu_len`].
pub fn head_len(ch: &CommonHeader, digests: Digests) -> usize {
    let hd = Header::digested(ch.ty) && digests.header;
    usize::from(ch.hlen) + if hd { DIGEST_LEN } else { 0 }
}

/// Parses one whole PDU (`b` is exactly PLEN bytes) on a connection carrying `digests`:
/// its header and its data.
pub fn parse(b: &[u8], digests: Digests) -> Result<(Header, &[u8]), PduError> {
    let ch = CommonHeader::parse(b).ok_or(invalid(0))?;
    if ch.plen as usize != b.len() {
        return Err(invalid(4));
    }
    let (header, l) = parse_head(b, digests)?;
    let start = b.len() - l.ddgst - l.data;
    let data = &b[start..start + l.data];
    if !check_data(data, &b[start + l.data..], digests) {
        return Err(PduError::DataDigest(Box::new(header)));
    }
    Ok((header, data))
}

/// Whether `data` matches its data digest `ddgst` (the [`Layout::ddgst`] bytes after it).
pub fn check_data(data: &[u8], ddgst: &[u8], digests: Digests) -> bool {
    !digests.data || ddgst.len() != DIGEST_LEN || le32(ddgst, 0) == crc32c::crc32c(data)
}

/// Parses the head of a PDU — `b` holds at least its first [`head_len`] bytes, PLEN the whole
/// PDU's — and checks it as [`parse`] does, up to the data: its header, and where the data is.
/// A reader reads the data straight to where it belongs and checks it with [`check_data`].
pub fn parse_head(b: &[u8], digests: Digests) -> Result<(Header, Layout), PduError> {
    let ch = CommonHeader::parse(b).ok_or(invalid(0))?;
    let hlen = Header::hlen(ch.ty).ok_or(invalid(0))?;
    if usize::from(ch.hlen) != hlen {
        return Err(invalid(2));
    }
    let plen = ch.plen as usize;
    if plen < hlen || b.len() < hlen {
        return Err(invalid(4));
    }
    let digested = Header::digested(ch.ty);
    let want_hd = digested && digests.header;
    if (ch.flags & flags::HDGST != 0) != want_hd {
        return Err(invalid(1));
    }
    let hd = if want_hd { DIGEST_LEN } else { 0 };
    if plen < hlen + hd || b.len() < hlen + hd {
        return Err(invalid(4));
    }
    if hd != 0 && le32(b, hlen) != crc32c::crc32c(&b[..hlen]) {
        return Err(PduError::Fatal {
            fes: fes::HEADER_DIGEST_ERROR,
            fei: 0,
        });
    }
    // The data: from PDO to the end, less its digest.
    let rest = plen - (hlen + hd);
    let layout = if rest == 0 {
        if (digested && ch.pdo != 0) || ch.flags & flags::DDGST != 0 {
            return Err(invalid(if ch.pdo != 0 { 3 } else { 1 }));
        }
        Layout {
            pad: 0,
            data: 0,
            ddgst: 0,
        }
    } else {
        if !Header::carries_data(ch.ty) {
            return Err(invalid(4));
        }
        let term = !digested;
        let pdo = usize::from(ch.pdo);
        // A termination request's data follows its header at once (PDO 0).
        let start = if term { hlen } else { pdo };
        if !term && (pdo < hlen + hd || pdo > plen || pdo % 4 != 0) {
            return Err(invalid(3));
        }
        let want_dd = digested && digests.data;
        if (ch.flags & flags::DDGST != 0) != want_dd {
            return Err(invalid(1));
        }
        let dd = if want_dd { DIGEST_LEN } else { 0 };
        if plen < start + dd {
            return Err(invalid(4));
        }
        Layout {
            pad: start - (hlen + hd),
            data: plen - start - dd,
            ddgst: dd,
        }
    };
    Ok((specific(b, &ch, layout.data)?, layout))
}

/// The PDU-specific header of `b` (checked up to its data, of `data_len` bytes).
fn specific(b: &[u8], ch: &CommonHeader, data_len: usize) -> Result<Header, PduError> {
    Ok(match ch.ty {
        pdu_type::IC_REQ | pdu_type::IC_RESP => {
            let d = b[11];
            if d & !0x3 != 0 {
                return Err(invalid(11));
            }
            let digests = Digests {
                header: d & 1 != 0,
                data: d & 2 != 0,
            };
            if ch.ty == pdu_type::IC_REQ {
                Header::IcReq {
                    pfv: le16(b, 8),
                    hpda: b[10],
                    digests,
                    maxr2t: le32(b, 12),
                }
            } else {
                Header::IcResp {
                    pfv: le16(b, 8),
                    cpda: b[10],
                    digests,
                    maxh2cdata: le32(b, 12),
                }
            }
        }
        pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ => Header::TermReq {
            c2h: ch.ty == pdu_type::C2H_TERM_REQ,
            fes: le16(b, 8),
            fei: le32(b, 10),
        },
        pdu_type::CAPSULE_CMD => Header::Cmd(Sqe::parse(&b[CH_LEN..]).ok_or(invalid(8))?),
        pdu_type::CAPSULE_RESP => {
            Header::Resp(Cqe::parse(&b[CH_LEN..CH_LEN + CQE_LEN]).ok_or(invalid(8))?)
        }
        pdu_type::H2C_DATA | pdu_type::C2H_DATA => {
            let c2h = ch.ty == pdu_type::C2H_DATA;
            let length = le32(b, 16);
            if data_len == 0 || length as usize != data_len {
                return Err(invalid(16));
            }
            let success = ch.flags & flags::DATA_SUCCESS != 0;
            // SUCCESS is for C2HData only, and only on its last PDU.
            if success && (!c2h || ch.flags & flags::DATA_LAST == 0) {
                return Err(invalid(1));
            }
            Header::Data {
                c2h,
                cccid: le16(b, 8),
                ttag: le16(b, 10),
                offset: le32(b, 12),
                length,
                last: ch.flags & flags::DATA_LAST != 0,
                success,
            }
        }
        pdu_type::R2T => Header::R2t {
            cccid: le16(b, 8),
            ttag: le16(b, 10),
            offset: le32(b, 12),
            length: le32(b, 16),
        },
        _ => return Err(invalid(0)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqe::{Sgl, Status};

    /// Linux's ICReq (nvme_tcp_init_connection): PFV 0, HPDA 0, header and data digests
    /// asked for, MAXR2T 0.
    const LINUX_ICREQ: [u8; 16] = [0, 0, 128, 0, 128, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0];

    fn both() -> Digests {
        Digests {
            header: true,
            data: true,
        }
    }

    #[test]
    fn connection_setup_pdus() {
        let mut icreq = [0u8; IC_LEN];
        icreq[..16].copy_from_slice(&LINUX_ICREQ);
        let (h, data) = parse(&icreq, Digests::default()).unwrap();
        assert!(data.is_empty());
        assert_eq!(
            h,
            Header::IcReq {
                pfv: 0,
                hpda: 0,
                digests: both(),
                maxr2t: 0
            }
        );
        assert_eq!(h.to_pdu(Digests::default(), &[], 0), icreq.to_vec());
        // Connection setup PDUs never carry digests, whatever was negotiated.
        assert_eq!(parse(&icreq, both()).unwrap().0, h);
        let resp = Header::IcResp {
            pfv: 0,
            cpda: 0,
            digests: both(),
            maxh2cdata: 0x2_0000,
        };
        let b = resp.to_pdu(both(), &[], 0);
        assert_eq!(b.len(), IC_LEN);
        assert_eq!(
            &b[..16],
            &[1, 0, 128, 0, 128, 0, 0, 0, 0, 0, 0, 3, 0, 0, 2, 0]
        );
        assert_eq!(parse(&b, both()).unwrap().0, resp);
        let mut bad = icreq;
        bad[11] = 4;
        assert_eq!(parse(&bad, Digests::default()), Err(invalid(11)));
    }

    #[test]
    fn command_capsules_with_in_capsule_data_and_digests() {
        let sqe = Sqe {
            opcode: 0x01,
            flags: 0x40,
            cid: 0x42,
            nsid: 1,
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            dptr: Sgl::DataBlock {
                addr: 0,
                len: 512,
                offset: true,
            }
            .to_bytes(),
            cdw: [8, 0, 0, 0, 0, 0],
        };
        let data = vec![0xa5u8; 512];
        for d in [Digests::default(), both()] {
            let b = Header::Cmd(sqe.clone()).to_pdu(d, &data, 0);
            let hd = if d.header { 4 } else { 0 };
            assert_eq!(b[3] as usize, 72 + hd, "PDO right after the header");
            assert_eq!(b.len(), 72 + hd + 512 + if d.data { 4 } else { 0 });
            let (h, got) = parse(&b, d).unwrap();
            assert_eq!((h, got), (Header::Cmd(sqe.clone()), &data[..]));
            // The other side's digests: refused, naming the flags.
            let other = Digests {
                header: !d.header,
                data: d.data,
            };
            assert_eq!(parse(&b, other), Err(invalid(1)));
        }
        // A data offset of the controller's alignment (CPDA).
        let b = Header::Cmd(sqe.clone()).to_pdu(Digests::default(), &data, 128);
        assert_eq!(b[3], 128);
        assert_eq!(parse(&b, Digests::default()).unwrap().1, &data[..]);
        // A corrupt header digest is fatal; a corrupt data digest fails the command only.
        let mut b = Header::Cmd(sqe.clone()).to_pdu(both(), &data, 0);
        b[100] ^= 1;
        assert_eq!(
            parse(&b, both()),
            Err(PduError::DataDigest(Box::new(Header::Cmd(sqe.clone()))))
        );
        b[100] ^= 1;
        b[9] ^= 1;
        assert_eq!(
            parse(&b, both()),
            Err(PduError::Fatal {
                fes: fes::HEADER_DIGEST_ERROR,
                fei: 0
            })
        );
        // PDO inside the header, or not a multiple of four.
        let mut b = Header::Cmd(sqe).to_pdu(Digests::default(), &data, 0);
        for pdo in [8u8, 74] {
            b[3] = pdo;
            assert_eq!(parse(&b, Digests::default()), Err(invalid(3)));
        }
    }

    #[test]
    fn responses_data_and_r2t() {
        let cqe = Cqe {
            cid: 7,
            status: Status::error(0, 0x80),
            ..Cqe::default()
        };
        let b = Header::Resp(cqe).to_pdu(both(), &[], 0);
        assert_eq!((b[1], b.len()), (flags::HDGST, 28));
        assert_eq!(parse(&b, both()).unwrap().0, Header::Resp(cqe));
        let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let c2h = Header::Data {
            c2h: true,
            cccid: 7,
            ttag: 0,
            offset: 8192,
            length: 4096,
            last: true,
            success: true,
        };
        let b = c2h.to_pdu(Digests::default(), &data, 0);
        assert_eq!(b[1], flags::DATA_LAST | flags::DATA_SUCCESS);
        assert_eq!(parse(&b, Digests::default()).unwrap(), (c2h, &data[..]));
        // DATAL must be the data's length; SUCCESS only on a last C2HData.
        let mut short = b.clone();
        put32(&mut short, 16, 4095);
        assert_eq!(parse(&short, Digests::default()), Err(invalid(16)));
        let h2c = Header::Data {
            c2h: false,
            cccid: 7,
            ttag: 3,
            offset: 0,
            length: 4096,
            last: true,
            success: false,
        };
        let mut b = h2c.to_pdu(both(), &data, 0);
        assert_eq!(parse(&b, both()).unwrap().0, h2c);
        b[1] |= flags::DATA_SUCCESS;
        let c = crc32c::crc32c(&b[..24]);
        put32(&mut b, 24, c);
        assert_eq!(parse(&b, both()), Err(invalid(1)));
        let r2t = Header::R2t {
            cccid: 7,
            ttag: 3,
            offset: 0,
            length: 1 << 20,
        };
        let b = r2t.to_pdu(Digests::default(), &[], 0);
        assert_eq!(b.len(), 24);
        assert_eq!(parse(&b, Digests::default()).unwrap().0, r2t);
        // Data after a header that takes none.
        let mut long = b.clone();
        long.extend_from_slice(&[0; 4]);
        put32(&mut long, 4, 28);
        assert_eq!(parse(&long, Digests::default()), Err(invalid(4)));
    }

    #[test]
    fn termination_requests_and_stream_lengths() {
        let offending = [0x04u8, 0, 72, 0, 8, 0, 0, 0];
        let t = Header::TermReq {
            c2h: true,
            fes: fes::INVALID_PDU_HEADER,
            fei: 2,
        };
        let b = t.to_pdu(both(), &offending, 0);
        assert_eq!(b.len(), 32);
        assert_eq!((b[1], b[3]), (0, 0), "no digests, no PDO");
        assert_eq!(parse(&b, both()).unwrap(), (t, &offending[..]));
        let ch = |ty: u8, hlen: u8, plen: u32| CommonHeader {
            ty,
            flags: 0,
            hlen,
            pdo: 0,
            plen,
        };
        assert_eq!(pdu_len(&ch(pdu_type::IC_REQ, 128, 128), 0), Ok(128));
        assert_eq!(pdu_len(&ch(pdu_type::IC_REQ, 128, 129), 0), Err(invalid(4)));
        assert_eq!(pdu_len(&ch(pdu_type::IC_REQ, 24, 128), 0), Err(invalid(2)));
        assert_eq!(pdu_len(&ch(0x08, 24, 24), 0), Err(invalid(0)));
        assert_eq!(
            pdu_len(&ch(pdu_type::CAPSULE_CMD, 72, 72 + 8192), 8192),
            Ok(72 + 8192)
        );
        assert_eq!(
            pdu_len(&ch(pdu_type::CAPSULE_CMD, 72, 1 << 30), 8192),
            Err(invalid(4))
        );
        assert_eq!(
            pdu_len(&ch(pdu_type::CAPSULE_RESP, 24, 8), 0),
            Err(invalid(4))
        );
        assert_eq!(parse(&[0u8; 7], Digests::default()), Err(invalid(0)));
    }
}
