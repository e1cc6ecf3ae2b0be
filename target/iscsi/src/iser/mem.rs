//! Memory registration for iSER data movement: the buffer pool's slabs as memory regions, so
//! RDMA WRITE and READ move data straight between backstore buffers and the wire, and one-off
//! regions for buffers outside the slabs (dedicated allocations above 1 MiB, heap buffers of
//! in-memory logical units). All `unsafe` of the iSER module lives here.

use std::ptr::NonNull;
use std::sync::Arc;

use rtgt_backstore::{BufPool, IoBuf};
use rtgt_transport::verbs::{Access, Mr, Pd, Region, Sge, VerbsError};

/// The pool's slabs registered with one protection domain, in slab order.
pub struct PoolMrs {
    pool: Arc<BufPool>,
    mrs: Vec<Mr>,
}

impl std::fmt::Debug for PoolMrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolMrs")
            .field("slabs", &self.mrs.len())
            .finish()
    }
}

impl PoolMrs {
    /// Registers every slab of `pool` for local access and RDMA READ responses landing in it.
    pub fn register(pd: &Pd, pool: &Arc<BufPool>) -> Result<PoolMrs, VerbsError> {
        let mut mrs = Vec::new();
        for (ptr, len) in pool.slabs() {
            let Some(ptr) = NonNull::new(ptr as *mut u8) else {
                continue;
            };
            let owner: Box<dyn Send + Sync> = Box::new(pool.clone());
            // SAFETY: a slab is mapped when the pool is created and stays mapped, unmoved,
            // until the pool and every buffer from it are gone (`BufPool::slabs`); the region
            // holds a reference to the pool. The engine touches a slab only through work
            // requests this module posts for buffers that are owned, and not otherwise
            // accessed, until their completion arrives.
            let region = unsafe { Region::from_raw(ptr, len, Some(owner)) };
            mrs.push(pd.reg_mr(Arc::new(region), Access::LOCAL_WRITE)?);
        }
        Ok(PoolMrs {
            pool: pool.clone(),
            mrs,
        })
    }

    /// The SGE of `buf[offset..offset + len]` when the buffer lies in the registered slabs.
    pub fn sge(&self, buf: &IoBuf, offset: usize, len: u32) -> Option<Sge> {
        if !buf.is_from_slabs_of(&self.pool) {
            return None;
        }
        let mr = self.mrs.get(buf.slab_index()?)?;
        Some(Sge {
            addr: buf.as_ptr() as u64 + offset as u64,
            length: len,
            lkey: mr.lkey(),
        })
    }
}

/// A memory region over a buffer outside the pool's slabs, owning it: the buffer is freed
/// when the region and every operation on it are gone.
pub fn owned_mr(pd: &Pd, mut buf: IoBuf) -> Result<Mr, VerbsError> {
    let len = buf.len().max(1);
    let ptr = NonNull::new(buf.as_mut_ptr()).ok_or(VerbsError::InvalidArgument("buffer"))?;
    let owner: Box<dyn Send + Sync> = Box::new(buf);
    // SAFETY: the IoBuf's memory does not move when the IoBuf moves into `owner`, and it is
    // freed only when the region drops `owner`, after every MR and work request using the
    // region is gone. Nothing else references the buffer once it is moved.
    let region = unsafe { Region::from_raw(ptr, len, Some(owner)) };
    pd.reg_mr(Arc::new(region), Access::LOCAL_WRITE)
}

/// A memory region over a buffer that stays where it is (a write command's data-out buffer,
/// held by its task).
///
/// # Safety
///
/// `buf` must stay allocated and must not be read, written or dropped until the returned MR
/// is dropped and every work request posted with it has completed.
pub unsafe fn borrowed_mr(pd: &Pd, buf: &mut IoBuf) -> Result<Mr, VerbsError> {
    let len = buf.len().max(1);
    let ptr = NonNull::new(buf.as_mut_ptr()).ok_or(VerbsError::InvalidArgument("buffer"))?;
    // SAFETY: the caller keeps the buffer alive and untouched for the MR's lifetime and its
    // operations (this function's contract).
    let region = unsafe { Region::from_raw(ptr, len, None) };
    pd.reg_mr(Arc::new(region), Access::LOCAL_WRITE)
}
