//! The software RoCEv2 stack's wire codecs (`rtgt-transport::wire`): RoCEv2 packets and
//! their IP/UDP framing, MADs, CM messages and the rdma_cm header.

use rtgt_transport::wire::cm::{self, AttributeId, CmMessage};
use rtgt_transport::wire::{
    cma, datagram, icrc, mad, roce, CmaHdrPacket, CmaHdrRepr, Datagram, EthernetFrame,
    EthernetRepr, MadPacket, MadRepr, RocePacket, RoceRepr,
};

/// MADs, CM messages and the rdma_cm header from arbitrary bytes: parse, emit, and re-parse to
/// the same representation. Nothing may panic.
///
/// Input: one MAD (header and data), also read as a bare CM payload under every CM attribute
/// ID and as an rdma_cm private-data header; its first 8 bytes as a service ID.
pub fn transport_cm(data: &[u8]) {
    if let Ok(p) = MadPacket::new_checked(data) {
        let _ = (p.tid(), p.attr_id(), p.attr_mod(), p.method(), p.data());
        if let Ok(r) = MadRepr::parse(&p) {
            let mut out = [0u8; mad::HEADER_LEN];
            r.emit(&mut MadPacket::new_unchecked(&mut out[..]));
            assert_eq!(MadRepr::parse(&MadPacket::new_unchecked(&out[..])), Ok(r));
        }
    }

    if let Ok(m) = cm::Mad::parse(data) {
        let mut out = [0u8; mad::MAD_LEN];
        m.emit(&mut out);
        assert_eq!(cm::Mad::parse(&out), Ok(m));
    }

    // Every message layout over the same bytes, as if they were a CM payload.
    for attr in 0x0010..=0x001a {
        let attr = AttributeId::from(attr);
        if let Ok(msg) = CmMessage::parse(attr, data) {
            let mut out = [0u8; cm::CM_DATA_LEN];
            msg.emit(&mut out);
            assert_eq!(CmMessage::parse(attr, &out), Ok(msg));
        }
    }
    if let Ok(p) = cm::req::Packet::new_checked(data) {
        let _ = (p.has_alternate_path(), p.primary_path().flow_label());
    }

    if let Ok(p) = CmaHdrPacket::new_checked(data) {
        let _ = (p.src_addr(), p.dst_addr(), p.payload());
        if let Ok(r) = CmaHdrRepr::parse(&p) {
            let mut out = [0u8; cma::HEADER_LEN];
            r.emit(&mut CmaHdrPacket::new_unchecked(&mut out[..]));
            assert_eq!(
                CmaHdrRepr::parse(&CmaHdrPacket::new_unchecked(&out[..])),
                Ok(r)
            );
        }
    }
    if data.len() >= 8 {
        let sid = u64::from_be_bytes(data[..8].try_into().unwrap());
        if let Some((space, port)) = cma::parse_service_id(sid) {
            assert_eq!(cma::service_id(space, port), sid);
        }
    }
}

/// RoCEv2 packets from arbitrary bytes: the IP datagram split (whole and in two parts) and ICRC check, the whole-packet
/// view and every accessor once `new_checked` accepted it, and emit(parse(x)) re-parsing to the
/// same representation. Nothing may panic.
///
/// Input: the same bytes as a RoCE packet (BTH through ICRC), as an IPv4/IPv6 datagram and as
/// an Ethernet frame.
pub fn transport_packet(data: &[u8]) {
    exercise_packet(data);
    exercise_datagram(data);
    if let Ok(frame) = EthernetFrame::new_checked(data) {
        let _ = EthernetRepr::parse(&frame);
        exercise_datagram(frame.payload());
    }
}

fn exercise_packet(bytes: &[u8]) {
    let Ok(p) = RocePacket::new_checked(bytes) else {
        return;
    };
    let bth = p.bth();
    let _ = (
        bth.opcode(),
        bth.pkey(),
        bth.dest_qp(),
        bth.psn(),
        bth.ack_req(),
    );
    let _ = (
        bth.solicited(),
        bth.mig_req(),
        bth.pad_count(),
        bth.fecn(),
        bth.becn(),
    );
    if let Some(h) = p.reth() {
        let _ = (h.va(), h.rkey(), h.dma_len());
    }
    if let Some(h) = p.aeth() {
        let _ = (h.syndrome(), h.msn());
    }
    if let Some(h) = p.deth() {
        let _ = (h.qkey(), h.src_qp());
    }
    if let Some(h) = p.atomic_eth() {
        let _ = (h.va(), h.rkey(), h.swap_add(), h.compare());
    }
    if let Some(h) = p.atomic_ack_eth() {
        let _ = h.orig();
    }
    if let Some(h) = p.immdt() {
        let _ = h.imm();
    }
    if let Some(h) = p.ieth() {
        let _ = h.rkey();
    }
    if let Some(h) = p.feth() {
        let _ = (h.selectivity_level(), h.placement_type());
    }
    let _ = (
        p.payload(),
        p.pad(),
        p.icrc(),
        p.header_len(),
        p.without_icrc(),
    );

    let Ok(repr) = RoceRepr::parse(&p) else {
        return;
    };
    assert_eq!(repr.buffer_len(), bytes.len());
    let mut out = vec![0u8; repr.buffer_len()];
    let mut q = RocePacket::new_unchecked(&mut out[..]);
    repr.emit(&mut q).expect("a parsed packet re-emits");
    q.payload_mut().copy_from_slice(p.payload());
    q.set_icrc(p.icrc());
    let q = RocePacket::new_checked(&out[..]).expect("re-emitted packet checks");
    assert_eq!(RoceRepr::parse(&q), Ok(repr));
    assert_eq!(q.payload(), p.payload());
}

/// In three parts, as a link hands over a packet whose payload it received in place: the
/// same lengths and ICRC as whole.
fn exercise_placed(d: &Datagram<'_>) {
    let Ok(pkt) = d.roce_packet() else {
        return;
    };
    let (h, end) = (pkt.header_len(), d.roce.len() - roce::ICRC_LEN);
    if pkt.pad_len() != 0 || h >= end {
        return;
    }
    let rest = [&d.roce[..h], &d.roce[end..]].concat();
    let head = [d.ip_header, d.udp_header].concat();
    let p = Datagram::split_placed(&head, &rest, &d.roce[h..end]).expect("placed parts");
    assert_eq!(p.computed_icrc(), d.computed_icrc());
    assert_eq!((p.wire_icrc(), p.udp_repr()), (d.wire_icrc(), d.udp_repr()));
    assert_eq!(p.icrc_covered_len(), d.icrc_covered_len());
}

fn exercise_datagram(bytes: &[u8]) {
    let _ = icrc::check(bytes);
    // In two parts, as a link hands over what it received in place: the same datagram or
    // none (the parts must match exactly, where `split` allows trailing padding).
    if let Ok(h) = Datagram::headers(bytes) {
        let hl = h.ip_header.len() + h.udp_header.len();
        let _ = h.ip_repr();
        if let Ok(p) = Datagram::split_parts(&bytes[..hl], &bytes[hl..]) {
            assert_eq!(Datagram::split(bytes), Ok(p));
        }
    }
    let Ok(d) = Datagram::split(bytes) else {
        return;
    };
    exercise_placed(&d);
    let udp = d.udp_repr();
    let _ = (d.computed_icrc(), d.wire_icrc());
    exercise_packet(d.roce);
    // Rebuild the datagram from its representations; its ICRC must check.
    let (Ok(ip), Ok(packet)) = (d.ip_repr(), d.roce_packet()) else {
        return;
    };
    let Ok(repr) = RoceRepr::parse(&packet) else {
        return;
    };
    let mut out = vec![0u8; bytes.len() + 64];
    let Ok(hl) =
        datagram::emit_headers(&ip, udp.src_port, udp.dst_port, repr.buffer_len(), &mut out)
    else {
        return;
    };
    let end = hl + repr.buffer_len();
    let mut q = RocePacket::new_unchecked(&mut out[hl..end]);
    repr.emit(&mut q).expect("a parsed packet re-emits");
    q.payload_mut().copy_from_slice(packet.payload());
    icrc::generate(&mut out[..end]).expect("rebuilt datagram");
    assert_eq!(icrc::check(&out[..end]), Ok(true));
}
