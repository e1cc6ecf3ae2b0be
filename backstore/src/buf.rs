//! Aligned data buffers and the bounded pool they come from.
//!
//! All `unsafe` for buffer memory lives here. An [`IoBuf`] owns its memory exclusively (like a
//! `Box<[u8]>`), and every byte of its capacity is initialised at all times: heap buffers are
//! allocated zeroed, pool slabs are fresh anonymous mappings (zero pages), and from then on only
//! initialised bytes are ever written (by safe code or by the kernel). Handing out pool memory
//! without zeroing it again is therefore sound; it only carries old data.
//!
//! The pool is a binary buddy allocator over a fixed set of slabs, with blocks of 4 KiB .. 1 MiB
//! (the size classes). A byte budget, enforced by a fair semaphore counted in 4 KiB pages, bounds
//! everything handed out, including dedicated allocations for requests above 1 MiB.

use std::alloc::{self, Layout};
use std::collections::BTreeSet;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, Semaphore};

/// Alignment of every [`IoBuf`]: enough for O_DIRECT on 4Kn devices and for page-granular
/// memory registration.
pub const IO_BUF_ALIGN: usize = 4096;

const PAGE: usize = 4096;
const PAGE_SHIFT: u32 = 12;
/// Largest pooled block: 2^MAX_ORDER pages = 1 MiB.
const MAX_ORDER: usize = 8;
const MAX_BLOCK: usize = PAGE << MAX_ORDER;
/// Slabs are at most this large: small enough for one io_uring fixed-buffer entry each, large
/// enough that a big pool needs only a few dozen registrations.
const SLAB_MAX: usize = 32 << 20;

/// An owned, 4096-byte aligned buffer whose length may be less than its capacity.
///
/// Dropping a pooled buffer returns its memory to the pool it came from.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
    origin: Origin,
}

enum Origin {
    /// From the global allocator with `Layout(cap, IO_BUF_ALIGN)`.
    Heap,
    /// A buddy block of `pool`'s slabs that holds `permits` pages of the budget.
    Pool {
        pool: Arc<PoolInner>,
        page: usize,
        order: u8,
        permits: usize,
    },
    /// A private anonymous mapping of `cap` bytes that holds `permits` pages of `pool`'s budget.
    Dedicated {
        pool: Arc<PoolInner>,
        permits: usize,
    },
}

// SAFETY: an IoBuf owns its memory exclusively (no aliasing pointer escapes safe code), like a
// Box<[u8]>; the pool it may point back to is itself Send + Sync.
unsafe impl Send for IoBuf {}
// SAFETY: shared access only hands out `&[u8]`, which is Sync.
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// An unpooled buffer of `len` zero bytes.
    pub fn zeroed(len: usize) -> IoBuf {
        let cap = round_up(len.max(1), PAGE);
        let layout = heap_layout(cap);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        IoBuf {
            ptr,
            len,
            cap,
            origin: Origin::Heap,
        }
    }

    /// An unpooled copy of `data`.
    pub fn from_slice(data: &[u8]) -> IoBuf {
        let mut buf = IoBuf::zeroed(data.len());
        buf.as_mut_slice().copy_from_slice(data);
        buf
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Sets the length; bytes between the old and the new length read as zero.
    ///
    /// # Panics
    /// If `len` exceeds the capacity.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.cap,
            "IoBuf::set_len({len}) beyond capacity {}",
            self.cap
        );
        if len > self.len {
            // SAFETY: old len..len lies within the capacity, which this buffer owns exclusively.
            unsafe {
                self.ptr
                    .as_ptr()
                    .add(self.len)
                    .write_bytes(0, len - self.len)
            };
        }
        self.len = len;
    }

    /// Shortens the buffer; a longer `len` is ignored.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the first `len` bytes are within the allocation and always initialised (module
        // doc); `&self` guarantees no mutable access for the lifetime of the slice.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Start of the memory, for handing to the kernel. The pointer is stable while the buffer
    /// lives: moving an `IoBuf` does not move its memory.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Mutable start of the memory; see [`IoBuf::as_ptr`].
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Index of the pool slab holding this buffer (the io_uring fixed-buffer index when a pool's
    /// slabs are registered in order), or `None` for unpooled and dedicated buffers.
    pub fn slab_index(&self) -> Option<usize> {
        match &self.origin {
            Origin::Pool { pool, page, .. } => Some(page / pool.slab_pages),
            _ => None,
        }
    }

    /// Whether this buffer's memory lies in `pool`'s slabs.
    pub fn is_from_slabs_of(&self, pool: &BufPool) -> bool {
        matches!(&self.origin, Origin::Pool { pool: p, .. } if Arc::ptr_eq(p, &pool.inner))
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        match &self.origin {
            Origin::Heap => {
                // SAFETY: allocated in `zeroed` with exactly this layout and not freed before.
                unsafe { alloc::dealloc(self.ptr.as_ptr(), heap_layout(self.cap)) }
            }
            Origin::Pool {
                pool,
                page,
                order,
                permits,
            } => pool.release_block(*page, *order, *permits),
            Origin::Dedicated { pool, permits } => {
                // SAFETY: `ptr`/`cap` are the mapping made in `map_anon` for this buffer only;
                // nothing else refers to it once the buffer is dropped.
                unsafe { unmap(self.ptr, self.cap) };
                pool.release_pages(self.cap >> PAGE_SHIFT, *permits);
            }
        }
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf").field("len", &self.len).finish()
    }
}

/// Bounded memory for data buffers.
///
/// `get` waits while the budget is used up, so a burst of large commands slows down instead of
/// growing memory. Blocks come in power-of-two classes from 4 KiB to 1 MiB out of slabs that
/// are mapped once, at creation; larger requests get a dedicated mapping that still counts
/// against the budget but is not part of [`BufPool::slabs`].
pub struct BufPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    slabs: Vec<Slab>,
    slab_pages: usize,
    budget_pages: usize,
    /// Budget in pages not yet handed out; FIFO, so a large request is not starved.
    permits: Semaphore,
    buddy: Mutex<Buddy>,
    /// Signalled on releases while `fragmented_waiters` is non-zero: requests that hold budget
    /// but found the slabs too fragmented for their block size.
    released: Notify,
    fragmented_waiters: AtomicUsize,
    in_use_pages: AtomicUsize,
}

struct Slab {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the slab pointers are only dereferenced through IoBufs that own disjoint blocks; the
// allocator state is behind a Mutex.
unsafe impl Send for PoolInner {}
// SAFETY: see Send.
unsafe impl Sync for PoolInner {}

impl BufPool {
    /// A pool that hands out at most `budget_bytes` (rounded up to 4 KiB) at a time.
    ///
    /// The slabs (the budget rounded up to 1 MiB) are reserved as lazily backed anonymous
    /// memory, so an idle pool costs address space, not RAM.
    pub fn new(budget_bytes: usize) -> Arc<BufPool> {
        let budget_pages = (round_up(budget_bytes.max(1), PAGE) >> PAGE_SHIFT)
            .min(u32::MAX as usize)
            .min(Semaphore::MAX_PERMITS);
        let region = round_up(budget_pages << PAGE_SHIFT, MAX_BLOCK);
        let slab_len = region.min(SLAB_MAX);
        let mut slabs = Vec::new();
        let mut left = region;
        while left > 0 {
            let len = left.min(slab_len);
            slabs.push(Slab {
                ptr: map_anon(len),
                len,
            });
            left -= len;
        }
        let mut buddy = Buddy::default();
        for top in (0..region >> PAGE_SHIFT).step_by(1 << MAX_ORDER) {
            buddy.free[MAX_ORDER].insert(top);
        }
        Arc::new(BufPool {
            inner: Arc::new(PoolInner {
                slabs,
                slab_pages: slab_len >> PAGE_SHIFT,
                budget_pages,
                permits: Semaphore::new(budget_pages),
                buddy: Mutex::new(buddy),
                released: Notify::new(),
                fragmented_waiters: AtomicUsize::new(0),
                in_use_pages: AtomicUsize::new(0),
            }),
        })
    }

    /// A buffer of `len` bytes (contents unspecified), waiting while the budget is used up.
    ///
    /// A request larger than the whole budget waits until nothing else is in use and then
    /// holds the entire budget; that is the one case in which `in_use_bytes` may exceed it.
    pub async fn get(&self, len: usize) -> IoBuf {
        let inner = &self.inner;
        let need = inner.permits_for(len);
        let permit = inner
            .permits
            .acquire_many(need as u32)
            .await
            .expect("the pool semaphore is never closed");
        if len > MAX_BLOCK {
            permit.forget();
            return inner.dedicated(len, need);
        }
        if let Some(buf) = inner.block(len, need) {
            permit.forget();
            return buf;
        }
        // Enough budget but no free block of this size: wait for releases to coalesce one.
        let _waiting = FragmentedWaiter::new(inner);
        loop {
            let released = inner.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(buf) = inner.block(len, need) {
                permit.forget();
                return buf;
            }
            released.await;
        }
    }

    /// Like [`BufPool::get`] but returns `None` instead of waiting.
    pub fn try_get(&self, len: usize) -> Option<IoBuf> {
        let inner = &self.inner;
        let need = inner.permits_for(len);
        let permit = inner.permits.try_acquire_many(need as u32).ok()?;
        let buf = if len > MAX_BLOCK {
            inner.dedicated(len, need)
        } else {
            inner.block(len, need)?
        };
        permit.forget();
        Some(buf)
    }

    /// The slab memory, for registration with io_uring and the RDMA stack.
    ///
    /// The list is fixed when the pool is created: slabs never move, grow or shrink, and stay
    /// mapped until the pool and every buffer taken from it are dropped. Buffers above 1 MiB
    /// (dedicated allocations) are not in any slab.
    pub fn slabs(&self) -> Vec<(*const u8, usize)> {
        self.inner
            .slabs
            .iter()
            .map(|s| (s.ptr.as_ptr() as *const u8, s.len))
            .collect()
    }

    /// Bytes currently handed out, counted in whole blocks (a 5 KiB request holds 8 KiB).
    pub fn in_use_bytes(&self) -> usize {
        self.inner.in_use_pages.load(Ordering::Relaxed) << PAGE_SHIFT
    }

    /// The budget in bytes (as rounded by [`BufPool::new`]); the largest transfer one buffer
    /// can hold without waiting for an empty pool.
    pub fn budget_bytes(&self) -> usize {
        self.inner.budget_pages << PAGE_SHIFT
    }
}

impl fmt::Debug for BufPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufPool")
            .field("budget_bytes", &self.budget_bytes())
            .field("in_use_bytes", &self.in_use_bytes())
            .finish()
    }
}

impl PoolInner {
    /// Budget pages a request of `len` bytes holds.
    fn permits_for(&self, len: usize) -> usize {
        let pages = if len > MAX_BLOCK {
            round_up(len, PAGE) >> PAGE_SHIFT
        } else {
            1 << order_for(len)
        };
        pages.min(self.budget_pages)
    }

    /// A buddy block for `len` (<= 1 MiB); the caller already holds `permits` of the budget.
    fn block(self: &Arc<Self>, len: usize, permits: usize) -> Option<IoBuf> {
        let order = order_for(len);
        let page = self
            .buddy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .alloc(order)?;
        self.in_use_pages.fetch_add(1 << order, Ordering::Relaxed);
        let slab = &self.slabs[page / self.slab_pages];
        let offset = (page % self.slab_pages) << PAGE_SHIFT;
        // SAFETY: the block lies inside the slab: top-level blocks never straddle slabs
        // because the slab size is a multiple of the largest block.
        let ptr = unsafe { NonNull::new_unchecked(slab.ptr.as_ptr().add(offset)) };
        Some(IoBuf {
            ptr,
            len,
            cap: PAGE << order,
            origin: Origin::Pool {
                pool: Arc::clone(self),
                page,
                order: order as u8,
                permits,
            },
        })
    }

    fn dedicated(self: &Arc<Self>, len: usize, permits: usize) -> IoBuf {
        let cap = round_up(len.max(1), PAGE);
        self.in_use_pages
            .fetch_add(cap >> PAGE_SHIFT, Ordering::Relaxed);
        IoBuf {
            ptr: map_anon(cap),
            len,
            cap,
            origin: Origin::Dedicated {
                pool: Arc::clone(self),
                permits,
            },
        }
    }

    fn release_block(&self, page: usize, order: u8, permits: usize) {
        self.buddy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free(page, order as usize);
        self.release_pages(1 << order, permits);
    }

    fn release_pages(&self, pages: usize, permits: usize) {
        self.in_use_pages.fetch_sub(pages, Ordering::Relaxed);
        self.permits.add_permits(permits);
        // SeqCst pairs with the increment in `FragmentedWaiter::new`: either the waiter's next
        // allocation attempt sees this release, or this load sees the waiter.
        if self.fragmented_waiters.load(Ordering::SeqCst) > 0 {
            self.released.notify_waiters();
        }
    }
}

/// Counts a `get` that waits for coalescing, for as long as it waits (or until cancelled).
struct FragmentedWaiter<'a>(&'a PoolInner);

impl<'a> FragmentedWaiter<'a> {
    fn new(pool: &'a PoolInner) -> Self {
        pool.fragmented_waiters.fetch_add(1, Ordering::SeqCst);
        FragmentedWaiter(pool)
    }
}

impl Drop for FragmentedWaiter<'_> {
    fn drop(&mut self) {
        self.0.fragmented_waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        for slab in &self.slabs {
            // SAFETY: every buffer holds an Arc to this pool, so none is left; the slab was
            // mapped by `map_anon` with this length.
            unsafe { unmap(slab.ptr, slab.len) };
        }
    }
}

/// Free lists of a binary buddy allocator, in page numbers per order.
#[derive(Default)]
struct Buddy {
    free: [BTreeSet<usize>; MAX_ORDER + 1],
}

impl Buddy {
    fn alloc(&mut self, order: usize) -> Option<usize> {
        let from = (order..=MAX_ORDER).find(|&o| !self.free[o].is_empty())?;
        let page = self.free[from].pop_first()?;
        for o in (order..from).rev() {
            self.free[o].insert(page + (1 << o));
        }
        Some(page)
    }

    fn free(&mut self, mut page: usize, mut order: usize) {
        while order < MAX_ORDER && self.free[order].remove(&(page ^ (1 << order))) {
            page &= !(1 << order);
            order += 1;
        }
        self.free[order].insert(page);
    }
}

/// Buddy order (log2 of pages) of the smallest block holding `len` bytes.
fn order_for(len: usize) -> usize {
    let pages = round_up(len.max(1), PAGE) >> PAGE_SHIFT;
    pages.next_power_of_two().trailing_zeros() as usize
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

fn heap_layout(cap: usize) -> Layout {
    Layout::from_size_align(cap, IO_BUF_ALIGN).expect("IoBuf capacity overflows a Layout")
}

/// Zero-filled, page-aligned anonymous memory; pages are backed on first touch.
fn map_anon(len: usize) -> NonNull<u8> {
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
    // existing memory.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        alloc::handle_alloc_error(Layout::from_size_align(len, PAGE).unwrap_or(Layout::new::<u8>()))
    }
    NonNull::new(raw.cast()).expect("mmap returned null")
}

/// # Safety
/// `ptr`/`len` must be a mapping made by [`map_anon`] that nothing refers to any more.
unsafe fn unmap(ptr: NonNull<u8>, len: usize) {
    // SAFETY: guaranteed by the caller.
    let rc = unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
    debug_assert_eq!(rc, 0, "munmap failed");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_is_aligned_and_zero() {
        for len in [0, 1, 511, 512, 4096, 4097, 1 << 20, 3 << 20] {
            let buf = IoBuf::zeroed(len);
            assert_eq!(buf.len(), len);
            assert!(buf.capacity() >= len);
            assert_eq!(buf.as_ptr() as usize % IO_BUF_ALIGN, 0);
            assert!(buf.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn from_slice_copies() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let buf = IoBuf::from_slice(&data);
        assert_eq!(&buf[..], &data[..]);
        assert_eq!(buf.as_ptr() as usize % IO_BUF_ALIGN, 0);
        assert_eq!(format!("{buf:?}"), "IoBuf { len: 10000 }");
    }

    #[test]
    fn set_len_zeroes_grown_bytes() {
        let mut buf = IoBuf::from_slice(&[0xa5; 4096]);
        buf.truncate(100);
        assert_eq!(buf.len(), 100);
        buf.truncate(200);
        assert_eq!(buf.len(), 100);
        buf.set_len(4096);
        assert!(buf[..100].iter().all(|&b| b == 0xa5));
        assert!(buf[100..].iter().all(|&b| b == 0));
        buf.set_len(0);
        assert!(buf.is_empty());
    }

    #[test]
    #[should_panic(expected = "beyond capacity")]
    fn set_len_beyond_capacity_panics() {
        let mut buf = IoBuf::zeroed(10);
        buf.set_len(buf.capacity() + 1);
    }

    #[test]
    fn order_for_classes() {
        assert_eq!(order_for(0), 0);
        assert_eq!(order_for(1), 0);
        assert_eq!(order_for(4096), 0);
        assert_eq!(order_for(4097), 1);
        assert_eq!(order_for(12 << 10), 2);
        assert_eq!(order_for(1 << 20), MAX_ORDER);
    }

    #[test]
    fn buddy_splits_and_coalesces() {
        let mut b = Buddy::default();
        b.free[MAX_ORDER].insert(0);
        let pages: Vec<usize> = (0..256).map(|_| b.alloc(0).unwrap()).collect();
        assert!(b.alloc(0).is_none());
        let mut sorted = pages.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 256);
        for p in pages {
            b.free(p, 0);
        }
        assert_eq!(b.free[MAX_ORDER].len(), 1);
        assert!((0..MAX_ORDER).all(|o| b.free[o].is_empty()));
    }

    #[test]
    fn pool_classes_alignment_and_accounting() {
        let pool = BufPool::new(8 << 20);
        assert_eq!(pool.budget_bytes(), 8 << 20);
        let slabs = pool.slabs();
        assert_eq!(slabs.iter().map(|s| s.1).sum::<usize>(), 8 << 20);
        let mut held = Vec::new();
        for len in [1, 4096, 5000, 65536, 100_000, 1 << 20] {
            let buf = pool.try_get(len).unwrap();
            assert_eq!(buf.len(), len);
            assert!(buf.capacity() >= len && buf.capacity().is_power_of_two());
            assert_eq!(buf.as_ptr() as usize % IO_BUF_ALIGN, 0);
            let slab = slabs[buf.slab_index().unwrap()];
            let start = buf.as_ptr() as usize;
            assert!(start >= slab.0 as usize && start + buf.capacity() <= slab.0 as usize + slab.1);
            assert!(buf.is_from_slabs_of(&pool));
            held.push(buf);
        }
        let expect: usize = held.iter().map(|b| b.capacity()).sum();
        assert_eq!(pool.in_use_bytes(), expect);
        assert_eq!(pool.slabs(), slabs, "slabs are stable");
        held.clear();
        assert_eq!(pool.in_use_bytes(), 0);
    }

    #[test]
    fn pool_buffers_are_disjoint_and_writable() {
        let pool = BufPool::new(4 << 20);
        let mut bufs: Vec<IoBuf> = (0..64).map(|_| pool.try_get(60_000).unwrap()).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            b.fill(i as u8);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.iter().all(|&x| x == i as u8));
        }
        assert!(
            pool.try_get(1).is_none(),
            "64 x 64 KiB use the whole budget"
        );
    }

    #[test]
    fn large_request_is_dedicated_and_counted() {
        let pool = BufPool::new(4 << 20);
        let big = pool.try_get(3 << 20).unwrap();
        assert_eq!(big.slab_index(), None);
        assert!(!big.is_from_slabs_of(&pool));
        assert_eq!(pool.in_use_bytes(), 3 << 20);
        assert!(pool.try_get(2 << 20).is_none());
        let small = pool.try_get(1 << 20).unwrap();
        assert!(pool.try_get(1).is_none());
        drop(big);
        drop(small);
        assert_eq!(pool.in_use_bytes(), 0);
        assert!(pool.try_get(4 << 20).is_some());
    }

    #[tokio::test]
    async fn get_waits_until_a_buffer_returns() {
        let pool = BufPool::new(64 << 10);
        let held: Vec<IoBuf> = (0..4).map(|_| pool.try_get(16 << 10).unwrap()).collect();
        assert_eq!(pool.in_use_bytes(), 64 << 10);
        assert!(pool.try_get(4096).is_none());
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let waiter = {
            let pool = Arc::clone(&pool);
            tokio::spawn(async move {
                let buf = pool.get(16 << 10).await;
                tx.send(()).unwrap();
                buf
            })
        };
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(
            rx.try_recv().is_err(),
            "get must wait while the budget is used up"
        );
        assert_eq!(pool.in_use_bytes(), 64 << 10);
        drop(held);
        let buf = waiter.await.unwrap();
        assert_eq!(buf.len(), 16 << 10);
        assert_eq!(pool.in_use_bytes(), 16 << 10);
    }

    #[tokio::test]
    async fn cancelled_get_gives_back_its_budget() {
        let pool = BufPool::new(64 << 10);
        let a = pool.try_get(32 << 10).unwrap();
        {
            let fut = pool.get(64 << 10);
            tokio::pin!(fut);
            let waker = std::task::Waker::noop();
            let mut cx = std::task::Context::from_waker(waker);
            assert!(std::future::Future::poll(fut.as_mut(), &mut cx).is_pending());
        }
        drop(a);
        assert!(pool.try_get(64 << 10).is_some());
        assert_eq!(pool.in_use_bytes(), 0);
    }

    #[tokio::test]
    async fn oversized_request_waits_for_an_empty_pool() {
        let pool = BufPool::new(1 << 20);
        let small = pool.try_get(4096).unwrap();
        assert!(pool.try_get(2 << 20).is_none());
        let waiter = {
            let pool = Arc::clone(&pool);
            tokio::spawn(async move { pool.get(2 << 20).await })
        };
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert!(!waiter.is_finished());
        drop(small);
        let big = waiter.await.unwrap();
        assert_eq!(big.len(), 2 << 20);
        assert!(pool.try_get(4096).is_none());
        drop(big);
        assert_eq!(pool.in_use_bytes(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_use_never_exceeds_budget() {
        let budget = 2 << 20;
        let pool = BufPool::new(budget);
        let peak = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for t in 0..32usize {
            let pool = Arc::clone(&pool);
            let peak = Arc::clone(&peak);
            tasks.push(tokio::spawn(async move {
                let mut seed = t as u64 * 7919 + 1;
                for _ in 0..200 {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let len = 512 << (seed % 11); // 512 B .. 512 KiB
                    let mut buf = pool.get(len as usize).await;
                    peak.fetch_max(pool.in_use_bytes(), Ordering::Relaxed);
                    buf.fill(t as u8);
                    tokio::task::yield_now().await;
                    assert!(buf.iter().all(|&b| b == t as u8), "buffers overlap");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(peak.load(Ordering::Relaxed) <= budget);
        assert!(peak.load(Ordering::Relaxed) > 0);
        assert_eq!(pool.in_use_bytes(), 0);
        let buddy = pool.inner.buddy.lock().unwrap();
        assert_eq!(
            buddy.free[MAX_ORDER].len(),
            budget / MAX_BLOCK,
            "fully coalesced"
        );
    }

    #[tokio::test]
    async fn fragmented_pool_waits_for_coalescing() {
        let pool = BufPool::new(2 << 20);
        let mut pages: Vec<Option<IoBuf>> = (0..512).map(|_| pool.try_get(4096)).collect();
        assert!(pages.iter().all(Option::is_some));
        // Free every other page: half the budget is free, but no 1 MiB block is.
        for p in pages.iter_mut().step_by(2) {
            *p = None;
        }
        assert_eq!(pool.in_use_bytes(), 1 << 20);
        assert!(pool.try_get(1 << 20).is_none());
        let waiter = {
            let pool = Arc::clone(&pool);
            tokio::spawn(async move { pool.get(1 << 20).await })
        };
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert!(!waiter.is_finished(), "no block of 1 MiB is free yet");
        // Free the rest of the first megabyte; it coalesces into one block.
        let low = pool.inner.slabs[0].ptr.as_ptr() as usize;
        for p in pages.iter_mut() {
            if p.as_ref()
                .is_some_and(|b| (b.as_ptr() as usize) < low + (1 << 20))
            {
                *p = None;
            }
        }
        let big = waiter.await.unwrap();
        assert_eq!(big.capacity(), 1 << 20);
        assert_eq!(big.as_ptr() as usize, low);
        drop(big);
        drop(pages);
        assert_eq!(pool.in_use_bytes(), 0);
    }

    #[test]
    fn buffers_keep_the_pool_alive() {
        let pool = BufPool::new(1 << 20);
        let mut buf = pool.try_get(4096).unwrap();
        drop(pool);
        buf.fill(7);
        assert!(buf.iter().all(|&b| b == 7));
    }
}
