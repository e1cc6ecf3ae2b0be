//! iSER wire formats (RFC 7145 §9; Linux `include/scsi/iser.h`; docs/WIRE.md §6).
//!
//! * [`Packet`] / [`Repr`]: the 28-byte iSER header in front of every iSCSI control PDU
//!   (`struct iser_ctrl`), and the iSER Hello / HelloReply messages, which share its first
//!   bytes:
//!
//! ```text
//! 0 flags: opcode in the high nibble (1 control, 2 Hello, 3 HelloReply), WSV 0x08, RSV 0x04
//! 1-3 reserved | 4-7 Write STag | 8-15 Write VA | 16-19 Read STag | 20-27 Read VA
//! Hello:      2 MaxVer/MinVer (nibbles) | 4-5 iSER-IRD
//! HelloReply: 0 low bit: reject flag | 2 MaxVer/CurVer (nibbles) | 4-5 iSER-ORD
//! ```
//!
//! * [`CmHeader`]: the 4 bytes of private data in the CM REQ and REP (`struct iser_cm_hdr`).
//!
//! After `check_len` succeeds no accessor of [`Packet`] panics; untrusted bytes go through
//! [`Packet::new_checked`].

use core::fmt;
use core::ops::Range;

/// Length of the iSER header (`sizeof(struct iser_ctrl)`).
pub const HEADER_LEN: usize = 28;
/// iSER header plus the iSCSI BHS: what precedes the data segment in every SEND.
pub const HEADERS_LEN: usize = HEADER_LEN + crate::pdu::BHS_LEN;
/// The only iSER protocol version (RFC 7145 §9.3).
pub const ISER_VERSION: u8 = 1;

/// A field that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("malformed iSER header")
    }
}

impl std::error::Error for Error {}

pub type Result<T> = core::result::Result<T, Error>;

mod field {
    use core::ops::Range;

    pub const FLAGS: usize = 0;
    pub const VERSIONS: usize = 2;
    pub const WRITE_STAG: Range<usize> = 4..8;
    pub const WRITE_VA: Range<usize> = 8..16;
    pub const READ_STAG: Range<usize> = 16..20;
    pub const READ_VA: Range<usize> = 20..28;
    /// iSER-IRD of a Hello, iSER-ORD of a HelloReply.
    pub const HELLO_DEPTH: Range<usize> = 4..6;
}

/// iSER opcodes (the high nibble of the first byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// An iSCSI control-type PDU follows.
    Control,
    Hello,
    HelloReply,
    Unknown(u8),
}

impl Opcode {
    pub fn from_nibble(n: u8) -> Opcode {
        match n & 0x0f {
            0x1 => Opcode::Control,
            0x2 => Opcode::Hello,
            0x3 => Opcode::HelloReply,
            other => Opcode::Unknown(other),
        }
    }

    pub fn nibble(self) -> u8 {
        match self {
            Opcode::Control => 0x1,
            Opcode::Hello => 0x2,
            Opcode::HelloReply => 0x3,
            Opcode::Unknown(n) => n & 0x0f,
        }
    }
}

/// Write STag valid: the initiator wants solicited data read from Write STag/VA.
pub const FLAG_WSV: u8 = 0x08;
/// Read STag valid: read data goes to Read STag/VA.
pub const FLAG_RSV: u8 = 0x04;
/// The reject flag of a HelloReply.
pub const FLAG_REJECT: u8 = 0x01;

fn be_u32(b: &[u8], r: Range<usize>) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[r]);
    u32::from_be_bytes(a)
}

fn be_u64(b: &[u8], r: Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[r]);
    u64::from_be_bytes(a)
}

/// A read/write view of an iSER header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    pub fn opcode(&self) -> Opcode {
        Opcode::from_nibble(self.flags() >> 4)
    }

    pub fn wsv(&self) -> bool {
        self.flags() & FLAG_WSV != 0
    }

    pub fn rsv(&self) -> bool {
        self.flags() & FLAG_RSV != 0
    }

    pub fn write_stag(&self) -> u32 {
        be_u32(self.buffer.as_ref(), field::WRITE_STAG)
    }

    pub fn write_va(&self) -> u64 {
        be_u64(self.buffer.as_ref(), field::WRITE_VA)
    }

    pub fn read_stag(&self) -> u32 {
        be_u32(self.buffer.as_ref(), field::READ_STAG)
    }

    pub fn read_va(&self) -> u64 {
        be_u64(self.buffer.as_ref(), field::READ_VA)
    }

    /// MaxVer (high nibble) and MinVer / CurVer (low nibble) of a Hello or HelloReply.
    pub fn versions(&self) -> (u8, u8) {
        let v = self.buffer.as_ref()[field::VERSIONS];
        (v >> 4, v & 0x0f)
    }

    /// iSER-IRD of a Hello, iSER-ORD of a HelloReply.
    pub fn hello_depth(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::HELLO_DEPTH];
        u16::from_be_bytes([b[0], b[1]])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[field::FLAGS] = v
    }

    pub fn clear_reserved(&mut self) {
        self.buffer.as_mut()[1..4].fill(0)
    }

    pub fn set_write_stag(&mut self, v: u32) {
        self.buffer.as_mut()[field::WRITE_STAG].copy_from_slice(&v.to_be_bytes())
    }

    pub fn set_write_va(&mut self, v: u64) {
        self.buffer.as_mut()[field::WRITE_VA].copy_from_slice(&v.to_be_bytes())
    }

    pub fn set_read_stag(&mut self, v: u32) {
        self.buffer.as_mut()[field::READ_STAG].copy_from_slice(&v.to_be_bytes())
    }

    pub fn set_read_va(&mut self, v: u64) {
        self.buffer.as_mut()[field::READ_VA].copy_from_slice(&v.to_be_bytes())
    }

    pub fn set_versions(&mut self, max: u8, other: u8) {
        self.buffer.as_mut()[field::VERSIONS] = (max << 4) | (other & 0x0f)
    }

    pub fn set_hello_depth(&mut self, v: u16) {
        self.buffer.as_mut()[field::HELLO_DEPTH].copy_from_slice(&v.to_be_bytes())
    }
}

/// A remote buffer the initiator advertised: STag (R_Key) and virtual address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stag {
    pub stag: u32,
    pub va: u64,
}

/// The decoded iSER header or Hello message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Repr {
    /// An iSCSI control PDU follows; `write` / `read` are present when WSV / RSV are set.
    Control {
        write: Option<Stag>,
        read: Option<Stag>,
    },
    /// iSER Hello (RFC 7145 §9.3): the initiator's versions and iSER-IRD.
    Hello { max_ver: u8, min_ver: u8, ird: u16 },
    /// iSER HelloReply (§9.4).
    HelloReply {
        reject: bool,
        max_ver: u8,
        cur_ver: u8,
        ord: u16,
    },
}

impl Repr {
    /// Parses a header; an unknown opcode and reserved flag bits of a control header are
    /// errors (RFC 7145 §9.2).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        let flags = p.flags();
        match p.opcode() {
            Opcode::Control => {
                if flags & 0x03 != 0 {
                    return Err(Error);
                }
                Ok(Repr::Control {
                    write: p.wsv().then(|| Stag {
                        stag: p.write_stag(),
                        va: p.write_va(),
                    }),
                    read: p.rsv().then(|| Stag {
                        stag: p.read_stag(),
                        va: p.read_va(),
                    }),
                })
            }
            Opcode::Hello => {
                let (max_ver, min_ver) = p.versions();
                Ok(Repr::Hello {
                    max_ver,
                    min_ver,
                    ird: p.hello_depth(),
                })
            }
            Opcode::HelloReply => {
                let (max_ver, cur_ver) = p.versions();
                Ok(Repr::HelloReply {
                    reject: flags & FLAG_REJECT != 0,
                    max_ver,
                    cur_ver,
                    ord: p.hello_depth(),
                })
            }
            Opcode::Unknown(_) => Err(Error),
        }
    }

    /// A plain control header (no STags), as the target puts in front of its PDUs.
    pub const fn control() -> Repr {
        Repr::Control {
            write: None,
            read: None,
        }
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the whole header, reserved bytes zeroed.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.buffer.as_mut()[..HEADER_LEN].fill(0);
        match *self {
            Repr::Control { write, read } => {
                let mut flags = Opcode::Control.nibble() << 4;
                if let Some(w) = write {
                    flags |= FLAG_WSV;
                    p.set_write_stag(w.stag);
                    p.set_write_va(w.va);
                }
                if let Some(r) = read {
                    flags |= FLAG_RSV;
                    p.set_read_stag(r.stag);
                    p.set_read_va(r.va);
                }
                p.set_flags(flags);
            }
            Repr::Hello {
                max_ver,
                min_ver,
                ird,
            } => {
                p.set_flags(Opcode::Hello.nibble() << 4);
                p.set_versions(max_ver, min_ver);
                p.set_hello_depth(ird);
            }
            Repr::HelloReply {
                reject,
                max_ver,
                cur_ver,
                ord,
            } => {
                let r = if reject { FLAG_REJECT } else { 0 };
                p.set_flags((Opcode::HelloReply.nibble() << 4) | r);
                p.set_versions(max_ver, cur_ver);
                p.set_hello_depth(ord);
            }
        }
    }

    /// The header as bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.emit(&mut Packet::new_unchecked(&mut b[..]));
        b
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Repr::Control { write, read } => {
                write!(f, "iSER control write={write:?} read={read:?}")
            }
            Repr::Hello {
                max_ver,
                min_ver,
                ird,
            } => {
                write!(f, "iSER Hello ver={min_ver}..={max_ver} ird={ird}")
            }
            Repr::HelloReply {
                reject,
                max_ver,
                cur_ver,
                ord,
            } => write!(
                f,
                "iSER HelloReply reject={reject} ver={cur_ver}/{max_ver} ord={ord}"
            ),
        }
    }
}

/// Length of the iSER CM private data (`struct iser_cm_hdr`).
pub const CM_HEADER_LEN: usize = 4;
/// The initiator does not support zero-based virtual addresses (ib_iser always sets it).
pub const CM_ZBVA_NOT_SUP: u8 = 0x80;
/// Send with invalidate is not to be used on this connection.
pub const CM_SEND_W_INV_NOT_SUP: u8 = 0x40;

/// The iSER CM header in REQ and REP private data (IBA Annex A12; docs/WIRE.md §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmHeader {
    pub zbva_not_supported: bool,
    pub send_w_inv_not_supported: bool,
}

impl CmHeader {
    /// Parses the consumer private data. An empty (or zero) region means both features are
    /// available, as Linux reads it. Unknown flag bits are ignored, as ib_isert does.
    pub fn parse(data: &[u8]) -> CmHeader {
        let flags = data.first().copied().unwrap_or(0);
        CmHeader {
            zbva_not_supported: flags & CM_ZBVA_NOT_SUP != 0,
            send_w_inv_not_supported: flags & CM_SEND_W_INV_NOT_SUP != 0,
        }
    }

    pub fn flags(&self) -> u8 {
        let mut f = 0;
        if self.zbva_not_supported {
            f |= CM_ZBVA_NOT_SUP;
        }
        if self.send_w_inv_not_supported {
            f |= CM_SEND_W_INV_NOT_SUP;
        }
        f
    }

    pub fn to_bytes(&self) -> [u8; CM_HEADER_LEN] {
        [self.flags(), 0, 0, 0]
    }

    /// The target's answer to an initiator's header (ib_isert `isert_rdma_accept`): no
    /// zero-based addressing, and send with invalidate unless the initiator ruled it out.
    pub fn answer(req: &CmHeader) -> CmHeader {
        CmHeader {
            zbva_not_supported: true,
            send_w_inv_not_supported: req.send_w_inv_not_supported,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A READ(10) command header as ib_iser sends it (RSV, read STag/VA).
    static READ_CMD: [u8; HEADER_LEN] = [
        0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x12, 0x34, 0x00, 0x00,
        0x7f, 0x00, 0x12, 0x34, 0x50, 0x00,
    ];

    #[test]
    fn parse() {
        let p = Packet::new_checked(&READ_CMD[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::Control);
        assert_eq!(
            Repr::parse(&p).unwrap(),
            Repr::Control {
                write: None,
                read: Some(Stag {
                    stag: 0x1234,
                    va: 0x7f00_1234_5000
                })
            }
        );
    }

    #[test]
    fn emit() {
        let r = Repr::Control {
            write: None,
            read: Some(Stag {
                stag: 0x1234,
                va: 0x7f00_1234_5000,
            }),
        };
        let mut buf = [0xa5u8; HEADER_LEN];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, READ_CMD);
        let w = Repr::Control {
            write: Some(Stag {
                stag: 7,
                va: 0x1000,
            }),
            read: None,
        };
        let b = w.to_bytes();
        assert_eq!(b[0], 0x18);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])).unwrap(), w);
        assert_eq!(Repr::control().to_bytes()[0], 0x10);
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&READ_CMD[..27]), Err(Error));
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&READ_CMD[..3])),
            Err(Error)
        );
    }

    #[test]
    fn bad_field() {
        let mut b = READ_CMD;
        b[0] = 0x40;
        assert_eq!(Packet::new_unchecked(&b[..]).opcode(), Opcode::Unknown(4));
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error));
        b[0] = 0x11;
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error));
    }

    #[test]
    fn hello_round_trip() {
        let h = Repr::Hello {
            max_ver: 1,
            min_ver: 1,
            ird: 16,
        };
        let b = h.to_bytes();
        assert_eq!(&b[..6], &[0x20, 0, 0x11, 0, 0, 16]);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])).unwrap(), h);
        let r = Repr::HelloReply {
            reject: true,
            max_ver: 1,
            cur_ver: 1,
            ord: 0,
        };
        let b = r.to_bytes();
        assert_eq!(b[0], 0x31);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])).unwrap(), r);
    }

    #[test]
    fn cm_header() {
        // ib_iser with remote invalidation ruled out, and the plain form.
        let h = CmHeader::parse(&[0xc0, 0, 0, 0]);
        assert!(h.zbva_not_supported && h.send_w_inv_not_supported);
        assert_eq!(CmHeader::answer(&h).to_bytes(), [0xc0, 0, 0, 0]);
        let h = CmHeader::parse(&[0x80, 0, 0, 0]);
        assert_eq!(CmHeader::answer(&h).to_bytes(), [0x80, 0, 0, 0]);
        // No private data reads as zeros: both features allowed.
        assert_eq!(CmHeader::parse(&[]), CmHeader::default());
    }
}
