//! Backstore errors and the kind the SCSI layer turns into sense data.

use std::io;
use std::path::PathBuf;

/// What went wrong, one variant per failing operation; [`BackstoreError::kind`] is what the
/// SCSI layer acts on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackstoreError {
    #[error("cannot open backstore {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("invalid backstore configuration: {0}")]
    Config(String),
    #[error("read of {len} bytes at offset {offset} failed")]
    Read {
        offset: u64,
        len: u64,
        #[source]
        source: io::Error,
    },
    #[error("write of {len} bytes at offset {offset} failed")]
    Write {
        offset: u64,
        len: u64,
        #[source]
        source: io::Error,
    },
    #[error("flush failed")]
    Flush {
        #[source]
        source: io::Error,
    },
    #[error("unmap of {len} bytes at offset {offset} failed")]
    Unmap {
        offset: u64,
        len: u64,
        #[source]
        source: io::Error,
    },
    #[error("allocation status at offset {offset} failed")]
    LbaStatus {
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error("resize to {num_blocks} blocks failed")]
    Resize {
        num_blocks: u64,
        #[source]
        source: io::Error,
    },
    #[error("{len} bytes at offset {offset} exceed the capacity of {capacity} bytes")]
    OutOfRange {
        offset: u64,
        len: u64,
        capacity: u64,
    },
    #[error("{op} refused: the backstore is read-only")]
    ReadOnly { op: &'static str },
    #[error("the backstore has no {op} of its own")]
    Unsupported { op: &'static str },
}

/// Error classes with distinct SCSI answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IoErrorKind {
    /// Unreadable or unwritable media: MEDIUM ERROR.
    Medium,
    /// The backing store ran out of space: SPACE ALLOCATION FAILED WRITE PROTECT.
    NoSpace,
    /// Writes are not allowed: DATA PROTECT / WRITE PROTECTED.
    ReadOnly,
    /// The operation is not supported by this backstore (e.g. no hole punching or discard).
    Unsupported,
    /// The range lies outside the device: LOGICAL BLOCK ADDRESS OUT OF RANGE.
    OutOfRange,
    /// The storage behind the backstore did not answer in time (a network file system, a
    /// Ceph cluster out of reach): NOT READY, so that a multipath initiator tries another
    /// path.
    NotReady,
    /// Anything else: HARDWARE ERROR.
    Other,
}

impl BackstoreError {
    pub fn kind(&self) -> IoErrorKind {
        match self {
            BackstoreError::OutOfRange { .. } => IoErrorKind::OutOfRange,
            BackstoreError::ReadOnly { .. } => IoErrorKind::ReadOnly,
            BackstoreError::Unsupported { .. } => IoErrorKind::Unsupported,
            BackstoreError::Config(_) => IoErrorKind::Other,
            BackstoreError::Open { source, .. }
            | BackstoreError::Read { source, .. }
            | BackstoreError::LbaStatus { source, .. } => errno_kind(source, false),
            BackstoreError::Write { source, .. }
            | BackstoreError::Flush { source }
            | BackstoreError::Unmap { source, .. }
            | BackstoreError::Resize { source, .. } => errno_kind(source, true),
        }
    }

    /// The underlying OS error, if there is one.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            BackstoreError::Open { source, .. }
            | BackstoreError::Read { source, .. }
            | BackstoreError::Write { source, .. }
            | BackstoreError::Flush { source }
            | BackstoreError::Unmap { source, .. }
            | BackstoreError::LbaStatus { source, .. }
            | BackstoreError::Resize { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Classifies an OS error; permission errors only mean "read-only" for operations that modify.
pub fn errno_kind(err: &io::Error, modifies: bool) -> IoErrorKind {
    match err.raw_os_error() {
        Some(libc::EIO | libc::EILSEQ | libc::EBADMSG) => IoErrorKind::Medium,
        Some(libc::ENOSPC | libc::EDQUOT) => IoErrorKind::NoSpace,
        Some(libc::EROFS) => IoErrorKind::ReadOnly,
        Some(libc::EPERM | libc::EACCES) if modifies => IoErrorKind::ReadOnly,
        Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::ENOSYS) => IoErrorKind::Unsupported,
        Some(libc::EFBIG | libc::ENXIO) => IoErrorKind::OutOfRange,
        // ESHUTDOWN: a Ceph client the cluster has blocklisted.
        Some(libc::ETIMEDOUT | libc::ENOTCONN | libc::ESHUTDOWN | libc::EHOSTUNREACH) => {
            IoErrorKind::NotReady
        }
        _ if err.kind() == io::ErrorKind::Unsupported => IoErrorKind::Unsupported,
        _ => IoErrorKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(errno: i32) -> io::Error {
        io::Error::from_raw_os_error(errno)
    }

    #[test]
    fn errno_classes() {
        let read = |e| {
            BackstoreError::Read {
                offset: 0,
                len: 512,
                source: os(e),
            }
            .kind()
        };
        let write = |e| {
            BackstoreError::Write {
                offset: 0,
                len: 512,
                source: os(e),
            }
            .kind()
        };
        assert_eq!(read(libc::EIO), IoErrorKind::Medium);
        assert_eq!(read(libc::EILSEQ), IoErrorKind::Medium);
        assert_eq!(write(libc::EIO), IoErrorKind::Medium);
        assert_eq!(write(libc::ENOSPC), IoErrorKind::NoSpace);
        assert_eq!(write(libc::EDQUOT), IoErrorKind::NoSpace);
        assert_eq!(write(libc::EROFS), IoErrorKind::ReadOnly);
        assert_eq!(write(libc::EPERM), IoErrorKind::ReadOnly);
        assert_eq!(write(libc::EACCES), IoErrorKind::ReadOnly);
        assert_eq!(read(libc::EACCES), IoErrorKind::Other);
        assert_eq!(write(libc::EINVAL), IoErrorKind::Other);
        let unmap = BackstoreError::Unmap {
            offset: 0,
            len: 4096,
            source: os(libc::EOPNOTSUPP),
        };
        assert_eq!(unmap.kind(), IoErrorKind::Unsupported);
        let range = BackstoreError::OutOfRange {
            offset: 1 << 20,
            len: 512,
            capacity: 1 << 20,
        };
        assert_eq!(range.kind(), IoErrorKind::OutOfRange);
        assert_eq!(
            BackstoreError::ReadOnly { op: "write" }.kind(),
            IoErrorKind::ReadOnly
        );
    }

    #[test]
    fn source_is_kept() {
        use std::error::Error;
        let err = BackstoreError::Flush {
            source: os(libc::EIO),
        };
        let source = err.source().unwrap().downcast_ref::<io::Error>().unwrap();
        assert_eq!(source.raw_os_error(), Some(libc::EIO));
        assert_eq!(err.io_error().unwrap().raw_os_error(), Some(libc::EIO));
        assert_eq!(err.to_string(), "flush failed");
    }
}
