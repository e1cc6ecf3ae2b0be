//! The device: GID table, attributes, resource tables and the engine that the transport roles
//! run on. Every handle (PD, MR, CQ, QP, SRQ) refers back to its device; resources are freed
//! when their handle drops.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::cq::Cq;
pub use super::event::EventQueue;
use super::mem::Region;
use super::mr::{access_valid, KeyKind, MrEntry, MrState, MrTable};
use super::qp::{modify_is_ok, QpCtx, RecvWqe, SendWqe, WqeState};
use super::shards::{owner, ShardMember};
pub use super::types::Ah;
use super::types::*;
use super::VerbsError;
use crate::ring::Ring;
use crate::wire::{roce, Opcode};

/// Device configuration.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    pub name: String,
    /// Local addresses; each becomes a RoCEv2 GID (IPv4 as `::ffff:a.b.c.d`).
    pub addrs: Vec<IpAddr>,
    /// Ethernet MTU of the underlying link; the port MTU follows as rxe computes it.
    pub eth_mtu: usize,
    pub attr: DeviceAttr,
    /// Verify the ICRC of received datagrams.
    pub check_icrc: bool,
    /// The link rebuilds received IPv4 headers (a UDP socket reports neither the
    /// identification nor the DF flag, which the ICRC covers): their ICRCs are checked for
    /// everything but those ([`crate::wire::icrc::UnknownIpv4Fields`]).
    pub ipv4_header_rebuilt: bool,
    /// How long the runner ([`crate::netdev::run`]) keeps polling the link after the last
    /// datagram moved before it sleeps (zero: it sleeps at once).
    pub busy_poll: Duration,
    /// The set of devices this one shares its addresses and QP numbers with, and its place
    /// in it ([`super::shards`]); `None` for a device on its own.
    pub shard: Option<ShardMember>,
}

impl DeviceConfig {
    pub fn new(name: &str, addrs: Vec<IpAddr>) -> DeviceConfig {
        DeviceConfig {
            name: name.to_string(),
            addrs,
            eth_mtu: 4200,
            attr: DeviceAttr::default(),
            check_icrc: true,
            ipv4_header_rebuilt: false,
            busy_poll: Duration::ZERO,
            shard: None,
        }
    }
}

/// A shared receive queue's engine state.
impl SrqCtx {
    /// Takes the next receive WQE, raising the limit event when the queue falls below it.
    pub(crate) fn take(&mut self, id: u32, events: &EventQueue) -> Option<RecvWqe> {
        let wqe = self.ring.pop()?;
        if self.limit > 0 && self.ring.len() < self.limit {
            self.limit = 0;
            events.push(AsyncEvent::SrqLimitReached { srq: id });
        }
        Some(wqe)
    }
}

#[derive(Debug)]
pub(crate) struct SrqCtx {
    pub pd: u32,
    pub ring: Ring<RecvWqe>,
    pub max_sge: u32,
    pub limit: u32,
    pub depth: u32,
}

/// A datagram the engine built: whole in `bytes`, or, for data sent straight from a memory
/// region, everything but the payload (`bytes[..at]`, the payload, then `bytes[at..]`: pad
/// and ICRC). The link sends the pieces with one gather; the payload is never copied into
/// the datagram.
#[derive(Debug, Default, Clone)]
pub struct Outgoing {
    pub bytes: Vec<u8>,
    pub payload: Option<Payload>,
}

/// Where a link hands what it receives ([`crate::netdev::NetDev::receive_into`]).
pub trait RxSink {
    /// The datagrams expected next from one peer, in order, with where their payloads go
    /// (empty if none is expected).
    fn expect(&mut self) -> Option<(std::net::IpAddr, &[Expected])>;

    /// A received datagram: `(head, rest)` as [`crate::netdev::NetDev::receive_each`] hands them, or, with
    /// `placed` not empty, its IP and UDP headers in `head`, its transport headers and ICRC in
    /// `rest` and its payload in `placed`, where [`RxSink::expect`] said it goes.
    fn datagram(&mut self, head: &[u8], rest: &[u8], placed: &[u8]);
}

/// A RoCEv2 packet a link expects and where its payload goes: the packet is the one expected
/// if its BTH has this opcode, destination QP and PSN, and its UDP payload is `header_len`
/// bytes of transport headers, `len` bytes of payload and the ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub opcode: u8,
    pub qpn: u32,
    pub psn: u32,
    pub header_len: usize,
    /// Registered memory of the operation the packet belongs to (an RDMA READ's destination,
    /// the rest of an RDMA WRITE), valid for writes of `len` bytes for as long as the engine
    /// that gave it out is not run again.
    pub dst: std::ptr::NonNull<u8>,
    pub len: usize,
}

// SAFETY: an `Expected` is an address the engine gave out with its rules (see `dst`); it is
// dereferenced only by the link the engine hands it to, on the thread driving both.
unsafe impl Send for Expected {}

impl Expected {
    /// The UDP payload length of the expected packet.
    pub fn udp_payload_len(&self) -> usize {
        self.header_len + self.len + crate::wire::roce::ICRC_LEN
    }

    /// Whether `bth` (a received packet's first bytes) is the expected packet's.
    pub fn matches(&self, bth: &[u8]) -> bool {
        bth.len() >= crate::wire::bth::HEADER_LEN
            && bth[0] == self.opcode
            && bth[5..8] == self.qpn.to_be_bytes()[1..]
            && bth[9..12] == self.psn.to_be_bytes()[1..]
    }
}

/// Where an [`Outgoing`] datagram's payload is.
#[derive(Debug, Clone)]
pub struct Payload {
    region: Arc<Region>,
    offset: usize,
    len: usize,
    /// Where in the datagram it goes.
    at: usize,
}

impl Outgoing {
    /// A datagram held whole.
    pub fn whole(bytes: Vec<u8>) -> Outgoing {
        Outgoing {
            bytes,
            payload: None,
        }
    }

    /// A datagram whose `len` payload bytes are at `offset` in `region`, to go at `at`
    /// (checked in bounds by the caller).
    pub(crate) fn from_region(
        bytes: Vec<u8>,
        region: Arc<Region>,
        offset: usize,
        len: usize,
        at: usize,
    ) -> Outgoing {
        Outgoing {
            bytes,
            payload: Some(Payload {
                region,
                offset,
                len,
                at,
            }),
        }
    }

    /// Bytes on the wire (from the IP header through the ICRC).
    pub fn len(&self) -> usize {
        self.bytes.len() + self.payload.as_ref().map_or(0, |p| p.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The datagram as three pieces: before the payload, the payload, after it (the last two
    /// empty for a datagram held whole).
    pub fn pieces(&self) -> [&[u8]; 3] {
        match &self.payload {
            None => [&self.bytes, &[], &[]],
            Some(p) => [
                &self.bytes[..p.at],
                // Checked in bounds when the datagram was built.
                p.region.slice(p.offset, p.len).unwrap_or_default(),
                &self.bytes[p.at..],
            ],
        }
    }

    /// The datagram in one buffer (for links that keep or alter what they carry).
    pub fn to_vec(&self) -> Vec<u8> {
        self.pieces().concat()
    }
}

/// Outgoing datagrams, bounded, and spent buffers to build the next ones in (a datagram per
/// allocation would make the allocator grow and trim its heap at packet rate).
#[derive(Debug, Default)]
pub(crate) struct Tx {
    pub queue: VecDeque<Outgoing>,
    /// Where a datagram sent from a memory region is put together before its payload is
    /// taken out again (its payload bytes are never written: they stay whatever they were).
    pub scratch: Vec<u8>,
    pub limit: usize,
    pub packets: u64,
    /// Spent buffers by size: `[small, large]` ([`SMALL`]).
    free: [Vec<Vec<u8>>; 2],
    /// UDP source and destination ports of the link ([`crate::netdev::NetDev::tx_ports`]).
    pub ports: Option<(u16, u16)>,
}

/// Spent datagram buffers kept for reuse, per size class.
const POOL: usize = 1024;
/// Datagrams up to this many bytes (ACKs, responses, commands) are built in buffers of their
/// own class, so a data packet does not grow one and zero what it grew by.
const SMALL: usize = 512;

impl Tx {
    pub fn has_room(&self) -> bool {
        self.queue.len() < self.limit
    }

    /// A buffer of `len` bytes, recycled when one is available: zero but for the `payload`
    /// range, which still holds an earlier datagram's bytes and which the caller overwrites
    /// whole (or gives the buffer back with [`Tx::give_back`]). Zeroing a 4 KiB payload only
    /// to copy over it cost as much as the copy.
    pub fn buffer(&mut self, len: usize, payload: std::ops::Range<usize>) -> Vec<u8> {
        let mut b = self.free[usize::from(len > SMALL)]
            .pop()
            .unwrap_or_default();
        if b.len() < len {
            b.resize(len, 0);
        }
        b.truncate(len);
        let start = payload.start.min(len);
        b[..start].fill(0);
        b[payload.end.clamp(start, len)..].fill(0);
        b
    }

    /// Keeps a spent (or unsent) buffer for [`Tx::buffer`].
    pub fn give_back(&mut self, buf: Vec<u8>) {
        let class = &mut self.free[usize::from(buf.len() > SMALL)];
        if class.len() < POOL {
            class.push(buf);
        }
    }

    /// Keeps the buffers of `sent` for [`Tx::buffer`]; `sent` is left empty.
    pub fn recycle(&mut self, sent: &mut Vec<Outgoing>) {
        for d in sent.drain(..) {
            self.give_back(d.bytes);
        }
    }

    /// Queues a datagram.
    pub fn push(&mut self, d: Outgoing) {
        self.queue.push_back(d);
        self.packets += 1;
    }
}

/// The engine state, behind the device lock.
#[derive(Debug)]
pub(crate) struct Engine {
    pub attr: DeviceAttr,
    pub port_mtu: Mtu,
    pub gids: Vec<Gid>,
    pub pds: HashMap<u32, ()>,
    pub mrs: MrTable,
    /// Boxed: a packet takes its QP out of the table while the engine handles it, and
    /// moving a pointer costs less than moving the QP.
    pub qps: HashMap<u32, Box<QpCtx>>,
    pub srqs: HashMap<u32, SrqCtx>,
    pub tx: Tx,
    pub check_icrc: bool,
    /// [`DeviceConfig::ipv4_header_rebuilt`], and the solver that goes with it.
    pub ipv4_header_rebuilt: bool,
    pub unknown_ipv4: crate::wire::icrc::UnknownIpv4Fields,
    /// Live CQs; each CQ decrements it when its last handle drops.
    pub cq_count: Arc<std::sync::atomic::AtomicU32>,
    pub events: Arc<EventQueue>,
    pub stats: Stats,
    /// The vector [`Device::drive`] moves outgoing datagrams in, kept between calls.
    pub tx_scratch: Vec<Outgoing>,
    /// QPs that owe an ACK (`RespState::ack`), sent when the received batch is done.
    pub acks: Vec<u32>,
    /// The QP numbers `poll` visits (kept for its allocation).
    pub poll_scratch: Vec<u32>,
    /// QPs that may have work for `poll`: posted work requests, received packets, state
    /// changes, or packets they could not all send in their last pass. `poll` visits these,
    /// not every QP.
    pub ready: Vec<u32>,
    /// No QP's timer (retransmission, RNR) is due before this: a lower bound, lowered
    /// whenever a QP the engine handled has an earlier deadline, made exact by the pass over
    /// every QP that `poll` makes once it is reached.
    pub timers_from: Duration,
    /// [`DeviceConfig::shard`].
    pub shard: Option<ShardMember>,
    /// The QP whose next packets a link is told to expect (the last to receive part of a
    /// long message), and the list it is told (kept for its allocation).
    pub rx_hint: Option<u32>,
    pub expected: Vec<Expected>,
    next_id: u32,
    next_qpn: u32,
}

/// Packet counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub rx_packets: u64,
    pub rx_dropped: u64,
    pub rx_bad_icrc: u64,
    pub tx_packets: u64,
    pub retransmits: u64,
    pub naks_sent: u64,
    pub rnr_naks_sent: u64,
    /// Datagrams for a QP of another device of the set, passed on to its inbox.
    pub rx_passed: u64,
    /// Received datagrams whose payload the link placed straight into the memory it was for
    /// (counted in `rx_packets` as well).
    pub rx_placed: u64,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Stats) {
        self.rx_packets += o.rx_packets;
        self.rx_dropped += o.rx_dropped;
        self.rx_bad_icrc += o.rx_bad_icrc;
        self.tx_packets += o.tx_packets;
        self.retransmits += o.retransmits;
        self.naks_sent += o.naks_sent;
        self.rnr_naks_sent += o.rnr_naks_sent;
        self.rx_passed += o.rx_passed;
        self.rx_placed += o.rx_placed;
    }
}

#[derive(Debug)]
pub(crate) struct DeviceInner {
    pub name: String,
    pub attr: DeviceAttr,
    pub port: PortAttr,
    pub gids: Vec<Gid>,
    pub engine: Mutex<Engine>,
    pub live_qps: AtomicUsize,
    pub events: Arc<EventQueue>,
    /// Wakes the runner when work was posted (or, in a set, a datagram passed on to it).
    pub kick: Arc<tokio::sync::Notify>,
    pub busy_poll: Duration,
}

/// A soft RoCEv2 HCA with one port (port number 1).
#[derive(Debug, Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

impl Device {
    pub fn new(config: DeviceConfig) -> Result<Device, VerbsError> {
        let mtu = Mtu::for_eth_mtu(config.eth_mtu).ok_or(VerbsError::InvalidArgument("eth_mtu"))?;
        if config.addrs.is_empty() {
            return Err(VerbsError::InvalidArgument("no addresses"));
        }
        let gids: Vec<Gid> = config.addrs.iter().map(|a| Gid::from_ip(*a)).collect();
        let events = Arc::new(EventQueue::new(1024));
        let engine = Engine {
            attr: config.attr.clone(),
            port_mtu: mtu,
            gids: gids.clone(),
            pds: HashMap::new(),
            mrs: MrTable::new(config.attr.max_mr),
            qps: HashMap::new(),
            srqs: HashMap::new(),
            tx: Tx {
                queue: VecDeque::new(),
                limit: 4096,
                packets: 0,
                free: Default::default(),
                scratch: Vec::new(),
                ports: None,
            },
            tx_scratch: Vec::new(),
            acks: Vec::new(),
            poll_scratch: Vec::new(),
            ready: Vec::new(),
            timers_from: Duration::MAX,
            check_icrc: config.check_icrc,
            ipv4_header_rebuilt: config.ipv4_header_rebuilt,
            unknown_ipv4: crate::wire::icrc::UnknownIpv4Fields::new(),
            cq_count: Arc::default(),
            events: events.clone(),
            stats: Stats::default(),
            shard: config.shard.clone(),
            rx_hint: None,
            expected: Vec::new(),
            next_id: 1,
            next_qpn: first_qpn(),
        };
        let kick = match &config.shard {
            Some(m) => m.set.inbox(m.index).kick.clone(),
            None => Arc::new(tokio::sync::Notify::new()),
        };
        Ok(Device {
            inner: Arc::new(DeviceInner {
                name: config.name,
                port: PortAttr {
                    state_active: true,
                    max_mtu: Mtu::Mtu4096,
                    active_mtu: mtu,
                    gid_tbl_len: gids.len() as u32,
                    pkey_tbl_len: 1,
                },
                attr: config.attr,
                gids,
                engine: Mutex::new(engine),
                live_qps: AtomicUsize::new(0),
                events,
                kick,
                busy_poll: config.busy_poll,
            }),
        })
    }

    /// [`DeviceConfig::busy_poll`].
    pub fn busy_poll(&self) -> Duration {
        self.inner.busy_poll
    }

    pub(crate) fn engine(&self) -> MutexGuard<'_, Engine> {
        self.inner.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    /// Attributes of port 1 (the only port).
    pub fn port_attr(&self, port: u8) -> Result<PortAttr, VerbsError> {
        if port != 1 {
            return Err(VerbsError::InvalidArgument("port"));
        }
        Ok(self.inner.port.clone())
    }

    pub fn gid(&self, index: u32) -> Option<Gid> {
        self.inner.gids.get(index as usize).copied()
    }

    pub fn gid_table(&self) -> &[Gid] {
        &self.inner.gids
    }

    /// The GID index of a local address.
    pub fn gid_index(&self, addr: IpAddr) -> Option<u32> {
        let g = Gid::from_ip(addr);
        self.inner
            .gids
            .iter()
            .position(|x| *x == g)
            .map(|i| i as u32)
    }

    /// Number of QPs that exist (created and not destroyed), GSI included.
    pub fn live_qps(&self) -> usize {
        self.inner.live_qps.load(Ordering::Acquire)
    }

    /// Number of memory regions that exist (registered or allocated for fast registration).
    pub fn live_mrs(&self) -> usize {
        self.engine().mrs.count()
    }

    /// Number of CQs that exist.
    pub fn live_cqs(&self) -> u32 {
        self.engine().cq_count.load(Ordering::Acquire)
    }

    /// Asynchronous events (CQ overrun, fatal QP errors, SQ drained).
    pub fn events(&self) -> &EventQueue {
        &self.inner.events
    }

    pub fn stats(&self) -> Stats {
        let eng = self.engine();
        Stats {
            tx_packets: eng.tx.packets,
            ..eng.stats
        }
    }

    pub fn alloc_pd(&self) -> Result<Pd, VerbsError> {
        let mut eng = self.engine();
        if eng.pds.len() as u32 >= eng.attr.max_pd {
            return Err(VerbsError::Exhausted("pd"));
        }
        let id = eng.alloc_id();
        eng.pds.insert(id, ());
        Ok(Pd(Arc::new(PdInner {
            dev: self.clone(),
            id,
        })))
    }

    /// Creates a CQ of at least `depth` entries (≤ max_cqe).
    pub fn create_cq(&self, depth: u32) -> Result<Cq, VerbsError> {
        let mut eng = self.engine();
        if depth == 0 || depth > eng.attr.max_cqe {
            return Err(VerbsError::InvalidArgument("cq depth"));
        }
        if eng.cq_count.load(Ordering::Acquire) >= eng.attr.max_cq {
            return Err(VerbsError::Exhausted("cq"));
        }
        eng.cq_count.fetch_add(1, Ordering::AcqRel);
        let id = eng.alloc_id();
        Ok(Cq::new(
            id,
            depth,
            self.inner.events.clone(),
            eng.cq_count.clone(),
        ))
    }

    /// An address handle for UD sends.
    pub fn create_ah(&self, pd: &Pd, av: AddressVector) -> Result<Ah, VerbsError> {
        self.check_av(&av)?;
        Ok(Ah { pd: pd.id(), av })
    }

    fn check_av(&self, av: &AddressVector) -> Result<(), VerbsError> {
        let sgid = self
            .gid(av.sgid_index)
            .ok_or(VerbsError::InvalidArgument("sgid_index"))?;
        if sgid.to_ip().is_ipv4() != av.dest.is_ipv4() {
            return Err(VerbsError::InvalidArgument("address family"));
        }
        Ok(())
    }

    /// Moves the engine's queued datagrams out, each in one buffer.
    pub fn take_tx(&self, out: &mut Vec<Vec<u8>>) {
        let mut eng = self.engine();
        out.extend(eng.tx.queue.drain(..).map(|d| d.to_vec()));
    }

    /// The earliest pending timer, if any.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.engine().next_deadline()
    }

    /// True if some QP has packets it could send right now.
    pub fn has_work(&self) -> bool {
        self.engine().has_work()
    }

    /// [`Qp::modify`] by QP number: the connection manager drives QPs it does not own.
    pub(crate) fn modify_qp(
        &self,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), VerbsError> {
        let mut eng = self.engine();
        let port_mtu = eng.port_mtu;
        let max_rd = eng.attr.max_qp_init_rd_atom;
        let max_dest_rd = eng.attr.max_qp_rd_atom;
        let qp = eng
            .qps
            .get_mut(&qpn)
            .ok_or(VerbsError::InvalidArgument("qp"))?;
        let cur = qp.state;
        if mask.contains(QpAttrMask::CUR_STATE) && attr.cur_qp_state != Some(cur) {
            return Err(VerbsError::InvalidArgument("cur_qp_state"));
        }
        let next = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
                .ok_or(VerbsError::InvalidArgument("qp_state"))?
        } else {
            cur
        };
        if !modify_is_ok(qp.qp_type, cur, next, mask) {
            return Err(VerbsError::InvalidTransition {
                from: cur,
                to: next,
            });
        }
        if mask.contains(QpAttrMask::PORT) && attr.port_num != 1 {
            return Err(VerbsError::InvalidArgument("port_num"));
        }
        if mask.contains(QpAttrMask::PKEY_INDEX) && attr.pkey_index != 0 {
            return Err(VerbsError::InvalidArgument("pkey_index"));
        }
        if mask.contains(QpAttrMask::PATH_MTU) && attr.path_mtu.is_none_or(|m| m > port_mtu) {
            return Err(VerbsError::InvalidArgument("path_mtu"));
        }
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) && u32::from(attr.max_rd_atomic) > max_rd {
            return Err(VerbsError::InvalidArgument("max_rd_atomic"));
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC)
            && u32::from(attr.max_dest_rd_atomic) > max_dest_rd
        {
            return Err(VerbsError::InvalidArgument("max_dest_rd_atomic"));
        }
        if (mask.contains(QpAttrMask::RETRY_CNT) && attr.retry_cnt > 7)
            || (mask.contains(QpAttrMask::RNR_RETRY) && attr.rnr_retry > 7)
            || (mask.contains(QpAttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31)
            || (mask.contains(QpAttrMask::TIMEOUT) && attr.timeout > 31)
        {
            return Err(VerbsError::InvalidArgument("retry/timer value"));
        }
        if mask.contains(QpAttrMask::ACCESS_FLAGS) && attr.qp_access_flags.is_none() {
            return Err(VerbsError::InvalidArgument("access flags"));
        }
        if mask.contains(QpAttrMask::AV) {
            let sgid = self
                .gid(attr.av.sgid_index)
                .ok_or(VerbsError::InvalidArgument("sgid_index"))?;
            if sgid.to_ip().is_ipv4() != attr.av.dest.is_ipv4() {
                return Err(VerbsError::InvalidArgument("address family"));
            }
        }
        // Apply.
        if let Some(a) = attr
            .qp_access_flags
            .filter(|_| mask.contains(QpAttrMask::ACCESS_FLAGS))
        {
            qp.access = a;
        }
        if mask.contains(QpAttrMask::QKEY) {
            qp.qkey = attr.qkey;
        }
        if mask.contains(QpAttrMask::PATH_MTU) {
            qp.mtu = attr.path_mtu.unwrap_or(port_mtu);
        }
        if mask.contains(QpAttrMask::TIMEOUT) {
            qp.timeout = attr.timeout;
        }
        if mask.contains(QpAttrMask::RETRY_CNT) {
            qp.retry_cnt = attr.retry_cnt;
            qp.comp.retry_left = attr.retry_cnt;
        }
        if mask.contains(QpAttrMask::RNR_RETRY) {
            qp.rnr_retry = attr.rnr_retry;
            qp.comp.rnr_retry_left = attr.rnr_retry;
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) {
            qp.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
            qp.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            qp.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask.contains(QpAttrMask::DEST_QPN) {
            qp.dest_qpn = attr.dest_qp_num & crate::wire::U24_MASK;
        }
        if mask.contains(QpAttrMask::AV) {
            qp.av = attr.av;
            if qp.qp_type == QpType::Rc {
                let dest = if mask.contains(QpAttrMask::DEST_QPN) {
                    qp.dest_qpn
                } else {
                    0
                };
                qp.sport = attr.av.udp_sport.unwrap_or_else(|| {
                    let fl = if attr.av.flow_label != 0 {
                        attr.av.flow_label
                    } else {
                        roce::flow_label_from_qpns(qp.qpn, dest)
                    };
                    roce::udp_sport_from_flow_label(fl)
                });
            }
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            qp.resp.psn = attr.rq_psn & crate::wire::U24_MASK;
        }
        if mask.contains(QpAttrMask::SQ_PSN) {
            let psn = attr.sq_psn & crate::wire::U24_MASK;
            qp.req.psn = psn;
            qp.comp.psn = psn;
        }
        if mask.contains(QpAttrMask::EN_SQD_ASYNC_NOTIFY) {
            qp.sqd_notify = attr.en_sqd_async_notify;
        }
        match next {
            QpState::Reset if cur != QpState::Reset => {
                // Reset discards everything without completions (IBA 10.3.1.1).
                qp.sq.drain().for_each(drop);
                qp.rq.drain().for_each(drop);
                qp.req = Default::default();
                qp.req.wqe_index = qp.sq.tail();
                qp.comp = Default::default();
                qp.resp = Default::default();
                qp.state = QpState::Reset;
            }
            QpState::Err if cur != QpState::Err => qp.enter_error(),
            s => qp.state = s,
        }
        eng.mark_ready(qpn);
        drop(eng);
        self.kick();
        Ok(())
    }

    /// The state of QP `qpn`, `None` once it is destroyed.
    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        self.engine().qps.get(&qpn).map(|q| q.state)
    }

    /// The send and expected receive PSNs of QP `qpn`.
    pub(crate) fn qp_psns(&self, qpn: u32) -> Option<(u32, u32)> {
        self.engine().qps.get(&qpn).map(|q| (q.req.psn, q.resp.psn))
    }

    /// The port MTU (from the Ethernet MTU the device was created with).
    pub fn port_mtu(&self) -> Mtu {
        self.inner.port.active_mtu
    }

    /// Wakes a runner waiting for posted work.
    pub(crate) fn kick(&self) {
        self.inner.kick.notify_one();
    }

    /// Resolves when work was posted (for async runners).
    pub async fn kicked(&self) {
        self.inner.kick.notified().await;
    }
}

impl Engine {
    pub(crate) fn alloc_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        id
    }

    /// When `poll` next has timers to run (possibly earlier than any QP's deadline, never
    /// later).
    fn next_deadline(&self) -> Option<Duration> {
        (self.timers_from != Duration::MAX).then_some(self.timers_from)
    }

    /// Puts QP `qpn` on the ready list, once.
    pub(crate) fn mark_ready(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            if !qp.ready {
                qp.ready = true;
                self.ready.push(qpn);
            }
        }
    }

    /// Lowers [`Engine::timers_from`] to `qp`'s deadlines.
    pub(crate) fn note_timers(&mut self, qp: &QpCtx) {
        for d in [qp.comp.deadline, qp.req.rnr_deadline]
            .into_iter()
            .flatten()
        {
            self.timers_from = self.timers_from.min(d);
        }
    }

    fn has_work(&self) -> bool {
        !self.tx.queue.is_empty()
            || self.qps.values().any(|q| {
                q.resp.read.is_some()
                    || (matches!(q.state, QpState::Rts | QpState::Sqd)
                        && (q.req.wqe_index != q.sq.tail()
                            || q.sq
                                .front()
                                .is_some_and(|w| matches!(w.state, WqeState::Done(_)))))
            })
    }
}

#[derive(Debug)]
pub(crate) struct PdInner {
    dev: Device,
    id: u32,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        self.dev.engine().pds.remove(&self.id);
    }
}

/// A protection domain.
#[derive(Debug, Clone)]
pub struct Pd(Arc<PdInner>);

impl Pd {
    pub fn id(&self) -> u32 {
        self.0.id
    }

    pub fn device(&self) -> &Device {
        &self.0.dev
    }

    /// Registers `region[offset..offset+len]` at I/O virtual address `iova`.
    pub fn reg_mr_at(
        &self,
        region: Arc<Region>,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Mr, VerbsError> {
        if !access_valid(access) {
            return Err(VerbsError::InvalidArgument("access flags"));
        }
        let in_bounds = offset.checked_add(len).is_some_and(|e| e <= region.len());
        if !in_bounds || len as u64 > self.0.dev.inner.attr.max_mr_size {
            return Err(VerbsError::InvalidArgument("mr range"));
        }
        let mut eng = self.0.dev.engine();
        let key = eng
            .mrs
            .insert(MrEntry {
                pd: self.id(),
                key: 0,
                state: MrState::Valid,
                region: Some(region.clone()),
                offset,
                length: len,
                iova,
                access,
                fast_reg_max: None,
            })
            .ok_or(VerbsError::Exhausted("mr"))?;
        Ok(Mr {
            dev: self.0.dev.clone(),
            key,
            iova,
            len,
            region: Some(region),
        })
    }

    /// Registers a whole region at its own address.
    pub fn reg_mr(&self, region: Arc<Region>, access: Access) -> Result<Mr, VerbsError> {
        let (len, iova) = (region.len(), region.addr());
        self.reg_mr_at(region, 0, len, iova, access)
    }

    /// Allocates an MR for fast registration of up to `max_len` bytes (`ib_alloc_mr`).
    pub fn alloc_mr(&self, max_len: usize) -> Result<Mr, VerbsError> {
        let mut eng = self.0.dev.engine();
        let key = eng
            .mrs
            .insert(MrEntry {
                pd: self.id(),
                key: 0,
                state: MrState::Free,
                region: None,
                offset: 0,
                length: 0,
                iova: 0,
                access: Access::empty(),
                fast_reg_max: Some(max_len),
            })
            .ok_or(VerbsError::Exhausted("mr"))?;
        Ok(Mr {
            dev: self.0.dev.clone(),
            key,
            iova: 0,
            len: 0,
            region: None,
        })
    }

    /// Creates a shared receive queue.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq, VerbsError> {
        let dev = &self.0.dev;
        let mut eng = dev.engine();
        if max_wr == 0 || max_wr > eng.attr.max_srq_wr || max_sge > eng.attr.max_srq_sge {
            return Err(VerbsError::InvalidArgument("srq size"));
        }
        if eng.srqs.len() as u32 >= eng.attr.max_srq {
            return Err(VerbsError::Exhausted("srq"));
        }
        let id = eng.alloc_id();
        eng.srqs.insert(
            id,
            super::device::SrqCtx {
                pd: self.id(),
                ring: Ring::new(max_wr),
                max_sge,
                limit: 0,
                depth: max_wr,
            },
        );
        Ok(Srq {
            dev: dev.clone(),
            id,
        })
    }

    /// Creates a QP. A GSI QP gets QPN 1 (one per device).
    pub fn create_qp(&self, init: QpInitAttr) -> Result<Qp, VerbsError> {
        let dev = &self.0.dev;
        let mut eng = dev.engine();
        let a = &eng.attr;
        let cap = init.cap;
        if cap.max_send_wr == 0 || cap.max_send_wr > a.max_qp_wr || cap.max_recv_wr > a.max_qp_wr {
            return Err(VerbsError::InvalidArgument("queue depth"));
        }
        if cap.max_send_sge > a.max_send_sge || cap.max_recv_sge > a.max_recv_sge {
            return Err(VerbsError::InvalidArgument("sge count"));
        }
        if cap.max_inline_data > a.max_inline_data {
            return Err(VerbsError::InvalidArgument("inline size"));
        }
        if eng.qps.len() as u32 >= a.max_qp {
            return Err(VerbsError::Exhausted("qp"));
        }
        if let Some(srq) = &init.srq {
            if !eng.srqs.contains_key(&srq.id) {
                return Err(VerbsError::InvalidArgument("srq"));
            }
        }
        let qpn = if init.qp_type == QpType::Gsi {
            if eng.qps.contains_key(&1) {
                return Err(VerbsError::Exhausted("gsi qp"));
            }
            1
        } else {
            // In a set, only the numbers this device owns (the links steer by them).
            let (index, count) = eng
                .shard
                .as_ref()
                .map_or((0, 1), |m| (m.index, m.set.count()));
            loop {
                let n = eng.next_qpn;
                eng.next_qpn = if n >= 0x00FF_FFFF { 0x11 } else { n + 1 };
                if owner(n, count) == index && !eng.qps.contains_key(&n) {
                    break n;
                }
            }
        };
        let ctx = QpCtx {
            qpn,
            qp_type: init.qp_type,
            state: QpState::Reset,
            pd: self.id(),
            send_cq: init.send_cq.clone(),
            recv_cq: init.recv_cq.clone(),
            srq: init.srq.as_ref().map(|s| s.id),
            cap,
            access: Access::empty(),
            qkey: if init.qp_type == QpType::Gsi {
                GSI_QKEY
            } else {
                0
            },
            av: AddressVector::default(),
            mtu: eng.port_mtu,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            min_rnr_timer: 0,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            dest_qpn: 0,
            sport: roce::qp_initial_sport(qpn),
            sq_sig_all: init.sq_sig_all,
            sqd_notify: false,
            sq: Ring::new(cap.max_send_wr),
            rq: Ring::new(cap.max_recv_wr.max(1)),
            req: Default::default(),
            comp: Default::default(),
            resp: Default::default(),
            ready: false,
        };
        eng.qps.insert(qpn, Box::new(ctx));
        dev.inner.live_qps.fetch_add(1, Ordering::AcqRel);
        Ok(Qp {
            dev: dev.clone(),
            qpn,
            qp_type: init.qp_type,
            pd: self.id(),
        })
    }
}

/// The Q_Key of the GSI QP (IBA 13.4.6.1).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// QP creation attributes.
#[derive(Debug, Clone)]
pub struct QpInitAttr {
    pub qp_type: QpType,
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub srq: Option<Srq>,
    pub cap: QpCap,
    /// Every send WR completes, signaled or not.
    pub sq_sig_all: bool,
}

impl QpInitAttr {
    pub fn new(qp_type: QpType, send_cq: &Cq, recv_cq: &Cq) -> QpInitAttr {
        QpInitAttr {
            qp_type,
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        }
    }
}

/// A memory region; deregistered on drop.
#[derive(Debug)]
pub struct Mr {
    dev: Device,
    key: u32,
    iova: u64,
    len: usize,
    region: Option<Arc<Region>>,
}

impl Mr {
    /// The L_Key as registered (fast-register installs new keys; see [`Mr::key_with_variant`]).
    pub fn lkey(&self) -> u32 {
        self.key
    }

    /// The R_Key (equal to the L_Key in this implementation, as in rxe).
    pub fn rkey(&self) -> u32 {
        self.key
    }

    /// The current key, after fast registrations.
    pub fn current_key(&self) -> u32 {
        self.dev
            .engine()
            .mrs
            .entry(self.key)
            .map_or(self.key, |e| e.key)
    }

    /// This MR's key with another 8-bit variant, for a fast-register WR.
    pub fn key_with_variant(&self, variant: u8) -> u32 {
        (self.key & !0xFF) | u32::from(variant)
    }

    pub fn iova(&self) -> u64 {
        self.iova
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn region(&self) -> Option<&Arc<Region>> {
        self.region.as_ref()
    }

    /// An SGE over `len` bytes at `offset` into this MR.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.iova + offset as u64,
            length: len,
            lkey: self.key,
        }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.dev.engine().mrs.remove(self.key);
    }
}

/// A shared receive queue; destroyed on drop.
#[derive(Debug, Clone)]
pub struct Srq {
    dev: Device,
    id: u32,
}

impl Srq {
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn post_recv(&self, wr: RecvWr) -> Result<(), VerbsError> {
        let mut eng = self.dev.engine();
        let Engine { srqs, mrs, .. } = &mut *eng;
        let srq = srqs
            .get_mut(&self.id)
            .ok_or(VerbsError::InvalidArgument("srq"))?;
        if wr.sg_list.len() > srq.max_sge as usize {
            return Err(VerbsError::TooManySge);
        }
        let total = check_recv_sges(mrs, srq.pd, &wr.sg_list)?;
        srq.ring
            .push(RecvWqe {
                wr_id: wr.wr_id,
                sg_list: wr.sg_list,
                total_len: total,
            })
            .map_err(|_| VerbsError::QueueFull)?;
        Ok(())
    }

    /// Posted and not yet consumed receive WQEs.
    pub fn len(&self) -> usize {
        self.dev
            .engine()
            .srqs
            .get(&self.id)
            .map_or(0, |s| s.ring.len() as usize)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Arms the SRQ limit event: [`AsyncEvent::SrqLimitReached`] fires once when fewer than
    /// `limit` receive WQEs remain (`IB_SRQ_LIMIT`); 0 disarms.
    pub fn set_limit(&self, limit: u32) {
        if let Some(s) = self.dev.engine().srqs.get_mut(&self.id) {
            s.limit = limit.min(s.depth);
        }
    }
}

fn check_recv_sges(mrs: &MrTable, pd: u32, sges: &[Sge]) -> Result<usize, VerbsError> {
    let mut total = 0usize;
    for s in sges {
        mrs.lookup(
            pd,
            s.lkey,
            KeyKind::Local,
            Access::LOCAL_WRITE,
            s.addr,
            s.length as usize,
        )
        .map_err(|_| VerbsError::InvalidLkey(s.lkey))?;
        total += s.length as usize;
    }
    Ok(total)
}

/// A queue pair; destroyed on drop.
#[derive(Debug)]
pub struct Qp {
    dev: Device,
    qpn: u32,
    qp_type: QpType,
    pd: u32,
}

impl Qp {
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    pub fn device(&self) -> &Device {
        &self.dev
    }

    pub fn state(&self) -> QpState {
        self.dev
            .engine()
            .qps
            .get(&self.qpn)
            .map_or(QpState::Err, |q| q.state)
    }

    /// The UDP source port this QP sends from.
    pub fn udp_sport(&self) -> u16 {
        self.dev.engine().qps.get(&self.qpn).map_or(0, |q| q.sport)
    }

    /// `ib_modify_qp`: checks the transition and its attribute mask, then applies it.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        self.dev.modify_qp(self.qpn, attr, mask)
    }

    /// `ib_query_qp`: the current attributes (state, path, PSNs, limits) and queue sizes.
    pub fn attr(&self) -> Option<(QpAttr, QpCap)> {
        let eng = self.dev.engine();
        let q = eng.qps.get(&self.qpn)?;
        let attr = QpAttr {
            qp_state: Some(q.state),
            cur_qp_state: Some(q.state),
            qp_access_flags: Some(q.access),
            pkey_index: 0,
            port_num: 1,
            qkey: q.qkey,
            av: q.av,
            path_mtu: Some(q.mtu),
            timeout: q.timeout,
            retry_cnt: q.retry_cnt,
            rnr_retry: q.rnr_retry,
            rq_psn: q.resp.psn,
            sq_psn: q.req.psn,
            max_rd_atomic: q.max_rd_atomic,
            max_dest_rd_atomic: q.max_dest_rd_atomic,
            min_rnr_timer: q.min_rnr_timer,
            dest_qp_num: q.dest_qpn,
            en_sqd_async_notify: q.sqd_notify,
        };
        Some((attr, q.cap))
    }

    /// The attributes that matter to a connection manager.
    pub fn query(&self) -> Option<(QpState, Mtu, u32, u32, u32)> {
        let eng = self.dev.engine();
        let q = eng.qps.get(&self.qpn)?;
        Some((q.state, q.mtu, q.dest_qpn, q.req.psn, q.resp.psn))
    }

    /// A one-line dump of the transport state, for diagnostics.
    pub fn debug_state(&self) -> String {
        let eng = self.dev.engine();
        let Some(q) = eng.qps.get(&self.qpn) else {
            return "destroyed".into();
        };
        let front = q.sq.front().map(|w| {
            format!(
                "{:?} {:?} first={:#x} last={:#x} next={:#x} off={}",
                w.wr.op.wc_opcode(),
                w.state,
                w.first_psn,
                w.last_psn,
                w.next_psn,
                w.offset
            )
        });
        format!(
            "{:?} sq={} req(idx={} psn={:#x} inflight={} rnr={:?}) comp(psn={:#x} retry={} deadline={:?}) resp(psn={:#x} nak={} read={}) front={:?}",
            q.state, q.sq.len(), q.req.wqe_index.wrapping_sub(q.sq.head()), q.req.psn,
            q.req.rd_atomic_inflight, q.req.rnr_deadline, q.comp.psn, q.comp.retry_left,
            q.comp.deadline, q.resp.psn, q.resp.sent_psn_nak, q.resp.read.is_some(), front
        )
    }

    /// Posts a send WR after the checks a NIC makes at post time.
    pub fn post_send(&self, wr: SendWr) -> Result<(), VerbsError> {
        let mut eng = self.dev.engine();
        let port_mtu = eng.port_mtu.bytes();
        let max_msg = eng.attr.max_msg_sz as usize;
        let Engine { qps, mrs, .. } = &mut *eng;
        let qp = qps
            .get_mut(&self.qpn)
            .ok_or(VerbsError::InvalidArgument("qp"))?;
        if !matches!(qp.state, QpState::Rts | QpState::Sqd | QpState::Err) {
            return Err(VerbsError::InvalidState(qp.state));
        }
        if qp.sq.is_full() || qp.sq.len() >= qp.cap.max_send_wr {
            return Err(VerbsError::QueueFull);
        }
        let ud = qp.qp_type != QpType::Rc;
        let op_ok = match (&wr.op, ud) {
            (SendOp::Send | SendOp::SendWithImm(_), _) => true,
            (_, true) => false,
            _ => true,
        };
        if !op_ok {
            return Err(VerbsError::InvalidOpcode);
        }
        if ud != wr.ud.is_some() {
            return Err(VerbsError::InvalidArgument("ud destination"));
        }
        if let Some(d) = &wr.ud {
            if d.ah.pd != self.pd {
                return Err(VerbsError::InvalidArgument("ah pd"));
            }
        }
        if wr.sg_list.len() > qp.cap.max_send_sge as usize {
            return Err(VerbsError::TooManySge);
        }
        let inline = wr.flags.contains(SendFlags::INLINE);
        let total = if inline {
            if wr.op.is_read_or_atomic() || wr.op.is_local() {
                return Err(VerbsError::InvalidArgument("inline with read/atomic"));
            }
            if wr.inline_data.len() > qp.cap.max_inline_data as usize {
                return Err(VerbsError::InlineTooLarge);
            }
            wr.inline_data.len()
        } else {
            let need = if wr.op.is_read_or_atomic() {
                Access::LOCAL_WRITE
            } else {
                Access::empty()
            };
            let mut total = 0usize;
            for s in &wr.sg_list {
                mrs.lookup(
                    self.pd,
                    s.lkey,
                    KeyKind::Local,
                    need,
                    s.addr,
                    s.length as usize,
                )
                .map_err(|_| VerbsError::InvalidLkey(s.lkey))?;
                total += s.length as usize;
            }
            total
        };
        if total > max_msg || (ud && total > port_mtu) {
            return Err(VerbsError::MessageTooLong);
        }
        if wr.op.is_atomic() {
            let addr = match &wr.op {
                SendOp::CompareSwap { remote_addr, .. } | SendOp::FetchAdd { remote_addr, .. } => {
                    *remote_addr
                }
                _ => 0,
            };
            if total != 8 || addr % 8 != 0 {
                return Err(VerbsError::InvalidArgument("atomic needs 8 aligned bytes"));
            }
        }
        let state = qp.state;
        qp.sq
            .push(SendWqe {
                wr,
                state: WqeState::Posted,
                total_len: total,
                first_psn: 0,
                last_psn: 0,
                offset: 0,
                next_psn: 0,
                placed: 0,
            })
            .map_err(|_| VerbsError::QueueFull)?;
        if state == QpState::Err {
            qp.flush();
            return Ok(());
        }
        eng.mark_ready(self.qpn);
        drop(eng);
        self.dev.kick();
        Ok(())
    }

    /// Posts a receive WR.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), VerbsError> {
        let mut eng = self.dev.engine();
        let Engine { qps, mrs, .. } = &mut *eng;
        let qp = qps
            .get_mut(&self.qpn)
            .ok_or(VerbsError::InvalidArgument("qp"))?;
        if qp.srq.is_some() {
            return Err(VerbsError::InvalidArgument("qp uses an srq"));
        }
        if qp.state == QpState::Reset {
            return Err(VerbsError::InvalidState(qp.state));
        }
        if wr.sg_list.len() > qp.cap.max_recv_sge as usize {
            return Err(VerbsError::TooManySge);
        }
        if qp.rq.len() >= qp.cap.max_recv_wr {
            return Err(VerbsError::QueueFull);
        }
        let total = check_recv_sges(mrs, self.pd, &wr.sg_list)?;
        qp.rq
            .push(RecvWqe {
                wr_id: wr.wr_id,
                sg_list: wr.sg_list,
                total_len: total,
            })
            .map_err(|_| VerbsError::QueueFull)?;
        if qp.state == QpState::Err {
            qp.flush();
        }
        // Nothing waits for a receive buffer: an RNR-NAKed requester retries on its timer.
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let removed = self.dev.engine().qps.remove(&self.qpn).is_some();
        if removed {
            self.dev.inner.live_qps.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Opcode sanity used by the receive path: is this opcode a request of `qp_type`'s transport?
pub(crate) fn opcode_matches(qp_type: QpType, op: Opcode) -> bool {
    let v = u8::from(op);
    match qp_type {
        QpType::Rc => v < 0x20,
        QpType::Ud | QpType::Gsi => (0x60..0x80).contains(&v),
    }
}

/// Where a device starts numbering its QPs: somewhere in the 24-bit space, different in every
/// process, as hardware numbers differ between boots. A peer's connection manager knows a
/// connection by the remote CA GUID and QPN and refuses a reply that repeats a live one
/// (REJ "stale connection"): two processes on one interface share the GUID, and a restarted
/// one would otherwise hand out its predecessor's numbers again.
fn first_qpn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let h = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    0x11 + (h % (0x00FF_FFFF - 0x11 - 0x1_0000u64)) as u32
}
