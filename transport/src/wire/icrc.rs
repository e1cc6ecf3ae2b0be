//! The RoCEv2 invariant CRC (IBA Annex A17.3.3), computed exactly as Linux rxe does
//! (`rxe_icrc.c`: `rxe_icrc_hdr`, `rxe_icrc_generate`, `rxe_icrc_check`; docs/WIRE.md §2).
//!
//! The CRC is plain CRC-32/IEEE (reflected polynomial 0xEDB88320, the kernel's `crc32_le`; not
//! CRC32C) over:
//!
//! 1. eight bytes of 0xFF standing for the masked LRH, which leaves the register at
//!    [`SEED`] = 0xDEBB20E3;
//! 2. the IP header, with a fixed size of 20 (IPv4, no options) or 40 (IPv6) bytes, and the
//!    UDP header, with the variant fields set to ones: IPv4 TOS, TTL and header checksum; IPv6
//!    traffic class, flow label and hop limit; the UDP checksum;
//! 3. the BTH with byte 4 (FECN, BECN, reserved) set to 0xFF;
//! 4. the extension headers, payload and pad unchanged.
//!
//! The result is inverted and stored as a raw `u32` in host order, i.e. little-endian on the
//! wire like an Ethernet FCS: this module returns the `u32` whose `to_le_bytes()` are the wire
//! bytes. The total length, identification, flags and addresses of the IP header are covered,
//! so the ICRC of a received packet can only be checked with the real IP header (a packet or
//! raw socket, not a UDP socket).
//!
//! The CRC runs on `crc32fast`, which folds with carry-less multiplication (PCLMULQDQ, ARMv8
//! PMULL) when the CPU has it and falls back to a slicing table otherwise.

use super::datagram::Datagram;
use super::{bth, ipv4, ipv6, roce, udp, Result};

/// The CRC register after the eight 0xFF bytes of the masked LRH.
pub const SEED: u32 = 0xDEBB_20E3;

/// Incremental ICRC: start with the headers, then feed the payload in as many pieces as it
/// comes in (for example straight out of memory-region pages).
#[derive(Clone)]
pub struct Icrc {
    hasher: crc32fast::Hasher,
}

impl Icrc {
    /// Starts the ICRC over an IP header (20-byte IPv4 or 40-byte IPv6, told apart by length),
    /// a UDP header and the start of the transport packet, which must begin with the BTH (the
    /// bytes after the BTH are fed as they are).
    ///
    /// # Panics
    ///
    /// If `ip_header` is neither 20 nor 40 bytes long, `udp_header` is not 8 bytes long or
    /// `transport` is shorter than a BTH. [`Datagram::split`] produces slices that fit.
    pub fn new(ip_header: &[u8], udp_header: &[u8], transport: &[u8]) -> Icrc {
        assert!(
            ip_header.len() == ipv4::HEADER_LEN || ip_header.len() == ipv6::HEADER_LEN,
            "ICRC: IP header must be 20 or 40 bytes"
        );
        assert_eq!(udp_header.len(), udp::HEADER_LEN, "ICRC: UDP header length");
        assert!(transport.len() >= bth::HEADER_LEN, "ICRC: no BTH");

        let mut pseudo = [0u8; ipv6::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN];
        let ip_len = ip_header.len();
        pseudo[..ip_len].copy_from_slice(ip_header);
        if ip_len == ipv4::HEADER_LEN {
            pseudo[1] = 0xFF; // TOS
            pseudo[8] = 0xFF; // TTL
            pseudo[10] = 0xFF; // header checksum
            pseudo[11] = 0xFF;
        } else {
            pseudo[0] |= 0x0F; // traffic class (high nibble) ...
            pseudo[1] = 0xFF; // ... and flow label
            pseudo[2] = 0xFF;
            pseudo[3] = 0xFF;
            pseudo[7] = 0xFF; // hop limit
        }
        let udp_at = ip_len;
        pseudo[udp_at..udp_at + udp::HEADER_LEN].copy_from_slice(udp_header);
        pseudo[udp_at + 6] = 0xFF; // UDP checksum
        pseudo[udp_at + 7] = 0xFF;
        let bth_at = udp_at + udp::HEADER_LEN;
        pseudo[bth_at..bth_at + bth::HEADER_LEN].copy_from_slice(&transport[..bth::HEADER_LEN]);
        pseudo[bth_at + 4] = 0xFF; // FECN, BECN, reserved

        let mut hasher = crc32fast::Hasher::new_with_initial(!SEED);
        hasher.update(&pseudo[..bth_at + bth::HEADER_LEN]);
        hasher.update(&transport[bth::HEADER_LEN..]);
        Icrc { hasher }
    }

    /// Continues over more bytes (extension headers, payload, pad).
    pub fn update(&mut self, data: &[u8]) {
        self.hasher.update(data);
    }

    /// The ICRC; its little-endian bytes go on the wire.
    pub fn finish(self) -> u32 {
        self.hasher.finalize()
    }
}

/// The ICRC of a packet given as its IP header (20 or 40 bytes), UDP header (8 bytes) and
/// the transport bytes from the BTH through the pad (without the ICRC).
///
/// # Panics
///
/// On the header lengths [`Icrc::new`] rejects.
pub fn compute(ip_header: &[u8], udp_header: &[u8], bth_and_rest: &[u8]) -> u32 {
    Icrc::new(ip_header, udp_header, bth_and_rest).finish()
}

// The ICRC of a datagram is computed here rather than in the datagram module, which only
// frames packets: the ICRC builds on the framing, not the other way round.
impl Datagram<'_> {
    /// The ICRC the packet should carry.
    pub fn computed_icrc(&self) -> u32 {
        let covered = &self.roce[..self.roce.len() - roce::ICRC_LEN];
        compute(self.ip_header, self.udp_header, covered)
    }
}

/// Checks the ICRC of an IP datagram (starting at the IP header) that carries a RoCEv2
/// packet. `Ok(false)` is a mismatch, `Err` a datagram that cannot carry one.
pub fn check(datagram: &[u8]) -> Result<bool> {
    let d = Datagram::split(datagram)?;
    Ok(d.computed_icrc() == d.wire_icrc())
}

/// Computes the ICRC of an IP datagram (starting at the IP header) whose headers and payload
/// are in place, stores it in the last four bytes of the UDP payload and returns it.
pub fn generate(datagram: &mut [u8]) -> Result<u32> {
    let (value, at) = {
        let d = Datagram::split(datagram)?;
        let end = d.ip_header.len() + d.udp_header.len() + d.roce.len();
        (d.computed_icrc(), end - roce::ICRC_LEN)
    };
    datagram[at..at + roce::ICRC_LEN].copy_from_slice(&value.to_le_bytes());
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit-at-a-time CRC-32 in the kernel's `crc32_le` form (no pre/post inversion), to check
    /// the table-free seed arithmetic independently of crc32fast.
    fn crc32_le(mut crc: u32, data: &[u8]) -> u32 {
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        crc
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The docs/WIRE.md §2 test vector: IPv4 192.168.1.1 → 192.168.1.2, ID 0x1234, DF, TTL
    /// 64, UDP 0xC123 → 4791, checksum 0, RC SEND_ONLY to QP 0x11 with AckReq, PSN 0x123456,
    /// payload 00..0f.
    const V4_FRAME: &str = "4500003c123440004011a529c0a80101c0a80102c12312b700280000\
                            0400ffff0000001180123456 000102030405060708090a0b0c0d0e0f e0941ecc";

    fn v6_frame() -> Vec<u8> {
        let v4 = hex(V4_FRAME);
        let mut f = hex("62012345 0028 11 40 fe800000000000000000000000000001 \
             fe800000000000000000000000000002");
        f.extend_from_slice(&v4[20..]);
        let n = f.len();
        f[n - 4..].copy_from_slice(&[0x60, 0x55, 0x3a, 0x9d]);
        f
    }

    #[test]
    fn seed() {
        assert_eq!(crc32_le(0xFFFF_FFFF, &[0xFF; 8]), SEED);
    }

    #[test]
    fn ipv4_vector() {
        let frame = hex(V4_FRAME);
        assert_eq!(
            compute(&frame[..20], &frame[20..28], &frame[28..frame.len() - 4]).to_le_bytes(),
            [0xe0, 0x94, 0x1e, 0xcc]
        );
        assert_eq!(check(&frame), Ok(true));
        let mut f = frame.clone();
        f[40] ^= 1;
        assert_eq!(check(&f), Ok(false));
        let mut f = frame.clone();
        f[frame.len() - 4..].fill(0xa5);
        assert_eq!(generate(&mut f), Ok(0xcc1e_94e0));
        assert_eq!(f, frame);
    }

    #[test]
    fn ipv6_vector() {
        let expected = v6_frame();
        let mut frame = expected.clone();
        let n = frame.len();
        frame[n - 4..].fill(0);
        let value = generate(&mut frame).unwrap();
        assert_eq!(value.to_le_bytes(), [0x60, 0x55, 0x3a, 0x9d]);
        assert_eq!(frame, expected);
        assert_eq!(check(&frame), Ok(true));
    }

    #[test]
    fn masked_fields_do_not_matter() {
        let frame = hex(V4_FRAME);
        let mut f = frame.clone();
        f[1] = 0xb8; // TOS
        f[8] = 3; // TTL
        f[10] = 0x12; // IP checksum
        f[26] = 0xab; // UDP checksum
        f[28 + 4] = 0xc0; // FECN, BECN
        assert_eq!(check(&f), Ok(true));
        // Covered: IP ID, UDP source port, BTH P_Key.
        for at in [5usize, 21, 31] {
            let mut f = frame.clone();
            f[at] ^= 0x01;
            assert_eq!(check(&f), Ok(false), "byte {at}");
        }
        let mut f = v6_frame();
        assert_eq!(check(&f), Ok(true));
        f[0] = 0x6f; // TC
        f[1] ^= 0xff; // TC, flow label
        f[3] = 0; // flow label
        f[7] = 1; // hop limit
        assert_eq!(check(&f), Ok(true));
        f[6] = 0x11;
        f[8] ^= 1; // source address
        assert_eq!(check(&f), Ok(false));
    }

    #[test]
    fn matches_reference_over_random_lengths() {
        let frame = hex(V4_FRAME);
        let mut state = 0x1234_5678u32;
        for len in [0usize, 1, 3, 15, 64, 127, 128, 129, 1000, 4096] {
            let mut rest = frame[28..40].to_vec();
            for _ in 0..len {
                state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
                rest.push((state >> 16) as u8);
            }
            let mut pseudo = frame[..28].to_vec();
            pseudo[1] = 0xff;
            pseudo[8] = 0xff;
            pseudo[10] = 0xff;
            pseudo[11] = 0xff;
            pseudo[26] = 0xff;
            pseudo[27] = 0xff;
            pseudo.extend_from_slice(&rest);
            pseudo[28 + 4] = 0xff;
            let expected = !crc32_le(SEED, &pseudo);
            assert_eq!(compute(&frame[..20], &frame[20..28], &rest), expected);
            // Incremental in two pieces.
            let mut icrc = Icrc::new(&frame[..20], &frame[20..28], &rest[..12 + len / 2]);
            icrc.update(&rest[12 + len / 2..]);
            assert_eq!(icrc.finish(), expected);
        }
    }

    #[test]
    fn malformed_datagrams() {
        let frame = hex(V4_FRAME);
        assert!(check(&frame[..40]).is_err());
        assert!(check(&[]).is_err());
        let mut f = frame.clone();
        f[9] = 6; // TCP
        assert!(check(&f).is_err());
    }
}
