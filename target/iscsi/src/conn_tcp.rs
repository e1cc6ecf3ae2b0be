//! The TCP connection driver (RFC 7143 §4.2, §11.2): PDU framing with digests, the login
//! phase, and R2T / Data-In data movement for [`Conn`].
//!
//! [`PduReader`] reads a PDU as READY → HDR → AHS → DATA and can resume after any partial
//! read; it never buffers more than one PDU of at most the negotiated
//! MaxRecvDataSegmentLength (plus AHS).
//!
//! One task per connection reads: it takes whatever requests one read returned, handles
//! them in turn — [`Conn`] runs a command to completion right there when nothing makes it
//! wait — and then sends all their responses with one vectored write. Outgoing PDUs go
//! through the TCP transmit path NVMe/TCP uses too ([`rtgt_tcp_channel::Outbox`], at most
//! [`TX_QUEUE`] PDUs); StatSN/ExpCmdSN/MaxCmdSN are filled when a PDU leaves its queue, so
//! StatSN increases in wire order. A writer task only steps in while the socket is full, and
//! sends what is left when the connection closes.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Buf, BytesMut};
use rtgt_backstore::{FileSpan, IoBuf};
use rtgt_tcp_channel::{Framer, Outbox, Wire};
use rtgt_transport::poll::PollBudget;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::conn::{
    Completion, Conn, ConnDriver, Flow, RxPdu, StatSn, TxData, TxPdu, FILE_RANGE_MIN,
};
use super::login::{Login, LoginStep, LOGIN_MAX_DATA};
use super::params::TransportKind;
use super::pdu::{
    self, digest, pad4, Bhs, BhsRepr, DataIn, LoginResponse, Opcode, R2t, BHS_LEN, RESERVED_TAG,
};
use super::session::{R2tState, Session, Task};
use super::shared::ServerShared;
use super::IscsiError;
use rtgt_scsi::FileRange;

/// Outgoing PDUs queued per connection before senders wait.
pub const TX_QUEUE: usize = 256;
/// Room the reader makes in its buffer before each read.
const READ_CHUNK: usize = 64 * 1024;
/// Time a login may take between two PDUs.
const LOGIN_PDU_TIMEOUT: Duration = Duration::from_secs(15);

/// Reader states (SPDK's READY → HDR → AHS → PAYLOAD).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadState {
    /// Between PDUs.
    Ready,
    /// Waiting for the 48-byte BHS.
    Header,
    /// Waiting for the AHS and the header digest.
    Ahs,
    /// Waiting for the data segment, its padding and digest.
    Data,
}

/// Why reading stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    HeaderDigest,
    /// The data segment exceeds our MaxRecvDataSegmentLength; the header is returned for
    /// the Reject.
    TooLong {
        bhs: [u8; BHS_LEN],
        len: u32,
    },
}

/// Resumable PDU reader over a byte buffer.
#[derive(Debug)]
pub struct PduReader {
    state: ReadState,
    pub max_data: usize,
    pub header_digest: bool,
    pub data_digest: bool,
    bhs: [u8; BHS_LEN],
    ahs_len: usize,
    ahs: Vec<u8>,
    data_len: usize,
}

impl PduReader {
    pub fn new(max_data: usize, header_digest: bool, data_digest: bool) -> PduReader {
        PduReader {
            state: ReadState::Ready,
            max_data,
            header_digest,
            data_digest,
            bhs: [0; BHS_LEN],
            ahs_len: 0,
            ahs: Vec::new(),
            data_len: 0,
        }
    }

    pub fn state(&self) -> ReadState {
        self.state
    }

    /// Bytes the current state needs before it can make progress.
    pub fn need(&self) -> usize {
        match self.state {
            ReadState::Ready | ReadState::Header => BHS_LEN,
            ReadState::Ahs => self.ahs_len + if self.header_digest { 4 } else { 0 },
            ReadState::Data => self.data_wire_len(),
        }
    }

    fn data_wire_len(&self) -> usize {
        let dd = if self.data_digest && self.data_len > 0 {
            4
        } else {
            0
        };
        self.data_len + pad4(self.data_len) + dd
    }

    fn ready(&mut self, buf: &mut BytesMut) -> Option<ReadState> {
        (!buf.is_empty()).then_some(ReadState::Header)
    }

    fn header(&mut self, buf: &mut BytesMut) -> Result<Option<ReadState>, ReadError> {
        if buf.len() < BHS_LEN {
            return Ok(None);
        }
        self.bhs.copy_from_slice(&buf[..BHS_LEN]);
        buf.advance(BHS_LEN);
        let h = Bhs::new_unchecked(&self.bhs[..]);
        self.ahs_len = h.total_ahs_len();
        self.data_len = h.data_segment_len() as usize;
        if self.data_len > self.max_data {
            self.state = ReadState::Ready;
            return Err(ReadError::TooLong {
                bhs: self.bhs,
                len: self.data_len as u32,
            });
        }
        Ok(Some(ReadState::Ahs))
    }

    fn ahs(&mut self, buf: &mut BytesMut) -> Result<Option<ReadState>, ReadError> {
        let need = self.need();
        if buf.len() < need {
            return Ok(None);
        }
        self.ahs = buf[..self.ahs_len].to_vec();
        if self.header_digest {
            let want = digest(&[&self.bhs, &self.ahs]);
            let got = u32::from_le_bytes([
                buf[self.ahs_len],
                buf[self.ahs_len + 1],
                buf[self.ahs_len + 2],
                buf[self.ahs_len + 3],
            ]);
            if want != got {
                self.state = ReadState::Ready;
                return Err(ReadError::HeaderDigest);
            }
        }
        buf.advance(need);
        Ok(Some(ReadState::Data))
    }

    fn data(&mut self, buf: &mut BytesMut) -> Option<RxPdu> {
        let need = self.data_wire_len();
        if buf.len() < need {
            return None;
        }
        let padded = self.data_len + pad4(self.data_len);
        let mut ok = true;
        if self.data_digest && self.data_len > 0 {
            let want = digest(&[&buf[..padded]]);
            let got = u32::from_le_bytes([
                buf[padded],
                buf[padded + 1],
                buf[padded + 2],
                buf[padded + 3],
            ]);
            ok = want == got;
        }
        let data = buf.split_to(self.data_len).freeze();
        buf.advance(need - self.data_len);
        Some(RxPdu {
            bhs: self.bhs,
            ahs: std::mem::take(&mut self.ahs),
            data,
            data_digest_ok: ok,
            data_short: false,
        })
    }

    /// Consumes bytes from `buf`; returns a PDU once one is complete.
    pub fn poll(&mut self, buf: &mut BytesMut) -> Result<Option<RxPdu>, ReadError> {
        loop {
            let next = match self.state {
                ReadState::Ready => self.ready(buf),
                ReadState::Header => self.header(buf)?,
                ReadState::Ahs => self.ahs(buf)?,
                ReadState::Data => match self.data(buf) {
                    Some(p) => {
                        self.state = ReadState::Ready;
                        return Ok(Some(p));
                    }
                    None => None,
                },
            };
            match next {
                Some(s) => self.state = s,
                None => return Ok(None),
            }
        }
    }
}

/// Reads one PDU from `r`, buffering in `buf`.
pub async fn read_pdu<R: AsyncRead + Unpin>(
    r: &mut R,
    reader: &mut PduReader,
    buf: &mut BytesMut,
) -> Result<RxPdu, IscsiError> {
    loop {
        match reader.poll(buf) {
            Ok(Some(p)) => return Ok(p),
            Ok(None) => {}
            Err(ReadError::HeaderDigest) => return Err(IscsiError::HeaderDigest),
            Err(ReadError::TooLong { len, .. }) => {
                return Err(IscsiError::SegmentTooLong {
                    len,
                    max: reader.max_data as u32,
                })
            }
        }
        buf.reserve(reader.need().max(16 * 1024));
        if r.read_buf(buf).await? == 0 {
            return Err(IscsiError::Closed);
        }
    }
}

/// Encodes a whole PDU (header, digests, padded data) into `out`.
pub fn encode_pdu(
    out: &mut Vec<u8>,
    bhs: &[u8; BHS_LEN],
    ahs: &[u8],
    data: &[u8],
    hd: bool,
    dd: bool,
) {
    out.extend_from_slice(bhs);
    out.extend_from_slice(ahs);
    if hd {
        out.extend_from_slice(&digest(&[bhs, ahs]).to_le_bytes());
    }
    if !data.is_empty() {
        out.extend_from_slice(data);
        let pad = [0u8; 3];
        out.extend_from_slice(&pad[..pad4(data.len())]);
        if dd {
            out.extend_from_slice(&digest(&[data, &pad[..pad4(data.len())]]).to_le_bytes());
        }
    }
}

/// How iSCSI PDUs go on the wire ([`Outbox`]): StatSN is assigned as a PDU leaves the queue,
/// so it increases in wire order, and ExpCmdSN/MaxCmdSN are filled then; digests follow.
struct Frames {
    session: Arc<Session>,
    hd: bool,
    dd: bool,
}

impl Framer for Frames {
    type Pdu = TxPdu;
    /// The next StatSN.
    type Seq = u32;

    fn data_len(pdu: &TxPdu) -> usize {
        pdu.data.len()
    }

    fn frame(&self, stat_sn: &mut u32, pdus: &mut Vec<TxPdu>, wires: &mut VecDeque<Wire>) {
        // One snapshot per batch: MaxCmdSN never decreases, and every slot freed before
        // these PDUs were queued is already counted.
        let (exp, max) = self.session.window_snapshot();
        for mut p in pdus.drain(..) {
            let sn = match p.stat_sn {
                StatSn::Advance => {
                    let sn = *stat_sn;
                    *stat_sn = sn.wrapping_add(1);
                    sn
                }
                StatSn::Peek => *stat_sn,
                StatSn::Without => 0,
            };
            Bhs::new_unchecked(&mut p.bhs[..]).set_sequence(sn, exp, max);
            wires.push_back(self.wire(&p.bhs, p.data));
        }
    }

    fn sent(&self, pdus: usize) {
        self.session
            .stats
            .pdus_out
            .fetch_add(pdus as u64, Ordering::Relaxed);
    }

    fn failed(&self, e: &std::io::Error) {
        tracing::debug!(peer = %self.session.peer, error = %e, "iSCSI send failed");
    }
}

impl Frames {
    /// Header (and digest), data, padding (and digest).
    fn wire(&self, bhs: &[u8; BHS_LEN], data: TxData) -> Wire {
        let mut head = [0u8; BHS_LEN + 4];
        head[..BHS_LEN].copy_from_slice(bhs);
        let mut head_len = BHS_LEN;
        if self.hd {
            head[BHS_LEN..].copy_from_slice(&digest(&[bhs]).to_le_bytes());
            head_len += 4;
        }
        let mut tail = [0u8; 7];
        let mut tail_len = 0;
        if !data.is_empty() {
            tail_len = pad4(data.len());
            // Data in a file is sent only without DataDigest (TcpDriver::file_ranges).
            if self.dd {
                let crc = digest(&[data.as_slice(), &tail[..tail_len]]);
                tail[tail_len..tail_len + 4].copy_from_slice(&crc.to_le_bytes());
                tail_len += 4;
            }
        }
        Wire::new(&head[..head_len], data, &tail[..tail_len])
    }
}

/// The TCP implementation of [`ConnDriver`].
pub struct TcpDriver {
    out: Arc<Outbox<Frames>>,
    max_xmit: AtomicU32,
    max_burst: u32,
    max_outstanding_r2t: u32,
    next_ttt: AtomicU32,
}

impl TcpDriver {
    fn ttt(&self) -> u32 {
        loop {
            let t = self.next_ttt.fetch_add(1, Ordering::Relaxed);
            if t != RESERVED_TAG {
                return t;
            }
        }
    }

    pub fn is_closing(&self) -> bool {
        self.out.is_closing()
    }

    async fn closed(&self) {
        self.out.closed().await
    }

    /// Data-In PDUs for `len` bytes whose segments `data` gives, then the status (in the
    /// last Data-In when GOOD, else a SCSI Response).
    async fn data_in(
        &self,
        task: &Arc<Task>,
        len: usize,
        data: impl Fn(usize, usize) -> TxData + Send + Sync,
        done: Completion,
    ) -> Result<(), IscsiError> {
        let mut data_sn = 0u32;
        let bidi = task.read && task.write;
        let good = done.status == rtgt_scsi::Status::Good as u8 && done.sense.is_none() && !bidi;
        if len > 0 {
            let max = (self.max_xmit.load(Ordering::Relaxed) as usize).max(512);
            let mut off = 0usize;
            while off < len {
                let n = max.min(len - off);
                let last = off + n == len;
                let s = last && good;
                let d = DataIn {
                    final_: last,
                    status_present: s,
                    status: if s { done.status } else { 0 },
                    overflow: s && done.overflow,
                    underflow: s && done.underflow,
                    residual: if s { done.residual } else { 0 },
                    lun: task.lun_bytes,
                    itt: task.itt,
                    ttt: RESERVED_TAG,
                    data_sn,
                    buffer_offset: off as u32,
                    ..Default::default()
                };
                let sn = if s { StatSn::Advance } else { StatSn::Without };
                self.send(TxPdu::new(&BhsRepr::DataIn(d), data(off, n), sn))
                    .await?;
                data_sn = data_sn.wrapping_add(1);
                off += n;
            }
            if good {
                return Ok(());
            }
        }
        let exp_data_sn = if task.write {
            task.xfer().next_r2t_sn
        } else {
            data_sn
        };
        self.send(done.response_pdu(task.itt, exp_data_sn, usize::MAX))
            .await
    }
}

#[async_trait]
impl ConnDriver for TcpDriver {
    async fn send(&self, pdu: TxPdu) -> Result<(), IscsiError> {
        self.out.send(pdu).await.map_err(|_| IscsiError::Closed)
    }

    /// R2T / Data-Out (RFC 7143 §11.8): at most MaxOutstandingR2T bursts of at most
    /// MaxBurstLength each.
    async fn solicit(&self, _session: &Session, task: &Arc<Task>) -> Result<(), IscsiError> {
        loop {
            let mut r2ts = Vec::new();
            {
                let mut x = task.xfer();
                if x.error.is_some() {
                    return Err(IscsiError::Protocol("data-out"));
                }
                if task.is_aborted() {
                    return Err(IscsiError::Aborted);
                }
                if x.received >= task.edtl {
                    return Ok(());
                }
                while (x.r2ts.len() as u32) < self.max_outstanding_r2t && x.solicit_next < task.edtl
                {
                    let len = self.max_burst.min(task.edtl - x.solicit_next);
                    let r = R2tState {
                        ttt: self.ttt(),
                        r2t_sn: x.next_r2t_sn,
                        offset: x.solicit_next,
                        len,
                        received: 0,
                        next_data_sn: 0,
                    };
                    x.next_r2t_sn = x.next_r2t_sn.wrapping_add(1);
                    x.solicit_next += len;
                    r2ts.push(R2t {
                        lun: task.lun_bytes,
                        itt: task.itt,
                        ttt: r.ttt,
                        r2t_sn: r.r2t_sn,
                        buffer_offset: r.offset,
                        desired_len: r.len,
                        ..Default::default()
                    });
                    x.r2ts.push(r);
                }
            }
            for r in r2ts {
                self.send(TxPdu::new(&BhsRepr::R2t(r), TxData::Empty, StatSn::Peek))
                    .await?;
            }
            tokio::select! {
                _ = task.wake().notified() => {}
                _ = self.closed() => return Err(IscsiError::Closed),
            }
        }
    }

    /// Data-In PDUs of at most the initiator's MaxRecvDataSegmentLength, with the status in
    /// the last one when it is GOOD (phase collapse, §11.7.4); otherwise a SCSI Response.
    async fn complete(
        &self,
        _session: &Session,
        task: &Arc<Task>,
        data_in: Option<IoBuf>,
        done: Completion,
    ) -> Result<(), IscsiError> {
        match data_in {
            Some(buf) => {
                let buf = Arc::new(buf);
                let len = buf.len();
                let data = move |off: usize, n: usize| TxData::Buf(buf.clone(), off..off + n);
                self.data_in(task, len, data, done).await
            }
            None => self.data_in(task, 0, |_, _| TxData::Empty, done).await,
        }
    }

    /// Without DataDigest, and when Data-In PDUs may carry [`FILE_RANGE_MIN`] bytes or more
    /// (with smaller ones a `sendfile` per PDU costs more than the copy it saves).
    fn file_ranges(&self) -> bool {
        self.out.framer().session.zero_copy_reads
            && !self.out.framer().dd
            && self.max_xmit.load(Ordering::Relaxed) >= FILE_RANGE_MIN
    }

    /// Like [`TcpDriver::complete`], each Data-In's data sent with `sendfile(2)` from the
    /// range's file. The range (and with it the blocks' lock) is released when its last
    /// PDU has been written.
    async fn complete_range(
        &self,
        _session: &Session,
        task: &Arc<Task>,
        range: FileRange,
        done: Completion,
    ) -> Result<(), IscsiError> {
        if self.out.framer().dd {
            return Err(IscsiError::Protocol("data-in from a file with DataDigest"));
        }
        let len = usize::try_from(range.len()).map_err(|_| IscsiError::Protocol("data-in"))?;
        let range: Arc<dyn FileSpan> = Arc::new(range);
        let data = move |off: usize, n: usize| TxData::File {
            range: range.clone(),
            start: off as u64,
            len: n,
        };
        self.data_in(task, len, data, done).await
    }
    fn max_xmit(&self) -> u32 {
        self.max_xmit.load(Ordering::Relaxed)
    }

    fn set_max_xmit(&self, len: u32) {
        self.max_xmit.store(len, Ordering::Relaxed);
    }

    fn close(&self) {
        self.out.close();
    }
}

/// Adaptive busy polling of a connection's socket (the portal group's `BusyPollMicros`).
///
/// Waking a sleeping thread when the next command arrives costs more than the rest of a
/// 4 KiB read at queue depth 1. So once a connection's answers are all written, its reader
/// keeps trying the socket for up to the budget, yielding to the runtime's other tasks
/// between tries, while polling pays ([`PollBudget`] with a tolerance of one: a connection
/// that found nothing stops polling until it again sleeps for less than the budget, so idle
/// and slow connections cost no CPU). A connection is one initiator's stream, so its first
/// fruitless window is enough to stop; the soft-RoCE engine, which serves many, tolerates
/// more.
struct BusyPoll {
    budget: PollBudget,
}

impl BusyPoll {
    fn new(budget: Duration) -> BusyPoll {
        BusyPoll {
            budget: PollBudget::new(budget, 1),
        }
    }

    fn armed(&self) -> bool {
        self.budget.armed()
    }

    /// The reader slept for `d` before the next bytes arrived.
    fn slept(&mut self, d: Duration) {
        self.budget.resumed_after(d);
    }

    /// Tries `fd` until bytes arrive in `buf` (their count, 0 at end of stream) or the
    /// budget is spent (`WouldBlock`, and polling is disarmed).
    async fn poll(&mut self, fd: RawFd, buf: &mut BytesMut) -> std::io::Result<usize> {
        let until = std::time::Instant::now() + self.budget.window();
        loop {
            match recv_now(fd, buf) {
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) => {}
                r => return r,
            }
            if std::time::Instant::now() >= until {
                self.budget.expired();
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            tokio::task::yield_now().await;
        }
    }
}

/// One non-blocking `recv(2)` into the spare capacity of `buf` (which must have some). It
/// goes to the socket directly: tokio's readiness flag is refreshed only by its poller, and
/// tokio still finds out about the bytes this takes (a read then gets `WouldBlock`).
fn recv_now(fd: RawFd, buf: &mut BytesMut) -> std::io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    // SAFETY: the kernel writes at most `spare.len()` bytes to `spare`, memory owned by `buf`
    // and valid for writes; `fd` is the connection's open socket.
    let r = unsafe {
        libc::recv(
            fd,
            spare.as_mut_ptr().cast(),
            spare.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel initialised the first `r` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + r as usize) };
    Ok(r as usize)
}

async fn send_login<W: AsyncWrite + Unpin>(
    w: &mut W,
    r: &LoginResponse,
    data: &[u8],
) -> std::io::Result<()> {
    let mut r = r.clone();
    r.data_len = data.len() as u32;
    let bhs = BhsRepr::LoginResponse(r).to_bytes();
    let mut out = Vec::with_capacity(BHS_LEN + data.len() + 3);
    encode_pdu(&mut out, &bhs, &[], data, false, false);
    w.write_all(&out).await?;
    w.flush().await
}

/// Serves one TCP connection: login, then full feature phase until logout or loss.
pub async fn serve_connection(shared: Arc<ServerShared>, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr()) else {
        return;
    };
    match login_phase(&shared, &mut stream, peer, local).await {
        Ok(Some((session, conn_cid, stat_sn, buf))) => {
            full_feature(shared, stream, session, conn_cid, stat_sn, buf).await;
        }
        Ok(None) => {}
        Err(e) => tracing::debug!(%peer, error = %e, "iSCSI login ended"),
    }
}

type LoggedIn = (Arc<Session>, u16, u32, BytesMut);

async fn login_phase(
    shared: &Arc<ServerShared>,
    stream: &mut TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
) -> Result<Option<LoggedIn>, IscsiError> {
    let mut reader = PduReader::new(LOGIN_MAX_DATA, false, false);
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut login = Login::new(shared.login_context(local, peer, TransportKind::Tcp));
    loop {
        let pdu = tokio::time::timeout(LOGIN_PDU_TIMEOUT, read_pdu(stream, &mut reader, &mut buf))
            .await
            .map_err(|_| IscsiError::Timeout)??;
        let h = pdu.header();
        if h.opcode() != Opcode::LoginRequest {
            tracing::info!(%peer, opcode = ?h.opcode(), "non-login PDU before login completed, closing");
            return Ok(None);
        }
        let Ok(BhsRepr::LoginRequest(req)) = BhsRepr::parse(&h) else {
            return Ok(None);
        };
        match login.handle(&req, &pdu.data) {
            LoginStep::Respond(r, d) => send_login(stream, &r, &d).await?,
            LoginStep::Fail(r, d) => {
                send_login(stream, &r, &d).await?;
                let _ = stream.shutdown().await;
                return Ok(None);
            }
            LoginStep::Complete(outcome) => {
                let cid = outcome.cid;
                match shared
                    .establish(*outcome, TransportKind::Tcp, peer, local)
                    .await
                {
                    Ok(session) => {
                        let (exp, max) = session.window_snapshot();
                        let (r, d) = login.accept(session.tsih, exp, max);
                        send_login(stream, &r, &d).await?;
                        tracing::info!(
                            tsih = session.tsih,
                            initiator = %session.params.initiator_name,
                            target = %session.params.target_name,
                            %peer,
                            "iSCSI session established"
                        );
                        return Ok(Some((session, cid, login.next_stat_sn(), buf)));
                    }
                    Err(code) => {
                        let r = login.refuse(code);
                        send_login(stream, &r, &[]).await?;
                        let _ = stream.shutdown().await;
                        return Ok(None);
                    }
                }
            }
        }
    }
}

async fn full_feature(
    shared: Arc<ServerShared>,
    stream: TcpStream,
    session: Arc<Session>,
    cid: u16,
    stat_sn: u32,
    mut buf: BytesMut,
) {
    let p = &session.params;
    session.watch_peer(&stream);
    let (mut rd, wr) = stream.into_split();
    let frames = Frames {
        session: session.clone(),
        hd: p.header_digest,
        dd: p.data_digest,
    };
    let out = Arc::new(Outbox::new(frames, wr, stat_sn, TX_QUEUE));
    let driver = Arc::new(TcpDriver {
        out: out.clone(),
        max_xmit: AtomicU32::new(p.max_xmit_data_segment_length.max(512)),
        max_burst: p.max_burst_length.max(512),
        max_outstanding_r2t: p.max_outstanding_r2t.max(1),
        next_ttt: AtomicU32::new(0x1000),
    });
    let writer_task = tokio::spawn(out.run_writer());
    let conn = Conn::new(cid, session.clone(), driver.clone());
    let conn_id = shared.register_conn(conn.clone());
    let mut reader = PduReader::new(
        p.max_recv_data_segment_length as usize,
        p.header_digest,
        p.data_digest,
    );

    let interval = Duration::from_secs(session.nopin_interval as u64);
    let timeout = Duration::from_secs(session.nopin_timeout.max(1) as u64);
    let mut last_rx = Instant::now();
    let mut ping_sent: Option<Instant> = None;
    let mut ping_ttt = 0x8000_0000u32;
    let peer = session.peer;
    let due = |ping_sent: Option<Instant>, last_rx: Instant| match ping_sent {
        _ if interval.is_zero() => None,
        Some(t) => Some(t + timeout),
        None => Some(last_rx + interval),
    };
    // The timer is armed lazily: traffic only moves the due time, and a timer that fires
    // early is re-armed, so busy connections do not touch the timer wheel per PDU.
    let mut armed = due(ping_sent, last_rx);
    let mut poll = BusyPoll::new(Duration::from_micros(session.busy_poll_micros.into()));
    let timer = tokio::time::sleep_until(armed.unwrap_or_else(Instant::now));
    tokio::pin!(timer);
    let closing = session.closing();
    tokio::pin!(closing);
    let closed = driver.closed();
    tokio::pin!(closed);

    let why = 'conn: loop {
        // Handle every PDU already received, then send their responses together.
        driver.out.begin_batch();
        let mut stop = None;
        let mut got = false;
        loop {
            match reader.poll(&mut buf) {
                Ok(Some(pdu)) => {
                    got = true;
                    match conn.receive(pdu).await {
                        Ok(Flow::Continue) => {}
                        Ok(Flow::Close) => {
                            stop = Some("closed after logout or protocol error".to_string());
                            break;
                        }
                        Err(e) => {
                            stop = Some(format!("{e}"));
                            break;
                        }
                    }
                }
                Ok(None) => break,
                Err(ReadError::HeaderDigest) => {
                    stop = Some(format!("{}", IscsiError::HeaderDigest));
                    break;
                }
                Err(ReadError::TooLong { bhs, len }) => {
                    let max = reader.max_data;
                    tracing::warn!(%peer, len, max, "data segment longer than MaxRecvDataSegmentLength");
                    let _ = conn.reject(pdu::reject_reason::PROTOCOL_ERROR, &bhs).await;
                    stop = Some("oversized data segment".to_string());
                    break;
                }
            }
        }
        driver.out.end_batch();
        if got {
            last_rx = Instant::now();
            if ping_sent.is_some() && !conn.ping_outstanding() {
                ping_sent = None;
                armed = due(ping_sent, last_rx);
                if let Some(d) = armed {
                    timer.as_mut().reset(d);
                }
            }
        }
        if let Some(why) = stop {
            break why;
        }
        buf.reserve(reader.need().max(READ_CHUNK));
        if poll.armed() && driver.out.is_idle() {
            match poll.poll(rd.as_ref().as_raw_fd(), &mut buf).await {
                Ok(0) => break "closed by the initiator".to_string(),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => break format!("{}", IscsiError::from(e)),
            }
        }
        let sleep_start = Instant::now();
        tokio::select! {
            biased;
            c = &mut closing => break format!("session closing ({c:?})"),
            _ = &mut closed => break "connection closed by the target".to_string(),
            r = rd.read_buf(&mut buf) => match r {
                Ok(0) => break "closed by the initiator".to_string(),
                Ok(_) => poll.slept(sleep_start.elapsed()),
                Err(e) => break format!("{}", IscsiError::from(e)),
            },
            _ = &mut timer, if armed.is_some() => {
                let now = Instant::now();
                loop {
                    armed = due(ping_sent, last_rx);
                    match armed {
                        Some(d) if d > now => {
                            timer.as_mut().reset(d);
                            continue 'conn;
                        }
                        None => continue 'conn,
                        Some(_) => {}
                    }
                    if ping_sent.is_some() {
                        if conn.ping_outstanding() {
                            break 'conn "NOP-In ping not answered".to_string();
                        }
                        ping_sent = None;
                        continue;
                    }
                    ping_ttt = ping_ttt.wrapping_add(1).max(0x8000_0000);
                    if conn.ping(ping_ttt).await.is_err() {
                        break 'conn "connection closed".to_string();
                    }
                    ping_sent = Some(Instant::now());
                }
            }
        }
    };
    tracing::debug!(tsih = session.tsih, %peer, reason = %why, "iSCSI connection ending");
    driver.close();
    if tokio::time::timeout(Duration::from_secs(5), writer_task)
        .await
        .is_err()
    {
        tracing::warn!(tsih = session.tsih, "writer did not finish in time");
    }
    shared.unregister_conn(conn_id);
    session.end().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdu_bytes(data: &[u8], ahs: &[u8], hd: bool, dd: bool) -> Vec<u8> {
        let mut bhs = BhsRepr::NopOut(pdu::NopOut {
            itt: 7,
            ttt: RESERVED_TAG,
            ..Default::default()
        })
        .to_bytes();
        let mut h = Bhs::new_unchecked(&mut bhs[..]);
        h.set_data_segment_len(data.len() as u32);
        h.set_total_ahs_len(ahs.len());
        let mut out = Vec::new();
        encode_pdu(&mut out, &bhs, ahs, data, hd, dd);
        out
    }

    #[test]
    fn parse_whole_pdu() {
        let bytes = pdu_bytes(b"hello", &[0, 5, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0], true, true);
        let mut r = PduReader::new(8192, true, true);
        let mut buf = BytesMut::from(&bytes[..]);
        let p = r.poll(&mut buf).unwrap().unwrap();
        assert_eq!(&p.data[..], b"hello");
        assert_eq!(p.ahs.len(), 12);
        assert!(p.data_digest_ok);
        assert!(buf.is_empty());
        assert_eq!(r.state(), ReadState::Ready);
    }

    #[test]
    fn resumes_byte_by_byte() {
        let bytes = pdu_bytes(&[9u8; 1001], &[], true, true);
        let mut twice = bytes.clone();
        twice.extend_from_slice(&bytes);
        let mut r = PduReader::new(8192, true, true);
        let mut buf = BytesMut::new();
        let mut got = 0;
        for b in twice {
            buf.extend_from_slice(&[b]);
            if let Some(p) = r.poll(&mut buf).unwrap() {
                assert_eq!(p.data.len(), 1001);
                got += 1;
            }
        }
        assert_eq!(got, 2);
    }

    #[test]
    fn digest_errors() {
        let mut bytes = pdu_bytes(b"abcd", &[], true, true);
        bytes[53] ^= 1;
        let mut r = PduReader::new(8192, true, true);
        let p = r.poll(&mut BytesMut::from(&bytes[..])).unwrap().unwrap();
        assert!(!p.data_digest_ok);
        let mut bytes = pdu_bytes(b"abcd", &[], true, true);
        bytes[3] ^= 1;
        let mut r = PduReader::new(8192, true, true);
        assert_eq!(
            r.poll(&mut BytesMut::from(&bytes[..])).unwrap_err(),
            ReadError::HeaderDigest
        );
    }

    #[test]
    fn oversized_segment() {
        let bytes = pdu_bytes(&[0u8; 600], &[], false, false);
        let mut r = PduReader::new(512, false, false);
        match r.poll(&mut BytesMut::from(&bytes[..])) {
            Err(ReadError::TooLong { len, .. }) => assert_eq!(len, 600),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn digest_on_wire_is_little_endian() {
        let bytes = pdu_bytes(&[], &[], true, false);
        let d = digest(&[&bytes[..48]]);
        assert_eq!(&bytes[48..52], &d.to_le_bytes());
    }

    #[tokio::test]
    async fn busy_poll_arms_and_disarms() {
        use std::io::Write;
        use std::os::unix::net::UnixStream;
        let (a, mut b) = UnixStream::pair().unwrap();
        let fd = a.as_raw_fd();
        let mut buf = BytesMut::with_capacity(64);
        let mut p = BusyPoll::new(Duration::from_micros(200));
        assert!(p.armed());
        // Nothing arrives within the budget: WouldBlock, and polling stops.
        let e = p.poll(fd, &mut buf).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        assert!(!p.armed());
        // A long sleep keeps it off, a short one turns it back on.
        p.slept(Duration::from_millis(5));
        assert!(!p.armed());
        p.slept(Duration::from_micros(20));
        assert!(p.armed());
        b.write_all(b"hello").unwrap();
        assert_eq!(p.poll(fd, &mut buf).await.unwrap(), 5);
        assert_eq!(&buf[..], b"hello");
        assert!(p.armed());
        drop(b);
        assert_eq!(p.poll(fd, &mut buf).await.unwrap(), 0);
        // A zero budget never polls.
        let mut off = BusyPoll::new(Duration::ZERO);
        assert!(!off.armed());
        off.slept(Duration::ZERO);
        assert!(!off.armed());
    }
}
