//! Block backstores for rtgt.
//!
//! A [`Backstore`] moves whole logical blocks between a device and [`IoBuf`]s. Buffers are
//! passed by value and handed back with the result, so a buffer the kernel may still write
//! into is never reachable from safe code (the ownership model of the io_uring backend).
//! Buffers come from a [`BufPool`] whose memory is allocated in large aligned slabs that can
//! later be registered with io_uring (fixed buffers) and with the RDMA stack (memory regions).
//!
//! Backends: [`FileBackstore`] (regular files and block devices on one io_uring per backstore,
//! through the page cache or with O_DIRECT for aligned transfers; transfers that need no
//! waiting — on tmpfs, page-cache hits — run inline instead), [`RamBackstore`] (sparse memory) and [`NullBackstore`].

mod buf;
mod error;
mod file;
mod inline;
mod mem;
pub mod policy;
mod shared;
mod span;
mod sys;
#[cfg(test)]
mod test_support;
mod uring;

pub use buf::{BufPool, IoBuf, IO_BUF_ALIGN};
pub use error::{errno_kind, BackstoreError, IoErrorKind};
pub use file::{FileBackstore, FileCounters, FileOptions, DEFAULT_QUEUE_DEPTH};
pub use inline::{run_inline, Latch};
pub use mem::{NullBackstore, RamBackstore, RAM_CHUNK};
pub use policy::{BackstoreRoots, FileRequest, PolicyError};
pub use shared::{write_atomically, SharedFile, SharedState, Update};
pub use span::{FileSlice, FileSpan};

/// Page granularity of [`Backstore::write_replacing`].
pub const PAGE: u64 = 4096;

use std::os::fd::RawFd;

use async_trait::async_trait;

/// `OutOfRange` unless `len` bytes at `offset` lie within `capacity` bytes.
pub fn check_range(offset: u64, len: u64, capacity: u64) -> Result<(), BackstoreError> {
    match offset.checked_add(len) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(BackstoreError::OutOfRange {
            offset,
            len,
            capacity,
        }),
    }
}

/// What the SCSI layer needs to know about a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Logical block size in bytes (512 or 4096).
    pub block_size: u32,
    /// Number of logical blocks.
    pub num_blocks: u64,
    /// Writes are refused.
    pub read_only: bool,
    /// UNMAP / WRITE SAME with UNMAP deallocate blocks (thin provisioning).
    pub thin: bool,
    /// The device has a volatile write cache that `flush` empties.
    pub write_cache: bool,
}

/// Result of an operation that takes a buffer: the buffer always comes back.
pub type BufResult<T> = (Result<T, BackstoreError>, IoBuf);

/// A block device. Offsets and lengths are in bytes and multiples of the block size;
/// callers (the SCSI engine) check ranges against [`DeviceInfo`] before calling.
#[async_trait]
pub trait Backstore: Send + Sync + 'static {
    fn info(&self) -> DeviceInfo;
    /// Reads `buf.len()` bytes at `offset` into `buf`.
    async fn read(&self, offset: u64, buf: IoBuf) -> BufResult<()>;
    /// Writes `buf` at `offset`. With `fua` the data is on stable media when this returns.
    async fn write(&self, offset: u64, buf: IoBuf, fua: bool) -> BufResult<()>;
    /// Makes all completed writes durable (SYNCHRONIZE CACHE).
    async fn flush(&self) -> Result<(), BackstoreError>;
    /// Deallocates `len` bytes at `offset`; reads of the range then return zeroes.
    async fn unmap(&self, offset: u64, len: u64) -> Result<(), BackstoreError>;
    /// Whether the range is mapped (allocated); used by GET LBA STATUS.
    /// Returns (mapped, length in bytes of the run starting at `offset` with that state).
    async fn lba_status(&self, offset: u64, len: u64) -> Result<(bool, u64), BackstoreError>;
    /// Changes the capacity (live resize).
    async fn resize(&self, num_blocks: u64) -> Result<(), BackstoreError>;
    /// Like [`Backstore::write`], but pages of the file that [`Backstore::file_range`]
    /// readers may have handed to the kernel (and that a socket may still be sending) are
    /// replaced, not changed in place, so those readers keep seeing the old bytes. It may
    /// rewrite the rest of the [`PAGE`]-sized pages the range touches with their current
    /// contents: the caller makes sure nobody writes them meanwhile. Used by the atomic
    /// writes (COMPARE AND WRITE, WRITE ATOMIC, ORWRITE).
    async fn write_replacing(&self, offset: u64, buf: IoBuf, fua: bool) -> BufResult<()> {
        self.write(offset, buf, fua).await
    }
    /// A descriptor through which the device's bytes can be read with `sendfile(2)` or
    /// `splice(2)` (buffered, so it reads through the page cache), and the file offset of
    /// byte 0 of the device. The descriptor stays open as long as the backstore. `None` when
    /// the data does not live in a file (memory and null backstores).
    ///
    /// Completed writes are visible through it, O_DIRECT ones included (a direct write
    /// invalidates the cached pages it covers).
    fn file_range(&self) -> Option<(RawFd, u64)> {
        None
    }
    /// Switches the volatile write cache on a running backstore. Turning it off returns once
    /// every write completed before is durable; from then on each write is durable on
    /// completion. Memory and null backstores have nothing to make durable.
    async fn set_write_cache(&self, on: bool) -> Result<(), BackstoreError> {
        let _ = on;
        Ok(())
    }
    /// Switches transfers past the page cache (`true`, O_DIRECT) or through it, on a running
    /// backstore. Returns whether they now bypass it: never for memory and null backstores,
    /// nor on a file system without direct I/O.
    fn set_direct(&self, direct: bool) -> bool {
        let _ = direct;
        false
    }
    /// Whether transfers bypass the page cache now.
    fn is_direct(&self) -> bool {
        false
    }
    /// For a medium that several processes export and whose writes go under one lock (an
    /// RBD image's exclusive lock): whether this process holds it now. `None` for a backstore
    /// without such a lock.
    fn holds_write_lock(&self) -> Option<bool> {
        None
    }
    /// Whether the medium's write lock moves to whichever process writes (an RBD image's
    /// cooperative exclusive lock): then the processes exporting it keep one target port
    /// group active/optimized at a time, so that the lock stays with one of them.
    fn write_lock_follows_writes(&self) -> bool {
        false
    }
    /// The longest [`Backstore::compare_and_write`] in bytes (0: none) the device does as
    /// its own operation, atomic against every writer of the device, other processes
    /// exporting it included (gateways over one Ceph image). Longer ones the SCSI layer
    /// compares and writes under its own range lock.
    fn compare_and_write_limit(&self) -> u64 {
        0
    }
    /// COMPARE AND WRITE done by the device: `buf` holds the compare data, then as many bytes
    /// to write at `offset` if the medium equals them. `None` when written; otherwise the
    /// offset in the compare data of the first byte that differs, and nothing was written.
    async fn compare_and_write(
        &self,
        offset: u64,
        buf: IoBuf,
        fua: bool,
    ) -> BufResult<Option<u64>> {
        let _ = (offset, fua);
        (
            Err(BackstoreError::Unsupported {
                op: "compare and write",
            }),
            buf,
        )
    }
    /// Writes zeroes to `len` bytes at `offset` without the caller moving them (WRITE SAME
    /// of a zero block). A backstore without such an operation answers `Unsupported` and the
    /// caller writes zero blocks.
    async fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), BackstoreError> {
        let _ = (offset, len, fua);
        Err(BackstoreError::Unsupported { op: "write zeroes" })
    }
    /// Changes of capacity made outside this process (another gateway resized the image):
    /// the number of blocks, each time it changes. `None` where only [`Backstore::resize`]
    /// changes it.
    fn capacity_changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}
