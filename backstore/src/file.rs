//! Regular files and block devices on io_uring.
//!
//! Each backstore opens its file twice where the file system supports direct I/O: an O_DIRECT
//! descriptor for transfers whose offset, length and buffer meet the device's alignment, and a
//! buffered one for everything else (and for an O_DIRECT transfer the kernel still refuses with
//! EINVAL). The kernel keeps the two coherent: direct writes invalidate cached pages and direct
//! reads write back dirty ones first. Which one aligned transfers take is the cache mode,
//! `direct`, and can change while I/O runs ([`FileBackstore::set_direct`]).
//!
//! Without a write cache every write is issued with `RWF_DSYNC`, as a FUA write always is: it
//! completes once it is on stable media. The descriptors themselves are never O_DSYNC, so the
//! write cache too can be switched on a running backstore ([`Backstore::set_write_cache`]).
//!
//! Transfers that need no waiting run synchronously in the caller instead of through the ring:
//! on a memory file system (tmpfs, ramfs) every transfer is a memory copy, like a
//! [`crate::RamBackstore`] access, and O_DIRECT is not used there because those file systems
//! only emulate it; elsewhere a buffered transfer first tries `RWF_NOWAIT`, which succeeds on
//! a page-cache hit, and only what remains goes to the ring. Without this, io_uring hands
//! every transfer on a file system lacking non-blocking support (tmpfs) to its worker
//! threads, which costs a thread hand-off and a wake-up per transfer.
//!
//! Buffered writes on a file system that refuses `RWF_NOWAIT` for them (ext4) are copied
//! into the page cache inline too, when small: such a write normally only copies, and the
//! hand-off to an io_uring worker would cost more than the write. It may block — the kernel
//! throttles writers when too much dirty data waits for the disk — so one that takes longer
//! than [`SLOW_INLINE_WRITE`] sends the backstore's writes back to the ring for
//! [`INLINE_WRITE_BACKOFF`]: a throttled disk never holds the caller's thread for long.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;

use crate::buf::{BufPool, IoBuf};
use crate::error::BackstoreError;
use crate::sys;
use crate::uring::{Completed, Op, Ring};
use crate::{Backstore, BufResult, DeviceInfo};

/// Submission queue depth of [`FileBackstore::open`].
pub const DEFAULT_QUEUE_DEPTH: u32 = 128;

/// Index of the buffered descriptor in the ring's file table.
const BUFFERED: u32 = 0;
/// Index of the O_DIRECT descriptor, when there is one.
const DIRECT: u32 = 1;
/// Resubmissions of one transfer after EINTR/EAGAIN before giving up.
const RETRIES: u32 = 16;
/// Largest buffered write done inline on a file system without `RWF_NOWAIT` writes.
const INLINE_WRITE_MAX: usize = 256 << 10;
/// An inline write that takes longer than this was held up (dirty-page throttling, a busy
/// journal): writes go through the ring for a while.
pub const SLOW_INLINE_WRITE: std::time::Duration = std::time::Duration::from_millis(1);
/// How long writes stay on the ring after a slow inline write.
pub const INLINE_WRITE_BACKOFF: std::time::Duration = std::time::Duration::from_secs(1);

/// How to open a [`FileBackstore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOptions {
    /// Capacity in bytes. A regular file shorter than this is extended (sparsely); without it
    /// the capacity is the current size of the file or device.
    pub size: Option<u64>,
    /// Logical block size: 512 or 4096.
    pub block_size: u32,
    pub read_only: bool,
    /// Report a volatile write cache: writes are durable only after `flush` or with FUA.
    /// When false every write is durable on completion (`RWF_DSYNC`).
    pub write_cache: bool,
    /// Use O_DIRECT for aligned transfers when the file system supports it; otherwise
    /// transfers go through the page cache.
    pub direct: bool,
    /// Thin provisioning: `unmap` deallocates. When false `unmap` is refused as unsupported.
    pub thin: bool,
    /// Create a regular file that does not exist.
    pub create: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            size: None,
            block_size: 512,
            read_only: false,
            write_cache: true,
            direct: true,
            thin: true,
            create: false,
        }
    }
}

fn check_block_size(block_size: u32) -> Result<(), BackstoreError> {
    if block_size != 512 && block_size != 4096 {
        return Err(BackstoreError::Config(format!(
            "block size {block_size} (must be 512 or 4096)"
        )));
    }
    Ok(())
}

/// Which I/O paths a backstore has used; for tests, metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileCounters {
    /// Submissions on the O_DIRECT descriptor.
    pub direct: u64,
    /// Submissions on the buffered descriptor.
    pub buffered: u64,
    /// Direct submissions refused with EINVAL and repeated buffered.
    pub direct_fallbacks: u64,
    /// Transfers the kernel completed only in part (the rest was resubmitted).
    pub short_transfers: u64,
    /// Submissions that used fixed buffers of the registered pool.
    pub fixed: u64,
    /// Transfers (or their leading part) completed synchronously without the ring.
    pub inline: u64,
    /// Inline writes slower than [`SLOW_INLINE_WRITE`] (each sent the writes that followed
    /// to the ring for [`INLINE_WRITE_BACKOFF`]).
    pub slow_inline_writes: u64,
}

#[derive(Default)]
struct Counters {
    direct: AtomicU64,
    buffered: AtomicU64,
    direct_fallbacks: AtomicU64,
    short_transfers: AtomicU64,
    inline: AtomicU64,
    slow_inline_writes: AtomicU64,
}

/// A regular file or block device served through io_uring.
///
/// Must be opened within a tokio runtime; the ring's completion reaper runs on it.
pub struct FileBackstore {
    ring: Ring,
    /// `[buffered, direct?]`, the same order as the ring's registered files.
    files: Vec<Arc<File>>,
    path: PathBuf,
    block_device: bool,
    /// The O_DIRECT descriptor exists (the file system supports direct I/O).
    has_direct: bool,
    /// Aligned transfers take the O_DIRECT descriptor (the cache mode `direct`).
    use_direct: AtomicBool,
    /// O_DIRECT alignment of file offsets and lengths.
    dio_offset_align: u64,
    /// O_DIRECT alignment of buffer addresses.
    dio_mem_align: usize,
    block_size: u32,
    num_blocks: AtomicU64,
    read_only: bool,
    /// Every write is issued with RWF_DSYNC (no write cache).
    write_through: AtomicBool,
    thin: bool,
    /// The file lives on tmpfs or ramfs: every transfer is a memory copy and runs inline.
    memory_fs: bool,
    /// Whether RWF_NOWAIT is still worth trying on the buffered descriptor; cleared when the
    /// file system refuses it.
    nowait_reads: AtomicBool,
    nowait_writes: AtomicBool,
    /// Blocking inline writes are off until this many nanoseconds after `opened`.
    inline_writes_after: AtomicU64,
    opened: std::time::Instant,
    counters: Counters,
    warned_fallback: AtomicBool,
}

impl FileBackstore {
    /// Opens `path` with a submission queue of [`DEFAULT_QUEUE_DEPTH`] entries.
    pub fn open(
        path: impl AsRef<Path>,
        opts: FileOptions,
    ) -> Result<FileBackstore, BackstoreError> {
        Self::open_with_queue_depth(path, opts, DEFAULT_QUEUE_DEPTH)
    }

    /// Opens `path`; at most `depth` operations are in flight, further callers wait.
    ///
    /// The path is taken as it is: the daemon opens backstores through
    /// [`crate::policy::BackstoreRoots`] and [`FileBackstore::from_file`] instead.
    pub fn open_with_queue_depth(
        path: impl AsRef<Path>,
        opts: FileOptions,
        depth: u32,
    ) -> Result<FileBackstore, BackstoreError> {
        let path = path.as_ref().to_path_buf();
        check_block_size(opts.block_size)?;
        let open_err = |source: io::Error| BackstoreError::Open {
            path: path.clone(),
            source,
        };
        let block_device = match std::fs::metadata(&path) {
            Ok(meta) if meta.file_type().is_block_device() => true,
            Ok(meta) if meta.is_file() => false,
            Ok(_) => {
                return Err(BackstoreError::Config(format!(
                    "{} is neither a regular file nor a block device",
                    path.display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && opts.create => false,
            Err(e) => return Err(open_err(e)),
        };
        // An exclusive open of a block device fails while it is mounted or claimed elsewhere.
        let excl = if block_device && !opts.read_only {
            libc::O_EXCL
        } else {
            0
        };
        let buffered = OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .create(opts.create && !block_device && !opts.read_only)
            .custom_flags(excl)
            .open(&path)
            .map_err(open_err)?;
        Self::from_file_with_queue_depth(buffered, path, opts, depth)
    }

    /// A backstore over `file`, an open regular file or block device, with a submission queue
    /// of [`DEFAULT_QUEUE_DEPTH`] entries. `file` must be open for reading, and for writing too
    /// unless `opts.read_only`; `path` names it in messages. `opts.create` is not used. The O_DIRECT descriptor, when there is one,
    /// is a reopen of the same inode (through `/proc/self/fd`), not a new lookup of `path`.
    pub fn from_file(
        file: File,
        path: impl Into<PathBuf>,
        opts: FileOptions,
    ) -> Result<FileBackstore, BackstoreError> {
        Self::from_file_with_queue_depth(file, path, opts, DEFAULT_QUEUE_DEPTH)
    }

    /// [`FileBackstore::from_file`] with at most `depth` operations in flight.
    pub fn from_file_with_queue_depth(
        buffered: File,
        path: impl Into<PathBuf>,
        opts: FileOptions,
        depth: u32,
    ) -> Result<FileBackstore, BackstoreError> {
        let path = path.into();
        check_block_size(opts.block_size)?;
        let open_err = |source: io::Error| BackstoreError::Open {
            path: path.clone(),
            source,
        };
        let meta = buffered.metadata().map_err(open_err)?;
        let block_device = meta.file_type().is_block_device();
        if !block_device && !meta.is_file() {
            return Err(BackstoreError::Config(format!(
                "{} is neither a regular file nor a block device",
                path.display()
            )));
        }
        let capacity = if block_device {
            let dev = sys::bdev_size(&buffered).map_err(open_err)?;
            match opts.size {
                Some(s) if s > dev => {
                    return Err(BackstoreError::Config(format!(
                        "size {s} exceeds the {dev} bytes of {}",
                        path.display()
                    )))
                }
                Some(s) => s,
                None => dev,
            }
        } else {
            let current = meta.len();
            match opts.size {
                Some(s) if s > current && !opts.read_only => {
                    buffered.set_len(s).map_err(open_err)?;
                    s
                }
                Some(s) => s,
                None => current,
            }
        };

        let memory_fs = !block_device && sys::is_memory_fs(&buffered).unwrap_or(false);
        let mut files = vec![Arc::new(buffered)];
        let mut dio_offset_align = u64::from(opts.block_size);
        let mut dio_mem_align = 512usize;
        if memory_fs {
            tracing::debug!(path = %path.display(), "memory file system: transfers run inline, without O_DIRECT");
        } else {
            // Opened whatever the cache mode, so that the mode can change on a running backstore.
            let align = if block_device {
                sys::bdev_logical_block_size(&files[0])
                    .ok()
                    .map(|lbs| sys::DioAlign {
                        offset: lbs,
                        mem: lbs,
                    })
            } else {
                sys::dio_align(&files[0]).ok().flatten()
            };
            match align {
                Some(a) if a.offset == 0 => {
                    tracing::debug!(path = %path.display(), "file system has no direct I/O");
                }
                _ => match sys::reopen(&files[0], !opts.read_only, libc::O_DIRECT) {
                    Ok(f) => {
                        if let Some(a) = align {
                            dio_offset_align = u64::from(a.offset.max(1));
                            dio_mem_align = a.mem.max(1) as usize;
                        }
                        files.push(Arc::new(f));
                    }
                    Err(e) => {
                        tracing::debug!(path = %path.display(), error = %e, "O_DIRECT open failed");
                    }
                },
            }
        }
        let has_direct = files.len() > 1;
        if opts.direct && !has_direct && !memory_fs {
            tracing::warn!(path = %path.display(), "the file system has no direct I/O: serving through the page cache");
        }
        let ring = Ring::new(files.clone(), depth).map_err(open_err)?;
        Ok(FileBackstore {
            ring,
            files,
            path,
            block_device,
            has_direct,
            use_direct: AtomicBool::new(opts.direct),
            dio_offset_align,
            dio_mem_align,
            block_size: opts.block_size,
            num_blocks: AtomicU64::new(capacity / u64::from(opts.block_size)),
            read_only: opts.read_only,
            write_through: AtomicBool::new(!opts.write_cache),
            thin: opts.thin,
            memory_fs,
            nowait_reads: AtomicBool::new(true),
            nowait_writes: AtomicBool::new(!opts.read_only),
            inline_writes_after: AtomicU64::new(0),
            opened: std::time::Instant::now(),
            counters: Counters::default(),
            warned_fallback: AtomicBool::new(false),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// Whether aligned transfers go through O_DIRECT: the cache mode asks for it and the file
    /// system supports it.
    pub fn is_direct(&self) -> bool {
        self.has_direct && self.use_direct.load(Ordering::Relaxed)
    }

    /// Switches aligned transfers to O_DIRECT (`true`) or to the page cache, on the running
    /// backstore; transfers under way finish as they started. Safe at any time: the kernel
    /// writes dirty cached pages back before a direct read of them, and drops the cached
    /// pages a direct write covers. Returns whether transfers now go through O_DIRECT (not
    /// where the file system has no direct I/O).
    pub fn set_direct(&self, direct: bool) -> bool {
        self.use_direct.store(direct, Ordering::Relaxed);
        if direct && !self.has_direct && !self.memory_fs {
            tracing::warn!(path = %self.path.display(), "the file system has no direct I/O: serving through the page cache");
        }
        self.is_direct()
    }

    /// Whether the file lives on a memory file system (tmpfs, ramfs), whose transfers run
    /// synchronously in the caller instead of through the ring.
    pub fn is_memory_fs(&self) -> bool {
        self.memory_fs
    }

    /// Registers `pool`'s slabs with the ring as fixed buffers, so transfers on its buffers skip
    /// per-operation page pinning. At most one pool per backstore; the memory is pinned.
    pub fn register_pool(&self, pool: &Arc<BufPool>) -> Result<(), BackstoreError> {
        self.ring
            .register_pool(pool)
            .map_err(|source| BackstoreError::Open {
                path: self.path.clone(),
                source,
            })
    }

    pub fn counters(&self) -> FileCounters {
        let c = &self.counters;
        FileCounters {
            direct: c.direct.load(Ordering::Relaxed),
            buffered: c.buffered.load(Ordering::Relaxed),
            direct_fallbacks: c.direct_fallbacks.load(Ordering::Relaxed),
            short_transfers: c.short_transfers.load(Ordering::Relaxed),
            fixed: self.ring.fixed_ops(),
            inline: c.inline.load(Ordering::Relaxed),
            slow_inline_writes: c.slow_inline_writes.load(Ordering::Relaxed),
        }
    }

    /// Operations handed to the kernel and not yet completed, including those whose caller
    /// has gone away.
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.ring.in_flight()
    }

    /// [`Backstore::write_replacing`] on a memory file system.
    fn replace_pages(&self, offset: u64, data: &[u8]) -> Result<(), BackstoreError> {
        use std::os::unix::fs::FileExt;
        let file = &self.files[BUFFERED as usize];
        let err = |source| BackstoreError::Write {
            offset,
            len: data.len() as u64,
            source,
        };
        let end = offset + data.len() as u64;
        let start = offset / crate::PAGE * crate::PAGE;
        let stop = end.div_ceil(crate::PAGE) * crate::PAGE;
        let stop = stop.min(self.capacity().max(end));
        let mut pages = vec![0u8; (stop - start) as usize];
        let head = (offset - start) as usize;
        let tail = (end - start) as usize;
        // A file shorter than the capacity reads as zeroes past its end.
        let read_part = |buf: &mut [u8], mut at: u64| -> io::Result<()> {
            let mut done = 0;
            while done < buf.len() {
                match file.read_at(&mut buf[done..], at) {
                    Ok(0) => break,
                    Ok(n) => {
                        done += n;
                        at += n as u64;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        };
        read_part(&mut pages[..head], start).map_err(err)?;
        read_part(&mut pages[tail..], end).map_err(err)?;
        pages[head..tail].copy_from_slice(data);
        // SAFETY: fallocate takes no pointers; the descriptor is open.
        let r = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                start as libc::off_t,
                (stop - start) as libc::off_t,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            // ramfs cannot punch holes: the pages are written in place.
            if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(err(e));
            }
        }
        file.write_all_at(&pages, start).map_err(err)?;
        self.counters.inline.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn capacity(&self) -> u64 {
        self.num_blocks.load(Ordering::Acquire) * u64::from(self.block_size)
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), BackstoreError> {
        crate::check_range(offset, len, self.capacity())
    }

    fn direct_ok(&self, offset: u64, buf: &IoBuf, start: usize) -> bool {
        let len = (buf.len() - start) as u64;
        self.is_direct()
            && offset % self.dio_offset_align == 0
            && len % self.dio_offset_align == 0
            && (buf.as_ptr() as usize + start) % self.dio_mem_align == 0
    }

    /// Reads or writes all of `buf`, resubmitting after short transfers and transient errors.
    async fn transfer(&self, write: bool, offset: u64, mut buf: IoBuf, fua: bool) -> BufResult<()> {
        let len = buf.len();
        if write && self.read_only {
            return (Err(BackstoreError::ReadOnly { op: "write" }), buf);
        }
        if let Err(e) = self.check_range(offset, len as u64) {
            return (Err(e), buf);
        }
        let fail = |source: io::Error| {
            let (offset, len) = (offset, len as u64);
            if write {
                BackstoreError::Write {
                    offset,
                    len,
                    source,
                }
            } else {
                BackstoreError::Read {
                    offset,
                    len,
                    source,
                }
            }
        };
        let rw_flags = if write && (fua || self.write_through.load(Ordering::Relaxed)) {
            libc::RWF_DSYNC
        } else {
            0
        };
        let mut done = match self.transfer_inline(write, offset, &mut buf, rw_flags) {
            Ok(n) => n,
            Err(e) => return (Err(fail(e)), buf),
        };
        if done == len && len > 0 {
            // Finished without waiting: count it against the task's scheduling budget, so a
            // caller looping over inline transfers still yields to other tasks now and then.
            tokio::task::coop::consume_budget().await;
        }
        let mut retries = 0;
        let mut direct_refused = false;
        while done < len {
            let at = offset + done as u64;
            let direct = !direct_refused && self.direct_ok(at, &buf, done);
            let file = if direct { DIRECT } else { BUFFERED };
            let counter = if direct {
                &self.counters.direct
            } else {
                &self.counters.buffered
            };
            counter.fetch_add(1, Ordering::Relaxed);
            let op = if write {
                Op::Write {
                    file,
                    offset: at,
                    buf,
                    start: done,
                    rw_flags,
                }
            } else {
                Op::Read {
                    file,
                    offset: at,
                    buf,
                    start: done,
                }
            };
            let Completed { result, buf: back } = self.ring.run(op).await;
            buf = match back {
                Some(b) => b,
                None => {
                    // Only if the driver lost track of the operation; its buffer stays with it.
                    return (
                        Err(fail(io::Error::other("io_uring operation lost"))),
                        IoBuf::zeroed(len),
                    );
                }
            };
            match result {
                Ok(0) if !write => {
                    // Past the end of a file shorter than the capacity: a sparse tail.
                    buf[done..].fill(0);
                    done = len;
                }
                Ok(0) => return (Err(fail(io::ErrorKind::WriteZero.into())), buf),
                Ok(n) => {
                    done += n;
                    if done < len {
                        self.counters
                            .short_transfers
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(e)
                    if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN))
                        && retries < RETRIES =>
                {
                    retries += 1;
                    tokio::task::yield_now().await;
                }
                Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    direct_refused = true;
                    self.counters
                        .direct_fallbacks
                        .fetch_add(1, Ordering::Relaxed);
                    if !self.warned_fallback.swap(true, Ordering::Relaxed) {
                        tracing::warn!(path = %self.path.display(), offset = at, "O_DIRECT transfer refused; repeating it buffered");
                    }
                }
                Err(e) => return (Err(fail(e)), buf),
            }
        }
        (Ok(()), buf)
    }

    /// The part of a transfer that completes without waiting, done synchronously: all of it
    /// on a memory file system, a page-cache hit (`RWF_NOWAIT`) on the buffered descriptor
    /// elsewhere. Returns the bytes done; the ring does the rest. Errors come back only for
    /// memory file systems, where no ring attempt follows.
    fn transfer_inline(
        &self,
        write: bool,
        offset: u64,
        buf: &mut IoBuf,
        rw_flags: i32,
    ) -> io::Result<usize> {
        let file = &self.files[BUFFERED as usize];
        let len = buf.len();
        if self.memory_fs {
            let mut done = 0usize;
            let mut retries = 0;
            while done < len {
                let at = offset + done as u64;
                let r = if write {
                    sys::pwrite_flags(file, &buf[done..], at, rw_flags)
                } else {
                    sys::pread_flags(file, &mut buf[done..], at, 0)
                };
                match r {
                    Ok(0) if !write => {
                        // Past the end of a file shorter than the capacity: a sparse tail.
                        buf[done..].fill(0);
                        done = len;
                    }
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => {
                        done += n;
                        if done < len {
                            self.counters
                                .short_transfers
                                .fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) && retries < RETRIES => {
                        retries += 1
                    }
                    Err(e) => return Err(e),
                }
            }
            self.counters.inline.fetch_add(1, Ordering::Relaxed);
            return Ok(len);
        }
        let nowait = if write {
            &self.nowait_writes
        } else {
            &self.nowait_reads
        };
        if write
            && rw_flags == 0
            && len > 0
            && len <= INLINE_WRITE_MAX
            && !nowait.load(Ordering::Relaxed)
            && !self.direct_ok(offset, buf, 0)
        {
            return Ok(self.write_inline(file, offset, buf));
        }
        if len == 0
            || !nowait.load(Ordering::Relaxed)
            || (write && rw_flags != 0)
            || self.direct_ok(offset, buf, 0)
        {
            return Ok(0);
        }
        let r = if write {
            sys::pwrite_flags(file, &buf[..], offset, libc::RWF_NOWAIT)
        } else {
            sys::pread_flags(file, &mut buf[..], offset, libc::RWF_NOWAIT)
        };
        match r {
            Ok(0) if !write => {
                // At or past the end of the file: a sparse tail.
                buf.fill(0);
                self.counters.inline.fetch_add(1, Ordering::Relaxed);
                Ok(len)
            }
            Ok(n) => {
                if n > 0 {
                    self.counters.inline.fetch_add(1, Ordering::Relaxed);
                }
                if n < len {
                    self.counters
                        .short_transfers
                        .fetch_add(1, Ordering::Relaxed);
                }
                Ok(n)
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)) => {
                // The file system cannot do this without blocking; stop asking.
                nowait.store(false, Ordering::Relaxed);
                Ok(0)
            }
            // EAGAIN (not cached, or a lock is busy) and real errors: the ring takes over and
            // reports what persists.
            Err(_) => Ok(0),
        }
    }

    /// A buffered write the file system cannot do without possibly blocking, done here unless
    /// a recent one was slow. Returns the bytes written; errors are left to the ring, which
    /// repeats the write and reports what persists.
    fn write_inline(&self, file: &File, offset: u64, buf: &IoBuf) -> usize {
        let since_open = |t: std::time::Instant| t.duration_since(self.opened).as_nanos() as u64;
        let start = std::time::Instant::now();
        if since_open(start) < self.inline_writes_after.load(Ordering::Relaxed) {
            return 0;
        }
        let r = sys::pwrite_flags(file, &buf[..], offset, 0);
        let took = start.elapsed();
        if took > SLOW_INLINE_WRITE {
            self.inline_writes_after.store(
                since_open(start + took + INLINE_WRITE_BACKOFF),
                Ordering::Relaxed,
            );
            self.counters
                .slow_inline_writes
                .fetch_add(1, Ordering::Relaxed);
        }
        match r {
            Ok(n) if n > 0 => {
                self.counters.inline.fetch_add(1, Ordering::Relaxed);
                if n < buf.len() {
                    self.counters
                        .short_transfers
                        .fetch_add(1, Ordering::Relaxed);
                }
                n
            }
            _ => 0,
        }
    }

    fn file_lba_status(&self, offset: u64, end: u64) -> io::Result<(bool, u64)> {
        let bs = u64::from(self.block_size);
        let file = &self.files[BUFFERED as usize];
        let data = sys::seek_data(file, offset)?;
        match data {
            Some(data) if data < offset + bs => {
                let hole = sys::seek_hole(file, data)?;
                let run_end = hole.div_ceil(bs) * bs;
                Ok((true, run_end.max(offset + bs).min(end) - offset))
            }
            Some(data) => Ok((false, (data / bs * bs).min(end) - offset)),
            None => Ok((false, end - offset)),
        }
    }
}

#[async_trait]
impl Backstore for FileBackstore {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            block_size: self.block_size,
            num_blocks: self.num_blocks.load(Ordering::Acquire),
            read_only: self.read_only,
            thin: self.thin,
            write_cache: !self.write_through.load(Ordering::Relaxed),
        }
    }

    /// Turning the cache off makes every later write RWF_DSYNC and then flushes what earlier
    /// writes left in the page cache, so that nothing acknowledged stays volatile.
    async fn set_write_cache(&self, on: bool) -> Result<(), BackstoreError> {
        let was_on = !self.write_through.swap(!on, Ordering::AcqRel);
        if was_on && !on {
            self.flush().await?;
        }
        Ok(())
    }

    fn set_direct(&self, direct: bool) -> bool {
        FileBackstore::set_direct(self, direct)
    }

    fn is_direct(&self) -> bool {
        FileBackstore::is_direct(self)
    }

    async fn read(&self, offset: u64, buf: IoBuf) -> BufResult<()> {
        self.transfer(false, offset, buf, false).await
    }

    async fn write(&self, offset: u64, buf: IoBuf, fua: bool) -> BufResult<()> {
        self.transfer(true, offset, buf, fua).await
    }

    async fn flush(&self) -> Result<(), BackstoreError> {
        if self.memory_fs {
            // Memory file systems have nothing to write back: fdatasync returns at once.
            return self.files[BUFFERED as usize]
                .sync_data()
                .map_err(|source| BackstoreError::Flush { source });
        }
        let mut retries = 0;
        loop {
            let done = self.ring.run(Op::Fdatasync { file: BUFFERED }).await;
            match done.result {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) && retries < RETRIES => {
                    retries += 1
                }
                Err(source) => return Err(BackstoreError::Flush { source }),
            }
        }
    }

    async fn unmap(&self, offset: u64, len: u64) -> Result<(), BackstoreError> {
        if self.read_only {
            return Err(BackstoreError::ReadOnly { op: "unmap" });
        }
        self.check_range(offset, len)?;
        let fail = |source| BackstoreError::Unmap {
            offset,
            len,
            source,
        };
        if !self.thin {
            return Err(fail(io::Error::from_raw_os_error(libc::EOPNOTSUPP)));
        }
        if len == 0 {
            return Ok(());
        }
        if self.block_device {
            let file = Arc::clone(&self.files[BUFFERED as usize]);
            return match tokio::task::spawn_blocking(move || sys::bdev_discard(&file, offset, len))
                .await
            {
                Ok(r) => r.map_err(fail),
                Err(e) => Err(fail(io::Error::other(e))),
            };
        }
        let op = Op::Fallocate {
            file: BUFFERED,
            offset,
            len,
            mode: libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        };
        self.ring.run(op).await.result.map(drop).map_err(fail)
    }

    async fn lba_status(&self, offset: u64, len: u64) -> Result<(bool, u64), BackstoreError> {
        self.check_range(offset, len)?;
        let end = offset + len;
        if self.block_device || len == 0 {
            return Ok((true, len));
        }
        // SEEK_DATA/SEEK_HOLE only read extent metadata; cheap enough to run inline.
        self.file_lba_status(offset, end)
            .map_err(|source| BackstoreError::LbaStatus { offset, source })
    }

    async fn resize(&self, num_blocks: u64) -> Result<(), BackstoreError> {
        if self.read_only {
            return Err(BackstoreError::ReadOnly { op: "resize" });
        }
        let fail = |source| BackstoreError::Resize { num_blocks, source };
        if self.block_device {
            return Err(fail(io::Error::from_raw_os_error(libc::EOPNOTSUPP)));
        }
        let size = num_blocks
            .checked_mul(u64::from(self.block_size))
            .ok_or_else(|| fail(io::Error::from_raw_os_error(libc::EFBIG)))?;
        let file = Arc::clone(&self.files[BUFFERED as usize]);
        match tokio::task::spawn_blocking(move || file.set_len(size)).await {
            Ok(r) => r.map_err(fail)?,
            Err(e) => return Err(fail(io::Error::other(e))),
        }
        self.num_blocks.store(num_blocks, Ordering::Release);
        Ok(())
    }

    /// The buffered descriptor, on a memory file system only: there the data is in the page
    /// cache already (sending it costs no disk read that could fail after the Data-In header
    /// went out), and [`Backstore::write_replacing`] keeps its promise by replacing pages.
    /// On other file systems reads keep going through io_uring (O_DIRECT where aligned), so a
    /// medium error is still answered with sense data and the page cache is not filled
    /// twice.
    fn file_range(&self) -> Option<(RawFd, u64)> {
        self.memory_fs
            .then(|| (self.files[BUFFERED as usize].as_raw_fd(), 0))
    }

    /// On a memory file system: the whole pages around the range are read, the range's
    /// pages are punched out of the file (a socket holding them keeps the old ones) and
    /// written anew. Elsewhere a direct write, which drops the cached pages.
    async fn write_replacing(&self, offset: u64, buf: IoBuf, fua: bool) -> BufResult<()> {
        if !self.memory_fs || self.read_only {
            return self.write(offset, buf, fua).await;
        }
        if let Err(e) = self.check_range(offset, buf.len() as u64) {
            return (Err(e), buf);
        }
        let r = self.replace_pages(offset, buf.as_slice());
        (r, buf)
    }
}

impl std::fmt::Debug for FileBackstore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileBackstore")
            .field("path", &self.path)
            .field("block_device", &self.block_device)
            .field("direct", &self.is_direct())
            .field("info", &self.info())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::skip_or_fail;
    use std::future::Future;
    use std::process::Command;
    use std::task::{Context, Waker};

    fn opts() -> FileOptions {
        FileOptions {
            size: Some(8 << 20),
            create: true,
            ..FileOptions::default()
        }
    }

    /// A scratch directory on tmpfs, if the machine has one at /dev/shm; `None` after
    /// [`skip_or_fail`] (the test then returns).
    fn tmpfs_dir() -> Option<tempfile::TempDir> {
        let probe = || -> std::io::Result<Option<tempfile::TempDir>> {
            let dir = tempfile::tempdir_in("/dev/shm")?;
            let probe = File::create(dir.path().join("probe"))?;
            Ok(sys::is_memory_fs(&probe)?.then_some(dir))
        };
        match probe() {
            Ok(Some(dir)) => Some(dir),
            Ok(None) => {
                skip_or_fail("/dev/shm is not a tmpfs");
                None
            }
            Err(e) => {
                skip_or_fail(format!("no tmpfs at /dev/shm: {e}"));
                None
            }
        }
    }

    /// Bytes of the file spliced into a pipe (the pipe holds references to the cached
    /// pages, as a socket does after `sendfile`) keep their contents across
    /// `write_replacing`, which changes the file itself.
    #[tokio::test]
    async fn write_replacing_leaves_spliced_pages_alone() {
        let Some(dir) = tmpfs_dir() else {
            return;
        };
        let bs = FileBackstore::open(dir.path().join("d"), opts()).unwrap();
        let old = vec![0x11u8; 3 * 4096];
        let (r, _) = bs.write(0, IoBuf::from_slice(&old), false).await;
        r.unwrap();
        let (fd, base) = bs.file_range().unwrap();
        let mut p = [0i32; 2];
        // SAFETY: `p` has room for the two descriptors pipe writes.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        let mut off = base as libc::loff_t;
        // SAFETY: `fd` is the backstore's open descriptor, `p[1]` the pipe's write end, `off`
        // a valid local.
        let n = unsafe { libc::splice(fd, &mut off, p[1], std::ptr::null_mut(), old.len(), 0) };
        assert_eq!(n, old.len() as isize);
        // Blocks 3..21: part of page 0, all of page 1, part of page 2.
        let new = vec![0x22u8; 18 * 512];
        let (r, _) = bs
            .write_replacing(3 * 512, IoBuf::from_slice(&new), false)
            .await;
        r.unwrap();
        let mut piped = vec![0u8; old.len()];
        // SAFETY: `piped` is writable for its length; `p[0]` is the pipe's read end.
        let n = unsafe { libc::read(p[0], piped.as_mut_ptr().cast(), piped.len()) };
        assert_eq!(n, piped.len() as isize);
        assert!(piped == old, "bytes already spliced changed");
        let (r, now) = bs.read(0, IoBuf::zeroed(old.len())).await;
        r.unwrap();
        let mut want = old.clone();
        want[3 * 512..21 * 512].fill(0x22);
        assert!(
            now[..] == want[..],
            "the file has the new blocks and keeps the others"
        );
        // SAFETY: both descriptors are open and closed once.
        unsafe {
            libc::close(p[0]);
            libc::close(p[1]);
        }
    }

    #[tokio::test]
    async fn memory_file_systems_transfer_inline_without_o_direct() {
        let Some(dir) = tmpfs_dir() else {
            return;
        };
        let path = dir.path().join("d");
        let bs = FileBackstore::open(&path, opts()).unwrap();
        assert!(bs.is_memory_fs());
        assert!(!bs.is_direct(), "tmpfs only emulates O_DIRECT");
        for (i, (offset, len)) in [(0u64, 512usize), (4096, 4096), (8192 + 512, 65536 + 512)]
            .into_iter()
            .enumerate()
        {
            let data: Vec<u8> = (0..len).map(|b| (b * 7 + i) as u8).collect();
            let (r, _) = bs.write(offset, IoBuf::from_slice(&data), i == 1).await;
            r.unwrap();
            let (r, back) = bs.read(offset, IoBuf::zeroed(len)).await;
            r.unwrap();
            assert!(back[..] == data[..], "offset {offset} len {len}");
        }
        bs.flush().await.unwrap();
        // Past the end of a file shorter than the capacity: zeroes, as through the ring.
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(6000)
            .unwrap();
        let (r, back) = bs.read(4096, IoBuf::from_slice(&[0xa5; 8192])).await;
        r.unwrap();
        assert!(back[6000 - 4096..].iter().all(|&b| b == 0));
        let c = bs.counters();
        assert_eq!(
            (c.direct, c.buffered),
            (0, 0),
            "the ring was not used: {c:?}"
        );
        assert_eq!(c.inline, 7, "{c:?}");
        assert!(c.short_transfers >= 1, "{c:?}");
    }

    #[tokio::test]
    async fn page_cache_hits_are_read_without_the_ring() {
        let dir = tempfile::tempdir().unwrap();
        let bs = FileBackstore::open(
            dir.path().join("d"),
            FileOptions {
                direct: false,
                ..opts()
            },
        )
        .unwrap();
        let data: Vec<u8> = (0..65536u32).map(|b| (b % 251) as u8).collect();
        let (r, _) = bs.write(4096, IoBuf::from_slice(&data), false).await;
        r.unwrap();
        for _ in 0..2 {
            let (r, back) = bs.read(4096, IoBuf::zeroed(data.len())).await;
            r.unwrap();
            assert!(back[..] == data[..]);
        }
        let c = bs.counters();
        // Written through the page cache, so the reads hit it wherever RWF_NOWAIT works; a
        // file system without it leaves everything to the ring.
        if bs.nowait_reads.load(Ordering::Relaxed) {
            assert!(c.inline >= 2, "{c:?}");
        } else {
            assert!(c.buffered >= 3, "{c:?}");
        }
    }

    #[tokio::test]
    async fn buffered_writes_run_inline_until_one_is_slow() {
        let dir = tempfile::tempdir().unwrap();
        let bs = FileBackstore::open(
            dir.path().join("d"),
            FileOptions {
                direct: false,
                ..opts()
            },
        )
        .unwrap();
        let data: Vec<u8> = (0..4096u32).map(|b| (b % 251) as u8).collect();
        for i in 0..32u64 {
            let (r, _) = bs.write(i * 4096, IoBuf::from_slice(&data), false).await;
            r.unwrap();
        }
        let c = bs.counters();
        // Inline with RWF_NOWAIT where the file system has it, else by a plain write: either
        // way at most the first write (which finds out) goes to the ring.
        assert!(c.inline + c.slow_inline_writes >= 31, "{c:?}");
        assert!(c.buffered <= 1 + c.slow_inline_writes, "{c:?}");
        // FUA writes wait for the disk: always on the ring.
        let (r, _) = bs.write(0, IoBuf::from_slice(&data), true).await;
        r.unwrap();
        assert_eq!(bs.counters().buffered, c.buffered + 1);
        // After a slow one, writes go to the ring for a while.
        if !bs.nowait_writes.load(Ordering::Relaxed) {
            bs.inline_writes_after.store(u64::MAX, Ordering::Relaxed);
            let before = bs.counters();
            let (r, _) = bs.write(0, IoBuf::from_slice(&data), false).await;
            r.unwrap();
            let after = bs.counters();
            assert_eq!(
                (after.buffered, after.inline),
                (before.buffered + 1, before.inline)
            );
        }
        let (r, back) = bs.read(0, IoBuf::zeroed(4096 * 32)).await;
        r.unwrap();
        assert!(back.chunks(4096).all(|c| c == &data[..]));
    }

    #[tokio::test]
    async fn abandoned_operations_leave_the_ring_idle() {
        let dir = tempfile::tempdir().unwrap();
        let bs = FileBackstore::open(dir.path().join("d"), opts()).unwrap();
        let pool = BufPool::new(4 << 20);
        for i in 0..256u64 {
            let fut = bs.read((i % 64) * 65536, pool.get(65536).await);
            let mut fut = std::pin::pin!(fut);
            let _ = fut.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        }
        for _ in 0..10_000 {
            if bs.in_flight() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert_eq!(bs.in_flight(), 0);
        assert_eq!(pool.in_use_bytes(), 0);
    }

    #[tokio::test]
    async fn direct_einval_falls_back_to_buffered() {
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("backing.img");
        File::create(&backing).unwrap().set_len(8 << 20).unwrap();
        // A 4Kn loop device refuses 512-byte O_DIRECT transfers with EINVAL.
        let out = Command::new("losetup")
            .args(["--find", "--show", "--sector-size", "4096"])
            .arg(&backing)
            .output();
        let dev = match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
            other => {
                return skip_or_fail(format!(
                    "cannot set up a 4Kn loop device (needs root and losetup): {other:?}"
                ))
            }
        };
        struct Detach(String);
        impl Drop for Detach {
            fn drop(&mut self) {
                let _ = Command::new("losetup").args(["--detach", &self.0]).status();
            }
        }
        let _detach = Detach(dev.clone());
        let mut bs = FileBackstore::open(
            &dev,
            FileOptions {
                size: None,
                create: false,
                ..FileOptions::default()
            },
        )
        .unwrap();
        assert!(bs.is_direct());
        assert_eq!(bs.dio_offset_align, 4096);
        let data: Vec<u8> = (0..512u32).map(|i| (i * 7) as u8).collect();
        // Misaligned for the device: routed to the buffered descriptor up front.
        let (r, _) = bs.write(512, IoBuf::from_slice(&data), false).await;
        r.unwrap();
        assert_eq!(bs.counters().direct, 0);
        // Pretend the alignment were 512 so the kernel refuses the direct attempt.
        bs.dio_offset_align = 512;
        let (r, buf) = bs.read(512, IoBuf::zeroed(512)).await;
        r.unwrap();
        assert_eq!(&buf[..], &data[..]);
        let c = bs.counters();
        assert_eq!(c.direct, 1, "{c:?}");
        assert_eq!(c.direct_fallbacks, 1, "{c:?}");
        assert!(c.buffered >= 2, "{c:?}");
    }
}
