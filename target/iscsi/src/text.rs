//! The text key=value format of Login and Text PDUs (RFC 7143 §6.1).
//!
//! Every pair is `key=value` followed by a NUL byte. Keys are at most 63 bytes of
//! `[A-Za-z0-9.\-+@_]`; values are UTF-8 of at most 8192 bytes (long binary values such as
//! CHAP challenges included).

use super::WireError;

/// Longest key name (RFC 7143 §6.1).
pub const MAX_KEY_LEN: usize = 63;
/// Longest value we accept; RFC 7143 §6.1 allows 255 for most keys and 8192 for some.
pub const MAX_VALUE_LEN: usize = 8192;

/// An ordered list of key=value pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextPairs(pub Vec<(String, String)>);

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= MAX_KEY_LEN
        && k.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b".-+@_".contains(&c))
}

impl TextPairs {
    pub fn new() -> TextPairs {
        TextPairs(Vec::new())
    }

    /// Parses a complete text segment. Trailing NUL padding is allowed; a final pair
    /// without its NUL is accepted (some initiators omit it), a pair without `=` is not.
    pub fn parse(data: &[u8]) -> Result<TextPairs, WireError> {
        let mut out = Vec::new();
        for item in data.split(|&b| b == 0) {
            if item.is_empty() {
                continue;
            }
            let eq = item.iter().position(|&b| b == b'=').ok_or(WireError)?;
            let key = std::str::from_utf8(&item[..eq]).map_err(|_| WireError)?;
            let value = std::str::from_utf8(&item[eq + 1..]).map_err(|_| WireError)?;
            if !valid_key(key) || value.len() > MAX_VALUE_LEN {
                return Err(WireError);
            }
            out.push((key.to_string(), value.to_string()));
        }
        Ok(TextPairs(out))
    }

    pub fn push(&mut self, key: &str, value: impl Into<String>) {
        self.0.push((key.to_string(), value.into()));
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn contains(&self, key: &str) -> bool {
        self.0.iter().any(|(k, _)| k == key)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The first key that occurs twice, if any (a protocol error in one negotiation, §6.2).
    pub fn duplicate(&self) -> Option<&str> {
        for (i, (k, _)) in self.0.iter().enumerate() {
            if self.0[..i].iter().any(|(k2, _)| k2 == k) {
                return Some(k);
            }
        }
        None
    }

    /// Encodes as `key=value\0...`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.0.iter().map(|(k, v)| k.len() + v.len() + 2).sum());
        for (k, v) in &self.0 {
            out.extend_from_slice(k.as_bytes());
            out.push(b'=');
            out.extend_from_slice(v.as_bytes());
            out.push(0);
        }
        out
    }
}

/// Collects a text segment spread over PDUs with the C bit (RFC 7143 §11.10.2, §11.12.3),
/// bounded so that a peer cannot make us buffer without limit.
#[derive(Debug, Default)]
pub struct TextAssembler {
    buf: Vec<u8>,
    limit: usize,
}

impl TextAssembler {
    pub fn new(limit: usize) -> TextAssembler {
        TextAssembler {
            buf: Vec::new(),
            limit,
        }
    }

    /// Appends one PDU's data; fails when the total would exceed the limit.
    pub fn push(&mut self, data: &[u8]) -> Result<(), WireError> {
        if self.buf.len() + data.len() > self.limit {
            return Err(WireError);
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Takes the whole text collected so far.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// Splits an outgoing text segment into PDU-sized pieces (continuation, §11.11.2): every
/// piece but the last is exactly `max` bytes.
#[derive(Debug, Default)]
pub struct TextSplitter {
    data: Vec<u8>,
    pos: usize,
}

impl TextSplitter {
    pub fn new(data: Vec<u8>) -> TextSplitter {
        TextSplitter { data, pos: 0 }
    }

    /// The next piece and whether more follow.
    pub fn next_piece(&mut self, max: usize) -> (Vec<u8>, bool) {
        let end = (self.pos + max.max(1)).min(self.data.len());
        let piece = self.data[self.pos..end].to_vec();
        self.pos = end;
        (piece, self.pos < self.data.len())
    }

    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse() {
        let t = TextPairs::parse(b"InitiatorName=iqn.x\0SessionType=Normal\0").unwrap();
        assert_eq!(t.get("InitiatorName"), Some("iqn.x"));
        assert_eq!(t.get("SessionType"), Some("Normal"));
        assert_eq!(t.0.len(), 2);
        // Empty value, trailing padding, missing final NUL.
        let t = TextPairs::parse(b"SendTargets=\0\0\0\0X-a=b").unwrap();
        assert_eq!(t.get("SendTargets"), Some(""));
        assert_eq!(t.get("X-a"), Some("b"));
        // A value may contain '='.
        let t = TextPairs::parse(b"X-k=a=b\0").unwrap();
        assert_eq!(t.get("X-k"), Some("a=b"));
    }

    #[test]
    fn emit() {
        let mut t = TextPairs::new();
        t.push("HeaderDigest", "None");
        t.push("MaxRecvDataSegmentLength", "8192");
        assert_eq!(
            t.encode(),
            b"HeaderDigest=None\0MaxRecvDataSegmentLength=8192\0".to_vec()
        );
        assert_eq!(TextPairs::parse(&t.encode()).unwrap(), t);
    }

    #[test]
    fn bad_field() {
        assert!(TextPairs::parse(b"NoEquals\0").is_err());
        assert!(TextPairs::parse(b"=value\0").is_err());
        assert!(TextPairs::parse(b"bad key=1\0").is_err());
        assert!(TextPairs::parse(b"K=\xff\xfe\0").is_err());
        let long_key = format!("{}=1", "k".repeat(64));
        assert!(TextPairs::parse(long_key.as_bytes()).is_err());
        let long_val = format!("k={}", "v".repeat(MAX_VALUE_LEN + 1));
        assert!(TextPairs::parse(long_val.as_bytes()).is_err());
    }

    #[test]
    fn duplicate() {
        let t = TextPairs::parse(b"A=1\0B=2\0A=3\0").unwrap();
        assert_eq!(t.duplicate(), Some("A"));
        assert_eq!(TextPairs::parse(b"A=1\0").unwrap().duplicate(), None);
    }

    #[test]
    fn assembler_limit() {
        let mut a = TextAssembler::new(10);
        a.push(b"Key=").unwrap();
        a.push(b"val\0").unwrap();
        assert!(a.push(b"xyz").is_err());
        assert_eq!(a.take(), b"Key=val\0".to_vec());
        assert!(a.is_empty());
    }

    #[test]
    fn splitter() {
        let mut s = TextSplitter::new(vec![1; 10]);
        assert_eq!(s.next_piece(4), (vec![1; 4], true));
        assert_eq!(s.next_piece(4), (vec![1; 4], true));
        assert_eq!(s.next_piece(4), (vec![1; 2], false));
        let mut e = TextSplitter::new(Vec::new());
        assert_eq!(e.next_piece(4), (vec![], false));
    }
}
