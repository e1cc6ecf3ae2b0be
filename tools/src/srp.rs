//! An SRP initiator on rtgt's soft-RoCE stack, for tests and benchmarks: one channel over a
//! connected RC QP, SRP_CMD with every data buffer descriptor format, task management and
//! logout, with the request limit kept as Linux ib_srp keeps it (one credit held back for
//! task management).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rtgt_backstore::Latch;
use rtgt_transport::cm::{Cm, CmConn, CmError, ConnParams};
use rtgt_transport::verbs::{
    Access, Cq, Mr, Pd, Qp, QpInitAttr, QpType, RecvWr, Region, SendFlags, SendOp, SendWr,
    VerbsError, WcOpcode, WcStatus,
};
use tokio::sync::{oneshot, Semaphore};

use rtgt_scsi::lun_to_bytes;
use rtgt_srp::iu::{
    buf_fmt, opcode, req_flags, rsp_flags, Cmd, DataDesc, DirectBuf, LoginRej, LoginReq, LoginRsp,
    Rsp, ShortIu, TargetIu, TskMgmt, IMM_DATA_OFFSET,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Tags of task management requests carry this bit, so their responses return the credit
/// held back for task management.
pub const TAG_TSK_MGMT: u64 = 1 << 63;

/// How an SRP_CMD describes its data buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescMode {
    /// One direct descriptor.
    Direct,
    /// An indirect descriptor with the whole table of `pieces` descriptors in the IU.
    Indirect { pieces: usize },
    /// An indirect descriptor whose table of `pieces` descriptors the target must fetch by
    /// RDMA READ; the IU carries the first `inline` of them.
    External { pieces: usize, inline: usize },
    /// Writes: the data inside the SRP_CMD (falls back to Direct for reads).
    Immediate,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitiatorError {
    #[error("verbs: {0}")]
    Verbs(#[from] VerbsError),
    #[error("the channel is closed")]
    Closed,
    #[error("SCSI status {status:#04x}, sense {sense:02x?}")]
    Status { status: u8, sense: Vec<u8> },
    #[error("{0}")]
    Invalid(&'static str),
    #[error("connection: {0}")]
    Cm(#[from] CmError),
    #[error("login rejected: SRP_LOGIN_REJ reason {0:#010x}")]
    Rejected(u32),
}

/// A command's answer: the SRP_RSP and the data-in bytes.
#[derive(Debug, Clone)]
pub struct Reply {
    pub rsp: Rsp,
    pub data: Vec<u8>,
}

#[derive(Default)]
struct Inner {
    pending: HashMap<u64, oneshot::Sender<Rsp>>,
    send_mrs: HashMap<u64, Mr>,
    closed: bool,
}

/// Counters of an initiator channel.
#[derive(Debug, Default)]
pub struct InitiatorStats {
    pub t_logouts: AtomicU64,
    pub cred_reqs: AtomicU64,
    pub aer_reqs: AtomicU64,
}

/// One SRP initiator channel.
pub struct Initiator {
    qp: Arc<Qp>,
    cq: Cq,
    pd: Pd,
    pub login: LoginRsp,
    it_iu_len: u32,
    imm_data_offset: Option<usize>,
    cmd_credits: Semaphore,
    tmf_credits: Semaphore,
    recv_region: Arc<Region>,
    recv_mr: Mr,
    inner: Mutex<Inner>,
    next_tag: AtomicU64,
    next_wr: AtomicU64,
    closed: Latch,
    pub stats: InitiatorStats,
    /// Read buffers of finished commands, for the next ones.
    buffers: crate::buffers::ReadBuffers,
}

const SEND_WR_BASE: u64 = 1 << 32;

/// What [`Initiator::connect`] asks for.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub initiator_port_id: [u8; 16],
    pub target_port_id: [u8; 16],
    /// Initiator-to-target IU length (Linux ib_srp's default is 8260).
    pub it_iu_len: u32,
    /// Ask for immediate data at [`IMM_DATA_OFFSET`].
    pub immediate: bool,
    /// Terminate this initiator's other channels (a single-channel login).
    pub single: bool,
    /// Request limit assumed for the channel, see [`Initiator::connect`].
    pub queue_depth: u32,
}

impl ConnectOptions {
    pub fn new(initiator_port_id: [u8; 16], id_ext: u64, ioc_guid: u64) -> ConnectOptions {
        let mut target_port_id = [0u8; 16];
        target_port_id[..8].copy_from_slice(&id_ext.to_be_bytes());
        target_port_id[8..].copy_from_slice(&ioc_guid.to_be_bytes());
        ConnectOptions {
            initiator_port_id,
            target_port_id,
            it_iu_len: 8260,
            immediate: true,
            single: true,
            queue_depth: 64,
        }
    }

    pub fn login_req(&self) -> LoginReq {
        LoginReq {
            tag: 0,
            req_it_iu_len: self.it_iu_len,
            req_buf_fmt: buf_fmt::DIRECT | buf_fmt::INDIRECT,
            req_flags: if self.single {
                req_flags::MULTICHAN_SINGLE
            } else {
                req_flags::MULTICHAN_MULTI
            } | if self.immediate {
                req_flags::IMMED_REQUESTED
            } else {
                0
            },
            imm_data_offset: if self.immediate {
                IMM_DATA_OFFSET as u16
            } else {
                0
            },
            initiator_port_id: self.initiator_port_id,
            target_port_id: self.target_port_id,
        }
    }
}

impl Initiator {
    /// Logs in through the RDMA/CM connection manager `cm` to the SRP target at `dst` (as
    /// Linux ib_srp does with `dest=`): the login request rides in the REQ, a LOGIN_REJ in a
    /// REJ becomes [`InitiatorError::Rejected`].
    ///
    /// The channel's receives are posted before the REQ goes out (the target may send as
    /// soon as it is connected), sized for what was asked: `queue_depth` credits and IUs of
    /// `it_iu_len` both ways. The LOGIN_RSP in the REP then settles it: fewer credits shrink
    /// the window; larger target IUs or refused immediate data fail the login.
    pub async fn connect(
        cm: &Cm,
        dst: std::net::SocketAddr,
        opts: &ConnectOptions,
    ) -> Result<(Arc<Initiator>, CmConn), InitiatorError> {
        let dev = cm.device();
        let pd = dev.alloc_pd()?;
        let slots = opts.queue_depth + 4;
        let cq = dev.create_cq(1024 + slots)?;
        let mut init = QpInitAttr::new(QpType::Rc, &cq, &cq);
        init.cap.max_send_wr = 1024;
        init.cap.max_recv_wr = slots;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = 256.min(dev.attr().max_inline_data);
        let qp = Arc::new(pd.create_qp(init)?);
        let req = opts.login_req();
        let login = LoginRsp {
            req_lim_delta: opts.queue_depth,
            tag: req.tag,
            max_it_iu_len: opts.it_iu_len,
            max_ti_iu_len: opts.it_iu_len,
            buf_fmt: buf_fmt::DIRECT | buf_fmt::INDIRECT,
            rsp_flags: if opts.immediate {
                rsp_flags::IMMED_SUPP
            } else {
                0
            },
        };
        // Receives are posted before the REQ goes out, as the target may answer at once.
        rtgt_transport::cm::prepare_qp(&qp)?;
        let ini = Initiator::start(pd, cq, qp.clone(), login, opts.it_iu_len, opts.immediate)?;
        let params = ConnParams {
            private_data: req.to_rdma_bytes(),
            // As ib_srp: the target may keep 4 RDMA READs in flight; we issue none.
            responder_resources: 4,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParams::default()
        };
        let r = cm.connect(&qp, dst, params).await;
        if r.is_err() {
            ini.close();
        }
        let conn = match r {
            Ok(c) => c,
            Err(CmError::Rejected {
                private_data,
                reason,
            }) => {
                return Err(match LoginRej::parse(&private_data) {
                    Ok(rej) => InitiatorError::Rejected(rej.reason),
                    Err(_) => InitiatorError::Cm(CmError::Rejected {
                        reason,
                        private_data,
                    }),
                })
            }
            Err(e) => return Err(e.into()),
        };
        if let Err(e) = ini.settle_login(&req, conn.private_data()) {
            ini.close();
            conn.disconnect();
            return Err(e);
        }
        Ok((ini, conn))
    }

    /// Checks the target's LOGIN_RSP against what [`Initiator::connect`] assumed and gives
    /// back the credits it did not grant.
    fn settle_login(&self, req: &LoginReq, rep: &[u8]) -> Result<(), InitiatorError> {
        let got =
            LoginRsp::parse(rep).map_err(|_| InitiatorError::Invalid("no LOGIN_RSP in the REP"))?;
        if got.tag != req.tag {
            return Err(InitiatorError::Invalid("LOGIN_RSP for another login"));
        }
        if got.req_lim_delta < 2 {
            return Err(InitiatorError::Invalid("request limit below 2"));
        }
        if got.max_ti_iu_len > self.login.max_ti_iu_len {
            return Err(InitiatorError::Invalid(
                "target IUs longer than the receive buffers",
            ));
        }
        if got.max_it_iu_len < self.it_iu_len {
            return Err(InitiatorError::Invalid(
                "target accepts shorter IUs than asked",
            ));
        }
        if self.imm_data_offset.is_some() && got.rsp_flags & rsp_flags::IMMED_SUPP == 0 {
            return Err(InitiatorError::Invalid("target refused immediate data"));
        }
        if got.req_lim_delta < self.login.req_lim_delta {
            self.cmd_credits
                .forget_permits((self.login.req_lim_delta - got.req_lim_delta) as usize);
        }
        Ok(())
    }

    /// Starts the initiator side of a channel on `qp` (connected or about to be), after the
    /// target accepted the login with `login`. `it_iu_len` is the IU length the login asked
    /// for, `imm` whether it asked for immediate data at [`IMM_DATA_OFFSET`].
    pub fn start(
        pd: Pd,
        cq: Cq,
        qp: Arc<Qp>,
        login: LoginRsp,
        it_iu_len: u32,
        imm: bool,
    ) -> Result<Arc<Initiator>, InitiatorError> {
        if login.req_lim_delta < 2 {
            return Err(InitiatorError::Invalid("request limit below 2"));
        }
        let slots = login.req_lim_delta + 4;
        let ti = login.max_ti_iu_len.max(64) as usize;
        let recv_region = Arc::new(Region::zeroed(slots as usize * ti));
        let recv_mr = pd.reg_mr(recv_region.clone(), Access::LOCAL_WRITE)?;
        let imm_ok = imm && login.rsp_flags & rtgt_srp::iu::rsp_flags::IMMED_SUPP != 0;
        let ini = Arc::new(Initiator {
            qp,
            cq,
            pd,
            login,
            it_iu_len: it_iu_len.min(login.max_it_iu_len),
            imm_data_offset: imm_ok.then_some(IMM_DATA_OFFSET),
            cmd_credits: Semaphore::new(login.req_lim_delta as usize - 1),
            tmf_credits: Semaphore::new(1),
            recv_region,
            recv_mr,
            inner: Mutex::new(Inner::default()),
            next_tag: AtomicU64::new(1),
            next_wr: AtomicU64::new(SEND_WR_BASE),
            closed: Latch::default(),
            buffers: Default::default(),
            stats: InitiatorStats::default(),
        });
        for slot in 0..slots {
            ini.repost(slot)?;
        }
        tokio::spawn(ini.clone().completions());
        Ok(ini)
    }

    pub fn qp(&self) -> &Arc<Qp> {
        &self.qp
    }

    pub fn is_closed(&self) -> bool {
        self.closed.is_set()
    }

    /// Resolves when the channel closed (QP error, SRP_T_LOGOUT).
    pub async fn closed(&self) {
        self.closed.wait().await
    }

    fn repost(&self, slot: u32) -> Result<(), VerbsError> {
        let len = self.login.max_ti_iu_len.max(64);
        self.qp.post_recv(RecvWr {
            wr_id: u64::from(slot),
            sg_list: self.recv_mr.sge(slot as usize * len as usize, len).into(),
        })
    }

    fn close(&self) {
        self.closed.set();
        let mut g = lock(&self.inner);
        g.closed = true;
        g.pending.clear();
        drop(g);
        self.cmd_credits.close();
        self.tmf_credits.close();
    }

    async fn completions(self: Arc<Self>) {
        let mut wcs = Vec::with_capacity(64);
        while !self.is_closed() {
            tokio::select! {
                _ = self.cq.wait_nonempty() => {}
                _ = self.closed() => break,
            }
            wcs.clear();
            self.cq.poll_into(&mut wcs, 64);
            for wc in wcs.drain(..) {
                if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                    if wc.status != WcStatus::Success {
                        self.close();
                        break;
                    }
                    self.receive(wc.wr_id as u32, wc.byte_len as usize).await;
                } else {
                    lock(&self.inner).send_mrs.remove(&wc.wr_id);
                    if wc.status != WcStatus::Success {
                        self.close();
                        break;
                    }
                }
            }
        }
    }

    async fn receive(&self, slot: u32, len: usize) {
        let ti = self.login.max_ti_iu_len.max(64) as usize;
        let mut iu = vec![0u8; len.min(ti)];
        self.recv_region.read(slot as usize * ti, &mut iu);
        let _ = self.repost(slot);
        match TargetIu::parse(&iu) {
            Ok(TargetIu::Rsp(rsp)) => {
                let delta = rsp.req_lim_delta as usize;
                if rsp.tag & TAG_TSK_MGMT != 0 && delta > 0 {
                    self.tmf_credits.add_permits(1);
                    self.cmd_credits.add_permits(delta - 1);
                } else {
                    self.cmd_credits.add_permits(delta);
                }
                if let Some(w) = lock(&self.inner).pending.remove(&rsp.tag) {
                    let _ = w.send(rsp);
                }
            }
            Ok(TargetIu::CredReq(c)) => {
                self.stats.cred_reqs.fetch_add(1, Ordering::Relaxed);
                self.cmd_credits.add_permits(c.word as usize);
                let r = ShortIu {
                    opcode: opcode::CRED_RSP,
                    sol_not: 0,
                    word: 0,
                    tag: c.tag,
                };
                let _ = self.send(r.to_bytes());
            }
            Ok(TargetIu::AerReq(a)) => {
                self.stats.aer_reqs.fetch_add(1, Ordering::Relaxed);
                self.cmd_credits.add_permits(a.req_lim_delta as usize);
                let r = ShortIu {
                    opcode: opcode::AER_RSP,
                    sol_not: 0,
                    word: 0,
                    tag: a.tag,
                };
                let _ = self.send(r.to_bytes());
            }
            Ok(TargetIu::TLogout(_)) => {
                self.stats.t_logouts.fetch_add(1, Ordering::Relaxed);
                self.close();
            }
            Err(e) => tracing::warn!(error = %e, "SRP initiator: invalid IU from the target"),
        }
    }

    /// Posts a SEND of `iu` (inline when small); the memory region lives until completion.
    fn send(&self, iu: Vec<u8>) -> Result<(), InitiatorError> {
        if self.is_closed() {
            return Err(InitiatorError::Closed);
        }
        let id = self.next_wr.fetch_add(1, Ordering::Relaxed);
        let wr = if iu.len() <= 256 {
            let mut wr = SendWr::new(id, SendOp::Send, Vec::new());
            wr.flags = SendFlags::SIGNALED | SendFlags::INLINE;
            wr.inline_data = iu;
            wr
        } else {
            let len = iu.len() as u32;
            let mr = self
                .pd
                .reg_mr(Arc::new(Region::from_vec(iu)), Access::LOCAL_WRITE)?;
            let wr = SendWr::new(id, SendOp::Send, mr.sge(0, len));
            lock(&self.inner).send_mrs.insert(id, mr);
            wr
        };
        self.qp.post_send(wr).map_err(|e| {
            lock(&self.inner).send_mrs.remove(&id);
            InitiatorError::Verbs(e)
        })
    }

    fn register(&self, region: Arc<Region>, access: Access) -> Result<Mr, InitiatorError> {
        Ok(self.pd.reg_mr(region, access | Access::LOCAL_WRITE)?)
    }

    /// Describes `len` bytes of `mr` (from offset 0) as `mode` asks; returns the descriptor
    /// and the table's memory region, which must live until the command completes.
    fn describe(
        &self,
        mr: &Mr,
        len: u32,
        mode: DescMode,
    ) -> Result<(DataDesc, Option<Mr>), InitiatorError> {
        let split = |pieces: usize| -> Vec<DirectBuf> {
            let pieces = pieces.clamp(1, len.max(1) as usize);
            let base = len / pieces as u32;
            let mut off = 0u32;
            (0..pieces)
                .map(|i| {
                    let n = if i + 1 == pieces { len - off } else { base };
                    let d = DirectBuf {
                        va: mr.iova() + u64::from(off),
                        key: mr.rkey(),
                        len: n,
                    };
                    off += n;
                    d
                })
                .collect()
        };
        Ok(match mode {
            DescMode::Direct | DescMode::Immediate => (DataDesc::Direct(split(1)[0]), None),
            DescMode::Indirect { pieces } | DescMode::External { pieces, .. } => {
                let list = split(pieces);
                let mut table = vec![0u8; list.len() * DirectBuf::LEN];
                for (i, d) in list.iter().enumerate() {
                    d.emit(&mut table[i * 16..i * 16 + 16]);
                }
                let tlen = table.len() as u32;
                let tmr = self.register(Arc::new(Region::from_vec(table)), Access::REMOTE_READ)?;
                let inline_n = match mode {
                    DescMode::External { inline, .. } => inline.min(list.len().saturating_sub(1)),
                    _ => list.len(),
                };
                (
                    DataDesc::Indirect {
                        table: DirectBuf {
                            va: tmr.iova(),
                            key: tmr.rkey(),
                            len: tlen,
                        },
                        total_len: len,
                        inline: list[..inline_n].to_vec(),
                    },
                    Some(tmr),
                )
            }
        })
    }

    /// Runs one SCSI command: `data_out` to write, `in_len` bytes expected back.
    pub async fn command(
        &self,
        lun: u64,
        cdb: &[u8],
        data_out: Option<&[u8]>,
        in_len: u32,
        mode: DescMode,
    ) -> Result<Reply, InitiatorError> {
        if cdb.len() > 16 + 252 {
            return Err(InitiatorError::Invalid("CDB longer than 268 bytes"));
        }
        self.cmd_credits
            .acquire()
            .await
            .map_err(|_| InitiatorError::Closed)?
            .forget();
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed) & !TAG_TSK_MGMT;
        let mut cmd = Cmd {
            sol_not: 0,
            tag,
            lun: lun_to_bytes(lun),
            task_attr: 0,
            cdb: cdb.into(),
            data_out: DataDesc::None,
            data_in: DataDesc::None,
        };
        if cmd.cdb.len() < 16 {
            cmd.cdb.resize(16, 0);
        }
        let mut keep: Vec<Mr> = Vec::new();
        let mut imm: Option<&[u8]> = None;
        let mut in_region = None;
        if let Some(out) = data_out.filter(|d| !d.is_empty()) {
            let fits = self
                .imm_data_offset
                .is_some_and(|o| o + out.len() <= self.it_iu_len as usize);
            if mode == DescMode::Immediate && fits {
                cmd.data_out = DataDesc::Immediate {
                    len: out.len() as u32,
                };
                imm = Some(out);
            } else {
                let mr = self.register(
                    Arc::new(Region::from_vec(out.to_vec())),
                    Access::REMOTE_READ,
                )?;
                let (d, t) = self.describe(&mr, out.len() as u32, mode)?;
                cmd.data_out = d;
                keep.extend(t);
                keep.push(mr);
            }
        }
        if in_len > 0 {
            let region = self.buffers.take(in_len as usize);
            let mr = self.register(region.clone(), Access::REMOTE_WRITE)?;
            let (d, t) = self.describe(&mr, in_len, mode)?;
            cmd.data_in = d;
            keep.extend(t);
            keep.push(mr);
            in_region = Some(region);
        }
        let mut iu = vec![0u8; cmd.buffer_len()];
        cmd.emit(&mut iu);
        if let (Some(data), Some(off)) = (imm, self.imm_data_offset) {
            iu.resize(off, 0);
            iu.extend_from_slice(data);
        }
        if iu.len() > self.it_iu_len as usize {
            return Err(InitiatorError::Invalid("SRP_CMD longer than the IU length"));
        }
        let rx = {
            let (tx, rx) = oneshot::channel();
            let mut g = lock(&self.inner);
            if g.closed {
                return Err(InitiatorError::Closed);
            }
            g.pending.insert(tag, tx);
            rx
        };
        self.send(iu)?;
        let rsp = rx.await.map_err(|_| InitiatorError::Closed)?;
        drop(keep);
        let mut data = Vec::new();
        if let Some(r) = in_region {
            let got = in_len.saturating_sub(if rsp.flags & rtgt_srp::iu::rsp_flag::DIUNDER != 0 {
                rsp.data_in_res_cnt
            } else {
                0
            });
            data = vec![0u8; got as usize];
            r.read(0, &mut data);
            self.buffers.give(r);
        }
        Ok(Reply { rsp, data })
    }

    /// Like [`Initiator::command`], failing unless the status is GOOD.
    pub async fn command_ok(
        &self,
        lun: u64,
        cdb: &[u8],
        data_out: Option<&[u8]>,
        in_len: u32,
        mode: DescMode,
    ) -> Result<Vec<u8>, InitiatorError> {
        let r = self.command(lun, cdb, data_out, in_len, mode).await?;
        if r.rsp.status != 0 {
            return Err(InitiatorError::Status {
                status: r.rsp.status,
                sense: r.rsp.sense,
            });
        }
        Ok(r.data)
    }

    /// READ(16) of `blocks` blocks of `block_size` bytes at `lba`.
    pub async fn read(
        &self,
        lun: u64,
        lba: u64,
        blocks: u32,
        block_size: u32,
        mode: DescMode,
    ) -> Result<Vec<u8>, InitiatorError> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x88;
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
        self.command_ok(lun, &cdb, None, blocks * block_size, mode)
            .await
    }

    /// WRITE(16) of `data` (whole blocks of `block_size` bytes) at `lba`.
    pub async fn write(
        &self,
        lun: u64,
        lba: u64,
        data: &[u8],
        block_size: u32,
        mode: DescMode,
    ) -> Result<(), InitiatorError> {
        let blocks = (data.len() / block_size as usize) as u32;
        let mut cdb = [0u8; 16];
        cdb[0] = 0x8a;
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
        self.command_ok(lun, &cdb, Some(data), 0, mode)
            .await
            .map(|_| ())
    }

    /// READ CAPACITY(16): (number of blocks, block size).
    pub async fn read_capacity(&self, lun: u64) -> Result<(u64, u32), InitiatorError> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x9e;
        cdb[1] = 0x10;
        cdb[13] = 32;
        let mut tries = 0;
        loop {
            // The first command of a new nexus reports POWER ON OCCURRED.
            match self.command_ok(lun, &cdb, None, 32, DescMode::Direct).await {
                Ok(d) if d.len() >= 12 => {
                    let last = u64::from_be_bytes(d[0..8].try_into().expect("8 bytes"));
                    let bs = u32::from_be_bytes(d[8..12].try_into().expect("4 bytes"));
                    return Ok((last + 1, bs));
                }
                Ok(_) => return Err(InitiatorError::Invalid("short READ CAPACITY data")),
                Err(InitiatorError::Status { status: 2, sense })
                    if tries < 3 && sense.get(2).is_some_and(|k| k & 0xf == 6) =>
                {
                    tries += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends a task management request; returns the response code (byte 3 of the response
    /// data).
    pub async fn task_mgmt(
        &self,
        lun: u64,
        function: u8,
        task_tag: u64,
    ) -> Result<u8, InitiatorError> {
        self.tmf_credits
            .acquire()
            .await
            .map_err(|_| InitiatorError::Closed)?
            .forget();
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed) | TAG_TSK_MGMT;
        let t = TskMgmt {
            sol_not: 0,
            tag,
            lun: lun_to_bytes(lun),
            function,
            task_tag,
        };
        let rx = {
            let (tx, rx) = oneshot::channel();
            lock(&self.inner).pending.insert(tag, tx);
            rx
        };
        self.send(t.to_bytes())?;
        let rsp = rx.await.map_err(|_| InitiatorError::Closed)?;
        rsp.tmf_status().ok_or(InitiatorError::Invalid(
            "task management response without data",
        ))
    }

    /// The tag the next command will carry (for ABORT TASK tests).
    pub fn peek_tag(&self) -> u64 {
        self.next_tag.load(Ordering::Relaxed)
    }

    /// Sends SRP_I_LOGOUT.
    pub fn logout(&self) -> Result<(), InitiatorError> {
        let iu = ShortIu {
            opcode: opcode::I_LOGOUT,
            sol_not: 0,
            word: 0,
            tag: self.next_tag.fetch_add(1, Ordering::Relaxed),
        };
        self.send(iu.to_bytes())
    }

    /// Sends raw bytes as one IU (bad-input tests); the credit is taken as for a command.
    pub async fn send_raw(&self, iu: Vec<u8>) -> Result<oneshot::Receiver<Rsp>, InitiatorError> {
        self.cmd_credits
            .acquire()
            .await
            .map_err(|_| InitiatorError::Closed)?
            .forget();
        let tag = rtgt_srp::iu::iu_tag(&iu);
        let (tx, rx) = oneshot::channel();
        lock(&self.inner).pending.insert(tag, tx);
        self.send(iu)?;
        Ok(rx)
    }

    /// Credits available to commands.
    pub fn credits(&self) -> usize {
        self.cmd_credits.available_permits()
    }
}
