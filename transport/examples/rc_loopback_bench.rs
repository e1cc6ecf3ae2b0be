//! In-memory loopback throughput of RC RDMA WRITE, READ and SEND between two soft-RoCE
//! devices driven in one thread (both ends' engines share the core, so the figure is the
//! whole stack's cost per byte: segmentation, ICRC on both sides, placement, ACKs).
//!
//! `cargo run --release -p rtgt-transport --example rc_loopback_bench [mtu] [seconds]`

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rtgt_transport::netdev::loopback;
use rtgt_transport::sim::Fabric;
use rtgt_transport::verbs::*;

struct Side {
    dev: Device,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    _region: Arc<Region>,
    mr: Mr,
}

const BUF: usize = 64 << 20;

fn side(last: u8) -> Side {
    let addr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, last));
    let dev = Device::new(DeviceConfig::new("bench", vec![addr])).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let mut init = QpInitAttr::new(QpType::Rc, &cq, &cq);
    init.cap.max_send_wr = 1024;
    init.cap.max_recv_wr = 1024;
    let qp = pd.create_qp(init).unwrap();
    let region = Arc::new(Region::zeroed(BUF));
    let mr = pd
        .reg_mr(
            region.clone(),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    Side {
        dev,
        _pd: pd,
        cq,
        qp,
        _region: region,
        mr,
    }
}

fn connect(qp: &Qp, remote: u8, dest: u32, mtu: Mtu) {
    qp.to_init(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)
        .unwrap();
    let remote = IpAddr::V4(Ipv4Addr::new(10, 0, 0, remote));
    qp.to_rts(&RcPath {
        mtu,
        min_rnr_timer: 0,
        ..RcPath::new(remote, dest, 0, 0)
    })
    .unwrap();
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Write,
    Read,
    Send,
}

fn run(kind: Kind, size: usize, mtu: Mtu, secs: f64) -> f64 {
    let a = side(1);
    let b = side(2);
    connect(&a.qp, 2, b.qp.qpn(), mtu);
    connect(&b.qp, 1, a.qp.qpn(), mtu);
    let (la, lb) = loopback::pair(1 << 16);
    let mut fab = Fabric::new();
    fab.add(a.dev.clone(), Box::new(la));
    fab.add(b.dev.clone(), Box::new(lb));
    let depth = ((8 << 20) / size).clamp(4, 256);
    let slots = BUF / size;
    let post = |n: u64| {
        let off = (n as usize % slots) * size;
        let sge = a.mr.sge(off, size as u32);
        let op = match kind {
            Kind::Write => SendOp::RdmaWrite {
                remote_addr: b.mr.iova() + off as u64,
                rkey: b.mr.rkey(),
            },
            Kind::Read => SendOp::RdmaRead {
                remote_addr: b.mr.iova() + off as u64,
                rkey: b.mr.rkey(),
            },
            Kind::Send => {
                b.qp.post_recv(RecvWr {
                    wr_id: n,
                    sg_list: b.mr.sge(off, size as u32).into(),
                })
                .unwrap();
                SendOp::Send
            }
        };
        a.qp.post_send(SendWr::new(n, op, vec![sge])).unwrap();
    };
    let mut posted = 0u64;
    for _ in 0..depth {
        post(posted);
        posted += 1;
    }
    let start = Instant::now();
    let mut done = 0u64;
    let mut wcs = Vec::new();
    while start.elapsed() < Duration::from_secs_f64(secs) {
        fab.step();
        wcs.clear();
        a.cq.poll_into(&mut wcs, 256);
        for wc in &wcs {
            assert_eq!(wc.status, WcStatus::Success);
            done += 1;
            post(posted);
            posted += 1;
        }
        if matches!(kind, Kind::Send) {
            b.cq.poll(256);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    (done as f64 * size as f64) / elapsed / 1e9
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mtu = args
        .next()
        .and_then(|s| s.parse().ok())
        .and_then(Mtu::from_bytes)
        .unwrap_or(Mtu::Mtu4096);
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    println!("RC loopback, path MTU {}, {secs} s per case", mtu.bytes());
    for kind in [Kind::Write, Kind::Read, Kind::Send] {
        for size in [4096usize, 1 << 20] {
            let gbs = run(kind, size, mtu, secs);
            println!("{:<6} {:>8} B  {:7.3} GB/s", format!("{kind:?}"), size, gbs);
        }
    }
}
