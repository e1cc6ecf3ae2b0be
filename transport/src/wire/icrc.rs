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
        let mut c = Icrc::new(self.ip_header, self.udp_header, covered);
        // A placed payload follows the transport headers (and the packet has no pad).
        c.update(self.placed);
        c.finish()
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

/// The IPv4 header fields a UDP socket does not report and that the ICRC covers: the
/// identification (16 bits) and the DF flag. Linux senders (rxe among them) number their
/// datagrams, so a receiver that rebuilds the header from a UDP socket's view (ID 0, DF set)
/// gets a different ICRC for a sound packet.
///
/// The CRC is linear: flipping bits of those fields changes the ICRC by the XOR of one fixed
/// 32-bit vector per flipped bit, which depends only on how many bytes follow the field. So
/// the difference between the ICRC on the wire and the one computed over the rebuilt header
/// must be a combination of 17 known vectors; [`UnknownIpv4Fields::explains`] solves for it.
/// A packet whose difference is such a combination is sound but for at most those 17 bits
/// (a corrupted one passes with probability 2^-15 instead of 2^-32); any other difference is
/// corruption. With the real header (a packet socket) the check is the full one.
#[derive(Debug, Clone)]
pub struct UnknownIpv4Fields {
    /// Bases by covered length ([`basis_cached`]).
    cache: Vec<(usize, Basis)>,
    /// Bases built (cache misses).
    built: u64,
}

/// The vectors of one covered length: each unknown bit's own (`raw`), and the rows of the
/// reduced basis (the vector, the unknown bits it stands for, its pivot bit).
#[derive(Debug, Clone, Copy)]
struct Basis {
    raw: [u32; UNKNOWN_BITS],
    rows: [(u32, u32, u32); UNKNOWN_BITS],
}

/// Identification bits and the DF flag.
const UNKNOWN_BITS: usize = 17;
/// Bases kept (two per set).
const CACHE: usize = 64;
/// The reflected CRC-32 polynomial.
const POLY: u32 = 0xEDB8_8320;

/// a·b modulo the CRC polynomial, in the reflected representation (bit 31 is x^0).
fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut p = 0u32;
    let mut m = 1u32 << 31;
    while m != 0 {
        if a & m != 0 {
            p ^= b;
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    p
}

/// x^(8·n) modulo the CRC polynomial: what appending `n` zero bytes multiplies a CRC
/// register by.
fn zeros_op(n: usize) -> u32 {
    let mut result = 1u32 << 31;
    // x^(2^k), from x^8 up.
    let mut square = 1u32 << (31 - 8);
    let mut n = n;
    while n != 0 {
        if n & 1 != 0 {
            result = mul_mod(square, result);
        }
        square = mul_mod(square, square);
        n >>= 1;
    }
    result
}

/// The CRC register change (zero start, no inversion) of one byte `mask` followed by `n`
/// zero bytes.
/// `zeros` is [`zeros_op`] of `n`, made once for every bit of a byte.
fn byte_delta(mask: u8, zeros: u32) -> u32 {
    let mut r = u32::from(mask);
    for _ in 0..8 {
        r = if r & 1 != 0 { (r >> 1) ^ POLY } else { r >> 1 };
    }
    mul_mod(zeros, r)
}

impl Basis {
    const EMPTY: Basis = Basis {
        raw: [0; UNKNOWN_BITS],
        rows: [(0, 0, 0); UNKNOWN_BITS],
    };

    /// For a datagram whose ICRC covers `covered` bytes from the start of the IPv4 header.
    fn new(covered: usize) -> Basis {
        let mut rows = [(0u32, 0u32, 0u32); UNKNOWN_BITS];
        let mut raw = [0u32; UNKNOWN_BITS];
        // What the bytes after each of the three header bytes multiply a change by.
        let zeros = |at: usize| zeros_op(covered - 1 - at);
        let (z4, z5, z6) = (zeros(4), zeros(5), zeros(6));
        for bit in 0..UNKNOWN_BITS {
            // ID bits 0..8 in byte 5, 8..16 in byte 4; DF is 0x40 of byte 6.
            let (zeros, mask) = match bit {
                0..=7 => (z5, 1u8 << bit),
                8..=15 => (z4, 1u8 << (bit - 8)),
                _ => (z6, 0x40),
            };
            let mut v = byte_delta(mask, zeros);
            raw[bit] = v;
            let mut c = 1u32 << bit;
            for &(rv, rc, pivot) in &rows[..bit] {
                if v & pivot != 0 {
                    v ^= rv;
                    c ^= rc;
                }
            }
            // Independent (CRC-32 detects every error within 32 bits), so `v` is not zero.
            rows[bit] = (v, c, v & v.wrapping_neg());
        }
        Basis { raw, rows }
    }

    /// The unknown bits that turn a zero difference into `delta`, if any.
    fn solve(&self, mut delta: u32) -> Option<u32> {
        let mut bits = 0;
        for &(v, c, pivot) in &self.rows {
            if delta & pivot != 0 {
                delta ^= v;
                bits ^= c;
            }
        }
        (delta == 0).then_some(bits)
    }
}

impl UnknownIpv4Fields {
    pub fn new() -> UnknownIpv4Fields {
        UnknownIpv4Fields {
            // A covered length of usize::MAX is never asked for: an empty entry.
            cache: vec![(usize::MAX, Basis::EMPTY); CACHE],
            built: 0,
        }
    }

    /// Whether `wire` is the ICRC of an IPv4 datagram whose rebuilt form (the one `computed`
    /// was computed over, covering `covered` bytes from the IP header to the ICRC) differs
    /// from the one sent at most in the identification and DF flag; returns the
    /// identification the sender used (relative to the rebuilt one) if so.
    pub fn explains(&mut self, covered: usize, computed: u32, wire: u32) -> Option<u16> {
        if computed == wire {
            return Some(0);
        }
        if covered < ipv4::HEADER_LEN {
            return None;
        }
        basis_cached(&mut self.cache, &mut self.built, covered)
            .solve(computed ^ wire)
            .map(|bits| bits as u16)
    }

    /// How many bases were built: one per covered length, again only when one was evicted.
    pub fn bases_built(&self) -> u64 {
        self.built
    }

    /// How the ICRC of an IPv4 datagram covering `covered` bytes changes when its
    /// identification changes by `ident` (XOR of the old and the new): the ICRC of the new
    /// datagram is the old one XOR this. A sender whose datagrams the kernel numbers (the
    /// segments of a UDP GSO send get consecutive IDs) adjusts each ICRC with 16 XORs instead of
    /// computing it again over the whole packet.
    pub fn ident_delta(&mut self, covered: usize, ident: u16) -> u32 {
        if ident == 0 || covered < ipv4::HEADER_LEN {
            return 0;
        }
        let b = basis_cached(&mut self.cache, &mut self.built, covered);
        (0..16)
            .filter(|bit| ident & (1 << bit) != 0)
            .fold(0, |d, bit| d ^ b.raw[bit])
    }
}

/// The basis of `covered` bytes from a two-way set-associative cache (packet lengths repeat:
/// a data path alternates between a few, such as full data packets and responses, which a
/// direct-mapped cache can put in one slot and then rebuild on every packet).
fn basis_cached<'a>(cache: &'a mut [(usize, Basis)], built: &mut u64, covered: usize) -> &'a Basis {
    let sets = cache.len() / 2;
    let set = 2 * ((covered.wrapping_mul(0x9E37_79B9) >> 8) % sets);
    if cache[set + 1].0 == covered {
        // Most recent first.
        cache.swap(set, set + 1);
    } else if cache[set].0 != covered {
        cache[set + 1] = cache[set];
        cache[set] = (covered, Basis::new(covered));
        *built += 1;
    }
    &cache[set].1
}

impl Default for UnknownIpv4Fields {
    fn default() -> Self {
        UnknownIpv4Fields::new()
    }
}

// The rebuilt-header check runs on datagrams, like the ICRC itself.
impl Datagram<'_> {
    /// The bytes the ICRC covers after the eight masked LRH bytes: IP and UDP headers and the
    /// transport packet up to the ICRC.
    pub fn icrc_covered_len(&self) -> usize {
        self.ip_header.len() + self.udp_header.len() + self.roce.len() + self.placed.len()
            - roce::ICRC_LEN
    }
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

    /// A datagram with identification `ident` and DF `df`, and its ICRC.
    fn v4_with(ident: u16, df: bool, payload_len: usize) -> Vec<u8> {
        let frame = hex(V4_FRAME);
        let mut f = frame[..40].to_vec();
        f.extend((0..payload_len).map(|i| (i * 7) as u8));
        f.extend_from_slice(&[0; 4]);
        let total = f.len() as u16;
        f[2..4].copy_from_slice(&total.to_be_bytes());
        f[4..6].copy_from_slice(&ident.to_be_bytes());
        f[6] = if df { 0x40 } else { 0 };
        let udp_len = total - 20;
        f[24..26].copy_from_slice(&udp_len.to_be_bytes());
        generate(&mut f).unwrap();
        f
    }

    /// The datagram as rebuilt from a UDP socket's view: ID 0, DF set, ICRC kept.
    fn rebuilt(f: &[u8]) -> Vec<u8> {
        let mut r = f.to_vec();
        r[4..6].fill(0);
        r[6] = 0x40;
        r
    }

    #[test]
    fn zeros_op_matches_feeding_zeros() {
        for n in [0usize, 1, 2, 7, 100, 4096] {
            let mut r = 0x1234_5678u32;
            for _ in 0..n {
                for _ in 0..8 {
                    r = if r & 1 != 0 { (r >> 1) ^ POLY } else { r >> 1 };
                }
            }
            assert_eq!(mul_mod(zeros_op(n), 0x1234_5678), r, "{n} zero bytes");
        }
    }

    #[test]
    fn ident_delta_gives_the_icrc_of_another_identification() {
        let mut u = UnknownIpv4Fields::new();
        for len in [0usize, 1, 3, 64, 1000, 4096] {
            let base = v4_with(0x1234, true, len);
            let old = u32::from_le_bytes(base[base.len() - 4..].try_into().unwrap());
            let covered = base.len() - 4;
            for ident in [0x1234u16, 0x1235, 0, 1, 0xffff, 0x8000, 0x467e] {
                let want = v4_with(ident, true, len);
                let want = u32::from_le_bytes(want[want.len() - 4..].try_into().unwrap());
                assert_eq!(
                    old ^ u.ident_delta(covered, 0x1234 ^ ident),
                    want,
                    "payload {len}, ID {ident:#x}"
                );
            }
        }
    }

    /// A data path alternates between a few lengths (4 KiB data packets and responses: 4152
    /// and 120 bytes once shared a direct-mapped slot); each basis is built once.
    #[test]
    fn bases_are_built_once_per_length() {
        let mut u = UnknownIpv4Fields::new();
        let lengths = [4152usize, 120, 44, 116, 1080, 2104, 4124, 60];
        for _ in 0..10 {
            for &n in &lengths {
                u.ident_delta(n, 3);
            }
        }
        assert_eq!(u.bases_built(), lengths.len() as u64);
    }

    #[test]
    fn unknown_ipv4_fields_are_solved_and_corruption_is_not() {
        let mut u = UnknownIpv4Fields::new();
        for (ident, df, len) in [
            (0u16, true, 16usize),
            (0x467e, true, 16),
            (0x467f, true, 4096),
            (0xffff, false, 1000),
            (1, false, 0),
            (0x8000, true, 333),
        ] {
            let f = v4_with(ident, df, len);
            let r = rebuilt(&f);
            let d = Datagram::split(&r).unwrap();
            let got = u.explains(d.icrc_covered_len(), d.computed_icrc(), d.wire_icrc());
            assert_eq!(got, Some(ident), "ident {ident:#x} df {df} len {len}");
            // Any single corrupted bit outside those fields is caught.
            for at in [0usize, 2, 12, 16, 20, 22, 28, 33, r.len() - 5, r.len() - 1] {
                if at == 1 || at == 8 || at == 10 || at == 11 || at == 26 || at == 27 {
                    continue;
                }
                for bit in [0u8, 3, 7] {
                    let mut c = r.clone();
                    c[at] ^= 1 << bit;
                    let Ok(d) = Datagram::split(&c) else {
                        continue;
                    };
                    let got = u.explains(d.icrc_covered_len(), d.computed_icrc(), d.wire_icrc());
                    assert_eq!(got, None, "byte {at} bit {bit} of a {len}-byte payload");
                }
            }
        }
    }
}
