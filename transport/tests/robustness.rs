//! Mutated capture packets through every parser: nothing panics once `new_checked` accepted
//! the bytes, and whatever parses re-emits to the same representation. (The cargo-fuzz targets
//! `transport_packet` and `transport_cm` explore further; this runs in every `cargo test`.)

mod common;

use common::load_capture;
use rtgt_transport::wire::cm::{self, AttributeId, CmMessage};
use rtgt_transport::wire::{cma, icrc, mad, Datagram, IpRepr, Opcode, RocePacket, RoceRepr};

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut XorShift, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    match rng.below(4) {
        0 => {
            for _ in 0..=rng.below(4) {
                let at = rng.below(v.len());
                if let Some(b) = v.get_mut(at) {
                    *b ^= 1 << rng.below(8);
                }
            }
        }
        1 => {
            let at = rng.below(v.len());
            if let Some(b) = v.get_mut(at) {
                *b = rng.next() as u8;
            }
        }
        2 => v.truncate(rng.below(v.len() + 1)),
        _ => {
            for _ in 0..rng.below(8) {
                v.push(rng.next() as u8);
            }
        }
    }
    v
}

fn exercise_packet(bytes: &[u8]) {
    let Ok(p) = RocePacket::new_checked(bytes) else {
        return;
    };
    let _ = (p.payload(), p.pad(), p.icrc(), p.header_len());
    if let Some(h) = p.aeth() {
        let _ = h.syndrome();
    }
    if let Some(h) = p.reth() {
        let _ = (h.va(), h.rkey(), h.dma_len());
    }
    let Ok(repr) = RoceRepr::parse(&p) else {
        return;
    };
    let mut out = vec![0u8; repr.buffer_len()];
    let mut q = RocePacket::new_unchecked(&mut out[..]);
    repr.emit(&mut q).unwrap();
    q.payload_mut().copy_from_slice(p.payload());
    let q = RocePacket::new_checked(&out[..]).unwrap();
    assert_eq!(RoceRepr::parse(&q), Ok(repr));
}

fn exercise_cm(bytes: &[u8]) {
    if let Ok(m) = cm::Mad::parse(bytes) {
        let mut out = [0u8; mad::MAD_LEN];
        m.emit(&mut out);
        assert_eq!(cm::Mad::parse(&out), Ok(m));
    }
    if bytes.len() > mad::HEADER_LEN {
        let data = &bytes[mad::HEADER_LEN..];
        for attr in 0x0010..=0x001a {
            let attr = AttributeId::from(attr);
            if let Ok(msg) = CmMessage::parse(attr, data) {
                let mut out = [0u8; cm::CM_DATA_LEN];
                msg.emit(&mut out);
                assert_eq!(CmMessage::parse(attr, &out), Ok(msg));
            }
        }
        if let Ok(p) = cma::Packet::new_checked(&data[data.len().min(140)..]) {
            let _ = cma::Repr::parse(&p);
        }
    }
}

#[test]
fn mutated_roce_datagrams() {
    let pcap = load_capture();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut parsed = 0;
    for record in pcap.records() {
        let Some((_, ip)) = pcap.network_layer(record.data) else {
            continue;
        };
        for _ in 0..12 {
            let m = mutate(&mut rng, ip);
            let _ = icrc::check(&m);
            if let Ok(d) = Datagram::split(&m) {
                let _ = (d.ip_repr(), d.udp_repr(), d.computed_icrc());
                exercise_packet(d.roce);
                parsed += 1;
            }
            exercise_packet(&m);
        }
    }
    assert!(parsed > 5000, "only {parsed} mutated datagrams split");
}

#[test]
fn mutated_cm_mads() {
    let pcap = load_capture();
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    for record in pcap.records() {
        let Some((_, ip)) = pcap.network_layer(record.data) else {
            continue;
        };
        let Ok(d) = Datagram::split(ip) else {
            continue;
        };
        let p = RocePacket::new_checked(d.roce).unwrap();
        if p.opcode() != Opcode::UdSendOnly {
            continue;
        }
        for _ in 0..300 {
            exercise_cm(&mutate(&mut rng, p.payload()));
        }
    }
}

#[test]
fn ipv6_rebuild_of_capture_packets() {
    // Every capture packet re-framed in IPv6 gets an ICRC that checks, and a single flipped
    // covered bit breaks it.
    let pcap = load_capture();
    for record in pcap.records().into_iter().take(200) {
        let Some((_, ip)) = pcap.network_layer(record.data) else {
            continue;
        };
        let Ok(d) = Datagram::split(ip) else {
            continue;
        };
        let IpRepr::V4(v4) = d.ip_repr().unwrap() else {
            unreachable!()
        };
        let v6 = IpRepr::V6(rtgt_transport::wire::Ipv6Repr {
            src_addr: v4.src_addr.to_ipv6_mapped(),
            dst_addr: v4.dst_addr.to_ipv6_mapped(),
            next_header: 17,
            payload_len: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0x12345,
        });
        let udp = d.udp_repr();
        let mut out = vec![0u8; 48 + d.roce.len()];
        let hl = rtgt_transport::wire::datagram::emit_headers(
            &v6,
            udp.src_port,
            udp.dst_port,
            d.roce.len(),
            &mut out,
        )
        .unwrap();
        out[hl..].copy_from_slice(d.roce);
        icrc::generate(&mut out).unwrap();
        assert_eq!(icrc::check(&out), Ok(true));
        let n = out.len();
        out[n - 5] ^= 0x10;
        assert_eq!(icrc::check(&out), Ok(false));
    }
}
