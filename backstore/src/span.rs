//! Bytes of a backstore's file that a fabric hands to the kernel (`sendfile(2)`) instead of
//! reading them into a buffer first.

use std::os::fd::RawFd;
use std::sync::Arc;

use crate::Backstore;

/// A range of a readable descriptor that stays open while the value lives.
pub trait FileSpan: Send + Sync + std::fmt::Debug {
    /// The readable descriptor.
    fn fd(&self) -> RawFd;
    /// File offset of the first byte.
    fn offset(&self) -> u64;
    /// Bytes in the range.
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `len` bytes of a backstore at `offset`, in the file it reads through the page cache
/// ([`Backstore::file_range`]); the backstore (and with it the descriptor) is kept alive.
/// A sender that sends fewer bytes than [`FileSpan::len`] must end its connection, never
/// report success.
pub struct FileSlice {
    _backstore: Arc<dyn Backstore>,
    fd: RawFd,
    offset: u64,
    len: u64,
}

impl FileSlice {
    /// The slice, when the backstore's data can be sent from its file and the range lies
    /// within the device.
    pub fn of(backstore: &Arc<dyn Backstore>, offset: u64, len: u64) -> Option<FileSlice> {
        let (fd, base) = backstore.file_range()?;
        let info = backstore.info();
        let capacity = u64::from(info.block_size) * info.num_blocks;
        crate::check_range(offset, len, capacity).ok()?;
        Some(FileSlice {
            _backstore: Arc::clone(backstore),
            fd,
            offset: base + offset,
            len,
        })
    }

    /// Shortens the slice to at most `len` bytes.
    pub fn truncate(&mut self, len: u64) {
        self.len = self.len.min(len);
    }
}

impl FileSpan for FileSlice {
    fn fd(&self) -> RawFd {
        self.fd
    }

    fn offset(&self) -> u64 {
        self.offset
    }

    fn len(&self) -> u64 {
        self.len
    }
}

impl std::fmt::Debug for FileSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSlice")
            .field("fd", &self.fd)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}
