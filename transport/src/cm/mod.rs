//! The connection manager: the IB CM over QP1 with rdma_cm addressing (IBA 12; docs/WIRE.md
//! §4–§5), as Linux initiators (ib_iser, ib_srp, rping) expect it of a RoCEv2 peer.
//!
//! One [`Cm`] per [`Device`] owns QP1. Consumers own their PD, CQ and RC QP (created in
//! RESET, or moved to INIT with [`prepare_qp`] to post receives first) and hand the QP to
//! [`ConnectRequest::accept`] or [`Cm::connect`]; the CM drives it to INIT, RTR and RTS with
//! the negotiated attributes and to ERR on disconnect.
//!
//! * Passive: [`Cm::listen`] on an IP address (or a wildcard) and port of the RDMA_PS_TCP
//!   port space; [`CmListener::accept`] yields each validated REQ as a [`ConnectRequest`]
//!   (peer and local address from the cma header and the datagram, the consumer's private
//!   data). A REQ nobody listens for gets REJ 8 at once; a full backlog REJ 3; a consumer
//!   that neither accepts nor rejects within half the peer's response timeout gets an MRA
//!   sent on its behalf.
//! * Active: [`Cm::connect`] sends the REQ and resolves once REP and RTU went by, or with the
//!   REJ reason and private data ([`CmError::Rejected`]) or a timeout.
//! * [`CmConn`] is the established connection: [`CmConn::disconnected`] resolves on DREQ,
//!   QP error or a vanished peer; dropping it disconnects.
//!
//! Replies leave from the address the peer connected to. Every table is bounded
//! ([`CmLimits`]).
//!
//! A passive consumer (an iSER or SRP target) looks like this:
//!
//! ```no_run
//! # async fn serve(hca: &rtgt_transport::hca::Hca) -> Result<(), Box<dyn std::error::Error>> {
//! use rtgt_transport::cm::{prepare_qp, ConnParams};
//! use rtgt_transport::verbs::{QpInitAttr, QpType};
//!
//! let dev = hca.device();
//! let mut listener = hca.cm().listen("0.0.0.0:3260".parse()?)?;
//! while let Some(req) = listener.accept().await {
//!     // req.private_data(): the initiator's bytes after the cma header.
//!     let pd = dev.alloc_pd()?;
//!     let cq = dev.create_cq(256)?;
//!     let qp = pd.create_qp(QpInitAttr::new(QpType::Rc, &cq, &cq))?;
//!     prepare_qp(&qp)?; // INIT: receives can be posted before the peer may send
//!     let params = ConnParams {
//!         private_data: vec![0x80, 0, 0, 0],
//!         ..ConnParams::default()
//!     };
//!     let conn = req.accept(&qp, params).await?;
//!     conn.disconnected().await; // DREQ, QP error or conn.disconnect()
//! }
//! # Ok(())
//! # }
//! ```

mod core;
pub(crate) mod gsi;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch, Notify};

use self::core::{Core, Phase};
use crate::verbs::{Device, Mtu, Qp, QpType, VerbsError};
use crate::wire::cm::RejReason;
use crate::wire::cma;

pub use crate::wire::cm::RejReason as Reason;

/// Errors of CM calls and connection attempts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// The peer answered with a REJ; `private_data` is the REJ's whole private data area.
    #[error("rejected by the peer: {reason:?}")]
    Rejected {
        reason: RejReason,
        private_data: Vec<u8>,
    },
    #[error("no answer from the peer")]
    Timeout,
    #[error("disconnected")]
    Disconnected,
    #[error("{0} is already listened on")]
    AddrInUse(SocketAddr),
    #[error("{0} is not an address of this device")]
    AddressNotAvailable(IpAddr),
    #[error("connection table full")]
    TooManyConnections,
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    #[error("QP: {0}")]
    Verbs(VerbsError),
    #[error("the connection manager has stopped")]
    Stopped,
}

/// Bounds of the CM's tables.
#[derive(Debug, Clone, Copy)]
pub struct CmLimits {
    /// Connections in any state, timewait included; a REQ beyond it gets REJ 3.
    pub max_connections: usize,
    /// Connect requests waiting in a listener for the consumer; beyond it REJ 3.
    pub backlog: usize,
    pub max_listeners: usize,
    /// How long a closed connection's IDs stay reserved (stale REQs get REJ 10).
    pub timewait: Duration,
}

impl Default for CmLimits {
    fn default() -> Self {
        CmLimits {
            max_connections: 1024,
            backlog: 64,
            max_listeners: 256,
            timewait: Duration::from_secs(1),
        }
    }
}

/// Connection parameters (`struct rdma_conn_param` and the CM's timing).
#[derive(Debug, Clone)]
pub struct ConnParams {
    /// The consumer's private data: at most 56 bytes in a REQ (after the cma header), 196 in
    /// a REP.
    pub private_data: Vec<u8>,
    /// RDMA READs and atomics this side accepts in flight (our QP's max_dest_rd_atomic).
    pub responder_resources: u8,
    /// RDMA READs and atomics this side issues in flight (our QP's max_rd_atomic); bounded
    /// by the peer's responder resources.
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// End-to-end flow control bit of REQ/REP.
    pub flow_control: bool,
    pub srq: bool,
    /// CM response timeout announced in the REQ (4.096 µs × 2^n; Linux uses 20, ~4 s), also
    /// the active side's REQ retransmission interval.
    pub cm_response_timeout: u8,
    /// REQ retransmissions (at most 15).
    pub max_cm_retries: u8,
    /// The RC QP's local ACK timeout (4.096 µs × 2^n) when the REQ does not give one.
    pub ack_timeout: u8,
    /// Responder's RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// Active side: the local address to connect from (default: one of the device's
    /// addresses of the destination's family).
    pub local_addr: Option<IpAddr>,
}

impl Default for ConnParams {
    fn default() -> Self {
        ConnParams {
            private_data: Vec::new(),
            responder_resources: 16,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
            flow_control: false,
            srq: false,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            ack_timeout: 16,
            min_rnr_timer: 12,
            local_addr: None,
        }
    }
}

/// Messages counted by type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MsgCounts {
    pub req: u64,
    pub mra: u64,
    pub rej: u64,
    pub rep: u64,
    pub rtu: u64,
    pub dreq: u64,
    pub drep: u64,
    pub other: u64,
}

/// CM counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmStats {
    pub sent: MsgCounts,
    pub received: MsgCounts,
    pub rejects_sent: u64,
    pub rejects_received: u64,
    /// Exchanges abandoned after the last retransmission.
    pub timeouts: u64,
    /// MADs dropped: malformed, not CM, or the send queue full.
    pub dropped: u64,
    /// Established connections.
    pub live_connections: u64,
    /// Table entries, timewait included.
    pub connections: u64,
}

pub(crate) struct Shared {
    core: Mutex<Core>,
    gsi: gsi::Gsi,
    wake: Arc<Notify>,
}

impl Shared {
    fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends the queued MADs through QP1 and wakes the task, whose timers may have changed.
    fn flush(&self, core: &mut Core) {
        self.send_queued(core);
        self.wake.notify_one();
    }

    fn send_queued(&self, core: &mut Core) {
        core.publish();
        while let Some(o) = core.out.pop_front() {
            if !self.gsi.send(o.src, o.dst, &o.mad[..]) {
                core.count_send_failure();
            }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

/// The connection manager of one device (cheap to clone).
#[derive(Clone)]
pub struct Cm {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Cm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cm")
            .field("device", &self.shared.gsi.dev.name())
            .finish()
    }
}

impl Cm {
    /// Creates QP1 on `dev` and starts the CM's task on the current tokio runtime.
    pub fn start(dev: &Device) -> Result<Cm, CmError> {
        Cm::start_with(dev, CmLimits::default())
    }

    pub fn start_with(dev: &Device, limits: CmLimits) -> Result<Cm, CmError> {
        let cm = Cm::new(dev, limits)?;
        tokio::spawn(run(
            Arc::downgrade(&cm.shared),
            cm.shared.gsi.cq.clone(),
            cm.shared.wake.clone(),
        ));
        Ok(cm)
    }

    /// A CM without its task: MADs go in through [`Cm::receive_mad`], time through
    /// [`Cm::tick`] (for tests and fuzzing).
    pub fn new(dev: &Device, limits: CmLimits) -> Result<Cm, CmError> {
        Cm::with_seed(dev, limits, None)
    }

    /// [`Cm::new`] with communication IDs and PSNs drawn from `seed` (reproducible runs).
    pub fn with_seed(dev: &Device, limits: CmLimits, seed: Option<u64>) -> Result<Cm, CmError> {
        let gsi = gsi::Gsi::open(dev).map_err(CmError::Verbs)?;
        let shared = Arc::new_cyclic(|weak: &Weak<Shared>| Shared {
            core: Mutex::new(Core::new(dev.clone(), limits, weak.clone(), seed)),
            gsi,
            wake: Arc::new(Notify::new()),
        });
        Ok(Cm { shared })
    }

    pub fn device(&self) -> &Device {
        &self.shared.gsi.dev
    }

    /// Listens on `addr` (RDMA_PS_TCP; the IP may be a wildcard).
    pub fn listen(&self, addr: SocketAddr) -> Result<CmListener, CmError> {
        let mut core = self.shared.core();
        let backlog = core.limits.backlog;
        let (id, rx) = core.listen(addr, backlog)?;
        Ok(CmListener {
            cm: self.clone(),
            id,
            addr,
            rx,
        })
    }

    /// Connects `qp` (RC, in RESET or INIT) to the listener at `dst`.
    pub async fn connect(
        &self,
        qp: &Qp,
        dst: SocketAddr,
        params: ConnParams,
    ) -> Result<CmConn, CmError> {
        if qp.qp_type() != QpType::Rc {
            return Err(CmError::InvalidArgument("not an RC QP"));
        }
        let local = match params.local_addr {
            Some(a) => a,
            None => self
                .pick_local(dst.ip())
                .ok_or(CmError::AddressNotAvailable(dst.ip()))?,
        };
        if self.device().gid_index(local).is_none() {
            return Err(CmError::AddressNotAvailable(local));
        }
        let (id, phase) = {
            let mut core = self.shared.core();
            let id = core.connect(qp.device(), qp.qpn(), local, dst, &params, Instant::now())?;
            let phase = core.phase(id).ok_or(CmError::Stopped)?;
            self.shared.flush(&mut core);
            (id, phase)
        };
        let mut conn = self.conn_handle(id)?;
        wait_established(phase).await?;
        conn.private_data = self.shared.core().rep_private(id).unwrap_or_default();
        Ok(conn)
    }

    fn conn_handle(&self, id: u32) -> Result<CmConn, CmError> {
        let core = self.shared.core();
        let phase = core.phase(id).ok_or(CmError::Stopped)?;
        let (local, peer) = core.addrs(id).ok_or(CmError::Stopped)?;
        Ok(CmConn {
            cm: self.clone(),
            id,
            local,
            peer,
            phase,
            private_data: Box::default(),
        })
    }

    /// A local address of `dst`'s family: `dst` itself, then a non-loopback one, then any.
    fn pick_local(&self, dst: IpAddr) -> Option<IpAddr> {
        let addrs: Vec<IpAddr> = self
            .device()
            .gid_table()
            .iter()
            .map(|g| g.to_ip())
            .filter(|a| a.is_ipv4() == dst.is_ipv4())
            .collect();
        if addrs.contains(&dst) {
            return Some(dst);
        }
        addrs
            .iter()
            .find(|a| a.is_loopback() == dst.is_loopback())
            .or(addrs.first())
            .copied()
    }

    pub fn stats(&self) -> CmStats {
        self.shared.core().stats()
    }

    /// Hands the CM one MAD received on QP1 (what its task does with every receive).
    pub fn receive_mad(&self, src: IpAddr, dst: IpAddr, mad: &[u8]) {
        let mut core = self.shared.core();
        core.on_mad(src, dst, mad, Instant::now());
        self.shared.flush(&mut core);
    }

    /// The local communication IDs in the table with their QP numbers (0 before a QP is
    /// bound), in no particular order.
    pub fn comm_ids(&self) -> Vec<(u32, u32)> {
        self.shared.core().comm_ids()
    }

    /// Runs the timers due at `now`.
    pub fn tick(&self, now: Instant) {
        let mut core = self.shared.core();
        core.tick(now);
        self.shared.flush(&mut core);
    }

    fn with_core<R>(&self, f: impl FnOnce(&mut Core) -> R) -> R {
        let mut core = self.shared.core();
        let r = f(&mut core);
        self.shared.flush(&mut core);
        r
    }
}

/// Moves `qp` (RC, in RESET) to INIT as [`ConnectRequest::accept`] and [`Cm::connect`]
/// would, so receives can be posted before the connection exists (the peer may send as soon
/// as it is established). Accept and connect take the QP in RESET or INIT.
pub fn prepare_qp(qp: &Qp) -> Result<(), CmError> {
    if qp.qp_type() != QpType::Rc {
        return Err(CmError::InvalidArgument("not an RC QP"));
    }
    core::init_qp(qp.device(), qp.qpn()).map_err(CmError::Verbs)
}

async fn wait_established(mut phase: watch::Receiver<Phase>) -> Result<(), CmError> {
    loop {
        match phase.borrow_and_update().clone() {
            Phase::Established => return Ok(()),
            Phase::Failed(e) => return Err(e),
            Phase::Disconnected => return Err(CmError::Disconnected),
            Phase::Pending => {}
        }
        if phase.changed().await.is_err() {
            return Err(CmError::Stopped);
        }
    }
}

/// The CM's task: MADs from QP1's CQ, timers at their deadlines.
async fn run(shared: Weak<Shared>, cq: crate::verbs::Cq, wake: Arc<Notify>) {
    let mut wcs = Vec::new();
    loop {
        let Some(s) = shared.upgrade() else { return };
        let (busy, deadline) = step(&s, &mut wcs);
        drop(s);
        if busy {
            tokio::task::yield_now().await;
            continue;
        }
        let sleep = deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_secs(3600));
        tokio::select! {
            _ = cq.wait_nonempty() => {}
            _ = wake.notified() => {}
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

/// Receives what QP1 has, runs the timers and sends; returns whether MADs came in and the
/// next deadline.
fn step(s: &Shared, wcs: &mut Vec<crate::verbs::WorkCompletion>) -> (bool, Option<Instant>) {
    wcs.clear();
    s.gsi.cq.poll_into(wcs, gsi::RECV_DEPTH as usize);
    let mut core = s.core();
    let now = Instant::now();
    for wc in wcs.iter() {
        if let Some(m) = s.gsi.take(wc) {
            core.on_mad(m.src, m.dst, &m.mad, now);
        }
    }
    core.tick(now);
    s.send_queued(&mut core);
    (!wcs.is_empty(), core.next_deadline())
}

/// A listening endpoint; dropping it stops the listening (later REQs get REJ 8).
#[derive(Debug)]
pub struct CmListener {
    cm: Cm,
    id: u64,
    addr: SocketAddr,
    rx: mpsc::Receiver<ConnectRequest>,
}

impl CmListener {
    /// The next connect request; `None` once the CM has stopped.
    pub async fn accept(&mut self) -> Option<ConnectRequest> {
        self.rx.recv().await
    }

    /// A connect request if one is waiting.
    pub fn try_accept(&mut self) -> Option<ConnectRequest> {
        self.rx.try_recv().ok()
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for CmListener {
    fn drop(&mut self) {
        // Requests still queued are rejected as they drop (outside the CM's lock).
        self.rx.close();
        while let Ok(cr) = self.rx.try_recv() {
            drop(cr);
        }
        let id = self.id;
        self.cm.with_core(|c| c.unlisten(id));
    }
}

/// A REQ waiting for the consumer: accept or reject it (dropping it rejects).
#[derive(Debug)]
pub struct ConnectRequest {
    cm: Cm,
    id: u32,
    peer: SocketAddr,
    local: SocketAddr,
    req: Box<crate::wire::cm::req::Repr>,
    answered: bool,
}

impl ConnectRequest {
    /// The peer: its address and the source port of its cma header.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The address and port the peer connected to.
    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// The consumer's bytes after the cma header (56 bytes, zero padded by the peer).
    pub fn private_data(&self) -> &[u8] {
        &self.req.private_data[cma::HEADER_LEN..]
    }

    pub fn responder_resources(&self) -> u8 {
        self.req.responder_resources
    }

    pub fn initiator_depth(&self) -> u8 {
        self.req.initiator_depth
    }

    pub fn path_mtu(&self) -> Mtu {
        self.req
            .path_mtu
            .bytes()
            .and_then(Mtu::from_bytes)
            .unwrap_or(Mtu::Mtu256)
    }

    /// The REQ as received.
    pub fn req(&self) -> &crate::wire::cm::req::Repr {
        &self.req
    }

    /// Accepts with `qp` (RC, in RESET or INIT): drives it to RTS, sends the REP and resolves once
    /// the connection is established (RTU or the first packet on the QP).
    pub async fn accept(mut self, qp: &Qp, params: ConnParams) -> Result<CmConn, CmError> {
        self.answered = true;
        if qp.qp_type() != QpType::Rc {
            self.reject(&[]);
            return Err(CmError::InvalidArgument("not an RC QP"));
        }
        let id = self.id;
        let phase = self.cm.with_core(|c| {
            let r = c.accept(id, qp.device(), qp.qpn(), &params, Instant::now());
            if r.is_err() {
                c.reject(id, &[], Instant::now());
            }
            r.and_then(|()| c.phase(id).ok_or(CmError::Stopped))
        })?;
        let conn = self.cm.conn_handle(id)?;
        wait_established(phase).await?;
        Ok(conn)
    }

    /// Rejects with REJ reason 28 (consumer defined) carrying `private_data` (at most 148
    /// bytes are sent).
    pub fn reject(mut self, private_data: &[u8]) {
        self.answered = true;
        let id = self.id;
        self.cm
            .with_core(|c| c.reject(id, private_data, Instant::now()));
    }
}

impl Drop for ConnectRequest {
    fn drop(&mut self) {
        if !self.answered {
            let id = self.id;
            self.cm.with_core(|c| c.reject(id, &[], Instant::now()));
        }
    }
}

/// An established connection; dropping it disconnects.
#[derive(Debug)]
pub struct CmConn {
    cm: Cm,
    id: u32,
    local: SocketAddr,
    peer: SocketAddr,
    phase: watch::Receiver<Phase>,
    /// Active side: the private data of the accepting REP.
    private_data: Box<[u8]>,
}

impl CmConn {
    /// The private data of the REP that accepted a connection made with [`Cm::connect`]
    /// (all 196 bytes of the REP's field, zero-padded); empty for accepted connections.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// Resolves when the connection is over: DREQ received, our own disconnect, the QP in
    /// the error state, or the peer gone.
    pub async fn disconnected(&self) {
        let mut phase = self.phase.clone();
        loop {
            if !matches!(
                *phase.borrow_and_update(),
                Phase::Established | Phase::Pending
            ) {
                return;
            }
            if phase.changed().await.is_err() {
                return;
            }
        }
    }

    /// True once [`CmConn::disconnected`] would resolve.
    pub fn is_disconnected(&self) -> bool {
        !matches!(*self.phase.borrow(), Phase::Established | Phase::Pending)
    }

    /// Sends a DREQ (once) and moves the QP to the error state so posted work flushes.
    pub fn disconnect(&self) {
        let id = self.id;
        self.cm.with_core(|c| c.disconnect(id, Instant::now()));
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// The local communication ID (for logs).
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for CmConn {
    fn drop(&mut self) {
        self.disconnect();
    }
}
