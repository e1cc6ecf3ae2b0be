//! A whole RoCEv2 transport packet: the UDP payload from the BTH through the ICRC
//! (IBA Annex A17.4; `rxe_hdr.h`, `rxe_recv.c` `hdr_check`).
//!
//! ```text
//! BTH (12) | extension headers (per opcode) | payload | pad (PadCnt, 0-3) | ICRC (4, LE)
//! ```
//!
//! [`Packet::check_len`] validates the whole layout, so every accessor of a checked packet is
//! panic-free: the opcode must be one this stack knows, TVer must be 0, the headers the opcode
//! calls for must be present, and payload plus pad must be a whole number of 4-byte words with
//! pad = (−payload) & 3 (IBA 9.2: "PadCnt ... to align the payload to a 4-byte boundary"; rxe
//! always sends it that way). Opcodes without payload must have none (and pad 0).

use core::fmt;

use super::opcode::{ExtHeaders, OpcodeInfo};
use super::{
    aeth, atomic_ack_eth, atomic_eth, bth, deth, feth, ieth, immdt, reth, Error, Opcode, Result,
};

/// The RoCEv2 UDP destination port (IBA Annex A17.2.2; `ROCE_V2_UDP_DPORT`).
pub const UDP_PORT: u16 = 4791;
/// Length of the ICRC.
pub const ICRC_LEN: usize = 4;
/// The shortest possible packet: a BTH and the ICRC.
pub const MIN_LEN: usize = bth::HEADER_LEN + ICRC_LEN;

/// The pad that follows `payload_len` bytes of payload: (−len) & 3.
pub const fn pad_len(payload_len: usize) -> usize {
    payload_len.wrapping_neg() & 3
}

/// A read/write view of a whole RoCEv2 packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer (exactly the UDP payload) and validates the layout.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Validates the layout (see the module documentation); afterwards no accessor panics.
    pub fn check_len(&self) -> Result<()> {
        let data = self.buffer.as_ref();
        if data.len() < MIN_LEN {
            return Err(Error);
        }
        let bth = bth::Packet::new_unchecked(data);
        if bth.tver() != bth::TVER {
            return Err(Error);
        }
        let info = bth.opcode().info().ok_or(Error)?;
        let rest = data
            .len()
            .checked_sub(info.header_len() + ICRC_LEN)
            .ok_or(Error)?;
        let pad = usize::from(bth.pad_count());
        if rest % 4 != 0 || pad > rest || (!info.has_payload() && rest != 0) {
            return Err(Error);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The BTH.
    pub fn bth(&self) -> bth::Packet<&[u8]> {
        bth::Packet::new_unchecked(&self.buffer.as_ref()[..bth::HEADER_LEN])
    }

    pub fn opcode(&self) -> Opcode {
        self.bth().opcode()
    }

    /// The opcode's layout, `None` for an opcode this stack does not know.
    pub fn opcode_info(&self) -> Option<&'static OpcodeInfo> {
        self.opcode().info()
    }

    /// Length of BTH plus extension headers.
    pub fn header_len(&self) -> usize {
        self.opcode_info()
            .map_or(bth::HEADER_LEN, OpcodeInfo::header_len)
    }

    fn ext_range(&self, header: ExtHeaders) -> Option<core::ops::Range<usize>> {
        let info = self.opcode_info()?;
        let start = bth::HEADER_LEN + info.headers.offset_of(header)?;
        Some(start..start + header.byte_len())
    }

    /// The bytes of one extension header, if the opcode carries it.
    pub fn ext_header(&self, header: ExtHeaders) -> Option<&[u8]> {
        let range = self.ext_range(header)?;
        self.buffer.as_ref().get(range)
    }

    pub fn deth(&self) -> Option<deth::Packet<&[u8]>> {
        self.ext_header(ExtHeaders::DETH)
            .map(deth::Packet::new_unchecked)
    }

    pub fn feth(&self) -> Option<feth::Packet<&[u8]>> {
        self.ext_header(ExtHeaders::FETH)
            .map(feth::Packet::new_unchecked)
    }

    pub fn reth(&self) -> Option<reth::Packet<&[u8]>> {
        self.ext_header(ExtHeaders::RETH)
            .map(reth::Packet::new_unchecked)
    }

    pub fn atomic_eth(&self) -> Option<atomic_eth::Packet<&[u8]>> {
        self.ext_header(ExtHeaders::ATOMIC_ETH)
            .map(atomic_eth::Packet::new_unchecked)
    }

    pub fn aeth(&self) -> Option<aeth::Packet<&[u8]>> {
        self.ext_header(ExtHeaders::AETH)
            .map(aeth::Packet::new_unchecked)
    }

    pub fn atomic_ack_eth(&self) -> Option<atomic_ack_eth::Packet<&[u8]>> {
        self.ext_header(ExtHeaders::ATOMIC_ACK_ETH)
            .map(atomic_ack_eth::Packet::new_unchecked)
    }

    pub fn immdt(&self) -> Option<immdt::Packet<&[u8]>> {
        self.ext_header(ExtHeaders::IMM_DT)
            .map(immdt::Packet::new_unchecked)
    }

    pub fn ieth(&self) -> Option<ieth::Packet<&[u8]>> {
        self.ext_header(ExtHeaders::IETH)
            .map(ieth::Packet::new_unchecked)
    }

    /// Offset of the ICRC (the end of the pad).
    pub fn icrc_offset(&self) -> usize {
        self.buffer.as_ref().len().saturating_sub(ICRC_LEN)
    }

    /// Number of pad bytes (PadCnt).
    pub fn pad_len(&self) -> usize {
        usize::from(self.bth().pad_count())
    }

    fn payload_range(&self) -> core::ops::Range<usize> {
        let start = self.header_len();
        let end = self.icrc_offset().saturating_sub(self.pad_len());
        start..end.max(start)
    }

    /// The payload, without pad and ICRC.
    pub fn payload(&self) -> &[u8] {
        let range = self.payload_range();
        &self.buffer.as_ref()[range]
    }

    /// The pad bytes (zero when a Linux peer sent them; covered by the ICRC).
    pub fn pad(&self) -> &[u8] {
        let end = self.icrc_offset();
        &self.buffer.as_ref()[self.payload_range().end..end]
    }

    /// The ICRC as the `u32` whose little-endian bytes are on the wire (see [`super::icrc`]).
    pub fn icrc(&self) -> u32 {
        let at = self.icrc_offset();
        let b = &self.buffer.as_ref()[at..at + ICRC_LEN];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// Everything the ICRC covers after the IP and UDP headers: BTH through pad.
    pub fn without_icrc(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.icrc_offset()]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn bth_mut(&mut self) -> bth::Packet<&mut [u8]> {
        bth::Packet::new_unchecked(&mut self.buffer.as_mut()[..bth::HEADER_LEN])
    }

    /// The bytes of one extension header, if the opcode carries it.
    pub fn ext_header_mut(&mut self, header: ExtHeaders) -> Option<&mut [u8]> {
        let range = self.ext_range(header)?;
        self.buffer.as_mut().get_mut(range)
    }

    pub fn deth_mut(&mut self) -> Option<deth::Packet<&mut [u8]>> {
        self.ext_header_mut(ExtHeaders::DETH)
            .map(deth::Packet::new_unchecked)
    }

    pub fn feth_mut(&mut self) -> Option<feth::Packet<&mut [u8]>> {
        self.ext_header_mut(ExtHeaders::FETH)
            .map(feth::Packet::new_unchecked)
    }

    pub fn reth_mut(&mut self) -> Option<reth::Packet<&mut [u8]>> {
        self.ext_header_mut(ExtHeaders::RETH)
            .map(reth::Packet::new_unchecked)
    }

    pub fn atomic_eth_mut(&mut self) -> Option<atomic_eth::Packet<&mut [u8]>> {
        self.ext_header_mut(ExtHeaders::ATOMIC_ETH)
            .map(atomic_eth::Packet::new_unchecked)
    }

    pub fn aeth_mut(&mut self) -> Option<aeth::Packet<&mut [u8]>> {
        self.ext_header_mut(ExtHeaders::AETH)
            .map(aeth::Packet::new_unchecked)
    }

    pub fn atomic_ack_eth_mut(&mut self) -> Option<atomic_ack_eth::Packet<&mut [u8]>> {
        self.ext_header_mut(ExtHeaders::ATOMIC_ACK_ETH)
            .map(atomic_ack_eth::Packet::new_unchecked)
    }

    pub fn immdt_mut(&mut self) -> Option<immdt::Packet<&mut [u8]>> {
        self.ext_header_mut(ExtHeaders::IMM_DT)
            .map(immdt::Packet::new_unchecked)
    }

    pub fn ieth_mut(&mut self) -> Option<ieth::Packet<&mut [u8]>> {
        self.ext_header_mut(ExtHeaders::IETH)
            .map(ieth::Packet::new_unchecked)
    }

    /// The payload, for the sender to fill after [`Repr::emit`].
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let range = self.payload_range();
        &mut self.buffer.as_mut()[range]
    }

    /// Stores an ICRC value (little-endian on the wire).
    pub fn set_icrc(&mut self, value: u32) {
        let at = self.icrc_offset();
        self.buffer.as_mut()[at..at + ICRC_LEN].copy_from_slice(&value.to_le_bytes());
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// A decoded RoCEv2 packet: the BTH, the extension headers its opcode carries (the others are
/// `None`) and the payload length. The payload itself stays in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The BTH. On emit its `pad_count` is replaced by the pad `payload_len` needs.
    pub bth: bth::Repr,
    pub deth: Option<deth::Repr>,
    pub feth: Option<feth::Repr>,
    pub reth: Option<reth::Repr>,
    pub atomic_eth: Option<atomic_eth::Repr>,
    pub aeth: Option<aeth::Repr>,
    pub atomic_ack_eth: Option<atomic_ack_eth::Repr>,
    pub immdt: Option<immdt::Repr>,
    pub ieth: Option<ieth::Repr>,
    pub payload_len: usize,
}

impl Repr {
    /// A packet with `bth` and no extension headers or payload yet.
    pub fn new(bth: bth::Repr) -> Repr {
        Repr {
            bth,
            deth: None,
            feth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            payload_len: 0,
        }
    }

    /// Decodes every header of a packet.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        let mut repr = Repr::new(bth::Repr::parse(&packet.bth())?);
        if let Some(p) = packet.deth() {
            repr.deth = Some(deth::Repr::parse(&p)?);
        }
        if let Some(p) = packet.feth() {
            repr.feth = Some(feth::Repr::parse(&p)?);
        }
        if let Some(p) = packet.reth() {
            repr.reth = Some(reth::Repr::parse(&p)?);
        }
        if let Some(p) = packet.atomic_eth() {
            repr.atomic_eth = Some(atomic_eth::Repr::parse(&p)?);
        }
        if let Some(p) = packet.aeth() {
            repr.aeth = Some(aeth::Repr::parse(&p)?);
        }
        if let Some(p) = packet.atomic_ack_eth() {
            repr.atomic_ack_eth = Some(atomic_ack_eth::Repr::parse(&p)?);
        }
        if let Some(p) = packet.immdt() {
            repr.immdt = Some(immdt::Repr::parse(&p)?);
        }
        if let Some(p) = packet.ieth() {
            repr.ieth = Some(ieth::Repr::parse(&p)?);
        }
        repr.payload_len = packet.payload().len();
        Ok(repr)
    }

    /// The extension headers present in this representation.
    pub fn present_headers(&self) -> ExtHeaders {
        let mut h = ExtHeaders::empty();
        h.set(ExtHeaders::DETH, self.deth.is_some());
        h.set(ExtHeaders::FETH, self.feth.is_some());
        h.set(ExtHeaders::RETH, self.reth.is_some());
        h.set(ExtHeaders::ATOMIC_ETH, self.atomic_eth.is_some());
        h.set(ExtHeaders::AETH, self.aeth.is_some());
        h.set(ExtHeaders::ATOMIC_ACK_ETH, self.atomic_ack_eth.is_some());
        h.set(ExtHeaders::IMM_DT, self.immdt.is_some());
        h.set(ExtHeaders::IETH, self.ieth.is_some());
        h
    }

    /// Checks that the headers and payload agree with the opcode.
    pub fn check(&self) -> Result<()> {
        let info = self.bth.opcode.info().ok_or(Error)?;
        let expected = info.headers - ExtHeaders::CNP_RESERVED;
        if self.present_headers() != expected || (!info.has_payload() && self.payload_len != 0) {
            return Err(Error);
        }
        Ok(())
    }

    /// Length of BTH plus extension headers, per the opcode (BTH only for unknown opcodes).
    pub fn header_len(&self) -> usize {
        self.bth
            .opcode
            .info()
            .map_or(bth::HEADER_LEN, OpcodeInfo::header_len)
    }

    /// Number of pad bytes after the payload.
    pub const fn pad_len(&self) -> usize {
        pad_len(self.payload_len)
    }

    /// Length of the whole packet including pad and ICRC.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_len + self.pad_len() + ICRC_LEN
    }

    /// Writes the BTH (with the computed PadCnt), the extension headers and zero pad. The
    /// payload is left for the caller ([`Packet::payload_mut`]) and the ICRC for
    /// [`super::icrc`]. Fails, writing nothing, when the representation disagrees with its
    /// opcode ([`Repr::check`]) or the buffer is not exactly [`Repr::buffer_len`] long: such a
    /// packet must not reach the wire.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        self.check()?;
        if packet.buffer.as_ref().len() != self.buffer_len() {
            return Err(Error);
        }
        let mut bth = self.bth;
        bth.pad_count = self.pad_len() as u8;
        bth.emit(&mut packet.bth_mut());
        if let (Some(r), Some(mut p)) = (self.deth, packet.deth_mut()) {
            r.emit(&mut p);
        }
        if let (Some(r), Some(mut p)) = (self.feth, packet.feth_mut()) {
            r.emit(&mut p);
        }
        if let (Some(r), Some(mut p)) = (self.reth, packet.reth_mut()) {
            r.emit(&mut p);
        }
        if let (Some(r), Some(mut p)) = (self.atomic_eth, packet.atomic_eth_mut()) {
            r.emit(&mut p);
        }
        if let (Some(r), Some(mut p)) = (self.aeth, packet.aeth_mut()) {
            r.emit(&mut p);
        }
        if let (Some(r), Some(mut p)) = (self.atomic_ack_eth, packet.atomic_ack_eth_mut()) {
            r.emit(&mut p);
        }
        if let (Some(r), Some(mut p)) = (self.immdt, packet.immdt_mut()) {
            r.emit(&mut p);
        }
        if let (Some(r), Some(mut p)) = (self.ieth, packet.ieth_mut()) {
            r.emit(&mut p);
        }
        if let Some(reserved) = packet.ext_header_mut(ExtHeaders::CNP_RESERVED) {
            reserved.fill(0);
        }
        let pad_start = packet.payload_range().end;
        let pad_end = packet.icrc_offset();
        packet.buffer.as_mut()[pad_start..pad_end].fill(0);
        Ok(())
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bth)?;
        if let Some(h) = self.deth {
            write!(f, " {h}")?;
        }
        if let Some(h) = self.feth {
            write!(f, " {h}")?;
        }
        if let Some(h) = self.reth {
            write!(f, " {h}")?;
        }
        if let Some(h) = self.atomic_eth {
            write!(f, " {h}")?;
        }
        if let Some(h) = self.aeth {
            write!(f, " {h}")?;
        }
        if let Some(h) = self.atomic_ack_eth {
            write!(f, " {h}")?;
        }
        if let Some(h) = self.immdt {
            write!(f, " {h}")?;
        }
        if let Some(h) = self.ieth {
            write!(f, " {h}")?;
        }
        write!(f, " payload={}", self.payload_len)
    }
}

/// The UDP source port for a flow label (`rdma_flow_label_to_udp_sport`,
/// include/rdma/ib_verbs.h): the low 14 bits XOR the high 6, in 0xC000..=0xFFFF. rxe uses it for
/// RC/UC QPs once modify_qp gives them an address vector (`rdma_get_udp_sport`).
pub const fn udp_sport_from_flow_label(flow_label: u32) -> u16 {
    let low = flow_label & 0x3FFF;
    let high = (flow_label & 0xF_C000) >> 14;
    ((low ^ high) | 0xC000) as u16
}

/// The flow label the kernel derives from a QP pair when the address vector has none
/// (`rdma_calc_flow_label`, include/rdma/ib_verbs.h). Symmetric in its arguments, so both ends
/// of a connection pick the same UDP source port.
pub const fn flow_label_from_qpns(lqpn: u32, rqpn: u32) -> u32 {
    let mut v = lqpn as u64 * rqpn as u64;
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0xF_FFFF) as u32
}

/// The flow label Linux rdma_cm puts in a RoCE REQ's primary path when the address has no IPv6
/// flow info: (source port × 31 + destination port) & 0xFFFFF (`cma.c`
/// `cma_get_roce_udp_flow_label`). Both peers then send with
/// `udp_sport_from_flow_label(label)`; verified against the lab capture.
pub const fn rdma_cm_flow_label(src_port: u16, dst_port: u16) -> u32 {
    (src_port as u32)
        .wrapping_mul(31)
        .wrapping_add(dst_port as u32)
        & 0xF_FFFF
}

/// The UDP source port rxe gives a QP at creation (`rxe_qp.c`): 0xC000 + `hash_32(qpn, 14)`.
/// QP1 therefore sends MADs from port 0xD872.
pub const fn qp_initial_sport(qpn: u32) -> u16 {
    const GOLDEN_RATIO_32: u32 = 0x61C8_8647;
    let hash = qpn.wrapping_mul(GOLDEN_RATIO_32) >> (32 - 14);
    (0xC000 + (hash & 0x3FFF)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{AethRepr, BthRepr, RethRepr, Syndrome};

    fn bth(opcode: Opcode) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: true,
            psn: 0x12_3456,
        }
    }

    // SEND_ONLY with 16 payload bytes (the docs/WIRE.md §2 test vector without IP/UDP).
    static SEND_ONLY: [u8; 32] = [
        0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56, 0x00, 0x01, 0x02,
        0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0xe0, 0x94,
        0x1e, 0xcc,
    ];

    #[test]
    fn parse() {
        let p = Packet::new_checked(&SEND_ONLY[..]).unwrap();
        assert_eq!(p.header_len(), 12);
        assert_eq!(p.payload(), &SEND_ONLY[12..28]);
        assert!(p.pad().is_empty());
        assert_eq!(p.icrc(), 0xcc1e_94e0);
        assert!(p.reth().is_none());
        let r = Repr::parse(&p).unwrap();
        assert_eq!(r.payload_len, 16);
        assert_eq!(r.bth, bth(Opcode::RcSendOnly));
        assert_eq!(r.buffer_len(), SEND_ONLY.len());
    }

    #[test]
    fn emit() {
        let mut r = Repr::new(bth(Opcode::RcSendOnly));
        r.payload_len = 16;
        let mut buf = [0xa5u8; 32];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        r.emit(&mut p).unwrap();
        p.payload_mut().copy_from_slice(&SEND_ONLY[12..28]);
        p.set_icrc(0xcc1e_94e0);
        assert_eq!(buf, SEND_ONLY);
    }

    #[test]
    fn emit_with_headers_and_pad() {
        let mut r = Repr::new(bth(Opcode::RcRdmaWriteOnlyWithImmediate));
        r.reth = Some(RethRepr {
            va: 0x1000,
            rkey: 0x42,
            dma_len: 5,
        });
        r.immdt = Some(crate::wire::ImmDtRepr { imm: 0xabcd_0123 });
        r.payload_len = 5;
        assert_eq!(r.pad_len(), 3);
        assert_eq!(r.buffer_len(), 12 + 16 + 4 + 5 + 3 + 4);
        let mut buf = vec![0xa5u8; r.buffer_len()];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        r.emit(&mut p).unwrap();
        p.payload_mut().copy_from_slice(b"hello");
        assert_eq!(p.bth().pad_count(), 3);
        assert_eq!(p.pad(), &[0, 0, 0]);
        assert_eq!(&buf[12..16], &[0, 0, 0, 0]); // VA high word
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(p.payload(), b"hello");
        let parsed = Repr::parse(&p).unwrap();
        let mut expected = r;
        expected.bth.pad_count = 3;
        assert_eq!(parsed, expected);
        assert_eq!(&buf[buf.len() - 4..], &[0xa5; 4]); // ICRC untouched
    }

    #[test]
    fn emit_inconsistent() {
        let mut buf = [0xa5u8; 64];
        // ACK without AETH.
        let r = Repr::new(bth(Opcode::RcAcknowledge));
        let mut p = Packet::new_unchecked(&mut buf[..r.buffer_len()]);
        assert_eq!(r.emit(&mut p), Err(Error));
        // ACK with payload.
        let mut r = Repr::new(bth(Opcode::RcAcknowledge));
        r.aeth = Some(AethRepr {
            syndrome: Syndrome::ACK_UNLIMITED,
            msn: 1,
        });
        r.payload_len = 4;
        assert_eq!(
            r.emit(&mut Packet::new_unchecked(&mut buf[..r.buffer_len()])),
            Err(Error)
        );
        // Wrong buffer length.
        r.payload_len = 0;
        assert_eq!(r.emit(&mut Packet::new_unchecked(&mut buf[..])), Err(Error));
        assert_eq!(
            r.emit(&mut Packet::new_unchecked(&mut buf[..r.buffer_len()])),
            Ok(())
        );
        // Unknown opcode.
        let r = Repr::new(bth(Opcode::Unknown(0x40)));
        assert_eq!(
            r.emit(&mut Packet::new_unchecked(&mut buf[..r.buffer_len()])),
            Err(Error)
        );
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&SEND_ONLY[..15]), Err(Error));
        // 28 bytes: a RETH-carrying opcode needs 12 + 16 + 4.
        let mut b = SEND_ONLY;
        b[0] = Opcode::RcRdmaWriteOnly.into();
        assert_eq!(Packet::new_checked(&b[..31]), Err(Error));
        assert!(Packet::new_checked(&b[..32]).is_ok());
        // Cut inside the payload so that payload + pad is not a whole number of words.
        assert_eq!(Packet::new_checked(&SEND_ONLY[..31]), Err(Error));
    }

    #[test]
    fn bad_field() {
        // TVer 1.
        let mut b = SEND_ONLY;
        b[1] = 0x01;
        assert_eq!(Packet::new_checked(&b[..]), Err(Error));
        // Unknown opcode (RD).
        let mut b = SEND_ONLY;
        b[0] = 0x44;
        assert_eq!(Packet::new_checked(&b[..]), Err(Error));
        // Pad larger than the payload.
        let mut b = [0u8; 20];
        b[..12].copy_from_slice(&SEND_ONLY[..12]);
        b[1] = 0x30;
        assert_eq!(Packet::new_checked(&b[..16]), Err(Error));
        assert!(Packet::new_checked(&b[..20]).is_ok());
        // Payload on an ACK.
        let mut b = [0u8; 24];
        b[0] = Opcode::RcAcknowledge.into();
        b[12] = 0x1f;
        assert!(Packet::new_checked(&b[..20]).is_ok());
        assert_eq!(Packet::new_checked(&b[..24]), Err(Error));
        // Reserved AETH syndrome type.
        b[12] = 0x40;
        let p = Packet::new_checked(&b[..20]).unwrap();
        assert_eq!(Repr::parse(&p), Err(Error));
    }

    #[test]
    fn cnp() {
        let mut r = Repr::new(bth(Opcode::Cnp));
        r.bth.ack_req = false;
        r.bth.psn = 0;
        let mut buf = vec![0xa5u8; r.buffer_len()];
        assert_eq!(buf.len(), 32);
        r.emit(&mut Packet::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(&buf[12..28], &[0u8; 16]);
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), r);
    }

    #[test]
    fn source_ports() {
        // The lab capture: iSER from 192.168.77.3:0x8796 to port 3260, SRP from :0xc561 to
        // 5555; RC traffic of both directions used 63463 and 64621, QP1 used 55410.
        let fl = rdma_cm_flow_label(0x8796, 3260);
        assert_eq!(fl, 0x077e6);
        assert_eq!(udp_sport_from_flow_label(fl), 63463);
        assert_eq!(
            udp_sport_from_flow_label(rdma_cm_flow_label(0xc561, 5555)),
            64621
        );
        assert_eq!(qp_initial_sport(1), 55410);
        assert_eq!(
            flow_label_from_qpns(0x11, 0x19),
            flow_label_from_qpns(0x19, 0x11)
        );
        assert_eq!(flow_label_from_qpns(0x11, 0x19), 0x1a9);
    }
}
