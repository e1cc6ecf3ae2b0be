//! The SCSI engine (SPC-4 / SBC-4). It knows nothing of fabrics: a fabric hands it a
//! [`Command`] for an I_T nexus and a LUN and gets a [`Response`] back.
//!
//! Layout: [`cdb`] (CDB views), [`sense`] (sense data), `table` (the command table that
//! drives dispatch, CDB validation, REPORT SUPPORTED OPERATION CODES and reservation
//! checks), `spc` (INQUIRY, VPD, mode pages, REQUEST SENSE, REPORT SUPPORTED OPERATION
//! CODES, reservations glue), `sbc` (block commands), `pr` (SPC-2 and persistent
//! reservations), `ua` (unit attentions), `xcopy` (EXTENDED COPY), `lun_map` (REPORT LUNS and
//! unmapped LUNs), `range_lock` (COMPARE AND WRITE / atomic write exclusion).
//!
//! Every protocol error becomes a SCSI status and sense data; no CDB or parameter list can
//! panic the engine.
//!
//! Above the engine, [`core`] is the target core the fabrics share (targets, portal groups,
//! LUN maps, ACLs, SRP target ports, live LUN maps of sessions) and [`stats`] the
//! per-command statistics it records. This crate depends on no fabric, transport or
//! admin API crate.

mod alua;
pub mod cdb;
pub mod core;
mod lun_map;
mod mode;
mod pr;
mod range_lock;
mod sbc;
pub mod sense;
mod shared;
mod spc;
pub mod stats;
mod table;
pub mod task;
mod ua;
mod xcopy;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use rtgt_backstore::{
    Backstore, BackstoreError, BufPool, FileSlice, FileSpan, IoBuf, IoErrorKind, SharedState,
};

pub use alua::{AccessState, AluaConfig, PortGroup};
pub use lun_map::{lun_from_bytes, lun_to_bytes};
pub use ua::UnitAttention;
pub use xcopy::DeviceRegistry;

use cdb::MAX_CDB_LEN;
use mode::ModeState;
use sense::{asc, key, Sense};
use table::{CmdDesc, Lookup, Op, Support};
use ua::UaQueue;

/// SCSI status codes (SAM-5 5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Good = 0x00,
    CheckCondition = 0x02,
    ConditionMet = 0x04,
    Busy = 0x08,
    ReservationConflict = 0x18,
    TaskSetFull = 0x28,
    AcaActive = 0x30,
    TaskAborted = 0x40,
}

/// Task attribute from the fabric (SAM-5 8.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskAttr {
    #[default]
    Simple,
    Ordered,
    HeadOfQueue,
    Aca,
}

/// One I_T nexus as the SCSI engine sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Nexus {
    /// Unique for the lifetime of the process.
    pub id: u64,
    /// Initiator port name, e.g. `iqn.1994-05.com.redhat:host,i,0x23d000000001` for iSCSI.
    pub initiator_port: String,
    /// SPC-4 TransportID of the initiator port (7.6.4), used by persistent reservations.
    pub transport_id: Vec<u8>,
    /// Target port name, e.g. `iqn.2025-01.io.rtgt:disk,t,0x0001`.
    pub target_port: String,
    /// Relative target port identifier (VPD 0x83).
    pub relative_port: u16,
    /// Target port group (VPD 0x83, REPORT TARGET PORT GROUPS).
    pub port_group: u16,
}

/// A CDB as a fabric received it: up to 16 bytes held inline (every fixed-length CDB), so
/// passing a command on allocates nothing; variable-length and extended CDBs spill to the heap.
pub type CdbBytes = smallvec::SmallVec<[u8; 16]>;

/// A SCSI command as delivered by a fabric.
#[derive(Debug)]
pub struct Command {
    pub cdb: CdbBytes,
    /// Data-out received for the command (length = what the fabric received, at most EDTL).
    /// Commands that move blocks process the whole blocks received (an initiator whose
    /// expected length is shorter than the CDB's gets only those written, as iSCSI
    /// overflow semantics require); COMPARE AND WRITE and WRITE SAME need the exact length.
    pub data_out: Option<IoBuf>,
    /// Expected data transfer length the initiator announced, for the data-in direction.
    pub expected_in_len: u32,
    pub attr: TaskAttr,
    /// Fabric task tag, for tracing only.
    pub tag: u64,
}

/// The engine's answer.
#[derive(Debug)]
pub struct Response {
    pub status: Status,
    /// Sense data when status is CHECK CONDITION: fixed format (SPC-4 4.5.3), or descriptor
    /// format (4.5.2) when the control mode page has D_SENSE set.
    pub sense: Option<Vec<u8>>,
    /// Data-in, at most `expected_in_len` bytes.
    pub data_in: Option<IoBuf>,
    /// Data-in as a range of the backstore's file instead of `data_in` (only when the
    /// fabric asked for it with [`Device::execute_ranged`]), at most `expected_in_len` bytes.
    pub data_range: Option<FileRange>,
    /// Bytes the command wanted to transfer according to its CDB (for data-in commands, the
    /// parameter data length limited by the allocation length); the fabric derives overflow /
    /// underflow residuals from this and the expected length.
    pub transfer_len: u32,
}

/// Data-in that a fabric sends straight from the backstore's file (`sendfile(2)`, `splice(2)`)
/// instead of a buffer. The blocks stay locked against COMPARE AND WRITE, ORWRITE, WRITE
/// ATOMIC and their kind until this is dropped, so a fabric drops it only once the kernel has
/// taken every byte (after the last `sendfile` returned). Sending fewer bytes than
/// [`FileSpan::len`] must end the connection, never a GOOD status.
pub struct FileRange {
    slice: FileSlice,
    _guard: range_lock::OwnedRangeGuard,
}

impl FileRange {
    fn truncate(&mut self, len: u64) {
        self.slice.truncate(len);
    }
}

impl FileSpan for FileRange {
    fn fd(&self) -> RawFd {
        self.slice.fd()
    }

    fn offset(&self) -> u64 {
        self.slice.offset()
    }

    fn len(&self) -> u64 {
        self.slice.len()
    }
}

impl std::fmt::Debug for FileRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileRange")
            .field("slice", &self.slice)
            .finish_non_exhaustive()
    }
}

impl Response {
    /// Bytes of data-in, from the buffer or the file range.
    pub fn data_in_len(&self) -> u64 {
        self.data_in.as_ref().map_or(0, |d| d.len() as u64)
            + self.data_range.as_ref().map_or(0, |r| r.len())
    }

    /// CHECK CONDITION with fixed-format sense.
    pub fn check(sense: &Sense) -> Response {
        Response {
            status: Status::CheckCondition,
            sense: Some(sense.emit(false)),
            data_in: None,
            data_range: None,
            transfer_len: 0,
        }
    }
}

/// Errors creating a [`Device`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScsiError {
    #[error("invalid device configuration: {0}")]
    InvalidConfig(String),
    #[error("unsupported logical block size {0}")]
    BlockSize(u32),
    #[error("reading persistent reservation state from {path}")]
    PrLoad {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("persistent reservation state in {path} is corrupt: {reason}")]
    PrCorrupt { path: PathBuf, reason: String },
}

/// Identity and behaviour of a logical unit.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Name for logs.
    pub name: String,
    /// T10 vendor identification, at most 8 printable ASCII characters.
    pub vendor: String,
    /// Product identification, at most 16 printable ASCII characters.
    pub product: String,
    /// Product revision level, at most 4 printable ASCII characters.
    pub revision: String,
    /// Unit serial number (VPD 0x80), at most 240 printable ASCII characters.
    pub serial: String,
    /// The 16-byte NAA IEEE Registered Extended designator (VPD 0x83), big-endian: the top
    /// nibble must be 6, followed by the 24-bit IEEE OUI and 100 bits of vendor-specific
    /// identifier. EXTENDED COPY finds logical units by it.
    pub wwn: u128,
    /// Initial WCE (caching mode page); with WCE=0 every write is forced to stable media.
    pub write_cache: bool,
    pub read_only: bool,
    /// Logical block provisioning management: UNMAP, WRITE SAME with UNMAP, GET LBA STATUS
    /// deallocated ranges, SANITIZE BLOCK ERASE.
    pub thin: bool,
    /// Physical block size in bytes: a power of two, at least the logical block size and at
    /// most 2^15 logical blocks. READ CAPACITY(16) reports it as LOGICAL BLOCKS PER PHYSICAL
    /// BLOCK EXPONENT (lowest aligned LBA 0); the Block Limits VPD granularities follow it.
    /// `None`: the logical block size.
    pub physical_block_size: Option<u32>,
    /// Removable medium (SBC-4 4.4): RMB in INQUIRY, START STOP UNIT with LOEJ ejects and
    /// loads, PREVENT ALLOW MEDIUM REMOVAL keeps the medium in.
    pub removable: bool,
    /// Bytes per second a SANITIZE overwrite or zero-fill may write (0: unlimited), so a
    /// sanitize in the background leaves the backing storage to the other logical units.
    pub sanitize_rate: u64,
    /// Persistent reservation state (saved while APTPL is set), restored by [`Device::new`].
    pub pr_file: Option<PathBuf>,
    /// The persistent reservation state lives with the other processes that export this
    /// logical unit (a shared file, a RADOS object), instead of `pr_file`: it holds the live
    /// state whatever APTPL says, every change is made atomically from its current contents,
    /// and every command first takes in a change another process made (with the unit
    /// attentions it owes this process's I_T nexuses).
    pub pr_shared: Option<Arc<dyn SharedState>>,
    /// Registry through which EXTENDED COPY resolves copy targets; the device registers
    /// itself in [`Device::new`].
    pub registry: Option<Arc<DeviceRegistry>>,
    /// Target port groups and their access states (learned from the I_T nexuses when
    /// none are configured).
    pub alua: AluaConfig,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            name: String::new(),
            vendor: "RTGT".into(),
            product: "VIRTUAL-DISK".into(),
            revision: "0001".into(),
            serial: String::new(),
            wwn: 0x6000_0000_0000_0000_0000_0000_0000_0000,
            write_cache: true,
            read_only: false,
            thin: false,
            physical_block_size: None,
            removable: false,
            sanitize_rate: DEFAULT_SANITIZE_RATE,
            pr_file: None,
            pr_shared: None,
            registry: None,
            alua: AluaConfig::default(),
        }
    }
}

/// Largest data transfer of one command (Block Limits VPD MAXIMUM TRANSFER LENGTH).
pub const MAX_TRANSFER_BYTES: u32 = 8 << 20;

/// Default [`DeviceConfig::sanitize_rate`]: 32 MiB/s.
pub const DEFAULT_SANITIZE_RATE: u64 = 32 << 20;

/// State of one I_T nexus on a logical unit.
#[derive(Debug)]
struct NexusState {
    ua: UaQueue,
    initiator_port: String,
    relative_port: u16,
    port_group: u16,
    /// PREVENT ALLOW MEDIUM REMOVAL state of this nexus.
    prevent: bool,
}

impl NexusState {
    fn new(nexus: &Nexus, ua: UaQueue) -> NexusState {
        NexusState {
            ua,
            initiator_port: nexus.initiator_port.clone(),
            relative_port: nexus.relative_port,
            port_group: nexus.port_group,
            prevent: false,
        }
    }
}

/// Mutable logical unit state, behind one mutex that is never held across an await.
#[derive(Debug)]
struct DevState {
    nexuses: HashMap<u64, NexusState>,
    mode: ModeState,
    /// The mode parameters at power on (the configuration's; MODE SENSE's default values).
    defaults: ModeState,
    pr: pr::PrState,
    stopped: bool,
    /// A removable medium is loaded (always true for a fixed medium).
    loaded: bool,
    sanitize: sbc::SanitizeState,
    copies: xcopy::HeldResults,
    alua: alua::Alua,
    /// This process's nexuses whose registrations another gateway's PREEMPT AND ABORT
    /// removed, for the shared state's listener to abort the commands of (kept only while
    /// there is one).
    preempted_elsewhere: Vec<u64>,
}

impl DevState {
    /// Why the logical unit cannot process `desc` now: a sanitize operation in progress
    /// refuses every command but those allowed during it (SBC-4 4.11); a failed sanitize,
    /// a missing removable medium and the stopped power condition refuse medium access and
    /// TEST UNIT READY.
    fn not_ready(&self, desc: &CmdDesc) -> Option<Sense> {
        if self.sanitize.running() && !desc.op.allowed_during_sanitize() {
            return Some(self.sanitize.in_progress_sense());
        }
        if !desc.media && desc.op != Op::TestUnitReady {
            return None;
        }
        if self.sanitize.failed() && desc.op != Op::Sanitize {
            // A new sanitize is the way out of the failure (SBC-4 4.11.2).
            return Some(sbc::sanitize_failed());
        }
        self.medium_state()
    }

    /// Readiness of the medium as REQUEST SENSE reports it (SPC-4 6.39).
    fn readiness(&self) -> Option<Sense> {
        if self.sanitize.running() {
            return Some(self.sanitize.in_progress_sense());
        }
        if self.sanitize.failed() {
            return Some(sbc::sanitize_failed());
        }
        self.medium_state()
    }

    fn medium_state(&self) -> Option<Sense> {
        if !self.loaded {
            Some(Sense::new(key::NOT_READY, asc::MEDIUM_NOT_PRESENT))
        } else if self.stopped {
            Some(Sense::new(key::NOT_READY, asc::NOT_READY_INIT_REQUIRED))
        } else {
            None
        }
    }

    /// Some I_T nexus prevents medium removal (SBC-4 5.13).
    fn removal_prevented(&self) -> bool {
        self.nexuses.values().any(|n| n.prevent)
    }

    fn post_all(&mut self, ua: UnitAttention, except: Option<u64>) {
        for (id, n) in self.nexuses.iter_mut() {
            if Some(*id) != except {
                n.ua.push(ua);
            }
        }
    }

    /// The nexuses, but `except`, whose registrations `targets` says were preempted.
    fn preempted(&self, targets: &[pr::UaTarget], except: u64) -> Vec<u64> {
        self.nexuses
            .iter()
            .filter(|(id, n)| {
                **id != except
                    && targets.iter().any(|t| {
                        t.ua == UnitAttention::RegistrationsPreempted
                            && t.reg.matches(&n.initiator_port, n.relative_port)
                    })
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Establishes unit attentions for the nexuses a registration covers.
    fn post_reg(&mut self, targets: &[pr::UaTarget], except: u64) {
        for t in targets {
            for (id, n) in self.nexuses.iter_mut() {
                if *id != except && t.reg.matches(&n.initiator_port, n.relative_port) {
                    n.ua.push(t.ua);
                }
            }
        }
    }
}

/// A logical unit: a backstore plus SCSI state (mode pages, reservations, unit attentions).
pub struct Device {
    /// This device, for background operations that outlive the command starting them.
    me: Weak<Device>,
    backstore: Arc<dyn Backstore>,
    pool: Arc<BufPool>,
    config: DeviceConfig,
    naa: [u8; 16],
    block_size: u32,
    /// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT.
    lbppb_exp: u8,
    num_blocks: AtomicU64,
    hw_read_only: bool,
    /// TPGS of standard INQUIRY data ([`AluaConfig::tpgs`]); it changes with the groups.
    tpgs: AtomicU8,
    /// The target port groups are learned (none configured): every one active/optimized.
    alua_learns: AtomicBool,
    /// Counts the changes of target port group states, for other fabrics to follow.
    alua_changes: tokio::sync::watch::Sender<u64>,
    state: Mutex<DevState>,
    /// Held while a shared reservation state is read and taken in.
    pr_refresh: tokio::sync::Mutex<()>,
    /// The task that takes in the changes other gateways announce ([`follow_shared_pr`]).
    pr_listener: Mutex<Option<tokio::task::AbortHandle>>,
    range_lock: Arc<range_lock::RangeLock>,
    /// Ordering of the logical unit's task set ([`task`]).
    order: task::Order,
}

impl Drop for Device {
    fn drop(&mut self) {
        let listener = self
            .pr_listener
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(task) = listener.take() {
            task.abort();
        }
    }
}

/// Takes in each change of the shared reservation state that another gateway announces as
/// it comes, and aborts the commands of the nexuses a PREEMPT AND ABORT there preempted,
/// before acknowledging it: the other gateway's command completes after that.
async fn follow_shared_pr(dev: Weak<Device>, store: Arc<dyn SharedState>) {
    while store.next_change().await {
        let Some(dev) = dev.upgrade() else {
            return;
        };
        // A failure is logged, and the next command tries again.
        let _ = dev.refresh_shared_pr().await;
        let victims = std::mem::take(&mut dev.lock().preempted_elsewhere);
        task::abort_preempted(&dev, None, &victims).await;
        drop(dev);
        store.acknowledge();
    }
    // The store does not announce changes: commands find them.
    if let Some(dev) = dev.upgrade() {
        *dev.pr_listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.config.name)
            .field("block_size", &self.block_size)
            .field("num_blocks", &self.num_blocks())
            .finish_non_exhaustive()
    }
}

/// A successful command.
#[derive(Debug)]
pub(crate) struct Done {
    status: Status,
    data: Option<IoBuf>,
    transfer_len: u32,
}

impl Done {
    fn good() -> Done {
        Done {
            status: Status::Good,
            data: None,
            transfer_len: 0,
        }
    }

    /// Parameter data limited by the allocation length (SPC-4 4.2.5.6).
    fn data(bytes: &[u8], alloc: u32) -> Done {
        let n = bytes.len().min(alloc as usize);
        Done {
            status: Status::Good,
            data: if n > 0 {
                Some(IoBuf::from_slice(&bytes[..n]))
            } else {
                None
            },
            transfer_len: n as u32,
        }
    }
}

/// A failed command.
#[derive(Debug)]
pub(crate) enum Fail {
    Check(Sense),
    Conflict,
}

impl From<Sense> for Fail {
    fn from(s: Sense) -> Fail {
        Fail::Check(s)
    }
}

pub(crate) type CmdResult = Result<Done, Fail>;

/// Everything a handler needs about one command.
pub(crate) struct Ctx<'a> {
    dev: &'a Device,
    nexus: &'a Nexus,
    cdb: [u8; MAX_CDB_LEN],
    desc: &'static CmdDesc,
    data_out: Option<IoBuf>,
    edtl_in: u32,
    /// The fabric's task tag ([`Device::abort_task`]).
    tag: u64,
    /// The fabric takes data-in as a file range ([`Device::execute_ranged`]).
    range_ok: bool,
    /// Data-in a handler left as a file range.
    data_range: Option<FileRange>,
    /// An ORDERED task: earlier reads may still be on their way out of the file's pages.
    ordered: bool,
}

impl Ctx<'_> {
    fn cdb(&self) -> cdb::Cdb<&[u8]> {
        cdb::Cdb::new_unchecked(&self.cdb[..])
    }

    fn data_out_len(&self) -> usize {
        self.data_out.as_ref().map_or(0, |b| b.len())
    }

    fn data_out(&self) -> &[u8] {
        self.data_out.as_ref().map_or(&[], |b| b.as_slice())
    }
}

fn ascii_ok(s: &str, max: usize) -> bool {
    s.len() <= max && s.bytes().all(|c| (0x20..=0x7e).contains(&c))
}

impl Device {
    /// Creates a logical unit over `backstore`; restores persistent reservations from
    /// `config.pr_file` and registers with `config.registry`.
    pub fn new(
        backstore: Arc<dyn Backstore>,
        pool: Arc<BufPool>,
        config: DeviceConfig,
    ) -> Result<Arc<Device>, ScsiError> {
        if !ascii_ok(&config.vendor, 8)
            || !ascii_ok(&config.product, 16)
            || !ascii_ok(&config.revision, 4)
            || !ascii_ok(&config.serial, 240)
        {
            return Err(ScsiError::InvalidConfig(
                "vendor/product/revision/serial must be short printable ASCII".into(),
            ));
        }
        if config.wwn >> 124 != 6 {
            return Err(ScsiError::InvalidConfig(
                "wwn must be an NAA 6 (IEEE Registered Extended) designator".into(),
            ));
        }
        let info = backstore.info();
        let bs = info.block_size;
        if !bs.is_power_of_two() || !(512..=65536).contains(&bs) {
            return Err(ScsiError::BlockSize(bs));
        }
        let pbs = config.physical_block_size.unwrap_or(bs);
        if !pbs.is_power_of_two() || pbs < bs || pbs / bs > 1 << 15 {
            return Err(ScsiError::InvalidConfig(format!(
                "physical block size {pbs} must be a power of two of 1 to 2^15 logical blocks of {bs} bytes"
            )));
        }
        let lbppb_exp = (pbs / bs).trailing_zeros() as u8;
        config.alua.validate().map_err(ScsiError::InvalidConfig)?;
        // A shared state is read before the first command (it may need the network).
        let pr = match &config.pr_file {
            Some(p) if config.pr_shared.is_none() => pr::load(p)?,
            _ => pr::PrState::default(),
        };
        let defaults = ModeState {
            wce: config.write_cache,
            d_sense: false,
            swp: false,
            tas: false,
        };
        let dev = Arc::new_cyclic(|me| Device {
            me: me.clone(),
            naa: config.wwn.to_be_bytes(),
            block_size: bs,
            lbppb_exp,
            num_blocks: AtomicU64::new(info.num_blocks),
            hw_read_only: info.read_only || config.read_only,
            tpgs: AtomicU8::new(config.alua.tpgs()),
            alua_learns: AtomicBool::new(config.alua.groups.is_empty()),
            alua_changes: tokio::sync::watch::Sender::new(0),
            state: Mutex::new(DevState {
                nexuses: HashMap::new(),
                mode: defaults,
                defaults,
                pr,
                stopped: false,
                loaded: true,
                sanitize: sbc::SanitizeState::default(),
                copies: xcopy::HeldResults::default(),
                alua: alua::Alua::new(&config.alua),
                preempted_elsewhere: Vec::new(),
            }),
            range_lock: Arc::new(range_lock::RangeLock::with_exclusive_align(
                (rtgt_backstore::PAGE / u64::from(bs)).max(1),
            )),
            order: task::Order::default(),
            pr_refresh: tokio::sync::Mutex::new(()),
            pr_listener: Mutex::new(None),
            backstore,
            pool,
            config,
        });
        if let Some(reg) = &dev.config.registry {
            reg.register(&dev);
        }
        if let (Some(store), Ok(rt)) = (
            dev.config.pr_shared.clone(),
            tokio::runtime::Handle::try_current(),
        ) {
            // Held while spawning: a listener that ends at once (the store announces
            // nothing) clears the slot only after it is filled.
            let mut slot = dev
                .pr_listener
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let task = rt.spawn(follow_shared_pr(Arc::downgrade(&dev), store));
            *slot = Some(task.abort_handle());
        }
        dev.share_group_states(Vec::new());
        Ok(dev)
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// The NAA designator bytes (VPD 0x83).
    pub fn naa(&self) -> &[u8; 16] {
        &self.naa
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Logical blocks per physical block.
    pub fn lbppb(&self) -> u32 {
        1 << self.lbppb_exp
    }

    pub fn num_blocks(&self) -> u64 {
        self.num_blocks.load(Ordering::Relaxed)
    }

    fn thin(&self) -> bool {
        self.config.thin
    }

    fn lock(&self) -> MutexGuard<'_, DevState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn supports(&self, c: &CmdDesc) -> bool {
        match c.support {
            Support::Always => true,
            Support::Thin => self.thin(),
            Support::ExplicitAlua => self.tpgs() & 0x20 != 0,
        }
    }

    fn max_transfer_blocks(&self) -> u32 {
        MAX_TRANSFER_BYTES / self.block_size
    }

    fn write_protected(&self, st: &DevState) -> bool {
        self.hw_read_only || st.mode.swp
    }

    /// DATA PROTECT sense if writes are refused (SBC-4 4.11).
    fn check_writable(&self) -> Result<(), Sense> {
        let st = self.lock();
        if self.hw_read_only {
            Err(Sense::write_protected())
        } else if st.mode.swp {
            Err(Sense::new(key::DATA_PROTECT, asc::SOFTWARE_WRITE_PROTECTED))
        } else {
            Ok(())
        }
    }

    /// Whether a write must reach stable media before completion: FUA, or WCE=0.
    fn write_fua(&self, fua: bool) -> bool {
        fua || !self.lock().mode.wce
    }

    /// SAM-5 7.7 LOGICAL UNIT RESET: releases the SPC-2 reservation, clears PREVENT
    /// state and held copy results, and establishes BUS DEVICE RESET FUNCTION OCCURRED
    /// for every I_T nexus. Persistent reservations, a loaded or ejected medium and a
    /// sanitize operation in progress (SBC-4 4.11) survive.
    pub fn lun_reset(&self, nexus: &Nexus) {
        self.release_spc2(|_| true);
        let mut st = self.lock();
        st.copies.clear();
        for n in st.nexuses.values_mut() {
            n.prevent = false;
        }
        st.post_all(UnitAttention::LunReset, None);
        tracing::info!(device = %self.config.name, nexus = nexus.id, "logical unit reset");
    }

    /// I_T nexus loss (session ended): releases its SPC-2 reservation and forgets its state
    /// (its PREVENT too); a new session gets POWER ON, RESET OR BUS DEVICE RESET OCCURRED. A
    /// sanitize operation in progress continues.
    pub fn nexus_loss(&self, nexus: &Nexus) {
        let holder = pr::Spc2Holder::of(nexus);
        self.release_spc2(move |h| *h == holder);
        let mut st = self.lock();
        st.nexuses.remove(&nexus.id);
        st.preempted_elsewhere.retain(|&id| id != nexus.id);
        st.copies.forget_nexus(nexus.id);
    }

    /// Releases the SPC-2 reservation if `held` says its holder lets go: at once locally;
    /// in a state shared with other gateways through an update in the background (the
    /// reset or nexus loss that releases it has no command to fail).
    fn release_spc2(&self, held: impl Fn(&pr::Spc2Holder) -> bool + Send + Sync + 'static) {
        let Some(store) = self.config.pr_shared.clone() else {
            let mut st = self.lock();
            if st.pr.spc2.as_ref().is_some_and(&held) {
                st.pr.spc2 = None;
            }
            return;
        };
        if !self.lock().pr.spc2.as_ref().is_some_and(&held) {
            return;
        }
        let me = self.me.clone();
        tokio::spawn(async move {
            let Some(dev) = me.upgrade() else {
                return;
            };
            let r = dev
                .update_shared(store.as_ref(), |doc| {
                    doc.pr.spc2.take_if(|h| held(h));
                    Ok(())
                })
                .await;
            match r {
                Ok((base, new, ())) => {
                    let mut st = dev.lock();
                    dev.take_in_shared(&mut st, &base, &new, None);
                }
                Err(_) => tracing::error!(device = %dev.config.name, state = %store.location(),
                    "releasing the SPC-2 reservation in the shared state failed"),
            }
        });
    }

    /// I_T NEXUS RESET (SAM-5 7.8): like an I_T nexus loss, but the nexus stays and its
    /// next command reports I_T NEXUS LOSS OCCURRED.
    pub fn it_nexus_reset(&self, nexus: &Nexus) {
        self.nexus_loss(nexus);
        let mut ua = UaQueue::default();
        ua.push(UnitAttention::ItNexusLoss);
        self.lock()
            .nexuses
            .insert(nexus.id, NexusState::new(nexus, ua));
    }

    /// The unit attention the next command of `nexus` would report (QUERY ASYNCHRONOUS
    /// EVENT, SAM-5 7.10): a nexus that has not used the logical unit yet has POWER ON.
    pub fn pending_unit_attention(&self, nexus: &Nexus) -> Option<UnitAttention> {
        match self.lock().nexuses.get(&nexus.id) {
            Some(n) => n.ua.peek(),
            None => Some(UnitAttention::PowerOn),
        }
    }

    /// TAS in the control mode page: tasks aborted by another I_T nexus end in TASK ABORTED
    /// status instead of silently.
    pub fn tas(&self) -> bool {
        self.lock().mode.tas
    }

    /// Re-reads the capacity from the backstore and establishes CAPACITY DATA HAS CHANGED.
    pub fn capacity_changed(&self) {
        self.num_blocks
            .store(self.backstore.info().num_blocks, Ordering::Relaxed);
        self.lock().post_all(UnitAttention::CapacityChanged, None);
    }

    /// Switches the volatile write cache (WCE) as a live reconfiguration does: the current
    /// and default caching page say `on`, every I_T nexus gets MODE PARAMETERS CHANGED when
    /// the current value changed, and when it goes off this returns once every write
    /// completed before is durable (later ones are durable on completion).
    pub async fn set_write_cache(&self, on: bool) -> Result<(), BackstoreError> {
        {
            let mut st = self.lock();
            st.defaults.wce = on;
            if st.mode.wce != on {
                st.mode.wce = on;
                st.post_all(UnitAttention::ModeParametersChanged, None);
            }
        }
        self.backstore.set_write_cache(on).await?;
        tracing::info!(device = %self.config.name, write_cache = on, "write cache switched");
        Ok(())
    }

    /// Switches transfers past the page cache (`true`) or through it; returns whether they
    /// now bypass it (see [`Backstore::set_direct`]).
    pub fn set_direct(&self, direct: bool) -> bool {
        let now = self.backstore.set_direct(direct);
        tracing::info!(device = %self.config.name, direct = now, "cache mode switched");
        now
    }

    /// Whether transfers bypass the page cache now.
    pub fn is_direct(&self) -> bool {
        self.backstore.is_direct()
    }

    /// The current WCE: whether writes without FUA may stay volatile until SYNCHRONIZE CACHE.
    pub fn write_cache(&self) -> bool {
        self.lock().mode.wce
    }

    /// Takes in what another process changed in the shared reservation state since this one
    /// last read it, posting the unit attentions that owes this process's I_T nexuses. A
    /// state that cannot be read fails the command (NOT READY when its storage is out of
    /// reach): reservations are not evaluated on a state that may be stale.
    async fn refresh_shared_pr(&self) -> Result<(), Sense> {
        let Some(store) = &self.config.pr_shared else {
            return Ok(());
        };
        if !store
            .maybe_changed()
            .map_err(|e| self.pr_failed(store.as_ref(), &e))?
        {
            return Ok(());
        }
        // One reader at a time, so an older read never replaces a newer one.
        let _one = self.pr_refresh.lock().await;
        if !store
            .maybe_changed()
            .map_err(|e| self.pr_failed(store.as_ref(), &e))?
        {
            return Ok(());
        }
        let bytes = store
            .read()
            .await
            .map_err(|e| self.pr_failed(store.as_ref(), &e))?;
        let doc = shared::decode(&bytes).map_err(|e| {
            self.pr_failed(
                store.as_ref(),
                &std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })?;
        let new = doc.pr;
        let listening = self
            .pr_listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        let mut st = self.lock();
        let uas = pr::changed_elsewhere(&st.pr, &new);
        if listening && new.aborts != st.pr.aborts {
            for id in st.preempted(&uas, u64::MAX) {
                if !st.preempted_elsewhere.contains(&id) {
                    st.preempted_elsewhere.push(id);
                }
            }
        }
        st.pr = new;
        st.post_reg(&uas, u64::MAX);
        self.take_group_states(&mut st, &doc.groups, None);
        Ok(())
    }

    /// Changes the state shared with the other processes (`change` may run more than once:
    /// another process changed it first). Returns the state `change` was applied to, the
    /// result, and what `change` returned.
    pub(crate) async fn update_shared<T: Send>(
        &self,
        store: &dyn SharedState,
        mut change: impl FnMut(&mut shared::SharedDoc) -> Result<T, Fail> + Send,
    ) -> Result<(shared::SharedDoc, shared::SharedDoc, T), Fail> {
        let mut outcome = None;
        store
            .update(&mut |current| {
                let base = match shared::decode(current) {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::error!(device = %self.config.name, error = %e,
                            "the shared state is corrupt");
                        outcome = Some(Err(Sense::internal_failure().into()));
                        return None;
                    }
                };
                let mut new = base.clone();
                match change(&mut new) {
                    Ok(t) => {
                        let bytes = (new != base).then(|| shared::encode(&new));
                        outcome = Some(Ok((base, new, t)));
                        bytes
                    }
                    Err(f) => {
                        outcome = Some(Err(f));
                        None
                    }
                }
            })
            .await
            .map_err(|e| self.pr_failed(store, &e))?;
        outcome.unwrap_or_else(|| Err(Sense::internal_failure().into()))
    }

    /// Takes in the shared state this process has just changed from `base` to `new`: what
    /// other processes changed before (`base` against the local copy: the unit attentions
    /// that owes this process's I_T nexuses), then `new` itself. A nexus other than `except`
    /// hears of a group state change. Returns whether a group state changed. (After an
    /// update the store counts the state as read, so nothing else would take it in.)
    pub(crate) fn take_in_shared(
        &self,
        st: &mut DevState,
        base: &shared::SharedDoc,
        new: &shared::SharedDoc,
        except: Option<u64>,
    ) -> bool {
        let elsewhere = pr::changed_elsewhere(&st.pr, &base.pr);
        st.post_reg(&elsewhere, u64::MAX);
        st.pr = new.pr.clone();
        self.take_group_states(st, &new.groups, except)
    }

    /// Takes in the group states of the shared state; every I_T nexus but `except` hears of
    /// a change. Returns whether a state changed.
    fn take_group_states(
        &self,
        st: &mut DevState,
        states: &[alua::GroupState],
        except: Option<u64>,
    ) -> bool {
        if !st.alua.take_states(states) {
            return false;
        }
        st.post_all(UnitAttention::AsymmetricAccessChanged, except);
        self.alua_moved();
        tracing::info!(device = %self.config.name, "target port group states changed");
        true
    }

    /// The shared state, when the target port group states are kept in it: groups are
    /// configured (learned ones are each process's own).
    fn shared_groups(&self) -> Option<Arc<dyn SharedState>> {
        let store = self.config.pr_shared.clone()?;
        (!self.lock().alua.learns()).then_some(store)
    }

    /// Sets the states of the groups in `wanted` (a change of kind `how`), and in the shared
    /// state when the groups are kept there (writing every group's state first if nobody
    /// has yet). With a backstore whose write lock follows the writes, one group at a time
    /// is active/optimized ([`alua::set_states`]). Every I_T nexus but `except` hears of a
    /// change, on every process that shares the states. Returns whether a state changed.
    pub(crate) async fn set_group_states(
        &self,
        wanted: &[(u16, AccessState)],
        how: alua::Changed,
        except: Option<u64>,
    ) -> Result<bool, Fail> {
        let one = self.backstore.write_lock_follows_writes();
        let Some(store) = self.shared_groups() else {
            let mut st = self.lock();
            let moved = st.alua.set(wanted, how, one);
            if moved {
                st.post_all(UnitAttention::AsymmetricAccessChanged, except);
                self.alua_moved();
            }
            return Ok(moved);
        };
        let own = self.lock().alua.states();
        let (base, new, ()) = self
            .update_shared(store.as_ref(), |doc| {
                if doc.groups.is_empty() {
                    doc.groups = own.clone();
                }
                alua::set_states(&mut doc.groups, wanted, how, one);
                Ok(())
            })
            .await?;
        let mut st = self.lock();
        Ok(self.take_in_shared(&mut st, &base, &new, except))
    }

    /// Sets the state of target port group `group` now, as an implicit change (the API), on
    /// every process that shares the states. Returns whether it changed, or why it could
    /// not be set.
    pub async fn set_group_state(&self, group: u16, state: AccessState) -> Result<bool, String> {
        if !self.lock().alua.states().iter().any(|g| g.id == group) {
            return Err(format!("no target port group {group}"));
        }
        self.set_group_states(&[(group, state)], alua::Changed::Implicitly, None)
            .await
            .map_err(|_| "the shared state of the target port groups is unavailable".into())
    }

    /// The sense for a shared reservation state that could not be read or changed.
    pub(crate) fn pr_failed(&self, store: &dyn SharedState, e: &std::io::Error) -> Sense {
        tracing::error!(device = %self.config.name, state = %store.location(), error = %e,
            "the shared reservation state is unavailable");
        match rtgt_backstore::errno_kind(e, false) {
            IoErrorKind::NotReady => {
                Sense::new(key::NOT_READY, asc::NOT_READY_CAUSE_NOT_REPORTABLE)
            }
            _ => Sense::internal_failure(),
        }
    }

    /// The TPGS field of standard INQUIRY data.
    pub(crate) fn tpgs(&self) -> u8 {
        self.tpgs.load(Ordering::Relaxed)
    }

    /// Takes new target port groups (the configuration changed; see
    /// [`alua::Alua::reconfigure`] for which states are kept). Every I_T nexus gets
    /// ASYMMETRIC ACCESS STATE CHANGED when the state of a port changed, and INQUIRY DATA
    /// HAS CHANGED when TPGS did.
    pub fn set_alua(&self, config: &AluaConfig) -> Result<(), ScsiError> {
        config.validate().map_err(ScsiError::InvalidConfig)?;
        let mut st = self.lock();
        // In the order the nexuses came (their IDs grow), as the groups were learned.
        let mut nexuses: Vec<(u64, u16, u16)> = st
            .nexuses
            .iter()
            .map(|(id, n)| (*id, n.port_group, n.relative_port))
            .collect();
        nexuses.sort_unstable();
        let group_states = |st: &DevState| -> Vec<(u16, AccessState)> {
            st.alua.states().iter().map(|g| (g.id, g.state)).collect()
        };
        let before = group_states(&st);
        let (moved, ordered) = st
            .alua
            .reconfigure(config, nexuses.into_iter().map(|(_, g, p)| (g, p)));
        self.alua_learns
            .store(config.groups.is_empty(), Ordering::Relaxed);
        if moved {
            st.post_all(UnitAttention::AsymmetricAccessChanged, None);
            tracing::info!(device = %self.config.name, "target port group states changed");
        }
        // Groups without SCSI ports (NVMe ports') change no port's state, but are followed.
        if moved || group_states(&st) != before {
            self.alua_moved();
        }
        let tpgs = st.alua.tpgs();
        if self.tpgs.swap(tpgs, Ordering::Relaxed) != tpgs {
            st.post_all(UnitAttention::InquiryDataChanged, None);
        }
        drop(st);
        self.share_group_states(ordered);
        Ok(())
    }

    /// Where the group states are shared with other processes, writes the configuration's
    /// changes `ordered` there, and the states of every group if nobody has written them
    /// yet: in the background, as a configuration has no command to fail.
    fn share_group_states(&self, ordered: Vec<(u16, AccessState)>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.shared_groups().is_none() {
            return;
        }
        let me = self.me.clone();
        rt.spawn(async move {
            let Some(dev) = me.upgrade() else {
                return;
            };
            if let Err(Fail::Check(s)) = dev
                .set_group_states(&ordered, alua::Changed::Implicitly, None)
                .await
            {
                tracing::error!(device = %dev.config.name, sense = ?s,
                    "the target port group states could not be shared");
            }
        });
    }

    /// The access state of target port group `group` now: active/optimized for every group
    /// while groups are learned (without taking the state's lock), unavailable for a group
    /// the configured ones do not have.
    pub fn access_state(&self, group: u16) -> AccessState {
        if self.alua_learns.load(Ordering::Relaxed) {
            return AccessState::ActiveOptimized;
        }
        self.lock().alua.group_state(group)
    }

    /// A counter that grows with every change of a target port group's state (the
    /// configuration, the API, SET TARGET PORT GROUPS, another gateway): for fabrics that
    /// tell their hosts in their own way.
    pub fn alua_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.alua_changes.subscribe()
    }

    fn alua_moved(&self) {
        self.alua_changes.send_modify(|n| *n += 1);
    }

    /// The target port groups as they are now (learned ones included).
    pub fn port_groups(&self) -> Vec<PortGroup> {
        self.lock().alua.groups()
    }

    /// Establishes REPORTED LUNS DATA HAS CHANGED for every I_T nexus.
    pub fn reported_luns_changed(&self) {
        self.lock()
            .post_all(UnitAttention::ReportedLunsChanged, None);
    }

    /// Establishes `ua` for one I_T nexus that has used this logical unit (live
    /// reconfiguration of that nexus's LUN map). A nexus that has not used it yet gets
    /// POWER ON OCCURRED on its first command anyway.
    pub fn unit_attention(&self, nexus: &Nexus, ua: UnitAttention) {
        if let Some(n) = self.lock().nexuses.get_mut(&nexus.id) {
            n.ua.push(ua);
        }
    }

    /// Like [`Device::unit_attention`] for the nexus with id `id`.
    pub fn unit_attention_id(&self, id: u64, ua: UnitAttention) {
        if let Some(n) = self.lock().nexuses.get_mut(&id) {
            n.ua.push(ua);
        }
    }

    /// Clears a pending REPORTED LUNS DATA HAS CHANGED (REPORT LUNS, SPC-4 6.33).
    fn clear_reported_luns_ua(&self, nexus: &Nexus) {
        if let Some(n) = self.lock().nexuses.get_mut(&nexus.id) {
            n.ua.remove(UnitAttention::ReportedLunsChanged);
        }
    }

    /// A fabric aborted the command with task tag `tag` of `nexus` (ABORT TASK). Call it
    /// before waiting for the command to finish: a command that only waits for a background
    /// operation (SANITIZE with IMMED=0) then returns at once, while the operation itself
    /// continues (SBC-4 4.11). Other commands finish as usual.
    pub fn abort_task(&self, nexus: &Nexus, tag: u64) {
        self.lock()
            .sanitize
            .abort_waiters(|n, t| n == nexus.id && t == tag);
    }

    /// Like [`Device::abort_task`] for every command of `nexus` (ABORT TASK SET, I_T nexus
    /// loss), or of every I_T nexus when `None` (CLEAR TASK SET, LOGICAL UNIT RESET, target
    /// reset).
    pub fn abort_task_set(&self, nexus: Option<&Nexus>) {
        let id = nexus.map(|n| n.id);
        self.abort_waits(&|n| id.is_none_or(|id| id == n));
    }

    /// Ends the logical unit's own waits of the commands of the nexuses `nexuses` selects.
    pub(crate) fn abort_waits(&self, nexuses: &dyn Fn(u64) -> bool) {
        self.lock().sanitize.abort_waiters(|n, _| nexuses(n));
    }

    /// Executes one command for `nexus`.
    pub async fn execute(&self, nexus: &Nexus, cmd: Command) -> Response {
        self.execute_ranged(nexus, cmd, false).await
    }

    /// Like [`Device::execute`]; with `range_ok` a READ on a backstore with a
    /// [`Backstore::file_range`] answers with [`Response::data_range`] instead of a buffer.
    pub async fn execute_ranged(&self, nexus: &Nexus, cmd: Command, range_ok: bool) -> Response {
        let edtl = cmd.expected_in_len;
        let (result, d_sense, range) = self.run(nexus, cmd, range_ok).await;
        let mut resp = match result {
            Ok(done) => Response {
                status: done.status,
                sense: None,
                data_in: done.data,
                data_range: range,
                transfer_len: done.transfer_len,
            },
            Err(Fail::Check(s)) => Response {
                status: Status::CheckCondition,
                sense: Some(s.emit(d_sense)),
                data_in: None,
                data_range: None,
                transfer_len: 0,
            },
            Err(Fail::Conflict) => Response {
                status: Status::ReservationConflict,
                sense: None,
                data_in: None,
                data_range: None,
                transfer_len: 0,
            },
        };
        if let Some(d) = &mut resp.data_in {
            if d.len() > edtl as usize {
                d.truncate(edtl as usize);
            }
            if d.is_empty() {
                resp.data_in = None;
            }
        }
        if let Some(r) = &mut resp.data_range {
            r.truncate(u64::from(edtl));
            if r.is_empty() {
                resp.data_range = None;
            }
        }
        resp
    }

    /// Admission (UA, lookup, reservations, CDB validation, readiness) then the handler.
    async fn run(
        &self,
        nexus: &Nexus,
        cmd: Command,
        range_ok: bool,
    ) -> (CmdResult, bool, Option<FileRange>) {
        let opcode = cmd.cdb.first().copied().unwrap_or(0xff);
        let desc = {
            if let Err(s) = self.refresh_shared_pr().await {
                return (Err(s.into()), self.lock().mode.d_sense, None);
            }
            let mut st = self.lock();
            let d_sense = st.mode.d_sense;
            if !st.nexuses.contains_key(&nexus.id) {
                st.alua.learn(nexus.port_group, nexus.relative_port);
            }
            let ns = st.nexuses.entry(nexus.id).or_insert_with(|| {
                let mut ua = UaQueue::default();
                ua.push(UnitAttention::PowerOn);
                NexusState::new(nexus, ua)
            });
            // INQUIRY, REPORT LUNS and REQUEST SENSE neither report nor clear unit
            // attentions (SAM-5 5.14); REQUEST SENSE returns them as parameter data.
            if !matches!(opcode, 0x12 | 0xa0 | 0x03) {
                if let Some(ua) = ns.ua.pop() {
                    return (Err(ua.sense().into()), d_sense, None);
                }
            }
            let desc = match table::lookup(&cmd.cdb, |c| self.supports(c)) {
                Lookup::Found(d) => d,
                Lookup::UnknownOpcode => {
                    return (Err(Sense::invalid_opcode().into()), d_sense, None)
                }
                Lookup::UnknownServiceAction => {
                    return (Err(Sense::invalid_cdb(1, Some(4)).into()), d_sense, None)
                }
            };
            if cmd.cdb.len() < desc.cdb_len() {
                return (Err(Sense::invalid_cdb(0, None).into()), d_sense, None);
            }
            let cdb = &cmd.cdb[..desc.cdb_len()];
            if let Some(s) = st.alua.state_of(nexus).refuses(desc) {
                return (Err(s.into()), d_sense, None);
            }
            if let Some(holder) = &st.pr.spc2 {
                if !holder.is(nexus) && !desc.spc2_ok {
                    return (Err(Fail::Conflict), d_sense, None);
                }
            }
            if st.pr.conflicts(nexus, desc.pr, cdb) {
                return (Err(Fail::Conflict), d_sense, None);
            }
            if let Err(s) = table::check_usage(desc, cdb) {
                return (Err(s.into()), d_sense, None);
            }
            if let Some(s) = st.not_ready(desc) {
                return (Err(s.into()), d_sense, None);
            }
            desc
        };
        let mut padded = [0u8; MAX_CDB_LEN];
        padded[..desc.cdb_len()].copy_from_slice(&cmd.cdb[..desc.cdb_len()]);
        let mut ctx = Ctx {
            dev: self,
            nexus,
            cdb: padded,
            desc,
            data_out: if desc.dir == table::Dir::Out {
                cmd.data_out
            } else {
                None
            },
            edtl_in: cmd.expected_in_len,
            tag: cmd.tag,
            range_ok,
            data_range: None,
            ordered: cmd.attr == TaskAttr::Ordered,
        };
        tracing::trace!(device = %self.config.name, op = desc.name, tag = cmd.tag, "execute");
        let mut r = self.dispatch(&mut ctx).await;
        if let (Ok(done), Some(len)) = (&mut r, table::param_list_len(desc, &ctx.cdb)) {
            done.transfer_len = len;
        }
        let d_sense = self.lock().mode.d_sense;
        let range = if r.is_ok() {
            ctx.data_range.take()
        } else {
            None
        };
        (r, d_sense, range)
    }

    async fn dispatch(&self, ctx: &mut Ctx<'_>) -> CmdResult {
        match ctx.desc.op {
            Op::TestUnitReady => Ok(Done::good()),
            Op::RequestSense => spc::request_sense(ctx),
            Op::Inquiry => spc::inquiry(ctx),
            Op::ModeSense => spc::mode_sense(ctx),
            Op::ModeSelect => spc::mode_select(ctx),
            Op::Reserve => spc::reserve(ctx).await,
            Op::Release => spc::release(ctx).await,
            Op::StartStopUnit => spc::start_stop_unit(ctx).await,
            Op::PreventAllow => spc::prevent_allow(ctx),
            Op::PrIn => spc::pr_in(ctx),
            Op::PrOut => spc::pr_out(ctx).await,
            Op::ReportSupportedOpcodes => spc::report_supported_opcodes(ctx),
            Op::ReportSupportedTmf => spc::report_supported_tmf(ctx),
            Op::ReportTargetPortGroups => alua::report_target_port_groups(ctx),
            Op::SetTargetPortGroups => alua::set_target_port_groups(ctx).await,
            Op::ReportLuns => Ok(lun_map::report_luns_single(ctx)),
            Op::ReadCapacity10 => sbc::read_capacity10(ctx),
            Op::ReadCapacity16 => sbc::read_capacity16(ctx),
            Op::Read => sbc::read(ctx).await,
            Op::Write => sbc::write(ctx).await,
            Op::WriteAndVerify => sbc::write_and_verify(ctx).await,
            Op::Verify => sbc::verify(ctx).await,
            Op::PreFetch => sbc::pre_fetch(ctx),
            Op::SynchronizeCache => sbc::synchronize_cache(ctx).await,
            Op::ReadDefectData => sbc::read_defect_data(ctx),
            Op::WriteSame => sbc::write_same(ctx).await,
            Op::Unmap => sbc::unmap(ctx).await,
            Op::OrWrite => sbc::or_write(ctx).await,
            Op::CompareAndWrite => sbc::compare_and_write(ctx).await,
            Op::WriteAtomic => sbc::write_atomic(ctx).await,
            Op::GetLbaStatus => sbc::get_lba_status(ctx).await,
            Op::Sanitize => sbc::sanitize(ctx).await,
            Op::ExtendedCopy => xcopy::extended_copy(ctx).await,
            Op::ReceiveCopyResults => xcopy::receive_copy_results(ctx),
        }
    }
}

/// The LUNs one nexus can see, with REPORT LUNS and answers for unmapped LUNs.
#[derive(Default, Clone)]
pub struct LunMap {
    pub luns: BTreeMap<u64, Arc<Device>>,
}

impl LunMap {
    /// The logical units of the map, each once.
    pub fn devices(&self) -> Vec<Arc<Device>> {
        let mut out: Vec<Arc<Device>> = Vec::new();
        for d in self.luns.values() {
            if !out.iter().any(|o| Arc::ptr_eq(o, d)) {
                out.push(d.clone());
            }
        }
        out
    }
}
