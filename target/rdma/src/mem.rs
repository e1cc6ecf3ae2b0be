//! Memory registration for RDMA data movement: the buffer pool's slabs as memory regions, so
//! RDMA WRITE and READ move data straight between backstore buffers and the wire, and one-off
//! regions for buffers outside the slabs (dedicated allocations above the pool's largest
//! class, heap buffers of in-memory logical units). All `unsafe` of the RDMA channel layer
//! lives here.

use std::ptr::NonNull;
use std::sync::Arc;

use rtgt_backstore::{BufPool, IoBuf};
use rtgt_transport::verbs::{Access, Region, Sge, VerbsError};

use crate::provider::{Mr, Pd, ProviderError};

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
    pub fn register(pd: &Pd, pool: &Arc<BufPool>) -> Result<PoolMrs, ProviderError> {
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
pub fn owned_mr(pd: &Pd, mut buf: IoBuf) -> Result<Mr, ProviderError> {
    let len = buf.len().max(1);
    let ptr = NonNull::new(buf.as_mut_ptr()).ok_or(VerbsError::InvalidArgument("buffer"))?;
    let owner: Box<dyn Send + Sync> = Box::new(buf);
    // SAFETY: the IoBuf's memory does not move when the IoBuf moves into `owner`, and it is
    // freed only when the region drops `owner`, after every MR and work request using the
    // region is gone. Nothing else references the buffer once it is moved.
    let region = unsafe { Region::from_raw(ptr, len, Some(owner)) };
    pd.reg_mr(Arc::new(region), Access::LOCAL_WRITE)
}

/// The landing place of RDMA READs: a buffer that the READs in flight keep alive (each holds
/// an `Arc` of it), with a region of its own when it lies outside the registered slabs.
/// Dropped before its READs completed, it frees the buffer only once no region over it is
/// left in the engine, and leaks it otherwise.
pub struct Landing {
    buf: Option<IoBuf>,
    /// A region borrowing the buffer's memory, and its registration.
    region: Option<Arc<Region>>,
    mr: Option<Mr>,
    len: usize,
}

impl Landing {
    /// A buffer from the registered slabs.
    pub fn pooled(buf: IoBuf) -> Landing {
        Landing {
            len: buf.len(),
            buf: Some(buf),
            region: None,
            mr: None,
        }
    }

    /// A buffer outside the slabs, registered with `pd` for as long as this lives.
    pub fn registered(pd: &Pd, mut buf: IoBuf) -> Result<Landing, ProviderError> {
        let len = buf.len();
        let ptr = NonNull::new(buf.as_mut_ptr()).ok_or(VerbsError::InvalidArgument("buffer"))?;
        // SAFETY: the memory belongs to `buf`, which this value keeps alive and does not
        // touch (no references to its bytes are created) while the region exists: `release`
        // hands the buffer out, or frees it, only when the region has no other holder, and
        // leaks it otherwise.
        let region = Arc::new(unsafe { Region::from_raw(ptr, len.max(1), None) });
        let mr = pd.reg_mr(region.clone(), Access::LOCAL_WRITE)?;
        Ok(Landing {
            len,
            buf: Some(buf),
            region: Some(region),
            mr: Some(mr),
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The SGE of bytes `off..off + len` of the buffer.
    pub fn sge(&self, pool: Option<&PoolMrs>, off: usize, len: u32) -> Option<Sge> {
        match &self.mr {
            Some(m) => Some(m.sge(off, len)),
            None => pool?.sge(self.buf.as_ref()?, off, len),
        }
    }

    /// The buffer, once every operation holding it is gone.
    pub fn into_buf(this: Arc<Landing>) -> Option<IoBuf> {
        match Arc::try_unwrap(this) {
            Ok(mut l) => l.release(),
            Err(_) => None,
        }
    }

    fn release(&mut self) -> Option<IoBuf> {
        drop(self.mr.take());
        if let Some(region) = self.region.take() {
            if let Err(shared) = Arc::try_unwrap(region) {
                // The engine may still write into the memory: never free it.
                tracing::warn!("RDMA data buffer still referenced by the engine: leaked");
                std::mem::forget(shared);
                std::mem::forget(self.buf.take());
                return None;
            }
        }
        self.buf.take()
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        drop(self.release());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn landing_gives_the_buffer_back_or_leaks_it() {
        use rtgt_transport::verbs::{Device, DeviceConfig};
        let addr = std::net::IpAddr::from([127, 0, 0, 1]);
        let dev = Device::new(DeviceConfig::new("landing", vec![addr])).unwrap();
        let pd = Pd::from(dev.alloc_pd().unwrap());
        let mut b = IoBuf::zeroed(4096);
        b.as_mut_slice()[0] = 7;
        let l = Arc::new(Landing::registered(&pd, b).unwrap());
        let r = l.region.clone().unwrap();
        assert!(r.write(1, &[9, 9]));
        drop(r);
        let b = Landing::into_buf(l).unwrap();
        assert_eq!(&b.as_slice()[..3], &[7, 9, 9]);
        // A region still held elsewhere: the buffer is not handed out (nor freed).
        let l = Arc::new(Landing::registered(&pd, IoBuf::zeroed(512)).unwrap());
        let extra = l.region.clone().unwrap();
        assert!(Landing::into_buf(l).is_none());
        assert!(extra.write(0, &[1; 512]));
    }
}
