//! The two providers the channel layer runs on, behind one set of types:
//!
//! * `soft`: rtgt's own RoCEv2 engine over a UDP socket ([`rtgt_transport::verbs`]), for
//!   targets without an RDMA NIC;
//! * `verbs`: rdma-core ([`rtgt_transport::rdmacore`]) driving an RDMA NIC's queues (mlx5,
//!   irdma, ... or the kernel's rdma_rxe), with librdmacm making the connections.
//!
//! Work requests, scatter/gather entries and completions are the engine's types either way;
//! the `verbs` side turns them into rdma-core's as it posts and polls. Nothing above this
//! module knows which provider runs.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rtgt_transport::poll::PollBudget;
use rtgt_transport::rdmacore::{self as rc, RdmaCoreError};
use rtgt_transport::verbs::{
    self as soft, Access, QpAttr, QpAttrMask, QpState, RecvWr, Region, SendWr, Sge, VerbsError,
    WorkCompletion,
};

use crate::lock;

/// A provider's failure.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error(transparent)]
    Soft(#[from] VerbsError),
    #[error(transparent)]
    Verbs(#[from] RdmaCoreError),
}

/// Which provider a resource belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Soft,
    Verbs,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Soft => "soft",
            Kind::Verbs => "verbs",
        }
    }
}

/// A protection domain.
#[derive(Clone)]
pub enum Pd {
    Soft(soft::Pd),
    Verbs(Arc<rc::res::Pd>),
}

impl From<soft::Pd> for Pd {
    fn from(pd: soft::Pd) -> Pd {
        Pd::Soft(pd)
    }
}

impl Pd {
    pub fn kind(&self) -> Kind {
        match self {
            Pd::Soft(_) => Kind::Soft,
            Pd::Verbs(_) => Kind::Verbs,
        }
    }

    /// The engine's PD (the in-repo initiators run on the soft engine only).
    pub fn soft(&self) -> Option<&soft::Pd> {
        match self {
            Pd::Soft(pd) => Some(pd),
            Pd::Verbs(_) => None,
        }
    }

    /// Registers all of `region` with `access`.
    pub fn reg_mr(&self, region: Arc<Region>, access: Access) -> Result<Mr, ProviderError> {
        Ok(match self {
            Pd::Soft(pd) => Mr::Soft(pd.reg_mr(region, access)?),
            // The engine's access flags have ib_access_flags' values.
            Pd::Verbs(pd) => Mr::Verbs(pd.reg_mr(region, access.bits())?),
        })
    }

    /// A completion queue of at least `depth` entries on the PD's device.
    pub fn create_cq(&self, depth: u32) -> Result<Cq, ProviderError> {
        Ok(match self {
            Pd::Soft(pd) => Cq::Soft(pd.device().create_cq(depth)?),
            Pd::Verbs(pd) => Cq::Verbs(Arc::new(VerbsCq::new(rc::res::Cq::create(
                pd.context(),
                depth,
            )?))),
        })
    }
}

/// A registered memory region.
pub enum Mr {
    Soft(soft::Mr),
    Verbs(rc::res::Mr),
}

impl Mr {
    /// The SGE of bytes `offset..offset + len` of the region.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        match self {
            Mr::Soft(m) => m.sge(offset, len),
            Mr::Verbs(m) => {
                let s = m.sge(offset, len);
                Sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                }
            }
        }
    }

    /// The engine's MR (fast registration is the soft engine's here).
    pub fn soft(&self) -> Option<&soft::Mr> {
        match self {
            Mr::Soft(m) => Some(m),
            Mr::Verbs(_) => None,
        }
    }

    pub fn lkey(&self) -> u32 {
        match self {
            Mr::Soft(m) => m.lkey(),
            Mr::Verbs(m) => m.lkey(),
        }
    }

    pub fn rkey(&self) -> u32 {
        match self {
            Mr::Soft(m) => m.rkey(),
            Mr::Verbs(m) => m.rkey(),
        }
    }

    /// The address the peer names the region's first byte by.
    pub fn iova(&self) -> u64 {
        match self {
            Mr::Soft(m) => m.iova(),
            Mr::Verbs(m) => m.region().addr(),
        }
    }
}

/// An rdma-core CQ as the channel layer waits on it: completions taken while checking for
/// work before sleeping are kept for the next poll (verbs has no peek); before sleeping, it
/// polls for a bounded window while that keeps paying ([`PollBudget`]).
pub struct VerbsCq {
    cq: Arc<rc::res::Cq>,
    stash: Mutex<Vec<WorkCompletion>>,
    budget: Mutex<PollBudget>,
}

/// Fruitless polling windows in a row after which a CQ sleeps at once.
const POLL_TOLERANCE: u8 = 8;

impl VerbsCq {
    fn new(cq: Arc<rc::res::Cq>) -> VerbsCq {
        VerbsCq {
            cq,
            stash: Mutex::new(Vec::new()),
            budget: Mutex::new(PollBudget::new(Duration::ZERO, POLL_TOLERANCE)),
        }
    }

    pub fn raw(&self) -> &Arc<rc::res::Cq> {
        &self.cq
    }

    /// Takes what the CQ holds into the stash; whether it found any.
    fn look(&self, max: usize) -> bool {
        match self.cq.poll_wc(&mut lock(&self.stash), max) {
            Ok(n) => n > 0,
            Err(e) => {
                tracing::warn!(error = %e, "polling a completion queue");
                false
            }
        }
    }

    /// Polls for up to the budget's window; whether it found work.
    async fn busy_poll(&self) -> bool {
        let window = lock(&self.budget).window();
        if window.is_zero() {
            return false;
        }
        let deadline = Instant::now() + window;
        loop {
            if self.look(STASH_BATCH) {
                lock(&self.budget).hit();
                return true;
            }
            if Instant::now() >= deadline {
                lock(&self.budget).expired();
                return false;
            }
            tokio::task::yield_now().await;
        }
    }
}

/// A completion queue.
#[derive(Clone)]
pub enum Cq {
    Soft(soft::Cq),
    Verbs(Arc<VerbsCq>),
}

/// Completions taken per look while deciding whether to sleep.
const STASH_BATCH: usize = 32;

impl Cq {
    /// Takes up to `max` completions into `out`; returns how many.
    pub fn poll_into(&self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        match self {
            Cq::Soft(cq) => cq.poll_into(out, max),
            Cq::Verbs(v) => {
                let mut n = 0;
                {
                    let mut st = lock(&v.stash);
                    if !st.is_empty() {
                        n = st.len().min(max);
                        out.extend(st.drain(..n));
                    }
                }
                if n < max {
                    match v.cq.poll_wc(out, max - n) {
                        Ok(k) => n += k,
                        Err(e) => tracing::warn!(error = %e, "polling a completion queue"),
                    }
                }
                n
            }
        }
    }

    /// Resolves once a completion is waiting (at once if one is).
    pub async fn wait_nonempty(&self) {
        match self {
            Cq::Soft(cq) => cq.wait_nonempty().await,
            Cq::Verbs(v) => {
                if !lock(&v.stash).is_empty() || v.busy_poll().await {
                    return;
                }
                let slept = Instant::now();
                loop {
                    // Armed before looking, so a completion after the look raises an event.
                    if let Err(e) = v.cq.arm() {
                        tracing::warn!(error = %e, "arming a completion queue");
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    if v.look(STASH_BATCH) {
                        break;
                    }
                    if let Err(e) = v.cq.wait().await {
                        tracing::warn!(error = %e, "waiting on a completion channel");
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                lock(&v.budget).resumed_after(slept.elapsed());
            }
        }
    }

    /// Polls for up to `window` before sleeping while that keeps finding work (verbs; the
    /// soft engine's device polls its socket instead).
    pub fn set_busy_poll(&self, window: Duration) {
        if let Cq::Verbs(v) = self {
            *lock(&v.budget) = PollBudget::new(window, POLL_TOLERANCE);
        }
    }
}

/// An RC queue pair: the engine's, or the one librdmacm made on a connection's id.
#[derive(Clone)]
pub enum Qp {
    Soft(Arc<soft::Qp>),
    Verbs(Arc<rc::cm::CmId>),
}

impl Qp {
    pub fn qpn(&self) -> u32 {
        match self {
            Qp::Soft(q) => q.qpn(),
            Qp::Verbs(id) => id.qpn().unwrap_or(0),
        }
    }

    pub fn post_send(&self, wr: SendWr) -> Result<(), ProviderError> {
        match self {
            Qp::Soft(q) => Ok(q.post_send(wr)?),
            Qp::Verbs(id) => Ok(id.post_send_wr(&wr)?),
        }
    }

    /// Posts `wrs` in order (chained in one post with `verbs`: one doorbell). On failure, how
    /// many went out before the one that failed (those complete), and why.
    pub fn post_send_list(&self, wrs: Vec<SendWr>) -> Result<(), (usize, ProviderError)> {
        match self {
            Qp::Soft(q) => {
                for (i, wr) in wrs.into_iter().enumerate() {
                    q.post_send(wr).map_err(|e| (i, e.into()))?;
                }
                Ok(())
            }
            Qp::Verbs(id) => id.post_send_wrs(&wrs).map_err(|(i, e)| (i, e.into())),
        }
    }

    pub fn post_recv(&self, wr: RecvWr) -> Result<(), ProviderError> {
        match self {
            Qp::Soft(q) => Ok(q.post_recv(wr)?),
            Qp::Verbs(id) => Ok(id.post_recv_wr(&wr)?),
        }
    }

    /// Moves the QP to the error state: everything posted completes, flushed.
    pub fn set_error(&self) -> Result<(), ProviderError> {
        match self {
            Qp::Soft(q) => {
                let attr = QpAttr {
                    qp_state: Some(QpState::Err),
                    ..Default::default()
                };
                Ok(q.modify(&attr, QpAttrMask::STATE)?)
            }
            Qp::Verbs(id) => Ok(id.set_error()?),
        }
    }

    /// Whether a QP in the error state has already reported (flushed) everything posted to
    /// it that will ever complete.
    pub fn flushes_at_once(&self) -> bool {
        match self {
            // The engine flushes the queues as the QP enters the error state.
            Qp::Soft(q) => q.state() == QpState::Err,
            // The NIC (or rdma_rxe's completer) flushes a QP in the error state a little
            // later; the id keeps the QP until dropped.
            Qp::Verbs(_) => false,
        }
    }

    /// The engine's QP (tests drive its states by hand).
    pub fn soft(&self) -> Option<&Arc<soft::Qp>> {
        match self {
            Qp::Soft(q) => Some(q),
            Qp::Verbs(_) => None,
        }
    }
}
