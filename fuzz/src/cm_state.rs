//! The connection manager's state machine (`rtgt-transport::cm`): arbitrary MADs into a CM
//! with a listener, active connections and consumers that accept, reject or drop requests,
//! on a virtual clock.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use rtgt_transport::cm::{Cm, CmConn, CmError, CmLimits, CmListener, ConnParams};
use rtgt_transport::verbs::{Cq, Device, DeviceConfig, Pd, Qp, QpInitAttr, QpType};
use rtgt_transport::wire::cm::{Mad, CLASS_VERSION};
use rtgt_transport::wire::{mad, Datagram, Opcode};

const LOCAL_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const LOCAL_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2);
const PORT: u16 = 7174;
/// A record: control byte, selector byte, then one MAD.
const RECORD: usize = 2 + mad::MAD_LEN;
const MAX_RECORDS: usize = 32;
/// QPs the consumers may hold at once.
const MAX_QPS: usize = 8;

type Pending = Pin<Box<dyn Future<Output = Result<CmConn, CmError>> + Send>>;

struct Bed {
    dev: Device,
    cm: Cm,
    listener: CmListener,
    pd: Pd,
    cq: Cq,
    pending: Vec<Pending>,
    conns: Vec<CmConn>,
    qps: Vec<Arc<Qp>>,
    now: Instant,
}

impl Bed {
    fn new() -> Bed {
        let mut config = DeviceConfig::new("fuzz", vec![LOCAL_V4.into(), LOCAL_V6.into()]);
        config.eth_mtu = 1500;
        config.check_icrc = false;
        let dev = Device::new(config).expect("device");
        let limits = CmLimits {
            max_connections: 8,
            backlog: 4,
            max_listeners: 4,
            timewait: Duration::from_millis(500),
        };
        let cm = Cm::with_seed(&dev, limits, Some(0x5eed)).expect("cm");
        let listener = cm
            .listen(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT))
            .expect("listen");
        let pd = dev.alloc_pd().expect("pd");
        let cq = dev.create_cq(64).expect("cq");
        Bed {
            dev,
            cm,
            listener,
            pd,
            cq,
            pending: Vec::new(),
            conns: Vec::new(),
            qps: Vec::new(),
            now: Instant::now(),
        }
    }

    fn qp(&mut self) -> Option<Arc<Qp>> {
        self.qps.retain(|q| Arc::strong_count(q) > 1);
        if self.qps.len() >= MAX_QPS {
            return None;
        }
        let init = QpInitAttr::new(QpType::Rc, &self.cq, &self.cq);
        let qp = Arc::new(self.pd.create_qp(init).ok()?);
        self.qps.push(qp.clone());
        Some(qp)
    }

    /// Polls the consumers' futures once; the finished ones become connections or go.
    fn poll(&mut self) {
        let mut cx = Context::from_waker(Waker::noop());
        let mut still = Vec::new();
        for mut f in self.pending.drain(..) {
            match f.as_mut().poll(&mut cx) {
                Poll::Ready(Ok(c)) => self.conns.push(c),
                Poll::Ready(Err(_)) => {}
                Poll::Pending => still.push(f),
            }
        }
        self.pending = still;
    }

    fn consume(&mut self, action: u8) {
        // 0: leave them waiting; the CM's timers speak for a slow consumer.
        if action == 0 {
            return;
        }
        while let Some(req) = self.listener.try_accept() {
            let _ = (req.peer(), req.local(), req.private_data(), req.path_mtu());
            match action {
                1 => {
                    let Some(qp) = self.qp() else {
                        req.reject(b"busy");
                        continue;
                    };
                    let p = ConnParams {
                        private_data: vec![0xa5; 8],
                        ..ConnParams::default()
                    };
                    self.pending
                        .push(Box::pin(async move { req.accept(&qp, p).await }));
                }
                2 => req.reject(b"no"),
                _ => drop(req),
            }
        }
    }

    fn connect(&mut self, sel: u8) {
        let Some(qp) = self.qp() else { return };
        let cm = self.cm.clone();
        let dst: IpAddr = if sel & 1 == 0 {
            Ipv4Addr::new(10, 0, 0, 1).into()
        } else {
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).into()
        };
        let p = ConnParams {
            cm_response_timeout: sel % 24,
            max_cm_retries: sel % 4,
            ..ConnParams::default()
        };
        self.pending.push(Box::pin(async move {
            cm.connect(&qp, SocketAddr::new(dst, PORT), p).await
        }));
    }

    /// Every MAD the CM sent must parse, speak class version 2 and leave from our address.
    fn check_output(&self) {
        let mut out = Vec::new();
        self.dev.take_tx(&mut out);
        for d in &out {
            let dg = Datagram::split(d).expect("the CM sent a malformed datagram");
            let ip = dg.ip_repr().expect("IP header");
            assert!(
                ip.src_addr() == IpAddr::from(LOCAL_V4) || ip.src_addr() == IpAddr::from(LOCAL_V6),
                "sent from {}",
                ip.src_addr()
            );
            let pkt = dg.roce_packet().expect("RoCE packet");
            if pkt.opcode() != Opcode::UdSendOnly {
                continue;
            }
            let m = Mad::parse(pkt.payload()).expect("the CM sent a MAD it cannot parse");
            assert_eq!(m.header.class_version, CLASS_VERSION);
        }
        let s = self.cm.stats();
        assert!(s.live_connections <= s.connections);
        assert!(s.connections <= 8, "{} connections", s.connections);
    }
}

fn source(ctl: u8) -> (IpAddr, IpAddr) {
    match ctl & 3 {
        0 | 3 => (Ipv4Addr::new(10, 0, 0, 1).into(), LOCAL_V4.into()),
        1 => (Ipv4Addr::new(10, 0, 0, 3).into(), LOCAL_V4.into()),
        _ => (
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).into(),
            LOCAL_V6.into(),
        ),
    }
}

/// Arbitrary MADs into a connection manager. Nothing may panic; every MAD it sends parses.
///
/// Input: records of a control byte, a selector byte and a 256-byte MAD (a short last record
/// is padded with zeros). Control bits: 0–1 the source (two IPv4 peers, one IPv6 peer);
/// 2 address the MAD to a live connection (its remote communication ID, and for a DREQ the
/// QPN, are set to those of connection `selector`); 3–4 what the consumer does with waiting
/// connect requests (leave, accept, reject, drop); 5 advance the clock by `selector` × 50 ms
/// and run the timers; 6 start a connect (to a peer chosen by the selector); 7 drop
/// connection `selector` (which disconnects it).
pub fn transport_cm_state(data: &[u8]) {
    let mut bed = Bed::new();
    for rec in data.chunks(RECORD).take(MAX_RECORDS) {
        let ctl = rec[0];
        let sel = rec.get(1).copied().unwrap_or(0);
        let mut m = [0u8; mad::MAD_LEN];
        let body = rec.get(2..).unwrap_or(&[]);
        m[..body.len()].copy_from_slice(body);
        if ctl & 0x04 != 0 {
            let ids = bed.cm.comm_ids();
            if !ids.is_empty() {
                let (id, qpn) = ids[sel as usize % ids.len()];
                m[28..32].copy_from_slice(&id.to_be_bytes());
                if u16::from_be_bytes([m[16], m[17]]) == 0x0015 {
                    m[32..35].copy_from_slice(&qpn.to_be_bytes()[1..]);
                }
            }
        }
        if ctl & 0x40 != 0 {
            bed.connect(sel);
        }
        let (src, dst) = source(ctl);
        bed.cm.receive_mad(src, dst, &m);
        bed.consume((ctl >> 3) & 3);
        if ctl & 0x20 != 0 {
            bed.now += Duration::from_millis(50 * u64::from(sel));
            bed.cm.tick(bed.now);
        }
        if ctl & 0x80 != 0 && !bed.conns.is_empty() {
            let i = sel as usize % bed.conns.len();
            bed.conns.swap_remove(i);
        }
        bed.poll();
        bed.check_output();
    }
    // Let every timer run out: retransmissions give up, timewait ends, the table empties.
    for _ in 0..64 {
        bed.now += Duration::from_secs(600);
        bed.cm.tick(bed.now);
        bed.poll();
        bed.check_output();
    }
    bed.conns.clear();
    bed.pending.clear();
    for _ in 0..64 {
        bed.now += Duration::from_secs(600);
        bed.cm.tick(bed.now);
    }
    bed.check_output();
    assert_eq!(
        bed.cm.stats().connections,
        0,
        "connections left after every timer ran"
    );
}
