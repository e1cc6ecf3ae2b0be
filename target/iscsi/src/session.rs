//! iSCSI sessions (RFC 7143 §4.2, §4.4): the CmdSN window, the task table, task management
//! and the table of live sessions used for TSIH allocation and reinstatement.
//!
//! Nothing here knows how PDUs move: connection drivers ([`super::conn::ConnDriver`]) do.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rtgt_backstore::{BufPool, IoBuf};
use tokio::sync::{watch, Notify};

use rtgt_scsi::core::{LiveLuns, PortIds, Registry};
use rtgt_scsi::task::{
    self, Function, Outcome, Refused, Task as CoreTask, TaskSet, TmResponse, Tracked, Turn,
};
use rtgt_scsi::{Device, LunMap, Nexus, TaskAttr};

use super::params::{SessionParams, SessionType, TransportKind};
use super::pdu::tmf;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serial number comparison (RFC 1982 with SERIAL_BITS = 32, as RFC 7143 §4.2.2.1 asks).
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 0x8000_0000
}

pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

/// Where a non-immediate command falls relative to the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnCheck {
    /// CmdSN == ExpCmdSN: deliver now.
    InOrder,
    /// Inside the window but ahead of ExpCmdSN: hold until the gap fills.
    Ahead,
    /// Outside the window: silently ignored (RFC 7143 §4.2.2.1).
    Outside,
}

/// The command window (RFC 7143 §4.2.2.1). It is the session's bounded queue:
/// MaxCmdSN = ExpCmdSN + queue_depth − 1 − outstanding.
#[derive(Debug)]
pub struct Window {
    pub exp_cmd_sn: u32,
    depth: u32,
    outstanding: u32,
    /// Commands that arrived ahead of ExpCmdSN, by CmdSN.
    held: BTreeMap<u32, super::pdu::RxPdu>,
    /// CmdSNs an ABORT TASK declared received before they arrived (§11.5.1).
    skipped: Vec<u32>,
}

impl Window {
    pub fn new(exp_cmd_sn: u32, depth: u32) -> Window {
        Window {
            exp_cmd_sn,
            depth: depth.max(1),
            outstanding: 0,
            held: BTreeMap::new(),
            skipped: Vec::new(),
        }
    }

    pub fn max_cmd_sn(&self) -> u32 {
        let free = self.depth.saturating_sub(self.outstanding);
        self.exp_cmd_sn.wrapping_add(free).wrapping_sub(1)
    }

    pub fn check(&self, cmd_sn: u32) -> SnCheck {
        let free = self.depth.saturating_sub(self.outstanding);
        match cmd_sn.wrapping_sub(self.exp_cmd_sn) {
            o if o >= free => SnCheck::Outside,
            0 => SnCheck::InOrder,
            _ => SnCheck::Ahead,
        }
    }

    /// Whether `cmd_sn` lies in [ExpCmdSN, MaxCmdSN].
    pub fn contains(&self, cmd_sn: u32) -> bool {
        self.check(cmd_sn) != SnCheck::Outside
    }

    /// Consumes ExpCmdSN; `task` says the command occupies a queue slot until finished.
    pub fn advance(&mut self, task: bool) {
        self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
        if task {
            self.outstanding += 1;
        }
    }

    pub fn finish_task(&mut self) {
        self.outstanding = self.outstanding.saturating_sub(1);
    }

    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    pub fn hold(&mut self, cmd_sn: u32, pdu: super::pdu::RxPdu) {
        self.held.insert(cmd_sn, pdu);
    }

    /// The held command that is now in order, if any.
    pub fn take_next(&mut self) -> Option<super::pdu::RxPdu> {
        loop {
            if let Some(i) = self.skipped.iter().position(|s| *s == self.exp_cmd_sn) {
                self.skipped.swap_remove(i);
                self.held.remove(&self.exp_cmd_sn);
                self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
                continue;
            }
            return self.held.remove(&self.exp_cmd_sn);
        }
    }

    /// Marks a CmdSN in the window as already received (ABORT TASK of a command that has
    /// not arrived): it is dropped when it comes.
    pub fn skip(&mut self, cmd_sn: u32) {
        if self.skipped.len() < self.depth as usize && !self.skipped.contains(&cmd_sn) {
            self.skipped.push(cmd_sn);
        }
    }

    pub fn is_skipped(&mut self, cmd_sn: u32) -> bool {
        if let Some(i) = self.skipped.iter().position(|s| *s == cmd_sn) {
            self.skipped.swap_remove(i);
            true
        } else {
            false
        }
    }
}

/// One outstanding R2T (RFC 7143 §11.8) of a write.
#[derive(Debug, Clone)]
pub struct R2tState {
    pub ttt: u32,
    pub r2t_sn: u32,
    pub offset: u32,
    pub len: u32,
    pub received: u32,
    pub next_data_sn: u32,
}

/// Data-Out state of a write: the buffer and what has arrived.
#[derive(Debug, Default)]
pub struct Xfer {
    /// The data-out buffer (EDTL bytes) once allocated.
    pub buf: Option<IoBuf>,
    /// Data that arrived before the buffer was allocated (immediate and unsolicited only;
    /// bounded by FirstBurstLength).
    pub early: Vec<(u32, Bytes)>,
    /// Bytes placed (ranges never overlap, so this reaching EDTL means complete).
    pub received: u32,
    /// Unsolicited Data-Out PDUs are still allowed (§13.11, the command's F bit was 0).
    pub unsolicited_open: bool,
    /// End offset of the unsolicited burst.
    pub unsolicited_end: u32,
    /// Next offset and DataSN of the unsolicited sequence.
    pub unsolicited_next: u32,
    pub unsolicited_data_sn: u32,
    /// Outstanding R2Ts (connection drivers that send R2Ts).
    pub r2ts: Vec<R2tState>,
    pub next_r2t_sn: u32,
    /// Offset the next solicitation starts at.
    pub solicit_next: u32,
    /// A protocol violation in the data-out phase.
    pub error: Option<&'static str>,
}

/// A SCSI task (one command) of a session: the task layer's [`CoreTask`] (tag = ITT) and
/// what iSCSI adds.
#[derive(Debug)]
pub struct Task {
    pub core: CoreTask,
    pub itt: u32,
    pub cmd_sn: u32,
    pub lun_bytes: [u8; 8],
    pub edtl: u32,
    pub read: bool,
    pub write: bool,
    pub immediate: bool,
    /// Expected read length of a bidirectional command (AHS type 2).
    pub bidi_read_len: Option<u32>,
    pub cdb: rtgt_scsi::CdbBytes,
    pub xfer: Mutex<Xfer>,
}

impl Tracked for Task {
    fn task(&self) -> &CoreTask {
        &self.core
    }
}

/// What a SCSI Command PDU says of its task.
#[derive(Debug, Clone, Copy)]
pub struct TaskHeader {
    pub itt: u32,
    pub cmd_sn: u32,
    pub lun_bytes: [u8; 8],
    pub edtl: u32,
    pub read: bool,
    pub write: bool,
    pub immediate: bool,
    pub attr: TaskAttr,
    pub bidi_read_len: Option<u32>,
}

impl Task {
    /// A task of `h` on `device` (what the session's LUN map holds at its LUN).
    pub fn new(h: TaskHeader, device: Option<Arc<Device>>, cdb: rtgt_scsi::CdbBytes) -> Task {
        let lun = rtgt_scsi::lun_from_bytes(&h.lun_bytes);
        Task {
            core: CoreTask::new(u64::from(h.itt), lun, h.attr, device),
            itt: h.itt,
            cmd_sn: h.cmd_sn,
            lun_bytes: h.lun_bytes,
            edtl: h.edtl,
            read: h.read,
            write: h.write,
            immediate: h.immediate,
            bidi_read_len: h.bidi_read_len,
            cdb,
            xfer: Mutex::new(Xfer::default()),
        }
    }

    pub fn lun(&self) -> u64 {
        self.core.lun
    }

    pub fn attr(&self) -> TaskAttr {
        self.core.attr
    }

    pub fn xfer(&self) -> MutexGuard<'_, Xfer> {
        lock(&self.xfer)
    }

    pub fn is_aborted(&self) -> bool {
        self.core.is_aborted()
    }

    /// Ends the task without a response (a Data-Out violation).
    pub fn abort(&self) {
        self.core.abort();
    }

    /// Wakes the task's driver: data arrived, an error, or an abort.
    pub fn wake(&self) -> &Notify {
        &self.core.wake
    }

    pub fn set_done(&self) {
        self.core.set_done();
    }

    pub fn is_done(&self) -> bool {
        self.core.is_done()
    }

    /// Waits until the task has finished (response sent or dropped).
    pub async fn finished(&self) {
        self.core.finished().await
    }

    /// Places Data-Out bytes at `offset`: in the buffer, or queued until it exists.
    pub fn place(x: &mut Xfer, offset: u32, data: &Bytes) {
        match x.buf.as_mut() {
            Some(b) => {
                let o = offset as usize;
                b.as_mut_slice()[o..o + data.len()].copy_from_slice(data);
            }
            None => x.early.push((offset, data.clone())),
        }
        x.received += data.len() as u32;
    }
}

/// Counters of a session.
#[derive(Debug, Default)]
pub struct SessionStats {
    pub commands: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub pdus_in: AtomicU64,
    pub pdus_out: AtomicU64,
}

/// A snapshot of a session for the daemon's API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub initiator: String,
    pub target: String,
    /// ISID as 12 hex digits.
    pub isid: String,
    pub tsih: u16,
    pub session_type: SessionType,
    /// "tcp" or "iser".
    pub transport: &'static str,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub queue_depth: u32,
    pub outstanding: u32,
    pub commands: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Commands aborted (task management, connection loss, protocol errors).
    pub tasks_aborted: u64,
    /// Task management functions received.
    pub task_management: u64,
    pub uptime: Duration,
}

/// Why a session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// Logout or connection loss.
    Normal,
    /// A new login with the same ISID and initiator (RFC 7143 §6.3.5).
    Reinstated,
    /// The administrator asked for it.
    Forced,
    /// TARGET COLD RESET.
    ColdReset,
    /// The daemon stops.
    Shutdown,
}

/// Everything needed to create a session.
pub struct SessionSetup {
    pub isid: [u8; 6],
    pub session_type: SessionType,
    pub params: SessionParams,
    pub luns: LunMap,
    pub exp_cmd_sn: u32,
    pub queue_depth: u32,
    pub transport: TransportKind,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub registry: Arc<Registry>,
    pub pool: Arc<BufPool>,
    /// Seconds between NOP-In pings and how long to wait for the answer (0 = off).
    pub nopin_interval: u32,
    pub nopin_timeout: u32,
    /// [`rtgt_scsi::core::IscsiParams::busy_poll_micros`] and
    /// [`rtgt_scsi::core::IscsiParams::zero_copy_reads`] of the portal group.
    pub busy_poll_micros: u32,
    pub zero_copy_reads: bool,
}

static NEXUS_ID: AtomicU64 = AtomicU64::new(1);

/// An iSCSI session.
pub struct Session {
    pub tsih: u16,
    pub isid: [u8; 6],
    pub session_type: SessionType,
    pub params: SessionParams,
    pub nexus: Nexus,
    /// The LUN map, replaced in place by a live reconfiguration.
    pub luns: LiveLuns,
    pub queue_depth: u32,
    pub transport: TransportKind,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub registry: Arc<Registry>,
    pub pool: Arc<BufPool>,
    pub nopin_interval: u32,
    pub nopin_timeout: u32,
    pub busy_poll_micros: u32,
    pub zero_copy_reads: bool,
    pub stats: SessionStats,
    window: Mutex<Window>,
    tasks: Arc<TaskSet<Task>>,
    close: watch::Sender<Option<CloseReason>>,
    table: Weak<SessionTable>,
    created: Instant,
    /// `end` has started (it runs once).
    ending: AtomicBool,
    /// `end` has finished: the devices know the nexus is gone.
    ended: AtomicBool,
    /// A duplicate of the TCP connection's socket while it serves the session, for
    /// [`Session::peer_closed`]; `end` drops it.
    peer_socket: Mutex<Option<OwnedFd>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("tsih", &self.tsih)
            .field("initiator", &self.params.initiator_name)
            .field("target", &self.params.target_name)
            .finish()
    }
}

/// Formats an ISID as 12 hex digits.
pub fn isid_hex(isid: &[u8; 6]) -> String {
    isid.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SPC-4 iSCSI TransportID, format 01b (SPC-4 7.6.4.6): protocol identifier 5, the
/// initiator port name, NUL terminated and padded to a multiple of 4 (at least 20 bytes).
pub fn transport_id(initiator_port: &str) -> Vec<u8> {
    let mut name = initiator_port.as_bytes().to_vec();
    name.push(0);
    let mut len = name.len().div_ceil(4) * 4;
    len = len.max(20);
    name.resize(len, 0);
    let mut out = vec![0x40 | 0x05, 0];
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.extend_from_slice(&name);
    out
}

/// The I_T nexus of an iSCSI session (RFC 7143 §4.4.2 port names) through portal group
/// `tpgt`, which is target port `ids`.
pub fn make_nexus(initiator: &str, isid: &[u8; 6], target: &str, tpgt: u16, ids: PortIds) -> Nexus {
    let initiator_port = format!("{initiator},i,0x{}", isid_hex(isid));
    Nexus {
        id: NEXUS_ID.fetch_add(1, Ordering::Relaxed),
        transport_id: transport_id(&initiator_port),
        initiator_port,
        target_port: format!("{target},t,0x{tpgt:04x}"),
        relative_port: ids.relative_port,
        port_group: ids.port_group,
    }
}

/// The LUN map the registry grants a new normal session now rather than at its login, and
/// the target port its portal group is now: the session table's lock orders session
/// creation against a live reconfiguration, which updates the sessions already in the
/// table, so neither misses a change.
fn granted_now(s: &SessionSetup) -> (LunMap, PortIds) {
    let tag = s.params.target_portal_group_tag;
    let group = s.registry.target(&s.params.target_name).and_then(|t| {
        t.portal_groups
            .iter()
            .find(|g| g.tag == tag)
            .map(|g| (g.ids, g.admit(&s.params.initiator_name)))
    });
    let ids = group.as_ref().map_or(PortIds::alone(tag), |(ids, _)| *ids);
    if s.session_type != SessionType::Normal {
        return (s.luns.clone(), ids);
    }
    let luns = group
        .and_then(|(_, admitted)| admitted)
        .map(|(luns, _)| luns)
        .unwrap_or_default();
    (luns, ids)
}

impl Session {
    fn new(tsih: u16, s: SessionSetup, table: Weak<SessionTable>) -> Session {
        let (luns, ids) = granted_now(&s);
        let nexus = make_nexus(
            &s.params.initiator_name,
            &s.isid,
            &s.params.target_name,
            s.params.target_portal_group_tag,
            ids,
        );
        let nexus_id = nexus.id;
        let labels = (s.session_type == SessionType::Normal).then(|| {
            vec![
                ("session", format!("iscsi-{tsih}")),
                ("initiator", s.params.initiator_name.clone()),
                ("target", s.params.target_name.clone()),
                ("transport", s.transport.name().to_string()),
            ]
        });
        Session {
            tsih,
            isid: s.isid,
            session_type: s.session_type,
            nexus,
            luns: LiveLuns::new(luns, Some(s.registry.clone()), labels),
            queue_depth: s.queue_depth.max(1),
            transport: s.transport,
            peer: s.peer,
            local: s.local,
            registry: s.registry,
            pool: s.pool,
            nopin_interval: s.nopin_interval,
            nopin_timeout: s.nopin_timeout,
            busy_poll_micros: s.busy_poll_micros,
            zero_copy_reads: s.zero_copy_reads,
            stats: SessionStats::default(),
            window: Mutex::new(Window::new(s.exp_cmd_sn, s.queue_depth)),
            tasks: TaskSet::new(nexus_id),
            close: watch::channel(None).0,
            table,
            created: Instant::now(),
            ending: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            peer_socket: Mutex::new(None),
            params: s.params,
        }
    }

    pub fn window(&self) -> MutexGuard<'_, Window> {
        lock(&self.window)
    }

    /// (ExpCmdSN, MaxCmdSN) for a PDU about to be sent.
    pub fn window_snapshot(&self) -> (u32, u32) {
        let w = self.window();
        (w.exp_cmd_sn, w.max_cmd_sn())
    }

    pub fn info(&self) -> SessionInfo {
        SessionInfo {
            initiator: self.params.initiator_name.clone(),
            target: self.params.target_name.clone(),
            isid: isid_hex(&self.isid),
            tsih: self.tsih,
            session_type: self.session_type,
            transport: self.transport.name(),
            peer: self.peer,
            local: self.local,
            queue_depth: self.queue_depth,
            outstanding: self.window().outstanding(),
            commands: self.stats.commands.load(Ordering::Relaxed),
            bytes_in: self.stats.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.stats.bytes_out.load(Ordering::Relaxed),
            tasks_aborted: self.tasks.stats.aborted.load(Ordering::Relaxed),
            task_management: self.tasks.stats.task_management.load(Ordering::Relaxed),
            uptime: self.created.elapsed(),
        }
    }

    pub fn task(&self, itt: u32) -> Option<Arc<Task>> {
        self.tasks.get(u64::from(itt))
    }

    /// The session's task set.
    pub fn tasks(&self) -> &TaskSet<Task> {
        &self.tasks
    }

    /// Registers a task; fails when the ITT is in use (Reject "task in progress") or for
    /// the ACA attribute. Returns the older tasks it waits for.
    pub fn add_task(&self, task: &Arc<Task>) -> Result<Turn, Refused> {
        self.tasks.admit(task)
    }

    /// Takes a task out of the set before its response is sent and says what to send.
    /// Frees the window slot first so the response carries the new MaxCmdSN.
    pub fn retire_task(&self, task: &Task) -> Outcome {
        let out = self.tasks.retire(task);
        if !task.immediate {
            self.window().finish_task();
        }
        out
    }

    pub fn task_count(&self) -> usize {
        self.tasks.len()
    }

    /// Waits until every task has finished.
    pub async fn drain(&self) {
        self.tasks.drain().await
    }

    /// Asks the session's connections to close.
    pub fn request_close(&self, why: CloseReason) {
        self.close.send_if_modified(|c| {
            if c.is_none() {
                *c = Some(why);
                true
            } else {
                false
            }
        });
    }

    pub fn close_requested(&self) -> Option<CloseReason> {
        *self.close.borrow()
    }

    /// Resolves once a close has been requested.
    pub async fn closing(&self) -> CloseReason {
        let mut rx = self.close.subscribe();
        let why = rx
            .wait_for(|c| c.is_some())
            .await
            .map(|c| c.unwrap_or(CloseReason::Normal));
        why.unwrap_or(CloseReason::Normal)
    }

    /// Devices mapped into this session, each once.
    pub fn devices(&self) -> Vec<Arc<Device>> {
        let mut out: Vec<Arc<Device>> = Vec::new();
        for d in self.luns.current().map.luns.values() {
            if !out.iter().any(|o| Arc::ptr_eq(o, d)) {
                out.push(d.clone());
            }
        }
        out
    }

    /// Keeps a duplicate of the socket that serves this session (TCP), so that
    /// [`Session::peer_closed`] can look at it from another connection's task.
    pub fn watch_peer(&self, socket: impl AsFd) {
        if let Ok(fd) = socket.as_fd().try_clone_to_owned() {
            *lock(&self.peer_socket) = Some(fd);
        }
    }

    /// Whether the initiator closed (or reset) the session's TCP connection although its
    /// task has not seen it yet: the end of the stream (or an error) is all that is left to
    /// read. False for sessions on other transports, and while data is still queued.
    pub fn peer_closed(&self) -> bool {
        let guard = lock(&self.peer_socket);
        let Some(fd) = guard.as_ref() else {
            return false;
        };
        let mut byte = 0u8;
        // SAFETY: recv(2) with MSG_PEEK writes at most one byte into `byte`, which lives for
        // the call; `fd` is a socket this session owns a duplicate of.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => true,
            n if n > 0 => false,
            _ => !matches!(
                std::io::Error::last_os_error().kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ),
        }
    }

    /// Ends the session after its last connection is gone: aborts and waits for tasks,
    /// reports the nexus loss to every device and leaves the session table.
    pub async fn end(self: &Arc<Self>) {
        if self.ending.swap(true, Ordering::AcqRel) {
            return;
        }
        lock(&self.peer_socket).take();
        self.request_close(CloseReason::Normal);
        let tasks = self.tasks.abort_all();
        for d in self.devices() {
            d.abort_task_set(Some(&self.nexus));
        }
        for t in tasks {
            t.finished().await;
        }
        for d in self.devices() {
            d.nexus_loss(&self.nexus);
        }
        if let Some(table) = self.table.upgrade() {
            table.remove(self.tsih, self);
        }
        // A reinstating login waits for this: its commands must not meet this nexus's
        // reservation or PREVENT.
        self.ended.store(true, Ordering::Release);
        tracing::info!(
            tsih = self.tsih,
            initiator = %self.params.initiator_name,
            target = %self.params.target_name,
            "iSCSI session closed"
        );
    }

    /// Whether `end` has run to its end (the nexus loss reported to every device).
    pub fn has_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// The other live sessions of the same target (task set and reset scope).
    pub fn other_target_sessions(&self) -> Vec<Arc<Session>> {
        match self.table.upgrade() {
            Some(t) => t
                .all()
                .into_iter()
                .filter(|s| {
                    !std::ptr::eq(Arc::as_ptr(s), self)
                        && s.session_type == SessionType::Normal
                        && s.params.target_name == self.params.target_name
                })
                .collect(),
            None => Vec::new(),
        }
    }

    /// Runs a task management function (RFC 7143 §11.5.1, RFC 7144 §4.5) and returns the
    /// response code once every affected task has finished. After TARGET COLD RESET the
    /// caller closes the target's sessions once the response is out.
    pub async fn task_management(&self, req: &super::pdu::TaskMgmtRequest) -> u8 {
        let lun = rtgt_scsi::lun_from_bytes(&req.lun);
        let f = match req.function {
            tmf::ABORT_TASK => Function::AbortTask(u64::from(req.ref_task_tag)),
            tmf::ABORT_TASK_SET => Function::AbortTaskSet,
            tmf::CLEAR_ACA => Function::ClearAca,
            tmf::CLEAR_TASK_SET => Function::ClearTaskSet,
            tmf::LOGICAL_UNIT_RESET => Function::LogicalUnitReset,
            tmf::TARGET_WARM_RESET | tmf::TARGET_COLD_RESET => Function::TargetReset,
            tmf::QUERY_TASK => Function::QueryTask(u64::from(req.ref_task_tag)),
            tmf::QUERY_TASK_SET => Function::QueryTaskSet,
            tmf::I_T_NEXUS_RESET => Function::ItNexusReset,
            tmf::QUERY_ASYNC_EVENT => Function::QueryAsyncEvent,
            // ErrorRecoveryLevel 0 only (§11.5.1).
            tmf::TASK_REASSIGN => return tmf::REASSIGNMENT_NOT_SUPPORTED,
            _ => return tmf::FUNCTION_REJECTED,
        };
        let luns = self.luns.current();
        let r = task::manage(&self.tasks, &self.nexus, &luns.map, lun, f, || {
            let mut devs = self.devices();
            for s in self.other_target_sessions() {
                for d in s.devices() {
                    if !devs.iter().any(|o| Arc::ptr_eq(o, &d)) {
                        devs.push(d);
                    }
                }
            }
            devs
        })
        .await;
        match r {
            TmResponse::Complete => tmf::FUNCTION_COMPLETE,
            TmResponse::Succeeded(_) => tmf::FUNCTION_SUCCEEDED,
            TmResponse::IncorrectLun => tmf::LUN_DOES_NOT_EXIST,
            TmResponse::Rejected => tmf::NOT_SUPPORTED,
            TmResponse::NoSuchTask => {
                // §11.5.1 b): a command inside the window and before this request that has
                // not arrived counts as received, and is dropped when it does.
                let mut w = self.window();
                if w.contains(req.ref_cmd_sn) && sn_lt(req.ref_cmd_sn, req.cmd_sn) {
                    w.skip(req.ref_cmd_sn);
                    tmf::FUNCTION_COMPLETE
                } else {
                    tmf::TASK_DOES_NOT_EXIST
                }
            }
        }
    }
}

/// The live sessions of a server: TSIH allocation and lookup for reinstatement.
#[derive(Debug, Default)]
pub struct SessionTable {
    sessions: Mutex<HashMap<u16, Arc<Session>>>,
    next_tsih: Mutex<u16>,
    limit: usize,
}

impl SessionTable {
    /// A table that holds at most `limit` sessions.
    pub fn new(limit: usize) -> Arc<SessionTable> {
        Arc::new(SessionTable {
            sessions: Mutex::new(HashMap::new()),
            next_tsih: Mutex::new(1),
            limit,
        })
    }

    pub fn get(&self, tsih: u16) -> Option<Arc<Session>> {
        lock(&self.sessions).get(&tsih).cloned()
    }

    pub fn contains(&self, tsih: u16) -> bool {
        lock(&self.sessions).contains_key(&tsih)
    }

    pub fn all(&self) -> Vec<Arc<Session>> {
        let mut v: Vec<_> = lock(&self.sessions).values().cloned().collect();
        v.sort_by_key(|s| s.tsih);
        v
    }

    pub fn len(&self) -> usize {
        lock(&self.sessions).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The session a new login with this initiator name, ISID and target reinstates
    /// (RFC 7143 §6.3.5).
    pub fn find(
        &self,
        initiator: &str,
        isid: &[u8; 6],
        target: &str,
        kind: SessionType,
    ) -> Option<Arc<Session>> {
        lock(&self.sessions)
            .values()
            .find(|s| {
                s.isid == *isid
                    && s.params.initiator_name == initiator
                    && s.params.target_name == target
                    && s.session_type == kind
            })
            .cloned()
    }

    /// The sessions of initiator `initiator`.
    pub fn of_initiator(&self, initiator: &str) -> Vec<Arc<Session>> {
        lock(&self.sessions)
            .values()
            .filter(|s| s.params.initiator_name == initiator)
            .cloned()
            .collect()
    }

    /// Creates a session with a fresh non-zero TSIH; `None` when the table is full.
    pub fn create(self: &Arc<Self>, setup: SessionSetup) -> Option<Arc<Session>> {
        let mut sessions = lock(&self.sessions);
        if sessions.len() >= self.limit.min(65535) {
            return None;
        }
        let mut next = lock(&self.next_tsih);
        let mut tsih = *next;
        while tsih == 0 || sessions.contains_key(&tsih) {
            tsih = tsih.wrapping_add(1);
        }
        *next = tsih.wrapping_add(1);
        let s = Arc::new(Session::new(tsih, setup, Arc::downgrade(self)));
        sessions.insert(tsih, s.clone());
        Some(s)
    }

    fn remove(&self, tsih: u16, which: &Arc<Session>) {
        let mut sessions = lock(&self.sessions);
        if sessions.get(&tsih).is_some_and(|s| Arc::ptr_eq(s, which)) {
            sessions.remove(&tsih);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_arithmetic() {
        assert!(sn_lt(1, 2));
        assert!(!sn_lt(2, 2));
        assert!(sn_lt(0xffff_fff0, 5));
        assert!(!sn_lt(5, 0xffff_fff0));
        assert!(sn_le(7, 7));
    }

    #[test]
    fn window_is_the_queue() {
        let mut w = Window::new(10, 4);
        assert_eq!(w.max_cmd_sn(), 13);
        assert_eq!(w.check(10), SnCheck::InOrder);
        assert_eq!(w.check(13), SnCheck::Ahead);
        assert_eq!(w.check(14), SnCheck::Outside);
        assert_eq!(w.check(9), SnCheck::Outside);
        w.advance(true);
        w.advance(true);
        // Two outstanding: ExpCmdSN 12, two more slots.
        assert_eq!((w.exp_cmd_sn, w.max_cmd_sn()), (12, 13));
        w.advance(true);
        w.advance(true);
        // Full: MaxCmdSN = ExpCmdSN - 1 closes the window.
        assert_eq!((w.exp_cmd_sn, w.max_cmd_sn()), (14, 13));
        assert_eq!(w.check(14), SnCheck::Outside);
        w.finish_task();
        assert_eq!(w.max_cmd_sn(), 14);
        assert_eq!(w.check(14), SnCheck::InOrder);
    }

    #[test]
    fn window_wraps() {
        let mut w = Window::new(u32::MAX, 3);
        assert_eq!(w.max_cmd_sn(), 1);
        assert_eq!(w.check(0), SnCheck::Ahead);
        w.advance(false);
        assert_eq!(w.exp_cmd_sn, 0);
        assert_eq!(w.check(0), SnCheck::InOrder);
    }

    #[test]
    fn skipped_cmd_sn() {
        let mut w = Window::new(5, 8);
        w.skip(6);
        assert!(w.is_skipped(6));
        assert!(!w.is_skipped(6));
        w.skip(5);
        assert!(w.take_next().is_none());
        assert_eq!(w.exp_cmd_sn, 6);
    }

    #[test]
    fn nexus_names() {
        let n = make_nexus(
            "iqn.1994-05.com.redhat:host",
            &[0x23, 0xd0, 0, 0, 0, 1],
            "iqn.2025-01.io.rtgt:disk",
            1,
            PortIds {
                relative_port: 3,
                port_group: 2,
            },
        );
        assert_eq!(
            n.initiator_port,
            "iqn.1994-05.com.redhat:host,i,0x23d000000001"
        );
        assert_eq!(n.target_port, "iqn.2025-01.io.rtgt:disk,t,0x0001");
        assert_eq!((n.relative_port, n.port_group), (3, 2));
        let tid = &n.transport_id;
        assert_eq!(tid[0], 0x45);
        let len = u16::from_be_bytes([tid[2], tid[3]]) as usize;
        assert_eq!(len % 4, 0);
        assert_eq!(tid.len(), 4 + len);
        assert_eq!(
            &tid[4..4 + n.initiator_port.len()],
            n.initiator_port.as_bytes()
        );
        assert_eq!(tid[4 + n.initiator_port.len()], 0);
        // Short names are padded to the 20-byte minimum.
        assert_eq!(transport_id("a,i,0x1").len(), 24);
    }

    fn setup(initiator: &str) -> SessionSetup {
        SessionSetup {
            isid: [0x80, 0, 0, 0, 0, 1],
            session_type: SessionType::Normal,
            params: SessionParams {
                initiator_name: initiator.into(),
                ..SessionParams::default()
            },
            luns: LunMap::default(),
            exp_cmd_sn: 1,
            queue_depth: 4,
            transport: TransportKind::Tcp,
            peer: "127.0.0.1:1".parse().unwrap(),
            local: "127.0.0.1:3260".parse().unwrap(),
            registry: Registry::new(),
            pool: BufPool::new(1 << 20),
            nopin_interval: 0,
            nopin_timeout: 0,
            busy_poll_micros: 0,
            zero_copy_reads: false,
        }
    }

    /// What a login checks of the other sessions of its initiator: a session whose TCP peer
    /// closed or reset its connection shows it before its own task reads the end of stream,
    /// and not while bytes are still queued or the connection is open.
    #[tokio::test]
    async fn a_session_sees_its_peer_gone_before_its_task_does() {
        use std::io::Write;
        let table = SessionTable::new(8);
        let a = table.create(setup("iqn.2025-01.test:a")).unwrap();
        let b = table.create(setup("iqn.2025-01.test:b")).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (served, _) = listener.accept().unwrap();
        // No socket watched (iSER, or before full feature phase): never "closed".
        assert!(!a.peer_closed());
        a.watch_peer(&served);
        assert!(!a.peer_closed(), "open and idle");
        client.write_all(b"x").unwrap();
        client.flush().unwrap();
        assert!(!a.peer_closed(), "a byte is queued");
        drop(client);
        // The FIN is behind the queued byte: still data to read.
        assert!(!a.peer_closed());
        let mut one = [0u8; 1];
        std::io::Read::read_exact(&mut &served, &mut one).unwrap();
        assert!(
            eventually(|| a.peer_closed()).await,
            "end of stream is all that is left"
        );
        assert!(!b.peer_closed(), "b watches no socket yet");
        let mine = table.of_initiator("iqn.2025-01.test:a");
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].tsih, a.tsih);
        assert!(table.of_initiator("iqn.2025-01.test:c").is_empty());

        // A reset (SO_LINGER 0) reads as an error, which counts as gone too.
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (served, _) = listener.accept().unwrap();
        b.watch_peer(&served);
        let sock = socket_linger_zero(client);
        drop(sock);
        assert!(eventually(|| b.peer_closed()).await, "reset");
    }

    /// Whether `f` holds within a second (the kernel delivers a FIN or RST asynchronously).
    async fn eventually(f: impl Fn() -> bool) -> bool {
        for _ in 0..100 {
            if f() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        f()
    }

    fn socket_linger_zero(s: std::net::TcpStream) -> std::net::TcpStream {
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: setsockopt reads `size_of::<linger>()` bytes from `l`, which lives for the
        // call; the descriptor is the open socket `s` owns.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&l as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0);
        s
    }
}
