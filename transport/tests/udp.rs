//! Two devices over real UDP sockets on loopback addresses of their own (127.0.0.11 and up),
//! port 4791, driven by the async runner; consumers await their CQs. When the sockets cannot
//! be bound (for example when rdma_rxe owns port 4791 in this network namespace) the tests
//! skip, or fail in CI.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use rtgt_transport::netdev::udp::{run, UdpNetDev};
use rtgt_transport::verbs::*;

#[path = "../src/test_support.rs"]
mod test_support;
use test_support::skip_or_fail;

fn addr(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

const ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// Takes `qp` through INIT and RTR to RTS, connected to QP `dest` at `remote`.
fn connect(qp: &Qp, remote: IpAddr, dest: u32, mtu: Mtu) {
    qp.to_init(ACCESS).unwrap();
    qp.to_rts(&RcPath {
        mtu,
        timeout: 12,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..RcPath::new(remote, dest, 0, 0)
    })
    .unwrap();
}

/// Two UDP links on 127.0.0.`base` and 127.0.0.`base + 1`, port 4791 (distinct per test:
/// tests run in parallel and each binds port 4791; and not 127.0.0.1, where a local rtgtd may
/// serve); `None` (after skipping, or failing in CI) where they cannot be bound.
fn bind_pair(base: u8, packet_rx: bool) -> Option<(UdpNetDev, UdpNetDev)> {
    let bind = |last| {
        let a = SocketAddr::new(addr(last), 4791);
        if packet_rx {
            UdpNetDev::bind_with_packet_rx(a, "lo")
        } else {
            UdpNetDev::bind(a)
        }
    };
    match (bind(base), bind(base + 1)) {
        (Ok(a), Ok(b)) => Some((a, b)),
        (a, b) => {
            // Packet sockets need CAP_NET_RAW; CI runs as root, where this must work.
            skip_or_fail(format!(
                "cannot bind UDP 4791 on 127.0.0.{base}/{}: {:?} {:?}",
                base + 1,
                a.err(),
                b.err()
            ));
            None
        }
    }
}

/// A PD, a CQ, an RC QP on it and a registered region of `len` zero bytes on `d`.
fn end(d: &Device, len: usize) -> (Pd, Cq, Qp, Arc<Region>, Mr) {
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(64).unwrap();
    let qp = pd.create_qp(QpInitAttr::new(QpType::Rc, &cq, &cq)).unwrap();
    let region = Arc::new(Region::zeroed(len));
    let mr = pd.reg_mr(region.clone(), ACCESS).unwrap();
    (pd, cq, qp, region, mr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rc_over_udp_sockets() {
    rc_over_udp(false, 11).await;
}

/// With AF_PACKET receive the whole datagrams arrive and the ICRC is verified in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rc_over_udp_with_packet_rx() {
    rc_over_udp(true, 13).await;
}

/// Devices on 127.0.0.`base` and 127.0.0.`base + 1` ([`bind_pair`]).
async fn rc_over_udp(packet_rx: bool, base: u8) {
    let Some((na, nb)) = bind_pair(base, packet_rx) else {
        return;
    };
    let mk = |last| {
        let mut cfg = DeviceConfig::new("udp", vec![addr(last)]);
        // A UDP socket cannot see the IPv4 ID and DF flag: ICRCs are checked for the rest.
        cfg.check_icrc = true;
        cfg.ipv4_header_rebuilt = !packet_rx;
        cfg.eth_mtu = 1500;
        Device::new(cfg).unwrap()
    };
    let (da, db) = (mk(base), mk(base + 1));
    let ta = tokio::spawn(run(da.clone(), na));
    let tb = tokio::spawn(run(db.clone(), nb));
    let setup = |d: &Device| end(d, 1 << 20);
    let (_pa, cqa, qpa, ra, mra) = setup(&da);
    let (_pb, cqb, qpb, rb, mrb) = setup(&db);
    connect(&qpa, addr(base + 1), qpb.qpn(), Mtu::Mtu1024);
    connect(&qpb, addr(base), qpa.qpn(), Mtu::Mtu1024);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    ra.write(0, &data);
    qpb.post_recv(RecvWr {
        wr_id: 1,
        sg_list: mrb.sge(0, 200_000).into(),
    })
    .unwrap();
    qpa.post_send(SendWr::new(1, SendOp::Send, vec![mra.sge(0, 100_000)]))
        .unwrap();
    qpa.post_send(SendWr::new(
        2,
        SendOp::RdmaWrite {
            remote_addr: mrb.iova() + 300_000,
            rkey: mrb.rkey(),
        },
        vec![mra.sge(0, 100_000)],
    ))
    .unwrap();
    qpa.post_send(SendWr::new(
        3,
        SendOp::RdmaRead {
            remote_addr: mrb.iova(),
            rkey: mrb.rkey(),
        },
        vec![mra.sge(500_000, 100_000)],
    ))
    .unwrap();
    let mut got = Vec::new();
    let wait = async {
        while got.len() < 3 {
            cqa.wait_nonempty().await;
            got.extend(cqa.poll(8));
        }
        cqb.wait_nonempty().await;
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), wait)
        .await
        .expect("timed out");
    assert!(got.iter().all(|w| w.status == WcStatus::Success), "{got:?}");
    assert_eq!(cqb.poll(1)[0].byte_len, 100_000);
    let mut check = vec![0u8; 100_000];
    rb.read(300_000, &mut check);
    assert!(check == data);
    ra.read(500_000, &mut check);
    assert!(check == data, "READ returned the SEND's bytes");
    // Every ICRC held (GSO segments carry IDs 1, 2, ... that the rebuilt header lacks).
    assert_eq!(da.stats().rx_bad_icrc + db.stats().rx_bad_icrc, 0);
    assert!(db.stats().rx_packets > 0);
    ta.abort();
    tb.abort();
}

/// IPv6 on ::1 (two ports, since loopback has one IPv6 address): the reconstructed IPv6
/// header is exact, so the ICRC is verified even through a plain UDP socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rc_over_udp_ipv6_checks_icrc() {
    let lo: IpAddr = "::1".parse().unwrap();
    let (mut na, mut nb) = match (
        UdpNetDev::bind(SocketAddr::new(lo, 4793)),
        UdpNetDev::bind(SocketAddr::new(lo, 4794)),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => {
            return skip_or_fail(format!(
                "cannot bind UDP ports 4793/4794 on [::1] (IPv6): {:?} {:?}",
                a.err(),
                b.err()
            ));
        }
    };
    na.peer_port = 4794;
    nb.peer_port = 4793;
    let mk = || {
        let mut cfg = DeviceConfig::new("udp6", vec![lo]);
        cfg.check_icrc = true;
        Device::new(cfg).unwrap()
    };
    let (da, db) = (mk(), mk());
    let ta = tokio::spawn(run(da.clone(), na));
    let tb = tokio::spawn(run(db.clone(), nb));
    let setup = |d: &Device| end(d, 1 << 18);
    let (_pa, cqa, qpa, ra, mra) = setup(&da);
    let (_pb, _cqb, qpb, rb, mrb) = setup(&db);
    connect(&qpa, lo, qpb.qpn(), Mtu::Mtu4096);
    connect(&qpb, lo, qpa.qpn(), Mtu::Mtu4096);
    let data: Vec<u8> = (0..50_000u32).map(|i| (i * 13) as u8).collect();
    rb.write(0, &data);
    qpa.post_send(SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: mrb.iova(),
            rkey: mrb.rkey(),
        },
        vec![mra.sge(0, 50_000)],
    ))
    .unwrap();
    let wc = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        cqa.wait_nonempty().await;
        cqa.poll(1)
    })
    .await
    .expect("timed out");
    assert_eq!(wc[0].status, WcStatus::Success);
    let mut got = vec![0u8; 50_000];
    ra.read(0, &mut got);
    assert!(got == data);
    assert_eq!(da.stats().rx_bad_icrc, 0);
    ta.abort();
    tb.abort();
}

/// Long RDMA WRITEs and READs (1 MiB at path MTU 4096, as rtgtd runs) arrive intact, with
/// payloads received straight into registered memory on both sides: the WRITEs' middle and
/// last packets at the responder, the READ responses at the requester.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_messages_are_received_in_place() {
    const MIB: usize = 1 << 20;
    let (base, n) = (15u8, 4);
    let Some((na, nb)) = bind_pair(base, false) else {
        return;
    };
    let mk = |last| {
        let mut cfg = DeviceConfig::new("udp", vec![addr(last)]);
        cfg.check_icrc = true;
        cfg.ipv4_header_rebuilt = true;
        cfg.eth_mtu = 9000;
        Device::new(cfg).unwrap()
    };
    let (da, db) = (mk(base), mk(base + 1));
    let ta = tokio::spawn(run(da.clone(), na));
    let tb = tokio::spawn(run(db.clone(), nb));
    let setup = |d: &Device| end(d, 2 * n * MIB);
    let (_pa, cqa, qpa, ra, mra) = setup(&da);
    let (_pb, _cqb, qpb, rb, mrb) = setup(&db);
    connect(&qpa, addr(base + 1), qpb.qpn(), Mtu::Mtu4096);
    connect(&qpb, addr(base), qpa.qpn(), Mtu::Mtu4096);
    for round in 0..4u32 {
        let data: Vec<u8> = (0..(n * MIB) as u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8 ^ round as u8)
            .collect();
        ra.write(0, &data);
        // WRITEs of a's first half to b, then READs of them back into a's second half.
        for k in 0..n {
            qpa.post_send(SendWr::new(
                k as u64,
                SendOp::RdmaWrite {
                    remote_addr: mrb.iova() + (k * MIB) as u64,
                    rkey: mrb.rkey(),
                },
                vec![mra.sge(k * MIB, MIB as u32)],
            ))
            .unwrap();
        }
        for k in 0..n {
            qpa.post_send(SendWr::new(
                (n + k) as u64,
                SendOp::RdmaRead {
                    remote_addr: mrb.iova() + (k * MIB) as u64,
                    rkey: mrb.rkey(),
                },
                vec![mra.sge((n + k) * MIB, MIB as u32)],
            ))
            .unwrap();
        }
        let mut got = Vec::new();
        tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while got.len() < 2 * n {
                cqa.wait_nonempty().await;
                got.extend(cqa.poll(16));
            }
        })
        .await
        .expect("timed out");
        assert!(got.iter().all(|w| w.status == WcStatus::Success), "{got:?}");
        let mut check = vec![0u8; n * MIB];
        rb.read(0, &mut check);
        assert!(check == data, "round {round}: WRITE data differs");
        ra.read(n * MIB, &mut check);
        assert!(check == data, "round {round}: READ data differs");
    }
    let (sa, sb) = (da.stats(), db.stats());
    assert_eq!(sa.rx_bad_icrc + sb.rx_bad_icrc, 0);
    assert!(
        sb.rx_placed > 0,
        "no WRITE packet received in place: {sb:?}"
    );
    assert!(
        sa.rx_placed > 0,
        "no READ response received in place: {sa:?}"
    );
    ta.abort();
    tb.abort();
}
