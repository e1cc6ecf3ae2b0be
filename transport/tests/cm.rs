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
    tokio::time::timeout(LIMIT + LIMIT, async {
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
        sg_list: b.mr.sge(0, BUF as u32).into(),
    })
    .unwrap();
    a.qp.post_send(SendWr::new(
        9,
        SendOp::Send,
        vec![a.mr.sge(BUF, len as u32)],
    ))
    .unwrap();
    let s = match tokio::time::timeout(LIMIT, wc(&a.cq)).await {
        Ok(s) => s,
        Err(_) => panic!(
            "no send completion: sender {} / receiver {}",
            a.qp.debug_state(),
            b.qp.debug_state()
        ),
    };
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
    let (ca, cb) = (ca.unwrap(), cb.unwrap());
    // The connecting side sees the REP's private data; the accepting side has none.
    assert_eq!(&ca.private_data()[..7], b"welcome");
    assert!(cb.private_data().is_empty());
    (ca, cb)
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

// ---- lost and duplicated CM messages ---------------------------------------------------------

use rtgt_transport::netdev::{AsyncNetDev, NetDev};
use rtgt_transport::wire::cm::{CmMessage, Mad};
use rtgt_transport::wire::{Datagram, Opcode};
use std::collections::HashMap;
use std::sync::Mutex;

/// What a [`CmTap`] does to the MADs it transmits, and what it saw.
#[derive(Default)]
struct Rules {
    /// Attribute ID → how many more to drop / to send twice.
    drop: HashMap<u16, u32>,
    dup: HashMap<u16, u32>,
    /// Every CM MAD transmitted (dropped ones included), in order.
    seen: Vec<Mad>,
}

type Shared = Arc<Mutex<Rules>>;
/// (attribute ID, duplicate rather than drop) of one side's transmissions.
type Faults = Vec<(u16, bool)>;

/// A netdev that drops or duplicates chosen CM messages on transmit.
struct CmTap<N> {
    inner: N,
    rules: Shared,
}

fn mad_of(d: &[u8]) -> Option<Mad> {
    let dg = Datagram::split(d).ok()?;
    let pkt = dg.roce_packet().ok()?;
    if pkt.opcode() != Opcode::UdSendOnly || pkt.bth().dest_qp() != 1 {
        return None;
    }
    Mad::parse(pkt.payload()).ok()
}

impl<N: NetDev> NetDev for CmTap<N> {
    fn transmit(&mut self, d: &[u8]) -> std::io::Result<()> {
        if let Some(m) = mad_of(d) {
            let attr = u16::from(m.message.attr_id());
            let mut r = self.rules.lock().unwrap();
            r.seen.push(m);
            if let Some(n) = r.drop.get_mut(&attr).filter(|n| **n > 0) {
                *n -= 1;
                return Ok(());
            }
            if let Some(n) = r.dup.get_mut(&attr).filter(|n| **n > 0) {
                *n -= 1;
                self.inner.transmit(d)?;
            }
        }
        self.inner.transmit(d)
    }

    fn receive(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        self.inner.receive()
    }
}

impl<N: AsyncNetDev> AsyncNetDev for CmTap<N> {
    fn readable(&self) -> impl std::future::Future<Output = std::io::Result<()>> + Send + '_ {
        self.inner.readable()
    }
}

const REQ: u16 = 0x10;
const MRA: u16 = 0x11;
const REJ: u16 = 0x12;
const REP: u16 = 0x13;
const RTU: u16 = 0x14;
const DREQ: u16 = 0x15;
const DREP: u16 = 0x16;

/// Two HCAs whose transmissions go through taps (`a`'s rules, `b`'s rules).
fn tapped(limits: CmLimits) -> (Hca, Hca, Shared, Shared) {
    let (la, lb) = loopback::pair(1 << 12);
    let (ra, rb) = (Shared::default(), Shared::default());
    let a = Hca::with_netdev(
        device("a", ip(1)),
        CmTap {
            inner: la,
            rules: ra.clone(),
        },
        limits,
    )
    .unwrap();
    let b = Hca::with_netdev(
        device("b", ip(2)),
        CmTap {
            inner: lb,
            rules: rb.clone(),
        },
        limits,
    )
    .unwrap();
    (a, b, ra, rb)
}

fn count(r: &Shared, attr: u16) -> usize {
    r.lock()
        .unwrap()
        .seen
        .iter()
        .filter(|m| u16::from(m.message.attr_id()) == attr)
        .count()
}

/// One connection with the given faults on each side, traffic both ways, then a disconnect
/// from `a` (active) or `b` (passive); returns the rules for inspection.
async fn faulty_cycle(
    a_faults: &[(u16, bool)],
    b_faults: &[(u16, bool)],
    passive_disconnects: bool,
) -> (Shared, Shared, Hca, Hca) {
    let (a, b, ra, rb) = tapped(CmLimits::default());
    for (rules, faults) in [(&ra, a_faults), (&rb, b_faults)] {
        let mut r = rules.lock().unwrap();
        for &(attr, dup) in faults {
            let m = if dup { &mut r.dup } else { &mut r.drop };
            *m.entry(attr).or_default() += 1;
        }
    }
    let (ua, ub) = (ulp(a.device()), ulp(b.device()));
    let (ca, cb) = connect(&a, &b, &ua, &ub, 4000, hello()).await;
    send_checked(&ua, &ub, 3000, 1).await;
    send_checked(&ub, &ua, 3000, 2).await;
    let (first, second) = if passive_disconnects {
        (&cb, &ca)
    } else {
        (&ca, &cb)
    };
    first.disconnect();
    done(second).await;
    // The disconnecting side finishes once DREP (or its retries) went by.
    let sides = [(&a, &ra), (&b, &rb)];
    tokio::time::timeout(LIMIT, async {
        loop {
            let dreps: usize = sides.iter().map(|(_, r)| count(r, DREP)).sum();
            let lost = [&ra, &rb]
                .iter()
                .map(|r| r.lock().unwrap().drop.get(&DREP).copied().unwrap_or(0))
                .sum::<u32>();
            if dreps > 0 && lost == 0 && a.cm().stats().live_connections == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("disconnect did not finish");
    assert_eq!(ua.qp.state(), QpState::Err);
    assert_eq!(ub.qp.state(), QpState::Err);
    drop((ca, cb));
    (ra, rb, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_req_rep_rtu() {
    // A lost REQ is sent again.
    let (ra, _rb, ..) = faulty_cycle(&[(REQ, false)], &[], false).await;
    assert!(count(&ra, REQ) >= 2);
    // A lost REP: sent again, on its own timer or to the retransmitted REQ, as it was.
    let (_ra, rb, ..) = faulty_cycle(&[], &[(REP, false)], false).await;
    assert!(count(&rb, REP) >= 2);
    let reps: Vec<_> = rb
        .lock()
        .unwrap()
        .seen
        .iter()
        .filter(|m| matches!(m.message, CmMessage::Rep(_)))
        .copied()
        .collect();
    assert!(
        reps.iter().all(|r| *r == reps[0]),
        "the REP was not resent as it was"
    );
    // A lost RTU: the passive side resends its REP (or the first packet establishes).
    let (ra, _rb, ..) = faulty_cycle(&[(RTU, false)], &[], true).await;
    assert!(count(&ra, RTU) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicated_req_rep_rtu() {
    let (ra, rb, _a, b) = faulty_cycle(&[(REQ, true), (RTU, true)], &[(REP, true)], false).await;
    // The duplicate REQ made no second connection, the duplicate REP a second RTU.
    // (a second request would have been rejected when the listener closed)
    assert!(b.cm().stats().received.req >= 2);
    assert_eq!(count(&rb, REJ), 0);
    assert!(count(&ra, RTU) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_and_duplicated_dreq_drep_both_sides() {
    for passive in [false, true] {
        // The DREQ comes from a when a disconnects, from b otherwise.
        let dreq_side = |lost: bool| -> (Faults, Faults) {
            let f = vec![(DREQ, !lost)];
            let g = vec![(DREP, !lost)];
            if passive {
                (g, f)
            } else {
                (f, g)
            }
        };
        for lost in [true, false] {
            let (fa, fb) = dreq_side(lost);
            let (ra, rb, ..) = faulty_cycle(&fa, &fb, passive).await;
            let (dreq, drep) = if passive {
                (count(&rb, DREQ), count(&ra, DREP))
            } else {
                (count(&ra, DREQ), count(&rb, DREP))
            };
            if lost {
                // Lost DREQ and lost DREP both end with the DREQ sent again and answered.
                assert!(dreq >= 2, "passive {passive}: {dreq} DREQs");
                assert!(drep >= 1, "passive {passive}: {drep} DREPs");
            } else {
                // The DREQ went out twice (the tap doubles it), each copy answered.
                assert!(dreq >= 1, "passive {passive}");
                assert!(drep >= 2, "passive {passive}: {drep} DREPs");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumer_gets_an_mra_sent() {
    let (a, b, ra, rb) = tapped(CmLimits::default());
    let (ua, ub) = (ulp(a.device()), ulp(b.device()));
    let mut l = b.cm().listen(SocketAddr::new(ip(2), 4100)).unwrap();
    let (ca, cb) = tokio::join!(
        a.cm()
            .connect(&ua.qp, SocketAddr::new(ip(2), 4100), hello()),
        async {
            let req = l.accept().await.unwrap();
            // Hold the request until the CM has asked the peer for more time.
            tokio::time::timeout(LIMIT, async {
                while count(&rb, MRA) == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .expect("no MRA");
            req.accept(&ub.qp, fast()).await
        }
    );
    let (ca, _cb) = (ca.unwrap(), cb.unwrap());
    assert!(a.cm().stats().received.mra >= 1);
    assert!(count(&ra, REQ) >= 1);
    send_checked(&ua, &ub, 10, 3).await;
    drop(ca);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_backlog_and_table_get_rej_no_resources() {
    let limits = CmLimits {
        backlog: 1,
        max_connections: 3,
        ..CmLimits::default()
    };
    let (a, b) = pair(None, limits);
    let _l = b.cm().listen(SocketAddr::new(ip(2), 4200)).unwrap();
    let dst = SocketAddr::new(ip(2), 4200);
    let u1 = ulp(a.device());
    // The first request waits in the backlog (nobody accepts); the second finds it full.
    let first = a.cm().connect(&u1.qp, dst, fast());
    tokio::pin!(first);
    tokio::select! {
        _ = &mut first => panic!("connected without an accept"),
        _ = async {
            while b.cm().stats().received.req == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        } => {}
    }
    let u2 = ulp(a.device());
    let r = a.cm().connect(&u2.qp, dst, fast()).await;
    assert!(
        matches!(
            r,
            Err(CmError::Rejected {
                reason: Reason::NoResources,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(b.cm().stats().rejects_sent, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reqs_get_the_right_rej() {
    use rtgt_transport::wire::cm::{req, Mtu as CmMtu, RejReason, TransportServiceType};
    let (a, b, ra, rb) = tapped(CmLimits::default());
    let (ua, ub) = (ulp(a.device()), ulp(b.device()));
    let (ca, cb) = connect(&a, &b, &ua, &ub, 4300, hello()).await;
    // The REQ a sent, as a template.
    let template = ra
        .lock()
        .unwrap()
        .seen
        .iter()
        .find(|m| matches!(m.message, CmMessage::Req(_)))
        .copied()
        .unwrap();
    let CmMessage::Req(good) = template.message else {
        unreachable!()
    };
    let variant = |n: u32, f: &dyn Fn(&mut req::Repr)| {
        let mut r = good;
        r.local_comm_id = n;
        r.local_qpn = n;
        f(&mut r);
        Mad::new(u64::from(n), CmMessage::Req(r))
    };
    let stale_qpn = ua.qp.qpn();
    let cases: Vec<(Mad, RejReason)> = vec![
        (
            variant(0x1001, &|r| {
                r.transport_service_type = TransportServiceType::Uc
            }),
            RejReason::InvalidTransportType,
        ),
        (
            variant(0x1002, &|r| r.path_mtu = CmMtu::Mtu4096),
            RejReason::InvalidMtu,
        ),
        (
            variant(0x1003, &|r| r.service_id = 0x0000_0000_0106_0000 | 9),
            RejReason::InvalidServiceId,
        ),
        (
            variant(0x1004, &|r| r.service_id = 0x1234),
            RejReason::InvalidServiceId,
        ),
        // A cma header of an unknown version.
        (
            variant(0x1005, &|r| r.private_data[0] = 7),
            RejReason::ConsumerDefined,
        ),
        (
            {
                let mut m = variant(0x1006, &|_| {});
                m.header.class_version = 1;
                m
            },
            RejReason::InvalidClassVersion,
        ),
        // A REQ from the QP of the established connection: stale.
        (
            variant(0x1007, &|r| r.local_qpn = stale_qpn),
            RejReason::StaleConn,
        ),
    ];
    for (m, want) in cases {
        let CmMessage::Req(r) = m.message else {
            unreachable!()
        };
        let mut bytes = [0u8; 256];
        m.emit(&mut bytes);
        b.cm().receive_mad(ip(1), ip(2), &bytes);
        let rej = tokio::time::timeout(LIMIT, async {
            loop {
                let found = rb
                    .lock()
                    .unwrap()
                    .seen
                    .iter()
                    .find_map(|x| match x.message {
                        CmMessage::Rej(j) if j.remote_comm_id == r.local_comm_id => {
                            Some((x.header.tid, j))
                        }
                        _ => None,
                    });
                if let Some(f) = found {
                    return f;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no REJ for {want:?}"));
        assert_eq!(rej.1.reason, want);
        assert_eq!(rej.0, m.header.tid, "the REJ carries the REQ's TID");
    }
    // No consumer saw any of them, and the stale REQ ended the established connection.
    assert_eq!(b.cm().stats().received.req, 8);
    // SIDR (rdma_cm's UDP port space) is answered "unsupported".
    use rtgt_transport::wire::cm::{sidr_req, SidrStatus};
    let sidr = Mad::new(
        77,
        CmMessage::SidrReq(sidr_req::Repr {
            request_id: 0x5151,
            pkey: 0xffff,
            service_id: 0x0000_0000_0111_1c06,
            private_data: [0; sidr_req::PRIVATE_DATA_LEN],
        }),
    );
    let mut bytes = [0u8; 256];
    sidr.emit(&mut bytes);
    b.cm().receive_mad(ip(1), ip(2), &bytes);
    let rep = tokio::time::timeout(LIMIT, async {
        loop {
            let found = rb
                .lock()
                .unwrap()
                .seen
                .iter()
                .find_map(|x| match x.message {
                    CmMessage::SidrRep(r) => Some(r),
                    _ => None,
                });
            if let Some(r) = found {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("no SIDR_REP");
    assert_eq!(
        (rep.request_id, rep.status),
        (0x5151, SidrStatus::Unsupported)
    );
    done(&ca).await;
    done(&cb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qp_error_tears_the_connection_down() {
    let (a, b) = pair(None, CmLimits::default());
    let (ua, ub) = (ulp(a.device()), ulp(b.device()));
    let (ca, cb) = connect(&a, &b, &ua, &ub, 4400, hello()).await;
    // The consumer's QP fails (as on a fatal error): the CM notices, sends a DREQ and both
    // owners learn of the end.
    let err = QpAttr {
        qp_state: Some(QpState::Err),
        ..Default::default()
    };
    ub.qp.modify(&err, QpAttrMask::STATE).unwrap();
    done(&cb).await;
    done(&ca).await;
    assert_eq!(ua.qp.state(), QpState::Err);
    assert_eq!(b.cm().stats().sent.dreq, 1);
    // A destroyed QP ends its connection the same way.
    let (ua, ub) = (ulp(a.device()), ulp(b.device()));
    let (ca, _cb) = connect(&a, &b, &ua, &ub, 4401, hello()).await;
    drop(ub);
    done(&ca).await;
    assert_eq!(ua.qp.state(), QpState::Err);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_req_times_out_and_table_is_bounded() {
    let limits = CmLimits {
        max_connections: 2,
        timewait: Duration::from_millis(50),
        ..CmLimits::default()
    };
    let (a, b, ra, _rb) = tapped(limits);
    ra.lock().unwrap().drop.insert(REQ, u32::MAX);
    let ua = ulp(a.device());
    let p = ConnParams {
        cm_response_timeout: 8,
        max_cm_retries: 2,
        ..fast()
    };
    let r = a
        .cm()
        .connect(&ua.qp, SocketAddr::new(ip(2), 4500), p.clone())
        .await;
    assert_eq!(r.err(), Some(CmError::Timeout));
    assert_eq!(count(&ra, REQ), 3, "the REQ and its two retries");
    assert_eq!(a.cm().stats().timeouts, 1);
    assert_eq!(ua.qp.state(), QpState::Err);
    // Once timewait is over, two pending connects fill a's table; a third is refused locally.
    tokio::time::timeout(LIMIT, async {
        while a.cm().stats().connections > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("timewait did not end");
    let (u1, u2, u3) = (ulp(a.device()), ulp(a.device()), ulp(a.device()));
    let slow = ConnParams {
        cm_response_timeout: 20,
        ..fast()
    };
    let dst = SocketAddr::new(ip(2), 4501);
    let f1 = a.cm().connect(&u1.qp, dst, slow.clone());
    let f2 = a.cm().connect(&u2.qp, dst, slow.clone());
    tokio::pin!(f1, f2);
    let third = async {
        // Once the first two REQs are out.
        while count(&ra, REQ) < 5 {
            tokio::select! {
                _ = &mut f1 => panic!("connected"),
                _ = &mut f2 => panic!("connected"),
                _ = tokio::time::sleep(Duration::from_millis(2)) => {}
            }
        }
        a.cm().connect(&u3.qp, dst, slow.clone()).await
    };
    assert_eq!(third.await.err(), Some(CmError::TooManyConnections));
    drop(b);
}

/// Two HCAs over real UDP sockets: `a` on `a_addrs` with `a_shards` engine threads, `b` on
/// `b_addr` on the test's runtime. Ports of their own (free ones the kernel picks), so that
/// parallel tests and rdma_rxe on 4791 do not collide.
fn udp_pair(a_addrs: &[[u8; 4]], b_addr: [u8; 4], a_shards: usize) -> (Hca, Hca) {
    use rtgt_transport::hca::HcaConfig;
    let free = |ip: [u8; 4]| {
        std::net::UdpSocket::bind((IpAddr::from(ip), 0))
            .and_then(|s| s.local_addr())
            .unwrap()
            .port()
    };
    let (pa, pb) = (free(a_addrs[0]), free(b_addr));
    let mut ca = HcaConfig::new(a_addrs.iter().map(|&a| IpAddr::from(a)).collect());
    (ca.port, ca.peer_port, ca.shards) = (pa, pb, a_shards);
    let mut cb = HcaConfig::new(vec![IpAddr::from(b_addr)]);
    (cb.port, cb.peer_port) = (pb, pa);
    (Hca::open(&ca).unwrap(), Hca::open(&cb).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_address_hca_over_udp() {
    let (a, b) = udp_pair(&[[127, 0, 0, 1], [127, 0, 0, 2]], [127, 0, 0, 3], 0);
    assert_eq!(a.addrs().len(), 2);
    // b connects to a's second address: the REP and the RC traffic must come from it.
    let mut l = a
        .cm()
        .listen(SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 7174))
        .unwrap();
    let (ua, ub) = (ulp(a.device()), ulp(b.device()));
    let dst = SocketAddr::new(IpAddr::from([127, 0, 0, 2]), 7174);
    let (cb_, ca_) = tokio::join!(b.cm().connect(&ub.qp, dst, hello()), async {
        let req = l.accept().await.unwrap();
        assert_eq!(req.local(), dst);
        req.accept(&ua.qp, fast()).await
    });
    let (cb_, ca_) = (cb_.unwrap(), ca_.unwrap());
    assert_eq!(ca_.local().ip(), IpAddr::from([127, 0, 0, 2]));
    send_checked(&ub, &ua, 20000, 7).await;
    send_checked(&ua, &ub, 20000, 8).await;
    cb_.disconnect();
    done(&ca_).await;
}

/// An HCA with two engine threads: connections placed on both devices, each QP numbered as
/// its device owns it, traffic both ways on every connection (the kernel steers each QP's
/// datagrams to its device; the devices pass on what a coalesced run brings to the other).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_hca_over_udp() {
    use rtgt_transport::verbs::shards::owner;
    let (a, b) = udp_pair(&[[127, 0, 0, 4]], [127, 0, 0, 5], 2);
    assert_eq!(a.count(), 2);
    assert!(a.on_shard());
    let dst = SocketAddr::new(IpAddr::from([127, 0, 0, 4]), 7175);
    let mut l = a.cm().listen(dst).unwrap();
    let mut conns = Vec::new();
    for i in 0..4u8 {
        let ub = ulp(b.device());
        let (cb_, accepted) = tokio::join!(b.cm().connect(&ub.qp, dst, hello()), async {
            let req = l.accept().await.unwrap();
            let at = a.place();
            let ua = ulp(a.device_at(at.index()));
            assert_eq!(owner(ua.qp.qpn(), 2), at.index(), "QP {:#x}", ua.qp.qpn());
            let c = req.accept(&ua.qp, fast()).await;
            (c, ua, at)
        });
        let (ca_, ua, at) = accepted;
        conns.push((cb_.unwrap(), ca_.unwrap(), ua, ub, at, i));
    }
    assert_eq!(a.placed(), vec![2, 2]);
    for (_, _, ua, ub, _, i) in &conns {
        send_checked(ub, ua, 20000, *i).await;
        send_checked(ua, ub, 20000, *i + 100).await;
    }
    for d in a.devices() {
        assert!(d.stats().rx_packets > 10, "{:?}", d.stats());
    }
    let s = a.stats();
    assert_eq!((s.rx_dropped, s.rx_bad_icrc), (0, 0), "{s:?}");
    for (cb_, ca_, ..) in &conns {
        cb_.disconnect();
        done(ca_).await;
    }
    drop(conns);
    assert_eq!(a.placed(), vec![0, 0]);
}

// ---- a Linux REQ from the capture ---------------------------------------------------------

mod common;

/// The RoCEv2 IP datagram of capture frame `number`.
fn capture_datagram(pcap: &common::Pcap, number: usize) -> Vec<u8> {
    let record = pcap
        .records()
        .into_iter()
        .find(|r| r.number == number)
        .expect("frame");
    let (_, ip) = pcap.network_layer(record.data).expect("IP");
    let d = Datagram::split(ip).expect("datagram");
    let len = d.ip_header.len() + d.udp_header.len() + d.roce.len();
    ip[..len].to_vec()
}

/// The CM MAD of a datagram the device sent, with its IP addresses.
fn sent_mad(d: &[u8]) -> Option<(IpAddr, IpAddr, Mad)> {
    let ip = Datagram::split(d).ok()?.ip_repr().ok()?;
    Some((ip.src_addr(), ip.dst_addr(), mad_of(d)?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linux_req_from_the_capture() {
    use rtgt_transport::cm::Cm;
    use rtgt_transport::wire::icrc;
    // ib_iser's REQ to LIO (frame 15) arrives at a device with LIO's address, ICRC checked.
    let pcap = common::load_capture();
    let lio: IpAddr = "192.168.77.2".parse().unwrap();
    let ini: IpAddr = "192.168.77.3".parse().unwrap();
    let mut cfg = DeviceConfig::new("lio", vec![lio]);
    cfg.eth_mtu = 1500;
    let dev = Device::new(cfg).unwrap();
    let cm = Cm::start(&dev).unwrap();
    let mut l = cm.listen(SocketAddr::new(lio, 3260)).unwrap();
    dev.receive(&capture_datagram(&pcap, 15), Duration::ZERO);
    assert_eq!(dev.stats().rx_bad_icrc, 0);
    let req = tokio::time::timeout(LIMIT, l.accept())
        .await
        .expect("no request")
        .unwrap();
    assert_eq!(req.peer(), SocketAddr::new(ini, 0x8796));
    assert_eq!(req.local(), SocketAddr::new(lio, 3260));
    assert_eq!(req.private_data()[0], 0x80, "iser_cm_hdr flags");
    assert_eq!(req.responder_resources(), 128);
    assert_eq!(req.initiator_depth(), 1);
    assert_eq!(req.path_mtu(), Mtu::Mtu1024);

    let u = ulp(&dev);
    let qpn = u.qp.qpn();
    let accept = req.accept(&u.qp, ConnParams::default());
    tokio::pin!(accept);
    // The REP leaves from LIO's address to the initiator's QP1.
    let rep = tokio::time::timeout(LIMIT, async {
        loop {
            tokio::select! {
                r = &mut accept => panic!("established without an RTU: {r:?}"),
                _ = tokio::time::sleep(Duration::from_millis(2)) => {}
            }
            dev.poll(Duration::ZERO);
            let mut out = Vec::new();
            dev.take_tx(&mut out);
            if let Some(found) =
                out.iter()
                    .filter_map(|d| sent_mad(d))
                    .find_map(|(s, d, m)| match m.message {
                        CmMessage::Rep(r) => Some((s, d, m.header.tid, r)),
                        _ => None,
                    })
            {
                return found;
            }
        }
    })
    .await
    .expect("no REP");
    let (src, dst, tid, rep) = rep;
    assert_eq!((src, dst), (lio, ini));
    assert_eq!(tid, 0x2_f425_03f2, "the REP carries the REQ's TID");
    assert_eq!(rep.remote_comm_id, 0xf203_25f4);
    assert_eq!(rep.local_qpn, qpn);
    // Initiator depth bounded by the REQ's responder resources (128) and ours (16).
    assert_eq!((rep.initiator_depth, rep.responder_resources), (16, 16));
    // As between Linux peers: we send from the REQ's starting PSN and expect the REP's.
    let (state, mtu, dest_qpn, sq_psn, rq_psn) = u.qp.query().unwrap();
    assert_eq!(
        (state, mtu, dest_qpn, sq_psn, rq_psn),
        (
            QpState::Rts,
            Mtu::Mtu1024,
            0x11,
            0x8b_15d4,
            rep.starting_psn
        )
    );
    // The initiator's RTU (frame 17), addressed to our communication ID.
    let mut rtu = capture_datagram(&pcap, 17);
    let at = rtu.len() - 4 - 256 + 24 + 4;
    rtu[at..at + 4].copy_from_slice(&rep.local_comm_id.to_be_bytes());
    icrc::generate(&mut rtu).unwrap();
    dev.receive(&rtu, Duration::ZERO);
    let conn = tokio::time::timeout(LIMIT, accept)
        .await
        .expect("not established")
        .unwrap();
    assert_eq!(conn.peer(), SocketAddr::new(ini, 0x8796));
    assert_eq!(cm.stats().live_connections, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cycles_over_a_faulty_link() {
    // Loss, duplication, reordering, delay and corruption (caught by the ICRC) of every
    // packet, CM and RC alike, 3% each.
    for seed in [11, 12, 13] {
        let (a, b) = pair(Some((FaultConfig::uniform(3.0), seed)), CmLimits::default());
        for i in 0..8u16 {
            let (ua, ub) = (ulp(a.device()), ulp(b.device()));
            let (ca, cb) = connect(&a, &b, &ua, &ub, 5000 + i, hello()).await;
            send_checked(&ua, &ub, 5000, i as u8).await;
            send_checked(&ub, &ua, 700, i as u8).await;
            // Either side ends it.
            let (first, second) = if i % 2 == 0 { (&ca, &cb) } else { (&cb, &ca) };
            first.disconnect();
            done(second).await;
        }
        tokio::time::timeout(LIMIT, async {
            while a.cm().stats().live_connections + b.cm().stats().live_connections > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("connections left");
        // QP1 is all that is left of the connections on each side.
        assert_eq!(a.device().live_qps(), 1, "seed {seed}");
        assert_eq!(b.device().live_qps(), 1, "seed {seed}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_packet_establishes_without_rtu() {
    let (a, b, ra, rb) = tapped(CmLimits::default());
    // Every RTU is lost, and the passive side's REP timer is long (4 s): the first SEND from
    // the active side is what establishes the connection.
    ra.lock().unwrap().drop.insert(RTU, u32::MAX);
    let (ua, ub) = (ulp(a.device()), ulp(b.device()));
    let mut l = b.cm().listen(SocketAddr::new(ip(2), 4600)).unwrap();
    let p = ConnParams {
        cm_response_timeout: 20,
        ..hello()
    };
    rtgt_transport::cm::prepare_qp(&ub.qp).unwrap();
    ub.qp
        .post_recv(RecvWr {
            wr_id: 5,
            sg_list: ub.mr.sge(0, BUF as u32).into(),
        })
        .unwrap();
    let (ca, cb) = tokio::join!(
        async {
            let c = a
                .cm()
                .connect(&ua.qp, SocketAddr::new(ip(2), 4600), p.clone())
                .await
                .unwrap();
            ua.region.write(BUF, b"first");
            ua.qp
                .post_send(SendWr::new(6, SendOp::Send, vec![ua.mr.sge(BUF, 5)]))
                .unwrap();
            c
        },
        async {
            let req = l.accept().await.unwrap();
            req.accept(&ub.qp, fast()).await.unwrap()
        }
    );
    assert_eq!(
        count(&rb, REP),
        1,
        "established by the REP timer, not the packet"
    );
    assert!(count(&ra, RTU) >= 1);
    let r = wc(&ub.cq).await;
    assert_eq!((r.wr_id, r.byte_len), (5, 5));
    assert_eq!(b.cm().stats().live_connections, 1);
    drop((ca, cb));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vanished_peer_ends_the_connection() {
    let (a, b) = pair(None, CmLimits::default());
    let (ua, ub) = (ulp(a.device()), ulp(b.device()));
    let (ca, _cb) = connect(&a, &b, &ua, &ub, 4700, hello()).await;
    // b disappears without a DREQ (its device stops); a's next SEND runs out of retries.
    b.shutdown();
    ua.qp
        .post_send(SendWr::new(1, SendOp::Send, vec![ua.mr.sge(BUF, 100)]))
        .unwrap();
    let w = wc(&ua.cq).await;
    assert_eq!(w.status, WcStatus::RetryExcErr);
    done(&ca).await;
    assert_eq!(a.cm().stats().sent.dreq, 1);
}
