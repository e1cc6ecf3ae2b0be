//! A controller: what one host's association with a subsystem holds (its properties, features,
//! keep alive timer and asynchronous events), and the execution of its commands, admin and
//! NVM, against the subsystem's namespaces. Transports hand [`Controller::execute`] a
//! submission entry with the data it brought and send the [`Reply`]; they know nothing of the
//! commands but which way their data goes ([`Controller::data_out_len`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use rtgt_backstore::{BackstoreError, FileSlice, FileSpan, IoBuf, IoErrorKind, Latch};
use tokio::sync::Notify;

use crate::admin::{self, ana, cns, feature, log, nidt, IdController, IdNamespace, IDENTIFY_LEN};
use crate::fabrics::FabricsCmd;
use crate::nvm::{self, Rw};
use crate::queue::Transport;
use crate::sqe::{sc, sct, Sqe, Status};
use crate::subsys::{Limits, Namespace, Subsystem, Targets, ADMIN_IN_CAPSULE, DISCOVERY_NQN};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Property offsets.
pub mod property {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1c;
}

/// NVMe version reported (VS and Identify Controller): 1.4.
pub const VERSION: u32 = 0x0001_0400;
/// Keep alive granularity (KAS), in 100 ms units.
const KAS: u16 = 10;
/// Smallest read sent from a namespace's file rather than a buffer: below this a
/// `sendfile(2)` costs more than the copy it saves.
pub const FILE_RANGE_MIN: u64 = 64 << 10;
/// Outstanding Asynchronous Event Requests a controller takes (AERL + 1).
const AER_LIMIT: usize = 4;
/// Events kept for hosts with no request outstanding.
const EVENT_LIMIT: usize = 16;

/// What kind of controller.
#[derive(Debug)]
pub enum Kind {
    Io(Arc<Subsystem>),
    Discovery,
}

/// A command's outcome: status, DW0 of the completion, and data for the host.
#[derive(Debug)]
pub struct Reply {
    pub status: Status,
    pub dw0: u32,
    /// DW1 (the high half of an 8-byte property).
    pub dw1: u32,
    pub data: Option<Vec<u8>>,
    /// Data read from a namespace, in a pool buffer (a read's).
    pub buf: Option<IoBuf>,
    /// Data of a namespace to send from its file instead (a read's, when the transport
    /// asked for file ranges).
    pub range: Option<FileSlice>,
}

/// A reply's data for the host, clipped to what the command's SGL describes.
#[derive(Debug)]
pub enum Payload {
    None,
    Vec(Vec<u8>, usize),
    Buf(IoBuf, usize),
    /// Only when the transport asked for file ranges; already clipped.
    File(FileSlice),
}

impl Payload {
    /// The bytes in memory: none for [`Payload::File`].
    pub fn bytes(&self) -> &[u8] {
        match self {
            Payload::None | Payload::File(_) => &[],
            Payload::Vec(v, n) => &v[..*n],
            Payload::Buf(b, n) => &b.as_slice()[..*n],
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Payload::File(f) => f.len() as usize,
            _ => self.bytes().len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Reply {
    /// Takes the reply's data (a read's buffer, else what the controller made), at most
    /// `host_len` bytes of it.
    pub fn take_payload(&mut self, host_len: usize) -> Payload {
        if let Some(mut f) = self.range.take() {
            f.truncate(host_len as u64);
            return Payload::File(f);
        }
        match (self.buf.take(), self.data.take()) {
            (Some(b), _) => {
                let n = b.len().min(host_len);
                Payload::Buf(b, n)
            }
            (None, Some(v)) => {
                let n = v.len().min(host_len);
                Payload::Vec(v, n)
            }
            (None, None) => Payload::None,
        }
    }

    fn ok() -> Reply {
        Reply::status(Status::SUCCESS)
    }

    /// A reply with `status` and nothing else.
    pub fn status(status: Status) -> Reply {
        Reply {
            status,
            dw0: 0,
            dw1: 0,
            data: None,
            buf: None,
            range: None,
        }
    }

    fn dw0(dw0: u32) -> Reply {
        Reply { dw0, ..Reply::ok() }
    }

    fn data(data: Vec<u8>) -> Reply {
        Reply {
            data: Some(data),
            ..Reply::ok()
        }
    }

    fn error(sc: u8) -> Reply {
        Reply::status(Status::error(sct::GENERIC, sc))
    }
}

#[derive(Debug, Default)]
struct State {
    cc: u32,
    csts: u32,
    /// Asynchronous event configuration (Set Features 0Bh).
    aec: u32,
    /// Namespaces changed since the host last read the log (Changed Namespace List).
    changed_ns: Vec<u32>,
    /// Events (completion DW0) waiting for a request.
    events: VecDeque<u32>,
    /// Log pages whose event was reported and not read yet: their events are masked.
    masked: Vec<u8>,
    /// ANA changes so far (the ANA log's change count).
    ana_chgcnt: u64,
}

/// What one queue (or, for commands run outside one, the controller) has done: its own
/// counters, so that a controller's queues share no cache line on the data path.
#[derive(Debug, Default)]
pub struct QueueStats {
    /// Commands executed.
    pub commands: AtomicU64,
    /// Bytes written by the host (I/O data to the controller).
    pub bytes_in: AtomicU64,
    /// Bytes read by the host.
    pub bytes_out: AtomicU64,
    /// Commands executing now.
    pub outstanding: AtomicU32,
    /// Entries of the submission queue (0 for the controller's own counters).
    pub size: u16,
    /// The host's address of the queue's connection, when it has one.
    pub peer: Option<std::net::SocketAddr>,
}

/// What a controller has done, its queues' counters summed, for the API and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub commands: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub outstanding: u32,
    /// Queues connected now (admin and I/O).
    pub queues: u32,
}

impl Stats {
    fn add(&mut self, q: &QueueStats) {
        self.commands += q.commands.load(Ordering::Relaxed);
        self.bytes_in += q.bytes_in.load(Ordering::Relaxed);
        self.bytes_out += q.bytes_out.load(Ordering::Relaxed);
        self.outstanding += q.outstanding.load(Ordering::Relaxed);
    }
}

/// Counts a command as outstanding while it lives.
struct InFlight<'a>(&'a QueueStats);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A queue attached to its controller ([`Controller::attach`]), with its counters.
#[derive(Debug)]
pub struct Attached {
    ctrl: Arc<Controller>,
    qid: u16,
    stats: Arc<QueueStats>,
}

impl Attached {
    /// The queue's counters, for the transport to execute its commands on
    /// ([`Controller::execute_on`]).
    pub fn stats(&self) -> Arc<QueueStats> {
        self.stats.clone()
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        {
            let mut queues = lock(&self.ctrl.queues);
            queues.retain(|(_, q)| !Arc::ptr_eq(q, &self.stats));
        }
        // What the queue did stays in the controller's totals.
        let r = &self.ctrl.retired;
        let s = &self.stats;
        r.commands
            .fetch_add(s.commands.load(Ordering::Relaxed), Ordering::Relaxed);
        r.bytes_in
            .fetch_add(s.bytes_in.load(Ordering::Relaxed), Ordering::Relaxed);
        r.bytes_out
            .fetch_add(s.bytes_out.load(Ordering::Relaxed), Ordering::Relaxed);
        if self.qid == 0 {
            self.ctrl.close();
        }
    }
}

/// One host's controller.
#[derive(Debug)]
pub struct Controller {
    pub cntlid: u16,
    pub kind: Kind,
    pub host_nqn: String,
    pub host_id: [u8; 16],
    targets: Weak<Targets>,
    io_queues: AtomicU16,
    kato_ms: AtomicU32,
    /// Milliseconds since `epoch` at the last command (keep alive).
    seen: AtomicU64,
    epoch: Instant,
    state: Mutex<State>,
    aers: AtomicU32,
    event: Notify,
    closed: Latch,
    /// The counters of the queues attached now, by queue ID.
    queues: Mutex<Vec<(u16, Arc<QueueStats>)>>,
    /// The counters of queues gone, and of commands run outside a queue.
    retired: QueueStats,
    /// When the host created it (the admin queue's Connect).
    pub created: Instant,
    /// The admin queue's peer and local addresses, when the transport knows them.
    addrs: Mutex<Option<(std::net::SocketAddr, std::net::SocketAddr)>>,
    /// The admin queue's transport.
    transport: std::sync::OnceLock<Transport>,
    /// The port the admin queue came through (`None`: a discovery-only listener).
    port: Option<u16>,
    /// That port's target port group.
    port_group: AtomicU16,
    /// In-capsule data its I/O commands may carry (its port's when it was created).
    in_capsule: u32,
}

impl Controller {
    pub(crate) fn new(
        cntlid: u16,
        kind: Kind,
        host_nqn: String,
        host_id: [u8; 16],
        kato_ms: u32,
        port: Option<u16>,
        targets: Weak<Targets>,
    ) -> Arc<Controller> {
        let ctrl = Arc::new(Controller {
            cntlid,
            kind,
            host_nqn,
            host_id,
            io_queues: AtomicU16::new(0),
            kato_ms: AtomicU32::new(kato_ms),
            seen: AtomicU64::new(0),
            epoch: Instant::now(),
            state: Mutex::new(State::default()),
            aers: AtomicU32::new(0),
            event: Notify::new(),
            closed: Latch::default(),
            queues: Mutex::new(Vec::new()),
            retired: QueueStats::default(),
            created: Instant::now(),
            addrs: Mutex::new(None),
            transport: std::sync::OnceLock::new(),
            port,
            port_group: AtomicU16::new(0),
            in_capsule: port
                .zip(targets.upgrade())
                .map_or(ADMIN_IN_CAPSULE, |(p, t)| t.in_capsule(p)),
            targets,
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(keep_alive(Arc::downgrade(&ctrl)));
        }
        ctrl
    }

    pub fn subsys_nqn(&self) -> &str {
        match &self.kind {
            Kind::Io(s) => &s.nqn,
            Kind::Discovery => DISCOVERY_NQN,
        }
    }

    /// The port the controller's admin queue came through.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// In-capsule data the controller's I/O commands may carry, in bytes (IOCCSZ).
    pub fn in_capsule(&self) -> u32 {
        self.in_capsule
    }

    /// The target port group of the controller's port.
    fn port_group(&self) -> u16 {
        self.port_group.load(Ordering::Relaxed)
    }

    /// The controller's port is now in target port group `group`.
    pub(crate) fn set_port_group(&self, group: u16) {
        self.port_group.store(group, Ordering::Relaxed);
    }

    /// Tells the host that the access state of its namespaces may have changed (an ANA
    /// change event, if it asked to hear of them: Asynchronous Event Configuration bit 11).
    pub fn ana_changed(&self) {
        if !matches!(self.kind, Kind::Io(_)) {
            return;
        }
        let mut st = lock(&self.state);
        st.ana_chgcnt += 1;
        let wanted = st.aec & 1 << 11 != 0;
        drop(st);
        if wanted {
            self.post_event(admin::event::NOTICE, admin::event::ANA_CHANGE, log::ANA);
        }
    }

    /// I/O queues allocated (Set Features Number of Queues).
    pub fn io_queues(&self) -> u16 {
        self.io_queues.load(Ordering::Relaxed)
    }

    /// A queue of the controller connected; the admin queue's addresses name the
    /// association. The queue lasts as long as the handle: dropping it (the connection ended,
    /// or its task was stopped) ends the queue, and the association with the admin queue.
    pub fn attach(
        self: &Arc<Self>,
        qid: u16,
        size: u16,
        addrs: Option<(std::net::SocketAddr, std::net::SocketAddr)>,
        transport: Transport,
    ) -> Attached {
        let stats = Arc::new(QueueStats {
            size,
            peer: addrs.map(|a| a.0),
            ..QueueStats::default()
        });
        lock(&self.queues).push((qid, stats.clone()));
        if qid == 0 {
            *lock(&self.addrs) = addrs;
            let _ = self.transport.set(transport);
        }
        Attached {
            ctrl: self.clone(),
            qid,
            stats,
        }
    }

    /// What the controller has done: its queues' counters and those of queues gone.
    pub fn stats(&self) -> Stats {
        let queues = lock(&self.queues);
        let mut s = Stats {
            queues: queues.len() as u32,
            ..Stats::default()
        };
        s.add(&self.retired);
        for (_, q) in queues.iter() {
            s.add(q);
        }
        s
    }

    /// The counters of each queue attached now, by queue ID.
    pub fn queue_stats(&self) -> Vec<(u16, Arc<QueueStats>)> {
        let mut v = lock(&self.queues).clone();
        v.sort_by_key(|(qid, _)| *qid);
        v
    }

    /// The admin queue's transport (TCP until it attached).
    pub fn transport(&self) -> Transport {
        self.transport.get().copied().unwrap_or(Transport::Tcp)
    }

    /// The admin queue's peer and local addresses.
    pub fn addrs(&self) -> Option<(std::net::SocketAddr, std::net::SocketAddr)> {
        *lock(&self.addrs)
    }

    /// Ends the association: every queue's connection closes.
    pub fn close(&self) {
        if self.closed.set() {
            tracing::info!(cntlid = self.cntlid, host = %self.host_nqn,
                subsystem = %self.subsys_nqn(), "controller closed");
        }
        self.event.notify_waiters();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.is_set()
    }

    /// Resolves once the controller is closed (keep alive expired, the admin queue gone).
    pub async fn closed(&self) {
        self.closed.wait().await
    }

    fn touch(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.seen.store(ms, Ordering::Relaxed);
    }

    /// Bytes of data the command brings from the host (its SGL's length when its data goes
    /// to the controller, else 0).
    pub fn data_out_len(sqe: &Sqe) -> usize {
        let to_controller = match FabricsCmd::parse(sqe) {
            Some(_) => sqe.fctype() & 1 != 0,
            None => sqe.opcode & 1 != 0,
        };
        if !to_controller {
            return 0;
        }
        sqe.sgl().data_len().unwrap_or(0) as usize
    }

    /// Posts an asynchronous event (completion DW0: type, information, log page), unless one
    /// of its kind is reported and not yet cleared by reading the log.
    pub fn post_event(&self, ty: u8, info: u8, lid: u8) {
        let mut st = lock(&self.state);
        if st.masked.contains(&lid) || st.events.len() >= EVENT_LIMIT {
            return;
        }
        st.masked.push(lid);
        st.events
            .push_back(u32::from(ty) | u32::from(info) << 8 | u32::from(lid) << 16);
        drop(st);
        self.event.notify_one();
    }

    /// Tells the host that namespace `nsid` changed (added, removed, resized), if it asked to
    /// hear of it (Asynchronous Event Configuration bit 8).
    pub fn namespace_changed(&self, nsid: u32) {
        let mut st = lock(&self.state);
        if !st.changed_ns.contains(&nsid) && st.changed_ns.len() < 1024 {
            st.changed_ns.push(nsid);
        }
        let wanted = st.aec & 1 << 8 != 0;
        drop(st);
        if wanted {
            self.post_event(
                admin::event::NOTICE,
                admin::event::NAMESPACE_CHANGED,
                log::CHANGED_NAMESPACES,
            );
        }
    }

    /// Executes a command of queue `qid`, counted with the controller's own counters;
    /// `data` is what the host sent with it.
    pub async fn execute(&self, qid: u16, sqe: &Sqe, data: Option<IoBuf>) -> Reply {
        self.execute_on(&self.retired, qid, sqe, data, false).await
    }

    /// Executes a command of queue `qid` counted on `stats` (the queue's, from
    /// [`Attached::stats`]). With `file_ranges` a read of at least [`FILE_RANGE_MIN`] bytes
    /// from a namespace whose data lives in a file ([`FileSlice::of`]) answers with the range
    /// ([`Reply::range`]) for the transport to send from the page cache.
    pub async fn execute_on(
        &self,
        stats: &QueueStats,
        qid: u16,
        sqe: &Sqe,
        data: Option<IoBuf>,
        file_ranges: bool,
    ) -> Reply {
        stats.outstanding.fetch_add(1, Ordering::Relaxed);
        let _in_flight = InFlight(stats);
        stats.commands.fetch_add(1, Ordering::Relaxed);
        if qid != 0 {
            if let Some(d) = &data {
                stats.bytes_in.fetch_add(d.len() as u64, Ordering::Relaxed);
            }
        }
        let reply = self.dispatch(qid, sqe, data, file_ranges).await;
        if qid != 0 {
            let out = reply.buf.as_ref().map(|b| b.len() as u64);
            if let Some(n) = out.or(reply.range.as_ref().map(|r| r.len())) {
                stats.bytes_out.fetch_add(n, Ordering::Relaxed);
            }
        }
        reply
    }

    async fn dispatch(&self, qid: u16, sqe: &Sqe, data: Option<IoBuf>, file_ranges: bool) -> Reply {
        if self.is_closed() {
            return Reply::status(Status {
                dnr: false,
                ..Status::error(sct::PATH, sc::INTERNAL_PATH_ERROR)
            });
        }
        if qid == 0 {
            self.touch();
        }
        if sqe.psdt() == 0 {
            // PRPs: not on a fabric.
            return Reply::error(sc::INVALID_FIELD);
        }
        if let Some(cmd) = FabricsCmd::parse(sqe) {
            return self.fabrics(qid, cmd);
        }
        if !self.ready() {
            return Reply::error(sc::COMMAND_SEQUENCE_ERROR);
        }
        if qid == 0 {
            self.admin(sqe).await
        } else {
            match &self.kind {
                Kind::Io(s) => self.io(s, sqe, data, file_ranges).await,
                Kind::Discovery => Reply::error(sc::INVALID_OPCODE),
            }
        }
    }

    fn ready(&self) -> bool {
        lock(&self.state).csts & 1 != 0
    }

    fn fabrics(&self, qid: u16, cmd: FabricsCmd) -> Reply {
        match cmd {
            FabricsCmd::PropertyGet { eight, offset } if qid == 0 => {
                match self.property(offset, eight) {
                    Some(v) => Reply {
                        dw1: (v >> 32) as u32,
                        ..Reply::dw0(v as u32)
                    },
                    None => Reply::error(sc::INVALID_FIELD),
                }
            }
            FabricsCmd::PropertySet {
                eight: false,
                offset: property::CC,
                value,
            } if qid == 0 => {
                let cc = value as u32;
                let mut st = lock(&self.state);
                st.cc = cc;
                // EN -> RDY; a shutdown notification completes at once.
                st.csts = u32::from(cc & 1 != 0);
                if cc >> 14 & 3 != 0 {
                    st.csts |= 2 << 2;
                }
                Reply::ok()
            }
            FabricsCmd::PropertySet { .. } => Reply::error(sc::INVALID_FIELD),
            FabricsCmd::Disconnect { .. } => Reply::ok(),
            // Connect is the transport's, once per queue; authentication is not offered.
            _ => Reply::error(sc::COMMAND_SEQUENCE_ERROR),
        }
    }

    fn property(&self, offset: u32, eight: bool) -> Option<u64> {
        let limits = self.targets.upgrade().map(|t| t.limits).unwrap_or_default();
        let st = lock(&self.state);
        match (offset, eight) {
            // MQES (zero based), CQR, TO (500 ms units), CSS: NVM.
            (property::CAP, true) => {
                Some(u64::from(limits.queue_size - 1) | 1 << 16 | 15 << 24 | 1 << 37)
            }
            (property::VS, false) => Some(u64::from(VERSION)),
            (property::CC, false) => Some(u64::from(st.cc)),
            (property::CSTS, false) => Some(u64::from(st.csts)),
            _ => None,
        }
    }

    /// An admin command (none of those served takes data from the host).
    async fn admin(&self, sqe: &Sqe) -> Reply {
        let [c10, c11, c12, c13, ..] = sqe.cdw;
        match sqe.opcode {
            admin::opcode::IDENTIFY => self.identify(sqe),
            admin::opcode::GET_LOG_PAGE => {
                self.get_log_page(admin::GetLogPage::from_cdw(c10, c11, c12, c13))
            }
            admin::opcode::SET_FEATURES => self.set_features(sqe).await,
            admin::opcode::GET_FEATURES => self.get_features(sqe),
            admin::opcode::KEEP_ALIVE => Reply::ok(),
            admin::opcode::ASYNC_EVENT_REQUEST => self.async_event().await,
            // Commands run to their end here: nothing is aborted (DW0 bit 0 set).
            admin::opcode::ABORT => Reply::dw0(1),
            _ => Reply::error(sc::INVALID_OPCODE),
        }
    }

    fn identify(&self, sqe: &Sqe) -> Reply {
        let id = admin::Identify::from_cdw(sqe.cdw[0], sqe.cdw[1]);
        let subsystem = match &self.kind {
            Kind::Io(s) => Some(s),
            Kind::Discovery => None,
        };
        match (id.cns, subsystem) {
            (cns::CONTROLLER, _) => Reply::data(self.id_controller().to_bytes()),
            (cns::NAMESPACE, Some(s)) => match s.namespace(sqe.nsid) {
                Some(ns) => Reply::data(id_namespace(&ns).to_bytes()),
                // An inactive namespace ID: zeroes.
                None if sqe.nsid != 0 && sqe.nsid != u32::MAX => Reply::data(vec![0; IDENTIFY_LEN]),
                None => Reply::error(sc::INVALID_NAMESPACE),
            },
            (cns::ACTIVE_NAMESPACES, Some(s)) => {
                let mut b = vec![0u8; IDENTIFY_LEN];
                for (i, nsid) in s
                    .nsids()
                    .into_iter()
                    .filter(|&n| n > sqe.nsid)
                    .take(IDENTIFY_LEN / 4)
                    .enumerate()
                {
                    b[4 * i..4 * i + 4].copy_from_slice(&nsid.to_le_bytes());
                }
                Reply::data(b)
            }
            (cns::NAMESPACE_DESCRIPTORS, Some(s)) => match s.namespace(sqe.nsid) {
                Some(ns) => {
                    let mut ids: Vec<(u8, &[u8])> = vec![(nidt::NGUID, &ns.nguid)];
                    if ns.eui64 != [0; 8] {
                        ids.push((nidt::EUI64, &ns.eui64));
                    }
                    ids.push((nidt::UUID, &ns.uuid));
                    ids.push((nidt::CSI, &[0]));
                    Reply::data(admin::ns_descriptors(&ids))
                }
                None => Reply::error(sc::INVALID_NAMESPACE),
            },
            // The NVM command set's controller data: nothing beyond the defaults.
            (cns::CS_CONTROLLER, Some(_)) if id.csi == 0 => Reply::data(vec![0; IDENTIFY_LEN]),
            _ => Reply::error(sc::INVALID_FIELD),
        }
    }

    fn id_controller(&self) -> IdController {
        let (limits, anatt) = self
            .targets
            .upgrade()
            .map(|t| (t.limits, t.ana_transition_secs()))
            .unwrap_or_default();
        let (serial, model, nn) = match &self.kind {
            Kind::Io(s) => (
                s.serial.clone(),
                s.model.clone(),
                s.nsids().last().copied().unwrap_or(0).max(1024),
            ),
            Kind::Discovery => (String::new(), "rtgt discovery".into(), 0),
        };
        let io = matches!(self.kind, Kind::Io(_));
        IdController {
            serial,
            model,
            firmware: env!("CARGO_PKG_VERSION").into(),
            // Several ports and controllers may reach a namespace; ANA reporting.
            cmic: if io { 0x0b } else { 0 },
            mdts: limits.mdts,
            cntlid: self.cntlid,
            ver: VERSION,
            // Namespace attribute and ANA change notices; discovery log changes.
            oaes: if io { 1 << 8 | 1 << 11 } else { 1 << 31 },
            // 128-bit host identifiers.
            ctratt: 1,
            cntrltype: if io { 1 } else { 2 },
            acl: 3,
            aerl: AER_LIMIT as u8 - 1,
            // Extended data for Get Log Page (offsets).
            lpa: 0x04,
            kas: KAS,
            anatt: if io { anatt } else { 0 },
            anacap: if io { ana::ANACAP } else { 0 },
            // Every namespace is a group of its own: as many groups as namespaces.
            anagrpmax: if io { nn } else { 0 },
            nanagrpid: if io { nn } else { 0 },
            mnan: nn,
            maxcmd: limits.queue_size,
            nn,
            // Compare, Dataset Management, Write Zeroes.
            oncs: if io { 0x0d } else { 0 },
            vwc: u8::from(io),
            // SGLs (byte aligned), keyed data blocks, offsets for in-capsule data.
            sgls: 0x0010_0005,
            subnqn: self.subsys_nqn().into(),
            ioccsz: (64 + self.in_capsule) / 16,
            iorcsz: 1,
            msdbd: 1,
            ..IdController::default()
        }
    }

    fn get_log_page(&self, g: admin::GetLogPage) -> Reply {
        let page = match (g.lid, &self.kind) {
            (log::ERROR, _) => vec![0u8; 64],
            (log::SMART, Kind::Io(_)) => {
                let mut b = vec![0u8; 512];
                // Temperature 293 K, available spare 100 %, threshold 10 %.
                b[1..3].copy_from_slice(&293u16.to_le_bytes());
                b[3] = 100;
                b[4] = 10;
                b
            }
            (log::CHANGED_NAMESPACES, Kind::Io(_)) => {
                let mut st = lock(&self.state);
                let mut b = vec![0u8; 4096];
                if st.changed_ns.len() >= 1024 {
                    b[..4].copy_from_slice(&u32::MAX.to_le_bytes());
                } else {
                    for (i, n) in st.changed_ns.iter().enumerate() {
                        b[4 * i..4 * i + 4].copy_from_slice(&n.to_le_bytes());
                    }
                }
                if !g.rae {
                    st.changed_ns.clear();
                    st.masked.retain(|l| *l != g.lid);
                }
                b
            }
            (log::ANA, Kind::Io(s)) => {
                let group = self.port_group();
                let mut st = lock(&self.state);
                if !g.rae {
                    st.masked.retain(|l| *l != g.lid);
                }
                let chgcnt = st.ana_chgcnt;
                drop(st);
                let groups: Vec<admin::AnaGroup> = s
                    .nsids()
                    .into_iter()
                    .filter_map(|n| s.namespace(n))
                    .map(|ns| admin::AnaGroup {
                        grpid: ns.ana_group(),
                        chgcnt,
                        state: ns.ana_state(group),
                        nsids: vec![ns.nsid],
                    })
                    .collect();
                admin::ana_log(chgcnt, &groups, g.lsp & ana::RGO != 0)
            }
            (log::DISCOVERY, Kind::Discovery) => {
                if !g.rae {
                    lock(&self.state).masked.retain(|l| *l != g.lid);
                }
                match self.targets.upgrade() {
                    Some(t) => t.discovery_log(&self.host_nqn, self.addrs().map(|a| a.1.ip())),
                    None => admin::discovery_log(0, &[]),
                }
            }
            _ => return Reply::status(Status::error(sct::COMMAND_SPECIFIC, sc::INVALID_LOG_PAGE)),
        };
        let Ok(offset) = usize::try_from(g.offset) else {
            return Reply::error(sc::INVALID_FIELD);
        };
        if offset > page.len() || offset % 4 != 0 {
            return Reply::error(sc::INVALID_FIELD);
        }
        // Beyond the page, zeroes (up to 1 MiB: the host's buffer is the transport's).
        let want = usize::try_from(g.len).unwrap_or(usize::MAX).min(1 << 20);
        let mut out = page[offset..].to_vec();
        out.resize(want, 0);
        Reply::data(out)
    }

    async fn set_features(&self, sqe: &Sqe) -> Reply {
        let [c10, c11, ..] = sqe.cdw;
        if c10 & 1 << 31 != 0 {
            return Reply::status(Status::error(
                sct::COMMAND_SPECIFIC,
                sc::FEATURE_NOT_SAVEABLE,
            ));
        }
        match c10 as u8 {
            feature::NUMBER_OF_QUEUES => {
                if !matches!(self.kind, Kind::Io(_)) {
                    return Reply::error(sc::INVALID_FIELD);
                }
                if c11 & 0xffff == 0xffff || c11 >> 16 == 0xffff {
                    return Reply::error(sc::INVALID_FIELD);
                }
                let max = self.targets.upgrade().map(|t| t.limits).unwrap_or_default();
                let wanted = (c11 & 0xffff).max(c11 >> 16) as u16 + 1;
                let n = wanted.min(max.io_queues);
                self.io_queues.store(n, Ordering::Relaxed);
                Reply::dw0(u32::from(n - 1) | u32::from(n - 1) << 16)
            }
            feature::KEEP_ALIVE_TIMER => {
                self.kato_ms.store(c11, Ordering::Relaxed);
                self.touch();
                Reply::ok()
            }
            feature::ASYNC_EVENT_CONFIG => {
                lock(&self.state).aec = c11;
                Reply::ok()
            }
            feature::VOLATILE_WRITE_CACHE => match &self.kind {
                Kind::Io(s) => {
                    for nsid in s.nsids() {
                        if let Some(ns) = s.namespace(nsid) {
                            if ns.backstore.set_write_cache(c11 & 1 != 0).await.is_err() {
                                return Reply::error(sc::INTERNAL_ERROR);
                            }
                        }
                    }
                    Reply::ok()
                }
                Kind::Discovery => Reply::error(sc::INVALID_FIELD),
            },
            _ => Reply::status(Status::error(
                sct::COMMAND_SPECIFIC,
                sc::FEATURE_NOT_CHANGEABLE,
            )),
        }
    }

    fn get_features(&self, sqe: &Sqe) -> Reply {
        let c10 = sqe.cdw[0];
        match c10 as u8 {
            feature::NUMBER_OF_QUEUES => {
                let n = u32::from(self.io_queues().max(1) - 1);
                Reply::dw0(n | n << 16)
            }
            feature::KEEP_ALIVE_TIMER => Reply::dw0(self.kato_ms.load(Ordering::Relaxed)),
            feature::ASYNC_EVENT_CONFIG => Reply::dw0(lock(&self.state).aec),
            feature::VOLATILE_WRITE_CACHE => {
                let on = match &self.kind {
                    Kind::Io(s) => s
                        .nsids()
                        .first()
                        .and_then(|&n| s.namespace(n))
                        .is_none_or(|ns| ns.backstore.info().write_cache),
                    Kind::Discovery => false,
                };
                Reply::dw0(u32::from(on))
            }
            feature::ARBITRATION | feature::POWER_MANAGEMENT | feature::ERROR_RECOVERY => {
                Reply::dw0(0)
            }
            feature::HOST_ID => Reply::data(self.host_id.to_vec()),
            _ => Reply::error(sc::INVALID_FIELD),
        }
    }

    /// An Asynchronous Event Request: completes with the next event (or never, until the
    /// controller closes).
    async fn async_event(&self) -> Reply {
        if self.aers.fetch_add(1, Ordering::SeqCst) as usize >= AER_LIMIT {
            self.aers.fetch_sub(1, Ordering::SeqCst);
            return Reply::status(Status::error(
                sct::COMMAND_SPECIFIC,
                sc::ASYNC_EVENT_LIMIT_EXCEEDED,
            ));
        }
        let reply = loop {
            let wait = self.event.notified();
            if let Some(ev) = lock(&self.state).events.pop_front() {
                break Reply::dw0(ev);
            }
            if self.is_closed() {
                break Reply::status(Status::error(sct::GENERIC, sc::ABORTED_SQ_DELETION));
            }
            wait.await;
        };
        self.aers.fetch_sub(1, Ordering::SeqCst);
        reply
    }

    async fn io(&self, s: &Subsystem, sqe: &Sqe, data: Option<IoBuf>, file_ranges: bool) -> Reply {
        let Some(ns) = s.namespace(sqe.nsid) else {
            return Reply::error(sc::INVALID_NAMESPACE);
        };
        if ns.access.is_some() {
            // Through another controller's port the namespace may be reachable: no DNR.
            let path = |code| {
                Reply::status(Status {
                    dnr: false,
                    ..Status::error(sct::PATH, code)
                })
            };
            match ns.ana_state(self.port_group()) {
                ana::OPTIMIZED | ana::NON_OPTIMIZED => {}
                ana::PERSISTENT_LOSS => return path(sc::ANA_PERSISTENT_LOSS),
                ana::CHANGE => return path(sc::ANA_TRANSITION),
                _ => return path(sc::ANA_INACCESSIBLE),
            }
        }
        let info = ns.backstore.info();
        let bs = u64::from(info.block_size);
        let in_range = |rw: &Rw| {
            rw.slba
                .checked_add(u64::from(rw.blocks))
                .is_some_and(|end| end <= info.num_blocks)
        };
        let max = self
            .targets
            .upgrade()
            .map_or(Limits::default(), |t| t.limits)
            .max_transfer() as u64;
        match sqe.opcode {
            nvm::opcode::FLUSH => done(ns.backstore.flush().await.map(|_| ()), false),
            nvm::opcode::READ | nvm::opcode::WRITE | nvm::opcode::COMPARE => {
                let rw = Rw::parse(sqe);
                let len = u64::from(rw.blocks) * bs;
                if !in_range(&rw) {
                    return Reply::error(sc::LBA_OUT_OF_RANGE);
                }
                if len > max {
                    return Reply::error(sc::INVALID_FIELD);
                }
                if sqe.sgl().data_len().map(u64::from) != Some(len) {
                    return Reply::error(sc::SGL_INVALID_DATA_LENGTH);
                }
                let offset = rw.slba * bs;
                let write = sqe.opcode == nvm::opcode::WRITE;
                if write && (info.read_only || ns.read_only) {
                    return Reply::error(sc::NAMESPACE_WRITE_PROTECTED);
                }
                if sqe.opcode == nvm::opcode::READ {
                    if file_ranges && len >= FILE_RANGE_MIN {
                        if let Some(range) = FileSlice::of(&ns.backstore, offset, len) {
                            return Reply {
                                range: Some(range),
                                ..Reply::ok()
                            };
                        }
                    }
                    let buf = self.pool_get(len as usize).await;
                    let (r, buf) = ns.backstore.read(offset, buf).await;
                    return match r {
                        Ok(()) => Reply {
                            buf: Some(buf),
                            ..Reply::ok()
                        },
                        Err(e) => failed(&e, false),
                    };
                }
                let Some(data) = data.filter(|d| d.len() as u64 == len) else {
                    return Reply::error(sc::DATA_TRANSFER_ERROR);
                };
                if write {
                    let (r, _) = ns.backstore.write(offset, data, rw.fua).await;
                    return done(r, true);
                }
                let buf = self.pool_get(len as usize).await;
                let (r, buf) = ns.backstore.read(offset, buf).await;
                match r {
                    Ok(()) if buf.as_slice() == data.as_slice() => Reply::ok(),
                    Ok(()) => Reply::status(Status::error(sct::MEDIA, sc::COMPARE_FAILURE)),
                    Err(e) => failed(&e, false),
                }
            }
            nvm::opcode::WRITE_ZEROES => {
                let rw = Rw::parse(sqe);
                if !in_range(&rw) {
                    return Reply::error(sc::LBA_OUT_OF_RANGE);
                }
                if info.read_only || ns.read_only {
                    return Reply::error(sc::NAMESPACE_WRITE_PROTECTED);
                }
                self.write_zeroes(
                    &ns,
                    rw.slba * bs,
                    u64::from(rw.blocks) * bs,
                    rw.deac && info.thin,
                )
                .await
            }
            nvm::opcode::DATASET_MANAGEMENT => {
                let (count, attr) = nvm::dsm_fields(sqe);
                let ranges = data
                    .as_ref()
                    .map(|d| nvm::dsm_ranges(d.as_slice(), count))
                    .unwrap_or_default();
                if ranges.len() != count {
                    return Reply::error(sc::DATA_TRANSFER_ERROR);
                }
                if attr & nvm::DSM_DEALLOCATE == 0 || !info.thin {
                    // Hints only, or nothing to deallocate with: done.
                    return Reply::ok();
                }
                for r in &ranges {
                    let rw = Rw {
                        slba: r.slba,
                        blocks: r.blocks,
                        fua: false,
                        lr: false,
                        deac: true,
                    };
                    if !in_range(&rw) {
                        return Reply::error(sc::LBA_OUT_OF_RANGE);
                    }
                }
                for r in ranges.iter().filter(|r| r.blocks > 0) {
                    if let Err(e) = ns
                        .backstore
                        .unmap(r.slba * bs, u64::from(r.blocks) * bs)
                        .await
                    {
                        if e.kind() != IoErrorKind::Unsupported {
                            return failed(&e, true);
                        }
                    }
                }
                Reply::ok()
            }
            _ => Reply::error(sc::INVALID_OPCODE),
        }
    }

    async fn pool_get(&self, len: usize) -> IoBuf {
        match self.targets.upgrade() {
            Some(t) => t.pool.get(len).await,
            None => IoBuf::zeroed(len),
        }
    }

    async fn write_zeroes(&self, ns: &Namespace, offset: u64, len: u64, deallocate: bool) -> Reply {
        if deallocate {
            match ns.backstore.unmap(offset, len).await {
                Ok(()) => return Reply::ok(),
                Err(e) if e.kind() != IoErrorKind::Unsupported => return failed(&e, true),
                Err(_) => {}
            }
        }
        const CHUNK: u64 = 1 << 20;
        let mut at = 0;
        while at < len {
            let n = (len - at).min(CHUNK) as usize;
            let mut buf = self.pool_get(n).await;
            buf.as_mut_slice().fill(0);
            let (r, _) = ns.backstore.write(offset + at, buf, false).await;
            if let Err(e) = r {
                return failed(&e, true);
            }
            at += n as u64;
        }
        Reply::ok()
    }
}

fn done(r: Result<(), BackstoreError>, modifies: bool) -> Reply {
    match r {
        Ok(()) => Reply::ok(),
        Err(e) => failed(&e, modifies),
    }
}

/// The status of a failed backstore operation.
fn failed(e: &BackstoreError, modifies: bool) -> Reply {
    tracing::warn!(error = %e, "namespace I/O failed");
    let status = match e.kind() {
        IoErrorKind::Medium if modifies => Status::error(sct::MEDIA, sc::WRITE_FAULT),
        IoErrorKind::Medium => Status::error(sct::MEDIA, sc::UNRECOVERED_READ_ERROR),
        IoErrorKind::NoSpace => Status::error(sct::GENERIC, sc::CAPACITY_EXCEEDED),
        IoErrorKind::ReadOnly => Status::error(sct::GENERIC, sc::NAMESPACE_WRITE_PROTECTED),
        IoErrorKind::Unsupported => Status::error(sct::GENERIC, sc::INVALID_OPCODE),
        IoErrorKind::OutOfRange => Status::error(sct::GENERIC, sc::LBA_OUT_OF_RANGE),
        // Retryable, through another path.
        IoErrorKind::NotReady => Status {
            dnr: false,
            ..Status::error(sct::GENERIC, sc::NAMESPACE_NOT_READY)
        },
        _ => Status::error(sct::GENERIC, sc::INTERNAL_ERROR),
    };
    Reply::status(status)
}

/// Identify Namespace of `ns`.
fn id_namespace(ns: &Namespace) -> IdNamespace {
    let info = ns.backstore.info();
    IdNamespace {
        nsze: info.num_blocks,
        ncap: info.num_blocks,
        nuse: info.num_blocks,
        nsfeat: u8::from(info.thin),
        // Shareable by several controllers.
        nmic: 1,
        // Deallocated blocks read zeroes; Write Zeroes may deallocate.
        dlfeat: if info.thin { 0x09 } else { 0 },
        nsattr: u8::from(info.read_only || ns.read_only),
        anagrpid: ns.ana_group(),
        nguid: ns.nguid,
        eui64: ns.eui64,
        lbads: info.block_size.trailing_zeros() as u8,
        ..IdNamespace::default()
    }
}

/// Ends the controller when the host sends no admin command for its keep alive timeout
/// (rounded up to the granularity; 0: never).
async fn keep_alive(ctrl: Weak<Controller>) {
    loop {
        let Some(c) = ctrl.upgrade() else {
            return;
        };
        if c.is_closed() {
            return;
        }
        let kato = u64::from(c.kato_ms.load(Ordering::Relaxed));
        let now = c.epoch.elapsed().as_millis() as u64;
        let grain = u64::from(KAS) * 100;
        if kato != 0 && now.saturating_sub(c.seen.load(Ordering::Relaxed)) > kato + grain {
            tracing::warn!(cntlid = c.cntlid, host = %c.host_nqn, kato_ms = kato,
                "keep alive timeout expired");
            c.close();
            return;
        }
        drop(c);
        tokio::time::sleep(Duration::from_millis(grain / 2)).await;
    }
}
