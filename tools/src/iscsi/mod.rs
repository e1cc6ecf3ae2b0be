//! An iSCSI initiator over TCP (RFC 7143): login with CHAP, SendTargets discovery, SCSI
//! commands with immediate, unsolicited and solicited (R2T) data, Data-In reassembly, many
//! commands in flight within the CmdSN window, NOP, task management and logout.
//!
//! The login runs through [`login::InitiatorLogin`], which does no I/O; the session below
//! drives it over a TCP stream or an iSER connection ([`Session::connect_iser`]), where data
//! moves by RDMA against registered command buffers instead of Data-In / R2T / Data-Out.

pub mod login;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};

pub use login::{InitiatorLogin, LoginConfig, LoginProgress};

use rtgt_iscsi::conn::RxPdu;
use rtgt_iscsi::conn_tcp::{encode_pdu, read_pdu, PduReader};
use rtgt_iscsi::iser::Endpoint;
use rtgt_iscsi::login::LOGIN_MAX_DATA;
use rtgt_iscsi::params::SessionParams;
use rtgt_iscsi::pdu::{
    tmf, Ahs, Bhs, BhsRepr, DataIn, DataOut, LogoutRequest, NopOut, R2t, ScsiCommand, ScsiResponse,
    TaskMgmtRequest, TextRequest, BHS_LEN, RESERVED_TAG,
};
use rtgt_iscsi::session::sn_lt;
use rtgt_iscsi::text::TextPairs;
use rtgt_iscsi::IscsiError;

use crate::iser::{CommandMemory, IserTransport};

/// Default time a request waits for its response.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The outcome of a SCSI command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScsiResult {
    /// iSCSI response code (0 = command completed at target).
    pub response: u8,
    pub status: u8,
    pub sense: Vec<u8>,
    /// The data read; over iSER, the buffer the target wrote into (no copy).
    pub data: Bytes,
    pub overflow: bool,
    pub underflow: bool,
    pub residual: u32,
}

impl ScsiResult {
    pub fn is_good(&self) -> bool {
        self.response == 0 && self.status == 0
    }

    /// Sense key, ASC and ASCQ of fixed-format sense data.
    pub fn sense_key(&self) -> Option<(u8, u8, u8)> {
        (self.sense.len() >= 14).then(|| (self.sense[2] & 0x0f, self.sense[12], self.sense[13]))
    }
}

/// A target found by SendTargets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredTarget {
    pub name: String,
    /// `ip:port,tag` strings.
    pub addresses: Vec<String>,
}

/// An Async Message the target sent (RFC 7143 §11.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    pub event: u8,
    pub param1: u16,
    pub param2: u16,
    pub param3: u16,
}

enum Reply {
    Pdu(BhsRepr, Bytes),
    Rejected(u8),
}

/// A read's data as Data-In PDUs bring it over TCP: the first PDU's data as it came while
/// it is the only one at offset 0 (a whole read in one PDU is never copied), else placed by
/// offset into memory of the read's length.
struct ReadData {
    /// The most the command reads.
    len: usize,
    first: Option<Bytes>,
    placed: Vec<u8>,
    /// The end of the furthest data received.
    received: usize,
}

impl ReadData {
    fn new(len: usize) -> ReadData {
        ReadData {
            len,
            first: None,
            placed: Vec::new(),
            received: 0,
        }
    }

    /// Takes `data` at offset `off`; false if it goes beyond the read's length.
    fn put(&mut self, off: usize, data: &Bytes) -> bool {
        let Some(end) = off.checked_add(data.len()).filter(|&e| e <= self.len) else {
            return false;
        };
        if off == 0 && self.received == 0 {
            self.first = Some(data.clone());
        } else {
            if let Some(f) = self.first.take() {
                self.placed = f.to_vec();
            }
            if self.placed.len() < end {
                self.placed.resize(end, 0);
            }
            self.placed[off..end].copy_from_slice(data);
        }
        self.received = self.received.max(end);
        true
    }

    /// The data received, up to the end of the furthest (gaps read as zeros).
    fn finish(self) -> Bytes {
        match self.first {
            Some(f) => f,
            None => {
                let mut v = self.placed;
                v.truncate(self.received);
                v.into()
            }
        }
    }
}

struct ScsiPending {
    tx: oneshot::Sender<Result<ScsiResult, IscsiError>>,
    /// Over TCP (over iSER the data lands in the command's registered buffer).
    data_in: ReadData,
    next_data_sn: u32,
    write: Option<Bytes>,
    lun: [u8; 8],
    answer_r2t: bool,
    /// iSER: the registered buffers the target moves the data in and out of.
    iser: Option<Box<CommandMemory>>,
}

/// Per-command options.
#[derive(Debug, Clone, Copy, Default)]
pub struct SubmitOptions {
    /// Send no Data-Out in answer to R2Ts (tests of task management on stalled writes).
    pub withhold_data: bool,
    /// iSER: advertise STags the target cannot use (tests of remote access errors).
    pub corrupt_stag: bool,
    /// iSER: announce the immediate data in DataSegmentLength but leave it out of the SEND,
    /// with the Write STag/VA covering the whole write from its first byte (an initiator
    /// docs/WIRE.md §6 describes).
    pub immediate_by_rdma: bool,
}

enum Pending {
    Scsi(ScsiPending),
    Other(oneshot::Sender<Reply>),
}

struct State {
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    exp_stat_sn: u32,
    next_itt: u32,
    pending: HashMap<u32, Pending>,
}

struct Inner {
    /// The TCP stream (`None` on iSER); its lock also orders PDUs on iSER.
    writer: tokio::sync::Mutex<Option<BufWriter<OwnedWriteHalf>>>,
    iser: Option<Arc<IserTransport>>,
    st: Mutex<State>,
    window: Notify,
    params: SessionParams,
    tsih: u16,
    closed: AtomicBool,
    events: Mutex<Vec<AsyncEvent>>,
    rejects: Mutex<Vec<u8>>,
    timeout: Duration,
    peer: SocketAddr,
}

impl Inner {
    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn write(&self, pdus: &[(&[u8; BHS_LEN], &[u8], &[u8])]) -> Result<(), IscsiError> {
        let mut w = self.writer.lock().await;
        self.write_locked(&mut w, pdus).await
    }

    /// The iSER header of a PDU: a SCSI Command carries its buffers' STags.
    fn iser_header(&self, bhs: &[u8; BHS_LEN]) -> [u8; rtgt_iscsi::iser::header::HEADER_LEN] {
        let h = Bhs::new_unchecked(&bhs[..]);
        if h.opcode() == rtgt_iscsi::pdu::Opcode::ScsiCommand {
            if let Some(Pending::Scsi(p)) = self.st().pending.get(&h.itt()) {
                if let Some(m) = &p.iser {
                    return m.header;
                }
            }
        }
        rtgt_iscsi::iser::header::Repr::control().to_bytes()
    }

    /// Writes PDUs with the writer lock held.
    async fn write_locked(
        &self,
        w: &mut Option<BufWriter<OwnedWriteHalf>>,
        pdus: &[(&[u8; BHS_LEN], &[u8], &[u8])],
    ) -> Result<(), IscsiError> {
        if let Some(t) = &self.iser {
            for (bhs, ahs, data) in pdus {
                let hdr = self.iser_header(bhs);
                t.send(&hdr, bhs, ahs, data).await?;
            }
            return Ok(());
        }
        let Some(w) = w.as_mut() else {
            return Err(IscsiError::Closed);
        };
        let mut out = Vec::new();
        for (bhs, ahs, data) in pdus {
            out.clear();
            encode_pdu(
                &mut out,
                bhs,
                ahs,
                data,
                self.params.header_digest,
                self.params.data_digest,
            );
            w.write_all(&out).await?;
        }
        w.flush().await?;
        Ok(())
    }

    fn fail_all(&self, e: impl Fn() -> IscsiError) {
        self.closed.store(true, Ordering::Release);
        let pending: Vec<Pending> = self.st().pending.drain().map(|(_, p)| p).collect();
        for p in pending {
            match p {
                Pending::Scsi(s) => {
                    let _ = s.tx.send(Err(e()));
                }
                Pending::Other(tx) => drop(tx),
            }
        }
        self.window.notify_waiters();
    }
}

/// A command submitted but not yet answered.
pub struct PendingCommand {
    pub itt: u32,
    pub cmd_sn: u32,
    rx: oneshot::Receiver<Result<ScsiResult, IscsiError>>,
    timeout: Duration,
}

impl PendingCommand {
    pub async fn wait(self) -> Result<ScsiResult, IscsiError> {
        match tokio::time::timeout(self.timeout, self.rx).await {
            Err(_) => Err(IscsiError::Timeout),
            Ok(Err(_)) => Err(IscsiError::Closed),
            Ok(Ok(r)) => r,
        }
    }
}

/// An iSCSI session with one TCP connection. Cloning shares the session.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

async fn login_exchange(
    stream: &mut TcpStream,
    cfg: LoginConfig,
) -> Result<(SessionParams, u16, u32, u32), IscsiError> {
    let mut reader = PduReader::new(LOGIN_MAX_DATA, false, false);
    let mut buf = BytesMut::new();
    let mut login = login::InitiatorLogin::new(cfg, 1);
    let mut step = login.start();
    loop {
        let (req, data) = match step {
            LoginProgress::Send(r, d) => (r, d),
            LoginProgress::Done {
                params,
                tsih,
                stat_sn,
            } => return Ok((params, tsih, login.cmd_sn(), stat_sn)),
        };
        let bhs = BhsRepr::LoginRequest(req).to_bytes();
        let mut out = Vec::new();
        encode_pdu(&mut out, &bhs, &[], &data, false, false);
        stream.write_all(&out).await?;
        let pdu = tokio::time::timeout(DEFAULT_TIMEOUT, read_pdu(stream, &mut reader, &mut buf))
            .await
            .map_err(|_| IscsiError::Timeout)??;
        let Ok(BhsRepr::LoginResponse(r)) = BhsRepr::parse(&pdu.header()) else {
            return Err(IscsiError::Protocol("expected a Login Response"));
        };
        step = login.on_response(&r, &pdu.data)?;
    }
}

async fn login_exchange_iser(
    t: &IserTransport,
    cfg: LoginConfig,
) -> Result<(SessionParams, u16, u32, u32), IscsiError> {
    let mut login = login::InitiatorLogin::new(cfg, 1);
    let mut step = login.start();
    let control = rtgt_iscsi::iser::header::Repr::control().to_bytes();
    loop {
        let (req, data) = match step {
            LoginProgress::Send(r, d) => (r, d),
            LoginProgress::Done {
                params,
                tsih,
                stat_sn,
            } => return Ok((params, tsih, login.cmd_sn(), stat_sn)),
        };
        let bhs = BhsRepr::LoginRequest(req).to_bytes();
        t.send(&control, &bhs, &[], &data).await?;
        let (_, pdu) = tokio::time::timeout(DEFAULT_TIMEOUT, t.recv())
            .await
            .map_err(|_| IscsiError::Timeout)??;
        let Ok(BhsRepr::LoginResponse(r)) = BhsRepr::parse(&pdu.header()) else {
            return Err(IscsiError::Protocol("expected a Login Response"));
        };
        step = login.on_response(&r, &pdu.data)?;
    }
}

impl Session {
    /// Connects and logs in (a discovery session when `cfg.target_name` is `None`).
    pub async fn connect(addr: SocketAddr, cfg: LoginConfig) -> Result<Session, IscsiError> {
        let mut stream = tokio::time::timeout(DEFAULT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| IscsiError::Timeout)??;
        let _ = stream.set_nodelay(true);
        let busy_poll = cfg.busy_poll;
        let (params, tsih, cmd_sn, stat_sn) = login_exchange(&mut stream, cfg).await?;
        let (rd, wr) = stream.into_split();
        let rd = crate::poll::PollingRead::new(rd, busy_poll);
        let inner = Arc::new(Inner {
            writer: tokio::sync::Mutex::new(Some(BufWriter::with_capacity(256 * 1024, wr))),
            iser: None,
            st: Mutex::new(State {
                cmd_sn,
                exp_cmd_sn: cmd_sn,
                max_cmd_sn: cmd_sn,
                exp_stat_sn: stat_sn.wrapping_add(1),
                next_itt: 1,
                pending: HashMap::new(),
            }),
            window: Notify::new(),
            tsih,
            closed: AtomicBool::new(false),
            events: Mutex::new(Vec::new()),
            rejects: Mutex::new(Vec::new()),
            timeout: DEFAULT_TIMEOUT,
            peer: addr,
            params,
        });
        let reader = PduReader::new(
            inner.params.max_recv_data_segment_length as usize,
            inner.params.header_digest,
            inner.params.data_digest,
        );
        tokio::spawn(reader_task(inner.clone(), rd, reader));
        Ok(Session { inner })
    }

    /// Logs in over a connected iSER endpoint (its receive ring posted, the QP in RTS):
    /// login PDUs as SENDs, then commands whose data the target moves by RDMA.
    pub async fn connect_iser(
        ep: Endpoint,
        peer: SocketAddr,
        cfg: LoginConfig,
    ) -> Result<Session, IscsiError> {
        Session::connect_iser_with(ep, peer, cfg, None).await
    }

    async fn connect_iser_with(
        ep: Endpoint,
        peer: SocketAddr,
        mut cfg: LoginConfig,
        cm: Option<rtgt_transport::cm::CmConn>,
    ) -> Result<Session, IscsiError> {
        cfg.transport = rtgt_iscsi::params::TransportKind::Iser;
        let t = IserTransport::start(ep, peer)?;
        if let Some(c) = cm {
            t.attach(c);
        }
        let (params, tsih, cmd_sn, stat_sn) = match login_exchange_iser(&t, cfg).await {
            Ok(x) => x,
            Err(e) => {
                t.shutdown().await;
                return Err(e);
            }
        };
        let inner = Arc::new(Inner {
            writer: tokio::sync::Mutex::new(None),
            iser: Some(t.clone()),
            st: Mutex::new(State {
                cmd_sn,
                exp_cmd_sn: cmd_sn,
                max_cmd_sn: cmd_sn,
                exp_stat_sn: stat_sn.wrapping_add(1),
                next_itt: 1,
                pending: HashMap::new(),
            }),
            window: Notify::new(),
            tsih,
            closed: AtomicBool::new(false),
            events: Mutex::new(Vec::new()),
            rejects: Mutex::new(Vec::new()),
            timeout: DEFAULT_TIMEOUT,
            peer,
            params,
        });
        tokio::spawn(iser_reader_task(inner.clone(), t));
        Ok(Session { inner })
    }

    /// Connects through the CM to the iSER portal `dst` and logs in.
    pub async fn connect_iser_cm(
        cm: &rtgt_transport::cm::Cm,
        pd: &rtgt_transport::verbs::Pd,
        dst: SocketAddr,
        cfg: LoginConfig,
    ) -> Result<Session, IscsiError> {
        let sizing = rtgt_iscsi::iser::Sizing::new(128, LOGIN_MAX_DATA as u32, 16);
        let (ep, conn) = crate::iser::connect(cm, pd, dst, sizing).await?;
        Session::connect_iser_with(ep, dst, cfg, Some(conn)).await
    }

    /// Whether the session runs over iSER.
    pub fn is_iser(&self) -> bool {
        self.inner.iser.is_some()
    }

    pub fn params(&self) -> &SessionParams {
        &self.inner.params
    }

    pub fn tsih(&self) -> u16 {
        self.inner.tsih
    }

    pub fn peer(&self) -> SocketAddr {
        self.inner.peer
    }

    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// Async Messages received so far.
    pub fn async_events(&self) -> Vec<AsyncEvent> {
        self.inner
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reject reasons received so far.
    pub fn rejects(&self) -> Vec<u8> {
        self.inner
            .rejects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// (CmdSN, ExpCmdSN, MaxCmdSN) as the initiator sees them.
    pub fn window(&self) -> (u32, u32, u32) {
        let st = self.inner.st();
        (st.cmd_sn, st.exp_cmd_sn, st.max_cmd_sn)
    }

    /// Waits until the CmdSN window has room, then assigns ITT and CmdSN under the writer
    /// lock (so commands leave in CmdSN order) and writes `build`'s PDUs.
    async fn issue<F>(
        &self,
        immediate: bool,
        pending: impl FnOnce(u32) -> Pending,
        build: F,
    ) -> Result<(u32, u32), IscsiError>
    where
        F: FnOnce(u32, u32, u32) -> Vec<([u8; BHS_LEN], Vec<u8>, Bytes)>,
    {
        let inner = &self.inner;
        let deadline = tokio::time::Instant::now() + inner.timeout;
        loop {
            if self.is_closed() {
                return Err(IscsiError::Closed);
            }
            let notified = inner.window.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let open = {
                let st = inner.st();
                immediate || !sn_lt(st.max_cmd_sn, st.cmd_sn)
            };
            if open {
                let mut w = inner.writer.lock().await;
                let (itt, cmd_sn, exp_stat_sn) = {
                    let mut st = inner.st();
                    if !immediate && sn_lt(st.max_cmd_sn, st.cmd_sn) {
                        continue;
                    }
                    let itt = loop {
                        let i = st.next_itt;
                        st.next_itt = st.next_itt.wrapping_add(1);
                        if i != RESERVED_TAG && !st.pending.contains_key(&i) {
                            break i;
                        }
                    };
                    let cmd_sn = st.cmd_sn;
                    if !immediate {
                        st.cmd_sn = st.cmd_sn.wrapping_add(1);
                    }
                    st.pending.insert(itt, pending(itt));
                    (itt, cmd_sn, st.exp_stat_sn)
                };
                let pdus = build(itt, cmd_sn, exp_stat_sn);
                let refs: Vec<(&[u8; BHS_LEN], &[u8], &[u8])> =
                    pdus.iter().map(|(b, a, d)| (b, &a[..], &d[..])).collect();
                if let Err(e) = inner.write_locked(&mut w, &refs).await {
                    inner.st().pending.remove(&itt);
                    return Err(e);
                }
                return Ok((itt, cmd_sn));
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(IscsiError::Timeout);
            }
        }
    }

    /// Submits a SCSI command: `data_out` is written (immediate data, unsolicited Data-Out
    /// and R2T as negotiated), up to `in_len` bytes are read.
    pub async fn submit(
        &self,
        lun: u64,
        cdb: &[u8],
        data_out: Option<Bytes>,
        in_len: u32,
    ) -> Result<PendingCommand, IscsiError> {
        self.submit_with(lun, cdb, data_out, in_len, SubmitOptions::default())
            .await
    }

    /// [`Session::submit`] with options.
    pub async fn submit_with(
        &self,
        lun: u64,
        cdb: &[u8],
        data_out: Option<Bytes>,
        in_len: u32,
        opts: SubmitOptions,
    ) -> Result<PendingCommand, IscsiError> {
        let p = &self.inner.params;
        let lun_b = rtgt_scsi::lun_to_bytes(lun);
        let (tx, rx) = oneshot::channel();
        let out_len = data_out.as_ref().map(|d| d.len() as u32).unwrap_or(0);
        let max_xmit = p.max_xmit_data_segment_length.max(512) as usize;
        let first_burst = if out_len > 0 {
            p.unsolicited_limit(out_len) as usize
        } else {
            0
        };
        let iser = self.inner.iser.clone();
        // iSER: immediate data up to TargetRecvDataSegmentLength, the rest read by the target
        // from the Write STag (no Data-Out SENDs).
        let max_imm = if iser.is_some() {
            p.target_recv_data_segment_length.max(512) as usize
        } else {
            max_xmit
        };
        let imm_len = if p.immediate_data {
            first_burst.min(max_imm)
        } else {
            0
        };
        let unsol_end = if p.initial_r2t || iser.is_some() {
            imm_len
        } else {
            first_burst
        };
        let mem = match &iser {
            Some(t) => Some(Box::new(
                CommandMemory::new(
                    t,
                    in_len,
                    data_out.as_deref(),
                    if opts.immediate_by_rdma {
                        0
                    } else {
                        imm_len.min(out_len as usize)
                    },
                    opts.corrupt_stag,
                )
                .await?,
            )),
            None => None,
        };
        let mut cdb16 = [0u8; 16];
        let n = cdb.len().min(16);
        cdb16[..n].copy_from_slice(&cdb[..n]);
        let mut ahs = Vec::new();
        if cdb.len() > 16 {
            Ahs::ExtendedCdb(cdb[16..].to_vec()).emit(&mut ahs);
        }
        let bidi = out_len > 0 && in_len > 0;
        if bidi {
            Ahs::BidiReadLength(in_len).emit(&mut ahs);
        }
        let write = data_out.clone();
        let pending = |_| {
            Pending::Scsi(ScsiPending {
                tx,
                data_in: ReadData::new(if mem.is_some() { 0 } else { in_len as usize }),
                next_data_sn: 0,
                write: write.clone(),
                lun: lun_b,
                answer_r2t: !opts.withhold_data,
                iser: mem,
            })
        };
        let (itt, cmd_sn) = self
            .issue(false, pending, |itt, cmd_sn, exp_stat_sn| {
                let data = data_out.clone().unwrap_or_default();
                let imm = data.slice(..imm_len.min(data.len()));
                let more_unsol = unsol_end > imm.len();
                let c = ScsiCommand {
                    immediate: false,
                    final_: !more_unsol,
                    read: in_len > 0,
                    write: out_len > 0,
                    attr: 1,
                    lun: lun_b,
                    itt,
                    edtl: if out_len > 0 { out_len } else { in_len },
                    cmd_sn,
                    exp_stat_sn,
                    cdb: cdb16,
                    data_len: imm.len() as u32,
                };
                let mut bhs = BhsRepr::ScsiCommand(c).to_bytes();
                Bhs::new_unchecked(&mut bhs[..]).set_total_ahs_len(ahs.len());
                let sent = if opts.immediate_by_rdma && iser.is_some() {
                    Bytes::new()
                } else {
                    imm.clone()
                };
                let mut pdus = vec![(bhs, ahs.clone(), sent)];
                let mut off = imm.len();
                let mut data_sn = 0;
                while off < unsol_end {
                    let n = max_xmit.min(unsol_end - off);
                    let d = DataOut {
                        final_: off + n == unsol_end,
                        lun: lun_b,
                        itt,
                        ttt: RESERVED_TAG,
                        exp_stat_sn,
                        data_sn,
                        buffer_offset: off as u32,
                        data_len: n as u32,
                    };
                    pdus.push((
                        BhsRepr::DataOut(d).to_bytes(),
                        Vec::new(),
                        data.slice(off..off + n),
                    ));
                    data_sn += 1;
                    off += n;
                }
                pdus
            })
            .await?;
        Ok(PendingCommand {
            itt,
            cmd_sn,
            rx,
            timeout: self.inner.timeout,
        })
    }

    /// Runs one SCSI command to completion.
    pub async fn command(
        &self,
        lun: u64,
        cdb: &[u8],
        data_out: Option<Bytes>,
        in_len: u32,
    ) -> Result<ScsiResult, IscsiError> {
        self.submit(lun, cdb, data_out, in_len).await?.wait().await
    }

    async fn request(
        &self,
        immediate: bool,
        build: impl FnOnce(u32, u32, u32) -> BhsRepr,
        data: Bytes,
    ) -> Result<(BhsRepr, Bytes), IscsiError> {
        let (tx, rx) = oneshot::channel();
        self.issue(
            immediate,
            |_| Pending::Other(tx),
            |itt, cmd_sn, exp| {
                let mut bhs = build(itt, cmd_sn, exp).to_bytes();
                Bhs::new_unchecked(&mut bhs[..]).set_data_segment_len(data.len() as u32);
                vec![(bhs, Vec::new(), data.clone())]
            },
        )
        .await?;
        match tokio::time::timeout(self.inner.timeout, rx).await {
            Err(_) => Err(IscsiError::Timeout),
            Ok(Err(_)) => Err(IscsiError::Closed),
            Ok(Ok(Reply::Rejected(r))) => Err(IscsiError::Rejected(r)),
            Ok(Ok(Reply::Pdu(r, d))) => Ok((r, d)),
        }
    }

    /// NOP-Out ping (RFC 7143 §11.18); returns the echoed data.
    pub async fn nop(&self, data: &[u8]) -> Result<Bytes, IscsiError> {
        let (r, d) = self
            .request(
                true,
                |itt, cmd_sn, exp_stat_sn| {
                    BhsRepr::NopOut(NopOut {
                        immediate: true,
                        lun: [0; 8],
                        itt,
                        ttt: RESERVED_TAG,
                        cmd_sn,
                        exp_stat_sn,
                        data_len: 0,
                    })
                },
                Bytes::copy_from_slice(data),
            )
            .await?;
        match r {
            BhsRepr::NopIn(_) => Ok(d),
            _ => Err(IscsiError::Protocol("unexpected answer to NOP-Out")),
        }
    }

    /// A task management function (RFC 7143 §11.5); returns the response code.
    pub async fn task_management(
        &self,
        function: u8,
        lun: u64,
        ref_itt: u32,
        ref_cmd_sn: u32,
    ) -> Result<u8, IscsiError> {
        let lun_b = rtgt_scsi::lun_to_bytes(lun);
        let (r, _) = self
            .request(
                true,
                |itt, cmd_sn, exp_stat_sn| {
                    BhsRepr::TaskMgmtRequest(TaskMgmtRequest {
                        immediate: true,
                        function,
                        lun: lun_b,
                        itt,
                        ref_task_tag: if function == tmf::ABORT_TASK || function == tmf::QUERY_TASK
                        {
                            ref_itt
                        } else {
                            RESERVED_TAG
                        },
                        cmd_sn,
                        exp_stat_sn,
                        ref_cmd_sn,
                        exp_data_sn: 0,
                    })
                },
                Bytes::new(),
            )
            .await?;
        match r {
            BhsRepr::TaskMgmtResponse(t) => Ok(t.response),
            _ => Err(IscsiError::Protocol("unexpected answer to a TMF request")),
        }
    }

    /// ABORT TASK for a submitted command.
    pub async fn abort(&self, lun: u64, cmd: &PendingCommand) -> Result<u8, IscsiError> {
        self.task_management(tmf::ABORT_TASK, lun, cmd.itt, cmd.cmd_sn)
            .await
    }

    /// A Text request, following continuations (RFC 7143 §11.10).
    pub async fn text(&self, keys: &TextPairs) -> Result<TextPairs, IscsiError> {
        let mut all = Vec::new();
        let mut ttt = RESERVED_TAG;
        let mut data = Bytes::from(keys.encode());
        let mut itt_used: Option<u32> = None;
        loop {
            let (r, d) = self
                .request(
                    true,
                    |itt, cmd_sn, exp_stat_sn| {
                        let _ = itt_used.insert(itt);
                        BhsRepr::TextRequest(TextRequest {
                            immediate: true,
                            final_: true,
                            continue_: false,
                            lun: [0; 8],
                            itt,
                            ttt,
                            cmd_sn,
                            exp_stat_sn,
                            data_len: 0,
                        })
                    },
                    data.clone(),
                )
                .await?;
            let BhsRepr::TextResponse(t) = r else {
                return Err(IscsiError::Protocol("unexpected answer to Text"));
            };
            all.extend_from_slice(&d);
            if all.len() > 1 << 20 {
                return Err(IscsiError::Protocol("text response too long"));
            }
            if !t.continue_ {
                return Ok(TextPairs::parse(&all)?);
            }
            ttt = t.ttt;
            data = Bytes::new();
        }
    }

    /// SendTargets (RFC 7143 §13.3).
    pub async fn send_targets(&self, which: &str) -> Result<Vec<DiscoveredTarget>, IscsiError> {
        let mut keys = TextPairs::new();
        keys.push("SendTargets", which);
        let r = self.text(&keys).await?;
        let mut out: Vec<DiscoveredTarget> = Vec::new();
        for (k, v) in r.iter() {
            match k {
                "TargetName" => out.push(DiscoveredTarget {
                    name: v.to_string(),
                    addresses: Vec::new(),
                }),
                "TargetAddress" => {
                    if let Some(t) = out.last_mut() {
                        t.addresses.push(v.to_string());
                    }
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// Logout (RFC 7143 §11.14) with reason 0 (close the session); returns the response code.
    pub async fn logout(&self) -> Result<u8, IscsiError> {
        let (r, _) = self
            .request(
                true,
                |itt, cmd_sn, exp_stat_sn| {
                    BhsRepr::LogoutRequest(LogoutRequest {
                        immediate: true,
                        reason: 0,
                        itt,
                        cid: 0,
                        cmd_sn,
                        exp_stat_sn,
                    })
                },
                Bytes::new(),
            )
            .await?;
        let BhsRepr::LogoutResponse(l) = r else {
            return Err(IscsiError::Protocol("unexpected answer to Logout"));
        };
        self.disconnect().await;
        Ok(l.response)
    }

    /// Writes raw bytes on the connection (tests of malformed input); on iSER, `bytes` is
    /// one whole message (iSER header included).
    pub async fn send_raw(&self, bytes: &[u8]) -> Result<(), IscsiError> {
        if let Some(t) = &self.inner.iser {
            return t.send_raw(bytes).await;
        }
        let mut w = self.inner.writer.lock().await;
        let w = w.as_mut().ok_or(IscsiError::Closed)?;
        w.write_all(bytes).await?;
        w.flush().await?;
        Ok(())
    }

    /// Writes one PDU as given, with the session's digests (tests).
    pub async fn send_pdu(&self, bhs: &[u8; BHS_LEN], data: &[u8]) -> Result<(), IscsiError> {
        self.inner.write(&[(bhs, &[], data)]).await
    }

    /// Drops the connection without logging out.
    pub async fn disconnect(&self) {
        self.inner.closed.store(true, Ordering::Release);
        if let Some(t) = &self.inner.iser {
            t.shutdown().await;
            return;
        }
        let mut w = self.inner.writer.lock().await;
        if let Some(w) = w.as_mut() {
            let _ = w.shutdown().await;
        }
    }
}

/// Discovers targets: a discovery session, SendTargets=All, logout.
pub async fn discover(
    addr: SocketAddr,
    mut cfg: LoginConfig,
) -> Result<Vec<DiscoveredTarget>, IscsiError> {
    cfg.target_name = None;
    let s = Session::connect(addr, cfg).await?;
    let t = s.send_targets("All").await?;
    let _ = s.logout().await;
    Ok(t)
}

async fn reader_task(
    inner: Arc<Inner>,
    mut rd: crate::poll::PollingRead<tokio::net::tcp::OwnedReadHalf>,
    mut reader: PduReader,
) {
    let mut buf = BytesMut::with_capacity(256 * 1024);
    let err = loop {
        let pdu = match read_pdu(&mut rd, &mut reader, &mut buf).await {
            Ok(p) => p,
            Err(e) => break e,
        };
        if let Err(e) = handle_pdu(&inner, pdu, None) {
            break e;
        }
    };
    tracing::debug!(error = %err, "initiator connection ended");
    inner.fail_all(|| IscsiError::Closed);
}

async fn iser_reader_task(inner: Arc<Inner>, t: Arc<IserTransport>) {
    let err = loop {
        let (st, pdu) = match t.recv().await {
            Ok(sp) => sp,
            Err(e) => break e,
        };
        if let Err(e) = handle_pdu(&inner, pdu, st.invalidated) {
            break e;
        }
    };
    tracing::debug!(error = %err, "iSER initiator connection ended");
    t.close();
    inner.fail_all(|| IscsiError::Closed);
}

fn update_sequence(inner: &Inner, stat_sn: Option<u32>, exp_cmd_sn: u32, max_cmd_sn: u32) {
    let mut st = inner.st();
    if let Some(s) = stat_sn {
        if !sn_lt(s.wrapping_add(1), st.exp_stat_sn) {
            st.exp_stat_sn = s.wrapping_add(1);
        }
    }
    // RFC 7143 §4.2.2.1: ignore a MaxCmdSN below ExpCmdSN − 1.
    if !sn_lt(max_cmd_sn, exp_cmd_sn.wrapping_sub(1)) {
        if sn_lt(st.exp_cmd_sn, exp_cmd_sn) {
            st.exp_cmd_sn = exp_cmd_sn;
        }
        if sn_lt(st.max_cmd_sn, max_cmd_sn) {
            st.max_cmd_sn = max_cmd_sn;
        }
    }
    drop(st);
    inner.window.notify_waiters();
}

fn complete_other(inner: &Inner, itt: u32, reply: Reply) {
    let p = inner.st().pending.remove(&itt);
    match p {
        Some(Pending::Other(tx)) => {
            let _ = tx.send(reply);
        }
        Some(Pending::Scsi(s)) => {
            let r = match reply {
                Reply::Rejected(r) => IscsiError::Rejected(r),
                _ => IscsiError::Protocol("unexpected PDU for a SCSI task"),
            };
            let _ = s.tx.send(Err(r));
        }
        None => {}
    }
}

/// Takes one PDU from the target; `invalidated` is the STag its iSER SEND invalidated.
fn handle_pdu(inner: &Arc<Inner>, pdu: RxPdu, invalidated: Option<u32>) -> Result<(), IscsiError> {
    if !pdu.data_digest_ok {
        return Err(IscsiError::Protocol("data digest error from target"));
    }
    if pdu.data_short {
        return Err(IscsiError::Protocol(
            "data segment missing from the target's message",
        ));
    }
    let repr = BhsRepr::parse(&pdu.header())?;
    match repr {
        BhsRepr::DataIn(d) => data_in(inner, d, &pdu.data),
        BhsRepr::ScsiResponse(r) => {
            update_sequence(inner, Some(r.stat_sn), r.exp_cmd_sn, r.max_cmd_sn);
            scsi_response(inner, r, &pdu.data, invalidated);
            Ok(())
        }
        BhsRepr::R2t(r) => {
            update_sequence(inner, None, r.exp_cmd_sn, r.max_cmd_sn);
            r2t(inner, r);
            Ok(())
        }
        BhsRepr::NopIn(n) => {
            update_sequence(
                inner,
                (n.ttt == RESERVED_TAG).then_some(n.stat_sn),
                n.exp_cmd_sn,
                n.max_cmd_sn,
            );
            if n.itt == RESERVED_TAG {
                // A target ping: answer with the same TTT (§11.18.2).
                if n.ttt != RESERVED_TAG {
                    let inner = inner.clone();
                    tokio::spawn(async move {
                        let (cmd_sn, exp) = {
                            let st = inner.st();
                            (st.cmd_sn, st.exp_stat_sn)
                        };
                        let bhs = BhsRepr::NopOut(NopOut {
                            immediate: true,
                            lun: n.lun,
                            itt: RESERVED_TAG,
                            ttt: n.ttt,
                            cmd_sn,
                            exp_stat_sn: exp,
                            data_len: 0,
                        })
                        .to_bytes();
                        let _ = inner.write(&[(&bhs, &[], &[])]).await;
                    });
                }
                return Ok(());
            }
            complete_other(inner, n.itt, Reply::Pdu(BhsRepr::NopIn(n), pdu.data));
            Ok(())
        }
        BhsRepr::TaskMgmtResponse(t) => {
            update_sequence(inner, Some(t.stat_sn), t.exp_cmd_sn, t.max_cmd_sn);
            complete_other(
                inner,
                t.itt,
                Reply::Pdu(BhsRepr::TaskMgmtResponse(t), pdu.data),
            );
            Ok(())
        }
        BhsRepr::TextResponse(t) => {
            update_sequence(inner, Some(t.stat_sn), t.exp_cmd_sn, t.max_cmd_sn);
            complete_other(inner, t.itt, Reply::Pdu(BhsRepr::TextResponse(t), pdu.data));
            Ok(())
        }
        BhsRepr::LogoutResponse(l) => {
            update_sequence(inner, Some(l.stat_sn), l.exp_cmd_sn, l.max_cmd_sn);
            complete_other(
                inner,
                l.itt,
                Reply::Pdu(BhsRepr::LogoutResponse(l), pdu.data),
            );
            Ok(())
        }
        BhsRepr::AsyncMessage(a) => {
            update_sequence(inner, Some(a.stat_sn), a.exp_cmd_sn, a.max_cmd_sn);
            inner
                .events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(AsyncEvent {
                    event: a.event,
                    param1: a.param1,
                    param2: a.param2,
                    param3: a.param3,
                });
            Ok(())
        }
        BhsRepr::Reject(r) => {
            update_sequence(inner, Some(r.stat_sn), r.exp_cmd_sn, r.max_cmd_sn);
            inner
                .rejects
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(r.reason);
            if pdu.data.len() >= BHS_LEN {
                let itt = Bhs::new_unchecked(&pdu.data[..BHS_LEN]).itt();
                complete_other(inner, itt, Reply::Rejected(r.reason));
            }
            Ok(())
        }
        _ => Err(IscsiError::Protocol("unexpected opcode from target")),
    }
}

fn data_in(inner: &Arc<Inner>, d: DataIn, data: &Bytes) -> Result<(), IscsiError> {
    update_sequence(
        inner,
        d.status_present.then_some(d.stat_sn),
        d.exp_cmd_sn,
        d.max_cmd_sn,
    );
    let mut st = inner.st();
    let Some(Pending::Scsi(p)) = st.pending.get_mut(&d.itt) else {
        return Ok(());
    };
    let off = d.buffer_offset as usize;
    let bad = if d.data_sn != p.next_data_sn {
        Some("Data-In DataSN out of order")
    } else if !p.data_in.put(off, data) {
        Some("Data-In beyond the expected length")
    } else {
        None
    };
    if let Some(e) = bad {
        if let Some(Pending::Scsi(p)) = st.pending.remove(&d.itt) {
            let _ = p.tx.send(Err(IscsiError::Protocol(e)));
        }
        return Ok(());
    }
    p.next_data_sn = p.next_data_sn.wrapping_add(1);
    if d.status_present {
        if let Some(Pending::Scsi(p)) = st.pending.remove(&d.itt) {
            let _ = p.tx.send(Ok(ScsiResult {
                response: 0,
                status: d.status,
                sense: Vec::new(),
                data: p.data_in.finish(),
                overflow: d.overflow,
                underflow: d.underflow,
                residual: d.residual,
            }));
        }
    }
    Ok(())
}

fn scsi_response(inner: &Inner, r: ScsiResponse, data: &[u8], invalidated: Option<u32>) {
    let Some(Pending::Scsi(mut p)) = inner.st().pending.remove(&r.itt) else {
        return;
    };
    let sense = if data.len() >= 2 {
        let n = u16::from_be_bytes([data[0], data[1]]) as usize;
        data[2..(2 + n).min(data.len())].to_vec()
    } else {
        Vec::new()
    };
    let data = match p.iser.take() {
        Some(mut m) => {
            if let Some(key) = invalidated {
                m.invalidated(key);
            }
            // The read data is already in the registered buffer (RDMA WRITE precedes the
            // response on the QP); the residual says how much of it is valid.
            let want = m.read_len();
            let n = if r.underflow {
                want.saturating_sub(r.residual as usize)
            } else {
                want
            };
            m.into_read_data(n)
        }
        None => p.data_in.finish(),
    };
    let _ = p.tx.send(Ok(ScsiResult {
        response: r.response,
        status: r.status,
        sense,
        data,
        overflow: r.overflow,
        underflow: r.underflow,
        residual: r.residual,
    }));
}

/// Answers an R2T with Data-Out PDUs (RFC 7143 §11.8.3).
fn r2t(inner: &Arc<Inner>, r: R2t) {
    let (write, lun, exp_stat_sn) = {
        let st = inner.st();
        let Some(Pending::Scsi(p)) = st.pending.get(&r.itt) else {
            return;
        };
        if !p.answer_r2t {
            return;
        }
        (p.write.clone(), p.lun, st.exp_stat_sn)
    };
    let Some(write) = write else { return };
    let max = inner.params.max_xmit_data_segment_length.max(512) as usize;
    let inner = inner.clone();
    tokio::spawn(async move {
        let start = r.buffer_offset as usize;
        let end = start
            .saturating_add(r.desired_len as usize)
            .min(write.len());
        let mut pdus = Vec::new();
        let mut off = start;
        let mut data_sn = 0;
        while off < end {
            let n = max.min(end - off);
            let d = DataOut {
                final_: off + n == end,
                lun,
                itt: r.itt,
                ttt: r.ttt,
                exp_stat_sn,
                data_sn,
                buffer_offset: off as u32,
                data_len: n as u32,
            };
            pdus.push((BhsRepr::DataOut(d).to_bytes(), write.slice(off..off + n)));
            data_sn += 1;
            off += n;
        }
        let refs: Vec<(&[u8; BHS_LEN], &[u8], &[u8])> =
            pdus.iter().map(|(b, d)| (b, &[][..], &d[..])).collect();
        let _ = inner.write(&refs).await;
    });
}

/// An `iscsi://[user[%password]@]host[:port]/target-iqn/lun` URL (libiscsi's format).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiUrl {
    pub host: String,
    pub port: u16,
    pub target: String,
    pub lun: u64,
    pub user: Option<String>,
    pub password: Option<String>,
}

impl std::str::FromStr for IscsiUrl {
    type Err = IscsiError;

    fn from_str(s: &str) -> Result<IscsiUrl, IscsiError> {
        let bad = || IscsiError::Address(s.to_string());
        let rest = s.strip_prefix("iscsi://").ok_or_else(bad)?;
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((a, r)) => (Some(a), r),
            None => (None, rest),
        };
        let (user, password) = match auth {
            Some(a) => match a.split_once('%') {
                Some((u, p)) => (Some(u.to_string()), Some(p.to_string())),
                None => (Some(a.to_string()), None),
            },
            None => (None, None),
        };
        let (hostport, path) = rest.split_once('/').ok_or_else(bad)?;
        let (host, port) = split_host_port(hostport).ok_or_else(bad)?;
        let (target, lun) = path.rsplit_once('/').ok_or_else(bad)?;
        if target.is_empty() {
            return Err(bad());
        }
        let lun = lun.parse().map_err(|_| bad())?;
        Ok(IscsiUrl {
            host,
            port,
            target: target.to_string(),
            lun,
            user,
            password,
        })
    }
}

/// Splits `host[:port]` (IPv6 in brackets); the port defaults to 3260.
pub fn split_host_port(s: &str) -> Option<(String, u16)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => 3260,
            None => return None,
        };
        return Some((h.to_string(), port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Some((h.to_string(), p.parse().ok()?)),
        _ if !s.is_empty() => Some((s.to_string(), 3260)),
        _ => None,
    }
}

/// Resolves `host:port` to a socket address.
pub async fn resolve(host: &str, port: u16) -> Result<SocketAddr, IscsiError> {
    tokio::net::lookup_host((host, port))
        .await?
        .next()
        .ok_or_else(|| IscsiError::Address(format!("{host}:{port}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_data_keeps_a_whole_pdu_and_places_the_others() {
        let whole = Bytes::from(vec![7u8; 4096]);
        let mut r = ReadData::new(4096);
        assert!(r.put(0, &whole));
        let got = r.finish();
        assert_eq!(
            got.as_ptr(),
            whole.as_ptr(),
            "one PDU with it all: not copied"
        );

        // Out of order, with a gap: placed by offset, the gap zero, up to the furthest.
        let mut r = ReadData::new(8192);
        assert!(r.put(0, &Bytes::from(vec![1u8; 1024])));
        assert!(r.put(2048, &Bytes::from(vec![2u8; 1024])));
        assert!(
            !r.put(8000, &Bytes::from(vec![3u8; 1024])),
            "beyond the length"
        );
        let got = r.finish();
        assert_eq!(got.len(), 3072);
        assert!(got[..1024].iter().all(|&b| b == 1));
        assert!(got[1024..2048].iter().all(|&b| b == 0));
        assert!(got[2048..].iter().all(|&b| b == 2));
        // First at an offset, then at 0.
        let mut r = ReadData::new(2048);
        assert!(r.put(1024, &Bytes::from(vec![5u8; 1024])));
        assert!(r.put(0, &Bytes::from(vec![4u8; 1024])));
        let got = r.finish();
        assert_eq!((got.len(), got[0], got[2047]), (2048, 4, 5));
    }

    #[test]
    fn urls() {
        let u: IscsiUrl = "iscsi://127.0.0.1:3261/iqn.2025-01.io.rtgt:d/1"
            .parse()
            .unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.target.as_str(), u.lun),
            ("127.0.0.1", 3261, "iqn.2025-01.io.rtgt:d", 1)
        );
        let u: IscsiUrl = "iscsi://bob%secret@[::1]/iqn.x/0".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 3260));
        assert_eq!(
            (u.user.as_deref(), u.password.as_deref()),
            (Some("bob"), Some("secret"))
        );
        assert!("http://x/y/0".parse::<IscsiUrl>().is_err());
        assert!("iscsi://host/iqn".parse::<IscsiUrl>().is_err());
        assert!("iscsi://host/iqn/x".parse::<IscsiUrl>().is_err());
        assert_eq!(split_host_port("h"), Some(("h".into(), 3260)));
        assert_eq!(
            split_host_port("[fe80::1]:99"),
            Some(("fe80::1".into(), 99))
        );
    }
}
