//! Memory that a memory region can expose to the RDMA engine. All `unsafe` of the stack's
//! memory registration lives here.
//!
//! # Ownership model
//!
//! A [`Region`] is a span of process memory that the engine may read and write at any time
//! while an operation targets it, as a NIC's DMA engine would. It either owns its bytes
//! ([`Region::zeroed`], [`Region::from_vec`]) or borrows them from the caller through
//! [`Region::from_raw`], whose safety contract keeps them alive and unmoved until the last
//! `Arc<Region>` is dropped (memory regions and in-flight operations hold such an `Arc`).
//!
//! The engine only touches the bytes through [`Region::read`], [`Region::write`],
//! [`Region::atomic_u64`] and [`Region::slice`] (data a datagram sends straight from memory). As with real RDMA, the application must not access bytes that an
//! outstanding work request or a remote peer with access rights is using: the contents are then
//! unspecified (ibverbs gives the same rule for registered memory).

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

/// Keeps externally provided memory alive (for example a buffer pool slab).
pub type Owner = Box<dyn Send + Sync>;

enum Backing {
    Owned { cap: usize },
    External(#[allow(dead_code)] Option<Owner>),
}

/// A registered span of memory (see the module documentation).
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

// SAFETY: a Region is a plain address range; all access goes through raw copies whose
// concurrency rules are the documented DMA contract, and the owner it may hold is Send + Sync.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only allows copies and atomics through raw pointers.
unsafe impl Sync for Region {}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

impl Region {
    /// An owned region of `len` zero bytes.
    pub fn zeroed(len: usize) -> Region {
        Region::from_vec(vec![0u8; len])
    }

    /// An owned region holding `data`.
    pub fn from_vec(data: Vec<u8>) -> Region {
        let mut data = std::mem::ManuallyDrop::new(data);
        let cap = data.capacity();
        let len = data.len();
        let ptr = NonNull::new(data.as_mut_ptr()).unwrap_or(NonNull::dangling());
        Region {
            ptr,
            len,
            backing: Backing::Owned { cap },
        }
    }

    /// A region over memory the caller manages (a pool slab, a mapping).
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` must be valid for reads and writes, must not move, and must stay
    /// allocated until the returned region is dropped (which happens only after every memory
    /// region and operation using it is gone). `owner`, if given, is dropped with the region and
    /// may be what keeps the memory alive. The caller must not create Rust references to the
    /// bytes that overlap engine accesses (see the module documentation).
    pub unsafe fn from_raw(ptr: NonNull<u8>, len: usize, owner: Option<Owner>) -> Region {
        Region {
            ptr,
            len,
            backing: Backing::External(owner),
        }
    }

    /// Start address, used as the default I/O virtual address of a memory region.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// Copies `out.len()` bytes at `offset` out of the region; false if out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        if !self.check(offset, out.len()) {
            return false;
        }
        // SAFETY: the range is in bounds (checked above) of memory valid for reads per the
        // constructors' contracts; `out` is a distinct Rust buffer, so they do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        true
    }

    /// `len` bytes at `offset` as a slice, for the engine to checksum and send straight
    /// from memory (as a NIC's DMA reads it); `None` if out of bounds. The bytes are those of
    /// an outstanding work request, which the application leaves alone until it completes
    /// (the module's rule); the slice lives no longer than the `&self` it borrows, and the
    /// region is never handed out as `&mut [u8]`.
    pub fn slice(&self, offset: usize, len: usize) -> Option<&[u8]> {
        if !self.check(offset, len) {
            return None;
        }
        // SAFETY: in bounds (checked) of memory valid for reads for as long as the region
        // lives, per the constructors' contracts; the engine never writes through a shared
        // slice, and writers of these bytes (the application, a remote peer) are excluded by
        // the rule above while the work request that sends them is outstanding.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) })
    }

    /// Copies `data` into the region at `offset`; false if out of bounds. Data that is
    /// already there (a payload the link received in place, [`Region::place`]) is not moved.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        if !self.check(offset, data.len()) {
            return false;
        }
        if std::ptr::eq(data.as_ptr(), self.ptr.as_ptr().wrapping_add(offset)) {
            return true;
        }
        // SAFETY: in bounds (checked) and valid for writes per the constructors' contracts;
        // `data` is a Rust slice and cannot alias the region's bytes mutably (the region is
        // never handed out as `&mut [u8]`), and copy handles an overlapping shared borrow.
        unsafe { std::ptr::copy(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len()) };
        true
    }

    /// Where `len` bytes at `offset` lie, for a link to receive a payload into them in place
    /// ([`crate::verbs::Expected`]); `None` if out of bounds. The bytes are those of an
    /// outstanding operation (an RDMA READ's destination, the rest of an RDMA WRITE), whose
    /// contents are undefined until it completes.
    pub(crate) fn place(&self, offset: usize, len: usize) -> Option<NonNull<u8>> {
        if !self.check(offset, len) {
            return None;
        }
        // SAFETY: in bounds (checked) of the region's allocation.
        Some(unsafe { self.ptr.add(offset) })
    }

    /// Fills `len` bytes at `offset` with `value`; false if out of bounds.
    pub fn fill(&self, offset: usize, len: usize, value: u8) -> bool {
        if !self.check(offset, len) {
            return false;
        }
        // SAFETY: in bounds and valid for writes (see `write`).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(offset), value, len) };
        true
    }

    /// A copy of the whole region.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        self.read(0, &mut v);
        v
    }

    /// The 8 bytes at `offset` as an atomic, if in bounds and 8-byte aligned (IBA 9.4.5: atomic
    /// operations need naturally aligned addresses). Values are in host order in memory.
    pub fn atomic_u64(&self, offset: usize) -> Option<&AtomicU64> {
        if !self.check(offset, 8) {
            return None;
        }
        // SAFETY: in bounds (checked).
        let p = unsafe { self.ptr.as_ptr().add(offset) };
        if !(p as usize).is_multiple_of(8) {
            return None;
        }
        // SAFETY: aligned, in bounds, valid for reads and writes for the lifetime of `&self`
        // (the region outlives the borrow); AtomicU64 has the layout of u64.
        Some(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Backing::Owned { cap } = self.backing {
            // SAFETY: ptr/len/cap came from a Vec<u8> we leaked in `from_vec` and never freed.
            drop(unsafe { Vec::from_raw_parts(self.ptr.as_ptr(), self.len, cap) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn read_write_bounds() {
        let r = Region::zeroed(16);
        assert!(r.write(4, &[1, 2, 3]));
        let mut out = [0u8; 4];
        assert!(r.read(3, &mut out));
        assert_eq!(out, [0, 1, 2, 3]);
        assert!(!r.write(15, &[1, 2]));
        assert!(!r.read(usize::MAX, &mut out));
        assert!(r.fill(0, 16, 7));
        assert_eq!(r.to_vec(), vec![7; 16]);
    }

    #[test]
    fn atomics_need_alignment() {
        let r = Region::zeroed(32);
        let base = (8 - (r.addr() as usize % 8)) % 8;
        let a = r.atomic_u64(base).unwrap();
        a.fetch_add(5, Ordering::SeqCst);
        assert_eq!(r.atomic_u64(base).unwrap().load(Ordering::SeqCst), 5);
        assert!(r.atomic_u64(base + 1).is_none());
        assert!(r.atomic_u64(30).is_none());
    }

    #[test]
    fn external_memory() {
        let mut buf = vec![0u8; 8].into_boxed_slice();
        let ptr = NonNull::new(buf.as_mut_ptr()).unwrap();
        // SAFETY: the owner keeps the boxed slice alive and unmoved for the region's life.
        let r = unsafe { Region::from_raw(ptr, 8, Some(Box::new(buf))) };
        assert!(r.write(0, b"abcdefgh"));
        assert_eq!(r.to_vec(), b"abcdefgh");
    }
}
