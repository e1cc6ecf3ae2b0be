//! A minimal pcap reader for the capture tests: the classic format (microsecond or nanosecond
//! timestamps, either byte order) with Ethernet or Linux cooked (SLL) link layers.

#![allow(dead_code)]

use std::path::PathBuf;

/// Link types this reader understands (tcpdump LINKTYPE_*).
pub const LINKTYPE_ETHERNET: u32 = 1;
pub const LINKTYPE_LINUX_SLL: u32 = 113;

pub struct Record<'a> {
    pub number: usize,
    pub data: &'a [u8],
}

pub struct Pcap {
    pub link_type: u32,
    bytes: Vec<u8>,
    big_endian: bool,
}

impl Pcap {
    pub fn parse(bytes: Vec<u8>) -> Pcap {
        assert!(bytes.len() >= 24, "pcap shorter than its global header");
        let magic = u32::from_le_bytes(bytes[0..4].try_into().unwrap());
        let big_endian = match magic {
            0xa1b2_c3d4 | 0xa1b2_3c4d => false,
            0xd4c3_b2a1 | 0x4d3c_b2a1 => true,
            other => panic!("not a classic pcap file (magic {other:#x})"),
        };
        let mut p = Pcap {
            link_type: 0,
            bytes,
            big_endian,
        };
        p.link_type = p.u32_at(20) & 0x0FFF_FFFF;
        p
    }

    fn u32_at(&self, at: usize) -> u32 {
        let b: [u8; 4] = self.bytes[at..at + 4].try_into().unwrap();
        if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }

    /// Every record, numbered from 1 like Wireshark's frame numbers.
    pub fn records(&self) -> Vec<Record<'_>> {
        let mut out = Vec::new();
        let mut at = 24;
        while at + 16 <= self.bytes.len() {
            let incl = self.u32_at(at + 8) as usize;
            let start = at + 16;
            assert!(start + incl <= self.bytes.len(), "truncated record");
            out.push(Record {
                number: out.len() + 1,
                data: &self.bytes[start..start + incl],
            });
            at = start + incl;
        }
        out
    }

    /// The network-layer bytes of a record and their EtherType.
    pub fn network_layer<'a>(&self, frame: &'a [u8]) -> Option<(u16, &'a [u8])> {
        let (type_at, start) = match self.link_type {
            LINKTYPE_ETHERNET => (12, 14),
            LINKTYPE_LINUX_SLL => (14, 16),
            other => panic!("unsupported link type {other}"),
        };
        if frame.len() < start {
            return None;
        }
        let ethertype = u16::from_be_bytes([frame[type_at], frame[type_at + 1]]);
        Some((ethertype, &frame[start..]))
    }
}

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn load_capture() -> Pcap {
    Pcap::parse(std::fs::read(fixture("lio-iser-srp.pcap")).expect("capture fixture"))
}

/// A tab-separated tshark export: header line of field names, one row per frame.
pub struct Tsv {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Tsv {
    pub fn load(name: &str) -> Tsv {
        let text = std::fs::read_to_string(fixture(name)).expect("tsv fixture");
        let mut lines = text.lines();
        let columns = lines
            .next()
            .expect("header")
            .split('\t')
            .map(str::to_owned)
            .collect();
        let rows = lines
            .map(|l| l.split('\t').map(str::to_owned).collect())
            .collect();
        Tsv { columns, rows }
    }

    /// The numeric value of a column in a row (decimal or 0x-hex), `None` when empty.
    pub fn num(&self, row: &[String], column: &str) -> Option<u64> {
        let i = self
            .columns
            .iter()
            .position(|c| c == column)
            .unwrap_or_else(|| panic!("no column {column}"));
        let v = row.get(i).map(String::as_str).unwrap_or("");
        if v.is_empty() {
            None
        } else if let Some(hex) = v.strip_prefix("0x") {
            Some(u64::from_str_radix(hex, 16).unwrap())
        } else {
            Some(v.parse().unwrap_or_else(|_| panic!("{column}: {v}")))
        }
    }

    pub fn text<'a>(&self, row: &'a [String], column: &str) -> &'a str {
        let i = self.columns.iter().position(|c| c == column).unwrap();
        row.get(i).map(String::as_str).unwrap_or("")
    }

    pub fn frame(&self, number: usize) -> Option<&Vec<String>> {
        self.rows
            .iter()
            .find(|r| self.num(r, "frame.number") == Some(number as u64))
    }
}
