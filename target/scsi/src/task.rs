//! The task layer: what every fabric shares about commands in flight (SAM-5 clause 8 and 7).
//!
//! A fabric creates one [`Task`] per command, admits it into the [`TaskSet`] of its I_T
//! nexus (one per iSCSI session, one per SRP channel), waits for its turn under the task
//! attribute rules, moves its data, has the logical unit execute it and retires it before it
//! sends the status. Task management functions ([`manage`]) run here for every fabric: the
//! fabric only maps its function and response codes and sends the response.
//!
//! Scope. Every logical unit has one task set shared by all I_T nexuses (TST=000b in the
//! control mode page): ORDERED tasks wait for every older task of the logical unit, whatever
//! nexus sent it, and CLEAR TASK SET and LOGICAL UNIT RESET reach the tasks of every nexus —
//! of every fabric — on that logical unit. The tasks of a nexus are kept with the nexus (its
//! fabric looks them up by tag on every data PDU); the functions whose scope is a logical
//! unit walk every live task set of the process, which is rare and touches no data path.
//!
//! Lifecycle. [`Stage`] records where a task is: received, waiting for older tasks, data-out
//! transfer, executing, data-in transfer, status, freed. An abort marks the task and wakes
//! whoever waits for it at any stage; the fabric notices at its next step, stops, and
//! [`TaskSet::retire`] tells it whether to send nothing or, for a task of another nexus
//! aborted while the control mode page has TAS=1, TASK ABORTED status. The function that
//! aborted it returns once the task is done, so its response follows every aborted task.
//!
//! Costs on the data path: one lock of the nexus's own set at admission and one at
//! retirement, one relaxed counter and one read of the logical unit's ORDERED count.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::Notify;

use super::{Device, LunMap, Nexus, TaskAttr, UnitAttention};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub use rtgt_backstore::run_inline;

/// Where a task is in its life (SAM-5 8.5 task states, as the target moves data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Stage {
    /// Received, not yet admitted.
    Received = 0,
    /// Admitted; waiting for older tasks (task attributes).
    Waiting = 1,
    /// Data-out moving from the initiator (R2T/Data-Out, RDMA READ).
    DataOut = 2,
    /// The logical unit executes it.
    Executing = 3,
    /// Data-in moving to the initiator (Data-In, RDMA WRITE).
    DataIn = 4,
    /// Status on its way; no longer abortable.
    Status = 5,
    /// Done.
    Freed = 6,
}

impl Stage {
    fn from_u8(v: u8) -> Stage {
        match v {
            0 => Stage::Received,
            1 => Stage::Waiting,
            2 => Stage::DataOut,
            3 => Stage::Executing,
            4 => Stage::DataIn,
            5 => Stage::Status,
            _ => Stage::Freed,
        }
    }
}

const NOT_ABORTED: u8 = 0;
const ABORTED_SILENT: u8 = 1;
const ABORTED_STATUS: u8 = 2;

/// What a fabric does when it retires a task ([`TaskSet::retire`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Send the task's status.
    Respond,
    /// Aborted: send nothing (the function that aborted it answers for it).
    Drop,
    /// Aborted by another I_T nexus while TAS=1: send TASK ABORTED status instead of the
    /// task's own (SAM-5 5.3.1, 7.1).
    TaskAborted,
}

/// A task was refused at admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The tag is in use by a task of the same nexus (SAM-5 5.10: OVERLAPPED COMMANDS
    /// ATTEMPTED; iSCSI rejects the PDU instead).
    Overlapped,
    /// ACA task attribute while no ACA condition exists: this target does not establish ACA
    /// (NormACA=0), so the command ends in CHECK CONDITION, ILLEGAL REQUEST, INVALID
    /// MESSAGE ERROR (SAM-5 8.6.5).
    NoAca,
}

/// The core of one command, embedded in each fabric's own task type.
#[derive(Debug)]
pub struct Task {
    /// The fabric's task tag, unique among the live tasks of the nexus.
    pub tag: u64,
    /// The LUN the command addresses.
    pub lun: u64,
    pub attr: TaskAttr,
    /// The logical unit behind `lun` at admission, if any.
    device: Option<Arc<Device>>,
    /// Order of arrival at the logical unit.
    seq: AtomicU64,
    /// The I_T nexus (set at admission).
    nexus: AtomicU64,
    stage: AtomicU8,
    aborted: AtomicU8,
    /// Wakes [`Task::wait_turn`] when the task is aborted.
    abort_signal: Notify,
    /// Wakes the fabric's driver of the task: its data arrived, or it was aborted.
    pub wake: Notify,
    done: AtomicBool,
    /// Callers in [`Task::finished`]; [`Task::set_done`] notifies only when there are any,
    /// which keeps the common case to two atomic operations.
    waiters: AtomicUsize,
    done_notify: Notify,
}

impl Task {
    /// A new task for `tag` and `lun`; `device` is what the nexus's LUN map holds at `lun`.
    pub fn new(tag: u64, lun: u64, attr: TaskAttr, device: Option<Arc<Device>>) -> Task {
        Task {
            tag,
            lun,
            attr,
            device,
            seq: AtomicU64::new(0),
            nexus: AtomicU64::new(0),
            stage: AtomicU8::new(Stage::Received as u8),
            aborted: AtomicU8::new(NOT_ABORTED),
            abort_signal: Notify::new(),
            wake: Notify::new(),
            done: AtomicBool::new(false),
            waiters: AtomicUsize::new(0),
            done_notify: Notify::new(),
        }
    }

    pub fn stage(&self) -> Stage {
        Stage::from_u8(self.stage.load(Ordering::Acquire))
    }

    /// Records the task's progress.
    pub fn set_stage(&self, s: Stage) {
        self.stage.store(s as u8, Ordering::Release);
    }

    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire) != NOT_ABORTED
    }

    /// Aborts the task without a response (the fabric's own decision, or a function of its
    /// own nexus). Returns whether this call aborted it.
    pub fn abort(&self) -> bool {
        self.abort_with(ABORTED_SILENT)
    }

    fn abort_with(&self, how: u8) -> bool {
        let first = self
            .aborted
            .compare_exchange(NOT_ABORTED, how, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        self.abort_signal.notify_waiters();
        self.wake.notify_one();
        first
    }

    fn device_is(&self, dev: &Arc<Device>) -> bool {
        self.device.as_ref().is_some_and(|d| Arc::ptr_eq(d, dev))
    }

    /// Marks the task finished and wakes every [`Task::finished`].
    pub fn set_done(&self) {
        self.set_stage(Stage::Freed);
        self.done.store(true, Ordering::SeqCst);
        // Pairs with the increment in `finished`: either this sees the waiter, or the waiter
        // sees `done`.
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.done_notify.notify_waiters();
        }
    }

    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Waits until the task has finished (status sent or dropped).
    pub async fn finished(&self) {
        if self.is_done() {
            return;
        }
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiters);
        loop {
            let notified = self.done_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.done.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }

    /// Waits for the older tasks of `turn` (task attributes, SAM-5 8.9); false when this
    /// task is aborted meanwhile.
    pub async fn wait_turn(&self, turn: Turn) -> bool {
        if !turn.0.is_empty() {
            self.set_stage(Stage::Waiting);
        }
        for t in turn.0 {
            let aborted = self.abort_signal.notified();
            tokio::pin!(aborted);
            aborted.as_mut().enable();
            if self.is_aborted() {
                return false;
            }
            tokio::select! {
                _ = t.task().finished() => {}
                _ = aborted => return false,
            }
        }
        !self.is_aborted()
    }
}

/// A fabric's task type: it embeds a [`Task`].
pub trait Tracked: Send + Sync + 'static {
    fn task(&self) -> &Task;
}

impl Tracked for Task {
    fn task(&self) -> &Task {
        self
    }
}

/// The older tasks an admitted task waits for ([`Task::wait_turn`]).
#[derive(Default)]
pub struct Turn(Vec<Arc<dyn Tracked>>);

impl Turn {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The ordering state a logical unit keeps for its task set.
#[derive(Debug, Default)]
pub(crate) struct Order {
    /// Arrival counter of the logical unit's tasks.
    seq: AtomicU64,
    /// ORDERED tasks admitted and not retired: while zero, a SIMPLE task waits for nothing.
    ordered: AtomicU32,
}

/// Counters of a task set.
#[derive(Debug, Default)]
pub struct TaskStats {
    pub admitted: AtomicU64,
    pub aborted: AtomicU64,
    pub task_management: AtomicU64,
}

/// The live tasks of one I_T nexus (one iSCSI session, one SRP channel), by tag.
pub struct TaskSet<T: Tracked> {
    nexus: u64,
    tasks: Mutex<HashMap<u64, Arc<T>>>,
    pub stats: TaskStats,
}

impl<T: Tracked> std::fmt::Debug for TaskSet<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskSet")
            .field("nexus", &self.nexus)
            .field("tasks", &self.len())
            .finish()
    }
}

/// What the functions whose scope is a logical unit see of a task set.
trait Scan: Send + Sync {
    fn collect(&self, out: &mut Vec<Arc<dyn Tracked>>, pred: &dyn Fn(&Task) -> bool);
}

impl<T: Tracked> Scan for TaskSet<T> {
    fn collect(&self, out: &mut Vec<Arc<dyn Tracked>>, pred: &dyn Fn(&Task) -> bool) {
        for t in lock(&self.tasks).values() {
            if pred(t.task()) {
                out.push(t.clone());
            }
        }
    }
}

/// Every live task set of the process, for ORDERED tasks and the functions that reach
/// every nexus of a logical unit.
static SETS: Mutex<Vec<Weak<dyn Scan>>> = Mutex::new(Vec::new());

/// Tasks of every nexus matching `pred`.
fn scan_all(pred: &dyn Fn(&Task) -> bool) -> Vec<Arc<dyn Tracked>> {
    let sets: Vec<Arc<dyn Scan>> = lock(&SETS).iter().filter_map(Weak::upgrade).collect();
    let mut out = Vec::new();
    for s in sets {
        s.collect(&mut out, pred);
    }
    out
}

impl<T: Tracked> TaskSet<T> {
    /// The task set of the nexus with id `nexus`.
    pub fn new(nexus: u64) -> Arc<TaskSet<T>> {
        let set = Arc::new(TaskSet {
            nexus,
            tasks: Mutex::new(HashMap::new()),
            stats: TaskStats::default(),
        });
        let weak: Weak<dyn Scan> = Arc::downgrade(&(set.clone() as Arc<dyn Scan>));
        let mut sets = lock(&SETS);
        sets.retain(|w| w.strong_count() > 0);
        sets.push(weak);
        set
    }

    pub fn nexus(&self) -> u64 {
        self.nexus
    }

    pub fn get(&self, tag: u64) -> Option<Arc<T>> {
        lock(&self.tasks).get(&tag).cloned()
    }

    pub fn len(&self) -> usize {
        lock(&self.tasks).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every live task.
    pub fn all(&self) -> Vec<Arc<T>> {
        lock(&self.tasks).values().cloned().collect()
    }

    /// Admits `task`: its tag must be free in this set. Returns the older tasks it waits
    /// for (SAM-5 8.9): an ORDERED task every older task of the logical unit, a SIMPLE or
    /// ACA task the older ORDERED ones, a HEAD OF QUEUE task none.
    pub fn admit(&self, task: &Arc<T>) -> Result<Turn, Refused> {
        let t = task.task();
        if t.attr == TaskAttr::Aca {
            return Err(Refused::NoAca);
        }
        {
            let mut tasks = lock(&self.tasks);
            if tasks.contains_key(&t.tag) {
                return Err(Refused::Overlapped);
            }
            t.nexus.store(self.nexus, Ordering::Relaxed);
            if let Some(d) = &t.device {
                if t.attr == TaskAttr::Ordered {
                    d.order.ordered.fetch_add(1, Ordering::SeqCst);
                }
                // Taken under this set's lock, so that whoever sees a later number finds
                // this task in its set.
                t.seq.store(
                    d.order.seq.fetch_add(1, Ordering::SeqCst) + 1,
                    Ordering::SeqCst,
                );
            }
            tasks.insert(t.tag, task.clone());
        }
        self.stats.admitted.fetch_add(1, Ordering::Relaxed);
        let Some(d) = &t.device else {
            return Ok(Turn::default());
        };
        let seq = t.seq.load(Ordering::Relaxed);
        let before = match t.attr {
            TaskAttr::HeadOfQueue | TaskAttr::Aca => return Ok(Turn::default()),
            TaskAttr::Simple if d.order.ordered.load(Ordering::SeqCst) == 0 => {
                return Ok(Turn::default())
            }
            TaskAttr::Simple => scan_all(&|o| {
                o.attr == TaskAttr::Ordered && o.device_is(d) && o.older(seq) && !o.is_done()
            }),
            TaskAttr::Ordered => scan_all(&|o| o.device_is(d) && o.older(seq) && !o.is_done()),
        };
        Ok(Turn(before))
    }

    /// Takes the task out of the set before its status is sent (the initiator may reuse the
    /// tag as soon as it sees the status) and says what to send. After this the task can no
    /// longer be aborted; the fabric still calls [`Task::set_done`] when it is finished.
    pub fn retire(&self, task: &T) -> Outcome {
        let t = task.task();
        let removed = {
            let mut tasks = lock(&self.tasks);
            let mine = tasks.get(&t.tag).is_some_and(|x| std::ptr::eq(x.task(), t));
            if mine {
                tasks.remove(&t.tag);
                t.set_stage(Stage::Status);
            }
            mine
        };
        if removed && t.attr == TaskAttr::Ordered {
            if let Some(d) = &t.device {
                d.order.ordered.fetch_sub(1, Ordering::SeqCst);
            }
        }
        match t.aborted.load(Ordering::Acquire) {
            NOT_ABORTED => Outcome::Respond,
            ABORTED_STATUS => Outcome::TaskAborted,
            _ => Outcome::Drop,
        }
    }

    /// Aborts every task of this set without a response (I_T nexus loss); returns them so
    /// the caller can wait for them.
    pub fn abort_all(&self) -> Vec<Arc<T>> {
        let hit = self.all();
        for t in &hit {
            if t.task().abort() {
                self.stats.aborted.fetch_add(1, Ordering::Relaxed);
            }
        }
        hit
    }

    /// Waits until the set is empty.
    pub async fn drain(&self) {
        loop {
            let tasks = self.all();
            if tasks.is_empty() {
                return;
            }
            for t in tasks {
                t.task().finished().await;
            }
        }
    }
}

impl Task {
    fn older(&self, seq: u64) -> bool {
        let s = self.seq.load(Ordering::SeqCst);
        s != 0 && s < seq
    }
}

/// A task management function (SAM-5 clause 7), as every fabric hands it over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Function {
    /// ABORT TASK with the referenced task's tag.
    AbortTask(u64),
    AbortTaskSet,
    ClearAca,
    ClearTaskSet,
    LogicalUnitReset,
    ItNexusReset,
    /// TARGET RESET (iSCSI's TARGET WARM RESET and TARGET COLD RESET).
    TargetReset,
    /// QUERY TASK with the referenced task's tag.
    QueryTask(u64),
    QueryTaskSet,
    QueryAsyncEvent,
}

impl Function {
    pub fn name(self) -> &'static str {
        match self {
            Function::AbortTask(_) => "abort_task",
            Function::AbortTaskSet => "abort_task_set",
            Function::ClearAca => "clear_aca",
            Function::ClearTaskSet => "clear_task_set",
            Function::LogicalUnitReset => "logical_unit_reset",
            Function::ItNexusReset => "i_t_nexus_reset",
            Function::TargetReset => "target_reset",
            Function::QueryTask(_) => "query_task",
            Function::QueryTaskSet => "query_task_set",
            Function::QueryAsyncEvent => "query_async_event",
        }
    }
}

/// The service response of a task management function (SAM-5 7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmResponse {
    /// FUNCTION COMPLETE.
    Complete,
    /// FUNCTION SUCCEEDED (a query found what it asked about), with the additional response
    /// information of QUERY ASYNCHRONOUS EVENT: sense key, ASC, ASCQ of the pending unit
    /// attention (zero otherwise).
    Succeeded([u8; 3]),
    /// ABORT TASK named a task that is not in the task set (SAM-5 answers FUNCTION COMPLETE;
    /// iSCSI distinguishes it).
    NoSuchTask,
    /// INCORRECT LOGICAL UNIT NUMBER.
    IncorrectLun,
    /// FUNCTION REJECTED: the function is not supported (CLEAR ACA: this target never
    /// establishes ACA).
    Rejected,
}

/// Runs task management function `f` of `nexus` whose tasks are `set` and whose logical
/// units are `luns`, and returns once every task it aborted has finished. `lun` is the
/// function's LUN field; `target_luns` lists the logical units of the target for
/// TARGET RESET.
pub async fn manage<T: Tracked>(
    set: &TaskSet<T>,
    nexus: &Nexus,
    luns: &LunMap,
    lun: u64,
    f: Function,
    target_luns: impl FnOnce() -> Vec<Arc<Device>>,
) -> TmResponse {
    set.stats.task_management.fetch_add(1, Ordering::Relaxed);
    let dev = luns.luns.get(&lun).cloned();
    let r = match f {
        Function::AbortTask(tag) => {
            let Some(task) = set.get(tag).filter(|t| t.task().lun == lun) else {
                return TmResponse::NoSuchTask;
            };
            if task.task().abort() {
                set.stats.aborted.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(d) = &dev {
                d.abort_task(nexus, tag);
            }
            task.task().finished().await;
            TmResponse::Complete
        }
        Function::AbortTaskSet => {
            let Some(d) = dev else {
                return TmResponse::IncorrectLun;
            };
            let hit = scan_all(&|t| t.nexus() == nexus.id && t.device_is(&d));
            abort_and_wait(Some(&set.stats), nexus.id, &d, hit, &|n| n == nexus.id).await;
            TmResponse::Complete
        }
        Function::ClearTaskSet | Function::LogicalUnitReset => {
            let Some(d) = dev else {
                return TmResponse::IncorrectLun;
            };
            clear(set, nexus, &d).await;
            if f == Function::LogicalUnitReset {
                d.lun_reset(nexus);
            }
            TmResponse::Complete
        }
        Function::TargetReset => {
            for d in target_luns() {
                clear(set, nexus, &d).await;
                d.lun_reset(nexus);
            }
            TmResponse::Complete
        }
        Function::ItNexusReset => {
            let devices = luns.devices();
            let hit = scan_all(&|t| t.nexus() == nexus.id);
            for t in &hit {
                if t.task().abort() {
                    set.stats.aborted.fetch_add(1, Ordering::Relaxed);
                }
            }
            for d in &devices {
                d.abort_task_set(Some(nexus));
            }
            for t in &hit {
                t.task().finished().await;
            }
            for d in &devices {
                d.it_nexus_reset(nexus);
            }
            TmResponse::Complete
        }
        Function::QueryTask(tag) => {
            let live = set
                .get(tag)
                .is_some_and(|t| t.task().lun == lun && t.task().stage() < Stage::Status);
            if live {
                TmResponse::Succeeded([0; 3])
            } else {
                TmResponse::Complete
            }
        }
        Function::QueryTaskSet => {
            let Some(d) = dev else {
                return TmResponse::IncorrectLun;
            };
            let any = !scan_all(&|t| {
                t.nexus() == nexus.id && t.device_is(&d) && t.stage() < Stage::Status
            })
            .is_empty();
            if any {
                TmResponse::Succeeded([0; 3])
            } else {
                TmResponse::Complete
            }
        }
        Function::QueryAsyncEvent => {
            let Some(d) = dev else {
                return TmResponse::IncorrectLun;
            };
            match d.pending_unit_attention(nexus) {
                Some(ua) => {
                    let (asc, ascq) = ua.code();
                    TmResponse::Succeeded([super::sense::key::UNIT_ATTENTION, asc, ascq])
                }
                None => TmResponse::Complete,
            }
        }
        Function::ClearAca => TmResponse::Rejected,
    };
    tracing::info!(nexus = nexus.id, function = f.name(), lun, response = ?r,
        "task management function done");
    r
}

impl Task {
    fn nexus(&self) -> u64 {
        self.nexus.load(Ordering::Relaxed)
    }
}

/// CLEAR TASK SET, and the abort part of LOGICAL UNIT RESET and TARGET RESET: every task of
/// every nexus on `dev`. With TAS=1 the tasks of other nexuses end in TASK ABORTED status;
/// with TAS=0 they end silently and their nexuses get COMMANDS CLEARED BY ANOTHER INITIATOR
/// (SAM-5 7.4, SPC-4 7.5.8 TAS), which the reset's own unit attention supersedes.
async fn clear<T: Tracked>(set: &TaskSet<T>, nexus: &Nexus, dev: &Arc<Device>) {
    let hit = scan_all(&|t| t.device_is(dev));
    abort_and_wait(Some(&set.stats), nexus.id, dev, hit, &|_| true).await;
}

/// The abort part of PREEMPT AND ABORT (SPC-4 5.14.11.2.6): every task on `dev` of the I_T
/// nexuses `victims`, whose registrations were preempted, ends as with CLEAR TASK SET, and
/// this returns once they all have finished. `requester` is the nexus of the PERSISTENT
/// RESERVE OUT (none of this process's when another gateway preempted).
pub(crate) async fn abort_preempted(dev: &Arc<Device>, requester: Option<u64>, victims: &[u64]) {
    if victims.is_empty() {
        return;
    }
    let hit = scan_all(&|t| t.device_is(dev) && victims.contains(&t.nexus()));
    tracing::info!(device = %dev.config.name, nexuses = ?victims, tasks = hit.len(),
        "PREEMPT AND ABORT: aborting the preempted nexuses' tasks");
    abort_and_wait(None, requester.unwrap_or(u64::MAX), dev, hit, &|n| {
        victims.contains(&n)
    })
    .await;
}

/// Aborts `hit` (tasks on `dev`) on behalf of nexus `requester` (counted in `stats`, when
/// given), ends the logical unit's own waits of the nexuses `waits` selects, and waits for
/// every task to finish.
async fn abort_and_wait(
    stats: Option<&TaskStats>,
    requester: u64,
    dev: &Arc<Device>,
    hit: Vec<Arc<dyn Tracked>>,
    waits: &(dyn Fn(u64) -> bool + Sync),
) {
    let tas = dev.tas();
    let mut cleared: Vec<u64> = Vec::new();
    for t in &hit {
        let task = t.task();
        let other = task.nexus() != requester;
        let first = if other && tas {
            task.abort_with(ABORTED_STATUS)
        } else {
            task.abort()
        };
        if first {
            if let Some(s) = stats {
                s.aborted.fetch_add(1, Ordering::Relaxed);
            }
            if other && !tas && !cleared.contains(&task.nexus()) {
                cleared.push(task.nexus());
            }
        }
    }
    dev.abort_waits(waits);
    for t in &hit {
        t.task().finished().await;
    }
    for id in cleared {
        dev.unit_attention_id(id, UnitAttention::CommandsCleared);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn finished_wakes_every_waiter() {
        let t = Arc::new(Task::new(1, 0, TaskAttr::Simple, None));
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let t = t.clone();
                tokio::spawn(async move { t.finished().await })
            })
            .collect();
        tokio::task::yield_now().await;
        assert!(!t.is_done());
        t.set_done();
        for w in waiters {
            w.await.unwrap();
        }
        // Already done: returns at once, and no waiter is left registered.
        t.finished().await;
        assert_eq!(t.waiters.load(Ordering::SeqCst), 0);
        assert_eq!(t.stage(), Stage::Freed);
    }

    #[test]
    fn tags_are_unique_per_set_and_aca_is_refused() {
        let set = TaskSet::<Task>::new(7);
        let a = Arc::new(Task::new(1, 0, TaskAttr::Simple, None));
        assert!(set.admit(&a).unwrap().is_empty());
        let again = Arc::new(Task::new(1, 0, TaskAttr::Simple, None));
        assert_eq!(set.admit(&again).err(), Some(Refused::Overlapped));
        let aca = Arc::new(Task::new(2, 0, TaskAttr::Aca, None));
        assert_eq!(set.admit(&aca).err(), Some(Refused::NoAca));
        // Retiring a task that is not the one under its tag leaves the other in place.
        assert_eq!(set.retire(&again), Outcome::Respond);
        assert_eq!(set.len(), 1);
        assert_eq!(set.retire(&a), Outcome::Respond);
        assert!(set.is_empty());
        // An aborted task is retired without a response.
        let b = Arc::new(Task::new(3, 0, TaskAttr::Simple, None));
        set.admit(&b).unwrap();
        assert!(b.abort());
        assert!(!b.abort(), "a second abort is not counted again");
        assert_eq!(set.retire(&b), Outcome::Drop);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_abort_ends_the_wait_for_older_tasks() {
        let set = TaskSet::<Task>::new(8);
        let older = Arc::new(Task::new(1, 0, TaskAttr::Simple, None));
        set.admit(&older).unwrap();
        let waiting = Arc::new(Task::new(2, 0, TaskAttr::Simple, None));
        set.admit(&waiting).unwrap();
        let turn = Turn(vec![older.clone() as Arc<dyn Tracked>]);
        let w = waiting.clone();
        let h = tokio::spawn(async move { w.wait_turn(turn).await });
        while waiting.stage() != Stage::Waiting {
            tokio::task::yield_now().await;
        }
        waiting.abort();
        assert!(!h.await.unwrap(), "an aborted task does not get its turn");
        assert!(!older.is_done());
    }
}
