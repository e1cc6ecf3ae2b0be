//! State shared by every gateway of an image, kept in a RADOS object beside it
//! ([`rtgt_backstore::SharedState`]): the persistent reservations of an rbd LUN.
//!
//! The object holds the state and an xattr `rtgt.gen`, its generation. An update reads the
//! generation, then the data, and writes the new data with the next generation in one RADOS
//! write operation guarded by a comparison of the xattr (or, for the first write, exclusive
//! creation): two gateways updating at once cannot both succeed, and the loser starts over
//! from what the winner wrote. Every gateway watches the object; the winner notifies it and
//! the notification returns once every watcher has acknowledged, each having marked its copy
//! stale first, so no gateway answers another command from the old state. A gateway whose
//! engine listens ([`SharedState::next_change`]) acknowledges only once the engine has taken
//! the change in and aborted what a PREEMPT AND ABORT asks of it; a notification from the
//! gateway's own client is acknowledged at once. A watch that breaks (the cluster out of
//! reach, a gateway's session reset) marks the copy stale until the watch is back.

use std::ffi::{c_char, c_int, c_void, CString};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use rtgt_backstore::{SharedState, Update};

use crate::cluster::{cstring, Cluster, ClusterSpec, IoCtx, Usage};
use crate::sys::{rados_ioctx_t, Ceph, LIBRADOS_CMPXATTR_OP_EQ, LIBRADOS_CREATE_EXCLUSIVE};
use crate::CephError;

/// The generation's xattr.
const GEN: &std::ffi::CStr = c"rtgt.gen";
/// Updates that lose to other gateways before one gives up (with EBUSY).
const MAX_ATTEMPTS: usize = 64;

/// What the watch callbacks see; boxed, so its address is stable while the watch exists.
struct Watch {
    lib: &'static Ceph,
    io: rados_ioctx_t,
    oid: CString,
    /// Another gateway may have changed the state since it was last read.
    stale: AtomicBool,
    /// The watch is gone (error callback): re-established before the next read.
    broken: AtomicBool,
    /// This client's instance: its own notifications are acknowledged at once.
    me: u64,
    /// Someone waits in [`SharedState::next_change`]: other gateways' notifications are
    /// acknowledged once it has dealt with them.
    listening: AtomicBool,
    /// Notifications (id, cookie) not acknowledged yet.
    pending: Mutex<Vec<(u64, u64)>>,
    changed: tokio::sync::Notify,
}

impl Watch {
    fn ack(&self, notify_id: u64, cookie: u64) {
        // SAFETY: the Watch's I/O context and object name; no reply payload.
        unsafe {
            (self.lib.rados.rados_notify_ack)(
                self.io,
                self.oid.as_ptr(),
                notify_id,
                cookie,
                std::ptr::null(),
                0,
            )
        };
    }
}

/// A change notification (librados's thread): mark the copy stale, then acknowledge, or,
/// with a listener, wake it and leave the acknowledgement to it.
unsafe extern "C" fn notified(
    arg: *mut c_void,
    notify_id: u64,
    cookie: u64,
    notifier: u64,
    _data: *mut c_void,
    _len: usize,
) {
    // SAFETY: `arg` is the boxed Watch, alive until the watch is removed and flushed.
    let w = unsafe { &*arg.cast::<Watch>() };
    w.stale.store(true, Ordering::SeqCst);
    if notifier == w.me || !w.listening.load(Ordering::SeqCst) {
        w.ack(notify_id, cookie);
        return;
    }
    w.pending
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push((notify_id, cookie));
    w.changed.notify_one();
}

/// The watch failed (disconnected, timed out): the copy can no longer be trusted.
unsafe extern "C" fn watch_failed(arg: *mut c_void, _cookie: u64, _err: c_int) {
    // SAFETY: as in `notified`.
    let w = unsafe { &*arg.cast::<Watch>() };
    w.stale.store(true, Ordering::SeqCst);
    w.broken.store(true, Ordering::SeqCst);
}

struct Inner {
    io: IoCtx,
    watch: Box<Watch>,
    cookie: Mutex<Option<u64>>,
    /// `pool/[namespace/]object`.
    location: String,
    notify_timeout_ms: u64,
}

// SAFETY: the raw I/O context inside `watch` is the one `io` owns, used only through
// librados's thread-safe calls.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

/// The state of one image, shared by its gateways.
pub struct RadosState {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RadosState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RadosState")
            .field("location", &self.inner.location)
            .finish_non_exhaustive()
    }
}

fn err(r: c_int) -> io::Error {
    io::Error::from_raw_os_error(-r)
}

impl RadosState {
    /// Opens (blocking) the state in `object` of `pool`/`namespace` and watches it. The object
    /// need not exist yet.
    pub fn open(
        spec: &ClusterSpec,
        pool: &str,
        namespace: &str,
        object: &str,
    ) -> Result<RadosState, CephError> {
        let cluster = Cluster::connect(spec, Usage::SharedState)?;
        let io = cluster.ioctx(pool, namespace)?;
        let watch = Box::new(Watch {
            lib: cluster.lib,
            io: io.io,
            oid: cstring("object", object)?,
            stale: AtomicBool::new(true),
            broken: AtomicBool::new(true),
            // SAFETY: a connected cluster handle.
            me: unsafe { (cluster.lib.rados.rados_get_instance_id)(cluster.raw()) },
            listening: AtomicBool::new(false),
            pending: Mutex::new(Vec::new()),
            changed: tokio::sync::Notify::new(),
        });
        let location = if namespace.is_empty() {
            format!("rados:{pool}/{object}")
        } else {
            format!("rados:{pool}/{namespace}/{object}")
        };
        let inner = Inner {
            io,
            watch,
            cookie: Mutex::new(None),
            location,
            notify_timeout_ms: spec.op_timeout.as_millis().try_into().unwrap_or(u64::MAX),
        };
        inner.rewatch().map_err(|e| CephError::Call {
            what: "rados_watch3",
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        })?;
        Ok(RadosState {
            inner: Arc::new(inner),
        })
    }
}

impl Inner {
    fn lib(&self) -> &'static Ceph {
        self.watch.lib
    }

    fn oid(&self) -> *const c_char {
        self.watch.oid.as_ptr()
    }

    /// Replaces a broken watch (blocking).
    fn rewatch(&self) -> io::Result<()> {
        let mut cookie = self.cookie.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = cookie.take() {
            // SAFETY: a watch this handle registered; errors mean it is gone already.
            unsafe { (self.lib().rados.rados_unwatch2)(self.io.io, old) };
        }
        let mut new = 0u64;
        let arg = std::ptr::from_ref::<Watch>(&self.watch)
            .cast_mut()
            .cast::<c_void>();
        let watch = |new: &mut u64| {
            // SAFETY: the Watch outlives the registration (removed and flushed in drop).
            unsafe {
                (self.lib().rados.rados_watch3)(
                    self.io.io,
                    self.oid(),
                    new,
                    notified,
                    watch_failed,
                    0,
                    arg,
                )
            }
        };
        let mut r = watch(&mut new);
        if r == -libc::ENOENT {
            // No state yet: create it empty so that it can be watched.
            self.create_empty()?;
            r = watch(&mut new);
        }
        if r < 0 {
            return Err(err(r));
        }
        *cookie = Some(new);
        self.watch.broken.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Creates the object with generation 0 unless it exists.
    fn create_empty(&self) -> io::Result<()> {
        let r = self.write(None, b"", 0);
        if r < 0 && r != -libc::EEXIST {
            return Err(err(r));
        }
        Ok(())
    }

    /// One guarded write: `data` with generation `gen`, if the object's generation is still
    /// `expected` (`None`: the object must not exist).
    fn write(&self, expected: Option<u64>, data: &[u8], gen: u64) -> c_int {
        let rados = &self.lib().rados;
        // SAFETY: a new operation, released below.
        let op = unsafe { (rados.rados_create_write_op)() };
        if op.is_null() {
            return -libc::ENOMEM;
        }
        let expected = expected.map(|g| g.to_string());
        let gen = gen.to_string();
        // SAFETY: `op` is live; librados copies names and values into the operation.
        unsafe {
            match &expected {
                None => {
                    (rados.rados_write_op_create)(op, LIBRADOS_CREATE_EXCLUSIVE, std::ptr::null())
                }
                Some(g) => (rados.rados_write_op_cmpxattr)(
                    op,
                    GEN.as_ptr(),
                    LIBRADOS_CMPXATTR_OP_EQ,
                    g.as_ptr().cast(),
                    g.len(),
                ),
            }
            (rados.rados_write_op_write_full)(op, data.as_ptr().cast(), data.len());
            (rados.rados_write_op_setxattr)(op, GEN.as_ptr(), gen.as_ptr().cast(), gen.len());
        }
        // SAFETY: `op` built above, on this handle's I/O context and object.
        let r = unsafe {
            (rados.rados_write_op_operate)(op, self.io.io, self.oid(), std::ptr::null_mut(), 0)
        };
        // SAFETY: created above, not used after.
        unsafe { (rados.rados_release_write_op)(op) };
        r
    }

    /// The generation, then the data (blocking). A missing object is generation 0, empty.
    fn read_current(&self) -> io::Result<(Option<u64>, Vec<u8>)> {
        let rados = &self.lib().rados;
        let mut g = [0u8; 24];
        // SAFETY: `g` is writable for its length.
        let r = unsafe {
            (rados.rados_getxattr)(
                self.io.io,
                self.oid(),
                GEN.as_ptr(),
                g.as_mut_ptr().cast(),
                g.len(),
            )
        };
        if r == -libc::ENOENT {
            return Ok((None, Vec::new()));
        }
        if r < 0 {
            return Err(err(r));
        }
        let gen = std::str::from_utf8(&g[..r as usize])
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad rtgt.gen"))?;
        let mut size = 0u64;
        // SAFETY: `size` is written; no mtime wanted.
        let r =
            unsafe { (rados.rados_stat)(self.io.io, self.oid(), &mut size, std::ptr::null_mut()) };
        if r < 0 {
            return Err(err(r));
        }
        // Room beyond the size seen, so that a read that fills the buffer means the object
        // grew in between and is read again.
        let mut len = usize::try_from(size).unwrap_or(usize::MAX / 2) + 4096;
        loop {
            let mut data = vec![0u8; len];
            // SAFETY: `data` is writable for `len` bytes.
            let r = unsafe {
                (rados.rados_read)(self.io.io, self.oid(), data.as_mut_ptr().cast(), len, 0)
            };
            if r < 0 {
                return Err(err(r));
            }
            let n = r as usize;
            if n < len {
                data.truncate(n);
                return Ok((Some(gen), data));
            }
            len *= 2;
        }
    }

    fn read_blocking(&self) -> io::Result<Vec<u8>> {
        if self.watch.broken.load(Ordering::SeqCst) {
            self.rewatch()?;
        }
        // Cleared before reading: a notification that arrives meanwhile marks it again.
        self.watch.stale.store(false, Ordering::SeqCst);
        let read = self.read_current();
        if read.is_err() {
            self.watch.stale.store(true, Ordering::SeqCst);
        }
        read.map(|(_, data)| data)
    }

    fn update_blocking(&self, update: &mut Update<'_>) -> io::Result<()> {
        if self.watch.broken.load(Ordering::SeqCst) {
            self.rewatch()?;
        }
        for _ in 0..MAX_ATTEMPTS {
            let (gen, data) = self.read_current()?;
            let Some(new) = update(&data) else {
                return Ok(());
            };
            let next = gen.map_or(1, |g| g + 1);
            let r = self.write(gen, &new, next);
            if r == -libc::ECANCELED || r == -libc::EEXIST {
                // Another gateway changed it first: start over from what it wrote.
                continue;
            }
            if r < 0 {
                return Err(err(r));
            }
            self.notify(next);
            return Ok(());
        }
        Err(io::Error::from_raw_os_error(libc::EBUSY))
    }

    /// Tells every watcher; returns once they all acknowledged (or the time is up: a gateway
    /// that does not answer cannot reach the cluster, and so fails its commands, until its
    /// watch is back and it reads the state again).
    fn notify(&self, gen: u64) {
        let payload = gen.to_string();
        let mut reply: *mut c_char = std::ptr::null_mut();
        let mut reply_len = 0usize;
        // SAFETY: valid object and payload; librados allocates the reply, freed below.
        let r = unsafe {
            (self.lib().rados.rados_notify2)(
                self.io.io,
                self.oid(),
                payload.as_ptr().cast(),
                payload.len() as c_int,
                self.notify_timeout_ms,
                &mut reply,
                &mut reply_len,
            )
        };
        if !reply.is_null() {
            // SAFETY: allocated by rados_notify2.
            unsafe { (self.lib().rados.rados_buffer_free)(reply) };
        }
        if r < 0 {
            tracing::warn!(state = %self.location, error = %err(r),
                "not every gateway acknowledged the change of the shared state");
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let cookie = self
            .cookie
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(c) = cookie {
            // SAFETY: registered by rewatch; then wait for callbacks in flight, which use
            // the Watch about to be freed.
            unsafe {
                (self.lib().rados.rados_unwatch2)(self.io.io, c);
                (self.lib().rados.rados_watch_flush)(self.io.cluster.raw());
            }
        }
    }
}

#[async_trait]
impl SharedState for RadosState {
    fn maybe_changed(&self) -> io::Result<bool> {
        let w = &self.inner.watch;
        Ok(w.stale.load(Ordering::SeqCst) || w.broken.load(Ordering::SeqCst))
    }

    async fn read(&self) -> io::Result<Vec<u8>> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || inner.read_blocking())
            .await
            .map_err(io::Error::other)?
    }

    async fn update(&self, update: &mut Update<'_>) -> io::Result<()> {
        // The update function borrows the caller's state, so it runs on this thread while it
        // waits for the cluster (PERSISTENT RESERVE OUT is rare); a multi-threaded runtime
        // is told, and moves its other tasks off this thread meanwhile.
        let inner = &self.inner;
        let multi = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if multi {
            tokio::task::block_in_place(|| inner.update_blocking(update))
        } else {
            inner.update_blocking(update)
        }
    }

    fn location(&self) -> String {
        self.inner.location.clone()
    }

    async fn next_change(&self) -> bool {
        let w = &self.inner.watch;
        w.listening.store(true, Ordering::SeqCst);
        w.changed.notified().await;
        true
    }

    fn acknowledge(&self) {
        let w = &self.inner.watch;
        let pending =
            std::mem::take(&mut *w.pending.lock().unwrap_or_else(PoisonError::into_inner));
        for (id, cookie) in pending {
            w.ack(id, cookie);
        }
    }
}
