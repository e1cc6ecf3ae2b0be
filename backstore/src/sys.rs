//! Safe wrappers for the few Linux calls std does not offer (block device ioctls, SEEK_DATA and
//! SEEK_HOLE, statx direct-I/O alignment, statfs, preadv2/pwritev2 with `RWF_*` flags).

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `_IOR(0x12, 114, size_t)` from linux/fs.h.
const BLKGETSIZE64: libc::Ioctl = 0x8008_1272u32 as libc::Ioctl;
/// `_IO(0x12, 119)` from linux/fs.h.
const BLKDISCARD: libc::Ioctl = 0x1277;

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Size of a block device in bytes.
pub(crate) fn bdev_size(f: &File) -> io::Result<u64> {
    let mut size = 0u64;
    // SAFETY: BLKGETSIZE64 writes one u64 to the pointer, which points to a live local.
    check(unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) })?;
    Ok(size)
}

/// Logical block size of a block device: the O_DIRECT alignment.
pub(crate) fn bdev_logical_block_size(f: &File) -> io::Result<u32> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int to the pointer, which points to a live local.
    check(unsafe {
        libc::ioctl(
            f.as_raw_fd(),
            libc::BLKSSZGET,
            &mut size as *mut libc::c_int,
        )
    })?;
    Ok(size as u32)
}

/// Discards a byte range of a block device.
pub(crate) fn bdev_discard(f: &File, offset: u64, len: u64) -> io::Result<()> {
    let range = [offset, len];
    // SAFETY: BLKDISCARD reads two u64 from the pointer, which points to a live local array.
    check(unsafe { libc::ioctl(f.as_raw_fd(), BLKDISCARD, range.as_ptr()) })?;
    Ok(())
}

/// The first data byte at or after `offset`, or `None` when only a hole follows.
pub(crate) fn seek_data(f: &File, offset: u64) -> io::Result<Option<u64>> {
    match seek(f, offset, libc::SEEK_DATA) {
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
        r => r.map(Some),
    }
}

/// The first hole byte at or after `offset` (end of file counts as a hole).
pub(crate) fn seek_hole(f: &File, offset: u64) -> io::Result<u64> {
    seek(f, offset, libc::SEEK_HOLE)
}

fn seek(f: &File, offset: u64, whence: libc::c_int) -> io::Result<u64> {
    let offset = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: lseek takes no pointers; the file offset it moves is not used by this crate,
    // which always passes explicit offsets.
    let pos = unsafe { libc::lseek(f.as_raw_fd(), offset, whence) };
    if pos < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(pos as u64)
}

/// Direct-I/O alignment of a file as the kernel reports it (Linux 6.1+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DioAlign {
    /// File offset and length alignment; 0 when the file system does not support O_DIRECT.
    pub offset: u32,
    /// Buffer address alignment.
    pub mem: u32,
}

/// `None` when the kernel does not report it.
pub(crate) fn dio_align(f: &File) -> io::Result<Option<DioAlign>> {
    const EMPTY: &CStr = c"";
    // SAFETY: an all-zero statx is a valid value of this plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the path is a valid C string, and statx writes one struct to a live local.
    check(unsafe {
        libc::statx(
            f.as_raw_fd(),
            EMPTY.as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    })?;
    if stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return Ok(None);
    }
    Ok(Some(DioAlign {
        offset: stx.stx_dio_offset_align,
        mem: stx.stx_dio_mem_align,
    }))
}

/// `statfs` magic of tmpfs (and of shmem files).
const TMPFS_MAGIC: u32 = 0x0102_1994;
/// `statfs` magic of ramfs.
const RAMFS_MAGIC: u32 = 0x8584_58f6;

/// Whether `f` lives on a file system that keeps its data in memory (tmpfs, ramfs): there is
/// no device I/O to wait for, and O_DIRECT, where accepted, only emulates direct I/O.
pub(crate) fn is_memory_fs(f: &File) -> io::Result<bool> {
    // SAFETY: an all-zero statfs is a valid value of this plain C struct.
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes one struct to a live local.
    check(unsafe { libc::fstatfs(f.as_raw_fd(), &mut sf) })?;
    // f_type is a signed word whose width differs between ABIs; the magics are 32-bit.
    Ok(matches!(sf.f_type as u32, TMPFS_MAGIC | RAMFS_MAGIC))
}

fn offset_arg(offset: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `preadv2` of one buffer at `offset` with `RWF_*` `flags`.
pub(crate) fn pread_flags(f: &File, buf: &mut [u8], offset: u64, flags: i32) -> io::Result<usize> {
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: the iovec describes `buf`, which is exclusively borrowed for the duration of the
    // call; the kernel writes at most `buf.len()` bytes into it.
    let n = unsafe { libc::preadv2(f.as_raw_fd(), &iov, 1, offset_arg(offset)?, flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// `pwritev2` of one buffer at `offset` with `RWF_*` `flags`.
pub(crate) fn pwrite_flags(f: &File, buf: &[u8], offset: u64, flags: i32) -> io::Result<usize> {
    let iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the iovec describes `buf`, which is borrowed for the duration of the call; the
    // kernel only reads from it.
    let n = unsafe { libc::pwritev2(f.as_raw_fd(), &iov, 1, offset_arg(offset)?, flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Opens the inode `fd` refers to anew, through `/proc/self/fd` (a descriptor opened with
/// O_PATH included): for reading, for writing too with `write`, with `flags` (O_DIRECT,
/// O_DSYNC, O_EXCL) and close-on-exec. No path is looked up again, so the new descriptor is
/// of the same file even if its name has been replaced meanwhile.
pub(crate) fn reopen(fd: &impl AsRawFd, write: bool, flags: i32) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(flags)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}
