//! NVMe/RDMA: one RC queue pair, reached through RDMA/CM, is one queue of one controller
//! ([`serve`]).
//!
//! The connection request's private data names the queue (its QID and sizes, [`CmReq`]); a
//! bad one is refused with the REJ status the specification names. The queue pair, its
//! receive ring (one capsule per submission queue entry, each a 64-byte command and up to
//! the in-capsule size of data), send slots, credits and data movement are the shared RDMA
//! channel layer's. The first capsule must be Connect; its data comes in the capsule or
//! through a keyed SGL (Linux's admin queue), which the queue reads by RDMA READ.
//!
//! A command's data from the host is in the capsule (an offset data block) or read by RDMA
//! READ straight into a pool buffer (a keyed data block); data for the host goes by RDMA
//! WRITE straight from the buffer it was read into, then the completion as a SEND, with
//! Invalidate when the keyed SGL asked for it (so the host need not invalidate its key
//! itself). Commands run in the receive loop's task until they must wait
//! ([`rtgt_backstore::run_inline`]); the completions of one batch of capsules go out in one
//! chained post.
//!
//! Bounds: a capsule beyond the queue's entries (the host's SQ size, each freed before its
//! completion is sent) or shorter than a command breaks the protocol and ends the
//! connection, as a failed or flushed receive does; closing the admin queue (or a keep alive
//! timeout) closes the controller and so every queue of it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use rtgt_backstore::{run_inline, IoBuf};
use rtgt_rdma_channel::cm::{Connection, Request};
use rtgt_rdma_channel::{self as rdma, Link, LinkError, Receiver, Remote, Rings, RxEvent};
use rtgt_transport::cm::ConnParams;

use crate::ctrl::{Attached, Controller, Payload, QueueStats, Reply};
use crate::queue::{ConnectCmd, Scope, SqHead, Transport};
use crate::rdma::{cm_rej, cm_rep, cm_status, CmReq};
use crate::sqe::{sc, sct, Cqe, Sgl, Sqe, Status, CQE_LEN, SQE_LEN};
use crate::subsys::{connect_offset, ConnectRefused, Targets, ADMIN_IN_CAPSULE};

/// RDMA READs a queue keeps in flight (the channel layer queues those beyond the host's
/// responder resources).
const READ_DEPTH: u32 = 64;

/// Checks a connection request's private data against the target's limits.
fn check_request(targets: &Targets, private_data: &[u8]) -> Result<CmReq, u16> {
    let r = CmReq::parse(private_data)?;
    let limits = targets.limits;
    if r.qid > limits.io_queues {
        return Err(cm_status::INVALID_QID);
    }
    if r.hsqsize == 0 || r.hsqsize >= limits.queue_size {
        return Err(cm_status::INVALID_HSQSIZE);
    }
    if r.hrqsize == 0 {
        return Err(cm_status::INVALID_HRQSIZE);
    }
    Ok(r)
}

/// The rings of a queue of `entries` submission queue entries.
fn rings(entries: u32, in_capsule: u32) -> Rings {
    Rings {
        recv_slots: entries,
        recv_slot_len: SQE_LEN + in_capsule as usize,
        send_slots: entries,
        send_slot_len: CQE_LEN,
        // A command's RDMA WRITE or READ (MDTS is within one work request) and its SEND.
        send_queue: entries * 2 + 8,
        rdma_read_depth: READ_DEPTH,
    }
}

/// Serves one NVMe/RDMA connection request: accepts or rejects it, then runs the queue
/// until either side ends it.
pub async fn serve(targets: Arc<Targets>, req: Request, scope: Scope) {
    let peer = req.peer();
    let local = req.local();
    let cm = match check_request(&targets, req.private_data()) {
        Ok(c) => c,
        Err(status) => {
            tracing::warn!(%peer, status, "NVMe/RDMA connection request refused");
            req.reject(&cm_rej(status));
            return;
        }
    };
    let entries = u32::from(cm.hsqsize) + 1;
    // Receive slots as large as the queue's capsules: an admin queue's are the transport's
    // 8 KiB; an I/O queue's its controller's (IOCCSZ, fixed when the controller was made),
    // so for a request that names a live controller that one's size even if its port's has
    // changed since, else the port's.
    let in_capsule = match scope {
        Scope::Port(id) if cm.qid != 0 => targets
            .controller(cm.cntlid)
            .map_or_else(|| targets.in_capsule(id), |c| c.in_capsule()),
        _ => ADMIN_IN_CAPSULE,
    };
    let built = req.endpoint(rings(entries, in_capsule));
    let started = built.map_err(|e| e.to_string()).and_then(|ep| {
        let link = Arc::new(Link::new(&ep, peer, req.pool_mrs()).map_err(|e| e.to_string())?);
        // Posted before the REP: the host may send its Connect as soon as it has sent RTU.
        ep.post_receives().map_err(|e| e.to_string())?;
        Ok((link, ep))
    });
    let (link, ep) = match started {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "NVMe/RDMA: no resources for a queue");
            req.reject(&cm_rej(cm_status::NO_RESOURCES));
            return;
        }
    };
    let qp = ep.qp.clone();
    tokio::spawn(rdma::poll_send(link.clone(), ep.send_cq().clone()));
    // From here on, however this future ends (its listener stopped drops it too), the queue
    // pair goes to the error state and the connection is disconnected.
    let mut open = Open {
        link: link.clone(),
        conn: None,
    };
    let rx = Receiver::new(ep);
    let (responder_resources, initiator_depth) = req.target_read_depths();
    let params = ConnParams {
        private_data: cm_rep(entries as u16).to_vec(),
        responder_resources,
        initiator_depth,
        rnr_retry_count: 7,
        flow_control: true,
        ..ConnParams::default()
    };
    let conn = match req.accept(&qp, params).await {
        Ok(c) => open.conn.insert(c),
        Err(e) => {
            tracing::warn!(%peer, error = %e, "NVMe/RDMA: connection not established");
            return;
        }
    };
    let mut run = Run {
        targets,
        link: link.clone(),
        cm,
        scope,
        in_capsule,
        addrs: (peer, local),
        queue: None,
        attached: None,
    };
    let why = tokio::select! {
        _ = conn.disconnected() => "the host disconnected",
        why = run.receive(rx) => why,
    };
    drop(open);
    if let Some(q) = &run.queue {
        tracing::info!(%peer, cntlid = q.ctrl.cntlid, qid = q.qid, why, "NVMe/RDMA queue closed");
    }
    // The controller learns the queue is gone (the admin queue's end closes it).
    drop(run);
}

/// What a queue closes when it ends: its queue pair (to the error state, flushing what is
/// posted) and its connection (DREQ).
struct Open {
    link: Arc<Link>,
    conn: Option<Connection>,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.link.close();
        if let Some(c) = &self.conn {
            c.disconnect();
        }
    }
}

/// A connection's receive side, before and after its Connect.
struct Run {
    targets: Arc<Targets>,
    link: Arc<Link>,
    cm: CmReq,
    scope: Scope,
    /// In-capsule data its receive slots hold.
    in_capsule: u32,
    addrs: (SocketAddr, SocketAddr),
    queue: Option<Arc<Queue>>,
    attached: Option<Attached>,
}

impl Run {
    /// Takes capsules until the queue ends; returns why.
    async fn receive(&mut self, mut rx: Receiver) -> &'static str {
        let mut events = Vec::new();
        let link = self.link.clone();
        loop {
            rx.take(&mut events);
            // The completions of this batch go out together, after their data.
            let batch = link.batch_sends();
            for ev in events.drain(..) {
                let msg = match ev {
                    RxEvent::Msg(msg, _) => msg,
                    RxEvent::Failed(_) => return "the queue pair failed or was flushed",
                };
                let ok = match &self.queue {
                    Some(q) => q.receive(msg),
                    None => self.connect(msg).await,
                };
                if !ok {
                    return "the host broke the protocol";
                }
            }
            drop(batch);
            let ctrl = self.queue.as_ref().map(|q| q.ctrl.clone());
            tokio::select! {
                _ = rx.wait() => {}
                _ = self.link.closed() => return "the queue pair failed",
                _ = async { match &ctrl {
                    Some(c) => c.closed().await,
                    None => std::future::pending().await,
                } } => return "the controller closed",
            }
        }
    }

    /// The first capsule, which must be a Connect for the queue the request named. Answers
    /// it; false when the connection is to end.
    async fn connect(&mut self, msg: Bytes) -> bool {
        let Some(sqe) = capsule(&msg) else {
            return false;
        };
        let link = &self.link;
        let answer = |status: Status, dw0: u32| {
            let cqe = Cqe {
                dw0,
                cid: sqe.cid,
                sq_id: self.cm.qid,
                status,
                ..Cqe::default()
            };
            send_cqe(link, &sqe, cqe)
        };
        let cmd = match ConnectCmd::parse(&sqe) {
            Ok(c) => c,
            Err(status) => return answer(status, 0).await.is_ok(),
        };
        let refused = if cmd.qid != self.cm.qid {
            Some(ConnectRefused::invalid(true, connect_offset::QID))
        } else if cmd.sqsize > self.cm.hsqsize {
            Some(ConnectRefused::invalid(true, connect_offset::SQSIZE))
        } else {
            None
        };
        if let Some(r) = refused {
            return answer(r.status, r.dw0).await.is_ok();
        }
        let data = match data_out(link, &self.targets, &sqe, &msg, self.in_capsule).await {
            Ok(Ok(d)) => d,
            Ok(Err(status)) => return answer(status, 0).await.is_ok(),
            Err(_) => return false,
        };
        let data = data.as_ref().map_or(&[][..], |b| b.as_slice());
        // An I/O queue of a controller that takes larger capsules than its receive slots
        // hold (its request named no controller, or another, and the port's size has
        // shrunk since this one was made) could not take what the host was told it may
        // send: refused, so the host makes a new controller.
        let admitted = cmd
            .admit(&self.targets, self.scope, data, Transport::Rdma)
            .and_then(|ctrl| {
                if cmd.qid != 0 && ctrl.in_capsule() > self.in_capsule {
                    tracing::warn!(peer = %self.addrs.0, cntlid = ctrl.cntlid,
                        in_capsule = ctrl.in_capsule(), slots = self.in_capsule,
                        "NVMe/RDMA I/O queue refused: its controller's capsules exceed its receive slots");
                    return Err(ConnectRefused::invalid(false, connect_offset::CNTLID));
                }
                Ok(ctrl)
            });
        match admitted {
            Ok(ctrl) => {
                let size = cmd.sqsize + 1;
                let attached = ctrl.attach(cmd.qid, size, Some(self.addrs), Transport::Rdma);
                let q = Arc::new(Queue {
                    targets: self.targets.clone(),
                    link: link.clone(),
                    ctrl: ctrl.clone(),
                    qid: cmd.qid,
                    sq: SqHead::new(size),
                    entries: u32::from(size),
                    in_capsule: if cmd.qid == 0 {
                        self.in_capsule
                    } else {
                        ctrl.in_capsule()
                    },
                    outstanding: AtomicU32::new(0),
                    stats: attached.stats(),
                });
                if answer(Status::SUCCESS, u32::from(ctrl.cntlid))
                    .await
                    .is_err()
                {
                    return false;
                }
                self.attached = Some(attached);
                tracing::info!(peer = %self.addrs.0, cntlid = ctrl.cntlid, qid = cmd.qid,
                    host = %ctrl.host_nqn, "NVMe/RDMA queue connected");
                self.queue = Some(q);
                true
            }
            Err(r) => answer(r.status, r.dw0).await.is_ok(),
        }
    }
}

/// The command at the head of a capsule; None for a capsule too short to hold one.
fn capsule(msg: &[u8]) -> Option<Sqe> {
    let sqe = msg.get(..SQE_LEN).and_then(Sqe::parse);
    if sqe.is_none() {
        tracing::warn!(len = msg.len(), "NVMe/RDMA capsule shorter than a command");
    }
    sqe
}

/// Sends a completion, with Invalidate of the command's key when its SGL asked for it.
async fn send_cqe(link: &Link, sqe: &Sqe, cqe: Cqe) -> Result<(), LinkError> {
    link.send(&[&cqe.to_bytes()], sqe.sgl().invalidate_key())
        .await
}

/// The data a command brings: from its capsule, or read from the host by RDMA READ. An
/// SGL the queue cannot follow is the status to complete the command with.
async fn data_out(
    link: &Link,
    targets: &Targets,
    sqe: &Sqe,
    msg: &[u8],
    in_capsule: u32,
) -> Result<Result<Option<IoBuf>, Status>, LinkError> {
    let len = Controller::data_out_len(sqe);
    if len == 0 {
        return Ok(Ok(None));
    }
    let fail = |code: u8| Ok(Err(Status::error(sct::GENERIC, code)));
    match sqe.sgl() {
        Sgl::DataBlock {
            offset: true,
            addr,
            len,
        } => {
            if addr.saturating_add(u64::from(len)) > u64::from(in_capsule) {
                return fail(sc::SGL_INVALID_OFFSET);
            }
            let data = &msg[SQE_LEN..];
            let (at, len) = (addr as usize, len as usize);
            if at + len > data.len() {
                return fail(sc::SGL_INVALID_DATA_LENGTH);
            }
            let mut buf = targets.pool.get(len).await;
            buf.as_mut_slice().copy_from_slice(&data[at..at + len]);
            Ok(Ok(Some(buf)))
        }
        Sgl::Keyed { addr, len, key, .. } => {
            if len as usize > targets.limits.max_transfer() {
                return fail(sc::INVALID_FIELD);
            }
            let buf = targets.pool.get(len as usize).await;
            let from = Remote {
                addr,
                rkey: key,
                len,
            };
            Ok(Ok(Some(link.rdma_read(buf, 0, &[from]).await?)))
        }
        _ => fail(sc::SGL_INVALID_TYPE),
    }
}

/// A connected queue.
struct Queue {
    targets: Arc<Targets>,
    link: Arc<Link>,
    ctrl: Arc<Controller>,
    qid: u16,
    sq: SqHead,
    /// The queue's entries: the most commands the host may have outstanding.
    entries: u32,
    /// In-capsule data its receive slots hold.
    in_capsule: u32,
    outstanding: AtomicU32,
    /// The queue's counters.
    stats: Arc<QueueStats>,
}

impl Queue {
    /// A capsule after Connect: its command runs. False when the host broke the protocol.
    fn receive(self: &Arc<Self>, msg: Bytes) -> bool {
        let Some(sqe) = capsule(&msg) else {
            return false;
        };
        if self.outstanding.fetch_add(1, Ordering::AcqRel) >= self.entries {
            tracing::warn!(
                cntlid = self.ctrl.cntlid,
                qid = self.qid,
                entries = self.entries,
                "NVMe/RDMA host sent more commands than the queue has entries"
            );
            return false;
        }
        self.sq.fetched();
        run_inline(self.clone().command(sqe, msg));
        true
    }

    async fn command(self: Arc<Self>, sqe: Sqe, msg: Bytes) {
        let reply = match data_out(&self.link, &self.targets, &sqe, &msg, self.in_capsule).await {
            Ok(Ok(data)) => {
                self.ctrl
                    .execute_on(&self.stats, self.qid, &sqe, data, false)
                    .await
            }
            Ok(Err(status)) => Reply::status(status),
            Err(_) => return,
        };
        drop(msg);
        let _ = self.respond(&sqe, reply).await;
    }

    /// Writes the command's data for the host (if any) and sends its completion.
    async fn respond(&self, sqe: &Sqe, mut reply: Reply) -> Result<(), LinkError> {
        let mut status = reply.status;
        // Data goes by RDMA WRITE, so only through a keyed SGL.
        let keyed_len = match sqe.sgl() {
            Sgl::Keyed { len, .. } => len as usize,
            _ => usize::MAX,
        };
        let data = match reply.take_payload(keyed_len) {
            Payload::Buf(mut b, n) => {
                b.truncate(n);
                Some(b)
            }
            Payload::Vec(v, n) if n > 0 => {
                let mut b = self.targets.pool.get(n).await;
                b.as_mut_slice().copy_from_slice(&v[..n]);
                Some(b)
            }
            Payload::Vec(..) | Payload::None => None,
            // Never made for this queue (it executes without file ranges).
            Payload::File(_) => {
                status = Status::error(sct::GENERIC, sc::INTERNAL_ERROR);
                None
            }
        };
        if let Some(d) = data {
            match sqe.sgl() {
                Sgl::Keyed { addr, len, key, .. } => {
                    if !d.is_empty() {
                        let to = Remote {
                            addr,
                            rkey: key,
                            len,
                        };
                        self.link.rdma_write(d, &[to]).await?;
                    }
                }
                _ => status = Status::error(sct::GENERIC, sc::SGL_INVALID_TYPE),
            }
        }
        let cqe = self.sq.cqe(self.qid, sqe.cid, status, reply.dw0, reply.dw1);
        // The entry is free before the host can see the completion.
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
        send_cqe(&self.link, sqe, cqe).await
    }
}
