//! The connection manager between two soft-RoCE devices over an in-memory link (optionally
//! through a fault injector): listen/accept/connect, RC traffic on the connected QPs,
//! disconnects from either side, rejects, and lost or duplicated CM messages.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rtgt_transport::cm::{CmConn, CmError, CmLimits, ConnParams, Reason};
use rtgt_transport::hca::Hca;
use rtgt_transport::netdev::fault::{FaultConfig, FaultInjector};
use rtgt_transport::netdev::loopback;
use rtgt_transport::verbs::*;

const LIMIT: Duration = Duration::from_secs(60);

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 9, last))
}

fn device(name: &str, addr: IpAddr) -> Device {
    let mut cfg = DeviceConfig::new(name, vec![addr]);
    cfg.eth_mtu = 1500;
    Device::new(cfg).unwrap()
}

/// Two HCAs on one link; `faults` applies to both directions.
fn pair(faults: Option<(FaultConfig, u64)>, limits: CmLimits) -> (Hca, Hca) {
    let (la, lb) = loopback::pair(1 << 12);
    let (da, db) = (device("a", ip(1)), device("b", ip(2)));
    match faults {
        None => (
            Hca::with_netdev(da, la, limits).unwrap(),
            Hca::with_netdev(db, lb, limits).unwrap(),
        ),
        Some((cfg, seed)) => (
            Hca::with_netdev(da, FaultInjector::new(la, cfg, seed), limits).unwrap(),
            Hca::with_netdev(db, FaultInjector::new(lb, cfg, seed * 7 + 1), limits).unwrap(),
        ),
    }
}

/// A consumer's resources: PD, CQ, an RC QP in RESET and a registered buffer.
struct Ulp {
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    region: Arc<Region>,
    mr: Mr,
}

const BUF: usize = 1 << 16;

fn ulp(dev: &Device) -> Ulp {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let mut init = QpInitAttr::new(QpType::Rc, &cq, &cq);
    init.cap.max_send_wr = 16;
    init.cap.max_recv_wr = 16;
    let qp = pd.create_qp(init).unwrap();
    let region = Arc::new(Region::zeroed(2 * BUF));
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd.reg_mr(region.clone(), access).unwrap();
    Ulp {
        _pd: pd,
        cq,
        qp,
        region,
        mr,
    }
}

/// Fast CM timers, so lost messages are retransmitted quickly.
fn fast() -> ConnParams {
    ConnParams {
        cm_response_timeout: 14,
        ack_timeout: 12,
        ..ConnParams::default()
    }
}

async fn wc(cq: &Cq) -> WorkCompletion {
    tokio::time::timeout(LIMIT, async {
        loop {
            if let Some(w) = cq.poll(1).pop() {
                return w;
            }
            cq.wait_nonempty().await;
        }
    })
    .await
    .expect("no completion")
}

/// A SEND of `len` patterned bytes from `a` to `b`, checked on arrival.
async fn send_checked(a: &Ulp, b: &Ulp, len: usize, seed: u8) {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    a.region.write(BUF, &data);
    b.qp.post_recv(RecvWr {
        wr_id: 7,
        sg_list: vec![b.mr.sge(0, BUF as u32)],
    })
    .unwrap();
    a.qp.post_send(SendWr::new(
        9,
        SendOp::Send,
        vec![a.mr.sge(BUF, len as u32)],
    ))
    .unwrap();
    let s = wc(&a.cq).await;
    assert_eq!((s.wr_id, s.status), (9, WcStatus::Success));
    let r = wc(&b.cq).await;
    assert_eq!((r.wr_id, r.status), (7, WcStatus::Success));
    assert_eq!(r.byte_len as usize, len);
    let mut got = vec![0u8; len];
    b.region.read(0, &mut got);
    assert!(got == data, "payload differs");
}

/// Connects `ua` (on `a`) to a listener of `b` on `port`, accepting with `ub`.
async fn connect(
    a: &Hca,
    b: &Hca,
    ua: &Ulp,
    ub: &Ulp,
    port: u16,
    params: ConnParams,
) -> (CmConn, CmConn) {
    let mut l = b.cm().listen(SocketAddr::new(ip(2), port)).unwrap();
    let p2 = params.clone();
    let (ca, cb) = tokio::join!(
        a.cm().connect(&ua.qp, SocketAddr::new(ip(2), port), p2),
        async {
            let req = tokio::time::timeout(LIMIT, l.accept())
                .await
                .expect("no REQ")
                .unwrap();
            assert_eq!(req.local(), SocketAddr::new(ip(2), port));
            assert_eq!(req.peer().ip(), ip(1));
            assert_eq!(&req.private_data()[..5], b"hello");
            assert_eq!(req.path_mtu(), Mtu::Mtu1024);
            let mut p = params.clone();
            p.private_data = b"welcome".to_vec();
            req.accept(&ub.qp, p).await
        }
    );
    (ca.unwrap(), cb.unwrap())
}

fn hello() -> ConnParams {
    ConnParams {
        private_data: b"hello".to_vec(),
        ..fast()
    }
}

async fn done(c: &CmConn) {
    tokio::time::timeout(LIMIT, c.disconnected())
        .await
        .expect("not disconnected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_send_both_ways_disconnect_either_side() {
    let (a, b) = pair(None, CmLimits::default());
    let (ua, ub) = (ulp(a.device()), ulp(b.device()));
    let (ca, cb) = connect(&a, &b, &ua, &ub, 7174, hello()).await;
    assert_eq!(ua.qp.state(), QpState::Rts);
    assert_eq!(ub.qp.state(), QpState::Rts);
    assert_eq!(ca.peer(), SocketAddr::new(ip(2), 7174));
    assert_eq!(cb.local(), SocketAddr::new(ip(2), 7174));
    for (len, seed) in [(1, 1), (1024, 2), (5000, 3)] {
        send_checked(&ua, &ub, len, seed).await;
        send_checked(&ub, &ua, len, seed + 10).await;
    }
    // Active side disconnects: DREQ, DREP; both QPs in error.
    ca.disconnect();
    done(&cb).await;
    done(&ca).await;
    assert_eq!(ub.qp.state(), QpState::Err);
    assert_eq!(ua.qp.state(), QpState::Err);

    // A second connection, closed by the passive side.
    let (ua, ub) = (ulp(a.device()), ulp(b.device()));
    let (ca, cb) = connect(&a, &b, &ua, &ub, 7175, hello()).await;
    send_checked(&ua, &ub, 100, 5).await;
    cb.disconnect();
    cb.disconnect();
    done(&ca).await;
    assert_eq!(ua.qp.state(), QpState::Err);
    let (sa, sb) = (a.cm().stats(), b.cm().stats());
    assert_eq!(sa.sent.req, 2);
    assert_eq!(sb.sent.rep, 2);
    assert_eq!(sa.sent.rtu, 2);
    assert_eq!(sa.sent.dreq + sb.sent.dreq, 2);
    assert_eq!(sa.sent.drep + sb.sent.drep, 2);
    assert_eq!(sa.live_connections + sb.live_connections, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_port_and_consumer_reject() {
    let (a, b) = pair(None, CmLimits::default());
    let ua = ulp(a.device());
    let r = a
        .cm()
        .connect(&ua.qp, SocketAddr::new(ip(2), 9), fast())
        .await;
    match r {
        Err(CmError::Rejected { reason, .. }) => assert_eq!(reason, Reason::InvalidServiceId),
        other => panic!("{other:?}"),
    }
    assert_eq!(ua.qp.state(), QpState::Err);
    assert_eq!(b.cm().stats().rejects_sent, 1);

    // A listener that rejects with private data.
    let mut l = b
        .cm()
        .listen(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 5555))
        .unwrap();
    let ua = ulp(a.device());
    let (r, ()) = tokio::join!(
        a.cm()
            .connect(&ua.qp, SocketAddr::new(ip(2), 5555), hello()),
        async {
            let req = l.accept().await.unwrap();
            req.reject(b"go away");
        }
    );
    match r {
        Err(CmError::Rejected {
            reason,
            private_data,
        }) => {
            assert_eq!(reason, Reason::ConsumerDefined);
            assert_eq!(&private_data[..7], b"go away");
        }
        other => panic!("{other:?}"),
    }

    // A listener whose owner is gone answers like a port nobody listens on.
    drop(l);
    let ua = ulp(a.device());
    let r = a
        .cm()
        .connect(&ua.qp, SocketAddr::new(ip(2), 5555), fast())
        .await;
    assert!(
        matches!(
            r,
            Err(CmError::Rejected {
                reason: Reason::InvalidServiceId,
                ..
            })
        ),
        "{r:?}"
    );
}
