//! One table of task management cases, run against every fabric: iSCSI over TCP, iSCSI over
//! iSER (soft-RoCE loopback) and SRP (soft-RoCE loopback). Each fabric is driven through
//! [`Fabric`], and its response codes are mapped to [`Resp`] in one place
//! ([`iscsi_resp`], [`srp_resp`]), so every case is asserted identically everywhere.
//!
//! A command is kept in flight by a backstore whose reads wait at a closed gate
//! ([`GatedStore`]); the target's own task set tells when the function has marked it aborted,
//! and only then is the gate opened.
//!
//! On the RDMA fabrics a command is also kept in its data transfer: a gate on the soft-RoCE
//! link ([`Gate`]) holds the RDMA READ responses that carry a WRITE's data-out, or the RDMA
//! WRITEs that carry a READ's data-in, while every other packet (the function, its response,
//! ACKs) passes. iSCSI over TCP has no RDMA stage; its WRITE stalls in data-out when the
//! initiator answers no R2T, and its data-in cannot be held (those cases do not apply to it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rtgt_backstore::BufPool;
use rtgt_transport::netdev::gate::{self, Gate};

use crate::srp::GatedStore;
use rtgt_iscsi::pdu::tmf as itmf;
use rtgt_iscsi::server::ServerShared;
use rtgt_scsi::core::{Auth, IscsiParams};
use rtgt_scsi::task::{Stage, Tracked};
use rtgt_scsi::{Device, DeviceConfig};
use rtgt_srp::channel::Channel;
use rtgt_srp::iu::{tmf as stmf, tmf_status};
use rtgt_tools::iscsi::{Session, SubmitOptions};
use rtgt_tools::srp::{DescMode, Initiator, InitiatorError};

const BLOCK: u32 = 512;
const BLOCKS: u64 = 65536;
/// The LUN every fabric maps; [`NO_LUN`] is mapped nowhere.
const LUN: u64 = 0;
const NO_LUN: u64 = 9;
/// A tag no command carries.
const UNKNOWN_TAG: u64 = 0x7777;
/// The held READ: 8 blocks at LBA 0 (the READ with its data-in held: at [`WRITE_LBA`]).
const READ_BLOCKS: u32 = 8;
/// The stalled WRITE: [`WRITE_BLOCKS`] at [`WRITE_LBA`]. Larger than iSCSI's first burst, so
/// that over TCP part of it waits for an R2T.
const WRITE_LBA: u64 = 4096;
const WRITE_BLOCKS: u32 = 256;
/// How long a polled state may take to appear.
const PATIENCE: Duration = Duration::from_secs(10);

/// A task management function as the table names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tmf {
    AbortTask(Ref),
    AbortTaskSet,
    ClearTaskSet,
    LunReset,
    ClearAca,
    QueryTask(Ref),
    QueryTaskSet,
    QueryAsyncEvent,
    ItNexusReset,
}

impl Tmf {
    /// Functions every fabric defines (SRP has no query functions and no I_T NEXUS RESET).
    fn in_srp(self) -> bool {
        matches!(
            self,
            Tmf::AbortTask(_)
                | Tmf::AbortTaskSet
                | Tmf::ClearTaskSet
                | Tmf::LunReset
                | Tmf::ClearAca
        )
    }
}

/// A task a function refers to: the held command's, or one that never existed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ref {
    Held,
    Unknown,
}

/// The referenced task on the wire: its tag (and for iSCSI the CmdSN it was sent with).
#[derive(Debug, Clone, Copy)]
struct Tagged {
    tag: u64,
    cmd_sn: u32,
}

/// A task management response, whatever fabric carried it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resp {
    /// FUNCTION COMPLETE.
    Complete,
    /// FUNCTION SUCCEEDED.
    Succeeded,
    /// The referenced task is not in the task set.
    NoSuchTask,
    /// INCORRECT LOGICAL UNIT NUMBER.
    IncorrectLun,
    /// The function is not supported.
    Rejected,
    /// Any other code of the fabric.
    Other(u8),
}

/// iSCSI response codes (RFC 7143 §11.6.1, RFC 7144 §4.6).
fn iscsi_resp(code: u8) -> Resp {
    match code {
        itmf::FUNCTION_COMPLETE => Resp::Complete,
        itmf::TASK_DOES_NOT_EXIST => Resp::NoSuchTask,
        itmf::LUN_DOES_NOT_EXIST => Resp::IncorrectLun,
        itmf::NOT_SUPPORTED => Resp::Rejected,
        itmf::FUNCTION_SUCCEEDED => Resp::Succeeded,
        c => Resp::Other(c),
    }
}

/// SRP response codes (SRP_RSP response data byte 3). SRP has no "task does not exist" and no
/// "incorrect LUN": the target answers the first with COMPLETE (SAM-5 7.2) and the second with
/// FAILED.
fn srp_resp(code: u8) -> Resp {
    match code {
        tmf_status::COMPLETE => Resp::Complete,
        tmf_status::FAILED => Resp::IncorrectLun,
        tmf_status::NOT_SUPPORTED => Resp::Rejected,
        c => Resp::Other(c),
    }
}

/// The answer of a command: status, and (sense key, ASC, ASCQ) with CHECK CONDITION.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Status {
    status: u8,
    sense: Option<(u8, u8, u8)>,
}

impl Status {
    fn good() -> Status {
        Status {
            status: 0,
            sense: None,
        }
    }

    fn unit_attention(asc: u8, ascq: u8) -> Status {
        Status {
            status: 2,
            sense: Some((6, asc, ascq)),
        }
    }
}

fn fixed_sense(sense: &[u8]) -> Option<(u8, u8, u8)> {
    (sense.len() >= 14).then(|| (sense[2] & 0xf, sense[12], sense[13]))
}

/// A command's response: its status and the data it read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: Status,
    data: Vec<u8>,
}

/// A command in flight: its tag and what its response turned into.
struct Held {
    tagged: Tagged,
    answer: tokio::task::JoinHandle<Result<Answer, String>>,
}

/// Waits for a command's response.
async fn answer_of(h: Held, what: &str) -> Result<Result<Answer, String>, String> {
    tokio::time::timeout(PATIENCE, h.answer)
        .await
        .map_err(|_| format!("{what} was never answered"))?
        .map_err(|e| format!("{what}: {e}"))
}

fn status_of(r: &Result<Answer, String>) -> Result<Status, String> {
    r.as_ref().map(|a| a.status.clone()).map_err(Clone::clone)
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// What a fabric offers the table.
trait Fabric {
    const NAME: &'static str;
    /// What ABORT TASK of a task that is not in the task set answers.
    const NO_SUCH_TASK: Resp;
    /// Whether data moves by RDMA (and can be held at the link's gate).
    const RDMA: bool;
    /// The backstore of [`LUN`].
    fn store(&self) -> &GatedStore;
    /// The gate on the fabric's RDMA packets; `None` without RDMA.
    fn gate(&self) -> Option<&Gate>;
    /// Sends a READ of `blocks` blocks at `lba` of [`LUN`].
    async fn start_read(&self, lba: u64, blocks: u32) -> Held;
    /// Sends a WRITE of `data` at `lba` of [`LUN`]; with `withhold`, an iSCSI initiator
    /// answers no R2T (the RDMA fabrics stall at the gate instead and ignore it).
    async fn start_write(&self, lba: u64, data: Vec<u8>, withhold: bool) -> Held;
    /// Sends `f` for `lun`; `held` is the task a [`Ref::Held`] refers to.
    async fn tmf(&self, f: Tmf, lun: u64, held: Option<Tagged>) -> Resp;
    /// A command without data: its status.
    async fn command(&self, lun: u64, cdb: &[u8]) -> Status;
    /// The target's view of this nexus: tasks in its set, and how many are marked aborted.
    fn target_tasks(&self) -> (usize, usize);
    /// The target's only task waits for its data-out: RDMA READ responses are held at the
    /// gate, or (TCP) it is in its data-out stage.
    fn data_out_stalled(&self) -> bool;
    /// Task management functions the target has received on this nexus.
    fn functions_seen(&self) -> u64;
}

fn resolve(r: Ref, held: Option<Tagged>) -> Tagged {
    match r {
        Ref::Held => held.expect("the case holds a command"),
        Ref::Unknown => Tagged {
            tag: UNKNOWN_TAG,
            cmd_sn: 0,
        },
    }
}

fn rw16(op: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(0x88, lba, blocks)
}

fn write16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(0x8a, lba, blocks)
}

const TUR: [u8; 6] = [0; 6];

fn gated_device(pool: &Arc<BufPool>) -> (Arc<GatedStore>, Arc<Device>) {
    let store = GatedStore::new(BLOCKS, BLOCK);
    let dev = Device::new(store.clone(), pool.clone(), DeviceConfig::default()).unwrap();
    (store, dev)
}

/// iSCSI, over TCP or iSER: the same initiator session either way.
struct Iscsi {
    name: &'static str,
    s: Session,
    shared: Arc<ServerShared>,
    store: Arc<GatedStore>,
    gate: Option<Gate>,
    _keep: Keep,
}

#[allow(dead_code)]
enum Keep {
    Tcp(crate::iscsi::Lab),
    Iser(crate::iser::Fab),
}

struct Tcp(Iscsi);
struct Iser(Iscsi);

impl Tcp {
    async fn new() -> Tcp {
        let pool = BufPool::new(64 << 20);
        let (store, dev) = gated_device(&pool);
        let lab = crate::iscsi::lab_on(
            IscsiParams::default(),
            Auth::default(),
            true,
            HashMap::new(),
            pool,
            dev,
        )
        .await;
        let s = crate::iscsi::connect(lab.addr, crate::iscsi::cfg()).await;
        Tcp(Iscsi {
            name: "iscsi/tcp",
            s,
            shared: lab.server.shared(),
            store,
            gate: None,
            _keep: Keep::Tcp(lab),
        })
    }
}

impl Iser {
    async fn new() -> Iser {
        let pool = BufPool::new(64 << 20);
        let (store, dev) = gated_device(&pool);
        let mut fab = crate::iser::fab_on(0, Auth::default(), pool, dev).await;
        let s = fab.connect(crate::iser::cfg()).await.unwrap();
        Iser(Iscsi {
            name: "iser",
            s,
            shared: fab.shared.clone(),
            store,
            gate: Some(fab.gate.clone()),
            _keep: Keep::Iser(fab),
        })
    }
}

impl Iscsi {
    async fn start_read(&self, lba: u64, blocks: u32) -> Held {
        self.start(&read16(lba, blocks), None, blocks * BLOCK, false)
            .await
    }

    async fn start_write(&self, lba: u64, data: Vec<u8>, withhold: bool) -> Held {
        let blocks = (data.len() / BLOCK as usize) as u32;
        self.start(&write16(lba, blocks), Some(Bytes::from(data)), 0, withhold)
            .await
    }

    async fn start(&self, cdb: &[u8], out: Option<Bytes>, in_len: u32, withhold: bool) -> Held {
        let opts = SubmitOptions {
            withhold_data: withhold,
            ..SubmitOptions::default()
        };
        let p = self
            .s
            .submit_with(LUN, cdb, out, in_len, opts)
            .await
            .unwrap();
        let tagged = Tagged {
            tag: u64::from(p.itt),
            cmd_sn: p.cmd_sn,
        };
        let answer = tokio::spawn(async move {
            match p.wait().await {
                Ok(r) => Ok(Answer {
                    status: Status {
                        status: r.status,
                        sense: r.sense_key(),
                    },
                    data: r.data.into(),
                }),
                Err(e) => Err(e.to_string()),
            }
        });
        Held { tagged, answer }
    }

    async fn tmf(&self, f: Tmf, lun: u64, held: Option<Tagged>) -> Resp {
        let (code, r) = match f {
            Tmf::AbortTask(r) => (itmf::ABORT_TASK, Some(resolve(r, held))),
            Tmf::AbortTaskSet => (itmf::ABORT_TASK_SET, None),
            Tmf::ClearTaskSet => (itmf::CLEAR_TASK_SET, None),
            Tmf::LunReset => (itmf::LOGICAL_UNIT_RESET, None),
            Tmf::ClearAca => (itmf::CLEAR_ACA, None),
            Tmf::QueryTask(r) => (itmf::QUERY_TASK, Some(resolve(r, held))),
            Tmf::QueryTaskSet => (itmf::QUERY_TASK_SET, None),
            Tmf::QueryAsyncEvent => (itmf::QUERY_ASYNC_EVENT, None),
            Tmf::ItNexusReset => (itmf::I_T_NEXUS_RESET, None),
        };
        let r = r.unwrap_or(Tagged { tag: 0, cmd_sn: 0 });
        let code = self
            .s
            .task_management(code, lun, r.tag as u32, r.cmd_sn)
            .await
            .unwrap();
        iscsi_resp(code)
    }

    async fn command(&self, lun: u64, cdb: &[u8]) -> Status {
        let r = self.s.command(lun, cdb, None, 0).await.unwrap();
        Status {
            status: r.status,
            sense: r.sense_key(),
        }
    }

    fn session(&self) -> Arc<rtgt_iscsi::session::Session> {
        let sessions = self.shared.sessions.all();
        assert_eq!(sessions.len(), 1, "{}: one session", self.name);
        sessions[0].clone()
    }

    fn target_tasks(&self) -> (usize, usize) {
        let tasks = self.session().tasks().all();
        let aborted = tasks.iter().filter(|t| t.task().is_aborted()).count();
        (tasks.len(), aborted)
    }

    fn data_out_stalled(&self) -> bool {
        match &self.gate {
            Some(g) => g.held() > 0,
            None => {
                let tasks = self.session().tasks().all();
                tasks.len() == 1 && tasks[0].task().stage() == Stage::DataOut
            }
        }
    }

    fn functions_seen(&self) -> u64 {
        self.session()
            .tasks()
            .stats
            .task_management
            .load(Ordering::SeqCst)
    }
}

macro_rules! iscsi_fabric {
    ($t:ty, $name:literal, $rdma:literal) => {
        impl Fabric for $t {
            const NAME: &'static str = $name;
            const NO_SUCH_TASK: Resp = Resp::NoSuchTask;
            const RDMA: bool = $rdma;
            fn store(&self) -> &GatedStore {
                &self.0.store
            }
            fn gate(&self) -> Option<&Gate> {
                self.0.gate.as_ref()
            }
            async fn start_read(&self, lba: u64, blocks: u32) -> Held {
                self.0.start_read(lba, blocks).await
            }
            async fn start_write(&self, lba: u64, data: Vec<u8>, withhold: bool) -> Held {
                self.0.start_write(lba, data, withhold).await
            }
            async fn tmf(&self, f: Tmf, lun: u64, held: Option<Tagged>) -> Resp {
                self.0.tmf(f, lun, held).await
            }
            async fn command(&self, lun: u64, cdb: &[u8]) -> Status {
                self.0.command(lun, cdb).await
            }
            fn target_tasks(&self) -> (usize, usize) {
                self.0.target_tasks()
            }
            fn data_out_stalled(&self) -> bool {
                self.0.data_out_stalled()
            }
            fn functions_seen(&self) -> u64 {
                self.0.functions_seen()
            }
        }
    };
}

iscsi_fabric!(Tcp, "iscsi/tcp", false);
iscsi_fabric!(Iser, "iser", true);

/// SRP over soft-RoCE.
struct Srp {
    rig: crate::srp::Rig,
    ch: Arc<Channel>,
    ini: Arc<Initiator>,
}

impl Srp {
    async fn new() -> Srp {
        use crate::srp as t;
        let rig = t::rig();
        let (ch, ini) = t::connect(&rig, &t::login_req(21, false));
        t::settle(&ini).await;
        Srp { rig, ch, ini }
    }
}

fn srp_answer(r: Result<rtgt_tools::srp::Reply, InitiatorError>) -> Result<Answer, String> {
    match r {
        Ok(r) => Ok(Answer {
            status: Status {
                status: r.rsp.status,
                sense: if r.rsp.status == 2 {
                    fixed_sense(&r.rsp.sense)
                } else {
                    None
                },
            },
            data: r.data,
        }),
        Err(e) => Err(e.to_string()),
    }
}

impl Srp {
    /// Sends a command; nothing else is sent meanwhile, so it takes the next tag.
    fn start(&self, cdb: [u8; 16], out: Option<Vec<u8>>, in_len: u32) -> Held {
        let tag = self.ini.peek_tag();
        let ini = self.ini.clone();
        let answer = tokio::spawn(async move {
            let r = ini
                .command(LUN, &cdb, out.as_deref(), in_len, DescMode::Direct)
                .await;
            srp_answer(r)
        });
        Held {
            tagged: Tagged { tag, cmd_sn: 0 },
            answer,
        }
    }
}

impl Fabric for Srp {
    const NAME: &'static str = "srp";
    const NO_SUCH_TASK: Resp = Resp::Complete;
    const RDMA: bool = true;

    fn store(&self) -> &GatedStore {
        &self.rig.store
    }

    fn gate(&self) -> Option<&Gate> {
        Some(&self.rig.gate)
    }

    async fn start_read(&self, lba: u64, blocks: u32) -> Held {
        self.start(read16(lba, blocks), None, blocks * BLOCK)
    }

    async fn start_write(&self, lba: u64, data: Vec<u8>, _withhold: bool) -> Held {
        let blocks = (data.len() / BLOCK as usize) as u32;
        self.start(write16(lba, blocks), Some(data), 0)
    }

    async fn tmf(&self, f: Tmf, lun: u64, held: Option<Tagged>) -> Resp {
        let (code, tag) = match f {
            Tmf::AbortTask(r) => (stmf::ABORT_TASK, resolve(r, held).tag),
            Tmf::AbortTaskSet => (stmf::ABORT_TASK_SET, 0),
            Tmf::ClearTaskSet => (stmf::CLEAR_TASK_SET, 0),
            Tmf::LunReset => (stmf::LUN_RESET, 0),
            Tmf::ClearAca => (stmf::CLEAR_ACA, 0),
            f => panic!("SRP defines no {f:?}"),
        };
        srp_resp(self.ini.task_mgmt(lun, code, tag).await.unwrap())
    }

    async fn command(&self, lun: u64, cdb: &[u8]) -> Status {
        srp_answer(self.ini.command(lun, cdb, None, 0, DescMode::Direct).await)
            .unwrap()
            .status
    }

    fn target_tasks(&self) -> (usize, usize) {
        (self.ch.outstanding(), self.ch.aborting())
    }

    fn data_out_stalled(&self) -> bool {
        self.rig.gate.held() > 0
    }

    fn functions_seen(&self) -> u64 {
        self.ch.stats.task_mgmt.load(Ordering::SeqCst)
    }
}

/// What is in flight, or pending, when the function is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    Idle,
    /// A READ parked in the backstore.
    HeldRead,
    /// A LOGICAL UNIT RESET answered before: its unit attention is pending.
    AfterLunReset,
    /// A WRITE over a known pattern, stalled in data-out: its RDMA READ responses held at
    /// the gate (iSCSI over TCP: its R2T unanswered).
    HeldWrite,
    /// A READ of a known pattern whose data-in RDMA WRITEs are held at the gate (RDMA only).
    HeldDataIn,
}

impl Setup {
    /// Whether the case holds a command in an RDMA data transfer.
    fn stalls_transfer(self) -> bool {
        matches!(self, Setup::HeldWrite | Setup::HeldDataIn)
    }
}

/// What becomes of the held command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Aborted: no response, ever; gone from the target's task set; a WRITE left the
    /// medium as it was.
    Aborted,
    /// Untouched: answered GOOD (with the right data) once let go.
    Answered,
}

struct Case {
    name: &'static str,
    setup: Setup,
    function: Tmf,
    lun: u64,
    /// The expected response; `None`: what the fabric answers for a task it does not have.
    expect: Option<Resp>,
    fate: Option<Fate>,
    /// The unit attention (ASC, ASCQ) the next command reports.
    ua: Option<(u8, u8)>,
}

const CASES: &[Case] = &[
    Case {
        name: "ABORT TASK, unknown tag",
        setup: Setup::Idle,
        function: Tmf::AbortTask(Ref::Unknown),
        lun: LUN,
        expect: None,
        fate: None,
        ua: None,
    },
    Case {
        name: "ABORT TASK, read held in the backstore",
        setup: Setup::HeldRead,
        function: Tmf::AbortTask(Ref::Held),
        lun: LUN,
        expect: Some(Resp::Complete),
        fate: Some(Fate::Aborted),
        ua: None,
    },
    Case {
        name: "ABORT TASK SET, held read",
        setup: Setup::HeldRead,
        function: Tmf::AbortTaskSet,
        lun: LUN,
        expect: Some(Resp::Complete),
        fate: Some(Fate::Aborted),
        ua: None,
    },
    Case {
        name: "CLEAR TASK SET, held read",
        setup: Setup::HeldRead,
        function: Tmf::ClearTaskSet,
        lun: LUN,
        expect: Some(Resp::Complete),
        fate: Some(Fate::Aborted),
        ua: None,
    },
    Case {
        name: "LOGICAL UNIT RESET",
        setup: Setup::Idle,
        function: Tmf::LunReset,
        lun: LUN,
        expect: Some(Resp::Complete),
        fate: None,
        ua: Some((0x29, 0x03)),
    },
    Case {
        name: "LOGICAL UNIT RESET, held read",
        setup: Setup::HeldRead,
        function: Tmf::LunReset,
        lun: LUN,
        expect: Some(Resp::Complete),
        fate: Some(Fate::Aborted),
        ua: Some((0x29, 0x03)),
    },
    Case {
        name: "LOGICAL UNIT RESET, no such LUN",
        setup: Setup::Idle,
        function: Tmf::LunReset,
        lun: NO_LUN,
        expect: Some(Resp::IncorrectLun),
        fate: None,
        ua: None,
    },
    Case {
        name: "CLEAR ACA",
        setup: Setup::Idle,
        function: Tmf::ClearAca,
        lun: LUN,
        expect: Some(Resp::Rejected),
        fate: None,
        ua: None,
    },
    Case {
        name: "QUERY TASK, held read",
        setup: Setup::HeldRead,
        function: Tmf::QueryTask(Ref::Held),
        lun: LUN,
        expect: Some(Resp::Succeeded),
        fate: Some(Fate::Answered),
        ua: None,
    },
    Case {
        name: "QUERY TASK, unknown tag",
        setup: Setup::Idle,
        function: Tmf::QueryTask(Ref::Unknown),
        lun: LUN,
        expect: Some(Resp::Complete),
        fate: None,
        ua: None,
    },
    Case {
        name: "QUERY TASK SET, held read",
        setup: Setup::HeldRead,
        function: Tmf::QueryTaskSet,
        lun: LUN,
        expect: Some(Resp::Succeeded),
        fate: Some(Fate::Answered),
        ua: None,
    },
    Case {
        name: "QUERY TASK SET, idle",
        setup: Setup::Idle,
        function: Tmf::QueryTaskSet,
        lun: LUN,
        expect: Some(Resp::Complete),
        fate: None,
        ua: None,
    },
    Case {
        name: "QUERY ASYNC EVENT, nothing pending",
        setup: Setup::Idle,
        function: Tmf::QueryAsyncEvent,
        lun: LUN,
        expect: Some(Resp::Complete),
        fate: None,
        ua: None,
    },
    Case {
        name: "QUERY ASYNC EVENT after a LUN reset",
        setup: Setup::AfterLunReset,
        function: Tmf::QueryAsyncEvent,
        lun: LUN,
        expect: Some(Resp::Succeeded),
        fate: None,
        // The query reports the unit attention without clearing it.
        ua: Some((0x29, 0x03)),
    },
    Case {
        name: "I_T NEXUS RESET",
        setup: Setup::Idle,
        function: Tmf::ItNexusReset,
        lun: LUN,
        expect: Some(Resp::Complete),
        fate: None,
        ua: Some((0x29, 0x07)),
    },
    Case {
        name: "I_T NEXUS RESET, held read",
        setup: Setup::HeldRead,
        function: Tmf::ItNexusReset,
        lun: LUN,
        expect: Some(Resp::Complete),
        fate: Some(Fate::Aborted),
        ua: Some((0x29, 0x07)),
    },
    // The task waits for its data-out (RDMA READ completions, or Data-Out PDUs), which the
    // abort does not cut short on RDMA: the function answers once the READs are let go and
    // the task has noticed the abort before executing.
    Case {
        name: "ABORT TASK, write with its data-out held",
        setup: Setup::HeldWrite,
        function: Tmf::AbortTask(Ref::Held),
        lun: LUN,
        expect: Some(Resp::Complete),
        fate: Some(Fate::Aborted),
        ua: None,
    },
    // iSER and SRP retire a task (out of the task set, status decided) when they post its
    // data-in RDMA WRITEs and status SEND, without waiting for their completion: the read is
    // no longer in the task set, so ABORT TASK finds no task (iSCSI: TASK DOES NOT EXIST, its
    // RefCmdSN being below the CmdSN window, RFC 7143 11.5.1; SRP: FUNCTION COMPLETE, SAM-5
    // 7.2), and the read ends GOOD with its data once the WRITEs are let go.
    Case {
        name: "ABORT TASK, read with its data-in held",
        setup: Setup::HeldDataIn,
        function: Tmf::AbortTask(Ref::Held),
        lun: LUN,
        expect: None,
        fate: Some(Fate::Answered),
        ua: None,
    },
    Case {
        name: "LOGICAL UNIT RESET, write with its data-out held",
        setup: Setup::HeldWrite,
        function: Tmf::LunReset,
        lun: LUN,
        expect: Some(Resp::Complete),
        fate: Some(Fate::Aborted),
        ua: Some((0x29, 0x03)),
    },
];

async fn poll(what: &str, mut cond: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !cond() {
        if tokio::time::Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

macro_rules! check {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!($($fmt)*));
        }
    };
}

/// Runs one case on a fresh fabric; `Err` says what differed.
async fn run_case<F: Fabric>(f: &F, case: &Case) -> Result<(), String> {
    if case.setup.stalls_transfer() {
        let r = run_transfer_case(f, case).await;
        if let Some(g) = f.gate() {
            g.open();
        }
        return r;
    }
    let mut held = None;
    match case.setup {
        Setup::Idle | Setup::HeldWrite | Setup::HeldDataIn => {}
        Setup::HeldRead => {
            f.store().set(true);
            let h = f.start_read(0, READ_BLOCKS).await;
            poll("the read to reach the backstore", || {
                f.store().parked() == 1
            })
            .await?;
            check!(
                f.target_tasks() == (1, 0),
                "target tasks before the function: {:?}",
                f.target_tasks()
            );
            held = Some(h);
        }
        Setup::AfterLunReset => {
            let r = f.tmf(Tmf::LunReset, LUN, None).await;
            check!(r == Resp::Complete, "LOGICAL UNIT RESET first: {r:?}");
        }
    }
    let expect = case.expect.unwrap_or(F::NO_SUCH_TASK);
    let tagged = held.as_ref().map(|h| h.tagged);
    let resp = {
        let tmf = f.tmf(case.function, case.lun, tagged);
        tokio::pin!(tmf);
        if case.fate == Some(Fate::Aborted) {
            // Open the backstore only once the function has marked the read aborted.
            let deadline = tokio::time::Instant::now() + PATIENCE;
            let mut answered = None;
            loop {
                tokio::select! {
                    r = &mut tmf => { answered = Some(r); break; }
                    _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                }
                if f.target_tasks().1 == 1 {
                    break;
                }
                if tokio::time::Instant::now() > deadline {
                    f.store().set(false);
                    return Err("the function never marked the read aborted".into());
                }
            }
            f.store().set(false);
            match answered {
                Some(r) => r,
                None => tmf.await,
            }
        } else {
            tmf.await
        }
    };
    f.store().set(false);
    check!(resp == expect, "response {resp:?}, expected {expect:?}");
    if let Some(h) = held {
        match case.fate {
            Some(Fate::Aborted) => {
                poll("the aborted read to leave the task set", || {
                    f.target_tasks() == (0, 0)
                })
                .await?;
            }
            Some(Fate::Answered) => {
                let r = status_of(&answer_of(h, "the held read").await?);
                check!(r == Ok(Status::good()), "the held read was answered {r:?}");
                return after(f, case, None).await;
            }
            None => unreachable!("a held read has a fate"),
        }
        return after(f, case, Some(h)).await;
    }
    after(f, case, None).await
}

/// The unit attention the case leaves, then a working nexus; an aborted read still has no
/// response once later commands have been answered.
async fn after<F: Fabric>(f: &F, case: &Case, aborted: Option<Held>) -> Result<(), String> {
    if let Some((asc, ascq)) = case.ua {
        let s = f.command(LUN, &TUR).await;
        check!(
            s == Status::unit_attention(asc, ascq),
            "first command after the function: {s:?}, expected UNIT ATTENTION {asc:02x}h/{ascq:02x}h"
        );
    }
    let s = f.command(LUN, &TUR).await;
    check!(s == Status::good(), "TEST UNIT READY afterwards: {s:?}");
    let h = f.start_read(0, READ_BLOCKS).await;
    let r = status_of(&answer_of(h, "a read afterwards").await?);
    check!(r == Ok(Status::good()), "a read afterwards: {r:?}");
    if let Some(a) = aborted {
        check!(
            !a.answer.is_finished(),
            "the aborted read was answered: {:?}",
            { a.answer.await.unwrap() }
        );
        a.answer.abort();
    }
    check!(
        f.target_tasks() == (0, 0),
        "target tasks at the end: {:?}",
        f.target_tasks()
    );
    Ok(())
}

/// Runs a case that holds a command in its data transfer ([`Setup::stalls_transfer`]).
///
/// The gate is opened by a future running alongside the function, once the function is
/// pending at the target: it has marked the stalled WRITE aborted, or (data-in) it has
/// reached the target. A function that waits for the task must not be answered before.
async fn run_transfer_case<F: Fabric>(f: &F, case: &Case) -> Result<(), String> {
    let bytes = (WRITE_BLOCKS * BLOCK) as usize;
    let before = pattern(bytes, 1);
    let w = f.start_write(WRITE_LBA, before.clone(), false).await;
    let r = status_of(&answer_of(w, "writing the first pattern").await?);
    check!(r == Ok(Status::good()), "writing the first pattern: {r:?}");
    let held = match case.setup {
        Setup::HeldWrite => {
            if let Some(g) = f.gate() {
                g.close(gate::rdma_read_responses);
            }
            let h = f.start_write(WRITE_LBA, pattern(bytes, 2), true).await;
            poll("the write to stall in data-out", || {
                f.data_out_stalled() && f.target_tasks() == (1, 0)
            })
            .await?;
            h
        }
        Setup::HeldDataIn => {
            let g = f.gate().expect("data-in is held on RDMA fabrics only");
            g.close(gate::rdma_writes);
            let h = f.start_read(WRITE_LBA, READ_BLOCKS).await;
            poll(
                "the read's data-in to be held and the read to leave the task set",
                || g.held() > 0 && f.target_tasks() == (0, 0),
            )
            .await?;
            h
        }
        s => unreachable!("{s:?} holds no transfer"),
    };
    let seen = f.functions_seen();
    let answered = AtomicBool::new(false);
    let tmf = async {
        let r = f.tmf(case.function, case.lun, Some(held.tagged)).await;
        answered.store(true, Ordering::SeqCst);
        r
    };
    let release = async {
        let pending = poll("the function to be pending at the target", || {
            answered.load(Ordering::SeqCst)
                || match case.setup {
                    Setup::HeldWrite => f.target_tasks().1 == 1,
                    _ => f.functions_seen() > seen,
                }
        })
        .await;
        let early = answered.load(Ordering::SeqCst);
        if let Some(g) = f.gate() {
            g.open();
        }
        pending.map(|()| early)
    };
    let (resp, early) = tokio::join!(tmf, release);
    let early = early?;
    let expect = case.expect.unwrap_or(F::NO_SUCH_TASK);
    check!(resp == expect, "response {resp:?}, expected {expect:?}");
    match case.fate {
        Some(Fate::Aborted) => {
            check!(
                !(early && f.gate().is_some()),
                "the function was answered while the write's data-out was held"
            );
            // The function answers once the aborted task is done, so it has left the set.
            let t = f.target_tasks();
            check!(
                t == (0, 0),
                "target tasks when the function was answered: {t:?}"
            );
            after(f, case, Some(held)).await?;
            let r = f.start_read(WRITE_LBA, WRITE_BLOCKS).await;
            let r = answer_of(r, "reading the write's blocks back").await?;
            check!(
                r.as_ref().is_ok_and(|a| a.status == Status::good()),
                "reading the write's blocks back: {:?}",
                status_of(&r)
            );
            check!(
                r.is_ok_and(|a| a.data == before),
                "the aborted write changed the medium"
            );
            Ok(())
        }
        Some(Fate::Answered) => {
            let r = answer_of(held, "the read with its data-in held").await?;
            let want = &before[..(READ_BLOCKS * BLOCK) as usize];
            check!(
                status_of(&r) == Ok(Status::good()),
                "the read with its data-in held was answered {:?}",
                status_of(&r)
            );
            check!(
                r.is_ok_and(|a| a.data == want),
                "the read with its data-in held returned wrong data"
            );
            after(f, case, None).await
        }
        None => unreachable!("a held command has a fate"),
    }
}

/// Runs every case that applies to the fabric, each on a fresh one made by `make`, and fails
/// with the list of cases that did not hold.
async fn run_table<F: Fabric, Fut: std::future::Future<Output = F>>(
    make: impl Fn() -> Fut,
    srp_only_functions: bool,
) {
    let mut failed = Vec::new();
    let mut ran = 0;
    for case in CASES {
        if srp_only_functions && !case.function.in_srp() {
            continue;
        }
        if case.setup == Setup::HeldDataIn && !F::RDMA {
            eprintln!("{}: {}: n/a (no RDMA data-in to hold)", F::NAME, case.name);
            continue;
        }
        let f = make().await;
        ran += 1;
        match tokio::time::timeout(PATIENCE * 3, run_case(&f, case)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed.push(format!("{}: {}: {e}", F::NAME, case.name)),
            Err(_) => failed.push(format!("{}: {}: timed out", F::NAME, case.name)),
        }
        f.store().set(false);
    }
    assert!(ran > 0);
    assert!(
        failed.is_empty(),
        "{} of {ran} cases failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_iscsi_tcp() {
    run_table(Tcp::new, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_iser() {
    run_table(Iser::new, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_srp() {
    run_table(Srp::new, true).await;
}
