//! The connection table and its state machine (IBA 12.9; Linux `drivers/infiniband/core/cm.c`
//! and the rdma_cm rules of `cma.c`, docs/WIRE.md §4–§5).
//!
//! Pure logic over the table: MADs in ([`Core::on_mad`]), the clock ([`Core::tick`]) and the
//! consumers' calls; MADs out into a bounded queue that the caller sends through QP1. QPs are
//! driven by number through the device, so a connection never owns its consumer's QP.
//!
//! States, one handler per received message:
//!
//! ```text
//! passive: REQ → ReqRcvd ─(slow consumer: MRA)→ MraSent ─accept: REP→ RepSent ─RTU→ Established
//! active:  connect: REQ → ReqSent ─MRA→ MraRcvd ─REP: RTU→ Established
//! both:    Established ─disconnect: DREQ→ DreqSent ─DREP→ TimeWait
//!          Established ─DREQ: DREP→ TimeWait ─(timewait)→ gone
//! ```
//!
//! Any REJ ends a connection that is not established; every retransmitted message gives up
//! after the peer's Max CM Retries and answers with REJ reason 4 (timeout).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Weak;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::{CmError, CmLimits, CmStats, ConnParams, ConnectRequest, MsgCounts, Shared};
use crate::verbs::{Access, AddressVector, Device, Mtu, QpAttr, QpAttrMask, QpState, VerbsError};
use crate::wire::cm::{
    self, drep, dreq, mra, path, rej, rep, req, rtu, sidr_rep, AttributeId, CmMessage, Mad,
    MessageRef, RejReason, SidrStatus, TransportServiceType,
};
use crate::wire::{cma, mad};

/// The high half of the transaction IDs this CM starts (the low half is the local
/// communication ID, byte-swapped, as Linux forms it).
const TID_HIGH: u64 = 0x5254 << 32;
/// Service timeout announced in an MRA: 4.096 µs × 2^22 ≈ 17 s more for the consumer.
const MRA_SERVICE_TIMEOUT: u8 = 22;
/// How often established connections are checked for a QP that went to the error state.
const QP_CHECK: Duration = Duration::from_millis(500);
/// The transport retry count a connected QP gets: the REQ's, but at most 6, because this
/// engine (like rxe) retries forever at 7, and a peer that vanished without a DREQ must end
/// the connection (QP error, then DREQ) rather than hold its resources for good.
fn qp_retry_count(requested: u8) -> u8 {
    requested.min(6)
}

/// How often QPs whose REP waits for an RTU are looked at for a first received packet.
const FIRST_PACKET_PROBE: Duration = Duration::from_millis(20);
/// MADs waiting to be sent; beyond it they are dropped (and retransmitted by the timers).
const OUT_LIMIT: usize = 4096;

/// The largest timeout code honoured (4.096 µs × 2^23 ≈ 34 s): a peer cannot make a table
/// entry wait for hours between retransmissions.
const MAX_TIMEOUT_CODE: u8 = 23;

/// 4.096 µs × 2^t (IBA 12.7.32), at least a millisecond and at most 2^23 units.
pub(crate) fn cm_timeout(t: u8) -> Duration {
    Duration::from_nanos(4096u64 << t.min(MAX_TIMEOUT_CODE)).max(Duration::from_millis(1))
}

/// Where a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    ReqSent,
    MraRcvd,
    ReqRcvd,
    MraSent,
    RepSent,
    Established,
    DreqSent,
    TimeWait,
}

/// What the owner of a connection sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Phase {
    Pending,
    Established,
    Failed(CmError),
    Disconnected,
}

/// Where a REJ goes and what it answers. A REQ rejected before there is a connection gets
/// local ID 0 (Linux `cm_issue_rej`).
struct RejTo {
    src: IpAddr,
    dst: IpAddr,
    tid: u64,
    remote_id: u32,
    local_id: u32,
    msg: MessageRef,
}

/// A MAD to send.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub mad: Box<[u8; mad::MAD_LEN]>,
}

#[derive(Debug)]
struct Listener {
    id: u64,
    addr: SocketAddr,
    tx: mpsc::Sender<ConnectRequest>,
}

#[derive(Debug)]
pub(crate) struct Conn {
    pub state: State,
    active: bool,
    pub local_id: u32,
    remote_id: u32,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    /// The consumer's QP, 0 until it is known.
    pub qpn: u32,
    /// The device of the consumer's QP (one of a set of devices, [`crate::verbs::shards`];
    /// the CM's own until the QP is known).
    dev: Device,
    remote_qpn: u32,
    /// The TID of the REQ, shared by REP, RTU, MRA and REJ.
    tid: u64,
    /// The message the timer retransmits and how often it still may.
    last: Option<Box<[u8; mad::MAD_LEN]>>,
    retries: u8,
    timeout: Duration,
    deadline: Option<Instant>,
    /// The REQ (passive) or what we put in it (active).
    req: Box<req::Repr>,
    /// Passive: our REP's starting PSN.
    rep_psn: u32,
    /// Active: the private data of the REP that accepted us.
    rep_private: Box<[u8]>,
    phase: watch::Sender<Phase>,
    next_phase: Option<Phase>,
}

impl Conn {
    fn set_phase(&mut self, p: Phase) {
        self.next_phase = Some(p);
    }
}

pub(crate) struct Core {
    pub dev: Device,
    pub limits: CmLimits,
    shared: Weak<Shared>,
    listeners: Vec<Listener>,
    next_listener: u64,
    conns: HashMap<u32, Conn>,
    /// (peer address, remote communication ID) → local ID.
    remote: HashMap<(IpAddr, u32), u32>,
    pub out: VecDeque<Outgoing>,
    /// While REPs wait for their RTU: when to look whether a QP already received (which
    /// establishes the connection without the RTU).
    probe_at: Option<Instant>,
    stats: CmStats,
    next_id: u32,
    rng: u64,
}

fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32) ^ 0x9E37_79B9_7F4A_7C15
}

fn count(c: &mut MsgCounts, attr: AttributeId) {
    match attr {
        AttributeId::Req => c.req += 1,
        AttributeId::Mra => c.mra += 1,
        AttributeId::Rej => c.rej += 1,
        AttributeId::Rep => c.rep += 1,
        AttributeId::Rtu => c.rtu += 1,
        AttributeId::Dreq => c.dreq += 1,
        AttributeId::Drep => c.drep += 1,
        _ => c.other += 1,
    }
}

fn mtu_code(m: Mtu) -> cm::Mtu {
    cm::Mtu::from(m as u8)
}

impl Core {
    pub fn new(
        dev: Device,
        limits: CmLimits,
        shared: Weak<Shared>,
        seed_with: Option<u64>,
    ) -> Core {
        let mut rng = seed_with.unwrap_or_else(seed) | 1;
        rng ^= rng << 13;
        Core {
            dev,
            limits,
            shared,
            listeners: Vec::new(),
            next_listener: 1,
            conns: HashMap::new(),
            remote: HashMap::new(),
            out: VecDeque::new(),
            probe_at: None,
            stats: CmStats::default(),
            next_id: (rng as u32) | 1,
            rng,
        }
    }

    fn random(&mut self) -> u32 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 16) as u32
    }

    fn alloc_id(&mut self) -> u32 {
        loop {
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    pub fn stats(&self) -> CmStats {
        let mut s = self.stats;
        s.connections = self.conns.len() as u64;
        s.live_connections = self
            .conns
            .values()
            .filter(|c| c.state == State::Established)
            .count() as u64;
        s
    }

    /// Tells owners of the phases set since the last call (after the QP transitions that
    /// go with them, so an owner woken by the news sees its QP already moved).
    pub fn publish(&mut self) {
        for c in self.conns.values_mut() {
            if let Some(p) = c.next_phase.take() {
                c.phase.send_replace(p);
            }
        }
    }

    pub fn count_send_failure(&mut self) {
        self.stats.dropped += 1;
    }

    /// The earliest timer.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.conns
            .values()
            .filter_map(|c| c.deadline)
            .chain(self.probe_at)
            .min()
    }

    fn send(&mut self, src: IpAddr, dst: IpAddr, m: &Mad) -> Box<[u8; mad::MAD_LEN]> {
        let mut bytes = Box::new([0u8; mad::MAD_LEN]);
        m.emit(&mut bytes[..]);
        self.push(src, dst, bytes.clone(), m.message.attr_id());
        bytes
    }

    fn push(&mut self, src: IpAddr, dst: IpAddr, mad: Box<[u8; mad::MAD_LEN]>, attr: AttributeId) {
        if self.out.len() >= OUT_LIMIT {
            self.stats.dropped += 1;
            return;
        }
        count(&mut self.stats.sent, attr);
        if attr == AttributeId::Rej {
            self.stats.rejects_sent += 1;
        }
        self.out.push_back(Outgoing { src, dst, mad });
    }

    fn resend(&mut self, id: u32) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let Some(m) = c.last.clone() else {
            return;
        };
        let attr = AttributeId::from(u16::from_be_bytes([m[16], m[17]]));
        let (src, dst) = (c.local.ip(), c.peer.ip());
        self.push(src, dst, m, attr);
    }

    /// Sends a REJ; returns it (a REJ may be kept to answer retransmissions).
    fn send_rej(
        &mut self,
        to: RejTo,
        reason: RejReason,
        private: &[u8],
    ) -> Box<[u8; mad::MAD_LEN]> {
        let mut r = rej::Repr {
            local_comm_id: to.local_id,
            remote_comm_id: to.remote_id,
            message_rejected: to.msg,
            rej_info_len: 0,
            reason,
            ari: [0; rej::ARI_LEN],
            private_data: [0; rej::PRIVATE_DATA_LEN],
        };
        let n = private.len().min(rej::PRIVATE_DATA_LEN);
        r.private_data[..n].copy_from_slice(&private[..n]);
        self.send(to.src, to.dst, &Mad::new(to.tid, CmMessage::Rej(r)))
    }

    // ---- listeners -------------------------------------------------------------------------

    pub fn listen(
        &mut self,
        addr: SocketAddr,
        backlog: usize,
    ) -> Result<(u64, mpsc::Receiver<ConnectRequest>), CmError> {
        if !addr.ip().is_unspecified() && self.dev.gid_index(addr.ip()).is_none() {
            return Err(CmError::AddressNotAvailable(addr.ip()));
        }
        self.listeners.retain(|l| !l.tx.is_closed());
        if self.listeners.iter().any(|l| l.addr == addr) {
            return Err(CmError::AddrInUse(addr));
        }
        if self.listeners.len() >= self.limits.max_listeners {
            return Err(CmError::TooManyConnections);
        }
        let (tx, rx) = mpsc::channel(backlog.max(1));
        let id = self.next_listener;
        self.next_listener += 1;
        self.listeners.push(Listener { id, addr, tx });
        Ok((id, rx))
    }

    pub fn unlisten(&mut self, id: u64) {
        self.listeners.retain(|l| l.id != id);
    }

    /// The listener for a REQ to `local`: an exact address first, then a wildcard of the
    /// same family, then an IPv6 wildcard (which also serves IPv4, as in Linux).
    fn find_listener(&self, local: SocketAddr) -> Option<usize> {
        let port = local.port();
        let on_port = |l: &&Listener| l.addr.port() == port;
        let exact = self
            .listeners
            .iter()
            .position(|l| on_port(&l) && l.addr.ip() == local.ip());
        exact
            .or_else(|| {
                self.listeners.iter().position(|l| {
                    on_port(&l)
                        && l.addr.ip().is_unspecified()
                        && l.addr.is_ipv4() == local.is_ipv4()
                })
            })
            .or_else(|| {
                self.listeners
                    .iter()
                    .position(|l| on_port(&l) && l.addr.ip().is_unspecified() && l.addr.is_ipv6())
            })
    }

    // ---- receive ---------------------------------------------------------------------------

    /// One MAD received on QP1 from `src` to our address `dst`.
    pub fn on_mad(&mut self, src: IpAddr, dst: IpAddr, bytes: &[u8], now: Instant) {
        let Ok(p) = mad::Packet::new_checked(bytes) else {
            self.stats.dropped += 1;
            return;
        };
        if p.mgmt_class() != mad::MgmtClass::Cm
            || p.base_version() != mad::BASE_VERSION
            || p.method() != mad::Method::Send
            || bytes.len() < mad::MAD_LEN
        {
            self.stats.dropped += 1;
            return;
        }
        let attr = AttributeId::from(p.attr_id());
        count(&mut self.stats.received, attr);
        if p.class_version() != cm::CLASS_VERSION {
            // Only a REQ gets an answer (IBA 12.6.7.2: REJ "invalid class version").
            if attr == AttributeId::Req {
                if let Ok(r) = req::Packet::new_checked(p.data()) {
                    let remote = r.local_comm_id();
                    self.send_rej(
                        RejTo {
                            src: dst,
                            dst: src,
                            tid: p.tid(),
                            remote_id: remote,
                            local_id: 0,
                            msg: MessageRef::Req,
                        },
                        RejReason::InvalidClassVersion,
                        &[],
                    );
                }
            } else {
                self.stats.dropped += 1;
            }
            return;
        }
        let Ok(m) = Mad::parse(bytes) else {
            self.stats.dropped += 1;
            return;
        };
        let tid = m.header.tid;
        match m.message {
            CmMessage::Req(r) => self.on_req(src, dst, tid, &r, now),
            CmMessage::Mra(r) => self.on_mra(src, &r, now),
            CmMessage::Rej(r) => self.on_rej(src, &r),
            CmMessage::Rep(r) => self.on_rep(src, &r, now),
            CmMessage::Rtu(r) => self.on_rtu(src, &r),
            CmMessage::Dreq(r) => self.on_dreq(src, dst, tid, &r, now),
            CmMessage::Drep(r) => self.on_drep(src, &r, now),
            // rdma_cm's UDP port space resolves service IDs with SIDR; none is served here,
            // which Linux answers the same way (`cm_sidr_req_handler`: unsupported).
            CmMessage::SidrReq(r) => {
                let rep = sidr_rep::Repr {
                    request_id: r.request_id,
                    status: SidrStatus::Unsupported,
                    info_length: 0,
                    vendor_id: 0,
                    qpn: 0,
                    service_id: r.service_id,
                    qkey: 0,
                    info: [0; sidr_rep::INFO_LEN],
                    private_data: [0; sidr_rep::PRIVATE_DATA_LEN],
                };
                self.send(dst, src, &Mad::new(tid, CmMessage::SidrRep(rep)));
            }
            // LAP and APR (path migration) are not used on RoCE; stray replies are ignored.
            _ => self.stats.dropped += 1,
        }
    }

    /// The connection a reply is for: ours by ID and theirs by the peer's ID and address.
    fn lookup(&self, src: IpAddr, local_id: u32, remote_id: u32) -> Option<u32> {
        let c = self.conns.get(&local_id)?;
        (c.peer.ip() == src && (c.remote_id == remote_id || c.remote_id == 0)).then_some(local_id)
    }

    fn on_req(&mut self, src: IpAddr, dst: IpAddr, tid: u64, r: &req::Repr, now: Instant) {
        // A retransmitted REQ: answer as before (IBA 12.9.8.2; Linux `cm_dup_req_handler`).
        if let Some(&id) = self.remote.get(&(src, r.local_comm_id)) {
            let state = self.conns.get(&id).map(|c| c.state);
            match state {
                Some(State::MraSent | State::RepSent) => self.resend(id),
                Some(State::TimeWait) => {
                    let last_is_rej = self
                        .conns
                        .get(&id)
                        .and_then(|c| c.last.as_ref())
                        .is_some_and(|m| {
                            u16::from_be_bytes([m[16], m[17]]) == u16::from(AttributeId::Rej)
                        });
                    if last_is_rej {
                        self.resend(id);
                    } else {
                        self.send_rej(
                            RejTo {
                                src: dst,
                                dst: src,
                                tid,
                                remote_id: r.local_comm_id,
                                local_id: 0,
                                msg: MessageRef::Req,
                            },
                            RejReason::StaleConn,
                            &[],
                        );
                    }
                }
                _ => {}
            }
            if state == Some(State::RepSent) {
                self.check_first_packet(id, now);
            }
            return;
        }
        let reject = |core: &mut Core, reason| {
            core.send_rej(
                RejTo {
                    src: dst,
                    dst: src,
                    tid,
                    remote_id: r.local_comm_id,
                    local_id: 0,
                    msg: MessageRef::Req,
                },
                reason,
                &[],
            );
        };
        if r.transport_service_type != TransportServiceType::Rc || r.extended_transport_type != 0 {
            return reject(self, RejReason::InvalidTransportType);
        }
        let Some(path_mtu) = r.path_mtu.bytes().and_then(Mtu::from_bytes) else {
            return reject(self, RejReason::InvalidMtu);
        };
        if path_mtu > self.dev.port_mtu() {
            return reject(self, RejReason::InvalidMtu);
        }
        if self.dev.gid_index(dst).is_none() {
            return reject(self, RejReason::InvalidGid);
        }
        // A REQ from a QP that still has a connection here: the peer lost it (IBA 12.9.8.3.1).
        let stale = self
            .conns
            .values()
            .find(|c| {
                c.peer.ip() == src
                    && c.remote_qpn != 0
                    && c.remote_qpn == r.local_qpn
                    && c.state != State::TimeWait
            })
            .map(|c| c.local_id);
        if let Some(old) = stale {
            reject(self, RejReason::StaleConn);
            self.disconnect(old, now);
            return;
        }
        let Some((cma::PortSpace::Tcp, port)) = cma::parse_service_id(r.service_id) else {
            return reject(self, RejReason::InvalidServiceId);
        };
        let Ok(hdr) =
            cma::Packet::new_checked(&r.private_data[..]).and_then(|p| cma::Repr::parse(&p))
        else {
            // rdma_cm refuses a bad header and the IB CM then rejects for the consumer.
            return reject(self, RejReason::ConsumerDefined);
        };
        let local = SocketAddr::new(dst, port);
        let Some(li) = self.find_listener(local) else {
            return reject(self, RejReason::InvalidServiceId);
        };
        if self.listeners[li].tx.is_closed() {
            self.listeners.remove(li);
            return reject(self, RejReason::InvalidServiceId);
        }
        if self.conns.len() >= self.limits.max_connections {
            return reject(self, RejReason::NoResources);
        }
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let id = self.alloc_id();
        let peer = SocketAddr::new(src, hdr.src_port);
        let (phase, _) = watch::channel(Phase::Pending);
        // The consumer has half of the peer's wait to answer before an MRA asks for more.
        let budget = cm_timeout(r.remote_cm_response_timeout);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqRcvd,
                active: false,
                local_id: id,
                remote_id: r.local_comm_id,
                local,
                peer,
                qpn: 0,
                dev: self.dev.clone(),
                remote_qpn: r.local_qpn,
                tid,
                last: None,
                retries: 0,
                timeout: budget,
                deadline: Some(now + budget / 2),
                req: Box::new(*r),
                rep_psn: 0,
                rep_private: Box::default(),
                phase,
                next_phase: None,
            },
        );
        self.remote.insert((src, r.local_comm_id), id);
        let cr = ConnectRequest {
            cm: super::Cm { shared },
            id,
            peer,
            local,
            req: Box::new(*r),
            answered: false,
        };
        match self.listeners[li].tx.try_send(cr) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(mut cr)) => {
                cr.answered = true;
                self.drop_conn(id);
                reject(self, RejReason::NoResources);
            }
            Err(mpsc::error::TrySendError::Closed(mut cr)) => {
                cr.answered = true;
                self.listeners.remove(li);
                self.drop_conn(id);
                reject(self, RejReason::InvalidServiceId);
            }
        }
    }

    fn drop_conn(&mut self, id: u32) {
        if let Some(c) = self.conns.remove(&id) {
            if self.remote.get(&(c.peer.ip(), c.remote_id)) == Some(&id) {
                self.remote.remove(&(c.peer.ip(), c.remote_id));
            }
        }
    }

    fn on_mra(&mut self, src: IpAddr, r: &mra::Repr, now: Instant) {
        let Some(id) = self.lookup(src, r.remote_comm_id, r.local_comm_id) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let extra = cm_timeout(r.service_timeout);
        match (c.state, r.message_mraed) {
            (State::ReqSent, MessageRef::Req) => {
                c.state = State::MraRcvd;
                c.remote_id = r.local_comm_id;
                c.deadline = Some(now + extra + c.timeout);
            }
            (State::RepSent, MessageRef::Rep) => c.deadline = Some(now + extra + c.timeout),
            _ => {}
        }
    }

    fn on_rej(&mut self, src: IpAddr, r: &rej::Repr) {
        let Some(id) = self.lookup(src, r.remote_comm_id, r.local_comm_id) else {
            return;
        };
        self.stats.rejects_received += 1;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if !matches!(
            c.state,
            State::ReqSent | State::MraRcvd | State::RepSent | State::MraSent | State::ReqRcvd
        ) {
            return;
        }
        let e = CmError::Rejected {
            reason: r.reason,
            private_data: r.private_data.to_vec(),
        };
        let (qpn, qp_dev) = (c.qpn, c.dev.clone());
        c.set_phase(Phase::Failed(e));
        qp_to_error(&qp_dev, qpn);
        self.enter_timewait(id, Instant::now());
    }

    fn on_rep(&mut self, src: IpAddr, r: &rep::Repr, now: Instant) {
        let Some(id) = self.lookup(src, r.remote_comm_id, r.local_comm_id) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.state {
            State::ReqSent | State::MraRcvd => {}
            // Our RTU was lost: send it again.
            State::Established if c.active => {
                let m = Mad::new(
                    c.tid,
                    CmMessage::Rtu(rtu::Repr {
                        local_comm_id: c.local_id,
                        remote_comm_id: c.remote_id,
                        private_data: [0; rtu::PRIVATE_DATA_LEN],
                    }),
                );
                let (s, d) = (c.local.ip(), c.peer.ip());
                self.send(s, d, &m);
                return;
            }
            _ => return,
        }
        c.remote_id = r.local_comm_id;
        c.remote_qpn = r.local_qpn;
        c.rep_private = r.private_data.to_vec().into_boxed_slice();
        let (qpn, qp_dev) = (c.qpn, c.dev.clone());
        let (local, peer, tid) = (c.local, c.peer, c.tid);
        let req = *c.req;
        let res = self.rts_active(&qp_dev, qpn, local.ip(), peer.ip(), &req, r);
        if let Err(e) = res {
            // Linux answers a REP it cannot use with a consumer REJ and reports the failure.
            self.send_rej(
                RejTo {
                    src: local.ip(),
                    dst: peer.ip(),
                    tid,
                    remote_id: r.local_comm_id,
                    local_id: id,
                    msg: MessageRef::Req,
                },
                RejReason::ConsumerDefined,
                &[],
            );
            if let Some(c) = self.conns.get_mut(&id) {
                c.set_phase(Phase::Failed(CmError::Verbs(e)));
            }
            qp_to_error(&qp_dev, qpn);
            self.enter_timewait(id, now);
            return;
        }
        let m = Mad::new(
            tid,
            CmMessage::Rtu(rtu::Repr {
                local_comm_id: id,
                remote_comm_id: r.local_comm_id,
                private_data: [0; rtu::PRIVATE_DATA_LEN],
            }),
        );
        self.send(local.ip(), peer.ip(), &m);
        self.remote.insert((peer.ip(), r.local_comm_id), id);
        self.establish(id, now);
    }

    fn establish(&mut self, id: u32, now: Instant) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::Established;
            c.last = None;
            c.deadline = Some(now + QP_CHECK);
            c.set_phase(Phase::Established);
        }
    }

    fn on_rtu(&mut self, src: IpAddr, r: &rtu::Repr) {
        let Some(id) = self.lookup(src, r.remote_comm_id, r.local_comm_id) else {
            return;
        };
        if self
            .conns
            .get(&id)
            .is_some_and(|c| c.state == State::RepSent)
        {
            self.establish(id, Instant::now());
        }
    }

    fn on_dreq(&mut self, src: IpAddr, dst: IpAddr, tid: u64, r: &dreq::Repr, now: Instant) {
        let drep = |local: u32, remote: u32| {
            Mad::new(
                tid,
                CmMessage::Drep(drep::Repr {
                    local_comm_id: local,
                    remote_comm_id: remote,
                    private_data: [0; drep::PRIVATE_DATA_LEN],
                }),
            )
        };
        let found = self
            .lookup(src, r.remote_comm_id, r.local_comm_id)
            .filter(|id| self.conns.get(id).is_some_and(|c| c.qpn == r.remote_qpn));
        let Some(id) = found else {
            // Unknown connection: a DREP all the same, so the peer can finish (Linux does).
            self.send(dst, src, &drep(r.remote_comm_id, r.local_comm_id));
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let (s, d) = (c.local.ip(), c.peer.ip());
        match c.state {
            State::Established | State::RepSent | State::DreqSent | State::TimeWait => {}
            _ => return,
        }
        let state = c.state;
        let (qpn, qp_dev) = (c.qpn, c.dev.clone());
        if state == State::RepSent {
            c.set_phase(Phase::Failed(CmError::Disconnected));
        } else {
            c.set_phase(Phase::Disconnected);
        }
        self.send(s, d, &drep(id, r.local_comm_id));
        if state != State::TimeWait {
            qp_to_error(&qp_dev, qpn);
            self.enter_timewait(id, now);
        }
    }

    fn on_drep(&mut self, src: IpAddr, r: &drep::Repr, now: Instant) {
        let Some(id) = self.lookup(src, r.remote_comm_id, r.local_comm_id) else {
            return;
        };
        if self
            .conns
            .get(&id)
            .is_some_and(|c| c.state == State::DreqSent)
        {
            self.enter_timewait(id, now);
        }
    }

    fn enter_timewait(&mut self, id: u32, now: Instant) {
        let tw = self.limits.timewait;
        if let Some(c) = self.conns.get_mut(&id) {
            if c.state != State::TimeWait {
                c.state = State::TimeWait;
                // A REJ stays to answer retransmitted REQs; anything else is done.
                let keep = c.last.as_ref().is_some_and(|m| {
                    u16::from_be_bytes([m[16], m[17]]) == u16::from(AttributeId::Rej)
                });
                if !keep {
                    c.last = None;
                }
                c.deadline = Some(now + tw);
            }
        }
    }

    /// Passive side: an RC packet before the RTU also establishes (IBA 12.9.8.5; Linux gets
    /// `IB_EVENT_COMM_EST`). Seen as the QP's expected PSN having moved past the REP's.
    fn check_first_packet(&mut self, id: u32, now: Instant) -> bool {
        let Some(c) = self.conns.get(&id) else {
            return false;
        };
        if c.state != State::RepSent {
            return false;
        }
        let moved = c.dev.qp_psns(c.qpn).is_some_and(|(_, rq)| rq != c.rep_psn);
        if moved {
            self.establish(id, now);
        }
        moved
    }

    // ---- timers ----------------------------------------------------------------------------

    pub fn tick(&mut self, now: Instant) {
        if self.probe_at.is_some_and(|t| t <= now) {
            self.probe_at = None;
            let waiting: Vec<u32> = self
                .conns
                .values()
                .filter(|c| c.state == State::RepSent)
                .map(|c| c.local_id)
                .collect();
            let mut left = false;
            for id in waiting {
                left |= !self.check_first_packet(id, now);
            }
            if left {
                self.probe_at = Some(now + FIRST_PACKET_PROBE);
            }
        }
        let due: Vec<u32> = self
            .conns
            .values()
            .filter(|c| c.deadline.is_some_and(|d| d <= now))
            .map(|c| c.local_id)
            .collect();
        for id in due {
            self.expire(id, now);
        }
    }

    fn expire(&mut self, id: u32, now: Instant) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.state {
            State::ReqSent | State::MraRcvd | State::RepSent | State::DreqSent => {
                if c.state == State::MraRcvd {
                    c.state = State::ReqSent;
                }
                if c.retries > 0 && c.last.is_some() {
                    c.retries -= 1;
                    c.deadline = Some(now + c.timeout);
                    self.resend(id);
                    return;
                }
                if self.check_first_packet(id, now) {
                    return;
                }
                let Some(c) = self.conns.get_mut(&id) else {
                    return;
                };
                let state = c.state;
                let (qpn, qp_dev) = (c.qpn, c.dev.clone());
                if state == State::DreqSent {
                    // The peer never answered; it is gone as far as we are concerned.
                    self.enter_timewait(id, now);
                    return;
                }
                self.stats.timeouts += 1;
                c.set_phase(Phase::Failed(CmError::Timeout));
                let (tid, s, d, remote) = (c.tid, c.local.ip(), c.peer.ip(), c.remote_id);
                self.send_rej(
                    RejTo {
                        src: s,
                        dst: d,
                        tid,
                        remote_id: remote,
                        local_id: id,
                        msg: if state == State::RepSent {
                            MessageRef::Rep
                        } else {
                            MessageRef::Req
                        },
                    },
                    RejReason::Timeout,
                    &[],
                );
                qp_to_error(&qp_dev, qpn);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.last = None;
                }
                self.enter_timewait(id, now);
            }
            State::ReqRcvd => {
                // The consumer is slow: ask the peer for more time, once.
                let r = mra::Repr {
                    local_comm_id: id,
                    remote_comm_id: c.remote_id,
                    message_mraed: MessageRef::Req,
                    service_timeout: MRA_SERVICE_TIMEOUT,
                    private_data: [0; mra::PRIVATE_DATA_LEN],
                };
                c.state = State::MraSent;
                c.deadline = Some(now + cm_timeout(MRA_SERVICE_TIMEOUT) + c.timeout);
                let (tid, s, d) = (c.tid, c.local.ip(), c.peer.ip());
                let bytes = self.send(s, d, &Mad::new(tid, CmMessage::Mra(r)));
                if let Some(c) = self.conns.get_mut(&id) {
                    c.last = Some(bytes);
                }
            }
            State::MraSent => {
                // Even the extra time ran out: the peer has given up by now.
                self.stats.timeouts += 1;
                c.set_phase(Phase::Failed(CmError::Timeout));
                let (tid, s, d, remote) = (c.tid, c.local.ip(), c.peer.ip(), c.remote_id);
                let bytes = self.send_rej(
                    RejTo {
                        src: s,
                        dst: d,
                        tid,
                        remote_id: remote,
                        local_id: id,
                        msg: MessageRef::Req,
                    },
                    RejReason::Timeout,
                    &[],
                );
                if let Some(c) = self.conns.get_mut(&id) {
                    c.last = Some(bytes);
                }
                self.enter_timewait(id, now);
            }
            State::Established => {
                c.deadline = Some(now + QP_CHECK);
                let ok = c
                    .dev
                    .qp_state(c.qpn)
                    .is_some_and(|s| !matches!(s, QpState::Err | QpState::Reset));
                if !ok {
                    self.disconnect(id, now);
                }
            }
            State::TimeWait => self.drop_conn(id),
        }
    }

    // ---- consumer calls ---------------------------------------------------------------------

    pub fn comm_ids(&self) -> Vec<(u32, u32)> {
        self.conns.values().map(|c| (c.local_id, c.qpn)).collect()
    }

    pub fn addrs(&self, id: u32) -> Option<(SocketAddr, SocketAddr)> {
        self.conns.get(&id).map(|c| (c.local, c.peer))
    }

    /// The private data of the REP that accepted an active connection (empty otherwise).
    pub fn rep_private(&self, id: u32) -> Option<Box<[u8]>> {
        self.conns.get(&id).map(|c| c.rep_private.clone())
    }

    pub fn phase(&self, id: u32) -> Option<watch::Receiver<Phase>> {
        self.conns.get(&id).map(|c| c.phase.subscribe())
    }

    /// Passive accept: QP to RTS, then the REP.
    pub fn accept(
        &mut self,
        id: u32,
        dev: &Device,
        qpn: u32,
        p: &ConnParams,
        now: Instant,
    ) -> Result<(), CmError> {
        if p.private_data.len() > rep::PRIVATE_DATA_LEN {
            return Err(CmError::InvalidArgument(
                "private data longer than 196 bytes",
            ));
        }
        let Some(c) = self.conns.get(&id) else {
            return Err(CmError::Timeout);
        };
        match c.state {
            State::ReqRcvd | State::MraSent => {}
            State::TimeWait => {
                return Err(match c.phase.borrow().clone() {
                    Phase::Failed(e) => e,
                    _ => CmError::Timeout,
                })
            }
            _ => return Err(CmError::InvalidArgument("request already answered")),
        }
        if self
            .conns
            .values()
            .any(|o| o.qpn == qpn && o.state != State::TimeWait)
        {
            return Err(CmError::InvalidArgument("QP already connected"));
        }
        let req = *c.req;
        let (local, peer, tid) = (c.local, c.peer, c.tid);
        let attr = self.dev.attr().clone();
        // Our initiator depth is bounded by the peer's responder resources (docs/WIRE.md §4);
        // like ib_srpt we offer responder resources up to the device's limit.
        let initiator_depth = p
            .initiator_depth
            .min(req.responder_resources)
            .min(attr.max_qp_init_rd_atom.min(255) as u8);
        let responder_resources = p
            .responder_resources
            .min(attr.max_qp_rd_atom.min(255) as u8);
        let rep_psn = self.random() & crate::wire::U24_MASK;
        self.rts_passive(
            dev,
            qpn,
            local.ip(),
            peer.ip(),
            &req,
            rep_psn,
            initiator_depth,
            responder_resources,
            p,
        )
        .map_err(CmError::Verbs)?;
        let mut r = rep::Repr {
            local_comm_id: id,
            remote_comm_id: req.local_comm_id,
            local_qkey: 0,
            local_qpn: qpn,
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: rep_psn,
            responder_resources,
            initiator_depth,
            target_ack_delay: attr.local_ca_ack_delay,
            failover_accepted: 0,
            e2e_flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: p.srq,
            local_ca_guid: attr.node_guid,
            private_data: [0; rep::PRIVATE_DATA_LEN],
        };
        r.private_data[..p.private_data.len()].copy_from_slice(&p.private_data);
        let bytes = self.send(local.ip(), peer.ip(), &Mad::new(tid, CmMessage::Rep(r)));
        let Some(c) = self.conns.get_mut(&id) else {
            return Err(CmError::Timeout);
        };
        c.qpn = qpn;
        c.dev = dev.clone();
        c.rep_psn = rep_psn;
        c.state = State::RepSent;
        self.probe_at.get_or_insert(now + FIRST_PACKET_PROBE);
        c.last = Some(bytes);
        // The peer answers within its own "local CM response timeout".
        c.timeout = cm_timeout(req.local_cm_response_timeout);
        c.retries = req.max_cm_retries;
        c.deadline = Some(now + c.timeout);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn rts_passive(
        &self,
        dev: &Device,
        qpn: u32,
        local: IpAddr,
        peer: IpAddr,
        req: &req::Repr,
        rep_psn: u32,
        initiator_depth: u8,
        responder_resources: u8,
        p: &ConnParams,
    ) -> Result<(), VerbsError> {
        let path = &req.primary_path;
        let mtu = req
            .path_mtu
            .bytes()
            .and_then(Mtu::from_bytes)
            .ok_or(VerbsError::InvalidArgument("path MTU"))?;
        init_qp(dev, qpn)?;
        let mut av = self.av(local, peer)?;
        av.traffic_class = path.traffic_class;
        av.flow_label = path.flow_label;
        use QpAttrMask as M;
        // Each side sends from the PSN the other one announced (as Linux peers do).
        let mut a = QpAttr {
            qp_state: Some(QpState::Rtr),
            av,
            path_mtu: Some(mtu),
            dest_qp_num: req.local_qpn,
            rq_psn: rep_psn,
            max_dest_rd_atomic: responder_resources,
            min_rnr_timer: p.min_rnr_timer.min(31),
            ..Default::default()
        };
        dev.modify_qp(
            qpn,
            &a,
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
        )?;
        a.qp_state = Some(QpState::Rts);
        a.sq_psn = req.starting_psn;
        a.timeout = if path.local_ack_timeout == 0 {
            p.ack_timeout
        } else {
            path.local_ack_timeout
        }
        .min(31);
        a.retry_cnt = qp_retry_count(req.retry_count);
        // The RNR retry count we announce in the REP is the one our QP uses too.
        a.rnr_retry = p.rnr_retry_count.min(7);
        a.max_rd_atomic = initiator_depth;
        dev.modify_qp(
            qpn,
            &a,
            M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
        )
    }

    fn rts_active(
        &self,
        dev: &Device,
        qpn: u32,
        local: IpAddr,
        peer: IpAddr,
        req: &req::Repr,
        r: &rep::Repr,
    ) -> Result<(), VerbsError> {
        let mtu = req
            .path_mtu
            .bytes()
            .and_then(Mtu::from_bytes)
            .ok_or(VerbsError::InvalidArgument("path MTU"))?;
        let attr = self.dev.attr();
        use QpAttrMask as M;
        let mut a = QpAttr {
            qp_state: Some(QpState::Rtr),
            av: self.av(local, peer)?,
            path_mtu: Some(mtu),
            dest_qp_num: r.local_qpn,
            rq_psn: req.starting_psn,
            max_dest_rd_atomic: r.initiator_depth.min(attr.max_qp_rd_atom.min(255) as u8),
            min_rnr_timer: 12,
            ..Default::default()
        };
        dev.modify_qp(
            qpn,
            &a,
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
        )?;
        a.qp_state = Some(QpState::Rts);
        a.sq_psn = r.starting_psn;
        a.timeout = req.primary_path.local_ack_timeout.min(31);
        a.retry_cnt = qp_retry_count(req.retry_count);
        a.rnr_retry = r.rnr_retry_count.min(7);
        a.max_rd_atomic = r
            .responder_resources
            .min(req.initiator_depth)
            .min(attr.max_qp_init_rd_atom.min(255) as u8);
        dev.modify_qp(
            qpn,
            &a,
            M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
        )
    }

    fn av(&self, local: IpAddr, peer: IpAddr) -> Result<AddressVector, VerbsError> {
        let mut av = AddressVector::new(peer);
        av.sgid_index = self
            .dev
            .gid_index(local)
            .ok_or(VerbsError::InvalidArgument("local address"))?;
        Ok(av)
    }

    /// Passive reject (REJ reason 28 with the consumer's private data).
    pub fn reject(&mut self, id: u32, private: &[u8], now: Instant) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if !matches!(c.state, State::ReqRcvd | State::MraSent) {
            return;
        }
        let (tid, s, d, remote) = (c.tid, c.local.ip(), c.peer.ip(), c.remote_id);
        let bytes = self.send_rej(
            RejTo {
                src: s,
                dst: d,
                tid,
                remote_id: remote,
                local_id: id,
                msg: MessageRef::Req,
            },
            RejReason::ConsumerDefined,
            private,
        );
        if let Some(c) = self.conns.get_mut(&id) {
            c.last = Some(bytes);
            c.set_phase(Phase::Failed(CmError::Disconnected));
        }
        self.enter_timewait(id, now);
    }

    /// Active connect: QP to INIT, then the REQ.
    pub fn connect(
        &mut self,
        dev: &Device,
        qpn: u32,
        local: IpAddr,
        dst: SocketAddr,
        p: &ConnParams,
        now: Instant,
    ) -> Result<u32, CmError> {
        if p.private_data.len() > req::PRIVATE_DATA_LEN - cma::HEADER_LEN {
            return Err(CmError::InvalidArgument(
                "private data longer than 56 bytes",
            ));
        }
        if self.conns.len() >= self.limits.max_connections {
            return Err(CmError::TooManyConnections);
        }
        if self
            .conns
            .values()
            .any(|o| o.qpn == qpn && o.state != State::TimeWait)
        {
            return Err(CmError::InvalidArgument("QP already connected"));
        }
        init_qp(dev, qpn).map_err(CmError::Verbs)?;
        let id = self.alloc_id();
        let src_port = 0xC000 | (self.random() as u16 & 0x3FFF);
        let attr = self.dev.attr().clone();
        let mut private = [0u8; req::PRIVATE_DATA_LEN];
        cma::Repr {
            src_port,
            src_addr: local,
            dst_addr: dst.ip(),
        }
        .emit(&mut cma::Packet::new_unchecked(&mut private[..]));
        private[cma::HEADER_LEN..cma::HEADER_LEN + p.private_data.len()]
            .copy_from_slice(&p.private_data);
        let r = req::Repr {
            local_comm_id: id,
            vendor_id: 0,
            service_id: cma::service_id(cma::PortSpace::Tcp, dst.port()),
            local_ca_guid: attr.node_guid,
            local_qkey: 0,
            local_qpn: qpn,
            responder_resources: p
                .responder_resources
                .min(attr.max_qp_rd_atom.min(255) as u8),
            local_eecn: 0,
            initiator_depth: p
                .initiator_depth
                .min(attr.max_qp_init_rd_atom.min(255) as u8),
            remote_eecn: 0,
            remote_cm_response_timeout: p.cm_response_timeout.min(31),
            transport_service_type: TransportServiceType::Rc,
            e2e_flow_control: p.flow_control,
            starting_psn: self.random() & crate::wire::U24_MASK,
            local_cm_response_timeout: p.cm_response_timeout.min(31),
            retry_count: p.retry_count.min(7),
            pkey: 0xFFFF,
            path_mtu: mtu_code(self.dev.port_mtu()),
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count.min(7),
            max_cm_retries: p.max_cm_retries.min(15),
            srq: p.srq,
            extended_transport_type: 0,
            primary_path: path::Repr {
                local_lid: 0xFFFF,
                remote_lid: 0xFFFF,
                local_gid: cma::gid_from_ip(local),
                remote_gid: cma::gid_from_ip(dst.ip()),
                flow_label: 0,
                packet_rate: 0,
                traffic_class: 0,
                hop_limit: 64,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: p.ack_timeout.min(31),
            },
            alternate_path: path::Repr::default(),
            sap_supported: false,
            private_data: private,
        };
        let tid = TID_HIGH | u64::from(id.swap_bytes());
        let bytes = self.send(local, dst.ip(), &Mad::new(tid, CmMessage::Req(r)));
        let (phase, _) = watch::channel(Phase::Pending);
        let timeout = cm_timeout(p.cm_response_timeout);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqSent,
                active: true,
                local_id: id,
                remote_id: 0,
                local: SocketAddr::new(local, src_port),
                peer: dst,
                qpn,
                dev: dev.clone(),
                remote_qpn: 0,
                tid,
                last: Some(bytes),
                retries: r.max_cm_retries,
                timeout,
                deadline: Some(now + timeout),
                req: Box::new(r),
                rep_psn: 0,
                rep_private: Box::default(),
                phase,
                next_phase: None,
            },
        );
        Ok(id)
    }

    /// Disconnect (idempotent): DREQ from an established connection, REJ from one being
    /// set up, and the QP to the error state so that posted work flushes.
    pub fn disconnect(&mut self, id: u32, now: Instant) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let (qpn, qp_dev) = (c.qpn, c.dev.clone());
        match c.state {
            State::Established => {
                c.set_phase(Phase::Disconnected);
                let r = dreq::Repr {
                    local_comm_id: id,
                    remote_comm_id: c.remote_id,
                    remote_qpn: c.remote_qpn,
                    private_data: [0; dreq::PRIVATE_DATA_LEN],
                };
                // The active side reuses the REQ's TID; the passive side starts its own.
                let tid = if c.active {
                    c.tid
                } else {
                    TID_HIGH | u64::from(id.swap_bytes())
                };
                let (s, d) = (c.local.ip(), c.peer.ip());
                c.state = State::DreqSent;
                c.retries = c.req.max_cm_retries;
                c.deadline = Some(now + c.timeout);
                let bytes = self.send(s, d, &Mad::new(tid, CmMessage::Dreq(r)));
                if let Some(c) = self.conns.get_mut(&id) {
                    c.last = Some(bytes);
                }
                qp_to_error(&qp_dev, qpn);
            }
            State::ReqSent | State::MraRcvd | State::RepSent | State::ReqRcvd | State::MraSent => {
                c.set_phase(Phase::Failed(CmError::Disconnected));
                let (tid, s, d, remote) = (c.tid, c.local.ip(), c.peer.ip(), c.remote_id);
                let reason = if c.active {
                    RejReason::Timeout
                } else {
                    RejReason::ConsumerDefined
                };
                let msg = if c.state == State::RepSent {
                    MessageRef::Rep
                } else {
                    MessageRef::Req
                };
                let bytes = self.send_rej(
                    RejTo {
                        src: s,
                        dst: d,
                        tid,
                        remote_id: remote,
                        local_id: id,
                        msg,
                    },
                    reason,
                    &[],
                );
                if let Some(c) = self.conns.get_mut(&id) {
                    c.last = Some(bytes);
                }
                qp_to_error(&qp_dev, qpn);
                self.enter_timewait(id, now);
            }
            State::DreqSent | State::TimeWait => {}
        }
    }
}

/// Moves QP `qpn` of `dev` to the error state (nothing for 0, a QP not known yet).
fn qp_to_error(dev: &Device, qpn: u32) {
    if qpn != 0 {
        let a = QpAttr {
            qp_state: Some(QpState::Err),
            ..Default::default()
        };
        let _ = dev.modify_qp(qpn, &a, QpAttrMask::STATE);
    }
}

/// Moves QP `qpn` from RESET to INIT with the access rights a connection gets (local write,
/// remote read, write and atomic); a QP already in INIT is left as it is.
pub(crate) fn init_qp(dev: &Device, qpn: u32) -> Result<(), VerbsError> {
    match dev.qp_state(qpn) {
        Some(QpState::Reset) => {}
        Some(QpState::Init) => return Ok(()),
        Some(s) => return Err(VerbsError::InvalidState(s)),
        None => return Err(VerbsError::InvalidArgument("qp")),
    }
    let a = QpAttr {
        qp_state: Some(QpState::Init),
        qp_access_flags: Some(
            Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
        ),
        port_num: 1,
        ..Default::default()
    };
    use QpAttrMask as M;
    dev.modify_qp(
        qpn,
        &a,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
}
