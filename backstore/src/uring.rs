//! The io_uring driver: one ring per file backstore.
//!
//! Ownership model (all `unsafe` for it is in this module): an operation's buffer moves into the
//! driver's slot table, keyed by the SQE's `user_data`, before the SQE is pushed, and leaves it
//! only when the matching CQE has been reaped. The future that submitted the operation gets the
//! buffer back with the result; if that future is dropped first (its task was cancelled), the
//! slot is marked abandoned and the buffer is dropped — returned to its pool — when the CQE
//! arrives. The files are held by the driver too, so an fd is never closed under an operation.
//!
//! Threading: submitters push and submit under a mutex from whatever task they run on; a reaper
//! task (spawned on the tokio runtime that opened the backstore) sleeps on an eventfd registered
//! with the ring and wakes the submitters' futures. The submitter also reaps right after
//! submitting, so operations the kernel completes inline (page-cache hits) finish without a
//! trip through the reaper. Nothing busy-polls. The reaper holds only a weak reference between
//! wake-ups, so the ring and its files close as soon as the backstore is dropped.
//!
//! Back-pressure: a semaphore with one permit per submission-queue entry; a permit is held
//! from submission until the completion is reaped, so the SQ can never overflow and the CQ
//! (twice the SQ) never drops completions.
//!
//! Shutdown: dropping the [`Ring`] first waits for the completions of operations whose callers
//! went away (normally none, or a few milliseconds of file I/O), and leaks the buffers of any
//! that have not arrived after [`DRAIN_LIMIT`].

use std::fs::File;
use std::future::Future;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::buf::{BufPool, IoBuf};

/// Largest single read or write handed to the kernel; longer transfers continue as short ones.
const MAX_RW: usize = 1 << 30;
/// How long the last reference waits for outstanding completions before leaking their buffers.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// An operation on one of the ring's files (an index into the `files` given to [`Ring::new`]).
pub(crate) enum Op {
    /// Reads into `buf[start..]` at `offset`.
    Read {
        file: u32,
        offset: u64,
        buf: IoBuf,
        start: usize,
    },
    /// Writes `buf[start..]` at `offset` with `RWF_*` flags.
    Write {
        file: u32,
        offset: u64,
        buf: IoBuf,
        start: usize,
        rw_flags: i32,
    },
    /// fdatasync.
    Fdatasync { file: u32 },
    Fallocate {
        file: u32,
        offset: u64,
        len: u64,
        mode: i32,
    },
}

/// Outcome of an [`Op`]: the byte count (or 0) and the buffer it owned.
pub(crate) struct Completed {
    pub result: io::Result<usize>,
    pub buf: Option<IoBuf>,
}

/// Owning handle of a ring; see the module documentation.
pub(crate) struct Ring {
    inner: Arc<Inner>,
}

struct Inner {
    /// Declared first so the ring is closed before the files and the registered pool go.
    state: Mutex<State>,
    /// Shared with the reaper, which must not keep the rest of `Inner` alive while it sleeps.
    eventfd: Arc<AsyncFd<OwnedFd>>,
    depth: Arc<Semaphore>,
    _files: Vec<Arc<File>>,
    /// The pool whose slabs are registered as fixed buffers, slab i at index i.
    fixed_pool: OnceLock<Arc<BufPool>>,
    /// Transfers submitted as READ_FIXED/WRITE_FIXED.
    fixed_ops: AtomicU64,
}

struct State {
    ring: IoUring,
    slots: Vec<Slot>,
    free: Vec<usize>,
    in_flight: usize,
    /// A submit failed transiently; SQEs are waiting in the queue.
    unsubmitted: bool,
}

enum Slot {
    Free,
    InFlight {
        buf: Option<IoBuf>,
        waker: Option<Waker>,
        abandoned: bool,
        _permit: OwnedSemaphorePermit,
    },
    Done {
        buf: Option<IoBuf>,
        result: i32,
    },
}

impl Ring {
    /// A ring with `depth` submission entries over `files`, which it keeps open. Must be called
    /// within a tokio runtime: the reaper task is spawned on it.
    pub(crate) fn new(files: Vec<Arc<File>>, depth: u32) -> io::Result<Ring> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            io::Error::other(format!("io_uring backstore needs a tokio runtime: {e}"))
        })?;
        let ring = IoUring::new(depth.max(1))?;
        let depth = (ring.params().sq_entries() as usize).min(depth.max(1) as usize);
        let fds: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
        ring.submitter().register_files(&fds)?;
        let eventfd = new_eventfd()?;
        ring.submitter().register_eventfd(eventfd.as_raw_fd())?;
        // SAFETY: the AsyncFd takes ownership of the OwnedFd, which keeps the descriptor open
        // and unchanged until the AsyncFd is dropped.
        let eventfd = unsafe { AsyncFd::register_with_interest(eventfd, Interest::READABLE) }
            .map_err(io::Error::from)?;
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                ring,
                slots: Vec::new(),
                free: Vec::new(),
                in_flight: 0,
                unsubmitted: false,
            }),
            eventfd: Arc::new(eventfd),
            depth: Arc::new(Semaphore::new(depth)),
            _files: files,
            fixed_pool: OnceLock::new(),
            fixed_ops: AtomicU64::new(0),
        });
        runtime.spawn(reap_loop(
            Arc::clone(&inner.eventfd),
            Arc::downgrade(&inner),
        ));
        Ok(Ring { inner })
    }

    /// Registers `pool`'s slabs as fixed buffers; reads and writes on its buffers then skip the
    /// per-operation page pinning. Only one pool per ring.
    pub(crate) fn register_pool(&self, pool: &Arc<BufPool>) -> io::Result<()> {
        let st = self.inner.lock();
        if self.inner.fixed_pool.get().is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a buffer pool is already registered",
            ));
        }
        let iovecs: Vec<libc::iovec> = pool
            .slabs()
            .into_iter()
            .map(|(ptr, len)| libc::iovec {
                iov_base: ptr as *mut libc::c_void,
                iov_len: len,
            })
            .collect();
        // SAFETY: the slabs stay mapped for as long as the pool lives (`BufPool::slabs`), and the
        // pool is kept in `fixed_pool` for the life of the ring.
        unsafe { st.ring.submitter().register_buffers(&iovecs)? };
        let _ = self.inner.fixed_pool.set(Arc::clone(pool));
        Ok(())
    }

    /// Runs `op` to completion. Cancel-safe: dropping the future never frees memory the kernel
    /// may still write (module documentation).
    pub(crate) async fn run(&self, op: Op) -> Completed {
        let permit = match Arc::clone(&self.inner.depth).acquire_owned().await {
            Ok(p) => p,
            Err(_) => {
                return Completed {
                    result: Err(io::Error::other("io_uring driver closed")),
                    buf: op.into_buf(),
                }
            }
        };
        let key = self.inner.start(op, permit);
        let (result, buf) = Completion {
            inner: Arc::clone(&self.inner),
            key,
            finished: false,
        }
        .await;
        Completed {
            result: if result < 0 {
                Err(io::Error::from_raw_os_error(-result))
            } else {
                Ok(result as usize)
            },
            buf,
        }
    }

    /// Transfers that used the registered pool's fixed buffers.
    pub(crate) fn fixed_ops(&self) -> u64 {
        self.inner.fixed_ops.load(Ordering::Relaxed)
    }

    /// Operations submitted and not yet reaped (including abandoned ones).
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.inner.lock().in_flight
    }
}

impl Op {
    fn into_buf(self) -> Option<IoBuf> {
        match self {
            Op::Read { buf, .. } | Op::Write { buf, .. } => Some(buf),
            Op::Fdatasync { .. } | Op::Fallocate { .. } => None,
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fixed-buffer index of `buf` if it lies in the registered pool.
    fn fixed_index(&self, buf: &IoBuf) -> Option<u16> {
        let pool = self.fixed_pool.get()?;
        if !buf.is_from_slabs_of(pool) {
            return None;
        }
        let index = buf.slab_index().and_then(|i| u16::try_from(i).ok())?;
        self.fixed_ops.fetch_add(1, Ordering::Relaxed);
        Some(index)
    }

    /// Moves `op` into a slot, pushes and submits its SQE; returns the slot key.
    fn start(&self, op: Op, permit: OwnedSemaphorePermit) -> usize {
        let mut st = self.lock();
        let key = match st.free.pop() {
            Some(k) => k,
            None => {
                st.slots.push(Slot::Free);
                st.slots.len() - 1
            }
        };
        let (entry, buf) = self.prepare(op);
        let entry = entry.user_data(key as u64);
        st.slots[key] = Slot::InFlight {
            buf,
            waker: None,
            abandoned: false,
            _permit: permit,
        };
        let mut pushed = push(&mut st.ring, &entry);
        if !pushed {
            // Unreachable while permits <= SQ entries; flush the queue and try once more.
            let _ = st.ring.submit();
            pushed = push(&mut st.ring, &entry);
        }
        if pushed {
            st.in_flight += 1;
            submit(&mut st);
        } else {
            tracing::error!("io_uring submission queue full despite the depth limit");
            if let Slot::InFlight { buf, .. } = mem::replace(&mut st.slots[key], Slot::Free) {
                st.slots[key] = Slot::Done {
                    buf,
                    result: -libc::EBUSY,
                };
            }
        }
        let (wakers, drops) = reap(&mut st);
        drop(st);
        finish(wakers, drops);
        key
    }

    /// Builds the SQE for `op`. The pointers in it stay valid after `buf` is moved into its
    /// slot because moving an IoBuf does not move its memory.
    fn prepare(&self, op: Op) -> (squeue::Entry, Option<IoBuf>) {
        match op {
            Op::Read {
                file,
                offset,
                mut buf,
                start,
            } => {
                let fixed = self.fixed_index(&buf);
                let region = &mut buf.as_mut_slice()[start..];
                let len = region.len().min(MAX_RW) as u32;
                let ptr = region.as_mut_ptr();
                let fd = types::Fixed(file);
                let entry = match fixed {
                    Some(index) => opcode::ReadFixed::new(fd, ptr, len, index)
                        .offset(offset)
                        .build(),
                    None => opcode::Read::new(fd, ptr, len).offset(offset).build(),
                };
                (entry, Some(buf))
            }
            Op::Write {
                file,
                offset,
                buf,
                start,
                rw_flags,
            } => {
                let fixed = self.fixed_index(&buf);
                let region = &buf.as_slice()[start..];
                let len = region.len().min(MAX_RW) as u32;
                let ptr = region.as_ptr();
                let fd = types::Fixed(file);
                let entry = match fixed {
                    Some(index) => opcode::WriteFixed::new(fd, ptr, len, index)
                        .offset(offset)
                        .rw_flags(rw_flags)
                        .build(),
                    None => opcode::Write::new(fd, ptr, len)
                        .offset(offset)
                        .rw_flags(rw_flags)
                        .build(),
                };
                (entry, Some(buf))
            }
            Op::Fdatasync { file } => (
                opcode::Fsync::new(types::Fixed(file))
                    .flags(types::FsyncFlags::DATASYNC)
                    .build(),
                None,
            ),
            Op::Fallocate {
                file,
                offset,
                len,
                mode,
            } => (
                opcode::Fallocate::new(types::Fixed(file), len)
                    .offset(offset)
                    .mode(mode)
                    .build(),
                None,
            ),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let deadline = Instant::now() + DRAIN_LIMIT;
        while st.in_flight > 0 && Instant::now() < deadline {
            let ts = types::Timespec::new().nsec(100_000_000);
            let args = types::SubmitArgs::new().timespec(&ts);
            match st.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                    ) => {}
                Err(e) => {
                    tracing::error!(error = %e, "io_uring drain failed");
                    break;
                }
            }
            let (wakers, drops) = reap(st);
            finish(wakers, drops);
        }
        if st.in_flight > 0 {
            tracing::error!(
                in_flight = st.in_flight,
                "io_uring operations did not complete; leaking their buffers"
            );
            for slot in st.slots.drain(..) {
                if let Slot::InFlight { buf, .. } = slot {
                    mem::forget(buf);
                }
            }
        } else {
            // Closing the ring releases its file table asynchronously, in a kernel worker; an
            // explicit unregister drops the references now, so an exclusively opened block
            // device can be opened again as soon as the backstore is gone.
            let _ = st.ring.submitter().unregister_files();
        }
        // Let the reaper see that the ring is gone.
        signal_eventfd(self.eventfd.get_ref().as_raw_fd());
    }
}

/// The future of one submitted operation: the slot's result and buffer.
struct Completion {
    inner: Arc<Inner>,
    key: usize,
    finished: bool,
}

impl Future for Completion {
    type Output = (i32, Option<IoBuf>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut st = this.inner.lock();
        match &mut st.slots[this.key] {
            Slot::InFlight { waker, .. } => {
                match waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            Slot::Done { .. } => {
                let Slot::Done { buf, result } = mem::replace(&mut st.slots[this.key], Slot::Free)
                else {
                    unreachable!("matched Done above")
                };
                st.free.push(this.key);
                this.finished = true;
                Poll::Ready((result, buf))
            }
            Slot::Free => {
                tracing::error!(key = this.key, "io_uring slot vanished");
                this.finished = true;
                Poll::Ready((-libc::EIO, None))
            }
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut st = self.inner.lock();
        let mut done_buf = None;
        match &mut st.slots[self.key] {
            Slot::InFlight {
                abandoned, waker, ..
            } => {
                // The kernel may still write into the buffer: the reaper drops it later.
                *abandoned = true;
                *waker = None;
            }
            Slot::Done { .. } => {
                if let Slot::Done { buf, .. } = mem::replace(&mut st.slots[self.key], Slot::Free) {
                    done_buf = buf;
                }
                st.free.push(self.key);
            }
            Slot::Free => {}
        }
        drop(st);
        drop(done_buf);
    }
}

/// Pushes one SQE; false if the queue is full.
fn push(ring: &mut IoUring, entry: &squeue::Entry) -> bool {
    // SAFETY: `push` requires every buffer and fd named by the entry to stay valid until the
    // completion is reaped. The buffer was moved into the entry's slot by the caller and leaves
    // it only in `reap` (or leaks in `Inner::drop`); the fixed files are kept by `Inner`.
    unsafe { ring.submission().push(entry).is_ok() }
}

fn submit(st: &mut State) {
    match st.ring.submit() {
        Ok(_) => st.unsubmitted = !st.ring.submission().is_empty(),
        Err(e) => {
            if !matches!(
                e.raw_os_error(),
                Some(libc::EAGAIN | libc::EBUSY | libc::EINTR)
            ) {
                tracing::error!(error = %e, "io_uring submit failed; retrying");
            }
            st.unsubmitted = true;
        }
    }
}

/// Moves every available completion into its slot. Returns the wakers to wake and the buffers
/// of abandoned operations, both to be handled after the lock is released.
fn reap(st: &mut State) -> (Vec<Waker>, Vec<IoBuf>) {
    let mut wakers = Vec::new();
    let mut drops = Vec::new();
    let State {
        ring,
        slots,
        free,
        in_flight,
        ..
    } = st;
    for cqe in ring.completion() {
        let key = cqe.user_data() as usize;
        let Some(slot) = slots.get_mut(key) else {
            tracing::error!(key, "io_uring completion for an unknown operation");
            continue;
        };
        match mem::replace(slot, Slot::Free) {
            Slot::InFlight {
                buf,
                waker,
                abandoned,
                _permit,
            } => {
                *in_flight -= 1;
                if abandoned {
                    drops.extend(buf);
                    free.push(key);
                } else {
                    *slot = Slot::Done {
                        buf,
                        result: cqe.result(),
                    };
                    wakers.extend(waker);
                }
            }
            other => {
                tracing::error!(key, "io_uring completion for an idle slot");
                *slot = other;
            }
        }
    }
    (wakers, drops)
}

fn finish(wakers: Vec<Waker>, drops: Vec<IoBuf>) {
    drop(drops);
    for w in wakers {
        w.wake();
    }
}

async fn reap_loop(eventfd: Arc<AsyncFd<OwnedFd>>, ring: Weak<Inner>) {
    let mut retry = false;
    loop {
        if retry {
            // The kernel refused a submit for lack of resources; try again soon.
            tokio::task::yield_now().await;
        } else {
            let mut guard = match eventfd.readable().await {
                Ok(g) => g,
                Err(e) => {
                    tracing::error!(error = %e, "io_uring eventfd failed; completions stop");
                    return;
                }
            };
            // Read until EAGAIN so that try_io clears the readiness.
            let _ = guard.try_io(|fd| -> io::Result<()> {
                loop {
                    drain_eventfd(fd.get_ref().as_raw_fd())?;
                }
            });
        }
        let Some(inner) = ring.upgrade() else {
            return;
        };
        let mut st = inner.lock();
        if st.unsubmitted {
            submit(&mut st);
        }
        let (wakers, drops) = reap(&mut st);
        retry = st.unsubmitted;
        drop(st);
        finish(wakers, drops);
    }
}

fn new_eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn drain_eventfd(fd: RawFd) -> io::Result<()> {
    let mut value = 0u64;
    // SAFETY: reads 8 bytes into a local u64.
    let n = unsafe { libc::read(fd, (&mut value as *mut u64).cast(), 8) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn signal_eventfd(fd: RawFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a local u64.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}
