//! ICRC throughput: the per-packet CRC work that bounds a software RoCE data path.
//!
//! Builds IPv4 RoCEv2 RC SEND ONLY datagrams with 1024- and 4096-byte payloads (the usual path
//! MTUs) and computes their ICRC over and over, the way a receiver checks and a sender
//! generates it.
//!
//!     cargo run --release -p rtgt-transport --example icrc_bench [seconds per size]

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use rtgt_transport::wire::{
    bth, datagram, icrc, ipv4, roce, BthRepr, Datagram, IpRepr, Opcode, RocePacket, RoceRepr,
};

fn build(payload_len: usize) -> Vec<u8> {
    let mut repr = RoceRepr::new(BthRepr {
        opcode: Opcode::RcSendOnly,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        pkey: bth::DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qp: 0x11,
        ack_req: true,
        psn: 0x12_3456,
    });
    repr.payload_len = payload_len;
    let ip = IpRepr::V4(ipv4::Repr::udp(
        Ipv4Addr::new(192, 168, 1, 1),
        Ipv4Addr::new(192, 168, 1, 2),
    ));
    let mut buf = vec![0u8; ip.header_len() + 8 + repr.buffer_len()];
    let hl = datagram::emit_headers(&ip, 0xc123, roce::UDP_PORT, repr.buffer_len(), &mut buf)
        .expect("headers");
    let mut packet = RocePacket::new_unchecked(&mut buf[hl..]);
    repr.emit(&mut packet).expect("packet");
    for (i, b) in packet.payload_mut().iter_mut().enumerate() {
        *b = i as u8;
    }
    icrc::generate(&mut buf).expect("icrc");
    buf
}

fn run(payload_len: usize, budget: Duration) {
    let frame = build(payload_len);
    let d = Datagram::split(&frame).expect("datagram");
    let covered = &d.roce[..d.roce.len() - roce::ICRC_LEN];
    let expected = d.wire_icrc();
    // Warm up (and let crc32fast pick its implementation).
    for _ in 0..1000 {
        assert_eq!(
            icrc::compute(d.ip_header, d.udp_header, black_box(covered)),
            expected
        );
    }
    let mut packets = 0u64;
    let start = Instant::now();
    while start.elapsed() < budget {
        for _ in 0..1000 {
            black_box(icrc::compute(
                black_box(d.ip_header),
                black_box(d.udp_header),
                black_box(covered),
            ));
        }
        packets += 1000;
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = packets as f64 * frame.len() as f64;
    println!(
        "payload {payload_len:5} B  packet {:5} B  {:7.1} ns/packet  {:6.2} Mpackets/s  {:6.2} GB/s",
        frame.len(),
        secs * 1e9 / packets as f64,
        packets as f64 / secs / 1e6,
        bytes / secs / 1e9,
    );
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let budget = Duration::from_secs_f64(secs);
    println!("ICRC (CRC-32/IEEE over masked IPv4/UDP/BTH + payload), one core");
    for payload in [1024, 4096] {
        run(payload, budget);
    }
}
