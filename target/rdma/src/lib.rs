//! The RDMA channel layer shared by iSER and SRP: one RC queue pair with its completion
//! queues, a registered receive ring, registered send slots, send-queue and RDMA READ
//! credits, and the movement of data between the initiator's memory and backstore buffers.
//!
//! A fabric keeps only its message headers, its login and how it maps commands onto
//! [`Link::rdma_write`] and [`Link::rdma_read`]:
//!
//! * Receiving: [`Receiver::take`] copies each message out of its ring slot and posts the
//!   slot again at once, so the ring never runs dry while a command waits; the fabric's own
//!   flow control (iSCSI's CmdSN window, SRP's request limit) bounds how many messages are
//!   held.
//! * Sending: a message is copied into a registered send slot and posted as one SEND (with
//!   invalidate when the fabric asks); slots, send-queue entries and RDMA READs in flight are
//!   credits, so a full queue is back-pressure, never an error.
//! * Data: RDMA WRITE from a backstore buffer and RDMA READ into one, straight from or into
//!   the buffer pool's slabs, which [`mem::PoolMrs`] registers once per protection domain;
//!   nothing is registered on the I/O path except a buffer outside the slabs (a dedicated
//!   allocation above the pool's largest class), which gets a one-off region. Operations hold
//!   their buffer until their completion arrives, so a cancelled command never frees memory
//!   the engine may still write.
//! * Completions: only some send work requests are signalled — one someone waits for (an
//!   RDMA READ), a message SEND posted on its own, the last of a chained batch, and at least
//!   one in every [`Link::signal_every`] — and a completion retires every work request posted
//!   before it as well (an RC send queue completes in order), so a command's RDMA WRITEs and
//!   the batch it answers in cost one completion.
//! * Failure: a failed completion or a failed post moves the QP to the error state, flushes
//!   everything posted, and runs the close hooks once ([`Link::on_close`]): the fabric's task
//!   set fails every outstanding task there.

pub mod cm;
pub mod mem;
pub mod provider;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use rtgt_backstore::{IoBuf, Latch};
use rtgt_transport::rdmacore::{self as rc, sys::ibv_qp_cap};
use rtgt_transport::verbs::{
    self as soft, Access, QpInitAttr, QpType, RecvWr, Region, SendFlags, SendOp, SendWr, SgList,
    Sge, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};
use tokio::sync::{oneshot, Semaphore};
use tokio::time::Instant;

use mem::{Landing, PoolMrs};
pub use provider::{Cq, Kind, Mr, Pd, ProviderError, Qp};

/// Largest RDMA WRITE or READ one work request moves.
pub const RDMA_CHUNK: usize = 1 << 20;
/// Completions taken per poll.
const POLL_BATCH: usize = 64;
/// Bytes of a message sent inline (copied into the work request by the CPU as it is posted,
/// so the NIC fetches no send slot) where the provider allows it: a SCSI response with its
/// sense data fits.
pub const INLINE_MAX: u32 = 256;

/// At most this many send work requests in a row go unsignalled.
const SIGNAL_EVERY_MAX: u32 = 16;

/// Work request ids: a send slot's SEND, or an operation someone may wait for.
pub const TAG_SLOT: u64 = 1 << 62;
const TAG_OP: u64 = 2 << 62;
const TAG_MASK: u64 = 3 << 62;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The link failed or closed under an operation: nothing more is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("the RDMA connection is closed")]
    Closed,
    #[error("message larger than a send slot")]
    TooLarge,
    #[error("memory registration failed")]
    Registration,
}

/// How one connection's queues are sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rings {
    pub recv_slots: u32,
    /// Bytes of one receive buffer (the largest message the fabric accepts).
    pub recv_slot_len: usize,
    pub send_slots: u32,
    /// Bytes of one send slot (the largest message the fabric sends).
    pub send_slot_len: usize,
    /// Send work requests: the slots' SENDs plus RDMA WRITEs and READs.
    pub send_queue: u32,
    /// RDMA READs in flight (the initiator's responder resources).
    pub rdma_read_depth: u32,
}

/// An RC QP with its completion queues and registered receive ring, created before the CM
/// accepts the connection (so the first SEND finds a buffer).
pub struct Endpoint {
    pub pd: Pd,
    pub qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    recv_region: Arc<Region>,
    recv_mr: Mr,
    rings: Rings,
    /// Largest message the QP sends inline (0: none).
    max_inline: u32,
}

impl Endpoint {
    /// An endpoint of the soft engine (its QP in RESET).
    pub fn new(pd: &soft::Pd, rings: impl Into<Rings>) -> Result<Endpoint, ProviderError> {
        let rings = rings.into();
        let dev = pd.device();
        let send_cq = dev.create_cq(rings.send_queue)?;
        let recv_cq = dev.create_cq(rings.recv_slots)?;
        let mut init = QpInitAttr::new(QpType::Rc, &send_cq, &recv_cq);
        init.cap.max_send_wr = rings.send_queue;
        init.cap.max_recv_wr = rings.recv_slots;
        init.cap.max_send_sge = 2;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = 0;
        let qp = Qp::Soft(Arc::new(pd.create_qp(init)?));
        Self::finish(
            Pd::Soft(pd.clone()),
            qp,
            (Cq::Soft(send_cq), Cq::Soft(recv_cq)),
            rings,
            0,
        )
    }

    /// An endpoint of rdma-core on the id of a connection request (librdmacm makes the QP,
    /// in INIT, and moves it on as the connection is accepted).
    pub fn on_cm_id(
        pd: &Arc<rc::res::Pd>,
        id: Arc<rc::cm::CmId>,
        rings: impl Into<Rings>,
    ) -> Result<Endpoint, ProviderError> {
        let rings = rings.into();
        let ppd = Pd::Verbs(pd.clone());
        let send_cq = ppd.create_cq(rings.send_queue)?;
        let recv_cq = ppd.create_cq(rings.recv_slots)?;
        let (Cq::Verbs(s), Cq::Verbs(r)) = (&send_cq, &recv_cq) else {
            unreachable!("a verbs PD makes verbs CQs");
        };
        let mut cap = ibv_qp_cap {
            max_send_wr: rings.send_queue,
            max_recv_wr: rings.recv_slots,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: INLINE_MAX,
        };
        // A device that sends nothing inline (or less) gets a QP without.
        let granted = match id.create_qp(pd, s.raw(), r.raw(), cap) {
            Ok(c) => c,
            Err(_) => {
                cap.max_inline_data = 0;
                id.create_qp(pd, s.raw(), r.raw(), cap)?
            }
        };
        let max_inline = granted.max_inline_data.min(INLINE_MAX);
        Self::finish(ppd, Qp::Verbs(id), (send_cq, recv_cq), rings, max_inline)
    }

    fn finish(
        pd: Pd,
        qp: Qp,
        (send_cq, recv_cq): (Cq, Cq),
        rings: Rings,
        max_inline: u32,
    ) -> Result<Endpoint, ProviderError> {
        let recv_region = Arc::new(Region::zeroed(
            rings.recv_slot_len * rings.recv_slots as usize,
        ));
        let recv_mr = pd.reg_mr(recv_region.clone(), Access::LOCAL_WRITE)?;
        Ok(Endpoint {
            pd,
            qp,
            send_cq,
            recv_cq,
            recv_region,
            recv_mr,
            rings,
            max_inline,
        })
    }

    /// Polls the completion queues for up to `window` before sleeping (see
    /// [`Cq::set_busy_poll`]).
    pub fn set_busy_poll(&self, window: Duration) {
        self.send_cq.set_busy_poll(window);
        self.recv_cq.set_busy_poll(window);
    }

    /// Posts the whole receive ring (the QP must be in INIT or later).
    pub fn post_receives(&self) -> Result<(), ProviderError> {
        for i in 0..self.rings.recv_slots {
            self.post_recv(i)?;
        }
        Ok(())
    }

    fn post_recv(&self, slot: u32) -> Result<(), ProviderError> {
        let len = self.rings.recv_slot_len;
        self.qp.post_recv(RecvWr {
            wr_id: slot as u64,
            sg_list: self.recv_mr.sge(slot as usize * len, len as u32).into(),
        })
    }

    pub fn rings(&self) -> Rings {
        self.rings
    }

    pub fn send_cq(&self) -> &Cq {
        &self.send_cq
    }
}

/// A buffer of the initiator's, named by an RDMA descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    pub addr: u64,
    pub rkey: u32,
    pub len: u32,
}

struct Op {
    done: Option<oneshot::Sender<WcStatus>>,
    /// Keeps a buffer (or the region owning it) until the operation completes.
    _hold: Hold,
    read: bool,
}

/// Operations in flight by work request id: a slab whose free entries are reused, so posting
/// and completing one neither hashes nor allocates.
#[derive(Default)]
struct Ops {
    entries: Vec<Option<Op>>,
    free: Vec<u64>,
}

impl Ops {
    /// Stores `op`; its id (below [`TAG_OP`]).
    fn insert(&mut self, op: Op) -> u64 {
        match self.free.pop() {
            Some(id) => {
                self.entries[id as usize] = Some(op);
                id
            }
            None => {
                self.entries.push(Some(op));
                (self.entries.len() - 1) as u64
            }
        }
    }

    fn remove(&mut self, id: u64) -> Option<Op> {
        let op = self.entries.get_mut(usize::try_from(id).ok()?)?.take();
        if op.is_some() {
            self.free.push(id);
        }
        op
    }
}

/// Send work requests in the order they went to the send queue, until a completion retires
/// them.
#[derive(Default)]
struct Order {
    ids: VecDeque<u64>,
    /// Posted unsignalled since the last signalled one.
    quiet: u32,
}

impl Order {
    /// Queues `wr`, signalled if `force`, or if it would otherwise be the `every`-th
    /// unsignalled one in a row.
    fn push(&mut self, wr: &mut SendWr, force: bool, every: u32) {
        if force || self.quiet + 1 >= every {
            wr.flags |= SendFlags::SIGNALED;
            self.quiet = 0;
        } else {
            wr.flags.remove(SendFlags::SIGNALED);
            self.quiet += 1;
        }
        self.ids.push_back(wr.wr_id);
    }

    /// Forgets the last `n` queued (their post failed).
    fn drop_last(&mut self, n: usize) {
        let keep = self.ids.len().saturating_sub(n);
        self.ids.truncate(keep);
        self.quiet = 0;
    }

    /// Moves to `out` what a completion of `wr_id` retires: every work request posted before
    /// it, then itself. False if `wr_id` is not in flight.
    fn retire(&mut self, wr_id: u64, out: &mut smallvec::SmallVec<[u64; 32]>) -> bool {
        let Some(n) = self.ids.iter().position(|&id| id == wr_id) else {
            return false;
        };
        out.extend(self.ids.drain(..=n));
        true
    }
}

/// What an operation keeps alive until its completion.
pub enum Hold {
    None,
    Buf(#[allow(dead_code)] Arc<IoBuf>),
    /// A buffer only this work request uses (no reference count to allocate).
    OneBuf(#[allow(dead_code)] IoBuf),
    Mr(#[allow(dead_code)] Arc<Mr>),
    Landing(#[allow(dead_code)] Arc<Landing>),
}

type CloseHook = Box<dyn FnOnce() + Send>;

/// The send side of a connected endpoint: send slots, queue credits and operations in flight.
pub struct Link {
    qp: Qp,
    pub pd: Pd,
    pub send_region: Arc<Region>,
    pub send_mr: Mr,
    pub slot_len: usize,
    /// Messages up to this long go inline.
    max_inline: usize,
    free_slots: Mutex<Vec<u32>>,
    slots: Semaphore,
    /// Send queue entries not yet completed.
    sq: Semaphore,
    /// RDMA READs in flight.
    reads: Semaphore,
    ops: Mutex<Ops>,
    /// Posted, not yet retired, in posting order ([`Link::posted`] is its length); taken
    /// around every post.
    order: Mutex<Order>,
    /// See [`Link::signal_every`].
    signal_every: u32,
    /// Send completions handled.
    completions: AtomicUsize,
    closing: Latch,
    on_close: Mutex<Vec<CloseHook>>,
    /// SENDs held back while a [`SendBatch`] is open (each with its slot and queue credit).
    held: Mutex<Option<Vec<SendWr>>>,
    pool_mrs: Option<Arc<PoolMrs>>,
    pub peer: SocketAddr,
}

/// While it lives, the link's message SENDs wait, in order, and go to the send queue together
/// when it drops, chained in one post (one doorbell on a NIC, one system call with rdma_rxe),
/// after the RDMA WRITEs and READs posted meanwhile (which are posted at once).
///
/// A fabric opens one around a batch of received commands: the data of all of them then goes
/// out before their responses, so the soft engine finds runs of equal-sized packets to one
/// peer (the WRITEs, then the responses) that leave as a few segmentation-offload sends
/// instead of one per command. Nothing waits on a held SEND: before anything on the link
/// waits for a credit, the held SENDs are posted.
pub struct SendBatch<'a> {
    link: &'a Link,
}

impl Drop for SendBatch<'_> {
    fn drop(&mut self) {
        self.link.post_held(true);
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("qpn", &self.qp.qpn())
            .field("peer", &self.peer)
            .finish()
    }
}

impl Link {
    /// The send side of `ep`; `pool_mrs` are the buffer pool's slabs registered with the
    /// endpoint's protection domain (data moves through one-off regions without them).
    pub fn new(
        ep: &Endpoint,
        peer: SocketAddr,
        pool_mrs: Option<Arc<PoolMrs>>,
    ) -> Result<Link, ProviderError> {
        let r = ep.rings;
        let send_region = Arc::new(Region::zeroed(r.send_slot_len * r.send_slots as usize));
        let send_mr = ep.pd.reg_mr(send_region.clone(), Access::LOCAL_WRITE)?;
        Ok(Link {
            qp: ep.qp.clone(),
            pd: ep.pd.clone(),
            send_region,
            send_mr,
            slot_len: r.send_slot_len,
            max_inline: ep.max_inline as usize,
            free_slots: Mutex::new((0..r.send_slots).rev().collect()),
            slots: Semaphore::new(r.send_slots as usize),
            sq: Semaphore::new(r.send_queue as usize),
            reads: Semaphore::new(r.rdma_read_depth as usize),
            ops: Mutex::new(Ops::default()),
            order: Mutex::new(Order {
                ids: VecDeque::with_capacity(r.send_queue as usize),
                quiet: 0,
            }),
            signal_every: (r.send_queue / 4).clamp(1, SIGNAL_EVERY_MAX),
            completions: AtomicUsize::new(0),
            closing: Latch::default(),
            on_close: Mutex::new(Vec::new()),
            held: Mutex::new(None),
            pool_mrs,
            peer,
        })
    }

    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    pub fn is_closing(&self) -> bool {
        self.closing.is_set()
    }

    /// Resolves once the link is closing.
    pub async fn closed(&self) {
        self.closing.wait().await
    }

    /// Runs `f` once when the link closes (at once if it already has): where a fabric fails
    /// its outstanding tasks.
    pub fn on_close(&self, f: impl FnOnce() + Send + 'static) {
        let mut hooks = lock(&self.on_close);
        if self.is_closing() {
            drop(hooks);
            f();
        } else {
            hooks.push(Box::new(f));
        }
    }

    /// Moves the QP to the error state: everything posted completes (flushed), the poller
    /// returns every resource, waiters see the failure, and the close hooks run.
    pub fn close(&self) {
        let hooks = {
            let mut h = lock(&self.on_close);
            if !self.closing.set() {
                return;
            }
            std::mem::take(&mut *h)
        };
        if let Err(e) = self.qp.set_error() {
            tracing::debug!(peer = %self.peer, error = %e, "moving the QP to error");
        }
        // Held SENDs never go out: their slots and credits return.
        let held = lock(&self.held).as_mut().map(std::mem::take);
        for wr in held.unwrap_or_default() {
            self.release(wr.wr_id, None);
        }
        self.slots.close();
        self.sq.close();
        self.reads.close();
        for h in hooks {
            h();
        }
    }

    async fn credit(&self, sem: &Semaphore) -> Result<(), LinkError> {
        if self.is_closing() {
            return Err(LinkError::Closed);
        }
        if let Ok(p) = sem.try_acquire() {
            p.forget();
            return Ok(());
        }
        // About to wait: the held SENDs may be what frees the credit.
        self.flush_held();
        match sem.acquire().await {
            Ok(p) => {
                p.forget();
                Ok(())
            }
            Err(_) => Err(LinkError::Closed),
        }
    }

    /// Opens a [`SendBatch`] (none is nested: an inner one ends the batch early).
    pub fn batch_sends(&self) -> SendBatch<'_> {
        let mut held = lock(&self.held);
        if held.is_none() {
            *held = Some(Vec::new());
        }
        SendBatch { link: self }
    }

    /// Posts the SENDs held so far; the batch stays open.
    fn flush_held(&self) {
        self.post_held(false);
    }

    /// Posts the SENDs a batch held, in order, chained in one post (one doorbell). `end`
    /// ends the batch.
    ///
    /// The post happens under the batch's lock, so a SEND that finds no batch open (and so
    /// posts at once) goes after the chain, never between its taking and its posting.
    fn post_held(&self, end: bool) {
        let (ids, failed) = {
            let mut held = lock(&self.held);
            let list = if end {
                held.take()
            } else {
                held.as_mut().map(std::mem::take)
            };
            let Some(list) = list.filter(|l| !l.is_empty()) else {
                return;
            };
            let ids: smallvec::SmallVec<[u64; 32]> = list.iter().map(|wr| wr.wr_id).collect();
            if self.is_closing() {
                (ids, Some((0, None)))
            } else {
                let mut list = list;
                let mut order = lock(&self.order);
                let last = list.len() - 1;
                for (i, wr) in list.iter_mut().enumerate() {
                    order.push(wr, i == last, self.signal_every);
                }
                let r = self.qp.post_send_list(list);
                if let Err((sent, _)) = &r {
                    order.drop_last(ids.len() - sent.min(&ids.len()));
                }
                (ids, r.err().map(|(sent, e)| (sent, Some(e))))
            }
        };
        // Outside the lock: closing takes it.
        if let Some((sent, e)) = failed {
            let lost = &ids[sent.min(ids.len())..];
            if let Some(e) = e {
                tracing::debug!(peer = %self.peer, error = %e, "post_send failed");
            }
            for &id in lost {
                self.release(id, None);
            }
            self.close();
        }
    }

    /// Posts `wr` (its send queue credit already taken), signalled if `signal` (or if the
    /// run of unsignalled ones is long enough).
    fn post(&self, mut wr: SendWr, signal: bool) -> Result<(), LinkError> {
        if self.is_closing() {
            self.sq.add_permits(1);
            return Err(LinkError::Closed);
        }
        let mut order = lock(&self.order);
        order.push(&mut wr, signal, self.signal_every);
        let r = self.qp.post_send(wr);
        if r.is_err() {
            order.drop_last(1);
        }
        drop(order);
        if let Err(e) = r {
            self.sq.add_permits(1);
            tracing::debug!(peer = %self.peer, error = %e, "post_send failed");
            self.close();
            return Err(LinkError::Closed);
        }
        Ok(())
    }

    /// Takes a send queue credit (for a work request posted with [`Link::post_op`]).
    pub async fn sq_credit(&self) -> Result<(), LinkError> {
        self.credit(&self.sq).await
    }

    /// Takes a send slot and its send queue credit.
    pub async fn reserve(&self) -> Result<u32, LinkError> {
        self.credit(&self.slots).await?;
        if let Err(e) = self.credit(&self.sq).await {
            self.slots.add_permits(1);
            return Err(e);
        }
        match lock(&self.free_slots).pop() {
            Some(s) => Ok(s),
            None => {
                self.sq.add_permits(1);
                Err(LinkError::Closed)
            }
        }
    }

    /// Copies `parts` one after the other into `slot` and posts them as one SEND (with
    /// invalidate of `invalidate`).
    pub fn post_slot(
        &self,
        slot: u32,
        parts: &[&[u8]],
        invalidate: Option<u32>,
    ) -> Result<(), LinkError> {
        let n: usize = parts.iter().map(|p| p.len()).sum();
        if n > self.slot_len {
            self.release_slot(slot);
            self.sq.add_permits(1);
            return Err(LinkError::TooLarge);
        }
        let mut off = slot as usize * self.slot_len;
        let start = off;
        for p in parts {
            self.send_region.write(off, p);
            off += p.len();
        }
        let op = match invalidate {
            Some(k) => SendOp::SendWithInv(k),
            None => SendOp::Send,
        };
        let mut wr = SendWr::new(
            TAG_SLOT | slot as u64,
            op,
            self.send_mr.sge(start, n as u32),
        );
        if n <= self.max_inline {
            // The provider copies the slot's bytes into the work request while posting.
            wr.flags |= SendFlags::INLINE;
        }
        if let Some(held) = lock(&self.held).as_mut() {
            if !self.is_closing() {
                held.push(wr);
                return Ok(());
            }
        }
        if let Err(e) = self.post(wr, true) {
            self.release_slot(slot);
            return Err(e);
        }
        Ok(())
    }

    /// Sends `parts` as one message.
    pub async fn send(&self, parts: &[&[u8]], invalidate: Option<u32>) -> Result<(), LinkError> {
        let slot = self.reserve().await?;
        self.post_slot(slot, parts, invalidate)
    }

    pub fn release_slot(&self, slot: u32) {
        lock(&self.free_slots).push(slot);
        self.slots.add_permits(1);
    }

    /// Posts any work request whose completion someone may wait for (its queue credit, and
    /// for a READ its read credit, already taken).
    pub fn post_op(
        &self,
        op: SendOp,
        sg_list: SgList,
        hold: Hold,
        want: bool,
    ) -> Result<Option<oneshot::Receiver<WcStatus>>, LinkError> {
        let read = matches!(op, SendOp::RdmaRead { .. });
        let (tx, rx) = if want {
            let (t, r) = oneshot::channel();
            (Some(t), Some(r))
        } else {
            (None, None)
        };
        let id = lock(&self.ops).insert(Op {
            done: tx,
            _hold: hold,
            read,
        });
        let wr = SendWr::new(TAG_OP | id, op, sg_list);
        if let Err(e) = self.post(wr, want || read) {
            lock(&self.ops).remove(id);
            if read {
                self.reads.add_permits(1);
            }
            return Err(e);
        }
        Ok(rx)
    }

    /// The SGE of `buf[off..off + len]` in the registered slabs.
    fn pool_sge(&self, buf: &IoBuf, off: usize, len: u32) -> Option<Sge> {
        self.pool_mrs.as_ref()?.sge(buf, off, len)
    }

    /// RDMA WRITEs `buf` to `remotes` in order (at most [`RDMA_CHUNK`] per work request)
    /// and returns the bytes posted, at most the buffer's length. Does not wait: RC ordering
    /// delivers every WRITE before a SEND posted after them, and each WRITE holds the buffer
    /// until it completes.
    pub async fn rdma_write(&self, buf: IoBuf, remotes: &[Remote]) -> Result<u32, LinkError> {
        enum Src {
            Pool(Arc<IoBuf>),
            /// In the slabs and sent by one work request, which holds it alone.
            PoolOnce(Option<IoBuf>),
            Owned(Arc<Mr>),
        }
        let len = buf.len();
        let one_wr = len <= RDMA_CHUNK && remotes.first().is_some_and(|r| r.len as usize >= len);
        let mut src = if self.pool_sge(&buf, 0, 0).is_some() {
            if one_wr {
                Src::PoolOnce(Some(buf))
            } else {
                Src::Pool(Arc::new(buf))
            }
        } else {
            // Outside the slabs: a region that owns the buffer.
            let mr = mem::owned_mr(&self.pd, buf).map_err(|e| {
                tracing::warn!(error = %e, "registering a data-in buffer");
                LinkError::Registration
            })?;
            Src::Owned(Arc::new(mr))
        };
        let mut off = 0usize;
        for r in remotes {
            let mut done = 0usize;
            while done < r.len as usize && off < len {
                let n = RDMA_CHUNK.min(r.len as usize - done).min(len - off);
                self.sq_credit().await?;
                let n32 = n as u32;
                let sge_hold = match &mut src {
                    Src::Pool(b) => self
                        .pool_sge(b, off, n32)
                        .map(|s| (s, Hold::Buf(b.clone()))),
                    Src::PoolOnce(b) => b
                        .take()
                        .and_then(|b| self.pool_sge(&b, off, n32).map(|s| (s, Hold::OneBuf(b)))),
                    Src::Owned(m) => Some((m.sge(off, n32), Hold::Mr(m.clone()))),
                };
                let Some((sge, hold)) = sge_hold else {
                    self.sq.add_permits(1);
                    return Err(LinkError::Registration);
                };
                let op = SendOp::RdmaWrite {
                    remote_addr: r.addr.wrapping_add(done as u64),
                    rkey: r.rkey,
                };
                self.post_op(op, sge.into(), hold, false)?;
                done += n;
                off += n;
            }
            if off >= len {
                break;
            }
        }
        Ok(off as u32)
    }

    /// RDMA READs `remotes`, in order, into `buf` from byte `start` on, and returns the
    /// buffer once every READ has completed. If this future is dropped early, the buffer
    /// stays with the READs in flight and is freed after the last one completes.
    pub async fn rdma_read(
        &self,
        buf: IoBuf,
        start: usize,
        remotes: &[Remote],
    ) -> Result<IoBuf, LinkError> {
        let in_slabs = self.pool_sge(&buf, 0, 0).is_some();
        let landing = Arc::new(if in_slabs {
            Landing::pooled(buf)
        } else {
            Landing::registered(&self.pd, buf).map_err(|e| {
                tracing::warn!(error = %e, "registering a data-out buffer");
                LinkError::Registration
            })?
        });
        let mut waits = Vec::new();
        let mut failed = None;
        let mut off = start;
        'all: for r in remotes {
            let mut done = 0usize;
            while done < r.len as usize {
                let n = RDMA_CHUNK.min(r.len as usize - done);
                if off + n > landing.len() {
                    failed = Some(LinkError::TooLarge);
                    break 'all;
                }
                if let Err(e) = self.credit(&self.reads).await {
                    failed = Some(e);
                    break 'all;
                }
                if let Err(e) = self.sq_credit().await {
                    self.reads.add_permits(1);
                    failed = Some(e);
                    break 'all;
                }
                let sge = match landing.sge(self.pool_mrs.as_deref(), off, n as u32) {
                    Some(s) => s,
                    None => {
                        self.reads.add_permits(1);
                        self.sq.add_permits(1);
                        failed = Some(LinkError::Registration);
                        break 'all;
                    }
                };
                let op = SendOp::RdmaRead {
                    remote_addr: r.addr.wrapping_add(done as u64),
                    rkey: r.rkey,
                };
                match self.post_op(op, sge.into(), Hold::Landing(landing.clone()), true) {
                    Ok(Some(rx)) => waits.push(rx),
                    Ok(None) => {}
                    Err(e) => {
                        failed = Some(e);
                        break 'all;
                    }
                }
                done += n;
                off += n;
            }
        }
        // Every READ posted completes (or is flushed) before the buffer is touched.
        let mut ok = failed.is_none();
        for w in waits {
            ok &= matches!(w.await, Ok(WcStatus::Success));
        }
        if !ok {
            return Err(failed.unwrap_or(LinkError::Closed));
        }
        Landing::into_buf(landing).ok_or(LinkError::Closed)
    }

    /// At most this many send work requests in a row go unsignalled (a quarter of the send
    /// queue, at most 16), so credits come back while the queue is still far from full.
    pub fn signal_every(&self) -> u32 {
        self.signal_every
    }

    /// Send completions handled so far.
    pub fn completions(&self) -> usize {
        self.completions.load(Ordering::Acquire)
    }

    /// Handles one send-side completion: it retires the work requests posted before it too.
    pub fn completed(&self, wc: &WorkCompletion) {
        self.completions.fetch_add(1, Ordering::AcqRel);
        let mut ids = smallvec::SmallVec::<[u64; 32]>::new();
        if !lock(&self.order).retire(wc.wr_id, &mut ids) {
            tracing::debug!(peer = %self.peer, wr_id = wc.wr_id, "completion of nothing in flight");
            return;
        }
        let last = ids.len() - 1;
        for (i, &id) in ids.iter().enumerate() {
            // An unsignalled one before it completed, and successfully: an error always has
            // a completion of its own.
            let status = if i == last {
                wc.status
            } else {
                WcStatus::Success
            };
            self.release(id, Some(status));
        }
        if wc.status != WcStatus::Success && wc.status != WcStatus::WrFlushErr {
            tracing::warn!(
                peer = %self.peer,
                status = ?wc.status,
                opcode = ?wc.opcode,
                "RDMA send-side operation failed; closing the connection"
            );
            self.close();
        }
    }

    /// Returns what one work request held: its send queue credit, and its slot, or its
    /// operation (buffer, READ credit) with its completion status to whoever waits — `None`
    /// for one that never went out (a waiter sees the channel drop).
    fn release(&self, wr_id: u64, status: Option<WcStatus>) {
        self.sq.add_permits(1);
        match wr_id & TAG_MASK {
            TAG_SLOT => self.release_slot((wr_id & !TAG_MASK) as u32),
            TAG_OP => {
                let op = lock(&self.ops).remove(wr_id & !TAG_MASK);
                if let Some(op) = op {
                    if op.read {
                        self.reads.add_permits(1);
                    }
                    let Op { done, _hold, .. } = op;
                    // The buffer is released before the waiter wakes.
                    drop(_hold);
                    if let (Some(tx), Some(status)) = (done, status) {
                        let _ = tx.send(status);
                    }
                }
            }
            _ => {}
        }
    }

    /// Retires everything still in flight of a closed link whose QP has nothing more to
    /// report (unsignalled work requests that had completed before the QP failed get no
    /// completion, flushed or not).
    fn retire_all(&self) {
        let ids: Vec<u64> = lock(&self.order).ids.drain(..).collect();
        for id in ids {
            self.release(id, Some(WcStatus::WrFlushErr));
        }
    }

    /// Work requests posted and not yet completed.
    pub fn posted(&self) -> usize {
        lock(&self.order).ids.len()
    }

    /// Waits (briefly) until what was posted has gone out, so a final response is not
    /// flushed by the close that follows it.
    pub async fn wait_sent(&self) {
        self.flush_held();
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.posted() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Returns send slots and credits as completions arrive; ends once the link is closed and
/// everything posted has completed.
pub async fn poll_send(link: Arc<Link>, cq: Cq) {
    let mut wcs = Vec::with_capacity(POLL_BATCH);
    // Waits of a closed link that found nothing.
    let mut quiet = 0;
    loop {
        wcs.clear();
        cq.poll_into(&mut wcs, POLL_BATCH);
        for wc in &wcs {
            link.completed(wc);
        }
        if !wcs.is_empty() {
            quiet = 0;
            continue;
        }
        if link.is_closing() {
            // What the failed QP will report is in its CQ already (the soft engine flushes
            // as the QP enters the error state), or a NIC has been quiet for a second: what
            // is left completed unsignalled before the failure, or is lost with the QP.
            if link.qp.flushes_at_once() || quiet >= 5 {
                link.retire_all();
            }
            if link.posted() == 0 {
                break;
            }
        }
        tokio::select! {
            _ = cq.wait_nonempty() => {}
            _ = link.closed(), if !link.is_closing() => {}
            _ = tokio::time::sleep(Duration::from_millis(200)), if link.is_closing() => {
                quiet += 1;
            }
        }
    }
    // Operations that never completed (the QP vanished) fail now.
    let ops = std::mem::take(&mut *lock(&link.ops));
    drop(ops);
}

/// A receive completion.
#[derive(Debug)]
pub enum RxEvent {
    /// One message, copied out of its ring slot, and the R_Key its SEND with Invalidate
    /// invalidated (IB_WC_WITH_INVALIDATE).
    Msg(Bytes, Option<u32>),
    /// The QP failed or was flushed.
    Failed(WcStatus),
}

/// The receive ring of an endpoint.
pub struct Receiver {
    ep: Endpoint,
    wcs: Vec<WorkCompletion>,
}

impl Receiver {
    pub fn new(ep: Endpoint) -> Receiver {
        Receiver {
            ep,
            wcs: Vec::with_capacity(POLL_BATCH),
        }
    }

    /// Takes waiting receive completions: copies each message out and posts its buffer again.
    pub fn take(&mut self, out: &mut Vec<RxEvent>) {
        self.wcs.clear();
        self.ep.recv_cq.poll_into(&mut self.wcs, POLL_BATCH);
        let slot_len = self.ep.rings.recv_slot_len;
        for wc in &self.wcs {
            if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
                out.push(RxEvent::Failed(wc.status));
                continue;
            }
            let slot = wc.wr_id as u32;
            let len = (wc.byte_len as usize).min(slot_len);
            // The one copy out of the ring (into memory not zeroed first): the buffer is
            // posted again right away.
            let buf = self
                .ep
                .recv_region
                .slice(slot as usize * slot_len, len)
                .map(Bytes::copy_from_slice)
                .unwrap_or_default();
            if let Err(e) = self.ep.post_recv(slot) {
                tracing::debug!(error = %e, "reposting a receive");
            }
            let invalidated = wc
                .flags
                .contains(WcFlags::WITH_INVALIDATE)
                .then_some(wc.imm_or_inv);
            out.push(RxEvent::Msg(buf, invalidated));
        }
    }

    pub async fn wait(&self) {
        self.ep.recv_cq.wait_nonempty().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtgt_transport::netdev::{loopback, run};
    use rtgt_transport::verbs::{
        AddressVector, Device, DeviceConfig, Mtu, QpAttr, QpAttrMask, QpState,
    };
    use std::net::{IpAddr, Ipv4Addr};

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn operation_ids_are_reused_once_free() {
        let op = |read| Op {
            done: None,
            _hold: Hold::None,
            read,
        };
        let mut ops = Ops::default();
        let (a, b, c) = (
            ops.insert(op(false)),
            ops.insert(op(true)),
            ops.insert(op(false)),
        );
        assert_eq!((a, b, c), (0, 1, 2));
        assert!(ops.remove(b).is_some_and(|o| o.read));
        // A completion that is not (or no longer) in flight finds nothing.
        assert!(ops.remove(b).is_none());
        assert!(ops.remove(7).is_none());
        assert_eq!(ops.insert(op(false)), b);
        assert_eq!(ops.insert(op(false)), 3);
        assert!(ops.entries.len() == 4 && ops.free.is_empty());
    }

    /// Moves `ep`'s QP to RTS towards QP `dest` at `remote`, its receive ring posted.
    fn connect(ep: &Endpoint, remote: IpAddr, dest: u32) {
        use QpAttrMask as M;
        let qp = ep.qp.soft().unwrap();
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let mut a = QpAttr {
            qp_state: Some(QpState::Init),
            qp_access_flags: Some(access),
            port_num: 1,
            ..Default::default()
        };
        qp.modify(&a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
            .unwrap();
        ep.post_receives().unwrap();
        a.qp_state = Some(QpState::Rtr);
        a.av = AddressVector::new(remote);
        a.path_mtu = Some(Mtu::Mtu1024);
        a.dest_qp_num = dest;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 1;
        let rtr = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        qp.modify(&a, rtr).unwrap();
        a.qp_state = Some(QpState::Rts);
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 1;
        let rts = M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY;
        qp.modify(&a, rts | M::MAX_QP_RD_ATOMIC).unwrap();
    }

    /// The messages `rx` has received so far.
    fn messages(rx: &mut Receiver) -> Vec<Vec<u8>> {
        let mut ev = Vec::new();
        rx.take(&mut ev);
        ev.into_iter()
            .map(|e| match e {
                RxEvent::Msg(b, _) => b.to_vec(),
                RxEvent::Failed(s) => panic!("receive failed: {s:?}"),
            })
            .collect()
    }

    /// A link from a sending endpoint on one engine to a receiving one on another, connected
    /// through a loopback pair; its receiver and both protection domains.
    fn linked_pair() -> (Arc<Link>, Receiver, soft::Pd, soft::Pd) {
        let (link, rx, pa, pb, _) = linked_pair_with(8);
        (link, rx, pa, pb)
    }

    /// [`linked_pair`] with a send queue of `send_queue` entries, and its send poller.
    fn linked_pair_with(
        send_queue: u32,
    ) -> (
        Arc<Link>,
        Receiver,
        soft::Pd,
        soft::Pd,
        tokio::task::JoinHandle<()>,
    ) {
        let (la, lb) = loopback::pair(1024);
        let da = Device::new(DeviceConfig::new("a", vec![ip(1)])).unwrap();
        let db = Device::new(DeviceConfig::new("b", vec![ip(2)])).unwrap();
        tokio::spawn(run(da.clone(), la));
        tokio::spawn(run(db.clone(), lb));
        let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
        let rings = Rings {
            recv_slots: 8,
            recv_slot_len: 256,
            send_slots: 2,
            send_slot_len: 256,
            send_queue,
            rdma_read_depth: 1,
        };
        let (ea, eb) = (
            Endpoint::new(&pa, rings).unwrap(),
            Endpoint::new(&pb, rings).unwrap(),
        );
        connect(&ea, ip(2), eb.qp.qpn());
        connect(&eb, ip(1), ea.qp.qpn());
        let link = Arc::new(Link::new(&ea, "10.0.0.2:0".parse().unwrap(), None).unwrap());
        let poller = tokio::spawn(poll_send(link.clone(), ea.send_cq().clone()));
        (link, Receiver::new(eb), pa, pb, poller)
    }

    /// A region of `pd` the peer may RDMA WRITE to, and one of `pa` to write from.
    fn write_regions(pa: &soft::Pd, pb: &soft::Pd) -> (Arc<Region>, soft::Mr, Arc<Mr>) {
        let target = Arc::new(Region::zeroed(4096));
        let target_mr = pb
            .reg_mr(target.clone(), Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let source = Arc::new(Region::zeroed(4096));
        source.write(0, b"data!");
        let source_mr = Arc::new(Mr::Soft(pa.reg_mr(source, Access::LOCAL_WRITE).unwrap()));
        (target, target_mr, source_mr)
    }

    /// Posts an RDMA WRITE of `source[0..5]` to `target[at..]` that nobody waits for.
    async fn post_write(link: &Link, target: &soft::Mr, source: &Arc<Mr>, at: u64) {
        link.sq_credit().await.unwrap();
        let op = SendOp::RdmaWrite {
            remote_addr: target.iova() + at,
            rkey: target.rkey(),
        };
        let rx = link
            .post_op(op, source.sge(0, 5).into(), Hold::Mr(source.clone()), false)
            .unwrap();
        assert!(rx.is_none());
    }

    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
    }

    /// Waits until [`post_write`]'s bytes are in `target` at `at`.
    async fn landed(target: &Region, at: usize) {
        let mut got = [0u8; 5];
        until("the WRITEs to land", || {
            target.read(at, &mut got);
            &got == b"data!"
        })
        .await;
    }

    #[tokio::test]
    async fn writes_and_the_response_after_them_cost_one_completion() {
        let (link, mut rx, pa, pb, _poller) = linked_pair_with(64);
        assert_eq!(link.signal_every(), 16);
        let (target, target_mr, source_mr) = write_regions(&pa, &pb);
        for i in 0..10 {
            post_write(&link, &target_mr, &source_mr, i * 8).await;
        }
        landed(&target, 9 * 8).await;
        // Done, but unsignalled: nothing returned yet.
        assert_eq!((link.completions(), link.posted()), (0, 10));
        link.send(&[b"response"], None).await.unwrap();
        until("the response's completion", || link.posted() == 0).await;
        assert_eq!(link.completions(), 1);
        assert_eq!(link.sq.available_permits(), 64);
        assert_eq!(messages(&mut rx), [b"response".to_vec()]);

        // A chained batch: one completion, at its end.
        {
            let _batch = link.batch_sends();
            link.send(&[b"a"], None).await.unwrap();
            link.send(&[b"b"], None).await.unwrap();
        }
        until("the batch's completion", || link.posted() == 0).await;
        assert_eq!(link.completions(), 2);
        assert_eq!(lock(&link.free_slots).len(), 2);

        // A long run of WRITEs signals one in every sixteen, so credits keep coming back.
        for i in 0..20 {
            post_write(&link, &target_mr, &source_mr, i * 8).await;
        }
        until("the sixteenth WRITE's completion", || link.posted() == 4).await;
        assert_eq!(link.completions(), 3);
        assert_eq!(link.sq.available_permits(), 60);
    }

    #[tokio::test]
    async fn a_closed_link_retires_what_completed_unsignalled() {
        let (link, _rx, pa, pb, poller) = linked_pair_with(64);
        let (target, target_mr, source_mr) = write_regions(&pa, &pb);
        for i in 0..3 {
            post_write(&link, &target_mr, &source_mr, i * 8).await;
        }
        landed(&target, 2 * 8).await;
        assert_eq!(link.posted(), 3);
        assert_eq!(Arc::strong_count(&source_mr), 4);
        // No completion will come for them: closing returns their credits and buffers.
        link.close();
        tokio::time::timeout(Duration::from_secs(5), poller)
            .await
            .expect("the send poller outlived its link")
            .unwrap();
        assert_eq!(link.posted(), 0);
        assert_eq!(link.completions(), 0);
        assert_eq!(Arc::strong_count(&source_mr), 1);
    }

    #[tokio::test]
    async fn a_batch_posts_its_sends_in_one_chain_and_close_returns_what_it_held() {
        let (link, mut rx, _pa, _pb) = linked_pair();
        let wait = Duration::from_secs(5);
        {
            let _batch = link.batch_sends();
            link.send(&[b"one"], None).await.unwrap();
            link.send(&[b"two"], None).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(messages(&mut rx).is_empty(), "a held SEND went out");
            assert_eq!(link.posted(), 0);
        }
        let mut got = Vec::new();
        tokio::time::timeout(wait, async {
            while got.len() < 2 {
                got.extend(messages(&mut rx));
                if got.len() < 2 {
                    rx.wait().await;
                }
            }
        })
        .await
        .expect("the batch never went out");
        assert_eq!(got, [b"one".to_vec(), b"two".to_vec()]);
        tokio::time::timeout(wait, async {
            while link.posted() > 0 || lock(&link.free_slots).len() < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();

        // Closed with a SEND held: its slot and credit come back; nothing is posted.
        let _batch = link.batch_sends();
        link.send(&[b"never"], None).await.unwrap();
        assert_eq!(lock(&link.free_slots).len(), 1);
        link.close();
        assert_eq!(lock(&link.free_slots).len(), 2);
        assert_eq!(link.posted(), 0);
        assert!(messages(&mut rx).is_empty());
    }

    #[tokio::test]
    async fn held_sends_follow_the_writes_and_never_block_a_wait() {
        let (link, mut rx, pa, pb) = linked_pair();
        let (target, target_mr, source_mr) = write_regions(&pa, &pb);
        let wait = Duration::from_secs(5);
        {
            let _batch = link.batch_sends();
            link.send(&[b"one"], None).await.unwrap();
            link.send(&[b"two"], None).await.unwrap();
            // A WRITE waited on goes at once; the SENDs before it wait.
            link.sq_credit().await.unwrap();
            let op = SendOp::RdmaWrite {
                remote_addr: target_mr.iova(),
                rkey: target_mr.rkey(),
            };
            let sge = source_mr.sge(0, 5);
            let done = link
                .post_op(op, sge.into(), Hold::Mr(source_mr.clone()), true)
                .unwrap()
                .unwrap();
            let status = tokio::time::timeout(wait, done).await.unwrap().unwrap();
            assert_eq!(status, WcStatus::Success);
            let mut landed = [0u8; 5];
            target.read(0, &mut landed);
            assert_eq!(&landed, b"data!");
            assert!(messages(&mut rx).is_empty(), "a held SEND went out");
            // Both slots are held: waiting for one posts the held SENDs first.
            tokio::time::timeout(wait, link.send(&[b"three"], None))
                .await
                .expect("a wait for a slot was blocked by held SENDs")
                .unwrap();
        }
        let mut got = Vec::new();
        tokio::time::timeout(wait, async {
            loop {
                got.extend(messages(&mut rx));
                if got.len() >= 3 {
                    break;
                }
                rx.wait().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("got {got:?}"));
        assert_eq!(got, [b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);
    }
}
