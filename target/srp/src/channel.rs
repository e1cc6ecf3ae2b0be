//! An SRP RDMA channel (SRP r16a §5.4): one RC queue pair, a receive ring of initiator IUs
//! sized from the request limit, and the commands in flight on it.
//!
//! The queue pair, rings, credits and data movement are the shared RDMA channel layer's
//! ([`rtgt_rdma_channel`]); this module adds the SRP information units, the request limit and the
//! mapping of SRP_CMD descriptors onto RDMA READ and WRITE.
//!
//! Flow control is the request limit: every SRP_CMD and SRP_TSK_MGMT takes a credit, which
//! its SRP_RSP returns (REQUEST LIMIT DELTA 1, plus the credits of aborted commands, which
//! get no response of their own). Each received IU is copied out of the ring and its buffer
//! posted again at once; the ring holds the request limit plus a reserve for IUs that take no
//! credit, and an initiator that sends beyond that is held back by RNR NAKs.
//!
//! Data-in moves by RDMA WRITE straight from the backstore buffer, data-out by RDMA READ
//! straight into a pool buffer handed to the SCSI engine; an indirect descriptor table that
//! the SRP_CMD does not carry whole is fetched by RDMA READ first; immediate data is copied
//! out of the received IU.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use rtgt_backstore::{BufPool, IoBuf};
use rtgt_rdma_channel::mem::PoolMrs;
use rtgt_rdma_channel::{self as rdma, Endpoint, Link, LinkError, Receiver, Remote, Rings};
use rtgt_rdma_channel::{ProviderError, Qp};
use rtgt_scsi::sense::{asc, key, Sense};
use rtgt_scsi::task::{self, Function, Outcome, Refused, Stage, Task, TaskSet, TmResponse, Turn};
use rtgt_scsi::{lun_from_bytes, Command, Status, TaskAttr, MAX_TRANSFER_BYTES};
use rtgt_transport::verbs::Pd;
use tokio::sync::watch;

use super::iu::{
    logout_reason, opcode, tmf, tmf_status, Cmd, DataDesc, DirectBuf, InitiatorIu, LoginRsp, Rsp,
    ShortIu, TskMgmt,
};
use super::login::ChannelParams;
use super::nexus::SessionNexus;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Receive buffers beyond the request limit, for IUs that take no credit (SRP_CRED_RSP,
/// SRP_AER_RSP, SRP_I_LOGOUT).
pub const RECV_RESERVE: u32 = 4;
/// Send work requests in flight per channel (RDMA READ/WRITE and SENDs).
pub const SEND_DEPTH: u32 = 1024;
/// RDMA READs in flight per channel (the engine queues those beyond the initiator's
/// responder resources).
pub const READ_DEPTH: u32 = 128;
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

impl From<LinkError> for Failed {
    fn from(_: LinkError) -> Failed {
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
    login_rsp: LoginRsp,
    pub session: Arc<SessionNexus>,
    /// Keeps the session registered with its port while the channel lives.
    session_ref: Mutex<Option<Box<dyn Send + Sync>>>,
    pub stats: ChannelStats,
    /// The initiator's address and the one it connected to, once connected.
    addrs: std::sync::OnceLock<(std::net::SocketAddr, std::net::SocketAddr)>,
    link: Arc<Link>,
    /// The channel's commands (tags are unique per channel).
    tasks: Arc<TaskSet<Task>>,
    pending_credits: AtomicU32,
    close_tx: watch::Sender<Option<CloseReason>>,
    finished: watch::Sender<bool>,
    pool: Arc<BufPool>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("id", &self.id)
            .field("qpn", &self.link.qp().qpn())
            .field("initiator", &self.session.nexus.initiator_port)
            .finish()
    }
}

impl Channel {
    /// Receive buffers of a channel with `params`.
    pub fn recv_slots(params: &ChannelParams) -> u32 {
        params.req_lim + RECV_RESERVE
    }

    /// The rings of a channel with `params`.
    pub fn rings(params: &ChannelParams) -> Rings {
        let slots = Self::recv_slots(params);
        Rings {
            recv_slots: slots,
            recv_slot_len: params.it_iu_len as usize,
            send_slots: slots,
            send_slot_len: (params.ti_iu_len as usize).max(ShortIu::LEN),
            send_queue: SEND_DEPTH,
            rdma_read_depth: READ_DEPTH,
        }
    }

    /// Creates the queue pair, completion queues and receive ring of a channel, the QP in
    /// the RESET state (the connection manager drives it to RTS).
    pub fn endpoint(pd: &Pd, params: &ChannelParams) -> Result<Endpoint, ProviderError> {
        Endpoint::new(pd, Self::rings(params))
    }

    /// Builds the channel of an accepted login on `ep` (made by [`Channel::endpoint`], its
    /// QP now INIT or later): posts the receive ring and starts the receiver and the send
    /// completion poller. An IU that arrives before the ring is posted is held back by RNR
    /// NAKs. `keep` is held until the channel is torn down (the session's registration).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        ep: Endpoint,
        params: ChannelParams,
        login_rsp: LoginRsp,
        session: Arc<SessionNexus>,
        keep: Box<dyn Send + Sync>,
        pool: Arc<BufPool>,
        peer: SocketAddr,
        pool_mrs: Option<Arc<PoolMrs>>,
    ) -> Result<Arc<Channel>, ProviderError> {
        let link = Arc::new(Link::new(&ep, peer, pool_mrs)?);
        ep.post_receives()?;
        let tasks = TaskSet::new(session.nexus.id);
        let ch = Arc::new(Channel {
            id: CHANNEL_ID.fetch_add(1, Ordering::Relaxed),
            params,
            login_rsp,
            session,
            session_ref: Mutex::new(Some(keep)),
            stats: ChannelStats::default(),
            addrs: std::sync::OnceLock::new(),
            link: link.clone(),
            tasks,
            pending_credits: AtomicU32::new(0),
            close_tx: watch::channel(None).0,
            finished: watch::channel(false).0,
            pool,
        });
        // A failed queue pair fails every outstanding task into the task set at once; the
        // teardown then waits for them.
        let tasks = ch.tasks.clone();
        link.on_close(move || {
            tasks.abort_all();
        });
        tokio::spawn(rdma::poll_send(link, ep.send_cq().clone()));
        tokio::spawn(ch.clone().receiver(Receiver::new(ep)));
        Ok(ch)
    }

    pub fn qp(&self) -> &Qp {
        self.link.qp()
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
    pub fn login_rsp(&self) -> LoginRsp {
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

    /// The channel's task set counters: commands aborted, task management functions.
    pub fn task_counts(&self) -> (u64, u64) {
        let s = &self.tasks.stats;
        (
            s.aborted.load(Ordering::Relaxed),
            s.task_management.load(Ordering::Relaxed),
        )
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
            if self.send_iu(&iu.to_bytes()).await.is_ok() {
                self.link.wait_sent().await;
            }
        }
        self.close(CloseReason::Shutdown);
        self.finished().await;
    }

    /// The receiver: received IUs become commands. Runs until the channel closes, then
    /// tears it down.
    async fn receiver(self: Arc<Self>, mut rx: Receiver) {
        let mut close_rx = self.close_tx.subscribe();
        let mut events = Vec::new();
        'run: loop {
            if close_rx.borrow_and_update().is_some() {
                break;
            }
            rx.take(&mut events);
            // The responses of this batch go out together, after its read data.
            let batch = self.link.batch_sends();
            for ev in events.drain(..) {
                match ev {
                    rdma::RxEvent::Msg(iu, _) => self.receive(iu),
                    rdma::RxEvent::Failed(status) => {
                        if !self.is_closed() {
                            tracing::info!(
                                channel = self.id,
                                ?status,
                                "SRP channel receive failed: closing"
                            );
                        }
                        self.close(CloseReason::Disconnected);
                        break 'run;
                    }
                }
            }
            drop(batch);
            tokio::select! {
                _ = rx.wait() => {}
                _ = close_rx.changed() => {}
                _ = self.link.closed() => self.close(CloseReason::Disconnected),
            }
        }
        self.teardown().await;
    }

    async fn teardown(self: Arc<Self>) {
        self.link.close();
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
        drop(lock(&self.session_ref).take());
        self.finished.send_replace(true);
    }

    fn receive(self: &Arc<Self>, iu: Bytes) {
        match InitiatorIu::parse(&iu) {
            Ok(InitiatorIu::Cmd(cmd)) => {
                self.stats.commands.fetch_add(1, Ordering::Relaxed);
                let lun = lun_from_bytes(&cmd.lun);
                let dev = self.session.luns.current().map.luns.get(&lun).cloned();
                let task = Arc::new(Task::new(cmd.tag, lun, task_attr(cmd.task_attr), dev));
                let ch = self.clone();
                let sense = match self.tasks.admit(&task) {
                    Ok(turn) => {
                        // Most commands complete here, their responses in this batch.
                        task::run_inline(ch.run_cmd(iu, cmd, task, turn));
                        return;
                    }
                    Err(Refused::Overlapped) => {
                        Sense::new(key::ABORTED_COMMAND, OVERLAPPED_COMMANDS)
                    }
                    Err(Refused::NoAca) => Sense::new(key::ILLEGAL_REQUEST, asc::INVALID_MESSAGE),
                };
                task::run_inline(async move { ch.respond_check(cmd.tag, &sense, None).await });
            }
            Ok(InitiatorIu::TskMgmt(t)) => {
                self.stats.task_mgmt.fetch_add(1, Ordering::Relaxed);
                let ch = self.clone();
                task::run_inline(ch.run_tmf(t));
            }
            Ok(InitiatorIu::ILogout(_)) => self.close(CloseReason::Logout),
            Ok(InitiatorIu::CredRsp(_) | InitiatorIu::AerRsp(_)) => {}
            Err(e) => {
                let tag = super::iu::iu_tag(&iu);
                let ch = self.clone();
                match iu.first().copied() {
                    Some(opcode::CMD) => {
                        tracing::debug!(channel = self.id, error = %e, "invalid SRP_CMD");
                        let sense = Sense::new(key::ILLEGAL_REQUEST, INVALID_FIELD_IN_IU);
                        task::run_inline(async move { ch.respond_check(tag, &sense, None).await });
                    }
                    Some(opcode::TSK_MGMT) => {
                        task::run_inline(async move {
                            ch.respond_tmf(tag, tmf_status::INVALID_FIELDS).await
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
                            if ch.send_iu(&iu.to_bytes()).await.is_ok() {
                                ch.link.wait_sent().await;
                            }
                            ch.close(CloseReason::Protocol);
                        });
                    }
                }
            }
        }
    }

    /// Sends one IU.
    async fn send_iu(&self, bytes: &[u8]) -> Result<(), Failed> {
        Ok(self.link.send(&[bytes], None).await?)
    }

    /// Sends `rsp`, which returns its command's credit and those of aborted commands.
    /// With `retire`, the task leaves the task set first and an aborted task gets no
    /// response (or TASK ABORTED status, when TAS says so).
    async fn respond(&self, mut rsp: Rsp, retire: Option<&Arc<Task>>) -> Result<(), Failed> {
        // The initiator may reuse the tag as soon as it sees the response.
        if let Some(t) = retire {
            match self.tasks.retire(t) {
                Outcome::Respond => {}
                Outcome::TaskAborted => rsp = Self::task_aborted(rsp.tag),
                Outcome::Drop => {
                    self.pending_credits.fetch_add(1, Ordering::AcqRel);
                    return Ok(());
                }
            }
        }
        rsp.req_lim_delta = 1 + self.pending_credits.swap(0, Ordering::AcqRel);
        // The initiator's receive buffers hold max_ti_iu_len bytes: shorten the sense data.
        let room = (self.params.ti_iu_len as usize).saturating_sub(Rsp::LEN + rsp.resp_data.len());
        rsp.sense.truncate(room);
        if let Err(f) = self.send_iu(&rsp.to_bytes()).await {
            self.pending_credits
                .fetch_add(rsp.req_lim_delta, Ordering::AcqRel);
            return Err(f);
        }
        Ok(())
    }

    async fn respond_check(&self, tag: u64, sense: &Sense, retire: Option<&Arc<Task>>) {
        let rsp = Rsp {
            tag,
            status: Status::CheckCondition as u8,
            sense: sense.emit(false),
            ..Rsp::default()
        };
        let _ = self.respond(rsp, retire).await;
    }

    /// TASK ABORTED status for a task another I_T nexus aborted while TAS=1.
    fn task_aborted(tag: u64) -> Rsp {
        Rsp {
            tag,
            status: Status::TaskAborted as u8,
            ..Rsp::default()
        }
    }

    async fn respond_tmf(&self, tag: u64, status: u8) {
        let rsp = Rsp {
            tag,
            resp_data: vec![0, 0, 0, status],
            ..Rsp::default()
        };
        let _ = self.respond(rsp, None).await;
    }

    async fn run_cmd(self: Arc<Self>, iu: Bytes, cmd: Cmd, task: Arc<Task>, turn: Turn) {
        let r = if task.wait_turn(turn).await {
            self.exec_cmd(&iu, &cmd, &task).await
        } else {
            Ok(false)
        };
        if let Ok(false) = r {
            if self.tasks.retire(&task) == Outcome::TaskAborted {
                let _ = self.respond(Self::task_aborted(cmd.tag), None).await;
            } else {
                // Aborted: no response; the credit goes back with the next one.
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
                    let mut buf = self.pool.get(table.len as usize).await;
                    buf.set_len(table.len as usize);
                    let from = Remote {
                        addr: table.va,
                        rkey: table.key,
                        len: table.len,
                    };
                    let buf = self.link.rdma_read(buf, 0, &[from]).await?;
                    match DirectBuf::parse_table(buf.as_slice()) {
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
        Ok(self.link.rdma_read(buf, 0, &remotes(list)).await?)
    }

    /// Runs one SRP_CMD; `Ok(false)` when it was aborted (no response sent).
    async fn exec_cmd(&self, iu: &[u8], cmd: &Cmd, task: &Arc<Task>) -> Result<bool, Failed> {
        let out_len = cmd.data_out.len();
        let in_len = cmd.data_in.len();
        let bad = Sense::new(key::ILLEGAL_REQUEST, INVALID_FIELD_IN_IU);
        if out_len > MAX_TRANSFER_BYTES || in_len > MAX_TRANSFER_BYTES {
            self.respond_check(cmd.tag, &bad, Some(task)).await;
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
                        self.respond_check(cmd.tag, &bad, Some(task)).await;
                        return Ok(true);
                    }
                }
            }
            d => match self.descriptors(d).await? {
                Err(sense) => {
                    self.respond_check(cmd.tag, &sense, Some(task)).await;
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
                self.respond_check(cmd.tag, &sense, Some(task)).await;
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
        let mut sent = 0u32;
        if let Some(mut d) = resp.data_in {
            d.truncate(in_len as usize);
            if !d.is_empty() {
                sent = self.link.rdma_write(d, &remotes(&in_list)).await?;
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
        self.respond(rsp, Some(task)).await?;
        Ok(true)
    }

    async fn run_tmf(self: Arc<Self>, t: TskMgmt) {
        let status = self.exec_tmf(&t).await;
        self.respond_tmf(t.tag, status).await;
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

/// The initiator's buffers of a descriptor list.
fn remotes(list: &[DirectBuf]) -> Vec<Remote> {
    list.iter()
        .map(|d| Remote {
            addr: d.va,
            rkey: d.key,
            len: d.len,
        })
        .collect()
}
