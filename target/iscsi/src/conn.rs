//! Full feature phase on one connection (RFC 7143 §4, §11), independent of the transport.
//!
//! A connection driver (TCP in [`super::conn_tcp`], iSER in [`crate::iser::conn`]) reads
//! PDUs and hands them to [`Conn::receive`]; everything it must do differently per transport
//! sits behind [`ConnDriver`]: queueing PDUs for transmission, obtaining solicited write data
//! (R2T and Data-Out on TCP, RDMA READ on iSER) and delivering read data with the status
//! (Data-In on TCP, RDMA WRITE on iSER).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use rtgt_backstore::{FileSpan, IoBuf};

use rtgt_scsi::sense;
use rtgt_scsi::task::{Outcome, Refused, Stage, Turn};
use rtgt_scsi::{Command, FileRange, Status, TaskAttr};

pub use super::pdu::RxPdu;
use super::pdu::{
    self, reject_reason, Ahs, Bhs, BhsRepr, DataOut, LogoutRequest, LogoutResponse, NopIn, NopOut,
    Opcode, ScsiCommand, ScsiResponse, TaskMgmtRequest, TaskMgmtResponse, TextRequest,
    TextResponse, BHS_LEN, RESERVED_TAG,
};
use super::session::{CloseReason, Session, SnCheck, Task, TaskHeader};
use super::text::{TextAssembler, TextPairs, TextSplitter};
use super::IscsiError;

/// Smallest read sent from a file ([`ConnDriver::complete_range`]): below it one copy into a
/// buffer and the batched write of the responses cost less than a `sendfile` per PDU.
pub const FILE_RANGE_MIN: u32 = 64 << 10;
/// Largest write buffer one command may ask for; bigger writes end with CHECK CONDITION.
pub const MAX_COMMAND_BYTES: u32 = 64 << 20;
/// Bound on a Text request collected over continuation PDUs.
const MAX_TEXT_BYTES: usize = 64 * 1024;

/// How the driver fills StatSN when it transmits a PDU (RFC 7143 §4.2.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatSn {
    /// Takes the next StatSN and advances it (responses).
    Advance,
    /// Carries the next StatSN without advancing (R2T, NOP-In pings).
    Peek,
    /// No StatSN (Data-In without status); ExpCmdSN/MaxCmdSN are still filled.
    Without,
}

pub use rtgt_tcp_channel::TxData;

/// A target PDU waiting for transmission.
#[derive(Debug)]
pub struct TxPdu {
    pub bhs: [u8; BHS_LEN],
    pub data: TxData,
    pub stat_sn: StatSn,
}

impl TxPdu {
    pub fn new(repr: &BhsRepr, data: TxData, stat_sn: StatSn) -> TxPdu {
        let mut bhs = repr.to_bytes();
        Bhs::new_unchecked(&mut bhs[..]).set_data_segment_len(data.len() as u32);
        TxPdu { bhs, data, stat_sn }
    }
}

/// Status of a finished command for the driver to deliver.
#[derive(Debug, Clone, Default)]
pub struct Completion {
    pub status: u8,
    /// Sense data (SPC-4 4.5); sent with the 2-byte SenseLength prefix (§11.4.7).
    pub sense: Option<Vec<u8>>,
    pub overflow: bool,
    pub underflow: bool,
    pub residual: u32,
    pub bidi_overflow: bool,
    pub bidi_underflow: bool,
    pub bidi_residual: u32,
}

impl Completion {
    /// The SCSI Response PDU for `itt` (RFC 7143 §11.4), the sense cut to `max_sense` bytes
    /// (SPC-4 4.5.1 allows truncation).
    pub fn response_pdu(&self, itt: u32, exp_data_sn: u32, max_sense: usize) -> TxPdu {
        let data = match &self.sense {
            Some(sense) => {
                let n = sense.len().min(max_sense);
                let mut v = Vec::with_capacity(2 + n);
                v.extend_from_slice(&(n as u16).to_be_bytes());
                v.extend_from_slice(&sense[..n]);
                TxData::Bytes(v.into())
            }
            None => TxData::Empty,
        };
        let r = ScsiResponse {
            bidi_overflow: self.bidi_overflow,
            bidi_underflow: self.bidi_underflow,
            overflow: self.overflow,
            underflow: self.underflow,
            response: 0,
            status: self.status,
            itt,
            exp_data_sn,
            bidi_residual: self.bidi_residual,
            residual: self.residual,
            ..Default::default()
        };
        TxPdu::new(&BhsRepr::ScsiResponse(r), data, StatSn::Advance)
    }
}

/// What differs between connection drivers.
#[async_trait]
pub trait ConnDriver: Send + Sync + 'static {
    /// Queues a PDU; StatSN, ExpCmdSN and MaxCmdSN are filled when it is transmitted.
    /// Waits while the outgoing queue is full.
    async fn send(&self, pdu: TxPdu) -> Result<(), IscsiError>;

    /// Obtains the solicited part of a write (from `Xfer::received` to EDTL): R2T and
    /// Data-Out on TCP, RDMA READ on iSER. Returns when the data is in the task's buffer,
    /// or with an error when the task was aborted or the connection failed.
    async fn solicit(&self, session: &Session, task: &Arc<Task>) -> Result<(), IscsiError>;

    /// Delivers a command's data-in and status (Data-In PDUs and SCSI Response on TCP;
    /// RDMA WRITE and the response SEND on iSER).
    async fn complete(
        &self,
        session: &Session,
        task: &Arc<Task>,
        data_in: Option<IoBuf>,
        done: Completion,
    ) -> Result<(), IscsiError>;

    /// Whether the driver sends data-in straight from a file ([`ConnDriver::complete_range`])
    /// for reads of at least [`FILE_RANGE_MIN`] bytes.
    fn file_ranges(&self) -> bool {
        false
    }

    /// Like [`ConnDriver::complete`] with data-in in a file. Called only when
    /// [`ConnDriver::file_ranges`] is true. The range must be kept until its last byte has
    /// been handed to the kernel; a failure part way must end the connection.
    async fn complete_range(
        &self,
        _session: &Session,
        _task: &Arc<Task>,
        _range: FileRange,
        _done: Completion,
    ) -> Result<(), IscsiError> {
        Err(IscsiError::Protocol("data-in from a file"))
    }

    /// The peer's MaxRecvDataSegmentLength (how much one PDU we send may carry).
    fn max_xmit(&self) -> u32;

    /// Changes it after a Text negotiation in full feature phase (RFC 7143 §13.12).
    fn set_max_xmit(&self, len: u32);

    /// Drops the connection after the queued PDUs went out.
    fn close(&self);
}

/// What the driver does after a PDU was handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Close the connection (after logout, or at an unrecoverable error).
    Close,
}

/// A long Text response being fetched piece by piece (§11.10.4).
#[derive(Debug)]
struct TextContinuation {
    itt: u32,
    ttt: u32,
    rest: TextSplitter,
}

#[derive(Debug, Default)]
struct TextState {
    incoming: Option<(u32, TextAssembler)>,
    outgoing: Option<TextContinuation>,
    next_ttt: u32,
}

/// One connection of a session in full feature phase.
pub struct Conn {
    pub cid: u16,
    pub session: Arc<Session>,
    pub driver: Arc<dyn ConnDriver>,
    text: Mutex<TextState>,
    immediate_tasks: AtomicU32,
    logged_out: AtomicBool,
    /// Outstanding target ping (TTT) and whether its answer arrived.
    ping: Mutex<Option<u32>>,
}

fn map_attr(a: u8) -> TaskAttr {
    match a {
        2 => TaskAttr::Ordered,
        3 => TaskAttr::HeadOfQueue,
        4 => TaskAttr::Aca,
        _ => TaskAttr::Simple,
    }
}

/// Residuals of a command (RFC 7143 §11.4.5): the command's own transfer length against
/// the initiator's expectation.
pub fn residuals(expected: u32, transfer_len: u32) -> (bool, bool, u32) {
    if transfer_len > expected {
        (true, false, transfer_len - expected)
    } else if transfer_len < expected {
        (false, true, expected - transfer_len)
    } else {
        (false, false, 0)
    }
}

impl Conn {
    pub fn new(cid: u16, session: Arc<Session>, driver: Arc<dyn ConnDriver>) -> Arc<Conn> {
        Arc::new(Conn {
            cid,
            session,
            driver,
            text: Mutex::new(TextState {
                next_ttt: 1,
                ..TextState::default()
            }),
            immediate_tasks: AtomicU32::new(0),
            logged_out: AtomicBool::new(false),
            ping: Mutex::new(None),
        })
    }

    pub fn logged_out(&self) -> bool {
        self.logged_out.load(Ordering::Acquire)
    }

    /// Sends a Reject carrying the offending header (RFC 7143 §11.17).
    pub async fn reject(&self, reason: u8, bhs: &[u8; BHS_LEN]) -> Result<(), IscsiError> {
        tracing::debug!(reason, opcode = bhs[0] & 0x3f, "reject");
        let r = BhsRepr::Reject(pdu::Reject {
            reason,
            data_sn: 0,
            data_len: BHS_LEN as u32,
            ..Default::default()
        });
        self.driver
            .send(TxPdu::new(
                &r,
                TxData::Bytes(Bytes::copy_from_slice(bhs)),
                StatSn::Advance,
            ))
            .await
    }

    /// Sends a target-initiated NOP-In ping (RFC 7143 §11.19) with a fresh TTT.
    pub async fn ping(&self, ttt: u32) -> Result<(), IscsiError> {
        *self.ping.lock().unwrap_or_else(|e| e.into_inner()) = Some(ttt);
        let r = BhsRepr::NopIn(NopIn {
            lun: [0; 8],
            itt: RESERVED_TAG,
            ttt,
            ..Default::default()
        });
        self.driver
            .send(TxPdu::new(&r, TxData::Empty, StatSn::Peek))
            .await
    }

    /// Whether the last ping is still unanswered.
    pub fn ping_outstanding(&self) -> bool {
        self.ping
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Asks the initiator to log out within `secs` (Async Message, event 1, §11.9.1).
    pub async fn request_logout(&self, secs: u16) -> Result<(), IscsiError> {
        let r = BhsRepr::AsyncMessage(pdu::AsyncMessage {
            event: 1,
            param3: secs,
            ..Default::default()
        });
        self.driver
            .send(TxPdu::new(&r, TxData::Empty, StatSn::Advance))
            .await
    }

    /// Tells the initiator the target drops all connections of the session (event 3).
    pub async fn announce_drop(&self, time2wait: u16, time2retain: u16) -> Result<(), IscsiError> {
        let r = BhsRepr::AsyncMessage(pdu::AsyncMessage {
            event: 3,
            param2: time2wait,
            param3: time2retain,
            ..Default::default()
        });
        self.driver
            .send(TxPdu::new(&r, TxData::Empty, StatSn::Advance))
            .await
    }

    /// Handles one received PDU.
    pub async fn receive(self: &Arc<Self>, pdu: RxPdu) -> Result<Flow, IscsiError> {
        let s = &self.session;
        s.stats.pdus_in.fetch_add(1, Ordering::Relaxed);
        let op = pdu.header().opcode();
        // After a Logout Request only data for commands in flight is accepted.
        if self.logged_out() && op != Opcode::DataOut {
            self.reject(reject_reason::WAITING_FOR_LOGOUT, &pdu.bhs)
                .await?;
            return Ok(Flow::Continue);
        }
        let repr = match BhsRepr::parse(&pdu.header()) {
            Ok(r) => r,
            Err(_) => {
                let reason = if matches!(op, Opcode::Unknown(_)) {
                    reject_reason::COMMAND_NOT_SUPPORTED
                } else {
                    reject_reason::INVALID_PDU_FIELD
                };
                tracing::debug!(opcode = ?op, "malformed BHS");
                self.reject(reason, &pdu.bhs).await?;
                return Ok(Flow::Continue);
            }
        };
        match repr {
            BhsRepr::DataOut(d) => self.data_out(&pdu, d).await,
            BhsRepr::Snack(_) => {
                // ErrorRecoveryLevel 0: no SNACK support (§11.16).
                self.reject(reject_reason::SNACK_REJECT, &pdu.bhs).await?;
                Ok(Flow::Continue)
            }
            BhsRepr::ScsiCommand(_)
            | BhsRepr::NopOut(_)
            | BhsRepr::TaskMgmtRequest(_)
            | BhsRepr::TextRequest(_)
            | BhsRepr::LogoutRequest(_) => self.sequence(pdu, repr).await,
            BhsRepr::LoginRequest(_) => {
                self.reject(reject_reason::PROTOCOL_ERROR, &pdu.bhs).await?;
                Ok(Flow::Continue)
            }
            _ => {
                // A target opcode from the initiator.
                self.reject(reject_reason::COMMAND_NOT_SUPPORTED, &pdu.bhs)
                    .await?;
                Ok(Flow::Continue)
            }
        }
    }

    /// Orders commands by CmdSN (RFC 7143 §4.2.2.1): immediate ones now, in-window ones in
    /// CmdSN order, others dropped.
    async fn sequence(self: &Arc<Self>, pdu: RxPdu, repr: BhsRepr) -> Result<Flow, IscsiError> {
        let h = pdu.header();
        let cmd_sn = h.cmd_sn();
        let immediate = h.immediate();
        // A NOP-Out answering our ping is neither a command nor in the CmdSN stream.
        if let BhsRepr::NopOut(n) = &repr {
            if n.itt == RESERVED_TAG {
                let mut p = self.ping.lock().unwrap_or_else(|e| e.into_inner());
                if *p == Some(n.ttt) || n.ttt == RESERVED_TAG {
                    *p = None;
                }
                return Ok(Flow::Continue);
            }
        }
        if immediate {
            return self.dispatch(pdu, repr).await;
        }
        let is_task = matches!(repr, BhsRepr::ScsiCommand(_));
        {
            let mut w = self.session.window();
            match w.check(cmd_sn) {
                SnCheck::InOrder => {
                    if w.is_skipped(cmd_sn) {
                        w.advance(false);
                        return Ok(Flow::Continue);
                    }
                    w.advance(is_task);
                }
                SnCheck::Ahead => {
                    tracing::debug!(cmd_sn, exp = w.exp_cmd_sn, "command ahead of ExpCmdSN held");
                    w.hold(cmd_sn, pdu);
                    return Ok(Flow::Continue);
                }
                SnCheck::Outside => {
                    tracing::debug!(
                        cmd_sn,
                        exp = w.exp_cmd_sn,
                        max = w.max_cmd_sn(),
                        "CmdSN outside the window: ignored"
                    );
                    return Ok(Flow::Continue);
                }
            }
        }
        if self.dispatch(pdu, repr).await? == Flow::Close {
            return Ok(Flow::Close);
        }
        loop {
            let next = {
                let mut w = self.session.window();
                let n = w.take_next();
                if let Some(p) = &n {
                    let task = p.header().opcode() == Opcode::ScsiCommand;
                    w.advance(task);
                }
                n
            };
            let Some(p) = next else {
                return Ok(Flow::Continue);
            };
            let Ok(r) = BhsRepr::parse(&p.header()) else {
                continue;
            };
            if self.dispatch(p, r).await? == Flow::Close {
                return Ok(Flow::Close);
            }
        }
    }

    async fn dispatch(self: &Arc<Self>, pdu: RxPdu, repr: BhsRepr) -> Result<Flow, IscsiError> {
        if !pdu.data_digest_ok || pdu.data_short {
            // RFC 7143 §7.8: Reject and discard; the CmdSN stays consumed. A PDU whose data
            // segment is missing from its message is discarded the same way, with reason
            // Protocol Error (§11.17.1).
            let reason = if pdu.data_digest_ok {
                tracing::warn!(opcode = ?pdu.header().opcode(), peer = %self.session.peer, "data segment missing from the message");
                reject_reason::PROTOCOL_ERROR
            } else {
                tracing::warn!(opcode = ?pdu.header().opcode(), peer = %self.session.peer, "data digest error");
                reject_reason::DATA_DIGEST_ERROR
            };
            if let BhsRepr::ScsiCommand(c) = &repr {
                if !c.immediate {
                    self.session.window().finish_task();
                }
            }
            self.reject(reason, &pdu.bhs).await?;
            return Ok(Flow::Continue);
        }
        let discovery = self.session.session_type == super::params::SessionType::Discovery;
        match repr {
            BhsRepr::ScsiCommand(c) if discovery => {
                if !c.immediate {
                    self.session.window().finish_task();
                }
                self.reject(reject_reason::PROTOCOL_ERROR, &pdu.bhs).await?;
                Ok(Flow::Continue)
            }
            BhsRepr::ScsiCommand(c) => self.scsi_command(pdu, c).await,
            BhsRepr::NopOut(n) => self.nop_out(pdu, n).await,
            BhsRepr::TaskMgmtRequest(_) if discovery => {
                self.reject(reject_reason::PROTOCOL_ERROR, &pdu.bhs).await?;
                Ok(Flow::Continue)
            }
            BhsRepr::TaskMgmtRequest(t) => {
                let me = self.clone();
                tokio::spawn(async move { me.task_management(t).await });
                Ok(Flow::Continue)
            }
            BhsRepr::TextRequest(t) => self.text(pdu, t).await,
            BhsRepr::LogoutRequest(l) => {
                // Answered once the commands before it are done; the reader keeps
                // accepting their Data-Out meanwhile.
                self.logged_out.store(true, Ordering::Release);
                let me = self.clone();
                tokio::spawn(async move { me.logout(l).await });
                Ok(Flow::Continue)
            }
            _ => Ok(Flow::Continue),
        }
    }

    async fn scsi_command(
        self: &Arc<Self>,
        pdu: RxPdu,
        c: ScsiCommand,
    ) -> Result<Flow, IscsiError> {
        let s = &self.session;
        let p = &s.params;
        s.stats.commands.fetch_add(1, Ordering::Relaxed);
        s.stats
            .bytes_in
            .fetch_add(pdu.data.len() as u64, Ordering::Relaxed);
        let release = |me: &Conn| {
            if !c.immediate {
                me.session.window().finish_task();
            }
        };
        let mut cdb = rtgt_scsi::CdbBytes::from_slice(&c.cdb);
        let mut bidi = None;
        match Ahs::parse_all(&pdu.ahs) {
            Ok(segs) => {
                for a in segs {
                    match a {
                        Ahs::ExtendedCdb(ext) => cdb.extend_from_slice(&ext),
                        Ahs::BidiReadLength(l) => bidi = Some(l),
                        Ahs::Unknown { .. } => {}
                    }
                }
            }
            Err(_) => {
                release(self);
                self.reject(reject_reason::INVALID_PDU_FIELD, &pdu.bhs)
                    .await?;
                return Ok(Flow::Continue);
            }
        }
        let imm = pdu.data.len() as u32;
        let unsol_end = if c.write {
            p.unsolicited_limit(c.edtl)
        } else {
            0
        };
        // §11.3: data only on writes, within EDTL and FirstBurstLength, ImmediateData=Yes;
        // unsolicited Data-Out (F=0) only with InitialR2T=No.
        let bad = (imm > 0
            && (!c.write || !p.immediate_data || imm > c.edtl || imm > p.first_burst_length))
            || (!c.final_ && (!c.write || p.initial_r2t || imm >= unsol_end));
        if bad {
            release(self);
            self.reject(reject_reason::PROTOCOL_ERROR, &pdu.bhs).await?;
            return Ok(Flow::Continue);
        }
        if c.immediate {
            let n = self.immediate_tasks.fetch_add(1, Ordering::AcqRel);
            if n >= s.queue_depth {
                self.immediate_tasks.fetch_sub(1, Ordering::AcqRel);
                self.reject(reject_reason::IMMEDIATE_COMMAND_REJECT, &pdu.bhs)
                    .await?;
                return Ok(Flow::Continue);
            }
        }
        let lun = rtgt_scsi::lun_from_bytes(&c.lun);
        let device = s.luns.current().map.luns.get(&lun).cloned();
        let header = TaskHeader {
            itt: c.itt,
            cmd_sn: c.cmd_sn,
            lun_bytes: c.lun,
            edtl: c.edtl,
            read: c.read,
            write: c.write,
            immediate: c.immediate,
            attr: map_attr(c.attr),
            bidi_read_len: bidi,
        };
        let task = Arc::new(Task::new(header, device, cdb));
        {
            let mut x = task.xfer();
            x.unsolicited_open = c.write && !c.final_;
            x.unsolicited_end = unsol_end;
            x.unsolicited_next = imm;
            if imm > 0 {
                Task::place(&mut x, 0, &pdu.data);
            }
        }
        let turn = match s.add_task(&task) {
            Ok(t) => Some(t),
            // ACA without an ACA condition: answered with CHECK CONDITION by `run_task`.
            Err(Refused::NoAca) => None,
            Err(Refused::Overlapped) => {
                release(self);
                if c.immediate {
                    self.immediate_tasks.fetch_sub(1, Ordering::AcqRel);
                }
                self.reject(reject_reason::TASK_IN_PROGRESS, &pdu.bhs)
                    .await?;
                return Ok(Flow::Continue);
            }
        };
        // Run here, in the driver's task: a command that completes at once has its
        // response in the batch the driver sends next.
        rtgt_scsi::task::run_inline(self.clone().run_task(task, turn));
        Ok(Flow::Continue)
    }

    /// Places a Data-Out PDU (RFC 7143 §11.7) into its task, checking TTT, offset and
    /// DataSN. ErrorRecoveryLevel 0 cannot recover within the command: a violation (or a
    /// data digest error) is rejected and ends the task without a response; the connection
    /// stays up.
    async fn data_out(&self, pdu: &RxPdu, d: DataOut) -> Result<Flow, IscsiError> {
        let s = &self.session;
        s.stats
            .bytes_in
            .fetch_add(pdu.data.len() as u64, Ordering::Relaxed);
        let Some(task) = s.task(d.itt) else {
            // The task may have been aborted or failed early: drop its data quietly.
            tracing::trace!(itt = d.itt, "Data-Out for an unknown task dropped");
            return Ok(Flow::Continue);
        };
        if task.is_aborted() {
            return Ok(Flow::Continue);
        }
        let len = pdu.data.len() as u32;
        let err = {
            let mut x = task.xfer();
            let err = if !pdu.data_digest_ok {
                Some("data digest error")
            } else if pdu.data_short {
                Some("Data-Out data segment missing from the message")
            } else if !task.write {
                Some("Data-Out for a command without W")
            } else if d.ttt == RESERVED_TAG {
                if !x.unsolicited_open {
                    Some("unsolicited Data-Out not allowed")
                } else if d.buffer_offset != x.unsolicited_next {
                    Some("unsolicited Data-Out offset out of order")
                } else if d.data_sn != x.unsolicited_data_sn {
                    Some("unsolicited Data-Out DataSN out of order")
                } else if d
                    .buffer_offset
                    .checked_add(len)
                    .is_none_or(|e| e > x.unsolicited_end)
                {
                    Some("unsolicited data beyond FirstBurstLength")
                } else {
                    Task::place(&mut x, d.buffer_offset, &pdu.data);
                    x.unsolicited_next += len;
                    x.unsolicited_data_sn = x.unsolicited_data_sn.wrapping_add(1);
                    if d.final_ {
                        x.unsolicited_open = false;
                        None
                    } else if x.unsolicited_next == x.unsolicited_end {
                        Some("unsolicited burst complete without F")
                    } else {
                        None
                    }
                }
            } else {
                match x.r2ts.iter().position(|r| r.ttt == d.ttt) {
                    None => Some("Data-Out with an unknown TTT"),
                    Some(i) => {
                        let r = x.r2ts[i].clone();
                        if d.buffer_offset != r.offset + r.received {
                            Some("Data-Out offset out of order")
                        } else if d.data_sn != r.next_data_sn {
                            Some("Data-Out DataSN out of order")
                        } else if r.received + len > r.len {
                            Some("Data-Out beyond the R2T")
                        } else if d.final_ != (r.received + len == r.len) {
                            Some("F bit does not end the R2T sequence")
                        } else {
                            Task::place(&mut x, d.buffer_offset, &pdu.data);
                            let r = &mut x.r2ts[i];
                            r.received += len;
                            r.next_data_sn = r.next_data_sn.wrapping_add(1);
                            if d.final_ {
                                x.r2ts.remove(i);
                            }
                            None
                        }
                    }
                }
            };
            if let Some(e) = err {
                x.error = Some(e);
            }
            err
        };
        task.wake().notify_one();
        if let Some(e) = err {
            tracing::warn!(itt = d.itt, peer = %s.peer, error = e, "Data-Out rejected, task ended");
            task.abort();
            let reason = if pdu.data_digest_ok {
                reject_reason::PROTOCOL_ERROR
            } else {
                reject_reason::DATA_DIGEST_ERROR
            };
            self.reject(reason, &pdu.bhs).await?;
        }
        Ok(Flow::Continue)
    }

    /// Runs one command: collects its write data, executes it and sends the response.
    async fn run_task(self: Arc<Self>, task: Arc<Task>, turn: Option<Turn>) {
        let s = self.session.clone();
        let result = match turn {
            Some(turn) => self.run_task_inner(&task, turn).await,
            None => {
                let (k, (asc, ascq)) = (sense::key::ILLEGAL_REQUEST, sense::asc::INVALID_MESSAGE);
                self.finish_with_sense(&task, k, asc, ascq).await
            }
        };
        if let Err(e) = result {
            tracing::debug!(itt = task.itt, error = %e, "task ended without response");
            s.retire_task(&task);
        }
        if task.immediate {
            self.immediate_tasks.fetch_sub(1, Ordering::AcqRel);
        }
        task.set_done();
    }

    async fn run_task_inner(&self, task: &Arc<Task>, turn: Turn) -> Result<(), IscsiError> {
        let s = &self.session;
        let mut data_out = None;
        if task.write && task.edtl > 0 {
            if task.edtl > MAX_COMMAND_BYTES {
                // Too large to buffer: refuse without collecting data.
                return self.finish_with_sense(task, 0x05, 0x24, 0x00).await;
            }
            task.core.set_stage(Stage::DataOut);
            let mut buf = s.pool.get(task.edtl as usize).await;
            buf.set_len(task.edtl as usize);
            {
                let mut x = task.xfer();
                for (off, d) in std::mem::take(&mut x.early) {
                    let o = off as usize;
                    buf.as_mut_slice()[o..o + d.len()].copy_from_slice(&d);
                }
                x.buf = Some(buf);
                x.solicit_next = x.unsolicited_end.max(x.received);
            }
            // Unsolicited Data-Out until its F bit (§13.11).
            loop {
                if task.is_aborted() {
                    return Err(IscsiError::Aborted);
                }
                {
                    let x = task.xfer();
                    if x.error.is_some() {
                        return Err(IscsiError::Protocol("data-out"));
                    }
                    if !x.unsolicited_open {
                        break;
                    }
                }
                task.wake().notified().await;
            }
            let (received, next) = {
                let mut x = task.xfer();
                // Solicitation starts after what actually arrived unsolicited.
                x.solicit_next = x.received;
                (x.received, x.solicit_next)
            };
            if received < task.edtl {
                debug_assert!(next < task.edtl);
                self.driver.solicit(s, task).await?;
            }
            let mut x = task.xfer();
            let mut buf = x
                .buf
                .take()
                .ok_or(IscsiError::Protocol("data-out buffer"))?;
            let got = x.received.min(task.edtl) as usize;
            buf.set_len(got);
            data_out = Some(buf);
        }
        // Task attributes (SAM-5 8.9), once the data is in.
        if !task.core.wait_turn(turn).await {
            return Err(IscsiError::Aborted);
        }
        task.core.set_stage(Stage::Executing);
        let expected_in = if task.read {
            if task.write {
                task.bidi_read_len.unwrap_or(0)
            } else {
                task.edtl
            }
        } else {
            0
        };
        let cmd = Command {
            cdb: task.cdb.clone(),
            data_out,
            expected_in_len: expected_in,
            attr: task.attr(),
            tag: task.itt as u64,
        };
        let range_ok =
            task.read && !task.write && task.edtl >= FILE_RANGE_MIN && self.driver.file_ranges();
        let resp = s
            .luns
            .execute_ranged(&s.nexus, task.lun(), cmd, range_ok)
            .await;
        let bidi = task.read && task.write;
        // EDTL is the read length of a read and the write length of a write or bidi command.
        let dir_expected = if task.read || task.write {
            task.edtl
        } else {
            0
        };
        let (overflow, underflow, residual) = residuals(dir_expected, resp.transfer_len);
        let mut done = Completion {
            status: resp.status as u8,
            sense: resp.sense,
            overflow,
            underflow,
            residual,
            ..Completion::default()
        };
        if let Some(range) = resp.data_range {
            if !self.retire(task).await? {
                return Ok(());
            }
            s.stats.bytes_out.fetch_add(range.len(), Ordering::Relaxed);
            return self.driver.complete_range(s, task, range, done).await;
        }
        let mut data_in = resp.data_in;
        if let Some(d) = data_in.as_mut() {
            let cap = expected_in as usize;
            if d.len() > cap {
                d.set_len(cap);
            }
        }
        if bidi {
            let sent = data_in.as_ref().map(|d| d.len() as u32).unwrap_or(0);
            let (o, u, r) = residuals(expected_in, sent);
            done.bidi_overflow = o;
            done.bidi_underflow = u;
            done.bidi_residual = r;
        }
        if data_in.as_ref().is_some_and(|d| d.is_empty()) {
            data_in = None;
        }
        if !self.retire(task).await? {
            return Ok(());
        }
        let out = data_in.as_ref().map(|d| d.len() as u64).unwrap_or(0);
        s.stats.bytes_out.fetch_add(out, Ordering::Relaxed);
        self.driver.complete(s, task, data_in, done).await
    }

    /// Retires `task` before its response; false when the response is not to be sent (the
    /// task was aborted). A task another I_T nexus aborted while TAS=1 gets TASK ABORTED
    /// status here (SAM-5 5.3.1).
    async fn retire(&self, task: &Arc<Task>) -> Result<bool, IscsiError> {
        let s = &self.session;
        match s.retire_task(task) {
            Outcome::Respond => Ok(true),
            Outcome::Drop => Ok(false),
            Outcome::TaskAborted => {
                let done = Completion {
                    status: Status::TaskAborted as u8,
                    ..Default::default()
                };
                self.driver.complete(s, task, None, done).await?;
                Ok(false)
            }
        }
    }

    async fn finish_with_sense(
        &self,
        task: &Arc<Task>,
        key: u8,
        asc: u8,
        ascq: u8,
    ) -> Result<(), IscsiError> {
        let mut sense = vec![0u8; 18];
        sense[0] = 0x70;
        sense[2] = key;
        sense[7] = 10;
        sense[12] = asc;
        sense[13] = ascq;
        if !self.retire(task).await? {
            return Ok(());
        }
        let done = Completion {
            status: Status::CheckCondition as u8,
            sense: Some(sense),
            ..Default::default()
        };
        self.driver.complete(&self.session, task, None, done).await
    }

    async fn nop_out(&self, pdu: RxPdu, n: NopOut) -> Result<Flow, IscsiError> {
        // A ping from the initiator: echo the data (§11.18.5), within the initiator's
        // MaxRecvDataSegmentLength.
        let max = self.driver.max_xmit() as usize;
        let data = if pdu.data.len() <= max {
            pdu.data.clone()
        } else {
            pdu.data.slice(..max)
        };
        let r = BhsRepr::NopIn(NopIn {
            lun: n.lun,
            itt: n.itt,
            ttt: RESERVED_TAG,
            ..Default::default()
        });
        self.driver
            .send(TxPdu::new(&r, TxData::Bytes(data), StatSn::Advance))
            .await?;
        Ok(Flow::Continue)
    }

    async fn task_management(self: Arc<Self>, t: TaskMgmtRequest) {
        let response = self.session.task_management(&t).await;
        let r = BhsRepr::TaskMgmtResponse(TaskMgmtResponse {
            response,
            itt: t.itt,
            ..Default::default()
        });
        if self
            .driver
            .send(TxPdu::new(&r, TxData::Empty, StatSn::Advance))
            .await
            .is_err()
        {
            return;
        }
        if t.function == pdu::tmf::TARGET_COLD_RESET && response == pdu::tmf::FUNCTION_COMPLETE {
            for s in self.session.other_target_sessions() {
                s.request_close(CloseReason::ColdReset);
            }
            self.driver.close();
            self.session.request_close(CloseReason::ColdReset);
        }
    }

    /// Text Request in full feature phase (RFC 7143 §11.10): SendTargets and declarations,
    /// with continuation both ways.
    async fn text(&self, pdu: RxPdu, t: TextRequest) -> Result<Flow, IscsiError> {
        let max_xmit = self.driver.max_xmit() as usize;
        let s = &self.session;
        enum Next {
            Send(Vec<u8>, bool, u32),
            Ack,
            Reject(u8),
        }
        let next = {
            let mut st = self.text.lock().unwrap_or_else(|e| e.into_inner());
            if t.ttt != RESERVED_TAG {
                // Continuation of our long response.
                match st.outgoing.take() {
                    Some(mut c) if c.ttt == t.ttt && c.itt == t.itt && pdu.data.is_empty() => {
                        let (piece, more) = c.rest.next_piece(max_xmit);
                        let ttt = c.ttt;
                        if more {
                            st.outgoing = Some(c);
                        }
                        Next::Send(piece, more, if more { ttt } else { RESERVED_TAG })
                    }
                    _ => Next::Reject(reject_reason::PROTOCOL_ERROR),
                }
            } else {
                st.outgoing = None;
                let asm = match st.incoming.take() {
                    Some((itt, a)) if itt == t.itt => Some(a),
                    _ => None,
                };
                let mut asm = asm.unwrap_or_else(|| TextAssembler::new(MAX_TEXT_BYTES));
                if asm.push(&pdu.data).is_err() {
                    Next::Reject(reject_reason::PROTOCOL_ERROR)
                } else if t.continue_ {
                    st.incoming = Some((t.itt, asm));
                    Next::Ack
                } else {
                    match TextPairs::parse(&asm.take()) {
                        Err(_) => Next::Reject(reject_reason::PROTOCOL_ERROR),
                        Ok(keys) => {
                            let out = self.answer_text(&keys).encode();
                            if out.len() <= max_xmit {
                                Next::Send(out, false, RESERVED_TAG)
                            } else {
                                let ttt = st.next_ttt;
                                st.next_ttt = st.next_ttt.wrapping_add(1).max(1);
                                let mut rest = TextSplitter::new(out);
                                let (piece, _) = rest.next_piece(max_xmit);
                                st.outgoing = Some(TextContinuation {
                                    itt: t.itt,
                                    ttt,
                                    rest,
                                });
                                Next::Send(piece, true, ttt)
                            }
                        }
                    }
                }
            }
        };
        let (data, more, ttt) = match next {
            Next::Reject(r) => {
                self.reject(r, &pdu.bhs).await?;
                return Ok(Flow::Continue);
            }
            Next::Ack => (Vec::new(), false, RESERVED_TAG),
            Next::Send(d, more, ttt) => (d, more, ttt),
        };
        let ack_only = data.is_empty() && t.continue_;
        let r = BhsRepr::TextResponse(TextResponse {
            final_: !more && !ack_only,
            continue_: more,
            lun: t.lun,
            itt: t.itt,
            ttt: if ack_only { RESERVED_TAG } else { ttt },
            ..Default::default()
        });
        let _ = s;
        self.driver
            .send(TxPdu::new(
                &r,
                TxData::Bytes(Bytes::from(data)),
                StatSn::Advance,
            ))
            .await?;
        Ok(Flow::Continue)
    }

    fn answer_text(&self, keys: &TextPairs) -> TextPairs {
        let s = &self.session;
        let mut out = TextPairs::new();
        let session_target = (s.session_type == super::params::SessionType::Normal)
            .then_some(s.params.target_name.as_str());
        for (k, v) in keys.iter() {
            match k {
                "SendTargets" => {
                    let list = super::discovery::send_targets_over(
                        &s.registry,
                        &s.params.initiator_name,
                        v,
                        s.local,
                        session_target,
                        s.transport,
                    );
                    for (k, v) in list.iter() {
                        out.push(k, v);
                    }
                }
                "MaxRecvDataSegmentLength" => match super::params::parse_number(v) {
                    Some(n) if (512..=16_777_215).contains(&n) => {
                        self.driver.set_max_xmit(n as u32);
                        out.push(k, s.params.max_recv_data_segment_length.to_string());
                    }
                    _ => out.push(k, super::params::REJECT),
                },
                "InitiatorAlias" => {}
                k => match super::params::lookup(k) {
                    Some(_) => out.push(k, super::params::REJECT),
                    None => out.push(k, super::params::NOT_UNDERSTOOD),
                },
            }
        }
        out
    }

    /// Logout (RFC 7143 §11.14): waits for the session's commands, answers, then closes.
    async fn logout(&self, l: LogoutRequest) {
        let response = match l.reason {
            0 => 0,
            1 if l.cid == self.cid => 0,
            1 => 1,
            // Connection recovery needs ErrorRecoveryLevel 2.
            2 => 2,
            _ => 3,
        };
        if response == 0 {
            self.session.drain().await;
            if l.reason == 0 {
                // The I_T nexus ends with the session: the logical units learn it before
                // the initiator does (an SPC-2 reservation is released by the time a
                // command on another session follows the Logout Response).
                for d in self.session.devices() {
                    d.nexus_loss(&self.session.nexus);
                }
            }
        } else {
            self.logged_out.store(false, Ordering::Release);
        }
        let r = BhsRepr::LogoutResponse(LogoutResponse {
            response,
            itt: l.itt,
            ..Default::default()
        });
        let sent = self
            .driver
            .send(TxPdu::new(&r, TxData::Empty, StatSn::Advance))
            .await;
        if response == 0 || sent.is_err() {
            self.driver.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residual_rules() {
        assert_eq!(residuals(0, 512), (true, false, 512));
        assert_eq!(residuals(10000, 512), (false, true, 9488));
        assert_eq!(residuals(200, 512), (true, false, 312));
        assert_eq!(residuals(512, 512), (false, false, 0));
    }

    #[test]
    fn tx_pdu_sets_length() {
        let r = BhsRepr::NopIn(NopIn::default());
        let p = TxPdu::new(
            &r,
            TxData::Bytes(Bytes::from_static(b"hello")),
            StatSn::Advance,
        );
        assert_eq!(Bhs::new_unchecked(&p.bhs[..]).data_segment_len(), 5);
        assert_eq!(p.data.as_slice(), b"hello");
    }
}
