//! What a backstore may open: the backstore path policy.
//!
//! A file backstore lives under a backstore root: the state directory (always one, and the
//! directory relative paths are in) or a configured root. Its path is resolved with
//! `openat2(2)` beneath an O_PATH descriptor of that root with `RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS`, so neither `..` nor a symlink leads out of it (symlinks that stay
//! inside are followed). The lookup opens an O_PATH descriptor, which has no side effects on
//! what it names (a FIFO, a device); only once it is known to be a regular file is the same
//! inode opened for I/O, through `/proc/self/fd`. A missing file is created with
//! `O_CREAT | O_EXCL` and mode 0600; an existing one is never changed: its length must equal
//! the size asked for, if any.
//!
//! A block backstore must be a block device that is neither mounted nor held by another
//! device (device mapper, MD RAID), and is opened with O_EXCL (read-only too: a read-only
//! export of a mounted file system would still show its files). Block device paths are not
//! confined to the roots.

use std::ffi::CString;
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::sys;

/// Why the policy refused a backstore path, or why it could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// An absolute file path under none of the roots.
    #[error(
        "{} is outside every backstore root ({}): add a directory to policy.backstore_roots in the configuration file",
        path.display(),
        roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    OutsideRoots { path: PathBuf, roots: Vec<PathBuf> },
    /// A `..` or a symlink on the way leads out of the root. Absolute symlinks count as
    /// leading out even when they point inside: a symlink within a root is relative.
    #[error(
        "{} leads out of the backstore root {} (a `..`, or a symlink that points out of it or is absolute)",
        path.display(),
        root.display()
    )]
    EscapesRoot { path: PathBuf, root: PathBuf },
    /// A file backstore on something other than a regular file.
    #[error("{} is not a regular file ({kind}): a file backstore needs a regular file", path.display())]
    NotRegularFile { path: PathBuf, kind: &'static str },
    /// A block backstore on something other than a block device.
    #[error("{} is not a block device ({kind})", path.display())]
    NotBlockDevice { path: PathBuf, kind: &'static str },
    /// The block device, or one of its partitions, carries a mounted file system.
    #[error("{} is mounted at {mount_point}", path.display())]
    Mounted { path: PathBuf, mount_point: String },
    /// Another block device is built on it (device mapper, MD RAID, bcache).
    #[error("{} is held by {holders}", path.display())]
    Held { path: PathBuf, holders: String },
    /// Someone else has the block device open exclusively.
    #[error("{} is in use (exclusive open refused: EBUSY)", path.display())]
    InUse { path: PathBuf },
    /// The file exists with another length than the size asked for.
    #[error(
        "{} exists with {len} bytes, not {size}; creating a backstore does not change an existing file: leave size out, or resize the backstore after creating it",
        path.display()
    )]
    ExistingSize { path: PathBuf, len: u64, size: u64 },
    /// The file does not exist and no size says how large to create it.
    #[error("{} does not exist: give a size to create it", path.display())]
    Missing { path: PathBuf },
    /// Any other failure of the system calls.
    #[error("cannot open {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl PolicyError {
    /// Whether a rule of the policy refused it (rather than the file system).
    pub fn is_forbidden(&self) -> bool {
        !matches!(
            self,
            PolicyError::ExistingSize { .. } | PolicyError::Missing { .. } | PolicyError::Io { .. }
        )
    }

    /// Whether the size asked for is what is wrong.
    pub fn is_size(&self) -> bool {
        matches!(self, PolicyError::ExistingSize { .. })
    }
}

/// How to open a file backstore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileRequest {
    /// The size to create a missing file with; an existing file must have it.
    pub size: Option<u64>,
    pub read_only: bool,
}

/// A file or block device the policy allowed, open for I/O.
#[derive(Debug)]
pub struct Opened {
    pub file: File,
    /// Whether the file was created by this open.
    pub created: bool,
    /// Major and minor number of a block device.
    pub device: Option<(u32, u32)>,
}

/// The directories file backstores may live in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackstoreRoots {
    /// The state directory first.
    roots: Vec<PathBuf>,
}

/// Where Ceph keeps client configuration and keyrings; readable by rbd backstores besides
/// the roots.
pub const CEPH_DIR: &str = "/etc/ceph";

/// `openat2` resolution: nothing may lead out of the directory, and no magic link of
/// `/proc` can be followed (they jump anywhere).
const RESOLVE: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;

impl BackstoreRoots {
    /// The state directory and `extra` roots (absolute, as the configuration validates them).
    /// A relative state directory is taken relative to the current directory.
    pub fn new(state_dir: &Path, extra: &[PathBuf]) -> BackstoreRoots {
        let state_dir = if state_dir.is_relative() {
            std::env::current_dir()
                .map(|d| d.join(state_dir))
                .unwrap_or_else(|_| state_dir.to_path_buf())
        } else {
            state_dir.to_path_buf()
        };
        let mut roots = vec![state_dir];
        for r in extra {
            if !roots.contains(r) {
                roots.push(r.clone());
            }
        }
        BackstoreRoots { roots }
    }

    /// Every root, the state directory first.
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    pub fn state_dir(&self) -> &Path {
        &self.roots[0]
    }

    /// The roots rtgtd cannot create files in: missing, or not writable (a read-only file
    /// system, as a service manager's sandbox makes of paths it was not told about).
    pub fn unwritable(&self) -> Vec<(PathBuf, io::Error)> {
        self.roots
            .iter()
            .filter_map(|r| {
                let c = CString::new(r.as_os_str().as_bytes()).ok()?;
                // SAFETY: `c` is a valid C string that outlives the call.
                let rc = unsafe { libc::access(c.as_ptr(), libc::W_OK) };
                (rc != 0).then(|| (r.clone(), io::Error::last_os_error()))
            })
            .collect()
    }

    /// The roots an absolute path may be resolved in, with the rest of the path: the
    /// innermost root first.
    fn candidates(&self, path: &Path) -> Result<Vec<(&Path, PathBuf)>, PolicyError> {
        if path.is_relative() {
            return Ok(vec![(self.state_dir(), path.to_path_buf())]);
        }
        let mut found: Vec<(&Path, PathBuf)> = self
            .roots
            .iter()
            .filter_map(|r| {
                let rest = path.strip_prefix(r).ok()?;
                let rest = if rest.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    rest.to_path_buf()
                };
                Some((r.as_path(), rest))
            })
            .collect();
        if found.is_empty() {
            return Err(PolicyError::OutsideRoots {
                path: path.to_path_buf(),
                roots: self.roots.clone(),
            });
        }
        found.sort_by_key(|(r, _)| std::cmp::Reverse(r.components().count()));
        Ok(found)
    }

    /// Opens (or creates) the regular file of a file backstore at `path`: relative to the
    /// state directory, or absolute under one of the roots.
    pub fn open_file(&self, path: &Path, req: FileRequest) -> Result<Opened, PolicyError> {
        let candidates = self.candidates(path)?;
        let last = candidates.len() - 1;
        for (i, (root, rest)) in candidates.into_iter().enumerate() {
            match open_beneath(root, &rest, path, req) {
                Err(PolicyError::EscapesRoot { .. }) if i < last => continue,
                r => return r,
            }
        }
        unreachable!("the last candidate returns")
    }

    /// `path` as configured: relative to the state directory, or absolute.
    fn full_path(&self, path: &Path) -> PathBuf {
        if path.is_relative() {
            self.state_dir().join(path)
        } else {
            path.to_path_buf()
        }
    }

    /// The path of a file kept beside a backstore (the reservation state that several rtgtd
    /// share): relative to the state directory, or absolute under one of the roots, with its
    /// directory inside that root once symlinks are resolved.
    pub fn side_file(&self, path: &Path) -> Result<PathBuf, PolicyError> {
        let candidates = self.candidates(path)?;
        let full = self.full_path(path);
        let io_err = |source| PolicyError::Io {
            path: path.to_path_buf(),
            source,
        };
        let (Some(dir), Some(name)) = (full.parent(), full.file_name()) else {
            return Err(io_err(io::Error::from(io::ErrorKind::InvalidInput)));
        };
        let real = std::fs::canonicalize(dir).map_err(io_err)?;
        for (root, _) in &candidates {
            if real.starts_with(std::fs::canonicalize(root).map_err(io_err)?) {
                return Ok(real.join(name));
            }
        }
        Err(PolicyError::EscapesRoot {
            path: path.to_path_buf(),
            root: candidates[0].0.to_path_buf(),
        })
    }

    /// The real path of a Ceph client file a backstore names (the cluster's configuration, a
    /// keyring), for the Ceph libraries to read: relative to the state directory, or
    /// absolute; once symlinks are resolved it must be a regular file under `/etc/ceph` or
    /// under one of the roots.
    pub fn ceph_file(&self, path: &Path) -> Result<PathBuf, PolicyError> {
        let io_err = |source| PolicyError::Io {
            path: path.to_path_buf(),
            source,
        };
        let real = std::fs::canonicalize(self.full_path(path)).map_err(io_err)?;
        let mut allowed = vec![PathBuf::from(CEPH_DIR)];
        allowed.extend(self.roots.iter().cloned());
        let inside = allowed
            .iter()
            .any(|dir| std::fs::canonicalize(dir).is_ok_and(|d| real.starts_with(d)));
        if !inside {
            return Err(PolicyError::OutsideRoots {
                path: path.to_path_buf(),
                roots: allowed,
            });
        }
        let meta = std::fs::metadata(&real).map_err(io_err)?;
        if !meta.is_file() {
            return Err(PolicyError::NotRegularFile {
                path: path.to_path_buf(),
                kind: kind_of(&meta),
            });
        }
        Ok(real)
    }

    /// Opens the block device of a block backstore — exclusively unless `shared` (other
    /// processes export it too) — after checking that it is a block device, not mounted and
    /// not held. A relative path is relative to the state directory.
    pub fn open_block(
        &self,
        path: &Path,
        read_only: bool,
        shared: bool,
    ) -> Result<Opened, PolicyError> {
        let full = self.full_path(path);
        let io_err = |source| PolicyError::Io {
            path: path.to_path_buf(),
            source,
        };
        let handle = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(&full)
            .map_err(io_err)?;
        let meta = handle.metadata().map_err(io_err)?;
        if !meta.file_type().is_block_device() {
            return Err(PolicyError::NotBlockDevice {
                path: path.to_path_buf(),
                kind: kind_of(&meta),
            });
        }
        let dev = dev_numbers(meta.rdev());
        let mut devices = vec![dev];
        devices.extend(partitions(dev));
        if let Some(mount_point) = mounted(&devices) {
            return Err(PolicyError::Mounted {
                path: path.to_path_buf(),
                mount_point,
            });
        }
        let holders = holders(&devices);
        if !holders.is_empty() {
            return Err(PolicyError::Held {
                path: path.to_path_buf(),
                holders: holders.join(", "),
            });
        }
        let excl = if shared { 0 } else { libc::O_EXCL };
        let file = sys::reopen(&handle, !read_only, excl).map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) {
                PolicyError::InUse {
                    path: path.to_path_buf(),
                }
            } else {
                io_err(e)
            }
        })?;
        Ok(Opened {
            file,
            created: false,
            device: Some(dev),
        })
    }
}

/// [`BackstoreRoots::open_file`] in one root; `shown` is the path as configured.
fn open_beneath(
    root: &Path,
    rest: &Path,
    shown: &Path,
    req: FileRequest,
) -> Result<Opened, PolicyError> {
    let io_err = |source| PolicyError::Io {
        path: shown.to_path_buf(),
        source,
    };
    let refuse = |e: io::Error| {
        if e.raw_os_error() == Some(libc::EXDEV) {
            PolicyError::EscapesRoot {
                path: shown.to_path_buf(),
                root: root.to_path_buf(),
            }
        } else {
            io_err(e)
        }
    };
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(root)
        .map_err(|source| PolicyError::Io {
            path: root.to_path_buf(),
            source,
        })?;
    let (handle, created) = match openat2(&dir, rest, libc::O_PATH, 0) {
        Ok(fd) => {
            let handle = File::from(fd);
            let meta = handle.metadata().map_err(io_err)?;
            if !meta.is_file() {
                return Err(PolicyError::NotRegularFile {
                    path: shown.to_path_buf(),
                    kind: kind_of(&meta),
                });
            }
            match req.size {
                Some(size) if size != meta.len() => {
                    return Err(PolicyError::ExistingSize {
                        path: shown.to_path_buf(),
                        len: meta.len(),
                        size,
                    })
                }
                _ => (handle, false),
            }
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => match req.size {
            None => {
                return Err(PolicyError::Missing {
                    path: shown.to_path_buf(),
                })
            }
            Some(_) if req.read_only => return Err(io_err(e)),
            Some(size) => {
                let fd = openat2(
                    &dir,
                    rest,
                    libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                    0o600,
                )
                .map_err(refuse)?;
                let file = File::from(fd);
                // Sparse: only the length is set. The file, its length and its name are on
                // stable storage before it serves a LUN: a power cut must not take away a
                // LUN whose writes were acknowledged as durable.
                if let Err(e) = file
                    .set_len(size)
                    .and_then(|()| file.sync_all())
                    .and_then(|()| sync_parent(&dir, rest))
                {
                    remove_created(&dir, rest, &file);
                    return Err(io_err(e));
                }
                (file, true)
            }
        },
        Err(e) => return Err(refuse(e)),
    };
    match sys::reopen(&handle, !req.read_only, 0) {
        Ok(file) => Ok(Opened {
            file,
            created,
            device: None,
        }),
        Err(e) => {
            if created {
                remove_created(&dir, rest, &handle);
            }
            Err(io_err(e))
        }
    }
}

/// fsync(2) of the directory holding `rest` (relative to `dir`), so that a new name in it is
/// durable.
fn sync_parent(dir: &File, rest: &Path) -> io::Result<()> {
    let parent = match rest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let fd = openat2(dir, parent, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    File::from(fd).sync_all()
}

/// Removes a file this open created and could not finish, when its name still refers to it.
fn remove_created(dir: &File, rest: &Path, created: &File) {
    let (Some(parent), Some(name)) = (rest.parent(), rest.file_name()) else {
        return;
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let Ok(parent) = openat2(dir, parent, libc::O_PATH | libc::O_DIRECTORY, 0) else {
        return;
    };
    let Ok(name) = CString::new(name.as_bytes()) else {
        return;
    };
    let Ok(meta) = created.metadata() else { return };
    // SAFETY: an all-zero stat is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is a valid C string and `st` a live local the call writes one struct to.
    let rc = unsafe {
        libc::fstatat(
            parent.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc == 0 && st.st_dev == meta.dev() && st.st_ino == meta.ino() {
        // SAFETY: `name` is a valid C string; unlinkat takes no other pointers.
        unsafe { libc::unlinkat(parent.as_raw_fd(), name.as_ptr(), 0) };
    }
}

/// `openat2(dir, path, flags | O_CLOEXEC, mode)` with [`RESOLVE`].
fn openat2(dir: &impl AsRawFd, path: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: an all-zero open_how is a valid value of this plain C struct.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = u64::from(mode);
    how.resolve = RESOLVE;
    let mut attempts = 0;
    loop {
        // SAFETY: `c` is a valid C string and `how` a live open_how whose size is passed; the
        // kernel only reads both. The returned descriptor is owned by nobody else.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: a descriptor the kernel just returned, owned by nothing else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        let e = io::Error::last_os_error();
        // EAGAIN: a rename or mount raced with a RESOLVE_BENEATH lookup; try again.
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EAGAIN) if attempts < 8 => attempts += 1,
            _ => return Err(e),
        }
    }
}

fn kind_of(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symlink"
    } else {
        "of an unknown type"
    }
}

/// Major and minor number of a `dev_t` (the glibc encoding).
pub fn dev_numbers(rdev: u64) -> (u32, u32) {
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    (major as u32, minor as u32)
}

fn sysfs_dir((major, minor): (u32, u32)) -> PathBuf {
    PathBuf::from(format!("/sys/dev/block/{major}:{minor}"))
}

/// The partitions of a disk, from sysfs.
fn partitions(dev: (u32, u32)) -> Vec<(u32, u32)> {
    let Ok(entries) = std::fs::read_dir(sysfs_dir(dev)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.path().join("partition").exists())
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path().join("dev")).ok()?;
            let (ma, mi) = text.trim().split_once(':')?;
            Some((ma.parse().ok()?, mi.parse().ok()?))
        })
        .collect()
}

/// Where one of `devices` is mounted, from `/proc/self/mountinfo`.
fn mounted(devices: &[(u32, u32)]) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mount_point_of(&text, devices)
}

/// The first mount point in `mountinfo` text of a file system on one of `devices`.
fn mount_point_of(mountinfo: &str, devices: &[(u32, u32)]) -> Option<String> {
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split(' ');
        let dev = fields.nth(2)?;
        let mount_point = fields.nth(1)?;
        let (ma, mi) = dev.split_once(':')?;
        let dev = (ma.parse().ok()?, mi.parse().ok()?);
        devices.contains(&dev).then(|| unescape(mount_point))
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(v as u8);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The devices built on any of `devices` (sysfs `holders`).
fn holders(devices: &[(u32, u32)]) -> Vec<String> {
    let mut out = Vec::new();
    for d in devices {
        if let Ok(entries) = std::fs::read_dir(sysfs_dir(*d).join("holders")) {
            out.extend(
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned()),
            );
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::{symlink, FileExt, PermissionsExt};

    /// A root with a state directory inside a scratch directory, and a file outside it.
    struct Scene {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        outside: PathBuf,
        roots: BackstoreRoots,
    }

    fn scene() -> Scene {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("nested/dir")).unwrap();
        let outside = tmp.path().join("outside.img");
        std::fs::write(&outside, b"not yours").unwrap();
        let roots = BackstoreRoots::new(&root, &[]);
        Scene {
            _tmp: tmp,
            root,
            outside,
            roots,
        }
    }

    fn rw(size: Option<u64>) -> FileRequest {
        FileRequest {
            size,
            read_only: false,
        }
    }

    fn len(p: &Path) -> u64 {
        std::fs::metadata(p).unwrap().len()
    }

    #[test]
    fn side_files_stay_in_a_root() {
        let s = scene();
        let real = std::fs::canonicalize(&s.root).unwrap();
        assert_eq!(
            s.roots.side_file(Path::new("d.pr")).unwrap(),
            real.join("d.pr")
        );
        assert_eq!(
            s.roots.side_file(&s.root.join("nested/dir/d.pr")).unwrap(),
            real.join("nested/dir/d.pr")
        );
        let outside = s.outside.with_file_name("d.pr");
        assert!(matches!(
            s.roots.side_file(&outside),
            Err(PolicyError::OutsideRoots { .. })
        ));
        // A directory in the root that leads out of it.
        symlink(s.outside.parent().unwrap(), s.root.join("out")).unwrap();
        assert!(matches!(
            s.roots.side_file(&s.root.join("out/d.pr")),
            Err(PolicyError::EscapesRoot { .. })
        ));
        assert!(matches!(
            s.roots.side_file(Path::new("../d.pr")),
            Err(PolicyError::EscapesRoot { .. })
        ));
        // A directory that does not exist.
        assert!(matches!(
            s.roots.side_file(&s.root.join("none/d.pr")),
            Err(PolicyError::Io { .. })
        ));
    }

    #[test]
    fn ceph_files_are_read_from_etc_ceph_or_a_root() {
        let s = scene();
        let real = std::fs::canonicalize(&s.root).unwrap();
        std::fs::write(s.root.join("ceph.conf"), "[global]\n").unwrap();
        assert_eq!(
            s.roots.ceph_file(Path::new("ceph.conf")).unwrap(),
            real.join("ceph.conf")
        );
        // A file outside, directly or through a symlink in the root.
        let e = s.roots.ceph_file(&s.outside).unwrap_err();
        assert!(
            matches!(&e, PolicyError::OutsideRoots { roots, .. } if roots[0] == Path::new(CEPH_DIR)),
            "{e}"
        );
        symlink(&s.outside, s.root.join("keyring")).unwrap();
        assert!(matches!(
            s.roots.ceph_file(Path::new("keyring")),
            Err(PolicyError::OutsideRoots { .. })
        ));
        assert!(matches!(
            s.roots.ceph_file(Path::new("nested")),
            Err(PolicyError::NotRegularFile { .. })
        ));
        assert!(matches!(
            s.roots.ceph_file(Path::new("absent.conf")),
            Err(PolicyError::Io { .. })
        ));
        assert!(matches!(
            s.roots.ceph_file(Path::new("/etc/passwd")),
            Err(PolicyError::OutsideRoots { .. })
        ));
    }

    #[test]
    fn files_inside_the_root_open() {
        let s = scene();
        std::fs::write(s.root.join("plain.img"), vec![7u8; 4096]).unwrap();
        let o = s.roots.open_file(Path::new("plain.img"), rw(None)).unwrap();
        assert!(!o.created);
        assert_eq!(o.file.metadata().unwrap().len(), 4096);
        // The descriptor is open for writing, on the same file.
        o.file.write_all_at(b"hello", 0).unwrap();
        assert_eq!(
            &std::fs::read(s.root.join("plain.img")).unwrap()[..5],
            b"hello"
        );

        // Absolute, in a nested directory, with the size it has.
        std::fs::write(s.root.join("nested/dir/n.img"), vec![0u8; 512]).unwrap();
        let abs = s.root.join("nested/dir/n.img");
        let o = s.roots.open_file(&abs, rw(Some(512))).unwrap();
        assert_eq!(o.file.metadata().unwrap().len(), 512);

        // A symlink that stays inside the root, relative and absolute.
        symlink("nested/dir/n.img", s.root.join("rel-link")).unwrap();
        symlink(&abs, s.root.join("abs-link")).unwrap();
        symlink("../../plain.img", s.root.join("nested/dir/up-link")).unwrap();
        for link in ["rel-link", "abs-link", "nested/dir/up-link"] {
            let o = s.roots.open_file(Path::new(link), rw(None));
            // An absolute symlink is resolved from the root, so it leads out unless the
            // root is `/`: RESOLVE_BENEATH refuses absolute symlinks altogether.
            if link == "abs-link" {
                assert!(
                    matches!(o, Err(PolicyError::EscapesRoot { .. })),
                    "{link}: {o:?}"
                );
            } else {
                o.unwrap_or_else(|e| panic!("{link}: {e}"));
            }
        }
        // Read-only opens read-only.
        let o = s
            .roots
            .open_file(
                Path::new("plain.img"),
                FileRequest {
                    read_only: true,
                    ..rw(None)
                },
            )
            .unwrap();
        assert!(o.file.write_at(b"x", 0).is_err());
    }

    #[test]
    fn extra_roots_take_absolute_paths() {
        let s = scene();
        let extra = s._tmp.path().join("extra");
        std::fs::create_dir(&extra).unwrap();
        let roots = BackstoreRoots::new(&s.root, std::slice::from_ref(&extra));
        assert_eq!(roots.roots(), &[s.root.clone(), extra.clone()]);
        let o = roots
            .open_file(&extra.join("e.img"), rw(Some(8192)))
            .unwrap();
        assert!(o.created);
        assert_eq!(len(&extra.join("e.img")), 8192);
        // A prefix that is not a whole component is not under the root.
        let sibling = s._tmp.path().join("extra2/e.img");
        let e = roots.open_file(&sibling, rw(Some(8192))).unwrap_err();
        assert!(matches!(e, PolicyError::OutsideRoots { .. }), "{e}");
        assert!(e.is_forbidden());
        assert!(
            e.to_string()
                .contains("add a directory to policy.backstore_roots"),
            "{e}"
        );
        assert!(e.to_string().contains(&extra.display().to_string()), "{e}");
    }

    #[test]
    fn nothing_leads_out_of_the_root() {
        let s = scene();
        let before = std::fs::read(&s.outside).unwrap();
        // `..` out of the state directory.
        let e = s
            .roots
            .open_file(Path::new("../outside.img"), rw(Some(1 << 20)))
            .unwrap_err();
        assert!(matches!(e, PolicyError::EscapesRoot { .. }), "{e}");
        assert!(
            e.to_string().contains("leads out of the backstore root"),
            "{e}"
        );
        // `..` in an absolute path under the root.
        let e = s
            .roots
            .open_file(&s.root.join("nested/../../outside.img"), rw(None))
            .unwrap_err();
        assert!(matches!(e, PolicyError::EscapesRoot { .. }), "{e}");
        // An absolute path outside every root.
        let e = s.roots.open_file(&s.outside, rw(None)).unwrap_err();
        assert!(matches!(e, PolicyError::OutsideRoots { .. }), "{e}");
        // Symlinks pointing out: absolute, relative, to /etc/passwd, and in a directory.
        symlink(&s.outside, s.root.join("abs")).unwrap();
        symlink("../outside.img", s.root.join("rel")).unwrap();
        symlink("/etc/passwd", s.root.join("passwd")).unwrap();
        symlink(s._tmp.path(), s.root.join("nested/dirlink")).unwrap();
        for link in ["abs", "rel", "passwd", "nested/dirlink/outside.img"] {
            let e = s
                .roots
                .open_file(Path::new(link), rw(Some(1 << 20)))
                .unwrap_err();
            assert!(matches!(e, PolicyError::EscapesRoot { .. }), "{link}: {e}");
            assert!(e.is_forbidden());
        }
        // A missing file behind a symlink out is not created there.
        symlink("../created-outside.img", s.root.join("dangling")).unwrap();
        let e = s
            .roots
            .open_file(Path::new("dangling"), rw(Some(4096)))
            .unwrap_err();
        assert!(matches!(e, PolicyError::EscapesRoot { .. }), "{e}");
        assert!(!s._tmp.path().join("created-outside.img").exists());
        assert_eq!(std::fs::read(&s.outside).unwrap(), before);
    }

    #[test]
    fn only_regular_files() {
        let s = scene();
        let fifo = s.root.join("fifo");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c` is a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Opening a FIFO read-only would block until a writer comes: the check comes first.
        for read_only in [false, true] {
            let e = s
                .roots
                .open_file(
                    Path::new("fifo"),
                    FileRequest {
                        read_only,
                        ..rw(None)
                    },
                )
                .unwrap_err();
            assert!(
                matches!(e, PolicyError::NotRegularFile { kind: "a FIFO", .. }),
                "{e}"
            );
            assert!(e.to_string().contains("needs a regular file"), "{e}");
        }
        let e = s
            .roots
            .open_file(Path::new("nested"), rw(None))
            .unwrap_err();
        assert!(
            matches!(
                e,
                PolicyError::NotRegularFile {
                    kind: "a directory",
                    ..
                }
            ),
            "{e}"
        );
        // A device outside the roots is refused for being outside, before anything else.
        let e = s
            .roots
            .open_file(Path::new("/dev/null"), rw(None))
            .unwrap_err();
        assert!(matches!(e, PolicyError::OutsideRoots { .. }), "{e}");
        // A root that contains it: still not a regular file.
        let dev = BackstoreRoots::new(Path::new("/dev"), &[]);
        let e = dev.open_file(Path::new("null"), rw(None)).unwrap_err();
        assert!(
            matches!(
                e,
                PolicyError::NotRegularFile {
                    kind: "a character device",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn missing_files_are_created_0600_and_existing_ones_kept() {
        let s = scene();
        let o = s
            .roots
            .open_file(Path::new("nested/new.img"), rw(Some(1 << 20)))
            .unwrap();
        assert!(o.created);
        let meta = std::fs::metadata(s.root.join("nested/new.img")).unwrap();
        assert_eq!(meta.len(), 1 << 20);
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // Sparse: the length is set, no blocks written.
        assert!(meta.blocks() * 512 < 1 << 20, "{} blocks", meta.blocks());

        // Without a size a missing file is not created.
        let e = s
            .roots
            .open_file(Path::new("none.img"), rw(None))
            .unwrap_err();
        assert!(matches!(e, PolicyError::Missing { .. }), "{e}");
        assert!(!e.is_forbidden());
        assert!(!s.root.join("none.img").exists());
        // Nor read-only.
        let e = s
            .roots
            .open_file(
                Path::new("none.img"),
                FileRequest {
                    read_only: true,
                    ..rw(Some(4096))
                },
            )
            .unwrap_err();
        assert!(matches!(e, PolicyError::Io { .. }), "{e}");
        assert!(!s.root.join("none.img").exists());

        // An existing file of another length is refused and left as it is.
        let path = s.root.join("disk.img");
        let mut f = File::create(&path).unwrap();
        f.write_all(&[0x5a; 674]).unwrap();
        drop(f);
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        for size in [4096, 512, 0] {
            let e = s
                .roots
                .open_file(Path::new("disk.img"), rw(Some(size)))
                .unwrap_err();
            assert!(
                matches!(e, PolicyError::ExistingSize { len: 674, .. }),
                "{e}"
            );
            assert!(e.is_size() && !e.is_forbidden());
            assert!(
                e.to_string().starts_with("disk.img exists with 674 bytes"),
                "{e}"
            );
        }
        assert_eq!(std::fs::read(&path).unwrap(), vec![0x5a; 674]);
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), mtime);
        // Its own length, or none, is fine.
        s.roots
            .open_file(Path::new("disk.img"), rw(Some(674)))
            .unwrap();
        s.roots.open_file(Path::new("disk.img"), rw(None)).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), vec![0x5a; 674]);
    }

    #[test]
    fn block_backstores_need_block_devices() {
        let s = scene();
        let e = s
            .roots
            .open_block(Path::new("/dev/null"), false, false)
            .unwrap_err();
        assert!(
            matches!(
                e,
                PolicyError::NotBlockDevice {
                    kind: "a character device",
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().starts_with("/dev/null is not a block device"),
            "{e}"
        );
        assert!(e.is_forbidden());
        let e = s.roots.open_block(&s.outside, true, false).unwrap_err();
        assert!(
            matches!(
                e,
                PolicyError::NotBlockDevice {
                    kind: "a regular file",
                    ..
                }
            ),
            "{e}"
        );
    }

    /// The backstore's descriptors, O_DIRECT included, are of the inode the policy opened,
    /// even when the name is replaced in between.
    #[tokio::test]
    async fn the_backstore_uses_the_opened_inode() {
        let s = scene();
        let o = s
            .roots
            .open_file(Path::new("lun.img"), rw(Some(1 << 20)))
            .unwrap();
        std::fs::rename(s.root.join("lun.img"), s.root.join("moved.img")).unwrap();
        std::fs::write(s.root.join("lun.img"), b"impostor").unwrap();
        let bs = crate::FileBackstore::from_file(
            o.file,
            "lun.img",
            crate::FileOptions {
                size: Some(1 << 20),
                ..crate::FileOptions::default()
            },
        )
        .unwrap();
        let data = crate::IoBuf::from_slice(&[0xc3; 4096]);
        let (r, _) = crate::Backstore::write(&bs, 4096, data, true).await;
        r.unwrap();
        assert_eq!(std::fs::read(s.root.join("lun.img")).unwrap(), b"impostor");
        let moved = std::fs::read(s.root.join("moved.img")).unwrap();
        assert!(moved[4096..8192].iter().all(|&b| b == 0xc3));
        assert_eq!(bs.path(), Path::new("lun.img"));
    }

    #[test]
    fn mountinfo_is_parsed() {
        let text = "\
22 1 8:2 / / rw,relatime shared:1 - ext4 /dev/sda2 rw
36 22 7:3 / /mnt/with\\040space rw,relatime shared:2 - ext4 /dev/loop3 rw
37 22 0:5 / /dev rw - devtmpfs udev rw
";
        assert_eq!(mount_point_of(text, &[(8, 2)]).as_deref(), Some("/"));
        assert_eq!(
            mount_point_of(text, &[(7, 0), (7, 3)]).as_deref(),
            Some("/mnt/with space")
        );
        assert_eq!(mount_point_of(text, &[(7, 1)]), None);
        assert_eq!(unescape("a\\011b\\134"), "a\tb\\");
        assert_eq!(dev_numbers(0x0703), (7, 3));
        assert_eq!(dev_numbers((259 << 8) | 1), (259, 1));
        // Minors above 255 live in bits 20..32.
        assert_eq!(dev_numbers((7 << 8) | (1 << 20) | 4), (7, 0x104));
    }
}
