//! The rbd backstore: a Ceph RBD image through librbd's asynchronous API.
//!
//! Every transfer is one librbd call on the command's own pool buffer (no copy): the buffer
//! moves into an [`Op`] on the heap, whose address is the completion's argument, and comes
//! back through a one-shot channel when librbd's completion thread calls [`complete`]. A
//! command whose future is dropped early leaves the buffer with the operation, so librbd
//! never writes into memory that has been reused; the completion frees it.
//!
//! Capacity changes made elsewhere (`rbd resize`, another gateway) reach
//! [`Backstore::capacity_changes`] through librbd's header watch.

use std::ffi::{c_char, c_int, c_void};
use std::io;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use rtgt_backstore::{Backstore, BackstoreError, BufResult, DeviceInfo, IoBuf};
use tokio::sync::{oneshot, watch, Notify};

use crate::cluster::{cstring, Cluster, ClusterSpec, IoCtx, Usage};
use crate::sys::{rbd_completion_t, rbd_image_t, Ceph};
use crate::CephError;

/// What librbd's compare-and-write covers: one sector, aligned.
const CAW_SECTOR: u64 = 512;
/// How often the exclusive lock's holder is polled, for [`Backstore::holds_write_lock`].
const LOCK_POLL: Duration = Duration::from_secs(2);
const LOCK_UNKNOWN: u8 = 0;
const LOCK_NOT_HELD: u8 = 1;
const LOCK_HELD: u8 = 2;

/// Which image, and how to present it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdOptions {
    pub cluster: ClusterSpec,
    pub pool: String,
    /// RADOS namespace in the pool; empty for none.
    pub namespace: String,
    pub image: String,
    /// Logical block size: 512 or 4096.
    pub block_size: u32,
    pub read_only: bool,
    /// Report a volatile write cache (WCE). librbd runs without its cache here, so every
    /// write is durable on completion either way; SYNCHRONIZE CACHE still flushes.
    pub write_cache: bool,
    /// UNMAP and WRITE SAME with UNMAP discard.
    pub thin: bool,
}

/// An open librbd image handle with its header watch, closed when the last holder drops it.
struct Image {
    lib: &'static Ceph,
    raw: rbd_image_t,
    /// The pool's I/O context (and through it the cluster connection).
    io: IoCtx,
    /// The header watch and what it wakes (kept alive until the watch is gone).
    watch: u64,
    notify: Arc<Notify>,
}

// SAFETY: librbd image handles are thread-safe for concurrent aio calls, size queries and
// resize; the handle is closed only on drop, when no call can be running.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: registered when opened; returns once no callback runs. Then rbd_close waits
        // for operations still in flight (their buffers are theirs); nothing uses the handle
        // after.
        unsafe {
            (self.lib.rbd.rbd_update_unwatch)(self.raw, self.watch);
            (self.lib.rbd.rbd_close)(self.raw)
        };
    }
}

impl Image {
    /// Opens `opts`'s image on `cluster` and watches its header (blocking).
    fn open(
        cluster: &Arc<Cluster>,
        opts: &RbdOptions,
        notify: &Arc<Notify>,
    ) -> Result<Image, CephError> {
        let lib = cluster.lib;
        let io = cluster.ioctx(&opts.pool, &opts.namespace)?;
        let name = cstring("image", &opts.image)?;
        let mut raw: rbd_image_t = std::ptr::null_mut();
        // SAFETY: live I/O context, valid C string, `raw` written on success; a null
        // snapshot name opens the image itself.
        let r = unsafe { (lib.rbd.rbd_open)(io.io, name.as_ptr(), &mut raw, std::ptr::null()) };
        if r < 0 {
            return Err(CephError::Image {
                image: image_name(opts),
                errno: -r,
            });
        }
        let mut watch = 0u64;
        // SAFETY: open image; the callback's argument is the Notify, which the Image keeps
        // alive until `rbd_update_unwatch` has returned (in drop).
        let r = unsafe {
            (lib.rbd.rbd_update_watch)(
                raw,
                &mut watch,
                header_changed,
                Arc::as_ptr(notify).cast_mut().cast(),
            )
        };
        if r < 0 {
            // SAFETY: opened above, not used after.
            unsafe { (lib.rbd.rbd_close)(raw) };
            return Err(CephError::call("rbd_update_watch", r));
        }
        Ok(Image {
            lib,
            raw,
            io,
            watch,
            notify: Arc::clone(notify),
        })
    }
}

/// An open RBD image.
pub struct RbdBackstore {
    lib: &'static Ceph,
    /// The open image; replaced by a new one on a new connection when the cluster has
    /// blocklisted this one's client.
    image: ArcSwap<Image>,
    opts: RbdOptions,
    /// Held while the image is opened again.
    reopening: tokio::sync::Mutex<()>,
    name: String,
    block_size: u32,
    num_blocks: AtomicU64,
    read_only: bool,
    write_cache: bool,
    thin: bool,
    capacity: watch::Sender<u64>,
    /// Whether this gateway holds the image's exclusive lock, as last polled.
    lock_owner: AtomicU8,
}

/// What an operation keeps alive until librbd completes it.
struct Op {
    lib: &'static Ceph,
    buf: Option<IoBuf>,
    /// COMPARE AND WRITE: librbd's offset of the first difference.
    mismatch: u64,
    done: Option<oneshot::Sender<Finished>>,
}

struct Finished {
    ret: isize,
    buf: Option<IoBuf>,
    mismatch: u64,
}

/// librbd's completion callback (its completion thread).
unsafe extern "C" fn complete(c: rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is the `Op` leaked by `RbdBackstore::submit` for this completion; librbd
    // calls this exactly once, so the box is taken back exactly once.
    let mut op = unsafe { Box::from_raw(arg.cast::<Op>()) };
    // SAFETY: `c` is the completion being finished; it is released here and never used again.
    let ret = unsafe { (op.lib.rbd.rbd_aio_get_return_value)(c) };
    // SAFETY: as above.
    unsafe { (op.lib.rbd.rbd_aio_release)(c) };
    if let Some(done) = op.done.take() {
        // A dropped receiver (the command went away) leaves the buffer to be freed here.
        let _ = done.send(Finished {
            ret,
            buf: op.buf.take(),
            mismatch: op.mismatch,
        });
    }
}

/// librbd's header watch: the image's size or features changed.
unsafe extern "C" fn header_changed(arg: *mut c_void) {
    // SAFETY: `arg` is the `Notify` inside the Arc the backstore holds until it has
    // unregistered the watch, which waits for running callbacks.
    let notify = unsafe { &*arg.cast::<Notify>() };
    notify.notify_one();
}

fn os(ret: isize) -> io::Error {
    io::Error::from_raw_os_error(i32::try_from(-ret).unwrap_or(libc::EIO))
}

impl RbdBackstore {
    /// Connects (or reuses the connection to) the cluster and opens the image. Blocking: run
    /// it off the async threads. Must be called within a tokio runtime (the header watch's
    /// task runs on it).
    pub fn open(opts: &RbdOptions) -> Result<Arc<RbdBackstore>, CephError> {
        if opts.block_size != 512 && opts.block_size != 4096 {
            return Err(CephError::Config(format!(
                "block size {} (must be 512 or 4096)",
                opts.block_size
            )));
        }
        let cluster = Cluster::connect(&opts.cluster, Usage::Images)?;
        let notify = Arc::new(Notify::new());
        let image = Image::open(&cluster, opts, &notify)?;
        let mut size = 0u64;
        // SAFETY: open image; `size` is written.
        let r = unsafe { (cluster.lib.rbd.rbd_get_size)(image.raw, &mut size) };
        if r < 0 {
            return Err(CephError::call("rbd_get_size", r));
        }
        let num_blocks = size / u64::from(opts.block_size);
        let (capacity, _) = watch::channel(num_blocks);
        let store = Arc::new(RbdBackstore {
            lib: cluster.lib,
            image: ArcSwap::from_pointee(image),
            opts: opts.clone(),
            reopening: tokio::sync::Mutex::new(()),
            name: image_name(opts),
            block_size: opts.block_size,
            num_blocks: AtomicU64::new(num_blocks),
            read_only: opts.read_only,
            write_cache: opts.write_cache,
            thin: opts.thin,
            capacity,
            lock_owner: AtomicU8::new(LOCK_UNKNOWN),
        });
        let weak = Arc::downgrade(&store);
        tokio::spawn(async move {
            let mut poll = tokio::time::interval(LOCK_POLL);
            loop {
                let header = tokio::select! {
                    () = notify.notified() => true,
                    _ = poll.tick() => false,
                };
                let Some(store) = weak.upgrade() else { return };
                let s = Arc::clone(&store);
                if header {
                    // rbd_get_size may refresh the header from the cluster.
                    let size = tokio::task::spawn_blocking(move || s.size()).await;
                    if let Ok(Ok(bytes)) = size {
                        store.update_capacity(bytes);
                    }
                } else {
                    // Asks the OSD whether the lock is still this client's.
                    let held = tokio::task::spawn_blocking(move || s.lock_owner()).await;
                    let state = match held {
                        Ok(Some(true)) => LOCK_HELD,
                        Ok(Some(false)) => LOCK_NOT_HELD,
                        _ => LOCK_UNKNOWN,
                    };
                    store.lock_owner.store(state, Ordering::Relaxed);
                }
            }
        });
        tracing::info!(image = %store.name, bytes = size, "rbd image open");
        Ok(store)
    }

    /// `pool/namespace/image`, as `rbd` names it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The image's id: unlike its name, it stays the same through `rbd rename` (blocking).
    pub fn id(&self) -> Result<String, CephError> {
        let image = self.image.load_full();
        let mut len = 64usize;
        loop {
            let mut buf = vec![0u8; len];
            // SAFETY: open image; `buf` has `len` writable bytes.
            let r = unsafe { (self.lib.rbd.rbd_get_id)(image.raw, buf.as_mut_ptr().cast(), len) };
            if r == -libc::ERANGE && len < 4096 {
                len *= 4;
                continue;
            }
            if r < 0 {
                return Err(CephError::call("rbd_get_id", r));
            }
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            buf.truncate(end);
            return String::from_utf8(buf)
                .map_err(|_| CephError::call("rbd_get_id", -libc::EINVAL));
        }
    }

    fn size(&self) -> Result<u64, io::Error> {
        let image = self.image.load_full();
        let mut size = 0u64;
        // SAFETY: open image; `size` is written.
        let r = unsafe { (self.lib.rbd.rbd_get_size)(image.raw, &mut size) };
        if r < 0 {
            return Err(os(r as isize));
        }
        Ok(size)
    }

    /// Whether this client holds the image's exclusive lock (blocking: librbd asks the OSD).
    fn lock_owner(&self) -> Option<bool> {
        let image = self.image.load_full();
        let mut owner: c_int = 0;
        // SAFETY: open image; `owner` is written.
        let r = unsafe { (self.lib.rbd.rbd_is_exclusive_lock_owner)(image.raw, &mut owner) };
        (r >= 0).then_some(owner != 0)
    }

    fn update_capacity(&self, bytes: u64) {
        let blocks = bytes / u64::from(self.block_size);
        if self.num_blocks.swap(blocks, Ordering::AcqRel) != blocks {
            tracing::info!(image = %self.name, bytes, "rbd image resized");
            self.capacity.send_replace(blocks);
        }
    }

    fn capacity_bytes(&self) -> u64 {
        self.num_blocks.load(Ordering::Acquire) * u64::from(self.block_size)
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), BackstoreError> {
        rtgt_backstore::check_range(offset, len, self.capacity_bytes())
    }

    /// Starts one librbd operation with `buf` kept alive until it completes, and waits.
    /// `start` gets the buffer's address, the completion and where a compare-and-write
    /// puts its mismatch offset, and returns librbd's result of starting it.
    /// A client the cluster has blocklisted (ESHUTDOWN) gets a new connection and the image
    /// is opened again on it, and the operation is repeated once.
    async fn submit(
        &self,
        buf: Option<IoBuf>,
        start: impl Fn(rbd_image_t, *mut u8, rbd_completion_t, *mut u64) -> isize,
    ) -> Finished {
        let image = self.image.load_full();
        let mut f = self.submit_on(&image, buf, &start).await;
        if f.ret == -(libc::ESHUTDOWN as isize) && self.reopen(&image).await {
            let image = self.image.load_full();
            let buf = f.buf.take();
            f = self.submit_on(&image, buf, &start).await;
        }
        f
    }

    async fn submit_on(
        &self,
        image: &Arc<Image>,
        buf: Option<IoBuf>,
        start: &impl Fn(rbd_image_t, *mut u8, rbd_completion_t, *mut u64) -> isize,
    ) -> Finished {
        let raw = image.raw as usize;
        let rx = match self.start(buf, |d, c, m| start(raw as rbd_image_t, d, c, m)) {
            Ok(rx) => rx,
            Err(refused) => return refused,
        };
        match rx.await {
            Ok(f) => f,
            // The completion always sends before dropping its sender.
            Err(_) => Finished {
                ret: -(libc::EIO as isize),
                buf: None,
                mismatch: 0,
            },
        }
    }

    /// Replaces `old` (whose client the cluster blocklisted) by the image opened on a new
    /// connection; false when that failed within the operation timeout. Commands that
    /// failed meanwhile are repeated by the hosts (NOT READY).
    async fn reopen(&self, old: &Arc<Image>) -> bool {
        let _one = self.reopening.lock().await;
        if !Arc::ptr_eq(&self.image.load_full(), old) {
            return true;
        }
        tracing::warn!(image = %self.name, "the cluster blocklisted this gateway's client: connecting again");
        let (opts, cluster) = (self.opts.clone(), Arc::clone(&old.io.cluster));
        let notify = Arc::clone(&old.notify);
        let open = tokio::task::spawn_blocking(move || {
            let fresh = Cluster::reconnect(&opts.cluster, Usage::Images, &cluster)?;
            Image::open(&fresh, &opts, &notify)
        });
        match tokio::time::timeout(self.opts.cluster.op_timeout, open).await {
            Ok(Ok(Ok(image))) => {
                self.image.store(Arc::new(image));
                tracing::info!(image = %self.name, "rbd image open again");
                true
            }
            Ok(Ok(Err(e))) => {
                tracing::error!(image = %self.name, error = %e, "opening the image again failed");
                false
            }
            _ => false,
        }
    }

    /// The synchronous half of [`RbdBackstore::submit`]: the operation started, or what
    /// librbd said when it refused it, with the buffer.
    fn start(
        &self,
        mut buf: Option<IoBuf>,
        start: impl FnOnce(*mut u8, rbd_completion_t, *mut u64) -> isize,
    ) -> Result<oneshot::Receiver<Finished>, Finished> {
        let (tx, rx) = oneshot::channel();
        let data = buf.as_mut().map_or(std::ptr::null_mut(), IoBuf::as_mut_ptr);
        let op = Box::into_raw(Box::new(Op {
            lib: self.lib,
            buf,
            mismatch: 0,
            done: Some(tx),
        }));
        let mut c: rbd_completion_t = std::ptr::null_mut();
        // SAFETY: `op` stays valid until `complete` takes it back; `c` is written.
        let r = unsafe { (self.lib.rbd.rbd_aio_create_completion)(op.cast(), complete, &mut c) };
        if r < 0 {
            // SAFETY: no completion exists, so nothing else owns `op`.
            let op = unsafe { Box::from_raw(op) };
            return Err(Finished {
                ret: r as isize,
                buf: op.buf,
                mismatch: 0,
            });
        }
        // SAFETY: `op` is live; its `mismatch` field does not move (the Op is boxed) until
        // the completion runs.
        let mismatch = unsafe { &raw mut (*op).mismatch };
        let r = start(data, c, mismatch);
        if r < 0 {
            // librbd did not take the operation: its completion will not run.
            // SAFETY: `c` was created above and never handed to librbd.
            unsafe { (self.lib.rbd.rbd_aio_release)(c) };
            // SAFETY: as above, `op` is ours again.
            let op = unsafe { Box::from_raw(op) };
            return Err(Finished {
                ret: r,
                buf: op.buf,
                mismatch: 0,
            });
        }
        Ok(rx)
    }

    fn writable(&self, op: &'static str) -> Result<(), BackstoreError> {
        if self.read_only {
            return Err(BackstoreError::ReadOnly { op });
        }
        Ok(())
    }
}

/// `pool/[namespace/]image`.
fn image_name(o: &RbdOptions) -> String {
    if o.namespace.is_empty() {
        format!("{}/{}", o.pool, o.image)
    } else {
        format!("{}/{}/{}", o.pool, o.namespace, o.image)
    }
}

/// The first run of allocated extents `rbd_diff_iterate2` reports: start and end.
#[derive(Default)]
struct Run {
    first: Option<(u64, u64)>,
}

/// `rbd_diff_iterate2`'s callback: extends the first run, and stops at its end.
unsafe extern "C" fn allocated(off: u64, len: usize, exists: c_int, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the Run of the lba_status call that is waiting for this iteration.
    let run = unsafe { &mut *arg.cast::<Run>() };
    if exists == 0 {
        return 0;
    }
    let len = len as u64;
    match &mut run.first {
        None => run.first = Some((off, off + len)),
        Some((_, end)) if *end == off => *end += len,
        Some(_) => return -libc::ECANCELED,
    }
    0
}

/// The buffer of a finished operation, or a replacement of the same length if librbd's
/// completion could not hand it back (never expected).
fn returned(f: &mut Finished, len: usize) -> IoBuf {
    f.buf.take().unwrap_or_else(|| IoBuf::zeroed(len))
}

#[async_trait]
impl Backstore for RbdBackstore {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            block_size: self.block_size,
            num_blocks: self.num_blocks.load(Ordering::Acquire),
            read_only: self.read_only,
            thin: self.thin,
            write_cache: self.write_cache,
        }
    }

    fn write_lock_follows_writes(&self) -> bool {
        true
    }

    fn holds_write_lock(&self) -> Option<bool> {
        match self.lock_owner.load(Ordering::Relaxed) {
            LOCK_HELD => Some(true),
            LOCK_NOT_HELD => Some(false),
            _ => None,
        }
    }

    async fn read(&self, offset: u64, buf: IoBuf) -> BufResult<()> {
        let len = buf.len();
        if let Err(e) = self.check_range(offset, len as u64) {
            return (Err(e), buf);
        }
        let rbd = &self.lib.rbd;
        let mut f = self
            .submit(Some(buf), |image, data, c, _| {
                // SAFETY: `data` is `len` bytes of the buffer the Op keeps until completion.
                unsafe { (rbd.rbd_aio_read)(image, offset, len, data.cast::<c_char>(), c) as isize }
            })
            .await;
        let buf = returned(&mut f, len);
        if f.ret < 0 {
            let source = os(f.ret);
            return (
                Err(BackstoreError::Read {
                    offset,
                    len: len as u64,
                    source,
                }),
                buf,
            );
        }
        (Ok(()), buf)
    }

    async fn write(&self, offset: u64, buf: IoBuf, _fua: bool) -> BufResult<()> {
        let len = buf.len();
        if let Err(e) = self
            .writable("write")
            .and_then(|()| self.check_range(offset, len as u64))
        {
            return (Err(e), buf);
        }
        let rbd = &self.lib.rbd;
        // Without librbd's cache a completed write is on the OSDs: FUA needs nothing more.
        let mut f = self
            .submit(Some(buf), |image, data, c, _| {
                // SAFETY: as in read; librbd only reads the buffer.
                unsafe {
                    (rbd.rbd_aio_write)(image, offset, len, data.cast_const().cast::<c_char>(), c)
                        as isize
                }
            })
            .await;
        let buf = returned(&mut f, len);
        if f.ret < 0 {
            let source = os(f.ret);
            return (
                Err(BackstoreError::Write {
                    offset,
                    len: len as u64,
                    source,
                }),
                buf,
            );
        }
        (Ok(()), buf)
    }

    async fn flush(&self) -> Result<(), BackstoreError> {
        let rbd = &self.lib.rbd;
        // SAFETY: open image; the completion is librbd's until it runs.
        let f = self
            .submit(None, |image, _, c, _| unsafe {
                (rbd.rbd_aio_flush)(image, c) as isize
            })
            .await;
        if f.ret < 0 {
            return Err(BackstoreError::Flush { source: os(f.ret) });
        }
        Ok(())
    }

    async fn unmap(&self, offset: u64, len: u64) -> Result<(), BackstoreError> {
        self.writable("unmap")?;
        if !self.thin {
            return Err(BackstoreError::Unmap {
                offset,
                len,
                source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
            });
        }
        self.check_range(offset, len)?;
        let rbd = &self.lib.rbd;
        // SAFETY: open image; range checked.
        let f = self
            .submit(None, |image, _, c, _| unsafe {
                (rbd.rbd_aio_discard)(image, offset, len, c) as isize
            })
            .await;
        if f.ret < 0 {
            return Err(BackstoreError::Unmap {
                offset,
                len,
                source: os(f.ret),
            });
        }
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u64, _fua: bool) -> Result<(), BackstoreError> {
        self.writable("write")?;
        self.check_range(offset, len)?;
        let n = usize::try_from(len).map_err(|_| BackstoreError::OutOfRange {
            offset,
            len,
            capacity: self.capacity_bytes(),
        })?;
        let rbd = &self.lib.rbd;
        // SAFETY: open image; range checked; no zero or op flags.
        let f = self
            .submit(None, |image, _, c, _| unsafe {
                (rbd.rbd_aio_write_zeroes)(image, offset, n, c, 0, 0) as isize
            })
            .await;
        if f.ret < 0 {
            return Err(BackstoreError::Write {
                offset,
                len,
                source: os(f.ret),
            });
        }
        Ok(())
    }

    /// librbd compares and writes within one 512-byte sector only (EINVAL otherwise).
    fn compare_and_write_limit(&self) -> u64 {
        CAW_SECTOR
    }

    async fn compare_and_write(
        &self,
        offset: u64,
        buf: IoBuf,
        _fua: bool,
    ) -> BufResult<Option<u64>> {
        let total = buf.len();
        let half = total / 2;
        if let Err(e) = self
            .writable("compare and write")
            .and_then(|()| self.check_range(offset, half as u64))
        {
            return (Err(e), buf);
        }
        let rbd = &self.lib.rbd;
        let mut f = self
            .submit(Some(buf), |image, data, c, mismatch| {
                let (cmp, new) = (
                    data.cast_const().cast::<c_char>(),
                    data.wrapping_add(half).cast_const().cast::<c_char>(),
                );
                // SAFETY: both halves lie in the buffer the Op keeps; `mismatch` is the Op's
                // field, written by librbd before the completion runs.
                unsafe {
                    (rbd.rbd_aio_compare_and_write)(image, offset, half, cmp, new, c, mismatch, 0)
                }
            })
            .await;
        let buf = returned(&mut f, total);
        match f.ret {
            r if r == -(libc::EILSEQ as isize) => {
                // librbd reports the mismatch as an offset on the image.
                let at = f.mismatch.checked_sub(offset).unwrap_or(f.mismatch);
                (Ok(Some(at)), buf)
            }
            r if r < 0 => {
                let source = os(r);
                (
                    Err(BackstoreError::Write {
                        offset,
                        len: half as u64,
                        source,
                    }),
                    buf,
                )
            }
            _ => (Ok(None), buf),
        }
    }

    /// From the image's allocation (its object map where it has one): RADOS objects are
    /// the unit, so a range is mapped as long as its object exists.
    async fn lba_status(&self, offset: u64, len: u64) -> Result<(bool, u64), BackstoreError> {
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok((true, 0));
        }
        let image = self.image.load_full();
        let run = tokio::task::spawn_blocking(move || {
            let mut run = Run::default();
            // SAFETY: the task holds the image open; `run` outlives the call, which invokes
            // the callback on this thread only.
            let r = unsafe {
                (image.lib.rbd.rbd_diff_iterate2)(
                    image.raw,
                    std::ptr::null(),
                    offset,
                    len,
                    1,
                    1,
                    allocated,
                    std::ptr::from_mut(&mut run).cast(),
                )
            };
            if r < 0 && r != -libc::ECANCELED {
                return Err(os(r as isize));
            }
            Ok(run)
        })
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)))
        .map_err(|source| BackstoreError::LbaStatus { offset, source })?;
        let end = offset + len;
        Ok(match run.first {
            None => (false, len),
            Some((start, _)) if start > offset => (false, start.min(end) - offset),
            Some((_, run_end)) => (true, run_end.min(end) - offset),
        })
    }

    async fn resize(&self, num_blocks: u64) -> Result<(), BackstoreError> {
        let bytes = num_blocks * u64::from(self.block_size);
        let image = self.image.load_full();
        // SAFETY: the task holds the image open.
        let r = tokio::task::spawn_blocking(move || unsafe {
            (image.lib.rbd.rbd_resize)(image.raw, bytes)
        })
        .await
        .unwrap_or(-libc::EIO);
        if r < 0 {
            return Err(BackstoreError::Resize {
                num_blocks,
                source: os(r as isize),
            });
        }
        self.update_capacity(bytes);
        Ok(())
    }

    fn capacity_changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.capacity.subscribe())
    }
}
