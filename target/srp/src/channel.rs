//! An SRP RDMA channel (SRP r16a §5.4): one RC queue pair, a receive ring of initiator IUs
//! sized from the request limit, and the commands in flight on it.
//!
//! Flow control is the request limit: every SRP_CMD and SRP_TSK_MGMT holds its receive
//! buffer until its answer is sent; the buffer is posted again just before the SRP_RSP goes
//! out and the SRP_RSP returns that credit (REQUEST LIMIT DELTA 1, plus the credits of
//! aborted commands, which get no response of their own). An initiator that sends beyond its
//! credits finds no receive buffer and is held back by RNR NAKs.
//!
//! Data-in moves by RDMA WRITE straight from the backstore buffer, data-out by RDMA READ
//! straight into the buffer handed to the SCSI engine; an indirect descriptor table that the
//! SRP_CMD does not carry whole is fetched by RDMA READ first; immediate data is copied out of
//! the receive buffer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rtgt_backstore::{BufPool, IoBuf};
use rtgt_transport::verbs::{
    Access, Cq, Mr, Pd, Qp, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr, Region,
    SendFlags, SendOp, SendWr, VerbsError, WcOpcode, WcStatus, WorkCompletion,
};
use tokio::sync::{oneshot, watch, Semaphore};

use super::iu::{
    logout_reason, opcode, tmf, tmf_status, Cmd, DataDesc, DirectBuf, InitiatorIu, Rsp, ShortIu,
    TskMgmt,
};
use super::login::ChannelParams;
use super::mem::{region_owning, Lent};
use super::port::{Login, Session, SessionRef, SrpPort};
use rtgt_scsi::sense::{asc, key, Sense};
use rtgt_scsi::task::{self, Function, Outcome, Refused, Stage, Task, TaskSet, TmResponse, Turn};
use rtgt_scsi::{lun_from_bytes, Command, Status, TaskAttr, MAX_TRANSFER_BYTES};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Receive buffers beyond the request limit, for IUs that take no credit (SRP_CRED_RSP,
/// SRP_AER_RSP, SRP_I_LOGOUT).
pub const RECV_RESERVE: u32 = 4;
/// Send work requests in flight per channel (RDMA READ/WRITE and SENDs).
pub const SEND_DEPTH: u32 = 1024;
/// Largest indirect descriptor table fetched from the initiator, in descriptors.
pub const MAX_EXT_DESCRIPTORS: usize = 4096;

/// INVALID FIELD IN COMMAND INFORMATION UNIT (SPC-4 Table D.1: 0Eh/03h).
const INVALID_FIELD_IN_IU: (u8, u8) = (0x0e, 0x03);
/// OVERLAPPED COMMANDS ATTEMPTED (4Eh/00h).
const OVERLAPPED_COMMANDS: (u8, u8) = (0x4e, 0x00);

/// Why a channel closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// SRP_I_LOGOUT.
    Logout,
    /// A single-channel login of the same initiator.
    Relogin,
    /// The connection went away (disconnect request, QP error, flushed receives).
    Disconnected,
    /// The initiator broke the protocol.
    Protocol,
    /// rtgtd stops (after SRP_T_LOGOUT).
    Shutdown,
}

/// The channel failed under a command (QP error or close): nothing more is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed;

impl From<VerbsError> for Failed {
    fn from(_: VerbsError) -> Failed {
        Failed
    }
}

/// Counters of a channel.
#[derive(Debug, Default)]
pub struct ChannelStats {
    pub commands: AtomicU64,
    pub task_mgmt: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
}

#[derive(Default)]
struct Inner {
    waiters: HashMap<u64, oneshot::Sender<WcStatus>>,
    /// Send-side memory regions kept until their work request completes.
    send_mrs: HashMap<u64, Mr>,
    closed: bool,
}

/// The SRP_CMD TASK ATTRIBUTE field (SRP r16a 6.9, the SAM task attribute codes).
fn task_attr(code: u8) -> TaskAttr {
    match code {
        1 => TaskAttr::HeadOfQueue,
        2 => TaskAttr::Ordered,
        4 => TaskAttr::Aca,
        _ => TaskAttr::Simple,
    }
}

static CHANNEL_ID: AtomicU64 = AtomicU64::new(1);

/// One SRP channel.
pub struct Channel {
    pub id: u64,
    pub params: ChannelParams,
    login_rsp: super::iu::LoginRsp,
    pub session: Arc<Session>,
    session_ref: Mutex<Option<SessionRef>>,
    pub stats: ChannelStats,
    /// The initiator's address and the one it connected to, once connected.
    addrs: std::sync::OnceLock<(std::net::SocketAddr, std::net::SocketAddr)>,
    qp: Arc<Qp>,
    cq: Cq,
    pd: Pd,
    recv_region: Arc<Region>,
    recv_mr: Mr,
    max_inline: u32,
    inner: Mutex<Inner>,
    /// The channel's commands (tags are unique per channel).
    tasks: Arc<TaskSet<Task>>,
    next_wr: AtomicU64,
    sq: Semaphore,
    pending_credits: AtomicU32,
    close_tx: watch::Sender<Option<CloseReason>>,
    finished: watch::Sender<bool>,
    pool: Arc<BufPool>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("id", &self.id)
            .field("qpn", &self.qp.qpn())
            .field("initiator", &self.session.nexus.initiator_port)
            .finish()
    }
}

/// Send work request ids start here; receive ids are slot numbers.
const SEND_WR_BASE: u64 = 1 << 32;

impl Channel {
    /// Receive buffers of a channel with `params`.
    pub fn recv_slots(params: &ChannelParams) -> u32 {
        params.req_lim + RECV_RESERVE
    }

    /// Queue sizes of the QP of a channel with `params` on a device with `max_inline` bytes
    /// of inline data.
    pub fn qp_cap(params: &ChannelParams, max_inline: u32) -> QpCap {
        QpCap {
            max_send_wr: SEND_DEPTH,
            max_recv_wr: Self::recv_slots(params),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: max_inline.min(512),
        }
    }

    /// Creates the completion queue and the RC QP of a channel, in the RESET state (the
    /// connection manager drives it to RTS).
    pub fn create_qp(pd: &Pd, params: &ChannelParams) -> Result<(Cq, Qp), VerbsError> {
        let dev = pd.device();
        let cap = Self::qp_cap(params, dev.attr().max_inline_data);
        let cq = dev.create_cq(cap.max_send_wr + cap.max_recv_wr)?;
        let mut init = QpInitAttr::new(QpType::Rc, &cq, &cq);
        init.cap = cap;
        init.sq_sig_all = true;
        let qp = pd.create_qp(init)?;
        Ok((cq, qp))
    }

    /// Builds the channel of an accepted login on `qp` (made by [`Channel::create_qp`], now
    /// INIT or later): registers and posts the receive ring and starts the completion
    /// handler. An IU that arrives before the ring is posted is held back by RNR NAKs.
    pub fn start(
        pd: Pd,
        cq: Cq,
        qp: Arc<Qp>,
        login: Login,
        port: &SrpPort,
    ) -> Result<Arc<Channel>, VerbsError> {
        let params = login.params;
        let slots = Self::recv_slots(&params);
        let iu_len = params.it_iu_len as usize;
        let recv_region = Arc::new(Region::zeroed(slots as usize * iu_len));
        let recv_mr = pd.reg_mr(recv_region.clone(), Access::LOCAL_WRITE)?;
        let max_inline = qp.attr().map_or(0, |(_, cap)| cap.max_inline_data);
        let session = login.session.session.clone();
        let tasks = TaskSet::new(session.nexus.id);
        let ch = Arc::new(Channel {
            id: CHANNEL_ID.fetch_add(1, Ordering::Relaxed),
            params,
            login_rsp: login.rsp,
            session,
            session_ref: Mutex::new(Some(login.session)),
            stats: ChannelStats::default(),
            addrs: std::sync::OnceLock::new(),
            qp,
            cq,
            pd,
            recv_region,
            recv_mr,
            max_inline,
            inner: Mutex::new(Inner::default()),
            tasks,
            next_wr: AtomicU64::new(SEND_WR_BASE),
            sq: Semaphore::new(SEND_DEPTH as usize),
            pending_credits: AtomicU32::new(0),
            close_tx: watch::channel(None).0,
            finished: watch::channel(false).0,
            pool: port.pool.clone(),
        });
        for slot in 0..slots {
            ch.repost(slot)?;
        }
        port.add_channel(&ch.session, &ch);
        tokio::spawn(ch.clone().completions());
        Ok(ch)
    }

    pub fn qp(&self) -> &Arc<Qp> {
        &self.qp
    }

    /// Records the connection's addresses: the initiator's and the one it connected to.
    pub fn set_addrs(&self, peer: std::net::SocketAddr, local: std::net::SocketAddr) {
        let _ = self.addrs.set((peer, local));
    }

    /// The connection's addresses (initiator, target), when known.
    pub fn addrs(&self) -> Option<(std::net::SocketAddr, std::net::SocketAddr)> {
        self.addrs.get().copied()
    }

    /// The LOGIN_RSP of the login that made this channel.
    pub fn login_rsp(&self) -> super::iu::LoginRsp {
        self.login_rsp
    }

    /// Asks the channel to close; idempotent, the first reason wins.
    pub fn close(&self, reason: CloseReason) {
        self.close_tx.send_if_modified(|r| {
            if r.is_none() {
                *r = Some(reason);
                true
            } else {
                false
            }
        });
    }

    /// Resolves when the channel was asked to close, with the reason.
    pub async fn closed(&self) -> CloseReason {
        let mut rx = self.close_tx.subscribe();
        let r = rx.wait_for(|r| r.is_some()).await;
        r.ok().and_then(|r| *r).unwrap_or(CloseReason::Disconnected)
    }

    /// Resolves when the channel has closed and every command on it has ended.
    pub async fn finished(&self) {
        let mut rx = self.finished.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }

    pub fn is_closed(&self) -> bool {
        self.close_tx.borrow().is_some()
    }

    /// Commands in flight.
    pub fn outstanding(&self) -> usize {
        self.tasks.len()
    }

    /// Commands marked aborted that have not finished yet.
    pub fn aborting(&self) -> usize {
        self.tasks.all().iter().filter(|t| t.is_aborted()).count()
    }

    /// Sends SRP_T_LOGOUT and closes the channel.
    pub async fn logout(&self) {
        if !self.is_closed() {
            let iu = ShortIu {
                opcode: opcode::T_LOGOUT,
                sol_not: 0,
                word: logout_reason::NO_REASON,
                tag: 0,
            };
            if let Ok(rx) = self.send_iu(iu.to_bytes()).await {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(2), rx).await;
            }
        }
        self.close(CloseReason::Shutdown);
        self.finished().await;
    }

    fn repost(&self, slot: u32) -> Result<(), VerbsError> {
        let len = self.params.it_iu_len;
        self.qp.post_recv(RecvWr {
            wr_id: u64::from(slot),
            sg_list: vec![self.recv_mr.sge(slot as usize * len as usize, len)],
        })
    }

    /// The completion handler: receives become commands, send completions wake their
    /// waiters. Runs until the channel closes, then tears it down.
    async fn completions(self: Arc<Self>) {
        let mut close_rx = self.close_tx.subscribe();
        let mut wcs = Vec::with_capacity(64);
        loop {
            if close_rx.borrow_and_update().is_some() {
                break;
            }
            tokio::select! {
                _ = self.cq.wait_nonempty() => {}
                _ = close_rx.changed() => continue,
            }
            wcs.clear();
            self.cq.poll_into(&mut wcs, 64);
            for wc in wcs.drain(..) {
                self.completion(wc);
            }
            if self.cq.is_error() {
                tracing::error!(channel = self.id, "SRP channel completion queue overrun");
                self.close(CloseReason::Disconnected);
            }
        }
        self.teardown().await;
    }

    fn completion(self: &Arc<Self>, wc: WorkCompletion) {
        if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            if wc.status != WcStatus::Success {
                if !self.is_closed() {
                    tracing::info!(channel = self.id, status = ?wc.status, "SRP channel receive failed: closing");
                }
                self.close(CloseReason::Disconnected);
                return;
            }
            self.receive(wc.wr_id as u32, wc.byte_len as usize);
            return;
        }
        let (waiter, _mr) = {
            let mut g = lock(&self.inner);
            (g.waiters.remove(&wc.wr_id), g.send_mrs.remove(&wc.wr_id))
        };
        self.sq.add_permits(1);
        if let Some(w) = waiter {
            let _ = w.send(wc.status);
        }
        if wc.status != WcStatus::Success {
            if wc.status != WcStatus::WrFlushErr {
                tracing::warn!(channel = self.id, status = ?wc.status, "SRP channel send failed: closing");
            }
            self.close(CloseReason::Disconnected);
        }
    }

    async fn teardown(self: Arc<Self>) {
        let _ = self.qp.modify(
            &QpAttr {
                qp_state: Some(QpState::Err),
                ..Default::default()
            },
            QpAttrMask::STATE,
        );
        {
            let mut g = lock(&self.inner);
            g.closed = true;
            g.waiters.clear();
        }
        self.sq.close();
        let tasks = self.tasks.abort_all();
        if !tasks.is_empty() {
            for dev in self.session.luns.current().map.luns.values() {
                dev.abort_task_set(Some(&self.session.nexus));
            }
        }
        for t in &tasks {
            t.finished().await;
        }
        let reason = self.close_tx.borrow().unwrap_or(CloseReason::Disconnected);
        tracing::info!(
            channel = self.id, initiator = %self.session.nexus.initiator_port, ?reason,
            aborted = tasks.len(), "SRP channel closed"
        );
        lock(&self.inner).send_mrs.clear();
        drop(lock(&self.session_ref).take());
        self.finished.send_replace(true);
    }

    fn receive(self: &Arc<Self>, slot: u32, len: usize) {
        let iu_len = self.params.it_iu_len as usize;
        let mut iu = vec![0u8; len.min(iu_len)];
        self.recv_region.read(slot as usize * iu_len, &mut iu);
        match InitiatorIu::parse(&iu) {
            Ok(InitiatorIu::Cmd(cmd)) => {
                self.stats.commands.fetch_add(1, Ordering::Relaxed);
                let lun = lun_from_bytes(&cmd.lun);
                let dev = self.session.luns.current().map.luns.get(&lun).cloned();
                let task = Arc::new(Task::new(cmd.tag, lun, task_attr(cmd.task_attr), dev));
                let ch = self.clone();
                let sense = match self.tasks.admit(&task) {
                    Ok(turn) => {
                        tokio::spawn(async move { ch.run_cmd(slot, iu, cmd, task, turn).await });
                        return;
                    }
                    Err(Refused::Overlapped) => {
                        Sense::new(key::ABORTED_COMMAND, OVERLAPPED_COMMANDS)
                    }
                    Err(Refused::NoAca) => Sense::new(key::ILLEGAL_REQUEST, asc::INVALID_MESSAGE),
                };
                tokio::spawn(async move { ch.respond_check(slot, cmd.tag, &sense, None).await });
            }
            Ok(InitiatorIu::TskMgmt(t)) => {
                self.stats.task_mgmt.fetch_add(1, Ordering::Relaxed);
                let ch = self.clone();
                tokio::spawn(async move { ch.run_tmf(slot, t).await });
            }
            Ok(InitiatorIu::ILogout(_)) => {
                let _ = self.repost(slot);
                self.close(CloseReason::Logout);
            }
            Ok(InitiatorIu::CredRsp(_) | InitiatorIu::AerRsp(_)) => {
                let _ = self.repost(slot);
            }
            Err(e) => {
                let tag = super::iu::iu_tag(&iu);
                let ch = self.clone();
                match iu.first().copied() {
                    Some(opcode::CMD) => {
                        tracing::debug!(channel = self.id, error = %e, "invalid SRP_CMD");
                        let sense = Sense::new(key::ILLEGAL_REQUEST, INVALID_FIELD_IN_IU);
                        tokio::spawn(
                            async move { ch.respond_check(slot, tag, &sense, None).await },
                        );
                    }
                    Some(opcode::TSK_MGMT) => {
                        tokio::spawn(async move {
                            ch.respond_tmf(slot, tag, tmf_status::INVALID_FIELDS).await
                        });
                    }
                    op => {
                        tracing::warn!(channel = self.id, opcode = ?op, error = %e,
                            "invalid SRP information unit: logging the initiator out");
                        tokio::spawn(async move {
                            let iu = ShortIu {
                                opcode: opcode::T_LOGOUT,
                                sol_not: 0,
                                word: logout_reason::INVALID_IU_TYPE,
                                tag,
                            };
                            if let Ok(rx) = ch.send_iu(iu.to_bytes()).await {
                                let _ = rx.await;
                            }
                            ch.close(CloseReason::Protocol);
                        });
                    }
                }
            }
        }
    }

    fn next_wr_id(&self) -> u64 {
        self.next_wr.fetch_add(1, Ordering::Relaxed)
    }

    /// Posts a send work request; the receiver resolves with its completion status.
    async fn post(
        &self,
        wr: SendWr,
        mr: Option<Mr>,
    ) -> Result<oneshot::Receiver<WcStatus>, Failed> {
        let permit = self.sq.acquire().await.map_err(|_| Failed)?;
        permit.forget();
        let (tx, rx) = oneshot::channel();
        let id = wr.wr_id;
        {
            let mut g = lock(&self.inner);
            if g.closed {
                drop(g);
                self.sq.add_permits(1);
                return Err(Failed);
            }
            g.waiters.insert(id, tx);
            if let Some(mr) = mr {
                g.send_mrs.insert(id, mr);
            }
        }
        if let Err(e) = self.qp.post_send(wr) {
            {
                let mut g = lock(&self.inner);
                g.waiters.remove(&id);
                g.send_mrs.remove(&id);
            }
            self.sq.add_permits(1);
            tracing::warn!(channel = self.id, error = %e, "SRP channel cannot post: closing");
            self.close(CloseReason::Disconnected);
            return Err(Failed);
        }
        Ok(rx)
    }

    /// Sends one IU, inline when it fits.
    async fn send_iu(&self, bytes: Vec<u8>) -> Result<oneshot::Receiver<WcStatus>, Failed> {
        let id = self.next_wr_id();
        if bytes.len() <= self.max_inline as usize {
            let mut wr = SendWr::new(id, SendOp::Send, Vec::new());
            wr.flags = SendFlags::SIGNALED | SendFlags::INLINE;
            wr.inline_data = bytes;
            self.post(wr, None).await
        } else {
            let len = bytes.len() as u32;
            let mr = self
                .pd
                .reg_mr(Arc::new(Region::from_vec(bytes)), Access::LOCAL_WRITE)?;
            let wr = SendWr::new(id, SendOp::Send, vec![mr.sge(0, len)]);
            self.post(wr, Some(mr)).await
        }
    }

    async fn wait_all(rxs: Vec<oneshot::Receiver<WcStatus>>) -> Result<(), Failed> {
        let mut ok = true;
        for rx in rxs {
            ok &= matches!(rx.await, Ok(WcStatus::Success));
        }
        if ok {
            Ok(())
        } else {
            Err(Failed)
        }
    }

    /// Reposts the receive buffer of `slot` and sends `rsp`, which returns its credit and
    /// those of aborted commands.
    async fn respond(
        &self,
        slot: u32,
        mut rsp: Rsp,
        before: Vec<oneshot::Receiver<WcStatus>>,
        retire: Option<&Arc<Task>>,
    ) -> Result<(), Failed> {
        // The initiator may reuse the tag as soon as it sees the response.
        if let Some(t) = retire {
            match self.tasks.retire(t) {
                Outcome::Respond => {}
                Outcome::TaskAborted => rsp = Self::task_aborted(rsp.tag),
                Outcome::Drop => {
                    self.repost(slot)?;
                    self.pending_credits.fetch_add(1, Ordering::AcqRel);
                    return Self::wait_all(before).await;
                }
            }
        }
        self.repost(slot)?;
        rsp.req_lim_delta = 1 + self.pending_credits.swap(0, Ordering::AcqRel);
        // The initiator's receive buffers hold max_ti_iu_len bytes: shorten the sense data.
        let room = (self.params.ti_iu_len as usize).saturating_sub(Rsp::LEN + rsp.resp_data.len());
        rsp.sense.truncate(room);
        let mut rxs = before;
        match self.send_iu(rsp.to_bytes()).await {
            Ok(rx) => rxs.push(rx),
            Err(f) => {
                self.pending_credits
                    .fetch_add(rsp.req_lim_delta, Ordering::AcqRel);
                return Err(f);
            }
        }
        Self::wait_all(rxs).await
    }

    async fn respond_check(&self, slot: u32, tag: u64, sense: &Sense, retire: Option<&Arc<Task>>) {
        let rsp = Rsp {
            tag,
            status: Status::CheckCondition as u8,
            sense: sense.emit(false),
            ..Rsp::default()
        };
        let _ = self.respond(slot, rsp, Vec::new(), retire).await;
    }

    /// TASK ABORTED status for a task another I_T nexus aborted while TAS=1.
    fn task_aborted(tag: u64) -> Rsp {
        Rsp {
            tag,
            status: Status::TaskAborted as u8,
            ..Rsp::default()
        }
    }

    async fn respond_tmf(&self, slot: u32, tag: u64, status: u8) {
        let rsp = Rsp {
            tag,
            resp_data: vec![0, 0, 0, status],
            ..Rsp::default()
        };
        let _ = self.respond(slot, rsp, Vec::new(), None).await;
    }

    async fn run_cmd(
        self: Arc<Self>,
        slot: u32,
        iu: Vec<u8>,
        cmd: Cmd,
        task: Arc<Task>,
        turn: Turn,
    ) {
        let r = if task.wait_turn(turn).await {
            self.exec_cmd(slot, &iu, &cmd, &task).await
        } else {
            Ok(false)
        };
        if let Ok(false) = r {
            if self.tasks.retire(&task) == Outcome::TaskAborted {
                let _ = self
                    .respond(slot, Self::task_aborted(cmd.tag), Vec::new(), None)
                    .await;
            } else {
                // Aborted: no response; the credit goes back with the next one.
                let _ = self.repost(slot);
                self.pending_credits.fetch_add(1, Ordering::AcqRel);
            }
        }
        self.tasks.retire(&task);
        task.set_done();
    }

    /// Resolves the descriptors of one direction to the list of remote buffers covering `len`
    /// bytes, fetching an external table by RDMA READ. `Ok(Err(sense))` for bad descriptors.
    async fn descriptors(&self, d: &DataDesc) -> Result<Result<Vec<DirectBuf>, Sense>, Failed> {
        let bad = Sense::new(key::ILLEGAL_REQUEST, INVALID_FIELD_IN_IU);
        let (mut list, total) = match d {
            DataDesc::Direct(b) => (vec![*b], b.len),
            DataDesc::Indirect {
                table,
                total_len,
                inline,
            } => {
                let n = table.len as usize / DirectBuf::LEN;
                if n <= inline.len() {
                    (inline.clone(), *total_len)
                } else if n > MAX_EXT_DESCRIPTORS {
                    return Ok(Err(bad));
                } else {
                    let region = Arc::new(Region::zeroed(table.len as usize));
                    let mr = self.pd.reg_mr(region.clone(), Access::LOCAL_WRITE)?;
                    let wr = SendWr::new(
                        self.next_wr_id(),
                        SendOp::RdmaRead {
                            remote_addr: table.va,
                            rkey: table.key,
                        },
                        vec![mr.sge(0, table.len)],
                    );
                    let rx = self.post(wr, None).await?;
                    Self::wait_all(vec![rx]).await?;
                    drop(mr);
                    match DirectBuf::parse_table(&region.to_vec()) {
                        Ok(l) => (l, *total_len),
                        Err(_) => return Ok(Err(bad)),
                    }
                }
            }
            _ => return Ok(Ok(Vec::new())),
        };
        // Keep the buffers that cover the data length; too little room is an error.
        let mut left = u64::from(total);
        list.retain_mut(|b| {
            let take = u64::from(b.len).min(left);
            left -= take;
            b.len = take as u32;
            take > 0
        });
        if left > 0 {
            return Ok(Err(bad));
        }
        Ok(Ok(list))
    }

    /// RDMA READs the data-out buffers into a backstore buffer.
    async fn read_data_out(&self, list: &[DirectBuf], len: u32) -> Result<IoBuf, Failed> {
        let mut buf = self.pool.get(len as usize).await;
        buf.set_len(len as usize);
        let lent = Lent::new(buf);
        let mr = self.pd.reg_mr(lent.region().clone(), Access::LOCAL_WRITE)?;
        let mut rxs = Vec::with_capacity(list.len());
        let mut off = 0usize;
        for d in list {
            let wr = SendWr::new(
                self.next_wr_id(),
                SendOp::RdmaRead {
                    remote_addr: d.va,
                    rkey: d.key,
                },
                vec![mr.sge(off, d.len)],
            );
            rxs.push(self.post(wr, None).await?);
            off += d.len as usize;
        }
        let r = Self::wait_all(rxs).await;
        drop(mr);
        r?;
        lent.into_buf().ok_or(Failed)
    }

    /// Runs one SRP_CMD; `Ok(false)` when it was aborted (no response sent).
    async fn exec_cmd(
        &self,
        slot: u32,
        iu: &[u8],
        cmd: &Cmd,
        task: &Arc<Task>,
    ) -> Result<bool, Failed> {
        let out_len = cmd.data_out.len();
        let in_len = cmd.data_in.len();
        let bad = Sense::new(key::ILLEGAL_REQUEST, INVALID_FIELD_IN_IU);
        if out_len > MAX_TRANSFER_BYTES || in_len > MAX_TRANSFER_BYTES {
            self.respond_check(slot, cmd.tag, &bad, Some(task)).await;
            return Ok(true);
        }
        let data_out = match &cmd.data_out {
            DataDesc::None => None,
            DataDesc::Immediate { len } => {
                let data = self
                    .params
                    .imm_data_offset
                    .and_then(|o| cmd.immediate_data(iu, usize::from(o)));
                match data {
                    Some(d) if *len > 0 => {
                        let mut b = self.pool.get(d.len()).await;
                        b.set_len(d.len());
                        b.as_mut_slice().copy_from_slice(d);
                        Some(b)
                    }
                    Some(_) => None,
                    None => {
                        self.respond_check(slot, cmd.tag, &bad, Some(task)).await;
                        return Ok(true);
                    }
                }
            }
            d => match self.descriptors(d).await? {
                Err(sense) => {
                    self.respond_check(slot, cmd.tag, &sense, Some(task)).await;
                    return Ok(true);
                }
                Ok(list) if out_len > 0 => {
                    task.set_stage(Stage::DataOut);
                    Some(self.read_data_out(&list, out_len).await?)
                }
                Ok(_) => None,
            },
        };
        let in_list = match self.descriptors(&cmd.data_in).await? {
            Err(sense) => {
                self.respond_check(slot, cmd.tag, &sense, Some(task)).await;
                return Ok(true);
            }
            Ok(l) => l,
        };
        if task.is_aborted() {
            return Ok(false);
        }
        task.set_stage(Stage::Executing);
        let s = &self.session;
        let received = data_out.as_ref().map_or(0, |b| b.len() as u64);
        self.stats.bytes_in.fetch_add(received, Ordering::Relaxed);
        let command = Command {
            cdb: cmd.cdb.clone(),
            data_out,
            expected_in_len: in_len,
            attr: task_attr(cmd.task_attr),
            tag: cmd.tag,
        };
        let resp = s.luns.execute(&s.nexus, task.lun, command).await;
        if task.is_aborted() {
            return Ok(false);
        }
        task.set_stage(Stage::DataIn);
        let mut rsp = Rsp {
            tag: cmd.tag,
            status: resp.status as u8,
            sense: resp.sense.unwrap_or_default(),
            ..Rsp::default()
        };
        use super::iu::rsp_flag;
        let residual = |expected: u32, actual: u32| -> (u8, u32) {
            if actual > expected {
                (1, actual - expected)
            } else if actual < expected {
                (2, expected - actual)
            } else {
                (0, 0)
            }
        };
        if !matches!(cmd.data_out, DataDesc::None) {
            let (kind, r) = residual(out_len, resp.transfer_len);
            match kind {
                1 => rsp.flags |= rsp_flag::DOOVER,
                2 => rsp.flags |= rsp_flag::DOUNDER,
                _ => {}
            }
            rsp.data_out_res_cnt = r;
        }
        let mut rxs = Vec::new();
        let mut sent = 0u32;
        if let Some(mut d) = resp.data_in {
            d.truncate(in_len as usize);
            sent = d.len() as u32;
            if sent > 0 {
                let region = region_owning(d);
                let mr = self.pd.reg_mr(region, Access::LOCAL_WRITE)?;
                let mut off = 0u32;
                let mut mr = Some(mr);
                for b in &in_list {
                    let n = b.len.min(sent - off);
                    if n == 0 {
                        break;
                    }
                    let sge = mr.as_ref().map(|m| m.sge(off as usize, n)).expect("held");
                    off += n;
                    // The last WRITE keeps the memory region until it completes.
                    let keep = if off == sent { mr.take() } else { None };
                    let wr = SendWr::new(
                        self.next_wr_id(),
                        SendOp::RdmaWrite {
                            remote_addr: b.va,
                            rkey: b.key,
                        },
                        vec![sge],
                    );
                    rxs.push(self.post(wr, keep).await?);
                }
                self.stats
                    .bytes_out
                    .fetch_add(u64::from(sent), Ordering::Relaxed);
            }
        }
        if !matches!(cmd.data_in, DataDesc::None) {
            // What the command wanted against what the initiator expected (SAM-5 5.4.3).
            let (kind, r) = if matches!(cmd.data_out, DataDesc::None) {
                residual(in_len, resp.transfer_len.max(sent))
            } else {
                residual(in_len, sent)
            };
            match kind {
                1 => rsp.flags |= rsp_flag::DIOVER,
                2 => rsp.flags |= rsp_flag::DIUNDER,
                _ => {}
            }
            rsp.data_in_res_cnt = r;
        }
        self.respond(slot, rsp, rxs, Some(task)).await?;
        Ok(true)
    }

    async fn run_tmf(self: Arc<Self>, slot: u32, t: TskMgmt) {
        let status = self.exec_tmf(&t).await;
        self.respond_tmf(slot, t.tag, status).await;
    }

    async fn exec_tmf(self: &Arc<Self>, t: &TskMgmt) -> u8 {
        let f = match t.function {
            tmf::ABORT_TASK => Function::AbortTask(t.task_tag),
            tmf::ABORT_TASK_SET => Function::AbortTaskSet,
            tmf::CLEAR_TASK_SET => Function::ClearTaskSet,
            tmf::LUN_RESET => Function::LogicalUnitReset,
            tmf::CLEAR_ACA => Function::ClearAca,
            _ => return tmf_status::NOT_SUPPORTED,
        };
        let s = &self.session;
        let luns = s.luns.current();
        let lun = lun_from_bytes(&t.lun);
        // SRP has no target reset: the logical units of the port are never asked for.
        match task::manage(&self.tasks, &s.nexus, &luns.map, lun, f, Vec::new).await {
            // ABORT TASK of a task not in the task set is complete (SAM-5 7.2).
            TmResponse::Complete | TmResponse::NoSuchTask | TmResponse::Succeeded(_) => {
                tmf_status::COMPLETE
            }
            TmResponse::IncorrectLun => tmf_status::FAILED,
            TmResponse::Rejected => tmf_status::NOT_SUPPORTED,
        }
    }
}
