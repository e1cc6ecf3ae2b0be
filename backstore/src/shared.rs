//! State that the processes exporting one logical unit keep together (the persistent
//! reservations of a LUN that several gateways export): a small blob that every process reads
//! again whenever another may have changed it, and that changes atomically against all of
//! them. [`SharedFile`] keeps it in a file they all reach; the rbd backstore keeps it in a
//! RADOS object beside the image.

use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

/// The result of an update function: new contents, or `None` to leave the state as it is.
pub type Update<'a> = dyn FnMut(&[u8]) -> Option<Vec<u8>> + Send + 'a;

#[async_trait]
pub trait SharedState: std::fmt::Debug + Send + Sync + 'static {
    /// Whether another process may have changed the state since this handle last read or
    /// wrote it. Asked before every command: cheap (no network round trip).
    fn maybe_changed(&self) -> io::Result<bool>;
    /// The current contents; empty when the state was never written.
    async fn read(&self) -> io::Result<Vec<u8>>;
    /// Replaces the contents with what `update` makes of the current ones, atomically
    /// against every other process; `update` may run more than once (another process changed
    /// the state first). Once this returns, every other process that holds the state
    /// knows that it changed (their next [`SharedState::maybe_changed`] says so).
    async fn update(&self, update: &mut Update<'_>) -> io::Result<()>;
    /// Where the state is, for messages.
    fn location(&self) -> String;
    /// For stores that announce changes: waits until another process announces one and
    /// returns `true`. That process's [`SharedState::update`] then waits (up to the store's
    /// timeout) until this one calls [`SharedState::acknowledge`], so what this process does
    /// about the change first (abort the commands of a preempted I_T nexus) is done before
    /// the other process's command completes. Stores that do not announce changes (they are
    /// found by [`SharedState::maybe_changed`] alone) return `false` at once.
    async fn next_change(&self) -> bool {
        false
    }
    /// Acknowledges the changes [`SharedState::next_change`] reported.
    fn acknowledge(&self) {}
}

/// What identifies one version of a state file: each write renames a new file into place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    len: u64,
}

/// The state in a file every process reaches: an update holds an exclusive `flock` on
/// `PATH.lock` while it reads the file and renames the new contents into place; a process
/// notices another's change by the file's stamp (inode, times, length): one `stat` per
/// command.
#[derive(Debug)]
pub struct SharedFile {
    path: PathBuf,
    /// The stamp of what this handle last read or wrote (`None`: no file then).
    seen: Mutex<Option<Option<Stamp>>>,
}

impl SharedFile {
    pub fn new(path: impl Into<PathBuf>) -> SharedFile {
        SharedFile {
            path: path.into(),
            seen: Mutex::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn stamp(&self) -> io::Result<Option<Stamp>> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(&self.path) {
            Ok(m) => Ok(Some(Stamp {
                ino: m.ino(),
                mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
                ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
                len: m.len(),
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn set_seen(&self, stamp: Option<Stamp>) {
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = Some(stamp);
    }

    /// Reads the file, stamped before reading: a change that lands in between is seen again.
    fn read_now(&self) -> io::Result<Vec<u8>> {
        let stamp = self.stamp()?;
        let data = match std::fs::read(&self.path) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        self.set_seen(stamp);
        Ok(data)
    }

    /// Holds the exclusive lock (`PATH.lock`, created when missing) until dropped; waits
    /// for another process holding it.
    fn lock(&self) -> io::Result<std::fs::File> {
        let mut name = self.path.as_os_str().to_os_string();
        name.push(".lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(name)?;
        // SAFETY: flock on a descriptor this function owns; the lock goes with the file.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(f)
    }
}

/// Writes `data` to `path` atomically: a temporary file beside it, fsync, rename, fsync of the
/// directory.
pub fn write_atomically(path: &Path, data: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[async_trait]
impl SharedState for SharedFile {
    fn maybe_changed(&self) -> io::Result<bool> {
        let now = self.stamp()?;
        let seen = *self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(seen != Some(now))
    }

    async fn read(&self) -> io::Result<Vec<u8>> {
        // Small local reads: done in place, as the state is read only after a change.
        self.read_now()
    }

    async fn update(&self, update: &mut Update<'_>) -> io::Result<()> {
        // PERSISTENT RESERVE OUT is rare and the lock is held for a local read and write.
        let _held = self.lock()?;
        let current = self.read_now()?;
        if let Some(new) = update(&current) {
            write_atomically(&self.path, &new)?;
            self.set_seen(self.stamp()?);
        }
        Ok(())
    }

    fn location(&self) -> String {
        self.path.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn two_handles_see_each_others_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let (a, b) = (SharedFile::new(&path), SharedFile::new(&path));
        // No file: nothing to read, and nothing changes until someone writes.
        assert!(a.maybe_changed().unwrap());
        assert_eq!(a.read().await.unwrap(), b"");
        assert!(!a.maybe_changed().unwrap());
        b.update(&mut |cur| {
            assert_eq!(cur, b"");
            Some(b"one".to_vec())
        })
        .await
        .unwrap();
        assert!(!b.maybe_changed().unwrap(), "its own write is seen");
        assert!(a.maybe_changed().unwrap());
        assert_eq!(a.read().await.unwrap(), b"one");
        assert!(!a.maybe_changed().unwrap());
        // An update sees the current contents; declining leaves the file alone.
        a.update(&mut |cur| {
            assert_eq!(cur, b"one");
            None
        })
        .await
        .unwrap();
        assert!(!b.maybe_changed().unwrap());
        a.update(&mut |cur| Some([cur, b"+two"].concat()))
            .await
            .unwrap();
        assert!(b.maybe_changed().unwrap());
        assert_eq!(b.read().await.unwrap(), b"one+two");
        assert!(path.with_file_name("state.lock").exists());
        // Unreadable: the error, not stale contents.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(b.read().await.is_err());
    }
}
