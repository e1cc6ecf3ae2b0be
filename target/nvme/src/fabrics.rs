//! Fabrics commands (NVMe over Fabrics 1.1, section 3): Connect with its 1024-byte data,
//! Property Get, Property Set and Disconnect, all with opcode 0x7f and a FCTYPE in byte 4.

use crate::sqe::{Sqe, FABRICS_OPCODE};
use crate::{le16, put16};

/// FCTYPE values.
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const AUTH_SEND: u8 = 0x05;
    pub const AUTH_RECV: u8 = 0x06;
    pub const DISCONNECT: u8 = 0x08;
}

/// Command specific status codes of fabrics commands.
pub mod status {
    pub const INCOMPATIBLE_FORMAT: u8 = 0x80;
    pub const CONTROLLER_BUSY: u8 = 0x81;
    pub const CONNECT_INVALID_PARAMETERS: u8 = 0x82;
    pub const RESTART_DISCOVERY: u8 = 0x83;
    pub const CONNECT_INVALID_HOST: u8 = 0x84;
    pub const INVALID_QUEUE_TYPE: u8 = 0x85;
}

/// Length of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;
/// Longest NVMe Qualified Name, in bytes (its field holds 256 with the terminating NUL).
pub const NQN_MAX: usize = 223;

/// A fabrics command, from its submission entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricsCmd {
    Connect {
        /// Record format: 0.
        recfmt: u16,
        /// 0: the admin queue.
        qid: u16,
        /// Submission queue size, zero based.
        sqsize: u16,
        /// Connect attributes (bit 2: I/O queue deletion; bits 1:0: priority).
        cattr: u8,
        /// Keep alive timeout in milliseconds (admin queue only; 0: none).
        kato: u32,
    },
    /// `eight`: an 8-byte property (ATTRIB bits 2:0 = 1), else 4 bytes.
    PropertyGet {
        eight: bool,
        offset: u32,
    },
    PropertySet {
        eight: bool,
        offset: u32,
        value: u64,
    },
    Disconnect {
        recfmt: u16,
    },
    /// An FCTYPE not listed here (authentication among them).
    Other(u8),
}

impl FabricsCmd {
    /// The fabrics command in `sqe`; `None` when it is not one (another opcode).
    pub fn parse(sqe: &Sqe) -> Option<FabricsCmd> {
        if sqe.opcode != FABRICS_OPCODE {
            return None;
        }
        let [c10, c11, c12, c13, ..] = sqe.cdw;
        Some(match sqe.fctype() {
            fctype::CONNECT => FabricsCmd::Connect {
                recfmt: c10 as u16,
                qid: (c10 >> 16) as u16,
                sqsize: c11 as u16,
                cattr: (c11 >> 16) as u8,
                kato: c12,
            },
            fctype::PROPERTY_GET => FabricsCmd::PropertyGet {
                eight: c10 & 0x7 == 1,
                offset: c11,
            },
            fctype::PROPERTY_SET => FabricsCmd::PropertySet {
                eight: c10 & 0x7 == 1,
                offset: c11,
                value: u64::from(c12) | u64::from(c13) << 32,
            },
            fctype::DISCONNECT => FabricsCmd::Disconnect { recfmt: c10 as u16 },
            other => FabricsCmd::Other(other),
        })
    }

    /// The submission entry for it (command ID `cid`, data pointer `dptr`).
    pub fn to_sqe(&self, cid: u16, dptr: [u8; 16]) -> Sqe {
        let mut cdw = [0u32; 6];
        let ty = match *self {
            FabricsCmd::Connect {
                recfmt,
                qid,
                sqsize,
                cattr,
                kato,
            } => {
                cdw[0] = u32::from(recfmt) | u32::from(qid) << 16;
                cdw[1] = u32::from(sqsize) | u32::from(cattr) << 16;
                cdw[2] = kato;
                fctype::CONNECT
            }
            FabricsCmd::PropertyGet { eight, offset } => {
                cdw[0] = u32::from(eight);
                cdw[1] = offset;
                fctype::PROPERTY_GET
            }
            FabricsCmd::PropertySet {
                eight,
                offset,
                value,
            } => {
                cdw[0] = u32::from(eight);
                cdw[1] = offset;
                cdw[2] = value as u32;
                cdw[3] = (value >> 32) as u32;
                fctype::PROPERTY_SET
            }
            FabricsCmd::Disconnect { recfmt } => {
                cdw[0] = u32::from(recfmt);
                fctype::DISCONNECT
            }
            FabricsCmd::Other(t) => t,
        };
        Sqe {
            opcode: FABRICS_OPCODE,
            flags: crate::sqe::PSDT_SGL,
            cid,
            nsid: u32::from(ty),
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            dptr,
            cdw,
        }
    }
}

/// The data of a Connect command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    pub host_id: [u8; 16],
    /// 0xffff on the admin queue (dynamic controller); the controller's ID on an I/O queue.
    pub cntlid: u16,
    pub subsys_nqn: String,
    pub host_nqn: String,
}

/// Why Connect data cannot be used: the byte offset of the bad field (for the Invalid
/// Parameters status's IATTR/IPO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadField(pub u16);

impl ConnectData {
    const SUBNQN: usize = 256;
    const HOSTNQN: usize = 512;

    pub fn parse(b: &[u8]) -> Result<ConnectData, BadField> {
        if b.len() < CONNECT_DATA_LEN {
            return Err(BadField(b.len().min(usize::from(u16::MAX)) as u16));
        }
        let mut host_id = [0u8; 16];
        host_id.copy_from_slice(&b[..16]);
        Ok(ConnectData {
            host_id,
            cntlid: le16(b, 16),
            subsys_nqn: nqn(b, Self::SUBNQN)?,
            host_nqn: nqn(b, Self::HOSTNQN)?,
        })
    }

    /// The 1024 bytes; names longer than [`NQN_MAX`] are cut.
    pub fn to_bytes(&self) -> [u8; CONNECT_DATA_LEN] {
        let mut b = [0u8; CONNECT_DATA_LEN];
        b[..16].copy_from_slice(&self.host_id);
        put16(&mut b, 16, self.cntlid);
        for (at, s) in [
            (Self::SUBNQN, &self.subsys_nqn),
            (Self::HOSTNQN, &self.host_nqn),
        ] {
            let s = &s.as_bytes()[..s.len().min(NQN_MAX)];
            b[at..at + s.len()].copy_from_slice(s);
        }
        b
    }
}

/// The NUL-terminated printable ASCII name in the 256-byte field at `at`.
fn nqn(b: &[u8], at: usize) -> Result<String, BadField> {
    let field = &b[at..at + 256];
    let len = field
        .iter()
        .position(|&c| c == 0)
        .filter(|&n| n > 0 && n <= NQN_MAX)
        .ok_or(BadField(at as u16))?;
    let name = &field[..len];
    if !name.iter().all(|c| c.is_ascii_graphic()) {
        return Err(BadField(at as u16));
    }
    Ok(String::from_utf8_lossy(name).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqe::Sgl;

    #[test]
    fn fabrics_commands_round_trip() {
        let dptr = Sgl::DataBlock {
            addr: 0,
            len: 1024,
            offset: true,
        }
        .to_bytes();
        for cmd in [
            FabricsCmd::Connect {
                recfmt: 0,
                qid: 3,
                sqsize: 127,
                cattr: 0,
                kato: 0,
            },
            FabricsCmd::Connect {
                recfmt: 0,
                qid: 0,
                sqsize: 31,
                cattr: 4,
                kato: 5000,
            },
            FabricsCmd::PropertyGet {
                eight: true,
                offset: 0,
            },
            FabricsCmd::PropertySet {
                eight: false,
                offset: 0x14,
                value: 0x0046_0001,
            },
            FabricsCmd::Disconnect { recfmt: 0 },
            FabricsCmd::Other(fctype::AUTH_SEND),
        ] {
            let sqe = cmd.to_sqe(9, dptr);
            let b = sqe.to_bytes();
            assert_eq!(b[0], 0x7f);
            let back = Sqe::parse(&b).unwrap();
            assert_eq!(FabricsCmd::parse(&back), Some(cmd), "{cmd:?}");
        }
        // Connect's fields where Linux puts them: qid at byte 42, sqsize 44, kato 48.
        let b = FabricsCmd::Connect {
            recfmt: 0,
            qid: 2,
            sqsize: 0x7f,
            cattr: 0,
            kato: 15000,
        }
        .to_sqe(1, dptr)
        .to_bytes();
        assert_eq!((b[4], b[42], b[44]), (fctype::CONNECT, 2, 0x7f));
        assert_eq!(&b[48..52], &15000u32.to_le_bytes());
        let mut other = Sqe::parse(&b).unwrap();
        other.opcode = 0x02;
        assert_eq!(FabricsCmd::parse(&other), None);
    }

    #[test]
    fn connect_data_names_are_checked() {
        let d = ConnectData {
            host_id: [7; 16],
            cntlid: 0xffff,
            subsys_nqn: "nqn.2014-08.org.nvmexpress.discovery".into(),
            host_nqn: "nqn.2014-08.org.nvmexpress:uuid:0c2b3ad4-5e5f-4f5c-9d1b-3c6a6f6f0e01".into(),
        };
        let b = d.to_bytes();
        assert_eq!(ConnectData::parse(&b), Ok(d));
        assert_eq!(ConnectData::parse(&b[..1023]), Err(BadField(1023)));
        let mut empty = b;
        empty[256] = 0;
        assert_eq!(ConnectData::parse(&empty), Err(BadField(256)));
        let mut unterminated = b;
        unterminated[512..768].fill(b'a');
        assert_eq!(ConnectData::parse(&unterminated), Err(BadField(512)));
        let mut control = b;
        control[515] = b'\n';
        assert_eq!(ConnectData::parse(&control), Err(BadField(512)));
    }
}
