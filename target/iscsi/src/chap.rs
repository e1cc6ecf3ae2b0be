//! CHAP authentication (RFC 7143 §12.1.3, RFC 1994) with MD5 (CHAP_A=5), one-way and
//! mutual, and the binary value encodings of RFC 7143 §6.1 (`0x` hex, `0b` base64).

use md5::{Digest, Md5};
use rand::RngCore;

use super::WireError;

/// CHAP_A value for MD5 (RFC 1994).
pub const ALGORITHM_MD5: &str = "5";
/// Challenge length we send; RFC 7143 §12.1.3 wants it at least as long as the digest.
pub const CHALLENGE_LEN: usize = 16;
/// Longest challenge we accept from a peer.
pub const MAX_CHALLENGE_LEN: usize = 1024;

/// `CHAP_R = MD5(CHAP_I || secret || CHAP_C)` (RFC 1994 §4.1).
pub fn response(id: u8, secret: &[u8], challenge: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update([id]);
    h.update(secret);
    h.update(challenge);
    h.finalize().into()
}

/// Encodes binary as `0x` followed by lower-case hex.
pub fn encode_hex(data: &[u8]) -> String {
    let mut s = String::with_capacity(2 + 2 * data.len());
    s.push_str("0x");
    for b in data {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn b64_val(c: u8) -> Option<u8> {
    match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// Decodes a binary value: `0x`/`0X` hex (an odd digit count means a leading zero nibble)
/// or `0b`/`0B` base64 (RFC 7143 §6.1).
pub fn decode_binary(v: &str) -> Result<Vec<u8>, WireError> {
    // Match the prefix on bytes: the value may start with a multi-byte character.
    let prefix = v.as_bytes().get(..2).ok_or(WireError)?;
    let body = if matches!(prefix, b"0x" | b"0X" | b"0b" | b"0B") {
        &v[2..]
    } else {
        return Err(WireError);
    };
    match prefix {
        b"0x" | b"0X" => {
            let digits: Vec<u8> = body
                .bytes()
                .map(hex_val)
                .collect::<Option<_>>()
                .ok_or(WireError)?;
            if digits.is_empty() {
                return Err(WireError);
            }
            let mut out = Vec::with_capacity(digits.len().div_ceil(2));
            let mut it = digits.iter();
            if digits.len() % 2 == 1 {
                out.push(*it.next().ok_or(WireError)?);
            }
            while let (Some(h), Some(l)) = (it.next(), it.next()) {
                out.push(h << 4 | l);
            }
            Ok(out)
        }
        _ => {
            let body = body.trim_end_matches('=');
            if body.is_empty() {
                return Err(WireError);
            }
            let vals: Vec<u8> = body
                .bytes()
                .map(b64_val)
                .collect::<Option<_>>()
                .ok_or(WireError)?;
            if vals.len() % 4 == 1 {
                return Err(WireError);
            }
            let mut out = Vec::with_capacity(vals.len() * 3 / 4);
            for chunk in vals.chunks(4) {
                let mut acc = 0u32;
                for (i, v) in chunk.iter().enumerate() {
                    acc |= (*v as u32) << (18 - 6 * i);
                }
                let bytes = acc.to_be_bytes();
                out.extend_from_slice(&bytes[1..chunk.len()]);
            }
            Ok(out)
        }
    }
}

/// Parses CHAP_I: a number 0..=255, decimal or hex.
pub fn parse_id(v: &str) -> Result<u8, WireError> {
    super::params::parse_number(v)
        .and_then(|n| u8::try_from(n).ok())
        .ok_or(WireError)
}

/// A fresh identifier and challenge.
pub fn new_challenge() -> (u8, Vec<u8>) {
    let mut rng = rand::rng();
    let mut c = vec![0u8; CHALLENGE_LEN];
    rng.fill_bytes(&mut c);
    let mut id = [0u8; 1];
    rng.fill_bytes(&mut id);
    (id[0], c)
}

/// Constant-time comparison of two responses.
pub fn verify(expected: &[u8], got: &[u8]) -> bool {
    expected.len() == got.len() && expected.iter().zip(got).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0
}

/// Why CHAP failed; every case ends the login with status 0x0201.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChapError {
    /// No algorithm we support was offered.
    Algorithm,
    /// A CHAP key is missing or malformed.
    Malformed,
    /// Unknown user name.
    User,
    /// Response does not match.
    Response,
    /// The initiator asked for mutual CHAP but none is configured.
    NoMutual,
    /// The initiator reflected our own challenge (RFC 7143 §12.1.3).
    Reflected,
}

/// The target's side of a CHAP exchange.
#[derive(Debug, Clone)]
pub struct TargetChap {
    id: u8,
    challenge: Vec<u8>,
}

impl TargetChap {
    /// Answers CHAP_A: picks MD5 and issues a challenge. Returns the keys to send.
    pub fn start(chap_a: &str) -> Result<(TargetChap, Vec<(String, String)>), ChapError> {
        if !chap_a.split(',').any(|a| a == ALGORITHM_MD5) {
            return Err(ChapError::Algorithm);
        }
        let (id, challenge) = new_challenge();
        let keys = vec![
            ("CHAP_A".to_string(), ALGORITHM_MD5.to_string()),
            ("CHAP_I".to_string(), id.to_string()),
            ("CHAP_C".to_string(), encode_hex(&challenge)),
        ];
        Ok((TargetChap { id, challenge }, keys))
    }

    #[cfg(test)]
    pub fn with_challenge(id: u8, challenge: Vec<u8>) -> TargetChap {
        TargetChap { id, challenge }
    }

    /// Checks CHAP_N/CHAP_R against `expected` and, when the initiator sent CHAP_I/CHAP_C,
    /// answers with the target's credentials (`mutual`). Returns the keys to send.
    pub fn finish(
        &self,
        name: Option<&str>,
        resp: Option<&str>,
        peer_id: Option<&str>,
        peer_challenge: Option<&str>,
        expected: &rtgt_scsi::core::ChapCredentials,
        mutual: Option<&rtgt_scsi::core::ChapCredentials>,
    ) -> Result<Vec<(String, String)>, ChapError> {
        let (Some(name), Some(resp)) = (name, resp) else {
            return Err(ChapError::Malformed);
        };
        let got = decode_binary(resp).map_err(|_| ChapError::Malformed)?;
        if name != expected.user {
            return Err(ChapError::User);
        }
        let want = response(self.id, expected.secret.as_bytes(), &self.challenge);
        if !verify(&want, &got) {
            return Err(ChapError::Response);
        }
        match (peer_id, peer_challenge) {
            (None, None) => Ok(Vec::new()),
            (Some(i), Some(c)) => {
                let id = parse_id(i).map_err(|_| ChapError::Malformed)?;
                let challenge = decode_binary(c).map_err(|_| ChapError::Malformed)?;
                if challenge.is_empty() || challenge.len() > MAX_CHALLENGE_LEN {
                    return Err(ChapError::Malformed);
                }
                if challenge == self.challenge {
                    return Err(ChapError::Reflected);
                }
                let m = mutual.ok_or(ChapError::NoMutual)?;
                let r = response(id, m.secret.as_bytes(), &challenge);
                Ok(vec![
                    ("CHAP_N".to_string(), m.user.clone()),
                    ("CHAP_R".to_string(), encode_hex(&r)),
                ])
            }
            _ => Err(ChapError::Malformed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtgt_scsi::core::ChapCredentials;

    #[test]
    fn md5_vectors() {
        // RFC 1321 test suite: MD5("abc").
        let mut h = Md5::new();
        h.update(b"abc");
        let d: [u8; 16] = h.finalize().into();
        assert_eq!(encode_hex(&d), "0x900150983cd24fb0d6963f7d28e17f72");
        // CHAP: id 0x01, secret "abc" split across fields gives the same digest.
        assert_eq!(response(b'a', b"b", b"c"), d);
    }

    #[test]
    fn decode_encodings() {
        assert_eq!(decode_binary("0x0102ff").unwrap(), vec![1, 2, 0xff]);
        assert_eq!(decode_binary("0XABcd").unwrap(), vec![0xab, 0xcd]);
        assert_eq!(decode_binary("0x102").unwrap(), vec![0x01, 0x02]);
        assert_eq!(decode_binary("0bAQL/").unwrap(), vec![1, 2, 0xff]);
        assert_eq!(decode_binary("0BAQI=").unwrap(), vec![1, 2]);
        assert_eq!(decode_binary("0bAQ==").unwrap(), vec![1]);
        assert_eq!(decode_binary("0bkAFQmDzST7DWlj99KOF/cg==").unwrap(), {
            let mut h = Md5::new();
            h.update(b"abc");
            let d: [u8; 16] = h.finalize().into();
            d.to_vec()
        });
        for bad in [
            "",
            "0x",
            "0b",
            "12",
            "0xzz",
            "0b@@@@",
            "0bA",
            "x0ab",
            "e\u{48a}",
            "0x\u{48a}",
        ] {
            assert!(decode_binary(bad).is_err(), "{bad}");
        }
        assert_eq!(
            decode_binary(&encode_hex(&[9, 8, 7])).unwrap(),
            vec![9, 8, 7]
        );
    }

    #[test]
    fn ids() {
        assert_eq!(parse_id("200").unwrap(), 200);
        assert_eq!(parse_id("0xff").unwrap(), 255);
        assert!(parse_id("256").is_err());
        assert!(parse_id("x").is_err());
    }

    fn creds(u: &str, s: &str) -> ChapCredentials {
        ChapCredentials {
            user: u.into(),
            secret: s.into(),
        }
    }

    #[test]
    fn one_way_and_mutual() {
        let c = vec![7u8; 16];
        let t = TargetChap::with_challenge(3, c.clone());
        let good = encode_hex(&response(3, b"secret12", &c));
        let exp = creds("alice", "secret12");
        assert_eq!(
            t.finish(Some("alice"), Some(&good), None, None, &exp, None)
                .unwrap(),
            vec![]
        );
        assert_eq!(
            t.finish(Some("alice"), Some("0x00"), None, None, &exp, None),
            Err(ChapError::Response)
        );
        assert_eq!(
            t.finish(Some("bob"), Some(&good), None, None, &exp, None),
            Err(ChapError::User)
        );
        assert_eq!(
            t.finish(None, Some(&good), None, None, &exp, None),
            Err(ChapError::Malformed)
        );
        // Mutual.
        let m = creds("target", "tsecret99");
        let ic = vec![1u8, 2, 3, 4];
        let out = t
            .finish(
                Some("alice"),
                Some(&good),
                Some("9"),
                Some("0x01020304"),
                &exp,
                Some(&m),
            )
            .unwrap();
        assert_eq!(out[0], ("CHAP_N".into(), "target".into()));
        assert_eq!(out[1].1, encode_hex(&response(9, b"tsecret99", &ic)));
        assert_eq!(
            t.finish(
                Some("alice"),
                Some(&good),
                Some("9"),
                Some("0x01020304"),
                &exp,
                None
            ),
            Err(ChapError::NoMutual)
        );
        // Reflection of our own challenge.
        assert_eq!(
            t.finish(
                Some("alice"),
                Some(&good),
                Some("9"),
                Some(&encode_hex(&c)),
                &exp,
                Some(&m)
            ),
            Err(ChapError::Reflected)
        );
        // Half of the mutual keys.
        assert_eq!(
            t.finish(Some("alice"), Some(&good), Some("9"), None, &exp, Some(&m)),
            Err(ChapError::Malformed)
        );
    }

    #[test]
    fn algorithm() {
        assert!(TargetChap::start("5").is_ok());
        assert!(TargetChap::start("7,5").is_ok());
        assert_eq!(TargetChap::start("7").unwrap_err(), ChapError::Algorithm);
        let (_, keys) = TargetChap::start("5").unwrap();
        assert_eq!(keys[0].1, "5");
        assert_eq!(decode_binary(&keys[2].1).unwrap().len(), CHALLENGE_LEN);
    }

    #[test]
    fn verify_ct() {
        assert!(verify(&[1, 2], &[1, 2]));
        assert!(!verify(&[1, 2], &[1, 3]));
        assert!(!verify(&[1, 2], &[1]));
    }
}
