//! The RC engines seen from the wire: packets produced by one device are inspected and fed
//! (possibly altered or crafted) to the other.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use rtgt_transport::verbs::*;
use rtgt_transport::wire::aeth::{NakCode, Syndrome};
use rtgt_transport::wire::{datagram, icrc, Datagram, IpRepr, Opcode, RocePacket, RoceRepr};

struct End {
    dev: Device,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    region: Arc<Region>,
    mr: Mr,
}

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

fn end(addr: IpAddr) -> End {
    end_with(addr, |_| {})
}

fn end_with(addr: IpAddr, config: impl FnOnce(&mut DeviceConfig)) -> End {
    let mut cfg = DeviceConfig::new("x", vec![addr]);
    config(&mut cfg);
    let dev = Device::new(cfg).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let qp = pd.create_qp(QpInitAttr::new(QpType::Rc, &cq, &cq)).unwrap();
    let region = Arc::new(Region::zeroed(1 << 20));
    let mr = pd
        .reg_mr(
            region.clone(),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    End {
        dev,
        _pd: pd,
        cq,
        qp,
        region,
        mr,
    }
}

fn connect(qp: &Qp, remote: IpAddr, dest: u32, mtu: Mtu, sq_psn: u32, rq_psn: u32, rd: u8) {
    qp.to_init(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)
        .unwrap();
    qp.to_rts(&RcPath {
        mtu,
        timeout: 10,
        retry_cnt: 3,
        rnr_retry: 3,
        max_rd_atomic: rd,
        max_dest_rd_atomic: rd,
        ..RcPath::new(remote, dest, rq_psn, sq_psn)
    })
    .unwrap();
}

fn ends(mtu: Mtu, rd: u8) -> (End, End) {
    let a = end(ip(1));
    let b = end(ip(2));
    connect(&a.qp, ip(2), b.qp.qpn(), mtu, 1000, 2000, rd);
    connect(&b.qp, ip(1), a.qp.qpn(), mtu, 2000, 1000, rd);
    (a, b)
}

fn out(dev: &Device, now: Duration) -> Vec<Vec<u8>> {
    dev.poll(now);
    let mut v = Vec::new();
    dev.take_tx(&mut v);
    v
}

fn decode(d: &[u8]) -> (RoceRepr, Vec<u8>) {
    let dg = Datagram::split(d).unwrap();
    assert_eq!(dg.computed_icrc(), dg.wire_icrc());
    let p = RocePacket::new_checked(dg.roce).unwrap();
    (RoceRepr::parse(&p).unwrap(), p.payload().to_vec())
}

fn with_repr(d: &[u8], f: impl FnOnce(&mut RoceRepr), payload: &[u8]) -> Vec<u8> {
    let dg = Datagram::split(d).unwrap();
    let ip = dg.ip_repr().unwrap();
    let udp = dg.udp_repr();
    let (mut repr, _) = decode(d);
    f(&mut repr);
    repr.payload_len = payload.len();
    craft(ip, udp.src_port, &repr, payload)
}

fn craft(ip: IpRepr, sport: u16, repr: &RoceRepr, payload: &[u8]) -> Vec<u8> {
    let len = repr.buffer_len();
    let mut buf = vec![0u8; ip.header_len() + 8 + len];
    let hl = datagram::emit_headers(&ip, sport, 4791, len, &mut buf).unwrap();
    let mut p = RocePacket::new_unchecked(&mut buf[hl..]);
    repr.emit(&mut p).unwrap();
    p.payload_mut().copy_from_slice(payload);
    icrc::generate(&mut buf).unwrap();
    buf
}

fn write_wr(a: &End, b: &End, len: u32) -> SendWr {
    SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: b.mr.iova(),
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(0, len)],
    )
}

#[test]
fn segmentation_padding_and_ackreq() {
    let (a, b) = ends(Mtu::Mtu256, 4);
    a.qp.post_send(write_wr(&a, &b, 256 * 2 + 129)).unwrap();
    let pkts: Vec<_> = out(&a.dev, Duration::ZERO)
        .iter()
        .map(|d| decode(d))
        .collect();
    let ops: Vec<_> = pkts.iter().map(|(r, _)| r.bth.opcode).collect();
    assert_eq!(
        ops,
        [
            Opcode::RcRdmaWriteFirst,
            Opcode::RcRdmaWriteMiddle,
            Opcode::RcRdmaWriteLast
        ]
    );
    let lens: Vec<_> = pkts.iter().map(|(r, _)| r.payload_len).collect();
    assert_eq!(lens, [256, 256, 129]);
    assert_eq!(pkts[2].0.bth.pad_count, 3);
    assert_eq!(pkts[0].0.reth.unwrap().dma_len, 641);
    let psns: Vec<_> = pkts.iter().map(|(r, _)| r.bth.psn).collect();
    assert_eq!(psns, [1000, 1001, 1002]);
    let acks: Vec<_> = pkts.iter().map(|(r, _)| r.bth.ack_req).collect();
    assert_eq!(acks, [false, false, true]);

    // A long SEND requests an ACK every 64 packets, and stops at 128 unacknowledged PSNs.
    let (a, _b) = ends(Mtu::Mtu256, 4);
    a.qp.post_send(SendWr::new(2, SendOp::Send, vec![a.mr.sge(0, 256 * 200)]))
        .unwrap();
    let pkts: Vec<_> = out(&a.dev, Duration::ZERO)
        .iter()
        .map(|d| decode(d))
        .collect();
    assert_eq!(pkts.len(), 128);
    let acked: Vec<_> = (0..128).filter(|i| pkts[*i].0.bth.ack_req).collect();
    assert_eq!(acked, [63, 127]);
}

/// Delivers `pkts` to `to` one by one and returns what `to` sent in answer.
fn deliver(to: &End, pkts: &[Vec<u8>], now: Duration) -> Vec<Vec<u8>> {
    for p in pkts {
        to.dev.receive(p, now);
    }
    out(&to.dev, now)
}

#[test]
fn unacked_window_grows_with_acks_and_halves_on_loss() {
    // 1000 packets of 256 bytes in one SEND; the receiver has a buffer for it.
    let (a, b) = ends(Mtu::Mtu256, 4);
    b.qp.post_recv(RecvWr {
        wr_id: 9,
        sg_list: b.mr.sge(0, 256 * 1000).into(),
    })
    .unwrap();
    a.qp.post_send(SendWr::new(1, SendOp::Send, vec![a.mr.sge(0, 256 * 1000)]))
        .unwrap();
    let now = Duration::ZERO;
    // The first window is rxe's 128 PSNs.
    let burst = out(&a.dev, now);
    assert_eq!(burst.len(), 128);
    // Two ACKs of 64 PSNs each grow it by a quarter of that: the next burst is 160.
    let acks = deliver(&b, &burst, now);
    assert_eq!(acks.len(), 2);
    let burst = deliver(&a, &acks, now);
    assert_eq!(burst.len(), 160);
    let first_psn = decode(&burst[0]).0.bth.psn;
    assert_eq!(first_psn, 1128);
    // Of these, two ACKs cover 128 (the last 32 wait for the next AckReq): the window is
    // 192, 32 of it in flight, so 160 more go out.
    let acks = deliver(&b, &burst, now);
    assert_eq!(acks.len(), 2);
    let burst = deliver(&a, &acks, now);
    assert_eq!(burst.len(), 160);
    assert_eq!(decode(&burst[0]).0.bth.psn, 1288);
    // All lost: the timer resends from the oldest unacknowledged PSN (1256) in a window
    // halved to 96, which never goes below 128.
    let t = Duration::from_nanos(4096 << 10);
    let resent = out(&a.dev, t);
    let psns: Vec<u32> = resent.iter().map(|p| decode(p).0.bth.psn).collect();
    assert_eq!(psns, (1256..1384).collect::<Vec<u32>>());
    // The rest of the message arrives intact.
    let mut pending = resent;
    let mut now = t;
    while !pending.is_empty() {
        let acks = deliver(&b, &pending, now);
        pending = deliver(&a, &acks, now);
        now += Duration::from_micros(1);
    }
    let wc = b.cq.poll(4);
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].byte_len, 256 * 1000);
    assert_eq!(a.cq.poll(4)[0].status, WcStatus::Success);
}

#[test]
fn qps_stopped_by_a_full_transmit_queue_send_later_and_timers_come_due() {
    // 40 QPs of one device, each with a 128-packet SEND: 5120 packets for a transmit queue
    // of 4096. Each QP is posted to once; those the full queue stopped go on by themselves.
    let a = end(ip(1));
    let pd = a.dev.alloc_pd().unwrap();
    let cq = a.dev.create_cq(64).unwrap();
    let mr = pd.reg_mr(a.region.clone(), Access::LOCAL_WRITE).unwrap();
    let qps: Vec<Qp> = (0..40)
        .map(|i| {
            let qp = pd.create_qp(QpInitAttr::new(QpType::Rc, &cq, &cq)).unwrap();
            connect(&qp, ip(2), 7000 + i, Mtu::Mtu256, 1000, 2000, 1);
            qp.post_send(SendWr::new(1, SendOp::Send, vec![mr.sge(0, 256 * 128)]))
                .unwrap();
            qp
        })
        .collect();
    let first = out(&a.dev, Duration::ZERO);
    assert_eq!(first.len(), 4096);
    let second = out(&a.dev, Duration::ZERO);
    assert_eq!(second.len(), 5120 - 4096);
    // Every QP now waits for its ACKs: nothing more until the retransmit timer, which is
    // what the device says it waits for.
    assert!(out(&a.dev, Duration::ZERO).is_empty());
    let t = Duration::from_nanos(4096 << 10);
    assert_eq!(a.dev.next_deadline(), Some(t));
    assert!(out(&a.dev, t - Duration::from_nanos(1)).is_empty());
    // Go-back-N for all 40 (the queue takes 4096 of their 5120 again, the rest follow).
    assert_eq!(out(&a.dev, t).len(), 4096);
    assert_eq!(out(&a.dev, t).len(), 5120 - 4096);
    drop(qps);
}

#[test]
fn read_consumes_psns_and_rd_atomic_limit() {
    let (a, b) = ends(Mtu::Mtu256, 2);
    for _ in 0..3 {
        let op = SendOp::RdmaRead {
            remote_addr: b.mr.iova(),
            rkey: b.mr.rkey(),
        };
        a.qp.post_send(SendWr::new(1, op, vec![a.mr.sge(0, 1000)]))
            .unwrap();
    }
    let pkts: Vec<_> = out(&a.dev, Duration::ZERO)
        .iter()
        .map(|d| decode(d))
        .collect();
    assert_eq!(pkts.len(), 2, "max_rd_atomic = 2");
    assert_eq!(pkts[0].0.bth.psn, 1000);
    assert_eq!(
        pkts[1].0.bth.psn, 1004,
        "a 1000-byte READ at MTU 256 uses 4 PSNs"
    );
    // The responder answers with FIRST, MIDDLE, MIDDLE, LAST.
    b.dev.receive(&out_raw(&pkts[0]), Duration::ZERO);
    let resp: Vec<_> = out(&b.dev, Duration::ZERO)
        .iter()
        .map(|d| decode(d))
        .collect();
    let ops: Vec<_> = resp.iter().map(|(r, _)| r.bth.opcode).collect();
    assert_eq!(
        ops,
        [
            Opcode::RcRdmaReadResponseFirst,
            Opcode::RcRdmaReadResponseMiddle,
            Opcode::RcRdmaReadResponseMiddle,
            Opcode::RcRdmaReadResponseLast
        ]
    );
    assert!(resp[0].0.aeth.is_some() && resp[1].0.aeth.is_none() && resp[3].0.aeth.is_some());
}

fn out_raw(p: &(RoceRepr, Vec<u8>)) -> Vec<u8> {
    let ip = IpRepr::V4(rtgt_transport::wire::Ipv4Repr {
        src_addr: Ipv4Addr::new(10, 0, 0, 1),
        dst_addr: Ipv4Addr::new(10, 0, 0, 2),
        protocol: 17,
        payload_len: 0,
        ttl: 64,
        tos: 0,
        ident: 0,
        dont_frag: true,
    });
    craft(ip, 0xc000, &p.0, &p.1)
}

fn acks(dev: &Device) -> Vec<(Syndrome, u32, u32)> {
    out(dev, Duration::ZERO)
        .iter()
        .map(|d| decode(d).0)
        .filter_map(|r| r.aeth.map(|a| (a.syndrome, r.bth.psn, a.msn)))
        .collect()
}

#[test]
fn responder_psn_checks() {
    let (a, b) = ends(Mtu::Mtu256, 4);
    a.qp.post_send(write_wr(&a, &b, 256 * 3)).unwrap();
    let pkts = out(&a.dev, Duration::ZERO);
    // Skip the first packet: NAK 0x60 with the expected PSN, once.
    b.dev.receive(&pkts[1], Duration::ZERO);
    b.dev.receive(&pkts[2], Duration::ZERO);
    assert_eq!(
        acks(&b.dev),
        [(Syndrome::Nak(NakCode::PsnSequenceError), 1000, 0)]
    );
    // In order: one ACK for the AckReq packet, MSN 1.
    for p in &pkts {
        b.dev.receive(p, Duration::ZERO);
    }
    assert_eq!(acks(&b.dev), [(Syndrome::ACK_UNLIMITED, 1002, 1)]);
    // A duplicate is acknowledged with the last PSN.
    b.dev.receive(&pkts[0], Duration::ZERO);
    assert_eq!(acks(&b.dev), [(Syndrome::ACK_UNLIMITED, 1002, 1)]);
    // The requester completes on that ACK.
    let ack = out(&b.dev, Duration::ZERO);
    assert!(ack.is_empty());
}

#[test]
fn responder_sequence_and_length_errors() {
    // MIDDLE without FIRST: NAK 0x61 and the responder QP goes to error.
    let (a, b) = ends(Mtu::Mtu256, 4);
    a.qp.post_send(write_wr(&a, &b, 256 * 3)).unwrap();
    let pkts = out(&a.dev, Duration::ZERO);
    let bad = with_repr(&pkts[1], |r| r.bth.psn = 1000, &[0u8; 256]);
    b.dev.receive(&bad, Duration::ZERO);
    let got = acks(&b.dev);
    assert_eq!(got[0].0, Syndrome::Nak(NakCode::InvalidRequest), "{got:?}");
    assert_eq!(b.qp.state(), QpState::Err);

    // A FIRST packet shorter than the MTU is a length error.
    let (a, b) = ends(Mtu::Mtu256, 4);
    a.qp.post_send(write_wr(&a, &b, 256 * 3)).unwrap();
    let pkts = out(&a.dev, Duration::ZERO);
    let short = with_repr(&pkts[0], |_| {}, &[0u8; 200]);
    b.dev.receive(&short, Duration::ZERO);
    assert_eq!(acks(&b.dev)[0].0, Syndrome::Nak(NakCode::InvalidRequest));

    // The requester maps NAK 0x61 to REM_INV_REQ_ERR and flushes the rest.
    let (a, b) = ends(Mtu::Mtu256, 4);
    a.qp.post_send(write_wr(&a, &b, 256 * 3)).unwrap();
    a.qp.post_send(write_wr(&a, &b, 8)).unwrap();
    let pkts = out(&a.dev, Duration::ZERO);
    b.dev
        .receive(&with_repr(&pkts[0], |_| {}, &[0u8; 200]), Duration::ZERO);
    for d in out(&b.dev, Duration::ZERO) {
        a.dev.receive(&d, Duration::ZERO);
    }
    a.dev.poll(Duration::ZERO);
    let wc = a.cq.poll(4);
    assert_eq!(wc[0].status, WcStatus::RemInvReqErr);
    assert_eq!(wc[1].status, WcStatus::WrFlushErr);
    let _ = (&b.cq, &b.region, &a.region);
}

#[test]
fn retransmit_timer_and_retry_exhaustion() {
    let (a, b) = ends(Mtu::Mtu1024, 4);
    a.qp.post_send(write_wr(&a, &b, 10)).unwrap();
    let first = out(&a.dev, Duration::ZERO);
    assert_eq!(first.len(), 1);
    // 4.096 µs × 2^10 ≈ 4.19 ms.
    let t = Duration::from_nanos(4096 << 10);
    assert!(out(&a.dev, t - Duration::from_nanos(1)).is_empty());
    let again = out(&a.dev, t);
    assert_eq!(again, first, "go-back-N resends the same packet");
    let mut now = t;
    for _ in 0..3 {
        now += t;
        out(&a.dev, now);
    }
    let wc = a.cq.poll(1);
    assert_eq!(wc[0].status, WcStatus::RetryExcErr);
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn garbage_never_panics() {
    let (a, b) = ends(Mtu::Mtu256, 4);
    a.qp.post_send(write_wr(&a, &b, 600)).unwrap();
    a.qp.post_send(SendWr::new(
        3,
        SendOp::RdmaRead {
            remote_addr: b.mr.iova(),
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(0, 600)],
    ))
    .unwrap();
    let pkts = out(&a.dev, Duration::ZERO);
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // Packets with valid framing and ICRC but random transport bytes.
    for i in 0..20_000 {
        let base = &pkts[i % pkts.len()];
        let dg = Datagram::split(base).unwrap();
        let hl = dg.ip_header.len() + 8;
        let mut d = base.clone();
        for _ in 0..1 + rnd() % 6 {
            let at = hl + (rnd() as usize % (d.len() - hl));
            d[at] = rnd() as u8;
        }
        if rnd() % 4 == 0 {
            d[hl + 5..hl + 8].copy_from_slice(&b.qp.qpn().to_be_bytes()[1..]);
        }
        let _ = icrc::generate(&mut d);
        b.dev.receive(&d, Duration::from_micros(i as u64));
        a.dev.receive(&d, Duration::from_micros(i as u64));
        for r in out(&b.dev, Duration::from_micros(i as u64)) {
            a.dev.receive(&r, Duration::from_micros(i as u64));
        }
    }
    // Truncated and random datagrams.
    for n in 0..pkts[0].len() {
        b.dev.receive(&pkts[0][..n], Duration::ZERO);
    }
    for _ in 0..2000 {
        let v: Vec<u8> = (0..rnd() % 200).map(|_| rnd() as u8).collect();
        b.dev.receive(&v, Duration::ZERO);
    }
    let _ = (&a.region, &b.cq);
}

#[test]
fn duplicate_sequence_naks_spend_one_retry() {
    let (a, b) = ends(Mtu::Mtu1024, 4);
    a.qp.post_send(write_wr(&a, &b, 3000)).unwrap();
    let pkts = out(&a.dev, Duration::ZERO);
    assert_eq!(pkts.len(), 3);
    // The first packet is lost: the second draws a sequence NAK for PSN 1000.
    b.dev.receive(&pkts[1], Duration::ZERO);
    let nak = out(&b.dev, Duration::ZERO);
    let (r, _) = decode(&nak[0]);
    assert_eq!(
        (r.aeth.unwrap().syndrome, r.bth.psn),
        (Syndrome::Nak(NakCode::PsnSequenceError), 1000)
    );
    // The network duplicates it more often than the retry count (3) allows: one go-back-N.
    for _ in 0..6 {
        a.dev.receive(&nak[0], Duration::ZERO);
    }
    let again = out(&a.dev, Duration::ZERO);
    assert_eq!(again, pkts, "one go-back-N resends the whole WRITE once");
    assert_eq!(a.qp.state(), QpState::Rts);
    for p in &again {
        b.dev.receive(p, Duration::ZERO);
    }
    for ack in out(&b.dev, Duration::ZERO) {
        a.dev.receive(&ack, Duration::ZERO);
    }
    a.dev.poll(Duration::ZERO);
    assert_eq!(a.cq.poll(1)[0].status, WcStatus::Success);
}

#[test]
fn rnr_nak_on_the_wire() {
    let (a, b) = ends(Mtu::Mtu1024, 4);
    a.qp.post_send(SendWr::new(1, SendOp::Send, vec![a.mr.sge(0, 10)]))
        .unwrap();
    let pkts = out(&a.dev, Duration::ZERO);
    b.dev.receive(&pkts[0], Duration::ZERO);
    // min_rnr_timer 1 = 10 µs, PSN of the refused packet, MSN unchanged.
    let nak = out(&b.dev, Duration::ZERO);
    let (r, _) = decode(&nak[0]);
    assert_eq!(r.bth.opcode, Opcode::RcAcknowledge);
    assert_eq!(r.aeth.unwrap().syndrome, Syndrome::RnrNak { timer: 1 });
    assert_eq!((r.bth.psn, r.aeth.unwrap().msn), (1000, 0));
    a.dev.receive(&nak[0], Duration::ZERO);
    assert!(out(&a.dev, Duration::from_micros(9)).is_empty());
    let again = out(&a.dev, Duration::from_micros(10));
    assert_eq!(again, pkts, "resent after the RNR timer");
    b.qp.post_recv(RecvWr {
        wr_id: 5,
        sg_list: b.mr.sge(0, 64).into(),
    })
    .unwrap();
    b.dev.receive(&again[0], Duration::ZERO);
    let ack = out(&b.dev, Duration::ZERO);
    let (r, _) = decode(&ack[0]);
    assert_eq!(
        (r.aeth.unwrap().syndrome, r.aeth.unwrap().msn),
        (Syndrome::ACK_UNLIMITED, 1)
    );
    a.dev.receive(&ack[0], Duration::ZERO);
    a.dev.poll(Duration::ZERO);
    assert_eq!(a.cq.poll(1)[0].status, WcStatus::Success);
    assert_eq!(b.cq.poll(1)[0].byte_len, 10);
}

#[test]
fn ud_qkey_mismatch_is_dropped() {
    let dev_a = Device::new(DeviceConfig::new("a", vec![ip(1)])).unwrap();
    let dev_b = Device::new(DeviceConfig::new("b", vec![ip(2)])).unwrap();
    let mk = |d: &Device, qkey| {
        let pd = d.alloc_pd().unwrap();
        let cq = d.create_cq(8).unwrap();
        let qp = pd.create_qp(QpInitAttr::new(QpType::Ud, &cq, &cq)).unwrap();
        use QpAttrMask as M;
        let a = QpAttr {
            qp_state: Some(QpState::Init),
            port_num: 1,
            qkey,
            ..Default::default()
        };
        qp.modify(&a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
            .unwrap();
        qp.modify(
            &QpAttr {
                qp_state: Some(QpState::Rtr),
                ..Default::default()
            },
            M::STATE,
        )
        .unwrap();
        qp.modify(
            &QpAttr {
                qp_state: Some(QpState::Rts),
                ..Default::default()
            },
            M::STATE | M::SQ_PSN,
        )
        .unwrap();
        let region = Arc::new(Region::zeroed(4096));
        let mr = pd.reg_mr(region.clone(), Access::LOCAL_WRITE).unwrap();
        (pd, cq, qp, region, mr)
    };
    let (pda, _cqa, qpa, _ra, mra) = mk(&dev_a, 0x1111);
    let (_pdb, cqb, qpb, _rb, mrb) = mk(&dev_b, 0x2222);
    for _ in 0..2 {
        qpb.post_recv(RecvWr {
            wr_id: 1,
            sg_list: mrb.sge(0, 1024).into(),
        })
        .unwrap();
    }
    let ah = dev_a.create_ah(&pda, AddressVector::new(ip(2))).unwrap();
    for qkey in [0x3333, 0x2222] {
        let mut wr = SendWr::new(1, SendOp::SendWithImm(9), vec![mra.sge(0, 100)]);
        wr.ud = Some(UdDest {
            ah: ah.clone(),
            remote_qpn: qpb.qpn(),
            remote_qkey: qkey,
        });
        qpa.post_send(wr).unwrap();
    }
    for d in out(&dev_a, Duration::ZERO) {
        dev_b.receive(&d, Duration::ZERO);
    }
    let wc = cqb.poll(4);
    assert_eq!(wc.len(), 1, "the wrong Q_Key is dropped");
    assert_eq!((wc[0].byte_len, wc[0].imm_or_inv), (140, 9));
    assert_eq!(dev_b.stats().rx_dropped, 1);
}

/// A link that hands a device one prepared batch of datagrams and keeps what it sends.
struct Batch {
    rx: std::collections::VecDeque<Vec<u8>>,
    tx: Vec<Vec<u8>>,
}

impl rtgt_transport::netdev::NetDev for Batch {
    fn transmit(&mut self, d: &[u8]) -> std::io::Result<()> {
        self.tx.push(d.to_vec());
        Ok(())
    }

    fn receive(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        Ok(self.rx.pop_front())
    }
}

/// (syndrome, PSN, MSN) of an acknowledgement.
type Ack = (Syndrome, u32, u32);

/// Drives `dev` once over `pkts` as one received batch; returns the acknowledgements it sent
/// and everything it sent.
fn batch_acks(dev: &Device, pkts: &[Vec<u8>]) -> (Vec<Ack>, Vec<Vec<u8>>) {
    let mut link = Batch {
        rx: pkts.iter().cloned().collect(),
        tx: Vec::new(),
    };
    dev.drive(&mut link, Duration::ZERO);
    let acks = link
        .tx
        .iter()
        .map(|d| decode(d).0)
        .filter_map(|r| r.aeth.map(|a| (a.syndrome, r.bth.psn, a.msn)))
        .collect();
    (acks, link.tx)
}

#[test]
fn acks_are_coalesced_per_received_batch() {
    let (a, b) = ends(Mtu::Mtu1024, 4);
    for i in 0..8 {
        a.qp.post_send(write_wr(&a, &b, 100 + i)).unwrap();
    }
    let pkts = out(&a.dev, Duration::ZERO);
    assert_eq!(pkts.len(), 8);
    assert!(pkts.iter().all(|p| decode(p).0.bth.ack_req));
    // Eight requests that each ask for an ACK, received together: one ACK for the last.
    let (acks, sent) = batch_acks(&b.dev, &pkts);
    assert_eq!(acks, [(Syndrome::ACK_UNLIMITED, 1007, 8)]);
    // It completes all eight WRITEs.
    a.dev.receive(&sent[0], Duration::ZERO);
    a.dev.poll(Duration::ZERO);
    let mut wcs = Vec::new();
    a.cq.poll_into(&mut wcs, 16);
    assert_eq!(wcs.len(), 8);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));

    // Received one per batch, each is acknowledged on its own.
    a.qp.post_send(write_wr(&a, &b, 10)).unwrap();
    a.qp.post_send(write_wr(&a, &b, 10)).unwrap();
    let pkts = out(&a.dev, Duration::ZERO);
    assert_eq!(
        batch_acks(&b.dev, &pkts[..1]).0,
        [(Syndrome::ACK_UNLIMITED, 1008, 9)]
    );
    assert_eq!(
        batch_acks(&b.dev, &pkts[1..]).0,
        [(Syndrome::ACK_UNLIMITED, 1009, 10)]
    );

    // A gap within a batch: the ACK owed for what came before it leaves before the NAK.
    for _ in 0..3 {
        a.qp.post_send(write_wr(&a, &b, 10)).unwrap();
    }
    let pkts = out(&a.dev, Duration::ZERO);
    let (acks, _) = batch_acks(&b.dev, &[pkts[0].clone(), pkts[2].clone()]);
    assert_eq!(
        acks,
        [
            (Syndrome::ACK_UNLIMITED, 1010, 11),
            (Syndrome::Nak(NakCode::PsnSequenceError), 1011, 11)
        ]
    );
    // A duplicate in the same batch as new requests adds no ACK of its own.
    let (acks, _) = batch_acks(&b.dev, &[pkts[0].clone(), pkts[1].clone(), pkts[2].clone()]);
    assert_eq!(acks, [(Syndrome::ACK_UNLIMITED, 1012, 13)]);
}

/// `d` (IPv4) as the sender put it on the wire with identification `ident` (its ICRC
/// recomputed), and as a UDP socket's receiver rebuilds it: ID 0, the sender's ICRC kept.
fn sent_and_rebuilt(d: &[u8], ident: u16) -> (Vec<u8>, Vec<u8>) {
    let header = |d: &mut Vec<u8>, ident: u16| {
        d[4..6].copy_from_slice(&ident.to_be_bytes());
        d[10..12].fill(0);
        let sum = rtgt_transport::wire::ipv4::checksum(&d[..20]);
        d[10..12].copy_from_slice(&sum.to_be_bytes());
    };
    let mut sent = d.to_vec();
    header(&mut sent, ident);
    icrc::generate(&mut sent).unwrap();
    let mut rebuilt = sent.clone();
    header(&mut rebuilt, 0);
    (sent, rebuilt)
}

#[test]
fn ipv4_icrc_is_checked_on_rebuilt_headers() {
    let a = end(ip(1));
    let b = end_with(ip(2), |c| c.ipv4_header_rebuilt = true);
    connect(&a.qp, ip(2), b.qp.qpn(), Mtu::Mtu1024, 1000, 2000, 4);
    connect(&b.qp, ip(1), a.qp.qpn(), Mtu::Mtu1024, 2000, 1000, 4);
    a.region.write(0, &[0x5a; 64]);
    a.qp.post_send(write_wr(&a, &b, 64)).unwrap();
    a.qp.post_send(write_wr(&a, &b, 64)).unwrap();
    let pkts = out(&a.dev, Duration::ZERO);
    // An rxe peer numbers its datagrams; the rebuilt header says ID 0.
    let (_, first) = sent_and_rebuilt(&pkts[0], 0x4680);
    let (_, mut second) = sent_and_rebuilt(&pkts[1], 0x4681);
    let n = second.len();
    second[n - 10] ^= 0x04;
    b.dev.receive(&first, Duration::ZERO);
    b.dev.receive(&second, Duration::ZERO);
    // The sound one is taken (and acknowledged), the corrupted one dropped and counted.
    assert_eq!(acks(&b.dev), [(Syndrome::ACK_UNLIMITED, 1000, 1)]);
    assert_eq!(b.dev.stats().rx_bad_icrc, 1);
    let mut got = [0u8; 64];
    b.region.read(0, &mut got);
    assert_eq!(got, [0x5a; 64]);

    // A device that sees real headers checks them in full: the rebuilt one does not pass.
    let c = end(ip(2));
    connect(&c.qp, ip(1), a.qp.qpn(), Mtu::Mtu1024, 2000, 1000, 4);
    let mut to_c = pkts[0].clone();
    let qpn = c.qp.qpn().to_be_bytes();
    to_c[28 + 5..28 + 8].copy_from_slice(&qpn[1..]);
    let (sent, rebuilt) = sent_and_rebuilt(&to_c, 0x4680);
    c.dev.receive(&rebuilt, Duration::ZERO);
    assert_eq!(c.dev.stats().rx_bad_icrc, 1);
    c.dev.receive(&sent, Duration::ZERO);
    // The real one reaches the responder (whose R_Key check is c's business, not the ICRC's).
    let s = c.dev.stats();
    assert_eq!((s.rx_packets, s.rx_dropped, s.rx_bad_icrc), (2, 1, 1));
}
