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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use rtgt_backstore::{Backstore, BackstoreError, BufResult, DeviceInfo, IoBuf};
use tokio::sync::{oneshot, watch, Notify};

use crate::cluster::{cstring, Cluster, ClusterSpec, IoCtx};
use crate::sys::{rbd_completion_t, rbd_image_t, Ceph};
use crate::CephError;

/// What librbd's compare-and-write covers: one sector, aligned.
const CAW_SECTOR: u64 = 512;

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

/// An open librbd image handle, closed when the last holder drops it.
struct Image {
    lib: &'static Ceph,
    raw: rbd_image_t,
    /// Keeps the pool's I/O context (and through it the cluster connection) open.
    _io: IoCtx,
}

// SAFETY: librbd image handles are thread-safe for concurrent aio calls, size queries and
// resize; the handle is closed only on drop, when no call can be running.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: opened by rbd_open; waits for operations still in flight (their buffers
        // are theirs); nothing uses the handle after.
        unsafe { (self.lib.rbd.rbd_close)(self.raw) };
    }
}

/// An open RBD image.
pub struct RbdBackstore {
    lib: &'static Ceph,
    /// `handle.raw`, for the data path.
    image: rbd_image_t,
    handle: Arc<Image>,
    name: String,
    block_size: u32,
    num_blocks: AtomicU64,
    read_only: bool,
    write_cache: bool,
    thin: bool,
    watch: Option<(u64, Arc<Notify>)>,
    capacity: watch::Sender<u64>,
}

// SAFETY: see `Image`; `image` is `handle.raw`.
unsafe impl Send for RbdBackstore {}
// SAFETY: as above.
unsafe impl Sync for RbdBackstore {}

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
        let cluster = Cluster::connect(&opts.cluster)?;
        let lib = cluster.lib;
        let io = cluster.ioctx(&opts.pool, &opts.namespace)?;
        let name = cstring("image", &opts.image)?;
        let mut image: rbd_image_t = std::ptr::null_mut();
        // SAFETY: live I/O context, valid C string, `image` written on success; a null
        // snapshot name opens the image itself.
        let r = unsafe { (lib.rbd.rbd_open)(io.io, name.as_ptr(), &mut image, std::ptr::null()) };
        let full = image_name(opts);
        if r < 0 {
            return Err(CephError::Image {
                image: full,
                errno: -r,
            });
        }
        let handle = Arc::new(Image {
            lib,
            raw: image,
            _io: io,
        });
        let mut size = 0u64;
        // SAFETY: open image; `size` is written.
        let r = unsafe { (lib.rbd.rbd_get_size)(image, &mut size) };
        if r < 0 {
            return Err(CephError::call("rbd_get_size", r));
        }
        let num_blocks = size / u64::from(opts.block_size);
        let (capacity, _) = watch::channel(num_blocks);
        let mut store = RbdBackstore {
            lib,
            image,
            handle,
            name: full,
            block_size: opts.block_size,
            num_blocks: AtomicU64::new(num_blocks),
            read_only: opts.read_only,
            write_cache: opts.write_cache,
            thin: opts.thin,
            watch: None,
            capacity,
        };
        let notify = Arc::new(Notify::new());
        let mut handle = 0u64;
        // SAFETY: open image; the callback's argument is the Notify, kept alive by
        // `store.watch` until `rbd_update_unwatch` has returned (in drop).
        let r = unsafe {
            (lib.rbd.rbd_update_watch)(
                image,
                &mut handle,
                header_changed,
                Arc::as_ptr(&notify).cast_mut().cast(),
            )
        };
        if r < 0 {
            return Err(CephError::call("rbd_update_watch", r));
        }
        store.watch = Some((handle, Arc::clone(&notify)));
        let store = Arc::new(store);
        let weak = Arc::downgrade(&store);
        tokio::spawn(async move {
            loop {
                notify.notified().await;
                let Some(store) = weak.upgrade() else { return };
                let s = Arc::clone(&store);
                // rbd_get_size may refresh the header from the cluster.
                let size = tokio::task::spawn_blocking(move || s.size()).await;
                if let Ok(Ok(bytes)) = size {
                    store.update_capacity(bytes);
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

    fn size(&self) -> Result<u64, io::Error> {
        let mut size = 0u64;
        // SAFETY: open image; `size` is written.
        let r = unsafe { (self.lib.rbd.rbd_get_size)(self.image, &mut size) };
        if r < 0 {
            return Err(os(r as isize));
        }
        Ok(size)
    }

    fn update_capacity(&self, bytes: u64) {
        let blocks = bytes / u64::from(self.block_size);
        if self.num_blocks.swap(blocks, Ordering::AcqRel) != blocks {
            tracing::info!(image = %self.name, bytes, "rbd image resized");
            self.capacity.send_replace(blocks);
        }
    }

    /// Whether this client holds the image's exclusive lock.
    pub fn is_lock_owner(&self) -> Result<bool, io::Error> {
        let mut owner: c_int = 0;
        // SAFETY: open image; `owner` is written.
        let r = unsafe { (self.lib.rbd.rbd_is_exclusive_lock_owner)(self.image, &mut owner) };
        if r < 0 {
            return Err(os(r as isize));
        }
        Ok(owner != 0)
    }

    fn capacity_bytes(&self) -> u64 {
        self.num_blocks.load(Ordering::Acquire) * u64::from(self.block_size)
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), BackstoreError> {
        let capacity = self.capacity_bytes();
        match offset.checked_add(len) {
            Some(end) if end <= capacity => Ok(()),
            _ => Err(BackstoreError::OutOfRange {
                offset,
                len,
                capacity,
            }),
        }
    }

    /// Starts one librbd operation with `buf` kept alive until it completes, and waits.
    /// `start` gets the buffer's address, the completion and where a compare-and-write
    /// puts its mismatch offset, and returns librbd's result of starting it.
    async fn submit(
        &self,
        buf: Option<IoBuf>,
        start: impl FnOnce(*mut u8, rbd_completion_t, *mut u64) -> isize,
    ) -> Finished {
        let rx = match self.start(buf, start) {
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

    async fn read(&self, offset: u64, buf: IoBuf) -> BufResult<()> {
        let len = buf.len();
        if let Err(e) = self.check_range(offset, len as u64) {
            return (Err(e), buf);
        }
        let rbd = &self.lib.rbd;
        let mut f = self
            .submit(Some(buf), |data, c, _| {
                // SAFETY: `data` is `len` bytes of the buffer the Op keeps until completion.
                unsafe {
                    (rbd.rbd_aio_read)(self.image, offset, len, data.cast::<c_char>(), c) as isize
                }
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
            .submit(Some(buf), |data, c, _| {
                // SAFETY: as in read; librbd only reads the buffer.
                unsafe {
                    (rbd.rbd_aio_write)(
                        self.image,
                        offset,
                        len,
                        data.cast_const().cast::<c_char>(),
                        c,
                    ) as isize
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
            .submit(None, |_, c, _| unsafe {
                (rbd.rbd_aio_flush)(self.image, c) as isize
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
            .submit(None, |_, c, _| unsafe {
                (rbd.rbd_aio_discard)(self.image, offset, len, c) as isize
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
            .submit(None, |_, c, _| unsafe {
                (rbd.rbd_aio_write_zeroes)(self.image, offset, n, c, 0, 0) as isize
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
            .submit(Some(buf), |data, c, mismatch| {
                let (cmp, new) = (
                    data.cast_const().cast::<c_char>(),
                    data.wrapping_add(half).cast_const().cast::<c_char>(),
                );
                // SAFETY: both halves lie in the buffer the Op keeps; `mismatch` is the Op's
                // field, written by librbd before the completion runs.
                unsafe {
                    (rbd.rbd_aio_compare_and_write)(
                        self.image, offset, half, cmp, new, c, mismatch, 0,
                    )
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

    async fn lba_status(&self, offset: u64, len: u64) -> Result<(bool, u64), BackstoreError> {
        self.check_range(offset, len)?;
        Ok((true, len))
    }

    async fn resize(&self, num_blocks: u64) -> Result<(), BackstoreError> {
        let bytes = num_blocks * u64::from(self.block_size);
        let image = Arc::clone(&self.handle);
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

impl Drop for RbdBackstore {
    fn drop(&mut self) {
        if let Some((handle, _notify)) = self.watch.take() {
            // SAFETY: registered in open; returns once no callback runs, so the Notify may
            // be dropped after it. The image closes when `self.handle` is dropped.
            unsafe { (self.lib.rbd.rbd_update_unwatch)(self.image, handle) };
        }
    }
}
