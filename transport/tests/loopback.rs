//! Two soft-RoCE devices over the in-memory link, with and without injected faults.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use rtgt_transport::netdev::fault::{FaultConfig, FaultInjector};
use rtgt_transport::netdev::loopback;
use rtgt_transport::netdev::NetDev;
use rtgt_transport::sim::Fabric;
use rtgt_transport::verbs::*;

struct Side {
    dev: Device,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    region: Arc<Region>,
    mr: Mr,
}

struct Pair {
    fab: Fabric,
    a: Side,
    b: Side,
}

const BUF: usize = 16 << 20;

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

fn side(name: &str, addr: IpAddr, buf: usize) -> (Device, Pd, Cq, Qp, Arc<Region>, Mr) {
    let dev = Device::new(DeviceConfig::new(name, vec![addr])).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let mut init = QpInitAttr::new(QpType::Rc, &cq, &cq);
    init.cap.max_send_wr = 256;
    init.cap.max_recv_wr = 256;
    let qp = pd.create_qp(init).unwrap();
    let region = Arc::new(Region::zeroed(buf));
    let access =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = pd.reg_mr(region.clone(), access).unwrap();
    (dev, pd, cq, qp, region, mr)
}

fn connect_qp(qp: &Qp, remote: IpAddr, dest_qpn: u32, mtu: Mtu, sq_psn: u32, rq_psn: u32) {
    qp.to_init(
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
    )
    .unwrap();
    qp.to_rts(&RcPath {
        mtu,
        ..RcPath::new(remote, dest_qpn, rq_psn, sq_psn)
    })
    .unwrap();
}

fn pair_with(
    mtu: Mtu,
    faults: Option<(FaultConfig, u64)>,
    psn_a: u32,
    psn_b: u32,
    buf: usize,
) -> Pair {
    let (da, pda, cqa, qpa, ra, mra) = side("a", ip(1), buf);
    let (db, pdb, cqb, qpb, rb, mrb) = side("b", ip(2), buf);
    connect_qp(&qpa, ip(2), qpb.qpn(), mtu, psn_a, psn_b);
    connect_qp(&qpb, ip(1), qpa.qpn(), mtu, psn_b, psn_a);
    let (la, lb) = loopback::pair(1 << 16);
    let mut fab = Fabric::new();
    let (na, nb): (Box<dyn NetDev>, Box<dyn NetDev>) = match faults {
        Some((cfg, seed)) => (
            Box::new(FaultInjector::new(la, cfg, seed)),
            Box::new(FaultInjector::new(lb, cfg, seed.wrapping_mul(31) + 1)),
        ),
        None => (Box::new(la), Box::new(lb)),
    };
    fab.add(da.clone(), na);
    fab.add(db.clone(), nb);
    Pair {
        fab,
        a: Side {
            dev: da,
            pd: pda,
            cq: cqa,
            qp: qpa,
            region: ra,
            mr: mra,
        },
        b: Side {
            dev: db,
            pd: pdb,
            cq: cqb,
            qp: qpb,
            region: rb,
            mr: mrb,
        },
    }
}

fn pair(mtu: Mtu) -> Pair {
    pair_with(mtu, None, 100, 5000, BUF)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

/// Runs until `cq` has `n` completions, and returns them.
fn wait(fab: &mut Fabric, cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    let ok = fab.run_until(2_000_000, || {
        cq.poll_into(&mut got, 64);
        got.len() >= n
    });
    assert!(
        ok,
        "only {} of {n} completions (last {:?}) at {:?}",
        got.len(),
        got.last(),
        fab.now
    );
    got
}

fn send_wr(id: u64, op: SendOp, sge: Sge) -> SendWr {
    SendWr::new(id, op, vec![sge])
}

fn post_recv(s: &Side, id: u64, off: usize, len: u32) {
    s.qp.post_recv(RecvWr {
        wr_id: id,
        sg_list: s.mr.sge(off, len).into(),
    })
    .unwrap();
}

fn check_send(p: &mut Pair, len: usize) {
    let data = pattern(len, len as u8);
    p.a.region.write(0, &data);
    post_recv(&p.b, 7, 0, BUF as u32);
    p.a.qp
        .post_send(send_wr(1, SendOp::Send, p.a.mr.sge(0, len as u32)))
        .unwrap();
    let wb = wait(&mut p.fab, &p.b.cq, 1);
    assert_eq!(wb[0].status, WcStatus::Success);
    assert_eq!(wb[0].byte_len as usize, len);
    let wa = wait(&mut p.fab, &p.a.cq, 1);
    assert_eq!(wa[0].status, WcStatus::Success, "{wa:?}");
    let mut got = vec![0u8; len];
    p.b.region.read(0, &mut got);
    assert!(got == data, "SEND of {len} bytes corrupted");
}

fn check_write(p: &mut Pair, len: usize) {
    let data = pattern(len, 3);
    p.a.region.write(0, &data);
    let op = SendOp::RdmaWrite {
        remote_addr: p.b.mr.iova() + 64,
        rkey: p.b.mr.rkey(),
    };
    p.a.qp
        .post_send(send_wr(2, op, p.a.mr.sge(0, len as u32)))
        .unwrap();
    let wa = wait(&mut p.fab, &p.a.cq, 1);
    assert_eq!(wa[0].status, WcStatus::Success, "{wa:?}");
    assert_eq!(wa[0].opcode, WcOpcode::RdmaWrite);
    let mut got = vec![0u8; len];
    p.b.region.read(64, &mut got);
    assert!(got == data, "WRITE of {len} bytes corrupted");
}

fn check_read(p: &mut Pair, len: usize) {
    let data = pattern(len, 9);
    p.b.region.write(128, &data);
    let op = SendOp::RdmaRead {
        remote_addr: p.b.mr.iova() + 128,
        rkey: p.b.mr.rkey(),
    };
    p.a.qp
        .post_send(send_wr(3, op, p.a.mr.sge(8, len as u32)))
        .unwrap();
    let wa = wait(&mut p.fab, &p.a.cq, 1);
    assert_eq!(wa[0].status, WcStatus::Success, "{wa:?}");
    assert_eq!(wa[0].opcode, WcOpcode::RdmaRead);
    let mut got = vec![0u8; len];
    p.a.region.read(8, &mut got);
    assert!(got == data, "READ of {len} bytes corrupted");
}

#[test]
fn send_recv_sizes_and_mtus() {
    for mtu in [Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096] {
        let mut p = pair(mtu);
        for len in [0usize, 1, 3, 255, 256, 257, mtu.bytes() * 3, 100_000] {
            check_send(&mut p, len);
        }
    }
}

#[test]
fn write_and_read_sizes() {
    for mtu in [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu2048, Mtu::Mtu4096] {
        let mut p = pair(mtu);
        for len in [1usize, 2, 4095, 4096, 4097, 65_537] {
            check_write(&mut p, len);
            check_read(&mut p, len);
        }
    }
}

#[test]
fn eight_mib_messages() {
    for mtu in [Mtu::Mtu256, Mtu::Mtu4096] {
        let mut p = pair(mtu);
        check_write(&mut p, 8 << 20);
        check_read(&mut p, 8 << 20);
        check_send(&mut p, 8 << 20);
    }
}

#[test]
fn psn_wrap() {
    let mut p = pair_with(Mtu::Mtu256, None, 0xFF_FFF0, 0xFF_FFFE, BUF);
    check_write(&mut p, 10_000);
    check_read(&mut p, 10_000);
    check_send(&mut p, 10_000);
    let (_, _, _, sq, _) = p.a.qp.query().unwrap();
    assert!(sq < 0x1000, "PSN wrapped: {sq:#x}");
    let (attr, cap) = p.b.qp.attr().unwrap();
    assert_eq!(
        (attr.qp_state, attr.path_mtu),
        (Some(QpState::Rts), Some(Mtu::Mtu256))
    );
    assert!(attr.rq_psn < 0x1000 && cap.max_send_wr == 256);
}

#[test]
fn atomics() {
    let mut p = pair(Mtu::Mtu1024);
    let base = (8 - (p.b.region.addr() % 8) as usize) % 8 + 256;
    p.b.region.write(base, &40u64.to_ne_bytes());
    let remote_addr = p.b.mr.iova() + base as u64;
    let rkey = p.b.mr.rkey();
    let la = (8 - (p.a.region.addr() % 8) as usize) % 8;
    p.a.qp
        .post_send(send_wr(
            1,
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add: 2,
            },
            p.a.mr.sge(la, 8),
        ))
        .unwrap();
    p.a.qp
        .post_send(send_wr(
            2,
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare: 42,
                swap: 7,
            },
            p.a.mr.sge(la + 8, 8),
        ))
        .unwrap();
    p.a.qp
        .post_send(send_wr(
            3,
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare: 42,
                swap: 9,
            },
            p.a.mr.sge(la + 16, 8),
        ))
        .unwrap();
    let wc = wait(&mut p.fab, &p.a.cq, 3);
    assert!(wc.iter().all(|w| w.status == WcStatus::Success), "{wc:?}");
    let v = |r: &Region, off| {
        let mut b = [0u8; 8];
        r.read(off, &mut b);
        u64::from_ne_bytes(b)
    };
    assert_eq!(v(&p.a.region, la), 40);
    assert_eq!(v(&p.a.region, la + 8), 42);
    assert_eq!(v(&p.a.region, la + 16), 7);
    assert_eq!(v(&p.b.region, base), 7);
    // Misaligned atomic requests are refused at post time.
    let bad = send_wr(
        4,
        SendOp::FetchAdd {
            remote_addr: remote_addr + 1,
            rkey,
            add: 1,
        },
        p.a.mr.sge(la, 8),
    );
    assert!(p.a.qp.post_send(bad).is_err());
}

#[test]
fn immediate_and_invalidate() {
    let mut p = pair(Mtu::Mtu1024);
    // SEND with immediate, solicited.
    post_recv(&p.b, 10, 0, 4096);
    let mut wr = send_wr(1, SendOp::SendWithImm(0xdead_beef), p.a.mr.sge(0, 100));
    wr.flags |= SendFlags::SOLICITED;
    p.b.cq.req_notify(NotifyKind::Solicited);
    p.a.qp.post_send(wr).unwrap();
    let wb = wait(&mut p.fab, &p.b.cq, 1);
    assert_eq!(wb[0].flags, WcFlags::WITH_IMM);
    assert_eq!(wb[0].imm_or_inv, 0xdead_beef);
    assert_eq!(p.b.cq.event_count(), 1);
    wait(&mut p.fab, &p.a.cq, 1);

    // RDMA WRITE with immediate consumes a receive WQE.
    post_recv(&p.b, 11, 0, 0);
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: p.b.mr.iova(),
        rkey: p.b.mr.rkey(),
        imm: 5,
    };
    p.a.qp
        .post_send(send_wr(2, op, p.a.mr.sge(0, 5000)))
        .unwrap();
    let wb = wait(&mut p.fab, &p.b.cq, 1);
    assert_eq!(
        (wb[0].opcode, wb[0].imm_or_inv),
        (WcOpcode::RecvRdmaWithImm, 5)
    );
    wait(&mut p.fab, &p.a.cq, 1);

    // Fast-register an MR on B, then invalidate it remotely with SEND with Invalidate.
    let frmr = p.b.pd.alloc_mr(1 << 20).unwrap();
    let key = frmr.key_with_variant(0x42);
    let fr = FastReg {
        key,
        region: p.b.region.clone(),
        offset: 1 << 20,
        length: 4096,
        iova: 0x7000_0000,
        access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    };
    p.b.qp
        .post_send(SendWr::new(20, SendOp::FastReg(fr), vec![]))
        .unwrap();
    let wb = wait(&mut p.fab, &p.b.cq, 1);
    assert_eq!(
        (wb[0].opcode, wb[0].status),
        (WcOpcode::RegMr, WcStatus::Success)
    );
    let op = SendOp::RdmaWrite {
        remote_addr: 0x7000_0010,
        rkey: key,
    };
    p.a.region.write(0, b"through the fast-registered key");
    p.a.qp.post_send(send_wr(3, op, p.a.mr.sge(0, 31))).unwrap();
    let wa = wait(&mut p.fab, &p.a.cq, 1);
    assert_eq!(wa[0].status, WcStatus::Success);
    let mut got = [0u8; 31];
    p.b.region.read((1 << 20) + 0x10, &mut got);
    assert_eq!(&got, b"through the fast-registered key");

    post_recv(&p.b, 12, 0, 4096);
    p.a.qp
        .post_send(send_wr(4, SendOp::SendWithInv(key), p.a.mr.sge(0, 8)))
        .unwrap();
    let wb = wait(&mut p.fab, &p.b.cq, 1);
    assert_eq!(wb[0].flags, WcFlags::WITH_INVALIDATE);
    assert_eq!(wb[0].imm_or_inv, key);
    wait(&mut p.fab, &p.a.cq, 1);

    // The invalidated key is now refused: NAK 0x62, REM_ACCESS_ERR, both QPs in error.
    p.a.qp
        .post_send(send_wr(
            5,
            SendOp::RdmaWrite {
                remote_addr: 0x7000_0000,
                rkey: key,
            },
            p.a.mr.sge(0, 8),
        ))
        .unwrap();
    let wa = wait(&mut p.fab, &p.a.cq, 1);
    assert_eq!(wa[0].status, WcStatus::RemAccessErr);
    assert_eq!(p.b.qp.state(), QpState::Err);
}

#[test]
fn local_invalidate() {
    let mut p = pair(Mtu::Mtu1024);
    let frmr = p.a.pd.alloc_mr(4096).unwrap();
    let key = frmr.key_with_variant(1);
    let fr = FastReg {
        key,
        region: p.a.region.clone(),
        offset: 0,
        length: 4096,
        iova: 0x1000,
        access: Access::LOCAL_WRITE,
    };
    p.a.qp
        .post_send(SendWr::new(1, SendOp::FastReg(fr), vec![]))
        .unwrap();
    p.a.qp
        .post_send(SendWr::new(2, SendOp::LocalInv { key }, vec![]))
        .unwrap();
    let wc = wait(&mut p.fab, &p.a.cq, 2);
    assert_eq!(wc[1].opcode, WcOpcode::LocalInv);
    assert!(wc.iter().all(|w| w.status == WcStatus::Success));
    // The key no longer passes the post-time L_Key check.
    let wr = SendWr::new(
        3,
        SendOp::Send,
        vec![Sge {
            addr: 0x1000,
            length: 8,
            lkey: key,
        }],
    );
    assert_eq!(
        p.a.qp.post_send(wr).unwrap_err(),
        VerbsError::InvalidLkey(key)
    );
}

#[test]
fn rnr_then_receive_posted() {
    let mut p = pair(Mtu::Mtu1024);
    p.a.region.write(0, b"hello");
    p.a.qp
        .post_send(send_wr(1, SendOp::Send, p.a.mr.sge(0, 5)))
        .unwrap();
    // No receive posted: the responder sends RNR NAKs, the requester keeps retrying.
    for _ in 0..50 {
        p.fab.step();
    }
    assert!(p.b.dev.stats().rnr_naks_sent >= 1);
    assert!(p.a.cq.is_empty());
    post_recv(&p.b, 9, 0, 64);
    let wb = wait(&mut p.fab, &p.b.cq, 1);
    assert_eq!((wb[0].status, wb[0].byte_len), (WcStatus::Success, 5));
    let wa = wait(&mut p.fab, &p.a.cq, 1);
    assert_eq!(wa[0].status, WcStatus::Success);
}

#[test]
fn rnr_retry_exhausted() {
    let mut p = pair(Mtu::Mtu1024);
    let attr = QpAttr {
        qp_state: Some(QpState::Rts),
        ..Default::default()
    };
    // rnr_retry cannot be changed in RTS; build a fresh pair with rnr_retry 1 through SQD.
    p.a.qp
        .modify(
            &QpAttr {
                qp_state: Some(QpState::Sqd),
                ..Default::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    let mut sqd = attr.clone();
    sqd.qp_state = Some(QpState::Sqd);
    sqd.rnr_retry = 1;
    p.a.qp
        .modify(&sqd, QpAttrMask::STATE | QpAttrMask::RNR_RETRY)
        .unwrap();
    p.a.qp.modify(&attr, QpAttrMask::STATE).unwrap();
    p.a.qp
        .post_send(send_wr(1, SendOp::Send, p.a.mr.sge(0, 5)))
        .unwrap();
    p.a.qp
        .post_send(send_wr(2, SendOp::Send, p.a.mr.sge(0, 5)))
        .unwrap();
    let wa = wait(&mut p.fab, &p.a.cq, 2);
    assert_eq!(wa[0].status, WcStatus::RnrRetryExcErr);
    assert_eq!(wa[1].status, WcStatus::WrFlushErr);
    assert_eq!(p.a.qp.state(), QpState::Err);
}

#[test]
fn bad_rkey_is_remote_access_error() {
    let mut p = pair(Mtu::Mtu1024);
    post_recv(&p.b, 50, 0, 64);
    post_recv(&p.b, 51, 64, 64);
    let op = SendOp::RdmaWrite {
        remote_addr: p.b.mr.iova(),
        rkey: p.b.mr.rkey() ^ 0x100,
    };
    p.a.qp.post_send(send_wr(1, op, p.a.mr.sge(0, 16))).unwrap();
    p.a.qp
        .post_send(send_wr(2, SendOp::Send, p.a.mr.sge(0, 16)))
        .unwrap();
    let wa = wait(&mut p.fab, &p.a.cq, 2);
    assert_eq!(wa[0].status, WcStatus::RemAccessErr);
    assert_eq!(wa[1].status, WcStatus::WrFlushErr);
    assert_eq!(p.a.qp.state(), QpState::Err);
    let wb = wait(&mut p.fab, &p.b.cq, 2);
    assert!(
        wb.iter().all(|w| w.status == WcStatus::WrFlushErr),
        "{wb:?}"
    );
    assert_eq!(p.b.qp.state(), QpState::Err);
    assert!(p.b.dev.stats().naks_sent >= 1);
    // Out-of-bounds READ is a remote access error too.
    let mut p = pair(Mtu::Mtu1024);
    let op = SendOp::RdmaRead {
        remote_addr: p.b.mr.iova() + BUF as u64 - 4,
        rkey: p.b.mr.rkey(),
    };
    p.a.qp.post_send(send_wr(1, op, p.a.mr.sge(0, 16))).unwrap();
    let wa = wait(&mut p.fab, &p.a.cq, 1);
    assert_eq!(wa[0].status, WcStatus::RemAccessErr);
}

#[test]
fn flush_on_error_and_post_in_error() {
    let p = pair(Mtu::Mtu1024);
    post_recv(&p.a, 1, 0, 16);
    post_recv(&p.a, 2, 0, 16);
    p.a.qp
        .modify(
            &QpAttr {
                qp_state: Some(QpState::Err),
                ..Default::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    let wc = p.a.cq.poll(8);
    assert_eq!(
        wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
    p.a.qp
        .post_send(send_wr(3, SendOp::Send, p.a.mr.sge(0, 4)))
        .unwrap();
    assert_eq!(p.a.cq.poll(8)[0].status, WcStatus::WrFlushErr);
    p.a.qp
        .modify(
            &QpAttr {
                qp_state: Some(QpState::Reset),
                ..Default::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    assert_eq!(p.a.qp.state(), QpState::Reset);
    assert!(p
        .a
        .qp
        .post_send(send_wr(4, SendOp::Send, p.a.mr.sge(0, 4)))
        .is_err());
}

#[test]
fn post_validation() {
    let p = pair(Mtu::Mtu1024);
    let qp = &p.a.qp;
    let many: Vec<_> = (0..5).map(|i| p.a.mr.sge(i * 8, 8)).collect();
    assert_eq!(
        qp.post_send(SendWr::new(1, SendOp::Send, many))
            .unwrap_err(),
        VerbsError::TooManySge
    );
    let bad = Sge {
        addr: p.a.mr.iova(),
        length: 8,
        lkey: 0x0012_3456,
    };
    assert!(matches!(
        qp.post_send(SendWr::new(1, SendOp::Send, vec![bad])),
        Err(VerbsError::InvalidLkey(_))
    ));
    let oob = Sge {
        addr: p.a.mr.iova() + BUF as u64,
        length: 8,
        lkey: p.a.mr.lkey(),
    };
    assert!(qp
        .post_send(SendWr::new(1, SendOp::Send, vec![oob]))
        .is_err());
    let mut inl = SendWr::new(1, SendOp::Send, vec![]);
    inl.flags |= SendFlags::INLINE;
    inl.inline_data = vec![0; 65];
    assert_eq!(
        qp.post_send(inl.clone()).unwrap_err(),
        VerbsError::InlineTooLarge
    );
    inl.inline_data.truncate(64);
    qp.post_send(inl).unwrap();
    let ah =
        p.a.dev
            .create_ah(&p.a.pd, AddressVector::new(ip(2)))
            .unwrap();
    let mut ud = SendWr::new(1, SendOp::Send, vec![]);
    ud.ud = Some(UdDest {
        ah,
        remote_qpn: 5,
        remote_qkey: 1,
    });
    assert!(qp.post_send(ud).is_err());
    let big = p.a.mr.sge(0, (9 << 20) as u32);
    assert_eq!(
        qp.post_send(SendWr::new(1, SendOp::Send, vec![big]))
            .unwrap_err(),
        VerbsError::MessageTooLong
    );
    for i in 0..255 {
        qp.post_send(SendWr::new(i, SendOp::Send, vec![])).unwrap();
    }
    assert_eq!(
        qp.post_send(SendWr::new(1, SendOp::Send, vec![]))
            .unwrap_err(),
        VerbsError::QueueFull
    );
}

#[test]
fn device_attributes_and_gids() {
    let v6: IpAddr = "fd00::5".parse().unwrap();
    let dev = Device::new(DeviceConfig::new("d", vec![ip(7), v6])).unwrap();
    assert_eq!(
        dev.gid(0).unwrap().0,
        Ipv4Addr::new(10, 0, 0, 7).to_ipv6_mapped().octets()
    );
    assert_eq!(dev.gid(0).unwrap().to_ip(), ip(7));
    assert_eq!(dev.gid(1).unwrap().to_ip(), v6);
    assert_eq!(dev.gid_index(v6), Some(1));
    let a = dev.attr();
    assert_eq!(
        (a.max_qp_rd_atom, a.max_send_sge, a.atomic_cap),
        (128, 32, AtomicCap::Hca)
    );
    assert_eq!(dev.port_attr(1).unwrap().active_mtu, Mtu::Mtu4096);
    assert!(dev.port_attr(2).is_err());
    let start = dev.live_qps();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let q1 = pd.create_qp(QpInitAttr::new(QpType::Rc, &cq, &cq)).unwrap();
    let gsi = pd
        .create_qp(QpInitAttr::new(QpType::Gsi, &cq, &cq))
        .unwrap();
    assert_eq!(gsi.qpn(), 1);
    assert!(pd
        .create_qp(QpInitAttr::new(QpType::Gsi, &cq, &cq))
        .is_err());
    assert_eq!(dev.live_qps(), start + 2);
    drop(q1);
    drop(gsi);
    assert_eq!(dev.live_qps(), start);
    // A transition with a missing required attribute fails.
    let q = pd.create_qp(QpInitAttr::new(QpType::Rc, &cq, &cq)).unwrap();
    let e = q.modify(
        &QpAttr {
            qp_state: Some(QpState::Init),
            ..Default::default()
        },
        QpAttrMask::STATE,
    );
    assert!(matches!(e, Err(VerbsError::InvalidTransition { .. })));
}

#[test]
fn srq_shared_by_two_qps() {
    let mut p = pair(Mtu::Mtu1024);
    let srq = p.b.pd.create_srq(64, 4).unwrap();
    let mut init = QpInitAttr::new(QpType::Rc, &p.b.cq, &p.b.cq);
    init.srq = Some(srq.clone());
    let qb2 = p.b.pd.create_qp(init).unwrap();
    let cqa2 = p.a.dev.create_cq(64).unwrap();
    let qa2 =
        p.a.pd
            .create_qp(QpInitAttr::new(QpType::Rc, &cqa2, &cqa2))
            .unwrap();
    connect_qp(&qa2, ip(2), qb2.qpn(), Mtu::Mtu1024, 1, 2);
    connect_qp(&qb2, ip(1), qa2.qpn(), Mtu::Mtu1024, 2, 1);
    for i in 0..4 {
        srq.post_recv(RecvWr {
            wr_id: 100 + i,
            sg_list: p.b.mr.sge(i as usize * 4096, 4096).into(),
        })
        .unwrap();
    }
    assert!(qb2
        .post_recv(RecvWr {
            wr_id: 1,
            sg_list: Default::default()
        })
        .is_err());
    p.a.region.write(0, b"via srq");
    qa2.post_send(send_wr(1, SendOp::Send, p.a.mr.sge(0, 7)))
        .unwrap();
    let wb = wait(&mut p.fab, &p.b.cq, 1);
    assert_eq!((wb[0].wr_id, wb[0].qp_num), (100, qb2.qpn()));
    assert_eq!(srq.len(), 3);
    srq.set_limit(3);
    qa2.post_send(send_wr(2, SendOp::Send, p.a.mr.sge(0, 7)))
        .unwrap();
    wait(&mut p.fab, &p.b.cq, 1);
    assert_eq!(
        p.b.dev.events().poll(),
        Some(AsyncEvent::SrqLimitReached { srq: srq.id() })
    );
}

#[test]
fn ud_and_gsi() {
    let (da, pda, cqa, _, ra, mra) = side("a", ip(1), 1 << 16);
    let (db, pdb, cqb, _, rb, mrb) = side("b", ip(2), 1 << 16);
    let ga = pda
        .create_qp(QpInitAttr::new(QpType::Gsi, &cqa, &cqa))
        .unwrap();
    let gb = pdb
        .create_qp(QpInitAttr::new(QpType::Gsi, &cqb, &cqb))
        .unwrap();
    for q in [&ga, &gb] {
        let a = QpAttr {
            qp_state: Some(QpState::Init),
            qkey: GSI_QKEY,
            ..Default::default()
        };
        q.modify(
            &a,
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::QKEY,
        )
        .unwrap();
        q.modify(
            &QpAttr {
                qp_state: Some(QpState::Rtr),
                ..Default::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
        q.modify(
            &QpAttr {
                qp_state: Some(QpState::Rts),
                sq_psn: 0,
                ..Default::default()
            },
            QpAttrMask::STATE | QpAttrMask::SQ_PSN,
        )
        .unwrap();
    }
    gb.post_recv(RecvWr {
        wr_id: 1,
        sg_list: mrb.sge(0, 40 + 256).into(),
    })
    .unwrap();
    ra.write(0, &[0x01; 256]);
    let ah = da.create_ah(&pda, AddressVector::new(ip(2))).unwrap();
    let mut wr = SendWr::new(9, SendOp::Send, vec![mra.sge(0, 256)]);
    wr.ud = Some(UdDest {
        ah,
        remote_qpn: 1,
        remote_qkey: GSI_QKEY,
    });
    ga.post_send(wr).unwrap();
    let (la, lb) = loopback::pair(64);
    let mut fab = Fabric::new();
    fab.add(da.clone(), Box::new(la));
    fab.add(db.clone(), Box::new(lb));
    let wb = wait(&mut fab, &cqb, 1);
    assert_eq!(wb[0].status, WcStatus::Success);
    assert_eq!((wb[0].byte_len, wb[0].src_qp), (296, 1));
    assert_eq!(wb[0].src_addr, Some(ip(1)));
    let mut grh = [0u8; 40];
    rb.read(0, &mut grh);
    assert_eq!(
        grh[20] >> 4,
        4,
        "IPv4 header in the last 20 bytes of the GRH"
    );
    let mut payload = [0u8; 256];
    rb.read(40, &mut payload);
    assert_eq!(payload, [0x01; 256]);
    assert_eq!(wait(&mut fab, &cqa, 1)[0].status, WcStatus::Success);
}

fn faulty(percent: f64, seed: u64, mtu: Mtu) -> Pair {
    let cfg = FaultConfig::uniform(percent);
    pair_with(mtu, Some((cfg, seed)), 0xFF_FF00, 77, BUF)
}

#[test]
fn faults_send_write_read() {
    for (seed, mtu) in [(1u64, Mtu::Mtu256), (2, Mtu::Mtu1024), (3, Mtu::Mtu4096)] {
        let mut p = faulty(1.0, seed, mtu);
        for len in [1usize, 5000, 300_000] {
            check_send(&mut p, len);
            check_write(&mut p, len);
            check_read(&mut p, len);
        }
        assert!(p.a.dev.stats().retransmits + p.b.dev.stats().retransmits > 0);
    }
}

#[test]
fn faults_large_and_mixed_pipeline() {
    let mut p = faulty(1.0, 42, Mtu::Mtu1024);
    check_write(&mut p, 4 << 20);
    check_read(&mut p, 4 << 20);
    // A pipeline of mixed operations, all outstanding at once.
    let n = 40usize;
    let chunk = 20_000usize;
    let src = pattern(n * chunk, 77);
    p.a.region.write(0, &src);
    p.b.region.write(8 << 20, &src);
    for i in (0..n).step_by(3) {
        post_recv(&p.b, i as u64, (4 << 20) + i * chunk, chunk as u32);
    }
    for i in 0..n {
        let sge = p.a.mr.sge(i * chunk, chunk as u32);
        let op = match i % 3 {
            0 => SendOp::Send,
            1 => SendOp::RdmaWrite {
                remote_addr: p.b.mr.iova() + (2 << 20) as u64 + (i * chunk) as u64,
                rkey: p.b.mr.rkey(),
            },
            _ => SendOp::RdmaRead {
                remote_addr: p.b.mr.iova() + (8 << 20) as u64 + (i * chunk) as u64,
                rkey: p.b.mr.rkey(),
            },
        };
        let sge = if i % 3 == 2 {
            p.a.mr.sge((12 << 20) + i * chunk, chunk as u32)
        } else {
            sge
        };
        p.a.qp.post_send(send_wr(i as u64, op, sge)).unwrap();
    }
    let wa = wait(&mut p.fab, &p.a.cq, n);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    assert_eq!(
        wa.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (0..n as u64).collect::<Vec<_>>()
    );
    let wb = wait(&mut p.fab, &p.b.cq, n.div_ceil(3));
    assert!(wb.iter().all(|w| w.status == WcStatus::Success));
    for i in 0..n {
        let want = &src[i * chunk..(i + 1) * chunk];
        let mut got = vec![0u8; chunk];
        match i % 3 {
            0 => p.b.region.read((4 << 20) + i * chunk, &mut got),
            1 => p.b.region.read((2 << 20) + i * chunk, &mut got),
            _ => p.a.region.read((12 << 20) + i * chunk, &mut got),
        };
        assert!(got == want, "op {i} corrupted");
    }
}

#[test]
fn faults_atomics_exactly_once() {
    let mut p = faulty(2.0, 9, Mtu::Mtu1024);
    let base = (8 - (p.b.region.addr() % 8) as usize) % 8;
    let la = (8 - (p.a.region.addr() % 8) as usize) % 8;
    let remote_addr = p.b.mr.iova() + base as u64;
    for i in 0..100u64 {
        let op = SendOp::FetchAdd {
            remote_addr,
            rkey: p.b.mr.rkey(),
            add: 1,
        };
        p.a.qp
            .post_send(send_wr(i, op, p.a.mr.sge(la + 8 * (i as usize % 64), 8)))
            .unwrap();
        if i % 32 == 31 {
            let mut got = Vec::new();
            let cq = p.a.cq.clone();
            let ok = p.fab.run_until(200_000, || {
                cq.poll_into(&mut got, 64);
                got.len() >= 32
            });
            assert!(
                ok,
                "stuck at {} now={:?}\nA {}\nB {}",
                got.len(),
                p.fab.now,
                p.a.qp.debug_state(),
                p.b.qp.debug_state()
            );
        }
    }
    wait(&mut p.fab, &p.a.cq, 4);
    let mut b = [0u8; 8];
    p.b.region.read(base, &mut b);
    assert_eq!(
        u64::from_ne_bytes(b),
        100,
        "duplicates must replay, not re-execute"
    );
}

#[test]
fn ipv6_rc() {
    let a6: IpAddr = "fd00::1".parse().unwrap();
    let b6: IpAddr = "fd00::2".parse().unwrap();
    let (da, pda, cqa, qpa, ra, mra) = side("a", a6, 1 << 20);
    let (db, pdb, cqb, qpb, rb, mrb) = side("b", b6, 1 << 20);
    connect_qp(&qpa, b6, qpb.qpn(), Mtu::Mtu2048, 1, 2);
    connect_qp(&qpb, a6, qpa.qpn(), Mtu::Mtu2048, 2, 1);
    let (la, lb) = loopback::pair(1 << 12);
    let mut fab = Fabric::new();
    fab.add(da.clone(), Box::new(la));
    fab.add(db.clone(), Box::new(lb));
    let mut p = Pair {
        fab,
        a: Side {
            dev: da,
            pd: pda,
            cq: cqa,
            qp: qpa,
            region: ra,
            mr: mra,
        },
        b: Side {
            dev: db,
            pd: pdb,
            cq: cqb,
            qp: qpb,
            region: rb,
            mr: mrb,
        },
    };
    // BUF-sized receives do not fit this smaller region; use direct operations.
    check_write(&mut p, 100_000);
    check_read(&mut p, 100_000);
}

#[test]
fn sqd_drains_and_resumes() {
    let mut p = pair(Mtu::Mtu1024);
    p.a.qp
        .post_send(send_wr(
            1,
            SendOp::RdmaWrite {
                remote_addr: p.b.mr.iova(),
                rkey: p.b.mr.rkey(),
            },
            p.a.mr.sge(0, 50_000),
        ))
        .unwrap();
    p.fab.step();
    let sqd = QpAttr {
        qp_state: Some(QpState::Sqd),
        en_sqd_async_notify: true,
        ..Default::default()
    };
    p.a.qp
        .modify(&sqd, QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY)
        .unwrap();
    p.a.qp
        .post_send(send_wr(
            2,
            SendOp::RdmaWrite {
                remote_addr: p.b.mr.iova(),
                rkey: p.b.mr.rkey(),
            },
            p.a.mr.sge(0, 8),
        ))
        .unwrap();
    // The message in progress finishes; the new one waits for RTS.
    let wc = wait(&mut p.fab, &p.a.cq, 1);
    assert_eq!(wc[0].wr_id, 1);
    for _ in 0..20 {
        p.fab.step();
    }
    assert!(p.a.cq.is_empty());
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        ..Default::default()
    };
    p.a.qp.modify(&rts, QpAttrMask::STATE).unwrap();
    assert_eq!(wait(&mut p.fab, &p.a.cq, 1)[0].wr_id, 2);
}

#[test]
fn cq_overflow_raises_event() {
    let mut p = pair(Mtu::Mtu1024);
    let small = p.a.dev.create_cq(2).unwrap();
    let qp =
        p.a.pd
            .create_qp(QpInitAttr::new(QpType::Rc, &small, &small))
            .unwrap();
    connect_qp(&qp, ip(2), p.b.qp.qpn(), Mtu::Mtu1024, 1, 1);
    for i in 0..4 {
        post_recv(&p.a, i, 0, 8);
        qp.post_recv(RecvWr {
            wr_id: i,
            sg_list: p.a.mr.sge(0, 8).into(),
        })
        .unwrap();
    }
    qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Err),
            ..Default::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    assert!(small.is_error());
    assert_eq!(
        p.a.dev.events().poll(),
        Some(AsyncEvent::CqError { cq: small.id() })
    );
    p.fab.step();
    let cqs = p.a.dev.live_cqs();
    drop(qp);
    drop(small);
    assert_eq!(p.a.dev.live_cqs(), cqs - 1);
}

/// Many seeds and heavier faults: a few by default, more with `SOAK_SEEDS=3000`.
#[test]
fn fault_soak() {
    let seeds: u64 = std::env::var("SOAK_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    for seed in 0..seeds {
        let mtu = [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ][seed as usize % 5];
        let pct = [0.5, 1.0, 3.0, 5.0][seed as usize % 4];
        let mut p = pair_with(
            mtu,
            Some((FaultConfig::uniform(pct), seed * 7 + 1)),
            0xFF_FFF0 - seed as u32,
            seed as u32,
            BUF,
        );
        let n = 24usize;
        let chunk = 1000 + (seed as usize * 7919) % 60_000;
        let src = pattern(n * chunk, seed as u8);
        p.a.region.write(0, &src);
        p.b.region.write(8 << 20, &src);
        for i in (0..n).step_by(4) {
            post_recv(&p.b, i as u64, (4 << 20) + i * chunk, chunk as u32);
        }
        let base = (8 - (p.b.region.addr() % 8) as usize) % 8 + (15 << 20);
        let la = (8 - (p.a.region.addr() % 8) as usize) % 8 + (15 << 20);
        for i in 0..n {
            let (op, sge) = match i % 4 {
                0 => (SendOp::Send, p.a.mr.sge(i * chunk, chunk as u32)),
                1 => (
                    SendOp::RdmaWrite {
                        remote_addr: p.b.mr.iova() + (2 << 20) as u64 + (i * chunk) as u64,
                        rkey: p.b.mr.rkey(),
                    },
                    p.a.mr.sge(i * chunk, chunk as u32),
                ),
                2 => (
                    SendOp::RdmaRead {
                        remote_addr: p.b.mr.iova() + (8 << 20) as u64 + (i * chunk) as u64,
                        rkey: p.b.mr.rkey(),
                    },
                    p.a.mr.sge((10 << 20) + i * chunk, chunk as u32),
                ),
                _ => (
                    SendOp::FetchAdd {
                        remote_addr: p.b.mr.iova() + base as u64,
                        rkey: p.b.mr.rkey(),
                        add: 1,
                    },
                    p.a.mr.sge(la + 8 * i, 8),
                ),
            };
            p.a.qp.post_send(send_wr(i as u64, op, sge)).unwrap();
        }
        let mut got = Vec::new();
        let cq = p.a.cq.clone();
        let ok = p.fab.run_until(3_000_000, || {
            cq.poll_into(&mut got, 64);
            got.len() >= n
        });
        assert!(
            ok,
            "seed {seed}: stuck at {} now={:?}\nA {}\nB {}",
            got.len(),
            p.fab.now,
            p.a.qp.debug_state(),
            p.b.qp.debug_state()
        );
        assert!(
            got.iter().all(|w| w.status == WcStatus::Success),
            "seed {seed}: {got:?}"
        );
        for i in 0..n {
            let want = &src[i * chunk..(i + 1) * chunk];
            let mut g = vec![0u8; chunk];
            match i % 4 {
                0 => p.b.region.read((4 << 20) + i * chunk, &mut g),
                1 => p.b.region.read((2 << 20) + i * chunk, &mut g),
                2 => p.a.region.read((10 << 20) + i * chunk, &mut g),
                _ => continue,
            };
            assert!(g == want, "seed {seed}: op {i} corrupted");
        }
        let mut b = [0u8; 8];
        p.b.region.read(base, &mut b);
        assert_eq!(
            u64::from_ne_bytes(b),
            (n / 4) as u64,
            "seed {seed}: atomics"
        );
    }
}

/// The async runner over the loopback (and a fault injector), consumers awaiting their CQs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_runner_over_faulty_loopback() {
    use rtgt_transport::netdev::run;
    let (da, _pda, cqa, qpa, ra, mra) = side("a", ip(1), 1 << 22);
    let (db, _pdb, cqb, qpb, rb, mrb) = side("b", ip(2), 1 << 22);
    connect_qp(&qpa, ip(2), qpb.qpn(), Mtu::Mtu1024, 10, 20);
    connect_qp(&qpb, ip(1), qpa.qpn(), Mtu::Mtu1024, 20, 10);
    let (la, lb) = loopback::pair(1 << 12);
    let cfg = FaultConfig::uniform(1.0);
    let ta = tokio::spawn(run(da.clone(), FaultInjector::new(la, cfg, 5)));
    let tb = tokio::spawn(run(db.clone(), FaultInjector::new(lb, cfg, 6)));
    let data = pattern(1 << 20, 1);
    ra.write(0, &data);
    qpb.post_recv(RecvWr {
        wr_id: 1,
        sg_list: mrb.sge(0, 1 << 20).into(),
    })
    .unwrap();
    qpa.post_send(send_wr(1, SendOp::Send, mra.sge(0, 1 << 20)))
        .unwrap();
    rb.write(2 << 20, &data);
    let op = SendOp::RdmaRead {
        remote_addr: mrb.iova() + (2 << 20),
        rkey: mrb.rkey(),
    };
    qpa.post_send(send_wr(2, op, mra.sge(2 << 20, 1 << 20)))
        .unwrap();
    let wcs = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        let mut got = Vec::new();
        while got.len() < 2 {
            cqa.wait_nonempty().await;
            got.extend(cqa.poll(4));
        }
        cqb.wait_nonempty().await;
        got
    })
    .await
    .expect("timed out");
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let mut got = vec![0u8; 1 << 20];
    rb.read(0, &mut got);
    assert!(got == data);
    ra.read(2 << 20, &mut got);
    assert!(got == data);
    ta.abort();
    tb.abort();
}

/// An ACK that arrives after the retransmit timer went off completes the SEND once, and
/// nothing is sent after it. (The case of an ACK landing while the rewound message is still
/// being sent again is reached by `cycles_over_a_faulty_link` in tests/cm.rs.)
#[test]
fn late_ack_after_timeout_completes_the_send() {
    use std::time::Duration;
    let (da, _pa, cqa, qpa, _ra, mra) = side("a", ip(1), 1 << 16);
    let (db, _pb, cqb, qpb, _rb, mrb) = side("b", ip(2), 1 << 16);
    connect_qp(&qpa, ip(2), qpb.qpn(), Mtu::Mtu1024, 100, 200);
    connect_qp(&qpb, ip(1), qpa.qpn(), Mtu::Mtu1024, 200, 100);
    qpb.post_recv(RecvWr {
        wr_id: 1,
        sg_list: mrb.sge(0, 8192).into(),
    })
    .unwrap();
    qpa.post_send(send_wr(7, SendOp::Send, mra.sge(0, 3000)))
        .unwrap();
    let mut t = Duration::ZERO;
    let mut out = Vec::new();
    da.poll(t);
    da.take_tx(&mut out);
    assert_eq!(out.len(), 3, "a 3000-byte SEND at MTU 1024");
    for d in out.drain(..) {
        db.receive(&d, t);
    }
    db.poll(t);
    db.take_tx(&mut out);
    let acks: Vec<Vec<u8>> = std::mem::take(&mut out);
    assert!(!acks.is_empty());
    // The ACK is late: the requester's timer (timeout 14, 67 ms) fires first and rewinds.
    t += Duration::from_millis(100);
    da.poll(t);
    da.take_tx(&mut out);
    assert!(!out.is_empty(), "no retransmission");
    out.clear();
    for d in &acks {
        da.receive(d, t);
    }
    da.poll(t);
    let wc = cqa.poll(4);
    assert_eq!(wc.len(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::Success));
    // Nothing left to send, and no timer left running.
    t += Duration::from_secs(1);
    da.poll(t);
    da.take_tx(&mut out);
    assert!(
        out.is_empty(),
        "{} packets sent after the completion",
        out.len()
    );
    assert_eq!(cqb.poll(4).len(), 1, "the message arrived once");
}
