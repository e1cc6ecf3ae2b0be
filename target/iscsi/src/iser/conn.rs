//! The iSER connection driver (RFC 7145; ib_iser's behaviour in docs/WIRE.md §6): login over
//! the RC QP, then full feature phase for [`Conn`] with data moved by RDMA.
//!
//! Every PDU is one SEND carrying the iSER header, the BHS and the data segment. Receives land
//! in a ring of posted buffers ([`Endpoint`]) sized from the queue depth; each buffer is copied
//! out and posted again at once. Target PDUs go out of a bounded set of send slots. Read data
//! is RDMA-written to the initiator's Read STag/VA ahead of the SCSI Response SEND (which
//! invalidates the STag when the CM agreed to it); write data beyond the immediate data is
//! RDMA-read from the Write STag/VA, at most [`Sizing::rdma_read_depth`] READs at a time.
//! Data moves between the backstore's pool buffers and the wire without copies when the pool
//! is registered ([`PoolMrs`]).
//!
//! The queue pair, rings, credits and data movement are the shared RDMA channel layer's
//! ([`rtgt_rdma_channel`]); this driver adds the iSER header, the login and the STag bookkeeping.
//! Two tasks serve a connection: the receiver (receive completions, login, [`Conn::receive`])
//! and the send completion poller ([`rdma::poll_send`]), which returns send slots and queue
//! credits and wakes operations waiting for their RDMA READ — so a receiver waiting for room
//! never waits on itself.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rtgt_backstore::IoBuf;
use rtgt_transport::verbs::WcStatus;
use tokio::time::Instant;

use super::header::{self, Packet, Repr, Stag, HEADERS_LEN, HEADER_LEN};
use crate::conn::{Completion, Conn, ConnDriver, Flow, RxPdu, StatSn, TxPdu};
use crate::login::{Login, LoginStep, LOGIN_MAX_DATA};
use crate::params::{SessionType, TransportKind};
use crate::pdu::{Bhs, BhsRepr, LoginResponse, Opcode, BHS_LEN};
use crate::session::{Session, Task};
use crate::shared::ServerShared;
use crate::IscsiError;
pub use rtgt_rdma_channel::mem::PoolMrs;
use rtgt_rdma_channel::{self as rdma, Remote, Rings};
pub use rtgt_rdma_channel::{poll_send, Endpoint, Hold, Link, RDMA_CHUNK, TAG_SLOT};

/// ib_iser's full-feature receive buffers hold 128 bytes after the headers
/// (ISER_RX_PAYLOAD_SIZE): every target PDU after login fits it, sense data included.
pub const INITIATOR_RX_PAYLOAD: usize = 128;
/// Receive buffers beyond the queue depth: immediate commands (NOP-Out, task management,
/// Logout) and a ping answer can arrive while the window is full.
pub const RECV_EXTRA: u32 = 16;
/// Send slots beyond the queue depth (NOP-In pings, Async Messages, Rejects).
pub const SEND_EXTRA: u32 = 16;
/// Time a login may take between two PDUs.
const LOGIN_PDU_TIMEOUT: Duration = Duration::from_secs(15);

/// How one connection's queues are sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// Commands the session may have in flight (the portal group's QueueDepth).
    pub queue_depth: u32,
    /// The largest data segment the target accepts (TargetRecvDataSegmentLength it allows).
    pub max_recv_data: u32,
    /// RDMA READs in flight (the initiator's responder resources, the CM's initiator depth).
    pub rdma_read_depth: u32,
}

impl Sizing {
    pub fn new(queue_depth: u32, max_recv_data: u32, rdma_read_depth: u32) -> Sizing {
        Sizing {
            queue_depth: queue_depth.clamp(1, 4096),
            max_recv_data: max_recv_data.clamp(LOGIN_MAX_DATA as u32, 1 << 20),
            rdma_read_depth: rdma_read_depth.clamp(1, 128),
        }
    }

    pub fn recv_slots(&self) -> u32 {
        self.queue_depth + RECV_EXTRA
    }

    /// Bytes of one receive buffer: headers plus the largest data segment.
    pub fn recv_slot_len(&self) -> usize {
        HEADERS_LEN + self.max_recv_data as usize
    }

    pub fn send_slots(&self) -> u32 {
        self.queue_depth + SEND_EXTRA
    }

    /// Send work requests: the slots' SENDs plus RDMA WRITEs and READs of the commands.
    pub fn send_queue(&self) -> u32 {
        self.send_slots() + 2 * self.queue_depth + self.rdma_read_depth
    }

    /// The RDMA channel's rings for these sizes.
    pub fn rings(&self) -> Rings {
        Rings {
            recv_slots: self.recv_slots(),
            recv_slot_len: self.recv_slot_len(),
            send_slots: self.send_slots(),
            send_slot_len: HEADERS_LEN + LOGIN_MAX_DATA,
            send_queue: self.send_queue(),
            rdma_read_depth: self.rdma_read_depth,
        }
    }
}

impl From<Sizing> for Rings {
    fn from(s: Sizing) -> Rings {
        s.rings()
    }
}

/// What the CM agreed for a connection.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub local: SocketAddr,
    pub peer: SocketAddr,
    /// SCSI Responses may invalidate the initiator's STag (no ISER_SEND_W_INV_NOT_SUP).
    pub send_with_invalidate: bool,
}

/// Counters of live iSER connections (for the daemon's leak checks).
#[derive(Debug, Default)]
pub struct IserStats {
    pub connections: AtomicUsize,
    pub accepted: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Per-command STags from the iSER header, kept until the response.
#[derive(Debug, Clone, Copy, Default)]
struct CmdStags {
    read: Option<Stag>,
    write: Option<Stag>,
    /// Data moved by RDMA against one of them (the response may invalidate it).
    rdma_done: bool,
}

/// The iSER implementation of [`ConnDriver`].
pub struct IserDriver {
    link: Arc<Link>,
    stat_sn: Mutex<u32>,
    stags: Mutex<HashMap<u32, CmdStags>>,
    max_xmit: AtomicU32,
    send_inv: bool,
    session: Arc<Session>,
}

impl IserDriver {
    fn stags(&self) -> MutexGuard<'_, HashMap<u32, CmdStags>> {
        lock(&self.stags)
    }

    async fn send_with(&self, pdu: TxPdu, invalidate: Option<u32>) -> Result<(), IscsiError> {
        let slot = self.link.reserve().await?;
        let mut bhs = pdu.bhs;
        // StatSN is assigned and the SEND posted under one lock: StatSN order is wire order.
        let mut sn = lock(&self.stat_sn);
        let (exp, max) = self.session.window_snapshot();
        let v = match pdu.stat_sn {
            StatSn::Advance => {
                let v = *sn;
                *sn = v.wrapping_add(1);
                v
            }
            StatSn::Peek => *sn,
            StatSn::Without => 0,
        };
        Bhs::new_unchecked(&mut bhs[..]).set_sequence(v, exp, max);
        let r = self
            .link
            .post_pdu(slot, &bhs, pdu.data.as_slice(), invalidate);
        drop(sn);
        if r.is_ok() {
            self.session.stats.pdus_out.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// RDMA WRITE of `buf` to the initiator's read buffer.
    async fn write_data(&self, buf: IoBuf, to: Stag) -> Result<(), IscsiError> {
        let len = buf.len() as u32;
        let to = Remote {
            addr: to.va,
            rkey: to.stag,
            len,
        };
        self.link.rdma_write(buf, &[to]).await?;
        Ok(())
    }
}

#[async_trait]
impl ConnDriver for IserDriver {
    async fn send(&self, pdu: TxPdu) -> Result<(), IscsiError> {
        self.send_with(pdu, None).await
    }

    /// RDMA READ of the rest of the write (RFC 7145 §7.3.6): from Write STag/VA, whose VA
    /// already points past the unsolicited data (as ib_iser sets it, docs/WIRE.md §6), into
    /// the task's buffer.
    async fn solicit(&self, _session: &Session, task: &Arc<Task>) -> Result<(), IscsiError> {
        let Some(from) = self.stags().get(&task.itt).and_then(|s| s.write) else {
            tracing::warn!(itt = task.itt, peer = %self.link.peer, "write needs data but carries no Write STag");
            return Err(IscsiError::Protocol("no Write STag"));
        };
        let start = task.xfer().received;
        let end = task.edtl;
        let Some(buf) = task.xfer().buf.take() else {
            return Err(IscsiError::Protocol("data-out buffer"));
        };
        let from = Remote {
            addr: from.va,
            rkey: from.stag,
            len: end.saturating_sub(start),
        };
        let buf = self.link.rdma_read(buf, start as usize, &[from]).await?;
        task.xfer().buf = Some(buf);
        task.xfer().received = end;
        if let Some(s) = self.stags().get_mut(&task.itt) {
            s.rdma_done = true;
        }
        self.session
            .stats
            .bytes_in
            .fetch_add((end - start) as u64, Ordering::Relaxed);
        Ok(())
    }

    /// RDMA WRITE of the read data, then the SCSI Response SEND (RFC 7145 §7.3.5).
    async fn complete(
        &self,
        _session: &Session,
        task: &Arc<Task>,
        data_in: Option<IoBuf>,
        mut done: Completion,
    ) -> Result<(), IscsiError> {
        let st = self.stags().remove(&task.itt).unwrap_or_default();
        let bidi = task.read && task.write;
        let mut invalidate = None;
        if let Some(buf) = data_in {
            match st.read {
                Some(to) => {
                    self.write_data(buf, to).await?;
                    invalidate = Some(to.stag);
                }
                None => {
                    // A read without a Read STag has nowhere to go: report it undelivered.
                    tracing::warn!(itt = task.itt, peer = %self.link.peer, "read data without a Read STag dropped");
                    let n = buf.len() as u32;
                    if bidi {
                        done.bidi_underflow = true;
                        done.bidi_residual = done.bidi_residual.saturating_add(n);
                    } else {
                        done.underflow = true;
                        done.overflow = false;
                        done.residual = task.edtl;
                    }
                }
            }
        } else if st.rdma_done {
            invalidate = st.write.map(|w| w.stag);
        }
        if !self.send_inv || bidi {
            invalidate = None;
        }
        // SenseLength (2 bytes) and the sense must fit the initiator's 128-byte receive
        // buffer; fixed-format sense is 18 bytes, longer descriptor sense is cut.
        let pdu = done.response_pdu(task.itt, 0, INITIATOR_RX_PAYLOAD - 2);
        self.send_with(pdu, invalidate).await
    }

    fn max_xmit(&self) -> u32 {
        self.max_xmit.load(Ordering::Relaxed)
    }

    fn set_max_xmit(&self, len: u32) {
        // The initiator's receive buffers do not grow with a declaration (ib_iser).
        let cap = self.max_xmit.load(Ordering::Relaxed);
        self.max_xmit.store(len.min(cap), Ordering::Relaxed);
    }

    /// Closes once what is already posted (a Logout Response) has gone out.
    fn close(&self) {
        let link = self.link.clone();
        tokio::spawn(async move {
            link.wait_sent().await;
            link.close();
        });
    }
}

/// A received SEND, split ([`split`]).
#[derive(Debug)]
pub enum Received {
    /// An iSCSI PDU. When the message ended before the data segment (or AHS) its BHS
    /// announced, the PDU has [`RxPdu::data_short`] set and no data: the connection rejects it
    /// and goes on ([`split`]).
    Pdu(Stags, RxPdu),
    /// An iSER Hello (answered with a rejecting HelloReply).
    Hello,
    /// Not a valid iSER message (no whole BHS, unknown iSER opcode): the connection ends.
    Bad(&'static str),
}

/// The STags of a received control PDU, and the STag its SEND invalidated (a SCSI Response
/// sent with Invalidate, as the initiator sees it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stags {
    pub read: Option<Stag>,
    pub write: Option<Stag>,
    pub invalidated: Option<u32>,
}

/// Splits one received message into the iSER header and the iSCSI PDU (header, AHS, data
/// segment; no padding or digests on iSER).
///
/// RFC 7145 §7.3.1 puts a command's immediate data in its SEND. A message whose data segment
/// is shorter than its DataSegmentLength is taken as follows (docs/WIRE.md §6):
/// - a SCSI write command whose SEND holds none of its announced immediate data but carries a
///   Write STag is delivered as a command without immediate data (DataSegmentLength 0): the
///   target then RDMA-reads the whole write from the Write STag/VA (§7.3.6), which is where
///   such an initiator left the data;
/// - any other (some of the data, no Write STag, another opcode, an AHS cut short) is
///   delivered with [`RxPdu::data_short`] set and no data, and is rejected with reason
///   Protocol Error (RFC 7143 §11.17.1).
pub fn split(msg: &[u8]) -> Received {
    split_owned(Bytes::copy_from_slice(msg))
}

/// [`split`] of a message already copied out of its receive buffer: the data segment is a
/// slice of it, not another copy.
fn split_owned(msg: Bytes) -> Received {
    let Ok(p) = Packet::new_checked(&msg[..]) else {
        return Received::Bad("message shorter than the iSER header");
    };
    let repr = match Repr::parse(&p) {
        Ok(r) => r,
        Err(_) => return Received::Bad("unknown iSER opcode or flags"),
    };
    let (write, read) = match repr {
        Repr::Control { write, read } => (write, read),
        Repr::Hello { .. } => return Received::Hello,
        Repr::HelloReply { .. } => return Received::Bad("iSER HelloReply from the initiator"),
    };
    let stags = Stags {
        read,
        write,
        invalidated: None,
    };
    let rest = &msg[HEADER_LEN..];
    if rest.len() < BHS_LEN {
        return Received::Bad("message shorter than the BHS");
    }
    let mut bhs = [0u8; BHS_LEN];
    bhs.copy_from_slice(&rest[..BHS_LEN]);
    let h = Bhs::new_unchecked(&bhs[..]);
    let ahs_len = h.total_ahs_len();
    let dlen = h.data_segment_len() as usize;
    let body = &rest[BHS_LEN..];
    if body.len() >= ahs_len + dlen {
        let ahs = body[..ahs_len].to_vec();
        let start = HEADERS_LEN + ahs_len;
        return Received::Pdu(
            stags,
            RxPdu {
                bhs,
                ahs,
                data: msg.slice(start..start + dlen),
                data_digest_ok: true,
                data_short: false,
            },
        );
    }
    // The message ends before the data segment (or the AHS) it announces.
    let ahs_whole = body.len() >= ahs_len;
    let immediate_by_rdma = ahs_whole
        && body.len() == ahs_len
        && write.is_some()
        && matches!(
            BhsRepr::parse(&h),
            Ok(BhsRepr::ScsiCommand(c)) if c.write && dlen as u64 <= c.edtl as u64
        );
    let ahs = if ahs_whole {
        body[..ahs_len].to_vec()
    } else {
        Vec::new()
    };
    if immediate_by_rdma {
        tracing::debug!(
            itt = h.itt(),
            announced = dlen,
            "immediate data not in the SEND: read by RDMA from the Write STag"
        );
        Bhs::new_unchecked(&mut bhs[..]).set_data_segment_len(0);
        return Received::Pdu(
            stags,
            RxPdu {
                bhs,
                ahs,
                data: Bytes::new(),
                data_digest_ok: true,
                data_short: false,
            },
        );
    }
    Received::Pdu(
        stags,
        RxPdu {
            bhs,
            ahs,
            data: Bytes::new(),
            data_digest_ok: true,
            data_short: true,
        },
    )
}

/// The receive ring, with each message split into its iSER header and iSCSI PDU.
pub struct Receiver {
    ring: rdma::Receiver,
    raw: Vec<rdma::RxEvent>,
}

/// A receive event of an iSER connection.
pub enum RxEvent {
    Msg(Received),
    /// The QP failed or was flushed.
    Failed(WcStatus),
}

impl Receiver {
    pub fn new(ep: Endpoint) -> Receiver {
        Receiver {
            ring: rdma::Receiver::new(ep),
            raw: Vec::new(),
        }
    }

    /// Takes waiting messages (the ring's buffers are posted again at once).
    pub fn take(&mut self, out: &mut Vec<RxEvent>) {
        self.ring.take(&mut self.raw);
        out.extend(self.raw.drain(..).map(|e| match e {
            rdma::RxEvent::Msg(m, invalidated) => RxEvent::Msg(match split_owned(m) {
                Received::Pdu(st, p) => Received::Pdu(Stags { invalidated, ..st }, p),
                r => r,
            }),
            rdma::RxEvent::Failed(s) => RxEvent::Failed(s),
        }));
    }

    pub async fn wait(&self) {
        self.ring.wait().await
    }
}

/// The control PDUs of iSER on a [`Link`]'s send slots.
pub trait IserLink {
    /// Writes an iSER header, BHS, AHS and data segment into `slot` and posts its SEND.
    fn post_message(
        &self,
        slot: u32,
        iser: &[u8; HEADER_LEN],
        bhs: &[u8; BHS_LEN],
        ahs: &[u8],
        data: &[u8],
        invalidate: Option<u32>,
    ) -> Result<(), IscsiError>;

    /// A PDU behind a plain control header.
    fn post_pdu(
        &self,
        slot: u32,
        bhs: &[u8; BHS_LEN],
        data: &[u8],
        invalidate: Option<u32>,
    ) -> Result<(), IscsiError> {
        let iser = Repr::control().to_bytes();
        self.post_message(slot, &iser, bhs, &[], data, invalidate)
    }
}

impl IserLink for Link {
    fn post_message(
        &self,
        slot: u32,
        iser: &[u8; HEADER_LEN],
        bhs: &[u8; BHS_LEN],
        ahs: &[u8],
        data: &[u8],
        invalidate: Option<u32>,
    ) -> Result<(), IscsiError> {
        Ok(self.post_slot(slot, &[iser, bhs, ahs, data], invalidate)?)
    }
}

/// Serves one connected iSER QP: login, then full feature phase until logout or loss.
/// Returns once every resource of the connection is released (the QP is then in the error
/// state, ready to be dropped after the CM's disconnect).
pub async fn serve(
    shared: Arc<ServerShared>,
    ep: Endpoint,
    peer: Peer,
    pool_mrs: Option<Arc<PoolMrs>>,
    stats: Arc<IserStats>,
) {
    serve_until(
        shared,
        ep,
        peer,
        pool_mrs,
        stats,
        Box::pin(std::future::pending()),
    )
    .await
}

/// [`serve`], ending the connection when `gone` resolves (the CM saw a DREQ or the peer
/// vanished).
pub async fn serve_until(
    shared: Arc<ServerShared>,
    ep: Endpoint,
    peer: Peer,
    pool_mrs: Option<Arc<PoolMrs>>,
    stats: Arc<IserStats>,
    gone: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
) {
    stats.connections.fetch_add(1, Ordering::AcqRel);
    stats.accepted.fetch_add(1, Ordering::Relaxed);
    let link = match Link::new(&ep, peer.peer, pool_mrs) {
        Ok(l) => Arc::new(l),
        Err(e) => {
            tracing::warn!(peer = %peer.peer, error = %e, "iSER connection setup failed");
            stats.connections.fetch_sub(1, Ordering::AcqRel);
            return;
        }
    };
    let poller = tokio::spawn(poll_send(link.clone(), ep.send_cq().clone()));
    let l = link.clone();
    let watcher = tokio::spawn(async move {
        gone.await;
        tracing::debug!(peer = %l.peer, "iSER connection gone (CM)");
        l.close();
    });
    let mut rx = Receiver::new(ep);
    match login_phase(&shared, &link, &mut rx, &peer).await {
        Ok(Some((session, cid, stat_sn))) => {
            full_feature(&shared, &link, &mut rx, session, cid, stat_sn, &peer).await;
        }
        Ok(None) => {}
        Err(e) => tracing::debug!(peer = %peer.peer, error = %e, "iSER login ended"),
    }
    link.close();
    watcher.abort();
    let _ = poller.await;
    stats.connections.fetch_sub(1, Ordering::AcqRel);
}

type LoggedIn = (Arc<Session>, u16, u32);

/// Posts a login response on its own (no session yet: StatSN is the login's).
async fn send_login(link: &Link, r: &LoginResponse, data: &[u8]) -> Result<(), IscsiError> {
    let mut r = r.clone();
    r.data_len = data.len() as u32;
    let bhs = BhsRepr::LoginResponse(r).to_bytes();
    let slot = link.reserve().await?;
    link.post_pdu(slot, &bhs, data, None)
}

pub async fn next_event(
    link: &Link,
    rx: &mut Receiver,
    queue: &mut Vec<RxEvent>,
) -> Result<RxEvent, IscsiError> {
    loop {
        if !queue.is_empty() {
            return Ok(queue.remove(0));
        }
        rx.take(queue);
        if !queue.is_empty() {
            continue;
        }
        tokio::select! {
            _ = rx.wait() => {}
            _ = link.closed() => return Err(IscsiError::Closed),
        }
    }
}

/// Answers an iSER Hello: this target does not take part in the Hello exchange (Linux never
/// sends one); a HelloReply with the reject flag tells the initiator before the connection
/// closes.
async fn refuse_hello(link: &Link) {
    tracing::warn!(peer = %link.peer, "iSER Hello received; answering with a rejecting HelloReply");
    let reply = Repr::HelloReply {
        reject: true,
        max_ver: header::ISER_VERSION,
        cur_ver: header::ISER_VERSION,
        ord: 0,
    }
    .to_bytes();
    let _ = link.send(&[&reply], None).await;
}

async fn login_phase(
    shared: &Arc<ServerShared>,
    link: &Arc<Link>,
    rx: &mut Receiver,
    peer: &Peer,
) -> Result<Option<LoggedIn>, IscsiError> {
    let mut login = Login::new(shared.login_context(peer.local, peer.peer, TransportKind::Iser));
    let mut queue = Vec::new();
    loop {
        let ev = tokio::time::timeout(LOGIN_PDU_TIMEOUT, next_event(link, rx, &mut queue))
            .await
            .map_err(|_| IscsiError::Timeout)??;
        let pdu = match ev {
            RxEvent::Failed(s) => {
                tracing::debug!(peer = %peer.peer, status = ?s, "iSER QP failed during login");
                return Ok(None);
            }
            RxEvent::Msg(Received::Bad(why)) => {
                tracing::warn!(peer = %peer.peer, reason = why, "malformed iSER message during login, closing");
                return Ok(None);
            }
            RxEvent::Msg(Received::Hello) => {
                refuse_hello(link).await;
                return Ok(None);
            }
            RxEvent::Msg(Received::Pdu(_, p)) if p.data_short => {
                tracing::warn!(peer = %peer.peer, "login PDU without its data segment, closing");
                return Ok(None);
            }
            RxEvent::Msg(Received::Pdu(_, p)) => p,
        };
        let h = pdu.header();
        if h.opcode() != Opcode::LoginRequest {
            tracing::info!(peer = %peer.peer, opcode = ?h.opcode(), "non-login PDU before login completed, closing");
            return Ok(None);
        }
        let Ok(BhsRepr::LoginRequest(req)) = BhsRepr::parse(&h) else {
            return Ok(None);
        };
        match login.handle(&req, &pdu.data) {
            LoginStep::Respond(r, d) => send_login(link, &r, &d).await?,
            LoginStep::Fail(r, d) => {
                send_login(link, &r, &d).await?;
                link.wait_sent().await;
                return Ok(None);
            }
            LoginStep::Complete(outcome) => {
                let cid = outcome.cid;
                match shared
                    .establish(*outcome, TransportKind::Iser, peer.peer, peer.local)
                    .await
                {
                    Ok(session) => {
                        let (exp, max) = session.window_snapshot();
                        let (r, d) = login.accept(session.tsih, exp, max);
                        send_login(link, &r, &d).await?;
                        tracing::info!(
                            tsih = session.tsih,
                            initiator = %session.params.initiator_name,
                            target = %session.params.target_name,
                            peer = %peer.peer,
                            "iSER session established"
                        );
                        return Ok(Some((session, cid, login.next_stat_sn())));
                    }
                    Err(code) => {
                        let r = login.refuse(code);
                        send_login(link, &r, &[]).await?;
                        link.wait_sent().await;
                        return Ok(None);
                    }
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn full_feature(
    shared: &Arc<ServerShared>,
    link: &Arc<Link>,
    rx: &mut Receiver,
    session: Arc<Session>,
    cid: u16,
    stat_sn: u32,
    peer: &Peer,
) {
    let p = &session.params;
    // Normal sessions: ib_iser's 128-byte receive buffers; discovery keeps the login buffer.
    let max_xmit = match session.session_type {
        SessionType::Normal => INITIATOR_RX_PAYLOAD as u32,
        SessionType::Discovery => p
            .max_xmit_data_segment_length
            .clamp(512, LOGIN_MAX_DATA as u32),
    };
    let driver = Arc::new(IserDriver {
        link: link.clone(),
        stat_sn: Mutex::new(stat_sn),
        stags: Mutex::new(HashMap::new()),
        max_xmit: AtomicU32::new(max_xmit),
        send_inv: peer.send_with_invalidate,
        session: session.clone(),
    });
    // A failed queue pair fails every outstanding task of the session (ErrorRecoveryLevel 0:
    // the connection is the session) into its task set at once.
    let s = session.clone();
    link.on_close(move || {
        s.tasks().abort_all();
    });
    let conn = Conn::new(cid, session.clone(), driver.clone());
    let conn_id = shared.register_conn(conn.clone());
    let interval = Duration::from_secs(session.nopin_interval as u64);
    let timeout = Duration::from_secs(session.nopin_timeout.max(1) as u64);
    let mut last_rx = Instant::now();
    let mut ping_sent: Option<Instant> = None;
    let mut ping_ttt = 0x8000_0000u32;
    let closing = session.closing();
    tokio::pin!(closing);
    let mut queue = Vec::new();
    let why = 'conn: loop {
        rx.take(&mut queue);
        if !queue.is_empty() {
            last_rx = Instant::now();
        }
        // The responses of this batch go out together, after its read data.
        let batch = link.batch_sends();
        for ev in queue.drain(..) {
            let (st, pdu) = match ev {
                RxEvent::Failed(s) => break 'conn format!("QP failed ({s:?})"),
                RxEvent::Msg(Received::Bad(why)) => {
                    tracing::warn!(peer = %peer.peer, reason = why, "malformed iSER message");
                    break 'conn format!("malformed iSER message: {why}");
                }
                RxEvent::Msg(Received::Hello) => {
                    refuse_hello(link).await;
                    break 'conn "iSER Hello in full feature phase".to_string();
                }
                RxEvent::Msg(Received::Pdu(st, p)) => (st, p),
            };
            if pdu.header().opcode() == Opcode::ScsiCommand && !pdu.data_short {
                let itt = pdu.header().itt();
                let mut m = driver.stags();
                // Bounded: an ITT is reused only after its command ended.
                if m.len() >= 4 * session.queue_depth as usize + 64 {
                    let live: Vec<u32> = m
                        .keys()
                        .copied()
                        .filter(|i| session.task(*i).is_none())
                        .collect();
                    for i in live {
                        m.remove(&i);
                    }
                }
                m.insert(
                    itt,
                    CmdStags {
                        read: st.read,
                        write: st.write,
                        rdma_done: false,
                    },
                );
            }
            if ping_sent.is_some() {
                // Any PDU shows the initiator is alive; the ping's own answer clears it.
                if !conn.ping_outstanding() {
                    ping_sent = None;
                }
            }
            match conn.receive(pdu).await {
                Ok(Flow::Continue) => {}
                Ok(Flow::Close) => break 'conn "closed after logout or protocol error".to_string(),
                Err(e) => break 'conn format!("{e}"),
            }
        }
        drop(batch);
        if ping_sent.is_some() && !conn.ping_outstanding() {
            ping_sent = None;
        }
        let due = match ping_sent {
            _ if interval.is_zero() => None,
            Some(t) => Some(t + timeout),
            None => Some(last_rx + interval),
        };
        let sleep = async {
            match due {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            c = &mut closing => break format!("session closing ({c:?})"),
            _ = link.closed() => break "connection closed by the target".to_string(),
            _ = rx.wait() => {}
            _ = sleep => {
                if ping_sent.is_some() {
                    if conn.ping_outstanding() {
                        break "NOP-In ping not answered".to_string();
                    }
                    ping_sent = None;
                } else {
                    ping_ttt = ping_ttt.wrapping_add(1).max(0x8000_0000);
                    if conn.ping(ping_ttt).await.is_err() {
                        break "connection closed".to_string();
                    }
                    ping_sent = Some(Instant::now());
                }
            }
        }
    };
    tracing::debug!(tsih = session.tsih, peer = %peer.peer, reason = %why, "iSER connection ending");
    // A Logout Response (or Reject) already posted goes out before the QP is closed.
    link.wait_sent().await;
    link.close();
    shared.unregister_conn(conn_id);
    session.end().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu;

    fn msg(iser: &[u8; HEADER_LEN], bhs: &[u8; BHS_LEN], data: &[u8]) -> Vec<u8> {
        let mut v = iser.to_vec();
        v.extend_from_slice(bhs);
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn split_control_pdu() {
        let iser = Repr::Control {
            write: Some(Stag {
                stag: 9,
                va: 0x2000,
            }),
            read: None,
        }
        .to_bytes();
        let mut bhs = BhsRepr::NopOut(pdu::NopOut {
            itt: 3,
            ..Default::default()
        })
        .to_bytes();
        Bhs::new_unchecked(&mut bhs[..]).set_data_segment_len(5);
        match split(&msg(&iser, &bhs, b"hello")) {
            Received::Pdu(st, p) => {
                assert_eq!(
                    st.write,
                    Some(Stag {
                        stag: 9,
                        va: 0x2000
                    })
                );
                assert_eq!(&p.data[..], b"hello");
                assert_eq!(p.header().itt(), 3);
            }
            _ => panic!("not split"),
        }
    }

    /// A message split into a PDU; panics on anything else.
    fn pdu_of(m: &[u8]) -> (Stags, RxPdu) {
        match split(m) {
            Received::Pdu(st, p) => (st, p),
            other => panic!("not a PDU: {other:?}"),
        }
    }

    fn write_cmd(edtl: u32, dlen: u32, read: bool) -> [u8; BHS_LEN] {
        let mut bhs = BhsRepr::ScsiCommand(pdu::ScsiCommand {
            final_: true,
            write: true,
            read,
            attr: 1,
            itt: 0x11,
            edtl,
            cmd_sn: 4,
            cdb: [0x8a; 16],
            ..Default::default()
        })
        .to_bytes();
        Bhs::new_unchecked(&mut bhs[..]).set_data_segment_len(dlen);
        bhs
    }

    const WRITE_STAG: Stag = Stag {
        stag: 0x77,
        va: 0x1000,
    };

    #[test]
    fn split_write_without_its_immediate_data_reads_it_by_rdma() {
        // DataSegmentLength announces 4096 bytes the SEND does not hold, and a Write STag is
        // there: a command without immediate data, the whole write read from the STag.
        let iser = Repr::Control {
            write: Some(WRITE_STAG),
            read: None,
        }
        .to_bytes();
        for (edtl, dlen) in [(4096, 4096), (65536, 8192)] {
            let (st, p) = pdu_of(&msg(&iser, &write_cmd(edtl, dlen, false), &[]));
            assert!(!p.data_short);
            assert!(p.data.is_empty());
            assert_eq!(p.header().data_segment_len(), 0);
            assert_eq!(st.write, Some(WRITE_STAG));
            let Ok(BhsRepr::ScsiCommand(c)) = BhsRepr::parse(&p.header()) else {
                panic!("not a SCSI Command");
            };
            assert_eq!((c.itt, c.edtl, c.write, c.final_), (0x11, edtl, true, true));
        }
        // With the data in the SEND nothing changes.
        let data = vec![0x5a; 512];
        let (_, p) = pdu_of(&msg(&iser, &write_cmd(4096, 512, false), &data));
        assert!(!p.data_short);
        assert_eq!(&p.data[..], &data[..]);
        assert_eq!(p.header().data_segment_len(), 512);
    }

    #[test]
    fn split_inconsistent_data_is_marked_short() {
        let with_stag = Repr::Control {
            write: Some(WRITE_STAG),
            read: None,
        }
        .to_bytes();
        let plain = Repr::control().to_bytes();
        let short = |m: Vec<u8>| {
            let (_, p) = pdu_of(&m);
            assert!(p.data_short, "not marked short");
            assert!(p.data.is_empty());
            p
        };
        // No Write STag to read the data from.
        let p = short(msg(&plain, &write_cmd(4096, 4096, false), &[]));
        assert_eq!(
            p.header().data_segment_len(),
            4096,
            "BHS kept for the Reject"
        );
        assert_eq!(p.header().itt(), 0x11);
        // Part of the data in the SEND: where the rest starts is unknown.
        short(msg(&with_stag, &write_cmd(4096, 4096, false), &[1; 100]));
        // More immediate data than the command transfers.
        short(msg(&with_stag, &write_cmd(4096, 8192, false), &[]));
        // A bidirectional command with only its Read STag.
        let read_only = Repr::Control {
            write: None,
            read: Some(WRITE_STAG),
        }
        .to_bytes();
        short(msg(&read_only, &write_cmd(4096, 4096, true), &[]));
        // Other opcodes.
        let mut nop = BhsRepr::NopOut(pdu::NopOut {
            immediate: true,
            itt: 3,
            ttt: crate::pdu::RESERVED_TAG,
            ..Default::default()
        })
        .to_bytes();
        Bhs::new_unchecked(&mut nop[..]).set_data_segment_len(100);
        short(msg(&plain, &nop, b"short"));
        short(msg(&with_stag, &nop, &[]));
        let mut data_out = BhsRepr::DataOut(pdu::DataOut {
            final_: true,
            itt: 0x11,
            ttt: crate::pdu::RESERVED_TAG,
            ..Default::default()
        })
        .to_bytes();
        Bhs::new_unchecked(&mut data_out[..]).set_data_segment_len(8192);
        short(msg(&plain, &data_out, &[]));
        // An AHS cut short.
        let mut cmd = write_cmd(4096, 0, false);
        Bhs::new_unchecked(&mut cmd[..]).set_total_ahs_len(20);
        let p = short(msg(&with_stag, &cmd, &[0; 8]));
        assert!(p.ahs.is_empty());
    }

    #[test]
    fn split_rejects_bad_messages() {
        let iser = Repr::control().to_bytes();
        assert!(matches!(
            split(&msg(&iser, &[0; BHS_LEN], &[])[..HEADERS_LEN - 1]),
            Received::Bad(_)
        ));
        assert!(matches!(split(&iser[..20]), Received::Bad(_)));
        let mut bad = iser;
        bad[0] = 0x70;
        assert!(matches!(
            split(&msg(&bad, &[0; BHS_LEN], &[])),
            Received::Bad(_)
        ));
        let hello = Repr::Hello {
            max_ver: 1,
            min_ver: 1,
            ird: 4,
        }
        .to_bytes();
        assert!(matches!(split(&hello), Received::Hello));
    }

    #[test]
    fn sizing_bounds() {
        let s = Sizing::new(128, 8192, 16);
        assert_eq!(s.recv_slots(), 128 + RECV_EXTRA);
        assert_eq!(s.recv_slot_len(), 76 + 8192);
        assert!(s.send_queue() > s.send_slots());
        let s = Sizing::new(0, 0, 0);
        assert_eq!(
            (s.queue_depth, s.max_recv_data, s.rdma_read_depth),
            (1, 8192, 1)
        );
    }
}
