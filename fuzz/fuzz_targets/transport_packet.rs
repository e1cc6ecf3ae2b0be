#![no_main]
//! RoCEv2 packets from arbitrary bytes: the IP datagram split and ICRC check, the whole-packet
//! view and every accessor once `new_checked` accepted it, and emit(parse(x)) re-parsing to the
//! same representation. Nothing may panic.
use libfuzzer_sys::fuzz_target;
use rtgt_transport::wire::{
    datagram, icrc, Datagram, EthernetFrame, EthernetRepr, RocePacket, RoceRepr,
};

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

fn exercise_datagram(bytes: &[u8]) {
    let _ = icrc::check(bytes);
    let Ok(d) = Datagram::split(bytes) else {
        return;
    };
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

fuzz_target!(|data: &[u8]| {
    exercise_packet(data);
    exercise_datagram(data);
    if let Ok(frame) = EthernetFrame::new_checked(data) {
        let _ = EthernetRepr::parse(&frame);
        exercise_datagram(frame.payload());
    }
});
